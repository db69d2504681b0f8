"""The ``workload: synthetic:`` block of a scenario, and the figures of a synthesized run.

::

    workload:
      synthetic:
        model: deepseek-v3            # a card name, a card .yaml or a Hugging Face config.json
        layout: {tp: 2, pp: 8, vpp: 4, ep: 64, pipeline_layers: [...]}
        batch: {global: 8192, micro: 1, seq: 4096}
        precision: fp8                # bf16 | fp8 | mxfp8
        routing: uniform              # uniform | zipf:1.2 | FILE | {model: ..., placement: ..., redundant: N}

Serving (forward only, :mod:`cosim.workload.synth.infer`)::

    workload:
      synthetic:
        model: deepseek-v3
        mode: decode                  # train | prefill | decode
        layout: {ep: 128}             # tp 1: data-parallel attention, experts over 128 GPUs
        batch: {requests_per_gpu: 128, context: 4096}   # prefill: {tokens_per_gpu: 16384, prompt: 4096, chunk: 4096}
        overlap: two-microbatch       # none | two-microbatch
        dispatch: deepep-ll           # nccl | deepep | deepep-ll (default: deepep for prefill, deepep-ll for decode)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_args

from pydantic import BeforeValidator, ConfigDict, Discriminator, Field, Tag, model_validator

from cosim.catalog.models import Strict, Time
from cosim.errors import CosimInputError
from cosim.topology.model import NoRouteError
from cosim.workload.synth.costs import PRECISIONS, Op
from cosim.workload.synth.layout import ParallelLayout, RankMap
from cosim.workload.synth.routing import RoutingSpec

if TYPE_CHECKING:
    from cosim.workload.synth.build import BuildOptions

__all__ = ["BatchSpec", "DecodeBatch", "PrefillBatch", "StragglerSpec", "Synthesized", "SyntheticSpec", "memory_options", "spec_card", "synthesize", "synthetic_figures"]


MAX_TOKENS = 2**30
"""Most tokens a sequence, prompt, chunk, KV cache or micro-batch (micro x seq) may hold: a thousand times the
longest published context (1M tokens); with a card's widest hidden size (:data:`cosim.capture.config.MAX_WIDTH`)
their activation and transfer bytes stay within the 64-bit counts of the step's tables (2**63 tokens per sequence
overflowed them)."""


class BatchSpec(Strict):
    """Global batch, micro-batch and sequence length (sequences and tokens)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    global_: int = Field(alias="global", gt=0)
    """Sequences per optimizer step over all data-parallel replicas."""
    micro: int = Field(default=1, gt=0)
    """Sequences per micro-batch (per pipeline, per forward/backward unit)."""
    seq: int = Field(gt=0, le=MAX_TOKENS)
    """Tokens per sequence."""
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    """Pipeline schedules per optimizer step (the gradient-accumulation steps of NeMo AutoModel and torchtitan, whose
    ``local_batch_size`` is ``global / (dp x gradient_accumulation_steps)``): PyTorch ``torch.distributed.pipelining``
    runs a whole 1F1B / interleaved schedule of ``global / (micro x dp x gradient_accumulation_steps)`` micro-batches
    per step, each with its own pipeline fill and drain, accumulating gradients; the last schedule's last backward
    reduces them over data parallelism and the optimizer runs once (:data:`cosim.workload.synth.schedule.GA_SOURCE`).
    1: one schedule of all the step's micro-batches (Megatron-Core). Needs the micro-batches per pipeline to be a
    multiple of it (of pp x it when interleaved), a 1f1b or interleaved schedule, and no ``a2a_overlap``."""

    @model_validator(mode="after")
    def _tokens(self) -> BatchSpec:
        if self.micro * self.seq > MAX_TOKENS:
            raise ValueError(f"micro x seq = {self.micro * self.seq} tokens per micro-batch; at most {MAX_TOKENS}")
        return self


class PrefillBatch(Strict):
    """A prefill step: prompt tokens per GPU, prompt length and the chunk of chunked prefill."""

    tokens_per_gpu: int = Field(gt=0, le=MAX_TOKENS)
    """Prompt tokens each GPU runs through the model per step (over its prompts' chunks)."""
    prompt: int = Field(gt=0, le=MAX_TOKENS)
    """Tokens per prompt (the keys a chunk's queries see grow up to it)."""
    chunk: int | None = Field(default=None, gt=0, le=MAX_TOKENS)
    """Chunked prefill: tokens of one prompt per step (default: the whole prompt, or tokens_per_gpu if smaller)."""


class DecodeBatch(Strict):
    """A decode step: one new token for each running request, over its KV cache."""

    requests_per_gpu: int = Field(gt=0)
    """Running requests (sequences) per GPU; each gets one output token per step."""
    context: int = Field(gt=0, le=MAX_TOKENS)
    """Tokens in each request's KV cache (prompt plus generated so far)."""


def _batch_kind(v: Any) -> str:
    """Which batch a ``batch:`` value is, by its fields (errors then name one kind's fields)."""
    keys = set(v) if isinstance(v, dict) else set(type(v).model_fields) if hasattr(type(v), "model_fields") else set()
    # tags start with "tagged-union" so that an error's path leaves them out (yamlio._describe)
    kind = "decode" if "requests_per_gpu" in keys else "prefill" if "tokens_per_gpu" in keys else "train"
    return f"tagged-union:{kind}"


def _routing_kind(v: Any) -> str | None:
    """Which form a ``routing:`` value takes (an error inside a mapping then names its own field, not "should be a
    valid string"): a name or file (a string), or a mapping."""
    if isinstance(v, str):
        return "tagged-union:name"
    return "tagged-union:spec" if isinstance(v, (dict, RoutingSpec)) else None


MAX_MICROBATCHES = 2**20
"""Most micro-batches per pipeline and step a training step may have. A coalesced step still keeps a few numbers per
micro-batch (tiny-moe on 8 GPUs, 2**20 micro-batches: 0.44 GB peak, 4 s) and one simulated whole takes about a
millisecond each (8192: 11 s, cosim run on a quiet core), so a larger count is a typo, not a batch."""


class StragglerSpec(Strict):
    """Per-rank slowdowns (no peer simulator has them): factors >= 1 keyed by global rank."""

    gpu: dict[int, float] = Field(default_factory=dict)
    """Rank -> factor on every kernel duration of that GPU (a slow or throttled GPU)."""
    host: dict[int, float] = Field(default_factory=dict)
    """Rank -> factor on every host launch (a slow or busy host CPU)."""
    launch_jitter: dict[int, Time] = Field(default_factory=dict)
    """Rank -> mean extra host time per kernel launch, e.g. "3 us" (exponentially distributed, seeded)."""


C10D_CALL_HOST = 73.5e-6
"""Measured host time of one ``torch.distributed`` collective call besides its CUDA launch calls (s): the median of
the per-row medians of every shared trace whose calls run on 2-8 ranks (9 rows from 5 jobs on V100, A100 and MI300X
hosts, 39-273 us: ``python -m validation.e2e.c10d_host``, ``default_net_s``; validation/e2e/RESULTS.md "c10d host
cost: evidence"; it was 78 us, the DLRM all-to-all alone, until round 7).
It stands for a call on :data:`C10D_REF_RANKS` ranks; an all-to-all's grows with its group by
:data:`C10D_PEER_HOST` per peer.
The default of ``SyntheticSpec.collective_host`` (training)."""

