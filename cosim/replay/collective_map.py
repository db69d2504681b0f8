"""Mapping a replayed collective onto the engine: which GPUs, which operation, how many bytes.

The executor matches the kernels of one collective instance across ranks (docs/REPLAY.md,
"Collectives"); this module turns such a match into what :meth:`cosim.engine.Simulator.collective`
runs (an all-to-allv byte matrix from the participants' split sizes, a DeepEP dispatch/combine from a
synthesized label), places ranks on the topology's GPUs, and, for a folded synthetic graph, adds the
equivalent groups of the stage a folded rank stands for so that their traffic still loads the links.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import simpy

from cosim.errors import CosimInputError
from cosim.replay.config import ReplayConfig
from cosim.replay.program import ENGINE_OPS
from cosim.workload.graph import CollType, RankGraph

__all__ = ["collective_runner", "collective_spec", "deepep", "fabric_blocks", "fold_replicas", "fold_stage",
           "gpu_of_rank", "rank_gpu", "split_matrix"]


def rank_gpu(topo: Any, rank: int, cfg: ReplayConfig) -> str | None:
    """The topology GPU a rank ran on (``summary.json`` ranks[].gpu), None without a topology."""
    if topo is None or not hasattr(topo, "gpus"):
        return None
    try:
        return gpu_of_rank(topo, rank, cfg)
    except CosimInputError:
        return None


def gpu_of_rank(topo: Any, rank: int, cfg: ReplayConfig) -> str:
    gpus = topo.gpus
    if cfg.ranks_per_node:
        node, local = divmod(rank, cfg.ranks_per_node)
        on = topo.gpus_on(node) if node < topo.nodes else []
        if local < len(on):
            return on[local]
    if rank >= len(gpus):
        raise CosimInputError(f"rank {rank} does not fit topology {topo.name} ({len(gpus)} GPUs); "
                              "choose a larger topology with --topology or --set topology=...")
    return gpus[rank]


def split_matrix(arr: list, ranks: list[int]) -> list[list[float]] | None:
    """all_to_allv bytes matrix [i][j] from every participant's input split sizes."""
    index = {r: k for k, r in enumerate(ranks)}
    m = [[0.0] * len(ranks) for _ in ranks]
    for r, j, _ in arr:
        rg = r.rg
        c = int(rg.gpu_ops.collective[j])
        C = rg.collectives
        splits = C.ragged("in_splits", c)
        if len(splits) != len(ranks):
            return None
        total_el = float(splits.sum())
        per_el = float(C.in_bytes[c]) / total_el if total_el > 0 and math.isfinite(C.in_bytes[c]) else math.nan
        if not math.isfinite(per_el):
            return None
        i = index[rg.rank]
        for k, n_el in enumerate(splits.tolist()):
            m[i][k] = 0.0 if k == i else n_el * per_el
    return m


def nbytes_of(rg: RankGraph, c: int, ctype: int) -> float:
    C = rg.collectives
    b = float(C.out_bytes[c] if ctype == CollType.ALL_GATHER else C.in_bytes[c])
    if not math.isfinite(b) or b <= 0:
        eb = int(C.elem_bytes[c])
        n = int(C.out_nelems[c] if ctype == CollType.ALL_GATHER else C.in_nelems[c])
        b = float(eb * n) if eb > 0 and n > 0 else math.nan
    return b


class _Colls:
    """A rank graph's collectives as Python lists, read once per runner (not per call): per GPU op its
    collective row (-1: none); per row its type, engine op (None: not on the fabric), bytes as :func:`nbytes_of`
    reads them, process group, group size and name. O(GPU ops + collectives) numpy to build."""

    __slots__ = ("coll", "group", "gsize", "name", "nb", "op", "strings", "type")

    def __init__(self, rg: RankGraph) -> None:
        C = rg.collectives
        self.strings = rg.strings
        self.coll: list[int] = rg.gpu_ops.collective.astype(np.int64).tolist()
        ct = C.type.astype(np.int64)
        self.type: list[int] = ct.tolist()
        self.op: list[str | None] = [ENGINE_OPS.get(t) for t in self.type]
        ag = ct == int(CollType.ALL_GATHER)
        b = np.where(ag, C.out_bytes, C.in_bytes).astype(float)
        eb = C.elem_bytes.astype(np.int64)
        n = np.where(ag, C.out_nelems, C.in_nelems).astype(np.int64)
        alt = np.where((eb > 0) & (n > 0), (eb * n).astype(float), math.nan)
        self.nb: list[float] = np.where(np.isfinite(b) & (b > 0), b, alt).tolist()
        self.group: list[int] = C.group.astype(np.int64).tolist()
        self.gsize: list[int] = C.group_size.astype(np.int64).tolist()
        self.name: list[int] = C.name.astype(np.int64).tolist()

    def label(self, c: int) -> str:
        """:func:`label_of` row ``c``."""
        return str(self.strings[self.name[c]])


