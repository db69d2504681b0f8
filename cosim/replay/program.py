"""Compile one rank of an execution graph into replayable programs.

A host thread becomes a *program*: the sequence of its launch and synchronize
calls, each at a *static* time — where it would fall if the thread never had
to wait for the GPU. Host work between calls (profiled ops, and the unprofiled
gaps between them) is fixed, so everything on a thread between two blocking
calls moves together: at run time a thread only tracks its accumulated *stall*
(time spent blocked beyond a call's own cost), and any host op's simulated time
is its static time plus the stall accumulated before it.

GPU ops become a dependency graph: each op waits for its launch (ready at the
launch call's start plus the launch-to-start latency), its predecessor on the
same stream, and the cross-stream event waits the trace shows. An op whose launch
is not in the trace follows its stream predecessor (or, first on its stream, the op
that ended last before it) after the recorded idle time.

Only the rank's first op is placed at its recorded time: a thread other than the
main one, and a launchless GPU op with nothing before it, is anchored to the
main-thread op that last started before it.

Units: seconds, relative to the rank's ``time_origin``.
"""

from __future__ import annotations

import fnmatch
import itertools
import math
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from zlib_ng import zlib_ng

from cosim.replay.config import ReplayConfig
from cosim.workload.graph import CollType, CopyKind, EdgeKind, GpuKind, HostKind, OpClass, RankGraph

__all__ = ["ENGINE_OPS", "LAUNCH", "SYNC", "THREADS_PER_SM", "RankProgram", "ThreadProgram", "compile_program", "compile_rank",
           "gpu_successors", "gpu_waits", "last_wave", "rank_digest"]

LAUNCH, SYNC = 0, 1
"""Program event kinds."""

ENGINE_OPS: dict[int, str] = {
    CollType.ALL_REDUCE: "all_reduce",
    CollType.ALL_GATHER: "all_gather",
    CollType.REDUCE_SCATTER: "reduce_scatter",
    CollType.ALL_TO_ALL: "all_to_all",
    CollType.BROADCAST: "broadcast",
    CollType.REDUCE: "reduce",
    CollType.SEND: "send_recv",
    CollType.RECV: "send_recv",
    CollType.SEND_RECV: "send_recv",
}
"""Execution-graph collective types that the engine can put on the fabric."""


@dataclass
class ThreadProgram:
    """The blocking structure of one host thread.

    ``ev_kind[k]`` is LAUNCH or SYNC, ``ev_host[k]`` the host op, ``ev_static[k]``
    the static time of the call's start (s), ``ev_cost[k]`` a SYNC's own cost (s).
    """

    thread: int
    ev_kind: list[int]
    ev_host: list[int]
    ev_static: list[float]
    ev_cost: list[float]
    anchor_thread: int = -1
    """The thread this one's start depends on (the rank's main thread), or -1 for the
    main thread itself, whose first op is the rank's origin."""
    anchor_syncs: int = 0
    """SYNC events of ``anchor_thread`` before the anchor op: this thread starts only
    after they returned, and inherits the stall they accumulated."""


@dataclass
class RankProgram:
    """Everything the executor needs for one rank (plain lists for fast indexing)."""

    rank: int
    threads: list[ThreadProgram]
    host_static_start: np.ndarray
    """Static start of every host op (s)."""
    host_static_end: np.ndarray
    """Static end of every host op (s)."""
    host_syncs_before_start: np.ndarray
    """Per host op: SYNC events of its thread that end before it starts (index into the thread's stall prefix sums)."""
    host_syncs_before_end: np.ndarray
    """Per host op: SYNC events of its thread that end before it ends."""
    host_sync_event: np.ndarray
    """Per host op: its thread-local SYNC event index, or -1."""
    launch_gpu: dict[int, list[int]]
    """Host op -> GPU ops it enqueues."""
    sync_deps: dict[int, list[int]]
    """Host op (SYNC / LAUNCH_SYNC) -> GPU ops it waits for."""
    gpu_dur: list[float]
    """Effective duration of each GPU op (s), after knobs."""
    gpu_stream_pred: list[int]
    """GPU op -> the op before it on its stream (-1 for the first). A GPU op with no
    launch in the trace and no op before it on its stream points to its *anchor*
    instead: the GPU op of the rank that ended last before it started."""
    gpu_pred_gap: list[float]
    """GPU op -> time between its ``gpu_stream_pred``'s end and its earliest start (s):
    the kernel gap for launched ops; for ops without a launch in the trace, the
    recorded idle time after that predecessor (kept as a delay, like host gaps)."""
    gpu_preds: list[list[int]]
    """GPU op -> GPU ops on other streams it waits for (event waits)."""
    kernel_gap: float
    """Minimum time between the end of an op and the start of the next on the same stream (s)."""
    kernel_gap_source: str
    gpu_orphan_ready: dict[int, float]
    """GPU ops with no launch in the trace -> ready time. Those with a predecessor or an
    anchor are ready at the rank's origin (their start comes from that dependency);
    only ops that started before any GPU op of the rank had ended, the head of the
    replay, keep their recorded offset from the rank's origin."""
    gpu_host_anchor: dict[int, tuple[int, int, float]]
    """GPU ops without a launch that started before any GPU op of the rank ended, but
    after the main thread's first op -> (main thread, SYNC events of it before the anchor
    op, static ready time): ready at the main-thread op that last started before them,
    plus the recorded time since its start, plus the stall of those SYNC events."""
    launch_delay: dict[int, float]
    """Launch host op -> extra delay before its GPU ops are submitted (s): a launch call
    longer than the rank's median launch spends the excess before submission (lazy
    module loading, argument packing), as kernels on an idle GPU show in real traces."""
    launch_latency: float
    """Launch-to-start latency used (s)."""
    launch_latency_source: str
    gpu_hidden_delay: dict[int, float] = field(default_factory=dict)
    """Launched GPU op -> time the trace shows it waiting on an idle GPU after its launch (s): unrecorded GPU
    work (see :func:`hidden_gpu_delay`); added to its ready time."""
    gpu_device: list[int] | None = None
    """GPU op -> device index (for the block dispatcher; None: no op fills its GPU)."""
    gpu_launch_host: np.ndarray | None = None
    """GPU op -> the host op that launched it, -1 for none (int64; ``launch_gpu`` inverted; read by the
    summary's critical path; None: not recorded, the summary inverts ``launch_gpu`` itself)."""
    gpu_last_wave: list[float] | None = None
    """GPU op -> duration of its last wave of thread blocks when it fills its GPU (more blocks than the
    GPU holds at once), else 0 (s): see :func:`last_wave`."""
    gpu_waits: list[int] | None = None
    """GPU op -> dependencies it waits for before it can start: its launch (or orphan ready time), its stream
    predecessor if any, and its ``gpu_preds`` (the executor's starting countdown, copied per replay)."""
    gpu_succ: list[list[int]] | None = None
    """GPU op -> GPU ops that wait for it (``gpu_preds`` and ``gpu_stream_pred`` inverted; read-only)."""
    measured: dict[str, Any] | None = None
    """The summary's figures of the trace itself for this rank (its measured step times and breakdown), which
    depend on the rank's graph alone: worked out by the first summary of a replay with this program and kept
    here, so replays that share the program (:func:`compile_rank`'s memo) share them (set after compiling, as
    is :attr:`summary_static`)."""
    summary_static: dict[str, Any] | None = None
    """Columns of the rank's graph that the summary reads at every replay (op class masks, its critical path's
    Python lists, each thread's synchronize host ops), worked out by the first summary with this program and
    kept here (:func:`cosim.replay.summary.critical_path`)."""
    thread_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
    """Per thread of :attr:`threads`: its host ops and, at them, ``host_syncs_before_start`` and
    ``host_syncs_before_end``; worked out by the first replay with this program and kept here (the executor's
    host times, ``Executor._result``)."""
    host_index: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray] | None] | None = None
    """The executor's host times' index (``Executor._result``, ``executor._host_index``): per count of
    synchronize calls each thread passed, the threads' host ops and where each reads its stall; worked out by
    the first replay with this program and kept here."""
    link_static: tuple[Any, ...] | None = None
    """What the link attribution reads of the rank's graph (its collective ops and their keys, its copy ops by
    kind: :func:`cosim.replay.links.rank_static`), worked out by the first replay with this program and kept
    here."""
    copy_static: tuple[Any, ...] | None = None
    """The rank's host <-> device copies that can run on the fabric, by direction, and their fixed part
    (:func:`cosim.replay.copies.copy_ops` of the graph and :attr:`gpu_dur`), worked out by the first replay with
    this program and kept here."""


