"""Pipeline schedules: the order in which one stage runs its forward and backward units.

A unit is ``(kind, microbatch, v)``: kind ``"F"`` or ``"B"``, ``v`` the virtual stage
(model chunk ``v * pp + stage``). Only the order is fixed here; when each unit runs,
and so the bubble, comes out of the simulation (units wait for their activations and
gradients from the neighbouring stages).

* 1F1B (PipeDream-Flush, Megatron ``forward_backward_pipelining_without_interleaving``):
  stage ``s`` runs ``min(pp - s - 1, m)`` warm-up forwards, then alternates one forward
  and one backward, then drains the remaining backwards.
* Interleaved 1F1B (Megatron ``forward_backward_pipelining_with_interleaving``): forward
  unit ``k`` is micro-batch ``(k // (pp * vpp)) * pp + k % pp`` of chunk
  ``(k // pp) % vpp``; backward units walk the chunks in reverse; warm-up
  ``(pp - s - 1) * 2 + (vpp - 1) * pp`` units. Needs ``m`` to be a multiple of ``pp``.
* DualPipe (:func:`dualpipe_order`): bidirectional, with zero-bubble weight-gradient units and
  overlapped forward-backward pairs.
* Gradient accumulation over repeated schedules (:func:`accumulated_order`): PyTorch
  ``torch.distributed.pipelining`` as NeMo AutoModel and torchtitan drive it runs ``schedule.step`` once per
  local batch, ``gradient_accumulation_steps`` times per optimizer step, each a whole 1F1B / interleaved
  schedule with its own fill and drain; gradients accumulate and only the last schedule's last backward
  reduces them over data parallelism (:data:`GA_SOURCE`).
"""

from __future__ import annotations

from typing import Any

from cosim.errors import CosimInputError

__all__ = ["GA_SOURCE", "OVERLAP_SYNC_SOURCE", "Unit", "accumulated_order", "dualpipe_order", "peak_in_flight",
           "stage_order", "steady_bounds"]

GA_SOURCE = (
    "NeMo AutoModel nemo_automodel/recipes/llm/train_ft.py _run_train_optim_step: one pipeline schedule.step per "
    "gradient-accumulation batch (local_batch_size sequences, local_batch_size / micro-batch size micro-batches), "
    "prepare_for_grad_accumulation before the first and prepare_for_final_backward before the last; "
    "nemo_automodel/components/moe/fsdp_mixin.py patched_backward_maybe_with_nosync (patches PyTorch's "
    "PipelineStage.backward_maybe_with_nosync): every backward runs with requires_gradient_sync False and "
    "reshard_after_backward False, and the FSDP post-backward (the gradient reduce-scatter) runs only on a "
    "schedule's last backward of the optimizer step (last_backward and get_is_optim_step()); the schedules run one "
    "after another (schedule.step returns after its last backward), so each has its own fill and drain")
"""Where gradient accumulation over repeated pipeline schedules and its single DP reduction come from."""

OVERLAP_SYNC_SOURCE = (
    "NVIDIA/Megatron-LM core_v0.16.0 (the same lines at core_v0.16.1; at core_v0.14.0, core_v0.15.0 and "
    "core_v0.17.0 the same issue order and waits, at other lines): "
    "megatron/core/models/common/model_chunk_schedule_plan.py:215-252 (TransformerLayerSchedulePlan.run issues the "
    "backward's combine backward, the forward's attn node, the backward's mlp node, then the forward's moe_dispatch "
    "node), models/gpt/fine_grained_callables.py:477-481 (the attn node runs MoELayer.preprocess: the "
    "dispatcher's dispatch_preprocess) and :516 (the moe_dispatch node runs MoELayer.dispatch: token_dispatch), "
    "pipeline_parallel/utils.py:119-126 and :210-213 (a node waits for its micro-batch's event, runs under its own "
    "stream, the dispatch and combine nodes on the one communication stream, and records the event after); "
    "transformer/moe/token_dispatcher.py:562-564, :663 and :897-899 (MoEAlltoAllTokenDispatcher: with EP the "
    "host's d2h_event.synchronize() is at before_ep_alltoall, in token_dispatch), :1167-1196 and :1430-1456 and "
    "fused_a2a.py:84-135 (the flex dispatcher with DeepEP: Buffer.dispatch with async_finish, previous_event an "
    "EventHandle recorded on the caller's stream, returns num_recv_tokens_per_expert_list, 'the CPU will wait "
    "for GPU's signal to arrive'); deepseek-ai/DeepEP v1.2.1 csrc/deep_ep.cpp Buffer::intranode_dispatch:396-399 "
    "(stream_wait(comm_stream, previous_event)), :433 (notify_dispatch on comm_stream) and :451-465 (the CPU "
    "spins on moe_recv_counter)")
"""Where the host's wait for the MoE token counts sits in Megatron-Core's combined 1F1B (``a2a_overlap``): in the
forward's dispatch call, after the paired backward's expert data-gradient work is launched, and (DeepEP) behind the
communication stream's earlier all-to-alls."""

Unit = tuple[str, int, int]


def _fwd_unit(k: int, pp: int, vpp: int) -> tuple[int, int]:
    """(micro-batch, virtual chunk) of a stage's ``k``-th forward under interleaved 1F1B: micro-batches go in
    groups of ``pp``, each group through every chunk in turn."""
    group, within = divmod(k, pp * vpp)
    return group * pp + within % pp, within // pp


def _bwd_unit(k: int, pp: int, vpp: int) -> tuple[int, int]:
    """(micro-batch, virtual chunk) of a stage's ``k``-th backward: as :func:`_fwd_unit`, the chunks in reverse."""
    mb, v = _fwd_unit(k, pp, vpp)
    return mb, vpp - 1 - v


