"""The :class:`Topology` object: the graph plus routing and headline figures.

Routing is :class:`cosim.topology.routing.Router` (its rules: docs/TOPOLOGY.md, "Routing"), the one
router the engine's bare-graph stand-in uses too.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx

from cosim.catalog import Catalog
from cosim.catalog.models import CPU, NIC, Accelerator
from cosim.errors import CosimError

from .build import BuildResult
from .routing import Link, Router, iter_links, link_of, natural_key

__all__ = ["Link", "NoRouteError", "Topology", "natural_key"]

_NET = frozenset({"fabric_switch", "nic"})
_SCALE_UP = frozenset({"gpu", "nvswitch"})


class NoRouteError(CosimError, ValueError):
    """No path between two devices under the routing rules."""


class Topology:
    """A loaded topology: ``graph`` (networkx DiGraph, see :mod:`cosim.topology.build`),
    the ``catalog`` its specs come from (overrides applied), routing and figures.

    All bandwidths are raw bytes/s per direction; latencies seconds.
    """

    def __init__(self, result: BuildResult, source_file: Path | None = None) -> None:
        self.name: str = result.name
        self.source_file: Path | None = source_file
        self.catalog: Catalog = result.catalog
        self.graph: nx.DiGraph = result.graph
        self.description: str = result.description
        self.source: str | None = result.source
        self.notes: str = result.notes
        self.node_name: str | None = result.node_name
        """For a cluster: the name of its host-node topology."""
        self.fabric: dict[str, Any] | None = result.fabric
        """For a cluster: the fabric parameters as given (after defaults)."""
        self.is_cluster: bool = result.is_cluster
        g = self.graph
        self._kind = {n: a["kind"] for n, a in g.nodes(data=True)}
        self._node = {n: a["node"] for n, a in g.nodes(data=True)}
        self._gpus = sorted((n for n, k in self._kind.items() if k == "gpu"), key=lambda n: (self._node[n], g.nodes[n]["index"]))
        self._router = Router(g, self.nic_of)
        self._nic_of: dict[str, str | None] | None = None
        self._cpu_of: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"Topology({self.name!r}, nodes={self.nodes}, gpus={len(self._gpus)})"

    # --- devices -------------------------------------------------------------------------------

    @property
    def gpus(self) -> list[str]:
        """GPU ids in rank order: host node, then local index."""
        return list(self._gpus)

    @cached_property
    def nodes(self) -> int:
        """Number of host nodes (servers / compute trays)."""
        return len({n for n in self._node.values() if n >= 0})

    def node_of(self, dev: str) -> int:
        """Host-node index of ``dev`` (-1 for fabric / rack-level parts)."""
        return self._node[self._check(dev)]

    def kind_of(self, dev: str) -> str:
        """Device kind: gpu, cpu, pcie_switch, nvswitch, nic, fabric_switch or nvme."""
        return self._kind[self._check(dev)]

    @cached_property
    def gpus_per_node(self) -> int:
        """GPUs of the first GPU's host node (0 without GPUs): the node size ``nodes:`` scales a preset by."""
        return len(self.gpus_on(self._node[self._gpus[0]])) if self._gpus else 0

    def gpus_on(self, node: int) -> list[str]:
        """GPUs of host node ``node`` in local index order (O(GPUs on it): per-GPU figures call it per GPU)."""
        return list(self._gpus_by_node.get(node, ()))

    @cached_property
    def _gpus_by_node(self) -> dict[int, list[str]]:
        by: dict[int, list[str]] = {}
        for g in self._gpus:
            by.setdefault(self._node[g], []).append(g)
        return by

    def devices(self, kind: str | None = None, node: int | None = None) -> list[str]:
        """Device ids, optionally of one kind and/or on one host node, in (node, kind index) order."""
        if kind is not None and node is not None:  # per GPU in cpu_of: an index, not a scan of every device
            idx = self.__dict__.get("_by_kind_node")
            if idx is None or idx[0] != self.graph.number_of_nodes():
                by: dict[tuple[str, Any], list[str]] = {}
                for n in self.graph:
                    by.setdefault((self._kind[n], self._node[n]), []).append(n)
                idx = self.__dict__["_by_kind_node"] = (self.graph.number_of_nodes(), by)
            out = list(idx[1].get((kind, node), []))
            return sorted(out, key=lambda n: (self._node[n], self._kind[n], self.graph.nodes[n]["index"]))
        out = [n for n in self.graph if (kind is None or self._kind[n] == kind) and (node is None or self._node[n] == node)]
        return sorted(out, key=lambda n: (self._node[n], self._kind[n], self.graph.nodes[n]["index"]))

    def _check(self, dev: str) -> str:
        if dev not in self.graph:
            raise KeyError(f"{self.name}: no device {dev!r}")
        return dev

    def _spec(self, dev: str, kind: str) -> str:
        if self.kind_of(dev) != kind:
            raise KeyError(f"{dev!r} is a {self._kind[dev]}, not a {kind}")
        return self.graph.nodes[dev]["spec"]

    def accelerator(self, gpu: str) -> Accelerator:
        """Catalog entry of ``gpu``."""
        return self.catalog.accelerators[self._spec(gpu, "gpu")]

    def cpu_spec(self, cpu: str) -> CPU:
        """Catalog entry of CPU socket ``cpu``."""
        return self.catalog.cpus[self._spec(cpu, "cpu")]

    def nic_spec(self, nic: str) -> NIC:
        """Catalog entry of ``nic``."""
        return self.catalog.nics[self._spec(nic, "nic")]

    def has_nvswitch(self, node: int = 0) -> bool:
        """True if the GPUs of host node ``node`` attach to an NVSwitch (on the node or rack-level)."""
        return any(self._kind[v] == "nvswitch" for gpu in self.gpus_on(node) for v in self.graph.successors(gpu))

    # --- routing (the rules: :mod:`cosim.topology.routing`) --------------------------------------

    def paths(self, src: str, dst: str) -> list[list[str]]:
        """All equal-cost shortest paths from ``src`` to ``dst`` (ECMP), in a fixed order.

        Empty when the routing rules allow no path.
        """
        self._check(src)
        self._check(dst)
        return self._router.paths(src, dst)

    def route(self, src: str, dst: str, key: int = 0) -> list[str]:
        """One ECMP path: ``paths(src, dst)[key % len(paths)]``.

        Raises:
            NoRouteError: when there is no path.
        """
        ps = self.paths(src, dst)
        if not ps:
            raise NoRouteError(f"{self.name}: no route from {src!r} to {dst!r}")
        return ps[key % len(ps)]

    def path_bandwidth(self, path: list[str]) -> float:
        """Raw bottleneck bandwidth of ``path`` (bytes/s per direction)."""
        return self._router.bottleneck(path)

    def path_latency(self, path: list[str]) -> float:
        """Sum of link latencies along ``path`` (seconds)."""
        return sum(self.graph.edges[a, b]["latency"] for a, b in itertools.pairwise(path))

    def link(self, src: str, dst: str) -> Link:
        """The directed link ``src -> dst`` (bandwidth bytes/s per direction, latency s, kind: link type)."""
        return link_of(self.graph, src, dst)

    def links(self) -> Iterator[Link]:
        """Every directed link of the graph, in the graph's edge order."""
        return iter_links(self.graph)

    # --- affinity ------------------------------------------------------------------------------

    def _has_network(self, nic: str) -> bool:
        return any(self._kind[v] in _NET for v in self.graph.successors(nic))

    def _assign_nics(self) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        for node in sorted({self._node[g] for g in self._gpus}):
            nics = self.devices("nic", node)
            if any(self._has_network(n) for n in nics):
                nics = [n for n in nics if self._has_network(n)]
            load: Counter[str] = Counter()
            for gpu in self.gpus_on(node):
                if not nics:
                    out[gpu] = None
                    continue
                switches = [v for v in self.graph.successors(gpu) if self._kind[v] == "pcie_switch"]
                cands = sorted({v for s in switches for v in self.graph.successors(s) if v in nics}, key=natural_key)
                if not cands:
                    dist = {}
                    for nic in nics:
                        ps = self._router.local_paths(gpu, nic)
                        if ps:
                            dist[nic] = len(ps[0])
                    if dist:
                        best = min(dist.values())
                        cands = sorted((n for n, d in dist.items() if d == best), key=natural_key)
                if not cands:
                    out[gpu] = None
                    continue
                pick = min(cands, key=lambda n: (load[n], natural_key(n)))
                load[pick] += 1
                out[gpu] = pick
        return out

    def nic_of(self, gpu: str) -> str | None:
        """The GPU's rail NIC: one on the same PCIe switch, else the nearest; NICs shared by
        GPUs are spread evenly (in rank order). None if the node has no NIC."""
        if self.kind_of(gpu) != "gpu":
            raise KeyError(f"{gpu!r} is not a gpu")
        if self._nic_of is None:
            self._nic_of = self._assign_nics()
        return self._nic_of[gpu]

    def cpu_of(self, gpu: str) -> str:
        """The CPU socket whose root port the GPU hangs off (the nearest over PCIe / C2C)."""
        self._check(gpu)
        if gpu not in self._cpu_of:
            best: tuple[int, tuple[Any, ...]] | None = None
            pick = None
            for cpu in self.devices("cpu", self._node[gpu]):
                ps = self._router.local_paths(gpu, cpu)
                if ps:
                    key = (len(ps[0]), natural_key(cpu))
                    if best is None or key < best:
                        best, pick = key, cpu
            if pick is None:
                raise NoRouteError(f"{self.name}: {gpu!r} reaches no CPU")
            self._cpu_of[gpu] = pick
        return self._cpu_of[gpu]

    # --- figures -------------------------------------------------------------------------------

    def scale_up_bandwidth(self, gpu: str) -> float:
        """Raw bytes/s per direction of the GPU's scale-up ports (edges to GPUs / NVSwitches)."""
        return sum(e["bandwidth"] for _, v, e in self.graph.out_edges(gpu, data=True) if self._kind[v] in _SCALE_UP)

    def scale_out_bandwidth(self, gpu: str) -> float:
        """Raw bytes/s per direction of the GPU's NIC (line rate, capped by its host link),
        divided by the number of GPUs that share that NIC; 0 without a NIC."""
        nic = self.nic_of(gpu)
        if nic is None:
            return 0.0
        sharers = sum(1 for g in self.gpus_on(self._node[gpu]) if self.nic_of(g) == nic)
        return self._nic_rate(nic) / max(1, sharers)

    def _nic_rate(self, nic: str) -> float:
        """Raw bytes/s per direction of ``nic``: its line rate (its network links, else its catalog ports),
        capped by its host link."""
        net = sum(e["bandwidth"] for _, v, e in self.graph.out_edges(nic, data=True) if self._kind[v] in _NET)
        if net == 0.0:
            spec = self.nic_spec(nic)
            net = spec.bandwidth * spec.ports
        host = sum(e["bandwidth"] for _, v, e in self.graph.out_edges(nic, data=True) if self._kind[v] not in _NET)
        return min(net, host if host > 0 else net)

    def _min_scale_out_bandwidth(self) -> float:
        """``min(scale_out_bandwidth(g))`` over the GPUs, each NIC's figure computed once (its sharers counted once
        per node, not once per GPU: O(GPUs), where per GPU it is O(GPUs x GPUs per node))."""
        sharers = Counter((self._node[g], self.nic_of(g)) for g in self._gpus)
        return min((0.0 if nic is None else self._nic_rate(nic) / n for (_, nic), n in sharers.items()), default=0.0)

    def host_bandwidth(self, gpu: str) -> float:
        """Raw bottleneck bytes/s per direction from the GPU to its CPU socket (one GPU alone)."""
        return self.path_bandwidth(self.route(gpu, self.cpu_of(gpu)))

    _SPARSE_FLOW_EDGES = 4096
    """From this many edges on, :meth:`_max_flows` uses scipy's compiled max-flow (importing ``scipy.sparse`` costs
    ~0.2 s, more than networkx's flow on smaller graphs); below, networkx's."""

    def _max_flows(self, g: nx.DiGraph, splits: list[tuple[list[str], list[str]]]) -> list[float]:
        """Max-flow values (bytes/s) from GPUs ``a`` to GPUs ``b`` over ``g``'s ``bandwidth`` capacities, per
        ``(a, b)`` of ``splits`` (``g``'s edges read once for all)."""
        if g.number_of_edges() >= self._SPARSE_FLOW_EDGES:
            net = _flow_net(g)
            got = [_sparse_max_flow(g, a, b, net) for a, b in splits]
            return [v if v is not None else self._nx_max_flow(g, a, b) for v, (a, b) in zip(got, splits)]
        return [self._nx_max_flow(g, a, b) for a, b in splits]

    @staticmethod
    def _nx_max_flow(g: nx.DiGraph, a: list[str], b: list[str]) -> float:
        h = nx.DiGraph(g)
        h.add_node("__src")
        h.add_node("__dst")
        for x in a:
            h.add_edge("__src", x)  # no capacity attribute: infinite
        for x in b:
            h.add_edge(x, "__dst")
        return float(nx.maximum_flow_value(h, "__src", "__dst", capacity="bandwidth"))

    def bisection_bandwidth(self) -> float:
        """Per-direction bisection (bytes/s): the smaller max-flow from one half of the GPUs to
        the other over two splits (contiguous halves, and even/odd). Multi-node: halves of the
        host nodes over the whole graph. Single node: halves of the GPUs over the scale-up
        network (NVLink/NVSwitch), or the whole node when the GPUs have no scale-up links."""
        gpus = self._gpus
        if len(gpus) < 2:
            return 0.0
        if self.nodes > 1:
            n = self.nodes
            half = n // 2
            order = list(range(n))
            node_splits = [(order[:half], order[n - half:]), (order[0::2][:half], order[1::2][:half])]
            graph = self.graph
            splits = []
            for a_nodes, b_nodes in node_splits:
                a = [g for g in gpus if self._node[g] in set(a_nodes)]
                b = [g for g in gpus if self._node[g] in set(b_nodes)]
                splits.append((a, b))
            return min(self._max_flows(graph, splits))
        k = self._kind
        if any(self.scale_up_bandwidth(g) > 0 for g in gpus):
            graph = nx.subgraph_view(self.graph, filter_node=lambda x: k[x] in _SCALE_UP)
        else:
            graph = self.graph
        half = len(gpus) // 2
        splits = [(gpus[:half], gpus[len(gpus) - half:]), (gpus[0::2][:half], gpus[1::2][:half])]
        return min(self._max_flows(graph, splits))

    def nvlink_domain_size(self) -> int:
        """GPUs reachable from the first GPU over scale-up links (multi-hop allowed)."""
        if not self._gpus:
            return 0
        k = self._kind
        view = nx.subgraph_view(self.graph, filter_node=lambda x: k[x] in _SCALE_UP,
                                filter_edge=lambda u, v: True)
        comp = nx.node_connected_component(view.to_undirected(as_view=True), self._gpus[0])
        return sum(1 for x in comp if k[x] == "gpu")

    def link_counts(self) -> dict[str, int]:
        """Physical links per catalog link type (each cable counted once, times its ``count``): O(edges), one
        :func:`natural_key` per device (not two per edge)."""
        keys = {n: natural_key(n) for n in self.graph.nodes}
        order = {k: i for i, k in enumerate(sorted(set(keys.values())))}  # equal keys, equal ranks: as ``<`` on the keys
        rank = {n: order[k] for n, k in keys.items()}
        out: Counter[str] = Counter()
        for a, b, e in self.graph.edges(data=True):
            if rank[a] < rank[b]:
                out[e["link"]] += e["count"]
        return dict(sorted(out.items()))

    def node_classes(self) -> dict[int, int]:
        """Host node -> the first host node identical to it for routing inside the node (the same devices
        with the same kind, spec and index, the same edges between them with the same bandwidth, latency and
        link type; names compared without the ``node<k>.`` prefix): figures that depend only on a node's
        inside are computed once per class. O(devices + edges)."""
        g = self.graph
        loc: dict[str, str] = {}
        for n, k in self._node.items():
            pre = f"node{k}."
            loc[n] = n[len(pre):] if k >= 0 and n.startswith(pre) else n
        sig: dict[int, list[Any]] = {}
        for n, a in g.nodes(data=True):
            k = self._node[n]
            if k >= 0:
                sig.setdefault(k, []).append((loc[n], a.get("kind"), str(a.get("spec")), a.get("index")))
        for u, v, e in g.edges(data=True):
            k = self._node[u]
            if k >= 0 and self._node[v] == k:
                sig[k].append((loc[u], loc[v], e.get("bandwidth"), e.get("latency"), e.get("link")))
        first: dict[tuple[Any, ...], int] = {}
        out: dict[int, int] = {}
        for k in sorted(sig):
            out[k] = first.setdefault(tuple(sig[k]), k)  # (the graph lists every node's devices and edges in one order)
        return out

    def _min_host_bandwidth(self) -> float:
        """``min(host_bandwidth(g))`` over the GPUs, over one node of each :meth:`node_classes` class (a GPU's
        route to its CPU stays inside its node: PCIe switches and CPUs; the same figures on identical nodes)."""
        classes = self.node_classes()
        return min((self.host_bandwidth(g) for g in self._gpus if classes.get(self._node[g], self._node[g]) == self._node[g]),
                   default=0.0)

    def device_counts(self) -> dict[str, int]:
        """Devices per kind."""
        return dict(sorted(Counter(self._kind.values()).items()))

    @cached_property
    def _figures(self) -> dict[str, Any]:
        gpus = self._gpus
        figs: dict[str, Any] = {
            "name": self.name,
            "nodes": self.nodes,
            "gpus": len(gpus),
            "gpus_per_node": self.gpus_per_node,
            "devices": self.device_counts(),
            "links": self.link_counts(),
            "per_gpu_scale_up_bw_Bps": min((self.scale_up_bandwidth(g) for g in gpus), default=0.0),
            "per_gpu_scale_out_bw_Bps": self._min_scale_out_bandwidth(),
            "per_gpu_host_bw_Bps": self._min_host_bandwidth(),
            "bisection_bw_Bps": self.bisection_bandwidth(),
            "nvlink_domain_gpus": self.nvlink_domain_size(),
        }
        return figs

    def figures(self) -> dict[str, Any]:
        """Headline figures (raw bytes/s per direction; definitions in docs/TOPOLOGY.md):

        gpus, nodes, gpus_per_node, devices (count per kind), links (physical links per
        type), per_gpu_scale_up_bw_Bps, per_gpu_scale_out_bw_Bps, per_gpu_host_bw_Bps,
        bisection_bw_Bps, nvlink_domain_gpus. Per-GPU figures are the minimum over GPUs.
        """
        import copy

        return copy.deepcopy(self._figures)


