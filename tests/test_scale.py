"""Scale by structure, checked for exactness: coalesced collectives (a memo of the collective's run
alone on an idle fabric, materialized as real flows when another flow arrives on its links) give the
same times and link counters as solving every collective, on hand-built overlaps and on synthesized
64-GPU training steps (several layouts, uniform and skewed routing)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cosim.engine import SimConfig, Simulator
from cosim.engine.flows import Fabric, FabricConfig
from tests._cards import TINY as _TINY


def _overlap(coalesce: bool, topo: object, at: float, algo: str = "auto") -> tuple[list[float], object]:
    """Three back-to-back all-reduces on every GPU and, from ``at``, two all-to-allvs on the first 4."""
    sim = Simulator(topo, SimConfig(fabric=FabricConfig(coalesce=coalesce), record_trace=False))
    g = list(sim.topo.gpus)
    out: list[float] = []

    def reduce():  # type: ignore[no-untyped-def]
        for _ in range(3):
            r = yield sim.collective("all_reduce", g, 64 * 2**20, algo=algo)
            out.append(r.time)

    def a2a():  # type: ignore[no-untyped-def]
        yield sim.env.timeout(at)
        m = np.random.default_rng(0).uniform(0, 4e6, (4, 4))
        for _ in range(2):
            r = yield sim.collective("all_to_allv", g[:4], matrix=m)
            out.append(r.time)

    sim.env.process(reduce())
    sim.env.process(a2a())
    sim.run()
    return out, sim


@pytest.mark.parametrize("at", [0.0, 5e-5, 4e-4, 1e-2])
def test_coalesced_collectives_equal_solved_ones(at: float) -> None:
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100")
    plain, ps = _overlap(False, topo, at)
    co, cs = _overlap(True, topo, at)
    assert co == pytest.approx(plain, rel=1e-9, abs=1e-15)
    assert cs.env.now == pytest.approx(ps.env.now, rel=1e-12)
    a, b = ps.fabric.link_stats(), cs.fabric.link_stats()
    assert [x.bytes for x in b] == pytest.approx([x.bytes for x in a], rel=1e-9, abs=1e-3)
    assert [x.busy_time for x in b] == pytest.approx([x.busy_time for x in a], rel=1e-9, abs=1e-15)
    assert [x.peak_flows for x in b] == [x.peak_flows for x in a]
    assert ps.fabric.n_coalesced == 0 and cs.fabric.n_coalesced > 0
    assert cs.fabric.n_solves < ps.fabric.n_solves
    if at < 1e-3:  # the all-to-allv lands on links of a running all-reduce: it is materialized
        assert cs.fabric.n_materialized > 0


def _hier_hit(topo: object, gpus: list, coalesce: bool, traj: bool,
              at: float) -> tuple[list[tuple[float, float]], Simulator]:
    """Two 256 MiB hierarchical all-reduces (3 phases) over ``gpus``, hit at ``at`` by a 64 MiB transfer from
    the first node to the second: each all-reduce's (time, bytes on the fabric), and the simulator."""
    sim = Simulator(topo, SimConfig(fabric=FabricConfig(coalesce=coalesce, trajectory=traj), record_trace=False))
    res: list[tuple[float, float]] = []

    def coll():  # type: ignore[no-untyped-def]
        for _ in range(2):
            r = yield sim.collective("all_reduce", gpus, 256 * 2**20, algo="hier", proto="simple")
            res.append((r.time, r.bytes_on_fabric))

    def hit():  # type: ignore[no-untyped-def]
        yield sim.env.timeout(at)
        yield sim.transfer(gpus[0], gpus[8], 64 * 2**20)

    sim.env.process(coll())
    sim.env.process(hit())
    sim.run()
    return res, sim