def collective_spec(arr: list, topo: Any, cfg: ReplayConfig, gpu_of: dict[int, str] | None = None,
                    group_gpus: dict[tuple[int, int, int], list[str]] | None = None,
                    colls: _Colls | None = None) -> tuple[str, list[str], float, Any] | None:
    """What the engine runs for matched participants ``arr`` [(rank, gpu op, start)]:
    (op, GPUs, nbytes, all-to-allv matrix or None), or None when it cannot (type or size unknown).
    ``group_gpus``: the runner's cache of a lone participant's GPUs by (rank graph, group, group size);
    ``colls``: the runner's :class:`_Colls` of the first participant's rank graph."""
    r0, j0, _ = arr[0]
    rg = r0.rg
    if colls is not None:
        c = colls.coll[j0]
        ctype = colls.type[c]
        op = colls.op[c]
        nb = colls.nb[c]
    else:
        c = int(rg.gpu_ops.collective[j0])
        ctype = int(rg.collectives.type[c])
        op = ENGINE_OPS.get(CollType(ctype))
        nb = nbytes_of(rg, c, ctype)
    if op is None or not math.isfinite(nb):
        return None
    if len(arr) == 1 and group_gpus is not None and op != "send_recv":  # what the lone branch below gives
        gk = ((id(rg), colls.group[c], colls.gsize[c]) if colls is not None
              else (id(rg), int(rg.collectives.group[c]), int(rg.collectives.group_size[c])))
        hit = group_gpus.get(gk)
        if hit is None:
            spec = collective_spec(arr, topo, cfg, gpu_of)
            if spec is not None and spec[3] is None:
                group_gpus[gk] = list(spec[1])
            return spec
        return op, list(hit), nb, None
    if len(arr) > 1:
        ranks = sorted({r.rg.rank for r, _, _ in arr})
        if rg.source.get("fold") == "classes":  # the simulated members of a group folded into classes
            members = sorted(group_members(rg, c))
            if len(members) > len(ranks) and set(ranks) <= set(members):
                ranks = members  # the others are their replicas: the collective spans every member
    else:
        gsize = int(rg.collectives.group_size[c])
        members = group_members(rg, c)
        if len(members) < 2:
            members = list(range(max(gsize, 1)))
        ranks = members  # symmetric peers: the other members behave like this rank
    if len(ranks) < 2:
        return None
    if gpu_of is None:
        gpus = [gpu_of_rank(topo, r, cfg) for r in ranks]
    else:  # the runner's cache: topology.gpus builds its list on every call
        gpus = [gpu_of[r] if r in gpu_of else gpu_of.setdefault(r, gpu_of_rank(topo, r, cfg)) for r in ranks]
    if op == "send_recv":
        gpus = gpus[:2]
    if ctype == CollType.ALL_TO_ALL and len(arr) == len(ranks) > 1:
        matrix = split_matrix(arr, ranks)
        if matrix is not None:
            return "all_to_allv", gpus, nb, matrix
    return op, gpus, nb, None


def group_members(rg: RankGraph, c: int) -> list[int]:
    """The ranks of collective ``c``'s process group as ``rg`` records them ([] without a group)."""
    g = int(rg.collectives.group[c])
    return [int(x) for x in rg.groups.ragged("ranks", g)] if g >= 0 else []


def label_of(rg: RankGraph, c: int) -> str:
    """Name (label) of collective ``c`` of ``rg``."""
    return str(rg.strings[int(rg.collectives.name[c])])


