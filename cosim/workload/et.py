"""Import a PyTorch Execution Trace (ExecutionTraceObserver JSON, schemas 1.0.x to
1.1.x, including the Chakra-flavoured ``1.0.2-chakra.0.0.4`` layout).

Two node layouts exist:

* 1.0.1: flat fields ``parent``, ``rf_id``, ``tid``, ``inputs``, ``input_shapes``,
  ``input_types``, ``outputs``, ``output_shapes``, ``output_types``, ``scope``;
* 1.0.2+ (chakra): ``ctrl_deps`` (the parent), ``inputs``/``outputs`` as
  ``{values, shapes, types}``, and ``attrs`` (a list of ``{name, type, value}``
  holding ``rf_id``, ``tid``, ``scope``, and for record_param_comms
  ``collective_name``, ``dtype``, ``in_msg_nelems``, ``in_split_size``, ``pg_name``...).

An ET alone gives host ops with shapes, nesting and collectives but no times
(``start``/``dur`` NaN). :func:`link_et` attaches an ET to a Kineto rank graph by
record-function id.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import numpy as np

from cosim.errors import CosimInputError
from cosim.fileio import open_maybe_gzip
from cosim.workload.classify import collective_type, dtype_bytes, op_flops_bytes
from cosim.workload.cost import fill_gpu_costs
from cosim.workload.deps import host_edges
from cosim.workload.graph import CollType, HostKind, RankGraph, SeqSource, StringTable, Table, ragged_arrays
from cosim.workload.kineto_common import int_list

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover
    _orjson = None  # type: ignore[assignment]

__all__ = ["EtNode", "link_et", "load_et_nodes", "read_et"]

_ROOT = re.compile(r"^\[pytorch\|profiler\|execution_(graph|trace)\|(thread|process)\]$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")


class EtNode(dict):
    """A normalised ET node: id, name, parent, rf_id, tid, scope, in_values,
    in_shapes, in_types, out_shapes, attrs (dict)."""


def _loads(path: Path) -> Any:
    try:
        fh = open_maybe_gzip(path)
        try:
            data = fh.read()
        finally:
            fh.close()
    except EOFError:
        raise CosimInputError("truncated gzip file (compressed stream ended early)", file=path) from None
    except OSError as exc:
        if isinstance(exc, CosimInputError):
            raise
        raise CosimInputError(f"corrupt gzip data ({exc})", file=path) from None
    if _orjson is not None:
        try:
            return _orjson.loads(data)
        except _orjson.JSONDecodeError:
            pass  # fall through to json for a precise line:column
    try:
        return json.loads(data)
    except json.JSONDecodeError as exc:
        raise CosimInputError(f"invalid JSON: {exc.msg}", file=path, line=exc.lineno, column=exc.colno) from None
    except UnicodeDecodeError as exc:
        raise CosimInputError(f"invalid UTF-8 ({exc.reason})", file=path) from None


def _strip_tensor(t: Any) -> Any:
    if isinstance(t, str) and t.startswith("Tensor(") and t.endswith(")"):
        return t[7:-1]
    return t


#: Node fields per layout: 1.0.1 (flat) and 1.0.2+ (chakra-style, ``ctrl_deps`` and ``attrs``).
ET_FIELDS_FLAT = (
    "id",
    "name",
    "parent",
    "rf_id",
    "tid",
    "scope",
    "inputs",
    "input_shapes",
    "input_types",
    "outputs",
    "output_shapes",
    "output_types",
)
ET_FIELDS_CHAKRA = ("id", "name", "ctrl_deps", "inputs", "outputs", "attrs")


def _is_int(x: Any) -> bool:
    """An integer that fits the graph's int64 columns (ids, rf_id, tid, scope)."""
    return isinstance(x, int) and not isinstance(x, bool) and -(2**63) <= x < 2**63


def _chakra_layout(schema: str, nodes: list[Any]) -> bool:
    m = re.match(r"^1\.(\d+)\.(\d+)", schema)
    if m:
        return (int(m.group(1)), int(m.group(2))) >= (0, 2)
    return any(isinstance(n, dict) and ("ctrl_deps" in n or "attrs" in n) for n in nodes[:100])


def _node_label(k: int, n: Any) -> str:
    if isinstance(n, dict):
        nid, name = n.get("id"), n.get("name")
        return f"nodes[{k}]" + (
            f" (id {nid}" + (f", {name!r})" if isinstance(name, str) else ")") if nid is not None else ""
        )
    return f"nodes[{k}]"


