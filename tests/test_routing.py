"""One router: a Topology and the engine's bare-graph stand-in route a machine the same way."""

from __future__ import annotations

import pytest

from cosim.engine.topoview import GraphTopology, TopologyLike, cluster
from cosim.topology import load_topology
from cosim.topology.routing import Link


@pytest.mark.parametrize("preset", ["dgx-a100", "dgx1-v100", "pcie-8x-l40s", "dgx-h100-4node"])
def test_graph_topology_routes_like_topology(preset: str) -> None:
    topo = load_topology(preset)
    bare = GraphTopology(topo.graph)
    devs = [d for d in topo.graph if topo.kind_of(d) in ("gpu", "cpu", "nic")]
    if len(devs) > 40:  # multi-node: node 0 and the first devices of node 1
        devs = [d for d in devs if topo.node_of(d) == 0] + [d for d in devs if topo.node_of(d) == 1][:6]
    pairs = [(a, b) for a in devs for b in devs if a != b]
    # the NIC a GPU sends through is the one affinity rule both must share for cross-node routes
    nic_same = all(bare.nic_of(g) == topo.nic_of(g) for g in topo.gpus if topo.nic_of(g) is not None)
    for a, b in pairs:
        if not nic_same and topo.node_of(a) != topo.node_of(b):
            continue
        assert bare.paths(a, b) == topo.paths(a, b), (preset, a, b)


def test_typed_links_and_protocol() -> None:
    topo = load_topology("dgx-a100")
    bare = GraphTopology(cluster(2, 2, nvlink_bw=300e9, nic_bw=25e9))
    for t in (topo, bare):
        assert isinstance(t, TopologyLike)
        links = list(t.links())
        assert links and all(isinstance(ln, Link) and ln.bandwidth > 0 and ln.latency >= 0 for ln in links)
        ln = links[0]
        assert t.link(ln.src, ln.dst) == ln
    assert bare.link("node0.nic0", "fabric.leaf0").bandwidth == 25e9
    assert bare.link("node0.nic0", "fabric.leaf0").kind == "ib"


def test_no_transit_through_gpu_or_other_nic() -> None:
    # GPU -> remote GPU leaves through its own NIC (no detour through the CPU to another NIC)
    bare = GraphTopology(cluster(2, 2, nvlink_bw=300e9, nic_bw=25e9))
    ps = bare.paths("node0.gpu0", "node1.gpu1")
    assert ps == [["node0.gpu0", "node0.pcie0", "node0.nic0", "fabric.leaf0", "fabric.spine0", "fabric.leaf1",
                   "node1.nic1", "node1.pcie1", "node1.gpu1"]]
    assert all("gpu" not in bare.kind_of(n) for p in bare.paths("node0.gpu0", "node0.cpu0") for n in p[1:-1])


def test_cluster_router_pieces_follow_the_one_router() -> None:
    from cosim.engine.topoview import ClusterRouter

    topo = load_topology("dgx-h100-4node")
    cr = ClusterRouter(topo)
    gpus = topo.gpus[::5]
    for a in gpus:
        for b in gpus:
            if a != b:
                assert cr(a, b) == topo.paths(a, b), (a, b)
