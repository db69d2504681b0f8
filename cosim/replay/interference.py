"""The GPU's shared resources in replay: communication kernels take SMs and HBM bandwidth from the compute
kernels they overlap in the simulation.

**The law** (rates that change only when the set of active kernels on a GPU changes). A communication kernel
(NCCL collective, MoE dispatch/combine) holds ``c`` SMs (one thread block per channel) and a fraction
``h_c`` of HBM bandwidth from when it starts on its stream (waiting for peers included) until it ends. A
compute kernel ``k`` on the same GPU (another stream) progresses, while ``n`` communication kernels run, at

    rate_k(n) = min(rho_SM(n), rho_HBM,k(n))
    rho_SM(n)  = sm_rate(S, n, c) = min(1, max(S - n c, 1) / S)       (it asks for the whole chip)
    rho_HBM,k(n) = min(1, 1 / (h_k + n h_c))  if h_k > 0, else 1

of its standalone speed (roofline-style: it is slowed by the resource it lacks most); ``S`` is the
accelerator's SM count, ``h_k`` is 1 for memory-bound classes (elementwise, reduction, norm, memset, other,
device copies) and 0 for compute-bound ones (GEMM, grouped GEMM, attention).

**Measured durations.** A measured kernel already ran at ``rate_k(1)`` with the traced ``c0`` and ``h_c0`` during
the fraction ``f`` of its interval that overlapped communication kernels of other streams on its GPU (the
trace's overlap), so its standalone work is ``w = d ((1 - f) + f rate0_k)``. Replay with a what-if that changes
the law (``comm_sms`` differs from ``c0``, or the HBM bandwidth ``B`` from the catalog's ``B0``: a communication
kernel then needs ``h_c = h_c0 B0 / B`` of it) runs every compute kernel of such a GPU as ``w`` units of work
at ``rate_k(n(t))``, ``n(t)`` the communication kernels active *in the simulation*. Without such a what-if the
law is off and every kernel keeps its measured duration (list-scheduled: identity replay unchanged). Modeled
durations are standalone already (``f`` = 0).

**Each kernel's own SMs** (synthesized training steps, ``ReplayConfig.comm_share``, on by default): kernel ``i``
holds ``c_i`` SMs (:func:`comm_kernel_sms`: the NCCL channels of the call from
:meth:`cosim.engine.nccl.NcclParams.kernel_channels`, DeepEP's 20, HybridEP's label) and the law takes the sum over
the active ones, ``rho_SM = min(1, max(S - sum_i c_i, 1) / S)``; ``n`` still counts them for HBM. Their durations are
standalone (``f`` = 0). Held-out check: validation/overlap/.

Parameters and calibration: ``S`` from the catalog; ``c0`` = the median grid (blocks) of the trace's
communication kernels (16, NCCL's default channel count, when the trace has none); ``h_c0`` =
``GpuConfig.comm_hbm_fraction`` (0.1: not calibrated); ``f`` from the trace. Not modelled: compute kernels
sharing SMs with each other (their measured durations hold it), L2, clocks and power; the block dispatcher
predicts a stretched kernel's last wave from its standalone duration.

**HBM bandwidth and peak FLOP/s** (``accelerators.<id>.hbm_bandwidth`` / ``accelerators.<id>.bf16_tflops``
catalog overrides on the replayed GPU) also change standalone times: memory-bound classes scale by ``B0 / B``,
compute-bound classes by the dense bf16 peak ratio ``P0 / P`` (the roofline limits of the cross-accelerator
scaling, cosim.replay.binding).
"""

from __future__ import annotations

import heapq
import math
import re
from collections.abc import Callable
from heapq import heappush
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from cosim.replay.binding import _COMPUTE, _MEMORY
from cosim.replay.program import ENGINE_OPS, is_comm
from cosim.workload.graph import CollType, CopyKind, GpuKind, OpClass, RankGraph

__all__ = ["COMM", "COMPUTE", "DEEPEP_SMS", "DEFAULT_COMM_SMS", "GpuShare", "comm_kernel_sms", "comm_overlap",
           "hardware_factor", "share_plan", "sm_rate", "traced_comm_sms", "wave_slowdown"]

