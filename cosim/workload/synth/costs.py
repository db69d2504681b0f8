"""FLOPs, bytes and saved activations of every op of one transformer layer.

Pure Python: no torch, no simulation. :func:`layer_ops` lists the ops one rank
runs for one micro-batch through one layer, forward, under a :class:`Shard`
(tensor, sequence, context and expert parallelism); :func:`backward_ops` derives
the backward ops from them. :func:`layer_forward_flops` is the unsharded total
that the fake-tensor capture (issue 15 point 11) is checked against.

Conventions (SI units):

* 2 FLOPs per multiply-accumulate; a GEMM ``[m, k] x [k, n]`` is ``2 m n k``.
* Causal flash attention: ``QK^T`` and ``PV`` each ``2 sq sk d`` per head and
  sequence, halved by the causal mask (``sk`` keys, ``sq`` queries); backward is
  2.5x forward (recomputed ``QK^T`` plus four GEMMs, FlashAttention-2).
* Norms :data:`cosim.workload.cost.NORM_FLOPS` per element, softmax
  :data:`~cosim.workload.cost.SOFTMAX_FLOPS`, element-wise ops 1 per output element.
* Bytes are the minimum HBM traffic: every input once plus the output.
* Routed experts count ``tokens * top_k`` expert-token rows (uniform routing in
  :func:`layer_forward_flops`; :func:`layer_ops` takes the per-expert counts of a
  routing model).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from cosim.capture.config import MoEModelConfig
from cosim.errors import CosimInputError
from cosim.workload.cost import NORM_FLOPS, SOFTMAX_FLOPS

__all__ = [
    "CE_UNFUSED_SOURCE",
    "EARLY_STOP_SOURCE",
    "MAIN_GRAD_HOOK_SOURCE",
    "MTP_SOURCE",
    "MUON_NS_STEPS",
    "MUON_SOURCE",
    "OP_PATTERNS",
    "PARAM_HOOK_SOURCE",
    "PRECISIONS",
    "RECOMPUTE_MODULES",
    "ROUTER_UNFUSED_SOURCE",
    "SAVED_SOURCE",
    "TE_QUANTIZE_SOURCE",
    "Comm",
    "Op",
    "Precision",
    "Shard",
    "backward_ops",
    "bias_ops",
    "early_stop_end",
    "embedding_ops",
    "expert_activation_ops",
    "expert_bias_ops",
    "forward_name",
    "head_ops",
    "kv_cache_bytes_per_token",
    "layer_forward_flops",
    "layer_ops",
    "layer_params",
    "mtp_body_layer",
    "mtp_depth",
    "mtp_embedding_copy",
    "mtp_layer_index",
    "mtp_ops",
    "mtp_params",
    "mtp_recomputed_full",
    "muon_matrices",
    "muon_ops",
    "newton_schulz_flops",
    "recipe_with_experts",
    "recomputed",
    "rope_ops",
    "sample_head_ops",
    "selective_saved",
    "unfused_cross_entropy_ops",
    "unfused_router_ops",
]


QUANT_COPIES = 2
"""Quantized copies Transformer Engine writes per cast of a training GEMM input (and of its gradient in the
backward): the row-wise one the forward (dgrad) GEMM reads and the column-wise one the wgrad GEMM reads.
MXFP8: the 1x32 scales run along the reduction dimension, so the column-wise copy is quantized again from the
BF16 source, not transposed (TE ``MXFP8Quantizer(rowwise=True, columnwise=True)``; NVIDIA, "Recipes for
Pre-training LLMs with MXFP8", arXiv:2506.08027, section 3); Hopper FP8: its GEMMs take only the TN layout, so
TE's fused ``cast_transpose`` writes the FP8 tensor and its transpose (transformer_engine/common/transpose/
cast_transpose.cu)."""


SAVED_SOURCE = (
    "NVIDIA/TransformerEngine v2.12 transformer_engine/pytorch/module/linear.py (_Linear.forward: the saved input is "
    "the local, pre-all-gather one, re-gathered in backward when backward_input_needs_gather, i.e. column-parallel "
    "under sequence parallelism; under FP8 one quantized copy, row-wise data discarded; save_original_input keeps the "
    "bf16 original instead); NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/attention.py and "
    "multi_latent_attention.py (linear_proj set_save_original_input for non-delayed FP8: 'the output of the fused "
    "core_attn is saved by itself'; MLA's linear_q_down_proj / linear_kv_down_proj are TELinear "
    "parallel_mode='duplicated' on the [s/TP] shard), moe/shared_experts.py (linear_fc1 set_save_original_input: "
    "'the output of pre_mlp_layernorm is saved by router'), moe/token_dispatcher.py (combine_postprocess: unpermute "
    "without probs) and moe/experts.py (TEGroupedMLP: the probabilities are applied in the weighted activation), "
    "tensor_parallel/layers.py (LinearWithGradAccumulationAndAsyncCommunication: the LM head keeps its local input "
    "under sequence parallelism and all-gathers it in backward); flash attention keeps q, k, v, o and the fp32 "
    "softmax LSE (k and v on the KV heads)")
"""Where the :attr:`Op.saved` bytes of the linear layers, the attention and the MoE unpermute come from (each tensor
counted once, by the op that owns it)."""


@dataclass(frozen=True)
class Precision:
    """Datatypes of one training precision recipe."""

    name: str
    """bf16, fp8 (DeepSeek-V3 / Transformer Engine tensorwise or blockwise FP8) or mxfp8 (Blackwell)."""
    gemm: str
    """Math dtype of linear layers and expert GEMMs (forward, dgrad, wgrad)."""
    gemm_in_bytes: float
    """Bytes per element of a GEMM's inputs."""
    act_bytes: float = 2.0
    """Bytes per element of activations between ops (bf16)."""
    dispatch_bytes: float = 2.0
    """Bytes per element of the all-to-all dispatch payload (FP8 dispatch with its scales)."""
    quant_kernels: int = 1
    """Kernels one quantization of one tensor launches: 1 for MXFP8, blockwise and delayed-scaling FP8 (one
    cast kernel); 4 for per-tensor current scaling (zero the amax, compute the amax, compute the scale, cast:
    :data:`TE_QUANTIZE_SOURCE`)."""
    cast_bytes: float = 2.0
    """Bytes per element of one quantized copy of a GEMM input: 1 byte + its share of the block scales."""
    cast_copies: int = QUANT_COPIES
    """Quantized copies a cast writes: :data:`QUANT_COPIES` in training; 1 when serving (no wgrad GEMM)."""
    cast_reads: int = 1
    """Passes over the BF16 input one cast makes: 1 (a fused cast); 2 under per-tensor current scaling, whose amax
    kernel reads the whole tensor before the cast kernel reads it again (:data:`TE_QUANTIZE_SOURCE`:
    ``nvte_compute_amax_with_config`` then ``nvte_quantize_v2``)."""
    split_alloc: bool = False
    """Transformer Engine's ``split_quantize`` allocates each split's quantized tensor on its own
    (``quantizer->create_tensor`` per split: per-tensor current and delayed scaling) instead of one bulk allocation
    with a view per split (MXFP8, FP8 blockwise; :data:`TE_QUANTIZE_SOURCE`): each further split costs the host
    one eager step (:attr:`Op.outputs`)."""
    row_align: int = 0
    """Rows a Transformer Engine quantized grouped GEMM needs per expert, a multiple of: 32 under MXFP8, 16 under
    FP8 (``get_align_size_for_quantization``); 0: no alignment (bf16). Megatron-Core pads each local expert's
    rows to it in training (:data:`TE_PADDING_SOURCE`)."""
    experts: Precision | None = None
    """Recipe of the routed experts' grouped GEMMs, their input casts and row padding when it differs from this
    one (``workload.synthetic.expert_precision``, :data:`EXPERT_PRECISION_SOURCE`); None: this recipe. The shared
    experts, attention, dense MLPs and the dispatch payload keep this recipe's (:attr:`dispatch_bytes`)."""

    @property
    def routed(self) -> Precision:
        """The recipe the routed experts run in (:attr:`experts`, else this one)."""
        return self.experts if self.experts is not None else self


PRECISIONS: dict[str, Precision] = {
    "bf16": Precision("bf16", "bf16", 2.0),
    # 1 byte per element plus one fp32 scale per 128 elements (DeepSeek-V3 report, section 3.3)
    "fp8": Precision("fp8", "fp8", 1.0, dispatch_bytes=1.0 + 4.0 / 128, cast_bytes=1.0 + 4.0 / 128, row_align=16),
    # 1 byte plus one e8m0 scale per 32 elements (OCP MX spec v1.0)
    "mxfp8": Precision("mxfp8", "mxfp8", 1.0, dispatch_bytes=1.0 + 1.0 / 32, cast_bytes=1.0 + 1.0 / 32, row_align=32),
    # Transformer Engine's per-tensor current scaling (Megatron-Bridge FP8_CS): FP8 math, four kernels per cast
    "fp8-cs": Precision("fp8-cs", "fp8", 1.0, dispatch_bytes=1.0 + 4.0 / 128, cast_bytes=1.0 + 4.0 / 128,
                        quant_kernels=4, cast_reads=2, split_alloc=True, row_align=16),
}
"""The precision recipes ``precision:`` accepts."""

EXPERT_PRECISION_SOURCE = (
    "NVIDIA/TransformerEngine v2.12 transformer_engine.pytorch autocast (formerly fp8_autocast: a region in which "
    "only the TE modules called quantize: te.Linear, te.LayerNormLinear, te.GroupedLinear); NVIDIA/Megatron-LM "
    "core_v0.16.0 megatron/core/transformer/moe/moe_layer.py (MoELayer: routed experts self.experts, a "
    "TEGroupedMLP over te.GroupedLinear; shared experts self.shared_experts, shared_experts.py SharedExpertMLP, an "
    "MLP over TE column / row parallel linears like the dense MLP), experts.py (TEGroupedMLP: Fp8Padding / "
    "Fp8Unpadding only around the grouped linears); PrimeIntellect-ai/prime-rl (convert_model_moe_to_fp8: each MoE "
    "layer's mlp.experts, the routed GroupedExperts, replaced by TE GroupedLinear with Fp8Padding under a "
    "Float8BlockScaling autocast; attention, shared experts and dense MLPs stay torch BF16 linears)")
"""Why ``expert_precision`` takes the routed experts only (:attr:`Precision.experts`): the grouped GEMMs are the
module an expert-only FP8 autocast region or module swap reaches; the shared experts are a dense MLP module."""


def recipe_with_experts(precision: str, experts: str | None = None) -> Precision:
    """The recipe ``PRECISIONS[precision]`` with the routed experts' recipe ``experts`` (:attr:`Precision.experts`)
    when it is given and differs (``workload.synthetic.expert_precision``)."""
    p = PRECISIONS[precision]
    return p if experts is None or experts == precision else replace(p, experts=PRECISIONS[experts])


@dataclass(frozen=True)
class Comm:
    """A collective an op stands for: which group, what, and its bytes on this rank."""

    group: str
    """tp, cp, ep, etp, dp or edp (the layout's group of this rank)."""
    kind: str
    """all_gather, reduce_scatter, all_reduce, all_to_all_dispatch, all_to_all_combine."""
    nbytes: float
    """The engine's size of the collective on this rank: all-gather the gathered output,
    reduce-scatter and all-reduce the full input, all-to-all everything this rank sends
    (its own share included). A transposed collective (backward) keeps it."""


OP_PATTERNS = ("", "strided", "unrolled", "batched_copy")
"""Access patterns a synthesized memory-bound op may name (:attr:`Op.pattern`; the keys of
:data:`cosim.models.synth_timing.PATTERN_KERNELS`, which gives each its kernel): "" a contiguous, vectorized
kernel."""


@dataclass(frozen=True)
class Op:
    """One kernel of one rank, forward or backward."""

    name: str
    """What it computes, e.g. ``attn.qkv``; backward ops end in ``.dgrad`` / ``.wgrad`` / ``.bwd``."""
    cls: str
    """Kernel-model class: gemm, grouped_gemm, attention, elementwise, norm, reduction,
    moe_dispatch, moe_combine, collective."""
    flops: float = 0.0
    """FLOPs."""
    bytes: float = 0.0
    """Minimum HBM traffic, bytes."""
    dtype: str = "bf16"
    """Math dtype."""
    m: float = 0.0
    """GEMM rows (grouped GEMM: mean rows per group, :attr:`group_rows` gives each); attention query length."""
    n: float = 0.0
    """GEMM columns; attention key length."""
    k: float = 0.0
    """GEMM reduction dim; attention head dim."""
    batch: float = 1.0
    """Groups of a grouped GEMM; attention sequences."""
    heads: float = 1.0
    """Attention heads."""
    bwd: bool = False
    """A backward kernel."""
    saved: float = 0.0
    """Activation bytes this op keeps for the backward pass."""
    comm: Comm | None = None
    """The collective, for class ``collective``."""
    stream: str = "compute"
    """compute, or the communication stream that carries it (tp, ep, ...)."""
    waits: tuple[str, ...] = field(default_factory=tuple)
    """Names of earlier ops of the same layer on other streams that this op waits for."""
    keys: float = 0.0
    """Attention: key rows the kernel computes per query when not the causal half of ``n`` (a sliding window's
    tiles, :func:`window_tile_keys`); 0: derived from ``n`` and ``causal``."""
    causal: bool = True
    """Attention: causal (the kernel skips masked key blocks); False for a decode step's query, which
    reads every cached key and is bounded by HBM traffic as much as by FLOPs."""
    no_grad: bool = False
    """Bookkeeping without a backward (token counts, their host copies, loss logging)."""
    launches: int = 1
    """Kernels the host launches for this op: Transformer Engine's grouped GEMM (``GroupedLinear``, the
    default multi-stream cuBLASLt path) launches one GEMM per local expert (:data:`TE_GROUPED_GEMM_SOURCE`);
    the builder charges each launch beyond the first ``BuildOptions.expert_gemm_host``."""
    loop_launches: int = 0
    """Further kernels the op's one framework call launches from a C++ loop (no Python, no PyTorch dispatch):
    Transformer Engine's ``split_quantize`` quantizes each local expert's rows with its own kernel(s), and a
    current-scaling cast is four kernels (:data:`TE_QUANTIZE_SOURCE`); the builder charges each the CUDA
    launch call (``BuildOptions.launch_overhead``)."""
    c10d: bool = True
    """A collective launched through ``torch.distributed`` (the builder charges ``BuildOptions.collective_host``);
    False: a communication library's own kernel behind its own Python call (HybridEP's dispatch and combine),
    charged as any framework call."""
    host_sync: bool = False
    """The host blocks until this op has run: a blocking host-to-device copy (``torch.tensor(x, device=cuda)``
    copies from pageable memory through ``c10::cuda::memcpy_and_sync``, a cudaStreamSynchronize)."""
    bias: bool = False
    """The op carries a bias parameter (card ``linear_bias``): a linear whose bias rides in its GEMM epilogue
    (one per local expert for a grouped GEMM), or the eager bias add of one that returns its bias. Only the
    backward's parameter count reads it (:func:`param_tensors`)."""
    params: int = 0
    """Backward: parameter tensors whose gradient this op completes (a weight GEMM's wgrad: 1, a grouped GEMM's
    wgrad: one weight per local expert, a norm's or the embedding's backward: 1). Each runs autograd's
    ``AccumulateGrad`` node and Megatron-Core's per-parameter backward hook in Python
    (:data:`PARAM_HOOK_SOURCE`); the builder charges each ``BuildOptions.eager_step_host`` on the host."""
    group_rows: tuple[float, ...] = ()
    """Grouped GEMM: token rows of each group (local expert), as routing gave them; the kernel model tiles each
    group on its own (:class:`cosim.models.synth_timing.KernelTimer`). They are the forward's and the dgrad's
    M per group and the wgrad's K per group (:attr:`group_k`); ``m`` (and ``k`` of a wgrad) hold their mean,
    so FLOPs and bytes stay the exact sums. Empty: ``batch`` groups of ``m`` rows."""
    group_k: bool = False
    """:attr:`group_rows` are each group's K (a grouped GEMM's wgrad, ``dW_e = X_e^T dY_e``), not its M."""
    outputs: int = 0
    """Further tensors the op's one framework call allocates on their own, one eager step each (allocation and
    Python object): Transformer Engine's ``split_quantize`` creates each local expert's quantized tensor with
    ``quantizer->create_tensor`` under per-tensor scaling (:attr:`Precision.split_alloc`; MXFP8 and blockwise
    allocate in bulk: not counted); the builder charges each ``BuildOptions.eager_step_host``."""
    copy: bool = False
    """A pure data movement (the row padding of :func:`expert_padding_ops`, HybridEP's permute and unpermute): its
    backward is the inverse copy of the gradient, the same traffic (not the element-wise rule's twice)."""
    bwd_launches: int | None = None
    """Host launches of the op's backward (:func:`backward_ops`); None: the forward's :attr:`launches`. A fused
    call whose backward starts with another of its kernels sets it (HybridEP: :func:`hybridep_dispatch_ops`)."""
    bwd_bytes: float | None = None
    """HBM traffic of the op's backward (:func:`backward_ops`), bytes; None: the element-wise rule's twice the
    forward's. Set where autograd's backward of an eager op is known kernel by kernel (gpt-oss's clamps and bias
    adds, :data:`GPT_OSS_BACKWARD_SOURCE`): its :attr:`bwd_launches` kernels are timed as one memory-bound op of
    these bytes, the kernels beyond the first charged as C++ launches (:attr:`loop_launches`: autograd's engine
    runs them without Python); 0 with :attr:`bwd_launches` 0: a backward that only passes the gradient on
    (views, no kernel)."""
    pattern: str = ""
    """Memory-bound op: how the kernel PyTorch launches for it walks memory (a name of :data:`OP_PATTERNS`,
    checked at construction; :data:`cosim.models.synth_timing.PATTERN_KERNELS` gives its kernel): ``strided``
    for an eager op on a non-contiguous or broadcast view (TensorIterator's generic ``elementwise_kernel``),
    ``batched_copy`` for ``torch.cat``; "": a contiguous, vectorized kernel. Its backward keeps it."""

    def __post_init__(self) -> None:
        if self.pattern not in OP_PATTERNS:
            raise CosimInputError(f"synthesized op {self.name}: unknown access pattern {self.pattern!r} "
                                  f"(known: {', '.join(p for p in OP_PATTERNS if p)})")


