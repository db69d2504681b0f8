"""What-ifs on the GPU's shared resources, applied to measured kernel durations.

A measured kernel duration already holds whatever SM and HBM share the kernel
lost on the traced machine. The laws here therefore scale it by the *change* in
that share, so that identity replay is untouched (every factor is exactly 1)
and a what-if moves only the kernels that use the resource it changes.

**Communication SMs** (``comm_sms``, ``--comm-sms``). A running communication
kernel holds ``c`` SMs (NCCL: one thread block per channel); a compute kernel
that overlaps it is SM-limited to ``(S - c) / S`` of its speed (the engine's GPU
model, docs/ENGINE.md). A compute kernel measured for ``d`` seconds, a fraction
``f`` of which overlapped communication kernels of other streams on its GPU,
did ``f d (S - c0) / S`` of its work during the overlap; with ``c1`` SMs that
work takes ``f d (S - c0) / (S - c1)``, so

    d' = d ((1 - f) + f (S - c0) / (S - c1)).

``S`` is the accelerator's SM count (catalog), ``c0`` the traced communication
kernels' grid size (their median block count on the device: calibrated from the
trace; 16, NCCL's default channel count, when the trace has no grid), ``f`` the
measured overlap. Not calibrated: the law assumes compute kernels are SM-bound
while they overlap (a memory-bound kernel loses less); the overlap is the
trace's, not the replay's.

**HBM bandwidth and peak FLOP/s** (``accelerators.<id>.hbm_bandwidth`` /
``accelerators.<id>.bf16_tflops`` catalog overrides on the replayed GPU).
Memory-bound classes (elementwise, reduction, norm, memset, device copies, other)
scale by ``B0 / B``, compute-bound classes (gemm, grouped GEMM, attention) by the
dense bf16 peak ratio ``P0 / P``: the roofline limits of the cross-accelerator
scaling (cosim.replay.binding), taken between the catalog's part and its
overridden copy.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cosim.engine.gpu import sm_rate
from cosim.replay.binding import _COMPUTE, _MEMORY
from cosim.workload.graph import CopyKind, GpuKind, OpClass, RankGraph

__all__ = ["DEFAULT_COMM_SMS", "comm_overlap", "comm_sm_factor", "hardware_factor", "traced_comm_sms"]

DEFAULT_COMM_SMS = 16
"""SMs of a communication kernel when the trace has no grid for it (NCCL's default channel count)."""

_COMM = (OpClass.COLLECTIVE, OpClass.MOE_DISPATCH, OpClass.MOE_COMBINE)


def _is_comm(rg: RankGraph) -> np.ndarray:
    return np.isin(rg.gpu_ops.cls, _COMM)


def comm_overlap(rg: RankGraph) -> np.ndarray:
    """Per GPU op, the fraction of its measured interval during which a communication op of another stream
    ran on its device (0 for communication ops and ops of unknown time)."""
    G = rg.gpu_ops
    n = len(G)
    out = np.zeros(n)
    comm = _is_comm(rg)
    start = G.start.astype(float)
    end = start + G.dur.astype(float)
    ok = np.isfinite(start) & np.isfinite(end) & (end > start)
    for dev in np.unique(G.device[comm & ok]).tolist():
        on = G.device == dev
        for stream in np.unique(G.stream[on & ~comm & ok]).tolist():
            mine = np.flatnonzero(on & ~comm & ok & (G.stream == stream))
            other = np.flatnonzero(on & comm & ok & (G.stream != stream))
            if not other.size:
                continue
            a, b = _union(start[other], end[other])
            cum = np.r_[0.0, np.cumsum(b - a)]
            out[mine] = (_covered(a, b, cum, end[mine]) - _covered(a, b, cum, start[mine])) / (end[mine] - start[mine])
    return np.clip(out, 0.0, 1.0)


def _union(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    o = np.argsort(s, kind="stable")
    s, e = s[o], e[o]
    run = np.maximum.accumulate(e)
    new = np.r_[True, s[1:] > run[:-1]]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(run, idx)


def _covered(a: np.ndarray, b: np.ndarray, cum: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Length of the union of [a_k, b_k] before each ``t``."""
    k = np.searchsorted(a, t, side="right") - 1
    kk = np.maximum(k, 0)
    part = np.clip(np.minimum(t, b[kk]) - a[kk], 0.0, None)
    return np.where(k >= 0, cum[kk] + part, 0.0)


def traced_comm_sms(rg: RankGraph) -> float:
    """SMs the trace's communication kernels held: the median block count of their grids."""
    G = rg.gpu_ops
    sel = _is_comm(rg) & (G.kind == GpuKind.KERNEL) & (G.grid.min(axis=1) > 0)
    if not sel.any():
        return float(DEFAULT_COMM_SMS)
    return float(np.median(np.prod(G.grid[sel].astype(np.int64), axis=1)))


def comm_sm_factor(rg: RankGraph, sm_count: int, comm_sms: int) -> np.ndarray:
    """Per GPU op, the factor on its measured duration when communication kernels hold ``comm_sms`` SMs
    instead of the traced number (module docstring)."""
    G = rg.gpu_ops
    f = np.ones(len(G))
    rho0 = sm_rate(sm_count, 1, traced_comm_sms(rg))  # the engine's law: (S - c) / S, one SM kept free
    rho1 = sm_rate(sm_count, 1, float(comm_sms))
    if rho0 == rho1:
        return f
    ov = comm_overlap(rg)
    compute = ~_is_comm(rg) & (G.kind != GpuKind.MEMCPY)
    f[compute] = (1.0 - ov[compute]) + ov[compute] * rho0 / rho1
    return f


def hardware_factor(rg: RankGraph, base: Any, changed: Any) -> np.ndarray | None:
    """Per GPU op, the factor for catalog overrides of the replayed accelerator (``changed``) against the
    catalog's own part (``base``); None when neither HBM bandwidth nor the bf16 peak changed."""
    b0, b1 = float(base.hbm_bandwidth), float(changed.hbm_bandwidth)
    p0, p1 = float(base.peak("bf16")), float(changed.peak("bf16"))
    if b0 == b1 and p0 == p1:
        return None
    G = rg.gpu_ops
    f = np.ones(len(G))
    cls = G.cls
    f[np.isin(cls, _COMPUTE)] = p0 / p1
    f[np.isin(cls, _MEMORY)] = b0 / b1
    f[(cls == OpClass.MEMCPY) & (G.copy_kind == CopyKind.DTOD)] = b0 / b1
    return f
