"""Step times, step-time breakdown and critical path of a replay.

Step time is defined identically on the measured and the simulated side (see
docs/REPLAY.md):

* a GPU op belongs to the step recorded for it in the execution graph
  (``gpu_ops.step``: the ProfilerStep containing its launch);
* where a rank has several steps, its step time is the GPU step-to-step period:
  start of step N+1's first launched GPU op minus start of step N's, averaged over
  the periods the trace has (ops enqueued before profiling started have no launch
  in the trace and do not start a step);
* otherwise it is the GPU span of the step: first GPU op start to last GPU op end;
* the CPU step time is the duration of the ProfilerStep annotation;
* a CPU-only trace (no GPU op, nothing to project) takes the mean ProfilerStep
  duration as its step time, on both sides.

The breakdown splits the same window (per step) into ``compute`` (some compute
kernel runs), ``exposed_communication`` (communication runs, no compute),
``memcpy`` (only copies or memsets run), ``host_bound_gpu_idle`` (nothing runs
and the next GPU op is waiting for its launch: the host is late) and
``other_idle`` (nothing runs for another reason: a peer, a dependency). The five
add up to the step time.

:func:`comm_split` splits ``exposed_communication`` in two: ``transfer_s`` (a
collective has all its peers and moves data) and ``wait_for_peers_s`` (a
collective kernel runs but waits for its slowest peer to arrive: a sync, not a
fabric cost). The two add up to ``exposed_communication``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import platform
from typing import Any

import numpy as np

from cosim import __version__
from cosim.replay.collective_map import rank_gpu
from cosim.replay.executor import BOUND_COLL, BOUND_LAUNCH, BOUND_PRED, RankRun
from cosim.replay.program import SYNC, RankProgram, is_comm
from cosim.workload.graph import GpuKind, OpClass, RankGraph

_clip: Any = (getattr(np, "_core", None) or np.core).umath.clip
"""The ufunc ``ndarray.clip`` calls (numpy 2's ``np._core.umath``, 1.x's ``np.core.umath``), without its Python
wrappers: the same elementwise function."""

_MIN, _MAX, _ANY = np.minimum.reduce, np.maximum.reduce, np.logical_or.reduce
"""``a.min()``, ``a.max()``, ``a.any()`` of a 1-D array: the ufunc reductions those methods call, without their
Python wrappers (a job's ranks have a few hundred ops: the wrappers cost as much as the work)."""

__all__ = ["BREAKDOWN_KEYS", "NOISE_FLOOR", "SUMMARY_SCHEMA", "WALL_CLOCK_FIELDS", "bound_label", "breakdown", "busiest_links", "comm_split",
           "critical_path", "critical_paths", "explain_change", "fmt_delta", "merge_intervals", "nan_to_none", "op_masks", "slowest_rank",
           "step_times", "summarize", "summarize_with", "without_wall_clock"]

SUMMARY_SCHEMA = "cosim.summary/2"
"""Schema name of ``summary.json`` (docs/REPLAY.md)."""

BREAKDOWN_KEYS = ("compute", "exposed_communication", "memcpy", "host_bound_gpu_idle", "other_idle")


WALL_CLOCK_FIELDS = frozenset({"sim_wall_s", "ops_per_wall_s"})
"""Summary fields that time the simulator's own run (wall seconds), not the simulated system: the only fields
that differ between two runs of the same inputs."""


def without_wall_clock(x: Any) -> Any:
    """``x`` (a summary, or any JSON value holding summaries) without :data:`WALL_CLOCK_FIELDS`, at any depth."""
    if isinstance(x, dict):
        return {k: without_wall_clock(v) for k, v in x.items() if k not in WALL_CLOCK_FIELDS}
    if isinstance(x, list):
        return [without_wall_clock(v) for v in x]
    return x


def step_times(gstep: np.ndarray, start: np.ndarray, end: np.ndarray,
               launched: np.ndarray | None = None) -> dict[str, Any]:
    """Per-step first GPU start and step times from per-op (step, start, end).

    ``launched`` (optional, per op) marks the ops whose launch is in the trace. A step's
    start for the step-to-step period is its first *launched* GPU op (its first op of any
    kind if it has none): ops enqueued before the profiler started carry no launch and are
    a backlog, not the step's work, and would make the periods uneven (tracelens-mi300:
    16.8 and 51.2 ms by any op, 19.0 and 19.0 ms by launched ops). The GPU span of a
    single step still runs from its first op of any kind.

    Returns ``steps`` (step row indices present), ``first`` (first GPU start per step, as
    above), ``span`` (GPU span per step), ``periods`` (step-to-step, len-1), and
    ``step_time`` (mean period if several steps, else the span; NaN if no GPU op).
    """
    ok = (gstep >= 0) & np.isfinite(start) & np.isfinite(end)
    g = gstep[ok]
    one = bool(g.size) and _MIN(g) == _MAX(g)  # one step (a job's rank, mostly): every ok op is that step's
    steps = g[:1].copy() if one else np.unique(g)
    anchor = ok if launched is None else ok & np.asarray(launched, dtype=bool)
    first_any, first, last = (np.zeros(steps.size) for _ in range(3))
    for i, s in enumerate(steps):
        mine = ok if one else ok & (gstep == s)
        first_any[i] = _MIN(start[mine])
        last[i] = _MAX(end[mine])
        a = mine & anchor
        first[i] = _MIN(start[a]) if _ANY(a) else first_any[i]
    span = last - first_any
    periods = np.diff(first) if steps.size >= 2 else np.zeros(0)
    if periods.size:
        st = float(periods.mean())
    elif span.size:
        st = float(span[0])
    else:
        st = math.nan
    return {"steps": steps, "first": first, "span": span, "periods": periods, "step_time": st,
            "window": (float(first[0]), float(first[-1])) if periods.size else
            ((float(first_any[0]), float(last[0])) if span.size else (math.nan, math.nan)),
            "n_periods": max(int(periods.size), 1)}


def merge_intervals(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of intervals [s, e) as sorted disjoint intervals."""
    if s.size == 0:
        return s, e
    o = np.argsort(s, kind="stable")
    return _merge_sorted(s[o], e[o])


def _covered(s: np.ndarray, e: np.ndarray) -> float:
    ms, me = merge_intervals(s, e)
    return float((me - ms).sum())


def breakdown(rg: RankGraph, run: RankRun, window: tuple[float, float], n_periods: int,
              start: np.ndarray | None = None, end: np.ndarray | None = None,
              bound: np.ndarray | None = None, masks: dict[str, Any] | None = None) -> dict[str, float]:
    """Split ``window`` into :data:`BREAKDOWN_KEYS` (seconds per step).

    ``start``/``end``/``bound`` default to the simulated times of ``run``; pass
    the measured ones to break down the trace itself (``bound`` None: idle time
    counts as other_idle). ``masks``: the rank's :func:`op_masks`, when known.
    """
    a, b = window
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return out
    s = run.gpu_start if start is None else start
    e = run.gpu_end if end is None else end
    bnd = run.gpu_bound if (bound is None and start is None) else bound
    ok = np.isfinite(s) & np.isfinite(e) & (e > a) & (s < b)
    s, e = s[ok].clip(a, b), e[ok].clip(a, b)
    mk = masks or op_masks(rg)
    comm, comp = mk["comm"][ok], mk["compute"][ok]
    c1 = _covered(s[comp], e[comp])
    c2 = _covered(s[comp | comm], e[comp | comm])
    ms, me = merge_intervals(s, e)
    c3 = float((me - ms).sum())
    idle = (b - a) - c3
    host_idle = 0.0
    if bnd is not None and ms.size:
        order = np.argsort(s, kind="stable")
        host_idle = _launch_idle(a, ms, me, s[order], order, bnd[ok])
    return _breakdown_of(c1, c2, c3, idle, host_idle, n_periods)


def _launch_idle(a: float, ms: np.ndarray, me: np.ndarray, s_sorted: np.ndarray, order: np.ndarray,
                 bound: np.ndarray) -> float:
    """Seconds of the idle gaps (before the first merged interval ``ms``/``me``, from ``a``, and between them)
    whose op starting at the gap's end (the first in stable start order ``order``, ``s_sorted`` its starts) is
    launch-bound (``bound``: per op, :data:`BOUND_LAUNCH` when so), added in gap order (a cumulative sum is
    sequential)."""
    gap = ms - np.concatenate([[a], me[:-1]])
    pos = np.minimum(np.searchsorted(s_sorted, ms, side="left"), s_sorted.size - 1)
    launch_gap = (gap > 0) & (s_sorted[pos] == ms) & (bound[order[pos]] == BOUND_LAUNCH)
    return float(np.cumsum(gap[launch_gap])[-1]) if launch_gap.any() else 0.0


def _breakdown_of(c1: float, c2: float, c3: float, idle: float, host_idle: float, n_periods: int
                  ) -> dict[str, float]:
    """:data:`BREAKDOWN_KEYS` per step from the seconds covered by compute (``c1``), compute or communication
    (``c2``), any op (``c3``), the window's idle seconds and those of them behind a launch (``host_idle``)."""
    n = max(n_periods, 1)
    return {"compute": c1 / n, "exposed_communication": (c2 - c1) / n, "memcpy": (c3 - c2) / n,
            "host_bound_gpu_idle": host_idle / n, "other_idle": max(idle - host_idle, 0.0) / n}


def op_masks(rg: RankGraph) -> dict[str, np.ndarray]:
    """Per GPU op of ``rg``: ``comm`` (communication: :func:`is_comm`) and ``compute`` (a kernel that is neither
    communication nor a memcpy or memset), what :func:`breakdown` and :func:`comm_split` split time by."""
    G = rg.gpu_ops
    cls = G.cls
    comm = is_comm(cls)
    return {"comm": comm, "compute": ~comm & (G.kind == GpuKind.KERNEL) & (cls != OpClass.MEMCPY)
            & (cls != OpClass.MEMSET)}


def comm_split(rg: RankGraph, run: RankRun, window: tuple[float, float], n_periods: int,
               masks: dict[str, Any] | None = None) -> dict[str, float]:
    """Split the exposed communication of ``window`` into transfer and wait-for-peers (seconds per step).

    A collective's interval on a rank is waiting from its start until its last peer arrives
    (``run.gpu_meet``), then transfer until its end. Exposed transfer is the time some transfer runs and no
    compute kernel does (``|compute U transfer| - |compute|``); the rest of the exposed communication is
    waiting. O(n log n) in the number of GPU ops. ``masks``: the rank's :func:`op_masks`, when known.
    """
    out = {"transfer_s": 0.0, "wait_for_peers_s": 0.0}
    a, b = window
    if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return out
    s, e = run.gpu_start, run.gpu_end
    meet = getattr(run, "gpu_meet", None)
    m = s if meet is None else np.where(np.isfinite(meet), np.maximum(meet, s), s)
    ok = np.isfinite(s) & np.isfinite(e) & (e > a) & (s < b)
    mk = masks or op_masks(rg)
    comm, comp = mk["comm"][ok], mk["compute"][ok]
    s_, e_, m_ = s[ok].clip(a, b), e[ok].clip(a, b), m[ok].clip(a, b)
    c1 = _covered(s_[comp], e_[comp])
    exposed = _covered(np.concatenate([s_[comp], s_[comm]]), np.concatenate([e_[comp], e_[comm]])) - c1
    transfer = _covered(np.concatenate([s_[comp], m_[comm]]), np.concatenate([e_[comp], e_[comm]])) - c1
    return _split_of(transfer, exposed, n_periods)


def _split_of(transfer: float, exposed: float, n_periods: int) -> dict[str, float]:
    """:func:`comm_split`'s figures per step from the window's exposed transfer and exposed communication (s)."""
    n = max(n_periods, 1)
    return {"transfer_s": max(transfer, 0.0) / n, "wait_for_peers_s": max(exposed - transfer, 0.0) / n}


def _sim_breakdown_split(rg: RankGraph, run: RankRun, window: tuple[float, float], n_periods: int,
                         masks: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]]:
    """:func:`breakdown` and :func:`comm_split` of ``run``'s simulated times, the same figures bit for bit, with
    one sort of the window's ops by start shared by their unions: a subset of a stably sorted array, taken in
    sorted order, is the subset's stable sort, so compute, compute + communication and every op are merged from
    the one order (breakdown's launch-gap search uses it too), and comm_split's exposed communication is
    ``|compute U communication| - |compute|``, breakdown's own two unions. That last equality needs the union
    of ties in any order to be the same, which holds when no op ends before it starts (a tie never opens a new
    interval); a run where one does is split by the two functions themselves."""
    a, b = window
    if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return dict.fromkeys(BREAKDOWN_KEYS, 0.0), {"transfer_s": 0.0, "wait_for_peers_s": 0.0}
    s0, e0 = run.gpu_start, run.gpu_end
    ok = np.isfinite(s0) & np.isfinite(e0) & (e0 > a) & (s0 < b)
    s, e = s0[ok].clip(a, b), e0[ok].clip(a, b)
    if not (e >= s).all():
        return (breakdown(rg, run, window, n_periods, masks=masks),
                comm_split(rg, run, window, n_periods, masks))
    comm, comp = masks["comm"][ok], masks["compute"][ok]
    order = np.argsort(s, kind="stable")
    ss, es = s[order], e[order]
    comp_o, both_o = comp[order], (comp | comm)[order]
    c1 = _covered_sorted(ss[comp_o], es[comp_o])
    c2 = _covered_sorted(ss[both_o], es[both_o])
    ms, me = _merge_sorted(ss, es)
    c3 = float((me - ms).sum())
    bnd = run.gpu_bound
    host_idle = _launch_idle(a, ms, me, ss, order, bnd[ok]) if bnd is not None and ms.size else 0.0
    bd = _breakdown_of(c1, c2, c3, (b - a) - c3, host_idle, n_periods)
    meet = getattr(run, "gpu_meet", None)
    m = s0 if meet is None else np.where(np.isfinite(meet), np.maximum(meet, s0), s0)
    m_ = m[ok].clip(a, b)
    transfer = _covered(np.concatenate([s[comp], m_[comm]]), np.concatenate([e[comp], e[comm]])) - c1
    return bd, _split_of(transfer, c2 - c1, n_periods)


_Split = tuple[dict[str, float], dict[str, float]]


_JOINT_MAX_OPS = 1024
"""GPU ops of a rank above which :func:`_sim_breakdown_splits` splits it on its own: the one pass's extra work per
op (its concatenations, per-op window bounds, the second sort's rank key: ~0.1 us) outweighs the ~70 us of numpy
calls a rank saves from ~700 ops on (dsv3-1024's eight ~50 k-op ranks: 28 ms on their own, 64 ms in one pass)."""


def _sim_breakdown_splits(rows: list[tuple[RankGraph, RankRun, tuple[float, float], int, dict[str, Any]]]
                          ) -> list[_Split]:
    """:func:`_sim_breakdown_split` of each ``(rg, run, window, n_periods, masks)`` of ``rows`` (a job's ranks), the
    same figures bit for bit, in one pass over the ranks' ops together (a job's ranks have a few hundred GPU ops
    each: per rank ~90 numpy calls on small arrays, their call overhead, became ~40 calls a job and 4 sums a
    rank; a rank of more than :data:`_JOINT_MAX_OPS` ops is split on its own). The ops are concatenated in rank
    order and sorted by (rank, start), stably (each rank's stable sort by start); the unions are merged per rank (:func:`_merge_segments`), each rank's covered seconds summed over
    its own slice (numpy's pairwise sum of the same array: ``np.add.reduceat`` sums in another order). A rank
    whose window is empty or whose op ends before it starts is split by :func:`_sim_breakdown_split` itself."""
    out: list[_Split | None] = [None] * len(rows)
    vec = []
    for i, (rg, run, (a, b), n, masks) in enumerate(rows):
        if (not (math.isfinite(a) and math.isfinite(b)) or b <= a or run.gpu_bound is None
                or len(run.gpu_start) > _JOINT_MAX_OPS):
            out[i] = _sim_breakdown_split(rg, run, (a, b), n, masks)
        else:
            vec.append(i)
    if vec:
        got = _splits_together([rows[i] for i in vec])
        for i, x in zip(vec, got):
            out[i] = x if x is not None else _sim_breakdown_split(*rows[i])
    return out  # type: ignore[return-value]


def _splits_together(rows: list[tuple[RankGraph, RankRun, tuple[float, float], int, dict[str, Any]]]
                     ) -> list[_Split | None]:
    """:func:`_sim_breakdown_splits` of ranks with finite, non-empty windows and a simulated bound: None for a rank
    with an op that ends before it starts."""
    R = len(rows)
    runs = [x[1] for x in rows]
    counts = np.fromiter((len(r.gpu_start) for r in runs), np.int64, R)
    rid = np.repeat(np.arange(R), counts)
    lo = np.fromiter((x[2][0] for x in rows), float, R)[rid]
    hi = np.fromiter((x[2][1] for x in rows), float, R)[rid]
    s0 = np.concatenate([r.gpu_start for r in runs])
    e0 = np.concatenate([r.gpu_end for r in runs])
    ok = np.isfinite(s0) & np.isfinite(e0) & (e0 > lo) & (s0 < hi)
    lo, hi, rid = lo[ok], hi[ok], rid[ok]
    s, e = _clip(s0[ok], lo, hi), _clip(e0[ok], lo, hi)
    badr = np.zeros(R, dtype=bool)
    badr[rid[e < s]] = True
    comm = np.concatenate([x[4]["comm"] for x in rows])[ok]
    comp = np.concatenate([x[4]["compute"] for x in rows])[ok]
    bnd = np.concatenate([r.gpu_bound for r in runs])[ok]
    order = _sort_each(s, rid, R)
    ss, es = s[order], e[order]
    comp_o, both_o = comp[order], (comp | comm)[order]
    c1 = _covered_each(ss[comp_o], es[comp_o], rid[comp_o], R)
    c2 = _covered_each(ss[both_o], es[both_o], rid[both_o], R)
    ms, me, mr, idx = _merge_segments(ss, es, rid)
    c3 = _sums_each(me - ms, mr, R)
    # the gap before each merged interval (from the window's start, or the rank's previous interval); the op at the
    # gap's end is the interval's first (a merged interval starts after every earlier start: ops end after they
    # start, so no earlier op of its rank starts at its start)
    prev = np.empty_like(me)
    prev[1:] = me[:-1]
    first = np.ones(mr.size, dtype=bool)
    first[1:] = mr[1:] != mr[:-1]
    prev[first] = lo[idx[first]]
    gap = ms - prev
    launch = (gap > 0) & (bnd[order[idx]] == BOUND_LAUNCH)
    host_idle = _seq_sums_each(gap[launch], mr[launch], R)
    meets = [r.gpu_start if getattr(r, "gpu_meet", None) is None else r.gpu_meet for r in runs]
    meet0 = np.concatenate(meets)
    m = np.where(np.isfinite(meet0), np.maximum(meet0, s0), s0)[ok]
    m_ = _clip(m, lo, hi)
    xs = np.concatenate([s[comp], m_[comm]])
    xe = np.concatenate([e[comp], e[comm]])
    xr = np.concatenate([rid[comp], rid[comm]])
    o2 = np.argsort(xr, kind="stable")
    xs, xe, xr = xs[o2], xe[o2], xr[o2]
    o2 = _sort_each(xs, xr, R)
    tr = _covered_each(xs[o2], xe[o2], xr[o2], R)
    res: list[_Split | None] = []
    for k, (_, _, (a, b), n, _) in enumerate(rows):
        if badr[k]:
            res.append(None)
            continue
        bd = _breakdown_of(c1[k], c2[k], c3[k], (b - a) - c3[k], host_idle[k], n)
        res.append((bd, _split_of(tr[k] - c1[k], c2[k] - c1[k], n)))
    return res


def _merge_segments(s: np.ndarray, e: np.ndarray, rid: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`_merge_sorted` of each rank's intervals (``rid``: each interval's rank, sorted; ``s`` in stable start
    order within a rank): the merged starts and ends, their ranks and the index of each one's first interval.
    Each rank's running maximum of ends starts afresh."""
    if s.size == 0:
        z = np.zeros(0, dtype=np.int64)
        return s, e, z, z
    first = np.ones(s.size, dtype=bool)
    first[1:] = rid[1:] != rid[:-1]
    b = [*first.nonzero()[0].tolist(), s.size]
    acc = np.maximum.accumulate
    run_max = np.concatenate([acc(e[b[k]:b[k + 1]]) for k in range(len(b) - 1)])
    new = first.copy()
    new[1:] |= s[1:] > run_max[:-1]
    idx = new.nonzero()[0]
    return s[idx], np.concatenate((run_max[idx[1:] - 1], run_max[-1:])), rid[idx], idx


def _sort_each(x: np.ndarray, rid: np.ndarray, R: int) -> np.ndarray:
    """The order that sorts each rank's slice of ``x`` stably (``rid`` sorted): ``np.argsort(kind="stable")`` of
    each slice, offset to it (one sort of all would compare across ranks: ~2x the time)."""
    bounds = np.searchsorted(rid, np.arange(R + 1)).tolist()
    return np.concatenate([np.argsort(x[bounds[k]:bounds[k + 1]], kind="stable") + bounds[k] for k in range(R)])


def _sums_each(x: np.ndarray, rid: np.ndarray, R: int) -> list[float]:
    """Per rank ``0..R-1``, ``float(x[rid == k].sum())`` (``rid`` sorted): numpy's sum of each rank's slice."""
    bounds = np.searchsorted(rid, np.arange(R + 1)).tolist()
    return [float(x[bounds[k]:bounds[k + 1]].sum()) for k in range(R)]


def _seq_sums_each(x: np.ndarray, rid: np.ndarray, R: int) -> list[float]:
    """Per rank ``0..R-1``, the last of ``np.cumsum(x[rid == k])`` (0.0 if none; ``rid`` sorted, ``x`` > 0): a
    cumulative sum adds in order, as a Python loop does."""
    if x.size == 0:
        return [0.0] * R
    first = np.ones(x.size, dtype=bool)
    first[1:] = rid[1:] != rid[:-1]
    pos = np.arange(x.size) - first.nonzero()[0][np.cumsum(first) - 1]
    pad = np.zeros((R, int(pos.max()) + 1))
    pad[rid, pos] = x
    return np.cumsum(pad, axis=1)[:, -1].tolist()  # a row's trailing zeros add nothing (x + 0.0 is x)


def _covered_each(s: np.ndarray, e: np.ndarray, rid: np.ndarray, R: int) -> list[float]:
    """:func:`_covered_sorted` of each rank's intervals (``rid`` sorted, stable start order within a rank)."""
    ms, me, mr, _ = _merge_segments(s, e, rid)
    return _sums_each(me - ms, mr, R)


def _merge_sorted(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """:func:`merge_intervals` of intervals already in stable start order."""
    if s.size == 0:
        return s, e
    run_max = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    np.greater(s[1:], run_max[:-1], out=new[1:])
    idx = new.nonzero()[0]
    return s[idx], np.concatenate((run_max[idx[1:] - 1], run_max[-1:]))


def _covered_sorted(s: np.ndarray, e: np.ndarray) -> float:
    ms, me = _merge_sorted(s, e)
    return float((me - ms).sum())


_CLS_NAMES = [c.name.lower() for c in OpClass]
"""Op class names as the summary writes them, by :class:`OpClass` value (iterating an enum is slow)."""


def critical_path(rg: RankGraph, prog: RankProgram, run: RankRun, window: tuple[float, float],
                  n_periods: int) -> dict[str, Any]:
    """What bounds the step: walk back from the last GPU op in ``window`` through
    whatever set each start (a GPU predecessor, a collective, a launch and the
    host work before it, a synchronize and the GPU op it waited for).

    Returns seconds per step by resource (``gpu``, ``communication``, ``memcpy``,
    ``host``, ``launch_latency``) and by GPU op class, and the top ops.
    """
    return critical_paths(rg, prog, run, window, n_periods, None)[0]


def _cp_start(run: RankRun, window: tuple[float, float]) -> int | None:
    """The GPU op a walk over ``window`` starts from (the last to end, its end clipped to the window; the first
    of equals), None when the window is not finite or holds no GPU op."""
    a, b = window
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    s, e = run.gpu_start, run.gpu_end
    cand = (np.isfinite(e) & (s < b) & (e > a)).nonzero()[0]
    if cand.size == 0:
        return None
    return int(cand[np.minimum(e[cand], b).argmax()])


def critical_paths(rg: RankGraph, prog: RankProgram, run: RankRun, window: tuple[float, float], n_periods: int,
                   sub: tuple[float, float] | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``critical_path(rg, prog, run, window, n_periods)`` and, with ``sub`` (a window inside ``window``, such as a
    coalesced step's repeated period), ``critical_path(rg, prog, run, sub, 1)``, identical to the last bit, in one
    walk where it can, else from the same Python lists of the rank's columns (built once: O(ops)).

    The walk's next op depends only on the op it is at (the GPU predecessor or collective that released it, its
    launch and the synchronize before it), never on the time: once the walk over ``window`` reaches the op the
    walk over ``sub`` starts from, at or after the time that walk starts at, the two visit the same ops and only
    clip their segments to different windows; both sums are kept, each in its own walk's order. Where the walk
    over ``window`` never meets that start (it reaches the period through another op), or stops on its step guard
    while the other would go on, ``sub`` is walked on its own.
    """
    j = _cp_start(run, window)
    j2 = _cp_start(run, sub) if sub is not None else None
    if j is None and j2 is None:
        return _cp_empty(), (_cp_empty() if sub is not None else None)
    data = _WalkData(rg, prog, run)
    if j is None:
        out = _cp_empty()
        joint = None
    else:
        both = (sub, j2) if sub is not None and j2 is not None and sub[0] >= window[0] else None
        main, joint = _walk(data, window, j, both)
        out = _cp_result(*main, n_periods)
    if sub is None:
        return out, None
    if j2 is None:
        return out, _cp_empty()
    if joint is None:
        joint = _walk(data, sub, j2, None)[0]
    return out, _cp_result(*joint, 1)


def _cp_empty() -> dict[str, Any]:
    return {"total_s": 0.0, "by_resource": {"gpu": 0.0, "communication": 0.0, "memcpy": 0.0, "host": 0.0,
                                            "launch_latency": 0.0}, "by_class": {}, "top_ops": []}


def _cp_result(res: dict[str, float], by_class: dict[str, float], by_op: dict[str, float],
               n_periods: int) -> dict[str, Any]:
    n = max(n_periods, 1)
    top = sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    return {
        "total_s": sum(res.values()) / n,
        "by_resource": {k: v / n for k, v in res.items()},
        "by_class": {k: v / n for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"name": k[:160], "time_s": v / n} for k, v in top],
        "bound": max(res, key=lambda k: res[k]),
    }


_Sums = tuple[dict[str, float], dict[str, float], dict[str, float]]


class _WalkData:
    """What the critical-path walks of one rank read, as Python lists (the walk reads single elements: O(ops) once,
    then O(1) a step), and per thread its stalled syncs (sim end, releasing GPU op) sorted by end (ends as an
    array, as a list or None where one is NaN, releasing ops as a list): the walk searches the list with bisect
    (np.searchsorted's answer for a sorted list without NaN: NaN sorts last, where bisect's comparisons would go
    wrong)."""

    def __init__(self, rg: RankGraph, prog: RankProgram, run: RankRun) -> None:
        st_ = _static(rg, prog)
        thread_syncs: dict[int, tuple[Any, list[float] | None, list[int]]] = {}
        host_end = np.asarray(run.host_end, dtype=float)
        lists = getattr(run, "lists", None)  # the executor's (RankRun.lists): no arrays to convert back
        for tp, hosts in zip(prog.threads, st_["sync_hosts"]):
            if lists is not None:
                got = _syncs_of(lists[4].get(tp.thread, []), lists[5].get(tp.thread, []), hosts, host_end)
                if got is not None:
                    thread_syncs[tp.thread] = got
                    continue
            stalls = np.asarray(run.sync_stall.get(tp.thread, _NO_FLOATS), dtype=float)
            bnd = np.asarray(run.sync_bound.get(tp.thread, _NO_INTS), dtype=np.int64)
            m = min(len(hosts), len(stalls))
            sel = ((stalls[:m] > 0) & (bnd[:m] >= 0)).nonzero()[0]
            ends = host_end[hosts[sel]]
            ops = bnd[sel]
            o = np.argsort(ends, kind="stable")
            ends = ends[o]
            el_ = ends.tolist()
            thread_syncs[tp.thread] = (ends, None if (el_ and el_[-1] != el_[-1]) else el_, ops[o].tolist())
        self.thread_syncs = thread_syncs
        if lists is not None:
            self.sl, self.el, self.bound, self.bsrc = lists[:4]
        else:
            self.sl, self.el = run.gpu_start.tolist(), run.gpu_end.tolist()
            self.bound, self.bsrc = run.gpu_bound.tolist(), run.gpu_bound_src.tolist()
        self.st = st_
        self.strings = rg.strings
        self.hstart, self.hthread = run.host_start, rg.host_ops.thread
        self.guard = len(rg.gpu_ops) + sum(len(v[0]) for v in thread_syncs.values()) + 8


def _syncs_of(stalls: list[float], bounds: list[int], hosts: np.ndarray, host_end: np.ndarray
              ) -> tuple[list[float], list[float], list[int]] | None:
    """A thread's entry of :attr:`_WalkData.thread_syncs` from the executor's lists of its synchronize calls'
    stalls and releasing ops (``hosts``: their host ops), the ends sorted stably in Python (a few calls a thread);
    None where an end is NaN (Python's sort needs an order: the arrays' path then)."""
    m = min(len(hosts), len(stalls))
    sel = [i for i in range(m) if stalls[i] > 0 and bounds[i] >= 0]
    ends = host_end[hosts[sel]].tolist() if sel else []
    if any(x != x for x in ends):
        return None
    o = sorted(range(len(ends)), key=ends.__getitem__)
    el_ = [ends[i] for i in o]
    return el_, el_, [bounds[sel[i]] for i in o]


def _walk(data: _WalkData, window: tuple[float, float], j: int,
          sub: tuple[tuple[float, float], int] | None) -> tuple[_Sums, _Sums | None]:
    """The critical-path walk over ``window`` from GPU op ``j``: seconds (not per step) by resource, GPU op class
    and op name; with ``sub`` (a window and its walk's start op), that walk's sums as well (None where it did not
    end within this walk: see :func:`critical_paths`)."""
    a, b = window
    res = {"gpu": 0.0, "communication": 0.0, "memcpy": 0.0, "host": 0.0, "launch_latency": 0.0}
    by_class: dict[str, float] = {}
    by_op: dict[str, float] = {}
    cls_names = _CLS_NAMES
    st_ = data.st
    thread_syncs = data.thread_syncs
    sl, el, bound, bsrc = data.sl, data.el, data.bound, data.bsrc
    comml, copyl, clsl, namel, lhl = st_["comm"], st_["copy"], st_["cls"], st_["name"], st_["launch_host"]
    strings = data.strings
    hstart, hthread = data.hstart, data.hthread
    t = min(el[j], b)
    guard = data.guard
    # the walk over ``sub``: waiting for its start op (wait2), on it (on2) or ended (ended2)
    res2 = dict.fromkeys(res, 0.0)
    by_class2: dict[str, float] = {}
    by_op2: dict[str, float] = {}
    wait2 = on2 = ended2 = False
    a2 = t2 = 0.0
    j2 = -1
    guard2 = guard
    if sub is not None:
        (a2, b2), j2 = sub
        t2 = min(el[j2], b2)
        wait2 = True
        if not t2 > a2:  # its loop never runs
            wait2, ended2 = False, True
    while guard > 0 and t > a:
        guard -= 1
        if wait2 and j == j2 and t >= t2:
            wait2, on2 = False, True
        if on2:
            if guard2 > 0 and t2 > a2:
                guard2 -= 1
            else:
                on2, ended2 = False, True
        # max() / min() as conditionals that return the same operand (NaN and -0.0 included): no call per step
        st = sl[j]
        st = a if a > st else st
        seg = t - st
        seg = 0.0 if 0.0 > seg else seg
        key = "communication" if comml[j] else ("memcpy" if copyl[j] else "gpu")
        res[key] += seg
        cn = cls_names[clsl[j]]
        by_class[cn] = by_class.get(cn, 0.0) + seg
        nm = namel[j]
        nm = strings[nm] if nm >= 0 else "?"
        by_op[nm] = by_op.get(nm, 0.0) + seg
        if on2:
            st2 = sl[j]
            st2 = a2 if a2 > st2 else st2
            seg2 = t2 - st2
            seg2 = 0.0 if 0.0 > seg2 else seg2
            res2[key] += seg2
            by_class2[cn] = by_class2.get(cn, 0.0) + seg2
            by_op2[nm] = by_op2.get(nm, 0.0) + seg2
            t2 = st2
            if t2 <= a2:
                on2, ended2 = False, True
        t = st
        if t <= a:
            break
        bd = bound[j]
        if (bd == BOUND_PRED or bd == BOUND_COLL) and bsrc[j] >= 0:
            j = bsrc[j]
            e = el[j]
            t = e if e < t else t
            if on2:
                t2 = e if e < t2 else t2
            continue
        lh = lhl[j]
        if lh < 0:
            if on2:
                on2, ended2 = False, True
            break
        t_launch = float(hstart[lh])
        lat = max(t - t_launch, 0.0)
        res["launch_latency"] += min(lat, max(t - a, 0.0))
        t = t_launch
        if on2:
            lat2 = max(t2 - t_launch, 0.0)
            res2["launch_latency"] += min(lat2, max(t2 - a2, 0.0))
            t2 = t_launch
        ends, endl, opl = thread_syncs.get(int(hthread[lh]), _NO_SYNCS)
        k = (bisect.bisect_right(endl, t) if endl is not None else int(np.searchsorted(ends, t, side="right"))) - 1
        if k < 0:
            res["host"] += max(t - a, 0.0)
            if on2:
                res2["host"] += max(t2 - a2, 0.0)
                on2, ended2 = False, True
            break
        te = float(ends[k]) if endl is None else endl[k]
        res["host"] += max(t - max(te, a), 0.0)
        t = te
        if on2:
            res2["host"] += max(t2 - max(te, a2), 0.0)
            t2 = te
        j = opl[k]
    if on2 and not (guard2 > 0 and t2 > a2):  # its loop ends at this walk's end too
        on2, ended2 = False, True
    return (res, by_class, by_op), ((res2, by_class2, by_op2) if ended2 and sub is not None else None)


_NO_FLOATS = np.zeros(0)
_NO_INTS = np.zeros(0, dtype=np.int64)
_NO_SYNCS: tuple[np.ndarray, list[float] | None, list[int]] = (_NO_FLOATS, [], [])


def _static(rg: RankGraph, prog: RankProgram) -> dict[str, Any]:
    """What :func:`critical_path` reads of rank ``rg``'s graph and program alone, kept on the program
    (:attr:`RankProgram.summary_static`: compiled from ``rg``, shared by replays of the same content): per GPU op
    as Python lists its communication and copy flags, class, name and launching host op (-1: none); per thread
    of ``prog`` the host ops of its SYNC events; ``masks``: :func:`op_masks`."""
    got = prog.summary_static
    if got is None:
        G = rg.gpu_ops
        launch_host = prog.gpu_launch_host  # GPU op -> the host op that launched it (-1: none)
        if launch_host is None:
            launch_host = np.full(len(G), -1, dtype=np.int64)
            if prog.launch_gpu:
                lists = list(prog.launch_gpu.values())
                launch_host[np.fromiter(itertools.chain.from_iterable(lists), np.int64)] = np.repeat(
                    np.fromiter(prog.launch_gpu, np.int64, len(lists)),
                    np.fromiter(map(len, lists), np.int64, len(lists)))
        got = prog.summary_static = {
            "comm": is_comm(G.cls).tolist(), "copy": (G.kind != GpuKind.KERNEL).tolist(), "cls": G.cls.tolist(),
            "name": G.name.tolist(), "launch_host": np.asarray(launch_host).tolist(), "masks": op_masks(rg),
            "sync_hosts": [np.asarray(tp.ev_host, dtype=np.int64)[np.asarray(tp.ev_kind) == SYNC]
                           for tp in prog.threads]}
    return got


NOISE_FLOOR = 1e-3
"""Relative step-time change below which two runs count as the same ("no effect"): 0.1% of the step.

The replay is deterministic, but a what-if that does not touch the bound resource still moves the step by a
few microseconds (a reordered tie, a collective that starts a little later); cosim's accuracy against
measurements (median 0.1-10%) is far coarser, so ranking such differences would rank noise."""

_CP_BOUND = {"host": "host-bound", "gpu": "compute-bound", "communication": "communication-bound",
             "memcpy": "copy-bound", "launch_latency": "launch-latency-bound"}
_LINK_KIND = {"nvlink": "NVLink", "pcie": "PCIe", "infiniband": "InfiniBand", "ethernet": "Ethernet",
              "c2c": "NVLink-C2C", "upi": "UPI", "xgmi": "Infinity Fabric", "infinity_fabric": "Infinity Fabric"}


def bound_label(cp_bound: str | None) -> str:
    """A critical-path bound as a word: "host" -> "host-bound"."""
    return _CP_BOUND.get(str(cp_bound), f"{cp_bound}-bound")


def busiest_links(usage: Any, topology: Any, window: tuple[float, float], n_periods: int) -> dict[str, Any]:
    """Per link type with traffic, its busiest directed link within the job's step ``window``.

    Returns ``{link_type: {"kind", "link", "busy_s_per_step", "busy_share"}}`` (``busy_share``: union of the
    link's traffic intervals in the window over the window), sorted by busy share, largest first. Empty when
    the replay recorded no link traffic."""
    a, b = window
    if usage is None or topology is None or not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return {}
    busy = usage.busy(a, b)
    n = max(n_periods, 1)
    best: dict[str, dict[str, Any]] = {}
    g = topology.graph
    for i in (busy > 0).nonzero()[0].tolist():
        u, v = usage.links[i]
        e = g.edges[u, v] if g.has_edge(u, v) else {}
        lt = str(e.get("link", "?"))
        share = float(busy[i]) / (b - a)
        if lt not in best or share > best[lt]["busy_share"]:
            best[lt] = {"kind": str(e.get("kind", "?")), "link": f"{u} -> {v}",
                        "busy_s_per_step": float(busy[i]) / n, "busy_share": share}
    return dict(sorted(best.items(), key=lambda kv: (-kv[1]["busy_share"], kv[0])))


def _link_name(lt: str, info: dict[str, Any]) -> str:
    return _LINK_KIND.get(str(info.get("kind")), lt)


def _touched_link_types(base: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Link types whose catalog entry the two runs' overrides set differently (``links.<type>.<field>``)."""
    co_a = (base.get("config") or {}).get("catalog_overrides") or {}
    co_b = (new.get("config") or {}).get("catalog_overrides") or {}
    out = []
    for k in sorted(co_a.keys() | co_b.keys()):
        if co_a.get(k) != co_b.get(k) and k.startswith("links."):
            lt = k.split(".")[1]
            if lt not in out:
                out.append(lt)
    return out


def explain_change(base: dict[str, Any], new: dict[str, Any], noise_floor: float = NOISE_FLOOR) -> dict[str, Any]:
    """Compare a run's summary with its baseline's, in words a hardware architect can use.

    Returns ``{"delta_s", "relative", "speedup", "unchanged", "bound", "text"}``. When the step moved by
    less than ``noise_floor`` of the baseline step, ``unchanged`` is True and the text says which resource
    bounds the step instead, e.g. "unchanged (Δ +0.0 ms, below the 0.1% noise floor): host-bound (host 82% of
    the critical path); NVLink busy 2% of the step" -- naming the link types the what-if changed, else the
    busiest one."""
    from cosim.units import fmt_time

    bs, ns = base.get("step_time_s"), new.get("step_time_s")
    cp = new.get("critical_path") or {}
    bound = cp.get("bound")
    out: dict[str, Any] = {"delta_s": None, "relative": None, "speedup": None, "unchanged": False,
                           "bound": bound, "text": "no step time to compare"}
    if not bs or not ns:
        return out
    d = ns - bs
    rel = d / bs
    out.update(delta_s=d, relative=rel, speedup=bs / ns, unchanged=abs(rel) < noise_floor)
    br = cp.get("by_resource") or {}
    tot = sum(br.values())
    why = bound_label(bound) + (f" ({bound} {br[bound] / tot:.0%} of the critical path)"
                                if bound in br and tot > 0 else "")
    links = new.get("busiest_links") or {}
    touched = [lt for lt in _touched_link_types(base, new) if lt in links] or list(links)[:1]
    busy = [f"{_link_name(lt, links[lt])} busy {_share(links[lt]['busy_share'])} of the step"
            + (f" ({fmt_time(links[lt]['busy_s_per_step'])} per step)" if links[lt]["busy_share"] < 0.01 else "")
            for lt in touched]
    ms = fmt_delta(d, bs)
    if out["unchanged"]:
        head = f"unchanged (Δ {ms}, below the {noise_floor:.1%} noise floor)"
    else:
        head = f"{bs / ns:.2f}x {'faster' if d < 0 else 'slower'} (Δ {ms}, {rel:+.1%})"
    out["text"] = f"{head}: {why}" + ("; " + ", ".join(busy) if busy else "")
    return out


def fmt_delta(d: float, step: float) -> str:
    """A step-time difference in ms to a resolution of 0.1% of ``step`` (at least 0.1 ms digits), signed;
    one that rounds to zero prints as "0.0 ms", never "-0.000 ms"."""
    digits = 1
    if step > 0:
        digits = max(1, min(6, -math.ceil(math.log10(step))))
    v = round(d * 1e3, digits)
    return f"{0.0:.{digits}f} ms" if v == 0 else f"{v:+.{digits}f} ms"


def _share(x: float) -> str:
    """A share of the step as a percentage, with a decimal when small ("2%", "0.04%")."""
    p = 100 * x
    if p >= 10 or p == 0:
        return f"{p:.0f}%"
    return f"{p:.1f}%" if p >= 0.1 else ("<0.1%" if p >= 0.01 else "<0.01%")


def nan_to_none(x: float | None) -> float | None:
    """``x`` as a JSON number, None where it is missing or not finite."""
    return None if x is None or not math.isfinite(x) else float(x)


def _measured(rg: RankGraph, prog: RankProgram, run: RankRun) -> tuple[dict[str, Any], dict[str, float]]:
    """The trace's own step times and breakdown of rank ``rg`` (its measured GPU op times), kept on its program
    (:attr:`RankProgram.measured`: compiled from ``rg``, shared by replays of the same content). ``run`` is not
    read: :func:`breakdown` of given times reads no simulated bound."""
    got = prog.measured
    if got is None:
        G = rg.gpu_ops
        end = G.start + G.dur
        meas = step_times(G.step, G.start, end, G.launch >= 0)
        bd = breakdown(rg, run, meas["window"], meas["n_periods"], start=G.start, end=end)
        got = prog.measured = {"steps": meas, "breakdown": bd}
    return got["steps"], got["breakdown"]


def summarize(res: Any) -> dict[str, Any]:
    """The documented ``summary.json`` of a finished replay (a :class:`cosim.replay.ReplayResult`), JSON-ready."""
    return summarize_with(res, {})[0]


def summarize_with(res: Any, sub_windows: dict[int, tuple[float, float]]) -> tuple[dict[str, Any], dict[int, Any]]:
    """:func:`summarize` and, for each rank of ``sub_windows``, its ``breakdown``, ``exposed_communication_split``
    and ``critical_path`` over its window (one period: ``n_periods`` 1), the first two from one sort of the
    window's ops (:func:`_sim_breakdown_split`), the last from the same walk as the rank's step
    (:func:`critical_paths`)."""
    subs: dict[int, Any] = {}
    ranks = []
    windows = []
    jobs = list(zip(res.graph.ranks, res.programs, res.runs))
    sims = [step_times(rg.gpu_ops.step, run.gpu_start, run.gpu_end, rg.gpu_ops.launch >= 0) for rg, _, run in jobs]
    all_masks = [_static(rg, prog)["masks"] for rg, prog, _ in jobs]
    splits = _sim_breakdown_splits([(rg, run, sim["window"], sim["n_periods"], mk)
                                    for (rg, _, run), sim, mk in zip(jobs, sims, all_masks)])
    for (rg, prog, run), sim, masks, (bd, split) in zip(jobs, sims, all_masks, splits):
        G = rg.gpu_ops
        meas, bd_meas = _measured(rg, prog, run)
        st_rows = rg.steps
        cpu_meas, cpu_sim = [], []
        step_rows = sim["steps"] if sim["steps"].size else np.arange(len(st_rows))
        for s in step_rows:
            h = int(st_rows.host_op[s]) if 0 <= s < len(st_rows) else -1
            if h >= 0:
                cpu_meas.append(float(rg.host_ops.dur[h]))
                cpu_sim.append(float(run.host_end[h] - run.host_start[h]))
            elif 0 <= s < len(st_rows):  # no ProfilerStep annotation: the step is the span of its host ops
                cpu_meas.append(float(st_rows.cpu_dur[s]))
                mine = rg.host_ops.step == s
                cpu_sim.append(float(run.host_end[mine].max() - run.host_start[mine].min()) if mine.any() else math.nan)
        windows.append((*sim["window"], sim["n_periods"]))
        cp, sub_cp = critical_paths(rg, prog, run, sim["window"], sim["n_periods"], sub_windows.get(rg.rank))
        if sub_cp is not None:
            sub_bd, sub_split = _sim_breakdown_split(rg, run, sub_windows[rg.rank], 1, masks)
            subs[rg.rank] = {"breakdown": sub_bd, "exposed_communication_split": sub_split, "critical_path": sub_cp}
        numbers = [int(st_rows.number[s]) for s in step_rows if 0 <= s < len(st_rows)]
        per_step = []
        sp, mp = sim["periods"], meas["periods"]
        for k, num in enumerate(numbers):
            if sp.size:
                sv = sp[k] if k < sp.size else math.nan
                mv = mp[k] if k < mp.size else math.nan
            elif k < sim["span"].size:
                sv, mv = sim["span"][k], meas["span"][k] if k < meas["span"].size else math.nan
            else:
                sv = mv = math.nan
            per_step.append({"step": num, "step_time_s": nan_to_none(sv), "measured_step_time_s": nan_to_none(mv)})
        sim_t, meas_t = sim["step_time"], meas["step_time"]
        projected = bool(rg.source.get("projected"))
        if projected:
            cpu_meas = []
        if not math.isfinite(meas_t) and cpu_meas:  # CPU-only trace: the step is the host's
            meas_t = float(np.mean(cpu_meas))
            sim_t = float(np.nanmean(cpu_sim)) if np.isfinite(cpu_sim).any() else math.nan
            per_step = [{"step": n, "step_time_s": nan_to_none(c), "measured_step_time_s": nan_to_none(m)}
                        for n, c, m in zip(numbers or [-1] * len(cpu_sim), cpu_sim, cpu_meas)]
        err = (sim_t - meas_t) / meas_t if (math.isfinite(meas_t) and meas_t > 0) else math.nan
        ranks.append({
            "rank": rg.rank,
            "device": rg.device_name,
            "gpu": rank_gpu(res.topology, rg.rank, res.config),
            "step_time_s": nan_to_none(sim_t),
            "measured_step_time_s": nan_to_none(meas_t),
            "error": nan_to_none(err),
            "cpu_step_time_s": nan_to_none(_nanmean(cpu_sim)),
            "measured_cpu_step_time_s": nan_to_none(float(np.mean(cpu_meas)) if len(cpu_meas) > 1
                                                    else (cpu_meas[0] if cpu_meas else math.nan)),
            "steps": per_step,
            "breakdown": bd,
            "exposed_communication_split": split,
            "measured_breakdown": {k: bd_meas[k] for k in ("compute", "exposed_communication", "memcpy")},
            "critical_path": cp,
            "launch_latency_s": run.launch_latency,
            "launch_latency_source": run.launch_latency_source,
            "gpu_ops": len(G),
            "host_ops": len(rg.host_ops),
        })
    slowest, ties = slowest_rank(ranks)
    slow = slowest or (ranks[0] if ranks else None)
    meas_vals = [r["measured_step_time_s"] for r in ranks if r["measured_step_time_s"] is not None]
    step = slow["step_time_s"] if slow else None
    mstep = max(meas_vals) if meas_vals else None
    topo = res.topology
    return {
        "schema": SUMMARY_SCHEMA,
        "cosim_version": __version__,
        "sources": res.sources,
        "topology": getattr(topo, "name", None),
        "config": res.config.to_dict(),
        "step_time_s": step,
        "measured_step_time_s": mstep,
        "error": nan_to_none((step - mstep) / mstep) if (step is not None and mstep) else None,
        "breakdown": slow["breakdown"] if slow else dict.fromkeys(BREAKDOWN_KEYS, 0.0),
        "exposed_communication_split": slow["exposed_communication_split"] if slow else
        {"transfer_s": 0.0, "wait_for_peers_s": 0.0},
        "critical_path": slow["critical_path"] if slow else {},
        "slowest_rank": slowest["rank"] if slowest else None,
        "slowest_rank_ties": ties,
        "busiest_links": busiest_links(res.link_usage, topo, *job_window(windows)),
        "ranks": ranks,
        "sim_wall_s": res.sim_wall_s,
        "events": res.events,
        "ops_per_wall_s": nan_to_none(sum(r["gpu_ops"] + r["host_ops"] for r in ranks) / res.sim_wall_s)
        if res.sim_wall_s > 0 else None,
        "notes": res.notes,
        "links": res.links,
        "host": platform.node(),
        **({"kernel_error_by_class": res.kernel_errors} if res.kernel_errors else {}),
        **({"precision": res.precision} if res.precision else {}),
    }, subs


def _nanmean(x: list[float]) -> float:
    """``np.nanmean(x)``, NaN when ``x`` has no finite value; one value is its own mean (no numpy call: a
    job's ranks have one step each, mostly)."""
    if len(x) == 1:
        return x[0] if math.isfinite(x[0]) else math.nan
    return float(np.nanmean(x)) if x and np.isfinite(x).any() else math.nan


def slowest_rank(ranks: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, int]:
    """The first of the per-rank summaries with the slowest simulated step (the job's step: the summary shows its
    breakdown) and how many ranks tie for that step; ``(None, 0)`` when no rank has a simulated step."""
    valid = [r for r in ranks if r.get("step_time_s") is not None]
    if not valid:
        return None, 0
    slow = max(valid, key=lambda r: r["step_time_s"])
    return slow, sum(r["step_time_s"] == slow["step_time_s"] for r in valid)


def job_window(windows: list[tuple[float, float, int]]) -> tuple[tuple[float, float], int]:
    """The hull of the ranks' simulated step windows, and the most step periods of any rank."""
    ok = [w for w in windows if math.isfinite(w[0]) and math.isfinite(w[1])]
    if not ok:
        return (math.nan, math.nan), 1
    return (min(w[0] for w in ok), max(w[1] for w in ok)), max(w[2] for w in ok)