def stage_order(stage: int, pp: int, vpp: int, microbatches: int, extra_warmup: int = 0) -> list[Unit]:
    """The units of pipeline stage ``stage`` in issue order; ``extra_warmup`` more warm-up forwards (Megatron
    adds one under its EP all-to-all overlap, so that each steady-state forward and backward are independent)."""
    m = microbatches
    if vpp == 1:
        warm = min(pp - stage - 1 + extra_warmup, m)
        out: list[Unit] = [("F", i, 0) for i in range(warm)]
        for i in range(m - warm):
            out += [("F", warm + i, 0), ("B", i, 0)]
        out += [("B", i, 0) for i in range(m - warm, m)]
        return out
    if m % pp:
        raise CosimInputError(f"interleaved 1F1B needs the micro-batches per pipeline ({m}) to be a multiple "
                              f"of pp ({pp})")
    total = m * vpp
    warm = min((pp - stage - 1) * 2 + (vpp - 1) * pp + extra_warmup, total)
    out = [("F", *_fwd_unit(k, pp, vpp)) for k in range(warm)]
    for k in range(total - warm):
        out.append(("F", *_fwd_unit(warm + k, pp, vpp)))
        out.append(("B", *_bwd_unit(k, pp, vpp)))
    out += [("B", *_bwd_unit(k, pp, vpp)) for k in range(total - warm, total)]
    return out


def accumulated_order(stage: int, pp: int, vpp: int, microbatches: int, steps: int = 1,
                      extra_warmup: int = 0) -> list[Unit]:
    """The units of stage ``stage`` over one optimizer step of ``microbatches`` micro-batches per pipeline run as
    ``steps`` whole schedules of ``microbatches // steps`` each (gradient accumulation over repeated schedules,
    :data:`GA_SOURCE`): schedule ``j`` is :func:`stage_order` with its micro-batches numbered from
    ``j * microbatches // steps``. ``steps`` 1 is :func:`stage_order`."""
    if microbatches % steps:
        raise CosimInputError(f"gradient_accumulation_steps {steps} does not divide the {microbatches} micro-batches "
                              "per pipeline")
    n = microbatches // steps
    one = stage_order(stage, pp, vpp, n, extra_warmup)
    return [(kind, j * n + mb, v) for j in range(steps) for kind, mb, v in one]


def steady_bounds(order: list[Unit]) -> tuple[int, int]:
    """Positions ``[lo, hi)`` of the steady 1F1B phase of a (1F1B or interleaved) ``order``: from the forward
    just before the first backward to the backward just after the last forward; ``(0, 0)`` when the order has
    no forward followed by a backward (all warm-up)."""
    kinds = [k for k, _, _ in order]
    if "B" not in kinds or "F" not in kinds:
        return 0, 0
    lo = kinds.index("B") - 1
    hi = len(kinds) - kinds[::-1].index("F") + 1
    if lo < 0 or hi > len(kinds) or kinds[lo] != "F":
        return 0, 0
    return lo, hi


def peak_in_flight(order: list[Unit]) -> int:
    """Most forward units whose backward has not run yet (activations held at once)."""
    live = peak = 0
    for kind, _, _ in order:
        live += 1 if kind == "F" else -1
        peak = max(peak, live)
    return peak


def dualpipe_order(rank: int, pp: int, microbatches: int) -> list[tuple[Any, ...]]:
    """DualPipe's actions on ``rank`` (DeepSeek-V3 report section 3.2.1; the step order of
    deepseek-ai/DualPipe ``dualpipe.py``, ``DualPipe.step``), with phases mapped to directions.

    Actions: ``("F", d)`` forward of the next micro-batch of direction ``d`` (0: enters at rank 0,
    1: enters at rank pp-1); ``("B", d, zb)`` its backward (``zb``: weight gradients deferred);
    ``("W",)`` the oldest deferred weight gradients; ``("FB", d_f, d_b)`` a forward and a backward
    overlapped (one's communication under the other's compute). ``microbatches`` in total, half per
    direction; needs pp even and ``microbatches >= 2 * pp``, even."""
    if pp % 2 or microbatches % 2 or microbatches < 2 * pp:
        raise CosimInputError(f"dualpipe needs an even pp ({pp}) and an even number of micro-batches per "
                              f"pipeline >= 2 * pp ({microbatches})")
    half, hr, hm = pp // 2, min(rank, pp - 1 - rank), microbatches // 2
    second = int(rank >= half)
    middle = hr == half - 1

    def d(phase: int) -> int:
        return phase ^ second

    out: list[tuple[Any, ...]] = []
    out += [("F", d(0))] * ((half - hr - 1) * 2)
    for _ in range(hr + 1):
        out += [("F", d(0)), ("F", d(1))]
    for _ in range(half - hr - 1):
        out += [("B", d(1), True), ("W",), ("F", d(1))]
    for i in range(hm - pp + hr + 1):
        if i == 0 and middle:
            out += [("F", d(0)), ("B", d(1), False)]
        else:
            out.append(("FB", d(0), d(1)))
        out.append(("FB", d(1), d(0)))
    for _ in range(half - hr - 1):
        out += [("B", d(1), False), ("FB", d(1), d(0))]
    zb = False
    for i in range(hr + 1):
        if i == (hr + 1) // 2 and hr % 2 == 1:
            zb = True
        out.append(("B", d(1), zb))
        if i == (hr + 1) // 2 and hr % 2 == 0:
            zb = True
        out.append(("B", d(0), zb))
    for _ in range(half - hr - 1):
        out += [("W",), ("B", d(0), True)]
    out += [("W",)] * (hr + 1)
    return out
