"""Round 8 mechanisms (issue 15 point 7's known gaps), each from its source with a case worked by hand: the per-peer
host cost of an all-to-all call, Megatron-Core's default DDP bucket size, MLA's down projections under sequence
parallelism."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.resources import shared_dir
from cosim.workload.synth import SyntheticSpec
from tests._cards import synth_tiny as _synth
from tests.test_synth import launch_costs


def test_an_alltoall_call_costs_the_host_per_peer(tmp_path: Path, dgx: object) -> None:
    # EP4 all-to-alls: collective_host stands for a call on 8 ranks, so a 4-rank all-to-all costs 4 peers less;
    # an all-reduce / all-gather / send-recv call keeps collective_host (one NCCL collective per call)
    def costs(**kw: object) -> dict[str, float]:
        rg = _synth(tmp_path, dgx, dispatch_overhead="10 us", fold=False, collective_host="50 us", **kw).graph.ranks[0]
        return launch_costs(rg)

    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    flat, peer = costs(collective_host_per_peer="0 us"), costs(collective_host_per_peer="2 us")
    assert flat["moe.dispatch"] == pytest.approx(launch + 50e-6, rel=1e-9)
    assert peer["moe.dispatch"] == pytest.approx(launch + 50e-6 + 2e-6 * (4 - 8), rel=1e-9)
    assert peer["moe.combine"] == pytest.approx(launch + 50e-6 - 8e-6, rel=1e-9)
    for n in ("moe.counts_all_gather", "pp.send_activation", "pp.recv_gradient", "optim.dp_param_all_gather"):
        assert n in flat and peer[n] == flat[n], n
    # DeepEP: one library call, no per-peer posts on the host
    deep = costs(dispatch="deepep", collective_host_per_peer="2 us")
    assert deep["moe.dispatch"] == costs(dispatch="deepep", collective_host_per_peer="0 us")["moe.dispatch"]
    # an EP8 group (pp 1): exactly the 8 ranks collective_host stands for
    big = costs(layout=dict(ep=8), collective_host_per_peer="2 us")
    assert big["moe.dispatch"] == pytest.approx(launch + 50e-6, rel=1e-9)


def test_the_per_peer_figure_is_the_shared_traces_slope() -> None:
    root = shared_dir()
    if root is None or not (Path(root) / "traces" / "hta" / "job128-rank0.json.gz").is_file():
        pytest.skip("../shared/traces/hta/job128 not present")
    from cosim.workload.synth.spec import C10D_PEER_HOST
    from validation.e2e.c10d_host import all_rows, peer_rows, per_peer_s

    rows = peer_rows(all_rows(Path(root) / "traces"))
    # all-to-all less all-reduce of the same trace: 8 ranks 0.5 / 29.0 us, 128 ranks 118.0 / 129.0 us
    assert sorted((r.ranks, round(r.extra_s * 1e6, 1)) for r in rows) == [(8, 0.5), (8, 29.0), (128, 118.0),
                                                                          (128, 129.0)]
    # by hand: (mean at 128 - mean at 8) / 120 = (123.5 - 14.75) / 120 = 0.906 us per peer
    assert per_peer_s(rows) == pytest.approx((123.5 - 14.75) / 120 * 1e-6, rel=1e-6)
    assert C10D_PEER_HOST == pytest.approx(per_peer_s(rows), abs=0.001e-6)
    assert SyntheticSpec.model_fields["collective_host_per_peer"].default == C10D_PEER_HOST


def test_ddp_bucket_size_follows_megatron_core_and_bridge() -> None:
    from cosim.capture.config import load_model_config
    from cosim.workload.synth import ParallelLayout
    from cosim.workload.synth.build import ddp_bucket_params

    v3 = load_model_config("deepseek-v3")
    pl = [4] + [8] * 6 + [9]
    # Megatron-Core's default: max(40M, 1M x dp x cp): dp 8 -> 40M, dp 64 -> 64M, dp 128 -> 128M
    assert ddp_bucket_params(ParallelLayout(ep=8).resolve(load_model_config("qwen3-30b-a3b"), 8)) == 40e6
    assert ddp_bucket_params(ParallelLayout(tp=2, pp=8, ep=64, pipeline_layers=pl).resolve(v3, 1024)) == 64e6
    assert ddp_bucket_params(ParallelLayout(tp=2, pp=8, ep=64, pipeline_layers=pl).resolve(v3, 2048)) == 128e6
    assert ddp_bucket_params(ParallelLayout(ep=8, grad_bucket_params=1e6).resolve(v3, 8)) == 1e6
    # the e2e runner: Megatron-Bridge / NeMo 2.0 rows 128 Mi when dp > 1, Megatron-LM-launched rows the rule
    from validation.e2e.run import BRIDGE_BUCKET, ddp_bucket_size, load_cases

    cases = {c.id: c for c in load_cases()[1]}
    assert BRIDGE_BUCKET == 134217728
    assert ddp_bucket_size(cases["dsv3-h100-1024-fp8"]) == BRIDGE_BUCKET
    assert ddp_bucket_size(cases["nemo2502-mixtral-8x7b-b200-64-fp8"]) == BRIDGE_BUCKET
    assert ddp_bucket_size(cases["mlm-dsv3-gb200-256-mxfp8"]) is None
    assert ddp_bucket_size(cases["nemo2407-llama3-70b-h100-64-fp8"]) is None


def test_mla_down_projections_run_on_the_ranks_own_tokens_under_sequence_parallelism() -> None:
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.costs import Shard, layer_ops

    v3 = load_model_config("deepseek-v3")
    T, tp, h, nh = 4096.0, 2, 7168, 128
    sp = {o.name: o for o in layer_ops(v3, 3, T, 4096.0, Shard(tp=tp, sequence_parallel=True), "bf16")}
    no_sp = {o.name: o for o in layer_ops(v3, 3, T, 4096.0, Shard(tp=tp, sequence_parallel=False), "bf16")}
    # replicated TELinear on [s / TP]: 2 x 2048 x 7168 x 1536 (q) and x (512 + 64) (kv); without SP every rank
    # runs them on all 4096 tokens (the input is replicated)
    assert sp["attn.q_down"].flops == 2 * (T / tp) * h * 1536
    assert sp["attn.kv_down"].flops == 2 * (T / tp) * h * (512 + 64)
    assert no_sp["attn.q_down"].flops == 2 * T * h * 1536
    assert sp["attn.q_down"].m == T / tp  # the kernel's shape: T / tp rows
    # the up projections: all tokens, this rank's 64 heads
    assert sp["attn.q_up"].flops == no_sp["attn.q_up"].flops == 2 * T * 1536 * (nh / tp) * (128 + 64)
    assert sp["attn.kv_up"].flops == 2 * T * 512 * (nh / tp) * (128 + 128)
    # the gathers: no 7168-wide hidden-state gather; the normed latents (1536, 512) and the rotary key (64), bf16
    coll = {n: o.comm.nbytes for n, o in sp.items() if o.comm is not None and o.comm.group == "tp"
            and o.comm.kind == "all_gather" and n.startswith("attn.")}
    assert coll == {"attn.q_latent_all_gather": T * 1536 * 2, "attn.kv_latent_all_gather": T * 512 * 2,
                    "attn.k_rope_all_gather": T * 64 * 2}
    assert "attn.sp_all_gather" not in no_sp and "attn.sp_all_gather" not in sp  # no SP: a replicated input
    # the norms on the local tokens too; the saved bytes unchanged (SAVED_SOURCE: the local inputs)
    assert sp["attn.q_norm"].flops == no_sp["attn.q_norm"].flops / tp
    old_saved = {n: o.saved for n, o in no_sp.items() if n.startswith("attn.") and o.saved}
    new_saved = {n: o.saved for n, o in sp.items() if n.startswith("attn.") and o.saved}
    assert new_saved["attn.q_down"] == (T / tp) * h * 2
    assert set(new_saved) == set(old_saved)


def test_fsdp_resharding_sets_the_parameter_gathers(tmp_path: Path, dgx: object) -> None:
    # zero: fsdp, 8 GPUs, EP4, 4 micro-batches per rank (global 32 sequences over dp 8); U units gathered (the layers,
    # the embedding, the head). FSDP2's default frees the parameters after each forward and backward: U x 2 x 4
    # gathers; reshard_after_forward false (AutoModel's MoE default): the backward gathers nothing, U x 4; also no
    # reshard after backward (AutoModel's enable_fsdp_optimizations): once per step, U; only the latter: the first
    # forward, then each backward (freed after every forward), U x (1 + 4)
    def gathers(**lay: object) -> int:
        syn = _synth(tmp_path, dgx, layout={"pp": 1, "ep": 4, "zero": "fsdp", **lay}, fold=False,
                     batch={"global": 32, "micro": 1, "seq": 64})
        rg = syn.graph.ranks[0]
        names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        return sum(n.startswith("fsdp.") and n.endswith("_param_all_gather") for n in names)

    # U = 6: the dense parameters of the embedding, the 2 layers and the head over dp (8 ranks), the 2 layers' experts
    # over edp (2 ranks)
    U = 6
    assert gathers() == U * 2 * 4
    assert gathers(fsdp_reshard_after_forward=False) == U * 4
    assert gathers(fsdp_reshard_after_forward=False, fsdp_reshard_after_backward=False) == U
    assert gathers(fsdp_reshard_after_backward=False) == U * 5
