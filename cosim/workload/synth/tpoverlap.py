"""Tensor-parallel communication overlap (Transformer Engine userbuffers, Megatron ``tp_comm_overlap``).

With sequence parallelism every column-parallel linear (``qkv``, ``fc1``) all-gathers its input and every
row-parallel one (``o_proj``, ``fc2``) reduce-scatters its output. With ``tp_comm_overlap`` Transformer Engine
splits each such collective and the GEMM next to it so that they run concurrently (TE
``transformer_engine/pytorch/module/base.py``: ``initialize_ub`` creates one userbuffers communicator per GEMM;
its default methods: ``ring_exchange`` for ``qkv_fprop``, ``fc1_fprop``, ``proj_dgrad``, ``fc2_dgrad``;
``pipeline`` for ``proj_fprop``, ``fc2_fprop``; ``bulk`` for ``qkv_dgrad``, ``qkv_wgrad``, ``fc1_dgrad``,
``fc1_wgrad``; a run's ``tp_comm_overlap_cfg`` overrides them per GEMM, :data:`UB_CFG_SOURCE`).

This module rewrites one layer's op list (forward or backward, :func:`overlap_ops`); the builder then emits
the pieces with its usual stream rules plus one hook: a compute op whose ``waits`` names collectives waits
only for those (``build._RankBuilder.emit``). Three shapes:

- **ring-exchange all-gather + GEMM** (``qkv``/``fc1`` forward, ``o_proj``/``fc2`` data gradient): the GEMM
  runs in ``tp`` row chunks; chunk 0 is the rank's own shard (no wait), chunk ``i`` waits for ring step ``i``
  (a send/recv of one shard, ``tp - 1`` steps, modelled as a collective of the group carrying ``1/(tp-1)``
  of the all-gather's bytes, so the steps together load NVLink as the all-gather did). Nothing is exposed
  while a step is shorter than a GEMM chunk; a step waits for the previous GEMM chunk (the lock-step loop).
- **ring-exchange / pipelined GEMM + reduce-scatter** (``o_proj``/``fc2`` forward): the GEMM runs in ``n``
  chunks (``tp`` for ring-exchange, ``num_splits`` for pipeline); after chunk ``i`` its partial result goes
  out (``tp - 1`` ring steps, or ``n`` reduce-scatters of ``1/n`` of the bytes) while chunk ``i + 1`` runs;
  ring-exchange: the last step runs under the last chunk (its excess exposed); pipeline: the last chunk's
  reduce-scatter stays exposed.
- **bulk** (``qkv``/``fc1`` weight gradient): the reduce-scatter of the data gradient runs during the
  weight-gradient GEMM (which does not need it).

The pieces of one GEMM call are launched by one framework call (the first piece a full dispatch, the rest from
Transformer Engine's C++ loop, ``Op.launches = 0``: the builder charges the bare launch, ``loop_launch``).
Each GEMM chunk is timed by the kernel model at its own shape (``m / n`` rows: the per-chunk inefficiency),
and a GEMM overlapped with a communication kernel that holds ``num_sm`` SMs (bulk, pipeline, or
``set_sm_margin``) runs at ``(SMs - num_sm) / SMs`` of its speed (its work scaled by the inverse).
Ring-exchange steps run on copy engines (TE ``CommOverlapP2P``, ``use_ce``) and hold no SM unless
``set_sm_margin``.

Not modelled: Transformer Engine re-gathers a sequence-parallel linear's saved input for its weight gradient
(overlapped with the data gradient, ``qkv_dgrad``/``fc1_dgrad`` bulk); cosim keeps the gathered input and has
no such collective with or without overlap.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from cosim.workload.synth.costs import Comm, Op, Precision

UB_CFG_SOURCE = ("NVIDIA-NeMo/Megatron-Bridge v0.3.0: src/megatron/bridge/training/comm_overlap.py "
                 "(userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192, userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192: "
                 "RingExchangeOverlapCfg num_sm 1 default, BulkOverlapCfg, PipelineOverlapCfg), "
                 "scripts/performance/configs/llama/llama3_llm_pretrain.py (llama3_70b_pretrain_config_h100 sets "
                 "tp_comm_overlap_cfg to them); NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py "
                 "(initialize_ub: methods = ring_exchange [qkv_fprop, fc1_fprop, proj_dgrad, fc2_dgrad], pipeline "
                 "[proj_fprop, fc2_fprop], bulk [qkv_dgrad, qkv_wgrad, fc1_dgrad, fc1_wgrad]; get_default_config: "
                 "ring_exchange num_sm 1, no SM margin, num_splits tp_size, use_ce True (tex.CommOverlapP2P); "
                 "others num_sm 16, SM margin, num_splits 4 (tex.CommOverlap))")
"""Where the per-GEMM methods and SM counts below come from."""

NONE = ("-",)
"""``Op.waits`` of a GEMM chunk that waits for no pending collective (a name no op has)."""


@dataclass(frozen=True)
class UbMethod:
    """One GEMM's userbuffers overlap (Megatron-Bridge ``TPOverlapCfg``)."""

    method: str
    """ring_exchange, pipeline or bulk."""
    num_sm: int = 1
    """SMs of the communication kernel."""
    set_sm_margin: bool = False
    """The GEMM leaves ``num_sm`` SMs to the communication (ring-exchange / pipeline)."""
    num_splits: int = 4
    """Pipeline: chunks of the GEMM."""


