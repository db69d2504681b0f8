"""The :class:`Topology` object: the graph plus routing and headline figures.

Routing rules (docs/TOPOLOGY.md, "Routing"): cost is hop count; among
equal-hop paths only those with the widest bottleneck (raw bytes/s per
direction) are kept; the rest are the ECMP set, sorted deterministically.

1. GPU <-> GPU (or NVSwitch) over the scale-up network (NVLink / NVSwitch
   edges only; no GPU as an intermediate hop), when such a path exists.
2. Same host node otherwise: through PCIe switches and CPU sockets (root
   complex, UPI/xGMI, NVLink-C2C); never through a GPU, NIC or NVMe.
3. Different host nodes: device -> its NIC (``nic_of`` for a GPU, else the
   nearest NIC) -> fabric switches -> the peer's NIC -> device (GPUDirect RDMA).
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from functools import cached_property
from pathlib import Path
from typing import Any

import networkx as nx

from cosim.catalog import Catalog
from cosim.catalog.models import CPU, NIC, Accelerator
from cosim.errors import CosimError

from .build import BuildResult

__all__ = ["NoRouteError", "Topology", "natural_key"]

_NET = frozenset({"fabric_switch", "nic"})
_SCALE_UP = frozenset({"gpu", "nvswitch"})
_LOCAL_TRANSIT = frozenset({"pcie_switch", "cpu"})


class NoRouteError(CosimError, ValueError):
    """No path between two devices under the routing rules."""


def natural_key(s: str) -> tuple[Any, ...]:
    """Sort key that orders "gpu2" before "gpu10"."""
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s))


def _path_key(p: list[str]) -> tuple[Any, ...]:
    return tuple(natural_key(n) for n in p)


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
        self._paths: dict[tuple[str, str], list[list[str]]] = {}
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

    def gpus_on(self, node: int) -> list[str]:
        """GPUs of host node ``node`` in local index order."""
        return [g for g in self._gpus if self._node[g] == node]

    def devices(self, kind: str | None = None, node: int | None = None) -> list[str]:
        """Device ids, optionally of one kind and/or on one host node, in (node, kind index) order."""
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

    # --- routing -------------------------------------------------------------------------------

    def _view(self, src: str, dst: str, allow: Any, edge_ok: Any = None) -> nx.DiGraph:
        ends = {src, dst}
        return nx.subgraph_view(
            self.graph,
            filter_node=lambda n: n in ends or allow(n),
            filter_edge=(lambda u, v: edge_ok(u, v)) if edge_ok else (lambda u, v: True),
        )

    def _shortest(self, view: nx.DiGraph, src: str, dst: str) -> list[list[str]]:
        try:
            return [list(p) for p in nx.all_shortest_paths(view, src, dst)]
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            return []

    def _scale_up_paths(self, src: str, dst: str) -> list[list[str]]:
        k = self._kind
        view = self._view(src, dst, lambda n: k[n] == "nvswitch", lambda u, v: k[u] in _SCALE_UP and k[v] in _SCALE_UP)
        return self._shortest(view, src, dst)

    def _local_paths(self, src: str, dst: str) -> list[list[str]]:
        node = self._node[src] if self._node[src] >= 0 else self._node[dst]
        k, nd = self._kind, self._node
        view = self._view(
            src, dst,
            lambda n: nd[n] == node and k[n] in _LOCAL_TRANSIT,
            lambda u, v: not (k[u] in _SCALE_UP and k[v] in _SCALE_UP),
        )
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
        for nic in self.devices("nic", self._node[dev]):
            ps = self._local_paths(dev, nic)
            if ps:
                key = (len(ps[0]), natural_key(nic))
                if best is None or key < best:
                    best, pick = key, nic
        return pick

    def _bottleneck(self, path: list[str]) -> float:
        return min((self.graph.edges[a, b]["bandwidth"] for a, b in itertools.pairwise(path)), default=math.inf)

    def _finish(self, paths: list[list[str]]) -> list[list[str]]:
        if not paths:
            return []
        hops = min(len(p) for p in paths)
        paths = [p for p in paths if len(p) == hops]
        widest = max(self._bottleneck(p) for p in paths)
        paths = [p for p in paths if self._bottleneck(p) >= widest * (1 - 1e-12)]
        uniq = {tuple(p) for p in paths}
        return sorted((list(p) for p in uniq), key=_path_key)

    def _compute_paths(self, src: str, dst: str) -> list[list[str]]:
        k, nd = self._kind, self._node
        if src == dst:
            return [[src]]
        if k[src] in _SCALE_UP and k[dst] in _SCALE_UP:
            p = self._scale_up_paths(src, dst)
            if p:
                return self._finish(p)
        ns, nt = nd[src], nd[dst]
        if ns >= 0 and ns == nt:
            return self._finish(self._local_paths(src, dst))
        if k[src] == "nvswitch" or k[dst] == "nvswitch":
            return []
        # across host nodes (or to/from the fabric): device -> NIC -> fabric -> NIC -> device
        s_nic = self._exit_nic(src) if ns >= 0 else src
        d_nic = self._exit_nic(dst) if nt >= 0 else dst
        if s_nic is None or d_nic is None:
            return []
        head = [[src]] if s_nic == src else self._local_paths(src, s_nic)
        mid = self._fabric_paths(s_nic, d_nic)
        tail = [[dst]] if d_nic == dst else self._local_paths(d_nic, dst)
        if not head or not mid or not tail:
            return []
        out = [h + m[1:] + t[1:] for h in self._finish(head) for m in self._finish(mid) for t in self._finish(tail)]
        return self._finish(out)

    def paths(self, src: str, dst: str) -> list[list[str]]:
        """All equal-cost shortest paths from ``src`` to ``dst`` (ECMP), in a fixed order.

        Empty when the routing rules allow no path.
        """
        self._check(src)
        self._check(dst)
        key = (src, dst)
        if key not in self._paths:
            self._paths[key] = self._compute_paths(src, dst)
        return [list(p) for p in self._paths[key]]

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
        return self._bottleneck(path)

    def path_latency(self, path: list[str]) -> float:
        """Sum of link latencies along ``path`` (seconds)."""
        return sum(self.graph.edges[a, b]["latency"] for a, b in itertools.pairwise(path))

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
                        ps = self._local_paths(gpu, nic)
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
                ps = self._local_paths(gpu, cpu)
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
        net = sum(e["bandwidth"] for _, v, e in self.graph.out_edges(nic, data=True) if self._kind[v] in _NET)
        if net == 0.0:
            spec = self.nic_spec(nic)
            net = spec.bandwidth * spec.ports
        host = sum(e["bandwidth"] for _, v, e in self.graph.out_edges(nic, data=True) if self._kind[v] not in _NET)
        sharers = sum(1 for g in self.gpus_on(self._node[gpu]) if self.nic_of(g) == nic)
        return min(net, host if host > 0 else net) / max(1, sharers)

    def host_bandwidth(self, gpu: str) -> float:
        """Raw bottleneck bytes/s per direction from the GPU to its CPU socket (one GPU alone)."""
        return self.path_bandwidth(self.route(gpu, self.cpu_of(gpu)))

    def _max_flow(self, g: nx.DiGraph, a: list[str], b: list[str]) -> float:
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
            splits = [(order[:half], order[n - half:]), (order[0::2][:half], order[1::2][:half])]
            graph = self.graph
            cuts = []
            for a_nodes, b_nodes in splits:
                a = [g for g in gpus if self._node[g] in set(a_nodes)]
                b = [g for g in gpus if self._node[g] in set(b_nodes)]
                cuts.append(self._max_flow(graph, a, b))
            return min(cuts)
        k = self._kind
        if any(self.scale_up_bandwidth(g) > 0 for g in gpus):
            graph = nx.subgraph_view(self.graph, filter_node=lambda x: k[x] in _SCALE_UP)
        else:
            graph = self.graph
        half = len(gpus) // 2
        splits = [(gpus[:half], gpus[len(gpus) - half:]), (gpus[0::2][:half], gpus[1::2][:half])]
        return min(self._max_flow(graph, a, b) for a, b in splits)

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
        """Physical links per catalog link type (each cable counted once, times its ``count``)."""
        out: Counter[str] = Counter()
        for a, b, e in self.graph.edges(data=True):
            if natural_key(a) < natural_key(b):
                out[e["link"]] += e["count"]
        return dict(sorted(out.items()))

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
            "gpus_per_node": len(self.gpus_on(self._node[gpus[0]])) if gpus else 0,
            "devices": self.device_counts(),
            "links": self.link_counts(),
            "per_gpu_scale_up_bw_Bps": min((self.scale_up_bandwidth(g) for g in gpus), default=0.0),
            "per_gpu_scale_out_bw_Bps": min((self.scale_out_bandwidth(g) for g in gpus), default=0.0),
            "per_gpu_host_bw_Bps": min((self.host_bandwidth(g) for g in gpus), default=0.0),
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
