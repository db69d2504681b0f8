"""Launch-configuration model: kernel time from the launch grid and block, for ops without shapes.

A trace without ``Input Dims`` (or a kernel with no parent op) gives the shape models nothing: no
M, N, K, no bytes. It still records each kernel's name, launch grid and block. This module turns them
into a *work proxy* and predicts the time with laws fitted on calibration rows (the profile's train
traces, never the trace being scored)::

    GEMM-class kernel whose name spells its CTA tile (tm x tn):  work = prod(grid) * tm * tn
                                                                  (output elements incl. split-K slices)
    every other kernel:                                           work = prod(grid) * prod(block)  (threads)

    t = (floor + work / rate) * family_factor

``floor`` (s) and ``rate`` (work units / s) are fitted per ``<class>:<kind>`` (kind ``tile`` or
``threads``) in log space (robust least squares, as the shape models) on every calibration row with
a launch configuration and a measured duration (shape-less or not; memcpy / memset excluded, their
bytes are recorded). ``family_factor`` is, for kernel families (name without argument list) seen at
least :data:`MIN_FAMILY` times in the calibration rows, the median of log(measured / law) shrunk by
n / (n + 2) and clipped to [1/8, 8]: it carries what the proxy cannot see, e.g. the work per thread of
grid-stride kernels and, for GEMMs, the typical K of that kernel (K is not in the launch: the law's
time per output element is the calibration rows' typical K per tile area; a family's factor is its own).

The laws are stored in the profile's optional ``launch`` section (``cosim.profile/2``). Predicting
another GPU keeps the floors and scales the rates by the catalog ratio (HBM bandwidth for memory
classes, FP32 peak for GEMM classes); family factors apply only on the GPU they were fitted on.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import numpy as np

from cosim.models.calibrated import GEMM_CLASSES, HardwareFigures, _lsq, named_tiles

__all__ = ["LAUNCH_EXCLUDED", "MIN_FAMILY", "MIN_LAW", "fit_launch", "launch_family", "launch_keys", "launch_time",
           "launch_work", "scale_rate"]

MIN_LAW = 8
"""Calibration rows a ``<class>:<kind>`` law needs."""
MIN_FAMILY = 4
"""Calibration rows a kernel family needs for its own factor."""
FAMILY_PRIOR = 2.0
FAMILY_MAX = 512
"""At most this many families (the most frequent) get a factor."""
LAUNCH_EXCLUDED = ("collective", "memcpy_dtod", "memcpy_htod", "memcpy_dtoh", "memset")
"""Classes the launch model does not cover (communication; copies and memsets record their bytes)."""

_ANY_TILE = re.compile(r"(?<![\dx])(\d{2,3})x(\d{2,3})(?=_|x\d)")
"""A CTA tile spelled ``<rows>x<cols>`` followed by ``_`` or ``x<k>`` (cuDNN ``scudnn_128x64_relu``,
``winograd_128x128_ldg1``, cutlass ``tf32_64x128_32x3``), used after :func:`named_tiles`."""


def launch_family(name: str) -> str:
    """Kernel family of the launch factors: :func:`~cosim.models.profile.kernel_family` after removing
    ``(anonymous namespace)`` (which would otherwise cut ``void at::native::(anonymous namespace)::k<...>``
    to ``void at::native::``); names already recorded cut that way (ending in ``::``) get no family ("")."""
    from cosim.models.profile import kernel_family

    fam = kernel_family((name or "").replace("(anonymous namespace)", "(anon)"))
    return "" if fam.endswith("::") else fam  # a name cut at "(anonymous namespace)" says nothing


def launch_tiles(cls: list[str], kernels: list[str]) -> np.ndarray:
    """(rows, cols) CTA tile of GEMM-class kernels from their name (NaN where none / not GEMM-class)."""
    out = named_tiles(kernels)
    for i, (c, k) in enumerate(zip(cls, kernels)):
        if c not in GEMM_CLASSES:
            out[i] = np.nan
        elif not np.isfinite(out[i, 0]):
            mt = _ANY_TILE.search(k or "")
            if mt and 8 <= int(mt.group(1)) <= 512 and 8 <= int(mt.group(2)) <= 512:
                out[i] = (int(mt.group(1)), int(mt.group(2)))
    return out


def launch_work(cls: list[str], kernels: list[str], grid: np.ndarray, block: np.ndarray) -> tuple[np.ndarray, list]:
    """Work proxy and law key (``<class>:tile`` / ``<class>:threads``) of each kernel from its launch.

    NaN work (and key None) where the launch is unknown or the class is not covered."""
    g = np.asarray(grid, dtype=float).reshape(-1, 3)
    b = np.asarray(block, dtype=float).reshape(-1, 3)
    tiles = launch_tiles(cls, kernels)
    known = np.asarray((g > 0).all(axis=1) & (b > 0).all(axis=1))
    ctas = np.prod(np.where(known[:, None], g, 1.0), axis=1)
    threads = ctas * np.prod(np.where(known[:, None], b, 1.0), axis=1)
    tiled = np.isfinite(tiles[:, 0])
    work = np.where(tiled, ctas * np.nan_to_num(tiles[:, 0]) * np.nan_to_num(tiles[:, 1]), threads)
    keys: list = []
    for i, c in enumerate(cls):
        if not known[i] or c in LAUNCH_EXCLUDED:
            work[i] = np.nan
            keys.append(None)
        else:
            keys.append(f"{c}:{'tile' if tiled[i] else 'threads'}")
    return work, keys


def launch_keys(kind_key: str) -> tuple[str, str]:
    """(class, kind) of a law key."""
    c, _, kind = kind_key.rpartition(":")
    return c, kind


def launch_time(work: np.ndarray, law: Mapping[str, float], rate_scale: float = 1.0) -> np.ndarray:
    """``floor + work / (rate * rate_scale)`` (s)."""
    return float(law["floor_s"]) + np.asarray(work, dtype=float) / (float(law["rate"]) * rate_scale)


def scale_rate(kind_key: str, fit_hw: HardwareFigures, hw: HardwareFigures) -> float:
    """Cross-GPU factor on a law's rate: FP32-peak ratio for GEMM classes, HBM ratio otherwise."""
    c, _ = launch_keys(kind_key)
    if c in GEMM_CLASSES or c == "attention":
        return hw.peak("fp32") / fit_hw.peak("fp32")
    return hw.hbm_bandwidth / fit_hw.hbm_bandwidth


