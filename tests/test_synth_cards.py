"""Model cards: published parameter totals, MLA fields, dense cards, and the
Hugging Face config.json reader (configs written here from the public files)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosim.capture.config import MoEModelConfig, load_model_config
from cosim.errors import CosimInputError

# Published totals, billions: DeepSeek-V3 report (671B without the MTP module), Qwen3 report Table 2,
# gpt-oss model card (116.83B, 20.91B), Llama 3 paper (70.6B, 8.03B).
PUBLISHED = {"deepseek-v3": 671.0, "qwen3-235b-a22b": 235.0, "gpt-oss-120b": 116.8, "gpt-oss-20b": 20.91, "llama-3-70b": 70.6,
             "llama-3-8b": 8.03,
             "deepseek-v2-lite": 15.7, "qwen3-30b-a3b": 30.5, "mixtral-8x7b": 46.7}

DSV3_HF = {"model_type": "deepseek_v3", "hidden_size": 7168, "intermediate_size": 18432,
           "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
           "num_experts_per_tok": 8, "first_k_dense_replace": 3, "num_hidden_layers": 61,
           "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
           "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "vocab_size": 129280,
           "scoring_func": "sigmoid", "norm_topk_prob": True, "rms_norm_eps": 1e-6, "rope_scaling": {"factor": 40}}
QWEN3_235B_HF = {"model_type": "qwen3_moe", "hidden_size": 4096, "num_hidden_layers": 94, "num_attention_heads": 64,
                 "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936, "num_experts": 128,
                 "num_experts_per_tok": 8, "moe_intermediate_size": 1536, "decoder_sparse_step": 1,
                 "mlp_only_layers": [], "norm_topk_prob": True, "router_aux_loss_coef": 0.001}
GPT_OSS_HF = {"model_type": "gpt_oss", "hidden_size": 2880, "num_hidden_layers": 36, "num_attention_heads": 64,
              "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 201088, "num_local_experts": 128,
              "experts_per_token": 4, "intermediate_size": 2880, "sliding_window": 128,
              "layer_types": ["sliding_attention", "full_attention"] * 18, "attention_bias": True,
              "swiglu_limit": 7.0, "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                     "beta_slow": 1.0, "original_max_position_embeddings": 4096}}
LLAMA_HF = {"model_type": "llama", "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 28672, "rms_norm_eps": 1e-5}
GPT_OSS_20B_HF = {**GPT_OSS_HF, "num_hidden_layers": 24, "num_local_experts": 32,
                  "layer_types": ["sliding_attention", "full_attention"] * 12}
LLAMA8_HF = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
             "num_key_value_heads": 8, "vocab_size": 128256, "intermediate_size": 14336, "rms_norm_eps": 1e-5}
MIXTRAL_HF = {"model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
              "num_key_value_heads": 8, "vocab_size": 32000, "num_local_experts": 8, "num_experts_per_tok": 2,
              "intermediate_size": 14336}


def test_cards_match_published_totals_and_cite_sources() -> None:
    for name, billions in PUBLISHED.items():
        card = load_model_config(name)
        total = sum(card.param_counts().values()) / 1e9
        assert abs(total - billions) / billions < 0.01, (name, total)
        assert len(card.sources) >= 2 and any("huggingface.co" in s for s in card.sources), name
    v3 = load_model_config("deepseek-v3")
    assert v3.attention_kind == "mla" and (v3.q_lora_rank, v3.kv_lora_rank) == (1536, 512)
    assert not any("MLA" in a or "latent" in a for a in v3.approximations)
    # MLA attention params of one layer, by hand: q_a + q_a_norm + q_b + kv_a + kv_a_norm + kv_b + o
    by_hand = (7168 * 1536 + 1536 + 1536 * 128 * 192 + 7168 * 576 + 512 + 512 * 128 * 256 + 128 * 128 * 7168)
    assert v3.attention_params() == by_hand
    llama = load_model_config("llama-3-70b")
    assert llama.is_dense and llama.moe_layers == [] and llama.param_counts()["expert"] == 0


def test_attention_kind_derived_and_checked() -> None:
    base = load_model_config("mixtral-8x7b").model_dump()
    assert MoEModelConfig(**{**base, "attention": None}).attention_kind == "gqa"
    assert MoEModelConfig(**{**base, "attention": None, "num_kv_heads": 32}).attention_kind == "mha"
    with pytest.raises(ValueError, match="MLA needs"):
        MoEModelConfig(**{**base, "kv_lora_rank": 512})
    with pytest.raises(ValueError, match="dense model"):
        MoEModelConfig(**{**base, "num_experts": 0})
    with pytest.raises(ValueError, match="expert_ffn_size"):
        MoEModelConfig(**{**base, "expert_ffn_size": None})


@pytest.mark.parametrize("cfg,card", [(DSV3_HF, "deepseek-v3"), (QWEN3_235B_HF, "qwen3-235b-a22b"),
                                      (GPT_OSS_HF, "gpt-oss-120b"), (LLAMA_HF, "llama-3-70b"),
                                      (LLAMA8_HF, "llama-3-8b"), (GPT_OSS_20B_HF, "gpt-oss-20b"),
                                      (MIXTRAL_HF, "mixtral-8x7b")])
def test_hf_config_reads_same_shapes_as_card(tmp_path: Path, cfg: dict, card: str) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps(cfg))
    got, want = load_model_config(f), load_model_config(card)
    assert got.param_counts() == want.param_counts()
    assert got.attention_kind == want.attention_kind
    assert (got.num_experts, got.top_k, got.dense_layers) == (want.num_experts, want.top_k, want.dense_layers)


def test_hf_config_errors_are_one_line(tmp_path: Path) -> None:
    f = tmp_path / "config.json"
    f.write_text(json.dumps({**LLAMA_HF, "model_type": "bert"}))
    with pytest.raises(CosimInputError, match=r"config\.json: model_type: unknown 'bert'"):
        load_model_config(f)
    f.write_text(json.dumps({k: v for k, v in DSV3_HF.items() if k != "kv_lora_rank"}))
    with pytest.raises(CosimInputError, match="missing field 'kv_lora_rank'"):
        load_model_config(f)
    f.write_text(json.dumps({**QWEN3_235B_HF, "decoder_sparse_step": 2}))
    with pytest.raises(CosimInputError, match="decoder_sparse_step"):
        load_model_config(f)
    f.write_text(json.dumps({**LLAMA_HF, "hidden_size": "big"}))
    with pytest.raises(CosimInputError, match="hidden_size: expected a whole number"):
        load_model_config(f)
    f.write_text("{not json")
    with pytest.raises(CosimInputError, match="not a JSON"):
        load_model_config(f)
    for e in (CosimInputError,):
        with pytest.raises(e):
            load_model_config(tmp_path / "absent.json")


def test_gpt_oss_config_json_gives_the_cards_timing_fields(tmp_path: Path) -> None:
    """gpt-oss's config.json gives the card's sliding-window pattern, biases, activation clamp and YaRN factor;
    a layer_types list that is not one full layer every p layers is a one-line error."""
    f = tmp_path / "config.json"
    f.write_text(json.dumps(GPT_OSS_HF))
    got, want = load_model_config(f), load_model_config("gpt-oss-120b")
    fields = ("sliding_window", "sliding_window_pattern", "linear_bias", "activation_clamp", "rope_mscale")
    assert [getattr(got, k) for k in fields] == [getattr(want, k) for k in fields]
    assert [got.window(ly) for ly in range(4)] == [128, None, 128, None]
    f.write_text(json.dumps({**GPT_OSS_HF, "layer_types": ["full_attention", "sliding_attention"] * 18}))
    with pytest.raises(CosimInputError, match="layer_types"):
        load_model_config(f)
    bad = {**GPT_OSS_HF, "rope_scaling": {**GPT_OSS_HF["rope_scaling"], "factor": "x32"}}
    f.write_text(json.dumps(bad))
    with pytest.raises(CosimInputError, match=r"rope_scaling\.factor"):
        load_model_config(f)
