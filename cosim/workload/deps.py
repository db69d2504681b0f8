"""Dependency inference shared by the importers: the ``edges`` table
(docs/EXECUTION_GRAPH.md, "Edges").

:func:`host_edges` links consecutive host ops of a thread (both importers);
:func:`kineto_edges` adds launch, stream, synchronization and cross-stream event
edges from a Kineto trace's correlation ids and ``cuda_sync`` events, inferring
them conservatively where the trace lacks stream/event information.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from cosim.workload.graph import EdgeKind, HostKind, Table
from cosim.workload.kineto_common import EVENT_RECORD_APIS, STREAM_WAIT_APIS

__all__ = ["host_edges", "kineto_edges"]


def host_edges(h: Table) -> Table:
    """HOST edges: each host op to the next one on the same thread in row (pre-)order."""
    n = len(h)
    same = np.nonzero(h.thread[1:] == h.thread[:-1])[0] if n > 1 else np.zeros(0, np.int64)
    return Table(
        "edges",
        len(same),
        src=same,
        dst=same + 1,
        kind=np.full(len(same), int(EdgeKind.HOST), np.int8),
        inferred=np.zeros(len(same), np.int8),
    )


def kineto_edges(
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
    # the GPU ops each synchronous launch (LAUNCH_SYNC) enqueued, in GPU op order: one pass
    ls_host = h.kind == HostKind.LAUNCH_SYNC
    sync_ops = np.nonzero((h.kind == HostKind.SYNC) | ls_host)[0]
    # per stream, the last op launched before each sync call starts (one searchsorted per stream)
    sync_t = h.start[sync_ops]
    last_at_call: dict[tuple[int, int], list[int]] = {}
    for skey, (seg, when) in streams.items():
        kk = np.searchsorted(when, sync_t, side="left") - 1
        last_at_call[skey] = np.where(kk >= 0, seg[np.maximum(kk, 0)], -1).tolist()
    g_end = (g.start + g.dur).tolist()
    h_start_l, h_dur_l, h_corr_l = h.start.tolist(), h.dur.tolist(), h.correlation.tolist()
    is_ls = ls_host.tolist()
    own_of: dict[int, list[int]] = {}
    if ls_host.any() and ng:
        gl = np.asarray(g_launch_host, np.int64)
        js = np.nonzero((gl >= 0) & ls_host[np.maximum(gl, 0)])[0]
        for j, hh in zip(js.tolist(), gl[js].tolist()):
            own_of.setdefault(hh, []).append(j)
    # synchronization: GPU op -> blocking host call
    for n_sync, i in enumerate(sync_ops.tolist()):
        t = h_start_l[i]
        info = syncs.get(h_corr_l[i])
        if is_ls[i]:
            own = own_of.get(i)
            if own:
                for j in own:
                    ss.append(j)
                    sd.append(i)
                    si.append(0)
                continue
        targets: list[tuple[tuple[int, int], float]] = []
        inferred = 0
        if info is not None:
            sname, wait_stream, rec_corr, stream, device = info
            if rec_corr >= 0 and wait_stream >= 0 and rec_corr in corr2host:
                key = find_key(wait_stream, device)
                if key:
                    targets.append((key, h_start_l[corr2host[rec_corr]]))
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
                call_end = t + h_dur_l[i] + 1e-6
                best, best_end = None, -np.inf
                for key in streams:
                    j = last_at_call[key][n_sync]
                    if j < 0:
                        continue
                    e = g_end[j]
                    if best_end < e <= call_end:
                        best, best_end = key, e
                if best is not None:
                    targets = [(best, t)]
        for key, tt in targets:
            j = last_at_call[key][n_sync] if tt == t else last_before(key, tt)
            if j >= 0:
                ss.append(j)
                sd.append(i)
                si.append(inferred)
    if ss:
        add(nh + np.array(ss), np.array(sd), EdgeKind.SYNC, np.array(si, np.int8))

    # cross-stream event waits
    es, ed, ei = [], [], []
    runtime = h.kind == HostKind.RUNTIME
    if nh and runtime.any():
        # name tests once per distinct name id, then per host op by its name
        wait_name = np.array([x in STREAM_WAIT_APIS for x in strings], bool)[h.name]
        record_name = np.array([x in EVENT_RECORD_APIS for x in strings], bool)[h.name]
        waits = np.nonzero(runtime & wait_name)[0].tolist()
    else:
        waits = []
    if waits:
        # per-thread launch lists and event-record times for the fallback
        th_launch: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        lh = launches.host_op
        ok = launches.first_gpu_op >= 0
        th_first: dict[int, list[int]] = {}
        for t in np.unique(h.thread[lh[ok]]).tolist() if ok.any() else []:
            m = ok & (h.thread[lh] == t)
            th_launch[t] = (h.start[lh[m]], launches.first_gpu_op[m])
            th_first[t] = launches.first_gpu_op[m].tolist()
        records: dict[int, list[float]] = defaultdict(list)
        rec = np.nonzero(runtime & record_name)[0]
        for th_, t_ in zip(h.thread[rec].tolist(), h.start[rec].tolist()):
            records[th_].append(t_)
        rec_arr = {th_: np.array(v) for th_, v in records.items()}
        no_recs = np.zeros(0)
        # per wait: its time, thread, the thread's latest event record before it and next launch after it
        w_idx = np.array(waits, np.int64)
        w_t = h.start[w_idx]
        w_th = h.thread[w_idx].tolist()
        w_cut: list[float] = w_t.tolist()
        w_kb: list[int] = [-1] * len(waits)
        w_ka: list[int] = [-1] * len(waits)
        for th_ in set(w_th):
            m = np.nonzero(h.thread[w_idx] == th_)[0]
            recs_a = rec_arr.get(th_, no_recs)
            r = np.searchsorted(recs_a, w_t[m], side="left") - 1
            cut = np.where(r >= 0, recs_a[np.maximum(r, 0)] if len(recs_a) else w_t[m], w_t[m])
            tl = th_launch.get(th_)
            kb_a = np.searchsorted(tl[0], w_t[m], side="right") if tl is not None else np.full(len(m), -1)
            ka_a = np.searchsorted(tl[0], cut, side="left") - 1 if tl is not None else np.full(len(m), -1)
            for q, c, b_, a_ in zip(m.tolist(), cut.tolist(), kb_a.tolist(), ka_a.tolist()):
                w_cut[q], w_kb[q], w_ka[q] = c, b_, a_
        g_dev_l, g_stream_l, g_start_l = g.device.tolist(), g.stream.tolist(), g.start.tolist()
        for n_wait, i in enumerate(waits):
            t = h_start_l[i]
            info = syncs.get(h_corr_l[i])
            if info is not None and info[2] in corr2host and info[1] >= 0 and info[3] >= 0:
                _, wait_stream, rec_corr, stream, device = info
                ks, kd = find_key(wait_stream, device), find_key(stream, device)
                if ks and kd and ks != kd:
                    a = last_before(ks, h_start_l[corr2host[rec_corr]])
                    b = first_after(kd, t)
                    if a >= 0 and b >= 0:
                        es.append(a)
                        ed.append(b)
                        ei.append(0)
                continue
            # No stream/event info: the next GPU op this thread launches after the wait depends on
            # the latest op it launched on another stream before the matching event record (or,
            # with no record in the trace, before the wait).
            th = w_th[n_wait]
            first_ops = th_first.get(th)
            if first_ops is None:
                continue
            kb = w_kb[n_wait]
            if kb >= len(first_ops):
                continue
            b = first_ops[kb]
            kd = (g_dev_l[b], g_stream_l[b])
            ka = w_ka[n_wait]
            b_start = g_start_l[b] + 1e-6
            for k in range(ka, max(-1, ka - 256), -1):
                a = first_ops[k]
                # the op waited for is on another stream and, in the measured timeline, ended
                # before the waiting op started (a guess must not contradict the trace)
                if (g_dev_l[a], g_stream_l[a]) != kd and g_end[a] <= b_start:
                    es.append(a)
                    ed.append(b)
                    ei.append(1)
                    break
    if es:
        add(nh + np.array(es), nh + np.array(ed), EdgeKind.EVENT_WAIT, np.array(ei, np.int8))

    if src:
        s = np.concatenate(src)
        return Table(
            "edges", len(s), src=s, dst=np.concatenate(dst), kind=np.concatenate(kind), inferred=np.concatenate(inf)
        )
    return Table("edges", 0)