THREADS_PER_SM = 2048
"""Resident threads per SM (Volta to Blackwell data-center parts): bounds the blocks an SM holds at once."""


def last_wave(rg: RankGraph, dur: np.ndarray, sm_count: int, threads_per_sm: int = THREADS_PER_SM) -> np.ndarray:
    """Per GPU op, the time of its last wave of thread blocks if it fills the GPU, else 0 (s).

    The block dispatcher is in order: once a kernel holds every SM, a kernel of another stream gets its first
    blocks only when the first kernel's last blocks have been dispatched. A kernel of ``B`` blocks of ``T``
    threads runs in ``waves = ceil(B / (sm_count * min(32, threads_per_sm // T)))`` waves (occupancy bounded
    by threads only: registers and shared memory can only lower it); with ``waves >= 2`` it fills the GPU and
    its last wave lasts ``dur / waves``. Ops without grid and block (copies, CPU-side or unknown) never fill it.
    """
    G = rg.gpu_ops
    out = np.zeros(len(G))
    if not len(G) or sm_count <= 0:
        return out
    gx, gy, gz = (G.grid[:, k].astype(np.int64) for k in range(3))  # by column: no per-row reductions
    bx, by, bz = (G.block[:, k].astype(np.int64) for k in range(3))
    known = (np.minimum(np.minimum(gx, gy), gz) > 0) & (np.minimum(np.minimum(bx, by), bz) > 0) \
        & (G.kind != GpuKind.MEMCPY)
    blocks = np.maximum(gx, 1) * np.maximum(gy, 1) * np.maximum(gz, 1)
    threads = np.maximum(bx, 1) * np.maximum(by, 1) * np.maximum(bz, 1)
    per_sm = np.clip(threads_per_sm // np.maximum(threads, 1), 1, 32)
    waves = np.ceil(blocks / (sm_count * per_sm))
    fill = known & (waves >= 2) & (dur > 0)
    out[fill] = dur[fill] / waves[fill]
    return out


HIDDEN_WORK_MIN = 5e-6
"""Shortest launch-to-start wait on an idle GPU that is kept as unrecorded GPU work (s)."""


def hidden_gpu_delay(rg: RankGraph, lhost: list[int] | np.ndarray, lat: float, launch_delay: dict[int, float],
                     minimum: float = HIDDEN_WORK_MIN) -> dict[int, float]:
    """Launched GPU ops that the trace shows starting late on an idle GPU -> that wait (s).

    An op is ready ``lat`` (+ its call's ``launch_delay``) after its launch call started; if its device had
    no op running between then and its recorded start (every op that started before it had ended), nothing
    in the trace explains the wait: the GPU ran work the profiler did not record (another process, a
    driver-internal copy, host staging of a pageable copy). Waits of at least ``minimum`` are kept, as
    host gaps are: the replayed op becomes ready that much later."""
    G, H = rg.gpu_ops, rg.host_ops
    n = len(G)
    if n == 0:
        return {}
    lh = np.asarray(lhost, dtype=np.int64)
    start = G.start.astype(float)
    end = start + _nan0(G.dur)
    ok = (lh >= 0) & np.isfinite(start)
    if not ok.any():
        return {}
    o = np.lexsort((start, G.device))
    dev_o, end_o = G.device[o], np.where(np.isfinite(end[o]), end[o], -np.inf)
    # latest end of the ops that started before each op on its device (running max, reset per device)
    first = np.ones(n, dtype=bool)
    first[1:] = dev_o[1:] != dev_o[:-1]
    base = np.where(first, -np.inf, np.concatenate(([-np.inf], end_o[:-1])))
    run = np.empty(n)
    bounds = [*first.nonzero()[0].tolist(), n]
    for a, b in itertools.pairwise(bounds):
        run[a:b] = np.maximum.accumulate(base[a:b])
    prev_end = np.empty(n)
    prev_end[o] = run
    hstart = np.where(lh >= 0, H.start[np.maximum(lh, 0)], np.nan)
    extra: np.ndarray | float = 0.0
    if launch_delay:
        per_host = np.zeros(len(H))
        per_host[np.fromiter(launch_delay, np.int64, len(launch_delay))] = list(launch_delay.values())
        extra = np.where(lh >= 0, per_host[np.maximum(lh, 0)], 0.0)
    ready = hstart + lat + extra
    wait = start - np.maximum(ready, prev_end)
    sel = (ok & np.isfinite(wait) & (wait >= minimum)).nonzero()[0]
    return dict(zip(sel.tolist(), wait[sel].tolist()))


def _region_mask(rg: RankGraph, patterns: tuple[str, ...]) -> np.ndarray:
    """Host ops inside (or equal to) an op whose name matches one of ``patterns``."""
    H = rg.host_ops
    n = len(H)
    inside = np.zeros(n, dtype=bool)
    if not patterns or n == 0:
        return inside
    names = rg.strings
    root = np.zeros(n, dtype=bool)
    for i in range(n):
        nm = names[H.name[i]] if H.name[i] >= 0 else ""
        if any(fnmatch.fnmatchcase(nm, p) for p in patterns):
            root[i] = True
    parent = H.parent
    for i in range(n):  # pre-order: parents come first
        p = parent[i]
        inside[i] = root[i] or (p >= 0 and inside[p])
    return inside


def _nan0(x: np.ndarray) -> np.ndarray:
    """``numpy.nan_to_num(x.astype(float), nan=0.0)`` (a new float array), without its ~10 us of Python
    when every value is finite (the usual case)."""
    y = np.array(x, dtype=float)
    if not np.isfinite(y).all():
        y = np.nan_to_num(y, nan=0.0, copy=False)
    return y


def trace_launch_latency(rg: RankGraph) -> float | None:
    """Launch-to-start latency seen in the trace: the 1st percentile of (GPU op
    start - launch call start), in seconds; None if the trace has no launches."""
    L, H, G = rg.launches, rg.host_ops, rg.gpu_ops
    ok = L.first_gpu_op >= 0
    if not ok.any():
        return None
    d = G.start[L.first_gpu_op[ok]] - H.start[L.host_op[ok]]
    d = d[np.isfinite(d)]
    if d.size == 0:
        return None
    return float(max(_percentile_linear(d, 1.0), 0.0))


def _percentile_linear(d: np.ndarray, q: float) -> float:
    """``numpy.percentile(d, q)`` (its default linear method, the same float) for a 1-D array of finite
    floats, with one partition instead of numpy's ~50 us of Python around it (twice per rank per replay)."""
    n = d.size
    vi = (n - 1) * (q / 100)  # numpy's virtual index for the linear method, then its _get_indexes
    lo = math.floor(vi)
    gamma = vi - lo
    if vi >= n - 1:
        lo_i = hi_i = n - 1
    elif vi < 0:
        lo_i = hi_i = 0
    else:
        lo_i, hi_i = lo, lo + 1
    part = np.partition(d, (lo_i, hi_i)) if hi_i != lo_i else np.partition(d, lo_i)
    a, b = float(part[lo_i]), float(part[hi_i])
    diff = b - a  # numpy's _lerp
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def trace_kernel_gap(rg: RankGraph) -> float | None:
    """Device-side gap between back-to-back kernels on a stream seen in the trace:
    the median of (start - previous end) over kernels that were already queued
    (launched >= 10 us before their predecessor ended), in seconds."""
    G, H, L = rg.gpu_ops, rg.host_ops, rg.launches
    if len(G) < 3:
        return None
    o = np.lexsort((G.start, G.stream, G.device))
    dev, stream = G.device[o], G.stream[o]
    same = (dev[1:] == dev[:-1]) & (stream[1:] == stream[:-1])
    prev, nxt = o[:-1][same], o[1:][same]
    kern = (G.kind[prev] == 0) & (G.kind[nxt] == 0)
    li = G.launch[nxt]
    has = li >= 0
    lstart = np.full(nxt.size, np.inf)
    lstart[has] = H.start[L.host_op[li[has]]]
    prev_end = G.start[prev] + G.dur[prev]
    queued = kern & (lstart + 10e-6 < prev_end)
    if queued.sum() < 5:
        return None
    gaps = (G.start[nxt] - prev_end)[queued]
    return float(max(_median(gaps), 0.0))


def _median(d: np.ndarray) -> float:
    """``numpy.median(d)`` of a 1-D float array (the same float: the middle element, or the mean of the
    two middle ones; NaN when one is NaN) without numpy's Python around it."""
    n = d.size
    h = n // 2
    if np.isnan(d).any():
        return math.nan
    if n % 2:
        return float(np.partition(d, h)[h])
    part = np.partition(d, (h - 1, h))
    return (float(part[h - 1]) + float(part[h])) / 2


def _pick(configured: float | None, from_trace: float | None, trace_max: float, default: float,
          default_name: str) -> tuple[float, str]:
    """A timing parameter and where it came from: the config, else the trace (if plausible), else the default."""
    if configured is not None:
        return configured, "config"
    if from_trace is not None and from_trace <= trace_max:
        return from_trace, "trace"
    return default, default_name


def _orphan_deps(gstart: np.ndarray, gdur: np.ndarray, orphans: list[int], stream_pred: list[int],
                 pred_gap: list[float], offset: float) -> dict[int, float]:
    """Dependencies of GPU ops whose launch is not in the trace (launched before the
    profiler started, or by an unprofiled thread); updates ``stream_pred`` and
    ``pred_gap`` in place and returns their ready times.

    Such an op follows its stream predecessor after the idle time recorded between
    them. The first op of its stream follows its *anchor* — the GPU op of the rank
    that started before it and ended last before it started — after the recorded
    time between that end and its start. Anchors start strictly earlier, so anchor
    chains have no cycles. Only ops with neither (the head of the replay: nothing had
    ended when they started) get a ready time here: their recorded offset from the
    rank's origin, which :func:`compile_rank` replaces by an anchor on the main thread
    when a main-thread op started before them.
    """
    ready: dict[int, float] = {}
    if not orphans:
        return ready
    gend = gstart + _nan0(gdur)
    fin = np.nonzero(np.isfinite(gstart))[0]
    by_end = fin[np.argsort(gend[fin], kind="stable")]
    ends_sorted = gend[by_end]
    for j in orphans:
        sj = float(gstart[j])
        if not math.isfinite(sj):  # no timing at all (ET-only): nothing to derive from
            ready[j] = offset
            continue
        p = stream_pred[j]
        if p >= 0 and math.isfinite(gend[p]):
            pred_gap[j] = max(sj - float(gend[p]), 0.0)
            ready[j] = offset
            continue
        k = int(np.searchsorted(ends_sorted, sj, side="right")) - 1
        while k >= 0 and not gstart[by_end[k]] < sj:
            k -= 1
        if k >= 0:
            a = int(by_end[k])
            stream_pred[j] = a
            pred_gap[j] = sj - float(gend[a])
            ready[j] = offset
        else:
            ready[j] = sj + offset
    return ready


@dataclass
class _Timing:
    """Launch latency and kernel gap of a rank, with where each came from."""

    lat: float
    lat_src: str
    gap: float
    gap_src: str
    traced_lat: float
    """The trace's own launch latency (config ignored): the reference for launch delays and hidden GPU work."""


def _timing(rg: RankGraph, cfg: ReplayConfig, default_launch_latency: float) -> _Timing:
    """Phase 1: launch-to-start latency and kernel gap (config, else the trace if plausible, else a default)."""
    from_trace = trace_launch_latency(rg)
    lat, lat_src = _pick(cfg.launch_latency, from_trace, cfg.max_trace_launch_latency,
                         default_launch_latency, "catalog")
    gap, gap_src = _pick(cfg.kernel_gap, trace_kernel_gap(rg), cfg.max_trace_kernel_gap,
                         cfg.default_kernel_gap, "default")
    traced_lat, _ = _pick(None, from_trace, cfg.max_trace_launch_latency, default_launch_latency, "")
    return _Timing(lat, lat_src, gap, gap_src, traced_lat)


def _launch_map(rg: RankGraph) -> tuple[np.ndarray, dict[int, list[int]], list[int]]:
    """Phase 2: per GPU op the host op that launched it (-1: none in the trace), host op -> the GPU ops
    it enqueues (in GPU op order), and the GPU ops without a launch (*orphans*)."""
    G, L = rg.gpu_ops, rg.launches
    n_gpu = len(G)
    if len(L):
        lrow = G.launch
        lhost = np.where(lrow >= 0, L.host_op[np.maximum(lrow, 0)], -1).astype(np.int64)
    else:
        lhost = np.full(n_gpu, -1, dtype=np.int64)
    launched = lhost >= 0
    orphans: list[int] = (~launched).nonzero()[0].tolist()
    js = launched.nonzero()[0]
    hs = lhost[js]
    launch_gpu: dict[int, list[int]] = {}
    if not js.size:
        return lhost, launch_gpu, orphans
    # keys in order of their first GPU op, each one's GPU ops in GPU op order: a stable sort by host op
    order = np.argsort(hs, kind="stable")
    sh, sj = hs[order], js[order]
    first = np.concatenate(([True], sh[1:] != sh[:-1])).nonzero()[0]
    if len(first) == len(sh):  # one GPU op per launch (the usual case)
        launch_gpu = {h: [j] for h, j in zip(hs.tolist(), js.tolist())}
        return lhost, launch_gpu, orphans
    bounds = np.append(first, len(sh)).tolist()
    sj_l, keys = sj.tolist(), sh[first].tolist()
    for k in np.argsort(sj[first], kind="stable").tolist():
        launch_gpu[keys[k]] = sj_l[bounds[k] : bounds[k + 1]]
    return lhost, launch_gpu, orphans


def _gpu_deps(rg: RankGraph) -> tuple[list[int], list[list[int]], dict[int, list[int]]]:
    """Phase 3: from the graph's edges, per GPU op its same-stream predecessor (-1: none) and its
    cross-stream event waits, and per synchronizing host op the GPU ops it waits for."""
    n_host, n_gpu = len(rg.host_ops), len(rg.gpu_ops)
    E = rg.edges
    src, dst, kind = E.src, E.dst, E.kind

    def gpu_edges(k: int, dst_gpu: bool) -> tuple[list[int], list[int]]:
        sel = (kind == k).nonzero()[0]  # the edges of kind k, widened to int64 alone
        s, d = src[sel].astype(np.int64) - n_host, dst[sel].astype(np.int64) - (n_host if dst_gpu else 0)
        ok = (s >= 0) & (s < n_gpu) & (d >= 0) & (d < (n_gpu if dst_gpu else n_host))
        if dst_gpu:
            ok &= s != d
        return s[ok].tolist(), d[ok].tolist()

    none: list[int] = []  # shared by every op without event waits (read only)
    preds: list[list[int]] = [none] * n_gpu
    sp = np.full(n_gpu, -1, dtype=np.int64)
    s_, d_ = gpu_edges(EdgeKind.STREAM, True)
    if s_:
        dd = np.asarray(d_, dtype=np.int64)
        if np.bincount(dd, minlength=n_gpu).max() <= 1:
            sp[dd] = s_
        else:  # the last edge into an op wins, as one assignment per edge in order
            for s, d in zip(s_, d_):
                sp[d] = s
    stream_pred: list[int] = sp.tolist()
    sync_deps: dict[int, list[int]] = {}
    for s, d in zip(*gpu_edges(EdgeKind.EVENT_WAIT, True)):
        if s != stream_pred[d]:
            if preds[d] is none:
                preds[d] = []
            preds[d].append(s)
    for s, d in zip(*gpu_edges(EdgeKind.SYNC, False)):
        sync_deps.setdefault(d, []).append(s)
    return stream_pred, preds, sync_deps


def _blocking_kinds(rg: RankGraph, lhost: np.ndarray, launch_gpu: dict[int, list[int]],
                    sync_deps: dict[int, list[int]]) -> np.ndarray:
    """Phase 4: host op kinds as the replay blocks on them. A launch of a device-to-pageable copy blocks
    like a synchronous copy (LAUNCH_SYNC); a LAUNCH_SYNC waits for the GPU ops it launched
    (added to ``sync_deps`` in place)."""
    H, G = rg.host_ops, rg.gpu_ops
    hkind = H.kind.copy()
    names = rg.strings
    for j in (G.copy_kind == CopyKind.DTOH).nonzero()[0].tolist():
        h = int(lhost[j])
        if h >= 0 and hkind[h] == HostKind.LAUNCH and "Pageable" in names[G.name[j]]:
            hkind[h] = HostKind.LAUNCH_SYNC
    for h in (hkind == HostKind.LAUNCH_SYNC).nonzero()[0].tolist():
        deps = sync_deps.setdefault(h, [])
        for j in launch_gpu.get(h, []):
            if j not in deps:
                deps.append(j)
    return hkind


@dataclass
class _HostCosts:
    """Per host op (s, after ``host_speed``): unprofiled time before it, time after its last child,
    a sync's own cost, and what kind of call it is."""

    pre_gap: np.ndarray
    tail: np.ndarray
    sync_cost: np.ndarray
    is_launch: np.ndarray
    is_sync: np.ndarray
    region: np.ndarray
    """Inside a CUDA-graph region (``cfg.cuda_graphs``): host time disappears."""


def _host_costs(rg: RankGraph, cfg: ReplayConfig, hkind: np.ndarray, sync_deps: dict[int, list[int]]) -> _HostCosts:
    """Phase 5: host time per op under the host knobs (speed, launch and sync overheads, CUDA graphs).

    A sync whose GPU work had ended when it was called costs its measured duration; one that waited
    costs the time it took to return after that work ended (both at most ``default_sync_overhead``
    unless measured shorter)."""
    H, G = rg.host_ops, rg.gpu_ops
    n_host = len(H)
    region = _region_mask(rg, cfg.cuda_graphs)
    speed = cfg.host_speed
    pre_gap = _nan0(H.pre_gap) / speed
    tail = _nan0(H.tail) / speed
    hdur = _nan0(H.dur)
    is_launch = (hkind == HostKind.LAUNCH) | (hkind == HostKind.LAUNCH_SYNC)
    is_sync = (hkind == HostKind.SYNC) | (hkind == HostKind.LAUNCH_SYNC)
    if cfg.launch_overhead is not None:
        tail[is_launch & ~is_sync] = cfg.launch_overhead
    if cfg.sync_overhead is not None:
        sync_cost = np.full(n_host, cfg.sync_overhead)
    else:
        sync_cost = np.minimum(hdur, cfg.default_sync_overhead)
        gend = G.start + G.dur
        for h, deps in sync_deps.items():
            rel = float(gend[deps].max()) if deps else math.nan
            if not (math.isfinite(rel) and math.isfinite(hdur[h])):
                continue
            ret = hdur[h] if rel <= H.start[h] else H.start[h] + hdur[h] - rel
            sync_cost[h] = min(max(ret, 0.0), hdur[h])
    sync_cost = sync_cost / speed
    if region.any():  # host time inside a region disappears; the gap before a region's root stays
        par = H.parent
        inner = region & (par >= 0) & region[np.maximum(par, 0)]
        pre_gap[inner] = 0.0
        tail[region] = 0.0
        sync_cost[region] = 0.0
    return _HostCosts(pre_gap, tail, sync_cost, is_launch, is_sync, region)


def _launch_delays(rg: RankGraph, costs: _HostCosts, lhost: np.ndarray, launch_gpu: dict[int, list[int]],
                   traced_lat: float) -> dict[int, float]:
    """Phase 6: launch host op -> time spent before its GPU ops are submitted (s): the call's excess
    over the rank's median launch call; a copy call's excess never beyond when the trace shows the copy
    started (it runs its copy during the call)."""
    H, G = rg.host_ops, rg.gpu_ops
    launch_delay: dict[int, float] = {}
    lh = np.sort(np.fromiter(launch_gpu, np.int64, len(launch_gpu)))
    if not lh.size:
        return launch_delay
    call_dur = np.where(costs.is_sync, costs.sync_cost, costs.tail)
    d = call_dur[lh]
    extras = np.maximum(d - _median(d), 0.0)
    non_copy = np.zeros(len(H), dtype=bool)
    non_copy[lhost[(lhost >= 0) & (G.kind != GpuKind.MEMCPY)]] = True
    all_copy = ~non_copy[lh]  # launch calls whose GPU ops are all copies
    gstart = G.start.astype(float)
    pos = extras > 0
    plain = pos & ~all_copy
    launch_delay.update(zip(lh[plain].tolist(), extras[plain].tolist()))
    cp = pos & all_copy
    if cp.any():  # a copy call's excess: at most until its first copy is seen starting (finite starts)
        on = lhost >= 0
        seen = gstart[on] - (H.start[lhost[on]] + traced_lat)
        fin = np.isfinite(seen)
        first_seen = np.full(len(H), np.inf)
        np.minimum.at(first_seen, lhost[on][fin], seen[fin])
        h_c, extra_c = lh[cp], extras[cp]
        fs = first_seen[h_c]
        extra_c = np.where(np.isfinite(fs), np.minimum(extra_c, np.maximum(fs, 0.0)), extra_c)
        keep = extra_c > 0
        launch_delay.update(zip(h_c[keep].tolist(), extra_c[keep].tolist()))
    return launch_delay


@dataclass
class _HostWalk:
    """Static times and SYNC counts of every host op, and each thread's program (phase 7)."""

    static_start: np.ndarray
    static_end: np.ndarray
    sb_start: np.ndarray
    sb_end: np.ndarray
    sync_ev: np.ndarray
    threads: list[ThreadProgram]
    main_block: tuple[int, int] | None
    """Host op range of the main thread (None: no host ops)."""


def _thread_blocks(thread: np.ndarray) -> list[tuple[int, int]]:
    """Host op ranges of the threads (host ops are grouped by thread)."""
    n = thread.size
    if not n:
        return []
    cut = ((thread[1:] != thread[:-1]).nonzero()[0] + 1).tolist()
    return list(itertools.pairwise([0, *cut, n]))


def _preorder_ends(parent: np.ndarray, i: int, j: int) -> np.ndarray | None:
    """For the host ops ``[i, j)`` of one thread, each op's subtree end (the index before which it
    closes) when ``parent`` is a consistent pre-order (every op's parent is an ancestor-or-self of the
    op before it, as in every importer's tables); None otherwise (the caller then walks op by op)."""
    tree = _preorder(parent, i, j)
    return None if tree is None else tree[0] + i


def _preorder(parent: np.ndarray, i: int, j: int,
              depth: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray] | None:
    """:func:`_preorder_ends` relative to ``i``, and each op's depth (its open ancestors).
    O(m * depth) vectorized, m = j - i, no sort. Subtree ranges are [k, k + size(k)); the parents
    form a pre-order iff each op's range lies inside its parent's (the ranges then nest, and a
    parent's range, holding its whole subtree, holds nothing else). ``depth``: the host-op table's
    depth column, taken as it is when it agrees with ``parent`` (0 at a root, the parent's + 1
    below; O(m)), else the depths are counted by walking up the parents."""
    m = j - i
    raw = parent[i:j].astype(np.int64)
    par = np.where(raw >= 0, raw - i, -1)
    loc = np.arange(m)
    if ((par >= loc) | ((raw >= 0) & (raw < i))).any():
        return None
    has = par >= 0
    dep = None if depth is None else depth[i:j].astype(np.int32)
    # the column agrees: 0 at a root, the parent's + 1 below (a root's par -1 reads some op, then unused)
    if dep is None or (np.where(has, dep[par] + 1, 0) != dep).any():
        dep = _depths(par, m)
    if m and dep[0] != 0:
        return None
    if m > 1 and (dep[1:] > dep[:-1] + 1).any():
        return None
    size = np.ones(m, dtype=np.int64)
    for d in range(int(dep.max(initial=0)), 0, -1):  # subtree sizes, deepest first
        at = (dep == d).nonzero()[0]
        np.add.at(size, par[at], size[at])
    ends = loc + size
    # a pre-order iff every subtree is contiguous iff every op's range lies in its parent's
    if not (ends[has] <= ends[par[has]]).all():
        return None
    return ends, dep


def _depths(par: np.ndarray, m: int) -> np.ndarray:
    """Each op's number of ancestors (``par``: local parent indices, -1 at a root, each below its op),
    walking every op up one level at a time: O(m * depth)."""
    up_of = np.append(np.where(par >= 0, par, m), m).astype(np.int32)  # m: a sentinel root above the roots
    depth = np.zeros(m, dtype=np.int32)
    anc = up_of[:m]
    while True:
        up = anc != m
        if not up.any():
            break
        depth += up
        anc = up_of[anc]
    return depth


def _walk_block(costs: _HostCosts, cost_graph: float, region_root: np.ndarray, parent: np.ndarray,
                i: int, j: int, base: float, out: _HostWalk, depth: np.ndarray | None = None) -> None:
    """Static start/end and SYNC counts of the host ops ``[i, j)`` of one thread whose first op starts at
    ``base``: a cumulative sum over the thread's open/close sequence (open: pre-gap, then the CUDA-graph
    launch cost of a region root; close: a sync's cost, else the tail), in the order the pre-order walk of
    :func:`_walk_block_loop` adds them, so the floats are the same. In a pre-order, the opens before op
    k's open are k, the closes before it k - depth(k) (every earlier op but its ancestors), and the closes
    before its own close end(k) - depth(k) - 1 (every op opened before it closes but its ancestors).
    ``depth``: the host-op table's depth column (see :func:`_preorder`)."""
    tree = _preorder(parent, i, j, depth)
    if tree is None:
        _walk_block_loop(costs, cost_graph, region_root, parent, i, j, base, out)
        return
    loc_end, depth = tree
    m = j - i
    loc = np.arange(m)
    slot_open = 2 * loc + (loc - depth)
    slot_close = 2 * loc_end + (loc_end - depth - 1)
    vals = np.empty(3 * m + 1)
    vals[0] = base
    vals[1 + slot_open] = costs.pre_gap[i:j]
    vals[2 + slot_open] = np.where(region_root[i:j], cost_graph, 0.0)
    vals[1 + slot_close] = np.where(costs.is_sync[i:j], costs.sync_cost[i:j], costs.tail[i:j])
    cs = np.cumsum(vals, out=vals)  # in place: one large array fewer
    out.static_start[i:j] = cs[2 + slot_open]
    out.static_end[i:j] = cs[1 + slot_close]
    nsync = np.zeros(m + 1, dtype=np.int64)
    np.cumsum(costs.is_sync[i:j], out=nsync[1:])
    out.sb_start[i:j] = nsync[:m]
    out.sb_end[i:j] = nsync[loc_end]
    sy = costs.is_sync[i:j].nonzero()[0]
    out.sync_ev[i + sy] = nsync[sy]


def _walk_block_loop(costs: _HostCosts, cost_graph: float, region_root: np.ndarray, parent: np.ndarray,
                     i: int, j: int, base: float, out: _HostWalk) -> None:
    """:func:`_walk_block` op by op (any parent column: an op whose parent is not open starts a new
    top-level op): the reference the vectorized walk reproduces."""
    par = parent.tolist()
    pre_l, tail_l, cost_l = costs.pre_gap.tolist(), costs.tail.tolist(), costs.sync_cost.tolist()
    is_sync_l, root_l = costs.is_sync.tolist(), region_root.tolist()
    cursor, nsync = base, 0
    stack: list[int] = []

    def close(q: int) -> None:
        nonlocal cursor
        cursor += cost_l[q] if is_sync_l[q] else tail_l[q]
        out.static_end[q] = cursor
        out.sb_end[q] = nsync

    for h in range(i, j):
        while stack and stack[-1] != par[h]:
            close(stack.pop())
        cursor += pre_l[h]
        cursor += cost_graph if root_l[h] else 0.0
        out.static_start[h] = cursor
        out.sb_start[h] = nsync
        if is_sync_l[h]:
            out.sync_ev[h] = nsync
            nsync += 1
        stack.append(h)
    while stack:
        close(stack.pop())


def _thread_events(costs: _HostCosts, launching: np.ndarray, i: int, j: int, static_start: np.ndarray
                   ) -> tuple[list[int], list[int], list[float], list[float]]:
    """A thread's program events in host op order (a call that launches and syncs: LAUNCH, then SYNC):
    kinds, host ops, static start times, a SYNC's own cost."""
    hl = i + (costs.is_launch[i:j] & launching[i:j]).nonzero()[0]
    hs = i + costs.is_sync[i:j].nonzero()[0]
    host = np.concatenate([hl, hs])
    kind = np.concatenate([np.full(hl.size, LAUNCH), np.full(hs.size, SYNC)])
    o = np.lexsort((kind, host))
    host, kind = host[o], kind[o]
    cost = np.where(kind == SYNC, costs.sync_cost[host], 0.0)
    return kind.tolist(), host.tolist(), static_start[host].tolist(), cost.tolist()


def _host_programs(rg: RankGraph, cfg: ReplayConfig, costs: _HostCosts, launch_gpu: dict[int, list[int]],
                   offset: float) -> _HostWalk:
    """Phase 7: static times of every host op and each thread's program.

    The main thread holds the rank's first host op, the one op placed at its recorded offset from the
    rank's origin. Every other thread starts after the main-thread op that last started before it (its
    anchor), by the recorded time since that op's start: statically here, and at run time only once the
    anchor's thread has returned from the synchronize calls before the anchor, whose stall it inherits."""
    H = rg.host_ops
    n_host = len(H)
    out = _HostWalk(np.zeros(n_host), np.zeros(n_host), np.zeros(n_host, dtype=np.int64),
                    np.zeros(n_host, dtype=np.int64), np.full(n_host, -1, dtype=np.int64), [], None)
    blocks = _thread_blocks(H.thread)
    if not blocks:
        return out
    parent, hstart = H.parent, H.start
    region = costs.region
    region_root = region & ((parent < 0) | ~region[np.maximum(parent, 0)])
    launching = np.zeros(n_host, dtype=bool)
    if launch_gpu:
        launching[np.fromiter(launch_gpu, dtype=np.int64, count=len(launch_gpu))] = True
    firsts = [float(hstart[a]) if hstart[a] == hstart[a] else math.inf for a, _ in blocks]
    main = int(np.argmin(firsts))
    out.main_block = blocks[main]
    m0, m1 = blocks[main]
    main_starts = hstart[m0:m1]
    for bi in [main] + [k for k in range(len(blocks)) if k != main]:
        i, j = blocks[bi]
        first = float(hstart[i])
        anchor_thread, anchor_syncs = -1, 0
        if bi == main or not (first == first):
            base = (first if first == first else 0.0) + offset  # NaN-safe (ET-only graphs)
        else:
            k = int(np.searchsorted(main_starts, first, side="right")) - 1
            if k < 0:  # cannot happen (the main thread starts first); keep the recorded offset
                base = first + offset
            else:
                m = m0 + k
                base = float(out.static_start[m]) + (first - float(hstart[m])) / cfg.host_speed
                anchor_thread, anchor_syncs = int(H.thread[m0]), int(out.sb_start[m])
        _walk_block(costs, cfg.graph_launch_overhead, region_root, parent, i, j, base, out, H.depth)
        kinds, hosts, static, cost = _thread_events(costs, launching, i, j, out.static_start)
        out.threads.append(ThreadProgram(int(H.thread[i]), kinds, hosts, static, cost, anchor_thread, anchor_syncs))
    return out


def _head_anchors(rg: RankGraph, walk: _HostWalk, orphan: dict[int, float], stream_pred: list[int]
                  ) -> dict[int, tuple[int, int, float]]:
    """Phase 8: GPU ops at the head of the replay (no launch, nothing ended before them) are anchored to
    the main-thread op that last started before them (removed from ``orphan``); only those before every
    host op keep their recorded offset from the rank's origin."""
    host_anchor: dict[int, tuple[int, int, float]] = {}
    if walk.main_block is None:
        return host_anchor
    H, G = rg.host_ops, rg.gpu_ops
    m0, m1 = walk.main_block
    main_starts = H.start[m0:m1]
    if not main_starts.size:
        return host_anchor
    for j in [j for j in orphan if stream_pred[j] < 0 and np.isfinite(G.start[j])]:
        k = int(np.searchsorted(main_starts, G.start[j], side="right")) - 1
        if k >= 0:
            m = m0 + k
            host_anchor[j] = (int(H.thread[m0]), int(walk.sb_start[m]),
                              float(walk.static_start[m] + G.start[j] - H.start[m]))
            del orphan[j]
    return host_anchor


PROGRAMS_KEPT = 64
"""Compiled programs :func:`compile_rank` remembers in a process (least recently used go first) ..."""
PROGRAM_OPS_KEPT = 250_000
"""... and the most host + GPU ops they may hold together (a program holds ~250 bytes an op: the v100 HTA
trace's 123 k ops ~30 MiB; this bound ~60 MiB)."""
_PROGRAMS: OrderedDict[tuple[Any, ...], tuple[RankProgram, int]] = OrderedDict()
_cfg_text: tuple[ReplayConfig | None, str] = (None, "")


def rank_digest(rg: RankGraph) -> tuple[Any, ...]:
    """What identifies rank ``rg``'s content: its identity fields, its strings' hash, whether it is synthesized
    (``source["synthetic"]``: :func:`cosim.replay.copies.copy_ops`, kept on the program, reads it), and either its load-cache
    origin (:meth:`RankGraph.cache_identity`: the entry's key and rank index, while the rank holds the read-only
    arrays it was read with; ~15 us a DLRM rank, no byte read) or per table the row count and a CRC-32 of every
    column's bytes (zlib-ng's, read from the array's own buffer: ~0.09 ms for a DLRM rank, 83 columns, 334 kB,
    warm; its first read of freshly mapped pages costs several times that). Computed each time, so a graph
    edited after loading (a new table or column; a column assigned, which copies it) gets a new digest."""
    ident = (rg.rank, rg.world_size, rg.device_name, float(rg.time_origin), len(rg.strings), hash(tuple(rg.strings)),
             bool(rg.source.get("synthetic")))  # a synthesized copy has no fixed part
    origin = rg.cache_identity()
    if origin is not None:
        return ("cache", origin, *ident)
    crc = 0
    shape: list[Any] = []
    crc32 = zlib_ng.crc32
    for tab in rg.tables().values():
        shape.append(len(tab))
        for col, a in tab.columns().items():
            shape.append((col, a.dtype, a.shape))
            if a.size:
                try:  # the array's own buffer (C order); a strided view's bytes copied into one first
                    crc = crc32(a, crc)
                except ValueError:
                    crc = crc32(np.ascontiguousarray(a), crc)
    return ("bytes", *ident, hash(tuple(shape)), crc)


def _config_text(cfg: ReplayConfig) -> str:
    """``repr(cfg)``, once per config object (a replay compiles every rank under the same one)."""
    global _cfg_text
    if _cfg_text[0] is not cfg:
        _cfg_text = (cfg, repr(cfg))
    return _cfg_text[1]


def compile_rank(rg: RankGraph, cfg: ReplayConfig, default_launch_latency: float, gpu_dur: np.ndarray,
                 offset: float = 0.0, sm_count: int | None = None) -> RankProgram:
    """Compile rank ``rg`` under ``cfg`` into the executor's :class:`RankProgram` (see :func:`compile_program`).

    A pure function of its arguments, remembered for the process: a rank of identical content (
    :func:`rank_digest`), durations, config, launch latency, offset and SM count compiles once (a cached
    replay of a loaded graph, a sweep over knobs compile does not read the same way). The program returned is
    shared: it is read, never changed, by the executor, the summary and the link report (but for
    :attr:`RankProgram.measured`, which the summary fills once).
    """
    dur = np.ascontiguousarray(gpu_dur, dtype=float)
    key = (rank_digest(rg), dur.tobytes(), _config_text(cfg), float(default_launch_latency), float(offset),
           sm_count)
    hit = _PROGRAMS.get(key)
    if hit is not None:
        _PROGRAMS.move_to_end(key)
        return hit[0]
    prog = compile_program(rg, cfg, default_launch_latency, dur, offset, sm_count)
    ops = len(rg.host_ops) + len(rg.gpu_ops)
    if ops <= PROGRAM_OPS_KEPT:
        _PROGRAMS[key] = (prog, ops)
        held = sum(n for _, n in _PROGRAMS.values())
        while len(_PROGRAMS) > PROGRAMS_KEPT or held > PROGRAM_OPS_KEPT:
            held -= _PROGRAMS.popitem(last=False)[1][1]
    return prog


def compile_program(rg: RankGraph, cfg: ReplayConfig, default_launch_latency: float, gpu_dur: np.ndarray,
                    offset: float = 0.0, sm_count: int | None = None) -> RankProgram:
    """Compile rank ``rg`` under ``cfg`` into the executor's :class:`RankProgram` (not remembered).

    ``gpu_dur``: every GPU op's replayed duration (s; :func:`cosim.replay.durations.gpu_durations`);
    ``default_launch_latency`` comes from the topology's CPU; ``offset`` (s) places this rank's time
    origin on the replay's common clock, so that the rank's first op starts where it was recorded
    relative to the other ranks. Every other start follows from dependencies (docs/REPLAY.md, "Start
    times"). ``sm_count``: SMs of the rank's GPU, for the block dispatcher (:func:`last_wave`); None: not
    modeled. Phases: timing parameters, launches, GPU dependencies, blocking kinds, host costs, launch
    delays and hidden GPU work, host programs, head anchors. O(ops x host nesting depth), vectorized.
    """
    G = rg.gpu_ops
    tm = _timing(rg, cfg, default_launch_latency)
    dur = np.asarray(gpu_dur, dtype=float)
    waves = last_wave(rg, dur, sm_count) if sm_count else None
    fills = waves is not None and bool((waves > 0).any())
    lhost, launch_gpu, orphans = _launch_map(rg)
    stream_pred, preds, sync_deps = _gpu_deps(rg)
    pred_gap = [tm.gap] * len(G)
    orphan = _orphan_deps(G.start, G.dur, orphans, stream_pred, pred_gap, offset)
    hkind = _blocking_kinds(rg, lhost, launch_gpu, sync_deps)
    costs = _host_costs(rg, cfg, hkind, sync_deps)
    launch_delay = _launch_delays(rg, costs, lhost, launch_gpu, tm.traced_lat)
    hidden = hidden_gpu_delay(rg, lhost, tm.traced_lat, launch_delay) if not costs.region.any() else {}
    walk = _host_programs(rg, cfg, costs, launch_gpu, offset)
    host_anchor = _head_anchors(rg, walk, orphan, stream_pred)
    return RankProgram(
        rank=rg.rank,
        threads=walk.threads,
        host_static_start=walk.static_start,
        host_static_end=walk.static_end,
        host_syncs_before_start=walk.sb_start,
        host_syncs_before_end=walk.sb_end,
        host_sync_event=walk.sync_ev,
        launch_gpu=launch_gpu,
        sync_deps=sync_deps,
        gpu_dur=dur.tolist(),
        gpu_stream_pred=stream_pred,
        gpu_pred_gap=pred_gap,
        gpu_preds=preds,
        kernel_gap=tm.gap,
        kernel_gap_source=tm.gap_src,
        gpu_orphan_ready=orphan,
        gpu_host_anchor=host_anchor,
        launch_delay=launch_delay,
        launch_latency=tm.lat,
        launch_latency_source=tm.lat_src,
        gpu_hidden_delay=hidden,
        gpu_device=G.device.tolist() if fills else None,
        gpu_launch_host=lhost,
        gpu_last_wave=waves.tolist() if fills and waves is not None else None,
        gpu_waits=gpu_waits(preds, stream_pred),
        gpu_succ=gpu_successors(preds, stream_pred),
    )


def gpu_waits(preds: list[list[int]], stream_pred: list[int]) -> list[int]:
    """GPU op -> dependencies it waits for before it can start (:attr:`RankProgram.gpu_waits`): its launch (or
    orphan ready time), its stream predecessor if any, and its event waits ``preds``."""
    return [len(p) + 1 + (s >= 0) for p, s in zip(preds, stream_pred)]


def gpu_successors(preds: list[list[int]], stream_pred: list[int]) -> list[list[int]]:
    """GPU op -> ops that wait for it (:attr:`RankProgram.gpu_succ`): event waits first, then the next op on its
    stream (the order the executor releases them in)."""
    succ: list[list[int]] = [[] for _ in range(len(preds))]
    for d, ps in enumerate(preds):
        if ps:
            for p in ps:
                succ[p].append(d)
    sp = np.asarray(stream_pred, dtype=np.int64)
    ds = (sp >= 0).nonzero()[0]
    for p, d in zip(sp[ds].tolist(), ds.tolist()):
        succ[p].append(d)
    return succ


_COMM_CLASSES = (int(OpClass.COLLECTIVE), int(OpClass.MOE_DISPATCH), int(OpClass.MOE_COMBINE))
assert _COMM_CLASSES == tuple(range(_COMM_CLASSES[0], _COMM_CLASSES[-1] + 1)), "communication classes are one range"


def is_comm(cls: np.ndarray) -> np.ndarray:
    """GPU ops that are communication (collectives, MoE dispatch/combine: one range of class values)."""
    return (cls >= _COMM_CLASSES[0]) & (cls <= _COMM_CLASSES[-1])
