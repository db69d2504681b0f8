"""Kernel durations of synthesized ops from cosim's kernel models (:mod:`cosim.models`).

:func:`synthetic_kernel_timer` is what the scenario layer passes to
:func:`cosim.workload.synth.synthesize` (synthesis, a lower layer, takes its kernel timer as an argument).

The ops become a :class:`cosim.models.features.KernelFeatures` table (class, dtype,
GEMM dims, attention dims, FLOPs, bytes) and go through
:func:`cosim.models.predict.predict_features` with the calibration profile of the
accelerator (the bundled one fitted on it, else the H100 fit predicted cross-GPU, or a
profile the user names; FP8/MXFP8 GEMMs without a fit of their own follow the narrow-GEMM rule,
:data:`cosim.models.precision.NARROW_GEMM`). The per-kernel database and kernel-family factors are not
used: synthesized kernels have no recorded names. Attention is causal: the model sees half
the key length (flash kernels skip fully masked key blocks). A decode query (``causal=False``)
reads the whole KV cache: its time is a roofline, the larger of a memory-bound kernel moving its
bytes (the cache read, through the fitted memory model) and its FLOPs at
:data:`DECODE_ATTENTION_EFFICIENCY` of the bf16 peak.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.errors import CosimInputError
from cosim.workload.synth.costs import Op
from cosim.workload.synth.spec import SyntheticSpec

__all__ = [
    "BLACKWELL_MEMORY_SHARE",
    "BLACKWELL_MEMORY_SOURCE",
    "DECODE_ATTENTION_EFFICIENCY",
    "GROUPED_GEMM_SOURCE",
    "PATTERN_KERNELS",
    "PER_EXPERT_GEMM_SOURCE",
    "TE_COMPUTE_STREAMS",
    "TE_GROUPED_STREAMS_SOURCE",
    "KernelTimer",
    "blackwell_memory_profile",
    "blackwell_own_profile",
    "calibrated_profile",
    "grouped_gemm_time",
    "per_expert_gemm_time",
    "synthetic_kernel_name",
    "synthetic_kernel_timer",
    "timed_profile",
]

DECODE_ATTENTION_EFFICIENCY = 580.0 / 989.0
"""Share of the bf16 dense peak that decode attention reaches when compute-bound: FlashMLA's
580 TFLOP/s on H800 SXM5 (989 TFLOP/s bf16 dense), deepseek-ai/FlashMLA README, 2025-02. The fitted
flash-attention model (prefill tiles of 128 query rows, head dim 128) does not cover one query per
request with the heads packed as tile rows."""


BLACKWELL_MEMORY_SHARE = 0.84
"""Share of the peak HBM bandwidth that large memory-bound kernels reach on Blackwell HBM3e: 0.84, measured on a B300
(of 8 TB/s) by :data:`BLACKWELL_MEMORY_SOURCE`. A Blackwell GPU timed with a profile fitted on another architecture
takes this share for element-wise kernels in place of the profile's own fitted share, and every other memory-bound
class in proportion (:func:`blackwell_memory_ratio`). torchao's H100 entry (0.92) is a share of a 2.4 TB/s H100
variant, not of the 3.35 TB/s SXM part cosim's H100 fit measures (0.94), so it is not used as a denominator.
Not fitted to any e2e row; held out: torchao's B200 MXFP8 cast kernels (tests/test_synth_blackwell_heldout.py)."""
BLACKWELL_MEMORY_SOURCE = (
    "pytorch/ao torchao/testing/training/roofline_utils.py @21acb9c (PR #3640, 2026-01-14): pct_achievable_mem_bw "
    "0.84 for 'NVIDIA B300 SXM6 AC' ('From measurement on hardware', peak 8e12 B/s) and 0.92 for 'NVIDIA H100' "
    "('pointwise triton kernels with large inputs'); the B200 and GB200 entries copy the H100 value ('TODO: measure "
    "once we have the hardware'), so the B300 measurement stands for the Blackwell HBM3e memory system")
"""Where :data:`BLACKWELL_MEMORY_SHARE` comes from."""


def blackwell_memory_ratio(profile: Any) -> float:
    """Factor on a non-Blackwell profile's memory-bound efficiencies that brings its element-wise share (the
    ``default`` fit) to :data:`BLACKWELL_MEMORY_SHARE` (at most 1: a profile already below it is kept)."""
    from cosim.models.calibrated import MemoryParams

    p = profile.models.get("elementwise", {}).get("default")
    if not isinstance(p, MemoryParams) or p.efficiency <= 0:
        return 1.0
    return min(1.0, BLACKWELL_MEMORY_SHARE / p.efficiency)