def test_multi_phase_collective_materialized_mid_phase() -> None:
    """A hierarchical all-reduce (3 phases) over 2 nodes, hit by a transfer during its second phase."""
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    gpus = [g for g in topo.gpus if topo.node_of(g) in (0, 1)]

    def go(coalesce: bool, at: float, traj: bool = False) -> tuple[float, float, int]:
        res, sim = _hier_hit(topo, gpus, coalesce, traj, at)
        return res[0][0] + res[1][0], float(sum(x.bytes for x in sim.fabric.link_stats())), sim.fabric.n_materialized

    t_alone = go(False, 1.0)[0] / 2
    for frac in (0.2, 0.5, 0.8, 1.3):
        p = go(False, frac * t_alone)
        for traj in (False, True):  # materialized by a scratch re-run, or from the memo's trajectory
            c = go(True, frac * t_alone, traj)
            assert c[0] == pytest.approx(p[0], rel=1e-9)
            assert c[1] == pytest.approx(p[1], rel=1e-9)
            assert c[2] == 1


def test_collective_materialized_at_its_latencys_end_counts_its_bytes_once() -> None:
    """A transfer that lands on a coalesced hierarchical all-reduce exactly when its fixed latency ends (the
    trajectory's phase -1: nothing moved yet): the collective's bytes on the fabric are its payload, as when
    every collective is solved (they counted all phases but the last twice)."""
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    gpus = [g for g in topo.gpus if topo.node_of(g) in (0, 1)]
    probe = Simulator(topo, SimConfig(fabric=FabricConfig(trajectory=True), record_trace=False))
    probe.collective("all_reduce", gpus, 256 * 2**20, algo="hier", proto="simple")
    probe.run()
    ((*_, lat, _eff, _cap, _net),) = probe.collectives._runs.values()

    plain, _ = _hier_hit(topo, gpus, False, False, lat)
    for traj in (False, True):
        co, sim = _hier_hit(topo, gpus, True, traj, lat)
        assert sim.fabric.n_materialized == 1
        assert co == pytest.approx(plain, rel=1e-9)


def test_materialization_from_the_trajectory_equals_a_scratch_rerun() -> None:
    """The state a coalesced collective is materialized in, read from its memo's recorded trajectory, equals a
    scratch run stopped at the same time: phase, rows (bytes left, segments, caps, groups, batches), link
    counters and observer intervals; at its latency's end, mid-phase and between phases of a 3-phase
    hierarchical all-reduce and of an uneven all-to-allv."""
    from cosim.engine.collectives import _at_state, _static_rows
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    gpus = [g for g in topo.gpus if topo.node_of(g) in (0, 1)]
    sim = Simulator(topo, SimConfig(fabric=FabricConfig(trajectory=True), record_trace=False))
    col = sim.collectives
    m = np.random.default_rng(1).uniform(0, 8e6, (8, 8))
    for args, kw in (((gpus, 256 * 2**20), dict(algo="hier", proto="simple")), ((gpus[4:12],), dict(matrix=m))):
        op = "all_reduce" if "matrix" not in kw else "all_to_allv"
        sim.collective(op, *args, **kw)  # type: ignore[arg-type]
        sim.run()

    def relabel(x: np.ndarray) -> list[int]:
        first: dict[int, int] = {}
        return [first.setdefault(int(v), len(first)) if v >= 0 else -1 for v in x]

    nl = len(sim.fabric.links)
    checked = 0
    for _ck, (_a, _p, plan, scale, mkey, lat, eff, cap, net_eff) in list(col._runs.items()) + [
            (None, ("p2p", "simple", col._a2av_plans[k], 1.0, k, *_a2av_cost(col, k), None))
            for k in col._a2av_plans]:
        memo = col._memo[mkey]
        tr = memo.traj
        assert tr is not None
        rel = np.unique(tr.times - tr.start)
        taus = [lat, *(0.5 * (rel[:-1] + rel[1:])), 0.999 * memo.duration]
        for tau in taus:
            k, i, rem, counters, n_closed, extra = _at_state(memo, tau)
            segs, mult, wcap, grp, bat = _static_rows(tr, i)
            rows = (segs, rem, mult, wcap, grp, bat)
            flat = memo.usage_upto(n_closed, extra) if n_closed or extra is not None else None
            part = col._memo_run(plan, scale, lat, eff, cap / plan.rings, net_eff, until=tau)
            sc = col._scratch_sim()
            snap = sc.fabric.snapshot_rows()
            sc.drop_all()
            assert k == part.phase
            assert np.array_equal(rows[0], snap[0])
            assert rows[1] == pytest.approx(snap[1], rel=1e-9, abs=1e-3)
            for j in (2, 3):
                assert np.array_equal(rows[j], snap[j])
            assert relabel(rows[4]) == relabel(snap[4]) and relabel(rows[5]) == relabel(snap[5])
            for j, (got, want) in enumerate(zip(counters[1:], (part.bytes, part.busy, part.peak))):
                full = np.zeros(nl)
                full[part.links] = want
                mine = np.zeros(nl)
                mine[counters[0]] = got
                assert mine == pytest.approx(full, rel=1e-9, abs=1e-12 if j == 1 else 1e-3)
            w = part.usage
            tot_u = np.bincount(flat[0], flat[4], minlength=nl) if flat is not None else np.zeros(nl)
            tot_w = np.bincount(np.concatenate([x[0] for x in w]), np.concatenate([x[4] for x in w]),
                                minlength=nl) if w else np.zeros(nl)
            assert tot_u == pytest.approx(tot_w, rel=1e-9, abs=1e-3)
            checked += 1
    assert checked >= 8


