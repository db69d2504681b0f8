"""Import a Kineto / torch.profiler Chrome trace (one rank) into a :class:`RankGraph`.

The file is streamed (see :mod:`cosim.workload.jsonstream`); each event is reduced
to one compact row as it arrives, and the graph is built from numpy arrays once
the stream ends. What is read:

* host ops: ``cpu_op``, ``user_annotation`` and runtime calls (``cuda_runtime``,
  ``cuda_driver``; HIP names land in the same categories on ROCm);
* GPU ops: ``kernel``, ``gpu_memcpy``, ``gpu_memset``;
* links from runtime call to GPU op: the ``correlation`` arg, else ``ac2g`` /
  ``async_cpu_to_gpu`` flow events;
* ``cuda_sync`` events (newer Kineto): which stream or event a sync/wait is on.

Skipped: ``python_function``, ``cpu_instant_event``, ``gpu_user_annotation``,
``fwdbwd`` flows, memory and counter events.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from cosim.workload.classify import (
    classify_kernel,
    collective_type,
    copy_kind,
    dtype_bytes,
    op_flops_bytes,
    parse_nccl_kernel,
)
from cosim.workload.cost import fill_gpu_costs
from cosim.workload.graph import (
    CollType,
    EdgeKind,
    GpuKind,
    HostKind,
    OpClass,
    RankGraph,
    SeqSource,
    StringTable,
    Table,
    ragged_arrays,
)
from cosim.workload.jsonstream import ChromeTraceReader

try:  # orjson is faster; json gives the same text for our purposes
    import orjson

    def _dumps(x: Any) -> str:
        return orjson.dumps(x).decode()
except ImportError:  # pragma: no cover

    def _dumps(x: Any) -> str:
        return json.dumps(x, separators=(",", ":"))


__all__ = ["EVENT_RECORD_APIS", "LAUNCH_SYNC_APIS", "STREAM_WAIT_APIS", "SYNC_APIS", "read_kineto"]

_HOST_CATS = {
    "cpu_op": HostKind.OP,
    "operator": HostKind.OP,
    "user_annotation": HostKind.ANNOTATION,
    "cuda_runtime": HostKind.RUNTIME,
    "cuda_driver": HostKind.RUNTIME,
    "runtime": HostKind.RUNTIME,
    "driver": HostKind.RUNTIME,
}
_GPU_CATS = {
    "kernel": GpuKind.KERNEL,
    "gpu_memcpy": GpuKind.MEMCPY,
    "gpu_memset": GpuKind.MEMSET,
    "memcpy": GpuKind.MEMCPY,
    "memset": GpuKind.MEMSET,
}
_FLOW_CATS = {"ac2g", "async_cpu_to_gpu"}

#: Blocking host calls that wait for GPU work.
SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "hipCtxSynchronize",
    }
)
#: Calls that enqueue a copy and block until it is done.
LAUNCH_SYNC_APIS = frozenset(
    {
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cuMemcpy",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "hipMemcpy",
        "hipMemcpyWithStream",
        "hipMemcpyDtoH",
        "hipMemcpyHtoD",
        "hipMemcpy2D",
    }
)
EVENT_RECORD_APIS = frozenset(
    {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord", "hipEventRecord", "hipEventRecordWithFlags"}
)
STREAM_WAIT_APIS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"})
_LAUNCH_NAME = re.compile(r"Launch(?!HostFunc)|Memcpy|Memset|GraphLaunch")

_STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")


def _int(x: Any, default: int = -1) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _dim3(x: Any) -> tuple[int, int, int]:
    if isinstance(x, list) and len(x) == 3:
        return (_int(x[0]), _int(x[1]), _int(x[2]))
    return (-1, -1, -1)


def read_kineto(path: str | Path, *, time_unit: str | None = None) -> RankGraph:
    """Read one Kineto trace file into a :class:`RankGraph`.

    ``time_unit`` ("us" or "ns") overrides the detection of the timestamp unit.
    Chrome traces store ``ts``/``dur`` in microseconds (Kineto's ns-resolution
    traces, ``displayTimeUnit: "ns"``, still do, with 3 decimals); timestamps
    larger than 1e17 can only be nanoseconds since the epoch and are read as ns.
    """
    path = Path(path)
    st = StringTable()
    host: list[tuple] = []
    gpu: list[tuple] = []
    syncs: dict[int, tuple] = {}
    flow_s: dict[Any, tuple] = {}
    flow_f: dict[Any, tuple] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    dims_ids: dict[str, int] = {}
    host_cats, gpu_cats = _HOST_CATS, _GPU_CATS

    reader = ChromeTraceReader(path)
    for e in reader.events():
        ph = e.get("ph")
        if ph == "X":
            cat = e.get("cat")
            hk = host_cats.get(cat)
            if hk is not None:
                a = e.get("args") or {}
                name = e.get("name", "")
                dims = a.get("Input Dims")
                if dims is not None:
                    key = str(dims)  # lists of ints: Python's repr is valid JSON
                    did = dims_ids.get(key)
                    if did is None:
                        did = dims_ids[key] = st(key if "'" not in key else _dumps(dims))
                    t = a.get("Input type")
                    tid_ = st(_dumps(t)) if t is not None else -1
                else:
                    did = tid_ = -1
                comm = None
                if name == "record_param_comms" or "Collective name" in a:
                    comm = {k: a[k] for k in _COMM_KEYS if k in a}
                host.append(
                    (
                        e.get("pid"),
                        e.get("tid"),
                        e.get("ts", 0.0),
                        e.get("dur", 0.0),
                        st(name),
                        int(hk),
                        _int(a.get("External id")),
                        _int(a.get("Record function id")),
                        _int(a.get("correlation")),
                        did,
                        tid_,
                        comm,
                    )
                )
                continue
            gk = gpu_cats.get(cat)
            if gk is not None:
                a = e.get("args") or {}
                name = e.get("name", "")
                gpu.append(
                    (
                        _int(a.get("device", e.get("pid")), 0),
                        _int(a.get("stream", e.get("tid")), 0),
                        e.get("ts", 0.0),
                        e.get("dur", 0.0),
                        st(name),
                        int(gk),
                        _int(a.get("correlation")),
                        _int(a.get("External id")),
                        _dim3(a.get("grid")),
                        _dim3(a.get("block")),
                        a.get("bytes"),
                        int(copy_kind(name, a.get("kind"))) if gk == GpuKind.MEMCPY else 0,
                        e.get("pid"),
                        e.get("tid"),
                    )
                )
                continue
            if cat == "cuda_sync":
                a = e.get("args") or {}
                c = _int(a.get("correlation"))
                if c >= 0:
                    syncs[c] = (
                        e.get("name", a.get("cuda_sync_kind", "")),
                        _int(a.get("wait_on_stream")),
                        _int(a.get("wait_on_cuda_event_record_corr_id")),
                        _int(a.get("stream")),
                        _int(a.get("device")),
                    )
        elif ph == "s" or ph == "f":
            if e.get("cat") in _FLOW_CATS:
                (flow_s if ph == "s" else flow_f)[e.get("id")] = (e.get("pid"), e.get("tid"), e.get("ts"))
        elif ph == "M" and e.get("name") == "thread_name":
            thread_names[(e.get("pid"), e.get("tid"))] = str((e.get("args") or {}).get("name", ""))

    return _build(path, reader.meta, st, host, gpu, syncs, flow_s, flow_f, thread_names, time_unit)


_COMM_KEYS = (
    "Collective name",
    "In msg nelems",
    "Out msg nelems",
    "In msg size",
    "Out msg size",
    "dtype",
    "Group size",
    "Process Group Name",
    "Process Group Description",
    "Process Group Ranks",
    "In split size",
    "Out split size",
    "Seq",
    "seq",
    "Rank",
    "Global rank start",
    "Global rank stride",
)


def _detect_scale(meta: dict[str, Any], ts_max: float, time_unit: str | None) -> float:
    if time_unit is not None:
        if time_unit not in ("us", "ns"):
            raise ValueError(f"time_unit must be 'us' or 'ns', not {time_unit!r}")
        return 1e-6 if time_unit == "us" else 1e-9
    return 1e-9 if ts_max >= 1e17 else 1e-6


def _build(
    path: Path,
    meta: dict[str, Any],
    st: StringTable,
    host: list[tuple],
    gpu: list[tuple],
    syncs: dict[int, tuple],
    flow_s: dict[Any, tuple],
    flow_f: dict[Any, tuple],
    thread_names: dict[tuple[Any, Any], str],
    time_unit: str | None,
) -> RankGraph:
    dist = meta.get("distributedInfo") or {}
    rank = _int(dist.get("rank"), 0)
    world = max(_int(dist.get("world_size"), 1), rank + 1)

    # ---------------- raw columns -----------------------------------------------------------
    nh, ng = len(host), len(gpu)
    h_ts = np.array([r[2] for r in host], np.float64)
    h_dur = np.array([r[3] for r in host], np.float64)
    g_ts = np.array([r[2] for r in gpu], np.float64)
    g_dur = np.array([r[3] for r in gpu], np.float64)
    all_ts = np.concatenate([h_ts, g_ts])
    origin = float(all_ts.min()) if len(all_ts) else 0.0
    scale = _detect_scale(meta, float(np.abs(all_ts).max()) if len(all_ts) else 0.0, time_unit)

    # threads
    tkeys: dict[tuple[Any, Any], int] = {}
    h_thread = np.empty(nh, np.int32)
    for i, r in enumerate(host):
        k = (r[0], r[1])
        t = tkeys.get(k)
        if t is None:
            t = tkeys[k] = len(tkeys)
        h_thread[i] = t
    tlist = list(tkeys)
    threads = Table(
        "threads",
        len(tlist),
        pid=np.array([_int(p) for p, _ in tlist], np.int64),
        tid=np.array([_int(t) for _, t in tlist], np.int64),
        name=np.array([st(thread_names[k]) if k in thread_names else -1 for k in tlist], np.int32),
    )

    # ---------------- host ops: sort to pre-order per thread ------------------------------------
    h_kind = np.array([r[5] for r in host], np.int8)
    h_start = (h_ts - origin) * scale
    h_dur_s = h_dur * scale
    h_end = h_start + h_dur_s
    cat_rank = np.select([h_kind == HostKind.ANNOTATION, h_kind == HostKind.OP], [0, 1], 2)
    order = np.lexsort((cat_rank, -h_end, h_start, h_thread)) if nh else np.zeros(0, np.int64)
    host = [host[i] for i in order]
    h_thread, h_start, h_dur_s, h_end, h_kind = (
        h_thread[order],
        h_start[order],
        h_dur_s[order],
        h_end[order],
        h_kind[order],
    )
    h_name = np.array([r[4] for r in host], np.int32)
    h_corr = np.array([r[8] for r in host], np.int64)

    parent, depth, pre_gap, tail, self_time = _nest(h_thread, h_start, h_end, h_dur_s)

    # ---------------- steps ---------------------------------------------------------------------
    strings = st.strings
    step_rows = []
    for i in np.nonzero(h_kind == HostKind.ANNOTATION)[0]:
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
    gpu = [gpu[i] for i in gorder]
    g_start, g_dur_s = g_start[gorder], (g_dur * scale)[gorder]
    g_dev = np.array([r[0] for r in gpu], np.int16)
    g_stream = np.array([r[1] for r in gpu], np.int64)
    g_name = np.array([r[4] for r in gpu], np.int32)
    g_kind = np.array([r[5] for r in gpu], np.int8)
    g_corr = np.array([r[6] for r in gpu], np.int64)

    # link GPU ops to the runtime call that enqueued them: correlation, else flow events
    runtime_idx = np.nonzero(h_kind == HostKind.RUNTIME)[0]
    corr2host: dict[int, int] = {}
    for i in runtime_idx.tolist():
        c = int(h_corr[i])
        if c >= 0 and c not in corr2host:
            corr2host[c] = i
    g_launch_host = np.full(ng, -1, np.int64)
    for j in range(ng):
        h = corr2host.get(int(g_corr[j]), -1)
        g_launch_host[j] = h
    missing = np.nonzero(g_launch_host < 0)[0]
    n_flow_links = 0
    if len(missing) and (flow_s or flow_f):
        at_pos: dict[tuple, int] = {}
        for i in runtime_idx.tolist():
            r = host[i]
            at_pos[(r[0], r[1], r[2])] = i
        end_at: dict[tuple, Any] = {}
        for fid, pos in flow_f.items():
            end_at[pos] = fid
        for fid, pos in flow_s.items():
            end_at.setdefault(pos, fid)
        for j in missing.tolist():
            r = gpu[j]
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
    for i in runtime_idx.tolist():
        nm = strings[h_name[i]]
        if nm in SYNC_APIS:
            h_kind[i] = HostKind.SYNC
        elif nm in LAUNCH_SYNC_APIS:
            h_kind[i] = HostKind.LAUNCH_SYNC
        elif launched[i] or _LAUNCH_NAME.search(nm):
            h_kind[i] = HostKind.LAUNCH

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
    for j in has[::-1].tolist():  # reversed: first (earliest) op wins
        k = g_launch[j]
        l_first[k] = j
        l_dev[k] = g_dev[j]
        l_stream[k] = g_stream[j]
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
    op_anc = _nearest_ancestor(parent, h_kind == HostKind.OP)
    g_op = np.where(g_launch_host >= 0, op_anc[np.maximum(g_launch_host, 0)], -1).astype(np.int32)

    # classification
    g_cls = np.empty(ng, np.int8)
    for j in range(ng):
        k = g_kind[j]
        if k == GpuKind.MEMCPY:
            g_cls[j] = OpClass.MEMCPY
        elif k == GpuKind.MEMSET:
            g_cls[j] = OpClass.MEMSET
        else:
            g_cls[j] = classify_kernel(strings[g_name[j]], strings[h_name[g_op[j]]] if g_op[j] >= 0 else "")

    # FLOPs / bytes from shapes
    h_shapes = np.array([r[9] for r in host], np.int32)
    h_types = np.array([r[10] for r in host], np.int32)
    h_flops, h_bytes = _host_flops(strings, h_name, h_shapes, h_types, h_kind)
    g_flops, g_bytes = _gpu_flops(g_op, g_cls, g_kind, h_flops, h_bytes)
    for j, r in enumerate(gpu):
        if r[10] is not None and g_kind[j] != GpuKind.KERNEL:
            g_bytes[j] = float(r[10])

    # step of each GPU op: the step containing its launch call (else its own start)
    # GPU ops whose launch is not in the trace (enqueued before the profiling window)
    # belong to the step whose CPU window contains their GPU start (MANIFEST's rule).
    g_when = np.where(g_launch_host >= 0, h_start[np.maximum(g_launch_host, 0)], g_start)
    g_step = step_of(g_when)
    ns = len(s_start)
    s_gstart = np.full(ns, np.inf)
    s_gend = np.full(ns, -np.inf)
    s_cnt = np.zeros(ns, np.int32)
    m = g_step >= 0
    np.minimum.at(s_gstart, g_step[m], g_start[m])
    np.maximum.at(s_gend, g_step[m], (g_start + g_dur_s)[m])
    np.add.at(s_cnt, g_step[m], 1)
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
        rf_id=np.array([r[7] for r in host], np.int64),
        ext_id=np.array([r[6] for r in host], np.int64),
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
        copy_kind=np.array([r[11] for r in gpu], np.int8),
        grid=np.array([r[8] for r in gpu], np.int32).reshape(ng, 3),
        block=np.array([r[9] for r in gpu], np.int32).reshape(ng, 3),
        launch=g_launch,
        op=g_op,
        correlation=g_corr,
        ext_id=np.array([r[7] for r in gpu], np.int64),
        step=g_step,
        bytes=g_bytes,
        flops=g_flops,
    )

    collectives, groups = _collectives(st, host, host_ops, gpu_ops, g_launch_host, dist, world)
    edges = _edges(strings, host_ops, gpu_ops, launches, g_launch_host, syncs, corr2host)

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
    fill_gpu_costs(rg)  # bytes / FLOPs of the non-GEMM kernels from their parent op's shapes
    return rg


def _nest(thread: np.ndarray, start: np.ndarray, end: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, ...]:
    """Parent, depth, pre_gap, tail and self time of host ops sorted in pre-order per thread.

    An op is a child of the innermost open op that has not ended when it starts.
    """
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


def _nearest_ancestor(parent: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """For each host op, the nearest ancestor-or-self with ``is_target``, else -1."""
    n = len(parent)
    out = np.full(n, -1, np.int32)
    p = parent.tolist()
    tgt = is_target.tolist()
    res = out.tolist()
    for i in range(n):  # pre-order: parents come before children
        if tgt[i]:
            res[i] = i
        elif p[i] >= 0:
            res[i] = res[p[i]]
    return np.array(res, np.int32)


def _host_flops(
    strings: list[str], name: np.ndarray, shapes: np.ndarray, types: np.ndarray, kind: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    n = len(name)
    flops = np.full(n, np.nan)
    byts = np.full(n, np.nan)
    for i in np.nonzero((shapes >= 0) & (kind == HostKind.OP))[0].tolist():
        f, b = op_flops_bytes(strings[name[i]], strings[shapes[i]], strings[types[i]] if types[i] >= 0 else None)
        flops[i], byts[i] = f, b
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
        if isinstance(p, dict) and _int(p.get("id")) == dev:
            return str(p.get("name", ""))
    if props and isinstance(props[0], dict):
        return str(props[0].get("name", ""))
    return ""


def _parse_list(x: Any) -> list[int]:
    if isinstance(x, list):
        return [_int(v) for v in x]
    if isinstance(x, str) and x.strip():
        try:
            v = json.loads(x)
        except ValueError:
            return []
        return [_int(y) for y in v] if isinstance(v, list) else []
    return []


def _collectives(
    st: StringTable, host: list[tuple], h: Table, g: Table, g_launch_host: np.ndarray, dist: dict[str, Any], world: int
) -> tuple[Table, Table]:
    strings = st.strings
    nh = len(h)
    names = [strings[i] for i in h.name.tolist()]
    is_rpc = (
        np.array([nm == "record_param_comms" or host[i][11] is not None for i, nm in enumerate(names)], bool)
        if nh
        else np.zeros(0, bool)
    )
    is_ann = (
        np.array([nm.startswith(("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")) for nm in names], bool)
        if nh
        else np.zeros(0, bool)
    )
    rpc_anc = _nearest_ancestor(h.parent, is_rpc)
    ann_anc = _nearest_ancestor(h.parent, is_ann)
    # the nccl:* annotation directly inside each record_param_comms
    ann_of_rpc: dict[int, int] = {}
    for i in np.nonzero(is_ann)[0].tolist():
        p = int(h.parent[i])
        if p >= 0 and is_rpc[p]:
            ann_of_rpc.setdefault(p, i)

    # process groups
    pg_cfg = {str(c.get("pg_name")): c for c in (dist.get("pg_config") or []) if isinstance(c, dict)}
    groups: dict[tuple, int] = {}
    g_rows: list[tuple[int, int, list[int]]] = []

    def group_id(name: str | None, desc: str | None, ranks: list[int]) -> int:
        if name is None and not ranks:
            name = "0"
            cfg = pg_cfg.get("0")
            ranks = _parse_list(cfg.get("ranks")) if cfg else list(range(world))
            desc = desc or (cfg.get("pg_desc") if cfg else "default_pg")
        elif not ranks and name in pg_cfg:
            ranks = _parse_list(pg_cfg[name].get("ranks"))
            desc = desc or pg_cfg[name].get("pg_desc")
        key = (name, tuple(ranks))
        k = groups.get(key)
        if k is None:
            k = groups[key] = len(g_rows)
            g_rows.append((st(name), st(desc) if desc else -1, ranks))
        return k

    rows: list[dict[str, Any]] = []
    used_rpc: set[int] = set()
    comm_gpu = np.nonzero((g.cls == OpClass.COLLECTIVE) & (g.kind == GpuKind.KERNEL))[0]
    for j in comm_gpu.tolist():
        lh = int(g_launch_host[j])
        rpc = int(rpc_anc[lh]) if lh >= 0 else -1
        ann = int(ann_anc[lh]) if lh >= 0 else -1
        if rpc >= 0:
            used_rpc.add(rpc)
            ann = ann_of_rpc.get(rpc, ann)
        rows.append({"gpu": j, "rpc": rpc, "ann": ann})
    for i in np.nonzero(is_rpc)[0].tolist():
        if i in used_rpc:
            continue
        comm = host[i][11] or {}
        cname = str(comm.get("Collective name", ""))
        ann = ann_of_rpc.get(i, -1)
        if (cname and cname not in ("wait", "")) or ann >= 0:
            rows.append({"gpu": -1, "rpc": i, "ann": ann})

    out: dict[str, list[Any]] = defaultdict(list)
    in_splits: list[list[int]] = []
    out_splits: list[list[int]] = []
    counters: dict[tuple[int, int], int] = defaultdict(int)
    order_key = []
    for r in rows:
        j, rpc, ann = r["gpu"], r["rpc"], r["ann"]
        comm = (host[rpc][11] or {}) if rpc >= 0 else {}
        kinfo = parse_nccl_kernel(strings[g.name[j]]) if j >= 0 else None
        cname = str(comm.get("Collective name", "") or "")
        ann_name = names[ann] if ann >= 0 else ""
        if cname:
            ctype, rec_name = collective_type(cname), cname
        elif ann_name:
            ctype, rec_name = collective_type(ann_name), ann_name
        elif kinfo is not None:
            ctype, rec_name = kinfo["type"], strings[g.name[j]].split("(")[0]
        else:
            ctype, rec_name = CollType.OTHER, ""
        if ctype == CollType.OTHER and kinfo is not None:
            ctype = kinfo["type"]
        dtype = comm.get("dtype")
        in_n = _int(comm.get("In msg nelems"))
        out_n = _int(comm.get("Out msg nelems"))
        if in_n < 0 and ann >= 0:
            shp = host[ann][9]
            if shp >= 0:
                try:
                    dims = json.loads(strings[shp])
                except ValueError:
                    dims = []
                if dims and isinstance(dims[0], list) and all(isinstance(x, int) for x in dims[0]):
                    in_n = math.prod(dims[0])
            if dtype is None and host[ann][10] >= 0:
                ts_ = json.loads(strings[host[ann][10]])
                dtype = ts_[0] if ts_ else None
        if dtype is None and kinfo is not None:
            dtype = kinfo["dtype"]
        esz = dtype_bytes(str(dtype)) if dtype is not None else -1
        if esz < 0 and kinfo is not None and kinfo["dtype"]:
            esz = _NCCL_DT.get(kinfo["dtype"], -1)
        ranks = _parse_list(comm.get("Process Group Ranks"))
        gid = group_id(
            str(comm["Process Group Name"]) if "Process Group Name" in comm else None,
            comm.get("Process Group Description"),
            ranks,
        )
        gsize = _int(comm.get("Group size"), len(g_rows[gid][2]) or -1)
        if out_n < 0 and in_n >= 0:
            if ctype in (
                CollType.ALL_REDUCE,
                CollType.ALL_TO_ALL,
                CollType.BROADCAST,
                CollType.REDUCE,
                CollType.SEND_RECV,
            ):
                out_n = in_n
            elif ctype == CollType.ALL_GATHER and gsize > 0:
                out_n = in_n * gsize
            elif ctype == CollType.REDUCE_SCATTER and gsize > 0:
                out_n = in_n // gsize
        seq = _int(comm.get("Seq", comm.get("seq")))
        if seq >= 0:
            src = SeqSource.TRACE
        else:
            src = SeqSource.COUNTER
        out["host_op"].append(rpc if rpc >= 0 else ann)
        out["gpu_op"].append(j)
        out["type"].append(int(ctype))
        out["name"].append(st(rec_name) if rec_name else -1)
        out["dtype"].append(st(str(dtype)) if dtype is not None else -1)
        out["elem_bytes"].append(esz)
        out["in_nelems"].append(in_n)
        out["out_nelems"].append(out_n)
        out["in_bytes"].append(in_n * esz if in_n >= 0 and esz > 0 else math.nan)
        out["out_bytes"].append(out_n * esz if out_n >= 0 and esz > 0 else math.nan)
        out["group"].append(gid)
        out["group_size"].append(gsize)
        out["seq"].append(seq)
        out["seq_source"].append(int(src))
        out["algo"].append(st(kinfo["algo"]) if kinfo and kinfo["algo"] else -1)
        out["protocol"].append(st(kinfo["protocol"]) if kinfo and kinfo["protocol"] else -1)
        in_splits.append(_parse_list(comm.get("In split size")))
        out_splits.append(_parse_list(comm.get("Out split size")))
        hop = rpc if rpc >= 0 else ann
        order_key.append(float(h.start[hop]) if hop >= 0 else float(g.start[j]))

    n = len(rows)
    # issue order; counters for rows without a recorded sequence number
    order = np.argsort(np.array(order_key), kind="stable") if n else np.zeros(0, np.int64)
    seqs = out["seq"]
    for k in order.tolist():
        if out["seq_source"][k] == SeqSource.COUNTER:
            key = (out["group"][k], out["type"][k])
            seqs[k] = counters[key]
            counters[key] += 1
    cols = {k: np.array(v) for k, v in out.items()} if n else {}
    cols = {k: v[order] for k, v in cols.items()}
    in_splits = [in_splits[k] for k in order.tolist()]
    out_splits = [out_splits[k] for k in order.tolist()]
    io, iv = ragged_arrays(in_splits)
    oo, ov = ragged_arrays(out_splits)
    coll = Table(
        "collectives", n, in_splits_offsets=io, in_splits_values=iv, out_splits_offsets=oo, out_splits_values=ov, **cols
    )
    gp = g.collective
    for k in range(n):
        j = int(coll.gpu_op[k])
        if j >= 0:
            gp[j] = k
    go, gv = ragged_arrays([r[2] for r in g_rows])
    groups_t = Table(
        "groups",
        len(g_rows),
        name=np.array([r[0] for r in g_rows], np.int32),
        desc=np.array([r[1] for r in g_rows], np.int32),
        ranks_offsets=go,
        ranks_values=gv,
    )
    return coll, groups_t


_NCCL_DT = {
    "i8": 1,
    "u8": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "i32": 4,
    "u32": 4,
    "int32_t": 4,
    "uint32_t": 4,
    "i64": 8,
    "u64": 8,
    "int64_t": 8,
    "uint64_t": 8,
    "f16": 2,
    "half": 2,
    "bf16": 2,
    "__nv_bfloat16": 2,
    "f32": 4,
    "float": 4,
    "f64": 8,
    "double": 8,
    "f8e4m3": 1,
    "f8e5m2": 1,
    "e4m3": 1,
    "e5m2": 1,
}


def _edges(
    strings: list[str],
    h: Table,
    g: Table,
    launches: Table,
    g_launch_host: np.ndarray,
    syncs: dict[int, tuple],
    corr2host: dict[int, int],
) -> Table:
    nh, ng = len(h), len(g)
    src: list[np.ndarray] = []
    dst: list[np.ndarray] = []
    kind: list[np.ndarray] = []
    inf: list[np.ndarray] = []

    def add(s: np.ndarray, d: np.ndarray, k: EdgeKind, inferred: int | np.ndarray = 0) -> None:
        s = np.asarray(s, np.int64)
        src.append(s)
        dst.append(np.asarray(d, np.int64))
        kind.append(np.full(len(s), int(k), np.int8))
        inf.append(np.broadcast_to(np.asarray(inferred, np.int8), (len(s),)).copy())

    # host order
    same = np.nonzero(h.thread[1:] == h.thread[:-1])[0] if nh > 1 else np.zeros(0, np.int64)
    add(same, same + 1, EdgeKind.HOST)
    # launch
    lj = np.nonzero(g_launch_host >= 0)[0]
    add(g_launch_host[lj], nh + lj, EdgeKind.LAUNCH)

    # per-stream order and launch times
    g_when = np.where(g_launch_host >= 0, h.start[np.maximum(g_launch_host, 0)], g.start)
    streams: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
    if ng:
        so = np.lexsort((g.start, g.stream, g.device))
        dev, strm = g.device[so], g.stream[so]
        cut = np.nonzero((dev[1:] != dev[:-1]) | (strm[1:] != strm[:-1]))[0] + 1
        for seg in np.split(so, cut):
            streams[(int(g.device[seg[0]]), int(g.stream[seg[0]]))] = (seg, np.maximum.accumulate(g_when[seg]))
            add(nh + seg[:-1], nh + seg[1:], EdgeKind.STREAM)

    def last_before(key: tuple[int, int], t: float) -> int:
        s = streams.get(key)
        if s is None:
            return -1
        k = int(np.searchsorted(s[1], t, side="left")) - 1
        return int(s[0][k]) if k >= 0 else -1

    def first_after(key: tuple[int, int], t: float) -> int:
        s = streams.get(key)
        if s is None:
            return -1
        k = int(np.searchsorted(s[1], t, side="right"))
        return int(s[0][k]) if k < len(s[0]) else -1

    def find_key(stream: int, device: int) -> tuple[int, int] | None:
        if (device, stream) in streams:
            return (device, stream)
        for k in streams:
            if k[1] == stream:
                return k
        return None

    ss, sd, si = [], [], []
    # synchronization: GPU op -> blocking host call
    for i in np.nonzero((h.kind == HostKind.SYNC) | (h.kind == HostKind.LAUNCH_SYNC))[0].tolist():
        t = float(h.start[i])
        info = syncs.get(int(h.correlation[i]))
        if h.kind[i] == HostKind.LAUNCH_SYNC:
            own = np.nonzero(g_launch_host == i)[0]
            if len(own):
                for j in own.tolist():
                    ss.append(j), sd.append(i), si.append(0)
                continue
        targets: list[tuple[tuple[int, int], float]] = []
        inferred = 0
        if info is not None:
            sname, wait_stream, rec_corr, stream, device = info
            if rec_corr >= 0 and wait_stream >= 0 and rec_corr in corr2host:
                key = find_key(wait_stream, device)
                if key:
                    targets.append((key, float(h.start[corr2host[rec_corr]])))
            elif stream >= 0 and "Context" not in sname:
                key = find_key(stream, device)
                if key:
                    targets.append((key, t))
        if not targets:
            device_wide = (info is not None and "Context" in info[0]) or strings[h.name[i]] in (
                "cudaDeviceSynchronize",
                "hipDeviceSynchronize",
                "cuCtxSynchronize",
            )
            inferred = 0 if device_wide else 1
            targets = [(k, t) for k in streams]
            if not device_wide:
                # A stream or event sync without stream info waited on one stream: the one whose
                # last op launched before the call ended latest without ending after the call
                # returned (a stream still busy after the call returned was not waited for).
                call_end = t + float(h.dur[i]) + 1e-6
                best, best_end = None, -np.inf
                for key in streams:
                    j = last_before(key, t)
                    if j < 0:
                        continue
                    e = float(g.start[j] + g.dur[j])
                    if best_end < e <= call_end:
                        best, best_end = key, e
                if best is not None:
                    targets = [(best, t)]
        for key, tt in targets:
            j = last_before(key, tt)
            if j >= 0:
                ss.append(j), sd.append(i), si.append(inferred)
    if ss:
        add(nh + np.array(ss), np.array(sd), EdgeKind.SYNC, np.array(si, np.int8))

    # cross-stream event waits
    es, ed, ei = [], [], []
    waits = [i for i in np.nonzero(h.kind == HostKind.RUNTIME)[0].tolist() if strings[h.name[i]] in STREAM_WAIT_APIS]
    if waits:
        # per-thread launch lists and event-record times for the fallback
        th_launch: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        lh = launches.host_op
        ok = launches.first_gpu_op >= 0
        for t in np.unique(h.thread[lh[ok]]).tolist() if ok.any() else []:
            m = ok & (h.thread[lh] == t)
            th_launch[t] = (h.start[lh[m]], launches.first_gpu_op[m])
        records: dict[int, list[float]] = defaultdict(list)
        for i in np.nonzero(h.kind == HostKind.RUNTIME)[0].tolist():
            if strings[h.name[i]] in EVENT_RECORD_APIS:
                records[int(h.thread[i])].append(float(h.start[i]))
        for i in waits:
            t = float(h.start[i])
            info = syncs.get(int(h.correlation[i]))
            if info is not None and info[2] in corr2host and info[1] >= 0 and info[3] >= 0:
                _, wait_stream, rec_corr, stream, device = info
                ks, kd = find_key(wait_stream, device), find_key(stream, device)
                if ks and kd and ks != kd:
                    a = last_before(ks, float(h.start[corr2host[rec_corr]]))
                    b = first_after(kd, t)
                    if a >= 0 and b >= 0:
                        es.append(a), ed.append(b), ei.append(0)
                continue
            # No stream/event info: the next GPU op this thread launches after the wait depends on
            # the latest op it launched on another stream before the matching event record (or,
            # with no record in the trace, before the wait).
            th = int(h.thread[i])
            tl = th_launch.get(th)
            if tl is None:
                continue
            recs = records.get(th, [])
            r = int(np.searchsorted(recs, t, side="left")) - 1
            cutoff = recs[r] if r >= 0 else t
            kb = int(np.searchsorted(tl[0], t, side="right"))
            if kb >= len(tl[0]):
                continue
            b = int(tl[1][kb])
            kd = (int(g.device[b]), int(g.stream[b]))
            ka = int(np.searchsorted(tl[0], cutoff, side="left")) - 1
            b_start = float(g.start[b]) + 1e-6
            for k in range(ka, max(-1, ka - 256), -1):
                a = int(tl[1][k])
                # the op waited for is on another stream and, in the measured timeline, ended
                # before the waiting op started (a guess must not contradict the trace)
                if (int(g.device[a]), int(g.stream[a])) != kd and float(g.start[a] + g.dur[a]) <= b_start:
                    es.append(a), ed.append(b), ei.append(1)
                    break
    if es:
        add(nh + np.array(es), nh + np.array(ed), EdgeKind.EVENT_WAIT, np.array(ei, np.int8))

    if src:
        s = np.concatenate(src)
        return Table(
            "edges", len(s), src=s, dst=np.concatenate(dst), kind=np.concatenate(kind), inferred=np.concatenate(inf)
        )
    return Table("edges", 0)
