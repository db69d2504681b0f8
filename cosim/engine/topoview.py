"""What the engine needs from a topology, and a stand-in built from a bare graph.

The engine talks to a topology only through the typed protocol
:class:`TopologyLike` (the same names as :class:`cosim.topology.Topology`): devices
by kind and host node, routes from the one router (:mod:`cosim.topology.routing`),
and typed links (:class:`cosim.topology.routing.Link`: ``bandwidth`` bytes/s per
direction, ``latency`` s, ``efficiency``, ``kind``). :class:`GraphTopology`
implements it on a plain ``nx.DiGraph`` whose nodes carry ``kind`` / ``node`` /
``spec`` and whose directed edges carry ``bandwidth``, ``efficiency`` and
``latency``. It serves tests, benchmarks and validation cases that describe a
machine inline. Hardware specs it cannot look up come back as ``None``; the
engine then uses its config defaults.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import networkx as nx

from cosim.topology.routing import Link, Router, iter_links, link_of

__all__ = ["GraphTopology", "TopologyLike", "add_link", "gpu_sort_key"]


@runtime_checkable
class TopologyLike(Protocol):
    """The subset of :class:`cosim.topology.Topology` the engine uses."""

    graph: nx.DiGraph
    """The device graph (read by the flow network; prefer the typed methods below)."""

    @property
    def gpus(self) -> list[str]: ...

    def kind_of(self, dev: str) -> str: ...

    def paths(self, src: str, dst: str) -> list[list[str]]: ...

    def link(self, src: str, dst: str) -> Link: ...

    def links(self) -> Iterator[Link]: ...

    def nic_of(self, gpu: str) -> str | None: ...

    def cpu_of(self, gpu: str) -> str: ...

    def node_of(self, dev: str) -> int: ...

    def has_nvswitch(self, node: int = 0) -> bool: ...


def gpu_sort_key(name: str) -> tuple[Any, ...]:
    """Natural sort: node3.gpu10 after node3.gpu9, node10 after node9."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name))


def add_link(
    g: nx.DiGraph, a: str, b: str, bandwidth: float, *, latency: float = 0.0, efficiency: float = 1.0,
    link: str = "custom", count: int = 1,
) -> None:
    """Add a bidirectional link as two directed edges (``bandwidth`` per direction, bytes/s)."""
    for u, v in ((a, b), (b, a)):
        g.add_edge(u, v, link=link, count=count, bandwidth=float(bandwidth), efficiency=float(efficiency),
                   latency=float(latency))


class GraphTopology:
    """A :class:`TopologyLike` over a bare graph (no catalog)."""

    def __init__(self, graph: nx.DiGraph, name: str = "graph", catalog: Any = None) -> None:
        self.graph = graph
        self.name = name
        self.catalog = catalog
        self._gpus = sorted((n for n, d in graph.nodes(data=True) if d.get("kind") == "gpu"), key=gpu_sort_key)
        self._router = Router(graph, self.nic_of)

    @property
    def gpus(self) -> list[str]:
        return list(self._gpus)

    @property
    def nodes(self) -> int:
        return len({self.node_of(g) for g in self._gpus})

    def gpus_on(self, node: int) -> list[str]:
        return [g for g in self._gpus if self.node_of(g) == node]

    def node_of(self, dev: str) -> int:
        return int(self.graph.nodes[dev].get("node", 0))

    def kind_of(self, dev: str) -> str:
        return str(self.graph.nodes[dev].get("kind", ""))

    def link(self, src: str, dst: str) -> Link:
        """The directed link ``src -> dst`` (typed)."""
        return link_of(self.graph, src, dst)

    def links(self) -> Iterator[Link]:
        """Every directed link, in the graph's edge order."""
        return iter_links(self.graph)

    def paths(self, src: str, dst: str) -> list[list[str]]:
        """Equal-cost paths under the routing rules of :class:`cosim.topology.routing.Router` (the one router)."""
        for n in (src, dst):
            if n not in self.graph:
                raise ValueError(f"unknown device {n!r}")
        return self._router.paths(src, dst)

    def route(self, src: str, dst: str, key: int = 0) -> list[str]:
        ps = self.paths(src, dst)
        if not ps:
            raise ValueError(f"no path from {src} to {dst}")
        return ps[key % len(ps)]

    def _neighbors_of_kind(self, dev: str, kind: str) -> list[str]:
        best: list[str] = []
        lengths = nx.single_source_shortest_path_length(self.graph, dev)
        cands = sorted((lengths[n], n) for n in lengths if self.graph.nodes[n].get("kind") == kind
                       and self.node_of(n) == self.node_of(dev))
        if cands:
            dmin = cands[0][0]
            best = [n for d, n in cands if d == dmin]
        return best

    def nic_of(self, gpu: str) -> str | None:
        nics = self._neighbors_of_kind(gpu, "nic")
        return nics[0] if nics else None

    def cpu_of(self, gpu: str) -> str:
        cpus = self._neighbors_of_kind(gpu, "cpu")
        if not cpus:
            raise ValueError(f"{gpu} has no CPU in its node")
        return cpus[0]

    def has_nvswitch(self, node: int = 0) -> bool:
        return any(d.get("kind") == "nvswitch" and int(d.get("node", 0)) == node for _, d in self.graph.nodes(data=True))

    def accelerator(self, gpu: str) -> Any:
        return None

    def cpu_spec(self, cpu: str) -> Any:
        return None

    def nic_spec(self, nic: str) -> Any:
        return None


