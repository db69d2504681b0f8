"""Round 10 (issue 15 point 7): two settings of the Megatron-Bridge Qwen3 recipes that synthesis now models, checked
by hand: Qwen3's per-head QK RMSNorm (``qk_layernorm``) and Megatron-Core's gradient accumulation fusion (each wgrad GEMM
reads and writes its weight's ``main_grad``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosim.capture.config import MoEModelConfig, load_model_config
from cosim.capture.hf import card_from_hf_config
from cosim.workload.synth.costs import PRECISIONS, Shard, backward_ops, layer_ops
from tests._cards import TINY


def _names(ops: list) -> list[str]:
    return [o.name for o in ops]


def test_qk_norm_ops_by_hand() -> None:
    card = MoEModelConfig(**{**TINY, "qk_layernorm": True})
    T, d = 64.0, card.attn_head_dim
    heads, kvh = card.num_heads / 2, max(card.num_kv_heads / 2, 1.0)  # TP2: the rank's heads
    ops = layer_ops(card, 1, T, T, Shard(tp=2))
    names = _names(ops)
    # after the QKV projection, before RoPE (Megatron-Core get_query_key_value_tensors, then forward's RoPE)
    assert names.index("attn.qkv") < names.index("attn.q_layernorm") < names.index("attn.k_layernorm") \
        < names.index("attn.rope")
    q = ops[names.index("attn.q_layernorm")]
    k = ops[names.index("attn.k_layernorm")]
    assert (q.cls, k.cls) == ("norm", "norm")
    assert q.bytes == 2 * T * heads * d * 2.0  # read and write the bf16 query heads
    assert k.bytes == 2 * T * kvh * d * 2.0
    assert q.saved == T * heads * d * 2.0 and k.saved == T * kvh * d * 2.0
    bwd = _names(backward_ops(ops))
    assert "attn.q_layernorm.bwd" in bwd and "attn.k_layernorm.bwd" in bwd
    assert not any("layernorm" in n for n in _names(layer_ops(MoEModelConfig(**TINY), 1, T, T, Shard(tp=2))))


def test_qwen3_cards_and_hf_reader_carry_qk_norm(tmp_path: Path) -> None:
    assert load_model_config("qwen3-30b-a3b").qk_layernorm and load_model_config("qwen3-235b-a22b").qk_layernorm
    assert not load_model_config("llama-3-70b").qk_layernorm and not load_model_config("mixtral-8x7b").qk_layernorm
    base = {"hidden_size": 2048, "num_hidden_layers": 2, "num_attention_heads": 32, "num_key_value_heads": 4,
            "head_dim": 128, "vocab_size": 1000, "num_experts": 16, "num_experts_per_tok": 2,
            "moe_intermediate_size": 64, "intermediate_size": 256}
    for mt, want in (("qwen3_moe", True), ("qwen2_moe", False), ("qwen3", True), ("llama", False)):
        path = tmp_path / mt / "config.json"
        path.parent.mkdir()
        path.write_text(json.dumps({**base, "model_type": mt}))
        assert card_from_hf_config(path).get("qk_layernorm", False) is want, mt


@pytest.mark.parametrize(("precision", "grad_bytes"), [("bf16", 2.0), ("bf16", 4.0), ("fp8-cs", 2.0)])
def test_wgrad_main_grad_bytes_by_hand(precision: str, grad_bytes: float) -> None:
    card = MoEModelConfig(**TINY)
    p = PRECISIONS[precision]
    T = 256.0
    ops = layer_ops(card, 1, T, T, Shard(tp=1, ep=1), p)
    fused = {o.name: o for o in backward_ops(ops, grad_bytes)}
    plain = {o.name: o for o in backward_ops(ops)}
    inb = p.gemm_in_bytes
    h = card.hidden_size
    # the output projection [T, heads x d] x [heads x d, h]: X and dY in the GEMM's input bytes, main_grad read
    # and written (Megatron-Core's gradient accumulation fusion)
    hd = card.num_heads * card.attn_head_dim
    assert fused["attn.o_proj.wgrad"].bytes == (T * hd + T * h) * inb + 2 * grad_bytes * hd * h
    # the routed experts' fc1: one main_grad per local expert (TINY's experts, all local at EP1)
    e, f = card.num_experts, card.expert_ffn_size or 0
    rows = T * card.top_k / e
    assert fused["moe.experts_fc1.wgrad"].bytes == pytest.approx(
        (rows * h + rows * 2 * f) * e * inb + 2 * grad_bytes * h * 2 * f * e)
    # off: the forward's bytes; FLOPs and shapes unchanged either way
    fwd = {o.name: o for o in ops}
    assert plain["attn.o_proj.wgrad"].bytes == fwd["attn.o_proj"].bytes
    assert fused["attn.o_proj.wgrad"].flops == plain["attn.o_proj.wgrad"].flops
    assert [o.name for o in fused.values()] == [o.name for o in plain.values()]


def test_spec_grad_accumulation_fusion_reaches_every_wgrad(tmp_path: Path, dgx: object) -> None:
    """The spec's ``grad_accumulation_fusion`` (default on) and ``grad_reduce_in_fp32`` reach the synthesized graph's
    weight-gradient GEMMs. TINY's output projection, [64 tokens, 64] x [64, 64] in bf16 on every rank: fused, X and
    dY (2 x 4096 x 2 B) plus main_grad read and written (2 x 4096 x 2 B; fp32: x 4 B) = 32768 B (fp32: 49152 B);
    off, the forward's X, W and Y (3 x 4096 x 2 B) = 24576 B."""
    from tests._cards import synth_tiny

    for spec, want in (({}, 32768.0), ({"grad_reduce_in_fp32": True}, 49152.0),
                       ({"grad_accumulation_fusion": False}, 24576.0)):
        for rg in synth_tiny(tmp_path, dgx, **spec).graph.ranks:
            G = rg.gpu_ops
            got = [float(G.bytes[i]) for i in range(len(G)) if rg.strings[int(G.name[i])] == "attn.o_proj.wgrad"]
            assert got and set(got) == {want}, (spec, rg.rank, got)
