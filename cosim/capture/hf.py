"""Read a Hugging Face ``config.json`` into a model card (:class:`MoEModelConfig`).

Supported ``model_type`` values and the fields read (names as in the
transformers configuration classes):

* ``deepseek_v3`` / ``deepseek_v2``: ``n_routed_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``n_shared_experts``, ``first_k_dense_replace``,
  ``intermediate_size`` (dense layers), ``scoring_func``, ``norm_topk_prob`` and the
  MLA fields ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``,
  ``qk_rope_head_dim``, ``v_head_dim``;
* ``qwen3_moe`` / ``qwen2_moe``: ``num_experts``, ``num_experts_per_tok``,
  ``moe_intermediate_size``, ``head_dim``, ``norm_topk_prob`` (``decoder_sparse_step``
  must be 1 and ``mlp_only_layers`` empty); ``qwen3_moe`` (and dense ``qwen3``) sets the card's
  ``qk_layernorm`` (their attention has ``q_norm`` / ``k_norm``);
* ``mixtral`` and ``gpt_oss``: ``num_local_experts``, ``num_experts_per_tok`` (gpt-oss:
  ``experts_per_token``), ``intermediate_size`` (the expert width); gpt-oss also ``sliding_window`` with
  ``layer_types``, ``attention_bias``, ``swiglu_limit`` and a YaRN ``rope_scaling``;
* ``llama`` / ``mistral`` / ``qwen2`` / ``qwen3``: dense, ``intermediate_size``.

Every model needs ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads`` and
``vocab_size``; ``num_key_value_heads`` defaults to the head count. A missing field or
an unknown ``model_type`` is a one-line :class:`CosimInputError` naming the file and
the field. Fields that do not change shapes or FLOPs (rope scaling, dtypes, ...) are
ignored.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError
from cosim.yamlio import whole_number

__all__ = ["SUPPORTED_MODEL_TYPES", "card_from_hf_config"]

_MOE_DEEPSEEK = ("deepseek_v3", "deepseek_v2")
_MOE_QWEN = ("qwen3_moe", "qwen2_moe")
_MOE_MIXTRAL = ("mixtral", "gpt_oss")
_DENSE = ("llama", "mistral", "qwen2", "qwen3")
SUPPORTED_MODEL_TYPES = _MOE_DEEPSEEK + _MOE_QWEN + _MOE_MIXTRAL + _DENSE
"""``model_type`` values :func:`card_from_hf_config` understands."""


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise CosimInputError(f"{path}: cannot read ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CosimInputError(f"{path}: not a JSON config.json ({e})") from None
    if not isinstance(data, dict):
        raise CosimInputError(f"{path}: expected a JSON object (a Hugging Face config.json)")
    return data


def _gpt_oss_fields(cfg: dict[str, Any], path: Path, layers: int) -> dict[str, Any]:
    """gpt-oss's timing fields: ``sliding_window`` with its ``layer_types`` pattern (one full layer every ``p``,
    the others sliding), ``attention_bias`` (biased linears), ``swiglu_limit`` (the clamped activation) and a
    YaRN ``rope_scaling`` without an ``mscale`` pair (attention factor ``0.1 ln(factor) + 1``)."""
    import math

    out: dict[str, Any] = {"linear_bias": bool(cfg.get("attention_bias", False))}
    if isinstance(cfg.get("swiglu_limit"), (int, float)) and cfg["swiglu_limit"] > 0:
        out["activation_clamp"] = float(cfg["swiglu_limit"])
    rs = cfg.get("rope_scaling") or {}
    if isinstance(rs, dict) and rs.get("rope_type") == "yarn" and rs.get("mscale") is None:
        factor = rs.get("factor") or 1
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not math.isfinite(factor) or factor <= 0:
            raise CosimInputError(f"{path}: rope_scaling.factor: expected a positive number, got {factor!r}")
        if factor > 1:
            out["rope_mscale"] = round(0.1 * math.log(float(factor)) + 1.0, 4)
    window, lt = cfg.get("sliding_window"), cfg.get("layer_types")
    if isinstance(window, int) and window > 0 and isinstance(lt, list) and "sliding_attention" in lt:
        if len(lt) != layers:
            raise CosimInputError(f"{path}: layer_types: {len(lt)} entries for num_hidden_layers {layers}")
        full = [i for i, t in enumerate(lt) if t == "full_attention"]
        p = full[0] + 1 if full else None
        want = ["full_attention" if p is not None and (i + 1) % p == 0 else "sliding_attention" for i in range(layers)]
        if lt != want:
            raise CosimInputError(f"{path}: layer_types: only a full-attention layer every p layers (the others "
                                  "sliding) is supported")
        out["sliding_window"] = window
        if p is not None:
            out["sliding_window_pattern"] = p
    return out


def card_from_hf_config(path: str | Path, name: str | None = None) -> dict[str, Any]:
    """The model-card fields (a dict for :class:`MoEModelConfig`) of a Hugging Face ``config.json``."""
    path = Path(path)
    cfg = _read(path)

    def whole(k: str, v: Any) -> int:
        n = whole_number(v)
        if n is None:
            raise CosimInputError(f"{path}: {k}: expected a whole number, got {v!r}")
        return n

    def need(key: str, *alts: str) -> Any:
        for k in (key, *alts):
            if cfg.get(k) is not None:
                return whole(k, cfg[k])
        raise CosimInputError(f"{path}: missing field {key!r} (needed for model_type {cfg.get('model_type')!r})")

    def opt(key: str) -> Any:
        v = cfg.get(key)
        return whole(key, v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    mt = cfg.get("model_type")
    if mt not in SUPPORTED_MODEL_TYPES:
        raise CosimInputError(f"{path}: model_type: unknown {mt!r} (supported: {', '.join(SUPPORTED_MODEL_TYPES)})")
    heads = need("num_attention_heads")
    layers = need("num_hidden_layers")
    card: dict[str, Any] = {
        "name": name or path.parent.name or path.stem,
        "description": f"read from {path.name} (model_type {mt})",
        "sources": [str(path)],
        "hidden_size": need("hidden_size"),
        "num_layers": layers,
        "num_heads": heads,
        "num_kv_heads": opt("num_key_value_heads") or heads,
        "vocab_size": need("vocab_size"),
        "rms_norm_eps": float(cfg.get("rms_norm_eps") or 1e-6),
    }
    if opt("head_dim"):
        card["head_dim"] = opt("head_dim")
    if mt in _MOE_DEEPSEEK:
        card.update(
            num_experts=need("n_routed_experts"), top_k=need("num_experts_per_tok"),
            expert_ffn_size=need("moe_intermediate_size"), num_shared_experts=opt("n_shared_experts") or 0,
            dense_layers=opt("first_k_dense_replace") or 0,
            router="sigmoid" if cfg.get("scoring_func") == "sigmoid" else "softmax",
            normalize_top_k=bool(cfg.get("norm_topk_prob", False)),
            kv_lora_rank=need("kv_lora_rank"), qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=need("qk_rope_head_dim"), v_head_dim=need("v_head_dim"),
            q_lora_rank=opt("q_lora_rank"), attention="mla",
        )
        card.setdefault("head_dim", card["v_head_dim"])
        if card["dense_layers"]:
            card["dense_ffn_size"] = need("intermediate_size")
    elif mt in _MOE_QWEN:
        if (opt("decoder_sparse_step") or 1) != 1 or cfg.get("mlp_only_layers"):
            raise CosimInputError(f"{path}: decoder_sparse_step/mlp_only_layers: interleaved dense layers "
                                  "are not supported (only leading dense layers)")
        card.update(num_experts=need("num_experts"), top_k=need("num_experts_per_tok"),
                    expert_ffn_size=need("moe_intermediate_size"), router="softmax",
                    normalize_top_k=bool(cfg.get("norm_topk_prob", False)))
        if mt == "qwen2_moe" and opt("shared_expert_intermediate_size"):
            card.update(num_shared_experts=1, shared_expert_ffn_size=opt("shared_expert_intermediate_size"))
    elif mt in _MOE_MIXTRAL:
        card.update(num_experts=need("num_local_experts"), top_k=need("num_experts_per_tok", "experts_per_token"),
                    expert_ffn_size=need("intermediate_size"), router="softmax", normalize_top_k=True)
        if mt == "gpt_oss":
            card.update(_gpt_oss_fields(cfg, path, layers))
    else:
        card.update(num_experts=0, top_k=0, dense_layers=layers, dense_ffn_size=need("intermediate_size"))
    if mt in ("qwen3", "qwen3_moe"):  # Qwen3(Moe)Attention: q_norm, k_norm (RMSNorm over head_dim) in every layer
        card["qk_layernorm"] = True
    if cfg.get("router_aux_loss_coef") is not None:
        card["aux_loss_coef"] = float(cfg["router_aux_loss_coef"])
    if opt("num_nextn_predict_layers"):  # DeepSeek-V3's multi-token-prediction depths
        card["mtp_layers"] = opt("num_nextn_predict_layers")
    return card
