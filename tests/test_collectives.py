"""Collectives on the fabric: analytic ring times, conservation, rendezvous, CLI, validation targets."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from cosim.engine import NcclConfig, SimConfig, Simulator
from cosim.engine.topoview import GraphTopology, cluster, nvswitch_node

US = 1e-6
B = 100e9  # NVLink bytes/s per GPU per direction in the fixtures


def sim_for(n: int = 8, **nccl) -> Simulator:
    nccl.setdefault("use_calibration", False)
    return Simulator(nvswitch_node(n, nvlink_bw=B), SimConfig(nccl=NcclConfig(**nccl)))


def run(sim: Simulator, op: str, ranks, nbytes: float, **kw):
    ev = sim.collective(op, ranks, nbytes, **kw)
    sim.run()
    return ev.value


@pytest.mark.parametrize("n", [2, 4, 8])
def test_ring_allreduce_follows_analytic_formula(n):
    sim = sim_for(n)
    S = 256 * 2**20
    r = run(sim, "all_reduce", sim.topo.gpus, S, algo="ring", proto="simple")
    # NCCL latency: baseLat[ring][simple] 8.4 us + nsteps 2(n-1) x hwLat[nvlink][ring][simple] 3.4 us
    lat = 8.4 * US + 2 * (n - 1) * 3.4 * US
    # bandwidth: every rank sends 2(n-1)/n S to its ring neighbour at B (efficiency 1: Simple x bus 1.0)
    assert r.time == pytest.approx(lat + 2 * (n - 1) / n * S / B, rel=1e-9)
    assert r.busbw == pytest.approx(r.algbw * 2 * (n - 1) / n)
    # LL moves half the payload per wire byte and is capped at 141 GB/s busbw (B=100 GB/s: not binding)
    r2 = run(sim_for(n), "all_reduce", sim.topo.gpus, S, algo="ring", proto="ll")
    assert r2.time == pytest.approx(6.6 * US + 2 * (n - 1) * 0.6 * US + 2 * (n - 1) / n * S / (0.5 * B), rel=1e-9)


def test_other_ops_analytic():
    n, S = 4, 64 * 2**20
    lat_ring = 8.4 * US + (n - 1) * 3.4 * US
    r = run(sim_for(n), "all_gather", sim_for(n).topo.gpus, S, algo="ring", proto="simple")
    assert r.time == pytest.approx(lat_ring + (n - 1) / n * S / B, rel=1e-9)
    r = run(sim_for(n), "broadcast", sim_for(n).topo.gpus, S, algo="ring", proto="simple")
    assert r.time == pytest.approx(lat_ring + S / B, rel=1e-9)
    r = run(sim_for(n), "send_recv", ["gpu0", "gpu1"], S, proto="simple")
    assert r.time == pytest.approx((6 + 3.4) * US + S / B, rel=1e-9)
    # all-to-all: each rank sends S/n to each of n-1 peers through its one uplink: (n-1)/n S / B
    r = run(sim_for(n), "all_to_all", sim_for(n).topo.gpus, S, proto="simple")
    assert r.time == pytest.approx((6 + 3.4) * US + (n - 1) / n * S / B, rel=1e-9)
    assert r.busbw == pytest.approx(r.algbw * (n - 1) / n)


def test_bytes_sent_equal_bytes_received():
    for op, algo in [("all_reduce", "ring"), ("all_reduce", "tree"), ("all_reduce", "nvls"), ("all_to_all", "auto"),
                     ("reduce_scatter", "ring")]:
        sim = sim_for(8)
        run(sim, op, sim.topo.gpus, 32 * 2**20, algo=algo)
        up = sum(sim.fabric.link(g, "nvswitch0").bytes for g in sim.topo.gpus)
        down = sum(sim.fabric.link("nvswitch0", g).bytes for g in sim.topo.gpus)
        assert up == pytest.approx(down, rel=1e-9), op
        assert up > 0


def test_all_to_allv_matrix_and_ring_bytes():
    sim = sim_for(3)
    m = [[0, 1e6, 2e6], [3e6, 0, 0], [0, 4e6, 0]]
    r = run(sim, "all_to_allv", sim.topo.gpus, 0.0, matrix=m, proto="simple")
    assert r.nbytes == 10e6
    assert sim.fabric.link("gpu0", "nvswitch0").bytes == pytest.approx(3e6)
    assert sim.fabric.link("nvswitch0", "gpu1").bytes == pytest.approx(5e6)
    # bottleneck: gpu1 receives 1 + 4 = 5 MB through its downlink: 50 us after the latency
    assert r.time == pytest.approx((6 + 3.4) * US + 5e6 / B, rel=1e-9)


def test_contention_with_other_traffic_is_real():
    S = 64 * 2**20
    alone = run(sim_for(4), "all_reduce", sim_for(4).topo.gpus, S, algo="ring", proto="simple").time
    sim = sim_for(4)
    sim.fabric.transfer("gpu0", "gpu2", 1e12, name="bulk")  # shares gpu0's uplink for the whole collective
    ev = sim.collective("all_reduce", sim.topo.gpus, S, algo="ring", proto="simple")
    sim.run(until=ev)
    lat = 8.4 * US + 6 * 3.4 * US
    # coupled ring: gpu0's ring flow gets half of gpu0's uplink, so the whole ring runs at B/2
    assert ev.value.time == pytest.approx(lat + 2 * (alone - lat), rel=1e-6)


def test_tuner_decides_with_nccls_constants_not_the_fit():
    """NCCL picks (algo, proto) with its own constants; the fitted parameters only time the pick."""
    import dataclasses

    from cosim.engine.nccl import Fitted

    sim = sim_for(8, use_calibration=True)
    # a fit that makes NVLS look free must not change the choice at 1 KiB (NCCL's defaults pick ring/LL)
    fake = Fitted.from_vector([40e-6, 40e-6, 40e-6, 2e-6, 5e-6, 0.5, 0.9, 1.0, 1.0])
    p = sim.nccl_params.with_fitted(fake)
    sim.nccl_params = sim.collectives.params = p
    r = run(sim, "all_reduce", sim.topo.gpus, 1024)
    assert (r.algo, r.proto) == ("ring", "ll")
    assert r.latency == pytest.approx(p.latency(sim.collectives.shape("all_reduce", sim.topo.gpus), "ring", "ll"))
    # with tuner "fitted" the simulator's own (fitted) estimate decides
    sim2 = sim_for(8, use_calibration=True)
    sim2.nccl_params = sim2.collectives.params = dataclasses.replace(p, tuner="fitted")
    assert run(sim2, "all_reduce", sim2.topo.gpus, 1024).algo == "nvls"


def test_tuner_picks_small_latency_and_large_bandwidth():
    sim = sim_for(8)
    small = run(sim, "all_reduce", sim.topo.gpus, 1024)
    big = run(sim, "all_reduce", sim.topo.gpus, 2**30)
    assert small.proto == "ll"
    assert (big.algo, big.proto) == ("nvls", "simple")
    # NVLS needs an NVSwitch
    import networkx as nx

    from cosim.engine.topoview import add_link

    g = nx.DiGraph()
    for i in range(4):
        g.add_node(f"gpu{i}", kind="gpu", node=0)
    for i in range(4):
        add_link(g, f"gpu{i}", f"gpu{(i + 1) % 4}", B)
    s2 = Simulator(GraphTopology(g), SimConfig(nccl=NcclConfig(use_calibration=False)))
    with pytest.raises(ValueError):
        run(s2, "all_reduce", s2.topo.gpus, 2**30, algo="nvls_bad")
    assert run(s2, "all_reduce", s2.topo.gpus, 2**30).algo != "nvls"


def test_multinode_algorithms_and_rails():
    g = cluster(4, 4, nvlink_bw=B, nic_bw=25e9)
    for algo in ("ring", "tree", "hier"):
        sim = Simulator(g, SimConfig(nccl=NcclConfig(use_calibration=False)))
        r = run(sim, "all_reduce", sim.topo.gpus, 2**28, algo=algo, proto="simple")
        assert r.algo == algo and r.time > 0
        # every NIC uplink carried the same bytes (rails used evenly)
        nic_up = [sim.fabric.link(f"node{k}.nic{i}", f"fabric.leaf{i}").bytes for k in range(4) for i in range(4)]
        if algo in ("ring", "hier"):
            assert max(nic_up) == pytest.approx(min(nic_up), rel=1e-9)


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "broadcast"])
def test_multinode_ring_spreads_channels_over_all_rails(op):
    """Worked example: 2 nodes x 4 GPUs (NVLink 100 GB/s per GPU), one 20 GB/s NIC per GPU on its own rail.
    NCCL runs one ring per NIC (channel c on NIC c, PXN: a node's ring leaves through the NIC it entered
    by), so each ring carries 1/4 of the data and crosses each node boundary on its own rail:
      all-gather / reduce-scatter: a ring hop moves (n-1)/n S / 4; the 20 GB/s NIC is the slowest hop
        (each GPU's NVLink carries one hop per ring: 4 x 20 = 80 < 100 GB/s), so
        t = latency + (n-1)/n S / (4 x 20 GB/s), busbw = 4 x 20 = 80 GB/s (the node's aggregate NIC rate);
      broadcast: a pipelined chain per ring from the root, S / 4 per hop: t = latency + S / (4 x 20 GB/s).
    latency (NCCL's ring, Simple): baseLat 8.4 us + (n-1 - 1) x 3.4 us (NVLink steps) + 1 x 14 us (net step).
    One chain through all 8 GPUs would cross one NIC: 20 GB/s busbw."""
    nic = 20e9
    g = cluster(2, 4, nvlink_bw=B, nic_bw=nic)
    sim = Simulator(g, SimConfig(nccl=NcclConfig(use_calibration=False)))
    n, S = 8, 2**30
    r = run(sim, op, sim.topo.gpus, S, algo="ring", proto="simple")
    lat = 8.4 * US + (n - 2) * 3.4 * US + 14.0 * US
    per_hop = S / 4 if op == "broadcast" else (n - 1) / n * S / 4
    assert r.time == pytest.approx(lat + per_hop / nic, rel=1e-6)
    assert r.busbw == pytest.approx((S if op == "broadcast" else (n - 1) / n * S) / (per_hop / nic + lat),
                                    rel=1e-9)
    assert r.busbw > 0.99 * 4 * nic * (1 - lat / r.time)
    # every rail carries one ring's hop each way, rail-aligned (nothing crosses the spine); broadcast from
    # gpu0 (ring 0's entry on node 0): ring 0's chain ends on node 1, rings 1-3 wrap back to node 0
    up = [sim.fabric.link(f"node{k}.nic{i}", f"fabric.leaf{i}").bytes for k in range(2) for i in range(4)]
    want = [per_hop] * 8
    if op == "broadcast":
        want[4] = 0.0
    assert up == pytest.approx(want, rel=1e-9)
    assert all(sim.fabric.link(f"fabric.leaf{i}", "fabric.spine0").bytes == 0 for i in range(4))


def test_rendezvous_starts_when_all_ranks_arrive():
    sim = sim_for(4)
    ranks = sim.topo.gpus
    ends = {}

    def rank(i):
        yield sim.env.timeout(10 * US * i)  # rank 3 arrives last, at 30 us
        call = sim.collective_call(("tp", 0), "all_reduce", ranks, 2**20, algo="ring", proto="simple")
        res = yield call.arrive(ranks[i])
        ends[i] = (sim.now, res.start)

    for i in range(4):
        sim.env.process(rank(i))
    sim.run()
    assert [v[1] for v in ends.values()] == [pytest.approx(30 * US)] * 4
    assert len({v[0] for v in ends.values()}) == 1


def test_collectives_deterministic():
    def once():
        g = cluster(2, 4, nvlink_bw=B, nic_bw=25e9)
        sim = Simulator(g, SimConfig(nccl=NcclConfig(use_calibration=False)))
        evs = [sim.collective("all_reduce", sim.topo.gpus, 2**26),
               sim.collective("all_to_all", sim.topo.gpus, 2**24)]
        sim.run()
        return [(e.value.algo, e.value.proto, e.value.time) for e in evs], sim.trace

    assert once() == once()


# ----------------------------------------------------------------------------- CLI
def test_cli_collective_json(capsys):
    pytest.importorskip("cosim.topology")
    from cosim.cli import main

    assert main(["collective", "--topology", "dgx-h100", "--op", "all_reduce", "--ranks", "8",
                 "--sizes", "1MiB,64MiB", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = out["results"]
    assert [r["size_bytes"] for r in rows] == [2**20, 2**26]
    assert set(rows[0]) == {"size_bytes", "time_s", "algbw_Bps", "busbw_Bps", "algo", "proto"}
    r = rows[1]
    assert r["algbw_Bps"] == pytest.approx(r["size_bytes"] / r["time_s"])
    assert r["busbw_Bps"] == pytest.approx(r["algbw_Bps"] * 2 * 7 / 8)


def test_cli_collective_table_and_errors(capsys):
    pytest.importorskip("cosim.topology")
    from cosim.cli import main

    assert main(["collective", "-t", "dgx-h100-4node", "--ranks", "16", "--ranks-per-node", "4",
                 "--sizes", "1KiB:4KiB", "--algo", "ring", "--proto", "simple"]) == 0
    out = capsys.readouterr().out
    assert "4 KiB" in out and "ring/simple" in out
    assert main(["collective", "-t", "dgx-h100", "--ranks", "9", "--sizes", "1MiB"]) == 2
    assert "only 8 GPUs" in capsys.readouterr().err


@pytest.mark.parametrize("args, says", [
    (["-t", "dgx-h100", "--algo", "nvls", "--proto", "ll"], "protocol 'll' is not available with algorithm nvls"),
    (["-t", "dgx-h100", "--op", "send_recv", "--ranks", "2", "--proto", "ll128"], "algorithm p2p (it runs ll, simple)"),
    (["-t", "dgx-h100", "--op", "all_to_all", "--algo", "tree"], "point-to-point transfers"),
    (["-t", "dgx-h100-4node", "--algo", "nvls"], "the ranks span several nodes"),
    (["-t", "dgx-a100", "--algo", "nvls"], "predates Hopper"),
    (["-t", "dgx-h100", "--comm-sms", "100000"], "the GPU has only 132 SMs"),
])
def test_cli_collective_impossible_overrides(capsys, args, says):
    """An algorithm/protocol the communicator cannot run is one line and exit status 2, as NCCL refuses
    an NCCL_ALGO / NCCL_PROTO with no available algorithm."""
    pytest.importorskip("cosim.topology")
    from cosim.cli import main

    assert main(["collective", *args, "--sizes", "1MiB"]) == 2
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1 and "Traceback" not in err


def test_busbw_of_one_rank_is_zero(capsys):
    """nccl-tests: busbw = algbw * 2(n-1)/n for all-reduce, 0 on one rank; sizes come back as integers."""
    pytest.importorskip("cosim.topology")
    from cosim.cli import main

    assert main(["collective", "-t", "dgx-h100", "--ranks", "1", "--sizes", "1MiB", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)["results"]
    assert row["busbw_Bps"] == 0.0 and row["algbw_Bps"] > 0 and row["size_bytes"] == 2**20
    assert isinstance(row["size_bytes"], int)
    assert main(["collective", "-t", "dgx-h100", "--sizes", "12"]) == 2


# ----------------------------------------------------------------------- validation
def test_validation_error_targets_on_held_out_points():
    """Leave-one-configuration-out errors of the 10-parameter global model on the measured
    median statistic (issue 3; see validation/collectives/RESULTS.md)."""
    run_mod = pytest.importorskip("validation.collectives.run")
    root = run_mod.measured_dir()
    if root is None:
        pytest.skip("../shared/measured not found: measured NCCL data absent")
    assert run_mod.STAT == "median"
    results = run_mod.evaluate(root)
    per = run_mod.per_gpu_count(results)
    assert set(per) == {2, 4, 8}
    # what holds: the held-out median on 2 and 4 GPUs; on 8 GPUs (NVLS at NCCL's own bandwidth factor, not
    # fitted, which matches NVIDIA's published NVLS peaks: test_published_nvls_peaks) the pipeline fill and
    # NCCL's chunk by size put the intercept right, but vidur's harness reads ~0.81 of NVIDIA's rates on ring
    # and NVLS alike (4.7 us/MiB from 16 MiB vs 3.9): its NVLS points are slower than the model by a rate,
    # 10-20% from 16 MiB, and the 8-GPU median stays below 15% (21% before the fill)
    for n, st in per.items():
        assert st["median"] <= (run_mod.TARGET_MEDIAN if n < 8 else 0.15), (n, st)
    for n, st in run_mod.per_gpu_count(results, bound=True).items():  # collective-bound points only
        assert st["median"] <= (run_mod.TARGET_MEDIAN if n < 8 else 0.15), (n, st)
    for r in results:
        if r.case.name.startswith("dgx-h100") and r.case.workers < 8:
            m = ~r.pts.outlier & ~r.host_bound
            # collective-bound points: 4 GPUs 4.9%, 2 GPUs 10.1% (its large rings read 300 GB/s busbw while the
            # fold without it, fitted on the pairwise rings and DGX send/recv at 348 GB/s, runs them ~11% faster)
            assert np.median(np.abs(r.err(True)[m])) <= (0.105 if r.case.workers == 2 else 0.10), r.case.name
    r8 = next(r for r in results if r.case.name == "dgx-h100 all_reduce 8 GPUs")
    big = (r8.pts.size >= 16 * 2**20) & ~r8.pts.outlier
    e8 = r8.err(True)[big]
    assert (e8 < 0).all() and -0.20 < e8.min() and np.median(e8) < -0.08, e8
    m8 = ~r8.pts.outlier & ~r8.host_bound
    assert np.abs(r8.err(True)[m8]).max() <= 0.25  # collective-bound 8-GPU points within the max target
    # fitted parameters stay inside the physical bounds
    from cosim.engine import load_params

    x = load_params().fitted.vector()
    assert all(lo - 1e-12 <= v <= hi + 1e-12 for v, lo, hi in zip(x, run_mod.LO, run_mod.HI)), x
    missed = {n: (round(st["median"], 3), round(st["max"], 3)) for n, st in per.items()
              if st["median"] > run_mod.TARGET_MEDIAN or st["max"] > run_mod.TARGET_MAX}
    if missed:
        assert set(missed) <= {2, 4, 8}
        floor = {n: round(st["floor"], 3) for n, st in run_mod.floor_per_gpu_count(results, filtered=False).items()}
        pytest.xfail(f"held-out max-error target missed (GPU count: (median, max)) {missed}; no model whose time "
                     f"does not fall with size can reach below {floor} on these points (test_max_target_floor): "
                     "small all-reduces whose measured median reads the host's launch period (DGX ~42 us) or, in "
                     "other runs, the collective itself (7 us); also a protocol switch NCCL's default constants "
                     "place elsewhere (pairwise 4 GPUs), and pairwise-NVLink send/recv above the bridge's "
                     "documented capacity; see validation/collectives/RESULTS.md")


def test_monotone_floor_analytic():
    """The max-error floor of non-decreasing predictions, worked by hand: 10, 40, 10 us measured;
    a non-decreasing x has x2 >= x1, so max(|x1/40 - 1|, |x2/10 - 1|) >= (40-10)/(40+10) = 60%."""
    run_mod = pytest.importorskip("validation.collectives.run")
    t = np.array([10e-6, 40e-6, 10e-6])
    assert run_mod.monotone_floor(t) == (pytest.approx(0.6), 1, 2)
    x = run_mod.monotone_fit(t)
    assert np.all(np.diff(x) >= 0) and np.abs(x / t - 1).max() == pytest.approx(0.6)
    assert x[1] == pytest.approx(16e-6) and x[2] == pytest.approx(16e-6)  # 40(1-0.6) = 10(1+0.6)
    # a rising curve costs nothing; allowing a 25% fall absorbs 40 -> 30 but not 40 -> 10:
    # (0.75*40 - 10) / (0.75*40 + 10) = 50%
    assert run_mod.monotone_floor(np.array([1.0, 2.0, 3.0]))[0] == 0.0
    assert run_mod.monotone_floor(np.array([10.0, 40.0, 30.0]), drop=0.25)[0] == 0.0
    assert run_mod.monotone_floor(t, drop=0.25)[0] == pytest.approx(0.5)
    y = run_mod.monotone_fit(t, drop=0.25)
    assert y[2] >= 0.75 * y[1] - 1e-18 and np.abs(y / t - 1).max() == pytest.approx(0.5)


def test_max_target_floor():
    """On all measured points (median statistic), every GPU count holds a pair of neighbouring sizes
    where the larger size reads several times less (the host's launch period vs the collective), so
    no model whose time does not fall with size -- nor one that may fall 10% -- reaches the 25% max."""
    run_mod = pytest.importorskip("validation.collectives.run")
    root = run_mod.measured_dir()
    if root is None:
        pytest.skip("../shared/measured not found: measured NCCL data absent")
    results = run_mod.evaluate(root)
    strict = run_mod.floor_per_gpu_count(results, filtered=False)
    loose = run_mod.floor_per_gpu_count(results, filtered=False, drop=run_mod.FLOOR_DROP)
    assert set(strict) == {2, 4, 8}
    for n in strict:
        assert loose[n]["floor"] > run_mod.TARGET_MAX, (n, loose[n])
        (s0, t0), (s1, t1) = strict[n]["pair"]
        assert s0 < s1 and t0 > 1.6 * t1, strict[n]
        # a floor is a floor: cosim's own held-out max is not below it
        assert run_mod.per_gpu_count(results, filtered=False)[n]["max"] >= strict[n]["floor"]
    assert strict[2]["floor"] == pytest.approx(0.68, abs=0.01)  # 42 us at 74 KiB, 8 us at 122 KiB
    # to reach 25% a model must fall with size by more than any collective-bound curve here does (<= 28%)
    # on 2 and 4 GPUs; on 8 GPUs by 17%, exactly where the harness flips from host period to collective
    assert strict[2]["fall_needed"] > 0.6 and strict[4]["fall_needed"] > 0.4 and strict[8]["fall_needed"] > 0.15


def test_fall_needed_by_hand():
    """40 then 10 us: 25% max needs (1-d)(0.75)(40) <= (1.25)(10), d >= 1 - 12.5/30 = 58.3%."""
    run_mod = pytest.importorskip("validation.collectives.run")
    assert run_mod.fall_needed(np.array([40.0, 10.0]), 0.25) == pytest.approx(1 - 12.5 / 30)
    assert run_mod.fall_needed(np.array([10.0, 40.0, 30.0]), 0.25) == 0.0
    d = run_mod.fall_needed(np.array([40.0, 10.0]), 0.25)
    assert run_mod.monotone_floor(np.array([40.0, 10.0]), drop=d)[0] == pytest.approx(0.25)


def test_host_floor_from_measurements():
    """The host launch period read from each machine's small all-reduces (real data): most runs of
    the small DGX 4-GPU all-reduces sit at it, while 8 GPUs' fastest runs are far below."""
    run_mod = pytest.importorskip("validation.collectives.run")
    root = run_mod.measured_dir()
    if root is None:
        pytest.skip("../shared/measured not found: measured NCCL data absent")
    dgx = run_mod.host_floor(root, "vidur-dgx-h100/all_reduce.csv")
    pair = run_mod.host_floor(root, "vidur-h100-pairwise-nvlink/send_recv.csv")  # the machine's all-reduce file
    assert 35e-6 <= dgx <= 50e-6 and 25e-6 <= pair <= 35e-6, (dgx, pair)
    cases = {c.name: c for c in run_mod.CASES}
    r4 = run_mod.runs(cases["dgx-h100 all_reduce 4 GPUs"], root)
    r8 = run_mod.runs(cases["dgx-h100 all_reduce 8 GPUs"], root)
    small = [s for s in r4 if s <= 2**20 and s in r8]
    at_floor = np.mean([r4[s][1] > run_mod.HOST_FLOOR_RUN * dgx for s in small])
    assert at_floor > 0.9
    assert np.median([r8[s][0] for s in small]) < 0.75 * np.median([r4[s][1] for s in small])


def test_cluster_router_matches_topology_paths():
    topology = pytest.importorskip("cosim.topology")
    import random

    from cosim.engine.topoview import ClusterRouter

    t = topology.load_topology("dgx-h100-4node")
    router = ClusterRouter(t)
    gpus = t.gpus
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    random.Random(1).shuffle(pairs)
    for a, b in pairs[:60]:
        assert sorted(map(tuple, router(a, b))) == sorted(map(tuple, t.paths(a, b))), (a, b)


# ----------------------------------------------------------------------------- NICs
def _two_hosts(gpudirect: bool, **nic) -> Simulator:
    """Two hosts of one GPU each, PCIe 10 GB/s per direction everywhere inside a host, 25 GB/s NICs."""
    from cosim.engine.config import NicConfig

    g = cluster(2, 1, nvlink_bw=B, nic_bw=25e9, pcie_bw=10e9)
    return Simulator(g, SimConfig(nccl=NcclConfig(use_calibration=False),
                                  nic=NicConfig(default_gpudirect=gpudirect, **nic)))


@pytest.mark.parametrize("gpudirect", [True, False])
def test_collective_gpudirect_or_host_bounce(gpudirect):
    """send/recv of 1 GB between hosts next to a 3 GB host-to-GPU copy on the sender's host (it outlasts the
    send). With GPUDirect
    RDMA the send leaves by GPU -> PCIe switch -> NIC and shares no link with the copy (CPU -> switch -> GPU):
    1 GB / 10 GB/s = 0.1 s. Without it the send is staged in host memory (GPU -> CPU -> NIC) and shares the
    CPU -> switch link with the copy: half of 10 GB/s each, 0.2 s."""
    sim = _two_hosts(gpudirect)
    a, b = "node0.gpu0", "node1.gpu0"
    ev = sim.collective("send_recv", [a, b], 1e9)
    copy = sim.transfer("node0.cpu0", a, 3e9)
    sim.run()
    r = ev.value
    assert copy.processed
    assert r.time - r.latency == pytest.approx(0.1 if gpudirect else 0.2, rel=1e-6)
    up = sim.fabric.link("node0.pcie0", "node0.cpu0").bytes  # only the staged send goes up to the CPU
    assert up == pytest.approx(0.0 if gpudirect else 1e9)
    # bytes sent = bytes received, either way: every link into node1.gpu0 carries the message once
    assert sim.fabric.link("node1.pcie0", "node1.gpu0").bytes == pytest.approx(1e9)


def test_collective_gpudirect_shares_the_gpus_pcie_link():
    """With GPUDirect, the NIC's traffic and the GPU's own device-to-host copy (3 GB, outlasting the send)
    share GPU -> PCIe switch: 5 GB/s each, 1 GB in 0.2 s."""
    sim = _two_hosts(True)
    ev = sim.collective("send_recv", ["node0.gpu0", "node1.gpu0"], 1e9)
    sim.transfer("node0.gpu0", "node0.cpu0", 3e9)
    sim.run()
    assert ev.value.time - ev.value.latency == pytest.approx(0.2, rel=1e-6)


def test_collective_nic_message_rate_caps_small_messages():
    """1,000 messages/s of at most 1 KB each cap a flow at 1 MB/s: an all-to-all between two hosts with
    4 KB per peer moves it in 4 ms; with 1 M msg/s the cap is 1 GB/s: 4 us."""
    slow = _two_hosts(True, default_message_rate=1e3, message_size=1e3)
    ev = slow.collective("all_to_all", ["node0.gpu0", "node1.gpu0"], 8e3)  # 4 KB to the peer
    slow.run()
    assert ev.value.time - ev.value.latency == pytest.approx(4e3 / 1e6, rel=1e-6)
    fast = _two_hosts(True, default_message_rate=1e6, message_size=1e3)
    ev = fast.collective("all_to_all", ["node0.gpu0", "node1.gpu0"], 8e3)
    fast.run()
    assert ev.value.time - ev.value.latency == pytest.approx(4e3 / 1e9, rel=1e-6)  # 1 GB/s cap: 1e6 x 1 KB


def test_transfer_through_nics_pays_latency_overhead_and_message_rate():
    """A point-to-point transfer between hosts (``sim.transfer``): the NIC latency once plus each NIC's
    per-message overhead (sender's and receiver's), then 1 GB over the 10 GB/s PCIe bottleneck."""
    sim = _two_hosts(True, default_latency=2e-6, default_per_message_overhead=1e-6)
    sim.transfer("node0.gpu0", "node1.gpu0", 1e9)
    sim.run()
    assert sim.now == pytest.approx(2e-6 + 2 * 1e-6 + 0.1, rel=1e-9)
    # 1,000 messages/s of 1 KB: 1 MB/s, whatever the links offer
    sim = _two_hosts(True, default_latency=2e-6, default_message_rate=1e3, message_size=1e3)
    sim.transfer("node0.gpu0", "node1.gpu0", 1e6)
    sim.run()
    assert sim.now == pytest.approx(2e-6 + 1.0, rel=1e-9)


def test_transfer_without_gpudirect_is_staged_in_host_memory():
    """Without GPUDirect RDMA the bytes go GPU -> CPU, CPU -> CPU over the NICs, CPU -> GPU (three coupled
    flows): the host links carry them, and a host-to-GPU copy on the sender's host halves the rate."""
    for gpudirect, expect in ((True, 0.1), (False, 0.2)):
        sim = _two_hosts(gpudirect, default_latency=0.0)
        sim.transfer("node0.gpu0", "node1.gpu0", 1e9)
        sim.transfer("node0.cpu0", "node0.gpu0", 3e9)
        sim.run(until=0.25)
        t = sim.fabric.link("node1.pcie0", "node1.gpu0")
        assert t.bytes == pytest.approx(1e9)  # delivered by 0.25 s either way
        assert sim.fabric.link("node1.cpu0", "node1.pcie0").bytes == pytest.approx(0.0 if gpudirect else 1e9)
        assert t.busy_time == pytest.approx(expect, rel=1e-6)  # the receive link is busy while it moves


def test_channels_cap_a_collectives_bandwidth():
    """A channel carries at most NCCL's fastest planned channel speed (Hopper, inside a node: 60 GB/s), so a
    ring all-reduce on 1 channel of a DGX H100 moves 2(n-1)/n S at 60 GB/s per rank; at the default 16
    channels (960 GB/s) NVLink is the limit again, as without the cap."""
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100")
    S = 2.0**30

    def run(channels):
        sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False))
        ev = sim.collective("all_reduce", topo.gpus, S, algo="ring", proto="simple", channels=channels)
        sim.run()
        return ev.value

    one = run(1)
    assert one.time - one.latency == pytest.approx(2 * 7 / 8 * S / 60e9, rel=1e-9)
    assert run(2).time - run(2).latency == pytest.approx((one.time - one.latency) / 2, rel=1e-9)
    assert run(16).time == pytest.approx(run(None).time, rel=1e-12)
    p = run(None)
    assert p.time - p.latency > 2 * 7 / 8 * S / (16 * 60e9)  # NVLink, not the 16 channels, is the limit


def test_nvls_in_switch_reduction_moves_s_each_way_at_nccls_nvls_factor() -> None:
    """NVLS all-reduce reduces in the switch: each GPU sends its whole buffer S up (multimem ld_reduce)
    and receives the whole result S down (multimem st), at the fitted Simple efficiency x NCCL's Hopper
    NVLS factor (nvlsEfficiency 0.85 x 15/16 channels, not fitted) of the NVLink capacity: 8 GiB on
    8 H200 -> transfer time S / (18 x 25 GB/s x 0.77 x eff_simple x 0.796875), the same on 4 GPUs;
    busbw = 2 (n-1)/n x that rate."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    sim = Simulator(load_topology("hgx-h200"), SimConfig(record_trace=False))
    S = 8 * 2**30
    ev = sim.collective("all_reduce", sim.topo.gpus, S)
    sim.run()
    r = ev.value
    fit = sim.nccl_params.fitted
    assert fit.nvls_efficiency == pytest.approx(0.85 * 15 / 16)
    rate = 18 * 25e9 * 0.77 * fit.efficiency["simple"] * 0.85 * 15 / 16
    assert r.algo == "nvls"
    assert r.time - r.latency == pytest.approx(S / rate, rel=1e-6)
    # 4 GPUs move the same S each way: same transfer time (vidur's DGX H100: 4.64 and 4.75 us/MiB)
    ev4 = sim.collective("all_reduce", sim.topo.gpus[:4], S, algo="nvls")
    sim.run()
    assert ev4.value.time - ev4.value.latency == pytest.approx(S / rate, rel=1e-6)


def test_nvls_needs_more_than_two_gpus_per_node() -> None:
    """NCCL enables NVLS only with more than 2 GPUs (src/transport/nvls.cc: gpuCount <= 2 -> off): a
    2-GPU all-reduce on an NVSwitch runs a ring at every size, and forcing NVLS says why."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    sim = Simulator(load_topology("dgx-h100"), SimConfig(record_trace=False))
    two = sim.topo.gpus[:2]
    assert sim.collectives.shape("all_reduce", two).nvls is False
    assert sim.collectives.shape("all_reduce", sim.topo.gpus[:3]).nvls is True
    ev = sim.collective("all_reduce", two, 2**30)
    sim.run()
    assert ev.value.algo == "ring"
    with pytest.raises(ValueError, match="more than 2 GPUs per node"):
        sim.collective("all_reduce", two, 2**30, algo="nvls")


def test_published_nvls_peaks() -> None:
    """NVIDIA's published single-node NVLS all-reduce peaks (validation/collectives/published/sources.yaml:
    480 / 476 GB/s on 8 H100, 477 on 8 H200), not fitted: within 5% with NCCL's NVLS factor."""
    pub = pytest.importorskip("validation.collectives.published")
    for sw in pub.load():
        if "nvls-allreduce" in sw["id"] and sw["nodes"] == 1:
            for row in pub.simulate(sw):
                assert abs(row["err"]) <= 0.05, (sw["id"], row)
                assert row["pick"] == "nvls/simple"


def test_nvls_tree_across_nodes() -> None:
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-4node")
    sim = Simulator(topo, SimConfig(record_trace=False))
    ranks = list(topo.gpus)[:16]
    ev = sim.collective("all_reduce", ranks, 2**32)
    sim.run()
    res: Any = ev.value
    assert res.algo == "nvls_tree"
    with pytest.raises(ValueError, match="use nvls_tree"):
        sim.collective("all_reduce", ranks, 2**20, algo="nvls")


def test_cli_collective_comm_sms_caps_the_channels(capsys):
    """``cosim collective --comm-sms N``: NCCL runs one thread block (one SM) per channel, so N SMs run N
    channels of at most 60 GB/s each (Hopper, inside a node, NCCL's constants). A 1 GiB ring all-reduce on a
    DGX H100 moves 2 (n-1)/n S per rank: with 1 SM it takes latency + 2 * 7/8 * S / 60 GB/s, with 2 SMs half
    that transfer time (same latency); with 16 SMs (the parameters' 16 channels) it is the default run, whose
    limit is NVLink, not the channels."""
    pytest.importorskip("cosim.topology")
    import json as _json

    from cosim.cli import main

    def t(*extra: str) -> float:
        assert main(["collective", "-t", "dgx-h100", "--sizes", "1GiB", "--algo", "ring", "--proto", "simple",
                     "--no-calibration", "--json", *extra]) == 0
        return _json.loads(capsys.readouterr().out)["results"][0]["time_s"]

    S = 2.0**30
    one, two, sixteen, default = t("--comm-sms", "1"), t("--comm-sms", "2"), t("--comm-sms", "16"), t()
    wire = 2 * 7 / 8 * S / 60e9
    assert one - two == pytest.approx(wire / 2, rel=1e-9)
    assert sixteen == pytest.approx(default, rel=1e-12)
    assert default - (one - wire) > wire / 16  # 16 channels would allow more than NVLink gives
    assert main(["collective", "-t", "dgx-h100", "--sizes", "1MiB", "--comm-sms", "4", "--channels", "8"]) == 2
    assert "needs 8 SMs" in capsys.readouterr().err
    assert main(["collective", "-t", "dgx-h100", "--sizes", "1MiB", "--comm-sms", "0"]) == 2
    assert "--comm-sms must be >= 1" in capsys.readouterr().err


def test_tuner_picks_only_nccls_algorithms_across_nodes() -> None:
    """NCCL has no hierarchical all-reduce: across nodes the tuner chooses among ring, tree and NVLS-tree
    (src/graph/tuning.cc), by size: a ring or tree with LL / LL128 at 1 MiB (NCCL's 2-node Hopper LL cap,
    llMaxBws 45 GB/s) and NVLS-tree from 2 MiB on 2 x 8 H100 (the published 2-node sweep in
    validation/collectives: 2 MiB within 5%); ``algo="hier"`` still runs it."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-4node")
    ranks = [g for g in topo.gpus if topo.node_of(g) in (0, 1)]
    assert len(ranks) == 16
    sim = Simulator(topo, SimConfig(record_trace=False))
    assert all(a != "hier" for a, _ in sim.collectives.candidates("all_reduce", ranks))
    a, p = sim.collectives.choose("all_reduce", ranks, 2**20)
    assert a in ("ring", "tree") and p in ("ll", "ll128")
    assert sim.collectives.choose("all_reduce", ranks, 2 * 2**20) == ("nvls_tree", "simple")
    ev = sim.collective("all_reduce", ranks, 2**20, algo="hier")
    sim.run()
    assert ev.value.algo == "hier"


def test_nvls_chunk_by_size_follows_ncclss_enqueue_rule() -> None:
    """NCCL's NVLS chunk (src/enqueue.cc, calcCollChunking) with 16 NVLS channels (Hopper) x nHeads.
    One node of 8 GPUs: concurrentOps 128; the 128 KiB chunk is 64 KiB below 64 x 128 x 128 KiB = 1 GiB,
    32 KiB below 8 x 128 x 64 KiB = 64 MiB, 16 KiB below 2 x 128 x 32 KiB = 8 MiB. 4 GPUs (64 ops):
    32 KiB below 32 MiB. NVLS-tree on 2 nodes of 8 (128 ops): 128 KiB, 64 KiB below 4 x 128 x 128 KiB =
    64 MiB, 32 KiB below 1 x 128 x 64 KiB = 8 MiB; from 4 nodes at most 64 KiB."""
    from cosim.engine import load_params
    from cosim.engine.nccl import Shape

    p = load_params()
    one = Shape("all_reduce", 8, 1, 8, "nvswitch", nvls=True)
    MiB = 2**20
    assert [p.nvls_chunk(one, "nvls", s * MiB) for s in (4, 8, 63, 64, 1023, 1024)] == \
        [16384, 32768, 32768, 65536, 65536, 131072]
    four = Shape("all_reduce", 4, 1, 4, "nvswitch", nvls=True)
    assert [p.nvls_chunk(four, "nvls", s * MiB) for s in (3, 4, 31, 32)] == [16384, 32768, 32768, 65536]
    two = Shape("all_reduce", 16, 2, 8, "nvswitch", nvls=True)
    assert [p.nvls_chunk(two, "nvls_tree", s * MiB) for s in (4, 8, 63, 64, 16384)] == \
        [32768, 65536, 65536, 131072, 131072]
    eight = Shape("all_reduce", 64, 8, 8, "nvswitch", nvls=True)
    assert p.nvls_chunk(eight, "nvls_tree", 16384 * MiB) == 65536
    assert p.nvls_stages(one, "nvls") == 3 and p.nvls_stages(two, "nvls_tree") == 4
    assert p.nvls_stages(eight, "nvls_tree") == 8  # NVLS up, 3 tree levels up, 3 down, NVLS down


def test_nvls_tree_two_nodes_pipeline_steps_by_hand() -> None:
    """2 x 8 H100, NVLS-tree all-reduce (fitted model): 128 pipes (16 channels x 8 rails) move
    128 x 64 KiB = 8 MiB per step at 16 and 32 MiB; a chunk passes 4 stages (NVLS reduce, up the tree,
    down, NVLS multicast), so the call takes nsteps + 3 steps: 16 MiB 2 + 3 = 5, 32 MiB 4 + 3 = 7 steps of
    equal time. Hence (T16 - L) / (T32 - T16) = 5 / 2 with L = nvls_latency + 2 log2(2) x NCCL's
    NVLS-tree network hwLat (20.9 us x the fitted hwLat factor). Below one step a call fills it partly:
    at 2 MiB (32 KiB chunks, 4 MiB per step) the fill is 3 x 2 MiB."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-4node")
    ranks = [g for g in topo.gpus if topo.node_of(g) in (0, 1)]
    sim = Simulator(topo, SimConfig(record_trace=False))
    p, MiB = sim.nccl_params, 2**20
    shape = sim.collectives.shape("all_reduce", ranks)
    assert p.pipeline_fill(shape, "nvls_tree", 16 * MiB) == 3 * 8 * MiB
    assert p.pipeline_fill(shape, "nvls_tree", 2 * MiB) == 3 * 2 * MiB
    assert p.pipeline_fill(shape, "nvls_tree", 16 * MiB, use_fit=False) == 0  # NCCL's tuner has no fill
    fit = p.fitted
    L = fit.nvls_latency + 2 * 20.9e-6 * fit.hw_latency_scale
    assert p.latency(shape, "nvls_tree", "simple") == pytest.approx(L, rel=1e-9)

    def t(S: float) -> float:
        ev = sim.collective("all_reduce", ranks, S)
        sim.run()
        assert ev.value.algo == "nvls_tree"
        return float(ev.value.time)

    t16, t32 = t(16 * MiB), t(32 * MiB)
    assert (t16 - L) / (t32 - t16) == pytest.approx(5 / 2, rel=1e-6)


def test_nvls_chunk_step_caps_small_calls() -> None:
    """Each of the 16 NVLS channels moves one chunk per step of at least the fitted ``nvls_step``: a GPU
    moves at most 16 x chunk / nvls_step each way. 8 x H200, 4 MiB all-reduce: 16 KiB chunks, a cap of
    16 x 16 KiB / nvls_step (below NVLink's NVLS rate, so it binds), 128 pipes x 16 KiB = 2 MiB per step and
    2 fill steps (3 stages: scatter, switch reduce + multicast, gather): T = nvls_latency + (4 + 2 x 2) MiB
    / cap. At 8 GiB (128 KiB chunks) the cap is 8x higher and NVLink binds (test above)."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    sim = Simulator(load_topology("hgx-h200"), SimConfig(record_trace=False))
    p, MiB = sim.nccl_params, 2**20
    fit = p.fitted
    cap = 16 * 16384 / fit.nvls_step
    link = 18 * 25e9 * 0.77 * fit.efficiency["simple"] * 0.85 * 15 / 16
    assert cap < link
    shape = sim.collectives.shape("all_reduce", sim.topo.gpus)
    assert p.rate_cap(shape, "nvls", "simple", 16, 4 * MiB) == pytest.approx(cap, rel=1e-12)
    assert p.rate_cap(shape, "nvls", "simple", 16, 4 * MiB, use_fit=False) == pytest.approx(16 * 60e9)
    ev = sim.collective("all_reduce", sim.topo.gpus, 4 * MiB, algo="nvls")
    sim.run()
    assert ev.value.time == pytest.approx(fit.nvls_latency + (4 + 2 * 2) * MiB / cap, rel=1e-6)


def test_published_two_node_nvls_tree_sweep() -> None:
    """The published 2 x 8 H200 NVLS-tree all-reduce sweep (validation/collectives/published, not fitted):
    busbw within 20% at every size from 1 MiB to 16 GiB except 16 MiB (bimodal in the source: out-of-place
    304 us, in-place 208 us), median within 8%."""
    pub = pytest.importorskip("validation.collectives.published")
    sw = next(s for s in pub.load() if s["id"] == "h200-2node-nvls-tree-allreduce")
    rows = pub.simulate(sw)
    errs = [abs(r["err"]) for r in rows if r["size"] != 16 * 2**20]
    assert max(errs) <= 0.20, rows
    assert float(np.median(errs)) <= 0.08
