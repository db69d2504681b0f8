"""Multi-token prediction (DeepSeek-V3 report section 2.2; Megatron-Core multi_token_prediction.py): the card field,
the spec switch, the MTP ops of one depth by hand, the exact extra collectives of a 2-layer PP2 step, its memory
and the model FLOPs against Megatron-Bridge's DeepSeek-V3 count."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosim.capture.config import MoEModelConfig, load_model_config
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType
from cosim.workload.synth import SyntheticSpec, synthesize
from cosim.workload.synth.build import _model_flops_per_token
from cosim.workload.synth.costs import Shard, layer_ops, mtp_ops, mtp_params
from cosim.workload.synth.memory import memory_per_stage
from tests._cards import TINY as _TINY
from tests._cards import synth_tiny

# 2 MoE layers, d 64, 4 heads of 16 (2 KV heads), 8 experts top-2 of width 32, vocabulary 256, one MTP depth
TINY = {**_TINY, "mtp_layers": 1}  # tests/_cards.py's card
H, V, T = 64, 256, 64


def _synth(tmp_path: Path, topo: object, mtp: int | None, **layout: Any) -> Any:
    return synth_tiny(tmp_path, topo, TINY, layout={"pp": 2, "ep": 4, **layout}, batch={"global": 8, "micro": 1, "seq": T},
                      fold=False, **({} if mtp is None else {"mtp_layers": mtp}))


def _colls(rg: Any) -> Counter:
    C = rg.collectives
    return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c])) for c in range(len(C)))


def _names(rg: Any) -> Counter:
    return Counter(rg.strings[int(x)] for x in rg.gpu_ops.name)


def test_card_field_from_the_preset_and_config_json(tmp_path: Path) -> None:
    assert load_model_config("deepseek-v3").mtp_layers == 1  # config.json num_nextn_predict_layers: 1
    assert load_model_config("qwen3-235b-a22b").mtp_layers == 0
    from test_synth_cards import DSV3_HF

    cfg = dict(DSV3_HF)
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**cfg, "num_nextn_predict_layers": 1}))
    assert load_model_config(f).mtp_layers == 1
    f.write_text(json.dumps({k: v for k, v in cfg.items() if k != "num_nextn_predict_layers"}))
    assert load_model_config(f).mtp_layers == 0


def test_mtp_ops_of_one_depth_by_hand() -> None:
    """TP2 with sequence parallelism: the shifted tokens' embedding (vocabulary-parallel, reduce-scattered), enorm
    and hnorm on the T/2 local tokens, their concatenation, eh_proj (column-parallel 2h -> h/2: its 2h input
    all-gathered, its output gathered along the hidden dim), the layer, then final norm, shared head and loss."""
    card = MoEModelConfig(**TINY)
    sh = Shard(tp=2, ep=4, sequence_parallel=True)
    body = layer_ops(card, 1, T, T, sh, "bf16")
    ops = mtp_ops(card, T, T, sh, "bf16", body=body)
    names = [o.name for o in ops]
    n = len(body)
    assert names[:8] == ["mtp.embed.lookup", "mtp.embed.tp_reduce_scatter", "mtp.enorm", "mtp.hnorm", "mtp.concat",
                         "mtp.eh_proj.sp_all_gather", "mtp.eh_proj", "mtp.eh_proj.tp_all_gather"]
    assert ops[8:8 + n] == body
    assert names[8 + n:] == ["mtp.head.norm", "mtp.head.sp_all_gather", "mtp.head.lm_head", "mtp.head.cross_entropy",
                             "mtp.head.tp_loss_all_reduce"]
    by = {o.name: o for o in ops}
    assert by["mtp.enorm"].flops == by["mtp.hnorm"].flops and by["mtp.enorm"].bytes == 2 * (T / 2) * H * 2
    assert by["mtp.eh_proj.sp_all_gather"].comm.nbytes == T * 2 * H * 2  # type: ignore[union-attr]
    assert by["mtp.eh_proj.tp_all_gather"].comm.nbytes == T * H * 2  # type: ignore[union-attr]
    pj = by["mtp.eh_proj"]
    assert (pj.m, pj.n, pj.k, pj.flops) == (T, H / 2, 2 * H, 2 * T * (H / 2) * 2 * H)
    assert by["mtp.head.lm_head"].flops == 2 * T * (V / 2) * H
    # without SP the output gather's backward is a split (no communication)
    plain = {o.name: o for o in mtp_ops(card, T, T, Shard(tp=2, ep=4, sequence_parallel=False), "bf16")}
    assert "mtp.eh_proj.sp_all_gather" not in plain and plain["mtp.eh_proj.tp_all_gather"].no_grad


def test_worked_2_layer_pp2_step_adds_exactly_the_mtp_ops(tmp_path: Path, dgx: object) -> None:
    """8 GPUs, pp 2 x dp 4, ep 4, 2 micro-batches: MTP adds to the last stage one MoE layer's collectives per
    micro-batch, the bigger DP gradient bucket and parameter gather (the MTP parameters and the stage's embedding
    copy), and on both stages the embedding-gradient all-reduce between them; nothing else on the first stage."""
    a, b = _synth(tmp_path, dgx, 0), _synth(tmp_path, dgx, None)  # None: the card's 1
    layer = 64 * 16 * (4 * 2 + 2 * 2) + 2 * 64 + 64 * 8  # attention, 2 norms, router (experts: no DP replica)
    emb = V * H
    mtp = layer + 3 * H + 2 * H * H  # the MTP layer, enorm + hnorm + final norm, eh_proj
    assert mtp_params(load_model_config(str(tmp_path / "tiny2.yaml")), True) == (mtp + emb, 8 * 3 * H * 32)
    for ra, rb in zip(a.graph.ranks, b.graph.ranks):
        added, removed = _colls(rb) - _colls(ra), _colls(ra) - _colls(rb)
        emb_ar = {("ALL_REDUCE", 2, float(emb * 2)): 1}  # bf16 gradients of the vocabulary x hidden table
        if rb.rank < 4:
            assert (dict(added), dict(removed)) == (emb_ar, {}), rb.rank
            assert not any(k.startswith("mtp.") and k != "mtp.embed_grad_all_reduce" for k in _names(rb))
            continue
        dense0 = layer + emb + H  # stage 1 without MTP: a layer, the LM head and the final norm
        assert dict(removed) == {("REDUCE_SCATTER", 4, float(dense0 * 2)): 1,
                                 ("ALL_GATHER", 4, float(dense0 * 2 / 4)): 1}
        assert dict(added) == {
            **emb_ar,
            ("ALL_TO_ALL", 4, float(T * 2 * H * 2)): 2 * 4,  # the MTP layer's dispatch, combine and backward, x 2
            ("ALL_TO_ALL", 4, float(T * 2 * 4)): 2 * 2,      # its probabilities' all-to-all and backward
            ("ALL_GATHER", 4, 8.0 * 8): 2,                   # its token counts (forward)
            ("REDUCE_SCATTER", 4, float((dense0 + mtp + emb) * 2)): 1,  # one bucket: + MTP + embedding copy
            ("ALL_GATHER", 4, float((dense0 + mtp + emb) * 2 / 4)): 1,
        }, rb.rank
        got = {k: v for k, v in _names(rb).items() if k.startswith("mtp.")}
        fw = ["mtp.embed.lookup", "mtp.enorm", "mtp.hnorm", "mtp.concat", "mtp.head.norm", "mtp.head.cross_entropy"]
        assert got == {"mtp.embed_grad_all_reduce": 1, "mtp.eh_proj": 2, "mtp.eh_proj.dgrad": 2,
                       "mtp.eh_proj.wgrad": 2, "mtp.head.lm_head": 2, "mtp.head.lm_head.dgrad": 2,
                       "mtp.head.lm_head.wgrad": 2, **{k: 2 for k in fw}, **{f"{k}.bwd": 2 for k in fw}}
        # the MTP layer runs the main layers' ops under their names: one more of each per micro-batch
        assert _names(rb)["moe.experts_fc1"] == _names(ra)["moe.experts_fc1"] + 2
    assert b.built.model_flops > a.built.model_flops


def test_spec_switch_and_set_key(tmp_path: Path, dgx: object) -> None:
    """``mtp_layers: 0`` gives the step of a card without MTP (the same ops); serving never runs MTP."""
    off = _synth(tmp_path, dgx, 0)
    f = tmp_path / "nomtp.yaml"
    f.write_text(yaml.safe_dump({**TINY, "mtp_layers": 0}))
    spec = SyntheticSpec.model_validate(dict(model=str(f), layout={"pp": 2, "ep": 4}, precision="bf16",
                                             batch={"global": 8, "micro": 1, "seq": T}, fold=False))
    plain = synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer)
    assert [_names(r) for r in off.graph.ranks] == [_names(r) for r in plain.graph.ranks]
    assert off.built.model_flops == plain.built.model_flops
    from cosim.scenario import apply_scenario_sets, load_scenario

    scn = load_scenario(Path(__file__).resolve().parent.parent / "workloads/scenarios/dsv3-1024.yaml")
    scn2, rest = apply_scenario_sets(scn, {"workload.synthetic.mtp_layers": "0"})
    assert (scn2.workload.synthetic.mtp_layers, rest) == (0, {})  # type: ignore[union-attr]


def test_full_recompute_reruns_the_checkpointed_part(tmp_path: Path, dgx: object) -> None:
    """Megatron-Core's MTP _checkpointed_forward: the norms, concat, projection, layer and final norm re-run; the
    embedding, LM head and loss do not."""
    syn = _synth(tmp_path, dgx, 1, recompute="full")
    names = _names(syn.graph.ranks[-1])
    for n in ("mtp.enorm", "mtp.hnorm", "mtp.concat", "mtp.eh_proj", "mtp.head.norm"):
        assert names[f"{n}.recompute"] == 2, n
    for n in ("mtp.embed.lookup", "mtp.head.lm_head", "mtp.head.cross_entropy"):
        assert names[f"{n}.recompute"] == 0, n


def test_memory_of_the_last_stage(tmp_path: Path) -> None:
    """The MTP parameters (and the embedding copy) on the last stage only; bf16 weights and gradients, 12 bytes of
    optimizer state over the DP group (ZeRO-1)."""
    card = MoEModelConfig(**TINY)
    from cosim.workload.synth.layout import ParallelLayout

    rm = ParallelLayout(pp=2, ep=4).resolve(card, 8)
    with_, without = (memory_per_stage(c, rm, 1, T, 2, "bf16") for c in (card, card.model_copy(update={"mtp_layers": 0})))
    assert with_[0].total == without[0].total
    d, e = mtp_params(card, True)
    n = d + e / 4
    assert with_[1].weights - without[1].weights == pytest.approx(2 * n)
    assert with_[1].gradients - without[1].gradients == pytest.approx(2 * n)
    assert with_[1].activations > without[1].activations


def test_deepseek_v3_flops_per_token_match_megatron_bridge() -> None:
    """Megatron-Core's num_floating_point_operations (training.py, core_v0.16.0) counts the MTP depth as one more
    layer of the last layer's kind, its norms and eh_proj and one more logit GEMM; Megatron-Bridge's DeepSeek-V3
    rows give 260 GFLOP/token (TFLOP/s over tokens/s, validation/e2e/RESULTS.md). cosim: forward + backward."""
    card = load_model_config("deepseek-v3")
    with_ = 3 * _model_flops_per_token(card, 4096) / 1e9
    without = 3 * _model_flops_per_token(card.model_copy(update={"mtp_layers": 0}), 4096) / 1e9
    assert with_ == pytest.approx(260, rel=0.02)
    h, V = card.hidden_size, card.vocab_size
    from cosim.workload.synth.costs import layer_forward_flops

    extra = 3 * (layer_forward_flops(card, 60, 4096, 4096) / 4096 + 2 * 2 * h * h + 2 * V * h) / 1e9
    assert with_ - without == pytest.approx(extra)


def test_e2e_split_rule_counts_mtp_as_a_last_chunk_layer() -> None:
    """validation/e2e/run.py's uneven-split rule with one MTP depth gives Megatron-Bridge's DeepSeek-V3 layout for
    pp 8 x vpp 4, ``Et|(tt|)*30mL`` (the H100 row's pp_layout); without MTP the old split."""
    from validation.e2e.run import load_cases, pipeline_layers

    assert pipeline_layers(61, 32, 1) == [1] + [2] * 30 + [0]
    assert pipeline_layers(61, 32, 0) == [1] + [2] * 29 + [1, 1]
    assert pipeline_layers(61, 16, 1) == [3] + [4] * 14 + [2]
    rows = {c.id: c for c in load_cases()[1]}
    from cosim.workload.synth.layout import parse_pipeline_layout

    layout = rows["dsv3-h100-1024-fp8"].pipeline_model_parallel_layout  # the row gives the run's string
    assert layout is not None and parse_pipeline_layout(layout, 32, 61, 1) == (pipeline_layers(61, 32, 1), 31)
    assert {i: rows[i].mtp_layers for i in rows if "dsv3" in i} == {
        "dsv3-h100-1024-fp8": 1, "dsv3-b200-256-mxfp8": 1, "dsv3-gb200-256-mxfp8": 1,
        "dsv3-h800-2048-fp8-run-average": 1, "mlm-dsv3-gb200-256-mxfp8": 0, "automodel-dsv3-h100-256-bf16": 0,
        "automodel-dsv3-h100-1024-bf16": 0, "mb2511-dsv3-gb200-256-bf16": 0, "mb2511-dsv3-gb200-256-mxfp8": 0,
        "mb2511-dsv3-b200-256-mxfp8": 1, "mb2511-dsv3-gb300-256-bf16": 0, "mb2511-dsv3-gb300-256-mxfp8": 0,
        "mb2602-dsv3-gb300-256-mxfp8": 1, "mb2604-dsv3-gb300-256-mxfp8": 1, "mb2602-dsv3-b300-256-mxfp8": 1,
        "mb2604-dsv3-b300-256-mxfp8": 1, "mb260401-dsv3-b300-256-mxfp8": 1}


def test_mtp_pairs_as_a_layer_under_the_a2a_overlap(tmp_path: Path, dgx: object) -> None:
    """Megatron-Core's combined 1F1B schedules an MTP layer as a layer (model_chunk_schedule_plan.py): its forward
    and backward run once per micro-batch, and its all-to-alls are issued between other layers' compute."""
    f = tmp_path / "tiny2.yaml"
    f.write_text(yaml.safe_dump(TINY))
    spec = SyntheticSpec.model_validate(dict(model=str(f), precision="bf16", fold=True,
                                             layout={"pp": 2, "vpp": 2, "ep": 4, "a2a_overlap": True,
                                                     "pipeline_layers": [1, 0, 0, 1]},
                                             batch={"global": 32, "micro": 1, "seq": T}))
    syn = synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer)
    names = _names(syn.graph.ranks[-1])
    m = syn.built.microbatches
    assert names["mtp.eh_proj"] == names["mtp.eh_proj.dgrad"] == names["mtp.head.lm_head"] == m
    assert names["moe.experts_fc1"] == 2 * m  # the stage's layer and the MTP layer