def blackwell_memory_profile(profile: Any, accelerator: Accelerator) -> Any:
    """``profile`` with every memory-bound class measured against HBM (element-wise, reductions, norms, copies
    on the device, MoE permutes; not host copies, which PCIe bounds) reaching :func:`blackwell_memory_ratio` times
    its fitted share of HBM, when ``accelerator`` is a Blackwell part and ``profile`` was fitted on another
    architecture; else ``profile`` itself (a copy when changed; ``profile`` is left alone)."""
    from cosim.models.calibrated import MEMORY_CLASSES, MemoryParams
    from cosim.models.precision import architecture

    if architecture(accelerator.name) != "blackwell" or architecture(profile.accelerator) == "blackwell":
        return profile
    ratio = blackwell_memory_ratio(profile)
    models = {c: dict(by) for c, by in profile.models.items()}
    for c in MEMORY_CLASSES:
        if c in ("memcpy_htod", "memcpy_dtoh"):
            continue
        for key, p in models.get(c, {}).items():
            if isinstance(p, MemoryParams):
                models[c][key] = replace(p, efficiency=p.efficiency * ratio)
    return replace(profile, models=models)


BLACKWELL_REFERENCE_PROFILE = "h100-sxm5"
"""The profile every Blackwell part without a fit of its own is timed with, cross-GPU, under the Blackwell library
rules (:func:`cosim.models.precision.library_profile`, :func:`blackwell_memory_profile`): B200 and GB200."""


def blackwell_own_profile(profile: Any, accelerator: Accelerator) -> Any:
    """The profile synthesized kernels are timed with on a Blackwell ``accelerator`` whose ``profile`` was fitted on
    a Blackwell part itself (the bundled ``b300``, which GB300 inherits): its fits where its samples identify them,
    and for the rest what every other Blackwell part gets (:data:`BLACKWELL_REFERENCE_PROFILE` cross-GPU with the
    Blackwell library rules), not the uncalibrated :data:`cosim.models.calibrated.DEFAULTS`:

    * a model class the profile has no fit for (``b300``: attention, norms, memsets) takes the reference's;
    * when no BF16 GEMM of its kernel database ran compute-bound
      (:func:`cosim.models.profile.compute_bound_gemm_samples`), its BF16 GEMM fit keeps what small GEMMs identify
      (per-wave overhead, small-tile exponent, weight streaming, floor) and takes the main-loop efficiency and
      sustained-clock ceiling of the Blackwell library rule (:data:`cosim.models.precision.BLACKWELL_GEMM`);
    * when no one-byte (FP8 / MXFP8) GEMM of it ran compute-bound, one-byte GEMMs take that rule whole. Each dtype
      is judged by its own samples: a compute-bound MXFP8 GEMM identifies the MXFP8 fit, not the BF16 one.

    The ``b300`` fit's 9 GEMM shapes (BF16) reach at most ~14 FLOP/B (six of them 1) against a ridge of ~280, so its
    0.86 main-loop efficiency with no ceiling is not a measurement of a large GEMM, and it was timing the e2e rows'
    GEMMs at up to 0.86 of the BF16 and 0.83 of the MXFP8 peak.

    Other profiles (another architecture, or another GPU than Blackwell) are returned unchanged."""
    from cosim.models.calibrated import GEMM_CLASSES, GemmParams
    from cosim.models.precision import _NARROW_DTYPES, architecture
    from cosim.models.profile import compute_bound_gemm_samples, load_profile

    if architecture(accelerator.name) != "blackwell" or architecture(profile.accelerator) != "blackwell":
        return profile
    from cosim.catalog import load_catalog

    ref = timed_profile(load_profile(BLACKWELL_REFERENCE_PROFILE), accelerator)  # (another architecture's)
    models = {c: dict(by) for c, by in profile.models.items()}
    for cls, by in ref.models.items():
        if cls not in profile.models and not (cls == "grouped_gemm" and "gemm" in profile.models):
            models[cls] = dict(by)
    try:
        fitted_on = load_catalog().accelerator(profile.accelerator)
    except CosimInputError:
        fitted_on = accelerator
    bf16_open = compute_bound_gemm_samples(profile, fitted_on, ("bf16",)) == 0
    narrow_open = compute_bound_gemm_samples(profile, fitted_on, _NARROW_DTYPES) == 0
    if not (bf16_open or narrow_open):
        return replace(profile, models=models)
    for cls in GEMM_CLASSES:
        if bf16_open and narrow_open:  # no GEMM identified: the reference's GEMM entries, BF16 ones amended below
            if cls not in ref.models:
                models.pop(cls, None)
                continue
            models[cls] = dict(ref.models[cls])
        elif cls not in models:  # (grouped GEMMs fall back to the GEMM entries amended here)
            continue
        by, lib_by = models[cls], ref.models.get(cls) or ref.models.get("gemm", {})
        own = profile.params(cls, "bf16")
        if bf16_open and isinstance(own, GemmParams):  # small samples identify all but the main loop and ceiling
            for key in ("bf16", "default"):
                lib = lib_by.get(key)
                if isinstance(lib, GemmParams):
                    by[key] = replace(own, efficiency=lib.efficiency, max_throughput=lib.max_throughput)
        if narrow_open:  # one-byte GEMMs never measured compute-bound: the Blackwell library rule whole
            for dt in _NARROW_DTYPES:
                if isinstance(lib_by.get(dt), GemmParams):
                    by[dt] = lib_by[dt]
    return replace(profile, models=models)