C10D_REF_RANKS = 8
"""Group size of the calls :data:`C10D_CALL_HOST` was measured on (2-8 ranks; the all-to-alls on 8)."""

C10D_PEER_HOST = 0.906e-6
"""Host time per peer of an all-to-all call (s): ``torch.distributed.all_to_all_single`` with split sizes posts one
``ncclSend`` and one ``ncclRecv`` per rank of the group inside one NCCL group call (validation/e2e/c10d_host.py
``A2A_PEER_SOURCE``). Measured: the least-squares slope over the group size of (all-to-all call less all-reduce
call, both net of their launch calls) in every shared trace with both (8 ranks: 0.5 and 29.0 us, 128 ranks: 118.0
and 129.0 us; ``c10d_host.per_peer_s``; validation/e2e/RESULTS.md "Round 8"). Thin evidence: two 8-rank jobs and
ranks 0 and 1 of one 128-rank job (4 calls each, the equal-split path, which posts the same per-peer pairs), the
group taken as the job's world. Subtracting the same trace's
all-reduce cancels the host's speed: an all-reduce call enqueues one NCCL collective whatever the group size, so
all-reduce, all-gather and reduce-scatter calls keep :data:`C10D_CALL_HOST`. The default of
``SyntheticSpec.collective_host_per_peer``."""


CudaGraphScope = Literal["attn", "moe_router", "moe_preprocess", "full_iteration"]
"""A ``cuda_graph_scope`` value a synthesized training step models: Megatron-Core's Transformer Engine partial-graph
scopes (``cuda_graph_impl: transformer_engine``; :func:`cosim.workload.synth.costs.graph_scoped`,
:data:`cosim.workload.synth.costs.CUDA_GRAPH_SOURCE`) and ``full_iteration`` (``cuda_graph_impl: full_iteration``,
:data:`cosim.workload.synth.build.FULL_ITERATION_SOURCE`). The one list of names: ``SyntheticSpec.cuda_graph_scope``
and validation/e2e/run.py's rows take it."""

CUDA_GRAPH_SCOPES: tuple[str, ...] = get_args(CudaGraphScope)
""":data:`CudaGraphScope`'s names, in order."""


def _scope_list(v: Any) -> Any:
    """``cuda_graph_scope: full_iteration`` (a bare string, as ``--set`` gives it) as a one-item list."""
    return [v] if isinstance(v, str) else v


