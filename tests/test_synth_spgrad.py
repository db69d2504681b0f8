"""TP all-reduce of the sequence-parallel parameters' gradients (Megatron-Core finalize_model_grads), by hand."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cosim.capture.config import MoEModelConfig
from cosim.workload.graph import CollType
from cosim.workload.synth.build import sp_layer_params
from tests._cards import synth_tiny


def _coll(rg: object) -> Counter:
    C = rg.collectives  # type: ignore[attr-defined]
    return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c])) for c in range(len(C)))


def test_sp_grads_all_reduced_over_tp_once_per_step(tmp_path: Path, dgx: object) -> None:
    def synth(**lay: object) -> object:
        return synth_tiny(tmp_path, dgx, layout=dict(pp=2, ep=4, **lay))

    # 8 GPUs: tp 2 x pp 2 x dp 2, sequence parallel (default with tp > 1); per layer the tagged parameters are the
    # two norms (2 x 64) and the router (8 experts x 64): 640; stage 1 also the final norm (64). bf16 gradients.
    syn = synth(tp=2)
    for rg in syn.graph.ranks:
        stage = rg.rank // 4
        want = 2 * (640 + (64 if stage == 1 else 0))
        assert _coll(rg)[("ALL_REDUCE", 2, float(want))] == 1
        names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        assert names.count("grad.tp_sp_all_reduce") == 1
        i = names.index("grad.tp_sp_all_reduce")
        # after the step's DP reduction, before the optimizer
        assert max(j for j, n in enumerate(names) if n.startswith("grad.dp_")) < i
        assert i < names.index("optim.grad_norm_all_reduce") < names.index("optim.adam")
    # fp32 gradient reduction doubles it; no sequence parallelism (or tp 1): none
    rg0 = synth_tiny(tmp_path, dgx, layout=dict(pp=2, ep=4, tp=2), grad_reduce_in_fp32=True).graph.ranks[0]
    assert _coll(rg0)[("ALL_REDUCE", 2, 4.0 * 640)] == 1
    for rg in synth(tp=2, sequence_parallel=False).graph.ranks:
        assert "grad.tp_sp_all_reduce" not in [rg.strings[int(x)] for x in rg.gpu_ops.name]


def test_sp_layer_params_of_mla_by_hand() -> None:
    mla = MoEModelConfig(name="mla", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=256,
                         num_experts=8, top_k=2, expert_ffn_size=32, dense_layers=1, dense_ffn_size=128, attention="mla",
                         q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    # norms 2 x 64; kv down 64 x (16 + 8) and its norm 16; q down 64 x 32 and its norm 32
    dense = 128 + 64 * 24 + 16 + 64 * 32 + 32
    assert sp_layer_params(mla, 0) == dense
    assert sp_layer_params(mla, 1) == dense + 8 * 64  # + the router of the MoE layer


def test_qk_norm_grads_all_reduced_over_tp_with_and_without_sp(tmp_path: Path, dgx: object) -> None:
    """Megatron-Core's clause ``config.qk_layernorm and ("q_layernorm" in name or "k_layernorm" in name)`` sums
    Qwen3's q/k norm weight gradients over TP whether or not sequence parallelism is on. TINY with q/k norms:
    2 x head_dim 16 = 32 more parameters per layer, one layer per stage (tp 2, pp 2, bf16)."""
    from tests._cards import TINY

    card = {**TINY, "name": "tiny2qk", "qk_layernorm": True}
    sp = synth_tiny(tmp_path, dgx, card, layout=dict(pp=2, ep=4, tp=2))
    for rg in sp.graph.ranks:  # with SP: the tagged 640 (+ the final norm's 64 on stage 1) and the q/k norms' 32
        want = 2 * (640 + 32 + (64 if rg.rank // 4 == 1 else 0))
        assert _coll(rg)[("ALL_REDUCE", 2, float(want))] == 1
    nosp = synth_tiny(tmp_path, dgx, card, layout=dict(pp=2, ep=4, tp=2, sequence_parallel=False))
    plain = synth_tiny(tmp_path, dgx, layout=dict(pp=2, ep=4, tp=2, sequence_parallel=False))
    for rg, rp in zip(nosp.graph.ranks, plain.graph.ranks):  # without: one more, the q/k norms' 32 alone
        assert _coll(rg) - _coll(rp) == Counter({("ALL_REDUCE", 2, 2.0 * 32): 1}) and not _coll(rp) - _coll(rg)
        names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        i = names.index("grad.tp_qk_norm_all_reduce")
        assert "grad.tp_sp_all_reduce" not in names
        assert max(j for j, n in enumerate(names) if n.startswith("grad.dp_")) < i < names.index("optim.adam")
    for rg in synth_tiny(tmp_path, dgx, card, layout=dict(pp=2, ep=4, tp=1)).graph.ranks:  # tp 1: none
        assert not any(rg.strings[int(x)].startswith("grad.tp_") for x in rg.gpu_ops.name)
    # MLA's TE spec fuses its q/kv norms into the up projections (names without q_layernorm / k_layernorm)
    mla = MoEModelConfig(name="mla", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=256,
                         num_experts=8, top_k=2, expert_ffn_size=32, attention="mla", q_lora_rank=32,
                         kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, qk_layernorm=True)
    assert sp_layer_params(mla, 0, sequence_parallel=False) == 0
    assert sp_layer_params(mla, 0) == sp_layer_params(mla.model_copy(update={"qk_layernorm": False}), 0)


def test_qwen3_cards_carry_their_qk_norms(tmp_path: Path) -> None:
    import json

    from cosim.capture.config import load_model_config
    from cosim.capture.hf import card_from_hf_config

    assert load_model_config("qwen3-30b-a3b").qk_layernorm and load_model_config("qwen3-235b-a22b").qk_layernorm
    assert not load_model_config("deepseek-v3").qk_layernorm and not load_model_config("gpt-oss-120b").qk_layernorm
    cfg = {"model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 32}
    for mt, qk in (("qwen3_moe", True), ("qwen2_moe", False)):
        f = tmp_path / f"{mt}.json"
        f.write_text(json.dumps({**cfg, "model_type": mt}))
        assert card_from_hf_config(f).get("qk_layernorm", False) is qk
