"""Build one training step as an execution graph (docs/EXECUTION_GRAPH.md).

For every simulated rank: one host thread that launches each kernel (eager PyTorch:
the CPU's launch overhead plus a per-op dispatch cost), GPU ops on streams (compute,
and one stream per communication group: tp, ep, dp, cp, and one per pipeline
channel), event-wait edges where an op needs another stream's result, collectives
with their process group and a sequence number that matches them across ranks, and a
final synchronize. Units of work follow the pipeline schedule
(:mod:`cosim.workload.synth.schedule`); within a unit, the ops of
:mod:`cosim.workload.synth.costs` in order.

Streams and waits: a collective waits for the last compute op before it; a compute op
waits for every collective issued since (shared-expert ops only for their own, so the
shared expert overlaps the dispatch all-to-all, as Megatron's
``--moe-shared-expert-overlap``). Pipeline activations and gradients are point-to-point
transfers matched by (pair, message id); each direction and kind has its own stream, so
every channel is FIFO on both ends and the schedule cannot deadlock. DP gradient
buckets go out on the dp stream during the last micro-batch's backward (overlapped
with it), the optimizer runs after, then (ZeRO-1) the parameter all-gather. Under the EP
all-to-all overlap (``a2a_overlap``) a forward and another micro-batch's backward run layer by
layer in Megatron-Core's combined-1F1B order, their all-to-alls on one stream (docs/SYNTHESIS.md).

Folding: under uniform routing every rank of a pipeline stage runs the same program,
so only one rank per stage is built (tp, cp and dp index 0); its TP/EP/DP collectives
name their whole group, and replay runs each on all the group's GPUs (the other
members' traffic on the links; see docs/SYNTHESIS.md for what that leaves out).

Code: :func:`build_step` holds the step's shared plans in a :class:`_StepPlan` (batch shape, recipe, routing,
memoized layer ops and durations) and builds each simulated rank with a :class:`_StepRank` (one method per
phase: forward and backward chunks, pipeline sends, FSDP gathers, the DualPipe and 1F1B schedules, the
gradient reductions and optimizer; :class:`_Paired` for the combined 1F1B of ``a2a_overlap``), which records
the rank's host thread and GPU ops in a :class:`_RankBuilder`. A layer's forward, backward or recomputation is a
block the builder records once per distinct entry and replays for the other micro-batches (:meth:`_RankBuilder.block`,
docs/SYNTHESIS.md "Scale: folding", complexity).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, NamedTuple

import numpy as np

from cosim.capture.config import MoEModelConfig
from cosim.workload.graph import (
    CollType,
    CopyKind,
    EdgeKind,
    ExecutionGraph,
    GpuKind,
    HostKind,
    OpClass,
    RankGraph,
    SeqSource,
    StringTable,
    Table,
    gc_paused,
    ragged_arrays,
)
from cosim.workload.synth.costs import (
    Comm,
    Op,
    Precision,
    Shard,
    backward_ops,
    early_stop_end,
    embedding_ops,
    forward_name,
    graph_scoped,
    head_ops,
    layer_ops,
    layer_params,
    mtp_body_layer,
    mtp_depth,
    mtp_embedding_copy,
    mtp_layer_index,
    mtp_ops,
    mtp_params,
    mtp_recomputed_full,
    muon_matrices,
    muon_ops,
    recipe_with_experts,
    recomputed,
)
from cosim.workload.synth.layout import RankMap
from cosim.workload.synth.routing import RoutingSpec, route
from cosim.workload.synth.schedule import Unit, accumulated_order, dualpipe_order, steady_bounds
from cosim.workload.synth.tpoverlap import overlap_ops

__all__ = ["BuildOptions", "Built", "build_step"]

_COLL_TYPE = {"all_gather": CollType.ALL_GATHER, "reduce_scatter": CollType.REDUCE_SCATTER,
              "all_reduce": CollType.ALL_REDUCE, "all_to_all_dispatch": CollType.ALL_TO_ALL,
              "all_to_all_combine": CollType.ALL_TO_ALL, "send_recv": CollType.SEND_RECV}
_CLS = {"gemm": OpClass.GEMM, "grouped_gemm": OpClass.GROUPED_GEMM, "attention": OpClass.ATTENTION,
        "elementwise": OpClass.ELEMENTWISE, "norm": OpClass.NORM, "reduction": OpClass.REDUCTION,
        "moe_dispatch": OpClass.MOE_DISPATCH, "moe_combine": OpClass.MOE_COMBINE, "collective": OpClass.COLLECTIVE}
_STREAMS = {"compute": 7, "tp": 20, "ep": 21, "dp": 22, "cp": 23, "etp": 21}
FULL_ITERATION_SOURCE = ("NVIDIA/Megatron-LM megatron/core/full_cuda_graph.py (FullCudaGraphWrapper: after "
                         "cuda_graph_warmup_steps the whole forward_backward_func, every micro-batch's forward and "
                         "backward with finalize_model_grads, is captured as one torch.cuda.CUDAGraph and replayed; "
                         "the optimizer step stays outside), transformer_config.py (cuda_graph_impl full_iteration "
                         "needs an empty cuda_graph_scope), arguments (no overlap_p2p_comm); NVIDIA-NeMo/"
                         "Megatron-Bridge r0.5.0 performance recipes (full_iteration with the sync-free MoE: "
                         "moe_expert_rank_capacity_factor 1.5, moe_paged_stash, check_for_nan_in_loss False)")
"""Where :attr:`BuildOptions.full_iteration_graph` comes from."""

MUON_BYTES = 26.0
"""HBM bytes per local (owned) parameter of one Muon step besides the gradient (:func:`_adam_grad_bytes`): the fp32
momentum read and written (8), the Newton-Schulz input written and its output read (4 + 4), the fp32 master read
and written (8) and the bf16 parameter written (2) (:data:`cosim.workload.synth.costs.MUON_SOURCE`)."""

ADAM_BYTES = 30.0
"""HBM bytes per local (shard) parameter of one distributed-optimizer step besides the gradient: fp32 master weight,
Adam m and v read and written (24), the updated master read and written back to the bf16 parameter (4 + 2). The
gradient adds :func:`_adam_grad_bytes` per shard parameter and the zeroing of this rank's whole gradient buffer
(Megatron-Core core_v0.16.0 distrib_optimizer.py: bf16 main gradients copied to an fp32 shard before the step;
param_and_grad_buffer.py ``zero_grad_buffer`` zeroes the full local buffer)."""


def _adam_grad_bytes(grad_bytes: float) -> float:
    """HBM bytes per shard parameter the optimizer moves for its gradient: bf16 gradients are copied to fp32 (read 2,
    write 4) and read by Adam (4); fp32 gradients are read (4)."""
    return 10.0 if grad_bytes < 4.0 else 4.0


@dataclass(frozen=True)
class BuildOptions:
    """What to build besides the model, layout and batch."""

    precision: str = "bf16"
    """bf16, fp8 or mxfp8 (:data:`cosim.workload.synth.costs.PRECISIONS`)."""
    expert_precision: str | None = None
    """The routed experts' recipe when it differs from ``precision`` (a ``PRECISIONS`` key,
    :attr:`cosim.workload.synth.costs.Precision.experts`); None: ``precision``."""
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    """Routing model."""
    cross_entropy_fusion: bool = True
    """Megatron-Core's ``cross_entropy_loss_fusion``: the loss as one fused op; False: its unfused kernels
    (:func:`cosim.workload.synth.costs.unfused_cross_entropy_ops`)."""
    moe_router_fusion: bool = True
    """Training: Megatron-Core's ``moe_router_fusion``: the router's score function and top-k as one fused op; False:
    the eager kernels of the unfused path (:func:`cosim.workload.synth.costs.unfused_router_ops`)."""
    grad_accumulation_fusion: bool = True
    """Megatron-Core's gradient accumulation fusion: every weight-gradient GEMM reads and writes its weight's
    ``main_grad`` (``grad_bytes`` per element: :data:`cosim.workload.synth.costs.MAIN_GRAD_SOURCE`); False:
    the wgrad GEMM writes the gradient in the weight's dtype and Megatron-Core's backward hook adds it into
    ``main_grad`` with a kernel of its own (:meth:`main_grad_hook_bytes`)."""
    fold: bool | None = None
    """Build one rank per pipeline stage (None: whenever routing is uniform and there are no stragglers; under
    skewed routing without stragglers, None builds one rank per (stage, expert position): :func:`_skew_classes`;
    False: every rank)."""
    launch_overhead: float = 5e-6
    """Host time of one kernel launch call (s): the CPU's launch overhead."""
    dispatch_overhead: float = 12e-6
    """Host time per op besides the launch call (eager framework dispatch, s; see
    :attr:`cosim.workload.synth.spec.SyntheticSpec.dispatch_overhead`)."""
    gpu_slowdown: dict[int, float] = field(default_factory=dict)
    """Straggler GPUs: rank -> factor on every kernel duration."""
    host_slowdown: dict[int, float] = field(default_factory=dict)
    """Slow hosts: rank -> factor on every host launch time."""
    graph_launch_overhead: float = 10e-6
    """Host time of one cudaGraphLaunch (s), with ``layout.cuda_graphs``."""
    launch_jitter: dict[int, float] = field(default_factory=dict)
    """Rank -> mean extra host time per launch (s), exponentially distributed, seeded by the rank."""
    expert_gemm_host: float = 33e-6
    """Host time of each expert GEMM launch of a grouped GEMM beyond its first (s; ``Op.launches``, see
    :attr:`cosim.workload.synth.spec.SyntheticSpec.expert_gemm_host`)."""
    grad_bytes: float = 2.0
    """Bytes per gradient element reduced over data parallelism: 2 (bf16, Megatron-Core's DDP default and the
    Megatron-Bridge configs), 4 with ``grad_reduce_in_fp32`` (:attr:`cosim.workload.synth.spec.SyntheticSpec
    .grad_reduce_in_fp32`)."""
    collective_host: float | None = None
    """Host time of one collective call besides the launch call (s; None: ``dispatch_overhead``, see
    :attr:`cosim.workload.synth.spec.SyntheticSpec.collective_host`)."""
    collective_peer_host: float = 0.0
    """Host time per peer of an all-to-all call beyond ``collective_host`` (s; see
    :attr:`cosim.workload.synth.spec.SyntheticSpec.collective_host_per_peer`): a call over ``n`` ranks adds
    ``(n - collective_ref_ranks)`` times it."""
    collective_ref_ranks: int = 8
    """Group size ``collective_host`` stands for."""
    eager_step_host: float = 12e-6
    """Host time of one eager framework step without a kernel (s; ``Op.params``, ``Op.outputs``, see
    :attr:`cosim.workload.synth.spec.SyntheticSpec.eager_step_host`)."""
    dispatch: str = "nccl"
    """Training MoE dispatch/combine: ``nccl`` (all-to-all(v) flows, Megatron-Core's alltoall dispatcher) or
    ``deepep`` (Megatron-Core's flex dispatcher with DeepEP's normal kernels: RDMA once per destination node,
    NVLink forwarding, :func:`cosim.engine.moe_comm.deepep`; uniform routing only, skewed routing keeps
    all-to-allv flows with per-peer splits) or ``hybridep`` (the flex dispatcher with HybridEP:
    :func:`cosim.workload.synth.costs.hybridep_dispatch_ops`, :func:`cosim.engine.moe_comm.hybridep`)."""
    hybridep_sms: int = 16
    """SMs of each HybridEP dispatch/combine kernel (Megatron-Core ``moe_hybridep_num_sms``, default 16)."""
    full_iteration_graph: bool = False
    """Training: the whole forward-backward of every micro-batch (with the DP gradient reductions and
    ``finalize_model_grads``) is one CUDA graph, one ``cudaGraphLaunch`` per step; the optimizer runs eagerly after
    it (Megatron-Core ``cuda_graph_impl: full_iteration``, :data:`FULL_ITERATION_SOURCE`). No host sync inside: the
    dropless token-count syncs are gone (Megatron-Bridge pairs it with its sync-free MoE: static expert capacity)."""
    graph_scopes: tuple[str, ...] = ()
    """Transformer Engine partial CUDA graphs (Megatron-Core ``cuda_graph_impl: transformer_engine``,
    ``cuda_graph_scope``): ``attn``, ``moe_router``, ``moe_preprocess``; the ops of the scoped modules launch as
    one graph per contiguous run, forward and backward (:func:`cosim.workload.synth.costs.graph_scoped`)."""
    dispatch_bytes: float | None = None
    """Training: bytes per element of the forward dispatch payload (None: the precision recipe's
    ``dispatch_bytes``); the backward transfers and the combine move bf16 (:attr:`Precision.act_bytes`)."""
    moe_host_sync: bool = True
    """Dropless MoE: the host blocks (cudaStreamSynchronize) after each forward token permutation until the GPU
    has run it, to read the per-expert token counts that size the all-to-allv and grouped GEMMs (Megatron-Core's
    all-to-all dispatcher, ``cuda_sync_point`` ``before_ep_alltoall``, or ``before_finish`` without EP)."""
    tp_comm_overlap: bool = False
    """TP collectives overlapped with their GEMMs (Transformer Engine userbuffers, :mod:`.tpoverlap`)."""
    sm_count: int = 132
    """SMs of the GPU (what an overlapped GEMM shares with communication kernels)."""
    expert_padding: bool = True
    """Training FP8/MXFP8: the grouped MLP pads its experts' rows by copies (:attr:`cosim.workload.synth.costs.Shard.expert_padding`)."""
    offload_modules: tuple[str, ...] = ()
    """Fine-grained activation offloading (:attr:`cosim.workload.synth.spec.SyntheticSpec.offload_modules`): each
    named module's saved tensors go to the host in a D2H copy after its forward and come back in an H2D copy
    before its backward (:class:`_Offload`)."""
    optimizer: str = "adam"
    """``adam`` or ``muon`` (:attr:`cosim.workload.synth.spec.SyntheticSpec.optimizer`, :func:`_optimizer`)."""
    grad_accum: int = 1
    """Pipeline schedules per optimizer step (gradient accumulation over repeated schedules:
    :attr:`cosim.workload.synth.spec.BatchSpec.gradient_accumulation_steps`,
    :func:`cosim.workload.synth.schedule.accumulated_order`)."""
    host_link: tuple[float, float] = (64e9, 1e-6)
    """(bytes/s per direction, latency s) of a GPU's route to its host CPU (PCIe, or NVLink-C2C on GB200), after
    the link's efficiency: the duration of an offload copy alone on it (the replay moves it as a flow on that
    route, :mod:`cosim.replay.copies`)."""

    @property
    def main_grad_bytes(self) -> float:
        """Bytes per element of ``main_grad`` each weight-gradient GEMM reads and writes (``grad_bytes`` with
        ``grad_accumulation_fusion``, else 0: no accumulation in the GEMM): ``main_grad`` of
        :func:`cosim.workload.synth.costs.backward_ops`."""
        return self.grad_bytes if self.grad_accumulation_fusion else 0.0

    def main_grad_hook_bytes(self, fsdp: bool) -> float:
        """Bytes per element of ``main_grad`` Megatron-Core's backward hook reads and writes after each unfused
        weight-gradient GEMM (:data:`cosim.workload.synth.costs.MAIN_GRAD_HOOK_SOURCE`): 0 with
        ``grad_accumulation_fusion``; else ``main_grad.add_`` reads and writes it (``2 * grad_bytes``), Megatron-FSDP
        (``fsdp``, sharding optim_grads / optim_grads_params) overwrites it with ``copy_`` (``grad_bytes``)."""
        if self.grad_accumulation_fusion:
            return 0.0
        return self.grad_bytes * (1.0 if fsdp else 2.0)


@dataclass
class Built:
    """The synthesized step: graph and what the figures need."""

    graph: ExecutionGraph
    ranks: list[int]
    """Global ranks simulated (one per stage when folded, else all)."""
    folded: bool
    microbatches: int
    """Micro-batches per pipeline per step."""
    tokens_per_step: int
    """Tokens of the global batch (global * seq)."""
    model_flops: float
    """FLOPs of the step over all GPUs (forward + backward, no recompute)."""
    unit_spans: dict[int, list[tuple[int, int, bool]]]
    """Rank -> (first, last compute GPU op, waits for a neighbouring stage) of every schedule unit
    (for the bubble)."""
    notes: list[str] = field(default_factory=list)
    unit_keys: dict[int, list[tuple[tuple[Unit, ...], bool]]] = field(default_factory=dict)
    """Rank -> per schedule unit (parallel to ``unit_spans``): its ``(kind, microbatch, v)`` units (two for an
    overlapped pair) and whether it lies in the steady 1F1B phase (between the warm-up forwards and the
    cool-down backwards); empty under DualPipe. Used to find the step's period (:mod:`cosim.replay.periodic`)."""