def timed_profile(profile: Any, accelerator: Accelerator) -> Any:
    """The profile synthesized kernels are timed with on ``accelerator`` (:class:`KernelTimer`): FP8/MXFP8 GEMMs
    ``profile`` has no fit for follow the narrow-GEMM rule (:data:`cosim.models.precision.NARROW_GEMM`); on a
    Blackwell GPU with a profile of another architecture, BF16 and one-byte GEMMs follow
    :data:`cosim.models.precision.BLACKWELL_GEMM` (:func:`cosim.models.precision.library_profile`) and
    memory-bound kernels :data:`BLACKWELL_MEMORY_SHARE` (:func:`blackwell_memory_profile`); with a Blackwell
    profile, what its samples do not identify is timed that way too (:func:`blackwell_own_profile`)."""
    from cosim.models.precision import library_profile

    own = blackwell_own_profile(profile, accelerator)
    return blackwell_memory_profile(library_profile(own, accelerator), accelerator)


PATTERN_KERNELS: dict[str, str] = {
    "": "",
    "strided": "elementwise_kernel<128, 4>",
    "unrolled": "unrolled_elementwise_kernel",
    "batched_copy": "CatArrayBatchedCopy",
}
"""The kernel PyTorch launches for a synthesized memory-bound op of each access pattern (:attr:`Op.pattern`):
TensorIterator's generic ``elementwise_kernel<nt, vt>`` when an operand is strided or broadcast,
``unrolled_elementwise_kernel`` when contiguous but not vectorizable (a cast), ``CatArrayBatchedCopy`` for
``torch.cat``; "" the vectorized kernel (the class fit). The name is what
:func:`cosim.models.calibrated.access_patterns` reads the pattern from, as it does from a trace. Held out
(validation/kernels/small_shapes.py, H100 LOTO traces): without the pattern these kernels were timed 39-49 %
too fast, with it +8 … +18 %."""


def synthetic_kernel_name(o: Op) -> str:
    """Kernel name the timer gives a synthesized op: ``synthetic:<op>``, followed by the kernel of its access
    pattern (:data:`PATTERN_KERNELS`)."""
    k = PATTERN_KERNELS[o.pattern]
    return f"synthetic:{o.name} {k}" if k else f"synthetic:{o.name}"


