"""Fabric: max-min fair sharing, latencies, counters (analytic expectations)."""

from __future__ import annotations

import itertools
import math
from typing import Any

import networkx as nx
import pytest
import simpy

from cosim.engine.flows import Fabric, FabricConfig
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


# ----------------------------------------------------------------- selective re-solves


def test_arrival_on_disjoint_links_changes_nothing_else():
    """f1 alone on a->b (10 GB/s, 1 GB) ends at exactly 0.1 s whether or not f2 starts at 0.05 s on the
    disjoint c->d; the solve at f2's arrival re-rates f2 only (its own component)."""
    def once(with_f2: bool) -> tuple[dict[str, float], int]:
        g = chain("a", "b")
        add_link(g, "c", "d", 10 * GB)
        env = simpy.Environment()
        fab = Fabric(env, g)
        specs = [("f1", "a", "b", 1e9, 0.0)] + ([("f2", "c", "d", 2e9, 0.05)] if with_f2 else [])
        out = run_flows(fab, specs)
        return out, fab.n_rows_solved

    alone, solved_alone = once(False)
    both, solved_both = once(True)
    assert alone["f1"] == both["f1"] == 0.1
    assert both["f2"] == pytest.approx(0.05 + 0.2)
    assert solved_alone == 1 and solved_both == 2  # one row per solve: f1 at 0, f2 at 0.05


def test_departure_re_rates_only_rows_at_or_above_its_rate():
    """Links s->m 10, m->t 2, m->u 10 GB/s. P: s->t, Q: m->t, X and Y: s->u. Water filling: m->t gives
    P = Q = 1; s->m leaves 9 for X, Y: 4.5 each. Y (0.45 GB) ends at 0.1 s; X (1 GB) has 0.55 GB left and
    gets all 9 GB/s: ends at 0.1 + 0.55 / 9. P and Q (rate 1 < 4.5) keep their rates and are not re-solved;
    P, Q (0.5 GB at 1 GB/s) end at 0.5 s. All four flows are one component (P shares s->m with X)."""
    g = nx.DiGraph()
    add_link(g, "s", "m", 10 * GB)
    add_link(g, "m", "t", 2 * GB)
    add_link(g, "m", "u", 10 * GB)
    env = simpy.Environment()
    fab = Fabric(env, g)
    solved = []
    orig = fab._solve

    def solve() -> None:
        before = fab.n_rows_solved
        orig()
        solved.append((env.now, fab.n_rows_solved - before))

    fab._solve = solve  # type: ignore[method-assign]
    out = run_flows(fab, [("P", "s", "t", 0.5e9, 0.0), ("Q", "m", "t", 0.5e9, 0.0), ("X", "s", "u", 1e9, 0.0),
                          ("Y", "s", "u", 0.45e9, 0.0)])
    assert out["Y"] == pytest.approx(0.1, rel=1e-12)
    assert out["X"] == pytest.approx(0.1 + 0.55 / 9, rel=1e-12)
    assert out["P"] == pytest.approx(0.5, rel=1e-12) and out["Q"] == pytest.approx(0.5, rel=1e-12)
    assert solved[0] == (0.0, 4)
    assert solved[1] == (pytest.approx(0.1), 1)  # Y left: only X re-rated


