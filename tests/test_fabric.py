"""Fabric: max-min fair sharing, latencies, counters (analytic expectations)."""

from __future__ import annotations

import itertools

import networkx as nx
import pytest
import simpy

from cosim.engine.fabric import Fabric, FabricConfig
from cosim.engine.topoview import add_link

GB = 1e9


def chain(*names: str, bw: float = 10 * GB, lat: float = 0.0) -> nx.DiGraph:
    g = nx.DiGraph()
    for a, b in itertools.pairwise(names):
        add_link(g, a, b, bw, latency=lat)
    return g


def run_flows(fab: Fabric, specs: list[tuple[str, str, str, float, float]]) -> dict[str, float]:
    """specs: (name, src, dst, nbytes, start); returns name -> finish time."""
    env = fab.env
    out: dict[str, float] = {}

    def one(name: str, src: str, dst: str, nbytes: float, start: float):
        yield env.timeout(start)
        yield fab.transfer(src, dst, nbytes, name=name)
        out[name] = env.now

    for s in specs:
        env.process(one(*s))
    env.run()
    return out


def test_one_flow_one_link_latency_plus_bytes_over_bandwidth():
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b", bw=10 * GB, lat=2e-6))
    out = run_flows(fab, [("f", "a", "b", 1e9, 0.0)])
    # 2 us + 1 GB / 10 GB/s = 0.100002 s
    assert out["f"] == pytest.approx(2e-6 + 0.1, rel=1e-12)
    st = fab.link("a", "b")
    assert st.bytes == pytest.approx(1e9)
    assert st.busy_time == pytest.approx(0.1)
    assert st.peak_flows == 1
    assert fab.link("b", "a").bytes == 0