_STREAM_EDGE, _WAIT_EDGE = int(EdgeKind.STREAM), int(EdgeKind.EVENT_WAIT)  # plain ints: cheaper to convert
_KERNEL, _LAUNCH = int(GpuKind.KERNEL), int(HostKind.LAUNCH)


class _RankBuilder:
    """Accumulates one rank's tables."""

    def __init__(self, rank: int, world: int, device: str) -> None:
        self.rank, self.world, self.device = rank, world, device
        self.s = StringTable()
        self.h: dict[str, list[Any]] = {k: [] for k in ("name", "kind", "parent", "depth", "tail", "dur")}
        self.g: dict[str, list[Any]] = {k: [] for k in ("stream", "dur", "name", "cls", "kind", "flops", "bytes",
                                                        "collective")}
        self.host_waits: list[tuple[int, int]] = []  # (GPU op, host sync op that waits for it)
        self.launch_of: list[int] = []  # per GPU op, the host op that launched it
        self.c: dict[str, list[Any]] = {k: [] for k in ("type", "name", "in_bytes", "out_bytes", "group",
                                                        "group_size", "seq", "in_splits")}
        self.groups: dict[tuple[int, ...], int] = {}
        self.seq: dict[tuple[tuple[int, ...], int], int] = {}
        self.edges: list[int] = []  # src gpu, dst gpu, kind of each edge, flat; host links added at the end
        self.last_on: dict[int, int] = {}
        self.last_compute = -1
        self.last_main = -1
        self.pending: list[tuple[int, str]] = []  # comm ops not yet waited for: (gpu op, name)
        self.lane = 0
        self.lanes: dict[int, tuple[list[tuple[int, str]], int, int]] = {}
        self.grad_bytes = 2.0  # bytes per reduced gradient element (BuildOptions.grad_bytes)
        self.optimizer = "adam"  # BuildOptions.optimizer
        self.full_graph = False  # BuildOptions.full_iteration_graph: host syncs are not allowed (sync-free MoE)
        self.grad_ops: list[int] = []  # DP gradient reductions issued (GPU ops): the optimizer waits for them
        self.copies: dict[int, int] = {}  # GPU op -> CopyKind of a host copy (activation offloading, _Offload)
        self.h["name"].append(self.s("ProfilerStep#0"))
        self.h["kind"].append(HostKind.ANNOTATION)
        self.h["parent"].append(-1)
        self.h["depth"].append(0)
        self.h["tail"].append(0.0)
        self.h["dur"].append(0.0)
        # bound appends of the columns every op fills (the hot path: one call per op)
        self._h_parent, self._h_depth = self.h["parent"].append, self.h["depth"].append
        self._h_tail, self._h_dur = self.h["tail"].append, self.h["dur"].append
        self._g_app = tuple(self.g[k].append for k in ("stream", "dur", "name", "cls", "kind", "flops", "bytes",
                                                          "collective"))
        self._ops: dict[int, tuple[Op, int, int, float, float]] = {}  # id(op) -> (op, name, cls, flops, bytes)
        self.blocks: dict[tuple[Any, ...], _Block | None] = {}  # recorded blocks (block), None: not replayable
        self.block_streams: dict[tuple[Any, ...], tuple[int, ...]] = {}  # (block, lane, comm lane) -> its streams

    def switch(self, lane: int) -> None:
        """Continue the program of ``lane`` (DualPipe runs one per direction, interleaved on the compute
        stream): its own pending collectives and last ops."""
        if lane == self.lane:
            return
        self.lanes[self.lane] = (self.pending, self.last_compute, self.last_main)
        self.pending, self.last_compute, self.last_main = self.lanes.pop(lane, ([], self.last_compute,
                                                                              self.last_main))
        self.lane = lane

    def interleave(self, lanes: list[tuple[Iterator[None], int]]) -> None:
        """Run op generators side by side, each on its lane (:meth:`switch`), taking turns at their yields (their
        collectives): each one's communication runs under the others' compute."""
        live = list(lanes)
        while live:
            for item in list(live):
                self.switch(item[1])
                if next(item[0], StopIteration) is StopIteration:
                    live.remove(item)

    def group(self, members: list[int]) -> int:
        """Index of the process group of ranks ``members`` in this rank's group table (added at first use)."""
        key = tuple(members)
        g = self.groups.get(key)
        if g is None:
            g = self.groups[key] = len(self.groups)
        return g

    comm_lane: int | None = None
    """When set, every lane's EP all-to-alls go on this lane's stream (Megatron's EP overlap: one communication
    stream for the forward and the backward micro-batch's dispatch and combine); None: each lane its own."""
    jitter: float = 0.0
    """Mean of the exponentially distributed extra host time of each launch (s)."""
    graph_host: int = -1
    """The open CUDA-graph launch (host op), or -1 when kernels launch one by one."""
    d2h: int = -1
    """The last host copy of MoE token counts not yet waited for (GPU op), or -1."""
    per_launch: float = 0.0
    """Host time of each kernel launch of an op beyond its first (``Op.launches``, s)."""
    loop_launch: float = 0.0
    """Host time of each kernel an op launches from a C++ loop (``Op.loop_launches``: the CUDA launch call, s)."""
    coll_extra: float = 0.0
    """Host time of a collective call beyond an op's launch and dispatch (``BuildOptions.collective_host``, s)."""
    coll_peer: float = 0.0
    """Host time per peer of an all-to-all call beyond ``coll_extra`` (``BuildOptions.collective_peer_host``, s)."""
    coll_ref: int = 8
    """Group size ``coll_extra`` stands for (``BuildOptions.collective_ref_ranks``)."""
    sync_point: str = "permute"
    """Where the dropless host sync waits for the token counts: ``permute`` (Megatron's alltoall dispatcher: at the
    token permutation, for the counts' copies launched before it), ``copy`` (the last count copy itself,
    ``Op.host_sync``: moe_preprocess CUDA-graphed, ``Shard.dtoh_late``) or ``dispatch`` (DeepEP's normal-mode dispatch
    returns the received counts as a host list: the CPU waits inside the dispatch call, before its kernel, not at
    the flex dispatcher's later permute; also Megatron's alltoall dispatcher under ``a2a_overlap``, whose
    ``before_ep_alltoall`` wait sits in the combined 1F1B's dispatch node,
    :data:`~cosim.workload.synth.schedule.OVERLAP_SYNC_SOURCE`)."""
    sync_behind_stream: bool = False
    """With ``sync_point == "dispatch"`` and :attr:`comm_lane` set (the combined 1F1B): the host also waits for the
    work queued before the dispatch on the shared all-to-all stream (DeepEP: its notify kernel, whose receive counts
    the CPU spins on, runs after an event recorded on the caller's stream, there the communication stream holding
    the paired backward's combine backward, :data:`~cosim.workload.synth.schedule.OVERLAP_SYNC_SOURCE`; without the
    overlap the caller's stream is the compute stream, whose work before the dispatch ends with the count copies)."""
    eager_step: float = 0.0
    """Host time of one eager step without a kernel (``Op.params``: a gradient hook; ``Op.outputs``: a created
    tensor, s)."""

    def open_graph(self, cost: float) -> None:
        """Launch the following ops as one CUDA graph (``cudaGraphLaunch`` taking ``cost``)."""
        self.graph_host = self._host("cudaGraphLaunch", HostKind.LAUNCH, cost)

    def close_graph(self) -> None:
        """End the open CUDA graph (:meth:`open_graph`): the next launch is eager again."""
        self.graph_host = -1
    rng: np.random.Generator | None = None

    def _host(self, name: str, kind: int, cost: float) -> int:
        """Append a host op ``name`` of ``kind`` (a ``HostKind``) taking ``cost`` seconds (a launch plus this rank's
        seeded jitter); returns its row."""
        if self.jitter > 0 and self.rng is not None and kind == _LAUNCH:
            cost += float(self.rng.exponential(self.jitter))
        h = self.h
        names = h["name"]
        n = len(names)
        i = self.s.ids.get(name)
        names.append(self.s(name) if i is None else i)
        h["kind"].append(int(kind))
        self._h_parent(0)
        self._h_depth(1)
        self._h_tail(cost)
        self._h_dur(cost)
        return n

    def host_sync(self, gpu_op: int, cost: float = 3e-6, also: int = -1) -> None:
        """The host blocks until ``gpu_op`` (and its stream's earlier work) has run, and ``also`` when given (a GPU
        op of another stream, -1: none): a cudaStreamSynchronize taking ``cost`` once it returns. An open CUDA graph
        ends there and a new one starts after it. Not under a full-iteration graph, which cannot hold one: its MoE
        runs sync-free (``BuildOptions.full_iteration_graph``)."""
        if self.full_graph:
            return
        graph = self.graph_host >= 0
        cost_graph = self.h["tail"][self.graph_host] if graph else 0.0
        self.close_graph()
        h = self._host("cudaStreamSynchronize", HostKind.SYNC, cost)
        self.host_waits.append((gpu_op, h))
        if also >= 0 and also != gpu_op:
            self.host_waits.append((also, h))
        if graph:
            self.open_graph(cost_graph)

    def op(self, o: Op, dur: float, stream: int, launch_cost: float, *, coll: int = -1,
           waits: list[int] | None = None) -> int:
        """Launch ``o`` on ``stream`` after the ops in ``waits``; returns its GPU op index."""
        j = len(self.g["name"])
        if self.graph_host >= 0:  # inside a captured CUDA graph: its one launch enqueues this op too
            self.launch_host = self.graph_host
        else:
            if o.launches > 1:  # a grouped GEMM launching one GEMM per expert from C++
                launch_cost += (o.launches - 1) * self.per_launch
            elif o.launches == 0:  # launched from the C++ loop of the previous op's call (tpoverlap)
                launch_cost = self.loop_launch
            launch_cost += o.loop_launches * self.loop_launch
            launch_cost += (o.params + o.outputs) * self.eager_step
            if coll >= 0 and o.launches != 0 and o.c10d:  # a torch.distributed call, not one kernel launch
                launch_cost += self.coll_extra   # (a userbuffers ring step of tpoverlap, HybridEP's kernels: neither)
                launch_cost += self._peer_host(coll)
            launch_cost = max(launch_cost, 0.0)
            self.launch_host = self._host("cudaLaunchKernel", _LAUNCH, launch_cost)
        row = self._ops.get(id(o))
        if row is None or row[0] is not o:  # the op's constant columns, once per op (the memo keeps it alive)
            row = self._ops[id(o)] = (o, self.s(o.name), int(_CLS[o.cls]), o.flops if o.cls != "collective" else math.nan,
                                      o.bytes)
        a_stream, a_dur, a_name, a_cls, a_kind, a_flops, a_bytes, a_coll = self._g_app
        a_stream(stream)
        a_dur(dur)
        a_name(row[1])
        a_cls(row[2])
        a_kind(_KERNEL)
        a_flops(row[3])
        a_bytes(row[4])
        a_coll(coll)
        last_on = self.last_on
        prev = last_on.get(stream)
        edges = self.edges
        if prev is not None:
            edges += (prev, j, _STREAM_EDGE)
        last_on[stream] = j
        if waits:
            for w in waits:
                if w >= 0 and w != prev:
                    edges += (w, j, _WAIT_EDGE)
        self.launch_of.append(self.launch_host)
        return j

    def collective(self, kind: str, members: list[int], nbytes: float, seq: int | None = None,
                   splits: list[float] | None = None, label: str | None = None) -> int:
        """Record a collective of ``kind`` (a ``_COLL_TYPE`` key) over ranks ``members`` moving ``nbytes`` bytes (the
        full buffer: an all-gather's input and a reduce-scatter's output are its ``1 / n``), named ``label`` (else
        ``kind``); ``seq``: its sequence number in its group (None: the next of this kind and group); ``splits``:
        an all-to-all's bytes per peer. Returns its row; :meth:`op` launches the kernel that runs it."""
        c = len(self.c["type"])
        g = self.group(members)
        if seq is None:
            key = (tuple(members), int(_COLL_TYPE[kind]))
            seq = self.seq.get(key, 0)
            self.seq[key] = seq + 1
        n = len(members)
        ctype = _COLL_TYPE[kind]
        self.c["type"].append(int(ctype))
        self.c["name"].append(self.s(label or kind))
        in_b = nbytes / n if ctype == CollType.ALL_GATHER else nbytes
        out_b = nbytes / n if ctype == CollType.REDUCE_SCATTER else nbytes
        self.c["in_bytes"].append(in_b)
        self.c["out_bytes"].append(out_b)
        self.c["group"].append(g)
        self.c["group_size"].append(n)
        self.c["seq"].append(seq)
        self.c["in_splits"].append([round(x) for x in splits] if splits is not None else [])
        return c

    def _peer_host(self, coll: int) -> float:
        """Host time of collective ``coll``'s call beyond ``coll_extra``: an all-to-all posts a send and a receive
        per peer (``spec.C10D_PEER_HOST``), so ``coll_peer`` per rank of its group beyond ``coll_ref``; 0 for the
        other kinds (one NCCL collective enqueued per call) and for DeepEP's dispatch / combine (one Python call whose
        kernel reaches every peer: no per-peer ncclSend / ncclRecv posted by the host)."""
        if (self.coll_peer == 0.0 or self.c["type"][coll] != CollType.ALL_TO_ALL
                or self.s.strings[self.c["name"][coll]].startswith("deepep")):
            return 0.0
        return self.coll_peer * (self.c["group_size"][coll] - self.coll_ref)

    def emit(self, o: Op, dur: float, groups: dict[str, list[int]], launch: float,
             splits: list[float] | None = None, label: str | None = None, host_sync: bool = False) -> int:
        """Launch op ``o`` (``dur`` seconds) with the stream and waits of the module's rules: a collective
        on its group's stream (per lane) after the last compute op (the shared expert's after the
        shared expert's last), a compute op after every collective issued since (the shared expert's
        only after its own). ``groups``: this rank's members per group kind; a collective of a group
        of one is skipped (-1). ``label`` names the collective for the engine (default its kind).
        ``host_sync``: the host blocks after each token permutation until the GPU ran it (dropless MoE reads
        the per-expert token counts, Megatron's ``before_ep_alltoall`` sync)."""
        shared = o.name.startswith("moe.shared")
        if o.cls == "collective":
            assert o.comm is not None
            members = groups[o.comm.group]
            if len(members) < 2:
                return -1
            shared_stream = self.comm_lane is not None and o.comm.kind.startswith("all_to_all")
            lane = self.comm_lane if shared_stream and self.comm_lane is not None else self.lane
            stream = _STREAMS[o.stream] + 100 * lane
            if host_sync and self.sync_point == "dispatch" and o.name in ("moe.dispatch", "moe.dispatch.recompute") \
                    and self.d2h >= 0:
                self.host_sync(self.d2h, also=self.last_on.get(stream, -1)
                               if self.sync_behind_stream and shared_stream else -1)
                self.d2h = -1
            c = self.collective(o.comm.kind, members, o.comm.nbytes, splits=splits, label=label)
            j = self.op(o, 0.0, stream, launch, coll=c, waits=[self.last_compute if shared else self.last_main])
            self.pending.append((j, o.name))
            return j
        if o.waits:  # tpoverlap: a GEMM chunk waits only for the collectives it names
            waits = [w for w, nm in self.pending if any(nm == x or nm.startswith(x + ".") for x in o.waits)]
            self.pending = [(w, nm) for w, nm in self.pending if w not in waits]
        elif shared:  # the shared expert waits only for its own collectives
            waits = [w for w, nm in self.pending if nm.startswith("moe.shared")]
            self.pending = [(w, nm) for w, nm in self.pending if not nm.startswith("moe.shared")]
        else:
            waits = [w for w, _ in self.pending]
            self.pending = []
        j = self.op(o, dur, _STREAMS["compute"], launch, waits=waits)
        self.last_compute = j
        if not shared:
            self.last_main = j
        if o.name.startswith("moe.splits_d2h"):
            self.d2h = j
        if o.host_sync:  # a blocking copy: the host waits for this op (costs.Op.host_sync)
            self.host_sync(j)
        if host_sync and o.name in ("moe.permute", "moe.permute.recompute") and self.sync_point == "permute":
            # Megatron's d2h_event.synchronize() before the EP all-to-all: the host waits for the copies of
            # the token counts (launched before the permutation), else for the permutation itself
            self.host_sync(self.d2h if self.d2h >= 0 else j)
            self.d2h = -1
        return j

    def block(self, key: tuple[Any, ...], run: Callable[[], None]) -> None:
        """Emit a block of ops by ``run()`` (a layer's forward, backward or recomputation: ``key`` names it), or
        replay its record. A block writes the same streams every time (its ops' and lane's), and emission reads the
        builder's state only through the GPU ops it may refer to (pending collectives, last compute and main ops,
        the last token-count copy, the last op of each stream it writes), the pending ops' names, the lane, the open
        CUDA graph (and its launch cost) and the sequence counters. Two entries with the same ``key``, lanes, names
        and pattern of equal references (:func:`_ref_pattern`) emit the same rows, their references to earlier ops
        and their collectives' sequence numbers shifted alike. So the first is recorded (:meth:`_record`) and the
        next are appended from it (:meth:`_replay`), array-identical to emitting them op by op, in time linear in
        the block's rows and the pending ops."""
        head = (key, self.lane, self.comm_lane)
        gh = self.graph_host
        lasts = (self.last_compute, self.last_main, self.d2h)
        tail = self.h["tail"][gh] if gh >= 0 else None
        streams = self.block_streams.get(head)
        if streams is not None:
            refs, _, full = _entry_key(head, self.pending, lasts, tail, self.last_on, streams)
            rec = self.blocks.get(full, _UNSEEN)
            if rec is None:
                run()
                return
            if rec is not _UNSEEN:
                self._replay(rec, refs)  # type: ignore[arg-type]
                return
        pending0, last0, lane, n_copies, n_grads = list(self.pending), dict(self.last_on), self.lane, \
            len(self.copies), len(self.grad_ops)
        base = _Base(len(self.g["name"]), len(self.h["name"]), len(self.c["type"]), len(self.edges),
                     len(self.host_waits), gh)
        run()
        written = [s for s, v in self.last_on.items() if last0.get(s) != v]
        if streams is None:
            streams = self.block_streams[head] = tuple(written)
        _, slot, full = _entry_key(head, pending0, lasts, tail, last0, streams)
        ok = (self.lane == lane and len(self.copies) == n_copies and len(self.grad_ops) == n_grads
              and self.rng is None and set(written) <= set(streams))
        self.blocks[full] = self._record(base, slot, written) if ok else None

    def _record(self, b: _Base, slot: dict[int, int], written: list[int]) -> _Block | None:
        """The record of the block just emitted from ``b`` (entry lengths; ``written``: the streams whose last op
        it moved); None when it refers to an op outside its entry state."""
        try:
            return self._block_of(b, slot, written)
        except _Unrecordable:
            return None

    def _block_of(self, b: _Base, slot: dict[int, int], written: list[int]) -> _Block:
        """The record of the block just emitted from ``b`` (entry lengths), its references encoded (:func:`_enc`)."""
        G, H, C = self.g, self.h, self.c
        gcols = tuple(G[k][b.g:] for k in _G_CONST)
        coll = [v - b.c if v >= 0 else -1 for v in G["collective"][b.g:]]
        hcols = tuple(H[k][b.h:] for k in _H_COLS)
        launch = [_enc_host(v, b) for v in self.launch_of[b.g:]]
        flat = self.edges[b.e:]
        src = [_enc(v, b.g, slot) for v in flat[0::3]]
        dst = [_enc(v, b.g, slot) for v in flat[1::3]]
        hw = self.host_waits[b.w:]
        waits = [(_enc(gv, b.g, slot), _enc_host(hv, b)) for gv, hv in hw]
        members = list(self.groups)
        seq_keys = [(members[gi], t) for gi, t in zip(C["group"][b.c:], C["type"][b.c:])]
        _check_seq(seq_keys, C["seq"][b.c:], self.seq)
        ccols = tuple(C[k][b.c:] for k in _C_CONST)
        pending = [(_enc(v, b.g, slot), nm) for v, nm in self.pending]
        lasts = tuple(_enc(v, b.g, slot) for v in (self.last_compute, self.last_main, self.d2h))
        moved = [(s, _enc(self.last_on[s], b.g, slot)) for s in written]
        return _Block(gcols, coll, hcols, launch, src, dst, flat[2::3], waits, ccols, seq_keys, pending, lasts,
                      _enc_host(self.graph_host, b), moved)

    def _replay(self, r: _Block, refs: list[int]) -> None:
        """Append block ``r`` at the builder's ends, its references to ops before it decoded from ``refs`` (the
        entry state in :meth:`block`'s order)."""
        G, H, C = self.g, self.h, self.c
        ng, nh, nc = len(G["name"]), len(H["name"]), len(C["type"])
        table = [-1, *refs]  # decode: v >= 0 is v + base, -1 itself, -k - 2 entry reference k
        htable = [-1, self.graph_host]
        for k, vals in zip(_G_CONST, r.g):
            G[k] += vals
        G["collective"] += [v + nc if v >= 0 else -1 for v in r.coll]
        for k, vals in zip(_H_COLS, r.h):
            H[k] += vals
        self.launch_of += [v + nh if v >= 0 else htable[-v - 1] for v in r.launch]
        flat: list[int] = [0] * (3 * len(r.src))
        flat[0::3] = [v + ng if v >= 0 else table[-v - 1] for v in r.src]
        flat[1::3] = [v + ng if v >= 0 else table[-v - 1] for v in r.dst]
        flat[2::3] = r.kind
        self.edges += flat
        self.host_waits += [(gv + ng if gv >= 0 else table[-gv - 1], hv + nh if hv >= 0 else htable[-hv - 1])
                            for gv, hv in r.waits]
        for k, vals in zip(_C_CONST, r.c):
            C[k] += vals
        seqs = C["seq"]
        for key in r.seq_keys:
            s = self.seq.get(key, 0)
            seqs.append(s)
            self.seq[key] = s + 1
        self.pending = [(v + ng if v >= 0 else table[-v - 1], nm) for v, nm in r.pending]
        self.last_compute, self.last_main, self.d2h = (v + ng if v >= 0 else table[-v - 1] for v in r.lasts)
        self.graph_host = r.graph + nh if r.graph >= 0 else htable[-r.graph - 1]
        for s, v in r.last_on:
            self.last_on[s] = v + ng if v >= 0 else table[-v - 1]

    def finish(self, sync_cost: float = 10e-6, comm_share: bool = True) -> RankGraph:
        """The rank's graph. ``comm_share`` (its ``source["comm_share"]``): replay lets each communication kernel
        hold its own SMs while it overlaps compute kernels (cosim.replay.interference; a training step's standalone
        kernel durations); False: the synthesis already charged them (a serving step, cosim.workload.synth.infer)."""
        n_gpu = len(self.g["name"])
        hs = self._host("cudaDeviceSynchronize", HostKind.SYNC, sync_cost)
        host_ops = self._host_table()
        launch_host = np.asarray(self.launch_of, dtype=np.int64)
        gpu_ops, launches = self._gpu_tables(launch_host)
        collectives = self._collective_table(launch_host)
        groups = self._group_table()
        edges = self._edge_table(hs, launch_host)
        threads = Table("threads", 1, pid=np.asarray([self.rank]), tid=np.asarray([1]),
                        name=np.asarray([self.s("python main thread")]))
        steps = Table("steps", 1, number=np.asarray([0]), host_op=np.asarray([0]), cpu_start=np.asarray([0.0]),
                      cpu_dur=np.asarray([host_ops.dur[0]]), gpu_start=np.asarray([np.nan]),
                      gpu_end=np.asarray([np.nan]), n_gpu_ops=np.asarray([n_gpu]))
        return RankGraph(rank=self.rank, world_size=self.world, device_name=self.device, strings=self.s.strings,
                         threads=threads, host_ops=host_ops, gpu_ops=gpu_ops, launches=launches,
                         collectives=collectives, groups=groups, steps=steps, edges=edges,
                         source={"format": "cosim-synthetic", "synthetic": True, "projected": True,
                                 "projected_onto": self.device, "comm_share": comm_share})

    def _host_table(self) -> Table:
        """The host thread's ops back to back from t = 0 (s): op 0, the step, spans the others' tails."""
        n_host = len(self.h["name"])
        tails = np.asarray(self.h["tail"], dtype=float)
        dur = tails.copy()
        dur[0] = tails[1:].sum()
        start = np.concatenate([[0.0], np.cumsum(tails[1:]) - tails[1:]])
        return Table("host_ops", n_host, thread=np.zeros(n_host), start=start, dur=dur,
                     name=np.asarray(self.h["name"]), kind=np.asarray(self.h["kind"]),
                     parent=np.asarray(self.h["parent"]), depth=np.asarray(self.h["depth"]),
                     pre_gap=np.zeros(n_host), tail=np.where(np.arange(n_host) == 0, 0.0, tails),
                     self_time=np.where(np.arange(n_host) == 0, 0.0, tails), step=np.zeros(n_host))

    def _gpu_tables(self, launch_host: np.ndarray) -> tuple[Table, Table]:
        """The GPU ops (unscheduled: start NaN; durations in s; offload copies as memcpys) and their launches, one
        per op from host op ``launch_host[i]``."""
        G = self.g
        n_gpu = len(G["name"])
        gpu_ops = Table("gpu_ops", n_gpu, device=np.zeros(n_gpu), stream=np.asarray(G["stream"]),
                        start=np.full(n_gpu, np.nan), dur=np.asarray(G["dur"], dtype=float),
                        name=np.asarray(G["name"]), kind=np.asarray(G["kind"]), cls=np.asarray(G["cls"]),
                        copy_kind=np.full(n_gpu, CopyKind.NONE), launch=np.arange(n_gpu), op=np.full(n_gpu, -1),
                        correlation=np.arange(1, n_gpu + 1), step=np.zeros(n_gpu),
                        bytes=np.asarray(G["bytes"], dtype=float), flops=np.asarray(G["flops"], dtype=float),
                        collective=np.asarray(G["collective"]))
        _mark_copies(gpu_ops, self.copies)
        launches = Table("launches", n_gpu, host_op=launch_host, correlation=np.arange(1, n_gpu + 1),
                         first_gpu_op=np.arange(n_gpu), n_gpu_ops=np.ones(n_gpu), device=np.zeros(n_gpu),
                         stream=np.asarray(G["stream"]))
        return gpu_ops, launches

    def _collective_table(self, launch_host: np.ndarray) -> Table:
        """The collectives (bytes; element size 1), each with its GPU op and that op's launching host op."""
        C, G = self.c, self.g
        nc = len(C["type"])
        coll_gpu = np.full(nc, -1)
        cidx = np.asarray(G["collective"], dtype=np.int64)
        sel = np.flatnonzero(cidx >= 0)
        coll_gpu[cidx[sel]] = sel
        off, val = ragged_arrays(C["in_splits"])
        return Table("collectives", nc, host_op=launch_host[coll_gpu] if nc else np.zeros(0),
                     gpu_op=coll_gpu, type=np.asarray(C["type"]), name=np.asarray(C["name"]),
                     elem_bytes=np.full(nc, 1), in_nelems=np.asarray(C["in_bytes"], dtype=np.int64),
                     out_nelems=np.asarray(C["out_bytes"], dtype=np.int64),
                     in_bytes=np.asarray(C["in_bytes"], dtype=float),
                     out_bytes=np.asarray(C["out_bytes"], dtype=float), group=np.asarray(C["group"]),
                     group_size=np.asarray(C["group_size"]), seq=np.asarray(C["seq"]),
                     seq_source=np.full(nc, SeqSource.COUNTER), in_splits_offsets=off,
                     in_splits_values=val)

    def _group_table(self) -> Table:
        """The process groups by their member ranks (named by them, or ``first..lastxN`` past eight)."""
        goff, gval = ragged_arrays(list(self.groups))
        gnames = [self.s(",".join(map(str, k)) if len(k) <= 8 else f"{k[0]}..{k[-1]}x{len(k)}") for k in self.groups]
        return Table("groups", len(self.groups), name=np.asarray(gnames), desc=np.full(len(self.groups), -1),
                     ranks_offsets=goff, ranks_values=gval)

    def _edge_table(self, hs: int, launch_host: np.ndarray) -> Table:
        """The edges (host ops numbered first, then GPU ops), as columns in this order: stream / event waits,
        launches, the final sync ``hs``'s waits on each stream's last op, host syncs, the host thread's order."""
        n_host, n_gpu = len(self.h["name"]), len(self.g["name"])
        ee = np.fromiter(self.edges, dtype=np.int64, count=len(self.edges)).reshape(-1, 3)
        last = np.fromiter(self.last_on.values(), dtype=np.int64, count=len(self.last_on))
        hw = np.asarray(self.host_waits, dtype=np.int64).reshape(-1, 2)
        hh = np.arange(1, n_host - 1, dtype=np.int64)
        e_src = np.concatenate([n_host + ee[:, 0], launch_host, n_host + last, n_host + hw[:, 0], hh])
        e_dst = np.concatenate([n_host + ee[:, 1], n_host + np.arange(n_gpu, dtype=np.int64),
                                np.full(len(last), hs, dtype=np.int64), hw[:, 1], hh + 1])
        e_kind = np.concatenate([ee[:, 2], np.full(n_gpu, int(EdgeKind.LAUNCH), dtype=np.int64),
                                 np.full(len(last) + len(hw), int(EdgeKind.SYNC), dtype=np.int64),
                                 np.full(len(hh), int(EdgeKind.HOST), dtype=np.int64)])
        ne = len(e_src)
        return Table("edges", ne, src=e_src, dst=e_dst, kind=e_kind, inferred=np.zeros(ne))


