"""O(cluster) set-up shortcuts give the figures of the plain computation (issue 16, round 9)."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from cosim.replay.links import LinkUsage
from cosim.scenario import build_topology
from cosim.topology.routing import natural_key
from tests._link_rows import link_data


def _brute(t):
    out: Counter[str] = Counter()
    for a, b, e in t.graph.edges(data=True):
        if natural_key(a) < natural_key(b):
            out[e["link"]] += e["count"]
    return min(t.host_bandwidth(g) for g in t.gpus), dict(sorted(out.items()))


def test_identical_nodes_share_a_class_and_figures_match():
    t = build_topology("dgx-h100", None, {}, {}, 4)
    assert set(t.node_classes().values()) == {0}
    host, links = _brute(t)
    f = t.figures()
    assert f["per_gpu_host_bw_Bps"] == host and f["links"] == links


def test_a_different_node_is_its_own_class():
    t = build_topology("dgx-h100", None, {}, {}, 4)
    g = t.gpus_on(2)[0]
    cpu = t.cpu_of(g)
    path = t.route(g, cpu)
    for a, b in itertools.pairwise(path):  # a slower host path on node 2 only
        t.graph.edges[a, b]["bandwidth"] /= 8
        t.graph.edges[b, a]["bandwidth"] /= 8
    t2 = type(t).__new__(type(t))
    t2.__dict__.update({k: v for k, v in t.__dict__.items() if k not in ("_figures",)})
    t2._router = type(t._router)(t.graph, t2.nic_of)
    classes = t2.node_classes()
    assert classes[2] == 2 and classes[1] == 0 and classes[3] == 0
    host, _ = _brute(t2)
    assert t2.figures()["per_gpu_host_bw_Bps"] == host


def test_link_report_sort_key_keeps_the_order():
    """The 16-bit sort key gives the int64 key's stable order (ties in the order added)."""
    rng = np.random.default_rng(3)
    n, nl = 5000, 300
    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(nl)], np.ones(nl))
    lk = rng.integers(0, nl, n)
    s = np.round(rng.random(n), 2)  # many equal starts on a link
    e = s + 0.5
    u.add(lk, s, e, np.ones(n), rng.random(n), 0)
    data = link_data(u)
    o = np.lexsort((s, lk))
    assert np.array_equal(data[0], lk[o]) and np.array_equal(data[1], s[o]) and np.array_equal(data[4], link_data(u)[4])
    assert np.array_equal(data[2], e[o])