def _check_node(
    path: Path, k: int, n: Any, parent_key: str, expected: tuple[str, ...], missing_everywhere: set[str]
) -> None:
    """Types and required fields of ET node ``k``; raises a one-line CosimInputError."""
    if not isinstance(n, dict):
        raise CosimInputError(
            f"a node must be an object with fields {', '.join(expected)}; got {type(n).__name__}",
            file=path,
            path=f"nodes[{k}]",
        )
    for key in ("id", "name", parent_key):
        if key not in n:
            if key in missing_everywhere:
                raise CosimInputError(
                    f"no node has {key!r}: not the Execution Trace schema this importer reads (expected fields "
                    f"{', '.join(expected)}; this node has {', '.join(sorted(map(str, n)))})",
                    file=path,
                    path=_node_label(k, n),
                )
            raise CosimInputError(
                f"no {key!r} field (expected fields {', '.join(expected)})", file=path, path=_node_label(k, n)
            )
    if not _is_int(n["id"]) or n["id"] < 0:
        raise CosimInputError(f"id must be a non-negative integer, got {n['id']!r:.60}", file=path, path=f"nodes[{k}]")
    if not isinstance(n["name"], str):
        raise CosimInputError(f"name must be a string, got {n['name']!r:.60}", file=path, path=_node_label(k, n))
    if not _is_int(n[parent_key]):
        raise CosimInputError(
            f"{parent_key} must be a node id (an integer), got {n[parent_key]!r:.60}", file=path, path=_node_label(k, n)
        )
    for key in ("inputs", "outputs"):
        v = n.get(key)
        if v is not None and not isinstance(v, (list, dict)):
            raise CosimInputError(
                f"{key} must be an object or an array, got {v!r:.60}", file=path, path=_node_label(k, n)
            )
        if isinstance(v, dict):
            for sub in ("values", "shapes", "types"):
                if not isinstance(v.get(sub, []), list):
                    raise CosimInputError(
                        f"{key}.{sub} must be an array, got {v.get(sub)!r:.60}", file=path, path=_node_label(k, n)
                    )
    for key in ("input_shapes", "input_types", "output_shapes", "output_types"):
        if not isinstance(n.get(key, []), list):
            raise CosimInputError(f"{key} must be an array, got {n.get(key)!r:.60}", file=path, path=_node_label(k, n))
    attrs = n.get("attrs", [])
    if not isinstance(attrs, list) or not all(isinstance(a, dict) and isinstance(a.get("name"), str) for a in attrs):
        raise CosimInputError(
            "attrs must be an array of {name, type, value} objects", file=path, path=_node_label(k, n)
        )


def _check_graph(path: Path, ids: np.ndarray, parents: np.ndarray, labels: list[str], parent_key: str) -> None:
    """Unique ids, parents that exist, no cycles in the parent chains (vectorized)."""
    order = np.argsort(ids, kind="stable")
    sid = ids[order]
    dup = np.nonzero(sid[1:] == sid[:-1])[0]
    if len(dup):
        k = int(order[dup[0] + 1])
        raise CosimInputError(f"duplicate node id {int(sid[dup[0]])}", file=path, path=labels[k])
    pos = np.searchsorted(sid, parents)
    found = (pos < len(sid)) & (sid[np.minimum(pos, len(sid) - 1)] == parents)
    root = (parents == ids) | (parents <= 0)
    bad = ~found & ~root
    if bad.any():
        k = int(np.argmax(bad))
        raise CosimInputError(f"{parent_key} {int(parents[k])} names no node of this trace", file=path, path=labels[k])
    # parent pointers as row indices; 2^r hops after r doublings: a chain still going after n hops is a cycle
    up = np.where(found & ~root, order[np.minimum(pos, len(sid) - 1)], -1)
    hops = 1
    while hops < len(ids) and (up >= 0).any():
        up = np.where(up >= 0, up[np.maximum(up, 0)], -1)
        hops *= 2
    if (up >= 0).any():
        k = int(np.argmax(up >= 0))
        raise CosimInputError(
            f"cyclic {parent_key}: the chain of parents from this node never reaches a root", file=path, path=labels[k]
        )


