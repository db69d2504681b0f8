"""Parallel layouts (tp, pp, vpp, ep, etp, cp, dp) and the rank map they define.

Rank order follows Megatron-Core (``RankGenerator``, order ``tp-cp-ep-dp-pp``):
``rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))``. Within one pipeline stage the
``tp * cp * dp`` ranks are re-cut for the experts as ``etp * ep * edp`` (expert tensor
parallel fastest, then expert parallel, then expert data parallel), so an EP group is
``ep`` consecutive blocks of ``etp`` ranks.

Pipeline stages: stage ``s`` holds the model chunks ``v * pp + s`` for ``v < vpp``
(interleaved 1F1B), chunk ``c`` holds layers ``[sum(pipeline_layers[:c]), ...)``.
Without ``pipeline_layers`` the layers split evenly (the count must divide). A Megatron-Core
``pipeline_model_parallel_layout`` string (:func:`parse_pipeline_layout`) gives the layers per chunk and the
chunk of the MTP layers instead.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from cosim.capture.config import MoEModelConfig
from cosim.catalog.models import Strict
from cosim.errors import CosimInputError

__all__ = ["LAYOUT_SOURCE", "ParallelLayout", "RankMap", "parse_pipeline_layout"]

LAYOUT_SOURCE = (
    "Megatron-Core core_v0.16.0 megatron/core/transformer/pipeline_parallel_layer_layout.py "
    "(PipelineParallelLayerLayout.parse_str_to_list, validate_layer_layout): commas and spaces dropped, '(...)*N' and "
    "'X*N' unrolled, '|' separates the pp x vpp virtual stages in order vp_stage * pp + pp_rank; symbols E "
    "(embedding), t (transformer decoder layer), m (MTP layer), L (loss: final norm, output layer, loss); E first in "
    "the first stage, L last in the last stage, as many t as decoder layers and m as MTP layers")
"""Where the pipeline layout string's semantics come from."""

_LAYOUT_SYMBOLS = "EtmL"


def parse_pipeline_layout(text: str, chunks: int, num_layers: int, mtp_layers: int,
                          where: str = "layout.pipeline_model_parallel_layout") -> tuple[list[int], int | None]:
    """Decoder layers per model chunk and the chunk holding the MTP layers (None without ``m``) of a Megatron-Core
    ``pipeline_model_parallel_layout`` string such as ``"Et*3|(tt|)*29m|L"`` (:data:`LAYOUT_SOURCE`) over ``chunks``
    = pp x vpp model chunks; a malformed or inconsistent string is a one-line error naming ``where``."""
    s = text.replace(",", "").replace(" ", "")
    # a valid layout unrolls to one symbol per layer plus E, L and the '|' between chunks: a longer unrolling is
    # refused before it is built (a repeat such as t*99999999999 would otherwise exhaust memory)
    limit = len(text) + num_layers + mtp_layers + chunks + 1

    def unroll(g: re.Match[str]) -> str:
        if len(g.group(1)) * int(g.group(2)) > limit:
            raise CosimInputError(f"{where}: {text!r}: the repeat {g.group(0)!r} unrolls past the {num_layers} decoder "
                                  f"layers, {mtp_layers} MTP layers and {chunks} stages of the run")
        return g.group(1) * int(g.group(2))

    group = re.compile(r"\(([^()]*)\)\*(\d+)")
    while group.search(s):
        s = group.sub(unroll, s)
        if len(s) > limit:
            raise CosimInputError(f"{where}: {text!r} unrolls past the {num_layers} decoder layers, {mtp_layers} MTP "
                                  f"layers and {chunks} stages of the run")
    s = re.sub(r"([^|()*\d])\*(\d+)", unroll, s)
    bad = sorted(set(s) - set(_LAYOUT_SYMBOLS + "|"))
    if bad:
        raise CosimInputError(f"{where}: {text!r}: unexpected {''.join(bad)!r} (symbols E t m L, '|' between stages, "
                              "'(...)*N' or 'X*N' repeats)")
    stages = s.split("|")
    if len(stages) != chunks:
        raise CosimInputError(f"{where}: {text!r} has {len(stages)} stages, needs pp*vpp = {chunks}")
    flat = "".join(stages)
    if flat.count("E") != 1 or not stages[0].startswith("E"):
        raise CosimInputError(f"{where}: {text!r}: E (embedding) must appear once, first in the first stage")
    if flat.count("L") != 1 or not stages[-1].endswith("L"):
        raise CosimInputError(f"{where}: {text!r}: L (loss) must appear once, last in the last stage")
    if flat.count("t") != num_layers:
        raise CosimInputError(f"{where}: {text!r} has {flat.count('t')} decoder layers (t), the model {num_layers}")
    if flat.count("m") != mtp_layers:
        raise CosimInputError(f"{where}: {text!r} has {flat.count('m')} MTP layers (m), the run {mtp_layers}")
    mtp = [c for c, st in enumerate(stages) if "m" in st]
    if len(mtp) > 1:
        raise CosimInputError(f"{where}: {text!r}: the MTP layers (m) must sit in one stage (they are in {mtp})")
    if mtp and flat.rfind("t") > flat.find("m"):
        raise CosimInputError(f"{where}: {text!r}: an MTP layer (m) before a decoder layer (t); MTP follows the decoder")
    return [st.count("t") for st in stages], (mtp[0] if mtp else None)


