"""The one router of cosim: equal-cost paths between two devices of a topology graph.

Used by :class:`cosim.topology.Topology` and by the engine's stand-in for bare graphs
(:class:`cosim.engine.topoview.GraphTopology`), so a machine routes the same whichever way it was described.

The graph is a ``networkx.DiGraph``: every node has ``kind`` (gpu, cpu, pcie_switch, nvswitch, nic,
fabric_switch, nvme) and ``node`` (host-node index, -1 for fabric / rack-level parts); every directed
edge is a :class:`Link` (``bandwidth`` raw bytes/s per direction, ``latency`` s, ``link`` its type).

Rules (docs/TOPOLOGY.md, "Routing"): cost is hop count; among equal-hop paths only those with the
widest bottleneck (raw bytes/s per direction) are kept; the rest are the ECMP set, sorted in natural order.

1. GPU <-> GPU (or NVSwitch) over the scale-up network (NVLink / NVSwitch edges only; no GPU as an
   intermediate hop), when such a path exists.
2. Same host node otherwise: through PCIe switches and CPU sockets (root complex, UPI/xGMI,
   NVLink-C2C); never through a GPU, NIC or NVMe.
3. Different host nodes: device -> its NIC (``nic_of`` for a GPU, else the nearest NIC) -> fabric
   switches -> the peer's NIC -> device (GPUDirect RDMA).

Cost: each pair's paths are found once (breadth-first searches on filtered views, O(V + E) each) and cached.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import networkx as nx

__all__ = ["Link", "Router", "iter_links", "link_of", "natural_key"]

_SCALE_UP = frozenset({"gpu", "nvswitch"})
_LOCAL_TRANSIT = frozenset({"pcie_switch", "cpu"})


def natural_key(s: str) -> tuple[Any, ...]:
    """Sort key that orders "gpu2" before "gpu10"."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _path_key(p: list[str]) -> tuple[Any, ...]:
    return tuple(natural_key(n) for n in p)


@dataclass(frozen=True, slots=True)
class Link:
    """One directed link of a topology graph (an edge ``src -> dst``)."""

    src: str
    """Device the bytes leave."""
    dst: str
    """Device the bytes reach."""
    bandwidth: float
    """Raw bandwidth, bytes/s in this direction (all ``count`` parallel links together)."""
    latency: float = 0.0
    """Latency of the hop, s."""
    efficiency: float = 1.0
    """Fraction of ``bandwidth`` that transfers reach (0..1]."""
    kind: str = "custom"
    """Link type (a catalog link id such as ``nvlink4`` or ``pcie5x16``)."""
    count: int = 1
    """Parallel physical links this edge stands for."""


def link_of(graph: nx.DiGraph, src: str, dst: str) -> Link:
    """The typed :class:`Link` of edge ``src -> dst`` (ValueError when it has no bandwidth)."""
    d = graph.edges[src, dst]
    if "bandwidth" not in d:
        raise ValueError(f"edge {src}->{dst} has no bandwidth")
    return Link(src, dst, float(d["bandwidth"]), float(d.get("latency", 0.0)), float(d.get("efficiency", 1.0)),
                str(d.get("link", "custom")), int(d.get("count", 1)))


def iter_links(graph: nx.DiGraph) -> Iterator[Link]:
    """Every directed edge of ``graph`` as a :class:`Link`, in the graph's edge order."""
    for u, v in graph.edges():
        yield link_of(graph, u, v)