_RING = UbMethod("ring_exchange")
UB_CFG_FP8: dict[str, UbMethod] = {
    "qkv_fprop": _RING, "fc1_fprop": _RING, "proj_dgrad": _RING, "fc2_dgrad": _RING,
    "proj_fprop": UbMethod("ring_exchange", 1, True), "fc2_fprop": UbMethod("ring_exchange", 1, True),
    "qkv_wgrad": UbMethod("bulk", 24), "fc1_wgrad": UbMethod("bulk", 4),
}
"""Megatron-Bridge ``userbuffers_fp8_h100_h8192_tp4_mbs1_seqlen8192`` (:data:`UB_CFG_SOURCE`; the ``*_dgrad``
bulk entries overlap the input re-gather cosim does not model)."""
UB_CFG_BF16: dict[str, UbMethod] = {
    **UB_CFG_FP8, "proj_fprop": UbMethod("pipeline", 24, True, 4), "fc2_fprop": UbMethod("pipeline", 16, True, 4),
}
"""Megatron-Bridge ``userbuffers_bf16_h100_h8192_tp4_mbs1_seqlen8192``."""

_COL = {"qkv": "qkv", "fc1": "fc1"}
_ROW = {"o_proj": "proj", "fc2": "fc2"}


def _linear(name: str) -> str:
    """``attn.qkv`` -> qkv, ``mlp.fc2.dgrad`` -> fc2 ... ('' when not a TP linear)."""
    parts = name.split(".")
    for p in parts[1:]:
        if p in _COL:
            return _COL[p]
        if p in _ROW:
            return _ROW[p]
    return ""


def _chunk(g: Op, n: int, i: int, p: Precision, num_sm: int, sms: int, waits: tuple[str, ...]) -> Op:
    """Row chunk ``i`` of ``n`` of GEMM ``g``, slowed by ``num_sm`` SMs held by communication."""
    m = g.m / n
    slow = sms / (sms - num_sm) if 0 < num_sm < sms else 1.0
    nbytes = ((m * g.k + g.k * g.n) * p.gemm_in_bytes + m * g.n * p.act_bytes) * g.batch
    return replace(g, name=f"{g.name}.ub{i}", m=m, flops=g.flops / n * slow, bytes=nbytes * slow,
                   saved=g.saved / n, waits=waits)


def _steps(c: Op, n: int) -> list[Op]:
    """``n`` pieces of collective ``c`` carrying its bytes together."""
    assert c.comm is not None
    b = c.comm.nbytes / n
    return [replace(c, name=f"{c.name}.ub{k}", bytes=b, comm=Comm(c.comm.group, c.comm.kind, b))
            for k in range(1, n + 1)]


def _ring_ag(c: Op, g: Op, tp: int, p: Precision, u: UbMethod, sms: int) -> list[Op]:
    """All-gather ``c`` then GEMM ``g`` as a ring exchange: ``tp`` GEMM chunks, the first on the rank's own
    shard (waits for nothing), chunk ``i`` after ring step ``i - 1`` (``tp - 1`` steps carry ``c``'s bytes);
    the chunks run on ``sms`` less the method's SM margin."""
    steps = _steps(c, tp - 1)
    ns = u.num_sm if u.set_sm_margin else 0
    out = [steps[0], _chunk(g, tp, 0, p, ns, sms, NONE)]
    for i in range(1, tp):
        if i < tp - 1:
            out.append(steps[i])
        out.append(_chunk(g, tp, i, p, ns, sms, (steps[i - 1].name,)))
    return out