def load_et_nodes(path: str | Path) -> tuple[dict[str, Any], list[EtNode]]:
    """Read an ET file; returns (header without nodes, normalised nodes sorted by id).

    Checks every node (required fields and their types for the file's layout, unique ids,
    parents that exist, no cyclic parent chains); a bad node is one :class:`CosimInputError`
    naming the file, the node (index, id, name) and the problem.
    """
    path = Path(path)
    doc = _loads(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("nodes"), list):
        raise CosimInputError("not an Execution Trace (no 'nodes' list)", file=path, path="nodes")
    schema = str(doc.get("schema", ""))
    if schema and not re.match(r"^1\.[01]\.\d+", schema):
        raise CosimInputError(
            f"unsupported Execution Trace schema {schema!r} (supported: 1.0.x to 1.1.x)", file=path, path="schema"
        )
    nodes = doc["nodes"]
    if "pid" in doc and not _is_int(doc["pid"]):
        raise CosimInputError(f"pid must be an integer (the process id), got {doc['pid']!r:.60}", file=path, path="pid")
    chakra = _chakra_layout(schema, nodes)
    parent_key, expected = ("ctrl_deps", ET_FIELDS_CHAKRA) if chakra else ("parent", ET_FIELDS_FLAT)
    missing_everywhere = {
        k for k in ("id", "name", parent_key) if not any(isinstance(n, dict) and k in n for n in nodes)
    }
    out: list[EtNode] = []
    labels: list[str] = []
    for k, n in enumerate(nodes):
        _check_node(path, k, n, parent_key, expected, missing_everywhere)
        attrs = {a["name"]: a.get("value") for a in n.get("attrs", [])}
        ins, outs = n.get("inputs"), n.get("outputs")
        if isinstance(ins, dict):
            in_values, in_shapes, in_types = ins.get("values", []), ins.get("shapes", []), ins.get("types", [])
        else:
            in_values, in_shapes, in_types = ins or [], n.get("input_shapes", []), n.get("input_types", [])
        out_shapes = outs.get("shapes", []) if isinstance(outs, dict) else n.get("output_shapes", [])

        def field(key: str, default: int = -1, n: dict = n, attrs: dict = attrs, k: int = k) -> int:
            v = n[key] if key in n else attrs.get(key, default)
            if not _is_int(v):
                raise CosimInputError(f"{key} must be an integer (64-bit), got {v!r:.60}", file=path,
                                      path=_node_label(k, n))
            return v

        if not all(isinstance(t, str) for t in in_types):
            bad = next(t for t in in_types if not isinstance(t, str))
            raise CosimInputError(f"input types must be strings, got {bad!r:.60}", file=path, path=_node_label(k, n))

        out.append(
            EtNode(
                id=n["id"],
                name=n["name"],
                parent=-1 if n[parent_key] == n["id"] else (n[parent_key] or -1),  # a self-parent is a root
                rf_id=field("rf_id"),
                tid=field("tid", 0),
                scope=field("scope", 0),
                in_values=in_values,
                in_shapes=in_shapes,
                in_types=[_strip_tensor(t) for t in in_types],
                out_shapes=out_shapes,
                attrs=attrs,
            )
        )
        labels.append(_node_label(k, n))
    if out:
        _check_graph(
            path,
            np.array([n["id"] for n in out], np.int64),
            np.array([n["parent"] for n in out], np.int64),
            labels,
            parent_key,
        )
    out.sort(key=lambda x: x["id"])
    return {k: v for k, v in doc.items() if k != "nodes"}, out


