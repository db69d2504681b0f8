"""Memory per GPU of a training layout (bytes), as Megatron-Core with Transformer Engine holds it.

* weights: the parameters of this rank's share in bf16 (:attr:`MemoryOptions.weight_bytes`): dense
  parameters / tp, routed experts / (ep * etp), the embedding on the first stage and the LM head on the
  last (vocabulary split over tp); FSDP shards them over data parallelism too and holds, at the peak, two
  layers gathered in bf16 (the one at work and the prefetched next one, as the step builder gathers them;
  counted with the activations), or with ``fsdp_reshard_after_forward: false`` every layer of the stage (each
  stays gathered from its forward to its backward, and at the peak every layer has a micro-batch in flight:
  FSDP2 ``fully_shard(reshard_after_forward=False)``). Under FP8 / MXFP8,
  Transformer Engine also keeps each linear layer's quantized weight between micro-batches
  (:data:`FP8_WEIGHT_CACHE_SOURCE`): ``QUANT_COPIES`` copies (row- and column-wise) of ``cast_bytes``; the routed
  experts' follow :attr:`MemoryOptions.expert_precision` when it is set;
* gradients: the DDP gradient buffer in the parameters' dtype (:data:`GRAD_SOURCE`: Megatron-Core's default
  and every Megatron-Bridge performance config reduce in bf16), sharded over data parallelism with FSDP;
* optimizer: fp32 master weights and Adam's m and v (4 + 8 bytes per parameter), sharded over the
  data-parallel group with ZeRO-1 / FSDP (dense over dp x cp, experts over edp);
* activations: what each op keeps for its backward (:attr:`Op.saved`, each tensor counted once by the op
  that owns it: :data:`cosim.workload.synth.costs.SAVED_SOURCE`) for one micro-batch through the stage's
  layers, times the micro-batches the schedule holds at once per model chunk (the issue order of
  :func:`cosim.workload.synth.schedule.stage_order`, with Megatron's extra warm-up forward under the EP
  all-to-all overlap, or :func:`~cosim.workload.synth.schedule.dualpipe_order`). Recomputation:
  :func:`layer_activation_bytes`; the peak adds the largest transient: one layer's recomputed working set, or on
  the stage with the loss the bf16 copy of the logits (:data:`LOSS_SOURCE`).
  Fine-grained activation offloading (:attr:`MemoryOptions.offload_modules`, :data:`OFFLOAD_SOURCE`): what the
  named modules keep (:func:`offload_group_bytes`) leaves the GPU once copied to the host; the peak keeps one
  layer's offloaded groups on top (the group being copied, reloaded ahead of its backward, or kept by the margin).

Not modelled: allocator fragmentation, NCCL / DeepEP and CUDA-context buffers, the temporaries of one
kernel and the activation gradients of the layer in backward (the ``overhead`` term is a flat reserve for them).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from cosim.capture.config import MoEModelConfig
from cosim.workload.synth.costs import (
    QUANT_COPIES,
    Op,
    Precision,
    Shard,
    embedding_ops,
    head_ops,
    layer_ops,
    layer_params,
    mtp_body_layer,
    mtp_embedding_copy,
    mtp_ops,
    mtp_params,
    mtp_recomputed_full,
    recipe_with_experts,
    selective_saved,
)
from cosim.workload.synth.layout import RankMap
from cosim.workload.synth.schedule import dualpipe_order, stage_order

__all__ = [
    "DISCARD_SOURCE",
    "DROPOUT_SOURCE",
    "FP8_WEIGHT_CACHE_SOURCE",
    "GRAD_SOURCE",
    "LOSS_SOURCE",
    "OFFLOAD_MODULES",
    "OFFLOAD_SOURCE",
    "OVERHEAD_BYTES",
    "MemoryEstimate",
    "MemoryOptions",
    "layer_activation_bytes",
    "memory_per_stage",
    "offload_group_bytes",
    "offload_group_of",
]

OVERHEAD_BYTES = 3 * 2**30
"""CUDA context, NCCL buffers and allocator slack reserved per GPU (3 GiB)."""

GRAD_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/distributed/distributed_data_parallel_config.py "
               "(grad_reduce_in_fp32 = False) and param_and_grad_buffer.py (the grad buffer takes the parameters' "
               "dtype unless grad_reduce_in_fp32); NVIDIA-NeMo/Megatron-Bridge v0.3.0 scripts/performance/configs/"
               "{deepseek,qwen,llama,gpt_oss}/*_llm_pretrain.py (cfg.ddp.grad_reduce_in_fp32 = False)")
"""Why the gradient buffer holds 2 bytes per parameter by default."""

FP8_WEIGHT_CACHE_SOURCE = ("NVIDIA/TransformerEngine v2.12 transformer_engine/pytorch/module/linear.py and "
                           "grouped_linear.py (get_weight_workspace with cache_name 'weight' / 'weight{i}' when "
                           "is_first_microbatch is not None: the quantized weight is kept and re-used by the later "
                           "micro-batches); NVIDIA/Megatron-LM megatron/core/extensions/transformer_engine.py "
                           "(TELinear / TEGroupedLinear pass is_first_microbatch unless "
                           "disable_parameter_transpose_cache)")
"""Why FP8 / MXFP8 training holds a quantized copy of every linear weight besides the bf16 one."""

DISCARD_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/tensor_parallel/random.py (CheckpointWithoutOutput: "
                  "discard_output_and_register_recompute frees the output's storage once its consumer ran, and "
                  "recomputes it before the backward), multi_latent_attention.py (mla_up_proj: query, key, value "
                  "freed after core attention; set_for_recompute_input_layernorm: the down projections save the "
                  "original, freed, input), moe/experts.py (moe_act: linear_fc2 set_save_original_input), "
                  "transformer_layer.py (layernorm: input_layernorm when not fused into the QKV linear, "
                  "pre_mlp_layernorm of an MoE layer), moe/moe_layer.py (set_for_recompute_pre_mlp_layernorm)")
"""Why a selectively recomputed module also frees what its consumers saved of its output
(:func:`layer_activation_bytes`)."""


DROPOUT_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/fusions/fused_bias_dropout.py (_bias_dropout_add_func: "
                  "torch.nn.functional.dropout of the sublayer output, which keeps its bool mask for the backward, "
                  "then the residual add), transformer_config.py (hidden_dropout 0.1), megatron/training/arguments.py "
                  "(--hidden-dropout default 0.1)")
"""Why hidden dropout adds two 1-byte masks per layer and one for the embedding."""


LOSS_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/tensor_parallel/cross_entropy.py "
               "(_VocabParallelCrossEntropy: the bf16 logits cast to fp32 in forward, the fp32 softmax saved and turned "
               "into the gradient in place; autograd casts that fp32 gradient to the logits' bf16) and "
               "megatron/core/fusions/fused_cross_entropy.py (grad_input.to(torch.bfloat16))")
"""Why the stage with the loss holds, at its peak, a bf16 tensor of the logits' size besides the saved fp32 one
(the bf16 logits in forward, their bf16 gradient in backward)."""


@dataclass(frozen=True)
class MemoryOptions:
    """Bytes per parameter of the model state (framework settings; defaults: Megatron-Core's)."""

    weight_bytes: float = 2.0
    """Parameters as the model holds them (bf16)."""
    grad_bytes: float = 2.0
    """The gradient buffer per parameter (:data:`GRAD_SOURCE`; 4 with ``grad_reduce_in_fp32``)."""
    master_bytes: float = 4.0
    """fp32 master copy per parameter in the optimizer (0 when the optimizer steps the parameters themselves: fp32
    parameters that are their own master, or PyTorch FSDP2 with bf16 parameters as NeMo AutoModel runs it,
    validation/memory/run.py ``_AUTOMODEL_FSDP2``)."""
    moment_bytes: float = 8.0
    """Adam's m and v per parameter (fp32; 4 with bf16 moments; 4 under Muon: one fp32 momentum, the embedding's
    and norms' Adam moments, under 0.5% of a model's parameters, counted at the same rate)."""
    fp8_weight_cache: bool = True
    """Under FP8 / MXFP8 keep each linear weight's quantized copies between micro-batches
    (:data:`FP8_WEIGHT_CACHE_SOURCE`)."""
    hidden_dropout: bool = False
    """Dropout on the hidden states (Megatron's ``hidden_dropout`` > 0; its default 0.1, 0 in every
    Megatron-Bridge recipe): each bias-dropout-add (after attention, after the FFN) and the embedding's dropout
    keep a 1-byte mask per element (:data:`DROPOUT_SOURCE`)."""
    moe_act_input_fp8: bool = False
    """Keep the routed experts' activation input (the ``moe_act`` checkpoint: fc1's output) in FP8 with its scales
    instead of bf16, as DeepSeek-V3's framework does ("the input of the SwiGLU operator in MoE ... cached in FP8
    ... its output recomputed in the backward pass": DeepSeek-V3 report, arXiv:2412.19437, section 3.3.3);
    takes effect with ``moe_act`` recomputation and an FP8 precision of the routed experts (:attr:`expert_precision`
    or the precision given)."""
    overhead: float = OVERHEAD_BYTES
    """Flat reserve per GPU, bytes."""
    offload_modules: tuple[str, ...] = ()
    """Fine-grained activation offloading (Megatron-Core ``--fine-grained-activation-offloading --offload-modules``,
    :data:`OFFLOAD_MODULES`): what these modules save for the backward is copied to the host during the forward
    and reloaded before the backward (:func:`offload_group_bytes`); empty: off."""
    expert_precision: str | None = None
    """Recipe of the routed experts (a :data:`cosim.workload.synth.costs.PRECISIONS` key,
    ``workload.synthetic.expert_precision``); None: the precision the memory model is given. Their saved inputs and
    quantized weight copies follow it, every other linear's the given precision."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU of a pipeline stage."""

    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float = OVERHEAD_BYTES

    @property
    def total(self) -> float:
        """Everything, bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def as_dict(self) -> dict[str, float]:
        """The fields and the total (bytes; ``stage`` its index), by name."""
        return {"stage": self.stage, "weights": self.weights, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations, "overhead": self.overhead,
                "total": self.total}


def _discarded(ops: Sequence[Op], modules: Sequence[str], card: MoEModelConfig, p: Precision) -> float:
    """Bytes that consumers of a CheckpointWithoutOutput module's output saved and lose when it is freed
    (:data:`DISCARD_SOURCE`)."""
    gone = 0.0
    mla = card.attention_kind == "mla"
    for o in ops:
        if "mla_up_proj" in modules and mla and o.name == "attn.core":
            # query, key and value freed; the output and the softmax LSE stay
            gone += max(o.saved - o.batch * o.heads * o.m * ((card.v_head_dim or 0) * p.act_bytes + 4.0), 0.0)
        elif "moe_act" in modules and o.name == "moe.experts_fc2":
            gone += o.saved
        elif "layernorm" in modules and (o.name == "moe.router"
                                         or (mla and o.name in ("attn.q_down", "attn.q_proj", "attn.kv_down"))):
            gone += o.saved
    return gone


OFFLOAD_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0+ megatron/core/pipeline_parallel/fine_grained_activation_offload.py "
                  "(a group's saved_tensors_hooks capture what autograd saves between group_start and group_offload; "
                  "on_group_commit_forward copies them D2H on the manager's d2h_stream after the compute stream and "
                  "frees their GPU storage (record_stream: at the copy's end); on_group_start_backward, at the end "
                  "of a group's backward, bulk-reloads the previous offloaded group (LIFO) H2D on h2d_stream, and "
                  "on_group_commit_backward makes the compute stream wait for that reload before the group's "
                  "backward; post_warmup_callback keeps one group per name on the GPU as a margin; tensors under "
                  "min_offloaded_tensor_size (1M elements) stay), moe/experts.py (expert_fc1: the group around "
                  "linear_fc1, committed after it; moe_act: from the activation through linear_fc2, committed after "
                  "fc2 so that the checkpointed fc1 output is reloaded before moe_act's recomputation), "
                  "docs/user-guide/features/fine_grained_activation_offloading.md")
"""Where fine-grained activation offloading's groups, copies and lifetimes come from."""

OFFLOAD_MODULES: dict[str, tuple[str, ...]] = {
    "attn_norm": ("attn.norm",),
    "qkv_linear": ("attn.input.quantize", "attn.qkv"),
    "core_attn": ("attn.core",),
    "attn_proj": ("attn.o_input.quantize", "attn.o_proj"),
    "mlp_norm": ("moe.norm", "mlp.norm"),
    "expert_fc1": ("moe.experts_input.quantize", "moe.experts_fc1"),
    "moe_act": ("moe.experts_swiglu", "moe.experts_act", "moe.experts_fc2"),
}
"""Megatron-Core's offload modules that a synthesized layer has, and its forward ops each group spans (an op
belongs to a group when its name is one of these or starts with one followed by ``_`` or ``.``; :data:`OFFLOAD_SOURCE`)."""


def offload_group_of(name: str, modules: Sequence[str]) -> str | None:
    """The offload module of ``modules`` whose group holds forward op ``name`` (None: none)."""
    for m in modules:
        for x in OFFLOAD_MODULES.get(m, ()):
            if name == x or name.startswith(x + "_") or name.startswith(x + "."):
                return m
    return None


def offload_group_bytes(ops: Sequence[Op], recompute: str, modules: Sequence[str], card: MoEModelConfig,
                        p: Precision, layer_input: float, offload: Sequence[str],
                        options: MemoryOptions | None = None, kept: float | None = None) -> dict[str, float]:
    """Bytes each offload group of one layer copies to the host per micro-batch (forward order of the groups).

    A group offloads what its ops keep for the backward after recomputation's discards
    (:func:`layer_activation_bytes`): the layer's kept bytes less those kept with the group's ops saving nothing,
    taken group after group so that the groups add up to what the layer keeps less what stays. Full
    recomputation keeps only the layer input (no group inside). ``kept``: the layer's
    :func:`layer_activation_bytes` for these inputs when the caller has it (else worked out here)."""
    out: dict[str, float] = {}
    if recompute == "full" or not offload:
        return out
    zeroed: set[str] = set()
    group = [offload_group_of(o.name, offload) for o in ops]  # each op's group, worked out once
    prev = layer_activation_bytes(ops, recompute, modules, card, p, layer_input, options) if kept is None else kept
    for g in group:
        if g is None or g in out:
            continue
        zeroed |= {x.name for x, gx in zip(ops, group) if gx == g}
        now = layer_activation_bytes([replace(x, saved=0.0) if x.name in zeroed else x for x in ops], recompute,
                                     modules, card, p, layer_input, options)
        out[g] = max(prev - now, 0.0)
        prev = now
    return out


def layer_activation_bytes(ops: Sequence[Op], recompute: str, modules: Sequence[str], card: MoEModelConfig,
                           p: Precision, layer_input: float, options: MemoryOptions | None = None) -> float:
    """Activation bytes one layer keeps for its backward, per micro-batch.

    ``none``: every op's :attr:`Op.saved`; ``full``: the layer's input (``layer_input`` bytes); ``selective``:
    the ops outside ``modules`` keep theirs, a run of recomputed ops only its first op's input (the module's
    checkpoint, :func:`cosim.workload.synth.costs.selective_saved`), and what the consumers of a module's freed
    output saved of it is freed too (:data:`DISCARD_SOURCE`); :attr:`MemoryOptions.moe_act_input_fp8` stores the
    ``moe_act`` checkpoint's input in FP8."""
    if recompute == "full":
        return layer_input
    if recompute == "selective":
        kept = selective_saved(ops, modules) - _discarded(ops, modules, card, p)
        pe = p.routed  # the routed experts' recipe (workload.synthetic.expert_precision)
        if options is not None and options.moe_act_input_fp8 and "moe_act" in modules and pe.gemm != "bf16":
            first = next((o for o in ops if o.name in ("moe.experts_act_clamp_glu", "moe.experts_swiglu")), None)
            if first is not None:
                kept -= first.saved * (1.0 - pe.cast_bytes / pe.act_bytes)
        return kept
    return float(sum(o.saved for o in ops))


def _gemm_params(card: MoEModelConfig, layer: int) -> tuple[float, float]:
    """(dense, routed-expert) parameters of one layer's linear layers (no norms, no router)."""
    d, e = layer_params(card, layer)
    d -= 2 * card.hidden_size
    if layer >= card.dense_layers:
        d -= card.hidden_size * card.num_experts
    return float(d), float(e)


@dataclass
class _Stage:
    """What one rank of a pipeline stage holds (:func:`_stage`): parameter counts and activation bytes."""

    dense: float = 0.0
    """Parameters besides the routed experts' on this rank."""
    expert: float = 0.0
    """Routed experts' parameters on this rank."""
    gemm: float = 0.0
    """Of :attr:`dense` and :attr:`expert`, the linear layers' weights (no norms, no router: those an FP8 recipe
    keeps quantized copies of)."""
    gemm_expert: float = 0.0
    """Of :attr:`gemm`, the routed experts' parameters (their quantized copies follow ``expert_precision``)."""
    act_chunk: list[float] = field(default_factory=list)
    """Per model chunk of the stage, the activation bytes one micro-batch keeps for its backward."""
    work: float = 0.0
    """The largest transient at the peak: a recomputed layer's re-materialized bytes, or the loss's bf16 logits."""
    layer_max: float = 0.0
    """Parameters of the stage's largest layer on this rank (before FSDP sharding)."""
    offload_max: float = 0.0
    """Activation offloading: the most bytes one layer's groups offload per micro-batch (:func:`_offloaded`)."""


def _stage(card: MoEModelConfig, rm: RankMap, stage: int, T: float, seq: int, sh: Shard, p: Precision,
           o: MemoryOptions) -> _Stage:
    """Parameters and per-micro-batch activations of one rank of pipeline stage ``stage`` (``T`` tokens per
    micro-batch on the rank, sequences of ``seq``)."""
    lay = rm.layout
    st = _Stage()
    local = T / (rm.tp if rm.sequence_parallel and rm.tp > 1 else 1) * card.hidden_size  # residual-stream elements
    layer_input = local * p.act_bytes
    mask = local if o.hidden_dropout else 0.0
    for c in rm.stage_chunks(stage):
        a = 0.0
        for ly in rm.chunk_layers[c]:
            d, e = layer_params(card, ly)
            gd, ge = _gemm_params(card, ly)
            st.dense += d / rm.tp
            st.expert += e / (rm.ep * rm.etp)
            st.gemm += gd / rm.tp + ge / (rm.ep * rm.etp)
            st.gemm_expert += ge / (rm.ep * rm.etp)
            st.layer_max = max(st.layer_max, d / rm.tp + e / (rm.ep * rm.etp))
            ops = layer_ops(card, ly, T, seq, sh, p)
            kept = layer_activation_bytes(ops, lay.recompute, lay.recompute_modules, card, p, layer_input, o)
            off = _offloaded(ops, lay.recompute, lay.recompute_modules, card, p, layer_input, o, kept)
            st.offload_max = max(st.offload_max, off)
            a += kept - off + (2 * mask if lay.recompute != "full" else 0.0)
            if lay.recompute != "none":  # the layer in backward re-materializes what it dropped
                st.work = max(st.work, sum(x.saved for x in ops) - kept)
        if c == 0:
            st.dense += card.vocab_size * card.hidden_size / rm.tp
            a += sum(x.saved for x in embedding_ops(card, T, sh, p)) + mask
        if c == rm.mtp_chunk:  # the m of pipeline_model_parallel_layout (default: the last chunk)
            a += _mtp_stage(card, rm, st, T, seq, sh, p, o, layer_input, mask)
        if c == rm.last_chunk:
            st.dense += card.vocab_size * card.hidden_size / rm.tp
            a += sum(x.saved for x in head_ops(card, T, sh, p))
            st.work = max(st.work, T * card.vocab_size / rm.tp * p.act_bytes)  # LOSS_SOURCE
        st.act_chunk.append(a)
    return st


def _mtp_stage(card: MoEModelConfig, rm: RankMap, st: _Stage, T: float, seq: int, sh: Shard, p: Precision,
               o: MemoryOptions, layer_input: float, mask: float) -> float:
    """The MTP depths of the last chunk (:func:`cosim.workload.synth.costs.mtp_ops`): their parameters (and the
    stage's embedding copy with pp > 1) into ``st``; returns their activation bytes per micro-batch (the layer's as
    :func:`layer_activation_bytes`; the norms, projection and head as saved; under full recomputation only the
    depth's input and its un-checkpointed embedding and head)."""
    if not card.mtp_layers:
        return 0.0
    lay = rm.layout
    md, me = mtp_params(card, mtp_embedding_copy(rm.pp, rm.schedule))
    st.dense += md / rm.tp
    st.expert += me / (rm.ep * rm.etp)
    body = mtp_body_layer(card)
    gd, ge = _gemm_params(card, body)
    h = card.hidden_size
    st.gemm += card.mtp_layers * ((gd + 2 * h * h) / rm.tp + ge / (rm.ep * rm.etp))
    st.gemm_expert += card.mtp_layers * ge / (rm.ep * rm.etp)
    d, e = layer_params(card, body)
    st.layer_max = max(st.layer_max, d / rm.tp + e / (rm.ep * rm.etp))
    layer = layer_ops(card, body, T, seq, sh, p)
    ops = mtp_ops(card, T, seq, sh, p, body=layer)
    names = {id(x) for x in layer}
    rest = [x for x in ops if id(x) not in names]
    kept = layer_activation_bytes(layer, lay.recompute, lay.recompute_modules, card, p, layer_input, o)
    if lay.recompute == "full":
        outside = sum(x.saved for x in rest if not mtp_recomputed_full(x.name))
        return card.mtp_layers * (kept + outside)
    if lay.recompute != "none":
        st.work = max(st.work, sum(x.saved for x in layer) - kept)
    return card.mtp_layers * (kept + sum(x.saved for x in rest) + 2 * mask)


def _offloaded(ops: Sequence[Op], recompute: str, modules: Sequence[str], card: MoEModelConfig, p: Precision,
               layer_input: float, o: MemoryOptions, kept: float) -> float:
    """Bytes one layer's offload groups move to the host per micro-batch (0 without offloading); ``kept``: the
    layer's :func:`layer_activation_bytes`."""
    if not o.offload_modules:
        return 0.0
    return sum(offload_group_bytes(ops, recompute, modules, card, p, layer_input, o.offload_modules, o, kept).values())


def _peak(rm: RankMap, stage: int, act_chunk: list[float], microbatches: int) -> float:
    """Most activation bytes the stage holds at once over its schedule."""
    if rm.schedule == "dualpipe":  # (kind, chunk) per action; an overlapped pair is a forward then a backward
        steps: list[tuple[str, int]] = []
        for act in dualpipe_order(stage, rm.pp, microbatches):
            if act[0] == "FB":
                steps += [("F", int(act[1])), ("B", int(act[2]))]
            elif act[0] in ("F", "B"):
                steps.append((str(act[0]), int(act[1])))
    else:
        extra = int(rm.layout.a2a_overlap) if rm.pp > 1 else 0  # as the step builder issues it
        steps = [(kind, v) for kind, _, v in stage_order(stage, rm.pp, rm.vpp, microbatches, extra_warmup=extra)]
    live = [0] * len(act_chunk)
    peak = 0.0
    for kind, v in steps:
        live[v] += 1 if kind == "F" else -1
        peak = max(peak, sum(n * act_chunk[i] for i, n in enumerate(live)))
    return peak


def memory_per_stage(card: MoEModelConfig, rm: RankMap, micro: int, seq: int, microbatches: int,
                     precision: str = "bf16", options: MemoryOptions | None = None) -> list[MemoryEstimate]:
    """Memory of one GPU of every pipeline stage."""
    o = options or MemoryOptions()
    p = recipe_with_experts(precision, o.expert_precision)
    T = float(micro * seq // rm.cp)
    sh = Shard(tp=rm.tp, cp=rm.cp, ep=rm.ep, etp=rm.etp, sequence_parallel=rm.sequence_parallel)
    zero = rm.layout.zero
    n_dp, n_edp = rm.dp * rm.cp, rm.edp
    out = []
    for stage in range(rm.pp):
        st = _stage(card, rm, stage, T, seq, sh, p, o)
        peak = _peak(rm, stage, st.act_chunk, microbatches) + st.work + st.offload_max  # OFFLOAD_SOURCE
        params = st.dense + st.expert
        sharded = st.dense / n_dp + st.expert / n_edp
        held = sharded if zero == "fsdp" else params
        if zero == "fsdp":  # the gathered bf16 parameters of the layer at work and of the prefetched next one;
            # without resharding after forward every layer's stay gathered until its backward (FSDP_RESHARD_SOURCE)
            # (the parts FSDP shards: dense over dp x cp, experts over edp; a group of one gathers nothing)
            gathered = 2 * st.layer_max if rm.layout.fsdp_reshard_after_forward else (
                (st.dense if n_dp > 1 else 0.0) + (st.expert if n_edp > 1 else 0.0))
            peak += gathered * p.act_bytes
        weights = o.weight_bytes * held
        if p.experts is not None and o.fp8_weight_cache and zero != "fsdp":  # expert_precision: each part its own
            weights += QUANT_COPIES * sum(q.cast_bytes * n for q, n in ((p, st.gemm - st.gemm_expert),
                                                                        (p.experts, st.gemm_expert))
                                          if q.gemm != "bf16")
        elif p.gemm != "bf16" and o.fp8_weight_cache and zero != "fsdp":
            weights += QUANT_COPIES * p.cast_bytes * st.gemm
        grads = o.grad_bytes * held
        opt = (o.master_bytes + o.moment_bytes) * (params if zero == 0 else sharded)
        out.append(MemoryEstimate(stage, weights, grads, opt, peak, o.overhead))
    return out