class SyntheticSpec(Strict):
    """A synthesized training step: model card, parallel layout, batch, precision, routing."""

    model: str
    """Model card: a bundled card name (cosim/capture/presets), a card YAML or a Hugging Face config.json."""
    mode: Literal["train", "prefill", "decode"] = "train"
    """What one step is: train (forward, backward, optimizer), prefill (prompt chunks, forward) or
    decode (one token per running request, forward)."""
    layout: ParallelLayout = Field(default_factory=ParallelLayout)
    """Parallel layout; dp follows from the GPU count."""
    batch: Annotated[Annotated[BatchSpec, Tag("tagged-union:train")] | Annotated[PrefillBatch, Tag("tagged-union:prefill")]
                     | Annotated[DecodeBatch, Tag("tagged-union:decode")], Discriminator(_batch_kind)]
    """Batch sizes: {global, micro, seq} (train), {tokens_per_gpu, prompt, chunk} (prefill),
    {requests_per_gpu, context} (decode)."""
    mtp_layers: int | None = Field(default=None, ge=0)
    """Training: multi-token-prediction depths run on the last pipeline stage (DeepSeek-V3 section 2.2;
    Megatron-Core ``mtp_num_layers``, :func:`cosim.workload.synth.costs.mtp_ops`); None: the card's ``mtp_layers``
    (deepseek-v3: 1, as its config.json and Megatron-Bridge's DeepSeek-V3 recipe); 0: none (Megatron-Core's own
    default, NeMo AutoModel). Serving steps never run it."""
    optimizer: Literal["adam", "muon"] = "adam"
    """Training: the optimizer. ``adam``: Adam on every parameter (with ``layout.zero: 1`` Megatron-Core's
    distributed optimizer: gradient reduce-scatter, Adam on this rank's shard, parameter all-gather). ``muon``:
    Muon (Moonlight, arXiv:2502.16982; Megatron-Core ``optimizer: muon`` / ``dist_muon``) on every 2-D weight but
    the embedding and LM head, Adam on those and the norms: the gradients are all-reduced over data parallelism,
    each rank runs 5 Newton-Schulz iterations (3 GEMMs each) per weight matrix it owns and one fp32 momentum
    per parameter (``zero: 0``: every matrix of its stage; ``zero: 1``: the LayerWiseDistributedOptimizer of
    ``dist_muon``, whole matrices dealt over the dp group, then the updated parameters all-gathered at the step's
    end, so ``layout.overlap_param_gather`` must be false, its default with muon). Not with ``zero: fsdp``
    (:data:`cosim.workload.synth.costs.MUON_SOURCE`)."""
    optimizer_moments: Literal["fp32", "bf16"] = "fp32"
    """Memory only: dtype of Adam's two moments (Megatron-Core's precision-aware optimizer ``exp_avg_dtype`` /
    ``exp_avg_sq_dtype``; DeepSeek-V3 report section 3.3.3: bf16): 8 or 4 bytes per parameter over the DP group."""
    moe_act_input_fp8: bool = False
    """Memory only: the routed experts' SwiGLU input kept in FP8 for the backward (DeepSeek-V3 report section 3.3.3;
    :attr:`cosim.workload.synth.memory.MemoryOptions.moe_act_input_fp8`)."""
    overlap: Literal["none", "two-microbatch"] = "none"
    """Serving: run the step as one batch, or as two micro-batches whose communication overlaps the other's
    compute (DeepSeek's serving systems, SGLang's two-batch overlap)."""
    dispatch: Literal["nccl", "deepep", "deepep-ll", "hybridep"] | None = None
    """MoE dispatch/combine: NCCL all-to-all, DeepEP normal or DeepEP low-latency kernels (default: nccl for
    training, Megatron-Core's alltoall dispatcher; deepep for prefill, deepep-ll for decode). Training takes
    nccl, deepep (Megatron-Core's flex dispatcher with the DeepEP backend) or hybridep (the flex dispatcher with
    NVIDIA's HybridEP backend, ``moe_flex_dispatcher_backend: hybridep``: the routing map all-gathered, a host
    sync, dispatch + permute and unpermute + combine kernels; :func:`cosim.workload.synth.costs.hybridep_dispatch_ops`,
    :func:`cosim.engine.moe_comm.hybridep`)."""
    hybridep_sms: int = Field(default=16, ge=1)
    """Training, ``dispatch: hybridep``: SMs of each HybridEP kernel (Megatron-Core ``moe_hybridep_num_sms``, default
    16; Megatron-Bridge's performance harness sets 32): picks the measured rate table
    (:data:`cosim.engine.moe_comm.HYBRIDEP_GB200`). The SMs the kernels take from overlapped compute are the
    replay's ``gpu.comm_sms``."""
    cuda_graph_scope: Annotated[list[CudaGraphScope], BeforeValidator(_scope_list)] = Field(default_factory=list)
    """Training: Transformer Engine partial CUDA graphs (Megatron-Core ``cuda_graph_impl: transformer_engine`` with
    ``cuda_graph_scope``): the ops of the scoped modules run as one CUDA graph per contiguous run, forward and
    backward, each costing the host one graph launch (``graph_launch_overhead``) instead of an eager dispatch per
    kernel (:func:`cosim.workload.synth.costs.graph_scoped`); ``moe_preprocess`` needs ``moe_router`` (as
    Megatron-Core asserts). Empty: eager (``layout.cuda_graphs`` graphs whole layers). ``full_iteration`` (alone;
    a bare string is taken as a one-item list): Megatron-Core's ``cuda_graph_impl: full_iteration``, the whole
    forward-backward of every micro-batch as one graph, one launch per step, the optimizer eager after it; it has
    no host sync, so the MoE runs sync-free (:attr:`cosim.workload.synth.build.BuildOptions.full_iteration_graph`)."""
    comm_sms: int | None = Field(default=None, ge=0)
    """SMs a dispatch/combine kernel holds while compute overlaps it (default: 24 for deepep, the DeepEP
    README's ``Buffer.set_num_sms(24)``; the engine's 16 for nccl; 0 for deepep-ll, whose RDMA progress
    takes no SMs)."""
    kv_cache: Literal["bf16", "fp8"] = "bf16"
    """KV-cache element type (serving)."""
    dispatch_precision: Literal["bf16", "fp8"] | None = None
    """Element type of the MoE dispatch payload (fp8: 1 byte + one fp32 scale per 128 channels); the combine is bf16.
    Serving default: fp8 when ``precision`` is fp8 or mxfp8, else bf16. Training default: bf16 whatever
    ``precision`` is, as Megatron-Core dispatches: its alltoall dispatcher moves the permuted BF16 hidden states, its
    DeepEP ``fused_dispatch`` the BF16 input, FP8 dispatch is switched off in its DeepEP and HybridEP paths, and the
    FP8/MXFP8 casts happen inside the expert GEMMs (:data:`MEGATRON_DISPATCH_SOURCE`); fp8: DeepSeek-V3's own
    framework (report section 3.3: activations quantized to FP8 before the dispatch), forward only (gradients
    travel in bf16)."""
    precision: Literal["bf16", "fp8", "mxfp8"] = "bf16"
    """GEMM precision recipe."""
    fp8_recipe: Literal["blockwise", "current"] = "blockwise"
    """Scaling of ``precision: fp8``: blockwise (DeepSeek-V3's 1x128 / 128x128 blocks; also delayed scaling:
    one cast kernel per tensor) or current (Transformer Engine's per-tensor current scaling, Megatron-Bridge
    ``fp8_cs``: zero the amax, compute it, compute the scale, cast: four kernels per tensor, and per local
    expert in a grouped linear; :data:`cosim.workload.synth.costs.TE_QUANTIZE_SOURCE`)."""
    expert_precision: Literal["bf16", "fp8", "mxfp8"] | None = None
    """Training: GEMM recipe of the routed experts only (None: ``precision``), e.g. fp8 with ``precision: bf16`` for
    "FP8 experts": their grouped GEMMs (forward, dgrad, wgrad), the casts of their inputs and gradients, the FP8 row
    padding around them (``expert_padding``), their saved inputs and their quantized weight copies follow it;
    attention, the dense MLPs and the shared experts keep ``precision``, the dispatch payload
    ``dispatch_precision`` (:data:`cosim.workload.synth.costs.EXPERT_PRECISION_SOURCE`: an FP8 autocast region or
    module swap around Megatron-Core's ``TEGroupedMLP`` / TE ``GroupedLinear``; the shared experts are a dense
    MLP module). ``fp8_recipe`` sets the scaling of fp8 here too. The captures' counterpart is ``--set
    precision.experts=fp8``."""
    routing: Annotated[Annotated[str, Tag("tagged-union:name")] | Annotated[RoutingSpec, Tag("tagged-union:spec")],
                       Discriminator(_routing_kind, custom_error_type="routing_type",
                                     custom_error_message="routing must be uniform, zipf:S, a file, or a mapping "
                                                          "{model, placement, map, redundant, seed}")] = "uniform"
    """Routing model: uniform, zipf:S (a bare ``zipf`` is ``zipf:1.0``), a file, or a mapping with placement and
    redundant experts."""
    profile: str | None = None
    """Kernel-model calibration profile (bundled name or YAML); default: the accelerator's."""
    calibrate_from: str | list[str] | None = None
    """Trace(s) of the user's own measured step (Kineto files or a folder of ranks): the kernel models are
    fitted to their kernels (as ``cosim calibrate --from-traces``) and time this step's ops; the same
    fit then serves any layout of the model (Lumos-style re-layout keeping measured timings)."""
    fold: bool | None = None
    """Simulate one rank per pipeline stage (default: when routing is uniform and there are no stragglers)."""
    coalesce: bool = True
    """Training, 1F1B or interleaved: simulate the fewest micro-batches whose steady phase shows the step's
    period (checked on every rank), and extend it to the full step (:mod:`cosim.replay.periodic`); false:
    simulate every micro-batch."""
    allow_oom: bool = False
    """Run a layout that does not fit in GPU memory anyway (flagged in the result) instead of failing."""
    stragglers: StragglerSpec = Field(default_factory=StragglerSpec)
    """Slow GPUs and hosts."""
    dispatch_overhead: Time = 12e-6
    """Host time per launched kernel besides the CUDA launch call (eager framework dispatch: Python, the
    PyTorch dispatcher, allocation), e.g. "12 us". Default: the median host time between consecutive kernel
    launches of an eager decoder-only LLM on an H100 host (16.7 us, shared TraceLens H100 Qwen1.5-0.5B trace,
    ``python -m validation.e2e.host_cost``) less that host's launch call (4.6 us)."""
    expert_gemm_host: Time = 33e-6
    """Host time of each expert GEMM of a training grouped GEMM beyond the first, e.g. "33 us": Transformer
    Engine's ``GroupedLinear`` (Megatron-Core's TEGroupedMLP) runs one cuBLASLt GEMM per local expert from a host
    loop (descriptor set-up, algorithm heuristic, launch; ``multi_stream_cublas_gemm``), so a grouped GEMM over
    ``e`` local experts costs the host ``e`` of them, forward, dgrad and wgrad. Default: TransformerEngine PR
    #3134's measurement of that path on SM100, 0.267 ms for one grouped GEMM over 8 experts of 128 tokens
    (2048 x 2048; a single-launch kernel does the math in 0.069 ms): 33 us per expert GEMM. That benchmark
    (``--compare-nvfp4-grouped-gemm``) times the C++ entry point ``nvte_multi_tensor_gemm`` alone, forward:
    the module's own per-expert Python is not in it, and no source times that without a profiler attached
    (validation/e2e/RESULTS.md, "Round 14: s14-gl"). "0 us" models a single-launch grouped GEMM (CUTLASS /
    DeepGEMM)."""
    eager_step_host: Time | None = None
    """Training: host time of one eager framework step that launches no kernel, e.g. "12 us", charged (1) per
    parameter tensor whose gradient a backward op completes (autograd's ``AccumulateGrad`` node and Megatron-Core's
    per-parameter backward hook, in Python; Transformer Engine's ``GroupedLinear`` holds each local expert's weight
    as its own parameter, so a grouped GEMM's wgrad completes one per local expert: ``costs.PARAM_HOOK_SOURCE``)
    and (2) per further tensor an op's call allocates on its own (under per-tensor current scaling
    ``split_quantize`` allocates one quantized tensor per local expert: ``costs.TE_QUANTIZE_SOURCE``). Default (None): ``dispatch_overhead``, the measured host time of one
    eager step; "0 us" leaves both out."""
    collective_host: Time | None = C10D_CALL_HOST
    """Training: host time of one collective call besides the CUDA launch call, e.g. "73.5 us": a ``torch.distributed``
    collective goes through the Python binding, ProcessGroupNCCL's work and event bookkeeping and an NCCL group
    call (an all-to-all: one send and one receive per peer) before its kernel is launched. Default: the measured
    :data:`C10D_CALL_HOST` (scaled by the host CPU's ``host_time_factor``); null: the eager ``dispatch_overhead``
    of any op. Kernels a library launches behind its own Python call (HybridEP's dispatch and combine,
    ``costs.Op.c10d``) and the ring steps of TP overlap are not such calls."""
    collective_host_per_peer: Time = C10D_PEER_HOST
    """Training: host time per peer of an all-to-all call, on top of ``collective_host`` (which stands for a call on
    :data:`C10D_REF_RANKS` ranks): a call over ``n`` ranks costs ``collective_host + (n - 8) x`` this. Default: the
    measured :data:`C10D_PEER_HOST` (scaled by ``host_time_factor``); "0 us": one figure whatever the group. Only
    with ``collective_host`` set; not for DeepEP's dispatch and combine (one library call whose kernel reaches
    every peer: the host posts no per-peer send or receive)."""
    grad_reduce_in_fp32: bool = False
    """Training: reduce (and hold) gradients in fp32 (4 bytes per element) instead of bf16 (2). Megatron-Core's
    ``DistributedDataParallelConfig.grad_reduce_in_fp32`` defaults to false and every Megatron-Bridge performance
    config keeps it false (:data:`cosim.workload.synth.memory.GRAD_SOURCE`); Megatron-LM's own ``pretrain_gpt.py``
    launcher turns it on for bf16 training unless ``--grad-reduce-in-bf16`` (``arguments.py``: fp32 gradient
    accumulation and all-reduce). Sets the data-parallel reduction's bytes and the gradient buffer's memory."""
    cross_entropy_fusion: bool = True
    """Training: Megatron-Core's ``cross_entropy_loss_fusion`` (``--cross-entropy-loss-fusion``; set by the
    Megatron-Bridge performance configs): the loss as one fused op over the logits. False (Megatron-Core's own
    default, a Megatron-LM launch without the flag): its unfused vocabulary-parallel cross-entropy, six kernels
    over the fp32 logits forward and two backward
    (:data:`cosim.workload.synth.costs.CE_UNFUSED_SOURCE`). False on a serving step (mode prefill or decode,
    which computes no loss) is an error."""
    moe_router_fusion: bool = True
    """Training: Megatron-Core's ``moe_router_fusion`` (``--moe-router-fusion``, TE's fused top-k; what cosim
    modelled before the field): the router's score function and top-k as one fused op over the logits. False
    (Megatron-Core's own default, and the only path before the flag existed, Megatron-LM c08d89be): the eager
    kernels of ``topk_softmax_with_capacity``, top-k, softmax, the dense probabilities and the routing map built by
    zeros and scatters, its counts, with their backward
    (:data:`cosim.workload.synth.costs.ROUTER_UNFUSED_SOURCE`), as Megatron-LM ran them before the flag (1e057005,
    the ModelZoo rows' commit). Not modelled: a later Megatron-Core without the flag also gives the load-balancing
    loss a top-k mask and counts of its own (``compute_routing_scores_for_aux_loss(fused=False)``: top-k of the
    scores, the map's zeros, int cast, scatter and bool cast, its sum), a sigmoid router's ``+ 1e-20`` before the
    division, group-limited top-k and the top-k scaling factor (the cards carry neither). False on a serving step is
    an error."""
    grad_accumulation_fusion: bool = True
    """Training: Megatron-Core's ``gradient_accumulation_fusion`` (on in Megatron-LM and the Megatron-Bridge
    providers): every weight-gradient GEMM accumulates into the gradient buffer's ``main_grad``, reading and writing
    it each micro-batch (bytes: ``grad_reduce_in_fp32``'s; :data:`cosim.workload.synth.costs.MAIN_GRAD_SOURCE`).
    False (``--no-gradient-accumulation-fusion``): the wgrad GEMM writes ``.grad`` in the weight's dtype and
    Megatron-Core's backward hook adds it into ``main_grad`` (``main_grad.add_``; Megatron-FSDP with sharded
    gradients: ``copy_``), one more memory-bound kernel per weight
    (:data:`cosim.workload.synth.costs.MAIN_GRAD_HOOK_SOURCE`)."""
    moe_host_sync: bool = True
    """Dropless MoE: the host waits for each forward token permutation to read the per-expert token counts
    (Megatron-Core's all-to-all dispatcher); false models a sync-free dispatcher (padded capacity, device-side splits)."""
    tp_comm_overlap: bool = False
    """Training: TP all-gathers / reduce-scatters overlapped with their GEMMs (Megatron ``tp_comm_overlap``,
    Transformer Engine userbuffers; :mod:`cosim.workload.synth.tpoverlap`)."""
    offload_modules: list[Literal["attn_norm", "qkv_linear", "core_attn", "attn_proj", "mlp_norm", "expert_fc1",
                                  "moe_act"]] = Field(default_factory=list)
    """Training: Megatron-Core's fine-grained activation offloading (``--fine-grained-activation-offloading
    --offload-modules``, core_v0.16.0 and later): what these modules save for the backward (their input, and for
    ``moe_act`` also fc2's, as its group spans the activation through fc2) is copied to the host on a D2H stream
    after each module's forward, overlapped with the compute that follows, and copied back on an H2D stream while
    the backward of the group after it runs; the copies are host copies on the GPU's route to its CPU (PCIe, or
    NVLink-C2C on GB200), so they share it with anything else on it, and the memory model keeps on the GPU only
    what is not offloaded (:data:`cosim.workload.synth.memory.OFFLOAD_SOURCE`). ``attn_proj`` needs ``core_attn``;
    ``expert_fc1`` and ``moe_act`` exclude recomputing the whole MoE (``moe``); full recomputation keeps nothing to
    offload. Empty: off."""
    expert_padding: bool = True
    """Training, FP8/MXFP8: Megatron-Core's grouped MLP copies the local experts' rows into a buffer aligned for the
    quantized grouped GEMM (32 rows MXFP8, 16 FP8) and fc2's output back, and the inverse copies in the backward
    (``Fp8Padding`` / ``Fp8Unpadding``; :data:`cosim.workload.synth.costs.TE_PADDING_SOURCE`), as its all-to-all
    and DeepEP dispatchers deliver rows unaligned. false: the rows arrive aligned (the HybridEP dispatcher pads in
    its dispatch, ``pad_multiple``; or the run sets ``moe_router_padding_for_quantization``)."""