@dataclass(frozen=True)
class Shard:
    """How one rank's share of a layer is cut (the parallel layout seen from one rank)."""

    tp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False
    expert_tokens: Sequence[float] | None = None
    """Rows each local expert gets on this rank (length ``num_experts / ep``); None: uniform."""
    a2a_send_tokens: float | None = None
    """Token rows this rank sends in the dispatch all-to-all (top-k copies, self included);
    None: ``tokens_moe * top_k``."""
    q_len: float | None = None
    """Inference: query tokens per sequence in this pass (a prefill chunk; 1 for decode); None: the
    training case, ``seq / cp`` queries per sequence."""
    decode: bool = False
    """Inference decode: one query per request attends to a KV cache of ``seq`` tokens (MLA with the
    up-projections absorbed, as FlashMLA), and the new token's keys/values are appended to the cache."""
    kv_bytes: float = 2.0
    """Bytes per element of the KV cache (inference)."""
    framework_ops: bool = True
    """Training: include Megatron-Core's eager bookkeeping kernels of an MoE layer (load-balancing loss,
    token counts and their host copies, probabilities all-to-all, chunk sorts); False: the model's math only."""
    dispatcher: str = "alltoall"
    """Training MoE token dispatcher: ``alltoall`` (Megatron-Core's MoEAlltoAllTokenDispatcher: NCCL
    all-to-all of the tokens, a second one of their probabilities, the counts all-gathered over EP) or
    ``deepep`` (MoEFlexTokenDispatcher with DeepEP: the probabilities ride in DeepEP's token buffer and
    its notify kernel exchanges the counts, so neither the probabilities' all-to-all nor the counts'
    all-gather is launched) or ``hybridep`` (MoEFlexTokenDispatcher with HybridEP, :func:`hybridep_dispatch_ops`: the bool routing map
    all-gathered over EP, HybridEP's metadata and permute preprocessing, a host sync, then its dispatch + permute
    and unpermute + combine kernels; none of the alltoall dispatcher's bookkeeping, permutes or sorts)."""
    dtoh_late: bool = False
    """Training, alltoall dispatcher: the token counts' host copies follow the token permutation (Megatron-Core's
    ``cuda_dtoh_point = "before_ep_alltoall"`` when ``moe_preprocess`` is CUDA-graphed: the copies cannot be
    captured) and the host waits for the last of them (:attr:`Op.host_sync`); False: they precede it
    (``before_permutation_1``) and the host waits at the permutation (:class:`cosim.workload.synth.build.BuildOptions`
    ``moe_host_sync``)."""
    moe_router_fusion: bool = True
    """Training: the router's score function and top-k as one fused op (``moe.router_topk``: Megatron-Core's
    ``moe_router_fusion``, TE's fused top-k); False: the eager kernels of Megatron-Core's unfused
    ``topk_softmax_with_capacity`` (:func:`unfused_router_ops`)."""
    expert_padding: bool = True
    """Training, FP8/MXFP8: Megatron-Core's grouped MLP copies the local experts' rows into and out of a buffer
    aligned for the quantized GEMM (:func:`expert_padding_ops`); False: the rows arrive aligned
    (``moe_router_padding_for_quantization``). The ``hybridep`` dispatcher never copies: it pads in its dispatch
    (``pad_multiple``)."""


def _gemm(name: str, m: float, n: float, k: float, p: Precision, *, save_input: bool = True,
          batch: float = 1.0, cls: str = "gemm") -> Op:
    """A linear layer ``[m, k] x [k, n]`` (weights ``k x n``)."""
    inb, outb = p.gemm_in_bytes, p.act_bytes
    nbytes = (m * k + k * n) * batch * inb + m * n * batch * outb
    return Op(name, cls, 2.0 * m * n * k * batch, nbytes, p.gemm, m, n, k, batch,
              saved=m * k * batch * _saved_bytes(p) if save_input else 0.0)


def _saved_bytes(p: Precision) -> float:
    """Bytes per element of a GEMM input kept for the backward: one quantized copy with its scales (FP8: the
    column-wise one the wgrad reads, SAVED_SOURCE), or the bf16 tensor."""
    return p.cast_bytes if p.gemm != "bf16" else p.gemm_in_bytes


def _quant(name: str, numel: float, p: Precision, groups: int = 1) -> list[Op]:
    """The cast of a GEMM input to FP8 (nothing at bf16): one BF16 read, ``cast_copies`` FP8 copies with their
    scales (``cast_bytes`` per element) written. ``groups``: tensors quantized one by one in one call (Transformer
    Engine's ``split_quantize`` over the local experts' rows, training): each launches ``p.quant_kernels`` kernels
    (:data:`TE_QUANTIZE_SOURCE`)."""
    if p.gemm == "bf16":
        return []
    return [Op(f"{name}.quantize", "elementwise", numel,
               numel * (p.cast_reads * p.act_bytes + p.cast_copies * p.cast_bytes), p.gemm,
               loop_launches=max(groups, 1) * p.quant_kernels - 1,
               outputs=max(groups, 1) - 1 if p.split_alloc else 0)]


TE_QUANTIZE_SOURCE = ("NVIDIA/TransformerEngine v2.12 (NeMo 26.02): transformer_engine/pytorch/module/grouped_linear.py "
                      "(_GroupedLinear.forward: tex.split_quantize of the input; backward: of each grad output), "
                      "pytorch/csrc/extensions/cast.cpp (split_quantize -> multi_tensor_quantize_impl: a fused "
                      "multi-tensor kernel only for delayed scaling, else quantizer->quantize per tensor), "
                      "pytorch/csrc/quantizer.cpp (MXFP8Quantizer::quantize: nvte_quantize_v2; "
                      "Float8CurrentScalingQuantizer::quantize_impl: nvte_compute_amax_with_config, "
                      "nvte_compute_scale_from_amax, nvte_quantize_v2) and common/recipe/current_scaling.cu "
                      "(zero_amax_kernel, amax kernel, compute_scale_from_amax_kernel)")
"""Why a training quantize of the routed experts is one kernel per local expert (MXFP8, blockwise) or four
(current scaling), launched from C++ (:attr:`Op.loop_launches`), and returns one quantized tensor per local
expert, allocated one by one under per-tensor scaling (:attr:`Op.outputs`; cast.cpp ``split_quantize``:
``create_tensor`` per split unless every quantizer is MXFP8, blockwise or NVFP4, which allocate in bulk;
TransformerEngine issue #1499, the maintainers: the per-GEMM ``torch.empty`` calls and ``torch.split`` are what
dominate ``GroupedLinear``'s CPU time)."""


def _ew(name: str, numel: float, p: Precision, *, inputs: int = 1, flops_per: float = 1.0, saved: float = 0.0,
        cls: str = "elementwise", pattern: str = "") -> Op:
    """An element-wise op over ``numel`` elements: ``flops_per`` FLOPs each, ``inputs`` tensors read and one
    written in the activation dtype (bytes), ``saved`` bytes kept for the backward."""
    return Op(name, cls, numel * flops_per, numel * p.act_bytes * (inputs + 1), "bf16", saved=saved, pattern=pattern)


def _norm(name: str, tokens: float, width: float, p: Precision) -> Op:
    """A norm over ``tokens`` x ``width``: read and write once in the activation dtype, its input kept."""
    return Op(name, "norm", tokens * width * NORM_FLOPS, 2 * tokens * width * p.act_bytes, "bf16",
              saved=tokens * width * p.act_bytes)


def _coll(name: str, group: str, kind: str, nbytes: float, stream: str = "", waits: tuple[str, ...] = ()) -> Op:
    """A collective of ``kind`` moving ``nbytes`` over process group ``group``, on stream ``stream`` (default: the
    group's), after ops ``waits``."""
    return Op(name, "collective", 0.0, nbytes, comm=Comm(group, kind, nbytes), stream=stream or group, waits=waits)


def _attention_ops(c: MoEModelConfig, T: float, seq: float, s: Shard, p: Precision,
                   window: int | None = None) -> list[Op]:
    """Attention block of one rank: norm, projections, flash attention, output projection, collectives.
    ``window``: sliding-window attention (each query sees at most ``window`` keys, itself included)."""
    h = c.hidden_size
    tp, cp = s.tp, s.cp
    sp = s.sequence_parallel and tp > 1
    heads = c.num_heads / tp
    sq, sk = (seq / cp, seq) if s.q_len is None else (s.q_len, seq)
    b = T / sq  # sequences (or prefill chunks, or decode requests) in this micro-batch on this rank
    mla_sp = sp and c.attention_kind == "mla" and not s.decode  # MLA_SP_SOURCE: no gather of the hidden states
    ops: list[Op] = [_norm("attn.norm", T / tp if sp else T, h, p)]
    if sp and not mla_sp:
        ops.append(_coll("attn.sp_all_gather", "tp", "all_gather", T * h * p.act_bytes))
    elif tp > 1:
        pass  # the input is replicated on every TP rank; the all-reduce comes after o_proj
    ops += _quant("attn.input", (T / tp if mla_sp else T) * h, p)
    if s.decode:
        return ops + _decode_attention_ops(c, T, b, sk, s, p)
    if c.attention_kind == "mla":
        nope, rope = c.qk_nope_head_dim or 0, c.qk_rope_head_dim or 0
        vd, kvr = c.v_head_dim or 0, c.kv_lora_rank or 0
        dqk = nope + rope
        if mla_sp:
            ops += _mla_sp_projections(c, T, tp, heads, p)
        else:
            # saved (SAVED_SOURCE): the down projections' input on this rank's T / tp tokens under SP, one quantized
            # copy each (FP8) or the one norm output both read (bf16); the up projections' norm input and ln_out the
            # same
            loc = T / tp if sp else T
            own = _saved_bytes(p) if p.gemm != "bf16" else 0.0  # a second reader's own quantized copy
            if c.q_lora_rank:
                ops += [replace(_gemm("attn.q_down", T, c.q_lora_rank, h, p), saved=loc * h * _saved_bytes(p)),
                        replace(_norm("attn.q_norm", T, c.q_lora_rank, p), saved=loc * c.q_lora_rank * p.act_bytes),
                        *_quant("attn.q_latent", T * c.q_lora_rank, p),
                        replace(_gemm("attn.q_up", T, heads * dqk, c.q_lora_rank, p),
                                saved=loc * c.q_lora_rank * _saved_bytes(p))]
            else:
                ops.append(replace(_gemm("attn.q_proj", T, heads * dqk, h, p), saved=loc * h * _saved_bytes(p)))
            ops += [replace(_gemm("attn.kv_down", T, kvr + rope, h, p), saved=loc * h * own),
                    replace(_norm("attn.kv_norm", T, kvr, p), saved=loc * kvr * p.act_bytes),
                    *_quant("attn.kv_latent", T * kvr, p),
                    replace(_gemm("attn.kv_up", T, heads * (nope + vd), kvr, p), saved=loc * kvr * _saved_bytes(p)),
                    _ew("attn.rope", T * (heads + 1) * rope, p, flops_per=3.0)]
        d_core, d_out = (dqk + vd) / 2.0, float(vd)
        d_qk, d_v, kv_heads = float(dqk), float(vd), heads
        kv_bytes = T * (kvr + rope) * p.act_bytes
    else:
        d = c.attn_head_dim
        kvh = max(c.num_kv_heads / tp, 1.0)
        ops += [replace(_gemm("attn.qkv", T, (heads + 2 * kvh) * d, h, p), bias=c.linear_bias,
                        saved=(T / tp if sp else T) * h * _saved_bytes(p)),  # SP: the local ln_out (SAVED_SOURCE)
                *qk_norm_ops(c, T, heads, kvh, d, p),
                *rope_ops(c, T, sq, heads, kvh, d, p, s.q_len is None and not s.decode)]
        d_core, d_out = float(d), float(d)
        d_qk, d_v, kv_heads = float(d), float(d), kvh
        kv_bytes = T * 2 * kvh * d * p.act_bytes
    if cp > 1:  # every rank needs the keys and values of the whole sequence
        ops.append(_coll("attn.cp_kv_all_gather", "cp", "all_gather", kv_bytes * cp, stream="cp"))
    if s.q_len is not None:  # inference prefill: the chunk's keys/values go to the KV cache
        ops.append(_kv_append(c, T, s))
    flops = 4.0 * b * heads * sq * sk * d_core * 0.5  # causal: half the score matrix
    keys = 0.0
    if window is not None and window < sk:
        pairs = window_pairs(sq, sk, window)
        flops = 4.0 * b * heads * d_core * pairs
        keys = window_tile_keys(window, sk)
    qkvo = b * heads * (sq * d_core * 2 + sk * d_core * 2) * p.act_bytes
    # saved: q and the output on the rank's heads, k and v on its KV heads (GQA: fewer), the fp32 softmax LSE
    saved = b * (heads * sq * (d_qk + d_v) + kv_heads * sk * (d_qk + d_v)) * p.act_bytes + b * heads * sq * 4.0
    ops.append(Op("attn.core", "attention", flops, qkvo, "bf16", sq, sk, d_core, b, heads, saved=saved, keys=keys))
    return ops + _attention_out(c, T, heads, d_out, s, p)


