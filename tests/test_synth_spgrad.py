"""TP all-reduce of the sequence-parallel parameters' gradients (Megatron-Core finalize_model_grads), by hand."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from cosim.capture.config import MoEModelConfig
from cosim.workload.graph import CollType
from cosim.workload.synth.build import sp_layer_params
from tests._cards import synth_tiny


def _coll(rg: object) -> Counter:
    C = rg.collectives  # type: ignore[attr-defined]
    return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c])) for c in range(len(C)))


def test_sp_grads_all_reduced_over_tp_once_per_step(tmp_path: Path, dgx: object) -> None:
    def synth(**lay: object) -> object:
        return synth_tiny(tmp_path, dgx, layout=dict(pp=2, ep=4, **lay))

    # 8 GPUs: tp 2 x pp 2 x dp 2, sequence parallel (default with tp > 1); per layer the tagged parameters are the
    # two norms (2 x 64) and the router (8 experts x 64): 640; stage 1 also the final norm (64). bf16 gradients.
    syn = synth(tp=2)
    for rg in syn.graph.ranks:
        stage = rg.rank // 4
        want = 2 * (640 + (64 if stage == 1 else 0))
        assert _coll(rg)[("ALL_REDUCE", 2, float(want))] == 1
        names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        assert names.count("grad.tp_sp_all_reduce") == 1
        i = names.index("grad.tp_sp_all_reduce")
        # after the step's DP reduction, before the optimizer
        assert max(j for j, n in enumerate(names) if n.startswith("grad.dp_")) < i
        assert i < names.index("optim.grad_norm_all_reduce") < names.index("optim.adam")
    # fp32 gradient reduction doubles it; no sequence parallelism (or tp 1): none
    rg0 = synth_tiny(tmp_path, dgx, layout=dict(pp=2, ep=4, tp=2), grad_reduce_in_fp32=True).graph.ranks[0]
    assert _coll(rg0)[("ALL_REDUCE", 2, 4.0 * 640)] == 1
    for rg in synth(tp=2, sequence_parallel=False).graph.ranks:
        assert "grad.tp_sp_all_reduce" not in [rg.strings[int(x)] for x in rg.gpu_ops.name]


def test_sp_layer_params_of_mla_by_hand() -> None:
    mla = MoEModelConfig(name="mla", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=4, vocab_size=256,
                         num_experts=8, top_k=2, expert_ffn_size=32, dense_layers=1, dense_ffn_size=128, attention="mla",
                         q_lora_rank=32, kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    # norms 2 x 64; kv down 64 x (16 + 8) and its norm 16; q down 64 x 32 and its norm 32
    dense = 128 + 64 * 24 + 16 + 64 * 32 + 32
    assert sp_layer_params(mla, 0) == dense
    assert sp_layer_params(mla, 1) == dense + 8 * 64  # + the router of the MoE layer