def _flow_net(g: nx.DiGraph) -> tuple[dict[Any, int], list[int], list[int], list[int], int] | None:
    """``g``'s edges for :func:`_sparse_max_flow`: (node index, sources, destinations, capacities divided by their
    greatest common divisor, that divisor); None when a capacity is not a whole number of bytes/s."""
    import math

    idx = {x: i for i, x in enumerate(g.nodes)}
    src, dst, cap = [], [], []
    for u, nbrs in g.adj.items():  # the edges in ``g.edges`` order, without its per-edge generator
        iu = idx[u]
        for v, e in nbrs.items():
            bw = e.get("bandwidth")
            if bw is None or not math.isfinite(bw) or bw < 0 or bw != int(bw):
                return None
            src.append(iu)
            dst.append(idx[v])
            cap.append(int(bw))
    div = 0
    for c in cap:
        div = math.gcd(div, c)
    return idx, src, dst, [c // div for c in cap] if div else cap, div


def _sparse_max_flow(g: nx.DiGraph, a: list[str], b: list[str],
                     net: tuple[dict[Any, int], list[int], list[int], list[int], int] | None = None) -> float | None:
    """The max-flow value from ``a`` to ``b`` by scipy's Dinic (``scipy.sparse.csgraph.maximum_flow``, compiled):
    exact, on integer capacities: every ``bandwidth`` divided by their greatest common divisor. None (use networkx)
    when a capacity is not a whole number of bytes/s or the scaled ones could overflow 32-bit integers. The two agree
    exactly: every partial sum of whole-number capacities is exact in floating point below 2**53
    (tests/test_topology_flow.py checks them against each other). ``net`` is :func:`_flow_net` of ``g`` where the
    caller flows over the same graph more than once."""
    import numpy as np

    got = net if net is not None else _flow_net(g)
    if got is None:
        return None
    idx, src0, dst0, scaled0, div = got
    if div == 0:
        return 0.0
    big = sum(scaled0) + 1  # stands for the unbounded source and sink edges
    if big >= 2**31 - 1:
        return None
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_flow

    n = len(idx)
    s, t = n, n + 1
    src = src0 + [s] * len(a) + [idx[x] for x in b]
    dst = dst0 + [idx[x] for x in a] + [t] * len(b)
    scaled = scaled0 + [big] * (len(a) + len(b))
    m = csr_matrix((np.asarray(scaled, dtype=np.int32), (np.asarray(src), np.asarray(dst))), shape=(n + 2, n + 2))
    return float(int(maximum_flow(m, s, t).flow_value) * div)