def test_completion_window_worked_by_hand():
    """One batch of three flows on one 10 GB/s link: 1, 1.001 and 2 GB. Exact: each at 10/3 GB/s, f1 ends at
    0.3 s, f2 (0.001 GB left, now at 5 GB/s) at 0.3002 s, f3 (0.999 GB left at 10 GB/s) at 0.4001 s: 3
    solves. With completion_tolerance 0.01 the half window at the first solve is h = 0.01/2 x 0.6 s
    (f3's projected end) = 3 ms; f1 and f2 are due at 0.3 and 0.3003 s, within 2h of the first end, so
    both end at their middle, 0.30015 s (f1 late and f2 early by 0.15 ms < h), where f3 has
    2 - 10/3 x 0.30015 = 0.9995 GB left and ends at 0.30015 + 0.09995 = 0.4001 s: 2 solves, the same
    batch end (the link never idles) and every byte counted on the link."""
    import numpy as np

    def once(tol: float, until: float | None = None) -> Fabric:
        env = simpy.Environment()
        fab = Fabric(env, chain("a", "b"), FabricConfig(completion_tolerance=tol))
        seg = fab.pair_segment("a", "b")
        segs = np.array([[seg, -1, -1]] * 3)
        ev = fab.start_rows(segs, np.array([1e9, 1.001e9, 2e9]))
        ev.callbacks.append(lambda _e: setattr(fab, "done_at", env.now))
        env.run(until=until)
        return fab

    exact, batched = once(0.0), once(0.01)
    assert exact.done_at == pytest.approx(0.4001, rel=1e-12)  # type: ignore[attr-defined]
    assert batched.done_at == pytest.approx(0.4001, rel=1e-12)  # type: ignore[attr-defined]
    assert (exact.n_solves, batched.n_solves) == (3, 2)
    for fab in (exact, batched):
        st = fab.link("a", "b")
        assert st.bytes == pytest.approx(4.001e9, rel=1e-12) and st.busy_time == pytest.approx(0.4001, rel=1e-12)
    # at 0.30016 s: exact, f2 and f3 still move at 5 GB/s; batched, f3 alone at 10 GB/s
    mid_exact, mid_batched = once(0.0, 0.30016), once(0.01, 0.30016)
    assert mid_exact.active_flows == 2 and mid_batched.active_flows == 1
    assert mid_exact.active_rates()["flows"] == pytest.approx(5 * GB)
    assert mid_batched.active_rates()["flows"] == pytest.approx(10 * GB)
    # separate transfers are separate batches: each ends exactly
    env = simpy.Environment()
    fab = Fabric(env, chain("a", "b"), FabricConfig(completion_tolerance=0.01))
    out = run_flows(fab, [("f1", "a", "b", 1e9, 0.0), ("f2", "a", "b", 1.001e9, 0.0)])
    assert out == {"f1": pytest.approx(0.2), "f2": pytest.approx(0.2 + 0.001e9 / (10 * GB))}


def test_indexed_and_dense_filling_agree(monkeypatch: pytest.MonkeyPatch):
    """The event-driven filling used for big solves gives the dense one's max-min rates (random flows on a
    two-level tree with caps and a coupled group)."""
    import numpy as np

    def rates(dense_rows: int) -> list[float]:
        monkeypatch.setattr(Fabric, "_DENSE_ROWS", dense_rows)
        g = nx.DiGraph()
        for i in range(8):
            add_link(g, f"h{i}", f"l{i // 4}", (i + 1) * GB)
        add_link(g, "l0", "sp", 6 * GB)
        add_link(g, "l1", "sp", 9 * GB)
        env = simpy.Environment()
        fab = Fabric(env, g)
        rng = np.random.default_rng(1)
        grp = fab.new_group()
        for k in range(40):
            i, j = rng.choice(8, 2, replace=False)
            fab.transfer(f"h{i}", f"h{j}", 1e12, name=f"f{k}", max_rate=(0.3 * GB if k % 7 == 0 else math.inf),
                         group=grp if k % 11 == 0 else -1)
        env.run(until=1e-6)
        p = fab._rows
        return p.rate[: p.size].tolist()

    assert rates(0) == pytest.approx(rates(10**9), rel=1e-9)