RecomputeModule = Literal["core_attn", "mla_up_proj", "layernorm", "mlp", "moe_act", "shared_experts", "moe"]
"""A module Megatron-Core's selective recomputation can re-run (``recompute_modules``)."""


class ParallelLayout(Strict):
    """How the model is cut over the GPUs (names as practitioners use them)."""

    tp: int = Field(default=1, gt=0)
    """Tensor-parallel degree (attention heads and dense FFN columns split over tp GPUs)."""
    pp: int = Field(default=1, gt=0)
    """Pipeline-parallel stages."""
    vpp: int = Field(default=1, gt=0)
    """Virtual stages (model chunks) per pipeline stage: interleaved 1F1B when > 1."""
    ep: int = Field(default=1, gt=0)
    """Expert-parallel degree: routed experts split over ep GPUs of a stage."""
    etp: int = Field(default=1, gt=0)
    """Expert tensor parallelism: each expert's FFN split over etp GPUs."""
    cp: int = Field(default=1, gt=0)
    """Context parallelism: each sequence split over cp GPUs (keys/values all-gathered)."""
    dp: int | None = Field(default=None, gt=0)
    """Data-parallel replicas; derived as GPUs / (tp * cp * pp) when absent."""
    sequence_parallel: bool | None = None
    """Megatron sequence parallelism (norms and residuals on seq / tp tokens, all-gather /
    reduce-scatter instead of all-reduce); default: on when tp > 1."""
    zero: Literal[0, 1, "fsdp"] = 1
    """0: replicated optimizer, gradient all-reduce; 1: distributed optimizer (ZeRO-1:
    gradient reduce-scatter, parameter all-gather, optimizer state sharded over DP);
    fsdp: parameters and gradients sharded too (per-layer all-gather before forward and
    backward, reduce-scatter of gradients after backward)."""
    fsdp_reshard_after_forward: bool = True
    """``zero: fsdp``: free each layer's gathered parameters after its forward, so its backward gathers them again
    (PyTorch FSDP2 ``fully_shard(reshard_after_forward=True)``, its default, and Megatron-FSDP); false: they stay
    gathered until the backward, which gathers nothing (NeMo AutoModel's MoE ``parallelize_model`` default;
    :data:`cosim.workload.synth.build.FSDP_RESHARD_SOURCE`)."""
    fsdp_reshard_after_backward: bool = True
    """``zero: fsdp``: free them after each backward too (FSDP2's default); false: they stay gathered after each
    backward, so the next micro-batch's forward gathers nothing (with ``fsdp_reshard_after_forward`` false too, each
    layer is gathered once per step; with it true, each backward still gathers again) (AutoModel's
    ``enable_fsdp_optimizations`` under gradient accumulation: ``set_reshard_after_backward(False)`` for every
    backward but the last)."""
    schedule: Literal["1f1b", "interleaved", "dualpipe"] = "1f1b"
    """Pipeline schedule: 1f1b; interleaved (implied by vpp > 1); dualpipe (DeepSeek-V3's bidirectional
    schedule: vpp 1, even pp, each rank holds two stages)."""
    pipeline_layers: list[int] | None = None
    """Layers per model chunk, ``pp * vpp`` entries in chunk order (chunk ``v * pp + s`` is
    virtual stage ``v`` of stage ``s``); for uneven splits such as DeepSeek-V3's 61 layers."""
    pipeline_model_parallel_layout: str | None = None
    """Megatron-Core's ``pipeline_model_parallel_layout`` (Megatron-Bridge ``pp_layout``), e.g. ``"Et*3|(tt|)*29m|L"``:
    ``pp * vpp`` virtual stages separated by ``|`` (chunk ``v * pp + s`` is virtual stage ``v`` of stage ``s``), ``E``
    embedding, ``t`` a decoder layer, ``m`` an MTP layer, ``L`` the loss, ``(...)*N`` / ``X*N`` repeats
    (:func:`parse_pipeline_layout`): the layers per chunk and the chunk of the MTP layers (their logits and loss run
    with ``L``). Excludes ``pipeline_layers``; not with dualpipe."""
    recompute: Literal["none", "full", "selective"] = "none"
    """Activation recomputation: full re-runs each layer's forward before its backward; selective re-runs
    only the ``recompute_modules`` of each layer (Megatron-Core ``recompute_granularity: selective``)."""
    recompute_early_stop: bool = False
    """With ``recompute: full``: PyTorch's non-reentrant ``torch.utils.checkpoint`` (FSDP2's
    ``checkpoint_wrapper``: NeMo AutoModel, torchtitan) instead of Megatron-Core's reentrant checkpoint: the
    recomputation stops after the layer's last op that saves a tensor, so the trailing ops (the DeepEP combine,
    the residual add) are not re-run (:func:`cosim.workload.synth.costs.early_stop_end`)."""
    recompute_modules: list[RecomputeModule] = Field(default_factory=lambda: list[RecomputeModule](["core_attn"]))
    """With ``recompute: selective``: the modules re-run before their backward, as Megatron-Core names them
    (its default ``core_attn``; :data:`cosim.workload.synth.costs.RECOMPUTE_MODULES` lists the ops of each)."""
    grad_bucket_params: float | None = Field(default=None, gt=0)
    """Parameters per gradient-reduction bucket (Megatron-Core ``DistributedDataParallelConfig.bucket_size``). None:
    Megatron-Core's default ``max(40M, 1M x dp x cp)`` (core_v0.16.0 distributed_data_parallel.py: "larger DP sizes
    need larger buckets"; :func:`cosim.workload.synth.build.ddp_bucket_params`); Megatron-Bridge and NeMo 2.0 set
    128 Mi (134217728) when dp > 1."""
    overlap_grad_reduce: bool = True
    """Megatron-Core ``DistributedDataParallelConfig.overlap_grad_reduce`` (core_v0.16.0
    megatron/core/distributed/distributed_data_parallel.py, param_and_grad_buffer.py): true: each gradient bucket of
    ``grad_bucket_params`` is reduce-scattered (all-reduced with ``zero: 0``) on the dp stream as the last
    micro-batch's backward fills it, while the backward goes on (buckets of that size only on the first pipeline
    stage's first model chunk: Megatron-Core sets the size to None on the others); false: Megatron sets the bucket
    size to None (one bucket per model chunk and buffer, dense and expert) and ``finalize_model_grads`` reduces them all after the last
    backward, the optimizer waiting for them. Megatron-Core's default is false; the default here is true, as
    Megatron-Bridge's ``CommOverlapConfig`` sets it with data parallelism and every bundled configuration uses it.
    FSDP keeps its own per-layer reduce-scatters."""
    overlap_param_gather: bool | None = None
    """Megatron-Core ``DistributedDataParallelConfig.overlap_param_gather`` (core_v0.16.0
    megatron/core/optimizer/distrib_optimizer.py, distributed/distributed_data_parallel.py): with ``zero: 1``, true:
    the updated parameters' all-gathers are dispatched bucket by bucket and each module's forward pre-hook waits for
    its own bucket, so in steady state they run under the next step's forward (synthesized within one step: issued at
    its start on the dp stream in the order the forward uses the buckets, the first forward use of each bucket's
    layers waiting for its gather); false: the optimizer all-gathers every bucket after Adam, exposed at the step's
    end. Needs ``zero: 1``: ``zero: 0`` has no gather, ``fsdp`` its own per-layer gathers. Megatron-Core's default is
    false; default here: true with ``zero: 1`` (Megatron-Bridge's ``CommOverlapConfig`` sets it with data
    parallelism, and the bundled configurations). Megatron-LM's own launcher (arguments.py) accepts it only with
    ``overlap_grad_reduce``; Megatron-Core and Megatron-Bridge take it alone (one bucket per chunk and buffer then)."""
    cuda_graphs: bool = False
    """Launch each layer's forward (and backward) kernels as one CUDA graph: one host launch per
    layer and unit instead of one per kernel (eager)."""
    a2a_overlap: bool = False
    """Megatron-Core's EP all-to-all overlap (``--overlap-moe-expert-parallel-comm``, Megatron-Bridge
    ``moe_a2a_overlap``): each steady-state forward runs together with a backward of another micro-batch,
    layer by layer in Megatron's combined-1F1B order on one compute and one communication stream, so one's
    all-to-all runs under the other's compute. Needs ep > 1, vpp > 1 when pp > 1, and no full recomputation (as Megatron)."""
    delay_wgrad: bool = True
    """Under ``a2a_overlap``: Megatron-Core's ``delay_wgrad_compute`` (weight-gradient GEMMs run apart from the
    data gradients, filling the compute stream while the backward all-to-alls run). Megatron-Bridge's
    performance configs set it together with ``moe_a2a_overlap``."""

    def resolve(self, card: MoEModelConfig, gpus: int, where: str = "layout") -> RankMap:
        """Check this layout against ``card`` on ``gpus`` GPUs; one-line errors name the field."""
        return RankMap(self, card, gpus, where)