def _a2av_cost(col: object, mkey: object) -> tuple[float, float, float]:
    """(latency, efficiency, rate cap) :meth:`Collectives.run` gives the all-to-allv memoized under ``mkey``."""
    from cosim.engine.collectives import Collectives

    assert isinstance(col, Collectives)
    plan = col._a2av_plans[mkey]
    shape = col.shape("all_to_allv", plan.names)
    cfg = col.sim.config.nccl
    lat, eff, cap = col.params.cost(shape, "p2p", "simple", None, cfg.use_calibration, float(np.sum(plan.phases[0][2])))
    return lat, eff, cap


TINY = {**_TINY, "num_layers": 4, "num_experts": 16}  # tests/_cards.py's card, 4 layers of 16 experts


@pytest.fixture(scope="module")
def cluster64() -> object:
    from cosim.scenario import build_topology

    return build_topology("dgx-h100", None, nodes=8)


@pytest.mark.parametrize("layout,routing,gbs", [
    (dict(tp=2, pp=2, ep=8), "uniform", 64),
    (dict(tp=1, pp=4, ep=16), "uniform", 64),
    (dict(tp=2, pp=2, ep=8), "zipf:1.2", 32),
    (dict(tp=1, pp=2, vpp=2, ep=16), "zipf:1.2", 64),
])
def test_synthetic_64_gpu_step_coalesced_equals_plain(tmp_path: Path, cluster64: object, layout: dict,
                                                      routing: str, gbs: int, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.workload.synth import SyntheticSpec, synthesize

    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(TINY))
    spec = SyntheticSpec.model_validate(dict(model=str(f), layout=layout, routing=routing,
                                             batch={"global": gbs, "micro": 1, "seq": 64}, precision="bf16"))
    topo = cluster64
    assert len(topo.gpus) == 64
    syn = synthesize(spec, topo, kernel_timer=synthetic_kernel_timer)
    cfg = ReplayConfig(collectives="simulated")
    co = replay(syn.graph, topo, cfg).summary()["step_time_s"]
    monkeypatch.setattr(Fabric, "links_idle", lambda self, links: False)  # plain: every collective solved
    plain = replay(syn.graph, topo, cfg).summary()["step_time_s"]
    assert co == pytest.approx(plain, rel=5e-3)


def test_fold_replicas_partition_a_stage() -> None:
    from cosim.replay.collective_map import fold_replicas as _fold_replicas

    assert _fold_replicas([0, 2, 4, 6], 8) == [[1, 3, 5, 7]]  # DP group of tp position 0 (tp 2)
    assert _fold_replicas([8, 9], 8) == [[10, 11], [12, 13], [14, 15]]  # TP groups of stage 1
    assert _fold_replicas(list(range(16, 20)), 8) == [[20, 21, 22, 23]]  # EP 4 in a stage of 8
    assert _fold_replicas([0, 8], 8) == []  # a group across stages stands for nothing here
    assert _fold_replicas([0, 1, 3], 8) == []  # its translates do not tile the stage


