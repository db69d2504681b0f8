"""Chakra execution traces (ASTRA-sim's workload input) from an execution graph.

:func:`write_chakra` writes every rank of an :class:`~cosim.workload.graph.ExecutionGraph` as
``<prefix>.<rank>.et`` in Chakra's protobuf schema (vendored in :mod:`cosim.output.chakra_schema`):
a ``GlobalMetadata`` message, then one ``Node`` message per GPU op, each preceded by its length as a
varint (Chakra's ``encode_message`` / ``decode_message``). What a node is:

* compute (kernel, memcpy, memset): ``COMP_NODE``, ``duration_micros`` its duration rounded to the
  microsecond (at least 1 when it is not 0: Chakra's unit; ASTRA-sim skips a node with neither a
  runtime nor ``num_ops``), attributes ``num_ops`` (FLOPs) and ``tensor_size`` (bytes) when known;
* collective: ``COMM_COLL_NODE`` with ``comm_type`` (ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER, ALL_TO_ALL,
  BROADCAST, REDUCE, GATHER, SCATTER, BARRIER), ``comm_size`` in bytes as ASTRA-sim reads it (the
  buffer each rank contributes: the whole buffer of an all-reduce, reduce-scatter or all-to-all, the
  per-rank shard of an all-gather) and ``pg_name``, the id of its process group in
  ``<prefix>.comm_groups.json`` (ASTRA-sim's ``--comm-group-configuration``; empty for the whole world);
* pipeline point-to-point: ``COMM_SEND_NODE`` / ``COMM_RECV_NODE`` with ``comm_src``, ``comm_dst``,
  ``comm_tag`` (the transfer's sequence number, equal on both ends) and ``comm_size``.

Every node has ``is_cpu_op`` false. Dependencies are ``data_deps`` (ASTRA-sim 2a2979a's feeder
resolves only those): the previous op on the same stream, cross-stream event waits, and, through the
host, every GPU op a blocking host call (``cudaStreamSynchronize``) waited for before the launch
(only the latest such op per stream, the earlier ones follow by stream order). Host ops themselves are
not written (Chakra's GPU-level ETs have none). Uneven all-to-all splits are written as their total:
Chakra's all-to-all has one size.

A folded graph (one rank per class) cannot be written: Chakra needs one file per rank;
:func:`export_scenario` therefore synthesizes the scenario unfolded. Cost: O(GPU ops + edges) per rank.
"""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from cosim.errors import CosimInputError
from cosim.workload.graph import CollType, EdgeKind, ExecutionGraph, RankGraph

__all__ = ["ChakraExport", "collective_traces", "export_scenario", "read_chakra", "write_chakra"]

SCHEMA_VERSION = "0.0.4"
"""``GlobalMetadata.version`` written (the version Chakra's converters write at the vendored commit)."""

_COLL = {CollType.ALL_REDUCE: "ALL_REDUCE", CollType.ALL_GATHER: "ALL_GATHER",
         CollType.REDUCE_SCATTER: "REDUCE_SCATTER", CollType.ALL_TO_ALL: "ALL_TO_ALL",
         CollType.BROADCAST: "BROADCAST", CollType.REDUCE: "REDUCE", CollType.GATHER: "GATHER",
         CollType.SCATTER: "SCATTER", CollType.BARRIER: "BARRIER"}