_G_CONST = ("stream", "dur", "name", "cls", "kind", "flops", "bytes")
_H_COLS = ("name", "kind", "parent", "depth", "tail", "dur")
_C_CONST = ("type", "name", "in_bytes", "out_bytes", "group", "group_size", "in_splits")
_UNSEEN = object()


class _Unrecordable(Exception):
    """A block referred to an op outside its entry state (:meth:`_RankBuilder.block`)."""


class _Base(NamedTuple):
    """A block's entry: the lengths of the GPU op, host op, collective, flat edge and host-wait lists, and the
    open CUDA graph's host op (-1: none)."""

    g: int
    h: int
    c: int
    e: int
    w: int
    graph: int


class _Block(NamedTuple):
    """One recorded block (:meth:`_RankBuilder.block`): the rows it appended, GPU-op references encoded by
    :func:`_enc`, host-op references by :func:`_enc_host`, collectives relative to its first (-1: none), and the
    builder state it left (pending collectives, last compute / main op and count copy, open graph, moved streams)."""

    g: tuple[list[Any], ...]
    coll: list[int]
    h: tuple[list[Any], ...]
    launch: list[int]
    src: list[int]
    dst: list[int]
    kind: list[int]
    waits: list[tuple[int, int]]
    c: tuple[list[Any], ...]
    seq_keys: list[tuple[tuple[int, ...], int]]
    pending: list[tuple[int, str]]
    lasts: tuple[int, ...]
    graph: int
    last_on: list[tuple[int, int]]


def _entry_key(head: tuple[Any, ...], pending: list[tuple[int, str]], lasts: tuple[int, int, int], tail: float | None,
               last_on: dict[int, int], streams: tuple[int, ...]
               ) -> tuple[list[int], dict[int, int], tuple[Any, ...]]:
    """A block's entry references (pending ops, ``lasts``: last compute and main op and count copy, the last op of
    each of its ``streams``, -1 where none), their first positions (:func:`_ref_pattern`) and its record's key."""
    refs = [w for w, _ in pending]
    refs += lasts
    refs += [last_on.get(s, -1) for s in streams]
    slot, pattern = _ref_pattern(refs)
    return refs, slot, (head, tuple([nm for _, nm in pending]), pattern, tail)


def _ref_pattern(refs: list[int]) -> tuple[dict[int, int], tuple[int, ...]]:
    """Each referenced GPU op's first position in ``refs``, and per position that first position (-1: no op)."""
    first: dict[int, int] = {}
    return first, tuple([-1 if v < 0 else first.setdefault(v, i) for i, v in enumerate(refs)])


def _enc(v: int, base: int, slot: dict[int, int]) -> int:
    """GPU op ``v`` as a block records it: ``v - base`` when the block emitted it, -1 for none, ``-k - 2`` for the
    entry reference ``k`` (:func:`_ref_pattern`)."""
    if v >= base:
        return v - base
    if v < 0:
        return -1
    k = slot.get(v)
    if k is None:
        raise _Unrecordable(v)
    return -k - 2


def _enc_host(v: int, b: _Base) -> int:
    """Host op ``v`` as a block records it: relative to the block's first, -1 for none, -2 for the CUDA graph open
    at its entry."""
    if v >= b.h:
        return v - b.h
    if v < 0:
        return -1
    if v == b.graph:
        return -2
    raise _Unrecordable(v)