def _chunk_layer_counts(lay: ParallelLayout, card: MoEModelConfig, where: str) -> tuple[list[int], int | None]:
    """Decoder layers per model chunk (``pp * vpp`` chunks) and the chunk holding the MTP layers (None: not placed
    by the layout, the last) from ``pipeline_model_parallel_layout``, ``pipeline_layers`` or an even split."""
    pp, vpp = lay.pp, lay.vpp
    chunks = pp * vpp
    if lay.pipeline_model_parallel_layout is not None:
        field = "pipeline_model_parallel_layout"
        if lay.pipeline_layers is not None or lay.schedule == "dualpipe":
            raise CosimInputError(f"{where}.{field}: excludes pipeline_layers and schedule dualpipe")
        counts, mc = parse_pipeline_layout(lay.pipeline_model_parallel_layout, chunks, card.num_layers,
                                           card.mtp_layers, f"{where}.{field}")
        if mc is not None and pp > 1 and mc % pp == 0:
            raise CosimInputError(f"{where}.{field}: the MTP layers (m) on a chunk of the first stage (chunk {mc}) "
                                  "are not modelled")
        if mc is not None and mc < (vpp - 1) * pp:  # Megatron-Core validate_layer_layout
            raise CosimInputError(f"{where}.{field}: the MTP layers (m) on chunk {mc}, virtual stage {mc // pp} of "
                                  f"{vpp}: Megatron-Core puts them in a rank's last virtual stage")
        return counts, mc
    if lay.pipeline_layers is not None:
        pl = lay.pipeline_layers
        if len(pl) != chunks:
            raise CosimInputError(f"{where}.pipeline_layers: has {len(pl)} entries, needs pp*vpp = {chunks}")
        if any(x < 0 for x in pl) or sum(pl) != card.num_layers:
            raise CosimInputError(f"{where}.pipeline_layers: entries must be >= 0 and sum to {card.num_layers} "
                                  f"layers of {card.name} (they sum to {sum(pl)})")
        return list(pl), None
    if card.num_layers % chunks:
        raise CosimInputError(f"{where}.pp: {card.num_layers} layers of {card.name} are not divisible by pp*vpp = "
                              f"{chunks}; give pipeline_layers (layers per model chunk) for an uneven split")
    return [card.num_layers // chunks] * chunks, None


class RankMap:
    """A resolved layout: degrees, pipeline chunks, and every rank's coordinates and groups."""

    def __init__(self, lay: ParallelLayout, card: MoEModelConfig, gpus: int, where: str = "layout") -> None:
        def bad(field: str, msg: str) -> CosimInputError:
            return CosimInputError(f"{where}.{field}: {msg}")

        self.layout = lay
        self.card = card
        tp, pp, cp, vpp = lay.tp, lay.pp, lay.cp, lay.vpp
        base = tp * cp * pp
        if gpus % base:
            raise bad("tp", f"tp*cp*pp = {tp}*{cp}*{pp} = {base} does not divide the {gpus} GPUs")
        dp = gpus // base
        if lay.dp is not None and lay.dp != dp:
            raise bad("dp", f"dp {lay.dp} * tp {tp} * cp {cp} * pp {pp} = {lay.dp * base} != {gpus} GPUs")
        self.tp, self.pp, self.cp, self.vpp, self.dp = tp, pp, cp, vpp, dp
        self.ep, self.etp = lay.ep, lay.etp
        self.world = gpus
        if card.num_heads % tp:
            raise bad("tp", f"{card.num_heads} attention heads of {card.name} are not divisible by tp {tp}")
        if card.attention_kind != "mla" and card.num_kv_heads % tp and tp % card.num_kv_heads:
            raise bad("tp", f"{card.num_kv_heads} KV heads of {card.name} neither divide nor are divisible by tp {tp}")
        if card.is_dense:
            if lay.ep != 1 or lay.etp != 1:
                raise bad("ep", f"{card.name} is dense (no experts): ep and etp must be 1")
        else:
            if card.num_experts % lay.ep:
                raise bad("ep", f"{card.num_experts} experts of {card.name} are not divisible by ep {lay.ep}")
            if (tp * cp * dp) % (lay.ep * lay.etp):
                raise bad("ep", f"ep*etp = {lay.ep * lay.etp} does not divide tp*cp*dp = {tp * cp * dp} "
                                "(the GPUs of one pipeline stage)")
            if (card.expert_ffn_size or 0) % lay.etp:
                raise bad("etp", f"expert FFN width {card.expert_ffn_size} is not divisible by etp {lay.etp}")
        self.edp = (tp * cp * dp) // (lay.ep * lay.etp)
        if lay.schedule == "interleaved" and vpp == 1:
            raise bad("vpp", "schedule interleaved needs vpp > 1")
        if lay.a2a_overlap and (lay.ep < 2 or (pp > 1 and vpp < 2) or lay.recompute == "full"
                                or lay.schedule == "dualpipe"):
            raise bad("a2a_overlap", "needs ep > 1, vpp > 1 when pp > 1, no full recomputation and a 1f1b or "
                                     "interleaved schedule (Megatron-Core's EP all-to-all overlap)")
        if lay.recompute_early_stop and lay.recompute != "full":
            raise bad("recompute_early_stop", f"needs recompute: full (got {lay.recompute})")
        if lay.overlap_param_gather and lay.zero != 1:
            raise bad("overlap_param_gather", f"needs zero 1 (the distributed optimizer's parameter all-gather); "
                                              f"zero is {lay.zero!r}")
        self.overlap_param_gather = (lay.overlap_param_gather if lay.overlap_param_gather is not None
                                     else lay.zero == 1)
        """Resolved ``overlap_param_gather``."""
        if lay.schedule == "dualpipe" and (vpp != 1 or pp % 2):
            raise bad("schedule", f"dualpipe needs vpp 1 and an even pp (got pp {pp}, vpp {vpp})")
        self.schedule = "dualpipe" if lay.schedule == "dualpipe" else "interleaved" if vpp > 1 else "1f1b"
        self.sequence_parallel = lay.sequence_parallel if lay.sequence_parallel is not None else tp > 1
        chunks = pp * vpp
        self.last_chunk = chunks - 1
        """The last model chunk (``pp * vpp - 1``, on the last stage): the LM head and loss (the ``L``)."""
        counts, mc = _chunk_layer_counts(lay, card, where)
        self.mtp_chunk = self.last_chunk if mc is None else mc
        """Model chunk running the MTP layers (the ``m`` of ``pipeline_model_parallel_layout``; default the last)."""
        starts = [sum(counts[:c]) for c in range(chunks)]
        self.chunk_layers: list[list[int]] = [list(range(starts[c], starts[c] + counts[c])) for c in range(chunks)]

    # --------------------------------------------------------------- coordinates
    def rank(self, tp_i: int, cp_i: int, dp_i: int, pp_i: int) -> int:
        """Global rank of the coordinates."""
        return tp_i + self.tp * (cp_i + self.cp * (dp_i + self.dp * pp_i))

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp_i, cp_i, dp_i, pp_i) of ``rank``."""
        tp_i = rank % self.tp
        r = rank // self.tp
        cp_i = r % self.cp
        r //= self.cp
        return tp_i, cp_i, r % self.dp, r // self.dp

    def stage_chunks(self, stage: int) -> list[int]:
        """Model chunks of pipeline stage ``stage`` (virtual stage order; DualPipe: the chunk of direction 0,
        then that of direction 1)."""
        if self.schedule == "dualpipe":
            return [stage, self.pp - 1 - stage]
        return [v * self.pp + stage for v in range(self.vpp)]

    def chunk_stage(self, chunk: int, direction: int = 0) -> int:
        """Pipeline stage that holds model chunk ``chunk`` (DualPipe: of pipeline direction ``direction``;
        direction 1 runs the stages from rank pp - 1 down to rank 0)."""
        return self.pp - 1 - chunk if direction else chunk % self.pp

    # --------------------------------------------------------------- groups
    def group(self, kind: str, rank: int) -> list[int]:
        """Global ranks of ``rank``'s group ``kind``: tp, cp, dp (dense-gradient replicas: dp x cp),
        ep, etp, edp (expert-gradient replicas), pp."""
        tp_i, cp_i, dp_i, pp_i = self.coords(rank)
        stage0 = self.rank(0, 0, 0, pp_i)
        local = rank - stage0
        n_stage = self.tp * self.cp * self.dp
        if kind == "tp":
            return [self.rank(t, cp_i, dp_i, pp_i) for t in range(self.tp)]
        if kind == "cp":
            return [self.rank(tp_i, c, dp_i, pp_i) for c in range(self.cp)]
        if kind == "dp":
            return [self.rank(tp_i, c, d, pp_i) for d in range(self.dp) for c in range(self.cp)]
        if kind == "pp":
            return [self.rank(tp_i, cp_i, dp_i, s) for s in range(self.pp)]
        etp, ep = self.etp, self.ep
        e_i, rest = local % etp, local // etp
        ep_i, edp_i = rest % ep, rest // ep
        if kind == "etp":
            return [stage0 + t + etp * (ep_i + ep * edp_i) for t in range(etp)]
        if kind == "ep":
            return [stage0 + e_i + etp * (j + ep * edp_i) for j in range(ep)]
        if kind == "edp":
            return [stage0 + e_i + etp * (ep_i + ep * j) for j in range(n_stage // (etp * ep))]
        raise ValueError(f"unknown group kind {kind!r}")

    def ep_index(self, rank: int) -> int:
        """Position of ``rank`` in its EP group."""
        g = self.group("ep", rank)
        return g.index(rank)
