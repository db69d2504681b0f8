"""Serving synthesis (prefill / decode): collective bytes, the two-micro-batch overlap, KV-cache memory,
all checked by hand on small cases (docs/SYNTHESIS.md, "Inference")."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cosim.errors import CosimInputError
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType
from cosim.workload.synth import SyntheticSpec, synthesize, synthetic_figures
from cosim.workload.synth.costs import Shard, kv_cache_bytes_per_token, layer_ops
from tests._cards import TINY

# wide enough that the expert all-to-all over two nodes costs about as much as the compute
WIDE = dict(name="wide4", hidden_size=4096, num_layers=4, num_heads=32, num_kv_heads=8, head_dim=128,
            vocab_size=1024, num_experts=16, top_k=4, expert_ffn_size=1024)


@pytest.fixture(scope="module")
def two_nodes() -> object:
    from cosim.scenario import build_topology

    return build_topology("dgx-h100", None, nodes=2)


def _synth(tmp_path: Path, topo: object, card: dict | None = None, **kw: object) -> object:
    f = tmp_path / "card.yaml"
    f.write_text(yaml.safe_dump(card or TINY))
    return synthesize(SyntheticSpec.model_validate({"model": str(f), **kw}), topo, kernel_timer=synthetic_kernel_timer)


def _a2a(syn: object) -> list[tuple[str, float]]:
    rg = syn.graph.ranks[0]
    C = rg.collectives
    return [(rg.strings[int(C.name[i])], float(C.in_bytes[i])) for i in range(len(C.type)) if C.type[i] == CollType.ALL_TO_ALL]


def test_prefill_collective_bytes_per_layer_by_hand(tmp_path: Path, dgx: object) -> None:
    # 8 GPUs, ep 8, tp 1: each GPU routes its 256 prompt tokens (one chunk of a 256-token prompt... two
    # chunks of 128) to top-2 experts: dispatch 256 x 2 rows x 64 x 2 bytes (bf16) = 65536 bytes, combine the same
    syn = _synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, batch={"tokens_per_gpu": 256, "prompt": 512,
                                                                            "chunk": 128}, dispatch="nccl")
    a2a = _a2a(syn)
    assert [b for _, b in a2a] == [256 * 2 * 64 * 2.0] * 4  # dispatch + combine, 2 MoE layers
    # FP8 dispatch: 1 byte + one fp32 scale per 128 channels; the combine stays bf16
    fp8 = _a2a(_synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, precision="fp8", dispatch="nccl",
                      batch={"tokens_per_gpu": 256, "prompt": 512, "chunk": 128}))
    assert [b for _, b in fp8] == [256 * 2 * 64 * (1 + 4 / 128), 256 * 2 * 64 * 2.0] * 2
    # FP8 GEMMs with a bf16 dispatch
    bf = _a2a(_synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, precision="fp8", dispatch="nccl",
                     dispatch_precision="bf16", batch={"tokens_per_gpu": 256, "prompt": 512, "chunk": 128}))
    assert [b for _, b in bf] == [256 * 2 * 64 * 2.0] * 4
    # two micro-batches: the same bytes in two halves, and DeepEP labels carrying tokens per rank and bytes per token
    two = _a2a(_synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, overlap="two-microbatch", dispatch="deepep",
                      batch={"tokens_per_gpu": 256, "prompt": 512, "chunk": 128}))
    assert [b for _, b in two] == [128 * 2 * 64 * 2.0] * 8
    assert two[0][0] == "deepep_dispatch:normal:128:128:2:8" and two[1][0] == "deepep_dispatch:normal:128:128:2:8"
    # prefill attention: 2 chunks of 128 queries over 512-token prompts, causal (half), 4 heads of 16
    core = next(o for o in layer_ops(syn.card, 0, 256.0, 512.0, Shard(ep=8, q_len=128.0)) if o.name == "attn.core")
    assert core.flops == pytest.approx(4 * 2 * 4 * 128 * 512 * 16 * 0.5)


def test_decode_collective_bytes_and_attention_by_hand(tmp_path: Path, dgx: object) -> None:
    # 8 GPUs x 16 requests, tp 2: a TP group runs 32 tokens; sequence parallel gives each rank 16 to route
    syn = _synth(tmp_path, dgx, mode="decode", layout={"tp": 2, "ep": 8}, dispatch="nccl",
                 batch={"requests_per_gpu": 16, "context": 1000})
    assert [b for _, b in _a2a(syn)] == [16 * 2 * 64 * 2.0] * 4
    rg = syn.graph.ranks[0]
    names = [rg.strings[int(i)] for i in rg.gpu_ops.name]
    assert "attn.kv_cache_append" in names and "head.sample" in names and not any("dgrad" in n for n in names)
    # decode attention of a GQA layer on one TP rank: 32 requests x 2 heads (1 KV head) over 1000 cached
    # tokens: QK and PV 2 x 2 x 32 x 2 x 1000 x 16 FLOPs; it reads K and V of its KV head: 32 x 1000 x 2 x 16 x 2 B
    ops = layer_ops(syn.card, 0, 32.0, 1000.0, Shard(tp=2, ep=8, sequence_parallel=True, q_len=1.0, decode=True))
    core = next(o for o in ops if o.name == "attn.core")
    assert core.flops == 2 * 32 * 2 * 1000 * (16 + 16) and not core.causal
    assert core.bytes == 32 * 1000 * (2 * 1 * 16 * 2) + 32 * 2 * 32 * 2
    assert (core.m, core.heads, core.batch) == (2.0, 1.0, 32.0)  # the 2 query heads of a KV head share a tile


def test_kv_cache_memory_by_hand(tmp_path: Path, dgx: object) -> None:
    from cosim.capture.config import load_model_config

    v3 = load_model_config("deepseek-v3")
    # MLA: the latent (512) + decoupled rope key (64) per token per layer, bf16: 1152 bytes, on every TP rank
    assert kv_cache_bytes_per_token(v3) == 1152.0 == kv_cache_bytes_per_token(v3, tp=8)
    # DeepSeek-V3 decode, 128 requests x 4096 tokens per GPU, 61 layers: 36.84 GB per GPU
    assert 128 * 4096 * 61 * 1152 == 36_842_766_336
    # tiny GQA card on 8 GPUs, tp 2 (1 KV head per rank), 16 requests per GPU x 1000 tokens, bf16:
    # a TP group's 32 requests x 1000 tokens x 2 layers x (K+V) x 16 x 2 bytes = 4.096 MB per GPU
    syn = _synth(tmp_path, dgx, mode="decode", layout={"tp": 2, "ep": 8}, batch={"requests_per_gpu": 16,
                                                                                  "context": 1000})
    mem = syn.infer[1]
    assert mem.kv_cache == 32 * 1000 * 2 * 2 * 16 * 2
    # the largest batch: (HBM - weights - reserve) // (KV + activations per request)
    assert mem.max_batch == int((mem.hbm - mem.weights - mem.overhead) // (mem.kv_per_unit + mem.act_per_unit))
    # an fp8 cache halves it
    fp8 = _synth(tmp_path, dgx, mode="decode", layout={"tp": 2, "ep": 8}, kv_cache="fp8",
                 batch={"requests_per_gpu": 16, "context": 1000})
    assert fp8.infer[1].kv_cache == mem.kv_cache / 2


def test_two_microbatch_overlap_hides_communication(tmp_path: Path, two_nodes: object) -> None:
    from cosim.replay import ReplayConfig, replay

    cfg = ReplayConfig(collectives="simulated")
    out = {}
    for overlap in ("none", "two-microbatch"):
        syn = _synth(tmp_path, two_nodes, WIDE, mode="prefill", layout={"ep": 16}, overlap=overlap,
                     dispatch="deepep", comm_sms=0, batch={"tokens_per_gpu": 4096, "prompt": 4096})
        res = replay(syn.graph, two_nodes, cfg)
        figs = synthetic_figures(syn, res)
        out[overlap] = (res.summary()["breakdown"]["exposed_communication"], figs["step_time_s"],
                        figs["tokens_per_s_per_gpu"], figs["layer_time_s"])
    plain, two = out["none"], out["two-microbatch"]
    assert plain[0] > 0.2 * plain[1]  # the plain step waits for its all-to-alls
    assert two[0] < 0.5 * plain[0] and two[1] < plain[1] and two[2] > plain[2]
    assert two[3] < plain[3]
    # communication that holds SMs slows the overlapped compute: a longer step than with SM-free progress
    sms = _synth(tmp_path, two_nodes, WIDE, mode="prefill", layout={"ep": 16}, overlap="two-microbatch",
                 dispatch="deepep", comm_sms=66, batch={"tokens_per_gpu": 4096, "prompt": 4096})
    assert sms.infer[0].compute_scale == pytest.approx(2.0)
    assert replay(sms.graph, two_nodes, cfg).summary()["step_time_s"] > two[1]


def test_decode_figures_and_deepep_on_the_fabric(tmp_path: Path, two_nodes: object) -> None:
    from cosim.replay import ReplayConfig, replay

    syn = _synth(tmp_path, two_nodes, WIDE, mode="decode", layout={"ep": 16}, overlap="two-microbatch",
                 batch={"requests_per_gpu": 32, "context": 2048})
    assert syn.infer[0].dispatch == "deepep-ll" and syn.infer[0].compute_scale == 1.0 and syn.rm.layout.cuda_graphs
    res = replay(syn.graph, two_nodes, ReplayConfig(collectives="simulated"))
    figs = synthetic_figures(syn, res)
    assert figs["time_per_output_token_s"] == figs["step_time_s"] > 0
    assert figs["tokens_per_s_per_gpu"] == pytest.approx(32 / figs["step_time_s"])
    assert 0 < figs["layer_time_s"] * 4 < figs["step_time_s"]
    assert figs["max_requests_per_gpu"] > 32 and not figs["oom"]
    assert set(res.runs[0].coll_algo.values()) == {("deepep", "low_latency")}


def test_serving_input_errors(tmp_path: Path, dgx: object) -> None:
    with pytest.raises(CosimInputError, match="mode decode takes batch"):
        _synth(tmp_path, dgx, mode="decode", layout={"ep": 8}, batch={"global": 8, "seq": 64})
    with pytest.raises(CosimInputError, match="pipeline parallelism"):
        _synth(tmp_path, dgx, mode="prefill", layout={"pp": 2, "ep": 4}, batch={"tokens_per_gpu": 64, "prompt": 64})
    with pytest.raises(CosimInputError, match="comm_sms"):
        _synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, comm_sms=500, batch={"tokens_per_gpu": 64,
                                                                                       "prompt": 64})
    with pytest.raises(CosimInputError, match="serving fields"):
        _synth(tmp_path, dgx, layout={"ep": 8}, overlap="two-microbatch", batch={"global": 8, "seq": 64})
    with pytest.raises(CosimInputError, match="out of memory"):
        _synth(tmp_path, dgx, mode="decode", layout={"ep": 8}, batch={"requests_per_gpu": 10**6, "context": 10**5})
    with pytest.raises(CosimInputError, match="chunk"):
        _synth(tmp_path, dgx, mode="prefill", layout={"ep": 8}, batch={"tokens_per_gpu": 64, "prompt": 64,
                                                                          "chunk": 128})


def test_scenario_fields_are_set_keys_and_runs_are_deterministic(tmp_path: Path) -> None:
    from cosim.scenario import load_scenario, run_scenario

    (tmp_path / "card.yaml").write_text(yaml.safe_dump(TINY))
    f = tmp_path / "serve.yaml"
    f.write_text(yaml.safe_dump({"name": "serve", "topology": "dgx-h100", "workload": {"synthetic": {
        "model": "card.yaml", "mode": "decode", "layout": {"ep": 8}, "batch": {"requests_per_gpu": 8, "context": 256}}}}))
    sets = {"workload.synthetic.batch.requests_per_gpu": "16", "workload.synthetic.overlap": "two-microbatch",
            "workload.synthetic.dispatch": "nccl", "workload.synthetic.kv_cache": "fp8"}
    runs = [run_scenario(load_scenario(f), sets)[1].summary() for _ in range(2)]
    s = runs[0]
    assert s["synthetic"]["mode"] == "decode" and s["synthetic"]["microbatches"] == 2
    assert s["synthetic"]["dispatch"] == "nccl" and s["synthetic"]["kv_cache"] == "fp8"
    assert s["tokens_per_s_per_gpu"] == pytest.approx(16 / s["step_time_s"])
    assert s["kv_cache_bytes_per_gpu"] == 16 * 256 * 2 * (2 * 2 * 16 * 1)  # fp8 K and V of 2 KV heads, 2 layers
    for k in ("step_time_s", "layer_time_s", "time_per_output_token_s", "tokens_per_s_per_gpu",
              "kv_cache_bytes_per_gpu", "max_requests_per_gpu"):
        assert s[k] == runs[1][k]
    with pytest.raises(CosimInputError, match="overlap"):
        run_scenario(load_scenario(f), {"workload.synthetic.overlap": "three"})


def test_skewed_routing_builds_every_rank_and_slows_the_step(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    steps = {}
    for r in ("uniform", "zipf:1.5"):
        syn = _synth(tmp_path, dgx, WIDE, mode="decode", layout={"ep": 8}, overlap="two-microbatch", routing=r,
                     batch={"requests_per_gpu": 64, "context": 1024})
        res = replay(syn.graph, dgx, ReplayConfig(collectives="simulated"))
        steps[r] = (len(syn.graph.ranks), res.summary()["step_time_s"], set(res.runs[0].coll_algo.values()))
        C = syn.graph.ranks[0].collectives
        a2a = [i for i in range(len(C.type)) if C.type[i] == CollType.ALL_TO_ALL]
        splits = [C.ragged("in_splits", i) for i in a2a]
        if r == "uniform":
            assert all(len(x) == 0 for x in splits)
        else:  # every all-to-all carries its per-peer bytes, summing to what the rank sends
            assert all(len(x) == 8 and abs(sum(x) - C.in_bytes[i]) <= 8 for x, i in zip(splits, a2a))
            assert len({tuple(x) for x in splits[::2]}) > 1  # the dispatch shares differ by layer
    assert steps["uniform"][0] == 1 and steps["zipf:1.5"][0] == 8
    assert steps["zipf:1.5"][1] > steps["uniform"][1]  # the hot experts' rank is the straggler
    assert ("deepep", "low_latency") not in steps["zipf:1.5"][2]  # all-to-allv with per-peer splits


def test_a_serving_graph_says_replay_keeps_the_per_kernel_sm_law_off(tmp_path: Path, dgx: object) -> None:
    """The SM law's switch is in the graph: a serving step (its synthesis charges the communication SMs,
    ``compute_scale``) carries ``source["comm_share"]`` False, so its replay with ``gpu.comm_share`` on (the
    default) is the one with it off; a training step's graph carries True."""
    from cosim.replay import ReplayConfig, replay

    syn = _synth(tmp_path, dgx, mode="decode", layout={"ep": 8}, dispatch="nccl",
                 batch={"requests_per_gpu": 16, "context": 1000})
    assert all(rg.source["comm_share"] is False for rg in syn.graph.ranks)
    on = replay(syn.graph, dgx, ReplayConfig(collectives="simulated"))
    off = replay(syn.graph, dgx, ReplayConfig(collectives="simulated", comm_share=False))
    assert not any("own SMs" in n for n in on.notes)
    assert [r.gpu_end.tolist() for r in on.runs] == [r.gpu_end.tolist() for r in off.runs]
    train = _synth(tmp_path, dgx, layout={"ep": 8}, batch={"global": 8, "micro": 1, "seq": 64})
    assert all(rg.source["comm_share"] is True for rg in train.graph.ranks)