def test_two_flows_shared_bottleneck_get_half_each():
    # a -> s -> c and b -> s -> c share s->c (10 GB/s): 5 GB/s each
    g = nx.DiGraph()
    add_link(g, "a", "s", 100 * GB)
    add_link(g, "b", "s", 100 * GB)
    add_link(g, "s", "c", 10 * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    out = run_flows(fab, [("f1", "a", "c", 1e9, 0.0), ("f2", "b", "c", 1e9, 0.0)])
    assert out == {"f1": pytest.approx(0.2), "f2": pytest.approx(0.2)}
    assert fab.link("s", "c").peak_flows == 2


def test_flow_speeds_up_when_other_ends():
    # f1 1 GB and f2 0.5 GB share 10 GB/s: both at 5 GB/s until f2 ends at 0.1 s;
    # f1 has 0.5 GB left, alone at 10 GB/s -> ends at 0.15 s.
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b"))
    out = run_flows(fab, [("f1", "a", "b", 1e9, 0.0), ("f2", "a", "b", 0.5e9, 0.0)])
    assert [(k, round(v, 9)) for k, v in sorted(out.items(), key=lambda kv: kv[1])] == [("f2", 0.1), ("f1", 0.15)]


def test_late_arrival_resolves_rates():
    # f1 alone 0..0.05 at 10 GB/s moves 0.5 GB; then f2 arrives, 5 GB/s each:
    # f1's remaining 0.5 GB takes 0.1 s -> 0.15; f2 1 GB: 0.5 GB by 0.15, then 10 GB/s -> 0.2
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b"))
    out = run_flows(fab, [("f1", "a", "b", 1e9, 0.0), ("f2", "a", "b", 1e9, 0.05)])
    assert out["f1"] == pytest.approx(0.15)
    assert out["f2"] == pytest.approx(0.2)


def test_three_link_max_min_example():
    """Classic example: links L1 = x->y (cap 10), L2 = y->z (cap 4).

    Flows: A: x->y->z (L1, L2), B: y->z (L2), C: x->y (L1), D: x->y (L1).
    Water filling: L2 has 2 flows -> fair share 2; L1 has 3 flows -> 3.33.
    L2 saturates first at 2: A = B = 2. L1 left 10 - 2 = 8 for C and D: 4 each.
    Max-min rates: A=2, B=2, C=4, D=4 (GB/s).
    """
    g = nx.DiGraph()
    add_link(g, "x", "y", 10 * GB)
    add_link(g, "y", "z", 4 * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    flows = {}
    for name, src, dst in [("A", "x", "z"), ("B", "y", "z"), ("C", "x", "y"), ("D", "x", "y")]:
        flows[name] = fab.transfer(src, dst, 1e12, name=name)
    env.run(until=1e-3)
    rates = {k: v / GB for k, v in fab.active_rates().items()}
    assert rates == {"A": pytest.approx(2), "B": pytest.approx(2), "C": pytest.approx(4), "D": pytest.approx(4)}


def test_rate_cap_and_efficiency():
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b", bw=10 * GB))
    done = {}

    def p():
        # efficiency 0.5: 1 GB payload = 2 GB wire at 10 GB/s = 0.2 s
        yield fab.transfer("a", "b", 1e9, efficiency=0.5)
        done["eff"] = env.now
        # payload cap 2 GB/s: 1 GB takes 0.5 s
        yield fab.transfer("a", "b", 1e9, max_rate=2 * GB)
        done["cap"] = env.now

    env.process(p())
    env.run()
    assert done == {"eff": pytest.approx(0.2), "cap": pytest.approx(0.7)}
    assert fab.link("a", "b").bytes == pytest.approx(3e9)


def test_capped_flow_leaves_rest_to_others():
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b", bw=10 * GB))
    fab.transfer("a", "b", 1e12, max_rate=2 * GB, name="capped")
    fab.transfer("a", "b", 1e12, name="free")
    env.run(until=1e-3)
    rates = {k: v / GB for k, v in fab.active_rates().items()}
    assert rates == {"capped": pytest.approx(2), "free": pytest.approx(8)}


def test_coupled_group_moves_at_slowest_rate():
    # ring-like group: g1 on a->b alone, g2 on c->d shared with an outsider.
    g = nx.DiGraph()
    add_link(g, "a", "b", 10 * GB)
    add_link(g, "c", "d", 10 * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    grp = fab.new_group()
    fab.transfer("a", "b", 1e12, group=grp, name="g1")
    fab.transfer("c", "d", 1e12, group=grp, name="g2")
    fab.transfer("c", "d", 1e12, name="other")
    env.run(until=1e-3)
    rates = {k: v / GB for k, v in fab.active_rates().items()}
    assert rates == {"g1": pytest.approx(5), "g2": pytest.approx(5), "other": pytest.approx(5)}


def test_multiplicity_counts_as_many_flows():
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b", bw=12 * GB))
    fab.transfer("a", "b", 1e12, multiplicity=3, name="cls")
    fab.transfer("a", "b", 1e12, name="one")
    env.run(until=1e-3)
    rates = {k: v / GB for k, v in fab.active_rates().items()}
    assert rates == {"cls": pytest.approx(3), "one": pytest.approx(3)}
    assert fab.link("a", "b").peak_flows == 4


def test_multipath_split_by_capacity():
    # two planes a->s1->b (30 GB/s) and a->s2->b (10 GB/s): split 3:1, 40 GB/s total
    g = nx.DiGraph()
    add_link(g, "a", "s1", 30 * GB)
    add_link(g, "s1", "b", 30 * GB)
    add_link(g, "a", "s2", 10 * GB)
    add_link(g, "s2", "b", 10 * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    out = run_flows(fab, [("f", "a", "b", 4e9, 0.0)])
    assert out["f"] == pytest.approx(0.1)
    assert fab.path_capacity("a", "b") == pytest.approx(40 * GB)
    env2 = simpy.Environment()
    fab2 = Fabric(env2, g, FabricConfig(multipath="hash"))
    out2 = run_flows(fab2, [("f", "a", "b", 4e9, 0.0)])
    assert out2["f"] == pytest.approx(4e9 / (30 * GB))  # sorted paths: s1 first


def test_bytes_conserved_many_flows():
    g = nx.DiGraph()
    for i in range(6):
        add_link(g, f"h{i}", "sw", (i + 1) * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    specs = [(f"f{i}{j}", f"h{i}", f"h{j}", 1e8 * (1 + (i * 7 + j) % 5), 0.01 * ((i + j) % 3))
             for i in range(6) for j in range(6) if i != j]
    out = run_flows(fab, specs)
    assert len(out) == len(specs)
    sent = sum(fab.link(f"h{i}", "sw").bytes for i in range(6))
    received = sum(fab.link("sw", f"h{i}").bytes for i in range(6))
    assert sent == pytest.approx(sum(s[3] for s in specs), rel=1e-9)
    assert received == pytest.approx(sent, rel=1e-9)


def test_deterministic():
    def once():
        g = nx.DiGraph()
        for i in range(5):
            add_link(g, f"h{i}", "sw", (i + 2) * GB, latency=1e-6)
        env = simpy.Environment()
        fab = Fabric(env, g)
        specs = [(f"f{i}{j}", f"h{i}", f"h{j}", 1e7 * (1 + (i * 3 + j) % 4), 1e-3 * ((i * j) % 4))
                 for i in range(5) for j in range(5) if i != j]
        return sorted(run_flows(fab, specs).items())

    assert once() == once()