class Router:
    """Equal-cost paths of ``graph`` under the rules above, cached per (src, dst).

    Args:
        graph: the topology graph (node ``kind`` and ``node``; edge ``bandwidth``).
        nic_of: the NIC a GPU sends through to other host nodes (None: it has none).
    """

    def __init__(self, graph: nx.DiGraph, nic_of: Callable[[str], str | None]) -> None:
        self.graph = graph
        self.nic_of = nic_of
        self._kind: dict[str, str | None] = {n: a.get("kind") for n, a in graph.nodes(data=True)}
        self._node: dict[str, int] = {n: int(a.get("node", 0)) for n, a in graph.nodes(data=True)}
        self._nics: dict[int, list[str]] = {}
        for n, k in self._kind.items():
            if k == "nic":
                self._nics.setdefault(self._node[n], []).append(n)
        for v in self._nics.values():
            v.sort(key=natural_key)
        self._paths: dict[tuple[str, str], list[list[str]]] = {}

    def paths(self, src: str, dst: str) -> list[list[str]]:
        """All equal-cost paths from ``src`` to ``dst`` (ECMP), in natural order; empty when none is allowed."""
        key = (src, dst)
        if key not in self._paths:
            self._paths[key] = self._compute(src, dst)
        return [list(p) for p in self._paths[key]]

    def local_paths(self, src: str, dst: str) -> list[list[str]]:
        """Shortest paths inside one host node through PCIe switches and CPUs only (rule 2), unfiltered."""
        node = self._node[src] if self._node[src] >= 0 else self._node[dst]
        k, nd = self._kind, self._node
        view = self._view(
            src, dst,
            lambda n: nd[n] == node and k[n] in _LOCAL_TRANSIT,
            lambda u, v: not (k[u] in _SCALE_UP and k[v] in _SCALE_UP),
        )
        return self._shortest(view, src, dst)

    def fabric_paths(self, src: str, dst: str) -> list[list[str]]:
        """Equal-cost paths between two fabric switches (or NICs) inside the scale-out fabric, in natural order."""
        if src == dst:
            return [[src]]
        return [list(p) for p in self._finish(self._fabric_paths(src, dst))]

    def bottleneck(self, path: list[str]) -> float:
        """Raw bottleneck bandwidth of ``path`` (bytes/s per direction; inf for a single device)."""
        return min((float(self.graph.edges[a, b]["bandwidth"]) for a, b in itertools.pairwise(path)),
                   default=math.inf)

    def _view(self, src: str, dst: str, allow: Callable[[str], bool],
              edge_ok: Callable[[str, str], bool] | None = None) -> nx.DiGraph:
        ends = {src, dst}
        return nx.subgraph_view(
            self.graph,
            filter_node=lambda n: n in ends or allow(n),
            filter_edge=(lambda u, v: edge_ok(u, v)) if edge_ok else (lambda u, v: True),
        )

    @staticmethod
    def _shortest(view: nx.DiGraph, src: str, dst: str) -> list[list[str]]:
        try:
            return [list(p) for p in nx.all_shortest_paths(view, src, dst)]
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            return []

    def _scale_up_paths(self, src: str, dst: str) -> list[list[str]]:
        k = self._kind
        view = self._view(src, dst, lambda n: k[n] == "nvswitch", lambda u, v: k[u] in _SCALE_UP and k[v] in _SCALE_UP)
        return self._shortest(view, src, dst)

    def _fabric_paths(self, src: str, dst: str) -> list[list[str]]:
        k = self._kind
        return self._shortest(self._view(src, dst, lambda n: k[n] == "fabric_switch"), src, dst)

    def _exit_nic(self, dev: str) -> str | None:
        if self._kind[dev] == "nic":
            return dev
        if self._kind[dev] == "gpu":
            return self.nic_of(dev)
        best: tuple[int, tuple[Any, ...]] | None = None
        pick = None
        for nic in self._nics.get(self._node[dev], []):
            ps = self.local_paths(dev, nic)
            if ps:
                key = (len(ps[0]), natural_key(nic))
                if best is None or key < best:
                    best, pick = key, nic
        return pick

    def _finish(self, paths: list[list[str]]) -> list[list[str]]:
        if not paths:
            return []
        hops = min(len(p) for p in paths)
        paths = [p for p in paths if len(p) == hops]
        widest = max(self.bottleneck(p) for p in paths)
        paths = [p for p in paths if self.bottleneck(p) >= widest * (1 - 1e-12)]
        uniq = {tuple(p) for p in paths}
        return sorted((list(p) for p in uniq), key=_path_key)

    def _compute(self, src: str, dst: str) -> list[list[str]]:
        k, nd = self._kind, self._node
        if src == dst:
            return [[src]]
        if k[src] in _SCALE_UP and k[dst] in _SCALE_UP:
            p = self._scale_up_paths(src, dst)
            if p:
                return self._finish(p)
        ns, nt = nd[src], nd[dst]
        if ns >= 0 and ns == nt:
            return self._finish(self.local_paths(src, dst))
        if k[src] == "nvswitch" or k[dst] == "nvswitch":
            return []
        # across host nodes (or to/from the fabric): device -> NIC -> fabric -> NIC -> device
        s_nic = self._exit_nic(src) if ns >= 0 else src
        d_nic = self._exit_nic(dst) if nt >= 0 else dst
        if s_nic is None or d_nic is None:
            return []
        head = [[src]] if s_nic == src else self.local_paths(src, s_nic)
        mid = self._fabric_paths(s_nic, d_nic)
        tail = [[dst]] if d_nic == dst else self.local_paths(d_nic, dst)
        if not head or not mid or not tail:
            return []
        out = [h + m[1:] + t[1:] for h in self._finish(head) for m in self._finish(mid) for t in self._finish(tail)]
        return self._finish(out)
