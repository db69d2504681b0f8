"""Gradient accumulation over repeated pipeline schedules (PyTorch pipelining as NeMo AutoModel runs it), worked by
hand on a 2-layer, EP4, PP2 model."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from pathlib import Path

import pytest
import yaml

from cosim.errors import CosimInputError
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType
from cosim.workload.synth import SyntheticSpec, synthesize
from cosim.workload.synth.schedule import accumulated_order, stage_order

# 2 MoE layers, wide enough that the GPU (not the host) bounds every unit
WIDE = dict(name="wide2", hidden_size=2048, num_layers=2, num_heads=16, num_kv_heads=4, head_dim=128, vocab_size=4096,
            num_experts=8, top_k=2, expert_ffn_size=4096)


def test_accumulated_order_repeats_the_schedule_by_hand() -> None:
    F, B = "F", "B"
    # pp 2, 4 micro-batches, GA 2: two schedules of 2, each with its own warm-up and drain
    assert accumulated_order(0, 2, 1, 4, 2) == [(F, 0, 0), (F, 1, 0), (B, 0, 0), (B, 1, 0),
                                                (F, 2, 0), (F, 3, 0), (B, 2, 0), (B, 3, 0)]
    assert accumulated_order(1, 2, 1, 4, 2) == [(F, 0, 0), (B, 0, 0), (F, 1, 0), (B, 1, 0),
                                                (F, 2, 0), (B, 2, 0), (F, 3, 0), (B, 3, 0)]
    # GA 1 is the one schedule: stage 0 runs F2 between B0 and B1
    assert accumulated_order(0, 2, 1, 4, 1) == stage_order(0, 2, 1, 4) == [
        (F, 0, 0), (F, 1, 0), (B, 0, 0), (F, 2, 0), (B, 1, 0), (F, 3, 0), (B, 2, 0), (B, 3, 0)]
    # interleaved: each schedule is Megatron's interleaved order on its own micro-batches
    assert accumulated_order(0, 2, 2, 4, 2)[8:] == [(k, mb + 2, v) for k, mb, v in stage_order(0, 2, 2, 2)]
    with pytest.raises(CosimInputError, match="does not divide"):
        accumulated_order(0, 2, 1, 5, 2)


def _synth(tmp_path: Path, topo: object, ga: int, **kw: object) -> object:
    f = tmp_path / "wide2.yaml"
    f.write_text(yaml.safe_dump(WIDE))
    # 8 GPUs: pp 2 x dp 4, ep 4 per stage; global 16 -> 4 micro-batches per pipeline
    spec = SyntheticSpec.model_validate(dict(
        model=str(f), layout=dict(pp=2, ep=4, **kw), precision="bf16",
        batch={"global": 16, "micro": 1, "seq": 1024, "gradient_accumulation_steps": ga}))
    return synthesize(spec, topo, kernel_timer=synthetic_kernel_timer)


def _gaps(syn: object, run: object, rank: int) -> list[float]:
    """Idle time of ``rank``'s compute stream before each schedule unit after its first (s)."""
    spans = syn.built.unit_spans[rank]  # type: ignore[attr-defined]
    return [float(run.gpu_start[b[0]] - run.gpu_end[a[1]]) for a, b in pairwise(spans)]  # type: ignore[attr-defined]


def test_pp2_ga2_step_has_two_fills_and_one_dp_reduction(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    cfg = ReplayConfig(collectives="simulated", comm_share=False)
    one, two = _synth(tmp_path, dgx, 1), _synth(tmp_path, dgx, 2)
    r1, r2 = replay(one.graph, dgx, cfg), replay(two.graph, dgx, cfg)
    # the units as issued: stage 0 (rank 0) and stage 1 (rank 4)
    assert [k[0][0] for k in two.built.unit_keys[0]] == accumulated_order(0, 2, 1, 4, 2)
    assert [k[0][0] for k in two.built.unit_keys[4]] == accumulated_order(1, 2, 1, 4, 2)
    run0, run1 = r2.runs
    dur0 = {k[0][0]: float(run0.gpu_end[b] - run0.gpu_start[a])
            for (a, b, _), k in zip(two.built.unit_spans[0], two.built.unit_keys[0])}
    # by hand (transfers neglected), GA 2: stage 1 runs F0 B0 F1 B1, then waits for stage 0, which runs B1 (after
    # stage 1's B1) then F2 before it sends F2's activations: the second schedule's fill, one bubble of stage 0's
    # B1 + F2 on stage 1 between B1 and F2, and none elsewhere on stage 1
    g2 = _gaps(two, run1, 4)
    fill = dur0[("B", 1, 0)] + dur0[("F", 2, 0)]
    assert g2[3] == pytest.approx(fill, rel=0.2)
    assert max(g2[:3] + g2[4:]) < 0.2 * fill
    # GA 1 (one schedule): stage 0 runs F2 before B1, so stage 1 finds F2's activations ready: no bubble there
    g1 = _gaps(one, {r.rank: r for r in r1.runs}[4], 4)
    assert g1[3] < 0.2 * fill
    assert r2.summary()["step_time_s"] > r1.summary()["step_time_s"]
    # one DP reduction and one optimizer per step, after the last schedule's last backward
    for syn in (one, two):
        for rg in syn.graph.ranks:
            C = rg.collectives
            kinds = Counter(CollType(int(C.type[c])).name for c in range(len(C)))
            assert kinds["REDUCE_SCATTER"] == 1 and kinds["ALL_REDUCE"] == 1, kinds
            names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
            rs = [i for i, n in enumerate(names) if n == "grad.dp_reduce_scatter"]
            assert len(rs) == 1 and rs[0] > syn.built.unit_spans[rg.rank][-1][0]  # in the last unit: B3


def test_ga_errors_name_the_field(tmp_path: Path, dgx: object) -> None:
    with pytest.raises(CosimInputError, match="gradient_accumulation_steps: 3 needs"):
        _synth(tmp_path, dgx, 3)
    with pytest.raises(CosimInputError, match="1 micro-batches per pipeline and schedule to be a multiple of pp 2"):
        _synth(tmp_path, dgx, 4, vpp=2, pipeline_layers=[1, 0, 1, 0])  # 4 schedules of 1 micro-batch
    with pytest.raises(CosimInputError, match=r"gradient_accumulation_steps: 2 needs .*dualpipe"):
        _synth(tmp_path, dgx, 2, schedule="dualpipe")


def test_e2e_runner_probes_whole_schedules_of_the_automodel_row() -> None:
    """The AutoModel 1024-GPU DeepSeek-V3 row (GA 4 on 32 micro-batches per pipeline: schedules of 8): the runner's
    probes are whole schedules (8 and 16 micro-batches, GA 1 and 2), extrapolated linearly in schedules."""
    from validation.e2e.run import _scenario, load_cases, microbatches, probe_counts

    case = {c.id: c for c in load_cases()[1]}["automodel-dsv3-h100-1024-bf16"]
    assert case.gradient_accumulation_steps == 4 and microbatches(case) == 32 and not case.unscored
    assert probe_counts(case, 16) == [8, 16] and probe_counts(case, 64) == [32]
    for m, ga in ((8, 1), (16, 2), (32, 4)):
        batch = _scenario(case, m, "dgx-h100", 128, "none").workload.synthetic.batch
        assert (batch.global_, batch.gradient_accumulation_steps) == (m * 256, ga)