def nvswitch_node(
    n_gpus: int, *, nvlink_bw: float, pcie_bw: float = 64e9, latency: float = 0.0, prefix: str = "",
    node: int = 0, planes: int = 1, g: nx.DiGraph | None = None, nic_bw: float | None = None,
) -> nx.DiGraph:
    """A node of ``n_gpus`` GPUs on ``planes`` NVSwitch chips (``nvlink_bw`` per GPU in total),
    each GPU behind its own PCIe switch to one CPU, optionally with one NIC per PCIe switch."""
    g = g if g is not None else nx.DiGraph()
    cpu = f"{prefix}cpu0"
    g.add_node(cpu, kind="cpu", node=node, spec=None, index=0)
    for s in range(planes):
        g.add_node(f"{prefix}nvswitch{s}", kind="nvswitch", node=node, spec=None, index=s)
    for i in range(n_gpus):
        gpu, sw = f"{prefix}gpu{i}", f"{prefix}pcie{i}"
        g.add_node(gpu, kind="gpu", node=node, spec=None, index=i)
        g.add_node(sw, kind="pcie_switch", node=node, spec=None, index=i)
        add_link(g, gpu, sw, pcie_bw, latency=latency, link="pcie")
        add_link(g, sw, cpu, pcie_bw, latency=latency, link="pcie")
        for s in range(planes):
            add_link(g, gpu, f"{prefix}nvswitch{s}", nvlink_bw / planes, latency=latency, link="nvlink")
        if nic_bw is not None:
            nic = f"{prefix}nic{i}"
            g.add_node(nic, kind="nic", node=node, spec=None, index=i)
            add_link(g, sw, nic, pcie_bw, latency=latency, link="pcie")
    return g


def cluster(
    n_nodes: int, gpus_per_node: int, *, nvlink_bw: float, nic_bw: float, pcie_bw: float = 64e9,
    leaf_radix: int | None = None, latency: float = 0.0, planes: int = 1,
) -> nx.DiGraph:
    """Rail-optimized cluster: node ``k`` is ``node{k}.*``; NIC ``i`` of every node
    goes to leaf switch ``fabric.leaf{i}`` (one rail per GPU index); leaves of
    different rails meet at ``fabric.spine0``. ``leaf_radix`` is unused (one
    leaf per rail)."""
    g = nx.DiGraph()
    for k in range(n_nodes):
        nvswitch_node(gpus_per_node, nvlink_bw=nvlink_bw, pcie_bw=pcie_bw, latency=latency, prefix=f"node{k}.",
                      node=k, planes=planes, g=g, nic_bw=nic_bw)
    g.add_node("fabric.spine0", kind="fabric_switch", node=-1, spec=None, index=0)
    for i in range(gpus_per_node):
        leaf = f"fabric.leaf{i}"
        g.add_node(leaf, kind="fabric_switch", node=-1, spec=None, index=i)
        add_link(g, leaf, "fabric.spine0", nic_bw * n_nodes, latency=latency, link="ib")
        for k in range(n_nodes):
            add_link(g, f"node{k}.nic{i}", leaf, nic_bw, latency=latency, link="ib")
    return g


def ring_order(ranks: Sequence[str]) -> list[str]:
    """Ranks in natural order (helper for tests)."""
    return sorted(ranks, key=gpu_sort_key)