def test_spine_bundle_uses_every_spine():
    """dgx-h100-32node: rail 0's leaf has 32 uplinks (8 to each of 4 spines) of 50 GB/s x 0.94 (NDR400
    efficiency) = 1504 GB/s, exactly its 32 NICs' 47 GB/s: non-blocking. 32 flows of 1 GiB from node k gpu0
    (rail 0) to node k+1 gpu1 (rail 1) all cross the spines; each is NIC-bound at 47 GB/s and ends at
    1 GiB / 47 GB/s even with max_paths=1 (the leaf -> spine -> leaf bundle spreads over all 4 spines, not
    one: one spine would give 8 x 47 / 32 = 11.75 GB/s each). Each leaf0 -> spine edge carries 32 GiB / 4."""
    import numpy as np

    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-32node")
    sim = Simulator(topo, SimConfig(fabric=FabricConfig(max_paths=1), record_trace=False))
    fab = sim.fabric
    names = [f"node{k}.gpu0" for k in range(32)] + [f"node{(k + 1) % 32}.gpu1" for k in range(32)]
    segs = fab.route_segments(names, np.arange(32), np.arange(32, 64))
    ev = fab.start_rows(segs, np.full(32, float(2**30)), link_latency=False)
    sim.run()
    assert ev.triggered
    nic_rate = 50e9 * 0.94
    assert sim.env.now == pytest.approx(2**30 / nic_rate, rel=1e-9)
    spines = [v for v in topo.graph.successors("fabric.leaf0") if "spine" in v]
    assert len(spines) == 4
    for s in spines:
        assert fab.link("fabric.leaf0", s).bytes == pytest.approx(32 * 2**30 / 4, rel=1e-9)


def _uneven_all_to_all(n: int, seed: int = 0, tol: float = 0.0) -> tuple[float, list[float], list[float], Fabric]:
    """All-to-allv among the first ``n`` GPUs of dgx-h100-32node, 64 MiB per rank split over the peers in
    proportion to seeded uniform draws (benchmarks/bench_engine.py --pattern uneven), completion window
    ``tol``; returns the end time, every link's busy time and bytes, and the fabric (its solve counters)."""
    import numpy as np

    from cosim.engine import NcclConfig, SimConfig, Simulator
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-32node")
    w = np.random.default_rng(seed).random((n, n))
    np.fill_diagonal(w, 0.0)
    matrix = w / w.sum(axis=1, keepdims=True) * 64 * 2**20
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False,
                                    fabric=FabricConfig(coalesce=False, completion_tolerance=tol)))
    sim.collective("all_to_allv", topo.gpus[:n], matrix=matrix, proto="simple")
    sim.run()
    st = sim.fabric.link_stats()
    return sim.env.now, [s.busy_time for s in st], [s.bytes for s in st], sim.fabric


def test_uneven_all_to_all_fast_solver_matches_reference_filling(monkeypatch: pytest.MonkeyPatch):
    """Uneven all-to-all (16 GPUs on 2 DGX H100 nodes, 240 flows ending one by one): the fast solves (reused
    bottleneck structure, rounds of local bottlenecks) give the sequential progressive filling's schedule to
    1e-9: end time, and every link's busy time (its last flow's end) and bytes."""
    t, busy, nbytes, fab = _uneven_all_to_all(16)
    assert fab.n_reused > 0  # the fast path did answer solves
    monkeypatch.setattr(Fabric, "_DENSE_ROWS", 10**9)  # reference: one filling round per saturation level
    t_ref, busy_ref, bytes_ref, fab_ref = _uneven_all_to_all(16)
    assert fab_ref.n_reused == 0
    assert t == pytest.approx(t_ref, rel=1e-9)
    assert busy == pytest.approx(busy_ref, rel=1e-9, abs=1e-15)
    assert nbytes == pytest.approx(bytes_ref, rel=1e-9, abs=1e-3)


