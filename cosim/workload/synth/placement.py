"""Where a synthetic step's rank groups sit on the topology: the checks folding and the expert dispatchers need.

Rank ``r`` of a synthetic step runs on ``topology.gpus[r]`` (host node, then local index; the replay maps it so,
:func:`cosim.replay.collective_map.gpu_of_rank`). A group's *shape* is the number of its GPUs on each host node and
in each NVLink domain (:func:`cosim.engine.moe_comm.nvlink_domain_map`), in order of first appearance: what a
collective's cost depends on besides the GPUs' own links (NCCL's rings and trees per node, DeepEP's per-node
forwarding, HybridEP's per-domain forwarding); its *fabric pattern* says which of its ranks share a NIC and which
a leaf switch (on a rail-optimized fabric: the rail, from the GPU's local index, and the scalable unit), which
decides the scale-out links its traffic loads (:meth:`Placement.fabric`). Folding (docs/SYNTHESIS.md, *Scale:
folding*) simulates the
groups of a stage's first ranks and lets them stand for the stage's other groups, which is exact only when
those are shaped and patterned alike: :func:`unlike_group` names the first one that is not, and synthesis then builds every
rank. :func:`check_dispatch` refuses a DeepEP or HybridEP EP group that the kernel itself cannot run (unequal
ranks per node / per NVLink domain), before anything is simulated.
"""

from __future__ import annotations

from typing import Any

from cosim.errors import CosimInputError
from cosim.workload.synth.layout import RankMap

__all__ = ["GROUP_KINDS", "Placement", "check_dispatch", "unlike_group"]

GROUP_KINDS = ("tp", "cp", "dp", "ep", "etp", "edp", "pp")
"""Rank groups whose collectives or transfers a folded step simulates for one member group only."""


def _counts(keys: list[int]) -> tuple[int, ...]:
    """How many of ``keys`` fall on each distinct value, in order of first appearance."""
    out: dict[int, int] = {}
    for k in keys:
        out[k] = out.get(k, 0) + 1
    return tuple(out.values())