def test_folded_step_carries_the_other_groups_traffic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On a fabric oversubscribed 8:1 the EP all-to-alls of a stage's two TP positions share the spine
    uplinks: the folded step (one rank per stage) equals the full 64-rank step only when each folded
    collective also runs its stage's equivalent groups; without them it is 23% fast."""
    import yaml

    import cosim.replay.collective_map as cmap
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.scenario import build_topology
    from cosim.workload.synth import SyntheticSpec, synthesize

    card = dict(name="tiny", hidden_size=1024, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=128,
                vocab_size=4096, num_experts=32, top_k=2, expert_ffn_size=512)
    f = tmp_path / "tiny.yaml"
    f.write_text(yaml.safe_dump(card))
    topo = build_topology("dgx-h100", None, nodes=8, topology_sets={"topology.fabric.oversubscription": 8})

    def step(fold: bool) -> float:
        spec = SyntheticSpec.model_validate(dict(model=str(f), layout=dict(tp=2, pp=2, ep=16), fold=fold,
                                                 batch={"global": 64, "micro": 1, "seq": 1024}, precision="bf16",
                                                 expert_gemm_host="0 us", dispatch_overhead="4 us",
                                                 collective_host=None))  # the fabric binds
        return replay(synthesize(spec, topo, kernel_timer=synthetic_kernel_timer).graph, topo, ReplayConfig(collectives="simulated")).summary()["step_time_s"]

    assert cmap.fabric_blocks(topo.graph)
    assert not cmap.fabric_blocks(build_topology("dgx-h100", None, nodes=8).graph)  # non-blocking: no replicas
    full, folded = step(False), step(True)
    assert folded == pytest.approx(full, rel=5e-3)
    monkeypatch.setattr(cmap, "fold_replicas", lambda members, stage: [])
    assert step(True) < 0.9 * full


def test_rate_memo_reuses_an_identical_component() -> None:
    """Two 1 GB transfers sharing gpu0's NVLink to the switch, twice in a row: the second identical
    arrival reuses the first allocation (half the link each); times equal a hand-worked 2 x 1 GB / cap."""
    from cosim.topology import load_topology

    sim = Simulator(load_topology("dgx-h100"), SimConfig(record_trace=False))
    g = list(sim.topo.gpus)
    cap = sim.fabric.path_capacity(g[0], g[1])
    ends: list[float] = []

    def pair():  # type: ignore[no-untyped-def]
        for _ in range(2):
            t0 = sim.env.now
            yield sim.env.all_of([sim.transfer(g[0], g[1], 1e9), sim.transfer(g[0], g[2], 1e9)])
            ends.append(sim.env.now - t0)

    sim.env.process(pair())
    sim.run()
    lat = sim.fabric.path_latency(g[0], g[1])
    assert sim.fabric.n_rate_hits >= 1
    assert ends[0] == pytest.approx(ends[1], rel=1e-12)
    assert ends[0] == pytest.approx(lat + 1e9 / (cap / 2), rel=1e-6)  # each flow gets half of gpu0's uplinks


def _scenario(tmp_path: Path, layout: dict, routing: str, mb: int, stragglers: dict | None = None) -> Path:
    """A 64-GPU (8 DGX H100 nodes) synthetic training scenario of a tiny MoE card, ``mb`` micro-batches per
    pipeline."""
    import yaml

    card = tmp_path / "tiny.yaml"
    card.write_text(yaml.safe_dump(TINY))
    dp = 64 // (layout.get("tp", 1) * layout["pp"])
    # collective_host null: with the c10d host time (73.5 us per call) the tp1 pp4 ep16 case's fill no longer settles
    # within the coalescing probes (it falls back to the plain step); the coalescing itself is what is checked here
    syn: dict = dict(model=str(card), layout=layout, routing=routing, precision="bf16",
                     batch={"global": mb * dp, "micro": 1, "seq": 64}, collective_host=None)
    if stragglers:
        syn["stragglers"] = stragglers
    f = tmp_path / "scn.yaml"
    f.write_text(yaml.safe_dump(dict(name="coalesce", workload=dict(synthetic=syn), topology="dgx-h100", nodes=8)))
    return f


