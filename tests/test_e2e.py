"""End-to-end validation runner (validation/e2e) and the dropless MoE host sync of synthesis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def test_dropless_moe_forward_syncs_the_host_on_the_token_count_copies(dgx: object) -> None:
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.workload.graph import EdgeKind, HostKind
    from cosim.workload.synth import SyntheticSpec, synthesize

    def build(recompute: str) -> object:
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8, "recompute": recompute},
                                             "batch": {"global": 16, "micro": 1, "seq": 256}})
        return synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer)

    syn = build("none")
    rg = syn.graph.ranks[0]
    names = [rg.strings[int(x)] for x in rg.host_ops.name]
    gnames = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    syncs = [i for i, n in enumerate(names) if n == "cudaStreamSynchronize"]
    # 4 MoE layers x 2 micro-batches per GPU (16 sequences over dp 8), forward only: 8 host syncs
    assert syn.built.microbatches == 2 and len(syncs) == 4 * 2
    assert all(int(rg.host_ops.kind[h]) == HostKind.SYNC for h in syncs)
    n_host = len(names)
    E = rg.edges
    waited = {int(d): int(s) - n_host for s, d, k in zip(E.src, E.dst, E.kind) if k == EdgeKind.SYNC and d in syncs}
    # Megatron's d2h_event.synchronize(): the host waits for the last of the 4 host copies of the token counts
    # (tokens per expert, input, output and TP splits), launched before the permutation
    assert sorted(waited) == syncs and all(gnames[j] == "moe.splits_d2h" for j in waited.values())
    launch_of = {int(h): j for j, h in enumerate(rg.launches.host_op)}
    assert all(gnames[launch_of[h - 1]] == "moe.permute" for h in syncs)
    assert all([gnames[i] for i in range(j - 3, j + 1)] == ["moe.splits_d2h"] * 4 for j in waited.values())
    # each sync comes right before the launch of the dispatch all-to-all it sizes
    assert all(gnames[launch_of[h + 1]] == "moe.dispatch" for h in syncs)
    run = replay(syn.graph, dgx, ReplayConfig(collectives="simulated")).runs[0]
    gend = run.gpu_start + rg.gpu_ops.dur
    for h, j in waited.items():  # the host returns only after the last copy has run
        assert run.host_end[h] >= gend[j] - 1e-12 and run.host_start[h + 1] >= gend[j] - 1e-12
    # full recomputation re-runs each forward (and its sync) before the backward
    rg2 = build("full").graph.ranks[0]
    names_rc = [rg2.strings[int(x)] for x in rg2.host_ops.name]
    assert names_rc.count("cudaStreamSynchronize") == 2 * 4 * 2


def test_the_host_sync_costs_a_sync_and_a_launch_latency_per_moe_layer_when_gpu_bound(dgx: object) -> None:
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.workload.synth import SyntheticSpec, synthesize

    def step(sync: bool) -> tuple[float, float]:
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8}, "moe_host_sync": sync,
                                             "batch": {"global": 16, "micro": 1, "seq": 4096},
                                             "dispatch_overhead": "2 us", "expert_gemm_host": "0 us",
                                             "collective_host": "2 us"})  # a fast host
        g = synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer).graph
        rg = g.ranks[0]
        names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        permute = float(rg.gpu_ops.dur[names.index("moe.permute")])
        return replay(g, dgx, ReplayConfig(collectives="simulated")).summary()["step_time_s"], permute

    # GPU-bound (seq 4096): without the sync the host has launched the dispatch long before the permutation ends;
    # with it, the host returns (3 us) after the count copies, as the permutation starts, and launches the dispatch
    # (its launch latency): each of the 8 forward MoE layers waits what of that the permutation does not hide
    cpu = dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0]))
    (with_sync, permute), (without, _) = step(True), step(False)
    per_sync = (with_sync - without) / 8
    exposed = ReplayConfig().default_sync_overhead + float(cpu.launch_latency) - permute
    # here the permutation (16 us of 4096 x 8 rows) hides the 8 us: Megatron's sync costs nothing when GPU-bound
    # (a sync after the permutation, as before, cost 8 us per layer)
    assert exposed < 0 and per_sync == pytest.approx(max(exposed, 0.0), abs=1e-9)


def _cases_file(tmp_path: Path, **over: object) -> Path:
    case = {"id": "mini-pp2", "model": "qwen3-moe-mini", "system": "dgx-h100", "gpus": 8,
            "layout": {"tp": 1, "pp": 2, "vpp": 1, "cp": 1, "ep": 4}, "fsdp": False,
            "batch": {"global": 64, "micro": 1, "seq": 256}, "precision": "bf16",
            "measured": {"tokens_per_s_per_gpu": 100000.0},
            "source": {"ref": "MZQWEN3", "table": "a hand-made case"}}  # a framework with Megatron-Core's bucket rule
    case.update(over)
    f = tmp_path / "cases.yaml"
    f.write_text(yaml.safe_dump({"sources": {"MZQWEN3": "test"}, "cases": [case]}))
    return f


def test_runner_extrapolates_the_steady_state_to_the_full_step(tmp_path: Path) -> None:
    from validation.e2e.run import load_cases, microbatches, probe_counts, run_case

    _, [case] = load_cases(_cases_file(tmp_path))
    assert microbatches(case) == 16 and probe_counts(case, 8) == [4, 8] and probe_counts(case, 16) == [16]
    ext = run_case(case, cap=8)
    full = run_case(case, cap=16)
    assert ext["status"] == full["status"] == "run" and ext["simulated_microbatches"] == [4, 8]
    # 1F1B: warm-up + m steady micro-batches + cool-down + optimizer is linear in m once m >= pp
    assert ext["step_time_s"] == pytest.approx(full["step_time_s"], rel=0.01)
    assert ext["tokens_per_s_per_gpu"] == pytest.approx(64 * 256 / full["step_time_s"] / 8, rel=0.01)
    assert full["error"] == pytest.approx(full["tokens_per_s_per_gpu"] / 100000.0 - 1.0)
    assert np.isfinite(full["mfu"]) and 0 < full["mfu"] < 1


def test_runner_rows_it_cannot_run_and_bad_input(tmp_path: Path) -> None:
    from validation.e2e.run import load_cases, pipeline_layers, run_case

    _, [odd] = load_cases(_cases_file(tmp_path, gpus=258, system="gb200-nvl72"))
    r = run_case(odd)
    assert r["status"] == "not run" and "4-GPU GB200 compute trays" in r["reason"]
    # DeepSeek-V3's 61 layers over 16 chunks: the loss and embedding chunks and the last-but-one give a layer back
    assert pipeline_layers(61, 16) == [3] + [4] * 13 + [3, 3] and pipeline_layers(48, 24) is None
    bad = _cases_file(tmp_path, layout={"tp": 1, "pp": 2, "ep": 4, "dp": 3})
    p = subprocess.run([sys.executable, "-m", "validation.e2e.run", "--cases", str(bad)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert "layout" in p.stderr and "dp" in p.stderr


def test_every_system_of_the_rows_resolves_its_gpus_per_node_from_the_preset(tmp_path: Path) -> None:
    """``nodes`` = gpus / the preset's GPUs per host node, read from the topology (no table to keep): every system
    training.yaml names resolves (8-GPU nodes; the NVL72 racks are cut into 4-GPU trays by _gb200), a row of
    a whole number of nodes scales to them, an odd count or an unknown preset is a row not run with its reason."""
    from cosim.topology import list_presets
    from validation.e2e.run import _topology, gpus_per_node, load_cases, run_case

    _, cases = load_cases()
    systems = {c.system for c in cases}
    assert systems <= set(list_presets()) and {"dgx-h100", "hgx-b200", "hgx-b300", "h800-8node"} <= systems
    for c in cases:
        if c.system.endswith("-nvl72"):
            assert gpus_per_node(c.system) == 4  # a compute tray
            continue
        assert gpus_per_node(c.system) == 8, c.system
        assert _topology(c, tmp_path) == (c.system, c.gpus // 8), c.id
    assert gpus_per_node("dgx-h100-4node") == 8 and gpus_per_node("hgx-h200") == 8
    _, [odd] = load_cases(_cases_file(tmp_path, gpus=12, system="hgx-b300"))
    r = run_case(odd)
    assert r["status"] == "not run" and r["reason"] == "12 GPUs is not a whole number of 8-GPU hgx-b300 nodes"
    _, [unknown] = load_cases(_cases_file(tmp_path, system="hgx-z900"))
    r = run_case(unknown)
    assert r["status"] == "not run" and "unknown topology 'hgx-z900'" in r["reason"]


def test_ep_a2a_overlap_pairs_and_hides_all_to_all() -> None:
    from cosim.errors import CosimInputError
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.scenario import build_topology
    from cosim.workload.synth import SyntheticSpec, synthesize
    from cosim.workload.synth.build import _overlap_pairs
    from cosim.workload.synth.schedule import stage_order

    # no pipeline: F0, then each forward with the previous micro-batch's backward, then the last backward
    assert _overlap_pairs(stage_order(0, 1, 1, 3, extra_warmup=1)) == [
        [("F", 0, 0)], [("F", 1, 0), ("B", 0, 0)], [("F", 2, 0), ("B", 1, 0)], [("B", 2, 0)]]
    # interleaved pp 2 vpp 2, 4 micro-batches, last stage: (0 + 2 + 1) warm-up forwards, 5 overlapped pairs, 3
    # backwards; no pair holds a forward and the backward of the same micro-batch and chunk
    order = stage_order(1, 2, 2, 4, extra_warmup=1)
    steps = _overlap_pairs(order)
    assert [len(x) for x in steps] == [1, 1, 1, 2, 2, 2, 2, 2, 1, 1, 1]
    assert all(f[1:] != b[1:] for f, b in (x for x in steps if len(x) == 2))
    topo = build_topology("dgx-h100", None, None, None, 2)

    def run(overlap: bool) -> dict:
        # collective_host null: with the c10d host time this small step is host-bound; the overlap is checked here
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 16, "a2a_overlap": overlap},
                                             "batch": {"global": 64, "micro": 1, "seq": 4096},
                                             "collective_host": None})
        # the SM law off (gpu.comm_share): the same kernels at the same speed, only the schedule differs
        return replay(synthesize(spec, topo, kernel_timer=synthetic_kernel_timer).graph, topo,
                      ReplayConfig(collectives="simulated", comm_share=False)).summary()

    plain, over = run(False), run(True)
    assert over["breakdown"]["compute"] == pytest.approx(plain["breakdown"]["compute"], rel=1e-9)  # same kernels
    # communication-bound (EP16 over two nodes: 20 ms of exposed all-to-all, 9 ms of compute): the pairs hide
    # part of the all-to-all under the other micro-batch's compute, at most all of it, here more than a third
    hidden = plain["breakdown"]["exposed_communication"] - over["breakdown"]["exposed_communication"]
    assert over["breakdown"]["compute"] / 3 < hidden <= over["breakdown"]["compute"]
    assert over["step_time_s"] < plain["step_time_s"]
    with pytest.raises(CosimInputError, match="a2a_overlap: the EP all-to-all overlap with a pipeline needs at least"):
        synthesize(SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 4, "pp": 2, "vpp": 2,
                                                 "a2a_overlap": True}, "batch": {"global": 16, "seq": 256}}), topo,
                   kernel_timer=synthetic_kernel_timer)
    with pytest.raises(CosimInputError, match="a2a_overlap: needs ep > 1, vpp > 1 when pp > 1"):
        synthesize(SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8, "pp": 2,
                                                 "a2a_overlap": True}, "batch": {"global": 64, "seq": 256}}), topo,
                   kernel_timer=synthetic_kernel_timer)


def test_ep_a2a_overlap_never_pairs_the_last_microbatch_backward() -> None:
    """``_overlap_pairs`` pairs a forward with another unit's backward only, so the last micro-batch's backwards
    (which close the gradient buckets) are never in a pair: ``_Paired`` has no gradient-bucket path. Every layout the
    overlap allows (spec: vpp > 1 with a pipeline, at least 2 x pp micro-batches, no gradient accumulation), every
    stage; and one micro-batch without a pipeline, which paired F0 with its own B0 before."""
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.scenario import build_topology
    from cosim.workload.synth import SyntheticSpec, synthesize
    from cosim.workload.synth.build import _overlap_pairs
    from cosim.workload.synth.schedule import stage_order

    assert _overlap_pairs(stage_order(0, 1, 1, 1, extra_warmup=1)) == [[("F", 0, 0)], [("B", 0, 0)]]
    layouts = [(1, 1, m) for m in range(1, 7)]
    layouts += [(pp, vpp, m) for pp in (2, 4, 8) for vpp in (2, 3, 4) for m in range(2 * pp, 5 * pp, pp)]
    paired = 0
    for pp, vpp, m in layouts:
        for stage in range(pp):
            for step in _overlap_pairs(stage_order(stage, pp, vpp, m, extra_warmup=1)):
                if len(step) == 2:
                    (_, mf, vf), (_, mb, vb) = step
                    assert mb != m - 1 and (mf, vf) != (mb, vb), (pp, vpp, m, stage, step)
                    paired += 1
    assert paired > 1000
    # end to end, one micro-batch per pipeline (dp 8 on 8 GPUs, global batch 8): nothing to overlap, so the same
    # GPU ops in the same order as without the overlap, the DP gradient reduction included
    topo = build_topology("dgx-h100", None, None, None, 1)

    def ops(overlap: bool) -> list[str]:
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8, "a2a_overlap": overlap},
                                             "batch": {"global": 8, "micro": 1, "seq": 1024}})
        g = synthesize(spec, topo, kernel_timer=synthetic_kernel_timer).graph.ranks[0]
        return [g.strings[n] for n in g.gpu_ops.name.tolist()]

    over = ops(True)
    assert over == ops(False) and "grad.dp_reduce_scatter" in over


def test_training_deepep_dispatch_labels_the_ep_transfers_and_drops_the_alltoall_bookkeeping() -> None:
    """Megatron-Core's flex dispatcher with DeepEP (``dispatch: deepep``): each MoE layer's dispatch and combine,
    forward and backward, run as DeepEP normal kernels (the engine's ``deepep`` flows: RDMA once per
    destination node, NVLink forwarding); the probabilities' all-to-all and the counts' all-gather of the
    alltoall dispatcher are gone (DeepEP carries the weights in its token buffer, its notify kernel exchanges
    the counts). EP16 over two DGX H100: per token, NCCL sends each of its top-8 rows to its expert's GPU
    (about half of them to the other node), DeepEP crosses the network once per destination node, so the
    exposed communication drops."""
    from collections import Counter

    from cosim.errors import CosimInputError
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.scenario import build_topology
    from cosim.workload.synth import SyntheticSpec, synthesize

    topo = build_topology("dgx-h100", None, None, None, 2)

    def build(dispatch: str) -> object:
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 16}, "dispatch": dispatch,
                                             "batch": {"global": 64, "micro": 1, "seq": 4096}})
        return synthesize(spec, topo, kernel_timer=synthetic_kernel_timer)

    runs = {}
    for d in ("nccl", "deepep"):
        syn = build(d)
        rg = syn.graph.ranks[0]
        runs[d] = (Counter(rg.strings[int(x)].split(":")[0] for x in rg.collectives.name),
                   replay(syn.graph, topo, ReplayConfig(collectives="simulated")).summary())
    (nccl, a), (deepep, b) = runs["nccl"], runs["deepep"]
    card_layers, mb = 4, 4  # qwen3-moe-mini: 4 MoE layers; 64 sequences over dp 16: 4 micro-batches
    n = card_layers * mb
    # alltoall: per layer and micro-batch, dispatch + probabilities (forward and backward) and combine (both);
    # counts all-gathered once per layer forward; plus the ZeRO-1 parameter all-gather
    assert nccl["all_to_all_dispatch"] == nccl["all_to_all_combine"] == 3 * n and nccl["all_gather"] == n + 1
    assert deepep["deepep_dispatch"] == deepep["deepep_combine"] == 2 * n and deepep["all_gather"] == 1
    assert "all_to_all_dispatch" not in deepep and "all_to_all_combine" not in deepep
    assert b["breakdown"]["compute"] == pytest.approx(a["breakdown"]["compute"], rel=1e-6)  # same kernels
    assert b["breakdown"]["exposed_communication"] < 0.75 * a["breakdown"]["exposed_communication"]
    with pytest.raises(CosimInputError, match="dispatch: training takes nccl, deepep"):
        build("deepep-ll")


def test_default_dispatch_overhead_is_the_measured_eager_host_time_per_kernel() -> None:
    from cosim.resources import shared_dir
    from cosim.topology import load_topology
    from cosim.workload.synth import SyntheticSpec
    from validation.e2e.host_cost import LLM_TRACE, launch_intervals

    root = shared_dir()
    trace = None if root is None else root / "traces" / "tracelens-h100" / LLM_TRACE
    if trace is None or not trace.is_file():
        pytest.skip("needs ../shared/traces/tracelens-h100 (the eager H100 LLM trace)")
    r = launch_intervals(trace)
    dgx = load_topology("dgx-h100")
    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    default = float(SyntheticSpec.model_fields["dispatch_overhead"].default)
    # 16.7 us between launches of the eager Qwen1.5-0.5B step, 4.6 us of it the launch call
    assert r["median_interval_s"] == pytest.approx(16.7e-6, abs=0.05e-6) and r["launches"] == 1197
    assert default + launch == pytest.approx(r["median_interval_s"], abs=0.5e-6)


def test_gb200_racks_cut_to_a_job(tmp_path: Path) -> None:
    from cosim.topology import load_topology
    from validation.e2e.run import _gb200

    # 256 GPUs = 64 compute trays: 16 trays (64 GPUs) of each of 4 racks, each rack one NVLink domain
    topo = load_topology(_gb200(256, tmp_path))
    assert len(topo.gpus) == 256
    assert topo.figures()["nvlink_domain_gpus"] == 64
    g = topo.graph
    sw = sorted(x for x in g.nodes if g.nodes[x].get("kind") == "nvswitch")
    assert len(sw) == 4
    gpus_on = {s: {y for y in g.neighbors(s) if g.nodes[y].get("kind") == "gpu"} for s in sw}
    assert sorted(len(v) for v in gpus_on.values()) == [64, 64, 64, 64]
    assert "node15.gpu3" in gpus_on["fabric.nvswitch0"] and "node16.gpu0" in gpus_on["fabric.nvswitch1"]
    # the racks meet only on the InfiniBand fabric: 4 NICs per tray attached to it
    assert topo.figures()["devices"]["fabric_switch"] > 0 and topo.figures()["links"]["ib-ndr"] >= 256
    assert len(load_topology(_gb200(64, tmp_path)).gpus) == 64  # one rack cut to 16 trays


def test_the_engine_routes_gb200_racks_as_the_topology(tmp_path: Path) -> None:
    from cosim.engine.topoview import ClusterRouter
    from cosim.topology import load_topology
    from validation.e2e.run import _gb200

    topo = load_topology(_gb200(256, tmp_path))
    router = ClusterRouter(topo)
    # trays of one rack talk over its NVLink switch (also trays 16.. of rack 1, whose switch node 0 does not
    # reach); trays of different racks over InfiniBand
    assert router("node16.gpu0", "node16.gpu1") == [["node16.gpu0", "fabric.nvswitch1", "node16.gpu1"]]
    assert router("node16.gpu0", "node31.gpu3") == [["node16.gpu0", "fabric.nvswitch1", "node31.gpu3"]]
    assert any(n.startswith("fabric.leaf") for n in router("node15.gpu0", "node16.gpu0")[0])
    for a, b in [("node0.gpu0", "node5.gpu2"), ("node20.gpu1", "node47.gpu1"), ("node63.gpu3", "node2.gpu0")]:
        assert sorted(map(tuple, router(a, b))) == sorted(map(tuple, topo.paths(a, b)))
    # and the engine's split routes and NIC caps agree: an all-to-all over 8 trays of one rack costs what it costs
    # on a lone NVL72 rack (NVLink only), one spanning two racks more (half its peers over InfiniBand)
    from cosim.engine import SimConfig
    from cosim.engine.simulator import Simulator

    def a2a(t: object, trays: list[int]) -> float:
        sim = Simulator(t, SimConfig())
        ranks = [f"node{n}.gpu{i}" for n in trays for i in range(4)]
        return float(sim.collectives.estimate("all_to_all", ranks, 64 * 2**20, "p2p", "simple"))

    rack = load_topology("gb200-nvl72")
    assert a2a(topo, list(range(8))) == pytest.approx(a2a(rack, list(range(8))), rel=1e-6)
    assert a2a(topo, list(range(12, 20))) > 3 * a2a(rack, list(range(8)))


def test_quantize_cast_writes_the_rowwise_and_columnwise_copies() -> None:
    """A training GEMM input cast to MXFP8 (or Hopper FP8) is read once in BF16 and written twice, row-wise for
    the forward GEMM and column-wise for the wgrad GEMM, each copy 1 byte + its scales per element (MXFP8: one
    e8m0 per 32; FP8: one fp32 per 128); its backward (the gradient's cast) moves twice that; BF16 casts nothing."""
    from dataclasses import replace

    from cosim.workload.synth.costs import PRECISIONS, _quant, backward_ops

    n = 4096 * 7168
    (mx,) = _quant("x", n, PRECISIONS["mxfp8"])
    assert mx.bytes == pytest.approx(n * (2 + 2 * (1 + 1 / 32)))
    (fp8,) = _quant("x", n, PRECISIONS["fp8"])
    assert fp8.bytes == pytest.approx(n * (2 + 2 * (1 + 4 / 128)))
    # the cast keeps its FP8 width when the dispatch payload is bf16 (the dispatch bytes: tests/test_synth.py)
    (fp8_bf16_dispatch,) = _quant("x", n, replace(PRECISIONS["fp8"], dispatch_bytes=2.0))
    assert fp8_bf16_dispatch.bytes == fp8.bytes
    assert backward_ops([mx])[0].bytes == pytest.approx(2 * mx.bytes)
    assert _quant("x", n, PRECISIONS["bf16"]) == []


def test_runner_passes_the_rows_dispatcher_and_comm_sms(tmp_path: Path) -> None:
    """A row's ``dispatch`` becomes the synthetic spec's and its ``comm_sms`` the replay's ``gpu.comm_sms``; the
    DeepSeek-V3 H100 row takes its 25.09 run script's DeepEP and EP overlap, and no constant ``comm_sms``: since
    round 8 each kernel holds its own SMs (DeepEP: Megatron-Core's 20, tests/test_comm_sms.py)."""
    from validation.e2e.run import _scenario, load_cases

    _, [case] = load_cases(_cases_file(tmp_path, dispatch="deepep", comm_sms=20))
    scn = _scenario(case, 16, "dgx-h100", 1, "none")
    assert scn.workload.synthetic.dispatch == "deepep" and scn.set == {"gpu.comm_sms": "20"}
    _, [plain] = load_cases(_cases_file(tmp_path))
    scn = _scenario(plain, 16, "dgx-h100", 1, "none")
    assert scn.workload.synthetic.dispatch is None and scn.set == {}
    _, cases = load_cases()
    h100 = next(c for c in cases if c.id == "dsv3-h100-1024-fp8")
    assert (h100.dispatch, h100.a2a_overlap, h100.comm_sms) == ("deepep", True, None)


def test_runner_set_what_if_reaches_every_rows_scenario(tmp_path: Path) -> None:
    """``--set KEY=VALUE`` (a `cosim run --set` key) lands in each row's scenario beside the row's own settings, and
    a NIC rate set there slows a two-node row whose data-parallel gradients cross the NICs; an argument without
    ``=`` is one line and exit status 2."""
    from validation.e2e.run import _scenario, load_cases, run_case

    _, [case] = load_cases(_cases_file(tmp_path, comm_sms=20))
    half = {"nics.cx7-ndr400.port_bandwidth": "200 Gb/s"}
    scn = _scenario(case, 16, "dgx-h100", 1, "none", set_over=half)
    assert scn.set == {"gpu.comm_sms": "20", **half}
    _, [two] = load_cases(_cases_file(tmp_path, gpus=16, layout={"tp": 1, "pp": 1, "vpp": 1, "cp": 1, "ep": 4},
                                      overlap_grad_reduce=False))
    base, slow = run_case(two, cap=2), run_case(two, cap=2, set_over=half)
    assert base["status"] == slow["status"] == "run" and slow["step_time_s"] > base["step_time_s"]
    p = subprocess.run([sys.executable, "-m", "validation.e2e.run", "--cases", str(_cases_file(tmp_path)), "--set",
                        "nics.cx7-ndr400.port_bandwidth"], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1 and "--set" in p.stderr


def test_runner_passes_expert_padding(tmp_path: Path) -> None:
    """A row's ``expert_padding: false`` reaches the synthetic spec (absent: the spec's default, the copies on);
    no row sets it: the HybridEP rows (whose dispatcher pads rows in its dispatch) need not, the synthesis drops
    the copies under ``dispatch: hybridep`` (tests/test_synth.py)."""
    from validation.e2e.run import _scenario, load_cases

    _, [case] = load_cases(_cases_file(tmp_path, expert_padding=False))
    assert _scenario(case, 16, "dgx-h100", 1, "none").workload.synthetic.expert_padding is False
    _, [plain] = load_cases(_cases_file(tmp_path))
    assert _scenario(plain, 16, "dgx-h100", 1, "none").workload.synthetic.expert_padding is True
    _, cases = load_cases()
    assert all(c.expert_padding for c in cases)


def test_runner_passes_hybridep_its_sms_and_the_graph_scopes(tmp_path: Path) -> None:
    """A row's ``dispatch: hybridep`` with ``hybridep_sms`` sets the spec's HybridEP SMs (Megatron-Bridge's harness:
    moe_hybridep_num_sms 32); ``cuda_graph_scope`` passes through. The Megatron-Bridge
    v0.3.0 presets: DeepSeek-V3 B200 / GB200, Qwen3-30B GB200 and Qwen3-235B GB200 run HybridEP; the GB200
    DeepSeek-V3 / Qwen3-235B presets graph attn, moe_router and moe_preprocess, both Qwen3-30B Blackwell presets
    moe_router and moe_preprocess; Qwen3-30B B200 keeps the alltoall dispatcher."""
    from validation.e2e.run import _scenario, load_cases

    _, [case] = load_cases(_cases_file(tmp_path, dispatch="hybridep", hybridep_sms=32,
                                       cuda_graph_scope=["moe_router", "moe_preprocess"]))
    scn = _scenario(case, 16, "dgx-h100", 1, "none")
    syn = scn.workload.synthetic
    assert (syn.dispatch, syn.hybridep_sms, syn.cuda_graph_scope) == ("hybridep", 32, ["moe_router", "moe_preprocess"])
    assert scn.set == {}  # no replay SM share: the rows do not overlap HybridEP with compute
    _, cases = load_cases()
    by = {c.id: c for c in cases}
    full = ["attn", "moe_router", "moe_preprocess"]
    for cid, disp, scope in (("dsv3-b200-256-mxfp8", "hybridep", None), ("dsv3-gb200-256-mxfp8", "hybridep", full),
                             ("qwen3-30b-gb200-8-mxfp8", "hybridep", ["moe_router", "moe_preprocess"]),
                             ("qwen3-235b-gb200-256-mxfp8", "hybridep", full),
                             ("qwen3-30b-b200-8-mxfp8", "nccl", ["moe_router", "moe_preprocess"])):
        assert (by[cid].dispatch, by[cid].cuda_graph_scope) == (disp, scope), cid
        assert by[cid].hybridep_sms == (32 if disp == "hybridep" else None) and by[cid].comm_sms is None, cid


def test_runner_passes_a_full_iteration_graph_and_refuses_an_unknown_scope(tmp_path: Path) -> None:
    """A row may name every CUDA graph scope the synthetic spec takes (its names, read from its type), among them
    ``full_iteration`` (Megatron-Core ``cuda_graph_impl: full_iteration``): it reaches the spec and the build
    graphs the whole iteration; a scope the spec does not know is a one-line input error (exit 2)."""
    from cosim.workload.synth.spec import CUDA_GRAPH_SCOPES, SyntheticSpec
    from validation.e2e.run import _scenario, load_cases, run_case

    assert CUDA_GRAPH_SCOPES == ("attn", "moe_router", "moe_preprocess", "full_iteration")
    _, [case] = load_cases(_cases_file(tmp_path, cuda_graph_scope=["full_iteration"]))
    syn = _scenario(case, 16, "dgx-h100", 1, "none").workload.synthetic
    assert isinstance(syn, SyntheticSpec) and syn.cuda_graph_scope == ["full_iteration"]
    _, [eager] = load_cases(_cases_file(tmp_path))
    graphed, plain = run_case(case, cap=4), run_case(eager, cap=4)
    assert graphed["status"] == plain["status"] == "run"
    assert graphed["step_time_s"] < plain["step_time_s"]  # one graph launch per micro-batch, no eager dispatch
    bad = _cases_file(tmp_path, cuda_graph_scope=["attn", "full_step"])
    p = subprocess.run([sys.executable, "-m", "validation.e2e.run", "--cases", str(bad)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "cuda_graph_scope" in p.stderr and "unknown scope 'full_step'" in p.stderr
    assert "attn, moe_router, moe_preprocess, full_iteration" in p.stderr


def test_gpt_oss_clamp_prologue_and_eager_biases_by_hand() -> None:
    """gpt-oss's training-only kernels (Megatron-Core core_v0.16.0, costs.GPT_OSS_ACTIVATION_SOURCE), one MoE
    layer of a small card with ``activation_clamp`` and ``linear_bias`` at EP4 (8 local experts), 128 tokens:
    the clamp prologue (two clamps of rows x f, a cat of rows x 2f) before the fused activation, all inside
    ``moe_act``; the fc2 bias added per local expert (scale, add) then concatenated; the attention output's bias
    added before the residual. Exact op counts, bytes, FLOPs and saved bytes; a plain card has none of them."""
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.costs import Shard, backward_ops, layer_ops, recomputed, selective_saved

    plain = load_model_config("qwen3-moe-mini")
    oss = plain.model_copy(update={"linear_bias": True, "activation_clamp": 7.0})
    T, S, h, f, k, E, ep = 128, 64, 256, 96, 8, 32, 4
    rows = T * k  # uniform: every rank receives its share, T * top_k rows in all
    e_local = E // ep
    n_e = rows / e_local
    ops = layer_ops(oss, 1, T, S, Shard(ep=ep))
    base = layer_ops(plain, 1, T, S, Shard(ep=ep))
    names = [o.name for o in ops]
    new = [o for o in ops if o.name not in {b.name for b in base}]
    assert len(ops) - len(base) == len(new) == 4 + 2 * e_local + 1 + 1
    i = names.index("moe.experts_fc1")
    assert names[i + 1:i + 6] == ["moe.experts_act_clamp_glu", "moe.experts_act_clamp_linear", "moe.experts_act_cat",
                                  "moe.experts_act_offset_h2d", "moe.experts_swiglu"]
    # the linear offset's torch.tensor(..., device=cuda): a blocking copy, the host waits (no gradient)
    assert [o.name for o in ops if o.host_sync] == ["moe.experts_act_offset_h2d"]
    j = names.index("moe.experts_fc2")
    assert names[j + 1:j + 2 * e_local + 2] == [f"moe.experts_fc2_bias_{w}.{e}" for e in range(e_local)
                                                for w in ("scale", "add")] + ["moe.experts_fc2_bias_cat"]
    assert names[names.index("attn.residual") - 1] == "attn.o_bias"
    by = {o.name: o for o in ops}
    assert by["moe.experts_act_clamp_glu"].bytes == rows * f * 2 * 2
    assert by["moe.experts_act_clamp_linear"].bytes == rows * f * 2 * 2
    assert by["moe.experts_act_cat"].bytes == 2 * rows * f * 2 * 2 and by["moe.experts_act_cat"].flops == 0
    assert by["moe.experts_fc2_bias_scale.0"].bytes == n_e * h * 2 + n_e * 2 + h * 2
    assert by["moe.experts_fc2_bias_add.0"].bytes == n_e * h * 2 * 3
    assert by["moe.experts_fc2_bias_cat"].bytes == rows * h * 2 * 2
    assert by["attn.o_bias"].bytes == T * h * 2 * 2
    assert sum(o.flops for o in new) == 2 * rows * f + 2 * rows * h + T * h + 1
    # clamps 2 + 2, cat 4 (units of rows x f x 2 bytes); bias scale 1, add 3, cat 2 (rows x h x 2 bytes), each
    # scale also reads its rows' bf16 probabilities and the bias; the attention bias add 2 (T x h x 2 bytes)
    assert sum(o.bytes for o in new) == (8 * rows * f * 2 + 6 * rows * h * 2 + rows * 2 + e_local * h * 2
                                         + 2 * T * h * 2 + 2 * 2)
    # moe_act recomputes the whole prologue with the activation; the run keeps only fc1's output (both halves)
    act = [o.name for o in ops if recomputed(o.name, ["moe_act"])]
    assert act == ["moe.experts_act_clamp_glu", "moe.experts_act_clamp_linear", "moe.experts_act_cat",
                   "moe.experts_act_offset_h2d", "moe.experts_swiglu"]
    assert selective_saved(ops, []) - selective_saved(ops, ["moe_act"]) == 2 * rows * f * 2
    # the backward, autograd kernel by kernel (costs.GPT_OSS_BACKWARD_SOURCE), in units of rows x f (u) and
    # rows x h x 2 bytes: each clamp's where (3u), chunk's cat of the halves' gradients (4u, with clamp_glu's);
    # the sums and the cat pass their gradient on (no kernel); per expert the product's two muls and two sums
    # (6 units), the two splits' cats (2 units and the probabilities); the attention bias's one reduction
    bwd = {o.name: o for o in backward_ops(ops)}
    u = rows * f * 2
    glu = bwd["moe.experts_act_clamp_glu.bwd"]
    assert (glu.bytes, glu.launches, glu.loop_launches) == (7 * u, 1, 1)  # a second kernel from autograd's C++
    assert bwd["moe.experts_act_clamp_linear.bwd"].bytes == 3 * u
    assert not any(n.startswith(("moe.experts_act_cat", "moe.experts_fc2_bias_add")) for n in bwd)
    sc = bwd["moe.experts_fc2_bias_scale.0.bwd"]
    assert (sc.bytes, sc.launches + sc.loop_launches, sc.params) == ((6 * n_e * h + 2 * n_e + h) * 2, 4, 1)
    cat = bwd["moe.experts_fc2_bias_cat.bwd"]
    assert (cat.bytes, cat.launches + cat.loop_launches) == (2 * (rows * h + rows) * 2, 2)
    assert (bwd["attn.o_bias.bwd"].bytes, bwd["attn.o_bias.bwd"].launches, bwd["attn.o_bias.bwd"].params) == (
        T * h * 2, 1, 1)
    assert len(backward_ops(ops)) - len(backward_ops(base)) == len(new) - 1 - 1 - e_local
    # serving has none of the eager bias kernels (the clamp stays: the model's math)
    serve = [o.name for o in layer_ops(oss, 1, T, S, Shard(ep=ep, q_len=S))]
    assert not any("bias" in n or "h2d" in n for n in serve) and "moe.experts_act_cat" in serve
    card = load_model_config("gpt-oss-120b")
    assert card.linear_bias and card.activation_clamp == 7.0


def test_gpt_oss_model_flops_against_megatron_bridges_formula() -> None:
    """Why cosim counts 32.7 GFLOP/token (fwd + bwd) for gpt-oss-120b and the Megatron-Bridge table 27.1
    (428 TFLOP/s / 15784 tokens/s): Megatron-Bridge v0.3.0 ``training/utils/flop_utils.py`` applies the GLU
    factor 3/2 only when ``activation_func == F.silu`` (gpt-oss's GLU is quick-GELU: its three expert matrices
    count as two) and counts every layer's attention as full causal (no sliding windows). Its formula, from the
    card: 27.16; with the 3/2 factor 34.33; with the 18 window layers' pairs 32.63, cosim's count less the router
    GEMM, norms and element-wise ops (0.3%)."""
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.build import _model_flops_per_token
    from cosim.workload.synth.costs import window_pairs

    c = load_model_config("gpt-oss-120b")
    s = 4096
    h, heads, g, d, L = c.hidden_size, c.num_heads, c.num_kv_heads, c.attn_head_dim, c.num_layers
    f, k, V = c.expert_ffn_size or 0, c.top_k, c.vocab_size
    ratio = heads * d / h  # query_projection_to_hidden_size_ratio

    def megatron_bridge(glu: float, windows: bool = False) -> float:
        experts = 12 * L * h * f * k * glu
        proj = 12 * L * h * h * (1 + g / heads) * ratio
        if windows:
            keys = sum(s / 2 if c.window(ly) is None else window_pairs(s, s, c.window(ly) or 0) / s for ly in range(L))
        else:
            keys = L * s / 2
        core = 12 * h * h * ratio / h * keys
        return (experts + proj + core + 6 * h * V) / 1e9

    assert megatron_bridge(1.0) == pytest.approx(27.16, abs=0.01)
    assert megatron_bridge(1.0) == pytest.approx(428e12 / 15784 / 1e9, rel=0.002)  # the table's own figure
    assert megatron_bridge(1.5) == pytest.approx(34.33, abs=0.01)
    cosim = 3 * _model_flops_per_token(c, s) / 1e9
    assert cosim == pytest.approx(32.73, abs=0.01)
    assert cosim == pytest.approx(megatron_bridge(1.5, windows=True), rel=0.004)


def test_gpt_oss_activation_offset_copy_syncs_the_host_each_forward_and_recompute(tmp_path: Path, dgx: object) -> None:
    """A card with ``activation_clamp`` (gpt-oss) adds one host sync per MoE layer forward (the quick-GEGLU's
    ``torch.tensor(linear_offset, device=cuda)``) to the dispatcher's, and ``moe_act`` recomputation runs it again
    before the layer's backward: 4 MoE layers x 2 micro-batches x (1 + 1) syncs, + 4 x 2 recomputed."""
    from cosim.capture.config import load_model_config
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.workload.synth import SyntheticSpec, synthesize

    card = load_model_config("qwen3-moe-mini").model_dump()
    card.update(name="oss-mini", linear_bias=True, activation_clamp=7.0)
    f = tmp_path / "oss-mini.yaml"
    f.write_text(yaml.safe_dump(card))

    def syncs(model: str, recompute: str) -> int:
        spec = SyntheticSpec.model_validate({"model": model, "layout": {"ep": 8, "recompute": recompute,
                                                                        "recompute_modules": ["moe_act"]},
                                             "batch": {"global": 16, "micro": 1, "seq": 256}})
        rg = synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer).graph.ranks[0]
        return [rg.strings[int(x)] for x in rg.host_ops.name].count("cudaStreamSynchronize")

    assert syncs("qwen3-moe-mini", "selective") == 4 * 2
    assert syncs(str(f), "none") == 4 * 2 * 2
    assert syncs(str(f), "selective") == 4 * 2 * 2 + 4 * 2


def test_yarn_mscale_runs_megatrons_unfused_rope_chain_by_hand() -> None:
    """A card with a YaRN attention factor (gpt-oss ``rope_mscale`` 1.3466 = 0.1 ln 32 + 1) trains with
    Megatron-Core's unfused RoPE (TE's fused RoPE takes no mscale; costs.ROPE_SOURCE): per q and k, six small
    kernels on the fp32 angles and six over the tensor (12 units of n x 2 bytes forward), four backward kernels
    (14 units); the fused ``attn.rope`` (2 units per element of q and k) otherwise, and always when serving."""
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.costs import Shard, backward_ops, layer_ops

    plain = load_model_config("qwen3-moe-mini")  # 8 heads, 1 KV head, head dim 32
    yarn = plain.model_copy(update={"rope_mscale": 1.3466})
    T, S, d = 128, 64, 32
    ops = [o for o in layer_ops(yarn, 0, T, S, Shard()) if o.name.startswith("attn.rope")]
    assert [o.name for o in layer_ops(plain, 0, T, S, Shard()) if o.name.startswith("attn.rope")] == ["attn.rope"]
    assert len(ops) == 2 * 12
    for x, heads in (("q", 8), ("k", 1)):
        n = T * heads * d
        mine = [o for o in ops if o.name.startswith(f"attn.rope_{x}.")]
        small = [o for o in mine if o.no_grad and o.dtype == "fp32"]
        assert len(small) == 6 and all(o.bytes == 2 * S * d * 4 for o in small)
        big = [o for o in mine if o not in small]
        assert [o.name.split(".")[-1] for o in big] == ["mul_cos", "neg", "rotate_cat", "mul_sin", "add", "cat"]
        assert sum(o.bytes for o in big) == 12 * n * 2
        bwd = [o for o in backward_ops(mine)]
        assert len(bwd) == 4 and sum(o.bytes for o in bwd) == 14 * n * 2
    serve = [o.name for o in layer_ops(yarn, 0, T, S, Shard(q_len=S)) if o.name.startswith("attn.rope")]
    assert serve == ["attn.rope"]
    assert load_model_config("gpt-oss-120b").rope_mscale == pytest.approx(1.3466, abs=1e-4)


def test_nvlink5_rate_against_published_nvl72_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    """NVLink 5's efficiency (0.856) is nvbandwidth's GPU-to-GPU copy on a GB200 NVL72, ~770 GB/s of 900
    (Azure/AI-benchmarking-guide issue 7): the NVLink port's rate; a lone 1 GiB NCCL send/recv in the rack runs at
    NCCL's own NVLink rate below it (18 x 40.1 GB/s, SM100_NVLINK_BW: NcclParams.p2p_nvlink_factor; the published
    all-to-alls, validation/collectives/RESULTS.md, read below the port's rate too). Held out: nccl-tests
    all_reduce_perf on a full 72-GPU rack (coreweave/nccl-tests PR 43), busbw 758 / 839 / 835 GB/s at 2 / 4 / 8 GiB,
    within 10 % (NVLink 4's 0.77 gave -11 / -17 / -16 %)."""
    import json

    from cosim.catalog import load_catalog
    from cosim.cli import main

    assert load_catalog().link("nvlink5").efficiency == pytest.approx(0.856)

    def busbw(*argv: str) -> list[float]:
        assert main(["collective", "-t", "gb200-nvl72", "--json", *argv]) == 0
        return [r["busbw_Bps"] / 1e9 for r in json.loads(capsys.readouterr().out)["results"]]

    [p2p] = busbw("--op", "send_recv", "--ranks", "2", "--sizes", "1GiB")
    assert p2p == pytest.approx(18 * 40.1 * 0.980878, rel=0.03)  # x the Simple protocol's fitted efficiency
    for got, published in zip(busbw("--op", "all_reduce", "--ranks", "72", "--sizes", "2GiB,4GiB,8GiB"), (758, 839, 835)):
        assert got == pytest.approx(published, rel=0.10)


def test_from_json_bad_file_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--from-json`` on a truncated or foreign file: one line naming the file, exit status 2, no traceback."""
    from validation.e2e.run import main

    bad = tmp_path / "rows.json"
    for text in ("", '{"rows": [{"id": "x"}', '{"cases": []}', '{"rows": [1, 2]}'):
        bad.write_text(text, encoding="utf-8")
        assert main(["--from-json", str(bad)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: {bad}:") and "\n" not in err, err


ROUND7_SOURCES = {"MZQWEN3", "MZQWEN3B", "NEMO2504", "NEMO2502", "NEMO2407", "AUTOMODEL", "MLMGB200"}


def test_round7_rows_from_other_sources_load_and_match_their_tables() -> None:
    """The round-7 rows cite sources other than Megatron-Bridge's tables, each with its config; their measured
    tokens/s/GPU agree with the source's own figures (ModelZoo: GBS * seq / step / GPUs from the table's step time;
    AutoModel: its tokens/s/GPU column equals GBS * seq / step / GPUs), and every layout divides the GPUs."""
    from validation.e2e.run import load_cases, microbatches

    sources, cases = load_cases()
    new = [c for c in cases if c.source.ref in ROUND7_SOURCES]
    assert len(new) == 21 and ROUND7_SOURCES <= set(sources)
    assert all(c.config and c.source.row for c in new)
    step_s = {"mz-qwen3-235b-h100-256-bf16-deepep": 19.7, "mz-qwen3-235b-h100-256-bf16-deepep-a2a-overlap": 17.6,
              "mz-qwen3-235b-h100-256-bf16-a2a-pp32": 24.2, "mz-qwen3-235b-h100-256-bf16-tp4": 29.0,
              "mz-qwen3-235b-h100-256-bf16-fsdp": 17.6, "automodel-qwen3-30b-h100-8-bf16": 21.773,
              "automodel-gpt-oss-120b-h100-64-bf16": 4.30, "automodel-gpt-oss-20b-h100-8-bf16": 10.04, "automodel-dsv3-h100-256-bf16": 8.18,
              "automodel-dsv3-h100-1024-bf16": 37.87}
    by = {c.id: c for c in new}
    for cid, s in step_s.items():
        c = by[cid]
        assert c.batch.global_ * c.batch.seq / s / c.gpus == pytest.approx(c.measured.tokens_per_s_per_gpu, rel=0.005), cid
    for c in new:
        lay = c.layout
        assert c.gpus % (lay.tp * lay.pp * lay.cp) == 0 and microbatches(c) >= 1, c.id
    # AutoModel: FSDP2 with DeepEP; per-layer activation checkpointing where its config sets it
    assert {c.id for c in new if c.recompute == "full"} == {
        "mz-qwen3-235b-h100-256-bf16-fsdp", "automodel-qwen3-30b-h100-8-bf16", "automodel-dsv3-h100-256-bf16",
        "automodel-dsv3-h100-1024-bf16"}
    assert all(c.fsdp and c.dispatch == "deepep" for c in new if c.source.ref == "AUTOMODEL")


ROUND8_IDS = {"mb2511-dsv3-gb200-256-bf16", "mb2511-dsv3-gb200-256-mxfp8", "mb2511-gpt-oss-120b-gb200-64-bf16",
              "mb2511-qwen3-30b-gb200-8-mxfp8", "mb2511-qwen3-235b-gb200-256-bf16", "mb2511-dsv3-b200-256-mxfp8",
              "mb2511-gpt-oss-120b-b200-64-bf16", "mb2511-qwen3-30b-b200-8-mxfp8", "mb2511-qwen3-235b-b200-64-mxfp8",
              "mb2511-gpt-oss-120b-h100-64-bf16", "mb2511-qwen3-30b-h100-16-fp8", "mb2511-qwen3-235b-h100-256-fp8"}


def test_round8_rows_are_every_moe_row_of_the_2511_tables() -> None:
    """Round 8 adds every MoE row of Megatron-Bridge 25.11's DGX-GB200, DGX-B200 and DGX-H100 tables (MB2511; the
    GB300 table has no cosim preset), each with its config, and every layout divides its GPUs."""
    from validation.e2e.run import load_cases, microbatches

    sources, cases = load_cases()
    assert len(cases) == 75 and {"MB2511", "MB2511CFG"} <= set(sources)
    new = [c for c in cases if c.source.ref == "MB2511" and c.system != "gb300-nvl72"]  # GB300: round 9
    assert {c.id for c in new} == ROUND8_IDS
    for c in new:
        lay = c.layout
        assert c.config and c.source.row and c.gpus % (lay.tp * lay.pp * lay.cp) == 0 and microbatches(c) >= 1, c.id


def test_runner_passes_a_rows_full_recompute(tmp_path: Path) -> None:
    """A row's ``recompute: full`` becomes the layout's (the runner's ``--recompute full`` does it for every row);
    absent, a row's ``recompute_modules`` make it selective."""
    from validation.e2e.run import _scenario, load_cases

    _, [case] = load_cases(_cases_file(tmp_path, recompute="full"))
    assert _scenario(case, 16, "dgx-h100", 1, "none").workload.synthetic.layout.recompute == "full"
    _, [sel] = load_cases(_cases_file(tmp_path, recompute_modules=["moe_act"]))
    lay = _scenario(sel, 16, "dgx-h100", 1, "none").workload.synthetic.layout
    assert lay.recompute == "selective" and lay.recompute_modules == ["moe_act"]
    with pytest.raises(Exception, match="recompute"):
        load_cases(_cases_file(tmp_path, recompute="sometimes"))
    from cosim.errors import CosimInputError

    with pytest.raises(CosimInputError, match="recompute: full and recompute_modules exclude each other"):
        load_cases(_cases_file(tmp_path, recompute="full", recompute_modules=["moe_act"]))
    with pytest.raises(CosimInputError, match="recompute_early_stop needs recompute: full"):
        load_cases(_cases_file(tmp_path, recompute_early_stop=True))


def test_a_row_published_in_tflops_only_is_scored_on_them(tmp_path: Path) -> None:
    """A source that prints model TFLOP/s/GPU only (the Megatron-Core GB200 DeepSeek-V3 write-up) is scored on
    cosim's model TFLOP/s/GPU; a row with neither figure is a one-line error."""
    from validation.e2e.run import _figures, load_cases

    _, [case] = load_cases(_cases_file(tmp_path, measured={"model_tflops_per_gpu": 100.0}))
    syn = {"tokens_per_step": 64 * 256, "model_flops_per_step": 8 * 150e12}
    got = _figures(case, [(16, {"step_time_s": 1.0, "mfu": 0.1, "synthetic": syn, "memory_per_gpu_bytes": 0}, 0.0)])
    assert got["scored_on"] == "tflops" and got["error"] == pytest.approx(0.5)
    _, [both] = load_cases(_cases_file(tmp_path, measured={"tokens_per_s_per_gpu": 4096.0, "model_tflops_per_gpu": 1.0}))
    got = _figures(both, [(16, {"step_time_s": 1.0, "mfu": 0.1, "synthetic": syn, "memory_per_gpu_bytes": 0}, 0.0)])
    assert got["scored_on"] == "tokens" and got["error"] == pytest.approx(64 * 256 / 8 / 4096.0 - 1.0)
    with pytest.raises(Exception, match="tokens_per_s_per_gpu or model_tflops_per_gpu"):
        load_cases(_cases_file(tmp_path, measured={}))


def test_an_unscored_row_runs_but_leaves_the_statistics(tmp_path: Path) -> None:
    """``unscored: REASON`` (a run whose feature cosim lacks) is reported but kept out of the median and max, like
    a bound; no row is unscored since round 9 (AutoModel's 1024-GPU DeepSeek-V3 row runs its four pipeline schedules:
    gradient_accumulation_steps)."""
    from validation.e2e.run import load_cases, stats, table

    rows = [{"status": "run", "bound": False, "unscored": None, "error": 0.05},
            {"status": "run", "bound": False, "unscored": "activation offloading", "error": 0.9}]
    st = stats(rows)
    assert st["scored"] == 1 and st["max_abs_error"] == pytest.approx(0.05)
    sources, [case] = load_cases(_cases_file(tmp_path, unscored="needs X"))
    assert case.unscored == "needs X"
    row = {"id": "x", "gpus": 8, "precision": "bf16", "published": {"tokens_per_s_per_gpu": 1.0}, "status": "run",
           "bound": False, "unscored": "needs X", "tokens_per_s_per_gpu": 2.0, "error": 1.0, "model_tflops_per_gpu": 1.0,
           "mfu": 0.1, "source": {"ref": "MZQWEN3", "table": "t"}}
    assert "(not scored)" in table([row], sources)
    _, cases = load_cases()
    assert [c.id for c in cases if c.unscored] == []  # offloading (round 8), GA schedules (round 9) are modelled


def test_a_case_citing_a_source_of_no_known_framework_is_a_one_line_error(tmp_path: Path) -> None:
    """The framework decides the gradient bucket size (Megatron-Bridge's 128 Mi parameters or Megatron-Core's rule),
    so a source in neither list must be named: round 11's MB260201 rows silently took the wrong rule."""
    from cosim.errors import CosimInputError
    from validation.e2e.run import BRIDGE_BUCKET, ddp_bucket_size, load_cases

    f = _cases_file(tmp_path, source={"ref": "ZZ", "table": "t"})
    f.write_text(f.read_text().replace("MZQWEN3: test", "ZZ: test"))
    with pytest.raises(CosimInputError, match=r"cases\[0\]\.source\.ref: 'ZZ' names no framework"):
        load_cases(f)
    _, cases = load_cases(Path(__file__).parent.parent / "validation/e2e/heldout_qwen3_30b.yaml")
    h100 = [c for c in cases if c.id.endswith("qwen3-30b-h100-16-fp8")]
    assert {c.source.ref for c in h100} == {"MB260201", "MB2604", "MB260401", "MB2606"}
    assert {ddp_bucket_size(c) for c in h100} == {float(BRIDGE_BUCKET)}


def test_a_case_source_error_names_the_line_of_its_ref(tmp_path: Path) -> None:
    """Both source checks point at the case's ``ref`` line (training.yaml has 75 cases over 1375 lines: a
    ``cases[13]`` index alone leaves the user counting)."""
    from cosim.errors import CosimInputError
    from validation.e2e.run import load_cases

    f = _cases_file(tmp_path, source={"ref": "ZZ", "table": "t"})
    line = next(i for i, t in enumerate(f.read_text().splitlines(), 1) if "ref: ZZ" in t)
    with pytest.raises(CosimInputError) as err:  # ZZ is not a key of sources
        load_cases(f)
    assert f"{f}:{line}:" in str(err.value) and "is not a key of sources" in str(err.value)
    f.write_text(f.read_text().replace("MZQWEN3: test", "ZZ: test"))
    with pytest.raises(CosimInputError) as err:  # ZZ names no framework
        load_cases(f)
    assert f"{f}:{line}:" in str(err.value) and "names no framework" in str(err.value)
