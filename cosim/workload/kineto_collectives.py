"""Collectives of a Kineto rank: one row per communication kernel (NCCL/RCCL) and
per ``record_param_comms`` without a kernel, with sizes, process groups and
sequence numbers (docs/EXECUTION_GRAPH.md, "Collectives")."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import orjson

from cosim.workload.classify import collective_type, dtype_bytes, parse_nccl_kernel
from cosim.workload.graph import CollType, GpuKind, OpClass, SeqSource, StringTable, Table, ragged_arrays
from cosim.workload.kineto_common import as_int, int_list, nearest_ancestor

__all__ = ["collectives_tables"]


def collectives_tables(
    st: StringTable, host: Callable[[int], tuple], has_comm: np.ndarray, h: Table, g: Table, g_launch_host: np.ndarray,
    dist: dict[str, Any], world: int
) -> tuple[Table, Table]:
    """The collectives and process-group tables. ``host(i)``: host op ``i``'s importer row (its ``record_param_comms``
    args at 11, shapes and types string ids at 9 and 10); ``has_comm``: the host ops whose row has those args."""
    strings = st.strings
    nh = len(h)
    # name tests once per distinct (interned) name, then per host op by its name id
    hname = h.name.astype(np.int64)
    if nh:
        rpc_name = np.array([s == "record_param_comms" for s in strings], bool)[hname]
        is_ann = np.array([s.startswith(("nccl:", "gloo:", "c10d::", "mpi:", "ucc:")) for s in strings], bool)[hname]
        is_rpc = rpc_name | has_comm
    else:
        is_rpc = is_ann = np.zeros(0, bool)
    rpc_anc = nearest_ancestor(h.parent, is_rpc)
    ann_anc = nearest_ancestor(h.parent, is_ann)
    # the nccl:* annotation directly inside each record_param_comms
    ann_of_rpc: dict[int, int] = {}
    ann_at = np.nonzero(is_ann)[0]
    for i, p in zip(ann_at.tolist(), h.parent[ann_at].tolist()):
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
            ranks = int_list(cfg.get("ranks")) if cfg else list(range(world))
            desc = desc or (cfg.get("pg_desc") if cfg else "default_pg")
        elif not ranks and name in pg_cfg:
            ranks = int_list(pg_cfg[name].get("ranks"))
            desc = desc or pg_cfg[name].get("pg_desc")
        key = (name, tuple(ranks))
        k = groups.get(key)
        if k is None:
            k = groups[key] = len(g_rows)
            g_rows.append((st(name), st(desc) if desc else -1, ranks))
        return k

    # rows: (GPU op, record_param_comms host op, annotation host op), -1 where there is none
    rows: list[tuple[int, int, int]] = []
    used_rpc: set[int] = set()
    comm_gpu = np.nonzero((g.cls == OpClass.COLLECTIVE) & (g.kind == GpuKind.KERNEL))[0]
    lh = g_launch_host[comm_gpu]
    at = np.maximum(lh, 0)
    rpc_g = np.where(lh >= 0, rpc_anc[at] if nh else -1, -1).tolist()
    ann_g = np.where(lh >= 0, ann_anc[at] if nh else -1, -1).tolist()
    for j, rpc, ann in zip(comm_gpu.tolist(), rpc_g, ann_g):
        if rpc >= 0:
            used_rpc.add(rpc)
            ann = ann_of_rpc.get(rpc, ann)
        rows.append((j, rpc, ann))
    for i in np.nonzero(is_rpc)[0].tolist():
        if i in used_rpc:
            continue
        comm = host(i)[11] or {}
        cname = str(comm.get("Collective name", ""))
        ann = ann_of_rpc.get(i, -1)
        if (cname and cname not in ("wait", "")) or ann >= 0:
            rows.append((-1, i, ann))

    out: dict[str, list[Any]] = defaultdict(list)
    in_splits: list[list[int]] = []
    out_splits: list[list[int]] = []
    counters: dict[tuple[int, int], int] = defaultdict(int)
    kinfos: dict[int, Any] = {}  # kernel name id -> parse_nccl_kernel (a pure function of the name)
    g_name = g.name.tolist()
    r_j, r_rpc, r_ann = (np.array(c, np.int64) for c in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 3
    r_ann_name = np.where(r_ann >= 0, h.name[np.maximum(r_ann, 0)] if nh else -1, -1).tolist()
    h_name = dict(zip(r_ann.tolist(), r_ann_name))  # host op -> its name id, for the rows' annotations
    fields: dict[Any, tuple] = {}  # a row's signature -> its fields (below)

    def row_fields(j: int, rpc: int, ann: int, comm: dict[str, Any]) -> tuple:
        """The columns of one row that follow from its kernel's name, its annotation's name and shapes, and
        its ``record_param_comms`` args (in order: type, name, dtype, elem_bytes, in/out nelems, in/out bytes,
        group, group_size, seq, seq_source, algo, protocol, in/out splits)."""
        if j >= 0:
            gn = g_name[j]
            if gn not in kinfos:
                kinfos[gn] = parse_nccl_kernel(strings[gn])
            kinfo = kinfos[gn]
        else:
            kinfo = None
        cname = str(comm.get("Collective name", "") or "")
        ann_name = strings[h_name[ann]] if ann >= 0 else ""
        if cname:
            ctype, rec_name = collective_type(cname), cname
        elif ann_name:
            ctype, rec_name = collective_type(ann_name), ann_name
        elif kinfo is not None:
            ctype, rec_name = kinfo["type"], strings[g_name[j]].split("(")[0]
        else:
            ctype, rec_name = CollType.OTHER, ""
        if ctype == CollType.OTHER and kinfo is not None:
            ctype = kinfo["type"]
        dtype = comm.get("dtype")
        in_n = as_int(comm.get("In msg nelems"))
        out_n = as_int(comm.get("Out msg nelems"))
        if in_n < 0 and ann >= 0:
            ann_row = host(ann)
            shp = ann_row[9]
            if shp >= 0:
                try:
                    dims = json.loads(strings[shp])
                except ValueError:
                    dims = []
                if dims and isinstance(dims[0], list) and all(isinstance(x, int) for x in dims[0]):
                    in_n = math.prod(dims[0])
            if dtype is None and ann_row[10] >= 0:
                ts_ = json.loads(strings[ann_row[10]])
                dtype = ts_[0] if ts_ else None
        if dtype is None and kinfo is not None:
            dtype = kinfo["dtype"]
        esz = dtype_bytes(str(dtype)) if dtype is not None else -1
        if esz < 0 and kinfo is not None and kinfo["dtype"]:
            esz = _NCCL_DT.get(kinfo["dtype"], -1)
        ranks = int_list(comm.get("Process Group Ranks"))
        gid = group_id(
            str(comm["Process Group Name"]) if "Process Group Name" in comm else None,
            str(comm["Process Group Description"]) if comm.get("Process Group Description") is not None else None,
            ranks,
        )
        gsize = as_int(comm.get("Group size"), len(g_rows[gid][2]) or -1)
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
        seq = as_int(comm.get("Seq", comm.get("seq")))
        return (
            int(ctype),
            st(rec_name) if rec_name else -1,
            st(str(dtype)) if dtype is not None else -1,
            esz,
            in_n,
            out_n,
            in_n * esz if in_n >= 0 and esz > 0 else math.nan,
            out_n * esz if out_n >= 0 and esz > 0 else math.nan,
            gid,
            gsize,
            seq,
            int(SeqSource.TRACE if seq >= 0 else SeqSource.COUNTER),
            st(kinfo["algo"]) if kinfo and kinfo["algo"] else -1,
            st(kinfo["protocol"]) if kinfo and kinfo["protocol"] else -1,
            int_list(comm.get("In split size")),
            int_list(comm.get("Out split size")),
        )

    cols_of_row: list[tuple] = []
    for j, rpc, ann in rows:
        comm = (host(rpc)[11] or {}) if rpc >= 0 else {}
        # rows of one kernel name, annotation (name, shapes, types) and args give the same fields: each
        # such signature is worked out once (the v100 trace: 2,020 rows, a handful of signatures)
        sig = _comm_key(comm)
        sk = None if sig is None else (
            g_name[j] if j >= 0 else -1, (h_name[ann], *host(ann)[9:11]) if ann >= 0 else None, sig)
        f = None if sk is None else fields.get(sk)
        if f is None:
            f = row_fields(j, rpc, ann, comm)
            if sk is not None:
                fields[sk] = f
        cols_of_row.append(f)
    hop = np.where(r_rpc >= 0, r_rpc, r_ann)
    out["host_op"], out["gpu_op"] = hop.tolist(), r_j.tolist()
    order_key = np.where(hop >= 0, h.start[np.maximum(hop, 0)] if nh else 0.0, g.start[np.maximum(r_j, 0)]
                         if len(g) else 0.0)
    if cols_of_row:
        tcols = list(zip(*cols_of_row))
        for name, c in zip(_ROW_FIELDS, tcols[:14]):
            out[name] = list(c)
        in_splits, out_splits = list(tcols[14]), list(tcols[15])

    n = len(rows)
    # issue order; counters for rows without a recorded sequence number
    order = np.argsort(order_key, kind="stable") if n else np.zeros(0, np.int64)
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
    if n:
        on_gpu = np.flatnonzero(coll.gpu_op >= 0)  # each GPU op has at most one row
        g.collective[coll.gpu_op[on_gpu]] = on_gpu
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


#: The columns :func:`collectives_tables` works out per row signature, in its ``row_fields`` order.
_ROW_FIELDS = ("type", "name", "dtype", "elem_bytes", "in_nelems", "out_nelems", "in_bytes", "out_bytes", "group",
               "group_size", "seq", "seq_source", "algo", "protocol")


def _comm_key(comm: dict[str, Any]) -> str | None:
    """A ``record_param_comms``' args as a hashable key (their JSON text, in the importer's member order);
    None when they do not serialize (an integer beyond 64 bits)."""
    try:
        return orjson.dumps(comm).decode()
    except TypeError:
        return None


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
