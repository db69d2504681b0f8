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
from dataclasses import dataclass, field

import numpy as np

from cosim.replay.config import OP_CLASSES, ReplayConfig
from cosim.workload.graph import CopyKind, EdgeKind, GpuKind, HostKind, OpClass, RankGraph

__all__ = ["LAUNCH", "SYNC", "THREADS_PER_SM", "RankProgram", "ThreadProgram", "compile_rank", "last_wave"]

LAUNCH, SYNC = 0, 1
"""Program event kinds."""


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
    gpu_last_wave: list[float] | None = None
    """GPU op -> duration of its last wave of thread blocks when it fills its GPU (more blocks than the
    GPU holds at once), else 0 (s): see :func:`last_wave`."""


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
    grid, block = G.grid.astype(np.int64), G.block.astype(np.int64)
    known = (grid.min(axis=1) > 0) & (block.min(axis=1) > 0) & (G.kind != GpuKind.MEMCPY)
    blocks = np.prod(np.maximum(grid, 1), axis=1)
    threads = np.prod(np.maximum(block, 1), axis=1)
    per_sm = np.clip(threads_per_sm // np.maximum(threads, 1), 1, 32)
    waves = np.ceil(blocks / (sm_count * per_sm))
    fill = known & (waves >= 2) & (dur > 0)
    out[fill] = dur[fill] / waves[fill]
    return out


HIDDEN_WORK_MIN = 5e-6
"""Shortest launch-to-start wait on an idle GPU that is kept as unrecorded GPU work (s)."""


def hidden_gpu_delay(rg: RankGraph, lhost: list[int], lat: float, launch_delay: dict[int, float],
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
    end = start + np.nan_to_num(G.dur.astype(float), nan=0.0)
    ok = (lh >= 0) & np.isfinite(start)
    if not ok.any():
        return {}
    o = np.lexsort((start, G.device))
    dev_o, end_o = G.device[o], np.where(np.isfinite(end[o]), end[o], -np.inf)
    # latest end of the ops that started before each op on its device (running max, reset per device)
    first = np.ones(n, dtype=bool)
    first[1:] = dev_o[1:] != dev_o[:-1]
    base = np.where(first, -np.inf, np.r_[-np.inf, end_o[:-1]])
    run = np.empty(n)
    bounds = np.r_[np.flatnonzero(first), n].tolist()
    for a, b in itertools.pairwise(bounds):
        run[a:b] = np.maximum.accumulate(base[a:b])
    prev_end = np.empty(n)
    prev_end[o] = run
    hstart = np.where(lh >= 0, H.start[np.maximum(lh, 0)], np.nan)
    extra = np.array([launch_delay.get(int(h), 0.0) for h in lh]) if launch_delay else 0.0
    ready = hstart + lat + extra
    wait = start - np.maximum(ready, prev_end)
    sel = np.flatnonzero(ok & np.isfinite(wait) & (wait >= minimum))
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
    return float(max(np.percentile(d, 1.0), 0.0))


def trace_kernel_gap(rg: RankGraph) -> float | None:
    """Device-side gap between back-to-back kernels on a stream seen in the trace:
    the median of (start - previous end) over kernels that were already queued
    (launched >= 10 us before their predecessor ended), in seconds."""
    G, H, L = rg.gpu_ops, rg.host_ops, rg.launches
    if len(G) < 3:
        return None
    o = np.lexsort((G.start, G.stream, G.device))
    same = (G.device[o][1:] == G.device[o][:-1]) & (G.stream[o][1:] == G.stream[o][:-1])
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
    return float(max(np.median(gaps), 0.0))


def class_scale(cfg: ReplayConfig, cls: np.ndarray) -> np.ndarray:
    """Per-op duration factor from ``cfg.gpu_scale``."""
    f = np.ones(cls.shape[0])
    if not cfg.gpu_scale:
        return f
    allf = cfg.gpu_scale.get("all", 1.0)
    for k, name in enumerate(OP_CLASSES):
        f[cls == k] = cfg.gpu_scale.get(name, 1.0) * allf
    return f


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
    gend = gstart + np.nan_to_num(gdur, nan=0.0)
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


def compile_rank(rg: RankGraph, cfg: ReplayConfig, default_launch_latency: float,
                 gpu_factor: np.ndarray | None = None, offset: float = 0.0,
                 durations: np.ndarray | None = None, sm_count: int | None = None) -> RankProgram:
    """Compile rank ``rg`` under ``cfg``.

    ``gpu_factor`` multiplies each GPU op's measured duration (cross-accelerator
    scaling); ``default_launch_latency`` comes from the topology's CPU; ``offset``
    (s) places this rank's time origin on the replay's common clock, so that the
    rank's first op starts where it was recorded relative to the other ranks. Every
    other start follows from dependencies (docs/REPLAY.md, "Start times")
    ``durations`` (s per GPU op) replaces the measured durations where finite (modeled replay).
    ``sm_count``: SMs of the rank's GPU, for the block dispatcher (:func:`last_wave`); None: not modeled.
    """
    H, G, L, E = rg.host_ops, rg.gpu_ops, rg.launches, rg.edges
    n_host, n_gpu = len(H), len(G)

    lat, lat_src = _pick(cfg.launch_latency, trace_launch_latency(rg), cfg.max_trace_launch_latency,
                         default_launch_latency, "catalog")
    gap, gap_src = _pick(cfg.kernel_gap, trace_kernel_gap(rg), cfg.max_trace_kernel_gap,
                         cfg.default_kernel_gap, "default")

    # --- GPU durations
    dur = G.dur.astype(float)
    if durations is not None:
        dur = np.where(np.isfinite(durations), durations, dur)
    dur = np.nan_to_num(dur, nan=0.0) * class_scale(cfg, G.cls)
    if gpu_factor is not None:
        dur = dur * gpu_factor
    gpu_dur = dur.tolist()
    waves = last_wave(rg, dur, sm_count) if sm_count else None
    fills = waves is not None and bool((waves > 0).any())

    # --- launch -> GPU ops
    launch_gpu: dict[int, list[int]] = {}
    orphans: list[int] = []
    lrow = G.launch
    lhost = np.where(lrow >= 0, L.host_op[np.maximum(lrow, 0)], -1).tolist() if len(L) else [-1] * n_gpu
    for j, h in enumerate(lhost):
        if h >= 0:
            launch_gpu.setdefault(h, []).append(j)
        else:
            orphans.append(j)

    # --- GPU deps and sync deps from edges
    preds: list[list[int]] = [[] for _ in range(n_gpu)]
    stream_pred = [-1] * n_gpu
    sync_deps: dict[int, list[int]] = {}
    src, dst, kind = E.src.astype(np.int64), E.dst.astype(np.int64), E.kind

    def gpu_edges(k: int, dst_gpu: bool) -> list[tuple[int, int]]:
        sel = kind == k
        s, d = src[sel] - n_host, dst[sel] - (n_host if dst_gpu else 0)
        ok = (s >= 0) & (s < n_gpu) & (d >= 0) & (d < (n_gpu if dst_gpu else n_host))
        if dst_gpu:
            ok &= s != d
        return list(zip(s[ok].tolist(), d[ok].tolist()))

    for s, d in gpu_edges(EdgeKind.STREAM, True):
        stream_pred[d] = s
    for s, d in gpu_edges(EdgeKind.EVENT_WAIT, True):
        if s != stream_pred[d]:
            preds[d].append(s)
    for s, d in gpu_edges(EdgeKind.SYNC, False):
        sync_deps.setdefault(d, []).append(s)

    pred_gap = [gap] * n_gpu
    orphan = _orphan_deps(G.start, G.dur, orphans, stream_pred, pred_gap, offset)

    # A launch of a device-to-pageable copy blocks like a synchronous copy.
    hkind = H.kind.copy()
    names = rg.strings
    for j in np.nonzero(G.copy_kind == CopyKind.DTOH)[0].tolist():
        h = lhost[j]
        if h >= 0 and hkind[h] == HostKind.LAUNCH and "Pageable" in names[G.name[j]]:
            hkind[h] = HostKind.LAUNCH_SYNC
    for h in np.nonzero(hkind == HostKind.LAUNCH_SYNC)[0]:
        h = int(h)
        deps = sync_deps.setdefault(h, [])
        for j in launch_gpu.get(h, []):
            if j not in deps:
                deps.append(j)

    # --- host programs
    region = _region_mask(rg, cfg.cuda_graphs)
    speed = cfg.host_speed
    pre_gap = np.nan_to_num(H.pre_gap.astype(float), nan=0.0) / speed
    tail = np.nan_to_num(H.tail.astype(float), nan=0.0) / speed
    hdur = np.nan_to_num(H.dur.astype(float), nan=0.0)
    is_launch = (hkind == HostKind.LAUNCH) | (hkind == HostKind.LAUNCH_SYNC)
    is_sync = (hkind == HostKind.SYNC) | (hkind == HostKind.LAUNCH_SYNC)
    if cfg.launch_overhead is not None:
        tail[is_launch & ~is_sync] = cfg.launch_overhead
    if cfg.sync_overhead is not None:
        sync_cost = np.full(n_host, cfg.sync_overhead)
    else:
        sync_cost = np.minimum(hdur, cfg.default_sync_overhead)
        # A sync whose GPU work had ended when it was called costs its measured duration;
        # one that waited costs the time it took to return after that work ended.
        gend = G.start + G.dur
        for h, deps in sync_deps.items():
            rel = float(np.max(gend[deps])) if deps else math.nan
            if not (math.isfinite(rel) and math.isfinite(hdur[h])):
                continue
            ret = hdur[h] if rel <= H.start[h] else H.start[h] + hdur[h] - rel
            sync_cost[h] = min(max(ret, 0.0), hdur[h])
    sync_cost = sync_cost / speed
    if region.any():
        # host time inside a region disappears; the gap before a region's root stays
        par = H.parent
        inner = region & (par >= 0) & region[np.maximum(par, 0)]
        pre_gap[inner] = 0.0
        tail[region] = 0.0
        sync_cost[region] = 0.0

    call_dur = np.where(is_sync, sync_cost, tail)
    # waits are measured against the trace's own launch latency, so that a launch-latency what-if moves them
    traced_lat, _ = _pick(None, trace_launch_latency(rg), cfg.max_trace_launch_latency, default_launch_latency, "")
    launch_delay: dict[int, float] = {}
    lh = np.array(sorted(launch_gpu), dtype=np.int64)
    if lh.size:
        d = call_dur[lh]
        med = float(np.median(d))
        gstart = G.start.astype(float)
        is_copy = G.kind == GpuKind.MEMCPY
        for h, extra in zip(lh.tolist(), np.maximum(d - med, 0.0).tolist()):
            if extra > 0 and is_copy[launch_gpu[h]].all():
                # a copy call runs its copy during the call (a pageable copy stages while it copies): never
                # later than the trace shows the copy started
                seen = gstart[launch_gpu[h]] - (H.start[h] + traced_lat)
                seen = seen[np.isfinite(seen)]
                extra = min(extra, max(float(seen.min()), 0.0)) if seen.size else extra
            if extra > 0:
                launch_delay[h] = extra
    hidden = hidden_gpu_delay(rg, lhost, traced_lat, launch_delay) if not region.any() else {}

    static_start = np.zeros(n_host)
    static_end = np.zeros(n_host)
    sb_start = np.zeros(n_host, dtype=np.int64)
    sb_end = np.zeros(n_host, dtype=np.int64)
    sync_ev = np.full(n_host, -1, dtype=np.int64)
    threads: list[ThreadProgram] = []
    parent = H.parent.tolist()
    thread_col = H.thread.tolist()
    hstart = H.start.tolist()
    pre_l, tail_l, cost_l = pre_gap.tolist(), tail.tolist(), sync_cost.tolist()
    is_launch_l, is_sync_l, region_l = is_launch.tolist(), is_sync.tolist(), region.tolist()
    region_root = [region_l[i] and (parent[i] < 0 or not region_l[parent[i]]) for i in range(n_host)]
    graph_cost = cfg.graph_launch_overhead

    def close(q: int, cursor: float, nsync: int) -> float:
        """End host op ``q``: its own remaining time (a sync's cost) after its children."""
        cursor += cost_l[q] if is_sync_l[q] else tail_l[q]
        static_end[q] = cursor
        sb_end[q] = nsync
        return cursor

    # Host ops are grouped by thread, each thread in pre-order (hence by start).
    blocks: list[tuple[int, int]] = []
    i = 0
    while i < n_host:
        j_end = i
        while j_end < n_host and thread_col[j_end] == thread_col[i]:
            j_end += 1
        blocks.append((i, j_end))
        i = j_end
    # The main thread holds the rank's first host op, the one op placed at its recorded
    # offset from the rank's origin. Every other thread starts after the main-thread op
    # that last started before it (its anchor), by the recorded time since that op's
    # start: statically here, and at run time only once the anchor's thread has returned
    # from the synchronize calls before the anchor, whose stall it inherits.
    firsts = [hstart[b[0]] if hstart[b[0]] == hstart[b[0]] else math.inf for b in blocks]
    main = int(np.argmin(firsts)) if blocks else 0
    order = [main] + [k for k in range(len(blocks)) if k != main]
    main_starts = H.start[blocks[main][0]:blocks[main][1]] if blocks else H.start[:0]

    for bi in order:
        i, j_end = blocks[bi]
        t = thread_col[i]
        first = hstart[i]
        anchor_thread, anchor_syncs = -1, 0
        if bi == main or not (first == first):
            cursor = (first if first == first else 0.0) + offset  # NaN-safe (ET-only graphs)
        else:
            m0 = blocks[main][0]
            k = int(np.searchsorted(main_starts, first, side="right")) - 1
            if k < 0:  # cannot happen (the main thread starts first); keep the recorded offset
                cursor = first + offset
            else:
                m = m0 + k
                cursor = static_start[m] + (first - hstart[m]) / speed
                anchor_thread, anchor_syncs = thread_col[m0], int(sb_start[m])
        stack: list[int] = []
        nsync = 0
        ev_kind: list[int] = []
        ev_host: list[int] = []
        ev_static: list[float] = []
        ev_cost: list[float] = []
        for h in range(i, j_end):
            p = parent[h]
            while stack and stack[-1] != p:
                cursor = close(stack.pop(), cursor, nsync)
            cursor += pre_l[h]
            if region_root[h]:
                cursor += graph_cost
            static_start[h] = cursor
            sb_start[h] = nsync
            if is_launch_l[h] and h in launch_gpu:
                ev_kind.append(LAUNCH)
                ev_host.append(h)
                ev_static.append(cursor)
                ev_cost.append(0.0)
            if is_sync_l[h]:
                ev_kind.append(SYNC)
                ev_host.append(h)
                ev_static.append(cursor)
                ev_cost.append(cost_l[h])
                sync_ev[h] = nsync
                nsync += 1
            stack.append(h)
        while stack:
            cursor = close(stack.pop(), cursor, nsync)
        threads.append(ThreadProgram(t, ev_kind, ev_host, ev_static, ev_cost, anchor_thread, anchor_syncs))

    # GPU ops at the head of the replay (no launch, nothing ended before them): anchored to
    # the main-thread op that last started before them; only those before every host op
    # keep their recorded offset from the rank's origin.
    host_anchor: dict[int, tuple[int, int, float]] = {}
    if blocks and main_starts.size:
        m0 = blocks[main][0]
        for j in [j for j in orphan if stream_pred[j] < 0 and np.isfinite(G.start[j])]:
            k = int(np.searchsorted(main_starts, G.start[j], side="right")) - 1
            if k >= 0:
                m = m0 + k
                host_anchor[j] = (thread_col[m0], int(sb_start[m]), float(static_start[m] + G.start[j] - hstart[m]))
                del orphan[j]

    return RankProgram(
        rank=rg.rank,
        threads=threads,
        host_static_start=static_start,
        host_static_end=static_end,
        host_syncs_before_start=sb_start,
        host_syncs_before_end=sb_end,
        host_sync_event=sync_ev,
        launch_gpu=launch_gpu,
        sync_deps=sync_deps,
        gpu_dur=gpu_dur,
        gpu_stream_pred=stream_pred,
        gpu_pred_gap=pred_gap,
        gpu_preds=preds,
        kernel_gap=gap,
        kernel_gap_source=gap_src,
        gpu_orphan_ready=orphan,
        gpu_host_anchor=host_anchor,
        launch_delay=launch_delay,
        launch_latency=lat,
        launch_latency_source=lat_src,
        gpu_hidden_delay=hidden,
        gpu_device=G.device.tolist() if fills else None,
        gpu_last_wave=waves.tolist() if fills else None,
    )


def is_comm(cls: np.ndarray) -> np.ndarray:
    """GPU ops that are communication (collectives, MoE dispatch/combine)."""
    return (cls == OpClass.COLLECTIVE) | (cls == OpClass.MOE_DISPATCH) | (cls == OpClass.MOE_COMBINE)