MLA_SP_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/multi_latent_attention.py "
                 "(MLASelfAttention: linear_q_down_proj / linear_kv_down_proj built as TELinear parallel_mode="
                 "'duplicated', no TP group; _qkv_down_projection: 'elif linear_q_down_proj is Linear: q_compressed: "
                 "[s / TP, b, q_lora_rank]', kv_combined [s / TP, b, kv_lora_rank + qk_pos_emb_head_dim]; "
                 "get_query_key_value_tensors: under sequence parallelism k_pos_emb gathered with "
                 "gather_from_sequence_parallel_region; linear_q_up_proj / linear_kv_up_proj column-parallel, "
                 "all-gathering their [s / TP] input), megatron/core/models/gpt/gpt_layer_specs.py (the MLA spec's "
                 "down projections: backend.linear(), TELinear; up projections: column-parallel, with the q/kv norm "
                 "fused when qk_layernorm)")
"""Where MLA's projections under sequence parallelism come from (:func:`_mla_sp_projections`)."""


def _mla_sp_projections(c: MoEModelConfig, T: float, tp: int, heads: float, p: Precision) -> list[Op]:
    """MLA's projections of one rank under sequence parallelism (:data:`MLA_SP_SOURCE`): the hidden states are not
    gathered; the replicated down projections run on the rank's own ``T / tp`` tokens (a GEMM of ``T / tp`` rows,
    not ``T``: ``2 (T / tp) h (q_lora + kv_lora + rope)`` FLOPs), their norms too; the column-parallel up projections
    all-gather their narrow inputs over TP (the normed q latent, ``q_lora_rank`` wide; the normed kv latent,
    ``kv_lora_rank``; the rotary key, ``qk_rope_head_dim``) and run on all ``T`` tokens for the rank's heads.
    Backward: the gathers' reduce-scatters (:func:`backward_ops`). Saved bytes: as :func:`_attention_ops`'s
    unsplit path (:data:`SAVED_SOURCE`: the local inputs)."""
    h = c.hidden_size
    nope, rope, vd, kvr = c.qk_nope_head_dim or 0, c.qk_rope_head_dim or 0, c.v_head_dim or 0, c.kv_lora_rank or 0
    dqk = nope + rope
    loc = T / tp
    own = _saved_bytes(p) if p.gemm != "bf16" else 0.0
    ops: list[Op] = []
    if c.q_lora_rank:
        q = c.q_lora_rank
        ops += [replace(_gemm("attn.q_down", loc, q, h, p), saved=loc * h * _saved_bytes(p)),
                replace(_norm("attn.q_norm", loc, q, p), saved=loc * q * p.act_bytes),
                _coll("attn.q_latent_all_gather", "tp", "all_gather", T * q * p.act_bytes),
                *_quant("attn.q_latent", T * q, p),
                replace(_gemm("attn.q_up", T, heads * dqk, q, p), saved=loc * q * _saved_bytes(p))]
    else:  # the query projection is column-parallel itself: it gathers the hidden states
        ops += [_coll("attn.q_input_all_gather", "tp", "all_gather", T * h * p.act_bytes),
                replace(_gemm("attn.q_proj", T, heads * dqk, h, p), saved=loc * h * _saved_bytes(p))]
    ops += [replace(_gemm("attn.kv_down", loc, kvr + rope, h, p), saved=loc * h * own),
            replace(_norm("attn.kv_norm", loc, kvr, p), saved=loc * kvr * p.act_bytes),
            _coll("attn.kv_latent_all_gather", "tp", "all_gather", T * kvr * p.act_bytes),
            _coll("attn.k_rope_all_gather", "tp", "all_gather", T * rope * p.act_bytes),
            *_quant("attn.kv_latent", T * kvr, p),
            replace(_gemm("attn.kv_up", T, heads * (nope + vd), kvr, p), saved=loc * kvr * _saved_bytes(p)),
            _ew("attn.rope", T * (heads + 1) * rope, p, flops_per=3.0)]
    return ops


QK_NORM_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/attention.py "
                  "(SelfAttention.get_query_key_value_tensors: after the QKV split, query reshaped to [sq, b, np, hn], "
                  "'if self.q_layernorm is not None: query = self.q_layernorm(query)', the same for key; RoPE after, "
                  "in forward), megatron/core/models/gpt/gpt_layer_specs.py (q_layernorm / k_layernorm: TENorm when "
                  "qk_layernorm, else IdentityOp); NVIDIA-NeMo/Megatron-Bridge v0.3.0 "
                  "src/megatron/bridge/models/qwen/qwen3_moe_bridge.py (provider: qk_layernorm=True) and "
                  "qwen_provider.py (Qwen3MoEModelProvider qk_layernorm True); Hugging Face transformers "
                  "Qwen3MoeAttention (q_norm, k_norm: Qwen3MoeRMSNorm(head_dim))")
"""Where :func:`qk_norm_ops` comes from."""


def qk_norm_ops(c: MoEModelConfig, T: float, heads: float, kvh: float, d: float, p: Precision) -> list[Op]:
    """Per-head RMSNorm of the queries and keys (card ``qk_layernorm``, :data:`QK_NORM_SOURCE`): one Transformer Engine
    RMSNorm kernel on the rank's ``T x heads`` query rows of width ``d`` and one on its ``T x kvh`` key rows, in
    the activation dtype (the QKV GEMM's output); each saves its input for the backward (RMSNorm's gradient needs
    it, as :func:`_norm` counts; its output is what attention saves). Backward: :func:`backward_ops` (a norm's
    dgrad + dgamma). Empty without ``qk_layernorm``."""
    if not c.qk_layernorm:
        return []
    return [_norm("attn.q_layernorm", T * heads, d, p), _norm("attn.k_layernorm", T * kvh, d, p)]


ROPE_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0: megatron/core/models/common/embeddings/rope_utils.py "
               "(apply_rotary_pos_emb: with apply_rope_fusion, mscale != 1 -> 'not supported by TE's fused RoPE. "
               "Using unfused implementation'; _apply_rotary_pos_emb_bshd: cos/sin of freqs times mscale cast to "
               "the input dtype, t * cos + _rotate_half(t) * sin, _rotate_half = chunk, neg, cat, then "
               "torch.cat((t, t_pass))), megatron/core/transformer/attention.py (query and key each through "
               "apply_rotary_pos_emb with mscale=_yarn_get_concentration_factor_from_config), "
               "yarn_rotary_pos_embedding.py (_yarn_get_mscale: 0.1 ln(scale) + 1)")
"""Where :func:`rope_ops`'s unfused chain comes from."""


def rope_ops(c: MoEModelConfig, T: float, sq: float, heads: float, kvh: float, d: float, p: Precision,
             train: bool = True) -> list[Op]:
    """Rotary embedding of a GQA/MHA layer's queries and keys (``T`` tokens, ``heads`` / ``kvh`` heads of ``d``).

    Default: one fused kernel (TE's fused RoPE, ``attn.rope``). With a YaRN attention factor (card
    ``rope_mscale`` != 1) in training, Megatron-Core's unfused chain (:data:`ROPE_SOURCE`), for the queries and
    then the keys (``X`` = q, k; ``n`` = T x heads x d elements, ``u`` = n x 2 bytes): six small kernels on the
    ``sq x d`` fp32 angles (cos, times mscale, cast; sin, times mscale, cast; no gradient), then ``t * cos``
    (2u), the negated half (1u), the rotated cat (2u), ``* sin`` (2u), the sum (3u) and the final cat with the
    empty pass-through part (2u). Backward (:func:`backward_ops`, 2x bytes): the two products, the negation and
    the rotated cat (14u; the sum's and the final cat's gradients are views, the accumulation and the slice's
    gradient copy, ~5u, sit in that margin)."""
    if c.rope_mscale == 1.0 or not train:
        return [_ew("attn.rope", T * (heads + kvh) * d, p, flops_per=3.0)]
    ops: list[Op] = []
    for x, hx in (("q", heads), ("k", kvh)):
        n = T * hx * d
        a = f"attn.rope_{x}"
        ops += [_tiny(f"{a}.{fn}", sq * d, no_grad=True) for fn in ("cos", "cos_scale", "cos_cast", "sin",
                                                                      "sin_scale", "sin_cast")]
        # cos / sin broadcast over heads and the negated chunk half are strided operands; the cats batched copies
        ops += [_ew(f"{a}.mul_cos", n, p, pattern="strided"), _ew(f"{a}.neg", n / 2, p, pattern="strided"),
                _ew(f"{a}.rotate_cat", n, p, flops_per=0.0, pattern="batched_copy"),
                _ew(f"{a}.mul_sin", n, p, pattern="strided"),
                replace(_ew(f"{a}.add", n, p, inputs=2), no_grad=True),
                replace(_ew(f"{a}.cat", n, p, flops_per=0.0, pattern="batched_copy"), no_grad=True)]
    return ops


ATTENTION_TILE = 128
"""Key (and query) rows of one flash-attention tile (FlashAttention-2/3 forward on Hopper: 128 x 128 blocks)."""


def window_pairs(sq: float, sk: float, window: float) -> float:
    """(query, key) pairs a causal sliding window of ``window`` keys scores: the last ``sq`` of ``sk``
    positions, each seeing itself and up to ``window - 1`` keys before it: ``sum_i min(i + 1, window)``."""
    def upto(n: float) -> float:  # pairs of the first n positions
        w = min(n, window)
        return w * (w + 1) / 2.0 + max(n - window, 0.0) * window
    return upto(sk) - upto(sk - sq)


def window_tile_keys(window: float, sk: float) -> float:
    """Key rows a flash kernel computes per query under a sliding window: a query tile touches the key tiles
    that intersect its rows' windows, ``ceil(window / tile) + 1`` of them (the partly masked ones in full)."""
    return min(sk, (math.ceil(window / ATTENTION_TILE) + 1) * ATTENTION_TILE)


def _attention_out(c: MoEModelConfig, T: float, heads: float, d_out: float, s: Shard, p: Precision) -> list[Op]:
    """Output projection, its TP reduction and the residual add."""
    h, tp = c.hidden_size, s.tp
    sp = s.sequence_parallel and tp > 1
    ops = _quant("attn.o_input", T * heads * d_out, p)
    # its input is the attention output attn.core keeps (bf16), or saved as that original (FP8: SAVED_SOURCE)
    ops.append(_gemm("attn.o_proj", T, h, heads * d_out, p, save_input=False))
    if sp:
        ops.append(_coll("attn.sp_reduce_scatter", "tp", "reduce_scatter", T * h * p.act_bytes))
    elif tp > 1:
        ops.append(_coll("attn.tp_all_reduce", "tp", "all_reduce", T * h * p.act_bytes))
    ops += bias_ops(c, "attn.o_bias", (T / tp if sp else T) * h, p, s.q_len is None and not s.decode)
    ops.append(_ew("attn.residual", (T / tp if sp else T) * h, p, inputs=2))
    return ops


def kv_cache_bytes_per_token(c: MoEModelConfig, tp: int = 1, kv_bytes: float = 2.0) -> float:
    """KV-cache bytes one GPU holds per cached token per layer: MLA the compressed latent
    (``kv_lora_rank + qk_rope_head_dim``, replicated on every TP rank), GQA/MHA K and V of the
    rank's KV heads (``num_kv_heads / tp``, at least one)."""
    if c.attention_kind == "mla":
        return ((c.kv_lora_rank or 0) + (c.qk_rope_head_dim or 0)) * kv_bytes
    return 2.0 * max(c.num_kv_heads / tp, 1.0) * c.attn_head_dim * kv_bytes


def _kv_append(c: MoEModelConfig, T: float, s: Shard) -> Op:
    """Write the ``T`` new tokens' keys/values (or MLA latents) into the paged KV cache."""
    n = T * kv_cache_bytes_per_token(c, s.tp, s.kv_bytes)
    return Op("attn.kv_cache_append", "elementwise", 0.0, 2.0 * n, "bf16")


def _decode_attention_ops(c: MoEModelConfig, T: float, b: float, ctx: float, s: Shard, p: Precision) -> list[Op]:
    """Decode attention of ``b`` requests (``T = b`` queries) over ``ctx`` cached tokens each.

    MLA (DeepSeek's serving path, FlashMLA): q down/up projections, the key up-projection absorbed
    into the query (per head ``[b, nope] x [nope, kv_lora]``), the new latent appended, attention of
    every head over the shared latent (``kv_lora + rope`` for scores, ``kv_lora`` for values: one
    cache read serves all heads), then the value up-projection per head and the output GEMM.
    GQA/MHA: fused QKV, RoPE, K/V appended, attention reading K and V of each KV head."""
    h, heads = c.hidden_size, c.num_heads / s.tp
    kvpt = kv_cache_bytes_per_token(c, s.tp, s.kv_bytes)
    ops: list[Op] = []
    if c.attention_kind == "mla":
        nope, rope = c.qk_nope_head_dim or 0, c.qk_rope_head_dim or 0
        kvr = c.kv_lora_rank or 0
        if c.q_lora_rank:
            ops += [_gemm("attn.q_down", T, c.q_lora_rank, h, p), _norm("attn.q_norm", T, c.q_lora_rank, p),
                    *_quant("attn.q_latent", T * c.q_lora_rank, p),
                    _gemm("attn.q_up", T, heads * (nope + rope), c.q_lora_rank, p)]
        else:
            ops.append(_gemm("attn.q_proj", T, heads * (nope + rope), h, p))
        ops += [_gemm("attn.kv_down", T, kvr + rope, h, p), _norm("attn.kv_norm", T, kvr, p),
                _ew("attn.rope", T * (heads + 1) * rope, p, flops_per=3.0),
                _gemm("attn.q_absorb", T, kvr, nope, PRECISIONS["bf16"], batch=heads, cls="grouped_gemm"),
                _kv_append(c, T, s)]
        d_qk, d_v, kv_heads = kvr + rope, kvr, 1.0
    else:
        d = c.attn_head_dim
        kvh = max(c.num_kv_heads / s.tp, 1.0)
        ops += [_gemm("attn.qkv", T, (heads + 2 * kvh) * d, h, p),
                _ew("attn.rope", T * (heads + kvh) * d, p, flops_per=3.0), _kv_append(c, T, s)]
        d_qk = d_v = d
        kv_heads = kvh
    flops = 2.0 * b * heads * ctx * (d_qk + d_v)
    nbytes = b * ctx * kvpt + b * heads * (d_qk + d_v) * p.act_bytes
    # decode kernels (FlashMLA, FlashInfer) put the query heads that share a KV head in one tile's rows:
    # per request and KV head, a (heads / kv_heads) x ctx attention
    ops.append(Op("attn.core", "attention", flops, nbytes, "bf16", heads / kv_heads, ctx, (d_qk + d_v) / 2.0, b,
                  kv_heads, causal=False))
    if c.attention_kind == "mla":
        ops.append(_gemm("attn.v_absorb", T, c.v_head_dim or 0, c.kv_lora_rank or 0, PRECISIONS["bf16"],
                         batch=heads, cls="grouped_gemm"))
        d_out = float(c.v_head_dim or 0)
    else:
        d_out = float(c.attn_head_dim)
    return ops + _attention_out(c, T, heads, d_out, s, p)