_P2P = (CollType.SEND, CollType.RECV, CollType.SEND_RECV)
_ASTRA_SIMULATES = {"ALL_REDUCE", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL"}
"""Collectives ASTRA-sim 2a2979a simulates on its network (it replays a broadcast's recorded time and
does not run the others)."""


def _pb() -> Any:
    """The generated message classes (imported late: protobuf is only needed to export)."""
    try:
        from cosim.output.chakra_schema import et_def_pb2
    except ImportError as exc:  # pragma: no cover - protobuf is a dependency
        raise CosimInputError(f"Chakra export needs the protobuf package ({exc}); pip install protobuf") from None
    return et_def_pb2


@dataclass
class ChakraExport:
    """What :func:`write_chakra` wrote."""

    prefix: Path
    """Workload prefix (ASTRA-sim's ``--workload-configuration``): files ``<prefix>.<rank>.et``."""
    comm_groups: Path
    """``<prefix>.comm_groups.json``: process group id -> global ranks (ASTRA-sim's ``--comm-group-configuration``)."""
    ranks: int
    nodes: int
    """Nodes written over all ranks."""
    compute_nodes: int
    collectives: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per Chakra collective type (and SEND / RECV): ``count`` and ``bytes`` (sum of ``comm_size``) over all ranks."""
    notes: list[str] = field(default_factory=list)

    def files(self) -> list[Path]:
        return [Path(f"{self.prefix}.{r}.et") for r in range(self.ranks)]

    def to_json(self) -> dict[str, Any]:
        return {"prefix": str(self.prefix), "comm_groups": str(self.comm_groups), "ranks": self.ranks,
                "nodes": self.nodes, "compute_nodes": self.compute_nodes, "collectives": self.collectives,
                "notes": self.notes}


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(0x80 | b)
        else:
            out.append(b)
            return bytes(out)


def _write_msg(fh: IO[bytes], msg: Any) -> None:
    """Chakra's ``encode_message``: the serialized length as a varint, then the message."""
    data = msg.SerializeToString()
    fh.write(_varint(len(data)))
    fh.write(data)


def read_chakra(path: str | Path) -> tuple[Any, list[Any]]:
    """Decode one Chakra ET file: ``(GlobalMetadata, [Node, ...])`` (Chakra's ``decode_message`` loop).

    A truncated or corrupt file is one :class:`CosimInputError` naming the file and the message."""
    pb = _pb()
    raw = Path(path).read_bytes()
    pos, k = 0, 0
    msgs: list[Any] = []
    while pos < len(raw):
        size, shift = 0, 0
        while True:
            if pos >= len(raw) or shift > 63:
                raise CosimInputError(f"message {k}: truncated length prefix", file=path)
            b = raw[pos]
            pos += 1
            size |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if pos + size > len(raw):
            raise CosimInputError(f"message {k}: {size} bytes announced, {len(raw) - pos} left (truncated)",
                                  file=path)
        msg = pb.GlobalMetadata() if k == 0 else pb.Node()
        try:
            msg.ParseFromString(raw[pos:pos + size])
        except Exception as exc:  # protobuf's DecodeError
            raise CosimInputError(f"message {k}: not a Chakra {'GlobalMetadata' if k == 0 else 'Node'} "
                                  f"({exc})", file=path) from None
        msgs.append(msg)
        pos += size
        k += 1
    if not msgs:
        raise CosimInputError("empty: no GlobalMetadata message", file=path)
    return msgs[0], msgs[1:]


class _Groups:
    """Global process-group ids shared by every rank's file (ASTRA-sim's comm groups)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self.ids: dict[tuple[int, ...], int] = {}

    def name(self, members: tuple[int, ...]) -> str:
        if len(members) == self.world and members == tuple(range(self.world)):
            return ""
        g = self.ids.get(members)
        if g is None:
            g = self.ids[members] = len(self.ids) + 1
        return str(g)

    def to_json(self) -> dict[str, list[int]]:
        return {str(g): list(m) for m, g in self.ids.items()}


def _host_sync_deps(rg: RankGraph, n_host: int) -> dict[int, list[int]]:
    """GPU op -> GPU ops it waits for through the host: each op launched after a blocking host call
    depends on what that call waited for (latest op per source stream, once per target stream)."""
    e = rg.edges
    src, dst, kind = np.asarray(e.src), np.asarray(e.dst), np.asarray(e.kind)
    sync = (kind == EdgeKind.SYNC) & (src >= n_host) & (dst < n_host)
    if not sync.any():
        return {}
    waits: dict[int, list[int]] = {}
    for s, d in zip(src[sync].tolist(), dst[sync].tolist()):
        waits.setdefault(d, []).append(s - n_host)
    launch = (kind == EdgeKind.LAUNCH) & (src < n_host) & (dst >= n_host)
    launched: dict[int, list[int]] = {}
    for s, d in zip(src[launch].tolist(), dst[launch].tolist()):
        launched.setdefault(s, []).append(d - n_host)
    stream = np.asarray(rg.gpu_ops.stream)
    thread = np.asarray(rg.host_ops.thread)
    waited: dict[int, dict[int, int]] = {}  # thread -> source stream -> latest GPU op waited for
    applied: dict[tuple[int, int], dict[int, int]] = {}  # (thread, target stream) -> what it already has
    out: dict[int, list[int]] = {}
    for h in sorted(set(waits) | set(launched)):
        t = int(thread[h])
        for g in launched.get(h, ()):
            have = applied.setdefault((t, int(stream[g])), {})
            new = [op for ss, op in waited.get(t, {}).items() if have.get(ss) != op]
            if new:
                out.setdefault(g, []).extend(new)
                for op in new:
                    have[int(stream[op])] = op
        for g in waits.get(h, ()):
            cur = waited.setdefault(t, {})
            ss = int(stream[g])
            if cur.get(ss, -1) < g:
                cur[ss] = g
    return out


def _gpu_deps(rg: RankGraph) -> list[list[int]]:
    """Per GPU op, the GPU ops it waits for (sorted, unique)."""
    n_host, n_gpu = len(rg.host_ops), len(rg.gpu_ops)
    e = rg.edges
    src, dst, kind = np.asarray(e.src), np.asarray(e.dst), np.asarray(e.kind)
    gg = (src >= n_host) & (dst >= n_host) & ((kind == EdgeKind.STREAM) | (kind == EdgeKind.EVENT_WAIT))
    deps: list[list[int]] = [[] for _ in range(n_gpu)]
    for s, d in zip((src[gg] - n_host).tolist(), (dst[gg] - n_host).tolist()):
        deps[d].append(s)
    for g, extra in _host_sync_deps(rg, n_host).items():
        deps[g].extend(extra)
    return [sorted(set(d)) for d in deps]


def _attr(pb: Any, name: str, **value: Any) -> Any:
    return pb.AttributeProto(name=name, **value)


def _agreed_sizes(graph: ExecutionGraph, notes: set[str]) -> dict[tuple[tuple[int, ...], int, int], float]:
    """One ``comm_size`` per collective instance (group, type, seq) where the ranks disagree: ASTRA-sim runs a
    collective in equal chunks on every rank of its group, so unequal sizes (an all-to-allv: each rank sends
    what its routing gave it) would never complete. Their mean is written (the same total bytes)."""
    sizes: dict[tuple[tuple[int, ...], int, int], list[float]] = {}
    for rg in graph.ranks:
        C = rg.collectives
        for c in range(len(C)):
            ctype = int(C.type[c])
            if CollType(ctype) in _P2P:
                continue
            sizes.setdefault((_members(rg, c), ctype, int(C.seq[c])), []).append(float(C.in_bytes[c]))
    out = {}
    for key, v in sizes.items():
        if len(set(v)) > 1 and all(math.isfinite(x) for x in v):
            out[key] = float(round(sum(v) / len(v)))
            notes.add(f"{CollType(key[1]).name} sizes that differ between the ranks of a group (all-to-allv) written "
                      "as the group's mean (ASTRA-sim needs one size per collective)")
    return out


def _rank_nodes(rg: RankGraph, groups: _Groups, stats: dict[str, dict[str, float]],
                notes: set[str], agreed: dict[tuple[tuple[int, ...], int, int], float]) -> Iterator[Any]:
    """The Chakra nodes of one rank, in GPU-op order (every dependency comes earlier in the file)."""
    pb = _pb()
    G, C = rg.gpu_ops, rg.collectives
    deps = _gpu_deps(rg)
    names = rg.strings
    dur = np.asarray(G.dur, dtype=float)
    flops, nbytes = np.asarray(G.flops, dtype=float), np.asarray(G.bytes, dtype=float)
    coll = np.asarray(G.collective)
    where = f"rank {rg.rank}"
    for j in range(len(G)):
        name = names[int(G.name[j])] if int(G.name[j]) >= 0 else f"gpu_op{j}"
        node = pb.Node(id=j, name=name, data_deps=deps[j])
        attrs = [_attr(pb, "is_cpu_op", bool_val=False)]
        c = int(coll[j])
        if c < 0:
            d = float(dur[j])
            if not math.isfinite(d) or d < 0:
                raise CosimInputError(f"{where}: gpu_ops[{j}] ({name!r}): duration {d} is not a time >= 0")
            us = round(d * 1e6)
            node.type = pb.COMP_NODE
            node.duration_micros = max(us, 1) if d > 0 else 0
            if math.isfinite(flops[j]) and flops[j] > 0:
                attrs.append(_attr(pb, "num_ops", int64_val=int(flops[j])))
            if math.isfinite(nbytes[j]) and nbytes[j] > 0:
                attrs.append(_attr(pb, "tensor_size", uint64_val=int(nbytes[j])))
            stats.setdefault("COMP", {"count": 0, "time_s": 0.0})
            stats["COMP"]["count"] += 1
            stats["COMP"]["time_s"] += node.duration_micros * 1e-6
        else:
            ctype = CollType(int(C.type[c]))
            size = float(C.in_bytes[c])
            if not math.isfinite(size) or size < 0:
                raise CosimInputError(f"{where}: collectives[{c}] ({name!r}): unknown or negative size {size}")
            members = _members(rg, c)
            size = agreed.get((members, int(ctype), int(C.seq[c])), size)
            if ctype in _P2P:
                send = _is_send(ctype, name)
                if send is None or len(members) != 2 or rg.rank not in members:
                    raise CosimInputError(f"{where}: collectives[{c}] ({name!r}): a point-to-point transfer needs "
                                          "its direction (SEND/RECV, or send/recv in the op name) and a group of "
                                          f"this rank and one peer (group {list(members)})")
                peer = members[0] if members[1] == rg.rank else members[1]
                node.type = pb.COMM_SEND_NODE if send else pb.COMM_RECV_NODE
                src, dst = (rg.rank, peer) if send else (peer, rg.rank)
                attrs += [_attr(pb, "comm_src", int32_val=src), _attr(pb, "comm_dst", int32_val=dst),
                          _attr(pb, "comm_tag", int32_val=int(C.seq[c]) % (2**31 - 1)),
                          _attr(pb, "comm_size", int64_val=int(size))]
                key = "SEND" if send else "RECV"
            elif ctype in _COLL:
                key = _COLL[ctype]
                node.type = pb.COMM_COLL_NODE
                attrs += [_attr(pb, "comm_type", int64_val=int(pb.CollectiveCommType.Value(key))),
                          _attr(pb, "comm_size", int64_val=int(size)),
                          _attr(pb, "pg_name", string_val=groups.name(members))]
                if key not in _ASTRA_SIMULATES:
                    notes.add(f"{key} collectives written; ASTRA-sim 2a2979a does not simulate them on its network")
                if ctype == CollType.ALL_TO_ALL and len(C.ragged("in_splits", c)):
                    sp = C.ragged("in_splits", c)
                    if len(set(sp.tolist())) > 1:
                        notes.add("uneven all-to-all splits written as their total (Chakra's all-to-all has one size)")
            else:
                raise CosimInputError(f"{where}: collectives[{c}] ({name!r}): collective type {ctype.name} has no "
                                      "Chakra equivalent")
            s = stats.setdefault(key, {"count": 0, "bytes": 0.0})
            s["count"] += 1
            s["bytes"] += float(int(size))
        node.attr.extend(attrs)
        yield node


def _members(rg: RankGraph, c: int) -> tuple[int, ...]:
    g = int(rg.collectives.group[c])
    if g < 0:
        n = int(rg.collectives.group_size[c])
        if n in (-1, rg.world_size):
            return tuple(range(rg.world_size))
        raise CosimInputError(f"rank {rg.rank}: collectives[{c}]: process group unknown (group_size {n})")
    return tuple(int(x) for x in rg.groups.ragged("ranks", g))


def _is_send(ctype: CollType, name: str) -> bool | None:
    if ctype == CollType.SEND:
        return True
    if ctype == CollType.RECV:
        return False
    low = name.lower()
    if "send" in low and "recv" not in low:
        return True
    if "recv" in low and "send" not in low:
        return False
    return None


def write_chakra(graph: ExecutionGraph, out_dir: str | Path, prefix: str = "cosim",
                 progress: bool = False) -> ChakraExport:
    """Write ``graph`` as Chakra ETs ``out_dir/<prefix>.<rank>.et`` plus ``<prefix>.comm_groups.json``.

    Every rank 0..world-1 must be in the graph (a folded graph is refused). Files appear all together
    or not at all (written in a temporary folder, moved at the end)."""
    pb = _pb()
    ranks = [rg.rank for rg in graph.ranks]
    world = graph.ranks[0].world_size if graph.ranks else 0
    if not graph.ranks or ranks != list(range(world)):
        missing = sorted(set(range(world)) - set(ranks))[:5]
        raise CosimInputError(f"Chakra export needs every rank of the world ({world}); the graph has {len(ranks)} "
                              f"(missing e.g. {missing}): a folded graph has to be built unfolded")
    if "/" in prefix or not prefix:
        raise CosimInputError(f"Chakra prefix {prefix!r}: needs a file name without '/'")
    out = Path(out_dir)
    created = not out.exists()
    try:
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{prefix}.", dir=out))
    except OSError as exc:
        raise CosimInputError(f"cannot write: {exc.strerror or exc}", file=out) from None
    groups = _Groups(world)
    stats: dict[str, dict[str, float]] = {}
    notes: set[str] = set()
    total = 0
    agreed = _agreed_sizes(graph, notes)
    try:
        for rg in _progress(graph.ranks, progress):
            with open(tmp / f"{prefix}.{rg.rank}.et", "wb") as fh:
                meta = pb.GlobalMetadata(version=SCHEMA_VERSION, attr=[
                    _attr(pb, "producer", string_val="cosim"),
                    _attr(pb, "rank", int64_val=rg.rank), _attr(pb, "world_size", int64_val=world),
                    _attr(pb, "device", string_val=rg.device_name or "")])
                _write_msg(fh, meta)
                for node in _rank_nodes(rg, groups, stats, notes, agreed):
                    _write_msg(fh, node)
                    total += 1
        (tmp / f"{prefix}.comm_groups.json").write_text(json.dumps(groups.to_json(), indent=1) + "\n")
        for f in sorted(tmp.iterdir()):
            f.replace(out / f.name)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    comp = int(stats.pop("COMP", {"count": 0})["count"])
    return ChakraExport(out / prefix, out / f"{prefix}.comm_groups.json", world, total, comp, stats, sorted(notes))


def _progress(items: list[RankGraph], show: bool) -> Iterable[RankGraph]:
    if not show:
        return items
    from tqdm import tqdm

    return tqdm(items, desc="chakra", unit="rank", leave=False)


def collective_traces(op: str, nbytes: float, world: int, out_dir: str | Path,
                      prefix: str | None = None) -> ChakraExport:
    """One collective over all ``world`` ranks as Chakra ETs (one ``COMM_COLL_NODE`` per rank):
    ``op`` all_reduce, all_gather, reduce_scatter or all_to_all, ``nbytes`` its ``comm_size``
    (ASTRA-sim's reading, see the module docs). For side-by-side runs with ``cosim collective``."""
    pb = _pb()
    key = op.upper()
    if key not in _ASTRA_SIMULATES:
        raise CosimInputError(f"collective {op!r}: one of {sorted(k.lower() for k in _ASTRA_SIMULATES)}")
    if not (world >= 2 and math.isfinite(nbytes) and nbytes > 0):
        raise CosimInputError(f"collective {op}: needs >= 2 ranks and a size > 0 (got {world}, {nbytes})")
    prefix = prefix or f"{op}.{world}"
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for r in range(world):
        node = pb.Node(id=0, name=op, type=pb.COMM_COLL_NODE, attr=[
            _attr(pb, "is_cpu_op", bool_val=False),
            _attr(pb, "comm_type", int64_val=int(pb.CollectiveCommType.Value(key))),
            _attr(pb, "comm_size", int64_val=int(nbytes))])
        with open(out / f"{prefix}.{r}.et", "wb") as fh:
            _write_msg(fh, pb.GlobalMetadata(version=SCHEMA_VERSION))
            _write_msg(fh, node)
    (out / f"{prefix}.comm_groups.json").write_text("{}\n")
    return ChakraExport(out / prefix, out / f"{prefix}.comm_groups.json", world, world, 0,
                        {key: {"count": world, "bytes": float(int(nbytes)) * world}})


def export_scenario(scenario: str | Path | None, out_dir: str | Path, sets: dict[str, str] | None = None,
                    prefix: str | None = None, progress: bool = False) -> ChakraExport:
    """Write scenario ``scenario``'s workload (name or YAML, None: ``cosim run``'s default; with ``--set``
    overrides) as Chakra ETs.

    A synthetic workload (``workload: synthetic:``) is synthesized on the scenario's topology with
    every rank built (``fold`` off: Chakra needs one file per rank) and its kernels timed by the
    scenario's models; a captured workload is written as loaded (projected onto the topology's
    accelerator when it was captured on a CPU). ``prefix`` defaults to the scenario's name."""
    from cosim.replay import ReplayConfig, apply_sets
    from cosim.scenario import (
        SyntheticWorkload,
        apply_scenario_sets,
        build_topology,
        expand_port_bandwidth,
        find_workload,
        load_scenario,
        resolve_path,
        split_topology_sets,
    )

    scn, rest = apply_scenario_sets(load_scenario(scenario), dict(sets or {}))
    base = Path(scn.source_file).parent if scn.source_file else None
    tsets, other = split_topology_sets({**scn.set, **rest})
    cfg = apply_sets(ReplayConfig(accelerator=scn.replay.accelerator, topology=scn.topology),
                     expand_port_bandwidth(other))
    topo = build_topology(cfg.topology or scn.topology, base, dict(cfg.catalog_overrides), tsets, scn.nodes)
    notes: list[str] = []
    if isinstance(scn.workload, SyntheticWorkload):
        from cosim.models.synth_timing import synthetic_kernel_timer
        from cosim.workload.synth import synthesize

        spec = scn.workload.synthetic
        if spec.fold:
            notes.append("workload.synthetic.fold ignored: Chakra needs every rank, synthesized unfolded")
        syn = synthesize(spec.model_copy(update={"fold": False}), topo, base, kernel_timer=synthetic_kernel_timer)
        graph = syn.graph
    else:
        from cosim.models.roofline import RooflineModel
        from cosim.workload import load_trace
        from cosim.workload.project import ProjectionConfig, needs_projection, project_onto

        wpath = resolve_path(scn.workload, base) or find_workload(scn.workload)
        if wpath is None:
            raise CosimInputError(f"workload {scn.workload!r} not found (not a bundled workload or a path)",
                                  file=scn.source_file)
        graph = load_trace(wpath)
        if needs_projection(graph):
            p = scn.projection
            graph = project_onto(graph, topo, cfg.accelerator,
                                 ProjectionConfig(dtype=p.dtype, host_speed=p.host_speed, aten_overhead=p.aten_overhead),
                                 kernel_model=RooflineModel)
            notes.append(f"captured workload projected onto {topo.accelerator(topo.gpus[0]).name} before export")
    res = write_chakra(graph, out_dir, prefix or scn.name, progress=progress)
    res.notes[:0] = notes
    return res
