"""The bisection's max-flow: scipy's compiled Dinic on GCD-scaled integer capacities equals networkx's flow
(the oracle) on cluster topologies and on random graphs; capacities it cannot scale exactly fall back."""

from __future__ import annotations

from typing import Any

import networkx as nx
import numpy as np
import pytest

from cosim.scenario import build_topology
from cosim.topology.model import Topology, _sparse_max_flow


@pytest.mark.parametrize("nodes", [4, 16])
def test_sparse_flow_equals_networkx_on_clusters(nodes: int) -> None:
    topo = build_topology("dgx-h100", None, nodes=nodes)
    gpus = topo.gpus
    half = len(gpus) // 2
    for a, b in ((gpus[:half], gpus[half:]), (gpus[0::2], gpus[1::2]), (gpus[:3], gpus[-5:])):
        want = Topology._nx_max_flow(topo.graph, a, b)
        assert want > 0
        assert _sparse_max_flow(topo.graph, a, b) == want


def test_sparse_flow_equals_networkx_on_random_graphs() -> None:
    rng = np.random.default_rng(11)
    for trial in range(20):
        g = nx.gnp_random_graph(30, 0.15, seed=trial, directed=True)
        for u, v in g.edges:
            g.edges[u, v]["bandwidth"] = float(rng.integers(1, 50)) * 25e9
        nodes = list(g.nodes)
        a, b = nodes[:5], nodes[-5:]
        assert _sparse_max_flow(g, a, b) == Topology._nx_max_flow(g, a, b)


def test_sparse_flow_declines_what_it_cannot_scale() -> None:
    g = nx.DiGraph()
    g.add_edge("x", "y", bandwidth=1.5)  # not a whole number of bytes/s
    assert _sparse_max_flow(g, ["x"], ["y"]) is None
    g = nx.DiGraph()
    g.add_edge("x", "y", bandwidth=3.0)
    g.add_edge("y", "z", bandwidth=float(2**40 + 1))  # scaled capacities past 32 bits
    assert _sparse_max_flow(g, ["x"], ["z"]) is None
    g = nx.DiGraph()
    g.add_edge("x", "y")  # no capacity: unbounded in networkx
    assert _sparse_max_flow(g, ["x"], ["y"]) is None


def test_bisection_uses_the_sparse_flow_on_large_fabrics(monkeypatch: pytest.MonkeyPatch) -> None:
    import cosim.topology.model as model

    calls = []
    real = model._sparse_max_flow

    def spy(g: nx.DiGraph, a: list[str], b: list[str], net: Any = None) -> float | None:
        calls.append(g.number_of_edges())
        return real(g, a, b, net)

    monkeypatch.setattr(model, "_sparse_max_flow", spy)
    monkeypatch.setattr(Topology, "_SPARSE_FLOW_EDGES", 100)
    topo = build_topology("dgx-h100", None, nodes=8)
    got = topo.bisection_bandwidth()
    assert calls and min(calls) >= 100
    monkeypatch.setattr(Topology, "_SPARSE_FLOW_EDGES", 10**9)
    assert build_topology("dgx-h100", None, nodes=8).bisection_bandwidth() == got