def test_probe_length() -> None:
    """The probe: a full period of unit pairs after a transient of at least 3/4 of a period on every stage, and a
    whole number of periods left to the step (32 for the 1024-GPU DeepSeek-V3 step's pp 8 vpp 4: 24 holds less than
    one period of pairs on stage 0)."""
    from cosim.replay.periodic import _pairs_per_stage, probe_microbatches

    assert probe_microbatches(8, 4, 128) == 32
    assert _pairs_per_stage(8, 4, 24, 0, False) == (52, 64)  # less than one period: no check possible
    assert probe_microbatches(4, 2, 64) == 16
    assert probe_microbatches(2, 1, 24) == 8
    assert probe_microbatches(4, 1, 48) == 16
    assert probe_microbatches(8, 4, 32) is None  # no period left to insert


@pytest.mark.parametrize("layout,routing,mb,stragglers", [
    (dict(tp=2, pp=2, ep=8), "uniform", 24, None),
    (dict(tp=1, pp=4, ep=16), "uniform", 48, None),  # its fill settles slowly: probes of 16, 20, then 32
    (dict(tp=1, pp=2, vpp=2, ep=16), "uniform", 32, None),
    (dict(tp=2, pp=2, ep=8), "zipf:1.2", 12, None),
    (dict(tp=2, pp=2, ep=8), "uniform", 12, {"gpu": {5: 1.3}}),
])
def test_coalesced_step_equals_plain_step(tmp_path: Path, layout: dict, routing: str, mb: int,
                                          stragglers: dict | None) -> None:
    """Coalescing repeated micro-batches (a short probe, its checked steady-state period, extended to the
    full step) agrees with simulating every micro-batch within 0.5% on the step's figures; the probe is
    shorter than the step and the period was measured on every simulated rank."""
    from cosim.output import write_result
    from cosim.scenario import load_scenario, run_scenario

    scn = load_scenario(_scenario(tmp_path, layout, routing, mb, stragglers))
    _, co = run_scenario(scn)
    _, plain = run_scenario(scn, {"workload.synthetic.coalesce": "false"})
    c, p = co.summary(), plain.summary()
    assert "coalesced" not in p
    per = c["coalesced"]
    assert per["simulated_microbatches"] < mb and per["microbatches"] == mb
    assert per["simulated_microbatches"] + per["repeats"] * per["period_microbatches"] == mb
    assert c["synthetic"]["microbatches"] == p["synthetic"]["microbatches"] == mb
    assert c["step_time_s"] == pytest.approx(p["step_time_s"], rel=5e-3)
    for s in (c, p):  # the extended step's slowest rank is the one whose step the summary reports
        steps = {r["rank"]: r["step_time_s"] for r in s["ranks"]}
        assert steps[s["slowest_rank"]] == max(steps.values())
        assert s["slowest_rank_ties"] == list(steps.values()).count(max(steps.values()))
    assert c["tokens_per_s_per_gpu"] == pytest.approx(p["tokens_per_s_per_gpu"], rel=5e-3)
    assert c["mfu"] == pytest.approx(p["mfu"], rel=5e-3)
    assert c["bubble_fraction"] == pytest.approx(p["bubble_fraction"], rel=2e-2, abs=2e-3)
    for key in ("compute_s", "exposed_communication_s"):
        if key in p["breakdown"]:
            assert c["breakdown"][key] == pytest.approx(p["breakdown"][key], rel=5e-3, abs=1e-6)
    # the full step's timeline: as many GPU kernels as the plain step's, and the same last event
    pc = write_result(co, tmp_path / "co")
    pp_ = write_result(plain, tmp_path / "plain")
    import gzip
    import json

    def kernels(path: Path) -> tuple[int, float]:
        evs = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        ks = [e for e in evs if e.get("cat") == "kernel"]
        return len(ks), max(e["ts"] + e["dur"] for e in ks)

    (nc, endc), (np_, endp) = kernels(pc["timeline"]), kernels(pp_["timeline"])
    assert nc == np_
    assert endc == pytest.approx(endp, rel=5e-3)