def test_per_link_sums_and_searches_over_all_entries_match_the_compacted_ones(monkeypatch: pytest.MonkeyPatch):
    """The per-link sums and component searches over every registered segment entry (a sparse links x segments
    product; docs/ENGINE.md, round 7) give bit for bit the schedule of the compacted ones: an uneven all-to-all
    with a completion window (solves, end time, link busy times and bytes), and random coupled flows with caps
    arriving at different times (every row's rate and end)."""
    import numpy as np

    def coupled() -> tuple[list[float], list[float], int]:
        g = nx.DiGraph()
        for i in range(8):
            add_link(g, f"h{i}", f"l{i // 4}", (i + 1) * GB)
            add_link(g, f"l{i // 4}", f"h{i}", (i + 2) * GB)
        for leaf, bw in (("l0", 6 * GB), ("l1", 9 * GB)):
            add_link(g, leaf, "sp", bw)
            add_link(g, "sp", leaf, bw)
        env = simpy.Environment()
        fab = Fabric(env, g)
        rng = np.random.default_rng(3)
        groups = [fab.new_group() for _ in range(3)]
        ends: list[float] = []

        def one(k: int, i: int, j: int, start: float):
            yield env.timeout(start)
            yield fab.transfer(f"h{i}", f"h{j}", float(rng.integers(1, 50)) * 1e8,
                               max_rate=(0.3 * GB if k % 7 == 0 else math.inf),
                               group=groups[k % 3] if k % 5 == 0 else -1)
            ends.append(env.now)

        for k in range(60):
            i, j = rng.choice(8, 2, replace=False)
            env.process(one(k, int(i), int(j), float(rng.integers(0, 6)) * 0.05))
        env.run()
        return ends, [s.bytes for s in fab.link_stats()], fab.n_solves

    runs = []
    for dense in (True, False):
        monkeypatch.setattr(Fabric, "_dense_entries", lambda self, k, d=dense: d)
        t, busy, nbytes, fab = _uneven_all_to_all(16, tol=0.01)
        runs.append((t, busy, nbytes, fab.n_solves, coupled()))
    assert runs[0] == runs[1]
    assert runs[0][3] > 10 and runs[0][4][2] > 10


def test_link_water_level_and_tie_order_worked_by_hand():
    """One link of 10 B/s left, rows at 1, 2, 8 and 9 B/s (weight 1): at level t the first two keep their
    rates and the last two take t, 1 + 2 + 2t = 10, t = 3.5. Level order: classes 0 and 1 tie at 1.0 and
    rows of class 1 cross class 0's link, so class 1 is solved first; class 2 (level 2) last."""
    import numpy as np

    over = np.array([True, False])
    pr = np.arange(4)
    pl = np.zeros(4, dtype=np.int64)
    t = Fabric._link_water_level(np.array([0]), over, pr, pl, np.ones(4), np.array([9.0, 1.0, 8.0, 2.0]),
                                 np.array([10.0, 5.0]))
    assert t[0] == pytest.approx(3.5) and math.isinf(t[1])
    order = Fabric._level_order(np.array([1.0, 1.0, 2.0]), np.array([1]), np.array([0]))
    assert order.tolist() == [1, 0, 2]


def test_uneven_all_to_all_completion_window_within_bound_of_exact():
    """32-GPU uneven all-to-all (992 flows, 952 distinct ends): the default completion window needs a small
    fraction of the exact solves and ends within 0.5% of the exact end time (the stated bound,
    docs/ENGINE.md *Performance*); every link's bytes stay exact (charged when a flow ends off its time)."""
    tol = FabricConfig().completion_tolerance
    assert tol > 0  # the default batches
    t_ref, _, bytes_ref, fab_ref = _uneven_all_to_all(32)
    t, _, nbytes, fab = _uneven_all_to_all(32, tol=tol)
    assert fab_ref.n_solves >= 900 and fab.n_solves <= 200  # 952 distinct ends; 128 measured
    assert t == pytest.approx(t_ref, rel=5e-3)
    assert nbytes == pytest.approx(bytes_ref, rel=1e-9, abs=1e-3)