def _fit_law(work: np.ndarray, dur: np.ndarray) -> dict[str, float]:
    logd = np.log(dur)

    def fun(x: np.ndarray) -> np.ndarray:
        return np.log(math.exp(x[0]) + work / math.exp(x[1])) - logd

    lo = np.array([math.log(1e-7), math.log(1e3)])
    hi = np.array([math.log(1e-2), math.log(1e16)])
    x0 = np.array([math.log(max(float(np.min(dur)), 2e-7)), math.log(float(np.median(work / dur)))])
    x = _lsq(fun, np.clip(x0, lo, hi), lo, hi)
    return {"floor_s": float(math.exp(x[0])), "rate": float(math.exp(x[1])), "n": len(dur)}


def fit_launch(cls: list[str], kernels: list[str], grid: np.ndarray, block: np.ndarray, dur: np.ndarray) -> dict:
    """Fit the launch laws and family factors on calibration rows (see the module docs).

    Returns the profile's ``launch`` section: ``{"laws": {key: {floor_s, rate, n}}, "family": {family:
    {scale, n}}}`` (empty when no class has :data:`MIN_LAW` rows)."""
    work, keys = launch_work(cls, kernels, grid, block)
    dur = np.asarray(dur, dtype=float)
    ok = np.isfinite(work) & (work > 0) & np.isfinite(dur) & (dur > 0)
    karr = np.array([k or "" for k in keys], dtype=object)
    laws: dict[str, dict[str, float]] = {}
    for key in sorted(set(karr[ok]) - {""}):
        s = ok & (karr == key)
        if s.sum() >= MIN_LAW:
            laws[key] = _fit_law(work[s], dur[s])
    fams: dict[str, list[float]] = {}
    for j in np.flatnonzero(ok):
        law = laws.get(karr[j])
        if law is not None:
            fams.setdefault(launch_family(kernels[j]), []).append(
                math.log(dur[j] / float(launch_time(work[j], law))))
    top = sorted(((f, r) for f, r in fams.items() if f and len(r) >= MIN_FAMILY), key=lambda kv: (-len(kv[1]), kv[0]))
    family = {}
    for f, r in top[:FAMILY_MAX]:
        n = len(r)
        family[f] = {"scale": float(np.clip(math.exp(float(np.median(r)) * n / (n + FAMILY_PRIOR)), 0.125, 8.0)),
                     "n": n}
    return {"laws": laws, "family": family} if laws else {}