@pytest.mark.filterwarnings("ignore::Warning")
def test_coalesced_timeline_reads_in_hta_like_the_plain_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The coalesced step's per-rank timelines load in HolisticTraceAnalysis, and its temporal breakdown
    (compute, non-compute, idle per rank) matches the plain step's within 1%."""
    import logging

    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed (pip install '.[dev]')")
    from cosim.output import write_result
    from cosim.scenario import load_scenario, run_scenario

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    scn = load_scenario(_scenario(tmp_path, dict(tp=2, pp=2, ep=8), "uniform", 24))
    _, co = run_scenario(scn)
    _, plain = run_scenario(scn, {"workload.synthetic.coalesce": "false"})
    assert co.summary()["coalesced"]["repeats"] >= 1
    logging.disable(logging.WARNING)
    try:
        tb = {}
        for name, res in (("co", co), ("plain", plain)):
            paths = write_result(res, tmp_path / name)
            tb[name] = hta.TraceAnalysis(trace_dir=str(paths["timeline_ranks"])).get_temporal_breakdown(
                visualize=False).set_index("rank").sort_index()
    finally:
        logging.disable(logging.NOTSET)
    assert list(tb["co"].index) == list(tb["plain"].index) and len(tb["co"]) == 2
    assert (tb["plain"]["compute_time(us)"] > 0).all() and (tb["plain"]["idle_time(us)"] > 0).all()
    for col in ("idle_time(us)", "compute_time(us)", "non_compute_time(us)"):
        assert np.allclose(tb["co"][col], tb["plain"][col], rtol=1e-2, atol=1.0), col


def test_step_without_a_period_is_simulated_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When no probe shows the period (here: the check made to fail), the step is simulated micro-batch by
    micro-batch, says so, and equals the plain step exactly."""
    import cosim.replay.periodic as periodic
    from cosim.scenario import load_scenario, run_scenario

    scn = load_scenario(_scenario(tmp_path, dict(tp=2, pp=2, ep=8), "uniform", 12))
    _, plain = run_scenario(scn, {"workload.synthetic.coalesce": "false"})
    calls: list[int] = []

    def never(unit_keys, *a, **k):  # type: ignore[no-untyped-def]
        calls.append(1)
        return None

    monkeypatch.setattr(periodic, "detect_period", never)
    _, res = run_scenario(scn)
    s = res.summary()
    assert "coalesced" not in s and len(calls) == 2  # the probe and one a period longer
    assert any(n.startswith("not coalesced: no steady-state period") for n in s["notes"])
    assert s["step_time_s"] == plain.summary()["step_time_s"]


@pytest.mark.filterwarnings("ignore::Warning")
def test_coalesced_timeline_capped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past TIMELINE_MAX_GPU_OPS the coalesced timeline draws the repeated period fewer times than it repeats:
    one span per event group stands for the periods not drawn, and the step still ends where the plain step
    does (every event after the window keeps its full-step time)."""
    import gzip
    import json

    import cosim.replay.periodic as periodic
    from cosim.output import write_result
    from cosim.scenario import load_scenario, run_scenario

    scn = load_scenario(_scenario(tmp_path, dict(tp=2, pp=2, ep=8), "uniform", 24))
    _, co = run_scenario(scn)
    per = co.summary()["coalesced"]
    assert per["repeats"] >= 3
    probe = sum(int(np.isfinite(r.gpu_start).sum()) for r in co.runs)
    monkeypatch.setattr(periodic, "TIMELINE_MAX_GPU_OPS", probe + 1)
    assert co.drawn_repeats() == 0
    co._drawn = None
    monkeypatch.setattr(periodic, "TIMELINE_MAX_GPU_OPS", 10**9)
    full = co.drawn_repeats()
    assert full == per["repeats"]
    co._drawn = 1
    evs = json.loads(gzip.decompress(write_result(co, tmp_path / "co")["timeline"].read_bytes()))["traceEvents"]
    _, plain = run_scenario(scn, {"workload.synthetic.coalesce": "false"})
    pevs = json.loads(gzip.decompress(write_result(plain, tmp_path / "p")["timeline"].read_bytes()))["traceEvents"]
    ks, pks = [e for e in evs if e.get("cat") == "kernel"], [e for e in pevs if e.get("cat") == "kernel"]
    assert len(ks) < len(pks)
    marks = [e for e in evs if e.get("cat") == "coalesced"]
    assert marks and all(m["args"]["periods"] == per["repeats"] - 1 and m["args"]["drawn"] == 1 for m in marks)
    assert marks[0]["dur"] == pytest.approx((per["repeats"] - 1) * per["period_s"] * 1e6, rel=1e-6)
    end = max(e["ts"] + e["dur"] for e in ks)
    assert end == pytest.approx(max(e["ts"] + e["dur"] for e in pks), rel=5e-3)
    hta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed (pip install '.[dev]')")
    import logging

    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    logging.disable(logging.WARNING)
    try:  # the capped per-rank traces load in HTA
        tb = hta.TraceAnalysis(trace_dir=str(tmp_path / "co" / "timeline")).get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert len(tb) == 2 and (tb["compute_time(us)"] > 0).all()