class Synthesized:
    """A synthesized step ready to replay, with what its figures need."""

    def __init__(self, spec: SyntheticSpec, card: Any, rm: Any, built: Any, memory: list[Any], hbm: float,
                 peak_flops: float, infer: Any = None, moe_span: dict[int, tuple[int, int]] | None = None) -> None:
        self.spec, self.card, self.rm, self.built, self.memory = spec, card, rm, built, memory
        self.hbm, self.peak_flops = hbm, peak_flops
        self.infer = infer
        """Serving: the :class:`cosim.workload.synth.infer.InferStep` and its :class:`InferMemory` (None: training)."""
        self.moe_span = moe_span or {}
        """Serving: rank -> (first, last) GPU op of its MoE layers."""

    @property
    def graph(self) -> Any:
        """The step's execution graph."""
        return self.built.graph

    @property
    def oom(self) -> bool:
        """A GPU needs more bytes than its memory (serving: the step's; training: the fullest stage's)."""
        if self.infer is not None:
            return self.infer[1].total > self.hbm
        return max(m.total for m in self.memory) > self.hbm


def _card(model: str, base: Path | None) -> Any:
    """The model card ``model`` names: a file (relative to ``base`` first) or a bundled card's name."""
    from cosim.capture.config import load_model_config

    p = Path(model)
    if base is not None and not p.is_absolute() and (base / p).is_file():
        p = base / p
    return load_model_config(p if p.is_file() else model)