def test_completion_window_with_a_zero_byte_flow_in_the_batch():
    """A batch with an empty flow (0 bytes: an all-to-allv peer that receives nothing) beside 1 and 2 GB flows
    on one 10 GB/s link. Worked: the empty flow ends at once; the other two share the link at 5 GB/s, the 1 GB
    one ends at 0.2 s and the 2 GB one, with 1 GB left at 10 GB/s, at 0.3 s. The window must give the same end
    (a row without a projected end, tend = inf, is released at the tick, never at its 'end')."""
    import numpy as np

    def once(tol: float) -> float:
        env = simpy.Environment()
        fab = Fabric(env, chain("a", "b"), FabricConfig(completion_tolerance=tol))
        seg = fab.pair_segment("a", "b")
        ev = fab.start_rows(np.array([[seg, -1, -1]] * 3), np.array([0.0, 1e9, 2e9]))
        done: list[float] = []
        ev.callbacks.append(lambda _e: done.append(env.now))
        env.run()
        return done[0]

    assert once(0.0) == pytest.approx(0.3, rel=1e-12)
    assert once(0.01) == pytest.approx(0.3, rel=1e-12)


def test_rate_key_group_relabel_matches_sort_definition() -> None:
    """The rate memo's group relabelling (first appearance, -1 counted as an id) by a table of first positions
    gives what the sort-based definition gives, bit for bit, on recent ids, far ids (the sort fallback),
    mixed -1 and none."""
    import numpy as np

    from cosim.engine.flows import _first_seen

    def by_sort(g: np.ndarray) -> np.ndarray:
        if not np.count_nonzero(g >= 0):
            return g
        _, first, inv = np.unique(g, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))
        return np.where(g >= 0, rank[inv.reshape(-1)], -1)

    rng = np.random.default_rng(7)
    for i in range(600):
        n = int(rng.integers(1, 600)) if i % 2 else int(rng.integers(1024, 3000))  # (the scalar, sort and table paths)
        g = rng.integers(-1, int(rng.integers(1, 4 * n)), n).astype(np.int64)
        if rng.random() < 0.5:
            g = np.where(g >= 0, g + int(rng.integers(0, 10**6)), -1).astype(np.int64)
        if rng.random() < 0.1:
            g[:] = -1
        assert _first_seen(g).tobytes() == by_sort(g).tobytes()
    assert _first_seen(np.array([5, -1, 9, 5, 9, -1, 2])).tolist() == [0, -1, 2, 0, 2, -1, 3]
    big = np.array([5, -1, 9, 5, 9, -1, 2] * 200)  # the table path (1,400 ids over a span of 8)
    assert _first_seen(big).tolist() == [0, -1, 2, 0, 2, -1, 3] * 200


def test_stacked_row_sums_equal_the_per_vector_sums_bit_for_bit():
    """A completion's flow counts, loads and early bytes summed as one stacked vector set (two ``bincount`` calls,
    indices offset by vector: ``Fabric._row_link_sums``) are the floats of one ``_link_sums`` per vector, on the
    segment lists of an uneven all-to-all's rows (1-6 rows, shared and padded segments, signed values)."""
    import numpy as np

    fab = _uneven_all_to_all(16, tol=0.01)[3]
    p, rng = fab._rows, np.random.default_rng(5)
    tried = 0
    for _ in range(300):
        rows = np.sort(rng.choice(p.size, int(rng.integers(1, 7)), replace=False))
        segs, k = p.seg[rows], len(rows)
        P = np.vstack([rng.integers(1, 4, k).astype(float), rng.random(k) * 1e9, rng.normal(0.0, 1e6, k)])
        for nv in (2, 3):
            x, v, sums = fab._row_link_sums(segs, P[:nv])
            x1, (v1, *_), sums1 = fab._link_sums(segs.reshape(-1), list(P[:nv].repeat(3, axis=1)),
                                                 [False] + [True] * (nv - 1))
            assert x is x1 and v[0].tobytes() == v1.tobytes()
            assert all(sums[i].tobytes() == sums1[i].tobytes() for i in range(nv))
            tried += len(x.li) > len(x.ul)
    assert tried > 100  # lists with links summed from several entries (the order matters)


