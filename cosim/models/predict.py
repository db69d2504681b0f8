"""Predict GPU-op durations of an execution graph from a calibration profile.

``predict_durations(rg, accelerator, profile)`` is what ``cosim replay
--durations modeled`` calls. When ``profile`` was fitted on another accelerator
than ``accelerator`` the prediction is cross-GPU: the profile's efficiencies and
overheads are kept and the catalog figures (peaks, HBM bandwidth, SM count,
PCIe) of the target are used (see docs/MODELS.md).

Ops the models cannot see (no parent ATen op or no shapes, e.g. kernels enqueued
before the profiler started, or a trace without Input Dims) take the prediction of a
*twin*: a modeled op with the same kernel name, grid and block (same kernel
configuration); else the profile's launch-configuration law (:mod:`cosim.models.launch`,
fitted on calibration rows) from the kernel's grid and block; else a modeled op with
the same kernel name; else the class floor. Communication ops get NaN: the engine
simulates them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.models.calibrated import (
    GEMM_CLASSES,
    GEMV_PREFIX,
    TILE_PREFIX,
    AttentionParams,
    GemmParams,
    HardwareFigures,
    access_patterns,
    attention_time,
    gemm_time,
    gemv_kernels,
    launch_bound,
    memory_params,
    memory_time,
    named_tiles,
    reference_bandwidth,
)
from cosim.models.features import KernelFeatures, extract_features
from cosim.models.profile import CalibrationProfile, db_key, kernel_family, profile_for
from cosim.workload.graph import RankGraph

__all__ = ["Prediction", "predict_durations", "predict_features"]

SOURCES = ("model", "roofline", "twin", "kernel_name", "floor", "engine", "database", "launch", "measured", "inferred")
"""Where a prediction came from (:attr:`Prediction.source` codes index this)."""


@dataclass
class Prediction:
    """Per-op predicted durations (s) and where each came from."""

    dur: np.ndarray
    """Predicted seconds per GPU op; NaN for communication ops."""
    source: np.ndarray
    """Index into :data:`SOURCES` per op."""

    def counts(self) -> dict[str, int]:
        """How many ops each source predicted."""
        return {s: int(np.sum(self.source == i)) for i, s in enumerate(SOURCES) if np.any(self.source == i)}


def _default_profile(acc: Accelerator) -> CalibrationProfile:
    prof = profile_for(acc.name)
    if prof is not None:
        return prof
    from cosim.models.profile import load_profile

    return load_profile("h100-sxm5")  # cross-GPU from the H100 fit: efficiencies travel, figures do not


TIMED_KERNELS = re.compile(r"spin_kernel|sleep_kernel|nanosleep|\b_?sleep\b", re.IGNORECASE)
"""Kernels whose duration is their argument, not their work (``torch.cuda._sleep``'s ``spin_kernel``
spins a given number of cycles): they stand for a wait, so every prediction keeps their measured
duration (source ``measured``) and the error tables leave them out."""


def _same_gpu(prof: CalibrationProfile, accelerator: Accelerator) -> bool:
    from cosim.catalog import load_catalog
    from cosim.errors import CosimInputError

    try:
        return load_catalog().accelerator(prof.accelerator).name == accelerator.name
    except CosimInputError:
        return False


def predict_features(f: KernelFeatures, accelerator: Accelerator,
                     profile: CalibrationProfile | None = None, *, kernel_scale: bool = True,
                     database: bool = True) -> Prediction:
    """Predicted durations (s) for the ops described by ``f`` on ``accelerator``.

    When the profile was fitted on this GPU model, its optional per-kernel-family factors
    (``kernel_scale``) multiply the model's GEMM times, and its optional measured medians
    (``kernel_db``) replace the prediction of an op whose exact key (kernel family, class, dtype,
    shapes, bytes) they hold (source ``database``). Either can be switched off to score the model
    alone."""
    prof = profile if profile is not None else _default_profile(accelerator)
    hw = HardwareFigures.of(accelerator)
    n = len(f)
    out = np.full(n, np.nan)
    src = np.full(n, SOURCES.index("floor"), dtype=np.int8)
    cls = np.array(f.cls, dtype=object)
    dts = np.array(f.dtype, dtype=object)
    tiles = named_tiles(f.kernel)
    patterns = access_patterns(f.kernel, f)
    for c in sorted(set(f.cls)):
        sel = cls == c
        if c == "collective":
            src[sel] = SOURCES.index("engine")
            continue
        if c in GEMM_CLASSES:
            ok = sel & np.isfinite(f.m) & np.isfinite(f.n) & np.isfinite(f.k)
            by = prof.models.get(c) or (prof.models.get("gemm") or {} if c == "grouped_gemm" else {})
            gemv = ok & gemv_kernels(f.kernel) & (GEMV_PREFIX + "default" in by)
            tiled = ok & ~gemv & np.isfinite(tiles[:, 0]) & any(key.startswith(TILE_PREFIX) for key in by)
            for dt in sorted(set(dts[ok])):
                s = ok & ~tiled & ~gemv & (dts == dt)
                if s.any():
                    p = prof.params(c, dt)
                    assert isinstance(p, GemmParams)
                    out[s] = gemm_time(f.m[s], f.n[s], f.k[s], f.batch[s], f.bytes[s], hw.peak(dt), hw, p)
                s = tiled & (dts == dt)
                if s.any():  # the kernel's own tile (and split-K from its grid), with the parameters fitted that way
                    p = by.get(TILE_PREFIX + dt) or by[TILE_PREFIX + "default"]
                    assert isinstance(p, GemmParams)
                    out[s] = gemm_time(f.m[s], f.n[s], f.k[s], f.batch[s], f.bytes[s], hw.peak(dt), hw, p, tiles[s],
                                       f.grid[s])
                s = gemv & (dts == dt)
                if s.any():  # cuBLAS gemv / skinny kernels: their own parameter set
                    p = by.get(GEMV_PREFIX + dt) or by[GEMV_PREFIX + "default"]
                    assert isinstance(p, GemmParams)
                    out[s] = gemm_time(f.m[s], f.n[s], f.k[s], f.batch[s], f.bytes[s], hw.peak(dt), hw, p)
                src[ok & (dts == dt)] = SOURCES.index("model")
            rest = sel & ~ok & np.isfinite(f.flops)
            if rest.any():
                p = prof.params(c, "")
                assert isinstance(p, GemmParams)
                peaks = np.array([hw.peak(d or "bf16") for d in dts[rest]])
                tc = f.flops[rest] / (peaks * p.efficiency)
                tm = np.nan_to_num(f.bytes[rest]) / (hw.hbm_bandwidth * p.memory_efficiency)
                out[rest] = p.floor_s + np.maximum(tc, tm)
                src[rest] = SOURCES.index("roofline")
        elif c == "attention":
            ok = sel & np.isfinite(f.m) & np.isfinite(f.n) & np.isfinite(f.k)
            for dt in sorted(set(dts[ok])):
                s = ok & (dts == dt)
                p = prof.params(c, dt)
                assert isinstance(p, AttentionParams)
                out[s] = attention_time(f.batch[s], f.heads[s], f.m[s], f.n[s], f.k[s], f.bwd[s], hw.peak(dt), hw, p)
                src[s] = SOURCES.index("model")
        else:
            ok = sel & np.isfinite(f.bytes)
            base = prof.params(c, "")
            for pat in sorted(set(patterns[ok])):  # access pattern: its own fit, else the class's x a ratio
                s = ok & (patterns == pat)
                bw = reference_bandwidth(c, hw)
                p = memory_params(prof.models.get(c), base, pat, hw, bw)  # type: ignore[arg-type]
                out[s] = memory_time(f.bytes[s], bw, p, launch_bound(f, s, pat, hw))
            src[ok] = SOURCES.index("model")
    if f.inferred is not None:  # bytes read off a neighbouring launch, not shapes (features.infer_norm_bytes)
        src[f.inferred & (src == SOURCES.index("model"))] = SOURCES.index("inferred")
    if (kernel_scale and prof.kernel_scale) or (database and prof.kernel_db):
        if _same_gpu(prof, accelerator):
            modeled = np.flatnonzero(src == SOURCES.index("model"))
            if kernel_scale and prof.kernel_scale:
                for j in modeled:
                    if f.cls[j] in GEMM_CLASSES:
                        e = prof.kernel_scale.get(kernel_family(f.kernel[j]))
                        if e is not None:
                            out[j] *= e["scale"]
            if database and prof.kernel_db:
                for j in modeled:
                    hit = prof.kernel_db.get(db_key(f.kernel[j], f.cls[j], f.dtype[j], f.m[j], f.n[j], f.k[j],
                                                    f.batch[j], f.heads[j], f.bwd[j], f.bytes[j]))
                    if hit is not None:
                        out[j] = hit[0]
                        src[j] = SOURCES.index("database")
    timed = np.array([bool(TIMED_KERNELS.search(k or "")) for k in f.kernel], dtype=bool)
    timed &= np.isfinite(f.dur) & (f.dur > 0) & (cls != "collective")
    out[timed] = f.dur[timed]
    src[timed] = SOURCES.index("measured")
    # twins for ops the models could not see
    todo = np.flatnonzero(np.isnan(out) & (cls != "collective"))
    if len(todo):
        by_cfg: dict[tuple, list[float]] = {}
        by_name: dict[str, list[float]] = {}
        for j in np.flatnonzero(np.isfinite(out)):
            by_cfg.setdefault((f.kernel[j], *f.grid[j], *f.block[j]), []).append(out[j])
            by_name.setdefault(f.kernel[j], []).append(out[j])
        law_t = _launch_times(f, todo, prof, accelerator, hw)
        for j, lt in zip(todo, law_t):
            key = (f.kernel[j], *f.grid[j], *f.block[j])
            if key in by_cfg and f.grid[j][0] >= 0:
                out[j] = float(np.median(by_cfg[key]))
                src[j] = SOURCES.index("twin")
            elif np.isfinite(lt):
                out[j] = float(lt)
                src[j] = SOURCES.index("launch")
            elif f.kernel[j] in by_name:
                out[j] = float(np.median(by_name[f.kernel[j]]))
                src[j] = SOURCES.index("kernel_name")
            else:
                p = prof.params(f.cls[j], f.dtype[j])
                out[j] = float(p.floor_s)
    return Prediction(out, src)


def _launch_times(f: KernelFeatures, idx: np.ndarray, prof: CalibrationProfile, accelerator: Accelerator,
                  hw: HardwareFigures) -> np.ndarray:
    """Launch-law times (s) of rows ``idx`` of ``f`` (NaN where the profile has no law or the launch is unknown)."""
    from cosim.models.launch import launch_family, launch_time, launch_work, scale_rate

    out = np.full(len(idx), np.nan)
    laws = (prof.launch or {}).get("laws") or {}
    if not laws or not len(idx):
        return out
    same = _same_gpu(prof, accelerator)
    fit_hw = hw
    if not same:
        from cosim.catalog import load_catalog

        fit_hw = HardwareFigures.of(load_catalog().accelerator(prof.accelerator))
    family = (prof.launch.get("family") or {}) if same else {}
    work, keys = launch_work([f.cls[j] for j in idx], [f.kernel[j] for j in idx], f.grid[idx], f.block[idx])
    for i, key in enumerate(keys):
        law = laws.get(key) if key else None
        if law is None or not np.isfinite(work[i]):
            continue
        rs = 1.0 if same else scale_rate(key, fit_hw, hw)
        fam = family.get(launch_family(f.kernel[idx[i]]))
        out[i] = float(launch_time(work[i], law, rs)) * (fam["scale"] if fam else 1.0)
    return out


def predict_durations(rg: RankGraph, accelerator: Accelerator,
                      profile: CalibrationProfile | None = None) -> np.ndarray:
    """Predicted duration (s) of every GPU op of ``rg`` on ``accelerator``.

    Args:
        rg: one rank's execution graph (``load_trace(...).ranks[i]``).
        accelerator: target catalog accelerator (``load_catalog().accelerator("h100-sxm5")``).
        profile: calibration profile (:func:`cosim.models.load_profile`); None picks the bundled
            profile of ``accelerator``, else the H100 profile predicted cross-GPU.

    Returns:
        float64 array, one entry per ``rg.gpu_ops`` row: seconds, NaN for communication
        kernels (class COLLECTIVE), which the engine simulates or keeps measured.
    """
    return predict_features(extract_features(rg), accelerator, profile).dur