MEGATRON_DISPATCH_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/transformer/moe/token_dispatcher.py "
                            "(MoEAlltoAllTokenDispatcher.token_dispatch: all_to_all of the permuted bf16 hidden "
                            "states; _DeepepManager: 'fp8_dispatch = False # Currently, we do not support fp8 "
                            "dispatch') and fused_a2a.py (hybrid_ep_dispatch: 'HybridEP dispatcher does not support "
                            "fp8 dispatch now')")
"""Why a synthesized training step dispatches bf16 tokens by default (``dispatch_precision``)."""

KernelTimeFn = Callable[[Sequence[Op]], list[float]]
"""Kernel durations (s) of a list of synthesized ops."""

TimerFactory = Callable[["SyntheticSpec", Any, "Path | None"], KernelTimeFn]
"""``factory(spec, accelerator, base) -> timer``: the kernel timer of a synthetic block on a catalog accelerator,
files it names relative to ``base`` (:func:`cosim.models.synth_timing.synthetic_kernel_timer`)."""


def spec_card(spec: SyntheticSpec, card: Any) -> Any:
    """``card`` as ``spec`` runs it: with the spec's ``mtp_layers`` (training; serving steps run no MTP)."""
    mtp = 0 if spec.mode != "train" else card.mtp_layers if spec.mtp_layers is None else spec.mtp_layers
    return card if mtp == card.mtp_layers else card.model_copy(update={"mtp_layers": mtp})


def memory_options(spec: SyntheticSpec) -> Any:
    """The memory model's framework settings that the spec sets (the gradient buffer's and Adam moments' bytes,
    FP8-cached SwiGLU inputs)."""
    from cosim.workload.synth.memory import MemoryOptions

    return MemoryOptions(grad_bytes=4.0 if spec.grad_reduce_in_fp32 else 2.0,
                         moment_bytes=(4.0 if spec.optimizer == "muon" or spec.optimizer_moments == "bf16"
                                       else 8.0),
                         moe_act_input_fp8=spec.moe_act_input_fp8,
                         offload_modules=tuple(spec.offload_modules), expert_precision=spec.expert_precision)


def _recipe(precision: str, fp8_recipe: str) -> str:
    """The :data:`cosim.workload.synth.costs.PRECISIONS` key of ``precision`` under ``fp8_recipe``."""
    return "fp8-cs" if precision == "fp8" and fp8_recipe == "current" else precision


def _optimizer_layout(spec: SyntheticSpec) -> ParallelLayout:
    """``spec.layout`` as its optimizer runs it: with Muon and ``zero: 1``, ``overlap_param_gather`` false unless set
    (the LayerWiseDistributedOptimizer gathers after its step); one-line errors for what Muon does not run."""
    lay = spec.layout
    if spec.optimizer != "muon":
        return lay
    where = "workload.synthetic.optimizer"
    if spec.mode != "train":
        raise CosimInputError(f"{where}: muon is a training field (mode is {spec.mode})")
    if lay.zero == "fsdp":
        raise CosimInputError(f"{where}: muon needs layout.zero 0 (muon) or 1 (dist_muon, Megatron-Core's "
                              f"LayerWiseDistributedOptimizer), not fsdp")
    if lay.zero == 1 and lay.overlap_param_gather:
        raise CosimInputError(f"{where}: dist_muon (layout.zero 1) gathers the updated parameters after its step: "
                              f"layout.overlap_param_gather must be false (Megatron-Bridge's Muon recipes set it so)")
    return lay.model_copy(update={"overlap_param_gather": False}) if lay.zero == 1 else lay


def _check_offload(spec: SyntheticSpec) -> None:
    """One-line errors for ``offload_modules`` combinations Megatron-Core rejects (transformer_config.py
    __post_init__) or that leave nothing to offload."""
    mods = spec.offload_modules
    if not mods:
        return
    where = "workload.synthetic.offload_modules"
    if spec.mode != "train":
        raise CosimInputError(f"{where}: activation offloading is a training field (mode train)")
    if len(set(mods)) != len(mods):
        raise CosimInputError(f"{where}: {mods} names a module twice")
    if "attn_proj" in mods and "core_attn" not in mods:
        raise CosimInputError(f"{where}: attn_proj needs core_attn (Megatron-Core: the input of attn_proj is the "
                              "output of core_attn, which core_attn's backward needs)")
    lay = spec.layout
    if lay.recompute == "full":
        raise CosimInputError(f"{where}: layout.recompute full keeps only each layer's input: nothing to offload")
    inside = sorted({"expert_fc1", "moe_act"} & set(mods))
    if inside and lay.recompute == "selective" and "moe" in lay.recompute_modules:
        raise CosimInputError(f"{where}: cannot offload {', '.join(inside)} while recomputing the whole MoE layer "
                              "(layout.recompute_modules moe)")


def _host_link(topology: Any, gpu: str) -> tuple[float, float]:
    """(bytes/s per direction after the links' efficiency, latency s) of ``gpu``'s route to its host CPU."""
    try:
        path = topology.route(gpu, topology.cpu_of(gpu))
        links = [topology.link(a, b) for a, b in pairwise(path)]  # typed hops: bandwidth, efficiency, latency
        return min(x.bandwidth * x.efficiency for x in links), sum(x.latency for x in links)
    except NoRouteError:  # a topology without a host CPU: PCIe Gen5 x16 at the catalog's efficiency
        return 64e9 * 0.87, 1e-6