DEFAULT_COMM_SMS = 16
"""SMs of a communication kernel when the trace has no grid for it (NCCL's default channel count)."""

DEEPEP_SMS = 20
"""SMs of a DeepEP normal-mode dispatch / combine kernel: Megatron-Core's ``moe_deepep_num_sms`` default (20; DeepEP's
``Buffer.num_sms`` default, the DeepSeek-V3 report's 20 SMs, section 3.2.2). Low-latency kernels: 0 (they progress
RDMA from a hook, as cosim's serving steps model them)."""

_UB_PIECE = re.compile(r"\.ub\d+$")
"""Names of Transformer Engine userbuffers pieces (cosim.workload.synth.tpoverlap): the synthesizer already
scales the GEMM they overlap by their ``num_sm`` (ring-exchange steps run on copy engines: no SM)."""

COMM, COMPUTE = 1, 2
"""Roles of a GPU op in :class:`GpuShare` (0: not shared)."""


def sm_rate(sm_count: float, comm_kernels: float, comm_sms: float, demand: float | None = None) -> float:
    """Speed (fraction of standalone) of compute kernels asking for ``demand`` SMs (None: the whole chip) while
    ``comm_kernels`` communication kernels hold ``comm_sms`` SMs each: ``free / demand`` when the demand exceeds
    the free SMs (at least one SM stays free), else 1."""
    free = max(sm_count - comm_kernels * comm_sms, 1.0)
    want = sm_count if demand is None else demand
    return min(1.0, free / want) if want > 0 else 1.0


def wave_slowdown(ctas: float, sm_count: float, held: float, per_sm: int = 1) -> float:
    """Slowdown of a kernel of ``ctas`` equal thread blocks (``per_sm`` resident per SM) while other kernels hold
    ``held`` of the ``sm_count`` SMs for its whole run: its waves on the free SMs over its waves alone,
    ``ceil(ctas / (per_sm (S - held))) / ceil(ctas / (per_sm S))`` (at least one SM stays free).

    Persistent GEMMs (CUTLASS 3.x ``StaticPersistentTileScheduler``, Hopper / Blackwell) launch
    ``min(tiles, S)`` CTAs sized from the device's SM count (``KernelHardwareInfo.sm_count``) and give CTA ``i``
    the tiles ``i, i + grid, i + 2 grid, ...`` (``advance_to_next_work``): every CTA has the same work, so the
    same formula over the launched CTAs holds, ``ceil(S / (S - held))`` (2 for ``0 < held < S / 2``) whatever the
    tile count, unless the library was told the SMs left (cuBLASLt ``CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET``;
    Transformer Engine passes ``S - NVTE_EXT_MARGIN_SM``, default margin 0: all SMs). Non-persistent kernels
    (one tile per CTA) tend to the fluid :func:`sm_rate` as their waves grow. Not used by the replay (synthesized
    GEMMs carry no CTA count yet): scored held out in validation/overlap."""
    free = max(sm_count - held, 1.0)
    alone = math.ceil(ctas / (per_sm * sm_count)) if ctas > 0 else 0
    return math.ceil(ctas / (per_sm * free)) / alone if alone else 1.0


def hbm_rate(h_kernel: float, comm_kernels: float, h_comm: float) -> float:
    """Speed of a kernel that uses ``h_kernel`` of HBM bandwidth alone beside ``comm_kernels`` communication
    kernels using ``h_comm`` each: ``1 / total`` when the total exceeds 1 (kernels that use no HBM: 1)."""
    if h_kernel <= 0:
        return 1.0
    total = h_kernel + comm_kernels * h_comm
    return min(1.0, 1.0 / total) if total > 0 else 1.0


def _is_comm(rg: RankGraph) -> np.ndarray:
    return is_comm(rg.gpu_ops.cls)


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