class ClusterRouter:
    """Fast equal-cost paths on multi-node topologies (``node<k>.`` / ``fabric.`` ids).

    * Inside a node: the topology's paths between the same local devices of
      the first node, with the node prefix substituted (nodes are replicas).
    * Between nodes (GPU to GPU): up-segment GPU -> its NIC -> the NIC's fabric
      switch (the topology's own GPU-to-NIC path), the paths between the two
      fabric switches inside the fabric (the one router's rules,
      :meth:`cosim.topology.routing.Router.fabric_paths`), and the down-segment.
      Equal to the topology's routing on rail-optimized presets (no PXN);
      tests compare both on sample pairs.
    * Anything else: the topology's ``paths``.
    """

    def __init__(self, topo: TopologyLike) -> None:
        self.topo = topo
        g = topo.graph
        self._fab = g.subgraph([n for n, d in g.nodes(data=True) if d.get("kind") == "fabric_switch"])
        self._intra: dict[tuple[str, str], list[list[str]]] = {}
        self._up: dict[str, list[str] | None] = {}
        self._nvsw: dict[str, frozenset[str]] = {}
        self._mid: dict[tuple[str, str], list[list[str]]] = {}
        self._fab_copy: nx.DiGraph | None = None
        self._router = Router(g, topo.nic_of)  # the fabric segment under the one router's rules
        self._node_of: dict[str, int] = {}
        gpus = topo.gpus
        self._first: dict[int, str] = {}
        for gp in gpus:
            k = topo.node_of(gp)
            self._first.setdefault(k, gp.split(".", 1)[0] + "." if "." in gp else "")

    def _node(self, dev: str) -> int:
        k = self._node_of.get(dev)
        if k is None:
            k = self._node_of[dev] = int(self.topo.node_of(dev))
        return k

    def _switches(self, gpu: str) -> frozenset[str]:
        """The NVSwitches ``gpu`` links to (a multi-node NVLink domain's are shared by its hosts)."""
        hit = self._nvsw.get(gpu)
        if hit is None:
            g = self.topo.graph
            hit = self._nvsw[gpu] = frozenset(v for v in g.successors(gpu) if g.nodes[v].get("kind") == "nvswitch")
        return hit

    def _upseg(self, gpu: str) -> list[str] | None:
        if gpu not in self._up:
            seg = None
            nic = self.topo.nic_of(gpu)
            if nic is not None:
                leaves = sorted(n for n in self.topo.graph.successors(nic) if n in self._fab)
                if leaves:
                    seg = [*self.topo.paths(gpu, nic)[0], leaves[0]]
            self._up[gpu] = seg
        return self._up[gpu]

    def __call__(self, src: str, dst: str) -> list[list[str]]:
        ns, nd = self._node(src), self._node(dst)
        if ns == nd and ns >= 0 and "." in src and "." in dst:
            pre = src.split(".", 1)[0] + "."
            if dst.startswith(pre) and pre.startswith("node"):
                a, b = src[len(pre):], dst[len(pre):]
                key = (a, b)
                if key not in self._intra:
                    self._intra[key] = [list(p) for p in self.topo.paths("node0." + a, "node0." + b)] \
                        if self._has("node0." + a) and self._has("node0." + b) else []
                base = self._intra[key]
                if base:
                    out = [[pre + n[6:] if n.startswith("node0.") else n for n in p] for p in base]
                    # node 0's route leaving the node (a rack's shared NVSwitch) holds only for nodes on that device
                    if all(n.startswith("node0.") for p in base for n in p) or all(
                            self.topo.graph.has_edge(u, v) for p in out for u, v in itertools.pairwise(p)):
                        return out
            return self.topo.paths(src, dst)
        g = self.topo.graph
        if ns != nd and g.nodes[src].get("kind") == "gpu" and g.nodes[dst].get("kind") == "gpu":
            if self._switches(src) & self._switches(dst):  # one NVLink domain across hosts (NVL72): scale-up
                return self.topo.paths(src, dst)
            up, down = self._upseg(src), self._upseg(dst)
            if up is not None and down is not None:
                la, lb = up[-1], down[-1]
                mids = self.mid_paths(la, lb)
                tail = list(reversed(down))
                return [up[:-1] + m + tail[1:] for m in mids]
        return self.topo.paths(src, dst)

    def node(self, dev: str) -> int:
        """Node index of a device (-1: fabric) for the split routes of :meth:`cosim.engine.flows.Fabric.route_segments`;
        a GPU on an NVLink switch that several hosts share (an NVL72 rack) gets that NVLink domain's id
        (1,000,000 + the switch's index), so that routes between the hosts of one rack stay on NVLink."""
        g = self.topo.graph
        if dev in g and g.nodes[dev].get("kind") == "gpu":
            shared = sorted(v for v in self._switches(dev) if int(g.nodes[v].get("node", -1)) < 0)
            if shared:
                return 1_000_000 + int(g.nodes[shared[0]].get("index", 0))
        return self._node(dev)

    def up_path(self, gpu: str) -> list[str] | None:
        """GPU -> its NIC -> the NIC's first fabric switch (None: not a networked GPU)."""
        if gpu not in self.topo.graph or self.topo.graph.nodes[gpu].get("kind") != "gpu":
            return None
        return self._upseg(gpu)

    def mid_paths(self, la: str, lb: str) -> list[list[str]]:
        """Equal-cost paths between two fabric switches inside the fabric (the one router's rules, natural order)."""
        mids = self._mid.get((la, lb))
        if mids is None:
            if la == lb or la not in self._fab or lb not in self._fab:
                mids = self._router.fabric_paths(la, lb)
            else:  # the router's fabric view between two fabric switches is the fabric subgraph: search a copy
                if self._fab_copy is None:
                    self._fab_copy = nx.DiGraph(self._fab)
                try:
                    ps = [list(p) for p in nx.all_shortest_paths(self._fab_copy, la, lb)]
                except nx.NetworkXNoPath:
                    ps = []
                mids = [list(p) for p in self._router._finish(ps)]
            self._mid[(la, lb)] = mids
        return mids

    def _has(self, n: str) -> bool:
        return n in self.topo.graph