def synthesize(spec: SyntheticSpec, topology: Any, base: Path | None = None, *,
               kernel_timer: TimerFactory) -> Synthesized:
    """Build the step of ``spec`` for every GPU of ``topology``, kernel durations from
    ``kernel_timer(spec, accelerator, base)`` (the scenario layer passes
    :func:`cosim.models.synth_timing.synthetic_kernel_timer`)."""
    from cosim.workload.synth.build import build_step
    from cosim.workload.synth.memory import memory_per_stage
    from cosim.workload.synth.routing import parse_routing

    card = spec_card(spec, _card(spec.model, base))
    gpus = len(topology.gpus)
    rm = _optimizer_layout(spec).resolve(card, gpus, where="workload.synthetic.layout")
    routing = parse_routing(spec.routing, str(base) if base else None)
    _check_stragglers(spec, gpus)
    gpu0 = topology.gpus[0]
    acc = topology.accelerator(gpu0)
    timer = kernel_timer(spec, acc, base)
    opts = _build_options(spec, topology, gpu0, acc, routing)
    _check_mode_fields(spec)
    if spec.mode != "train":
        return _synthesize_serving(spec, card, rm, opts, acc, timer, topology)
    _check_training_fields(spec, rm)
    opts = replace(opts, dispatch=spec.dispatch or "nccl",
                   graph_scopes=tuple(x for x in spec.cuda_graph_scope if x != "full_iteration"),
                   full_iteration_graph="full_iteration" in spec.cuda_graph_scope,
                   hybridep_sms=spec.hybridep_sms, optimizer=spec.optimizer)
    _check_offload(spec)
    opts, unlike = _placed(spec, rm, topology, opts, opts.dispatch)
    if spec.offload_modules:
        opts = replace(opts, offload_modules=tuple(spec.offload_modules), host_link=_host_link(topology, gpu0))
    b = spec.batch
    assert isinstance(b, BatchSpec)
    mbs, ga = _training_microbatches(b, rm)
    mem = memory_per_stage(card, rm, b.micro, b.seq, mbs // ga, spec.precision, memory_options(spec))
    hbm = float(acc.hbm_capacity) if hasattr(acc, "hbm_capacity") else math.inf
    worst = max(mem, key=lambda m: m.total)
    if worst.total > hbm and not spec.allow_oom:
        raise CosimInputError(
            f"workload.synthetic.layout: out of memory: stage {worst.stage} needs {worst.total / 2**30:.1f} GiB per "
            f"GPU (weights {worst.weights / 2**30:.1f}, gradients {worst.gradients / 2**30:.1f}, optimizer "
            f"{worst.optimizer / 2**30:.1f}, activations {worst.activations / 2**30:.1f}) > {hbm / 2**30:.0f} GiB of "
            f"{acc.name}; shard more, recompute, or set allow_oom: true (--set workload.synthetic.allow_oom=true)")
    built = build_step(card, rm, b.global_, b.micro, b.seq, replace(opts, grad_accum=ga), timer, device=acc.name)
    built.notes += unlike
    peak = float(acc.peak("bf16"))
    return Synthesized(spec, card, rm, built, mem, hbm, peak)


def _check_stragglers(spec: SyntheticSpec, gpus: int) -> None:
    """Refuse a straggler on a rank outside ``[0, gpus)``, a slowdown factor below 1 or a negative launch jitter."""
    for kind, d in (("gpu", spec.stragglers.gpu), ("host", spec.stragglers.host)):
        for r, f in d.items():
            if not 0 <= r < gpus or not (f >= 1 and math.isfinite(f)):
                raise CosimInputError(f"workload.synthetic.stragglers.{kind}.{r}: needs a rank in [0, {gpus}) "
                                      f"and a factor >= 1, got {f}")
    for r, v in spec.stragglers.launch_jitter.items():
        if not 0 <= r < gpus or not (float(v) >= 0 and math.isfinite(float(v))):
            raise CosimInputError(f"workload.synthetic.stragglers.launch_jitter.{r}: needs a rank in [0, {gpus}) "
                                  "and a time >= 0")


def _build_options(spec: SyntheticSpec, topology: Any, gpu0: Any, acc: Any, routing: RoutingSpec) -> BuildOptions:
    """The build options of ``spec`` common to training and serving: precision, routing, the host's launch costs
    (s) from the CPU of ``gpu0`` (scaled by its ``host_time_factor`` for training), gradient bytes, stragglers."""
    from cosim.workload.synth.build import BuildOptions

    try:
        cpu = topology.cpu_spec(topology.cpu_of(gpu0))
        launch = float(cpu.launch_overhead)
        host_factor = float(cpu.host_time_factor)
    except Exception:  # a topology without a host CPU
        launch, host_factor = 5e-6, 1.0
    # training: eager framework host work scales with the host CPU (cpus.yaml host_time_factor: Grace 2.75x a
    # DGX H100 Xeon, TransformerEngine issue #2053); expert_gemm_host is a measured figure of its own and is kept.
    # Serving keeps the x86 figures (its validation rows were set up with them).
    if spec.mode != "train":
        host_factor = 1.0
    launch *= host_factor
    return BuildOptions(precision=_recipe(spec.precision, spec.fp8_recipe), routing=routing,
                        expert_precision=(None if spec.expert_precision is None
                                          else _recipe(spec.expert_precision, spec.fp8_recipe)),
                        dispatch_bytes=(PRECISIONS[spec.dispatch_precision or "bf16"].dispatch_bytes
                                        if spec.mode == "train" else None), fold=spec.fold, launch_overhead=launch,
                        dispatch_overhead=float(spec.dispatch_overhead) * host_factor, moe_host_sync=spec.moe_host_sync,
                        tp_comm_overlap=spec.tp_comm_overlap, sm_count=int(acc.sm_count),
                        expert_padding=spec.expert_padding, grad_bytes=4.0 if spec.grad_reduce_in_fp32 else 2.0,
                        grad_accumulation_fusion=spec.grad_accumulation_fusion,
                        cross_entropy_fusion=spec.cross_entropy_fusion, moe_router_fusion=spec.moe_router_fusion,
                        expert_gemm_host=float(spec.expert_gemm_host),
                        collective_host=(None if spec.collective_host is None or spec.mode != "train"
                                         else float(spec.collective_host) * host_factor),
                        collective_peer_host=float(spec.collective_host_per_peer) * host_factor,
                        collective_ref_ranks=C10D_REF_RANKS,
                        eager_step_host=float(spec.dispatch_overhead if spec.eager_step_host is None
                                              else spec.eager_step_host) * host_factor,
                        gpu_slowdown=dict(spec.stragglers.gpu),
                        host_slowdown=dict(spec.stragglers.host),
                        launch_jitter={r: float(v) for r, v in spec.stragglers.launch_jitter.items()})


def _check_mode_fields(spec: SyntheticSpec) -> None:
    """Refuse a batch of another mode's shape, and training-only fields (expert precision, the unfused loss) on a
    serving step."""
    want = {"train": BatchSpec, "prefill": PrefillBatch, "decode": DecodeBatch}[spec.mode]
    if not isinstance(spec.batch, want):
        fields = {"train": "{global, micro, seq}", "prefill": "{tokens_per_gpu, prompt, chunk}",
                  "decode": "{requests_per_gpu, context}"}[spec.mode]
        raise CosimInputError(f"workload.synthetic.batch: mode {spec.mode} takes batch {fields}")
    if spec.mode != "train" and (spec.dispatch == "hybridep" or spec.cuda_graph_scope):
        raise CosimInputError("workload.synthetic: dispatch hybridep and cuda_graph_scope are training fields "
                              "(Megatron-Core); serving takes nccl, deepep or deepep-ll and layout.cuda_graphs")
    if spec.mode != "train" and spec.expert_precision is not None:
        raise CosimInputError("workload.synthetic.expert_precision: a training field (mode train); serving steps "
                              "take precision for every GEMM")
    if spec.mode != "train" and not spec.cross_entropy_fusion:
        raise CosimInputError("workload.synthetic.cross_entropy_fusion: a training field (mode train); a serving step "
                              "computes no loss (its head samples the next token)")
    if spec.mode != "train" and not spec.moe_router_fusion:
        raise CosimInputError("workload.synthetic.moe_router_fusion: a training field (mode train); serving steps "
                              "route with the fused op")


def _check_training_fields(spec: SyntheticSpec, rm: RankMap) -> None:
    """Refuse serving-only fields on a training step, and CUDA graph scopes Megatron-Core does not combine."""
    if spec.overlap != "none" or spec.comm_sms is not None:
        raise CosimInputError("workload.synthetic: overlap and comm_sms are serving fields (mode prefill or decode); "
                              "training overlaps through layout.a2a_overlap or layout.schedule dualpipe")
    if spec.dispatch == "deepep-ll":
        raise CosimInputError("workload.synthetic.dispatch: training takes nccl, deepep (DeepEP's normal "
                              "kernels) or hybridep; deepep-ll is the serving decode dispatch")
    if spec.cuda_graph_scope and rm.layout.cuda_graphs:
        raise CosimInputError("workload.synthetic.cuda_graph_scope: partial CUDA graphs exclude layout.cuda_graphs "
                              "(whole-layer graphs)")
    if "full_iteration" in spec.cuda_graph_scope and len(spec.cuda_graph_scope) > 1:
        raise CosimInputError("workload.synthetic.cuda_graph_scope: full_iteration stands alone (Megatron-Core: "
                              "'cuda_graph_modules must be empty when cuda_graph_impl=\"full_iteration\"')")
    if "moe_preprocess" in spec.cuda_graph_scope and "moe_router" not in spec.cuda_graph_scope:
        raise CosimInputError("workload.synthetic.cuda_graph_scope: moe_preprocess needs moe_router "
                              "(Megatron-Core: 'moe_preprocess cuda graph is only supported with moe_router')")


def check_microbatches(b: BatchSpec, rm: RankMap) -> int:
    """The micro-batches per pipeline and step of training batch ``b`` on ``rm`` (whole: the caller checked that
    ``micro x dp`` divides the global batch); refuses more than :data:`MAX_MICROBATCHES`."""
    mbs = b.global_ // (b.micro * rm.dp)
    if mbs > MAX_MICROBATCHES:
        raise CosimInputError(f"workload.synthetic.batch.global: {b.global_} sequences make {mbs} micro-batches per "
                              f"pipeline (micro {b.micro} x dp {rm.dp}); at most {MAX_MICROBATCHES} are simulated")
    return mbs


def _training_microbatches(b: BatchSpec, rm: RankMap) -> tuple[int, int]:
    """(micro-batches per pipeline and step, gradient-accumulation schedules) of training batch ``b`` on ``rm``;
    refuses a batch the layout's schedule cannot run."""
    if b.global_ % (b.micro * rm.dp):
        raise CosimInputError(f"workload.synthetic.batch.global: {b.global_} sequences are not divisible by "
                              f"micro {b.micro} x dp {rm.dp} = {b.micro * rm.dp}")
    mbs = check_microbatches(b, rm)
    ga = b.gradient_accumulation_steps
    if ga > 1 and (mbs % ga or rm.schedule == "dualpipe" or rm.layout.a2a_overlap):
        raise CosimInputError(f"workload.synthetic.batch.gradient_accumulation_steps: {ga} needs the {mbs} "
                              f"micro-batches per pipeline to be a multiple of it, a 1f1b or interleaved schedule "
                              f"(got {rm.schedule}) and no layout.a2a_overlap (repeated schedules: PyTorch pipelining)")
    if rm.vpp > 1 and (mbs // ga) % rm.pp:
        raise CosimInputError(f"workload.synthetic.batch.global: interleaved 1F1B needs the {mbs // ga} micro-batches "
                              f"per pipeline and schedule to be a multiple of pp {rm.pp}")
    if rm.layout.a2a_overlap and rm.pp > 1 and mbs < 2 * rm.pp:
        raise CosimInputError(f"workload.synthetic.layout.a2a_overlap: the EP all-to-all overlap with a pipeline needs "
                              f"at least 2 x pp = {2 * rm.pp} micro-batches per pipeline (got {mbs})")
    return mbs, ga


def _placed(spec: SyntheticSpec, rm: Any, topology: Any, opts: Any, dispatch: str) -> tuple[Any, list[str]]:
    """(``opts``, notes) after the placement checks (:mod:`cosim.workload.synth.placement`): an EP group that
    ``dispatch`` cannot run is an input error; a rank group placed unlike the one folding would simulate in its
    stead turns folding off, with a note saying which. A ``fold: true`` given in the scenario is kept, with a note
    that the folded step stands for that group too; with stragglers (every rank built anyway) nothing is noted."""
    from cosim.workload.synth.placement import Placement, check_dispatch, unlike_group

    where = Placement(topology)
    check_dispatch(rm, where, "deepep" if dispatch.startswith("deepep") else dispatch)
    built_whole = spec.fold is False or (spec.fold is None and bool(opts.gpu_slowdown or opts.host_slowdown
                                                                    or opts.launch_jitter))
    unlike = None if built_whole else unlike_group(rm, where)
    if unlike is None:
        return opts, []
    if spec.fold:
        return opts, [f"folded (fold: true) though the {unlike}: the simulated group's collectives stand for it "
                      "(docs/SYNTHESIS.md, Scale: folding)"]
    return replace(opts, fold=False), [f"not folded: the {unlike} (docs/SYNTHESIS.md, Scale: folding)"]


def _synthesize_serving(spec: SyntheticSpec, card: Any, rm: Any, opts: Any, acc: Any,
                        timer: KernelTimeFn, topology: Any) -> Synthesized:
    """The prefill or decode step of ``spec`` (:mod:`cosim.workload.synth.infer`)."""
    from cosim.workload.synth.costs import PRECISIONS
    from cosim.workload.synth.infer import InferStep, build_infer_step, infer_memory

    b = spec.batch
    dispatch = spec.dispatch or ("deepep" if spec.mode == "prefill" else "deepep-ll")
    opts, unlike = _placed(spec, rm, topology, opts, dispatch)
    sms = spec.comm_sms if spec.comm_sms is not None else {"deepep": 24, "nccl": 16, "deepep-ll": 0}[dispatch]
    n_sm = int(getattr(acc, "sm_count", 132))
    if sms >= n_sm:
        raise CosimInputError(f"workload.synthetic.comm_sms: {sms} SMs leave none of the {n_sm} of {acc.name} "
                              "for compute")
    scale = n_sm / (n_sm - sms) if spec.overlap == "two-microbatch" and not card.is_dense else 1.0
    if isinstance(b, PrefillBatch):
        chunk = b.chunk or min(b.prompt, b.tokens_per_gpu)
        if chunk > b.prompt:
            raise CosimInputError(f"workload.synthetic.batch.chunk: {chunk} is longer than the prompt {b.prompt}")
        per_gpu, q_len, ctx = float(b.tokens_per_gpu), float(chunk), float(b.prompt)
        head_rows = b.tokens_per_gpu * rm.tp / chunk
    else:
        assert isinstance(b, DecodeBatch)
        per_gpu, q_len, ctx = float(b.requests_per_gpu), 1.0, float(b.context)
        head_rows = b.requests_per_gpu * rm.tp
    dbytes = None if spec.dispatch_precision is None else PRECISIONS[spec.dispatch_precision].dispatch_bytes
    step = InferStep(spec.mode, per_gpu * rm.tp, q_len, ctx, head_rows, spec.overlap, dispatch, scale,
                     1.0 if spec.kv_cache == "fp8" else 2.0, dbytes)
    if "cuda_graphs" not in spec.layout.model_fields_set and spec.mode == "decode":
        rm.layout = rm.layout.model_copy(update={"cuda_graphs": True})  # serving engines capture decode graphs
    hbm = float(acc.hbm_capacity) if hasattr(acc, "hbm_capacity") else math.inf
    mem = infer_memory(card, rm, step, per_gpu, spec.precision, hbm)
    if mem.total > hbm and not spec.allow_oom:
        unit = "requests" if spec.mode == "decode" else "tokens"
        raise CosimInputError(
            f"workload.synthetic.batch: out of memory: {mem.total / 2**30:.1f} GiB per GPU (weights "
            f"{mem.weights / 2**30:.1f}, KV cache {mem.kv_cache / 2**30:.1f}, activations "
            f"{mem.activations / 2**30:.1f}) > {hbm / 2**30:.0f} GiB of {acc.name}; at most {mem.max_batch} {unit} "
            "per GPU fit; shard more or set allow_oom: true (--set workload.synthetic.allow_oom=true)")
    built, span = build_infer_step(card, rm, step, opts, timer, device=acc.name)
    built.notes += unlike
    return Synthesized(spec, card, rm, built, [], hbm, float(acc.peak("bf16")), (step, mem), span)


def bubble_fraction(syn: Synthesized, result: Any) -> float:
    """Pipeline bubble: mean over the simulated ranks of the share of the step (first unit's start
    to last unit's end) their compute stream idles before a schedule unit that receives from a
    neighbouring stage (waiting for its activations or gradients). Stage 0's wait for its first
    micro-batch and the last stage's wait for its first backward count; gaps before units that
    wait for nothing (no pipeline) do not."""
    fr = []
    by_rank = {run.rank: run for run in result.runs}
    for rank, spans in syn.built.unit_spans.items():
        run = by_rank.get(rank)
        if run is None or not spans:
            continue
        s, e = run.gpu_start, run.gpu_end
        window = float(e[spans[-1][1]] - s[spans[0][0]])
        idle = sum(max(0.0, float(s[a] - e[prev[1]])) for prev, (a, _, recv) in pairwise(spans) if recv)
        if window > 0:
            fr.append(idle / window)
    return float(sum(fr) / len(fr)) if fr else math.nan


def serving_figures(syn: Synthesized, result: Any) -> dict[str, Any]:
    """Per-step and per-layer time, throughput, time per output token, KV-cache memory and the
    largest batch that fits, of a replayed prefill or decode step (``cosim run --json`` fields)."""
    step_s = result.summary().get("step_time_s")
    ok = step_s is not None and step_s > 0
    st, mem = syn.infer
    world = syn.rm.world
    layer = []
    by_rank = {run.rank: run for run in result.runs}
    for rank, (a, z) in syn.moe_span.items():
        run = by_rank.get(rank)
        if run is not None:
            layer.append(float(run.gpu_end[z] - run.gpu_start[a]) / len(syn.card.moe_layers))
    tokens = syn.built.tokens_per_step
    out: dict[str, Any] = {
        "tokens_per_s_per_gpu": tokens / step_s / world if ok else None,
        "step_time_s": step_s,
        "layer_time_s": sum(layer) / len(layer) if layer else None,
        "mfu": syn.built.model_flops / (step_s * world * syn.peak_flops) if ok else None,
        "kv_cache_bytes_per_gpu": mem.kv_cache,
        "memory_per_gpu_bytes": mem.total,
        "memory": mem.as_dict(),
        ("max_requests_per_gpu" if st.mode == "decode" else "max_tokens_per_gpu"): mem.max_batch,
        "oom": syn.oom,
    }
    if st.mode == "decode":
        out["time_per_output_token_s"] = step_s
    out["synthetic"] = {
        "model": syn.card.name, "mode": st.mode, "gpus": world, "tp": syn.rm.tp, "pp": syn.rm.pp, "ep": syn.rm.ep,
        "etp": syn.rm.etp, "dp": syn.rm.dp, "microbatches": syn.built.microbatches, "overlap": st.overlap,
        "dispatch": st.dispatch, "compute_scale": st.compute_scale, "precision": syn.spec.precision,
        "kv_cache": syn.spec.kv_cache, "folded": syn.built.folded, "simulated_ranks": len(syn.built.ranks),
        "model_flops_per_step": syn.built.model_flops, "tokens_per_step": tokens,
    }
    return out


def synthetic_figures(syn: Synthesized, result: Any) -> dict[str, Any]:
    """Throughput, MFU, bubble and memory of a replayed synthesized step (``cosim run --json`` fields);
    serving steps: :func:`serving_figures`."""
    if syn.infer is not None:
        return serving_figures(syn, result)
    summ = result.summary()
    step = summ.get("step_time_s")
    world = syn.rm.world
    ok = step is not None and step > 0
    tokens = syn.built.tokens_per_step
    return {
        "tokens_per_s_per_gpu": tokens / step / world if ok else None,
        "mfu": syn.built.model_flops / (step * world * syn.peak_flops) if ok else None,
        "step_time_s": step,
        "bubble_fraction": bubble_fraction(syn, result),
        "memory_per_gpu_bytes": max(m.total for m in syn.memory),
        "memory_by_stage": [m.as_dict() for m in syn.memory],
        "oom": syn.oom,
        "synthetic": {
            "model": syn.card.name, "gpus": world, "tp": syn.rm.tp, "pp": syn.rm.pp, "vpp": syn.rm.vpp,
            "ep": syn.rm.ep, "etp": syn.rm.etp, "cp": syn.rm.cp, "dp": syn.rm.dp,
            "microbatches": syn.built.microbatches, "schedule": syn.rm.schedule,
            "precision": syn.spec.precision, "folded": syn.built.folded, "simulated_ranks": len(syn.built.ranks),
            "model_flops_per_step": syn.built.model_flops, "tokens_per_step": tokens,
            **({} if syn.spec.expert_precision is None else {"expert_precision": syn.spec.expert_precision}),
        },
    }