def _dense_ffn_ops(c: MoEModelConfig, T: float, s: Shard, p: Precision, ffn: int, prefix: str = "mlp") -> list[Op]:
    """A TP-sharded SwiGLU FFN of width ``ffn`` on ``T`` tokens (with its SP all-gather / reduce-scatter)."""
    h, tp = c.hidden_size, s.tp
    sp = s.sequence_parallel and tp > 1
    f = ffn / tp
    ops: list[Op] = []
    if sp:
        ops.append(_coll(f"{prefix}.sp_all_gather", "tp", "all_gather", T * h * p.act_bytes))
    # fc1 keeps this rank's T / tp rows under SP; the shared experts' fc1 reads the pre-MLP norm output the router
    # keeps (bf16, or as that original under FP8): nothing of its own (SAVED_SOURCE)
    fc1_saved = 0.0 if prefix == "moe.shared" else (T / tp if sp else T) * h * _saved_bytes(p)
    ops += [*_quant(f"{prefix}.input", T * h, p), replace(_gemm(f"{prefix}.fc1", T, 2 * f, h, p), saved=fc1_saved),
            _ew(f"{prefix}.swiglu", T * f, p, inputs=2, flops_per=4.0, saved=2 * T * f * p.act_bytes),
            *_quant(f"{prefix}.act", T * f, p), _gemm(f"{prefix}.fc2", T, h, f, p)]
    if sp:
        ops.append(_coll(f"{prefix}.sp_reduce_scatter", "tp", "reduce_scatter", T * h * p.act_bytes))
    elif tp > 1:
        ops.append(_coll(f"{prefix}.tp_all_reduce", "tp", "all_reduce", T * h * p.act_bytes))
    return ops


def _moe_ops(c: MoEModelConfig, T: float, s: Shard, p: Precision) -> list[Op]:
    """MoE block of one rank (Megatron's all-to-all token dispatcher).

    With sequence parallelism the router sees this rank's ``T / tp`` tokens; permuted rows
    go to their experts' ranks in the EP group (all-to-all), the local experts run as
    grouped GEMMs on the rows they got, and the combine all-to-all brings them back.
    Shared experts run on the compute stream while the dispatch is in flight (Megatron's
    ``--moe-shared-expert-overlap``). Training adds Megatron-Core's eager bookkeeping
    (:func:`_megatron_router_ops`, :func:`_megatron_dispatch_ops`): the load-balancing loss,
    the per-expert token counts, their all-gather and host copies, the routing probabilities'
    own all-to-all and the sort of received rows by local expert."""
    h, E, k = c.hidden_size, c.num_experts, c.top_k
    tp, ep, etp = s.tp, s.ep, s.etp
    sp = s.sequence_parallel and tp > 1
    tm = T / tp if sp else T  # tokens routed by this rank
    e_local = E // ep
    # uniform: each of the ep peers sends this rank's experts their share of its tm * k rows
    rows = list(s.expert_tokens) if s.expert_tokens is not None else [tm * k * ep / E] * e_local
    total = float(sum(rows))
    f = (c.expert_ffn_size or 0) / etp
    send = s.a2a_send_tokens if s.a2a_send_tokens is not None else tm * k
    train = s.q_len is None and not s.decode and s.framework_ops
    ops: list[Op] = [_norm("moe.norm", tm, h, p),
                     Op("moe.router", "gemm", 2.0 * tm * E * h, (tm * h + h * E) * p.act_bytes + tm * E * 4.0, "bf16",
                        tm, E, h, saved=tm * h * p.act_bytes),
                     *([_ew("moe.router_topk", tm * E, p, flops_per=SOFTMAX_FLOPS, cls="reduction",
                            saved=tm * E * 4.0)] if s.moe_router_fusion or not train else
                       unfused_router_ops(c, tm))]
    hyb = train and s.dispatcher == "hybridep" and ep > 1
    if train:
        ops += _megatron_router_ops(c, tm, s) + ([] if hyb else _megatron_count_ops(c, s))
    if hyb:  # HybridEP: routing-map all-gather, preprocessing, dispatch kernel, permute kernel, shared expert
        pre, post = hybridep_dispatch_ops(c, tm, total, s)
        return ops + pre + _shared_ops(c, T, s, p) + _experts_ops(c, rows, f, p.routed, s, train) + post + [
            _ew("moe.residual", tm * h, p, inputs=2 + (1 if c.num_shared_experts else 0))]
    late: list[Op] = []
    if train and s.dtoh_late:  # the host copies after the permutation, the host waiting for the last one
        late = [o for o in ops if o.name == "moe.splits_d2h"]
        ops = [o for o in ops if o.name != "moe.splits_d2h"]
        late[-1:] = [replace(late[-1], host_sync=True)] if late else []
    # the alltoall dispatcher permutes the routed rows before its all-to-all and sorts the received rows by local
    # expert after it (dispatch_postprocess: sort_chunks_by_idxs); the flex dispatcher with DeepEP sends tokens and
    # permutes the received rows once by expert (get_permuted_hidden_states_by_experts), with no sort
    deepep = train and s.dispatcher == "deepep" and ep > 1
    permute = Op("moe.permute", "moe_dispatch", 0.0, 2 * (total if deepep else tm * k) * h * p.act_bytes, "bf16")
    ops += [] if deepep else [permute]
    ops += late
    if ep > 1:
        ops.append(_coll("moe.dispatch", "ep", "all_to_all_dispatch", send * h * p.dispatch_bytes, stream="ep"))
        if train and s.dispatcher == "alltoall":  # token_dispatch: the permuted probabilities' own all-to-all
            ops.append(_coll("moe.dispatch_probs", "ep", "all_to_all_dispatch", send * 4.0, stream="ep"))
    if etp > 1:
        ops.append(_coll("moe.etp_all_gather", "etp", "all_gather", total * h * p.act_bytes, stream="ep"))
    ops += _shared_ops(c, T, s, p)
    sort = train and e_local > 1 and not deepep
    if sort:
        ops.append(Op("moe.sort_chunks", "moe_dispatch", 0.0, 2 * total * h * p.dispatch_bytes, "bf16"))
    ops += [permute] if deepep else []
    ops += _experts_ops(c, rows, f, p.routed, s, train)
    if sort:  # combine_preprocess: the inverse sort
        ops.append(Op("moe.unsort_chunks", "moe_combine", 0.0, 2 * total * h * p.act_bytes, "bf16"))
    if etp > 1:
        ops.append(_coll("moe.etp_reduce_scatter", "etp", "reduce_scatter", total * h * p.act_bytes, stream="ep"))
    # no probabilities in the unpermute (the experts' weighted activation applies them): it keeps only its row map
    # the DeepEP unpermute runs on the expert side, over the rows this rank's experts computed (skew: not tm * k)
    un = total if s.dispatcher == "deepep" else tm * k
    unpermute = Op("moe.unpermute", "moe_combine", un * h, 2 * un * h * p.act_bytes + un * 4.0, "bf16")
    combine = ([_coll("moe.combine", "ep", "all_to_all_combine", total * h * p.act_bytes, stream="ep")]
               if ep > 1 else [])
    # the alltoall dispatcher unpermutes after the combine (combine_postprocess); the flex dispatcher with DeepEP
    # before it (combine_preprocess: get_restored_hidden_states_by_experts), where early stop needs it
    ops += [unpermute, *combine] if s.dispatcher == "deepep" else [*combine, unpermute]
    ops.append(_ew("moe.residual", tm * h, p, inputs=2 + (1 if c.num_shared_experts else 0)))
    return ops


TE_PADDING_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/moe/experts.py (TEGroupedMLP.__init__: "
                     "Fp8Padding / Fp8Unpadding(num_local_experts) under fp8 or fp4; forward: quantization_padding of the "
                     "permuted hidden states and of the permuted probabilities, quantization_unpadding of fc2's output), "
                     "transformer_config.py (moe_router_padding_for_quantization = False by default; no Megatron-Bridge "
                     "v0.3.0 or r0.1.0 performance config sets it), NVIDIA/TransformerEngine v2.12 "
                     "transformer_engine/pytorch/module/fp8_padding.py (_Fp8Padding: torch.empty + "
                     "tex.fused_multi_row_padding unless every split is already aligned; backward "
                     "fused_multi_row_unpadding) and fp8_unpadding.py, quantization.py (get_align_size_for_quantization: "
                     "32 MXFP8, 16 FP8), megatron/core/transformer/moe/moe_utils.py (RandomSTE: the tables' "
                     "force-balanced routing draws random router logits, so per-expert counts vary around the mean)")
"""Why an FP8/MXFP8 training MoE layer copies its experts' rows into and out of an aligned buffer
(:func:`expert_padding_ops`)."""


def expert_padding_ops(rows: Sequence[float], h: float, p: Precision) -> list[Op]:
    """Megatron-Core's row padding around a quantized grouped MLP in training (:data:`TE_PADDING_SOURCE`): the
    permuted hidden states and their probabilities are copied into a buffer where each local expert's rows start
    at a multiple of ``p.row_align`` (``moe.experts_pad``, ``moe.experts_probs_pad``, before the input cast), and
    fc2's output is copied back without the padding rows (``moe.experts_unpad``); each backward is the inverse
    copy of the gradient (:attr:`Op.copy`). The copies happen whenever a local expert's count is not a multiple of
    the alignment, which under data-dependent (or the tables' random force-balanced) routing is every step but
    with probability ``row_align ** -experts``; cosim's uniform routing stands for those counts, so the padding is
    charged whatever the mean is, with the mean padding of a random count, ``(row_align - 1) / 2`` rows per expert.
    Bytes: one read of the unpadded rows and one write of the padded ones (hidden states in ``p.act_bytes``,
    probabilities fp32). Empty at bf16 (no alignment). Returns [pad, probs pad, unpad]."""
    if not p.row_align or not rows:
        return []
    total = float(sum(rows))
    padded = total + len(rows) * (p.row_align - 1) / 2.0
    moved = (total + padded) * h * p.act_bytes
    return [Op("moe.experts_pad", "elementwise", 0.0, moved, "bf16", copy=True),
            Op("moe.experts_probs_pad", "elementwise", 0.0, (total + padded) * 4.0, "fp32", copy=True),
            Op("moe.experts_unpad", "elementwise", 0.0, moved, "bf16", copy=True)]


def _experts_ops(c: MoEModelConfig, rows: Sequence[float], f: float, p: Precision, s: Shard, train: bool) -> list[Op]:
    """The routed experts on ``rows`` per local expert (width ``f`` after expert TP): input cast, fc1 grouped GEMM,
    activation, its cast, fc2 grouped GEMM, [fc2 biases], and in FP8/MXFP8 training with ``s.expert_padding``
    the row padding copies around them (:func:`expert_padding_ops`)."""
    h = c.hidden_size
    total = float(sum(rows))
    mean = total / max(len(rows), 1)
    # training: TE's GroupedLinear launches one GEMM per local expert (TE_GROUPED_GEMM_SOURCE), for the
    # forward and (inherited by backward_ops) for each of the dgrad and wgrad
    launches = len(rows) if train else 1
    # training: TE's split_quantize casts each local expert's rows with its own kernel(s) (TE_QUANTIZE_SOURCE);
    # backward_ops keeps loop_launches for the grad outputs' split_quantize
    qgroups = len(rows) if train else 1
    # HybridEP pads each expert's rows inside its dispatch (hybrid_ep_dispatch pad_multiple): no padding copies
    pad = expert_padding_ops(rows, h, p) if train and s.expert_padding and s.dispatcher != "hybridep" else []
    group_rows = tuple(float(r) for r in rows)  # each expert's rows: the kernel model tiles every group
    return [*pad[:2], *_quant("moe.experts_input", total * h, p, qgroups),
            replace(_gemm("moe.experts_fc1", mean, 2 * f, h, p, batch=len(rows), cls="grouped_gemm"),
                    launches=launches, bias=c.linear_bias, group_rows=group_rows),
            *expert_activation_ops(c, total, f, p, train),
            *_quant("moe.experts_act", total * f, p, qgroups),
            replace(_gemm("moe.experts_fc2", mean, h, f, p, batch=len(rows), cls="grouped_gemm"),
                    launches=launches, group_rows=group_rows),
            *expert_bias_ops(c, rows, h, p, s.q_len is None and not s.decode), *pad[2:]]


HYBRIDEP_DISPATCH_SOURCE = (
    "NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/moe/token_dispatcher.py (_HybridEPManager: "
    "num_permuted_tokens None when dropless -> hybrid_ep_dispatch blocks; MoEFlexTokenDispatcher: no permute, "
    "sort or count ops of its own), fused_a2a.py (HybridEPDispatch / HybridEPCombine and their backwards: "
    "combine_with_unpermute with the probabilities' gradients, dispatch_with_permute with the handle), "
    "transformer_config.py (moe_hybridep_num_sms 16); deepseek-ai/DeepEP hybrid-ep @eb9cee7 "
    "(cosim.engine.moe_comm.HYBRIDEP_SOURCE)")
"""Where :func:`hybridep_dispatch_ops` comes from."""


def hybridep_rows_received(c: MoEModelConfig, tm: float, ep: int) -> float:
    """Token rows a rank receives in a HybridEP dispatch under uniform routing: every EP peer sends each of its
    ``tm`` tokens once to each rank holding one of its top-k experts (its own included),
    ``ep x tm x P(some of the k experts on the rank)``."""
    E, k, el = c.num_experts, min(c.top_k, c.num_experts), c.num_experts // ep
    p_rank = 1.0 - math.comb(E - el, k) / math.comb(E, k) if el < E else 1.0
    return ep * tm * p_rank