def _comm_info(node: EtNode) -> dict[str, Any] | None:
    """Collective fields of a record_param_comms node (both layouts); None for 'wait'."""
    a = node["attrs"]
    info: dict[str, Any] = {}
    if "collective_name" in a:
        info["name"] = a.get("collective_name")
        info["dtype"] = a.get("dtype")
        info["in_nelems"] = a.get("in_msg_nelems")
        info["out_nelems"] = a.get("out_msg_nelems")
        info["in_split"] = int_list(a.get("in_split_size"), drop=True)
        info["out_split"] = int_list(a.get("out_split_size"), drop=True)
        info["pg_name"] = a.get("pg_name")
        info["pg_desc"] = a.get("pg_desc")
        info["group_size"] = a.get("pg_size")
    vals = node["in_values"]
    # positional layout: [tensor(s), seq, pg (ptr or (name, desc)), rank, name, in_split, out_split, ...]
    si = next((i for i, v in enumerate(vals) if isinstance(v, str)), None)
    if si is not None:
        info.setdefault("name", vals[si])
        if si >= 3 and isinstance(vals[si - 3], int):
            info["seq"] = vals[si - 3]
        elif si == 3 and isinstance(vals[0], int):
            info["seq"] = vals[0]
        pg = vals[si - 2] if si >= 2 else None
        if isinstance(pg, list) and len(pg) == 2 and info.get("pg_name") is None:
            info["pg_name"], info["pg_desc"] = str(pg[0]), str(pg[1])
        if "in_split" not in info and len(vals) > si + 2:
            info["in_split"] = int_list(vals[si + 1], drop=True)
            info["out_split"] = int_list(vals[si + 2], drop=True)
    if not info.get("name") or info["name"] == "wait":
        return None
    if info.get("in_nelems") is None or info.get("dtype") is None:
        shp = node["in_shapes"][0] if node["in_shapes"] else None
        typ = node["in_types"][0] if node["in_types"] else None
        while isinstance(shp, list) and shp and isinstance(shp[0], list):  # a TensorList of one tensor
            shp = shp[0]
        if isinstance(typ, str) and typ.startswith("GenericList[Tensor("):
            typ = typ[len("GenericList[Tensor(") : typ.index(")")]
        if isinstance(shp, list) and all(isinstance(x, int) for x in shp):
            info.setdefault("in_nelems", math.prod(shp))
            if info.get("in_nelems") is None:
                info["in_nelems"] = math.prod(shp)
        if info.get("dtype") is None:
            info["dtype"] = typ
    return info


def read_et(path: str | Path, rank: int = 0, world_size: int | None = None) -> RankGraph:
    """An ET alone as a :class:`RankGraph`: host ops with names, nesting, shapes and
    collectives; times NaN; no GPU ops."""
    path = Path(path)
    header, nodes = load_et_nodes(path)
    st = StringTable()
    keep = [n for n in nodes if not _ROOT.match(n["name"])]
    if not keep:
        raise CosimInputError("the Execution Trace holds no operator nodes: nothing to replay", file=path, path="nodes")
    by_id = {n["id"]: k for k, n in enumerate(keep)}
    # threads, in order of first appearance
    tids: dict[int, int] = {}
    for n in keep:
        tids.setdefault(n["tid"], len(tids))
    order = sorted(range(len(keep)), key=lambda k: (tids[keep[k]["tid"]], keep[k]["id"]))
    keep = [keep[k] for k in order]
    pos = {n["id"]: k for k, n in enumerate(keep)}
    del by_id
    nh = len(keep)
    parent = np.array([pos.get(n["parent"], -1) for n in keep], np.int32)
    depth = np.zeros(nh, np.int16)
    for i in range(nh):
        if parent[i] >= 0:
            depth[i] = depth[parent[i]] + 1
    names = [n["name"] for n in keep]
    kind = np.array(
        [
            HostKind.ANNOTATION
            if (n["scope"] == 7 or n["name"].startswith("## ") or _STEP.match(n["name"]))
            else HostKind.OP
            for n in keep
        ],
        np.int8,
    )
    shapes = np.array(
        [st(json.dumps(n["in_shapes"], separators=(",", ":"))) if n["in_shapes"] else -1 for n in keep], np.int32
    )
    types = np.array(
        [st(json.dumps(n["in_types"], separators=(",", ":"))) if n["in_types"] else -1 for n in keep], np.int32
    )
    oshapes = np.array(
        [st(json.dumps(n["out_shapes"], separators=(",", ":"))) if n["out_shapes"] else -1 for n in keep], np.int32
    )
    name_ids = np.array([st(x) for x in names], np.int32)
    flops = np.full(nh, np.nan)
    byts = np.full(nh, np.nan)
    for i in np.nonzero(shapes >= 0)[0].tolist():
        flops[i], byts[i] = op_flops_bytes(
            names[i], st.strings[shapes[i]], st.strings[types[i]] if types[i] >= 0 else None
        )

    # steps: ProfilerStep nodes, else the whole trace
    steps_idx = [i for i in range(nh) if _STEP.match(names[i])]
    if steps_idx:
        nums = [int(m.group(1)) for i in steps_idx if (m := _STEP.match(names[i]))]
        steps = Table(
            "steps",
            len(steps_idx),
            number=np.array(nums),
            host_op=np.array(steps_idx),
            n_gpu_ops=np.zeros(len(steps_idx)),
        )
        step_of_root: dict[int, int] = {i: k for k, i in enumerate(steps_idx)}
        h_step = np.full(nh, -1, np.int32)
        for i in range(nh):
            if i in step_of_root:
                h_step[i] = step_of_root[i]
            elif parent[i] >= 0:
                h_step[i] = h_step[parent[i]]
    else:
        steps = Table("steps", 1, number=np.array([-1]), host_op=np.array([-1]), n_gpu_ops=np.zeros(1))
        h_step = np.zeros(nh, np.int32)

    threads = Table(
        "threads",
        len(tids),
        pid=np.full(len(tids), header["pid"] if _is_int(header.get("pid")) else -1),
        tid=np.array(list(tids), np.int64),
    )
    nan = np.full(nh, np.nan)
    host_ops = Table(
        "host_ops",
        nh,
        thread=np.array([tids[n["tid"]] for n in keep], np.int32),
        start=nan,
        dur=nan,
        name=name_ids,
        kind=kind,
        parent=parent,
        depth=depth,
        pre_gap=nan,
        tail=nan,
        self_time=nan,
        step=h_step,
        input_shapes=shapes,
        input_types=types,
        output_shapes=oshapes,
        rf_id=np.array([n["rf_id"] for n in keep], np.int64),
        et_node=np.array([n["id"] for n in keep], np.int64),
        flops=flops,
        bytes=byts,
    )
    rg = RankGraph(
        rank=rank,
        world_size=world_size or rank + 1,
        device_name="",
        strings=st.strings,
        threads=threads,
        host_ops=host_ops,
        gpu_ops=Table("gpu_ops", 0),
        launches=Table("launches", 0),
        collectives=Table("collectives", 0),
        groups=Table("groups", 0),
        steps=steps,
        edges=host_edges(host_ops),
        source={
            "format": "execution_trace",
            "file": str(path),
            "schema": header.get("schema"),
            "pid": header.get("pid"),
        },
    )
    rg.collectives, rg.groups = _et_collectives(st, keep, rg)
    rg.strings = st.strings
    return rg