def comm_kernel_sms(rg: RankGraph, nccl: Any, channels: int | None = None, gpus_per_node: int | None = None,
                    default: float = float(DEFAULT_COMM_SMS)) -> np.ndarray:
    """Per GPU op of ``rg``, the SMs it holds while it runs (0 for ops that are not communication kernels):
    its own count, read from what launches it. NCCL kernels: one CTA per channel,
    :meth:`cosim.engine.nccl.NcclParams.kernel_channels` for the op, its bytes and the communicator's ``channels``
    (``cross_node``: a peer of the group on another node of ``gpus_per_node`` GPUs); DeepEP (engine label
    ``deepep_<kind>:<mode>:...``): :data:`DEEPEP_SMS` (normal) or 0 (``ll``); HybridEP (``hybridep_...:<SMs>``): its
    label's SMs (Megatron-Core ``moe_hybridep_num_sms``); userbuffers pieces: 0 (already in the GEMM's time);
    anything else: ``default``, except in a synthesized graph, where a dispatch/combine-class op with no
    collective (the permutation, sort and unpermute kernels) is no communication kernel: -1 (:func:`share_plan`
    runs it as a memory-bound compute kernel). Cost: O(ops) numpy, one look-up per distinct kernel name and label,
    one ``kernel_channels`` call per distinct (type, group, bytes, peer across nodes, ranks)."""
    G = rg.gpu_ops
    out = np.zeros(len(G))
    comm = np.flatnonzero(_is_comm(rg) & (G.kind == GpuKind.KERNEL))
    if not comm.size:
        return out
    synthetic = bool(rg.source.get("synthetic"))
    C = rg.collectives
    S = rg.strings
    # one look-up per distinct name / label / (type, group, bytes, peer) key, not per op: O(ops) numpy
    nm = G.name[comm].astype(np.int64)
    un, inv = np.unique(nm, return_inverse=True)
    ub = np.array([u >= 0 and bool(_UB_PIECE.search(S[int(u)])) for u in un.tolist()], dtype=bool)[inv]
    c = G.collective[comm].astype(np.int64)
    valid = (c >= 0) & (c < len(C)) & ~ub
    out[comm[~valid & ~ub]] = default if not synthetic else -1.0
    j = comm[valid]
    cv = c[valid]
    if not j.size:
        return out
    lab = C.name[cv].astype(np.int64)
    ul, linv = np.unique(lab, return_inverse=True)
    kinds = []  # 0: NCCL, 1: DeepEP normal, 2: DeepEP low-latency, 3: HybridEP (value), 4: HybridEP unreadable
    hyb = []
    for u in ul.tolist():
        label = S[int(u)] if u >= 0 else ""
        v = 0.0
        if label.startswith("deepep_"):
            parts = label.split(":")
            k = 2 if len(parts) > 1 and parts[1] == "ll" else 1
        elif label.startswith("hybridep_"):
            try:
                v, k = float(label.rsplit(":", 1)[1]), 3
            except (IndexError, ValueError):
                k = 4
        else:
            k = 0
        kinds.append(k)
        hyb.append(v)
    kind = np.asarray(kinds, dtype=np.int8)[linv]
    out[j[kind == 1]] = float(DEEPEP_SMS)
    out[j[kind == 2]] = 0.0
    out[j[kind == 3]] = np.asarray(hyb)[linv][kind == 3]
    out[j[kind == 4]] = default
    nc = kind == 0
    if not nc.any():
        return out
    j, cv = j[nc], cv[nc]
    typ = C.type[cv].astype(np.int64)
    ib, ob = C.in_bytes[cv].astype(float), C.out_bytes[cv].astype(float)
    nbytes = np.maximum(np.maximum(np.where(np.isfinite(ib), ib, 0.0), np.where(np.isfinite(ob), ob, 0.0)), 0.0)
    grp = C.group[cv].astype(np.int64)
    gsz = C.group_size[cv].astype(np.int64)
    p2p = np.isin(typ, (CollType.SEND, CollType.RECV, CollType.SEND_RECV))
    cross = np.zeros(len(j), dtype=bool)
    size = np.where(gsz > 0, gsz, 0)
    if gpus_per_node:
        sel = p2p & (grp >= 0) & (grp < len(rg.groups))
        for g in np.unique(grp[sel]).tolist():
            ranks = rg.groups.ragged("ranks", g)
            on = sel & (grp == g)
            cross[on] = bool(ranks.size) and bool(np.any(ranks // gpus_per_node != rg.rank // gpus_per_node))
            size[on & (size == 0)] = int(ranks.size)
    keys = np.stack([typ, grp, nbytes.view(np.int64), cross.astype(np.int64), size], axis=1)
    uk, kinv = np.unique(keys, axis=0, return_inverse=True)
    vals = np.empty(len(uk))
    for i, (t, _g, bb, x, n) in enumerate(uk.tolist()):
        vals[i] = float(nccl.kernel_channels(ENGINE_OPS.get(int(t), "all_reduce"), float(np.int64(bb).view(np.float64)),
                                             channels, bool(x), int(n) or None))
    out[j] = vals[kinv.reshape(-1)]
    return out


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


def share_roles(rg: RankGraph) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU op of ``rg``: its role (COMM, COMPUTE, 0), its HBM demand alone ``h_k`` (0 or 1) and whether it
    runs on SMs. Compute roles only on devices that run communication kernels (nothing can slow the others)."""
    G = rg.gpu_ops
    comm = _is_comm(rg) & (G.kind == GpuKind.KERNEL)
    dtod = (G.kind == GpuKind.MEMCPY) & (G.copy_kind == CopyKind.DTOD)
    compute = ((G.kind != GpuKind.MEMCPY) & ~comm) | dtod
    compute &= np.isin(G.device, np.unique(G.device[comm]))
    roles = np.where(comm, COMM, np.where(compute, COMPUTE, 0)).astype(np.int8)
    h = np.where(np.isin(G.cls, _MEMORY) | dtod, 1.0, 0.0)
    sms = ~dtod
    return roles, h, sms


def share_plan(rg: RankGraph, sm_count: float, comm_sms: float | None, comm_hbm_fraction: float,
               hbm_ratio: float = 1.0, measured: bool = True, op_sms: np.ndarray | None = None) -> dict[str, Any] | None:
    """The law's inputs for one rank, or None when it would change nothing (no communication kernel, or
    ``comm_sms`` equal to the traced count and the HBM bandwidth unchanged). ``hbm_ratio`` = ``B0 / B``;
    ``measured``: the durations hold the traced overlap (module docstring), else they are standalone;
    ``op_sms``: each communication kernel's own SMs (:func:`comm_kernel_sms`; with ``comm_sms`` None)."""
    roles, h, sms = share_roles(rg)
    if not (roles == COMM).any():
        return None
    c0 = traced_comm_sms(rg)
    per_kernel = op_sms is not None and comm_sms is None and not measured
    c1 = c0 if comm_sms is None else float(comm_sms)
    if per_kernel:
        assert op_sms is not None
        local = (roles == COMM) & (op_sms < 0)  # local permutation kernels: memory-bound compute
        if local.any():
            roles = np.where(local, COMPUTE, roles).astype(np.int8)
            h = np.where(local, 1.0, h)
            op_sms = np.maximum(op_sms, 0.0)
            if not (roles == COMM).any():
                return None
        held = op_sms[roles == COMM]
        c1 = float(np.median(held)) if held.size else 0.0
    hc0 = float(comm_hbm_fraction)
    hc1 = hc0 * float(hbm_ratio)
    if c1 == c0 and hc1 == hc0 and measured:
        return None
    work = np.ones(len(roles))
    if measured:
        f = comm_overlap(rg)
        rho_sm = sm_rate(sm_count, 1, c0)
        rate0 = np.where(sms, rho_sm, 1.0)
        hb = h + hc0
        rate0 = np.minimum(rate0, np.where(h > 0, np.minimum(1.0, 1.0 / hb), 1.0))
        work = np.where(roles == COMPUTE, (1.0 - f) + f * rate0, 1.0)
    return {"roles": roles, "h": h, "sms": sms, "work": work, "device": rg.gpu_ops.device.astype(np.int64),
            "sm_count": float(sm_count), "comm_sms": c1, "h_comm": hc1, "traced_comm_sms": c0,
            "op_sms": np.minimum(op_sms, float(sm_count)) if per_kernel and op_sms is not None else None}


class _Kernel:
    """A compute kernel on a :class:`_Device`, made by :meth:`GpuShare.start_op` only (which sets every field, no
    ``__init__``: one Python call less per kernel): ``work`` standalone seconds, ``remaining`` of them, its HBM
    demand ``h`` and SM use ``sms``, ``start`` (s), ``done(start, end)`` at its end (None: the device's
    ``sink(kernel, end)``, the executor's path), the caller's ``rank`` tag and ``op``, its ``rate``, whether a rate
    below 1 ever applied (``touched``) and its projected end ``due`` (s).

    It is also the device's wake-up for its own end that :meth:`GpuShare.start_op` pushes (``callbacks``, ``gen``,
    ``target`` as on :class:`_Wake`; set only then): pushed at most once, so its generation stays the one it was
    pushed with."""

    __slots__ = ("callbacks", "done", "due", "gen", "h", "op", "rank", "rate", "remaining", "sms", "start", "target",
                 "touched", "work")
    _ok = True
    """Never fails (read by the engine's step, as :attr:`_Wake._ok`)."""
    callbacks: Any
    done: Callable[[float, float], None] | None
    due: float
    gen: int
    h: float
    op: int
    rank: Any
    rate: float
    remaining: float
    sms: bool
    start: float
    target: float
    touched: bool
    work: float


_new_kernel = object.__new__
"""``_new_kernel(_Kernel)``: a kernel with no field set (:meth:`GpuShare.start_op` sets them)."""


class _Wake:
    """A device's wake-up on the engine's queue: what a ``simpy.Timeout`` would be there (the same place in the
    queue), without a Timeout's checks and value; ``gen`` and ``target`` as :meth:`_Device._tick` reads them."""

    __slots__ = ("callbacks", "gen", "target")
    _ok = True
    """Never fails (read by the engine's step)."""

    def __init__(self, callbacks: tuple[Callable[[Any], None]], gen: int, target: float) -> None:
        self.callbacks: Any = callbacks
        self.gen = gen
        self.target = target


class _Device:
    """One GPU: its compute kernels (remaining standalone seconds; a kernel registered before its start waits in
    the set and progresses from its start), the communication kernels active, and the changes of that count to
    come, in time order. Compute kernels do not slow each other (their measured durations hold that), so each
    one's rate depends only on the count: one wake-up is pending per device on the engine's queue, at the earlier
    of the next change of the count and the next projected completion, and rates are re-solved only when the
    count changes or a kernel joins or leaves (O(kernels in flight) each)."""

    __slots__ = (
        "_cbs",
        "_eid",
        "_queue",
        "c_comm",
        "comm_sms",
        "env",
        "gen",
        "h_comm",
        "n_comm",
        "pending",
        "rates",
        "running",
        "seq",
        "sink",
        "sm_count",
        "t_last",
        "wake",
    )

    def __init__(self, env: simpy.Environment, sm_count: float, comm_sms: float, h_comm: float,
                 sink: Callable[[_Kernel, float], None] | None = None) -> None:
        self.env = env
        self.sm_count = sm_count
        self.comm_sms = comm_sms
        self.h_comm = h_comm
        self.sink = sink
        self.n_comm = 0
        self.c_comm = 0.0
        """SMs the active communication kernels hold together (the sum of their own counts)."""
        self.running: list[_Kernel] = []
        self.pending: list[tuple[float, int, int, float]] = []
        """Heap of changes of the communication kernels to come: (time, order, delta of the count, of the SMs)."""
        self.seq = 0
        self.t_last = env.now
        self.gen = 0
        self.wake = math.inf
        self.rates: dict[tuple[int, float, float, bool], float] = {}
        self._cbs = (self._on_wake,)
        self._queue: list[Any] = env._queue  # simpy's event heap: (time, priority, id, event)
        self._eid = env._eid

    def _advance(self, now: float) -> None:
        t0 = self.t_last
        if now > t0:
            for k in self.running:
                b = k.start
                if b < now:
                    k.remaining -= k.rate * (now - (b if b > t0 else t0))
                    if k.rate != 1.0:
                        k.touched = True
        self.t_last = now

    def comm(self, t: float, delta: int, sms: float | None = None) -> None:
        """From ``t`` (>= now), ``delta`` more communication kernels holding ``sms`` SMs each (None: the
        device's ``comm_sms``)."""
        dc = delta * (self.comm_sms if sms is None else sms)
        if t > self.env._now:
            self.seq += 1
            heapq.heappush(self.pending, (t, self.seq, delta, dc))
            if t < self.wake:
                self._wake_at(t)
            return
        self._advance(self.env._now)
        self._change(delta, dc)
        self._reschedule()

    def _change(self, delta: int, dc: float) -> None:
        self.n_comm += delta
        self.c_comm += dc
        if self.n_comm <= 0 or abs(self.c_comm) < 1e-9:  # no float residue once every kernel has left
            self.c_comm = 0.0 if self.n_comm <= 0 else max(self.c_comm, 0.0)

    def _rate(self, n: int, k: _Kernel) -> float:
        """The law's rate of ``k`` beside ``n`` > 0 communication kernels holding ``c_comm`` SMs together
        (memoized per n, their SMs, h_k, SM use)."""
        c = self.c_comm
        key = (n, c, k.h, k.sms)
        r = self.rates.get(key)
        if r is None:
            if len(self.rates) > 4096:
                self.rates.clear()
            r = self.rates[key] = min(sm_rate(self.sm_count, 1, c) if k.sms else 1.0,
                                      hbm_rate(k.h, n, self.h_comm))
        return r

    def _wake_at(self, t: float) -> None:
        """Wake up at ``t`` (>= now): pushed where ``env.timeout(t - now)`` would be (the same float time, the
        next id); an earlier wake-up still queued is stale (its generation is no longer current). Inlined in
        :meth:`GpuShare.start_op`: a change here is made there."""
        self.gen = gen = self.gen + 1
        self.wake = t
        now = self.env._now
        heappush(self._queue, (now + (t - now), NORMAL, next(self._eid), _Wake(self._cbs, gen, t)))

    def _on_wake(self, ev: _Wake | _Kernel) -> None:
        """The current wake-up (a stale one does nothing). The common case, one kernel in flight that ends now
        with no change of the communication kernels due by then, is :meth:`_tick` worked out for it (the same
        state and the same queue pushes in the same order, without the general loops): O(1)."""
        if ev.gen != self.gen:
            return
        run = self.running
        if len(run) != 1:
            self._tick(ev.target)
            return
        k = run[0]
        now = self.env._now
        target = ev.target
        due = now if now > target else target
        pend = self.pending
        if k.start > due or k.due > due or (pend and pend[0][0] <= due):
            self._tick(target)
            return
        if k.rate != 1.0 and k.start < now and now > self.t_last:  # _advance's mark of a slowed kernel
            k.touched = True
        self.t_last = now
        self.running = []
        if pend and pend[0][0] < math.inf:  # _reschedule with nothing in flight: wake for the next change
            self._wake_at(pend[0][0])
        else:
            self.gen += 1
            self.wake = math.inf
        end = now if k.touched else k.start + k.work
        if k.done is None:
            self.sink(k, end)  # type: ignore[misc]
        else:
            k.done(k.start, end)

    def _reschedule(self) -> None:
        n = self.n_comm
        now = self.env._now
        t = math.inf
        if n:
            for k in self.running:
                r = self._rate(n, k)
                k.rate = r
                d = (k.start if k.start > now else now) + (k.remaining / r if k.remaining > 0 else 0.0)
                k.due = d
                if d < t:
                    t = d
        else:
            for k in self.running:
                k.rate = 1.0
                d = (k.start if k.start > now else now) + (k.remaining if k.remaining > 0 else 0.0)
                k.due = d
                if d < t:
                    t = d
        if self.pending and self.pending[0][0] < t:
            t = self.pending[0][0]
        if t == math.inf:
            self.gen += 1  # nothing to come: a pending wake-up is stale
            self.wake = math.inf
        elif t != self.wake or t <= now:
            self._wake_at(t)

    def _tick(self, target: float) -> None:
        self.wake = math.inf
        now = self.env._now
        run = self.running
        self._advance(now)
        due = now if now > target else target  # the clock may land an ulp short of the time it woke for
        pend = self.pending
        while pend and pend[0][0] <= due:
            _, _, dn, dc = heapq.heappop(pend)
            self._change(dn, dc)
        fin: list[_Kernel] = []
        keep: list[_Kernel] = []
        for k in run:
            if k.start <= due and (k.due <= due or k.remaining <= 1e-12 * k.work + 1e-15):
                fin.append(k)
            else:
                keep.append(k)
        self.running = keep
        self._reschedule()
        sink = self.sink
        for k in fin:
            end = now if k.touched else k.start + k.work  # never slowed: exactly start + work
            if k.done is None:
                sink(k, end)  # type: ignore[misc]
            else:
                k.done(k.start, end)


_Ops = tuple[list[float], list[float], list[bool], list[_Device], int, list[float] | None]
"""A rank's ops as :meth:`GpuShare.ops_of` gives them."""


class GpuShare:
    """SM and HBM sharing between communication and compute kernels of the replayed GPUs (module docstring).

    Args:
        env: the replay's simpy environment.
        plans: rank -> :func:`share_plan` (ranks without one are not shared).
    """

    def __init__(self, env: simpy.Environment, plans: dict[int, dict[str, Any]]) -> None:
        self.env = env
        self.plans = plans
        self.roles: dict[int, list[int]] = {r: p["roles"].tolist() for r, p in plans.items()}
        """Rank -> role of each GPU op (COMM, COMPUTE, 0); what the executor reads."""
        self._work = {r: p["work"].tolist() for r, p in plans.items()}
        self._h = {r: p["h"].tolist() for r, p in plans.items()}
        self._sms = {r: p["sms"].tolist() for r, p in plans.items()}
        self._dev = {r: p["device"].tolist() for r, p in plans.items()}
        self._csms: dict[int, list[float] | None] = {
            r: (p["op_sms"].tolist() if p.get("op_sms") is not None else None) for r, p in plans.items()}
        """Rank -> SMs of each communication op (its own count; None: the plan's ``comm_sms`` for every one)."""
        self.devices: dict[tuple[int, int], _Device] = {}
        self._ops: dict[int, _Ops] = {}  # :meth:`start`'s ops_of per rank
        self.count = 0
        """Compute kernels that ran under the law."""
        self.sink: Callable[[_Kernel, float], None] | None = None
        """Where :meth:`start_op`'s kernels end: ``sink(kernel, end)`` (its ``rank``, ``op``, ``start``)."""

    def close(self) -> None:
        """The replay ended: drop :attr:`sink` and each device's wake-up callback (references back to the executor
        and to the device itself), so that what the replay built is freed by reference counting when it returns
        rather than at the collector's next full collection."""
        self.sink = None
        for d in self.devices.values():
            d.sink = None
            d._cbs = ()  # type: ignore[assignment]

    def _device(self, rank: int, j: int) -> _Device:
        key = (rank, self._dev[rank][j])
        d = self.devices.get(key)
        if d is None:
            p = self.plans[rank]
            d = self.devices[key] = _Device(self.env, p["sm_count"], p["comm_sms"], p["h_comm"], self.sink)
        return d

    def start_comm(self, rank: int, j: int, t: float) -> None:
        """Communication op ``j`` of ``rank`` holds its SMs and HBM share from ``t`` (>= now)."""
        c = self._csms[rank]
        self._device(rank, j).comm(t, 1, None if c is None else c[j])

    def end_comm(self, rank: int, j: int, t: float) -> None:
        """... until ``t`` (>= now)."""
        c = self._csms[rank]
        self._device(rank, j).comm(t, -1, None if c is None else c[j])

    def start(self, rank: int, j: int, t: float, duration: float, done: Callable[[float, float], None]) -> None:
        """Compute op ``j`` of ``rank`` (its duration in the replay ``duration``) starts at ``t`` (>= now);
        ``done(start, end)`` is called at its simulated end (from a simpy callback, never synchronously):
        :meth:`start_op` on the rank's :meth:`ops_of` (made at its first op)."""
        ops = self._ops.get(rank)
        if ops is None:
            ops = self._ops[rank] = self.ops_of(rank)
        self.start_op(ops, None, j, t, duration, done)

    def ops_of(self, rank: int) -> _Ops:
        """What :meth:`start_op` and :meth:`comm_op` read of ``rank``'s ops: work factors, HBM demands, SM use,
        the device of each op (made now, one per distinct device: set :attr:`sink` first), the rank, communication
        SMs."""
        dev = self._dev[rank]
        made = {x: self._device(rank, j) for x, j in {x: j for j, x in enumerate(dev)}.items()}
        return self._work[rank], self._h[rank], self._sms[rank], [made[x] for x in dev], rank, self._csms[rank]

    def comm_op(self, ops: _Ops, j: int, t: float, delta: int) -> None:
        """:meth:`start_comm` (``delta`` 1) or :meth:`end_comm` (-1) of op ``j`` of :meth:`ops_of`'s rank."""
        c = ops[5]
        ops[3][j].comm(t, delta, None if c is None else c[j])

    def start_op(self, ops: _Ops, tag: Any, j: int, t: float, duration: float,
                 done: Callable[[float, float], None] | None = None) -> None:
        """Compute op ``j`` of :meth:`ops_of`'s rank (its duration in the replay ``duration``) starts at ``t`` (>=
        now) on its device; its end goes to ``done(start, end)``, or with None (the executor's hot path) to
        :attr:`sink` (set before the first device is made) as ``sink(kernel, end)``, the kernel carrying ``tag``
        as its ``rank`` and ``j`` as its ``op``: no closure and no look-up by rank per op. The others' rates do
        not change: O(1). The device's :meth:`_Device._wake_at` inlined, the kernel itself as its wake-up (no
        :class:`_Wake`)."""
        self.count += 1
        d = ops[3][j]
        k = _new_kernel(_Kernel)
        k.work = k.remaining = duration * ops[0][j]
        k.h = ops[1][j]
        k.sms = ops[2][j]
        k.start = t
        k.done = done
        k.rank = tag
        k.op = j
        k.touched = False
        n = d.n_comm
        now = d.env._now
        b = t if t > now else now
        if n:
            r = d._rate(n, k)
            k.rate = r
            e = b + k.remaining / r
        else:
            k.rate = 1.0
            e = b + k.remaining
        k.due = e
        d.running.append(k)
        if e < d.wake or e <= now:  # d._wake_at(e), inlined: the kernel is the wake-up
            d.gen = k.gen = d.gen + 1
            d.wake = k.target = e
            k.callbacks = d._cbs
            heappush(d._queue, (now + (e - now), NORMAL, next(d._eid), k))


def build_share(env: simpy.Environment, ranks: list[RankGraph], sm_count: float, comm_sms: float | None,
                comm_hbm_fraction: float, hbm_ratio: float = 1.0, measured: bool = True, nccl: Any = None,
                channels: int | None = None, gpus_per_node: int | None = None) -> GpuShare | None:
    """The :class:`GpuShare` of a replay, or None when the law changes nothing on any rank (:func:`share_plan`).
    ``nccl`` (NCCL parameters, with standalone durations and ``comm_sms`` None): each communication kernel holds
    its own SMs (:func:`comm_kernel_sms`)."""
    plans = {}
    for rg in ranks:
        op_sms = comm_kernel_sms(rg, nccl, channels, gpus_per_node) \
            if nccl is not None and comm_sms is None and not measured else None
        p = share_plan(rg, sm_count, comm_sms, comm_hbm_fraction, hbm_ratio, measured, op_sms)
        if p is not None:
            plans[rg.rank] = p
    return GpuShare(env, plans) if plans else None