def class_replicas(rg: RankGraph, c: int, arrived: int) -> list[list[int]]:
    """The groups that collective ``c`` of a graph folded into classes (skewed routing, ``source.fold ==
    "classes"``) stands for: when all of its group's members are simulated (``arrived`` of them) and lie in the
    simulated block of one stage (its first ``fold_block`` ranks), the group's translates by multiples of the
    block within the stage (the same EP or TP group of the other expert-data-parallel replicas); else []."""
    members = sorted(group_members(rg, c))
    k, S = int(rg.source.get("fold_block", 0)), int(rg.source.get("stage_ranks", 0))
    if len(members) < 2 or arrived != len(members) or k <= 0 or S <= k or S % k:
        return []
    base = (members[0] // S) * S
    if members[-1] >= base + k:
        return []
    return [[m + j * k for m in members] for j in range(1, S // k)]


def fold_replicas(members: list[int], stage: int) -> list[list[int]]:
    """The other groups of a folded synthetic rank's stage that ``members`` stands for: the stage's
    ranks ``[base, base + stage)`` cut into translates of the group's pattern (Megatron's TP, DP, EP
    groups are); [] when the group spans stages or the stage is not such a partition."""
    base = (members[0] // stage) * stage
    pat = sorted(m - base for m in members)
    if pat[0] < 0 or pat[-1] >= stage:
        return []
    covered = np.zeros(stage, dtype=bool)
    covered[pat] = True
    out = []
    for x in np.flatnonzero(~covered).tolist():
        if covered[x]:
            continue
        q = [v - pat[0] + x for v in pat]
        if q[-1] >= stage or covered[q].any():
            return []
        covered[q] = True
        out.append([base + v for v in q])
    return out


def fabric_blocks(graph: Any) -> bool:
    """True when some fabric switch has less capacity toward other fabric switches than toward its
    hosts (an oversubscribed fat tree). On a non-blocking one, the links equivalent groups of a stage
    share are switch-to-switch links, and with traffic spread over every spine by capacity these
    carry at most what the hosts' own links carry: they never bind, so the groups cannot slow each
    other and folding needs no replicas, provided every GPU has a NIC of its own (checked by the
    caller; docs/SYNTHESIS.md)."""
    kind = graph.nodes

    def cap(d: dict) -> float:
        return float(d.get("bandwidth", 0.0)) * float(d.get("efficiency", 1.0))

    for n, d in graph.nodes(data=True):
        if d.get("kind") != "fabric_switch":
            continue
        up = sum(cap(e) for _, v, e in graph.out_edges(n, data=True) if kind[v].get("kind") == "fabric_switch")
        down = sum(cap(e) for _, v, e in graph.out_edges(n, data=True) if kind[v].get("kind") != "fabric_switch")
        if up > 0 and down > 0 and up < down * (1 - 1e-9):
            return True
    return False


def fold_stage(graph: Any, topology: Any) -> int:
    """Ranks per pipeline stage that each rank of a folded synthetic graph stands for, or 0 when the
    graph is not folded or folding needs no replicas (every GPU has a NIC of its own on a non-blocking
    fabric: :func:`fabric_blocks`)."""
    world = max((rg.world_size for rg in graph.ranks), default=0)
    folded = (graph.ranks and all(rg.source.get("format") == "cosim-synthetic" for rg in graph.ranks)
              and len(graph.ranks) < world and world % len(graph.ranks) == 0
              and not any(rg.source.get("fold") == "classes" for rg in graph.ranks))  # those span all members
    if folded and not groups_contend(topology):
        folded = False  # non-blocking: the equivalent groups cannot slow each other (fabric_blocks)
    return world // len(graph.ranks) if folded else 0


def groups_contend(topology: Any) -> bool:
    """Whether equivalent groups of a folded graph can slow each other on ``topology``: some GPUs share a NIC,
    or the fabric blocks (:func:`fabric_blocks`)."""
    nics = [topology.nic_of(g) for g in topology.gpus] if hasattr(topology, "nic_of") else []
    own_nic = not nics or None in nics or len(set(nics)) == len(nics)
    return not own_nic or fabric_blocks(topology.graph)


def collective_runner(sim: Any, topo: Any, cfg: ReplayConfig, notes: list[str], stage: int = 0
                      ) -> Callable[[list], simpy.Event | None]:
    """Start a collective on the engine's fabric for matched participants. ``stage``: ranks per pipeline
    stage of a folded synthetic graph (0: not folded); a folded rank's collective then also runs the
    equivalent groups of its stage (:func:`fold_replicas`) so their traffic loads the links."""

    gpu_of: dict[int, str] = {}
    group_gpus: dict[tuple[int, int, int], list[str]] = {}  # (the rank graphs live as long as the runner)
    blocking: list[bool] = []  # groups_contend(topo), decided once on a class-folded graph's first collective
    class_gpus: dict[tuple[int, int, int], list[list[str]]] = {}  # (rank graph, group, arrived) -> replicas' GPUs

    def blocks() -> bool:
        if not blocking:
            blocking.append(groups_contend(topo))
        return blocking[0]

    tables: dict[int, _Colls] = {}  # id(rank graph) -> its collectives as lists

    def run(arr: list) -> simpy.Event | None:
        r0, j0, _ = arr[0]
        colls = tables.get(id(r0.rg))
        if colls is None:
            colls = tables[id(r0.rg)] = _Colls(r0.rg)
        spec = collective_spec(arr, topo, cfg, gpu_of, group_gpus, colls)
        if spec is None:
            return None
        op, gpus, nb, matrix = spec
        c = colls.coll[j0]
        if r0.rg.source.get("fold") == "classes" and blocks():
            ck = (id(r0.rg), int(r0.rg.collectives.group[c]), len(arr))
            gr = class_gpus.get(ck)
            if gr is None:
                gr = class_gpus[ck] = [[gpu_of_rank(topo, r, cfg) for r in rep]
                                       for rep in class_replicas(r0.rg, c, len(arr))]
            if gr:
                if matrix is not None:
                    return sim.collective("all_to_allv", gpus, matrix=matrix, name="all_to_allv", replicas=gr)
                if op != "send_recv" and not colls.label(c).startswith(("deepep_", "hybridep_")):
                    return sim.collective(op, gpus, nb, name=op, replicas=gr)
        if matrix is not None:
            return sim.collective("all_to_allv", gpus, matrix=matrix, name="all_to_allv")
        label = colls.label(c)
        if label.startswith("deepep_"):  # a synthesized DeepEP dispatch/combine (cosim.workload.synth.infer)
            return deepep(sim, label, gpus)
        if label.startswith("hybridep_"):  # a synthesized HybridEP dispatch/combine (cosim.workload.synth.build)
            return hybridep(sim, label, gpus)
        reps: list[list[str]] = []
        if stage and len(arr) == 1 and op != "send_recv":
            members = group_members(r0.rg, c)
            if len(members) == len(gpus):
                reps = [[gpu_of_rank(topo, r, cfg) for r in rep] for rep in fold_replicas(sorted(members), stage)]
        return sim.collective(op, gpus, nb, name=op, replicas=reps)

    return run


def hybridep(sim: Any, label: str, gpus: list[str]) -> simpy.Event:
    """Run ``hybridep_<kind>:<tokens>:<hidden>:<probs 0|1>:<topk>:<experts>:<SMs>`` with
    :func:`cosim.engine.moe_comm.hybridep`; the event carries the algorithm the executor records."""
    from types import SimpleNamespace

    from cosim.engine.moe_comm import hybridep as run
    from cosim.engine.moe_comm import hybridep_rates

    op, tokens, hidden, probs, topk, experts, sms = label.split(":")
    ev = run(sim, op.removeprefix("hybridep_"), gpus, num_tokens=float(tokens), hidden=int(hidden),
             probs=probs == "1", num_topk=int(topk), num_experts=int(experts), name=op,
             rates=hybridep_rates(int(sms)))
    out = sim.env.event()
    ev.callbacks.append(lambda e: out.succeed(SimpleNamespace(algo="hybridep", proto="simple")))
    return out


def deepep(sim: Any, label: str, gpus: list[str]) -> simpy.Event:
    """Run ``deepep_<kind>:<mode>:<tokens>:<bytes per token>:<topk>:<experts>`` with
    :func:`cosim.engine.moe_comm.deepep`; the event carries the algorithm/protocol the executor records."""
    from types import SimpleNamespace

    from cosim.engine.moe_comm import token_bytes

    op, mode, tokens, bpt, topk, experts = label.split(":")
    kind = op.removeprefix("deepep_")
    hidden = float(bpt) / (token_bytes(1, kind))  # the width whose DeepEP token carries bpt bytes
    ev = sim.collective(op, gpus, num_tokens=float(tokens), hidden=hidden, num_topk=int(topk),
                        num_experts=int(experts), mode=mode, name=op)
    out = sim.env.event()
    ev.callbacks.append(lambda e: out.succeed(SimpleNamespace(algo="deepep", proto=mode)))
    return out
