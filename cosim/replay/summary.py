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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cosim.replay.executor import BOUND_COLL, BOUND_LAUNCH, BOUND_PRED, RankRun
from cosim.replay.program import SYNC, RankProgram, is_comm
from cosim.workload.graph import GpuKind, OpClass, RankGraph

__all__ = ["BREAKDOWN_KEYS", "breakdown", "critical_path", "merge_intervals", "step_times"]

BREAKDOWN_KEYS = ("compute", "exposed_communication", "memcpy", "host_bound_gpu_idle", "other_idle")


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
    steps = np.unique(gstep[ok])
    anchor = ok if launched is None else ok & np.asarray(launched, dtype=bool)
    first_any, first, last = (np.zeros(steps.size) for _ in range(3))
    for i, s in enumerate(steps):
        mine = ok & (gstep == s)
        first_any[i] = start[mine].min()
        last[i] = end[mine].max()
        a = mine & anchor
        first[i] = start[a].min() if a.any() else first_any[i]
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
    s, e = s[o], e[o]
    run_max = np.maximum.accumulate(e)
    new = np.ones(s.size, dtype=bool)
    new[1:] = s[1:] > run_max[:-1]
    idx = np.nonzero(new)[0]
    ms = s[idx]
    me = np.append(run_max[idx[1:] - 1], run_max[-1])
    return ms, me


def _covered(s: np.ndarray, e: np.ndarray) -> float:
    ms, me = merge_intervals(s, e)
    return float((me - ms).sum())


def breakdown(rg: RankGraph, run: RankRun, window: tuple[float, float], n_periods: int,
              start: np.ndarray | None = None, end: np.ndarray | None = None,
              bound: np.ndarray | None = None) -> dict[str, float]:
    """Split ``window`` into :data:`BREAKDOWN_KEYS` (seconds per step).

    ``start``/``end``/``bound`` default to the simulated times of ``run``; pass
    the measured ones to break down the trace itself (``bound`` None: idle time
    counts as other_idle).
    """
    a, b = window
    out = dict.fromkeys(BREAKDOWN_KEYS, 0.0)
    if not (math.isfinite(a) and math.isfinite(b)) or b <= a:
        return out
    G = rg.gpu_ops
    s = run.gpu_start if start is None else start
    e = run.gpu_end if end is None else end
    bnd = run.gpu_bound if (bound is None and start is None) else bound
    ok = np.isfinite(s) & np.isfinite(e) & (e > a) & (s < b)
    s, e = np.clip(s[ok], a, b), np.clip(e[ok], a, b)
    cls = G.cls[ok]
    comm = is_comm(cls)
    copy = (G.kind[ok] != GpuKind.KERNEL) | (cls == OpClass.MEMCPY) | (cls == OpClass.MEMSET)
    comp = ~comm & ~copy
    c1 = _covered(s[comp], e[comp])
    c2 = _covered(s[comp | comm], e[comp | comm])
    ms, me = merge_intervals(s, e)
    c3 = float((me - ms).sum())
    idle = (b - a) - c3
    host_idle = 0.0
    if bnd is not None and ms.size:
        bsel = bnd[ok]
        # idle gaps: before the first interval, between intervals; the op starting at a gap's end tells why
        gap_ends = ms
        gap_starts = np.concatenate([[a], me[:-1]])
        gap = gap_ends - gap_starts
        starts_at = {}
        order = np.argsort(s, kind="stable")
        for k in order[::-1]:
            starts_at[float(s[k])] = k
        for ge, g in zip(gap_ends, gap):
            if g <= 0:
                continue
            k = starts_at.get(float(ge))
            if k is not None and bsel[k] == BOUND_LAUNCH:
                host_idle += float(g)
    n = max(n_periods, 1)
    out["compute"] = c1 / n
    out["exposed_communication"] = (c2 - c1) / n
    out["memcpy"] = (c3 - c2) / n
    out["host_bound_gpu_idle"] = host_idle / n
    out["other_idle"] = max(idle - host_idle, 0.0) / n
    return out