def hybridep_dispatch_ops(c: MoEModelConfig, tm: float, total: float, s: Shard) -> tuple[list[Op], list[Op]]:
    """Megatron-Core's flex dispatcher with HybridEP in training (:data:`HYBRIDEP_DISPATCH_SOURCE`), dropless:
    (before the experts) ``dispatch_with_permute``: the bool routing map [tm, E] all-gathered over EP through
    ``torch.distributed.all_gather_into_tensor`` (a c10d call), the metadata preprocessing kernel (reads the
    gathered map), the permute preprocessing kernel (row map, tokens per expert into pinned memory) after which
    the host blocks (``cudaStreamSynchronize``: the count sizes the output), the dispatch kernel (each token once to
    every rank holding one of its experts, BF16 + the fp32 probability row, :func:`cosim.engine.moe_comm.hybridep`)
    and the permute kernel (received rows -> one row per (token, local expert), grouped by expert); (after) the
    unpermute kernel (expert rows -> one row per received token, summed) and the combine kernel (BF16, reduced
    over the top-k at the source). One Python call each; the kernels after the first are launched from C++
    (``launches=0``). The backward (``backward_ops``) runs combine_with_unpermute for the dispatch and
    dispatch_with_permute with the handle for the combine: no all-gather, preprocessing or sync."""
    h, E = c.hidden_size, c.num_experts
    recv = hybridep_rows_received(c, tm, s.ep)
    rows_b, pb = 2.0 * h, 4.0 * E  # BF16 row; the fp32 probabilities of the (one-domain) EP group's experts
    pre = [Op("moe.hybridep_routing_all_gather", "collective", 0.0, tm * E * s.ep,
              comm=Comm("ep", "all_gather", tm * E * s.ep), stream="ep", no_grad=True),
           replace(_tiny("moe.hybridep_preprocess", tm * E * s.ep, nbytes=0.5, no_grad=True, cls="reduction"),
                   launches=0),
           replace(_tiny("moe.hybridep_permute_preprocess", recv * E / s.ep, nbytes=2.5, no_grad=True,
                         cls="reduction"), launches=0, host_sync=True),
           replace(_coll("moe.dispatch", "ep", "all_to_all_dispatch", tm * c.top_k * rows_b, stream="ep"),
                   launches=0, bwd_launches=0, c10d=False),
           Op("moe.hybridep_permute", "moe_dispatch", 0.0, recv * (rows_b + pb) + total * (rows_b + 4.0), "bf16",
              launches=0, copy=True, bwd_launches=1)]
    # backward order: combine's transpose starts its call (launched), the unpermute's follows from C++; the
    # permute's transpose starts combine_with_unpermute, the dispatch kernel follows
    post = [Op("moe.hybridep_unpermute", "moe_combine", 0.0, total * rows_b + recv * rows_b, "bf16", copy=True,
               bwd_launches=0),
            replace(_coll("moe.combine", "ep", "all_to_all_combine", total * rows_b, stream="ep"), launches=0,
                    bwd_launches=1, c10d=False)]
    return pre, post


GPT_OSS_ACTIVATION_SOURCE = (
    "NVIDIA/Megatron-LM core_v0.16.0 (NeMo 26.02): megatron/core/transformer/moe/experts.py (TEGroupedMLP: "
    "linear_fc1 with skip_bias_add=False, linear_fc2 with skip_bias_add=True; forward: bias_act_func under "
    "bias_activation_fusion -> weighted_bias_quick_geglu_impl, the moe_act CheckpointWithoutOutput around it, "
    "_apply_bias: per local expert t + b * p over torch.split, then torch.cat), megatron/core/fusions/"
    "fused_bias_geglu.py (weighted_bias_quick_geglu_impl: with clamp_value, input.chunk(2), x_glu.clamp(max), "
    "x_linear.clamp(-v, v), torch.cat, then the jit_fuser (torch.compile) weighted quick-GEGLU), "
    "megatron/core/fusions/fused_bias_dropout.py (bias_dropout_add unfused: x + bias, dropout p=0, residual); "
    "NVIDIA-NeMo/Megatron-Bridge v0.3.0 src/megatron/bridge/models/gpt_oss/gpt_oss_provider.py (add_bias_linear "
    "True, activation_func quick_gelu, glu_linear_offset 1.0, bias_activation_fusion True, bias_dropout_fusion "
    "False, activation_func_clamp_value 7.0); NVIDIA/TransformerEngine v2.12 pytorch/module/grouped_linear.py "
    "(BF16 backward: the fc1 bias gradient is fused with the wgrad GEMM)")
"""Where :func:`expert_activation_ops` and :func:`bias_ops` / :func:`expert_bias_ops` come from."""

GPT_OSS_BACKWARD_SOURCE = (
    "PyTorch autograd derivatives (tools/autograd/derivatives.yaml): add.Tensor (the gradient to both inputs; a "
    "broadcast input's summed to its size: sum_to_size), mul.Tensor (grad * other, grad * self, each summed to "
    "its input's size), clamp (where(mask, grad, 0) over grad and the input), cat (narrow: views), chunk / "
    "split_with_sizes (their backward cats the pieces' gradients: a new tensor); applied to Megatron-LM "
    "core_v0.16.0 fused_bias_geglu.py (chunk, two clamps, cat), experts.py TEGroupedMLP._apply_bias "
    "(split, t + b * p, cat) and fused_bias_dropout.py (x + bias)")
"""Where the backward kernels of gpt-oss's eager ops (:attr:`Op.bwd_bytes`) come from."""


def expert_activation_ops(c: MoEModelConfig, rows: float, f: float, p: Precision, train: bool = True) -> list[Op]:
    """The routed experts' gated activation over ``rows`` expert-token rows of width ``2 f`` -> ``f``.

    Plain SwiGLU: one fused kernel (``moe.experts_swiglu``: reads both halves, writes ``f``). A clamped
    activation (card ``activation_clamp``, gpt-oss's ``swiglu_limit``) first runs Megatron-Core's eager clamp
    prologue of ``weighted_bias_quick_geglu_impl`` (:data:`GPT_OSS_ACTIVATION_SOURCE`): the gate half clamped
    above, the linear half clamped to +-limit (each reads and writes ``rows x f``), and ``torch.cat`` of the two
    (reads and writes ``rows x 2f``), the linear offset's blocking host-to-device copy (``torch.tensor`` of a
    Python float on the GPU: the host waits for the GPU, :attr:`Op.host_sync`; training only), then the same
    fused kernel. All of them sit inside the ``moe_act`` recompute checkpoint (:func:`recomputed`); their
    backward follows :func:`backward_ops` (a clamp's backward reads the gradient and its input and writes the
    gradient, the cat's is the chunk gradients' concatenation)."""
    act = _ew("moe.experts_swiglu", rows * f, p, inputs=2, flops_per=4.0, saved=2 * rows * f * p.act_bytes)
    if c.activation_clamp is None:
        return [act]
    # saved without recompute: the clamps keep fc1's output (both halves, one tensor), the fused kernel its input
    u = rows * f * p.act_bytes  # one half of fc1's output
    # backward (GPT_OSS_BACKWARD_SOURCE): each clamp's reads the gradient and its input and writes one (3u); the
    # cat's gradient is two views; chunk's backward concatenates the halves' gradients (4u), after clamp_glu's
    # the clamps read torch.chunk halves of fc1's output (strided views); the cat is a batched copy
    return [replace(_ew("moe.experts_act_clamp_glu", rows * f, p, saved=2 * u, pattern="strided"),
                    bwd_bytes=3 * u + 4 * u, bwd_launches=2),
            replace(_ew("moe.experts_act_clamp_linear", rows * f, p, pattern="strided"), bwd_bytes=3 * u),
            replace(_ew("moe.experts_act_cat", 2 * rows * f, p, flops_per=0.0, pattern="batched_copy"), bwd_bytes=0.0,
                    bwd_launches=0),
            # weighted_bias_quick_geglu_impl: torch.tensor(linear_offset, device=input.device), a blocking copy
            *([replace(_tiny("moe.experts_act_offset_h2d", 1, nbytes=2.0, no_grad=True), host_sync=True)]
              if train else []), act]


def bias_ops(c: MoEModelConfig, name: str, numel: float, p: Precision, train: bool = True) -> list[Op]:
    """An eager bias add over ``numel`` elements (card ``linear_bias``, training): Megatron-Core returns the
    attention output projection's bias (``skip_bias_add``) and, with gpt-oss's ``bias_dropout_fusion False``,
    adds it in the unfused bias-dropout-add (``x + bias``; dropout at p = 0 launches nothing) before the residual
    add (:data:`GPT_OSS_ACTIVATION_SOURCE`). Biases of linears that keep ``skip_bias_add=False`` ride in the GEMM
    epilogue (and, in BF16, their gradient in the wgrad GEMM's): no op."""
    if not (c.linear_bias and train):
        return []
    # backward (GPT_OSS_BACKWARD_SOURCE): x's gradient passes on; the bias's is one reduction of the gradient
    return [replace(_ew(name, numel, p), bias=True, bwd_bytes=numel * p.act_bytes)]


def expert_bias_ops(c: MoEModelConfig, rows: Sequence[float], h: float, p: Precision, train: bool) -> list[Op]:
    """The routed experts' fc2 bias (card ``linear_bias``, training), Megatron-Core's ``TEGroupedMLP._apply_bias``
    (:data:`GPT_OSS_ACTIVATION_SOURCE`): per local expert ``e``, ``b_e * p`` (the bias scaled by each row's routing
    probability: writes ``rows_e x h``; the probabilities are bf16, the router's logits dtype, as no gpt-oss
    config sets ``moe_router_dtype`` and TE's fused top-k allocates them in the logits dtype,
    transformer_engine/pytorch/csrc/extensions/router.cpp v2.12) and ``t_e + b_e * p`` (reads two, writes one), each its own eager kernel
    from a Python loop, then ``torch.cat`` of the experts' outputs (reads and writes ``rows x h``). Backward
    (:func:`backward_ops`): the sum's gradient, the bias and probability gradients of the product (a product and
    a reduction each) and the cat's split."""
    if not (c.linear_bias and train):
        return []
    ops: list[Op] = []
    for e, n in enumerate(rows):
        # backward (GPT_OSS_BACKWARD_SOURCE): the sum passes its gradient g on to both terms; the product's gives
        # the bias g * p then a sum over rows, the probabilities g * b then a sum over h: four kernels, 6 units
        ops += [Op(f"moe.experts_fc2_bias_scale.{e}", "elementwise", n * h, (n * h + n + h) * p.act_bytes, "bf16",
                   bias=True, bwd_bytes=(6 * n * h + 2 * n + h) * p.act_bytes, bwd_launches=4),
                replace(_ew(f"moe.experts_fc2_bias_add.{e}", n * h, p, inputs=2), bwd_bytes=0.0, bwd_launches=0)]
    total = float(sum(rows))
    # backward: the cat's gradients are views; the two torch.split's backwards concatenate the experts' output
    # and probability gradients (two kernels)
    ops.append(replace(_ew("moe.experts_fc2_bias_cat", total * h, p, flops_per=0.0, pattern="batched_copy"),
                       bwd_bytes=2 * (total * h + total) * p.act_bytes, bwd_launches=2))
    return ops


TE_GROUPED_GEMM_SOURCE = ("NVIDIA/TransformerEngine transformer_engine/common/gemm/cublaslt_gemm.cu "
                          "(multi_stream_cublas_gemm: one cuBLASLt GEMM per group, round-robin over the compute "
                          "streams; nvte_multi_tensor_gemm takes it unless NVTE_USE_CUTLASS_GROUPED_GEMM on Hopper "
                          "BF16), used by te.pytorch.GroupedLinear (Megatron-Core TEGroupedMLP)")
"""Why a training grouped GEMM is ``launches`` = local experts kernels (:attr:`Op.launches`)."""

MEGATRON_SOURCE = ("NVIDIA/Megatron-LM megatron/core/transformer/moe/router.py (TopKRouter.routing, _apply_aux_loss), "
                   "moe_utils.py (compute_routing_scores_for_aux_loss, switch_load_balancing_loss_func, "
                   "save_to_aux_losses_tracker), token_dispatcher.py (MoEAlltoAllTokenDispatcher.preprocess, "
                   "_maybe_dtoh_and_synchronize, token_dispatch, dispatch_postprocess, combine_preprocess)")
"""Where the eager training ops of :func:`_megatron_router_ops` and :func:`_megatron_count_ops` come from."""


def _tiny(name: str, numel: float, *, flops_per: float = 1.0, nbytes: float = 4.0, no_grad: bool = False,
          cls: str = "elementwise") -> Op:
    """A small eager kernel over ``numel`` elements of ``nbytes`` bytes (fp32 router tensors, int64 counts)."""
    return Op(name, cls, numel * flops_per, 2.0 * numel * nbytes, "fp32", no_grad=no_grad)


def _megatron_router_ops(c: MoEModelConfig, tm: float, s: Shard) -> list[Op]:
    """The load-balancing loss of Megatron-Core's TopKRouter in training (when the card has one):
    scores for the loss (softmax or sigmoid over the experts, their top-k mask), the tokens per
    expert (sum over tokens, all-reduced over TP x CP when sharded), the Switch loss (probabilities
    summed over tokens, times the counts, summed, scaled), and its logging into the aux-loss
    tracker (divide by the coefficient, accumulate): :data:`MEGATRON_SOURCE`."""
    if c.aux_loss_coef <= 0:
        return []
    E = c.num_experts
    ops = [_tiny("moe.aux_scores", tm * E, flops_per=SOFTMAX_FLOPS, cls="reduction")]
    if s.moe_router_fusion:  # unfused: the loss takes the routing map's counts (unfused_router_ops)
        ops += [_tiny("moe.aux_topk_mask", tm * E, no_grad=True, cls="reduction"),
                _tiny("moe.aux_tokens_per_expert", tm * E, no_grad=True, cls="reduction")]
    if s.tp * s.cp > 1:
        ops.append(Op("moe.aux_counts_all_reduce", "collective", 0.0, E * 8.0, comm=Comm("tp", "all_reduce", E * 8.0),
                      stream="tp", no_grad=True))
    ops += [_tiny("moe.aux_probs_sum", tm * E, cls="reduction"), _tiny("moe.aux_loss_mul", E),
            _tiny("moe.aux_loss_sum", E, cls="reduction"), _tiny("moe.aux_loss_scale", 1),
            _tiny("moe.aux_loss_log_div", 1, no_grad=True), _tiny("moe.aux_loss_log_add", 1, no_grad=True)]
    return ops


ROUTER_UNFUSED_SOURCE = (
    "NVIDIA/Megatron-LM at 1e057005 (the commit the ModelZoo Qwen3-235B table names; moe_router_fusion arrived in "
    "c08d89be, 2025-08-17, so every run of that commit routes unfused) megatron/core/transformer/moe/router.py "
    "(TopKRouter.aux_loss_load_balancing: topk_softmax_with_capacity, then compute_routing_scores_for_aux_loss: "
    "the softmax over all experts, no top-k mask of its own; the loss takes topk_softmax_with_capacity's "
    "tokens_per_expert) and moe_utils.py (topk_softmax_with_capacity, capacity_factor None, use_pre_softmax False: "
    "torch.topk of the logits, torch.softmax of the k scores in fp32 and type_as(logits); sigmoid: "
    "torch.sigmoid, the expert bias added for the choice, torch.topk, torch.gather, the sum and division; then "
    "torch.zeros_like(logits).scatter(1, top_indices, probs), torch.zeros_like(logits).int().scatter(1, "
    "top_indices, 1).bool() and topk_map.sum(dim=0)); PyTorch aten: out-of-place scatter is a clone and an "
    "in-place scatter_, topk's backward scatters the gradient into zeros (value_selecting_reduction_backward), "
    "scatter's backward to its source gathers the gradient, gather's scatters it into zeros")