def _et_collectives(st: StringTable, keep: list[EtNode], rg: RankGraph) -> tuple[Table, Table]:
    rows = []
    groups: dict[str | None, int] = {}
    g_rows: list[tuple[int, int, list[int]]] = []
    counters: dict[tuple[int, int], int] = {}
    for i, n in enumerate(keep):
        if n["name"] != "record_param_comms":
            continue
        info = _comm_info(n)
        if info is None:
            continue
        pg = info.get("pg_name")
        pg = str(pg) if pg is not None else None
        if pg not in groups:
            groups[pg] = len(g_rows)
            gsz = int(info.get("group_size") or -1)
            g_rows.append(
                (
                    st(pg) if pg is not None else -1,
                    st(str(info["pg_desc"])) if info.get("pg_desc") else -1,
                    list(range(gsz)) if gsz > 0 and pg == "0" else [],
                )
            )
        gid = groups[pg]
        ctype = collective_type(str(info["name"]))
        esz = dtype_bytes(str(info.get("dtype"))) if info.get("dtype") is not None else -1
        in_n = int(info["in_nelems"]) if info.get("in_nelems") is not None else -1
        out_n = (
            int(info["out_nelems"])
            if info.get("out_nelems") is not None
            else (in_n if ctype in (CollType.ALL_REDUCE, CollType.ALL_TO_ALL, CollType.BROADCAST) else -1)
        )
        if "seq" in info:
            seq, src = int(info["seq"]), SeqSource.ET
        else:
            key = (gid, int(ctype))
            seq = counters.get(key, 0)
            counters[key] = seq + 1
            src = SeqSource.COUNTER
        rows.append(
            (
                i,
                int(ctype),
                st(str(info["name"])),
                st(str(info["dtype"])) if info.get("dtype") is not None else -1,
                esz,
                in_n,
                out_n,
                gid,
                int(info.get("group_size") or -1),
                seq,
                int(src),
                info.get("in_split") or [],
                info.get("out_split") or [],
            )
        )
    nc = len(rows)
    io, iv = ragged_arrays([r[11] for r in rows])
    oo, ov = ragged_arrays([r[12] for r in rows])
    col = lambda k: np.array([r[k] for r in rows]) if nc else np.zeros(0)  # noqa: E731
    c_esz, c_in, c_out = col(4), col(5), col(6)
    coll = Table(
        "collectives",
        nc,
        host_op=col(0),
        gpu_op=np.full(nc, -1),
        type=col(1),
        name=col(2),
        dtype=col(3),
        elem_bytes=c_esz,
        in_nelems=c_in,
        out_nelems=c_out,
        in_bytes=np.where((c_in >= 0) & (c_esz > 0), c_in * c_esz, np.nan) if nc else np.zeros(0),
        out_bytes=np.where((c_out >= 0) & (c_esz > 0), c_out * c_esz, np.nan) if nc else np.zeros(0),
        group=col(7),
        group_size=col(8),
        seq=col(9),
        seq_source=col(10),
        in_splits_offsets=io,
        in_splits_values=iv,
        out_splits_offsets=oo,
        out_splits_values=ov,
    )
    go, gv = ragged_arrays([r[2] for r in g_rows])
    return coll, Table(
        "groups",
        len(g_rows),
        name=np.array([r[0] for r in g_rows]),
        desc=np.array([r[1] for r in g_rows]),
        ranks_offsets=go,
        ranks_values=gv,
    )