def test_expansion_cache_counts_what_it_holds() -> None:
    """The cap on the segment-list expansion cache bounds the memory it holds: each kept list is counted at no less
    than what tracemalloc sees it take (key, arrays, their objects); it counted only 24 bytes per link entry, so
    one-segment lists took ~60x their count."""
    import tracemalloc

    import numpy as np

    names = [f"n{i}" for i in range(41)]
    fab = Fabric(simpy.Environment(), chain(*names))
    segs = [fab.pair_segment(a, b) for a, b in itertools.pairwise(names)]
    fab._flush_segments()
    lists = [np.array(c, dtype=np.int64) for k in (1, 2) for c in zip(*[segs[i::k] for i in range(k)])]
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for x in lists:
        fab._seg_links(x)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(fab._exp_cache) == len(lists)
    assert fab._exp_bytes >= 0.9 * held, (fab._exp_bytes, held)


def _observed_calls(touch_all: bool, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The fabric observer's calls (each as the bytes of its five columns) for an uneven all-to-allv then an
    all-reduce on 16 GPUs of dgx-h100-32node; with ``touch_all`` every :meth:`Fabric._touch` marks every link
    (the change test then compares all links, as before round 13)."""
    import numpy as np

    from cosim.engine import NcclConfig, SimConfig, Simulator
    from cosim.topology import load_topology

    if touch_all:
        orig = Fabric._touch
        monkeypatch.setattr(Fabric, "_touch", lambda self, links=None: orig(self, None))
    topo = load_topology("dgx-h100-32node")
    w = np.random.default_rng(3).random((16, 16))
    np.fill_diagonal(w, 0.0)
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False,
                                    fabric=FabricConfig(coalesce=False, completion_tolerance=0.01)))
    calls: list[bytes] = []

    def observe(idx: np.ndarray, a: Any, b: Any, cnt: np.ndarray, nb: np.ndarray) -> None:
        n = len(idx)
        calls.append(b"".join(np.ascontiguousarray(np.broadcast_to(np.asarray(x, dtype=float), (n,))).tobytes()
                              for x in (idx, a, b, cnt, nb)))

    sim.fabric.observer = observe
    for _ in range(2):  # (the second time, its solves hit the rate memo)
        sim.collective("all_to_allv", topo.gpus[:16], matrix=w / w.sum(axis=1, keepdims=True) * 2**24, proto="simple")
        sim.run()
    sim.collective("all_reduce", topo.gpus[:16], 2**24)
    sim.run()
    sim.fabric.close_observer()
    return calls


def test_observer_on_marked_links_hands_what_comparing_every_link_hands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The observer's change test runs on the links whose load or flow count was written since the last
    observation (``Fabric._touch``): it hands the same intervals, bit for bit, as the test on every link. A write
    to ``_load`` or ``_nflows`` that skips ``_touch`` makes it miss that link's change, and this test fail."""
    marked = _observed_calls(False, monkeypatch)
    every = _observed_calls(True, monkeypatch)
    assert len(marked) > 50
    assert marked == every


def test_stacked_sums_of_a_list_not_kept_count_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """A segment list too long to keep (over ``_EXPANSION_LEN`` ids) is expanded afresh at each use: the stacked
    indices ``_row_link_sums`` tiles for it are not kept on it nor counted in the cache's bytes (counting what is
    not held would clear the cache early); a kept list's are kept and counted."""
    import numpy as np

    names = [f"n{i}" for i in range(9)]
    fab = Fabric(simpy.Environment(), chain(*names))
    segs = np.array([[fab.pair_segment(a, b), -1, -1] for a, b in itertools.pairwise(names)], dtype=np.int64)
    fab._flush_segments()
    P = np.ones((2, len(segs)))
    monkeypatch.setattr(Fabric, "_EXPANSION_LEN", segs.size - 1)
    x, _, _ = fab._row_link_sums(segs, P)
    assert not fab._exp_cache and not x.tiled and fab._exp_bytes == 0
    monkeypatch.setattr(Fabric, "_EXPANSION_LEN", segs.size)
    x, _, _ = fab._row_link_sums(segs, P)
    held = fab._exp_bytes
    assert len(fab._exp_cache) == 1 and len(x.tiled) == 1
    assert held >= sum(a.nbytes for a in x.tiled[(2, fab._has_cls)] if a is not None)
