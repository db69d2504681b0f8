"""One serving step (prefill or decode) of a model card on a parallel layout, as an execution graph.

Shares the training synthesis (:mod:`cosim.workload.synth.build`): the same per-layer ops
(:func:`cosim.workload.synth.costs.layer_ops`, with a :class:`~cosim.workload.synth.costs.Shard`
that says prefill chunk or decode), the same routing, rank map, folding and emit rules
(:meth:`_RankBuilder.emit`). Forward only: no backward, no gradients, no optimizer.

* Prefill: each GPU runs ``tokens`` tokens of ``tokens / chunk`` prompt chunks; a chunk's queries
  attend causally to its prompt's earlier tokens (the mean over a prompt's chunks of the causal
  cost is that of ``chunk`` queries over ``prompt`` keys, halved), its keys/values are appended to
  the KV cache, and the last position of each chunk goes through the LM head and sampling.
* Decode: each GPU runs one token for each of its ``requests`` requests, whose attention reads
  a KV cache of ``context`` tokens; every request gets one output token per step.

Overlap (``overlap``): ``none`` runs the step as one batch; ``two-microbatch`` splits it in two
halves whose ops alternate on the compute stream at every collective (DeepSeek's prefill and
decode systems, SGLang's two-batch overlap): one half's dispatch/combine runs while the other
computes, each half with its own communication streams and its own waits.

MoE dispatch/combine (``dispatch``): ``nccl`` (all-to-all(v) flows), ``deepep`` (DeepEP normal
kernels: RDMA once per destination node, NVLink forwarding) or ``deepep-ll`` (low-latency kernels:
every selection straight to its GPU) run by :mod:`cosim.engine.moe_comm` through the collective's
engine label. Communication kernels that take SMs (``comm_sms``) slow the compute they overlap:
with two overlapped micro-batches every compute kernel runs on ``sm_count - comm_sms`` SMs
(the share is applied here, and the graph's ``source["comm_share"]`` is False so that replay does not
charge it again per kernel, cosim.replay.interference); DeepEP's low-latency kernels progress RDMA without
SMs (``comm_sms`` 0).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from cosim.capture.config import MoEModelConfig
from cosim.workload.synth.build import BuildOptions, Built, _RankBuilder, _shard, _splits
from cosim.workload.synth.costs import PRECISIONS, Op, Shard, embedding_ops, layer_ops, sample_head_ops
from cosim.workload.synth.layout import RankMap
from cosim.workload.synth.routing import route

__all__ = ["InferMemory", "InferStep", "build_infer_step", "deepep_label", "infer_memory"]


@dataclass(frozen=True)
class InferStep:
    """What one serving step is, per TP group of ranks (tokens before sequence-parallel splitting)."""

    mode: str
    """prefill or decode."""
    tokens: float
    """Tokens one TP group runs through the layers this step (tp x tokens per GPU)."""
    q_len: float
    """Queries per sequence in this pass: the prefill chunk, 1 for decode."""
    context: float
    """Keys each query sees: the prompt (prefill) or the cached context (decode)."""
    head_rows: float
    """Positions that emit a token this step (one per prefill chunk, one per decode request)."""
    overlap: str = "none"
    """none or two-microbatch."""
    dispatch: str = "nccl"
    """nccl, deepep or deepep-ll."""
    compute_scale: float = 1.0
    """Factor on compute kernels overlapped by SM-holding communication (sm / (sm - comm_sms))."""
    kv_bytes: float = 2.0
    """Bytes per KV-cache element."""
    dispatch_bytes: float | None = None
    """Bytes per dispatched element (None: the precision recipe's)."""


def deepep_label(kind: str, mode: str, tokens: float, token_bytes: float, topk: int, experts: int) -> str:
    """Engine label of a DeepEP dispatch/combine: ``deepep_<kind>:<mode>:<tokens per rank>:<bytes per
    token>:<topk>:<experts>`` (read by the replay's collective runner)."""
    return f"deepep_{kind}:{mode}:{tokens:.6g}:{token_bytes:.6g}:{topk}:{experts}"


def _serving_micro_batches(step: InferStep, rm: RankMap) -> tuple[InferStep, int, float]:
    """``step`` (its chunk shortened to a micro-batch's tokens when a micro-batch holds part of one chunk, as
    SGLang splits), its micro-batches (2 under two-batch overlap) and the tokens of each per TP group; refuses
    pipeline parallelism and micro-batches that are not whole chunks or requests."""
    from cosim.errors import CosimInputError

    if rm.pp != 1:
        raise CosimInputError("workload.synthetic.layout.pp: inference with pipeline parallelism is not "
                              f"modelled yet (pp {rm.pp}); use tp / ep / dp")
    n_mb = 2 if step.overlap == "two-microbatch" else 1
    T = step.tokens / n_mb
    if 1 <= T < step.q_len and step.q_len % T == 0:
        step = replace(step, q_len=T)
    if T < 1 or T % step.q_len:
        raise CosimInputError(f"workload.synthetic.batch: {step.tokens:g} tokens per TP group in {n_mb} "
                              f"micro-batch(es) are not whole {'chunks' if step.mode == 'prefill' else 'requests'} "
                              f"of {step.q_len:g} tokens")
    return step, n_mb, T


def build_infer_step(card: MoEModelConfig, rm: RankMap, step: InferStep, opts: BuildOptions, predict: Any,
                     device: str = "GPU") -> tuple[Built, dict[int, tuple[int, int]]]:
    """Synthesize one serving step. Returns the build and, per simulated rank, the (first, last) GPU
    op of its MoE layers (for the per-layer time)."""
    step, n_mb, T = _serving_micro_batches(step, rm)
    p = replace(PRECISIONS[opts.precision], cast_copies=1)  # serving: a cast feeds the forward GEMM only
    if step.dispatch_bytes is not None:
        p = replace(p, dispatch_bytes=step.dispatch_bytes)
    tm = T / rm.tp if rm.sequence_parallel and rm.tp > 1 else T
    routes = {} if card.is_dense else {ly: route(opts.routing, card, ly, rm.ep, tm) for ly in card.moe_layers}
    fold = opts.fold if opts.fold is not None else (opts.routing.is_uniform and not opts.gpu_slowdown
                                                    and not opts.host_slowdown and not opts.launch_jitter)
    ranks = [0] if fold else list(range(rm.world))
    graphs, moe_span = [], {}
    cache: dict[Any, tuple[list[Op], list[float]]] = {}
    base = Shard(tp=rm.tp, cp=rm.cp, sequence_parallel=rm.sequence_parallel, q_len=step.q_len,
                 decode=step.mode == "decode", kv_bytes=step.kv_bytes)
    deepep = step.dispatch != "nccl" and opts.routing.is_uniform
    mode = "low_latency" if step.dispatch == "deepep-ll" else "normal"

    def layer(rank: int, ly: int) -> tuple[list[Op], list[float]]:
        """Layer ``ly``'s ops on ``rank`` and their durations (s), once per kind of layer and shard."""
        sh = _shard(rm, card, rank, ly, routes, T)
        sh = replace(sh, q_len=base.q_len, decode=base.decode, kv_bytes=base.kv_bytes)
        key = (ly if ly in routes and not opts.routing.is_uniform else ly < card.dense_layers, card.window(ly), sh)
        if key not in cache:
            ops = layer_ops(card, ly, T, step.context, sh, p)
            cache[key] = (ops, predict(ops))
        return cache[key]

    ends = (embedding_ops(card, T, base, p), sample_head_ops(card, step.head_rows / n_mb, base, p))
    end_durs = tuple(predict(o) for o in ends)

    def one_rank(rank: int) -> Any:
        """Rank ``rank``'s step: its graph and the (first, last) GPU op of its MoE layers."""
        gslow = opts.gpu_slowdown.get(rank, 1.0)
        launch = (opts.launch_overhead + opts.dispatch_overhead) * opts.host_slowdown.get(rank, 1.0)
        rb = _RankBuilder(rank, rm.world, device)
        groups = {k: rm.group(k, rank) for k in ("tp", "cp", "ep", "etp", "dp", "edp")}
        first_moe: list[int] = []
        last_moe: list[int] = []

        def label(o: Op) -> str | None:
            if not deepep or o.comm is None or not o.comm.kind.startswith("all_to_all"):
                return None
            kind = "dispatch" if o.comm.kind == "all_to_all_dispatch" else "combine"
            bpt = o.comm.nbytes / (tm * card.top_k) if kind == "dispatch" else p.act_bytes * card.hidden_size
            return deepep_label(kind, mode, tm, bpt, card.top_k, card.num_experts)

        def micro_batch() -> Iterator[None]:
            scale = gslow * step.compute_scale
            for o, d in zip(ends[0], end_durs[0]):
                rb.emit(o, d * scale, groups, launch, label=label(o))
            for ly in range(card.num_layers):
                ops, durs = layer(rank, ly)
                n0 = len(rb.g["name"])
                for o, d in zip(ops, durs):
                    splits = None
                    if (o.comm is not None and o.comm.kind.startswith("all_to_all") and ly in routes
                            and not opts.routing.is_uniform):  # skew: per-peer bytes (as training)
                        splits = _splits(o, routes[ly].send_fraction)
                    rb.emit(o, d * scale, groups, launch, splits, label(o))
                    if o.cls == "collective":
                        yield
                if ly in routes:
                    first_moe.append(n0)
                    last_moe.append(len(rb.g["name"]) - 1)
            for o, d in zip(ends[1], end_durs[1]):
                rb.emit(o, d * scale, groups, launch, label=label(o))

        if rm.layout.cuda_graphs:  # the whole forward captured as one graph (serving engines' decode graphs)
            rb.open_graph(opts.graph_launch_overhead * opts.host_slowdown.get(rank, 1.0))
        rb.interleave([(micro_batch(), lane) for lane in range(n_mb)])  # alternate them at their collectives
        rb.switch(0)
        rb.close_graph()
        if first_moe:
            moe_span[rank] = (min(first_moe), max(last_moe))
        return rb.finish(comm_share=False)  # compute_scale charged the communication SMs (module docstring)

    for rank in ranks:
        graphs.append(one_rank(rank))
    from cosim.workload.graph import ExecutionGraph

    tokens = step.tokens / rm.tp * rm.world if step.mode == "prefill" else step.head_rows / rm.tp * rm.world
    notes = []
    if fold:
        notes.append(f"folded {rm.world} ranks into 1 class (uniform routing: every rank runs the same program)")
    if step.dispatch != "nccl" and not deepep:
        notes.append("skewed routing: dispatch/combine run as all-to-allv flows with per-peer splits, not DeepEP")
    flops = sum(float(sum(o.flops for o in layer(ranks[0], ly)[0] if o.cls != "collective"))
                for ly in range(card.num_layers)) * n_mb * rm.world
    built = Built(ExecutionGraph(graphs), ranks, fold, n_mb, round(tokens), flops, {}, notes)
    return built, moe_span


@dataclass(frozen=True)
class InferMemory:
    """Bytes on one serving GPU and the largest batch that fits."""

    weights: float
    """This rank's parameters at the serving precision (linear layers and experts at the GEMM input
    width, embedding, LM head, norms and router in bf16)."""
    kv_cache: float
    """The KV cache of the batch (all layers)."""
    activations: float
    """Working set: the bytes the ops of the largest layer produce and read back (what training keeps
    for its backward, :attr:`Op.saved`), per micro-batch in flight."""
    overhead: float
    """CUDA context, communication buffers, allocator slack (flat)."""
    hbm: float
    """The GPU's memory."""
    kv_per_unit: float
    """KV-cache bytes per request (decode) or per prefill token."""
    act_per_unit: float
    """Activation bytes per request (decode) or per prefill token."""

    @property
    def total(self) -> float:
        """Everything, bytes."""
        return self.weights + self.kv_cache + self.activations + self.overhead

    @property
    def max_batch(self) -> int:
        """Most requests per GPU (decode) or tokens per GPU (prefill) whose KV cache and activations fit."""
        free = self.hbm - self.weights - self.overhead
        per = self.kv_per_unit + self.act_per_unit
        return max(int(free // per), 0) if per > 0 else 0

    def as_dict(self) -> dict[str, float]:
        """The fields and the total, bytes, by name."""
        return {"weights": self.weights, "kv_cache": self.kv_cache, "activations": self.activations,
                "overhead": self.overhead, "total": self.total}


def infer_memory(card: MoEModelConfig, rm: RankMap, step: InferStep, per_gpu: float, precision: str,
                 hbm: float) -> InferMemory:
    """Memory of one GPU for ``per_gpu`` requests (decode) or tokens (prefill). KV cache: every
    sequence of the batch holds ``context`` tokens per layer (:func:`kv_cache_bytes_per_token`;
    a prefill chunk belongs to a prompt whose cache grows to ``context`` tokens, so ``per_gpu /
    q_len`` prompts of ``context`` tokens are held)."""
    from cosim.workload.synth.costs import kv_cache_bytes_per_token, layer_params
    from cosim.workload.synth.memory import OVERHEAD_BYTES

    p = PRECISIONS[precision]
    dense = expert = 0.0
    for ly in range(card.num_layers):
        d, e = layer_params(card, ly)
        dense += d / rm.tp
        expert += e / (rm.ep * rm.etp)
    weights = (dense + expert) * p.gemm_in_bytes + 2.0 * card.vocab_size * card.hidden_size / rm.tp * 2.0
    kv_tok = kv_cache_bytes_per_token(card, rm.tp, step.kv_bytes) * card.num_layers
    # per GPU unit: a decode request holds `context` tokens; a prefill token's prompt holds context / q_len
    # tokens per token of the chunk. A TP group serves tp x per_gpu of them, each rank holding its share
    # of every one (GQA: its KV heads; MLA: the whole latent, so MLA under TP replicates the cache tp times)
    kv_unit = kv_tok * step.context / (step.q_len if step.mode == "prefill" else 1.0) * rm.tp
    n_mb = 2 if step.overlap == "two-microbatch" else 1
    T = step.tokens / n_mb
    sh = Shard(tp=rm.tp, ep=rm.ep, etp=rm.etp, sequence_parallel=rm.sequence_parallel, q_len=step.q_len,
               decode=step.mode == "decode", kv_bytes=step.kv_bytes)
    act = max(sum(o.saved for o in layer_ops(card, ly, T, step.context, sh, p)) for ly in {0, card.num_layers - 1})
    act *= n_mb
    act_unit = act / per_gpu if per_gpu else 0.0
    return InferMemory(weights, kv_unit * per_gpu, act, OVERHEAD_BYTES, hbm, kv_unit, act_unit)