"""Which eager kernels Megatron-Core runs for the router's score function and top-k without ``moe_router_fusion``
(:func:`unfused_router_ops`)."""


def unfused_router_ops(c: MoEModelConfig, tm: float) -> list[Op]:
    """Megatron-Core's unfused dropless top-k routing over this rank's ``tm`` tokens x ``E`` experts
    (:data:`ROUTER_UNFUSED_SOURCE`), kernel by kernel, on the router GEMM's fp32 logits (``moe.router``: 4 B, so the
    ``type_as`` casts launch nothing). With ``k`` = top-k and 8 B int64 indices, bytes forward / backward:
    softmax router: the top-k (read ``tm*E*4``, write ``tm*k*12``; backward: zeros ``tm*E*4`` and a scatter of the
    gradient ``tm*k*16``) and the softmax of the k scores (``tm*k*8``; backward ``tm*k*12``); sigmoid router: the
    sigmoid (``tm*E*8``, backward ``tm*E*12``), the expert bias added (``tm*E*8``; taken as set, as DeepSeek-V3's
    ``moe_router_enable_expert_bias`` runs set it: without it the top-k takes the gradient), the top-k (no gradient), the
    gather of the chosen scores (``tm*k*16``; backward zeros and a scatter), their sum and the division
    (``tm*k*4 + tm*4`` and ``tm*k*12``). Then the probabilities' dense map (an out-of-place scatter: a clone,
    launched from the scatter call's C++, ``launches`` 0, and the ``scatter_``): zeros, clone and scatter (``tm*E*12 +
    tm*k*16``; backward a gather ``tm*k*16``); the routing map: zeros, the int cast, clone and scatter, the bool
    cast (``tm*E*25 + tm*k*12``, no gradient), and its sum over tokens (``tm*E`` read, ``E*8`` written)."""
    E, k = float(c.num_experts), float(min(c.top_k, c.num_experts))
    nE, nk = tm * E, tm * k
    grad_into_zeros = nE * 4.0 + nk * 16.0  # zeros + scatter of a gathered gradient back to the dense shape
    if c.router == "sigmoid":
        score = [Op("moe.router_topk.sigmoid", "elementwise", nE, 8.0 * nE, "fp32", saved=4.0 * nE,
                    bwd_bytes=12.0 * nE),
                 Op("moe.router_topk.bias_add", "elementwise", nE, 8.0 * nE + 4.0 * E, "fp32", no_grad=True),
                 Op("moe.router_topk.topk", "reduction", nE, 4.0 * nE + 12.0 * nk, "fp32", no_grad=True),
                 Op("moe.router_topk.gather", "elementwise", 0.0, 16.0 * nk, "fp32", bwd_bytes=grad_into_zeros,
                    bwd_launches=2),
                 Op("moe.router_topk.sum", "reduction", nk, 4.0 * nk + 4.0 * tm, "fp32"),
                 Op("moe.router_topk.div", "elementwise", nk, 12.0 * nk, "fp32", saved=4.0 * nk)]
    else:
        score = [Op("moe.router_topk.topk", "reduction", nE, 4.0 * nE + 12.0 * nk, "fp32", saved=8.0 * nk,
                    bwd_bytes=grad_into_zeros, bwd_launches=2),
                 Op("moe.router_topk.softmax", "reduction", nk * SOFTMAX_FLOPS, 8.0 * nk, "fp32", saved=4.0 * nk,
                    bwd_bytes=12.0 * nk)]
    return [
        *score,
        Op("moe.router_topk.probs_zeros", "elementwise", 0.0, 4.0 * nE, "fp32", no_grad=True),
        Op("moe.router_topk.probs_clone", "elementwise", 0.0, 8.0 * nE, "fp32", launches=0, no_grad=True),
        Op("moe.router_topk.probs_scatter", "elementwise", 0.0, 16.0 * nk, "fp32", bwd_bytes=16.0 * nk),
        Op("moe.router_topk.map_zeros", "elementwise", 0.0, 4.0 * nE, "fp32", no_grad=True),
        Op("moe.router_topk.map_int", "elementwise", 0.0, 8.0 * nE, "fp32", no_grad=True),
        Op("moe.router_topk.map_clone", "elementwise", 0.0, 8.0 * nE, "fp32", launches=0, no_grad=True),
        Op("moe.router_topk.map_scatter", "elementwise", 0.0, 12.0 * nk, "fp32", no_grad=True),
        Op("moe.router_topk.map_bool", "elementwise", 0.0, 5.0 * nE, "fp32", no_grad=True),
        Op("moe.router_topk.tokens_per_expert", "reduction", nE, nE + 8.0 * E, "fp32", no_grad=True)]


def _megatron_count_ops(c: MoEModelConfig, s: Shard) -> list[Op]:
    """Megatron-Core's all-to-all dispatcher ``preprocess`` (dropless): tokens per expert (sum of
    the routing map, cast to int64), the send splits per EP rank, the counts all-gathered over the
    TP x EP group (the EP group here), sliced to the local experts and summed into the receive
    splits, then copied to the host (tokens per expert and the input, output and TP splits,
    ``_maybe_dtoh_and_synchronize``) where the host waits for them before the all-to-all
    (``moe.splits_d2h``; the synchronization itself is :class:`cosim.workload.synth.build.BuildOptions`
    ``moe_host_sync``). Without EP and TP: the counts and one host copy."""
    E, e_local = c.num_experts, c.num_experts // s.ep
    ops = [_tiny("moe.tokens_per_expert", E, nbytes=8.0, no_grad=True, cls="reduction"),
           _tiny("moe.tokens_per_expert_cast", E, nbytes=8.0, no_grad=True)]
    copies = 1
    if s.ep > 1 or s.tp > 1:
        ops += [_tiny("moe.input_splits", E, nbytes=8.0, no_grad=True, cls="reduction")]
        if s.ep > 1 and s.dispatcher == "alltoall":
            ops.append(Op("moe.counts_all_gather", "collective", 0.0, E * 8.0 * s.ep,
                          comm=Comm("ep", "all_gather", E * 8.0 * s.ep), stream="ep", no_grad=True))
        ops += [_tiny("moe.local_counts_slice", s.ep * s.tp * e_local, nbytes=8.0, no_grad=True),
                _tiny("moe.output_splits", s.ep * s.tp * e_local, nbytes=8.0, no_grad=True, cls="reduction"),
                _tiny("moe.output_splits_tp", s.ep * s.tp, nbytes=8.0, no_grad=True, cls="reduction"),
                _tiny("moe.local_tokens_per_expert", s.ep * s.tp * e_local, nbytes=8.0, no_grad=True,
                      cls="reduction")]
        copies = 4
    ops += [_tiny("moe.splits_d2h", E, nbytes=8.0, no_grad=True) for _ in range(copies)]
    return ops


def _shared_ops(c: MoEModelConfig, T: float, s: Shard, p: Precision) -> list[Op]:
    """The shared experts' ops (``moe.shared.*``: one dense FFN of all of them side by side); none without any."""
    if not c.num_shared_experts:
        return []
    width = (c.shared_expert_ffn_size or c.expert_ffn_size or 0) * c.num_shared_experts
    return _dense_ffn_ops(c, T, s, p, width, prefix="moe.shared")


def layer_ops(card: MoEModelConfig, layer: int, tokens: float, seq: float, shard: Shard | None = None,
              precision: Precision | str = "bf16") -> list[Op]:
    """Forward ops of transformer layer ``layer`` (0-based) on one rank.

    ``tokens``: tokens of the micro-batch on this rank's TP group (``micro * seq / cp``);
    ``seq``: the full sequence length (causal attention over it)."""
    s = shard or Shard()
    p = PRECISIONS[precision] if isinstance(precision, str) else precision
    ops = _attention_ops(card, tokens, seq, s, p, card.window(layer))
    if layer < card.dense_layers:
        sp = s.sequence_parallel and s.tp > 1
        ops.append(_norm("mlp.norm", tokens / s.tp if sp else tokens, card.hidden_size, p))
        ops += _dense_ffn_ops(card, tokens, s, p, card.dense_ffn_size or 0)
        ops.append(_ew("mlp.residual", (tokens / s.tp if sp else tokens) * card.hidden_size, p, inputs=2))
    else:
        ops += _moe_ops(card, tokens, s, p)
    return ops


def embedding_ops(card: MoEModelConfig, tokens: float, shard: Shard | None = None,
                  precision: Precision | str = "bf16") -> list[Op]:
    """Input embedding of the first pipeline stage (vocabulary-parallel lookup, then its TP reduction)."""
    s = shard or Shard()
    p = PRECISIONS[precision] if isinstance(precision, str) else precision
    h = card.hidden_size
    ops = [Op("embed.lookup", "elementwise", 0.0, 2 * tokens * h * p.act_bytes + tokens * 8.0, "bf16")]
    if s.tp > 1:
        kind = "reduce_scatter" if s.sequence_parallel else "all_reduce"
        ops.append(_coll(f"embed.tp_{kind}", "tp", kind, tokens * h * p.act_bytes))
    return ops


CE_UNFUSED_SOURCE = ("NVIDIA/Megatron-LM at 1e057005 (the commit the ModelZoo Qwen3-235B table names for its rows, "
                     "'main(1e057005)'; the same kernels at d98e8a6) "
                     "megatron/core/tensor_parallel/cross_entropy.py (VocabParallelCrossEntropy: "
                     "calculate_logits_max casts the bf16 logits to fp32 and takes their max; "
                     "calculate_predicted_logits subtracts the max in place, exponentiates in place "
                     "(torch.exp(out=)) and sums; calculate_cross_entropy_loss divides in place (exp_logits.div_), "
                     "the fp32 softmax saved; backward calculate_gradients multiplies it in place by the output "
                     "gradient, returned in fp32 for the bf16 logits, which autograd casts back to bf16) and "
                     "megatron/core/models/common/language_module/language_module.py (compute_language_model_loss: "
                     "that path unless TransformerConfig.cross_entropy_loss_fusion, whose default is False in "
                     "megatron/core/model_parallel_config.py, TransformerConfig's base class)")
"""Why Megatron-Core's unfused loss is six forward kernels over the logits (52 bytes per logit element, forward and
backward, against the fused op's 24): :func:`unfused_cross_entropy_ops`."""


def unfused_cross_entropy_ops(tokens: float, vocab: float) -> list[Op]:
    """Megatron-Core's unfused vocabulary-parallel cross-entropy (:data:`CE_UNFUSED_SOURCE`) over ``tokens`` x
    ``vocab`` logits of this rank, kernel by kernel (bytes per logit element): the fp32 cast (read 2, write 4), the
    max (read 4), the in-place subtraction, exponential and division (read and write 4 each) and the sum (read 4);
    backward the in-place scaling of the saved fp32 softmax (read and write 4, on the division's backward) and the
    cast of that fp32 gradient to bf16 (read 4, write 2, on the cast's). The target gathers and the per-token loss
    are per token, not per logit: left out. The TP all-reduces follow in :func:`head_ops`."""
    n = tokens * vocab
    return [Op("head.cross_entropy.float", "elementwise", 0.0, 6.0 * n, "fp32", bwd_bytes=6.0 * n),
            Op("head.cross_entropy.max", "reduction", n, 4.0 * n, "fp32", no_grad=True),
            Op("head.cross_entropy.sub_max", "elementwise", n, 8.0 * n, "fp32", no_grad=True),
            Op("head.cross_entropy.exp", "elementwise", n, 8.0 * n, "fp32", no_grad=True),
            Op("head.cross_entropy.sum_exp", "reduction", n, 4.0 * n, "fp32", no_grad=True),
            Op("head.cross_entropy.softmax", "elementwise", n, 8.0 * n, "fp32", saved=4.0 * n, bwd_bytes=8.0 * n)]


def head_ops(card: MoEModelConfig, tokens: float, shard: Shard | None = None,
             precision: Precision | str = "bf16", cross_entropy_fusion: bool = True) -> list[Op]:
    """Final norm, LM head (vocabulary-parallel) and cross-entropy loss of the last stage. ``cross_entropy_fusion``
    (Megatron-Core's ``cross_entropy_loss_fusion``): the loss as one fused op (reads and writes the fp32 logits once
    forward, twice backward); False: Megatron-Core's unfused kernels (:func:`unfused_cross_entropy_ops`)."""
    s = shard or Shard()
    p = PRECISIONS[precision] if isinstance(precision, str) else precision
    h, V = card.hidden_size, card.vocab_size / s.tp
    sp = s.sequence_parallel and s.tp > 1
    ops = [_norm("head.norm", tokens / s.tp if sp else tokens, h, p)]
    if sp:
        ops.append(_coll("head.sp_all_gather", "tp", "all_gather", tokens * h * p.act_bytes))
    ops.append(replace(_gemm("head.lm_head", tokens, V, h, Precision("bf16", "bf16", 2.0)),
                       saved=(tokens / s.tp if sp else tokens) * h * 2.0))  # SP: the local input, re-gathered
    if cross_entropy_fusion:
        ops.append(Op("head.cross_entropy", "reduction", tokens * V * SOFTMAX_FLOPS, tokens * V * 4.0 * 2, "bf16",
                      saved=tokens * V * 4.0))
    else:
        ops += unfused_cross_entropy_ops(tokens, V)
    if s.tp > 1:
        ops.append(_coll("head.tp_loss_all_reduce", "tp", "all_reduce", tokens * 4.0 * 3))
    return ops


def sample_head_ops(card: MoEModelConfig, rows: float, shard: Shard | None = None,
                    precision: Precision | str = "bf16") -> list[Op]:
    """Inference head of the last stage: final norm, LM head (vocabulary-parallel, bf16) on the
    ``rows`` positions that emit a token (the last of each prefill chunk's sequence, every decode
    request), the logits gathered over TP, and sampling (a softmax/top-k pass over the vocabulary)."""
    s = shard or Shard()
    p = PRECISIONS[precision] if isinstance(precision, str) else precision
    h, V = card.hidden_size, card.vocab_size / s.tp
    ops = [_norm("head.norm", rows, h, p), _gemm("head.lm_head", rows, V, h, PRECISIONS["bf16"], save_input=False)]
    if s.tp > 1:
        ops.append(_coll("head.tp_logits_all_gather", "tp", "all_gather", rows * V * s.tp * 4.0))
    ops.append(Op("head.sample", "reduction", rows * V * s.tp * SOFTMAX_FLOPS, rows * V * s.tp * 4.0, "bf16"))
    return ops


_BWD_COLL = {"all_gather": "reduce_scatter", "reduce_scatter": "all_gather", "all_reduce": "all_reduce",
             "all_to_all_dispatch": "all_to_all_combine", "all_to_all_combine": "all_to_all_dispatch"}


