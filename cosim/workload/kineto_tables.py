"""Table building for the Kineto importer: from the rows the reader extracted
(:mod:`cosim.workload.kineto`) to the execution-graph tables of one rank.

Host ops are sorted into pre-order per thread and nested (:func:`nest`), GPU ops
sorted by start, linked to their launch calls (correlation id, else flow events),
classified, given steps, FLOPs and bytes; collectives and dependency edges come
from :mod:`cosim.workload.kineto_collectives` and :mod:`cosim.workload.deps`.
"""

from __future__ import annotations

import contextlib
import itertools
import operator
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from cosim.errors import CosimInputError
from cosim.workload.classify import classify_kernel, op_flops_bytes
from cosim.workload.cost import fill_gpu_costs
from cosim.workload.deps import kineto_edges
from cosim.workload.graph import GpuKind, HostKind, OpClass, RankGraph, StringTable, Table
from cosim.workload.kineto_collectives import collectives_tables
from cosim.workload.kineto_common import (
    LAUNCH_SYNC_APIS,
    SYNC_APIS,
    as_int,
    col,
    col3,
    detect_scale,
    nearest_ancestor,
)

__all__ = ["TextMemos", "build_rank", "nest", "shared_cost_memos", "text_memos"]

_LAUNCH_NAME = re.compile(r"Launch(?!HostFunc)|Memcpy|Memset|GraphLaunch")
_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def build_rank(
    path: Path,
    meta: dict[str, Any],
    st: StringTable,
    host: list[tuple],
    gpu: list[tuple],
    syncs: dict[int, tuple],
    flows: Callable[[], tuple[dict[Any, tuple], dict[Any, tuple]]],
    thread_names: dict[tuple[Any, Any], str],
    time_unit: str | None,
    hcols: list[tuple] | None = None,
    gcols: list[tuple] | None = None,
    arrays: dict[tuple[str, int], np.ndarray] | None = None,
) -> RankGraph:
    """The tables of one rank from the importer's host and GPU rows (``hcols``/``gcols``: the same rows
    as columns, ``list(zip(*rows))``; computed here when not given; ``arrays``: columns already
    converted, by ("h" or "g", column), see :func:`cosim.workload.kineto.check_events`; ``flows``: the flow
    events' ends, (starts, finishes) by flow id, called only when some GPU op has no correlation to a runtime
    call, see :func:`cosim.workload.kineto.read_flows`)."""
    dist = meta.get("distributedInfo") or {}
    rank = as_int(dist.get("rank"), 0)
    world = max(as_int(dist.get("world_size"), 1), rank + 1)

    # ---------------- raw columns -----------------------------------------------------------
    nh, ng = len(host), len(gpu)
    if hcols is None:
        hcols = list(zip(*host)) if host else [()] * 13
    if gcols is None:
        gcols = list(zip(*gpu)) if gpu else [()] * 14
    pre = arrays or {}

    def hc(k: int, dtype: Any) -> np.ndarray:
        a = pre.get(("h", k))
        return col(hcols[k], dtype) if a is None else a.astype(dtype, copy=False)

    def gc(k: int, dtype: Any) -> np.ndarray:
        a = pre.get(("g", k))
        return col(gcols[k], dtype) if a is None else a.astype(dtype, copy=False)

    h_ts = hc(2, np.float64)
    h_dur = hc(3, np.float64)
    g_ts = gc(2, np.float64)
    g_dur = gc(3, np.float64)
    all_ts = np.concatenate([h_ts, g_ts])
    origin = float(all_ts.min()) if len(all_ts) else 0.0
    scale = detect_scale(float(np.abs(all_ts).max()) if len(all_ts) else 0.0, time_unit)

    # threads
    h_thread, tlist = _thread_ids(hcols[0], hcols[1])
    threads = Table(
        "threads",
        len(tlist),
        pid=np.array([as_int(p) for p, _ in tlist], np.int64),
        tid=np.array([as_int(t) for _, t in tlist], np.int64),
        name=np.array([st(thread_names[k]) if k in thread_names else -1 for k in tlist], np.int32),
    )

    # ---------------- host ops: sort to pre-order per thread ------------------------------------
    h_kind = col(hcols[5], np.int8)
    h_start = (h_ts - origin) * scale
    h_dur_s = h_dur * scale
    h_end = h_start + h_dur_s
    cat_rank = np.select([h_kind == HostKind.ANNOTATION, h_kind == HostKind.OP], [0, 1], 2)
    order = np.lexsort((cat_rank, -h_end, h_start, h_thread)) if nh else np.zeros(0, np.int64)
    rows_h = host

    def host_row(i: int) -> tuple:  # host op i's row (the rows stay in file order; the table is sorted)
        return rows_h[order[i]]

    h_thread, h_start, h_dur_s, h_end, h_kind = (
        h_thread[order],
        h_start[order],
        h_dur_s[order],
        h_end[order],
        h_kind[order],
    )
    h_name = hc(4, np.int32)[order]
    h_corr = hc(8, np.int64)[order]

    parent, depth, pre_gap, tail, self_time = nest(h_thread, h_start, h_end, h_dur_s)

    # ---------------- steps ---------------------------------------------------------------------
    strings = st.strings
    step_rows = []
    for i in np.nonzero(h_kind == HostKind.ANNOTATION)[0].tolist():
        m = _STEP_RE.match(strings[h_name[i]])
        if m:
            step_rows.append((h_start[i], int(m.group(1)), int(i)))
    step_rows.sort()
    if step_rows:
        s_start = np.array([r[0] for r in step_rows])
        s_num = np.array([r[1] for r in step_rows], np.int64)
        s_host = np.array([r[2] for r in step_rows], np.int32)
        s_dur = h_dur_s[s_host]
    else:
        lo = float(h_start.min()) if nh else (float((g_ts.min() - origin) * scale) if ng else 0.0)
        hi = float(h_end.max()) if nh else (float(((g_ts + g_dur).max() - origin) * scale) if ng else 0.0)
        s_start, s_num, s_host, s_dur = (
            np.array([lo]),
            np.array([-1], np.int64),
            np.array([-1], np.int32),
            np.array([hi - lo]),
        )

    def step_of(t: np.ndarray) -> np.ndarray:
        if s_host[0] < 0:
            return np.zeros(len(t), np.int32)
        k = np.searchsorted(s_start, t, side="right") - 1
        ok = (k >= 0) & (t < (s_start + s_dur)[np.maximum(k, 0)])
        return np.where(ok, k, -1).astype(np.int32)

    h_step = step_of(h_start)

    # ---------------- GPU ops -------------------------------------------------------------------
    g_start = (g_ts - origin) * scale
    gorder = np.argsort(g_start, kind="stable")
    g_start, g_dur_s = g_start[gorder], (g_dur * scale)[gorder]
    g_dev = gc(0, np.int16)[gorder]
    g_stream = gc(1, np.int64)[gorder]
    g_name = gc(4, np.int32)[gorder]
    g_kind = gc(5, np.int8)[gorder]
    g_corr = gc(6, np.int64)[gorder]

    # link GPU ops to the runtime call that enqueued them: correlation, else flow events
    runtime_idx = np.nonzero(h_kind == HostKind.RUNTIME)[0]
    corr2host, g_launch_host = _launch_links(runtime_idx, h_corr[runtime_idx], g_corr)
    missing = np.nonzero(g_launch_host < 0)[0]
    n_flow_links = 0
    flow_s, flow_f = flows() if len(missing) else ({}, {})
    if flow_s or flow_f:
        at_pos: dict[tuple, int] = {}
        for i in runtime_idx.tolist():
            r = host_row(i)
            at_pos[(r[0], r[1], r[2])] = i
        end_at: dict[tuple, Any] = {}
        for fid, pos in flow_f.items():
            end_at[pos] = fid
        for fid, pos in flow_s.items():
            end_at.setdefault(pos, fid)
        for j in missing.tolist():
            r = gpu[gorder[j]]
            fid = end_at.get((r[12], r[13], r[2]))
            if fid is None:
                continue
            for other in (flow_s.get(fid), flow_f.get(fid)):
                if other is not None and other in at_pos:
                    g_launch_host[j] = at_pos[other]
                    if g_corr[j] < 0:
                        g_corr[j] = fid if isinstance(fid, int) else -1
                    n_flow_links += 1
                    break

    # host-op kinds for runtime calls
    launched = np.zeros(nh, bool)
    launched[g_launch_host[g_launch_host >= 0]] = True
    # per distinct runtime-call name: SYNC, LAUNCH_SYNC, LAUNCH by name, or RUNTIME (then LAUNCH if it launched)
    rt_names = h_name[runtime_idx]
    uniq, inv = np.unique(rt_names, return_inverse=True)
    by_name = np.array(
        [
            HostKind.SYNC
            if strings[u] in SYNC_APIS
            else HostKind.LAUNCH_SYNC
            if strings[u] in LAUNCH_SYNC_APIS
            else HostKind.LAUNCH
            if _LAUNCH_NAME.search(strings[u])
            else HostKind.RUNTIME
            for u in uniq.tolist()
        ],
        np.int8,
    )
    rt_kind = by_name[inv.reshape(-1)] if len(runtime_idx) else np.zeros(0, np.int8)
    rt_kind = np.where((rt_kind == HostKind.RUNTIME) & launched[runtime_idx], np.int8(HostKind.LAUNCH), rt_kind)
    h_kind[runtime_idx] = rt_kind

    # launches table
    l_host = np.nonzero((h_kind == HostKind.LAUNCH) | (h_kind == HostKind.LAUNCH_SYNC))[0].astype(np.int32)
    host2launch = np.full(nh, -1, np.int32)
    host2launch[l_host] = np.arange(len(l_host), dtype=np.int32)
    g_launch = np.where(g_launch_host >= 0, host2launch[np.maximum(g_launch_host, 0)], -1).astype(np.int32)
    nl = len(l_host)
    l_first = np.full(nl, -1, np.int32)
    l_count = np.zeros(nl, np.int32)
    l_dev = np.full(nl, -1, np.int16)
    l_stream = np.full(nl, -1, np.int64)
    has = np.nonzero(g_launch >= 0)[0]
    np.add.at(l_count, g_launch[has], 1)
    # each launch's first (earliest) GPU op: ``has`` ascends, so np.unique's first index is the earliest
    launched_k, first_at = np.unique(g_launch[has], return_index=True)
    first_j = has[first_at]
    l_first[launched_k] = first_j
    l_dev[launched_k] = g_dev[first_j]
    l_stream[launched_k] = g_stream[first_j]
    launches = Table(
        "launches",
        nl,
        host_op=l_host,
        correlation=h_corr[l_host],
        first_gpu_op=l_first,
        n_gpu_ops=l_count,
        device=l_dev,
        stream=l_stream,
    )

    # the 'parent ATen op' of each GPU op: innermost OP ancestor of its launch call
    op_anc = nearest_ancestor(parent, h_kind == HostKind.OP)
    g_op = np.where(g_launch_host >= 0, op_anc[np.maximum(g_launch_host, 0)], -1).astype(np.int32)

    # classification
    # classification, once per distinct (kernel name, parent op name)
    op_name = np.where(g_op >= 0, h_name[np.maximum(g_op, 0)], -1) if nh else np.full(ng, -1)
    g_cls = np.where(g_kind == GpuKind.MEMCPY, np.int8(OpClass.MEMCPY), np.int8(OpClass.MEMSET)).astype(np.int8)
    kern = np.nonzero((g_kind != GpuKind.MEMCPY) & (g_kind != GpuKind.MEMSET))[0]
    if len(kern):
        pair = g_name[kern].astype(np.int64) * (len(strings) + 1) + (op_name[kern].astype(np.int64) + 1)
        upair, inv_pair = np.unique(pair, return_inverse=True)
        ucls = np.array(
            [
                int(classify_kernel(strings[kn], strings[on] if on >= 0 else ""))
                for kn, on in zip((upair // (len(strings) + 1)).tolist(), (upair % (len(strings) + 1) - 1).tolist())
            ],
            np.int8,
        )
        g_cls[kern] = ucls[inv_pair.reshape(-1)]

    # FLOPs / bytes from shapes
    h_shapes = hc(9, np.int32)[order]
    h_types = hc(10, np.int32)[order]
    h_flops, h_bytes = _host_flops(strings, h_name, h_shapes, h_types, h_kind)
    g_flops, g_bytes = _gpu_flops(g_op, g_cls, g_kind, h_flops, h_bytes)
    g_arg_bytes = gcols[10]
    for j in np.nonzero(g_kind != GpuKind.KERNEL)[0].tolist():
        b = g_arg_bytes[gorder[j]]
        if b is not None:
            if isinstance(b, bool) or not isinstance(b, (int, float)) or not (0 <= b < float("inf")):
                raise CosimInputError(f"args.bytes of the copy or memset {strings[int(g_name[j])]!r}: expected a "
                                      f"number of bytes >= 0, got {b!r}", file=path)
            g_bytes[j] = float(b)

    # step of each GPU op: the step containing its launch call (else its own start)
    # GPU ops whose launch is not in the trace (enqueued before the profiling window)
    # belong to the step whose CPU window contains their GPU start (MANIFEST's rule).
    g_when = np.where(g_launch_host >= 0, h_start[np.maximum(g_launch_host, 0)], g_start)
    g_step = step_of(g_when)
    ns = len(s_start)
    s_gstart = np.full(ns, np.inf)
    s_gend = np.full(ns, -np.inf)
    s_cnt = np.zeros(ns, np.int32)
    stepped = g_step >= 0
    np.minimum.at(s_gstart, g_step[stepped], g_start[stepped])
    np.maximum.at(s_gend, g_step[stepped], (g_start + g_dur_s)[stepped])
    np.add.at(s_cnt, g_step[stepped], 1)
    s_gstart[np.isinf(s_gstart)] = np.nan
    s_gend[np.isinf(s_gend)] = np.nan
    steps = Table(
        "steps",
        ns,
        number=s_num,
        host_op=s_host,
        cpu_start=s_start,
        cpu_dur=s_dur,
        gpu_start=s_gstart,
        gpu_end=s_gend,
        n_gpu_ops=s_cnt,
    )

    host_ops = Table(
        "host_ops",
        nh,
        thread=h_thread,
        start=h_start,
        dur=h_dur_s,
        name=h_name,
        kind=h_kind,
        parent=parent,
        depth=depth,
        pre_gap=pre_gap,
        tail=tail,
        self_time=self_time,
        step=h_step,
        input_shapes=h_shapes,
        input_types=h_types,
        concrete_inputs=_concrete_column(hcols, order),
        rf_id=hc(7, np.int64)[order],
        ext_id=hc(6, np.int64)[order],
        correlation=h_corr,
        flops=h_flops,
        bytes=h_bytes,
    )
    gpu_ops = Table(
        "gpu_ops",
        ng,
        device=g_dev,
        stream=g_stream,
        start=g_start,
        dur=g_dur_s,
        name=g_name,
        kind=g_kind,
        cls=g_cls,
        copy_kind=gc(11, np.int8)[gorder],
        grid=col3(gcols[8])[gorder],
        block=col3(gcols[9])[gorder],
        launch=g_launch,
        op=g_op,
        correlation=g_corr,
        ext_id=gc(7, np.int64)[gorder],
        step=g_step,
        bytes=g_bytes,
        flops=g_flops,
    )

    has_comm = np.fromiter(map(operator.is_not, hcols[11], itertools.repeat(None)), bool, nh)[order]
    collectives, groups = collectives_tables(st, host_row, has_comm, host_ops, gpu_ops, g_launch_host, dist, world)
    edges = kineto_edges(strings, host_ops, gpu_ops, launches, g_launch_host, syncs, corr2host)

    device_name = _device_name(meta, g_dev)
    rg = RankGraph(
        rank=rank,
        world_size=world,
        device_name=device_name,
        strings=st.strings,
        threads=threads,
        host_ops=host_ops,
        gpu_ops=gpu_ops,
        launches=launches,
        collectives=collectives,
        groups=groups,
        steps=steps,
        edges=edges,
        time_origin=origin * scale,
        source={
            "format": "kineto",
            "file": str(path),
            "time_unit": "ns" if scale == 1e-9 else "us",
            "flow_links": n_flow_links,
            "schemaVersion": meta.get("schemaVersion"),
        },
    )
    # bytes / FLOPs of the non-GEMM kernels from their parent op's shapes
    fill_gpu_costs(rg, *(_job_memos[1:] if _job_memos is not None else ()))
    return rg


_job_memos: tuple[dict[tuple[str, str, str | None], tuple[float, float]],
                  dict[tuple[str, str, str | None, int], tuple[float, float]],
                  dict[tuple[str, str | None], tuple[list, list]]] | None = None
"""Op FLOPs/bytes by text (:func:`_host_flops`), kernel costs and parsed (shapes, dtypes) by text
(``cost.fill_gpu_costs``), shared by the ranks of one load inside :func:`shared_cost_memos` (None outside:
each rank its own)."""


class TextMemos:
    """What the reader makes of an event's raw ``args`` texts, pure functions of their bytes, shared by the
    ranks of one load inside :func:`shared_cost_memos` (the DLRM job's 8 ranks: ~2,900 ``Input Dims`` texts
    new to their rank, ~360 distinct): ``types``: an ``Input type`` text's value (a list or None, checked);
    ``dims``: an ``Input Dims`` text's (dict key, interned text), None for a JSON null; ``dim3``: a grid or
    block text's int triple. String ids stay per rank (each rank its own string table)."""

    __slots__ = ("dim3", "dims", "types")

    def __init__(self) -> None:
        self.types: dict[bytes, list[Any] | None] = {}
        self.dims: dict[bytes, tuple[str, str] | None] = {}
        self.dim3: dict[bytes, tuple[int, int, int]] = {}


_job_texts: TextMemos | None = None
"""The load's :class:`TextMemos` inside :func:`shared_cost_memos` (None outside: each rank its own)."""


def text_memos() -> TextMemos:
    """The raw-text memos for the rank being read: the load's inside :func:`shared_cost_memos`, else new ones."""
    return _job_texts if _job_texts is not None else TextMemos()


@contextlib.contextmanager
def shared_cost_memos() -> Iterator[None]:
    """Let the ranks read inside share the per-op FLOPs/bytes figures, pure functions of the ops' name,
    shapes and dtypes texts: the ranks of a data-parallel job run the same ops (the DLRM job's 8 ranks:
    1,070 kernel-cost evaluations, 155 distinct); and the reader's decoded ``args`` texts (:class:`TextMemos`).
    Scoped to one load, so that the figures of a load
    never depend on what the process loaded before."""
    global _job_memos, _job_texts
    prev, prev_texts = _job_memos, _job_texts
    _job_memos, _job_texts = ({}, {}, {}), TextMemos()
    try:
        yield
    finally:
        _job_memos, _job_texts = prev, prev_texts


def _launch_links(runtime_idx: np.ndarray, rt_corr: np.ndarray, g_corr: np.ndarray) -> tuple[dict[int, int], np.ndarray]:
    """The runtime call of each correlation id (the first in table order of the runtime calls carrying it:
    ``runtime_idx`` ascending, ``rt_corr`` their ids, -1 none) and each GPU op's launching call by its
    correlation id ``g_corr`` (-1: none). Vectorized: the ids sorted once (O(n log n)), the GPU ops' ids found
    by binary search, instead of a dict insertion per runtime call and a lookup per GPU op."""
    ok = rt_corr >= 0
    ids, first = np.unique(rt_corr[ok], return_index=True)  # first: earliest position among the kept calls
    host_of = runtime_idx[ok][first].astype(np.int64)
    corr2host = dict(zip(ids.tolist(), host_of.tolist()))
    g_launch_host = np.full(len(g_corr), -1, np.int64)
    if len(ids) and len(g_corr):
        pos = np.minimum(np.searchsorted(ids, g_corr), len(ids) - 1)
        hit = ids[pos] == g_corr
        g_launch_host[hit] = host_of[pos[hit]]
    return corr2host, g_launch_host


def _thread_ids(pids: tuple, tids: tuple) -> tuple[np.ndarray, list[tuple[Any, Any]]]:
    """Each host row's thread number, the (pid, tid) pairs numbered in order of first appearance, and those
    pairs. A trace's rows come in long runs of one thread (the v100 trace: 14 runs in 101 k rows), so the
    pairs are numbered per run and the numbers repeated over each run's rows. Integer ids (every shared
    trace, every id checked to be an int, not a text that reads as one: ~3 ms of the ~6 ms for the v100 trace's
    101 k rows): the runs found by numpy; otherwise (a string or a missing id) by
    ``itertools.groupby``, ~8 ms; a dict lookup per row took ~25 ms."""
    n = len(pids)
    if not n:
        return np.zeros(0, np.int32), []
    # ids are int or text (the reader's types); fromiter would parse a text id ("7") into the number 7
    if any(type(v) is not int for v in set(pids) | set(tids)):
        return _thread_ids_any(pids, tids)
    try:
        p, t = np.fromiter(pids, np.int64, n), np.fromiter(tids, np.int64, n)
    except OverflowError:
        return _thread_ids_any(pids, tids)
    starts = np.flatnonzero(np.concatenate(([True], (p[1:] != p[:-1]) | (t[1:] != t[:-1]))))
    tkeys: dict[tuple[Any, Any], int] = {}
    ids = [tkeys.setdefault(k, len(tkeys)) for k in zip(p[starts].tolist(), t[starts].tolist())]
    return np.repeat(np.array(ids, np.int32), np.diff(np.append(starts, n))), list(tkeys)


def _thread_ids_any(pids: tuple, tids: tuple) -> tuple[np.ndarray, list[tuple[Any, Any]]]:
    """:func:`_thread_ids` for ids of any JSON type, per run of equal (pid, tid) pairs."""
    tkeys: dict[tuple[Any, Any], int] = {}
    ids: list[int] = []
    lens: list[int] = []
    for key, run in itertools.groupby(zip(pids, tids)):
        t = tkeys.get(key)
        if t is None:
            t = tkeys[key] = len(tkeys)
        ids.append(t)
        lens.append(sum(1 for _ in run))
    return np.repeat(np.array(ids, np.int32), lens), list(tkeys)


def nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, ...]:
    """Parent, depth, pre_gap, tail and self time of host ops sorted in pre-order per thread.

    An op is a child of the innermost open op that has not ended when it starts: with ops sorted by
    (thread, start), the latest earlier op of its thread that ends after it starts (every later one has
    ended, or it would be innermost). ``pre_gap``: time from the parent's start or the previous sibling's
    end (top-level: the previous top-level ops' latest end) to the op's start; ``tail``: time from the end
    of its last-ending child (or its start) to its end; ``self``: duration less the children's.

    Vectorized: the parent search descends a sparse table of running maxima of the ends, O(n log n) time
    and memory; equal to :func:`nest_loop` (tested), which it falls back to on NaN times.
    """
    n = len(thread)
    st, en, du = (np.asarray(x, dtype=float) for x in (start, end, dur))
    if n == 0 or not (np.isfinite(st).all() and np.isfinite(en).all() and np.isfinite(du).all()):
        return nest_loop(thread, start, end, dur)
    idx = np.arange(n)
    first = np.ones(n, dtype=bool)
    first[1:] = thread[1:] != thread[:-1]
    tb = np.maximum.accumulate(np.where(first, idx, 0))  # first op of each op's thread
    parent = _latest_open(tb, st, en)
    depth = _depth(parent)
    top = parent < 0
    has = ~top
    # pre_gap: against the running boundary of the parent (its start, then its earlier children's ends),
    # or, top-level, the latest end of the thread's earlier top-level ops (none: 0)
    group = np.where(has, parent, n + np.cumsum(first) - 1)
    prev_max = _exclusive_group_max(group, en)
    bound = np.where(has, np.fmax(st[np.maximum(parent, 0)], prev_max), prev_max)
    pre_gap = np.where(np.isnan(bound), 0.0, np.maximum(0.0, st - bound))
    # tail: against the op's start and all its children's ends
    kids_end = np.full(n, -np.inf)
    np.maximum.at(kids_end, parent[has], en[has])
    tail = np.maximum(0.0, en - np.maximum(st, kids_end))
    child_sum = np.bincount(parent[has], weights=du[has], minlength=n) if has.any() else np.zeros(n)
    self_time = np.maximum(0.0, dur - child_sum)
    return parent.astype(np.int32), depth.astype(np.int16), pre_gap, tail, self_time


def _latest_open(tb: np.ndarray, st: np.ndarray, en: np.ndarray) -> np.ndarray:
    """Per op ``i``, the latest ``j`` in ``[tb[i], i)`` with ``en[j] > st[i]``, or -1. The op just before ``i``
    when it qualifies (a first child: ~47% of the v100 trace's ops); the others by a greedy descent over a
    sparse table of window maxima of ``en`` (window ``[x - 2^k + 1, x]`` at level ``k``), O(n log n)."""
    n = st.size
    prev = np.arange(n) - 1
    quick = (prev >= tb) & (en[np.maximum(prev, 0)] > st)
    out = np.where(quick, prev, -1)
    rest = np.flatnonzero(~quick)
    if not rest.size:
        return out
    levels = [en]
    k = 1
    while (1 << k) <= n:
        lower, h = levels[-1], 1 << (k - 1)
        cur = lower.copy()
        cur[h:] = np.maximum(lower[h:], lower[:-h])
        levels.append(cur)
        k += 1
    pos, tb_r, st_r = rest - 1, tb[rest], st[rest]
    for k in range(len(levels) - 1, -1, -1):
        w = 1 << k
        ok = (pos - w + 1 >= tb_r) & (levels[k][np.maximum(pos, 0)] <= st_r)
        pos = np.where(ok, pos - w, pos)
    out[rest] = np.where(pos >= tb_r, pos, -1)
    return out


def _depth(parent: np.ndarray) -> np.ndarray:
    """Ancestors of each op (parent pointers to earlier ops): Wyllie's pointer jumping, O(n log depth)."""
    d = (parent >= 0).astype(np.int64)
    nxt = parent.astype(np.int64)
    while True:
        m = nxt >= 0
        if not m.any():
            return d
        safe = np.maximum(nxt, 0)
        d = np.where(m, d + d[safe], d)
        nxt = np.where(m, nxt[safe], -1)


def _exclusive_group_max(group: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Per element, the max of ``x`` over the earlier elements of its group (NaN: none); exact (ranks of
    ``x`` offset per group, so one running maximum serves every group)."""
    n = x.size
    o = np.argsort(group, kind="stable")
    vals, rank = np.unique(x[o], return_inverse=True)
    g = group[o]
    newg = np.ones(n, dtype=bool)
    newg[1:] = g[1:] != g[:-1]
    seg = np.cumsum(newg) - 1
    big = vals.size + 1
    run = np.maximum.accumulate(rank.reshape(-1) + seg * big) - seg * big
    excl = np.empty(n)
    excl[newg] = np.nan
    rest = ~newg
    excl[rest] = vals[run[np.flatnonzero(rest) - 1]]
    out = np.empty(n)
    out[o] = excl
    return out


def nest_loop(thread: np.ndarray, start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`nest` op by op with a stack of open ops (any input, NaN times included): the reference the
    vectorized :func:`nest` reproduces."""
    n = len(thread)
    parent = np.full(n, -1, np.int32)
    depth = np.zeros(n, np.int16)
    pre_gap = np.zeros(n)
    tail = np.zeros(n)
    child_sum = np.zeros(n)
    th, s_, e_, d_ = thread.tolist(), start.tolist(), end.tolist(), dur.tolist()
    boundary = [0.0] * n
    stack: list[int] = []
    cur = None
    last_top_end = None
    for i in range(n):
        t = th[i]
        s = s_[i]
        if t != cur:
            for j in stack:
                tail[j] = max(0.0, e_[j] - boundary[j])
            stack = []
            cur = t
            last_top_end = None
        while stack and e_[stack[-1]] <= s:
            j = stack.pop()
            tail[j] = max(0.0, e_[j] - boundary[j])
        if stack:
            p = stack[-1]
            parent[i] = p
            depth[i] = len(stack)
            pre_gap[i] = max(0.0, s - boundary[p])
            if e_[i] > boundary[p]:
                boundary[p] = e_[i]
            child_sum[p] += d_[i]
        else:
            if last_top_end is not None:
                pre_gap[i] = max(0.0, s - last_top_end)
            last_top_end = e_[i] if last_top_end is None else max(last_top_end, e_[i])
        boundary[i] = s
        stack.append(i)
    for j in stack:
        tail[j] = max(0.0, e_[j] - boundary[j])
    self_time = np.maximum(0.0, dur - child_sum)
    return parent, depth, pre_gap, tail, self_time


def _host_flops(
    strings: list[str], name: np.ndarray, shapes: np.ndarray, types: np.ndarray, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    n = len(name)
    flops = np.full(n, np.nan)
    byts = np.full(n, np.nan)
    sel = np.nonzero((shapes >= 0) & (kind == HostKind.OP))[0]
    memo: dict[tuple[int, int, int], tuple[float, float]] = {}  # op_flops_bytes is a pure function of its strings
    by_text = _job_memos[0] if _job_memos is not None else {}  # the same, by text: shared by a load's ranks
    fb = []
    for key in zip(name[sel].tolist(), shapes[sel].tolist(), types[sel].tolist()):
        v = memo.get(key)
        if v is None:
            nm, sh, ty = key
            tkey = (strings[nm], strings[sh], strings[ty] if ty >= 0 else None)
            v = by_text.get(tkey)
            if v is None:
                v = by_text[tkey] = op_flops_bytes(*tkey)
            memo[key] = v
        fb.append(v)
    if fb:
        flops[sel] = [f for f, _ in fb]
        byts[sel] = [b for _, b in fb]
    return flops, byts


_COMPUTE = np.array([OpClass.GEMM, OpClass.GROUPED_GEMM, OpClass.ATTENTION], np.int8)


def _gpu_flops(
    g_op: np.ndarray, g_cls: np.ndarray, g_kind: np.ndarray, h_flops: np.ndarray, h_bytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Spread each op's FLOPs and bytes evenly over its compute-class kernels."""
    ng = len(g_op)
    flops = np.full(ng, np.nan)
    byts = np.full(ng, np.nan)
    sel = np.nonzero((g_op >= 0) & np.isin(g_cls, _COMPUTE) & (g_kind == GpuKind.KERNEL))[0]
    if len(sel):
        ops = g_op[sel]
        cnt = np.bincount(ops, minlength=len(h_flops))
        flops[sel] = h_flops[ops] / cnt[ops]
        byts[sel] = h_bytes[ops] / cnt[ops]
    return flops, byts


def _device_name(meta: dict[str, Any], g_dev: np.ndarray) -> str:
    props = meta.get("deviceProperties") or []
    if not len(g_dev):
        return "cpu"
    dev = int(np.bincount(g_dev.astype(np.int64) - g_dev.min()).argmax() + g_dev.min())
    for p in props:
        if isinstance(p, dict) and as_int(p.get("id")) == dev:
            return str(p.get("name", ""))
    if props and isinstance(props[0], dict):
        return str(props[0].get("name", ""))
    return ""


def _concrete_column(hcols: list[tuple], order: np.ndarray) -> np.ndarray:
    """``host_ops.concrete_inputs`` (string ids of the ops' ``Concrete Inputs``, -1 if none) in table order;
    all -1 for host rows without that field (row tuples of 12 fields)."""
    if len(hcols) <= 12 or not len(order):
        return np.full(len(order), -1, np.int32)
    return col(hcols[12], np.int32)[order]
