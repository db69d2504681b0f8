"""Configuration of the reference MoE model and of one capture run.

Nothing here imports torch: the CLI validates a capture (preset, parallelism,
skew, device) and fails with one line before any process is started.

Units: sizes are element counts (hidden size, FFN size) or token counts
(batch, sequence length); memory estimates are bytes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, model_validator

from cosim.catalog.models import Strict
from cosim.errors import CosimInputError
from cosim.yamlio import describe_validation_error, load_yaml, validate

__all__ = [
    "PRESET_DIR",
    "CaptureOptions",
    "MoEModelConfig",
    "Skew",
    "list_presets",
    "load_model_config",
    "parse_skew",
]

PRESET_DIR = Path(__file__).resolve().parent / "presets"
"""Folder of the bundled model presets (``<name>.yaml``)."""

MAX_WIDTH = 2**20
"""Largest width a card may give (hidden size, heads, head dims, vocabulary, FFN and latent sizes, window): the
widest published one, Gemma 3's vocabulary of 262,144, is a quarter of it; wider ones overflow the synthesizer's
64-bit FLOP and byte counts (hidden x FFN x tokens)."""
MAX_LAYERS = 2**12
"""Most layers (and dense or MTP layers) a card may give: published models have at most ~128 (Llama 3.1 405B: 126)."""
MAX_EXPERTS = 2**16
"""Most routed experts (and top-k, shared experts) a card may give: published MoE models have at most 384 (Kimi K2);
the synthesizer keeps a row count per expert and layer."""


class MoEModelConfig(Strict):
    """A decoder-only transformer whose FFNs are mixture-of-experts layers: the
    model card shared by capture and synthesis (``cosim.workload.synth``).

    Each layer is: RMSNorm -> self-attention -> residual -> RMSNorm -> MoE FFN
    (router, top-k routed SwiGLU experts, optional always-on shared experts) ->
    residual. The first ``dense_layers`` layers use a dense SwiGLU FFN instead
    (DeepSeek's ``first_k_dense_replace``). Attention is multi-head (``mha``),
    grouped-query (``gqa``, ``num_kv_heads < num_heads``) or DeepSeek's
    multi-head latent attention (``mla``: low-rank query and key/value
    projections, ``q_lora_rank`` / ``kv_lora_rank``, decoupled RoPE dims).
    A dense model (Llama) has ``num_experts: 0``, ``top_k: 0`` and
    ``dense_layers == num_layers``.
    """

    name: str
    """Preset name, e.g. ``tiny-moe``."""
    description: str = ""
    """What the model is and what it approximates."""
    sources: list[str] = Field(default_factory=list)
    """Where the published hyperparameters come from (paper, config.json URL)."""
    approximations: list[str] = Field(default_factory=list)
    """Features of the published model that this reference model does not have."""

    hidden_size: int = Field(gt=0, le=MAX_WIDTH)
    """Model (residual stream) width, elements per token."""
    num_layers: int = Field(gt=0, le=MAX_LAYERS)
    """Number of transformer layers."""
    num_heads: int = Field(gt=0, le=MAX_WIDTH)
    """Attention query heads."""
    num_kv_heads: int = Field(gt=0, le=MAX_WIDTH)
    """Attention key/value heads (grouped-query attention when fewer than ``num_heads``)."""
    head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """Elements per attention head; default ``hidden_size // num_heads``."""
    vocab_size: int = Field(gt=0, le=MAX_WIDTH)
    """Vocabulary size (embedding rows and LM-head columns)."""

    attention: Literal["mha", "gqa", "mla"] | None = None
    """Attention kind; derived when absent: ``mla`` when ``kv_lora_rank`` is set, else
    ``gqa`` when ``num_kv_heads < num_heads``, else ``mha``."""
    q_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """MLA: rank of the low-rank query projection (``null``: full-rank query, as DeepSeek-V2-Lite)."""
    kv_lora_rank: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """MLA: rank of the compressed key/value latent (the cached vector per token)."""
    qk_nope_head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """MLA: per-head query/key dims without rotary embedding."""
    qk_rope_head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """MLA: per-head decoupled rotary query/key dims (the rotary key is shared by all heads)."""
    v_head_dim: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """MLA: per-head value dims (also the attention output dims per head)."""

    num_experts: int = Field(ge=0, le=MAX_EXPERTS)
    """Routed experts per MoE layer (0: a dense model)."""
    top_k: int = Field(ge=0, le=MAX_EXPERTS)
    """Routed experts chosen per token (0 for a dense model)."""
    expert_ffn_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """Intermediate width of one routed SwiGLU expert (``moe_intermediate_size``); required
    when ``num_experts > 0``."""
    num_shared_experts: int = Field(default=0, ge=0, le=MAX_EXPERTS)
    """Always-active shared experts per MoE layer (DeepSeek), run on every token."""
    shared_expert_ffn_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """Intermediate width of one shared expert; default ``expert_ffn_size``."""
    dense_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    """Leading layers with a dense SwiGLU FFN instead of an MoE layer."""
    dense_ffn_size: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """Intermediate width of the dense FFN of the leading dense layers."""
    mtp_layers: int = Field(default=0, ge=0, le=MAX_LAYERS)
    """Multi-token-prediction depths (DeepSeek-V3 section 2.2; Hugging Face ``num_nextn_predict_layers``): each
    predicts one more future token with the shared embedding and LM head, two RMSNorms, a 2h -> h projection and
    one transformer layer of the last layer's kind. Training only (synthesis: :func:`cosim.workload.synth.costs
    .mtp_ops`); not part of ``num_layers`` nor of :meth:`param_counts`."""

    sliding_window: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """Sliding-window attention: the keys a query of a sliding layer sees (itself and the ``sliding_window - 1``
    before it); ``null``: every layer attends to the whole causal prefix."""
    sliding_window_pattern: int | None = Field(default=None, gt=0, le=MAX_WIDTH)
    """With ``sliding_window``: every ``sliding_window_pattern``-th layer (layers ``p - 1``, ``2p - 1``, ...)
    attends fully, the others slide (Gemma's convention; gpt-oss: 2, alternating from a sliding layer 0);
    ``null``: every layer slides."""

    linear_bias: bool = False
    """Linear layers carry additive biases (gpt-oss: ``attention_bias`` and biased experts; Megatron-Core
    ``add_bias_linear``). Training timing: the attention output's and the routed experts' fc2 biases are added
    by eager kernels (:func:`cosim.workload.synth.costs.bias_ops`); the other biases ride in GEMM epilogues."""
    qk_layernorm: bool = False
    """Each attention head's queries and keys are RMS-normalized after the QKV projection, before RoPE (Qwen3:
    Hugging Face ``Qwen3MoeAttention`` ``q_norm`` / ``k_norm``, ``head_dim`` weights each; Megatron-Core
    ``qk_layernorm``, which Megatron-Bridge's Qwen3 bridges set). Training timing: two norm kernels on the rank's
    query and key heads (:func:`cosim.workload.synth.costs.qk_norm_ops`); their weight gradients join the TP
    all-reduce of the non-tensor-parallel gradients (:func:`cosim.workload.synth.build.sp_layer_params`); not
    applied to MLA (its latent norms are modelled)."""
    activation_clamp: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Clamped gated activation of the routed experts (gpt-oss ``swiglu_limit`` 7.0: gate clamped above, linear
    half to +-limit): two clamps and a concatenation before the fused activation
    (:func:`cosim.workload.synth.costs.expert_activation_ops`); ``null``: plain SwiGLU."""

    rope_mscale: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """YaRN's attention (concentration) factor on RoPE's cos/sin, ``0.1 ln(factor) + 1`` when the config gives no
    ``mscale`` pair (gpt-oss: factor 32 -> 1.3466; Megatron-Core ``_yarn_get_concentration_factor``). Not 1:
    Megatron-Core applies RoPE to q and k with its unfused element-wise chain (TE's fused RoPE has no mscale:
    :func:`cosim.workload.synth.costs.rope_ops`)."""

    router: Literal["softmax", "sigmoid"] = "softmax"
    """Router score function: softmax over experts (Mixtral, Qwen) or per-expert sigmoid (DeepSeek-V3)."""
    normalize_top_k: bool = True
    """Renormalize the chosen top-k gate weights to sum to 1."""
    capacity_factor: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """Expert capacity as a multiple of the even share ``tokens * top_k / num_experts`` on
    each rank; assignments past capacity are dropped. ``null``: dropless."""
    aux_loss_coef: float = Field(default=0.01, ge=0, allow_inf_nan=False)
    """Weight of the Switch-style load-balancing loss ``E * sum_e f_e * P_e`` in training."""
    rms_norm_eps: float = Field(default=1e-6, gt=0, allow_inf_nan=False)
    """RMSNorm epsilon."""

    @model_validator(mode="after")
    def _check(self) -> MoEModelConfig:
        if self.num_experts == 0:
            if self.top_k or self.dense_layers != self.num_layers:
                raise ValueError("a dense model (num_experts 0) needs top_k 0 and dense_layers == num_layers")
        elif self.top_k == 0:
            raise ValueError("top_k must be > 0 when num_experts > 0")
        elif self.expert_ffn_size is None:
            raise ValueError("num_experts > 0 needs expert_ffn_size")
        mla = (self.kv_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim)
        if self.attention == "mla" or any(v is not None for v in mla):
            if any(v is None for v in mla):
                raise ValueError("MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
            if self.attention not in (None, "mla"):
                raise ValueError(f"attention {self.attention!r} contradicts the MLA fields (kv_lora_rank ...)")
        elif self.attention == "mha" and self.num_kv_heads != self.num_heads:
            raise ValueError(f"attention mha needs num_kv_heads == num_heads ({self.num_heads})")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k ({self.top_k}) must be <= num_experts ({self.num_experts})")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size ({self.hidden_size}) must be a multiple of num_heads "
                             f"({self.num_heads}), or set head_dim")
        if self.dense_layers > self.num_layers:
            raise ValueError(f"dense_layers ({self.dense_layers}) must be <= num_layers ({self.num_layers})")
        if self.dense_layers and self.dense_ffn_size is None:
            raise ValueError("dense_layers > 0 needs dense_ffn_size")
        return self

    # Derived sizes -----------------------------------------------------------------
    @property
    def attn_head_dim(self) -> int:
        """Elements per attention head (MHA/GQA; for MLA the capture model's plain-attention head)."""
        return self.head_dim or self.hidden_size // self.num_heads

    @property
    def attention_kind(self) -> Literal["mha", "gqa", "mla"]:
        """``attention`` if given, else derived from the fields."""
        if self.attention:
            return self.attention
        if self.kv_lora_rank is not None:
            return "mla"
        return "gqa" if self.num_kv_heads < self.num_heads else "mha"

    def window(self, layer: int) -> int | None:
        """Keys a query of ``layer`` attends to at most (its sliding window), or None for full causal attention."""
        if self.sliding_window is None:
            return None
        p = self.sliding_window_pattern
        return None if p is not None and (layer + 1) % p == 0 else self.sliding_window

    @property
    def is_dense(self) -> bool:
        """True for a model without routed experts (every FFN dense)."""
        return self.num_experts == 0

    def attention_params(self) -> int:
        """Parameters of one attention block (projections and MLA's latent norms)."""
        h, nh = self.hidden_size, self.num_heads
        if self.attention_kind == "mla":
            qk = (self.qk_nope_head_dim or 0) + (self.qk_rope_head_dim or 0)
            kvr, rope, vd = self.kv_lora_rank or 0, self.qk_rope_head_dim or 0, self.v_head_dim or 0
            q = (h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * nh * qk if self.q_lora_rank
                 else h * nh * qk)
            kv = h * (kvr + rope) + kvr + kvr * nh * ((self.qk_nope_head_dim or 0) + vd)
            return q + kv + nh * vd * h
        d = self.attn_head_dim
        return h * d * (nh * 2 + self.num_kv_heads * 2)

    @property
    def moe_layers(self) -> list[int]:
        """Indices of the layers whose FFN is an MoE layer."""
        return list(range(self.dense_layers, self.num_layers))

    def param_counts(self) -> dict[str, int]:
        """Parameter counts: ``dense`` (replicated on every rank) and ``expert`` (all routed experts)."""
        h = self.hidden_size
        attn = self.attention_params()
        shared = 3 * h * (self.shared_expert_ffn_size or self.expert_ffn_size or 0) * self.num_shared_experts
        n_moe = len(self.moe_layers)
        dense = (2 * self.vocab_size * h + self.num_layers * (attn + 2 * h) + h
                 + self.dense_layers * 3 * h * (self.dense_ffn_size or 0)
                 + n_moe * (h * self.num_experts + shared))
        expert = n_moe * self.num_experts * 3 * h * (self.expert_ffn_size or 0)
        return {"dense": dense, "expert": expert}


SkewKind = Literal["balanced", "natural", "zipf"]


class Skew(Strict):
    """How tokens are assigned to experts.

    ``natural``: whatever the (random) router picks. ``balanced``: every
    expert gets the same number of assignments (token ``i``'s ``j``-th choice
    is expert ``(i*k + j) mod E``). ``zipf``: expert popularity follows a Zipf
    law with exponent ``s`` (the ``r``-th most popular expert is chosen with
    weight ``1/r**s``, in a per-layer random order), sampled without
    replacement per token. Gate weights are always the router's own scores at
    the chosen experts, so gradients and the auxiliary loss stay real.
    """

    kind: SkewKind = "natural"
    """balanced, natural or zipf."""
    s: float = 0.0
    """Zipf exponent (only for ``zipf``; > 0)."""

    def label(self) -> str:
        """The command-line spelling, e.g. ``zipf:1.2``."""
        return f"zipf:{self.s:g}" if self.kind == "zipf" else self.kind


def parse_skew(text: str) -> Skew:
    """Parse ``balanced``, ``natural``, ``zipf`` (s=1) or ``zipf:S``."""
    m = re.fullmatch(r"\s*(balanced|natural|zipf)(?::([0-9.eE+-]+))?\s*", text)
    if not m or (m.group(2) and m.group(1) != "zipf"):
        raise CosimInputError(f"--skew {text!r}: expected balanced, natural, zipf or zipf:S (e.g. zipf:1.2)")
    if m.group(1) != "zipf":
        return Skew(kind=m.group(1))  # type: ignore[arg-type]
    try:
        s = float(m.group(2)) if m.group(2) else 1.0
    except ValueError:
        raise CosimInputError(f"--skew {text!r}: Zipf exponent must be a number") from None
    if not (s > 0 and math.isfinite(s)):
        raise CosimInputError(f"--skew {text!r}: Zipf exponent must be > 0")
    return Skew(kind="zipf", s=s)


def list_presets() -> list[str]:
    """Names of the bundled model presets."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model_config(name_or_file: str | Path) -> MoEModelConfig:
    """Load a model card: a preset by name (``tiny-moe``), a model YAML file by path, or a
    Hugging Face ``config.json`` by path (:mod:`cosim.capture.hf`)."""
    text = str(name_or_file)
    path = Path(text)
    if text.endswith(".json"):
        from cosim.capture.hf import card_from_hf_config

        try:
            return MoEModelConfig(**card_from_hf_config(path))
        except ValidationError as e:
            field, msg = describe_validation_error(MoEModelConfig, e)
            raise CosimInputError(f"{path}: {field + ' (card field): ' if field else ''}{msg}") from None
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = PRESET_DIR / f"{text}.yaml"
        if not path.is_file():
            raise CosimInputError(f"unknown model preset {text!r} (presets: {', '.join(list_presets())}; "
                                  "or give a path to a model .yaml file)")
    data = load_yaml(path)
    return validate(MoEModelConfig, data, path)


Mode = Literal["train", "prefill", "decode"]
Device = Literal["cpu", "cuda"]


class CaptureOptions(Strict):
    """One capture run: which model, how it is parallelized, what is profiled."""

    model: MoEModelConfig
    """The model."""
    world_size: int = Field(gt=0)
    """Number of processes (ranks)."""
    ep: int = Field(gt=0)
    """Expert-parallel group size; ``world_size // ep`` data-parallel replicas."""
    steps: int = Field(gt=0)
    """Profiled steps (after warm-up)."""
    warmup: int = Field(default=1, ge=0)
    """Steps run before the profiled ones (profiler warm-up: not in the trace)."""
    mode: Mode = "train"
    """train: forward+backward+AdamW; prefill: one forward over the prompt; decode: one token per sequence with a KV cache."""
    skew: Skew = Field(default_factory=Skew)
    """Routing skew."""
    batch: int = Field(default=2, gt=0)
    """Sequences per rank per step."""
    seq: int = Field(default=64, gt=0)
    """Tokens per sequence (train/prefill); prompt length before decoding (decode)."""
    device: Device = "cpu"
    """cpu (gloo) or cuda (nccl, one GPU per rank)."""
    seed: int = 0
    """Seed of weights, inputs and routing."""
    lr: float = Field(default=1e-4, gt=0)
    """AdamW learning rate (train)."""
    profile_memory: bool = False
    """Also record allocator events in the trace."""
    bucket_mb: float = Field(default=25.0, gt=0)
    """Gradient all-reduce bucket size, MiB (as DDP's default ``bucket_cap_mb``)."""

    @property
    def dp(self) -> int:
        """Data-parallel replicas."""
        return self.world_size // self.ep

    @property
    def tokens_per_step(self) -> int:
        """Tokens that pass through the model per rank per step."""
        return self.batch * (1 if self.mode == "decode" else self.seq)

    @model_validator(mode="after")
    def _check(self) -> CaptureOptions:
        m = self.model
        if self.world_size % self.ep:
            raise ValueError(f"world size {self.world_size} is not divisible by the EP size {self.ep}")
        if m.num_experts % self.ep:
            raise ValueError(f"{m.name}: {m.num_experts} experts are not divisible by the EP size {self.ep}")
        return self

    def memory_per_rank(self) -> int:
        """Estimated bytes of weights (+ gradients and AdamW state in training) per rank, fp32."""
        pc = self.model.param_counts()
        params = pc["dense"] + pc["expert"] // self.ep
        per_param = 4 * (4 if self.mode == "train" else 1)  # weight, grad, exp_avg, exp_avg_sq
        return params * per_param