RECOMPUTE_MODULES: dict[str, str] = {
    "core_attn": "attn.core (the attention kernel)",
    "mla_up_proj": "attn.q_up, attn.kv_up, their input casts and attn.rope (MLA up-projections and RoPE)",
    "layernorm": "attn.norm, mlp.norm, moe.norm",
    "mlp": "every mlp.* op but the residual (the dense MLP, its TP collectives included)",
    "moe_act": "moe.experts_swiglu, its clamp prologue (moe.experts_act_*) and its output cast (the routed "
               "experts' activation)",
    "shared_experts": "every moe.shared.* op",
    "moe": "every moe.* op but the norm and the residual (the MoE layer: router, dispatch, experts, combine)",
}
"""Megatron-Core's ``recompute_modules`` (megatron/core/transformer/transformer_config.py) and the ops of
:func:`layer_ops` each re-runs under ``recompute: selective``."""


EARLY_STOP_SOURCE = (
    "pytorch/pytorch torch/utils/checkpoint.py (checkpoint(use_reentrant=False, early_stop=True): the recomputation "
    "'stops as soon as all needed intermediate activations have been recomputed': _recomputation_hook's pack hook "
    "raises _StopRecomputationError once recomp_counter equals the saved tensors of the original forward; "
    "reentrant checkpoint 'always recomputes function in its entirety'), torch/distributed/algorithms/_checkpoint/"
    "checkpoint_wrapper.py (checkpoint_wrapper: CheckpointImpl.NO_REENTRANT by default), NVIDIA-NeMo/Automodel "
    "@01926a5c nemo_automodel/components/moe/parallelizer.py (apply_ac: ptd_checkpoint_wrapper(block, "
    "preserve_rng_state=True) around every block), layers.py (GroupedExpertsDeepEP.forward: dispatch, gmm, "
    "activation, gmm, token_unpermutation = unpermute then fused combine; MoE.forward: y + z; Block.forward: "
    "x + mlp_out), megatron/fused_a2a.py (FusedCombine keeps only ctx.handle / ctx.group: no saved tensor), and "
    "NVIDIA/Megatron-LM core_v0.16.0 tensor_parallel/random.py (CheckpointFunction.backward re-runs "
    "ctx.run_function whole: Megatron-Core's full recomputation, method uniform or block)")
"""Why a recomputation with early stop skips the layer's trailing combine and residual add (:func:`early_stop_end`)."""


def early_stop_end(ops: Sequence[Op]) -> int:
    """How many leading ops of a layer's forward ``ops`` PyTorch's non-reentrant checkpoint re-runs with early
    stop (:data:`EARLY_STOP_SOURCE`): every op up to and including the last one that saves a tensor for the
    backward. Ops that save none: collectives (c10d and DeepEP autograd functions keep split sizes or the
    DeepEP handle on ``ctx``, not in ``save_for_backward``), residual adds (``add`` saves nothing) and ops
    without a gradient. Megatron-Core's reentrant checkpoint re-runs all ``len(ops)``."""
    end = len(ops)
    while end > 0 and (ops[end - 1].cls == "collective" or ops[end - 1].name.endswith(".residual")
                       or ops[end - 1].no_grad):
        end -= 1
    return end


def recomputed(name: str, modules: Sequence[str]) -> bool:
    """True when forward op ``name`` belongs to one of the selectively recomputed ``modules``."""
    for m in modules:
        if ((m == "core_attn" and name == "attn.core")
                or (m == "mla_up_proj" and name in ("attn.q_up", "attn.kv_up", "attn.rope", "attn.q_latent.quantize",
                                                    "attn.kv_latent.quantize", "attn.q_latent_all_gather",
                                                    "attn.kv_latent_all_gather"))  # SP: the up projections re-gather
                or (m == "layernorm" and name in ("attn.norm", "mlp.norm", "moe.norm"))
                or (m == "mlp" and name.startswith("mlp.") and name != "mlp.residual")
                or (m == "moe_act" and (name in ("moe.experts_swiglu", "moe.experts_act.quantize")
                                        or name.startswith("moe.experts_act_")))
                or (m == "shared_experts" and name.startswith("moe.shared."))
                or (m == "moe" and name.startswith("moe.") and name not in ("moe.norm", "moe.residual"))):
            return True
    return False


CUDA_GRAPH_SOURCE = (
    "NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/transformer_layer.py (_get_submodules_under_cudagraphs: "
    "attn -> input_layernorm, self_attention; moe_router -> pre_mlp_layernorm, router, and the shared experts "
    "when not overlapped; _te_cuda_graph_capture: attention then the MoE layer's early-returning partial forward, "
    "one graphed callable per layer), moe/moe_layer.py (route, preprocess: token_dispatcher.dispatch_preprocess, "
    "MoECudaGraphPartialCaptureSignal), moe/token_dispatcher.py (MoEAlltoAllTokenDispatcher: cuda_dtoh_point "
    "before_ep_alltoall when moe_preprocess is graphed), transformer_config.py (moe_preprocess needs "
    "moe_router), and NVIDIA/TransformerEngine pytorch/graph.py (make_graphed_callables: one forward and one "
    "backward graph per callable and micro-batch, each replayed with one cudaGraphLaunch)")
"""Where :func:`graph_scoped` comes from."""

_PREPROCESS_ALLTOALL = ("moe.tokens_per_expert", "moe.tokens_per_expert_cast", "moe.input_splits",
                        "moe.counts_all_gather", "moe.local_counts_slice", "moe.output_splits",
                        "moe.output_splits_tp", "moe.local_tokens_per_expert", "moe.permute")


def graph_scoped(name: str, scopes: Sequence[str], dispatcher: str = "alltoall") -> bool:
    """True when op ``name`` (forward, backward or recomputed) runs inside a Transformer Engine CUDA graph of
    ``scopes`` (:data:`CUDA_GRAPH_SOURCE`): ``attn`` the attention block (``attn.*``), ``moe_router`` the pre-MLP
    norm, the router and its load-balancing loss ops and the shared experts, ``moe_preprocess`` the dispatcher's
    ``dispatch_preprocess`` (alltoall: the token counts, their EP all-gather and splits, and the permutation; the
    counts' host copies stay outside; the flex dispatcher's reshapes launch nothing)."""
    base = forward_name(name)
    return (("attn" in scopes and base.startswith("attn."))
            or ("moe_router" in scopes and (base in ("moe.norm", "moe.router", "moe.router_topk")
                                            or base.startswith(("moe.aux_", "moe.shared.", "moe.router_topk."))))
            or ("moe_preprocess" in scopes and dispatcher == "alltoall" and base in _PREPROCESS_ALLTOALL))


_DERIVED_SUFFIXES = (".dgrad", ".wgrad", ".bwd", ".recompute")
"""Name suffixes of the ops derived from a forward op: its backward (:func:`backward_ops`) and its recomputation."""


def forward_name(name: str) -> str:
    """The forward op's name of op ``name``: less its backward (``.dgrad``, ``.wgrad``, ``.bwd``) or recomputation
    (``.recompute``) suffix; a forward op's name as it is."""
    for suffix in _DERIVED_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def selective_saved(ops: Sequence[Op], modules: Sequence[str]) -> float:
    """Activation bytes ``ops`` keep for the backward under selective recomputation of ``modules``: the ops
    not recomputed keep theirs; a run of consecutive recomputed ops keeps only its first op's (the checkpointed
    input of the module, Megatron's CheckpointWithoutOutput)."""
    total, prev = 0.0, False
    for o in ops:
        r = recomputed(o.name, modules)
        if not r or not prev:
            total += o.saved
        prev = r
    return total


MAIN_GRAD_SOURCE = (
    "NVIDIA/TransformerEngine v2.12 transformer_engine/pytorch/module/linear.py and grouped_linear.py (backward "
    "with fuse_wgrad_accumulation: the wgrad GEMM / general_grouped_gemm writes into weight.main_grad with "
    "out_dtype main_grad.dtype and accumulate=accumulate_wgrad_into_param_main_grad, i.e. cuBLAS beta = 1: the "
    "gradient is read and written by every micro-batch's wgrad), megatron/core/extensions/transformer_engine.py "
    "(fuse_wgrad_accumulation=config.gradient_accumulation_fusion), megatron/core/tensor_parallel/layers.py "
    "(non-TE linears: fused_weight_gradient_mlp_cuda wgrad_gemm_accum_fp32 / _fp16 into main_grad), "
    "megatron/core/distributed/param_and_grad_buffer.py (main_grad: a view of the gradient buffer, fp32 with "
    "grad_reduce_in_fp32, else the parameters' bf16); "
    "NVIDIA-NeMo/Megatron-Bridge v0.3.0 src/megatron/bridge/models/gpt_provider.py (gradient_accumulation_fusion "
    "default can_enable_gradient_accumulation_fusion(): on where the fused kernels are installed, as in the NeMo "
    "containers), Megatron-LM arguments.py (--no-gradient-accumulation-fusion: on by default)")
"""Why a Megatron-Core wgrad GEMM reads and writes its weight's gradient (:func:`backward_ops` ``main_grad``)."""


def _wgrad_bytes(o: Op, grad_bytes: float) -> float:
    """HBM bytes of the weight-gradient GEMM of forward linear ``o`` accumulating into ``main_grad``
    (:data:`MAIN_GRAD_SOURCE`) of ``grad_bytes`` per element (4 with ``grad_reduce_in_fp32``, else 2): its two
    operands (the saved input ``m x k`` and the output gradient ``m x n``, in the GEMM's input bytes) and a read and
    a write of the ``k x n`` gradient, per group of a grouped GEMM."""
    inb = min(q.gemm_in_bytes for q in PRECISIONS.values() if q.gemm == o.dtype)
    return (o.m * o.k + o.m * o.n) * o.batch * inb + 2.0 * grad_bytes * o.k * o.n * o.batch


MAIN_GRAD_HOOK_SOURCE = (
    "NVIDIA/Megatron-LM at 1e057005 megatron/core/distributed/distributed_data_parallel.py "
    "(_make_backward_post_hook: 'if param.grad is not None and (not param.grad_added_to_main_grad or "
    "getattr(param, \'zero_out_wgrad\', False)): param.main_grad.add_(param.grad.data)', then param.grad = None) and "
    "megatron/core/distributed/custom_fsdp/fully_sharded_data_parallel.py (Megatron-FSDP's post-backward hook: "
    "sharding strategy optim_grads or optim_grads_params overwrites, 'param.main_grad.copy_(param.grad)'; otherwise "
    "'param.main_grad.add_(param.grad)'); without gradient_accumulation_fusion TE's wgrad GEMM writes param.grad "
    "in the activation dtype (transformer_engine/pytorch/module/linear.py, grouped_linear.py: "
    "fuse_wgrad_accumulation False), so grad_added_to_main_grad stays False and the hook runs the kernel")
"""Why a Megatron-Core weight gradient computed without gradient accumulation fusion costs one more memory-bound
kernel per parameter tensor (:func:`backward_ops` ``main_grad_hook``)."""


def _main_grad_hook_op(o: Op, hook_bytes: float) -> Op:
    """The backward hook's ``main_grad.add_(grad)`` (or Megatron-FSDP's ``copy_``) after the weight gradient of
    forward linear ``o`` (:data:`MAIN_GRAD_HOOK_SOURCE`): per weight element it reads the gradient in the
    activation dtype TE's wgrad writes it in (bf16 under FP8 and MXFP8 too: only the GEMM's inputs are quantized) and
    reads / writes ``main_grad``, ``hook_bytes`` in all; one kernel per parameter tensor (each local expert's weight
    of a grouped GEMM)."""
    inb = min(q.act_bytes for q in PRECISIONS.values() if q.gemm == o.dtype)
    n = o.k * o.n * o.batch
    return Op(f"{o.name}.main_grad_add", "elementwise", n, n * (inb + hook_bytes), "fp32", bwd=True,
              launches=max(round(o.batch), 1) if o.cls == "grouped_gemm" else 1)


def backward_ops(fwd: list[Op], main_grad: float = 0.0, main_grad_hook: float = 0.0) -> list[Op]:
    """The backward ops of a forward op list, in backward order.

    A linear layer gives a data-gradient and a weight-gradient GEMM (each the forward's
    FLOPs), attention its flash backward (2.5x), element-wise ops and norms twice their
    traffic, each collective its transpose (all-gather <-> reduce-scatter, dispatch <->
    combine) with the same bytes, a quantize its own cast of the gradient. ``main_grad`` > 0
    (Megatron-Core's gradient accumulation fusion, :data:`MAIN_GRAD_SOURCE`): the bytes per element of
    the gradient every weight-gradient GEMM reads and writes (:func:`_wgrad_bytes`); 0: its bytes
    are the forward's (the gradient written in the input dtype, as the weight is read). ``main_grad_hook`` > 0 (no
    fusion, Megatron-Core's backward hook, :data:`MAIN_GRAD_HOOK_SOURCE`): after each weight-gradient GEMM, the
    hook's kernel that adds (or copies) that gradient into ``main_grad``, reading and writing ``main_grad_hook``
    bytes of it per element (:func:`_main_grad_hook_op`)."""
    out: list[Op] = []
    for o in reversed(fwd):
        if o.no_grad:
            continue
        launches = o.launches if o.bwd_launches is None else o.bwd_launches
        if o.cls == "collective" and o.comm is not None:
            kind = _BWD_COLL[o.comm.kind]
            out.append(replace(o, name=f"{o.name}.bwd", comm=Comm(o.comm.group, kind, o.comm.nbytes), bwd=True,
                               launches=launches))
        elif o.cls in ("gemm", "grouped_gemm"):
            out.append(replace(o, name=f"{o.name}.dgrad", m=o.m, n=o.k, k=o.n, bwd=True, saved=0.0))
            # a grouped GEMM's groups: dgrad keeps M per group, wgrad (dW_e = X_e^T dY_e) reduces over them
            out.append(replace(o, name=f"{o.name}.wgrad", m=o.k, n=o.n, k=o.m, bwd=True, saved=0.0,
                               params=param_tensors(o), group_k=bool(o.group_rows) and not o.group_k,
                               bytes=_wgrad_bytes(o, main_grad) if main_grad else o.bytes))
            if main_grad_hook:
                out.append(_main_grad_hook_op(o, main_grad_hook))
        elif o.cls == "attention":
            out.append(replace(o, name=f"{o.name}.bwd", flops=o.flops * 2.5, bytes=o.bytes * 2.0, bwd=True,
                               saved=0.0))
        elif o.copy:
            out.append(replace(o, name=f"{o.name}.bwd", bwd=True, saved=0.0, launches=launches))
        elif o.bwd_bytes is not None:  # the backward known kernel by kernel (GPT_OSS_BACKWARD_SOURCE)
            if launches > 0:  # autograd's C++ engine launches a node's further kernels: no Python between them
                out.append(replace(o, name=f"{o.name}.bwd", flops=o.flops * 2.0, bytes=o.bwd_bytes, bwd=True,
                                   saved=0.0, params=param_tensors(o), launches=1,
                                   loop_launches=o.loop_launches + launches - 1))
        else:
            out.append(replace(o, name=f"{o.name}.bwd", flops=o.flops * 2.0, bytes=o.bytes * 2.0, bwd=True,
                               saved=0.0, params=param_tensors(o)))
    return out