def _check_seq(keys: list[tuple[tuple[int, ...], int]], seqs: list[int], now: dict[Any, int]) -> None:
    """The block's collectives took consecutive numbers of their group's counter (none given explicitly), so a
    replay can draw them from the counters again."""
    count: dict[Any, int] = {}
    for k in keys:
        count[k] = count.get(k, 0) + 1
    seen: dict[Any, int] = {}
    for k, s in zip(keys, seqs):
        i = seen[k] = seen.get(k, -1) + 1
        if s != now.get(k, 0) - count[k] + i:
            raise _Unrecordable(s)


_D2H_STREAM, _H2D_STREAM = 26, 27
"""Streams of activation offloading's copies (Megatron-Core's offload manager: one d2h_stream, one h2d_stream)."""


def _mark_copies(gpu_ops: Table, copies: dict[int, int]) -> None:
    """Make the GPU ops in ``copies`` host copies (memcpy of their direction) instead of kernels."""
    if not copies:
        return
    idx = np.fromiter(copies.keys(), dtype=np.int64, count=len(copies))
    gpu_ops.kind[idx] = GpuKind.MEMCPY
    gpu_ops.cls[idx] = OpClass.MEMCPY
    gpu_ops.copy_kind[idx] = np.fromiter(copies.values(), dtype=np.int64, count=len(copies))
    gpu_ops.flops[idx] = 0.0


class _GroupPlan(NamedTuple):
    """One layer's offload groups (:class:`_Offload`)."""

    member: dict[str, str]
    """Op name -> its group."""
    last: dict[str, str]
    """Group -> its last forward op."""
    first: dict[str, str]
    """Group -> its first op with a backward."""
    order: list[str]
    """The groups that offload bytes, in forward order."""
    gbytes: dict[str, float]
    """Group -> the bytes it offloads per micro-batch."""


_NO_GROUPS = _GroupPlan({}, {}, {}, [], {})


class _Offload:
    """Fine-grained activation offloading of one rank (:data:`cosim.workload.synth.memory.OFFLOAD_SOURCE`).

    Forward: after the last op of a group (a module of ``modules``: its ops, :data:`~cosim.workload.synth.memory.
    OFFLOAD_MODULES`) a D2H copy of what the group keeps (:func:`~cosim.workload.synth.memory.offload_group_bytes`)
    goes on the d2h stream after that op; the compute stream does not wait for it. Backward: when a group's
    backward is done (the backward op of its first forward op), the H2D copy of the group before it in forward
    order (the same layer's, else the last group of the chunk's previous layer) goes on the h2d stream after the
    compute so far and after that group's D2H (Megatron's LIFO ``bulk_reload``); the first backward or
    recomputed op of a group waits for its reload (a group not reloaded yet, the chunk's first, is reloaded there).
    Micro-batches of a layer are matched first in, first out (1F1B runs a chunk's backwards in forward order)."""

    def __init__(self, rb: _RankBuilder, bytes_of: Callable[[list[Op]], dict[str, float]], prev_layer: dict[int, int],
                 host_link: tuple[float, float], launch: float) -> None:
        self.rb, self.bytes_of, self.prev_layer, self.launch = rb, bytes_of, prev_layer, launch
        self.bw, self.lat = host_link
        self.out: dict[tuple[int, str], deque[int]] = {}  # (layer, group) -> D2H copies not yet reloaded, FIFO
        self.back: dict[tuple[int, str], int] = {}  # (layer, group) -> its H2D copy, until a backward op waited
        self.active: set[tuple[int, str]] = set()  # groups whose backward waited for their reload and runs
        self.plan: dict[int, _GroupPlan] = {}

    def _plan(self, ly: int, ops: list[Op] | None) -> _GroupPlan:
        """Layer ``ly``'s offload groups, worked out from its forward ``ops`` the first time (none yet and no
        ``ops``: no groups)."""
        got = self.plan.get(ly)
        if got is None and ops is not None:
            from cosim.workload.synth.memory import offload_group_of

            gbytes: dict[str, float] = self.bytes_of(ops)
            member = {o.name: g for o in ops if (g := offload_group_of(o.name, list(gbytes))) is not None}
            last = {member[o.name]: o.name for o in ops if o.name in member}
            first: dict[str, str] = {}
            for o in ops:
                if o.name in member and not o.no_grad:
                    first.setdefault(member[o.name], o.name)
            got = self.plan[ly] = _GroupPlan(member, last, first, [g for g in gbytes if gbytes[g] > 0], gbytes)
        return got if got is not None else _NO_GROUPS

    def _copy(self, name: str, nbytes: float, stream: int, kind: int, waits: list[int]) -> int:
        """Emit an offload copy of ``nbytes`` bytes on ``stream`` (``kind``: a ``CopyKind``) after ``waits``, timed
        alone on the host link (latency + bytes / bandwidth, s); returns its GPU op."""
        o = Op(name, "elementwise", 0.0, nbytes)
        j = self.rb.op(o, self.lat + nbytes / self.bw, stream, self.launch, waits=waits)
        self.rb.copies[j] = kind
        return j

    def forward(self, o: Op, ly: int, j: int, ops: list[Op]) -> None:
        """After forward op ``o`` (GPU op ``j``) of layer ``ly``."""
        plan = self._plan(ly, ops)
        g = plan.member.get(o.name)
        if g is None or plan.last[g] != o.name or g not in plan.order:
            return
        d = self._copy(f"offload.{g}.d2h", plan.gbytes[g], _D2H_STREAM, CopyKind.DTOH, [j])
        self.out.setdefault((ly, g), deque()).append(d)

    def _reload(self, ly: int, g: str) -> None:
        """Emit the H2D reload of layer ``ly``'s group ``g`` (its oldest D2H copy not reloaded yet), after the
        compute so far and that copy; nothing when it is already reloaded or was never offloaded."""
        fifo = self.out.get((ly, g))
        if (ly, g) in self.back or not fifo:
            return
        d = fifo.popleft()
        self.back[(ly, g)] = self._copy(f"offload.{g}.h2d", self._plan(ly, None).gbytes[g], _H2D_STREAM, CopyKind.HTOD,
                                        [self.rb.last_compute, d])

    def chunk_backward(self, layers: list[int]) -> None:
        """A chunk's backward starts (after its gradient's receive is posted): prefetch the last group of its last
        layer that offloads (Megatron's ``pre_reload_last_layer`` of the next backward chunk)."""
        for ly in sorted((x for x in layers if x in self.plan), reverse=True):
            order = self.plan[ly].order
            if order:
                self._reload(ly, order[-1])
                return

    def before_backward(self, o: Op, ly: int) -> None:
        """Before backward (or recomputed) op ``o`` of layer ``ly``: the group's first such op waits for its
        reload (issued now if it was not prefetched)."""
        plan = self._plan(ly, None)
        g = plan.member.get(forward_name(o.name))
        if g is None or g not in plan.order or (ly, g) in self.active:
            return
        self._reload(ly, g)
        h = self.back.pop((ly, g), None)
        if h is not None:
            self.rb.pending.append((h, "offload.reload"))
            self.active.add((ly, g))

    def after_backward(self, o: Op, ly: int) -> None:
        """After backward op ``o`` of layer ``ly``: when it ends a group's backward (the last backward op of the
        group's first forward op: its ``.bwd``, a GEMM's ``.wgrad``), prefetch the group before it."""
        plan = self._plan(ly, None)
        name = forward_name(o.name)
        g = plan.member.get(name)
        if g is None or g not in plan.order or plan.first.get(g) != name or not o.name.endswith((".bwd", ".wgrad")):
            return
        self.active.discard((ly, g))
        i = plan.order.index(g)
        if i > 0:
            self._reload(ly, plan.order[i - 1])
        elif ly in self.prev_layer:
            prev = self.prev_layer[ly]
            porder = self._plan(prev, None).order
            if porder:
                self._reload(prev, porder[-1])


def hybridep_label(o: Op, tokens: float, card: MoEModelConfig, sms: int = 16) -> str:
    """Engine label of a HybridEP dispatch/combine (:func:`cosim.replay.collective_map.hybridep`):
    ``hybridep_<kind>:<tokens per rank>:<hidden>:<probabilities travel 0|1>:<topk>:<experts>:<SMs>``. The
    probabilities travel in the forward dispatch and in its backward (the combine of their gradients)."""
    assert o.comm is not None
    kind = "dispatch" if o.comm.kind == "all_to_all_dispatch" else "combine"
    probs = int(o.name.split(".")[1] == "dispatch")
    return f"hybridep_{kind}:{tokens:.6g}:{card.hidden_size}:{probs}:{card.top_k}:{card.num_experts}:{sms}"


def _rank_builder(rank: int, world: int, device: str, opts: BuildOptions, sync_point: str) -> _RankBuilder:
    """A training rank's builder with its host costs (s; scaled by the rank's host slowdown), gradient bytes,
    optimizer, full-iteration graph, MoE sync point (``_RankBuilder.sync_point``) and launch jitter."""
    slow = opts.host_slowdown.get(rank, 1.0)
    rb = _RankBuilder(rank, world, device)
    rb.per_launch = opts.expert_gemm_host * slow
    rb.loop_launch = opts.launch_overhead * slow
    rb.eager_step = opts.eager_step_host * slow
    rb.grad_bytes = opts.grad_bytes
    rb.optimizer = opts.optimizer
    if opts.collective_host is not None:
        rb.coll_extra = (opts.collective_host - opts.dispatch_overhead) * slow
        rb.coll_peer = opts.collective_peer_host * slow
        rb.coll_ref = opts.collective_ref_ranks
    rb.full_graph = opts.full_iteration_graph
    rb.sync_point = sync_point
    if opts.launch_jitter.get(rank):
        rb.jitter = opts.launch_jitter[rank]
        rb.rng = np.random.Generator(np.random.PCG64([opts.routing.seed, rank]))
    return rb


def _bucket_plans(rm: RankMap, card: MoEModelConfig, prepared: dict[tuple[int, int], tuple[Any, Any]]
                  ) -> tuple[dict[tuple[int, int], list[Bucket]], dict[int, list[Bucket]]]:
    """The gradient buckets of each prepared (chunk, direction) (:func:`_bucket_plan`, in backward order) and, by
    the layer whose backward closes them, the buckets reduced there. Megatron-Core buckets only the first model
    chunk of the first pipeline stage (DistributedDataParallel: bucket_size None when pp_rank > 0; get_model:
    disable_bucketing for model_chunk_idx > 0); DualPipe (not Megatron) buckets every chunk."""
    plans = {key: _bucket_plan(rm, card, [ly for ly, _, _ in bw], bucketed=key[0] == 0 or rm.schedule == "dualpipe")
             for key, (_, bw) in prepared.items()}
    closing: dict[int, list[Bucket]] = {}
    for key, (_, bw) in prepared.items():
        at = {ly: i for i, (ly, _, _) in enumerate(bw)}
        for b in plans[key]:
            closing.setdefault(bw[max(at[x] for x in b[1])][0], []).append(b)
    return plans, closing


def _shard(rm: RankMap, card: MoEModelConfig, rank: int, layer: int, routes: dict[int, Any], T: float,
           dispatcher: str = "alltoall", expert_padding: bool = True, dtoh_late: bool = False,
           moe_router_fusion: bool = True) -> Shard:
    """How layer ``layer`` is split on ``rank``: the layout's parallel sizes and, for an MoE layer, the rows each of
    the rank's local experts receives (``routes``; times etp, whose group all-gathers its rows) and the tokens it
    sends to the all-to-all (``T`` tokens per micro-batch, over tp under sequence parallelism, times top-k)."""
    base = Shard(tp=rm.tp, cp=rm.cp, ep=rm.ep, etp=rm.etp, sequence_parallel=rm.sequence_parallel,
                 dispatcher=dispatcher, expert_padding=expert_padding, dtoh_late=dtoh_late,
                 moe_router_fusion=moe_router_fusion)
    if card.is_dense or layer < card.dense_layers:
        return base
    r = routes[layer]
    i = rm.ep_index(rank)
    tm = T / rm.tp if rm.sequence_parallel and rm.tp > 1 else T
    return replace(base, expert_tokens=tuple(float(x) * rm.etp for x in r.rows[i]),  # etp all-gathers its rows
                   a2a_send_tokens=tm * card.top_k)


def _overlapped(memo: dict[int, tuple[list[Op], list[Op]]], ops: list[Op], tp: int, p: Precision,
                sm_count: int) -> list[Op]:
    """``ops`` with their TP collectives overlapped (:func:`overlap_ops`), memoized per op list: the memo
    keeps the list itself, so an id freed and reused by another list never returns the wrong ops."""
    hit = memo.get(id(ops))
    if hit is not None and hit[0] is ops:
        return hit[1]
    out = overlap_ops(ops, tp, p, sm_count)
    memo[id(ops)] = (ops, out)
    return out


Layers = list[tuple[int, list[Op], list[float]]]
"""Per layer (embedding -1, head ``num_layers``, MTP depths after it): its op list and their durations (s)."""
Prepared = dict[tuple[int, int], tuple[Layers, Layers]]
"""(chunk, DualPipe direction) -> its forward layers and its backward layers (in backward order)."""


def build_step(card: MoEModelConfig, rm: RankMap, global_batch: int, micro: int, seq: int,
               opts: BuildOptions, predict: Any, device: str = "GPU") -> Built:
    """Synthesize one training step (see module docs). ``predict(ops) -> durations`` times kernels."""
    from cosim.errors import CosimInputError

    if global_batch % (micro * rm.dp):
        raise CosimInputError(f"batch.global: {global_batch} sequences are not divisible by micro {micro} x dp "
                              f"{rm.dp} = {micro * rm.dp}")
    if seq % rm.cp:
        raise CosimInputError(f"batch.seq: {seq} is not divisible by cp {rm.cp}")
    plan = _StepPlan(card, rm, global_batch, micro, seq, opts, predict)
    calm = not opts.gpu_slowdown and not opts.host_slowdown and not opts.launch_jitter
    fold = opts.fold if opts.fold is not None else (opts.routing.is_uniform and calm)
    classes = _skew_classes(rm) if opts.fold is None and not fold and calm and not card.is_dense else 0
    stage_ranks = rm.world // rm.pp  # a stage's ranks are consecutive (RankMap.rank: pp is the outermost)
    per_stage = 1 if fold else classes or stage_ranks  # simulated ranks per stage: its first ones
    ranks = [s * stage_ranks + i for s in range(rm.pp) for i in range(per_stage)]
    graphs = []
    spans: dict[int, list[tuple[int, int, bool]]] = {}
    keys: dict[int, list[tuple[tuple[Unit, ...], bool]]] = {}
    with gc_paused():  # ~50k acyclic op rows per rank and micro-batch (graph.gc_paused)
        for rank in ranks:
            rg, spans[rank], keys[rank] = _StepRank(plan, rank, device).build()
            graphs.append(rg)
    tokens = global_batch * seq
    per_tok = _model_flops_per_token(card, seq)
    notes = []
    for rg in graphs if classes else []:
        # the replay matches a collective among its simulated members, and adds the other replicas' EP/TP groups
        rg.source.update(fold="classes", fold_block=classes, stage_ranks=stage_ranks)
    why = (f"skewed routing: the {rm.edp} expert-data-parallel replicas of each EP rank hold the same experts and "
           "see the same routed load; one simulated per class, its collectives still span every member" if classes
           else "one rank per pipeline stage; uniform routing makes every rank of a stage run the same program"
           if fold else "")
    if why:
        notes.append(f"folded {rm.world} ranks into {len(ranks)} class{'es' if len(ranks) > 1 else ''} ({why})")
    return Built(ExecutionGraph(graphs), ranks, fold or bool(classes), plan.m, tokens, 3.0 * per_tok * tokens, spans,
                 notes, keys if rm.schedule != "dualpipe" else {})


