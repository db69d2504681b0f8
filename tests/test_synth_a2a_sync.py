"""Where the host waits for the MoE token counts in Megatron-Core's combined 1F1B (``a2a_overlap``), worked on a
2-layer EP4 step without a pipeline (F0, F1+B0, F2+B1, B2): ``schedule.OVERLAP_SYNC_SOURCE``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosim.workload.graph import EdgeKind
from tests._cards import TINY
from tests._cards import synth_tiny as _synth


def _first_pair(tmp_path: Path, dgx: object, dispatch: str) -> tuple[Any, dict[str, list[int]], list[int]]:
    """The synthesized step, the GPU ops of its first overlapped pair (forward of micro-batch 1, backward of
    micro-batch 0) by name in issue order, and the host syncs issued inside that pair (host op rows)."""
    card = {**TINY, "hidden_size": 2048, "head_dim": 128, "expert_ffn_size": 1024}
    syn = _synth(tmp_path, dgx, card=card, layout=dict(ep=4, a2a_overlap=True), dispatch=dispatch,
                 batch={"global": 24, "micro": 1, "seq": 4096})
    rg = syn.graph.ranks[0]
    assert [k for k, _ in syn.built.unit_keys[rg.rank]][1] == (("F", 1, 0), ("B", 0, 0))
    lo, hi, _ = syn.built.unit_spans[rg.rank][1]
    ops: dict[str, list[int]] = {}
    for j in range(lo, hi + 1):
        ops.setdefault(rg.strings[int(rg.gpu_ops.name[j])], []).append(j)
    first, last = launch_of(rg, lo), launch_of(rg, hi)
    syncs = [h for h in range(first, last) if rg.strings[int(rg.host_ops.name[h])] == "cudaStreamSynchronize"]
    return syn, ops, syncs


def launch_of(rg: Any, j: int) -> int:
    """The host op that launched GPU op ``j``."""
    return int(rg.launches.host_op[int(rg.gpu_ops.launch[j])])


def waited_by(rg: Any, h: int) -> set[str]:
    """Names of the GPU ops host sync ``h`` waits for (its SYNC edges)."""
    nh, e = len(rg.host_ops), rg.edges
    return {rg.strings[int(rg.gpu_ops.name[int(e.src[i]) - nh])] for i in range(len(e))
            if int(e.dst[i]) == h and int(e.src[i]) >= nh and int(e.kind[i]) == EdgeKind.SYNC}


def test_alltoall_count_sync_waits_in_the_dispatch_node_after_the_paired_backward_is_launched(
        tmp_path: Path, dgx: object) -> None:
    # Megatron's alltoall dispatcher: dispatch_preprocess (counts, their non-blocking host copies, permute 1) in
    # the forward's attn node; d2h_event.synchronize() (before_ep_alltoall) in token_dispatch, the moe_dispatch
    # node, which run() issues after the backward's mlp node: the experts' data gradients are launched first
    syn, ops, syncs = _first_pair(tmp_path, dgx, "nccl")
    rg = syn.graph.ranks[0]
    assert len(syncs) == 2  # one per forward layer
    for layer, h in enumerate(syncs):
        dispatch = ops["moe.dispatch"][layer]
        assert launch_of(rg, ops["moe.permute"][layer]) < launch_of(rg, ops["moe.experts_fc1.dgrad"][layer]) < h \
            < launch_of(rg, dispatch)
        assert waited_by(rg, h) == {"moe.splits_d2h"}  # the count copies, not the comm stream


def test_deepep_count_sync_also_waits_for_the_paired_combine_backward(tmp_path: Path, dgx: object) -> None:
    # DeepEP: the notify kernel whose counts the CPU spins on runs after an event recorded on the caller's stream,
    # the combined 1F1B's communication stream, where the backward's combine backward was issued before it
    syn, ops, syncs = _first_pair(tmp_path, dgx, "deepep")
    rg = syn.graph.ranks[0]
    assert len(syncs) == 2
    for layer, h in enumerate(syncs):
        assert launch_of(rg, ops["moe.experts_fc1.dgrad"][layer]) < h < launch_of(rg, ops["moe.dispatch"][layer])
        assert waited_by(rg, h) == {"moe.splits_d2h", "moe.combine.bwd"}
        combine_bwd = ops["moe.combine.bwd"][layer]
        assert int(rg.gpu_ops.stream[combine_bwd]) == int(rg.gpu_ops.stream[ops["moe.dispatch"][layer]])



def test_combine_backward_does_not_wait_for_the_previous_layers_attention_wgrad(tmp_path: Path, dgx: object) -> None:
    # delay_wgrad_compute: Megatron records the micro-batch's event after the attn node's backward, before
    # attn.backward_dw(), and runs the combine node's backward (with its residual and unpermute backward) on the
    # communication stream: the next layer's combine backward runs beside the attention wgrad, not after it
    from cosim.replay import ReplayConfig, replay

    syn, ops, _ = _first_pair(tmp_path, dgx, "nccl")
    run = replay(syn.graph, dgx, ReplayConfig(collectives="simulated")).runs[0]
    wgrad, combine_bwd = ops["attn.qkv.wgrad"][0], ops["moe.combine.bwd"][1]  # backward layers 1 and 0
    assert run.gpu_end[ops["attn.core.bwd"][0]] <= run.gpu_start[combine_bwd] < run.gpu_end[wgrad]