def critical_path(rg: RankGraph, prog: RankProgram, run: RankRun, window: tuple[float, float],
                  n_periods: int) -> dict[str, Any]:
    """What bounds the step: walk back from the last GPU op in ``window`` through
    whatever set each start (a GPU predecessor, a collective, a launch and the
    host work before it, a synchronize and the GPU op it waited for).

    Returns seconds per step by resource (``gpu``, ``communication``, ``memcpy``,
    ``host``, ``launch_latency``) and by GPU op class, and the top ops.
    """
    a, b = window
    G, H = rg.gpu_ops, rg.host_ops
    res = {"gpu": 0.0, "communication": 0.0, "memcpy": 0.0, "host": 0.0, "launch_latency": 0.0}
    by_class: dict[str, float] = {}
    by_op: dict[str, float] = {}
    empty = {"total_s": 0.0, "by_resource": res, "by_class": by_class, "top_ops": []}
    if not (math.isfinite(a) and math.isfinite(b)):
        return empty
    s, e = run.gpu_start, run.gpu_end
    cand = np.nonzero(np.isfinite(e) & (s < b) & (e > a))[0]
    if cand.size == 0:
        return empty
    j = int(cand[np.argmax(np.minimum(e[cand], b))])
    comm = is_comm(G.cls)
    copy = G.kind != GpuKind.KERNEL
    cls_names = [c.name.lower() for c in OpClass]

    # per thread: stalled syncs (sim end, releasing GPU op), sorted by end
    thread_syncs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for tp in prog.threads:
        hosts = [h for h, k in zip(tp.ev_host, tp.ev_kind) if k == SYNC]
        stalls = run.sync_stall.get(tp.thread, np.zeros(0))
        bnd = run.sync_bound.get(tp.thread, np.zeros(0, dtype=np.int64))
        m = min(len(hosts), len(stalls))
        sel = [i for i in range(m) if stalls[i] > 0 and bnd[i] >= 0]
        ends = np.array([run.host_end[hosts[i]] for i in sel])
        ops = np.array([bnd[i] for i in sel], dtype=np.int64)
        o = np.argsort(ends, kind="stable")
        thread_syncs[tp.thread] = (ends[o], ops[o])
    launch_host = {}
    for h, js in prog.launch_gpu.items():
        for jj in js:
            launch_host[jj] = h

    t = min(float(e[j]), b)
    guard = len(G) + sum(len(v[0]) for v in thread_syncs.values()) + 8
    while guard > 0 and t > a:
        guard -= 1
        st = max(float(s[j]), a)
        seg = max(t - st, 0.0)
        key = "communication" if comm[j] else ("memcpy" if copy[j] else "gpu")
        res[key] += seg
        cn = cls_names[int(G.cls[j])]
        by_class[cn] = by_class.get(cn, 0.0) + seg
        nm = rg.strings[int(G.name[j])] if G.name[j] >= 0 else "?"
        by_op[nm] = by_op.get(nm, 0.0) + seg
        t = st
        if t <= a:
            break
        bd = int(run.gpu_bound[j])
        if bd in (BOUND_PRED, BOUND_COLL) and run.gpu_bound_src[j] >= 0:
            j = int(run.gpu_bound_src[j])
            t = min(t, float(e[j]))
            continue
        h = launch_host.get(j)
        if h is None:
            break
        t_launch = float(run.host_start[h])
        lat = max(t - t_launch, 0.0)
        res["launch_latency"] += min(lat, max(t - a, 0.0))
        t = t_launch
        ends, ops = thread_syncs.get(int(H.thread[h]), (np.zeros(0), np.zeros(0, dtype=np.int64)))
        k = int(np.searchsorted(ends, t, side="right")) - 1
        if k < 0:
            res["host"] += max(t - a, 0.0)
            break
        res["host"] += max(t - max(float(ends[k]), a), 0.0)
        t = float(ends[k])
        j = int(ops[k])
    n = max(n_periods, 1)
    top = sorted(by_op.items(), key=lambda kv: (-kv[1], kv[0]))[:8]
    return {
        "total_s": sum(res.values()) / n,
        "by_resource": {k: v / n for k, v in res.items()},
        "by_class": {k: v / n for k, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top_ops": [{"name": k[:160], "time_s": v / n} for k, v in top],
        "bound": max(res, key=lambda k: res[k]),
    }