def test_collectives_sharing_only_spine_links_coalesce_exactly() -> None:
    """dgx-h100-32node is two-tier and non-blocking: its leaf-spine links never bind (each carries 1/4 of what
    its leaf's 32 NICs bring, at most its capacity), so two all-to-alls on disjoint GPUs whose routes share only
    spine links both coalesce (no materialization), with the times and link bytes of solving both, and the
    same busy times and peaks on every other link. A route over one spine only turns the rule off."""
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-32node")
    groups = [["node0.gpu0", "node1.gpu1", "node2.gpu2"], ["node3.gpu0", "node4.gpu1", "node5.gpu2"]]

    def go(coalesce: bool) -> tuple[list[float], Simulator]:
        sim = Simulator(topo, SimConfig(fabric=FabricConfig(coalesce=coalesce), record_trace=False))
        out: list[float] = []

        def one(g: list[str]):  # type: ignore[no-untyped-def]
            for _ in range(2):
                r = yield sim.collective("all_to_all", g, 256 * 2**20)
                out.append(r.time)

        for g in groups:
            sim.env.process(one(g))
        sim.run()
        return out, sim

    plain, ps = go(False)
    co, cs = go(True)
    fab = cs.fabric
    assert fab._free.any() and fab._free_share == pytest.approx(1 / 4)
    assert co == pytest.approx(plain, rel=1e-9)
    assert fab.n_coalesced == 4 and fab.n_materialized == 0 and fab.n_solves == 0
    a, b = ps.fabric.link_stats(), fab.link_stats()
    assert [x.bytes for x in b] == pytest.approx([x.bytes for x in a], rel=1e-9, abs=1e-3)
    free = fab._free
    spine_bytes = sum(x.bytes for x, f in zip(b, free) if f)
    assert spine_bytes > 0  # the groups' traffic did cross the spines
    assert [x.busy_time for x, f in zip(b, free) if not f] == pytest.approx(
        [x.busy_time for x, f in zip(a, free) if not f], rel=1e-9, abs=1e-15)
    assert [x.peak_flows for x, f in zip(b, free) if not f] == [x.peak_flows for x, f in zip(a, free) if not f]
    # a segment over a single spine path breaks the even-bundle premise: no link is never-binding any more
    spine = next(v for v in topo.graph.successors("fabric.leaf0") if "spine" in v)
    fab.segment(("one-spine",), [["fabric.leaf0", spine, "fabric.leaf1"]])
    assert not fab._free_on and not fab._free.any()