class Placement:
    """Host node, NVLink domain and scale-out position (the NIC and the fabric switches that NIC is cabled to: on
    a rail-optimized fabric the rail and the leaf) of every rank of a synthetic step on ``topology``; built once per
    synthesis (O(links) for the NVLink domains, O(GPUs) for the rest) and shared by both checks."""

    def __init__(self, topology: Any) -> None:
        from cosim.engine.moe_comm import nvlink_domain_map

        self.gpus = topology.gpus
        dom = nvlink_domain_map(topology)
        self.node = [int(topology.node_of(g)) for g in self.gpus]
        self.domain = [dom.get(g, -1 - i) for i, g in enumerate(self.gpus)]
        nics = [_nic(topology, g) for g in self.gpus]
        self.nic = _ids(nics)
        leaf_of = {n: _leaf(topology, n) for n in set(nics)}
        self.leaf = _ids([leaf_of[n] for n in nics])

    def shape(self, ranks: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(GPUs per host node, GPUs per NVLink domain) of ``ranks``, each in order of first appearance."""
        return _counts([self.node[r] for r in ranks]), _counts([self.domain[r] for r in ranks])

    def fabric(self, ranks: list[int]) -> tuple[tuple[int, int], ...]:
        """Where ``ranks`` (in rank order) meet the scale-out fabric, up to renaming: per rank, the first-appearance
        index of its NIC and of its leaf switches among the group's. Two groups whose patterns are equal load their
        own NICs and leaves alike; unequal ones differ in which ranks share a NIC or a leaf (a group over the leaves
        of two scalable units where the other lies on one leaf per rail)."""
        nics: dict[int, int] = {}
        leaves: dict[int, int] = {}
        return tuple((nics.setdefault(self.nic[r], len(nics)), leaves.setdefault(self.leaf[r], len(leaves)))
                     for r in sorted(ranks))

    def leaves(self, ranks: list[int]) -> tuple[int, ...]:
        """GPUs of ``ranks`` per leaf switch (set of fabric switches their NICs are cabled to), in order of first
        appearance."""
        return _counts([self.leaf[r] for r in ranks])


def _ids(keys: list[Any]) -> list[int]:
    """``keys`` numbered by first appearance (equal keys, equal numbers)."""
    ids: dict[Any, int] = {}
    return [ids.setdefault(k, len(ids)) for k in keys]


def _nic(topology: Any, gpu: str) -> Any:
    """The NIC ``gpu``'s scale-out traffic leaves by (:meth:`cosim.topology.Topology.nic_of`), or a name of the GPU's
    own when it has none (a topology without NICs: no fabric position to tell apart)."""
    nic = topology.nic_of(gpu) if hasattr(topology, "nic_of") else None
    return nic if nic is not None else ("no-nic", gpu)


def _leaf(topology: Any, nic: Any) -> tuple[str, ...]:
    """The fabric switches ``nic`` is cabled to (its leaf; on a rail-optimized fabric the leaf of its rail and
    scalable unit); () for none."""
    g = topology.graph
    if not isinstance(nic, str) or nic not in g:
        return ()
    return tuple(sorted(v for v in g.successors(nic) if g.nodes[v].get("kind") == "fabric_switch"))


def _groups(rm: RankMap, kind: str) -> list[list[int]]:
    """The distinct groups ``kind`` of ``rm``, by their first member; O(world) group look-ups at most."""
    seen: set[int] = set()
    out = []
    for r in range(rm.world):
        if r not in seen:
            g = rm.group(kind, r)
            seen.update(g)
            out.append(g)
    return out


def _span(ranks: list[int]) -> str:
    """``ranks`` as ``a..b`` when consecutive, else the first few."""
    if ranks == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}..{ranks[-1]}"
    return ", ".join(map(str, ranks[:4])) + (", ..." if len(ranks) > 4 else "")


def unlike_group(rm: RankMap, where: Placement) -> str | None:
    """The first rank group placed unlike the group it would be folded onto (the same kind's group of its stage's
    first rank; for ``pp``, rank 0's), as a phrase; None when every group of every kind is shaped alike. O(world)."""
    stage = rm.world // rm.pp
    for kind in GROUP_KINDS:
        for g in _groups(rm, kind):
            ref = rm.group(kind, 0 if kind == "pp" else g[0] // stage * stage)
            a, b = where.shape(g), where.shape(ref)
            if a != b:
                what = "NVLink domains" if a[0] == b[0] else "host nodes"
                i = 1 if a[0] == b[0] else 0
                return (f"{kind} group of ranks {_span(g)} spans {what} of {'+'.join(map(str, a[i]))} GPUs where the "
                        f"simulated group of ranks {_span(ref)} spans {'+'.join(map(str, b[i]))}")
            if where.fabric(g) != where.fabric(ref):
                la, lb = where.leaves(g), where.leaves(ref)
                how = (f"leaf switches of {'+'.join(map(str, la))} GPUs where the simulated group of ranks "
                       f"{_span(ref)} reaches {'+'.join(map(str, lb))}" if la != lb else
                       f"NICs and leaf switches shared unlike those of the simulated group of ranks {_span(ref)}")
                return f"{kind} group of ranks {_span(g)} reaches the fabric through {how}"
    return None


def check_dispatch(rm: RankMap, where: Placement, dispatch: str) -> None:
    """Refuse (one-line :class:`CosimInputError` naming ``workload.synthetic.dispatch``) an EP group that
    ``dispatch`` cannot run: HybridEP needs the same number of ranks in every NVLink domain of the group
    (``cosim.engine.moe_comm.hybridep``), DeepEP the same number on every host node (``deepep``). Checked on every
    EP group, so a folded step (which simulates only the first of a stage) fails as the unfolded one does."""
    if dispatch not in ("hybridep", "deepep"):
        return
    i, unit = (1, "NVLink domain") if dispatch == "hybridep" else (0, "host node")
    for g in _groups(rm, "ep"):
        sizes = where.shape(g)[i]
        if len(set(sizes)) > 1:
            name = "HybridEP" if dispatch == "hybridep" else "DeepEP"
            raise CosimInputError(
                f"workload.synthetic.dispatch: {name} needs the same number of ranks in every {unit}: the EP group "
                f"of ranks {_span(g)} spans {len(sizes)} {unit}s of {'+'.join(map(str, sizes))} of its GPUs "
                f"(layout.ep {rm.ep} on {rm.world} GPUs, nodes: sets the GPUs); choose layout.ep and nodes so that "
                f"every EP group fills whole {unit}s or stays within one")