class KernelTimer:
    """``timer(ops) -> [seconds]`` for one accelerator and calibration profile."""

    def __init__(self, accelerator: Accelerator, profile: Any = None) -> None:
        from cosim.models.predict import _default_profile

        self.accelerator = accelerator
        self.profile = profile if profile is not None else _default_profile(accelerator)
        self._model_profile = timed_profile(self.profile, accelerator)
        """The profile the kernels are timed with (:func:`timed_profile`)."""

    def __call__(self, ops: Sequence[Op]) -> list[float]:
        from cosim.models.features import KernelFeatures
        from cosim.models.predict import predict_features

        n = len(ops)
        if n == 0:
            return []
        f = KernelFeatures(
            cls=[o.cls for o in ops], kernel=[synthetic_kernel_name(o) for o in ops], op_name=[o.name for o in ops],
            dtype=[o.dtype for o in ops],
            m=np.array([o.m if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            # causal attention: the kernel skips the masked half of the key blocks
            n=np.array([(o.keys if o.cls == "attention" and o.keys else
                         o.n * 0.5 if o.cls == "attention" and o.causal else o.n)
                        if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            k=np.array([o.k if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            batch=np.array([o.batch for o in ops], dtype=float), heads=np.array([o.heads for o in ops], dtype=float),
            bwd=np.array([o.bwd for o in ops], dtype=bool), flops=np.array([o.flops for o in ops], dtype=float),
            bytes=np.array([o.bytes for o in ops], dtype=float), dur=np.full(n, np.nan),
            grid=np.full((n, 3), -1, dtype=np.int64), block=np.full((n, 3), -1, dtype=np.int64))
        pred = predict_features(f, self.accelerator, self._model_profile, kernel_scale=False, database=False)
        out = np.where(np.array([o.cls == "collective" for o in ops]), 0.0, pred.dur)
        uneven = [i for i, o in enumerate(ops) if o.cls == "grouped_gemm" and len(set(o.group_rows)) > 1]
        if uneven:  # groups of unequal rows: each group tiled on its own (equal groups: the batched shape above)
            out[uneven] = self._grouped([ops[i] for i in uneven])
        te = [i for i, o in enumerate(ops) if o.cls == "grouped_gemm" and o.launches > 1]
        for i in te:  # TE's multi-stream grouped GEMM: a launch floor per round of its compute streams
            out[i] += self._stream_rounds_extra(ops[i])
        dec = [i for i, o in enumerate(ops) if o.cls == "attention" and not o.causal]
        if dec:  # decode attention: a roofline of its cache read and its FLOPs at the decode kernels' efficiency
            mem = self([replace(ops[i], name=f"{ops[i].name}.kv_read", cls="elementwise", flops=0.0) for i in dec])
            peak = float(self.accelerator.peak("bf16")) * DECODE_ATTENTION_EFFICIENCY
            for i, t in zip(dec, mem):
                out[i] = max(ops[i].flops / peak, t)
        return [float(x) if np.isfinite(x) else 0.0 for x in out]


    def _stream_rounds_extra(self, o: Op) -> float:
        """Time (s) a grouped GEMM that Transformer Engine runs as one cuBLAS GEMM per expert adds to the pooled
        tile waves (:data:`TE_GROUPED_STREAMS_SOURCE`): the launch floor of every round of
        :data:`TE_COMPUTE_STREAMS` expert GEMMs beyond the first, ``(⌈live experts / streams⌉ - 1)·floor``."""
        from cosim.models.calibrated import GemmParams

        live = sum(1 for r in o.group_rows if r > 0) if o.group_rows else max(round(o.batch), 1)
        p = self._model_profile.params("grouped_gemm", o.dtype)
        assert isinstance(p, GemmParams)
        return (math.ceil(max(live, 1) / TE_COMPUTE_STREAMS) - 1) * p.floor_s

    def _grouped(self, ops: Sequence[Op]) -> np.ndarray:
        """Durations (s) of grouped GEMMs with unequal groups (:attr:`Op.group_rows`), by
        :func:`grouped_gemm_time`; ops of equal shape and groups are timed once."""
        from cosim.models.calibrated import GemmParams, HardwareFigures

        hw = HardwareFigures.of(self.accelerator)
        keys = [(o.dtype, o.m, o.n, o.k, o.group_k, o.group_rows, o.bytes) for o in ops]
        uniq = list(dict.fromkeys(keys))
        out = np.empty(len(uniq))
        for dt in sorted({u[0] for u in uniq}):
            sel = [j for j, u in enumerate(uniq) if u[0] == dt]
            p = self._model_profile.params("grouped_gemm", dt)
            assert isinstance(p, GemmParams)
            width = max(len(uniq[j][5]) for j in sel)
            rows = np.zeros((len(sel), width))
            for r, j in enumerate(sel):
                rows[r, :len(uniq[j][5])] = uniq[j][5]
            u = np.array([uniq[j][1:5] for j in sel], dtype=float)
            out[sel] = grouped_gemm_time(rows, u[:, 0], u[:, 1], u[:, 2], u[:, 3].astype(bool),
                                         np.array([uniq[j][6] for j in sel]), hw.peak(dt), hw, p)
        at = {key: j for j, key in enumerate(uniq)}
        return out[[at[key] for key in keys]]


GROUPED_GEMM_SOURCE = (
    "NVIDIA/TransformerEngine transformer_engine/common/gemm/cublaslt_gemm.cu (multi_stream_cublas_gemm: GEMM i "
    "on compute stream i % 4, the four streams of transformer_engine/common/util/multi_stream.cpp running "
    "concurrently, so the experts' CTAs share the SMs); NVIDIA/cutlass examples/57_hopper_grouped_gemm and "
    "deepseek-ai/DeepGEMM m_grouped_gemm_fp8_fp8_bf16_nt_masked (one launch: a persistent tile scheduler walks the "
    "output tiles of every group in turn over the SMs)")
"""Why a grouped GEMM is timed as the tiles of all its groups scheduled in waves over the SMs."""


def grouped_gemm_time(rows: np.ndarray, m: np.ndarray, n: np.ndarray, k: np.ndarray, group_k: np.ndarray,
                      nbytes: np.ndarray, peak: float, hw: Any, p: Any) -> np.ndarray:
    """Modeled durations (s) of grouped GEMMs whose groups differ in size.

    ``rows`` [ops, groups]: each group's rows (0 pads and empty groups launch no tiles); ``m``, ``n``, ``k``
    [ops]: the GEMM dims, the grouped one (M, or K where ``group_k``, a wgrad) given by ``rows`` instead.
    Rule (:data:`GROUPED_GEMM_SOURCE`): the output tiles of all groups are scheduled in waves over the SMs,
    one (tile, split-K) for all groups, the fastest of the GEMM model's candidates
    (:func:`cosim.models.calibrated.gemm_time`): ``tiles = s·Σ_g ⌈M_g/tm⌉·⌈N/tn⌉``, ``waves = ⌈tiles/SMs⌉``,
    ``t = waves·(tile_overhead + 2·tm·tn·(K̄/s)/(peak/SMs·eff))`` with ``K̄`` the tiles' mean K (K itself
    unless ``group_k``), split-K only where every group has ``K_g/s ≥ 128``, its fp32 partials
    ``8·Σ_g M_g·N·s`` bytes, ``t`` at least ``Σ_g 2·M_g·N·K_g / (max_throughput·peak)`` (the GEMM model's
    sustained-clock ceiling); then ``floor + max(t, bytes/(HBM·mem_eff))``. With equal groups this is the
    GEMM model's batched shape (``batch`` = groups, ``m`` = rows per group) exactly: both are
    :func:`cosim.models.calibrated.gemm_tile_waves` (one column per group here, one column of ``batch`` equal
    groups there) and :func:`cosim.models.calibrated.gemm_total`. Cost: O(ops · groups · candidates)."""
    from cosim.models.calibrated import gemm_tile_waves, gemm_total

    rows = np.asarray(rows, dtype=float)
    live = rows > 0
    gk = np.asarray(group_k, dtype=bool)
    mg = np.where(gk[:, None], np.asarray(m, dtype=float)[:, None], rows)  # [ops, groups]: each group's M
    kg = np.where(gk[:, None], rows, np.asarray(k, dtype=float)[:, None])  # each group's K
    n = np.asarray(n, dtype=float)
    best = gemm_tile_waves(mg, kg, live.astype(float), n, 8.0 * (mg * live).sum(axis=1) * n,
                           np.full(len(n), peak / hw.sm_count), hw, p, group_k=gk)
    return gemm_total(best, 2.0 * (mg * kg * live).sum(axis=1) * n, np.asarray(nbytes, dtype=float), peak, hw, p)


TE_COMPUTE_STREAMS = 4
"""Compute streams Transformer Engine's multi-stream grouped GEMM spreads its per-expert GEMMs over
(:data:`TE_GROUPED_STREAMS_SOURCE`)."""
TE_GROUPED_STREAMS_SOURCE = (
    "NVIDIA/TransformerEngine v2.12 transformer_engine/pytorch/module/grouped_linear.py (_GroupedLinear forward: "
    "general_grouped_gemm over the m_splits; backward: one dgrad and one wgrad general_grouped_gemm) -> "
    "te_general_grouped_gemm (pytorch/csrc/extensions/gemm.cpp) -> nvte_multi_tensor_gemm -> "
    "multi_stream_cublas_gemm (common/gemm/cublaslt_gemm.cu: one cublasLtMatmul per expert, GEMM i on compute "
    "stream i % num_streams after an event on the main stream; common/util/multi_stream.cpp: 4 compute streams); "
    "held out: TE PR #2045 (NVIDIA/TransformerEngine, yaox12's benchmark of general_grouped_gemm with TE 2.7 and "
    "CUDA 12.9 on H100 BF16: 627.9 TFLOP/s at 8 x 4096 x 768 x 2048, 553.9 at 16 x 2048 x 768 x 2048; the "
    "single-launch CUTLASS grouped GEMM 650.6 and 636.9)")
"""Why a training grouped GEMM of Transformer Engine is the pooled tile waves plus a launch floor per round of
its compute streams."""
PER_EXPERT_GEMM_SOURCE = (
    "the same per-expert cublasLtMatmul calls (TE_GROUPED_STREAMS_SOURCE), each timed alone; held out: vidur's "
    "measured H100 cuBLAS GEMMs at 256-4096 rows (microsoft/vidur data/profiling/compute/h100, "
    "../shared/measured/vidur-h100-compute)")
"""Where the serial bound :func:`per_expert_gemm_time` comes from."""


def per_expert_gemm_time(rows: np.ndarray, m: float, n: float, k: float, group_k: bool, nbytes: float,
                         peak: float, hw: Any, p: Any) -> float:
    """Serial bound (s) of a grouped GEMM run as one cuBLAS GEMM per expert (:data:`PER_EXPERT_GEMM_SOURCE`): its
    experts' GEMMs one after another, none overlapping another. Not the kernel timer's rule (which overlaps them
    over Transformer Engine's compute streams, :data:`TE_GROUPED_STREAMS_SOURCE`); the upper end of what the
    per-expert launches can cost, checked against single cuBLAS GEMMs (validation/kernels/per_expert.py).

    ``rows``: each expert's rows (its M, or its K where ``group_k``: a wgrad ``dW_e = X_e^T dY_e``); ``m``, ``n``,
    ``k``: the other dims; ``nbytes``: the whole op's operand bytes, shared by the experts in proportion to their
    rows. Each expert's GEMM is timed by the dense GEMM model (:func:`cosim.models.calibrated.gemm_time`: its own
    tile, waves, split-K, memory bound and launch floor) and the experts' GEMMs add up. An expert with no rows
    launches nothing."""
    from cosim.models.calibrated import gemm_time

    r = np.asarray(rows, dtype=float)
    r = r[r > 0]
    if r.size == 0:
        return 0.0
    mm = np.full(r.size, float(m)) if group_k else r
    kk = r if group_k else np.full(r.size, float(k))
    share = float(nbytes) * r / r.sum()
    t = gemm_time(mm, np.full(r.size, float(n)), kk, np.ones(r.size), share, peak, hw, p)
    return float(np.sum(t))


def synthetic_kernel_timer(spec: SyntheticSpec, accelerator: Accelerator, base: Path | None = None) -> KernelTimer:
    """The kernel timer of a ``workload: synthetic:`` block on ``accelerator``: with the profile it names
    (a file relative to ``base`` or a bundled name), one fitted to its ``calibrate_from`` traces, or the
    accelerator's default profile."""
    if spec.profile and spec.calibrate_from:
        raise CosimInputError("workload.synthetic: give profile or calibrate_from, not both")
    prof = None
    if spec.profile:
        from cosim.models import load_profile

        prof = load_profile(str(base / spec.profile) if base and (base / spec.profile).is_file() else spec.profile)
    if spec.calibrate_from:
        prof = calibrated_profile(spec.calibrate_from, base)
    return KernelTimer(accelerator, prof)


def calibrated_profile(traces: str | list[str], base: Path | None = None) -> Any:
    """A calibration profile fitted to the kernels of ``traces`` (files or folders, relative to ``base``)."""
    from cosim.models.fit import KernelDB, fit_profile

    paths = []
    for t in [traces] if isinstance(traces, str) else traces:
        p = Path(t)
        if base is not None and not p.is_absolute() and (base / p).exists():
            p = base / p
        if not p.exists():
            raise CosimInputError(f"workload.synthetic.calibrate_from: {t}: no such trace file or folder")
        paths.append(p)
    files = sorted(KernelDB.trace_files(paths), key=str)
    key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key in _FITTED:
        return _FITTED[key]
    dbs = KernelDB.from_traces(paths, None)
    if len(dbs) != 1:
        raise CosimInputError(f"workload.synthetic.calibrate_from: the traces come from {len(dbs)} GPU models "
                              f"({', '.join(sorted(dbs)) or 'none recognised'}); give traces of one GPU model")
    prof = _FITTED[key] = fit_profile(next(iter(dbs.values())), name="calibrate_from",
                                      provenance={"sources": [str(p) for p in paths]})
    return prof


_FITTED: dict[tuple[Any, ...], Any] = {}
"""Profiles fitted by :func:`calibrated_profile` in this process, by the traces' identity (sweeps refit once)."""
