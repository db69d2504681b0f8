"""End-to-end validation runner (validation/e2e) and the dropless MoE host sync of synthesis."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dgx() -> object:
    from cosim.topology import load_topology

    return load_topology("dgx-h100")


def test_dropless_moe_forward_syncs_the_host_after_each_permutation(dgx: object) -> None:
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
    assert sorted(waited) == syncs and all(gnames[j] == "moe.permute" for j in waited.values())
    # each sync comes right before the launch of the dispatch all-to-all it sizes
    launch_of = {int(h): j for j, h in enumerate(rg.launches.host_op)}
    assert all(gnames[launch_of[h + 1]] == "moe.dispatch" for h in syncs)
    run = replay(syn.graph, dgx, ReplayConfig(collectives="simulated")).runs[0]
    gend = run.gpu_start + rg.gpu_ops.dur
    for h, j in waited.items():  # the host returns only after the permutation kernel has run
        assert run.host_end[h] >= gend[j] - 1e-12 and run.host_start[h + 1] >= gend[j] - 1e-12
    # full recomputation re-runs each forward (and its sync) before the backward
    rg2 = build("full").graph.ranks[0]
    names_rc = [rg2.strings[int(x)] for x in rg2.host_ops.name]
    assert names_rc.count("cudaStreamSynchronize") == 2 * 4 * 2


def test_the_host_sync_costs_a_sync_and_a_launch_latency_per_moe_layer_when_gpu_bound(dgx: object) -> None:
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import ReplayConfig, replay
    from cosim.workload.synth import SyntheticSpec, synthesize

    def step(sync: bool) -> float:
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8}, "moe_host_sync": sync,
                                             "batch": {"global": 16, "micro": 1, "seq": 4096}})
        return replay(synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer).graph, dgx, ReplayConfig(collectives="simulated")).summary()["step_time_s"]

    # GPU-bound (seq 4096): without the sync the host has launched the dispatch long before the permutation ends;
    # with it, each of the 8 forward MoE layers waits the sync's return (3 us) and the dispatch's launch latency
    cpu = dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0]))
    per_sync = (step(True) - step(False)) / 8
    assert per_sync == pytest.approx(ReplayConfig().default_sync_overhead + float(cpu.launch_latency), rel=1e-6)


def _cases_file(tmp_path: Path, **over: object) -> Path:
    case = {"id": "mini-pp2", "model": "qwen3-moe-mini", "system": "dgx-h100", "gpus": 8,
            "layout": {"tp": 1, "pp": 2, "vpp": 1, "cp": 1, "ep": 4}, "fsdp": False,
            "batch": {"global": 64, "micro": 1, "seq": 256}, "precision": "bf16",
            "measured": {"tokens_per_s_per_gpu": 100000.0},
            "source": {"ref": "X", "table": "a hand-made case"}}
    case.update(over)
    f = tmp_path / "cases.yaml"
    f.write_text(yaml.safe_dump({"sources": {"X": "test"}, "cases": [case]}))
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

    _, [big] = load_cases(_cases_file(tmp_path, gpus=4096, system="gb200-nvl72"))
    r = run_case(big)
    assert r["status"] == "not run" and "72-GPU" in r["reason"]
    # DeepSeek-V3's 61 layers over 16 chunks: the loss and embedding chunks and the last-but-one give a layer back
    assert pipeline_layers(61, 16) == [3] + [4] * 13 + [3, 3] and pipeline_layers(48, 24) is None
    bad = _cases_file(tmp_path, layout={"tp": 1, "pp": 2, "ep": 4, "dp": 3})
    p = subprocess.run([sys.executable, "-m", "validation.e2e.run", "--cases", str(bad)], cwd=ROOT,
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stdout == "" and len(p.stderr.strip().splitlines()) == 1
    assert "layout" in p.stderr and "dp" in p.stderr


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
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 16, "a2a_overlap": overlap},
                                             "batch": {"global": 64, "micro": 1, "seq": 4096}})
        return replay(synthesize(spec, topo, kernel_timer=synthetic_kernel_timer).graph, topo, ReplayConfig(collectives="simulated")).summary()

    plain, over = run(False), run(True)
    assert over["breakdown"]["compute"] == pytest.approx(plain["breakdown"]["compute"], rel=1e-9)  # same kernels
    assert over["breakdown"]["exposed_communication"] < 0.8 * plain["breakdown"]["exposed_communication"]
    assert over["step_time_s"] < plain["step_time_s"]
    with pytest.raises(CosimInputError, match="a2a_overlap: the EP all-to-all overlap with a pipeline needs at least"):
        synthesize(SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 4, "pp": 2, "vpp": 2,
                                                 "a2a_overlap": True}, "batch": {"global": 16, "seq": 256}}), topo,
                   kernel_timer=synthetic_kernel_timer)
    with pytest.raises(CosimInputError, match="a2a_overlap: needs ep > 1, vpp > 1 when pp > 1"):
        synthesize(SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "layout": {"ep": 8, "pp": 2,
                                                 "a2a_overlap": True}, "batch": {"global": 64, "seq": 256}}), topo,
                   kernel_timer=synthetic_kernel_timer)