class _StepPlan:
    """What every simulated rank of one training step shares: the batch's shape (``m`` micro-batches per pipeline,
    ``T`` tokens per micro-batch and CP rank, ``sp_tokens`` per TP rank under sequence parallelism), the precision
    recipe ``p``, the routed load per MoE layer, the pipeline's activation bytes per send, and the memos that let
    ranks share layer op lists, their predicted kernel durations (s) and their recomputed ops."""

    __slots__ = ("T", "backwards", "cache", "card", "chunks", "keep", "late_dtoh", "m", "opts", "p", "pp_bytes", "predict",
                 "recomputes", "rm", "routes", "seq", "sp_tokens", "times", "tpo")

    def __init__(self, card: MoEModelConfig, rm: RankMap, global_batch: int, micro: int, seq: int,
                 opts: BuildOptions, predict: Any) -> None:
        self.card, self.rm, self.opts, self.predict, self.seq = card, rm, opts, predict, seq
        self.m = global_batch // (micro * rm.dp)
        self.T = T = float(micro * seq // rm.cp)
        p = recipe_with_experts(opts.precision, opts.expert_precision)
        self.p = replace(p, dispatch_bytes=opts.dispatch_bytes) if opts.dispatch_bytes is not None else p
        self.routes: dict[int, Any] = {} if card.is_dense else {
            ly: route(opts.routing, card, ly, rm.ep, T / rm.tp if rm.sequence_parallel and rm.tp > 1 else T)
            for ly in card.moe_layers}
        _mtp_routes(card, self.routes)
        self.chunks = rm.pp * rm.vpp
        self.sp_tokens = T / rm.tp if rm.sequence_parallel and rm.tp > 1 else T
        self.pp_bytes = self.sp_tokens * card.hidden_size * self.p.act_bytes
        self.late_dtoh = "moe_preprocess" in opts.graph_scopes and opts.dispatch not in ("deepep", "hybridep") \
            and opts.moe_host_sync
        self.cache: dict[Any, list[Op]] = {}  # layer ops per (layer kind, window, shard)
        self.tpo: dict[int, tuple[list[Op], list[Op]]] = {}  # id(layer op list) -> (that list, its TP-overlapped fwd)
        self.backwards: dict[int, tuple[list[Op], list[Op]]] = {}  # id(forward op list) -> (that list, its backward)
        self.times: dict[int, list[float]] = {}  # id(op list) -> its kernel durations (s)
        self.keep: list[list[Op]] = []  # keeps the op lists alive while their id() keys the durations
        self.recomputes: dict[int, tuple[Op, Op]] = {}  # id(forward op) -> (that op, its recomputation)

    def deepep_label_of(self, o: Op) -> str:
        """DeepEP label of an EP all-to-all (forward dispatch: its payload per token; the combine and every
        backward transfer carry BF16 tokens or gradients)."""
        from cosim.workload.synth.infer import deepep_label

        assert o.comm is not None
        card, sp_tokens = self.card, self.sp_tokens
        kind = "dispatch" if o.comm.kind == "all_to_all_dispatch" else "combine"
        bpt = o.comm.nbytes / (sp_tokens * card.top_k) if kind == "dispatch" else 2.0 * card.hidden_size
        return deepep_label(kind, "normal", sp_tokens, bpt, card.top_k, card.num_experts)

    def chunk_ops(self, rank: int, c: int) -> tuple[Layers, Layers]:
        """Chunk ``c`` of ``rank``: per layer (embedding -1, head num_layers) its forward ops and
        durations, and the backward ones in backward order."""
        card, rm, opts, T, p, routes, cache = self.card, self.rm, self.opts, self.T, self.p, self.routes, self.cache
        fw: Layers = []
        sh0 = Shard(tp=rm.tp, cp=rm.cp, sequence_parallel=rm.sequence_parallel)
        if c == 0:
            fw.append((-1, embedding_ops(card, T, sh0, p), []))
        for ly in rm.chunk_layers[c]:
            sh = _shard(rm, card, rank, ly, routes, T, opts.dispatch if opts.dispatch in ("deepep", "hybridep")
                        else "alltoall", opts.expert_padding, dtoh_late=self.late_dtoh,
                        moe_router_fusion=opts.moe_router_fusion)
            key = (ly if ly in routes and not opts.routing.is_uniform else ly < card.dense_layers, card.window(ly), sh)
            if key not in cache:
                cache[key] = layer_ops(card, ly, T, self.seq, sh, p)
            fw.append((ly, cache[key], []))
        if c == rm.mtp_chunk:
            fw += _mtp_chunk_ops(card, rm, rank, routes, T, self.seq, p, cache, opts, self.late_dtoh)
        if c == self.chunks - 1:
            fw.append((card.num_layers, _head_with_mtp(card, rm, T, sh0, p, cache, opts.cross_entropy_fusion), []))
        bw0 = [(ly, self.backward_of(ops)) for ly, ops, _ in reversed(fw)]
        if opts.tp_comm_overlap:  # TE userbuffers (tpoverlap.py): memoized with the layer's ops
            fw = [(ly, _overlapped(self.tpo, ops, rm.tp, p, opts.sm_count), d) for ly, ops, d in fw]
            bw0 = [(ly, _overlapped(self.tpo, bops, rm.tp, p, opts.sm_count)) for ly, bops in bw0]
        fw = [(ly, ops, self.timed(ops)) for ly, ops, _ in fw]
        bw = [(ly, bops, self.timed(bops)) for ly, bops in bw0]
        return fw, bw

    def backward_of(self, ops: list[Op]) -> list[Op]:
        """The backward ops of forward op list ``ops`` (:func:`backward_ops`), built once per list (the memo keeps
        the list: an id freed and reused never returns another list's ops), so ranks and chunks sharing a layer's
        forward share its backward and its predicted durations (:meth:`timed`)."""
        hit = self.backwards.get(id(ops))
        if hit is None or hit[0] is not ops:
            opts = self.opts
            hit = self.backwards[id(ops)] = (ops, backward_ops(ops, opts.main_grad_bytes,
                                                               opts.main_grad_hook_bytes(self.rm.layout.zero == "fsdp")))
        return hit[1]

    def timed(self, ops: list[Op]) -> list[float]:
        """Kernel durations of op list ``ops`` (s), predicted once per list."""
        key = id(ops)
        if key not in self.times:
            self.times[key] = self.predict(ops)
            self.keep.append(ops)
        return self.times[key]

    def recomputed_op(self, fo: Op) -> Op:
        """``fo`` re-run in the backward pass (``<name>.recompute``), built once per forward op."""
        hit = self.recomputes.get(id(fo))
        if hit is None or hit[0] is not fo:
            hit = self.recomputes[id(fo)] = (fo, replace(fo, name=f"{fo.name}.recompute"))
        return hit[1]


class _StepRank:
    """One simulated rank's training step under construction: its chunks' prepared layers, its gradient bucket
    plans (``bucket_plans``, per prepared chunk; ``closing``: by the layer whose backward closes them), the
    parameter all-gathers it waits for (overlapped gathers, FSDP), its offloader, and the phases that
    emit its program into a :class:`_RankBuilder` (:meth:`build`)."""

    __slots__ = ("bucket_plans", "channels", "closing", "fsdp", "full", "gathered", "graph_cost", "graphs_on",
                 "groups", "gslow", "host_sync", "last_mb", "launch", "num_layers", "off", "opts", "order",
                 "overlap_grads", "param_wait", "plan", "prepared", "prepared_fwd", "rank", "rb", "replayable",
                 "routes", "scopes", "sh_dispatcher", "solo", "stage", "unit_key", "unit_span", "unsharded", "wfifo")

    def __init__(self, plan: _StepPlan, rank: int, device: str) -> None:
        rm, opts, card = plan.rm, plan.opts, plan.card
        self.plan, self.rank = plan, rank
        self.opts, self.routes, self.num_layers = opts, plan.routes, card.num_layers
        self.host_sync = opts.moe_host_sync
        self.stage = stage = rm.coords(rank)[3]
        self.gslow = opts.gpu_slowdown.get(rank, 1.0)
        self.launch = launch = (opts.launch_overhead + opts.dispatch_overhead) * opts.host_slowdown.get(rank, 1.0)
        self.sh_dispatcher = opts.dispatch if opts.dispatch in ("deepep", "hybridep") else "alltoall"
        deepep = self.sh_dispatcher == "deepep" and rm.ep > 1
        at_dispatch = deepep or (rm.layout.a2a_overlap and rm.ep > 1 and self.sh_dispatcher == "alltoall")
        self.rb = rb = _rank_builder(rank, rm.world, device, opts, "copy" if plan.late_dtoh else "dispatch"
                                     if at_dispatch else "permute")
        rb.sync_behind_stream = deepep
        self.graphs_on = rm.layout.cuda_graphs
        self.graph_cost = opts.graph_launch_overhead * opts.host_slowdown.get(rank, 1.0)
        self.full = rb.full_graph
        self.scopes = opts.graph_scopes
        self.groups = {k: rm.group(k, rank) for k in ("tp", "cp", "ep", "etp", "dp", "edp")}
        self.order = (accumulated_order(stage, rm.pp, rm.vpp, plan.m, opts.grad_accum,
                                        extra_warmup=int(rm.layout.a2a_overlap)) if rm.schedule != "dualpipe" else [])
        if rm.schedule == "dualpipe":  # rank `stage` holds stage `stage` of direction 0 and pp-1-stage of direction 1
            self.prepared = {(rm.chunk_stage(stage, d), d): plan.chunk_ops(rank, rm.chunk_stage(stage, d))
                             for d in (0, 1)}
        else:
            self.prepared = {(c, 0): plan.chunk_ops(rank, c) for c in rm.stage_chunks(stage)}
        self.unit_span: list[tuple[int, int, bool]] = []
        self.unit_key: list[tuple[tuple[Unit, ...], bool]] = []
        self.bucket_plans, self.closing = _bucket_plans(rm, card, self.prepared)
        self.overlap_grads = rm.layout.overlap_grad_reduce or rm.layout.zero == "fsdp"
        self.param_wait = self._gathers_ahead() if rm.overlap_param_gather else {}
        self.fsdp = rm.layout.zero == "fsdp"
        self.gathered: dict[int, list[int]] = {}
        self.unsharded: set[int] = set()  # FSDP: layers whose parameters are gathered and not yet freed
        self.off = _offloader(rb, opts, rm, card, plan.T, plan.p, launch)
        self.wfifo: list[tuple[int, list[tuple[Op, float]], list[Bucket]]] = []  # DualPipe: W passes to come
        self.last_mb = plan.m - 1 if rm.schedule != "dualpipe" else plan.m // 2 - 1
        self.prepared_fwd = {ly: (ops, durs) for fw_, _ in self.prepared.values() for ly, ops, durs in fw_}
        self.solo = False  # a unit runs alone (run): no other unit interleaves at its collectives
        self.channels: dict[tuple[str, bool, int, int, int], tuple[list[int], int, Op] | None] = {}  # p2p's
        self.replayable = self.off is None and rb.rng is None  # layer blocks recorded and replayed (rb.block)

    def _gathers_ahead(self) -> dict[int, list[int]]:
        """Overlapped parameter all-gathers (steady state: the last step's gathers run under this step's forward),
        bucket by bucket in the order of their layers' first forward use; layer -> the gathers it waits for."""
        first_use = {ly: (i, k) for i, (key, (fw, _)) in enumerate(self.prepared.items())
                     for k, (ly, _, _) in enumerate(fw)}
        ahead = sorted((b for bs in self.bucket_plans.values() for b in bs),
                       key=lambda b: (min(first_use[x] for x in b[1]), b[0] != "dp"))
        return _param_gathers(self.rb, ahead, self.groups, self.launch)

    def build(self) -> tuple[RankGraph, list[tuple[int, int, bool]], list[tuple[tuple[Unit, ...], bool]]]:
        """The rank's step: its graph, its schedule units' spans (:attr:`Built.unit_spans`) and their units
        (:attr:`Built.unit_keys`). The pipeline schedule, then the gradient reductions not overlapped, the
        sequence-parallel and MTP-embedding gradient all-reduces, and the optimizer step."""
        plan, rb, rm = self.plan, self.rb, self.plan.rm
        if self.full:  # forward_backward_func captured whole (FullCudaGraphWrapper)
            rb.open_graph(self.graph_cost)
        if rm.schedule == "dualpipe":
            self._dualpipe()
        else:
            self._one_f_one_b()
        buckets = [b for bs in self.bucket_plans.values() for b in bs]
        if not self.overlap_grads:  # finalize_model_grads: every chunk's buckets after the last backward
            rb.switch(0)
            _grad_buckets(rb, rm, buckets, self.groups, self.emit)
        _sp_grad_all_reduce(rb, rm, plan.card, self.groups["tp"], self.launch,
                            [ly for fw, _ in self.prepared.values() for ly, _, _ in fw])
        _mtp_embedding_grad(rb, rm, plan.card, self.rank, self.launch)
        if self.full:  # the optimizer step runs eagerly, outside the full-iteration graph
            rb.close_graph()
        _optimizer(rb, rm, plan.card, self.stage, self.groups, self.launch, self.emit, plan.predict, buckets)
        return rb.finish(), self.unit_span, self.unit_key

    def param_ready(self, ly: int) -> None:
        """The first forward use of layer ``ly`` waits for the all-gathers of its parameters' buckets."""
        self.rb.pending += [(j, "param_gather") for j in self.param_wait.pop(ly, [])]

    def emit(self, o: Op, d: float, ly: int = -1) -> int:
        """Emit op ``o`` of layer ``ly`` lasting ``d`` (s, before this rank's slowdown): its all-to-all's
        per-peer bytes or DeepEP / HybridEP label (:meth:`_a2a_tags`), its partial CUDA graph, its offload copies.
        Returns its GPU op."""
        rb = self.rb
        splits = label = None
        if (o.cls == "collective" and ly in self.routes and o.comm is not None
                and o.comm.kind.startswith("all_to_all")):
            splits, label = self._a2a_tags(o, ly)
        if self.scopes:  # partial CUDA graphs: a run of scoped ops is one graph launch
            if graph_scoped(o.name, self.scopes, self.sh_dispatcher):
                if rb.graph_host < 0:
                    rb.open_graph(self.graph_cost)
            elif rb.graph_host >= 0:
                rb.close_graph()
        off = self.off
        if off is None or not 0 <= ly < self.num_layers:
            return rb.emit(o, d * self.gslow, self.groups, self.launch, splits, label=label, host_sync=self.host_sync)
        return _offload_emit(off, o, ly, self.prepared_fwd, lambda: rb.emit(
            o, d * self.gslow, self.groups, self.launch, splits, label=label, host_sync=self.host_sync))

    def _a2a_tags(self, o: Op, ly: int) -> tuple[list[float] | None, str | None]:
        """An EP all-to-all of MoE layer ``ly``: its per-peer bytes under skewed routing, else its DeepEP or
        HybridEP label (None where neither applies)."""
        opts = self.opts
        if not opts.routing.is_uniform:
            return _splits(o, self.routes[ly].send_fraction), None
        if opts.dispatch == "deepep":
            return None, self.plan.deepep_label_of(o)
        if opts.dispatch == "hybridep":
            return None, hybridep_label(o, self.plan.sp_tokens, self.plan.card, opts.hybridep_sms)
        return None, None

    def emit_all(self, seg: Iterable[tuple[Op, float]], ly: int) -> None:
        """Emit a segment of layer ``ly``'s ops (:meth:`emit`)."""
        emit = self.emit
        for o, d in seg:
            emit(o, d, ly)

    def emit_seg(self, seg: Seg, ly: int) -> None:
        """Emit a segment of layer ``ly``'s ops as a block (:meth:`_RankBuilder.block`, keyed by its ops, which the
        prepared layers keep alive, and durations) where blocks are replayable, else op by op."""
        if not self.replayable or not seg:
            self.emit_all(seg, ly)
            return
        key = ("segment", ly, tuple([id(o) for o, _ in seg]), tuple([d for _, d in seg]))
        self.rb.block(key, lambda: self.emit_all(seg, ly))

    def recompute(self, ly: int, fwd: dict[int, tuple[list[Op], list[float]]] | None = None) -> None:
        """Backward layer ``ly``'s recomputation of its forward (``fwd``: by layer, the chunk's; default every
        prepared chunk's) as the layout's recompute says (:func:`_recompute_layer`)."""
        plan = self.plan
        layers = self.prepared_fwd if fwd is None else fwd

        def go() -> None:
            _recompute_layer(plan.rm, plan.card, layers, self.emit, plan.recomputed_op, ly)

        if self.replayable and ly in layers:
            self.rb.block(("recompute", ly, id(layers[ly][0])), go)
        else:
            go()

    def fsdp_gather(self, ly: int) -> None:
        """FSDP: all-gather layer ``ly``'s bf16 parameters (issued ahead; waited for at the layer's start) unless
        they are still gathered (:meth:`fsdp_reshard`)."""
        if not self.fsdp or ly in self.gathered or ly in self.unsharded:
            return
        rm, rb, groups = self.plan.rm, self.rb, self.groups
        self.unsharded.add(ly)
        dense, expert = _unit_params(self.plan.card, ly, mtp_embedding_copy(rm.pp, rm.schedule))
        ids = []
        for g, n in (("dp", dense / rm.tp), ("edp", expert / (rm.ep * rm.etp))):
            if n > 0 and len(groups[g]) > 1:
                o = Op(f"fsdp.{g}_param_all_gather", "collective", 0.0, n * 2.0,
                       comm=Comm(g, "all_gather", n * 2.0), stream="dp")
                c = rb.collective("all_gather", groups[g], n * 2.0)
                ids.append(rb.op(o, 0.0, _STREAMS["dp"], self.launch, coll=c, waits=[rb.last_main]))
        self.gathered[ly] = ids

    def fsdp_reshard(self, ly: int, bwd: bool) -> None:
        """FSDP: free layer ``ly``'s gathered parameters after its forward / backward as the layout's
        ``fsdp_reshard_after_forward`` / ``fsdp_reshard_after_backward`` say (:data:`FSDP_RESHARD_SOURCE`)."""
        layout = self.plan.rm.layout
        if self.fsdp and (layout.fsdp_reshard_after_backward if bwd else layout.fsdp_reshard_after_forward):
            self.unsharded.discard(ly)

    def run_layers(self, layers: Layers, before: Callable[[int], None] | None = None,
                   after: Callable[[int], None] | None = None, skip_wgrad: list[tuple[Op, float]] | None = None,
                   bwd: bool = False) -> Iterator[None]:
        """Emit ``layers`` in order, yielding after every collective (DualPipe interleaves two units
        there). FSDP: gather each layer one ahead; CUDA graphs: one per layer; ``skip_wgrad``:
        weight-gradient GEMMs collected there instead (zero-bubble)."""
        rb, emit = self.rb, self.emit
        for i, (ly, ops, durs) in enumerate(layers):
            self.param_ready(ly)
            self.fsdp_gather(ly)
            rb.pending += [(j, "fsdp") for j in self.gathered.pop(ly, [])]
            if i + 1 < len(layers):
                self.fsdp_gather(layers[i + 1][0])  # prefetch: overlaps this layer's compute
            if self.graphs_on:
                rb.open_graph(self.graph_cost)
            if before is not None:
                before(ly)
            if self.solo and skip_wgrad is None and self.replayable:  # nothing interleaves at its collectives
                rb.block(("layer", ly, id(ops)), partial(self.emit_all, zip(ops, durs), ly))
            else:
                for o, d in zip(ops, durs):
                    if skip_wgrad is not None and o.name.endswith((".wgrad", ".main_grad_add")):
                        skip_wgrad.append((o, d))
                        continue
                    emit(o, d, ly)
                    if o.cls == "collective":
                        yield
            if not self.full:
                rb.close_graph()
            self.fsdp_reshard(ly, bwd)
            if after is not None:
                after(ly)

    def p2p(self, kind: str, send: bool, mb: int, c_from: int, c_to: int, dirn: int = 0) -> int:
        """Send or receive (``send``) micro-batch ``mb``'s activation (``kind`` F) or gradient (B) between chunks
        ``c_from`` and ``c_to`` (``dirn``: DualPipe's direction) with the peer stage; -1 when the peer is this
        rank, else the GPU op."""
        plan, rb = self.plan, self.rb
        key = (kind, send, c_from, c_to, dirn)
        channel = self.channels.get(key)
        if channel is None:
            channel = self.channels[key] = self._channel(*key)
        if channel is None:
            return -1
        members, stream, o = channel
        seq = (((0 if kind == "F" else 1) + 2 * dirn) * plan.m + mb) * plan.chunks + (c_to if kind == "F" else c_from)
        c = rb.collective("send_recv", members, o.bytes, seq=seq)
        j = rb.op(o, 0.0, stream, self.launch, coll=c, waits=[rb.last_compute] if send else None)
        if not send:
            rb.pending.append((j, o.name))
        return j

    def _channel(self, kind: str, send: bool, c_from: int, c_to: int, dirn: int) -> tuple[list[int], int, Op] | None:
        """:meth:`p2p`'s transfer besides its sequence number, the same for every micro-batch: its two ranks, its
        FIFO stream and its op (bytes); None when the peer is this rank."""
        plan, rank = self.plan, self.rank
        rm, chunks = plan.rm, plan.chunks
        peer_stage = rm.chunk_stage(c_to if send else c_from, dirn)
        tp_i, cp_i, dp_i, _ = rm.coords(rank)
        peer = rm.rank(tp_i, cp_i, dp_i, peer_stage)
        if peer == rank:
            return None
        nbytes = plan.pp_bytes * (1 + plan.card.mtp_layers if rm.mtp_chunk <= min(c_from, c_to) < chunks - 1 else 1)
        stream = 30 + 4 * peer_stage + (0 if send else 1) + (2 if kind == "B" else 0) + 1000 * dirn  # FIFO channel
        o = Op(f"pp.{'send' if send else 'recv'}_{'activation' if kind == 'F' else 'gradient'}", "collective",
               0.0, nbytes)
        return sorted([rank, peer]), stream, o

    def forward(self, c: int, mb: int, dirn: int = 0) -> Iterator[None]:
        """Chunk ``c``'s forward of micro-batch ``mb``: receive, layers, send (yields at its collectives)."""
        fw, _ = self.prepared[(c, dirn)]
        if c > 0:
            self.p2p("F", False, mb, c - 1, c, dirn)
        yield from self.run_layers(fw)
        if c < self.plan.chunks - 1:
            self.p2p("F", True, mb, c, c + 1, dirn)

    def backward(self, c: int, mb: int, dirn: int = 0, zb: bool = False) -> Iterator[None]:
        """Chunk ``c``'s backward of micro-batch ``mb`` (``zb``: zero-bubble, the weight gradients apart), with
        recomputation, offload reloads and the gradient buckets it closes (yields at its collectives)."""
        fw, bw = self.prepared[(c, dirn)]
        if c < self.plan.chunks - 1:
            self.p2p("B", False, mb, c + 1, c, dirn)
        if self.off is not None:
            self.off.chunk_backward([ly for ly, _, _ in fw])
        fwd_of = {ly: (ops, durs) for ly, ops, durs in fw}
        held: list[Bucket] = []  # zero-bubble: buckets closed by this B pass, reduced after its W pass

        def grads(ly: int) -> None:
            if mb == self.last_mb and self.overlap_grads:
                if zb:
                    held.extend(self.closing.get(ly, []))
                else:
                    _grad_buckets(self.rb, self.plan.rm, self.closing.get(ly, []), self.groups, self.emit)

        deferred: list[tuple[Op, float]] | None = [] if zb else None
        yield from self.run_layers(bw, lambda ly: self.recompute(ly, fwd_of), grads, deferred, bwd=True)
        if deferred:
            self.wfifo.append((dirn, deferred, held))
        elif held:
            _grad_buckets(self.rb, self.plan.rm, held, self.groups, self.emit)
        if c > 0:
            self.p2p("B", True, mb, c, c - 1, dirn)

    def run(self, gen: Iterator[None], lane: int = 0) -> None:
        """Run a forward or backward unit (its generator) to its end on lane ``lane``."""
        self.rb.switch(lane)
        self.solo = True
        for _ in gen:
            pass
        self.solo = False

    def _compute_since(self, first: int) -> list[int]:
        """The rank's compute-stream GPU ops from GPU op ``first`` on."""
        g = self.rb.g
        return [j for j in range(first, len(g["name"])) if g["stream"][j] == _STREAMS["compute"]]

    def _unit(self, first: int) -> None:
        """Record the span of the schedule unit whose ops start at GPU op ``first`` (none without compute), and
        whether it starts with a pipeline receive (:attr:`Built.unit_spans`)."""
        comp = self._compute_since(first)
        recv = bool(comp) and any(self.rb.g["stream"][j] >= 30 for j in range(first, comp[0]))
        if comp:
            self.unit_span.append((comp[0], comp[-1], recv))

    def _dualpipe(self) -> None:
        """DualPipe's schedule (:func:`dualpipe_order`): forward, backward (zero-bubble B), W and overlapped
        forward-backward units of both directions; micro-batches numbered per kind and direction."""
        rm, rb, stage = self.plan.rm, self.rb, self.stage
        nxt = {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}

        def take(kind: str, dirn: int) -> int:
            nxt[(kind, dirn)] += 1
            return nxt[(kind, dirn)] - 1

        for act in dualpipe_order(stage, rm.pp, self.plan.m):
            first = len(rb.g["name"])
            if act[0] == "F":
                self.run(self.forward(rm.chunk_stage(stage, act[1]), take("F", act[1]), act[1]), act[1])
            elif act[0] == "B":
                self.run(self.backward(rm.chunk_stage(stage, act[1]), take("B", act[1]), act[1], act[2]), act[1])
            elif act[0] == "W":
                dirn, ops, held_buckets = self.wfifo.pop(0)
                rb.switch(dirn)
                for o, d in ops:
                    self.emit(o, d)
                _grad_buckets(rb, rm, held_buckets, self.groups, self.emit)  # the weight gradients exist now
            else:
                df, db = act[1], act[2]
                # DualPipe's overlapped forward-backward: each one's communication under the other's compute
                rb.interleave([(self.forward(rm.chunk_stage(stage, df), take("F", df), df), df),
                               (self.backward(rm.chunk_stage(stage, db), take("B", db), db), db)])
            self._unit(first)
        rb.switch(0)

    def _one_f_one_b(self) -> None:
        """The (interleaved) 1F1B schedule (:func:`accumulated_order`); with ``a2a_overlap`` a forward and another
        micro-batch's backward paired (:class:`_Paired`, or interleaved at collectives where Megatron has no
        combined schedule); each unit's span and key recorded."""
        rm, rb, stage = self.plan.rm, self.rb, self.stage
        lo, hi = steady_bounds(self.order)
        pos = 0
        for step in (_overlap_pairs(self.order) if rm.layout.a2a_overlap else [[u] for u in self.order]):
            first = len(rb.g["name"])
            n_span = len(self.unit_span)
            if len(step) == 2:  # EP all-to-all overlap: a forward and another micro-batch's backward
                (_, mf, vf), (_, mb_, vb) = step
                if self.fsdp or self.graphs_on or rm.layout.recompute == "full":  # not Megatron's combinations
                    rb.interleave([(self.forward(vf * rm.pp + stage, mf), 0),
                                   (self.backward(vb * rm.pp + stage, mb_), 1)])
                else:
                    _Paired(self, vf * rm.pp + stage, mf, vb * rm.pp + stage, mb_).run()
                rb.switch(0)
            else:
                kind, mb, v = step[0]
                self.run(self.forward(v * rm.pp + stage, mb) if kind == "F" else self.backward(v * rm.pp + stage, mb))
            self._unit(first)
            if len(self.unit_span) > n_span:
                self.unit_key.append((tuple(step), lo <= pos < hi))
            pos += len(step)


class _Paired:
    """Megatron-Core's combined 1F1B (``overlap_moe_expert_parallel_comm``, ``TransformerModelChunkSchedulePlan.run``
    / ``TransformerLayerSchedulePlan.run``) on rank ``r``: the forward of chunk ``cf`` micro-batch ``mf`` (lane 0)
    and the backward of chunk ``cb`` micro-batch ``mb`` (lane 1) layer by layer (forward layer i with backward layer
    n-1-i), on one compute and one communication stream, in the order docs/SYNTHESIS.md "EP all-to-all overlap"
    gives (segments: :func:`_fwd_parts`, :func:`_bwd_parts`)."""

    __slots__ = ("bw", "cb", "cf", "dw", "fw", "mb", "mf", "post", "post_ly", "r")

    def __init__(self, r: _StepRank, cf: int, mf: int, cb: int, mb: int) -> None:
        self.r, self.cf, self.mf, self.cb, self.mb = r, cf, mf, cb, mb
        self.fw = r.prepared[(cf, 0)][0]
        self.bw = r.prepared[(cb, 0)][1]
        # the last micro-batch's backward closes gradient buckets (_StepRank.backward); it is never paired
        assert mb != r.last_mb, "the last micro-batch's backward is in the cool-down (_overlap_pairs)"
        self.post: Seg = []  # the forward's ops after its combine: they run before its next layer
        self.post_ly = -1
        self.dw: tuple[int, Seg] | None = None  # a backward layer's deferred attention wgrad

    def run(self) -> None:
        """The pair: receives and the unpaired ends (:meth:`_open`), the layers paired (:meth:`_layer`), the sends
        and the other unpaired ends (:meth:`_close`)."""
        r, nl = self.r, self.r.plan.card.num_layers
        self._open()
        # MTP depths pair as layers (Megatron-Core's model_chunk_schedule_plan: an MTP layer runs the
        # transformer layer's nodes, its norms, projection and embedding in the attn node, its head and loss
        # in mtp_post_process); the embedding and the main head stay unpaired
        f_layers = [x for x in self.fw if 0 <= x[0] < nl or mtp_depth(r.plan.card, x[0]) is not None]
        b_layers = [x for x in self.bw if 0 <= x[0] < nl or mtp_depth(r.plan.card, x[0]) is not None]
        n = min(len(f_layers), len(b_layers))
        for i in range(max(len(f_layers), len(b_layers))):
            self._layer(f_layers[i] if i < len(f_layers) else None, b_layers[i] if i < len(b_layers) else None,
                        i < n)
        self._close()

    def _open(self) -> None:
        """Receives of both units, the offload reload plan, then phase 0: the embedding forward (lane 0) and the
        head's backward (lane 1)."""
        r, rb, nl = self.r, self.r.rb, self.r.plan.card.num_layers
        rb.comm_lane = 0
        rb.switch(0)
        if self.cf > 0:
            r.p2p("F", False, self.mf, self.cf - 1, self.cf)
        rb.switch(1)
        if self.cb < r.plan.chunks - 1:
            r.p2p("B", False, self.mb, self.cb + 1, self.cb)
        if r.off is not None:
            r.off.chunk_backward([ly for ly, _, _ in self.bw])
        rb.switch(0)
        for ly, ops, durs in self.fw:
            if ly < 0:
                r.param_ready(ly)
                r.emit_all(list(zip(ops, durs)), ly)
        rb.switch(1)
        for ly, ops, durs in self.bw:
            if ly == nl:
                r.emit_all(list(zip(ops, durs)), ly)

    def _layer(self, f: tuple[int, list[Op], list[float]] | None, b: tuple[int, list[Op], list[float]] | None,
               both: bool) -> None:
        """Forward layer ``f`` with backward layer ``b`` (either None past the shorter side; ``both``: neither
        is), their segments interleaved so each all-to-all runs under the other's compute."""
        r = self.r
        fp = _fwd_parts(f[1], f[2]) if f is not None else None
        bp = _bwd_parts(b[1], b[2], r.plan.rm.layout.delay_wgrad) if b is not None else None
        lyf = f[0] if f is not None else -1
        lyb = b[0] if b is not None else -1
        if bp is not None:
            r.rb.switch(1)
            r.recompute(lyb)
            self.b_seg(lyb, bp[0])
            self.b_seg(lyb, bp[1])       # B: combine backward (comm)
            self.flush_dw()              # the previous backward layer's wgrad
        if fp is not None:
            self.f_seg(self.post_ly, self.post)
            self.f_seg(lyf, fp[0])       # F: attention, router, permute
            if not both:
                for seg in fp[1:4]:
                    self.f_seg(lyf, seg)
        if bp is not None:
            self.b_seg(lyb, bp[2])       # B: experts backward
        if fp is not None and both:
            self.f_seg(lyf, fp[1])       # F: dispatch (comm)
        if bp is not None:
            self.b_seg(lyb, bp[3], keep_main=True)  # B: experts wgrad (delay_wgrad_compute)
            self.b_seg(lyb, bp[4])       # B: dispatch backward (comm)
        if fp is not None and both:
            self.f_seg(lyf, fp[2])       # F: experts
            self.f_seg(lyf, fp[3])       # F: combine (comm)
        if fp is not None:
            self.post, self.post_ly = fp[4], lyf
        if bp is not None:
            self.b_seg(lyb, bp[5])       # B: attention backward
            self.dw = (lyb, bp[6])
            if not r.plan.rm.layout.delay_wgrad:
                self.flush_dw()

    def _close(self) -> None:
        """The backward's send (Megatron runs the first layer's wgrad after it), the forward's last combine, head
        and send, then the embedding's backward."""
        r, rb, nl = self.r, self.r.rb, self.r.plan.card.num_layers
        rb.switch(1)
        if self.cb > 0:
            r.p2p("B", True, self.mb, self.cb, self.cb - 1)
        self.flush_dw()
        self.f_seg(self.post_ly, self.post)
        for ly, ops, durs in self.fw:
            if ly == nl:
                r.param_ready(ly)
                r.emit_all(list(zip(ops, durs)), ly)
        if self.cf < r.plan.chunks - 1:
            r.p2p("F", True, self.mf, self.cf, self.cf + 1)
        rb.switch(1)
        for ly, ops, durs in self.bw:
            if ly < 0:
                r.emit_all(list(zip(ops, durs)), ly)
        rb.switch(0)
        rb.comm_lane = None

    def flush_dw(self) -> None:
        """The deferred attention wgrad of the previous backward layer, if any."""
        if self.dw is not None:
            self.r.rb.switch(1)
            self.r.emit_all(self.dw[1], self.dw[0])
            self.dw = None

    def f_seg(self, ly: int, seg: Seg) -> None:
        """A forward segment of layer ``ly`` on lane 0 (after its parameters' gathers)."""
        self.r.rb.switch(0)
        self.r.param_ready(ly)
        self.r.emit_seg(seg, ly)

    def b_seg(self, ly: int, seg: Seg, keep_main: bool = False) -> None:
        """A backward segment of layer ``ly`` on lane 1; ``keep_main``: a wgrad, so the next collective waits for
        the dgrad only (Megatron's events)."""
        rb = self.r.rb
        rb.switch(1)
        keep = rb.last_main
        self.r.emit_seg(seg, ly)
        if keep_main:
            rb.last_main = keep


def _skew_classes(rm: RankMap) -> int:
    """Ranks per pipeline stage simulated when routing is skewed (0: no partial folding): the first
    ``etp * ep`` ranks of each stage, those of expert-data-parallel index 0. The ``edp`` replicas of an
    (etp, ep) position hold the same experts and see the same routed load (:func:`route` depends on the
    layer and the EP rank only), so they run the same program; TP and CP groups stay whole (``tp * cp``
    divides ``etp * ep``). 0 when ``edp`` is 1, under DualPipe, or when TP/CP groups would be cut."""
    k = rm.etp * rm.ep
    if rm.edp <= 1 or rm.schedule == "dualpipe" or k % (rm.tp * rm.cp):
        return 0
    return k


def _offloader(rb: _RankBuilder, opts: BuildOptions, rm: RankMap, card: MoEModelConfig, T: float,
               p: Precision, launch: float) -> _Offload | None:
    """The rank's activation offloading (None: ``offload_modules`` empty)."""
    if not opts.offload_modules:
        return None
    from cosim.workload.synth.memory import MemoryOptions, offload_group_bytes

    lay = rm.layout
    local = T / (rm.tp if rm.sequence_parallel and rm.tp > 1 else 1) * card.hidden_size
    mo = MemoryOptions(offload_modules=opts.offload_modules)
    memo: dict[int, dict[str, float]] = {}

    def bytes_of(ops: list[Op]) -> dict[str, float]:
        """Bytes each offload group of a layer of forward ``ops`` keeps, once per op list."""
        key = id(ops)
        if key not in memo:
            memo[key] = offload_group_bytes(ops, lay.recompute, lay.recompute_modules, card, p, local * p.act_bytes,
                                            opts.offload_modules, mo)
        return memo[key]

    prev_layer = {ly: layers[i - 1] for layers in rm.chunk_layers for i, ly in enumerate(layers) if i > 0}
    return _Offload(rb, bytes_of, prev_layer, opts.host_link, launch)


def _offload_emit(off: _Offload, o: Op, ly: int, fwd: dict[int, tuple[list[Op], list[float]]], go: Any) -> int:
    """Emit op ``o`` of layer ``ly`` (``go()``) with activation offloading's copies and waits around it."""
    if o.bwd or o.name.endswith(".recompute"):
        off.before_backward(o, ly)
        j = int(go())
        off.after_backward(o, ly)
        return j
    j = int(go())
    off.forward(o, ly, j, fwd[ly][0])
    return j


def _overlap_pairs(order: list[tuple[str, int, int]]) -> list[list[tuple[str, int, int]]]:
    """Steps of Megatron's EP all-to-all overlap: every steady-state forward with the backward issued
    after it (the order has one more warm-up forward, so the two are independent: without a pipeline
    F0, F1+B0, ..., B last); each pair runs layer by layer in Megatron's combined-1F1B order (``paired``).
    A forward is never paired with its own backward (one micro-batch without a pipeline: F0, then B0, as
    Megatron-Core's ``combined_1f1b_schedule_for_no_pipelining`` runs it). So the last micro-batch's backwards are
    never paired: they follow the last forward (the cool-down), which :class:`_Paired` relies on."""
    steps: list[list[tuple[str, int, int]]] = []
    i = 0
    while i < len(order):
        if order[i][0] == "F" and i + 1 < len(order) and order[i + 1][0] == "B" and order[i + 1][1:] != order[i][1:]:
            steps.append([order[i], order[i + 1]])
            i += 2
        else:
            steps.append([order[i]])
            i += 1
    return steps


def _is_a2a(o: Op) -> bool:
    """``o`` is an EP all-to-all (dispatch or combine)."""
    return o.cls == "collective" and o.comm is not None and o.comm.kind.startswith("all_to_all")


def _a2a_runs(ops: list[Op]) -> list[tuple[int, int]]:
    """``[start, end)`` of each run of consecutive EP all-to-alls in ``ops``."""
    runs: list[tuple[int, int]] = []
    i = 0
    while i < len(ops):
        if _is_a2a(ops[i]):
            j = i
            while j < len(ops) and _is_a2a(ops[j]):
                j += 1
            runs.append((i, j))
            i = j
        else:
            i += 1
    return runs


Seg = list[tuple[Op, float]]


def _fwd_parts(ops: list[Op], durs: list[float]) -> list[Seg]:
    """A forward layer as Megatron's combined-1F1B nodes: [pre-dispatch (attention, router, permute, and the
    shared expert, which Megatron runs there under the overlap), dispatch, experts, combine, after the
    combine]; a layer without two all-to-all runs (dense) is all pre-dispatch."""
    od = list(zip(ops, durs))
    runs = _a2a_runs(ops)
    if len(runs) != 2:
        return [od, [], [], [], []]
    (a0, a1), (b0, b1) = runs
    mlp = od[a1:b0]
    shared = [x for x in mlp if x[0].name.startswith("moe.shared")]
    return [od[:a0] + shared, od[a0:a1], [x for x in mlp if not x[0].name.startswith("moe.shared")],
            od[b0:b1], od[b1:]]


def _bwd_parts(ops: list[Op], durs: list[float], delay_wgrad: bool) -> list[Seg]:
    """A backward layer as Megatron's combined-1F1B nodes: [before the combine's backward, the combine's
    backward, experts backward, experts wgrad (``delay_wgrad``, else empty: in the experts backward),
    dispatch backward, pre-dispatch backward, its wgrad (``delay_wgrad``)]. The shared expert's backward
    goes with the pre-dispatch part (as its forward)."""
    od = list(zip(ops, durs))
    runs = _a2a_runs(ops)

    def split(seg: Seg) -> tuple[Seg, Seg]:
        if not delay_wgrad:
            return seg, []
        wg = (".wgrad", ".main_grad_add")  # the hook's add follows its weight gradient
        return [x for x in seg if not x[0].name.endswith(wg)], [x for x in seg if x[0].name.endswith(wg)]

    if len(runs) != 2:
        pre, pre_w = split(od)
        return [[], [], [], [], [], pre, pre_w]
    (a0, a1), (b0, b1) = runs
    mid = od[a1:b0]
    shared = [x for x in mid if x[0].name.startswith("moe.shared")]
    mlp, mlp_w = split([x for x in mid if not x[0].name.startswith("moe.shared")])
    pre, pre_w = split(shared + od[b1:])
    return [od[:a0], od[a0:a1], mlp, mlp_w, od[b0:b1], pre, pre_w]


def _splits(o: Op, send_fraction: np.ndarray) -> list[float]:
    """Per-peer bytes of a routed all-to-all (``elem_bytes`` is 1): towards the experts (the dispatch,
    and the combine's backward) by each peer's share of the routed rows; back from the experts (the
    combine, and the dispatch's backward) an equal part to every peer, since every peer sent this
    rank the same rows."""
    assert o.comm is not None
    ep = len(send_fraction)
    if o.comm.kind == "all_to_all_dispatch":
        return [o.comm.nbytes * float(f) for f in send_fraction]
    return [o.comm.nbytes / ep] * ep


Bucket = tuple[str, list[int], float]
"""A DP gradient bucket: its group (``dp`` dense, ``edp`` expert), its layers in backward order and its parameters
on this rank."""


FSDP_RESHARD_SOURCE = ("pytorch/pytorch torch/distributed/fsdp/_fully_shard/_fully_shard.py (fully_shard "
                       "reshard_after_forward=True: free the unsharded parameters after forward, all-gather them "
                       "again in backward; False: keep them until backward; FSDPModule.set_reshard_after_backward); "
                       "NVIDIA-NeMo/Automodel nemo_automodel/components/moe/parallelizer.py (parallelize_model / "
                       "apply_fsdp: reshard_after_forward: bool = False), components/moe/fsdp_mixin.py "
                       "(MoEFSDPSyncMixin with backend enable_fsdp_optimizations: reshard_after_backward=False and "
                       "requires_gradient_sync=False for every backward but the last; with PP through the patched "
                       "backward_maybe_with_nosync), examples/benchmark/configs/*.yaml (the rows' settings)")
"""Where the FSDP resharding switches come from."""


DDP_BUCKET_SOURCE = ("NVIDIA/Megatron-LM core_v0.16.0 megatron/core/distributed/distributed_data_parallel.py "
                     "(bucket_size None -> max(40000000, 1000000 * dp_cp group size): 'larger DP sizes need larger "
                     "buckets to ensure collectives do not become latency-bound'; None again without "
                     "overlap_grad_reduce); NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/comm_overlap.py "
                     "(CommOverlapConfig._get_optimizer_overlap_cfgs: bucket_size = 128 * 1024 * 1024 when dp > 1, "
                     "as NeMo 2.0's MegatronCommOverlapCallback)")
"""Where the gradient bucket size comes from."""


def ddp_bucket_params(rm: RankMap) -> float:
    """Parameters per gradient bucket (:data:`DDP_BUCKET_SOURCE`): the layout's ``grad_bucket_params``, else
    Megatron-Core's default ``max(40M, 1M x dp x cp)`` (dp 64: 64M; dp 128: 128M)."""
    lay = rm.layout
    if lay.grad_bucket_params is not None:
        return float(lay.grad_bucket_params)
    return float(max(40_000_000, 1_000_000 * rm.dp * rm.cp))


def _bucket_plan(rm: RankMap, card: MoEModelConfig, layers: list[int], bucketed: bool = True) -> list[Bucket]:
    """The gradient buckets of one model chunk whose layers (-1: embedding, ``num_layers``: head) the backward
    completes in the order ``layers``, in the order the backward closes them (dense before expert at one layer).
    Megatron-Core's DDP fills a bucket of ``grad_bucket_params`` per buffer (dense, expert) in backward order; without
    ``overlap_grad_reduce``, or not ``bucketed`` (Megatron-Core core_v0.16.0 distributed_data_parallel.py: every
    pipeline stage but the first; training.py get_model: every model chunk but the first), its bucket size is None:
    one bucket per chunk and buffer. FSDP: one per layer."""
    lay = rm.layout
    per_layer = lay.zero == "fsdp"
    size = ddp_bucket_params(rm) if (lay.overlap_grad_reduce and bucketed) or per_layer else math.inf
    closed: list[tuple[int, int, Bucket]] = []
    for gi, g in enumerate(("dp", "edp")):
        n, lys = 0.0, list[int]()
        for i, ly in enumerate(layers):
            dense, expert = _unit_params(card, ly, mtp_embedding_copy(rm.pp, rm.schedule))
            x = dense / rm.tp if g == "dp" else expert / (rm.ep * rm.etp)
            if x <= 0:
                continue
            n += x
            lys.append(ly)
            if per_layer or n >= size or i == len(layers) - 1:
                closed.append((i, gi, (g, lys, n)))
                n, lys = 0.0, []
        if n > 0:
            closed.append((len(layers) - 1, gi, (g, lys, n)))
    return [b for _, _, b in sorted(closed, key=lambda t: (t[0], t[1]))]


def _grad_buckets(rb: _RankBuilder, rm: RankMap, buckets: list[Bucket], groups: dict[str, list[int]],
                  emit: Any) -> None:
    """Reduce ``buckets`` (:func:`_bucket_plan`) on the dp stream after the last compute op: a reduce-scatter with
    ZeRO-1 and FSDP, an all-reduce with ``zero: 0`` or Muon (Megatron-Core's LayerWiseDistributedOptimizer leaves
    the full gradient on every rank, :data:`cosim.workload.synth.costs.MUON_SOURCE`), of ``grad_bytes`` per element. The compute stream goes on (it
    does not wait for them); the optimizer does (``_RankBuilder.grad_ops``)."""
    kind = "all_reduce" if rm.layout.zero == 0 or rb.optimizer == "muon" else "reduce_scatter"
    for g, _, n in buckets:
        if len(groups[g]) < 2:
            continue
        j = emit(Op(f"grad.{g}_{kind}", "collective", 0.0, n * rb.grad_bytes,
                    comm=Comm(g, kind, n * rb.grad_bytes), stream="dp"), 0.0)
        if j >= 0:
            rb.pending = [(w, nm) for w, nm in rb.pending if w != j]
            rb.grad_ops.append(j)


def _param_gathers(rb: _RankBuilder, buckets: list[Bucket], groups: dict[str, list[int]], launch: float,
                   waits: list[int] | None = None) -> dict[int, list[int]]:
    """All-gather the bf16 parameters of ``buckets`` (the distributed optimizer's ``start_param_sync``) on the dp
    stream in that order after the ops ``waits``; returns, per layer, the gathers its parameters come from."""
    out: dict[int, list[int]] = {}
    for g, lys, n in buckets:
        if len(groups[g]) < 2:
            continue
        name = f"optim.{g}_param_all_gather"
        c = rb.collective("all_gather", groups[g], n * 2.0)
        j = rb.op(Op(name, "collective", 0.0, n * 2.0, comm=Comm(g, "all_gather", n * 2.0), stream="dp"), 0.0,
                  _STREAMS["dp"], launch, coll=c, waits=waits)
        for ly in lys:
            out.setdefault(ly, []).append(j)
    return out


def _unit_params(card: MoEModelConfig, layer: int, emb_copy: bool = False) -> tuple[float, float]:
    """(dense, expert) parameters of a layer, of the embedding (-1), of the LM head and final norm
    (``num_layers``) or of an MTP depth (:func:`_mtp_unit_params`), unsharded."""
    if mtp_depth(card, layer) is not None:
        return _mtp_unit_params(card, layer, emb_copy)
    if layer == -1:
        return float(card.vocab_size * card.hidden_size), 0.0
    if layer == card.num_layers:
        return float(card.vocab_size * card.hidden_size + card.hidden_size), 0.0
    d, e = layer_params(card, layer)
    return float(d), float(e)


def _stage_params(rm: RankMap, card: MoEModelConfig, stage: int) -> tuple[float, float]:
    """(dense, expert) parameters one rank of ``stage`` holds."""
    dense = expert = 0.0
    for c in rm.stage_chunks(stage):
        for ly in rm.chunk_layers[c]:
            d, e = layer_params(card, ly)
            dense += d / rm.tp
            expert += e / (rm.ep * rm.etp)
        if c == 0:
            dense += card.vocab_size * card.hidden_size / rm.tp
        if c == rm.last_chunk:
            dense += card.vocab_size * card.hidden_size / rm.tp + card.hidden_size
        if c == rm.mtp_chunk:
            md, me = mtp_params(card, mtp_embedding_copy(rm.pp, rm.schedule))
            dense += md / rm.tp
            expert += me / (rm.ep * rm.etp)
    return dense, expert


def _optimizer(rb: _RankBuilder, rm: RankMap, card: MoEModelConfig, stage: int, groups: dict[str, list[int]],
               launch: float, emit: Any, predict: Any, buckets: list[Bucket]) -> None:
    """Grad-norm all-reduce (after every gradient reduction), the optimizer on this rank's shard, and (ZeRO-1
    without ``overlap_param_gather``) the parameter all-gather of every bucket in ``buckets``, exposed at the step's
    end. Adam: one elementwise kernel. Muon (``rb.optimizer``, :data:`cosim.workload.synth.costs.MUON_SOURCE`): the
    Newton-Schulz GEMMs of the 2-D weights this rank owns (all of its stage's with ``zero: 0``; with ``zero: 1``
    Megatron-Core's LayerWiseDistributedOptimizer, a 1/dp share, 1/edp of the experts'), the momentum update of
    those weights, and Adam on the rest (embedding, LM head, norms)."""
    dense, expert = _stage_params(rm, card, stage)
    ndp, nedp = (1, 1) if rm.layout.zero == 0 else (len(groups["dp"]), len(groups["edp"]))
    local = dense / ndp + expert / nedp
    norm = Op("optim.grad_norm_all_reduce", "collective", 0.0, 8.0, comm=Comm("dp", "all_reduce", 8.0), stream="dp")
    rb.pending += [(j, "grad") for j in rb.grad_ops]  # the optimizer reads the reduced gradients
    if len(groups["dp"]) > 1:
        c = rb.collective("all_reduce", groups["dp"], 8.0)
        rb.pending.append((rb.op(norm, 0.0, _STREAMS["dp"], launch, coll=c,
                                 waits=[rb.last_main, *rb.grad_ops]), norm.name))
    zeroing = (dense + expert) * rb.grad_bytes
    if rb.optimizer == "muon":
        mats = _stage_muon_matrices(rm, card, stage)
        md = sum(r * k * n for r, k, n, x in mats if not x) / ndp
        me = sum(r * k * n for r, k, n, x in mats if x) / nedp
        owned = [(r, k, n / (nedp if x else ndp)) for r, k, n, x in mats]
        muon = Op("optim.muon.momentum", "elementwise", (md + me) * 4.0,
                  (md + me) * (MUON_BYTES + _adam_grad_bytes(rb.grad_bytes)) + zeroing, "fp32")
        ns = muon_ops(owned)
        for o, t in zip([muon, *ns], predict([muon, *ns])):
            emit(o, t)
        rest = max(local - md - me, 0.0)
        adam = Op("optim.adam", "elementwise", rest * 12.0, rest * (ADAM_BYTES + _adam_grad_bytes(rb.grad_bytes)),
                  "fp32")
    else:
        adam = Op("optim.adam", "elementwise", local * 12.0,
                  local * (ADAM_BYTES + _adam_grad_bytes(rb.grad_bytes)) + zeroing, "fp32")
    emit(adam, predict([adam])[0])
    if rm.layout.zero == 1 and not rm.overlap_param_gather:  # every rank gathers the updated parameters
        _param_gathers(rb, buckets, groups, launch, waits=[rb.last_main])


def _stage_muon_matrices(rm: RankMap, card: MoEModelConfig, stage: int) -> list[tuple[float, float, float, bool]]:
    """The 2-D weights Muon orthogonalizes on one rank of ``stage`` before any DP split
    (:func:`cosim.workload.synth.costs.muon_matrices`; expert counts divided by ep; an MTP depth: its layer and its
    ``2h -> h`` projection)."""
    out: list[tuple[float, float, float, bool]] = []
    for c in rm.stage_chunks(stage):
        lys = list(rm.chunk_layers[c])
        if c == rm.mtp_chunk:
            lys += [mtp_body_layer(card)] * card.mtp_layers
            out += [(float(card.hidden_size), 2.0 * card.hidden_size / rm.tp, float(card.mtp_layers), False)]
        for ly in lys:
            out += [(r, k, n / rm.ep if x else n, x) for r, k, n, x in muon_matrices(card, ly, rm.tp, rm.etp)]
    return out


def _model_flops_per_token(card: MoEModelConfig, seq: int) -> float:
    """Forward FLOPs per token of the whole model (layers, embedding-free LM head), for MFU."""
    from cosim.workload.synth.costs import layer_forward_flops

    t = float(seq)
    total = sum(layer_forward_flops(card, ly, int(t), seq) for ly in _distinct_layers(card)) / t
    return total + 2.0 * card.vocab_size * card.hidden_size + _mtp_flops_per_token(card, seq)


def _distinct_layers(card: MoEModelConfig) -> list[int]:
    """Per layer, the first layer of its kind (dense or MoE, attention window): layers of one kind cost the same
    under uniform routing, so one representative stands for each."""
    first: dict[tuple[bool, int | None], int] = {}
    out: list[int] = []
    for ly in range(card.num_layers):
        out.append(first.setdefault((ly < card.dense_layers, card.window(ly)), ly))
    return out


# ---------------------------------------------------------------- multi-token prediction (costs.MTP_SOURCE)
def _mtp_routes(card: MoEModelConfig, routes: dict[int, Any]) -> None:
    """Each MTP depth routes as the main model's last layer (its MoE layer's kind): its routing is that layer's."""
    body = mtp_body_layer(card)
    if body in routes:
        for k in range(card.mtp_layers):
            routes[mtp_layer_index(card, k)] = routes[body]


def _mtp_head(o: Op) -> bool:
    """Whether MTP op ``o`` is part of its depth's logits and loss, which run on the ``L`` chunk (Megatron-Core
    GPTModel: the post-process stage computes every depth's output layer and loss, ``process_mtp_loss``); the MTP's
    final layernorm (``mtp.head.norm``) belongs to its layer."""
    return o.name.startswith("mtp.head.") and o.name != "mtp.head.norm"


def _head_with_mtp(card: MoEModelConfig, rm: RankMap, T: float, sh: Shard, p: Precision,
                   cache: dict[Any, list[Op]], ce_fusion: bool = True) -> list[Op]:
    """The ``L`` chunk's ops: with the MTP layers on an earlier chunk (``pipeline_model_parallel_layout``), each
    depth's logits and loss (:func:`_mtp_head`) before the main final norm, LM head and loss; else the head alone."""
    key = ("head", rm.mtp_chunk, sh, ce_fusion)
    if key not in cache:
        ops = head_ops(card, T, sh, p, ce_fusion)
        if card.mtp_layers and rm.mtp_chunk != rm.last_chunk:
            ops = [o for o in mtp_ops(card, T, T, sh, p, body=[], cross_entropy_fusion=ce_fusion)
                   if _mtp_head(o)] * card.mtp_layers + ops
        cache[key] = ops
    return cache[key]


def _mtp_chunk_ops(card: MoEModelConfig, rm: RankMap, rank: int, routes: dict[int, Any], T: float, seq: int,
                   p: Precision, cache: dict[Any, list[Op]], opts: BuildOptions,
                   late_dtoh: bool) -> list[tuple[int, list[Op], list[float]]]:
    """The MTP depths of their model chunk (the ``m`` of a ``pipeline_model_parallel_layout``; default the last),
    after its layers (Megatron-Core GPTModel: the decoder, the MTP block, each depth's logits and loss, then the main
    logits and loss): per depth its pseudo-layer index and forward ops; on a chunk before the ``L`` chunk without
    their logits and loss (:func:`_head_with_mtp`)."""
    if not card.mtp_layers:
        return []
    body = mtp_body_layer(card)  # every depth runs the same layer: one op list for all
    sh = _shard(rm, card, rank, body, routes, T, opts.dispatch if opts.dispatch in ("deepep", "hybridep")
                else "alltoall", opts.expert_padding, dtoh_late=late_dtoh,
                        moe_router_fusion=opts.moe_router_fusion)
    apart = rm.mtp_chunk != rm.last_chunk
    key = ("mtp", body if body in routes and not opts.routing.is_uniform else None, sh, apart)
    if key not in cache:
        ops = mtp_ops(card, T, seq, sh, p, cross_entropy_fusion=opts.cross_entropy_fusion)
        cache[key] = [o for o in ops if not _mtp_head(o)] if apart else ops
    return [(mtp_layer_index(card, k), cache[key], []) for k in range(card.mtp_layers)]


def _recompute_layer(rm: RankMap, card: MoEModelConfig, fwd: dict[int, tuple[list[Op], list[float]]], emit: Any,
                     recomputed_op: Any, ly: int) -> None:
    """Layer ``ly``'s recomputation before its backward (``fwd``: layer -> its forward ops and durations): an MTP
    depth's (:func:`_mtp_recompute`); full: its forward ops up to the early stop (``recompute_early_stop``);
    selective: the ops of its ``recompute_modules``."""
    lay = rm.layout
    if mtp_depth(card, ly) is not None:
        _mtp_recompute(rm, fwd[ly], emit, recomputed_op, ly)
    elif lay.recompute == "full" and 0 <= ly < card.num_layers:
        ops, durs = fwd[ly]
        end = early_stop_end(ops) if lay.recompute_early_stop else len(ops)
        for fo, fd in zip(ops[:end], durs[:end]):
            emit(recomputed_op(fo), fd, ly)
    elif lay.recompute == "selective" and 0 <= ly < card.num_layers:
        for fo, fd in zip(*fwd[ly]):
            if recomputed(fo.name, lay.recompute_modules):
                emit(recomputed_op(fo), fd, ly)


def _mtp_recompute(rm: RankMap, fwd: tuple[list[Op], list[float]], emit: Any, recomputed_op: Any, ly: int) -> None:
    """An MTP depth's recomputation before its backward: full re-runs its checkpointed part (projection, layer,
    final norm: :func:`cosim.workload.synth.costs.mtp_recomputed_full`), selective the ``recompute_modules`` of
    its layer."""
    lay = rm.layout
    for fo, fd in zip(*fwd):
        if ((lay.recompute == "full" and mtp_recomputed_full(fo.name))
                or (lay.recompute == "selective" and recomputed(fo.name, lay.recompute_modules))):
            emit(recomputed_op(fo), fd, ly)


def _mtp_unit_params(card: MoEModelConfig, layer: int, emb_copy: bool) -> tuple[float, float]:
    """(dense, expert) parameters of MTP depth pseudo-layer ``layer``; the first depth also holds the MTP stage's
    embedding copy (``emb_copy``)."""
    d, e = mtp_params(card)
    emb = card.vocab_size * card.hidden_size if emb_copy and mtp_depth(card, layer) == 0 else 0
    return float(d / card.mtp_layers + emb), float(e / card.mtp_layers)


def _mtp_embedding_grad(rb: _RankBuilder, rm: RankMap, card: MoEModelConfig, rank: int, launch: float) -> None:
    """Megatron-Core ``_allreduce_word_embedding_grads`` with MTP: the first stage's embedding and the MTP stage's
    copy sum their gradients (an all-reduce of ``vocab / tp x hidden`` gradient elements between the two ranks)
    after the data-parallel reduction, before the optimizer. Not under DualPipe (rank 0 holds both ends: DeepSeek-V3
    section 3.2.3 shares them physically)."""
    if not card.mtp_layers or not mtp_embedding_copy(rm.pp, rm.schedule):
        return
    tp_i, cp_i, dp_i, stage = rm.coords(rank)
    mtp_stage = rm.chunk_stage(rm.mtp_chunk)
    if stage not in (0, mtp_stage):
        return
    members = [rm.rank(tp_i, cp_i, dp_i, 0), rm.rank(tp_i, cp_i, dp_i, mtp_stage)]
    nbytes = card.vocab_size * card.hidden_size / rm.tp * rb.grad_bytes
    name = "mtp.embed_grad_all_reduce"
    c = rb.collective("all_reduce", members, nbytes)
    o = Op(name, "collective", 0.0, nbytes, comm=Comm("pp", "all_reduce", nbytes), stream="dp")
    j = rb.op(o, 0.0, _STREAMS["dp"], launch, coll=c, waits=[rb.last_main, *rb.grad_ops])
    rb.grad_ops.append(j)


SP_GRAD_SOURCE = (
    "Megatron-Core core_v0.16.0 megatron/core/distributed/finalize_model_grads.py: finalize_model_grads, after "
    "finish_grad_sync (the DP reduction) and before the embedding all-reduce, calls "
    "_allreduce_non_tensor_model_parallel_grads (formerly _allreduce_layernorm_grads): the main gradients of every "
    "parameter with the sequence_parallel attribute, flattened into one buffer (_flatten_dense_tensors) and all-reduced "
    "(SUM) once over the TP group. Tagged: Transformer Engine's norm weights (input, pre-MLP, final layernorm; MLA's "
    "q/kv layernorm; the MTP's enorm, hnorm and final layernorm), the router's weight (transformer/moe/router.py "
    "setattr(self.weight, 'sequence_parallel', ...)), the duplicated TELinear weights (MLA's q and kv down "
    "projections: extensions/transformer_engine.py, parallel_mode 'duplicated'), row-parallel linear biases. The same "
    "call also sums, with or without sequence parallelism, the gradients of every parameter whose name holds "
    "'q_layernorm' or 'k_layernorm' when config.qk_layernorm ('elif (config.sequence_parallel and getattr(param, "
    "\"sequence_parallel\", False)) or (config.qk_layernorm and (\"q_layernorm\" in name or \"k_layernorm\" in "
    "name))'): Qwen3's per-head q/k RMSNorm weights (gpt_layer_specs.py: q_layernorm / k_layernorm TENorm of "
    "hidden_size head_dim); MLA's TE spec fuses its q/kv norms into linear_q_up_proj / linear_kv_up_proj "
    "(q_layernorm=IdentityOp), whose names do not match")
"""Where the TP all-reduce of the non-tensor-parallel parameters' gradients comes from."""


def qk_norm_params(card: MoEModelConfig) -> int:
    """Parameters of one transformer layer's q and k norms (``qk_layernorm``, not MLA: :data:`SP_GRAD_SOURCE`),
    ``head_dim`` each; 0 without them."""
    return 2 * card.attn_head_dim if card.qk_layernorm and card.attention_kind != "mla" else 0


def sp_layer_params(card: MoEModelConfig, layer: int, sequence_parallel: bool = True) -> int:
    """Parameters of transformer layer ``layer`` whose gradients are all-reduced over TP (:data:`SP_GRAD_SOURCE`):
    with sequence parallelism those tagged ``sequence_parallel`` (both norms, MLA's down projections and latent
    norms, the router (MoE layers) and the row-parallel biases) and the q/k norms (:func:`qk_norm_params`);
    without, the q/k norms only."""
    if not sequence_parallel:
        return qk_norm_params(card)
    h = card.hidden_size
    n = 2 * h  # input_layernorm, pre_mlp_layernorm
    if card.attention_kind == "mla":
        kv = (card.kv_lora_rank or 0) + (card.qk_rope_head_dim or 0)
        n += h * kv + (card.kv_lora_rank or 0)  # linear_kv_down_proj, kv_layernorm
        if card.q_lora_rank:
            n += h * card.q_lora_rank + card.q_lora_rank  # linear_q_down_proj, q_layernorm
    moe = not card.is_dense and layer >= card.dense_layers
    if moe:
        n += card.num_experts * h  # router weight
    if card.linear_bias:
        n += h * (1 if moe else 2)  # attention output bias (and a dense FFN's fc2 bias)
    return n + qk_norm_params(card)


def sp_grad_params(card: MoEModelConfig, layers: list[int], sequence_parallel: bool = True) -> int:
    """Parameters whose gradients are all-reduced over TP (:func:`sp_layer_params`) of the (pseudo-)layers
    ``layers`` of one rank's model chunks (-1 embedding: none; ``num_layers`` the head: the final norm, with
    sequence parallelism; an MTP depth: its enorm, hnorm and final norm, with sequence parallelism, and its
    transformer layer)."""
    sp_norms = card.hidden_size if sequence_parallel else 0
    n = 0
    for ly in layers:
        if ly == card.num_layers:
            n += sp_norms
        elif mtp_depth(card, ly) is not None:
            n += 3 * sp_norms + sp_layer_params(card, mtp_body_layer(card), sequence_parallel)
        elif 0 <= ly < card.num_layers:
            n += sp_layer_params(card, ly, sequence_parallel)
    return n


def _sp_grad_all_reduce(rb: _RankBuilder, rm: RankMap, card: MoEModelConfig, tp_group: list[int], launch: float,
                        layers: list[int]) -> None:
    """With tp > 1: one all-reduce over TP of the gradients of the rank's non-tensor-parallel parameters
    (:func:`sp_grad_params` x the gradient element size; without sequence parallelism only the q/k norms')
    after the DP reduction, before the optimizer (:data:`SP_GRAD_SOURCE`); none when there are none."""
    if rm.tp < 2:
        return
    nbytes = sp_grad_params(card, layers, rm.sequence_parallel) * rb.grad_bytes
    if nbytes <= 0:
        return
    name = "grad.tp_sp_all_reduce" if rm.sequence_parallel else "grad.tp_qk_norm_all_reduce"
    c = rb.collective("all_reduce", tp_group, nbytes)
    o = Op(name, "collective", 0.0, nbytes, comm=Comm("tp", "all_reduce", nbytes), stream="dp")
    j = rb.op(o, 0.0, _STREAMS["dp"], launch, coll=c, waits=[rb.last_main, *rb.grad_ops])
    rb.grad_ops.append(j)


def _mtp_flops_per_token(card: MoEModelConfig, seq: int) -> float:
    """Forward FLOPs per token of the MTP depths: per depth its layer (of the last layer's kind), its three norms'
    and the 2h x h projection's, and one more LM head (as Megatron-Core's ``num_floating_point_operations``)."""
    if not card.mtp_layers:
        return 0.0
    from cosim.workload.synth.costs import layer_forward_flops

    h = card.hidden_size
    layer = layer_forward_flops(card, mtp_body_layer(card), seq, seq) / seq
    return card.mtp_layers * (layer + 2.0 * 2 * h * h + 2.0 * card.vocab_size * h)