PARAM_HOOK_SOURCE = ("NVIDIA/Megatron-LM megatron/core/distributed/distributed_data_parallel.py "
                     "(DistributedDataParallel.__init__: grad_acc.register_hook(self._make_backward_post_hook(param)) "
                     "for every parameter; the hook adds a non-fused grad to main_grad, clears param.grad and, with "
                     "overlap_grad_reduce, register_grad_ready on its bucket group) and NVIDIA/TransformerEngine v2.12 "
                     "transformer_engine/pytorch/module/grouped_linear.py (GroupedLinear holds weight0..weight{n-1} as "
                     "separate parameters; _GroupedLinear.backward returns one wgrad per expert: "
                     "handle_custom_ddp_from_mcore, get_dummy_wgrad under gradient_accumulation_fusion)")
"""Why a backward op's host launch carries one eager step per parameter it completes (:attr:`Op.params`)."""


def param_tensors(o: Op) -> int:
    """Parameter tensors whose gradient backward op of forward op ``o`` completes (:attr:`Op.params`): a linear
    layer's weight (one per local expert for a grouped GEMM, TE ``GroupedLinear``'s ``weight{i}``), a norm's weight,
    the embedding table, and a bias (:attr:`Op.bias`: with its linear's weight, or its own eager add). Attention,
    activations, casts and bookkeeping own none."""
    per = 2 if o.bias else 1  # a biased linear's bias is a parameter of its own (AccumulateGrad and hook)
    if o.cls == "grouped_gemm":
        return max(round(o.batch), 1) * per
    if o.cls in ("gemm", "norm") or o.name in ("embed.lookup", "mtp.embed.lookup"):
        return per
    return 1 if o.bias else 0


def layer_params(card: MoEModelConfig, layer: int) -> tuple[int, int]:
    """(dense parameters, routed-expert parameters) of one layer."""
    h = card.hidden_size
    dense = card.attention_params() + 2 * h
    if layer < card.dense_layers:
        return dense + 3 * h * (card.dense_ffn_size or 0), 0
    shared = 3 * h * (card.shared_expert_ffn_size or card.expert_ffn_size or 0) * card.num_shared_experts
    return dense + h * card.num_experts + shared, card.num_experts * 3 * h * (card.expert_ffn_size or 0)


def layer_forward_flops(card: MoEModelConfig, layer: int, tokens: int, seq: int) -> float:
    """Total forward FLOPs of transformer layer ``layer`` (0-based; a dense FFN when
    ``layer < card.dense_layers``) for ``tokens`` tokens in sequences of length ``seq``
    (causal attention), unsharded, routed experts counted as ``tokens * top_k`` rows under
    uniform routing, shared experts included, 2 FLOPs per multiply-accumulate.

    Includes every op of :func:`layer_ops` (norms, router, softmax/top-k, activations,
    residual adds) but Megatron's bookkeeping (``Shard.framework_ops``); at bf16 (no quantize casts)."""
    if not 0 <= layer < card.num_layers:
        raise ValueError(f"layer {layer} out of range: {card.name} has {card.num_layers} layers")
    ops = layer_ops(card, layer, float(tokens), float(seq), Shard(framework_ops=False))
    return float(sum(o.flops for o in ops if o.cls != "collective"))


# ---------------------------------------------------------------- multi-token prediction (DeepSeek-V3 section 2.2)
MTP_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/multi_token_prediction.py "
              "(MultiTokenPredictionLayer: the shared embedding of the rolled input ids, enorm and hnorm, "
              "torch.cat((embedding, hidden), -1), eh_proj a ColumnParallelLinear 2h -> h with gather_output False "
              "then gather_from_tensor_model_parallel_region and scatter_to_sequence_parallel_region, one "
              "transformer_layer, final_layernorm; _checkpointed_forward wraps the projection, layer and norm under "
              "full recomputation), megatron/core/models/gpt/gpt_model.py (_postprocess: the shared output_layer and "
              "compute_language_model_loss on each MTP depth's hidden states; the MTP stage builds its own copy of the "
              "embedding), megatron/core/distributed/finalize_model_grads.py (_allreduce_word_embedding_grads: the "
              "embedding gradient all-reduced between the first and the MTP stage) and megatron/training/training.py "
              "(num_floating_point_operations: the MTP layer counted as one more layer of the last layer's kind, "
              "its norms and eh_proj, and one more logit GEMM per depth)")
"""Where the multi-token-prediction ops, parameters and FLOPs come from."""


def mtp_layer_index(card: MoEModelConfig, depth: int) -> int:
    """Pseudo-layer index of MTP depth ``depth`` (0-based) in a chunk's layer list: after the LM head
    (``num_layers``), so ``-1`` embedding, ``0..num_layers-1`` layers, ``num_layers`` head, then the MTP depths."""
    return card.num_layers + 1 + depth


def mtp_depth(card: MoEModelConfig, layer: int) -> int | None:
    """The MTP depth of pseudo-layer index ``layer``, or None when it is no MTP module."""
    k = layer - card.num_layers - 1
    return k if 0 <= k < card.mtp_layers else None


def mtp_body_layer(card: MoEModelConfig) -> int:
    """The main-model layer whose kind (dense or MoE FFN, window) the MTP transformer layer has: the last one
    (Megatron-Core training.py counts the MTP layer as MoE iff the last layer is; DeepSeek-V3's layer 61 is MoE)."""
    return card.num_layers - 1


def mtp_ops(card: MoEModelConfig, tokens: float, seq: float, shard: Shard | None = None,
            precision: Precision | str = "bf16", body: list[Op] | None = None,
            cross_entropy_fusion: bool = True) -> list[Op]:
    """Forward ops of one MTP depth on the last pipeline stage (:data:`MTP_SOURCE`): the embedding of the shifted
    tokens (vocabulary-parallel lookup and its TP reduction), RMSNorm of it and of the hidden state, their
    concatenation, the 2h -> h projection (column-parallel: under SP its input all-gathered, its output gathered
    along the hidden dim), the transformer layer ``body`` (default: :func:`layer_ops` of :func:`mtp_body_layer`,
    op names unchanged so recomputation and CUDA-graph scopes treat it as a layer), then the final norm, the shared
    LM head and the cross-entropy loss (:func:`head_ops`, ``mtp.`` prefixed)."""
    s = shard or Shard()
    p = PRECISIONS[precision] if isinstance(precision, str) else precision
    h = card.hidden_size
    sp = s.sequence_parallel and s.tp > 1
    local = tokens / s.tp if sp else tokens
    ops = [replace(o, name=f"mtp.{o.name}") for o in embedding_ops(card, tokens, s, p)]
    ops += [_norm("mtp.enorm", local, h, p), _norm("mtp.hnorm", local, h, p),
            _ew("mtp.concat", local * 2 * h, p, flops_per=0.0)]
    if sp:
        ops.append(_coll("mtp.eh_proj.sp_all_gather", "tp", "all_gather", tokens * 2 * h * p.act_bytes))
    ops += [*_quant("mtp.eh_proj.input", tokens * 2 * h, p),
            replace(_gemm("mtp.eh_proj", tokens, h / s.tp, 2 * h, p), saved=local * 2 * h * _saved_bytes(p))]
    if s.tp > 1:  # gather_from_tensor_model_parallel_region: backward a split (no communication) without SP; the SP
        # scatter's backward all-gathers the same bytes (modelled as this gather's transpose)
        ops.append(replace(_coll("mtp.eh_proj.tp_all_gather", "tp", "all_gather", tokens * h * p.act_bytes),
                           no_grad=not sp))
    ops += body if body is not None else layer_ops(card, mtp_body_layer(card), tokens, seq, s, p)
    ops += [replace(o, name=f"mtp.{o.name}") for o in head_ops(card, tokens, s, p, cross_entropy_fusion)]
    return ops


def mtp_recomputed_full(name: str) -> bool:
    """Under full recomputation: whether MTP forward op ``name`` is re-run (Megatron-Core checkpoints the
    projection, the transformer layer and the final norm; not the embedding, the LM head and the loss)."""
    return not name.startswith(("mtp.embed.", "mtp.head.lm_head", "mtp.head.cross_entropy", "mtp.head.tp_loss",
                                "mtp.head.sp_all_gather"))


def mtp_embedding_copy(pp: int, schedule: str) -> bool:
    """Whether the MTP stage holds its own copy of the embedding (:func:`mtp_params`' ``embedding_copy``, and the
    gradient all-reduce that ties the two copies): with pp > 1, except under DualPipe."""
    return pp > 1 and schedule != "dualpipe"


def mtp_params(card: MoEModelConfig, embedding_copy: bool = False) -> tuple[int, int]:
    """(dense, routed-expert) parameters of all MTP depths: per depth the two input norms, the 2h x h projection,
    the final norm and one layer of :func:`mtp_body_layer`'s kind; with ``embedding_copy`` the MTP stage's own copy
    of the embedding (Megatron-Core with pp > 1; not DualPipe, whose rank holding the MTP holds the embedding too:
    DeepSeek-V3 section 3.2.3). The LM head is shared (Megatron-Core's output_layer)."""
    if not card.mtp_layers:
        return 0, 0
    h = card.hidden_size
    d, e = layer_params(card, mtp_body_layer(card))
    dense = card.mtp_layers * (3 * h + 2 * h * h + d) + (card.vocab_size * h if embedding_copy else 0)
    return dense, card.mtp_layers * e


# ---------------------------------------------------------------- Muon (Moonlight, arXiv:2502.16982)
MUON_SOURCE = ("NVIDIA/Megatron-LM megatron/core/optimizer/muon.py (get_megatron_muon_optimizer: every parameter that "
               "is not 1-D and not is_embedding_or_output_parameter goes to TensorParallelMuon, the rest to Adam; "
               "num_ns_steps 5, quintic Newton-Schulz of emerging_optimizers newton_schulz_tp; muon_tp_mode "
               "blockwise orthogonalizes each TP shard alone; muon_split_qkv and muon_split_moe_experts default true), layer_wise_optimizer.py (LayerWiseDistributedOptimizer, "
               "Megatron-Bridge's dist_muon: DDP all-reduces the gradients, each DP rank steps the whole parameters "
               "it owns, then all-gathers the updated parameters; use_distributed_optimizer False); "
               "Moonlight, arXiv:2502.16982 section 2.3 (Distributed Muon) and Algorithm 1: momentum buffer only, "
               "X <- aX + (bA + cA^2)X with A = XX^T, 5 iterations on the matrix or its transpose (rows <= columns)")
"""Where :func:`muon_matrices` and :func:`muon_ops` come from."""

MUON_NS_STEPS = 5
"""Newton-Schulz iterations per step (Megatron-Core ``muon_num_ns_steps`` default, Moonlight)."""


def muon_matrices(card: MoEModelConfig, layer: int, tp: int = 1, etp: int = 1) -> list[tuple[float, float, float, bool]]:
    """The 2-D weights of transformer layer ``layer`` that Muon orthogonalizes, as ``(rows, cols, count, expert)``
    of one rank's TP (expert: ETP) shard (``muon_tp_mode: blockwise``: column-parallel weights split their
    output dim, row-parallel their input dim; MLA's down projections and the router are replicated). The norms
    (1-D) and the embedding / LM head stay on Adam (:data:`MUON_SOURCE`). Megatron-Core's fused weights are one
    matrix: ``linear_fc1`` (gate and up); ``linear_qkv`` is split into q, k and v (``muon_split_qkv``, default
    true). Routed experts: one fc1 and one fc2 per expert (``muon_split_moe_experts``, default true)."""
    c, h = card, float(card.hidden_size)
    nh = float(c.num_heads)
    out: list[tuple[float, float, float, bool]] = []
    if c.attention_kind == "mla":
        nope, rope, vd = float(c.qk_nope_head_dim or 0), float(c.qk_rope_head_dim or 0), float(c.v_head_dim or 0)
        kvr = float(c.kv_lora_rank or 0)
        if c.q_lora_rank:
            out += [(float(c.q_lora_rank), h, 1.0, False), (nh * (nope + rope) / tp, float(c.q_lora_rank), 1.0, False)]
        else:
            out.append((nh * (nope + rope) / tp, h, 1.0, False))
        out += [(kvr + rope, h, 1.0, False), (nh * (nope + vd) / tp, kvr, 1.0, False), (h, nh * vd / tp, 1.0, False)]
    else:
        d = float(c.attn_head_dim)
        out += [(nh * d / tp, h, 1.0, False), (c.num_kv_heads * d / tp, h, 2.0, False), (h, nh * d / tp, 1.0, False)]
    if layer < c.dense_layers:
        f = float(c.dense_ffn_size or 0)
        return [*out, (2.0 * f / tp, h, 1.0, False), (h, f / tp, 1.0, False)]
    fs = float(c.shared_expert_ffn_size or c.expert_ffn_size or 0) * c.num_shared_experts
    if fs:
        out += [(2.0 * fs / tp, h, 1.0, False), (h, fs / tp, 1.0, False)]
    fe, E = float(c.expert_ffn_size or 0), float(c.num_experts)
    return [*out, (float(c.num_experts), h, 1.0, False), (2.0 * fe / etp, h, E, True), (h, fe / etp, E, True)]


def newton_schulz_flops(rows: float, cols: float, steps: int = MUON_NS_STEPS) -> float:
    """FLOPs of ``steps`` quintic Newton-Schulz iterations on one ``rows x cols`` matrix: on ``X`` of ``m x n``
    (the matrix or its transpose, ``m <= n``) each iteration runs ``A = X X^T`` (``2 m^2 n``), ``B = bA + cA A``
    (``2 m^3``) and ``X = aX + B X`` (``2 m^2 n``)."""
    m, n = min(rows, cols), max(rows, cols)
    return steps * (4.0 * m * m * n + 2.0 * m ** 3)


def muon_ops(mats: list[tuple[float, float, float]], steps: int = MUON_NS_STEPS) -> list[Op]:
    """The Newton-Schulz GEMMs of the matrices ``(rows, cols, count)`` one rank orthogonalizes (``count`` may be
    fractional: the rank's share of a DP-distributed set): per distinct shape three batched GEMMs
    (``X X^T``, ``A A``, ``B X``) of ``count x steps`` groups, at bf16 (Megatron-Core ``muon_fp32_matmul_prec``
    ``medium``: fp32 tensors, bf16 tensor-core math). FLOPs sum to :func:`newton_schulz_flops` per matrix."""
    p = PRECISIONS["bf16"]
    shapes: dict[tuple[float, float], float] = {}
    for r, cl, n in mats:
        m, k = min(r, cl), max(r, cl)
        shapes[(m, k)] = shapes.get((m, k), 0.0) + n
    ops: list[Op] = []
    for (m, k), n in sorted(shapes.items()):
        if n <= 0 or m <= 0:
            continue
        b = n * steps
        ops += [_gemm("optim.muon.ns_gram", m, m, k, p, save_input=False, batch=b),
                _gemm("optim.muon.ns_poly", m, m, m, p, save_input=False, batch=b),
                _gemm("optim.muon.ns_update", m, k, m, p, save_input=False, batch=b)]
    return ops