def _gemm_rs(g: Op, c: Op, tp: int, p: Precision, u: UbMethod, sms: int) -> list[Op]:
    """GEMM ``g`` then reduce-scatter ``c``: ring exchange (``tp`` chunks, ``tp - 1`` steps) or pipelined
    (``num_splits`` chunks, one reduce-scatter piece each); each piece runs under the next chunk (pipelined:
    the piece of the last chunk stays exposed); the chunks run on ``sms`` less the SMs the method's communication kernels hold."""
    n = tp if u.method == "ring_exchange" else max(u.num_splits, 1)
    steps = _steps(c, tp - 1 if u.method == "ring_exchange" else n)
    ns = u.num_sm if (u.set_sm_margin or u.method != "ring_exchange") else 0
    out: list[Op] = []
    for i in range(n):
        out.append(_chunk(g, n, i, p, ns, sms, () if i == 0 else NONE))
        if i < len(steps):
            out.append(steps[i])
    return out + steps[n:]


def _one_call(pieces: list[Op]) -> list[Op]:
    """The pieces of one userbuffers GEMM call: the first launched by the framework (a full dispatch), the
    others from Transformer Engine's C++ loop (``launches=0``: the builder charges them the bare CUDA launch)."""
    return pieces[:1] + [replace(o, launches=0) for o in pieces[1:]]


def _is_tp(o: Op, kind: str) -> bool:
    """``o`` is a collective of kind ``kind`` over the TP group."""
    return o.cls == "collective" and o.comm is not None and o.comm.group == "tp" and o.comm.kind == kind


def overlap_ops(ops: list[Op], tp: int, p: Precision, sms: int, cfg: dict[str, UbMethod] | None = None) -> list[Op]:
    """One layer's op list (forward or backward order) with its TP collectives overlapped with their GEMMs
    (module docs); unchanged when ``tp < 2`` or no pattern matches."""
    if tp < 2:
        return ops
    cfg = cfg if cfg is not None else (UB_CFG_BF16 if p.gemm == "bf16" else UB_CFG_FP8)
    out: list[Op] = []
    i = 0
    while i < len(ops):
        o = ops[i]
        # all-gather (forward SP gather, or the backward of a reduce-scatter) ... GEMM: ring-exchange
        if _is_tp(o, "all_gather"):
            j = i + 1
            while j < len(ops) and ops[j].cls not in ("gemm", "collective") and not ops[j].name.endswith(".core"):
                j += 1
            if j < len(ops) and ops[j].cls == "gemm":
                g = ops[j]
                lin = _linear(g.name)
                key = f"{lin}_dgrad" if g.name.endswith(".dgrad") else f"{lin}_fprop"
                u = cfg.get(key)
                if lin and u is not None and not g.name.endswith(".wgrad") and u.method == "ring_exchange":
                    out += ops[i + 1:j] + _one_call(_ring_ag(o, g, tp, p, u, sms))
                    i = j + 1
                    continue
        # GEMM followed by its reduce-scatter (forward row-parallel): ring-exchange or pipeline
        if o.cls == "gemm" and i + 1 < len(ops) and _is_tp(ops[i + 1], "reduce_scatter") and not o.bwd:
            u = cfg.get(f"{_linear(o.name)}_fprop")
            if _linear(o.name) in ("proj", "fc2") and u is not None and u.method in ("ring_exchange", "pipeline"):
                out += _one_call(_gemm_rs(o, ops[i + 1], tp, p, u, sms))
                i += 2
                continue
        # data gradient, weight gradient, ..., reduce-scatter of the data gradient: bulk with the weight gradient
        if o.cls == "gemm" and o.name.endswith(".dgrad") and i + 1 < len(ops) and ops[i + 1].name.endswith(".wgrad"):
            lin = _linear(o.name)
            u = cfg.get(f"{lin}_wgrad")
            j = i + 2
            while j < len(ops) and ops[j].cls not in ("gemm", "collective", "attention"):
                j += 1
            if lin in ("qkv", "fc1") and u is not None and j < len(ops) and _is_tp(ops[j], "reduce_scatter"):
                w = ops[i + 1]
                slow = sms / (sms - u.num_sm) if 0 < u.num_sm < sms else 1.0
                out += [o, *ops[i + 2:j], ops[j], replace(w, flops=w.flops * slow, bytes=w.bytes * slow, waits=NONE)]
                i = j + 1
                continue
        out.append(o)
        i += 1
    return out