def link_et(rg: RankGraph, et_path: str | Path, nodes: list[EtNode] | None = None) -> dict[str, int]:
    """Attach an ET to a Kineto rank graph in place.

    Host ops are matched to ET nodes by record-function id: Kineto's
    ``Record function id`` arg, or — in older traces without it — the ``External id``
    of cpu ops (which was the record-function id then). A match also requires equal
    op names. Matched ops get the ET node id, missing input shapes/types, output
    shapes and FLOPs, and their non-GEMM kernels bytes and FLOPs (``cost.fill_gpu_costs``);
    collectives get split sizes and sequence numbers from the ET's record_param_comms.
    Returns counts ``{matched, et_ops, kineto_ops}``.
    """
    if nodes is None:
        _, nodes = load_et_nodes(et_path)
    rg.make_writable()  # a loaded graph's arrays are read-only
    by_rf = {n["rf_id"]: n for n in nodes if n["rf_id"] >= 0 and not _ROOT.match(n["name"])}
    h = rg.host_ops
    st = StringTable(rg.strings)
    cpu = (h.kind == HostKind.OP) | (h.kind == HostKind.ANNOTATION)
    use_rf = (h.rf_id[cpu] > 0).any()
    key = np.where(cpu, h.rf_id if use_rf else h.ext_id, -1)
    matched = 0
    et_by_host: dict[int, EtNode] = {}
    for i in np.nonzero(key >= 0)[0].tolist():
        n = by_rf.get(int(key[i]))
        if n is None or n["name"] != rg.strings[h.name[i]]:
            continue
        matched += 1
        et_by_host[i] = n
        h.et_node[i] = n["id"]
        if h.input_shapes[i] < 0 and n["in_shapes"]:
            h.input_shapes[i] = st(json.dumps(n["in_shapes"], separators=(",", ":")))
        if h.input_types[i] < 0 and n["in_types"]:
            h.input_types[i] = st(json.dumps(n["in_types"], separators=(",", ":")))
        if n["out_shapes"]:
            h.output_shapes[i] = st(json.dumps(n["out_shapes"], separators=(",", ":")))
        if np.isnan(h.flops[i]) and h.input_shapes[i] >= 0:
            f, b = op_flops_bytes(
                n["name"],
                st.strings[h.input_shapes[i]],
                st.strings[h.input_types[i]] if h.input_types[i] >= 0 else None,
            )
            h.flops[i], h.bytes[i] = f, b
    c = rg.collectives
    new_in: list[list[int]] = []
    new_out: list[list[int]] = []
    for k in range(len(c)):
        i = int(c.host_op[k])
        n = et_by_host.get(i)
        info = _comm_info(n) if n is not None else None
        ins, outs = list(c.ragged("in_splits", k)), list(c.ragged("out_splits", k))
        if info is not None:
            ins = ins or info.get("in_split") or []
            outs = outs or info.get("out_split") or []
            if c.seq_source[k] == SeqSource.COUNTER and "seq" in info:
                c.seq[k] = int(info["seq"])
                c.seq_source[k] = SeqSource.ET
        new_in.append(ins)
        new_out.append(outs)
    if len(c):
        cols = c.columns()
        cols["in_splits_offsets"], cols["in_splits_values"] = ragged_arrays(new_in)
        cols["out_splits_offsets"], cols["out_splits_values"] = ragged_arrays(new_out)
        rg.collectives = Table("collectives", len(c), **cols)
    rg.strings = st.strings
    fill_gpu_costs(rg)  # kernels whose parent op gained shapes from the ET
    rg.source["et"] = str(et_path)
    rg.source["et_matched_ops"] = matched
    return {"matched": matched, "et_ops": len(by_rf), "kineto_ops": int(cpu.sum())}
