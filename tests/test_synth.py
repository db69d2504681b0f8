"""Training-step synthesis, checked by hand on small cases: layer FLOPs, layout errors,
pipeline order, every collective of one step of a 2-layer EP4 PP2 model, routing skew."""

from __future__ import annotations

from collections import Counter
from math import comb
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.capture.config import MoEModelConfig, load_model_config
from cosim.errors import CosimInputError
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType, OpClass
from cosim.workload.synth import ParallelLayout, SyntheticSpec, layer_forward_flops, synthesize, synthetic_figures
from cosim.workload.synth.costs import layer_ops
from cosim.workload.synth.routing import RoutingSpec, expert_shares, route
from cosim.workload.synth.schedule import peak_in_flight, stage_order
from tests._cards import TINY
from tests._cards import synth_tiny as _synth

ROOT = Path(__file__).resolve().parent.parent


def tiny(**kw: object) -> MoEModelConfig:
    return MoEModelConfig(**{**TINY, **kw})


def launch_costs(rg: Any) -> dict[str, float]:
    """Host time of the launch call of each GPU op of rank graph ``rg``, by the op's name (seconds)."""
    names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    return {names[int(g)]: float(rg.host_ops.dur[int(h)])
            for h, g in zip(rg.launches.host_op, rg.launches.first_gpu_op) if g >= 0}


def test_layer_flops_by_hand() -> None:
    c = tiny()
    T, S = 128, 64  # two sequences of 64
    by_hand = (128 * 64 * 5            # attention RMSNorm, 5 FLOPs per element
               + 2 * 128 * 64 * (4 + 2 * 2) * 16  # fused QKV projection
               + 128 * (4 + 2) * 16 * 3          # rotary embedding on q and k
               + 4 * 2 * 4 * 64 * 64 * 16 // 2  # causal flash attention: QK^T and PV, half the scores
               + 2 * 128 * 64 * 64               # output projection
               + 128 * 64                        # residual add
               + 128 * 64 * 5                    # MoE RMSNorm
               + 2 * 128 * 8 * 64                # router
               + 128 * 8 * 5                     # softmax + top-k
               + 2 * (128 * 2) * (2 * 32) * 64   # experts fc1 (w1, w3) on tokens * top_k rows
               + (128 * 2) * 32 * 4              # SwiGLU
               + 2 * (128 * 2) * 64 * 32         # experts fc2
               + 128 * 2 * 64                    # unpermute: weighted sum of the top-k rows
               + 128 * 64)                       # residual add
    assert layer_forward_flops(c, 1, T, S) == by_hand
    # a dense layer: the same attention, a SwiGLU FFN of width 96 instead of the MoE block
    d = tiny(dense_layers=1, dense_ffn_size=96)
    attn = 128 * 64 * 5 + 2 * 128 * 64 * 128 + 128 * 6 * 16 * 3 + 4 * 2 * 4 * 64 * 64 * 16 // 2 + 2 * 128 * 64 * 64 \
        + 128 * 64
    ffn = 128 * 64 * 5 + 2 * 128 * 192 * 64 + 128 * 96 * 4 + 2 * 128 * 64 * 96 + 128 * 64
    assert layer_forward_flops(d, 0, T, S) == attn + ffn
    with pytest.raises(ValueError, match="out of range"):
        layer_forward_flops(c, 2, T, S)


def test_mla_projections_by_hand() -> None:
    v3 = load_model_config("deepseek-v3")
    T = 10
    ops = {o.name: o for o in layer_ops(v3, 3, T, 4096)}
    h, nh = 7168, 128
    assert ops["attn.q_down"].flops == 2 * T * h * 1536
    assert ops["attn.q_up"].flops == 2 * T * 1536 * nh * (128 + 64)
    assert ops["attn.kv_down"].flops == 2 * T * h * (512 + 64)
    assert ops["attn.kv_up"].flops == 2 * T * 512 * nh * (128 + 128)
    assert ops["attn.o_proj"].flops == 2 * T * nh * 128 * h
    # causal attention: scores over the 192-dim q/k and values of 128 dims
    assert ops["attn.core"].flops == pytest.approx(2 * (T / 4096) * nh * 4096 * 4096 * (192 + 128) * 0.5)
    # routed experts: tokens * 8 rows through 3 matrices of 7168 x 2048; one shared expert on every token
    assert ops["moe.experts_fc1"].flops + ops["moe.experts_fc2"].flops == 2 * T * 8 * 3 * h * 2048
    assert ops["moe.shared.fc1"].flops + ops["moe.shared.fc2"].flops == 2 * T * 3 * h * 2048


def test_layout_errors_name_the_field() -> None:
    c = tiny()
    cases = [
        (dict(tp=3), 12, r"layout\.tp: 4 attention heads of tiny2 are not divisible by tp 3"),
        (dict(ep=3), 6, r"layout\.ep: 8 experts of tiny2 are not divisible by ep 3"),
        (dict(tp=2, pp=2, dp=3), 8, r"layout\.dp: dp 3 \* tp 2 \* cp 1 \* pp 2 = 12 != 8 GPUs"),
        (dict(pp=3), 6, r"layout\.pp: 2 layers of tiny2 are not divisible by pp\*vpp = 3"),
        (dict(pp=2, pipeline_layers=[2, 1]), 8, r"layout\.pipeline_layers: entries must be >= 0 and sum to 2"),
        (dict(ep=8), 4, r"layout\.ep: ep\*etp = 8 does not divide tp\*cp\*dp = 4"),
        (dict(tp=3), 8, r"layout\.tp: tp\*cp\*pp = 3\*1\*1 = 3 does not divide the 8 GPUs"),
        (dict(vpp=1, schedule="interleaved"), 8, r"layout\.vpp: schedule interleaved needs vpp > 1"),
    ]
    for kw, gpus, msg in cases:
        with pytest.raises(CosimInputError, match=msg):
            ParallelLayout(**kw).resolve(c, gpus)
    rm = ParallelLayout(pp=2, pipeline_layers=[0, 2]).resolve(c, 8)
    assert rm.chunk_layers == [[], [0, 1]] and rm.dp == 4
    with pytest.raises(CosimInputError, match=r"layout\.ep: llama-3-70b is dense"):
        ParallelLayout(ep=2).resolve(load_model_config("llama-3-70b"), 8)


def test_issue_example_layout_resolves() -> None:
    v3 = load_model_config("deepseek-v3")
    with pytest.raises(CosimInputError, match="give pipeline_layers"):
        ParallelLayout(tp=2, pp=8, vpp=4, ep=64).resolve(v3, 1024)
    import yaml

    doc = yaml.safe_load((ROOT / "workloads/scenarios/dsv3-1024.yaml").read_text())
    rm = ParallelLayout(**doc["workload"]["synthetic"]["layout"]).resolve(v3, 1024)
    assert (rm.dp, rm.edp, rm.schedule) == (64, 2, "interleaved")
    assert sum(len(x) for x in rm.chunk_layers) == 61 and rm.chunk_layers[0] == [0]
    assert rm.group("ep", 0) == list(range(64)) and rm.group("ep", 64) == list(range(64, 128))
    assert rm.group("tp", 5) == [4, 5] and rm.group("pp", 1) == [1 + 128 * s for s in range(8)]
    assert rm.group("edp", 3) == [3, 67] and len(rm.group("dp", 0)) == 64


def test_1f1b_and_interleaved_order_by_hand() -> None:
    F, B = "F", "B"
    assert stage_order(0, 4, 1, 6) == [(F, 0, 0), (F, 1, 0), (F, 2, 0), (F, 3, 0), (B, 0, 0), (F, 4, 0), (B, 1, 0),
                                       (F, 5, 0), (B, 2, 0), (B, 3, 0), (B, 4, 0), (B, 5, 0)]
    assert stage_order(3, 4, 1, 6) == [x for i in range(6) for x in ((F, i, 0), (B, i, 0))]
    assert stage_order(0, 2, 2, 2) == [(F, 0, 0), (F, 1, 0), (F, 0, 1), (F, 1, 1),
                                       (B, 0, 1), (B, 1, 1), (B, 0, 0), (B, 1, 0)]
    assert stage_order(1, 2, 2, 2) == [(F, 0, 0), (F, 1, 0), (F, 0, 1), (B, 0, 1), (F, 1, 1), (B, 1, 1),
                                       (B, 0, 0), (B, 1, 0)]
    assert peak_in_flight(stage_order(0, 4, 1, 6)) == 4
    with pytest.raises(CosimInputError, match="multiple of pp"):
        stage_order(0, 4, 2, 6)


def _spec(**kw: object) -> SyntheticSpec:
    base = dict(model="x", layout=dict(pp=2, ep=4), batch={"global": 8, "micro": 1, "seq": 64}, precision="bf16")
    base.update(kw)
    return SyntheticSpec.model_validate(base)


def test_every_collective_of_a_2_layer_ep4_pp2_step_by_hand(tmp_path: Path, dgx: object) -> None:
    # 8 GPUs: pp 2 x dp 4, ep 4 inside each stage; global 8 x 64 tokens -> 2 micro-batches per pipeline
    syn = _synth(tmp_path, dgx, fold=False)
    assert [rg.rank for rg in syn.graph.ranks] == list(range(8)) and syn.built.microbatches == 2
    h, T, k = 64, 64, 2
    a2a = T * k * h * 2  # every all-to-all moves the 64 tokens x top-2 rows of d 64 in bf16: 16384 bytes
    pp_msg = T * h * 2   # one micro-batch's activations (or gradients) between the stages: 8192 bytes
    layer = 64 * 16 * (4 * 2 + 2 * 2) + 2 * 64 + 64 * 8  # attention, 2 norms, router (experts: no DP replica)
    emb = 256 * 64
    for rg in syn.graph.ranks:
        C = rg.collectives
        got = Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c]))
                      for c in range(len(C)))
        stage = rg.rank // 4
        dense = layer + emb + (64 if stage == 1 else 0)  # stage 1 also holds the final norm
        want = Counter({
            ("ALL_TO_ALL", 4, float(a2a)): 2 * 4,  # dispatch, combine, and their backward, x 2 micro-batches
            # Megatron's dispatcher: the top-2 fp32 probabilities of the 64 tokens in their own all-to-all
            # (and its backward), and the 8 experts' int64 token counts all-gathered over EP (forward only)
            ("ALL_TO_ALL", 4, float(T * k * 4)): 2 * 2,
            ("ALL_GATHER", 4, 8.0 * 8): 2,
            ("SEND_RECV", 2, float(pp_msg)): 4,     # 2 activations one way, 2 gradients the other
            ("REDUCE_SCATTER", 4, float(dense * 2)): 1,  # bf16 gradients over the 4 DP replicas, one bucket
            ("ALL_REDUCE", 4, 8.0): 1,              # gradient norm
            ("ALL_GATHER", 4, float(dense * 2 / 4)): 1,  # ZeRO-1: updated bf16 parameters (input = one shard)
        })
        assert got == want, (rg.rank, got)
        # dispatch/combine groups are this stage's 4 ranks; pipeline pairs are (r, r + 4)
        ep = {tuple(rg.groups.ragged("ranks", int(C.group[c])).tolist()) for c in range(len(C))
              if C.type[c] == CollType.ALL_TO_ALL}
        assert ep == {tuple(range(4 * stage, 4 * stage + 4))}
        pairs = {tuple(rg.groups.ragged("ranks", int(C.group[c])).tolist()) for c in range(len(C))
                 if C.type[c] == CollType.SEND_RECV}
        assert pairs == {(rg.rank % 4, rg.rank % 4 + 4)}


def test_pipeline_runs_1f1b_with_a_bubble(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    syn = _synth(tmp_path, dgx)  # folded: one rank per stage
    assert syn.built.folded and [rg.rank for rg in syn.graph.ranks] == [0, 4]
    res = replay(syn.graph, dgx, ReplayConfig(collectives="simulated"))
    run0, run1 = res.runs
    spans0, spans1 = syn.built.unit_spans[0], syn.built.unit_spans[4]
    # stage 0: F0 F1 B0 B1 (warm-up 1); stage 1: F0 B0 F1 B1. Stage 1's F0 starts after stage 0's F0 ends,
    # stage 0's B0 after stage 1's B0.
    assert run1.gpu_start[spans1[0][0]] > run0.gpu_end[spans0[0][1]]
    assert run0.gpu_start[spans0[2][0]] > run1.gpu_end[spans1[1][1]]
    figs = synthetic_figures(syn, res)
    assert 0.05 < figs["bubble_fraction"] < 0.9
    flat = _synth(tmp_path, dgx, layout=dict(ep=4))
    res1 = replay(flat.graph, dgx, ReplayConfig(collectives="simulated"))
    assert synthetic_figures(flat, res1)["bubble_fraction"] < 1e-3


def test_folded_matches_full_under_uniform_routing(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    cfg = ReplayConfig(collectives="simulated")
    a = replay(_synth(tmp_path, dgx, fold=True).graph, dgx, cfg).summary()["step_time_s"]
    b = replay(_synth(tmp_path, dgx, fold=False).graph, dgx, cfg).summary()["step_time_s"]
    assert a == pytest.approx(b, rel=0.01)


def test_routing_shares_placement_and_redundancy() -> None:
    c = tiny()
    u = route(RoutingSpec(), c, 0, 4, 64.0)
    assert [r.tolist() for r in u.rows] == [[64.0, 64.0]] * 4  # 4 ranks x 64 tokens x top-2 / 8 experts
    z = expert_shares(RoutingSpec(model="zipf:1.2"), c, 0)
    assert z.sum() == pytest.approx(1.0) and z.max() <= 0.5 + 1e-12  # no expert above 1 / top_k
    assert np.array_equal(z, expert_shares(RoutingSpec(model="zipf:1.2"), c, 0))  # deterministic
    hot = int(np.argmax(z))
    rr = route(RoutingSpec(model="zipf:1.2", placement="round-robin"), c, 0, 4, 64.0)
    assert int(np.argmax([r.sum() for r in rr.rows])) == hot % 4
    red = route(RoutingSpec(model="zipf:1.2", redundant=1), c, 0, 4, 64.0)
    assert sum(len(r) for r in red.rows) == 9
    assert max(r.sum() for r in red.rows) < max(r.sum() for r in route(RoutingSpec(model="zipf:1.2"), c, 0, 4,
                                                                          64.0).rows)


def _compute_time(rg: object, run: object) -> float:
    G = rg.gpu_ops  # type: ignore[attr-defined]
    sel = G.cls != OpClass.COLLECTIVE
    return float(np.sum(run.gpu_end[sel] - run.gpu_start[sel]))  # type: ignore[attr-defined]


def test_routing_skew_moves_the_slowest_rank(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    cfg = ReplayConfig(collectives="simulated", comm_share=False)  # compute busy time without the SM law's overlap
    shares = expert_shares(RoutingSpec(model="zipf:1.5"), tiny(), 0)
    hot = int(np.argmax(shares))
    wide = {**TINY, "hidden_size": 2048, "expert_ffn_size": 8192}  # GPU-bound experts, not launch-bound
    batch = {"global": 32, "micro": 4, "seq": 256}
    for owner in (1, 3):  # put the hot expert of every layer on EP rank `owner`, the rest round-robin
        emap = [(e % 4) for e in range(8)]
        emap[hot], emap[(hot + 1) % 8] = owner, emap[hot]
        syn = _synth(tmp_path, dgx, wide, layout=dict(ep=4), batch=batch,
                     routing=dict(model="zipf:1.5", placement="map", map=emap))
        res = replay(syn.graph, dgx, cfg)
        busy = [_compute_time(rg, run) for rg, run in zip(syn.graph.ranks, res.runs)]
        assert int(np.argmax(busy)) == owner, busy
    base = _synth(tmp_path, dgx, wide, layout=dict(ep=4), batch=batch)
    assert base.built.folded
    skew_step = replay(syn.graph, dgx, cfg).summary()["step_time_s"]
    assert skew_step > replay(base.graph, dgx, cfg).summary()["step_time_s"]


def test_memory_and_oom(tmp_path: Path, dgx: object) -> None:
    spec = SyntheticSpec.model_validate(dict(model="qwen3-30b-a3b", layout=dict(ep=8),
                                             batch={"global": 8, "micro": 1, "seq": 4096}))
    with pytest.raises(CosimInputError, match=r"out of memory: stage 0 needs .* GiB .* allow_oom"):
        synthesize(spec, dgx, kernel_timer=synthetic_kernel_timer)
    syn = _synth(tmp_path, dgx)
    m0 = syn.memory[0]
    # stage 0 (embedding + layer 0): bf16 weights, bf16 grad buffer (Megatron DDP's default), fp32 master + Adam
    # state over 4 DP replicas (experts: 1 replica)
    dense = 64 * 16 * 12 + 2 * 64 + 64 * 8 + 256 * 64
    expert = 8 * 3 * 64 * 32 / 4
    assert m0.weights == 2 * (dense + expert) and m0.gradients == 2 * (dense + expert)
    assert m0.optimizer == 12 * (dense / 4 + expert)
    assert m0.activations > 0 and not syn.oom


def test_scenario_synthetic_block_sets_and_json_fields(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    import yaml

    from cosim.scenario import apply_scenario_sets, build_topology, load_scenario

    scn = load_scenario(ROOT / "workloads/scenarios/dsv3-1024.yaml")
    assert scn.nodes == 128 and scn.workload.synthetic.layout.ep == 64  # type: ignore[union-attr]
    scn2, rest = apply_scenario_sets(scn, {"workload.synthetic.layout.ep": "32", "workload.synthetic.precision": "bf16",
                                           "workload.synthetic.batch.global": "4096", "nodes": "64"})
    s = scn2.workload.synthetic  # type: ignore[union-attr]
    assert (s.layout.ep, s.layout.tp, s.precision, s.batch.global_, scn2.nodes, rest) == (32, 2, "bf16", 4096, 64, {})
    with pytest.raises(CosimInputError, match=r"--set workload.synthetic.layout.ep: .*greater than 0"):
        apply_scenario_sets(scn, {"workload.synthetic.layout.ep": "0"})
    with pytest.raises(CosimInputError, match=r"--set workload.synthetic.layout.bogus: unknown key 'bogus'; valid: tp, "):
        apply_scenario_sets(scn, {"workload.synthetic.layout.bogus": "1"})
    topo = build_topology("dgx-h100", None, None, None, 4)
    assert len(topo.gpus) == 32 and topo.nodes == 4
    assert len(build_topology("dgx-h100-4node", None, None, None, 2).gpus) == 16
    assert len(build_topology("gb200-nvl72", None, None, None, 2).gpus) == 8  # two 4-GPU compute trays
    pair = tmp_path / "pair.yaml"
    pair.write_text("name: pair\nnode: dgx-h100\nnodes: 2\nlinks:\n"
                    "  - {between: [node0.nic0, node1.nic0], type: ndr400}\n", encoding="utf-8")
    with pytest.raises(CosimInputError, match="cannot be scaled"):
        build_topology(str(pair), None, None, None, 4)
    f = tmp_path / "s.yaml"
    f.write_text(yaml.safe_dump({"name": "t", "topology": "dgx-h100", "workload": {"synthetic": {
        "model": "qwen3-moe-mini", "layout": {"ep": 8, "pp": 1}, "batch": {"global": 16, "micro": 2, "seq": 256}}}}))
    out = subprocess.run([sys.executable, "-m", "cosim", "run", str(f), "--json", "--no-timeline", "--out",
                          str(tmp_path / "o"), "--set", "workload.synthetic.layout.ep=4"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["synthetic"]["ep"] == 4 and d["synthetic"]["dp"] == 8 and d["synthetic"]["folded"]
    tok = 16 * 256
    assert d["tokens_per_s_per_gpu"] == pytest.approx(tok / d["step_time_s"] / 8)
    assert 0 < d["mfu"] < 1 and d["bubble_fraction"] == 0 and d["memory_per_gpu_bytes"] > 0
    bad = subprocess.run([sys.executable, "-m", "cosim", "run", str(f), "--set", "workload.synthetic.layout.ep=3"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "layout.ep" in bad.stderr


def test_stragglers_slow_gpu_host_and_jitter(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    cfg = ReplayConfig(collectives="simulated")
    wide = {**TINY, "hidden_size": 1024, "expert_ffn_size": 4096}
    kw = dict(layout=dict(ep=4), batch={"global": 16, "micro": 2, "seq": 256})
    base = replay(_synth(tmp_path, dgx, wide, **kw).graph, dgx, cfg)
    t0 = base.summary()["step_time_s"]
    slow = _synth(tmp_path, dgx, wide, stragglers={"gpu": {5: 1.5}}, **kw)
    assert not slow.built.folded and len(slow.graph.ranks) == 8
    res = replay(slow.graph, dgx, cfg)
    busy = [_compute_time(rg, run) for rg, run in zip(slow.graph.ranks, res.runs)]
    assert int(np.argmax(busy)) == 5 and busy[5] == pytest.approx(1.5 * busy[0], rel=1e-9)
    assert res.summary()["step_time_s"] > t0  # its EP peers wait for it in every all-to-all
    host = _synth(tmp_path, dgx, wide, stragglers={"host": {2: 50.0}}, **kw)
    H = host.graph.ranks[2].host_ops
    assert H.tail[1] == pytest.approx(50 * host.graph.ranks[0].host_ops.tail[1])
    jit = _synth(tmp_path, dgx, wide, stragglers={"launch_jitter": {3: "20 us"}}, **kw)
    again = _synth(tmp_path, dgx, wide, stragglers={"launch_jitter": {3: "20 us"}}, **kw)
    t3, t0h = jit.graph.ranks[3].host_ops.tail, jit.graph.ranks[0].host_ops.tail
    assert np.array_equal(t3, again.graph.ranks[3].host_ops.tail)  # seeded: deterministic
    extra = float(np.mean(t3[1:-1] - t0h[1:-1]))
    assert 15e-6 < extra < 25e-6  # mean of the exponential draws, 20 us
    with pytest.raises(CosimInputError, match=r"stragglers\.gpu\.9: needs a rank in \[0, 8\)"):
        _synth(tmp_path, dgx, wide, stragglers={"gpu": {9: 2.0}}, **kw)


def test_cuda_graphs_launch_each_layer_once(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    eager = _synth(tmp_path, dgx, layout=dict(ep=4))
    graph = _synth(tmp_path, dgx, layout=dict(ep=4, cuda_graphs=True))
    e, g = eager.graph.ranks[0], graph.graph.ranks[0]
    assert len(e.gpu_ops) == len(g.gpu_ops)
    names = [g.strings[int(x)] for x in g.host_ops.name]
    # 1 micro-batch (8 sequences over dp 8) x (forward + backward) x (embedding, 2 layers, head): one graph each,
    # and each MoE layer's forward graph split in two at the dropless dispatcher's host sync
    assert names.count("cudaGraphLaunch") == 1 * 2 * 4 + 2
    assert names.count("cudaStreamSynchronize") == 2
    # eager: gradient reduce-scatters (dense over dp 8, experts over edp 2), grad-norm all-reduce, Adam, and the
    # two parameter all-gathers
    assert names.count("cudaLaunchKernel") == 6
    assert [e.strings[int(x)] for x in e.host_ops.name].count("cudaLaunchKernel") == len(e.gpu_ops)
    cfg = ReplayConfig(collectives="simulated")
    te = replay(eager.graph, dgx, cfg).summary()
    tg = replay(graph.graph, dgx, cfg).summary()
    assert te["breakdown"]["host_bound_gpu_idle"] > 0  # the tiny model is launch-bound eagerly
    assert tg["step_time_s"] < te["step_time_s"]


def test_sweeps_take_synthetic_keys_and_precision_whatif_is_refused() -> None:
    from cosim.scenario import load_scenario, run_scenario
    from cosim.sweep.runner import input_files_fingerprint
    from cosim.sweep.spec import check_key

    check_key("workload.synthetic.layout.ep", "4")
    check_key("nodes", "16")
    base = str(ROOT / "workloads/scenarios/qwen3-30b-ep8-dgx-h100.yaml")
    fp = input_files_fingerprint(base, {"workload.synthetic.layout.ep": "4"})
    assert fp["workload"]["synthetic"]["layout"]["ep"] == 4 and fp["workload"]["synthetic"]["model"] == "qwen3-30b-a3b"
    with pytest.raises(CosimInputError, match=r"set workload\.synthetic\.precision"):
        run_scenario(load_scenario(base), {"precision.experts": "fp8"})


def test_routing_from_a_capture_and_from_a_file(tmp_path: Path) -> None:
    import yaml

    cap = ROOT / "workloads/moe-ep4-cpu/capture.yaml"
    card = load_model_config("tiny-moe")
    doc = yaml.safe_load(cap.read_text())
    for layer in (0, 1):
        counts = np.asarray(doc["routing"]["layers"][layer]["tokens_per_expert"], dtype=float).sum(axis=0)
        got = expert_shares(RoutingSpec(model=str(cap)), card, layer)
        assert np.allclose(got, counts / counts.sum())  # measured shares (none above 1 / top_k here)
    f = tmp_path / "w.yaml"
    f.write_text("experts: [4, 1, 1, 1, 1, 0, 0, 0]\n")
    s = expert_shares(RoutingSpec(model=str(f)), card, 0)
    assert s.tolist() == pytest.approx([0.5, 0.125, 0.125, 0.125, 0.125, 0.0, 0.0, 0.0])
    f.write_text("experts: [6, 1, 1, 0, 0, 0, 0, 0]\n")  # 0.75 > 1 / top_k: capped, the excess spread by weight
    assert expert_shares(RoutingSpec(model=str(f)), card, 0).tolist() == pytest.approx([0.5, 0.25, 0.25] + [0.0] * 5)
    f.write_text("experts: [1, 2]\n")
    with pytest.raises(CosimInputError, match="2 expert weights for layer 0, but tiny-moe has 8 experts"):
        expert_shares(RoutingSpec(model=str(f)), card, 0)


def test_calibrate_from_a_measured_multi_rank_trace(tmp_path: Path) -> None:
    from cosim.models.predict import predict_features
    from cosim.models.synth_timing import KernelTimer, calibrated_profile
    from cosim.resources import shared_dir
    from cosim.topology import load_topology

    shared = shared_dir()
    trace = shared / "traces/param-dlrm-v100x8/kineto" if shared else None
    if trace is None or not trace.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 (8-rank DLRM on V100) is not present")
    topo = load_topology("dgx1-v100")
    prof = calibrated_profile(str(trace))
    assert prof.accelerator == "v100-sxm2-32gb" and prof.fit_errors["gemm"]["n"] > 100  # the 8 ranks' GEMMs
    a = _synth(tmp_path, topo, layout=dict(ep=4), calibrate_from=str(trace))
    b = _synth(tmp_path, topo, layout=dict(ep=8, pp=1), calibrate_from=str(trace), batch={"global": 8, "micro": 1,
                                                                                          "seq": 64})
    default = _synth(tmp_path, topo, layout=dict(ep=4))
    acc = topo.accelerator(topo.gpus[0])
    timer = KernelTimer(acc, prof)
    for syn in (a, b):  # every kernel of every layout timed by the fitted models
        rg = syn.graph.ranks[0]
        G = rg.gpu_ops
        j = int(np.flatnonzero([rg.strings[int(x)] == "attn.qkv" for x in G.name])[0])
        qkv = next(o for o in layer_ops(tiny(), 0, 64.0, 64.0) if o.name == "attn.qkv")
        assert G.dur[j] == pytest.approx(timer([qkv])[0])
    dd = default.graph.ranks[0].gpu_ops.dur
    assert not np.allclose(a.graph.ranks[0].gpu_ops.dur, dd)  # not the bundled profile's times
    with pytest.raises(CosimInputError, match="calibrate_from: nope: no such trace"):
        _synth(tmp_path, topo, calibrate_from="nope")
    assert predict_features  # the models the fit feeds (cosim.models.predict)


def test_fsdp_gathers_each_layer_and_reduce_scatters_its_gradients(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    syn = _synth(tmp_path, dgx, layout=dict(pp=2, ep=4, zero="fsdp"), fold=False)
    layer = 64 * 16 * (4 * 2 + 2 * 2) + 2 * 64 + 64 * 8  # dense parameters of one layer (experts: edp 1)
    for rg in syn.graph.ranks:
        C = rg.collectives
        got = Counter((CollType(int(C.type[c])).name, float(C.in_bytes[c])) for c in range(len(C))
                      if C.type[c] in (CollType.ALL_GATHER, CollType.REDUCE_SCATTER))
        edge = 256 * 64 + (64 if rg.rank >= 4 else 0)  # embedding (stage 0) or LM head + final norm (stage 1)
        want = Counter({
            # bf16 parameters gathered before each layer's forward and backward, 2 micro-batches (input: a shard)
            ("ALL_GATHER", layer * 2 / 4): 4, ("ALL_GATHER", edge * 2 / 4): 4,
            # bf16 gradients of each layer reduce-scattered once, after the last micro-batch's backward
            ("REDUCE_SCATTER", layer * 2.0): 1, ("REDUCE_SCATTER", edge * 2.0): 1,
            ("ALL_GATHER", 8 * 8.0): 2,  # the MoE layer's int64 token counts of 8 experts over EP, 2 micro-batches
        })
        assert got == want, (rg.rank, got)
    assert replay(syn.graph, dgx, ReplayConfig(collectives="simulated")).summary()["step_time_s"] > 0


def test_dualpipe_order_by_hand_and_its_overlap(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay
    from cosim.workload.synth.schedule import dualpipe_order

    F0, F1, W = ("F", 0), ("F", 1), ("W",)
    # rank 0 of 4, 8 micro-batches (deepseek-ai/DualPipe dualpipe.py, DualPipe.step, steps 1-8)
    assert dualpipe_order(0, 4, 8) == [F0, F0, F0, F1, ("B", 1, True), W, F1, ("FB", 0, 1), ("FB", 1, 0),
                                       ("B", 1, False), ("FB", 1, 0), ("B", 1, False), ("B", 0, True), W,
                                       ("B", 0, True), W]
    # rank 3 mirrors rank 0 with the directions swapped
    assert dualpipe_order(3, 4, 8) == [tuple(a[:1]) + tuple(1 - x if isinstance(x, int) and not isinstance(x, bool)
                                                            else x for x in a[1:]) for a in dualpipe_order(0, 4, 8)]
    with pytest.raises(CosimInputError, match="dualpipe needs"):
        dualpipe_order(0, 4, 6)
    wide = {**TINY, "hidden_size": 1024, "expert_ffn_size": 4096}
    kw = dict(batch={"global": 64, "micro": 4, "seq": 256})  # pp 2 x dp 4: 4 micro-batches per pipeline
    plain = _synth(tmp_path, dgx, wide, layout=dict(pp=2, ep=4), **kw)
    dual = _synth(tmp_path, dgx, wide, layout=dict(pp=2, ep=4, schedule="dualpipe"), **kw)
    # each rank holds one stage per direction: rank 0 the embedding + layer 0 and layer 1 + the head
    names = {dual.graph.ranks[0].strings[int(x)] for x in dual.graph.ranks[0].gpu_ops.name}
    assert {"embed.lookup", "head.lm_head"} <= names and not {"embed.lookup", "head.lm_head"} <= {
        plain.graph.ranks[0].strings[int(x)] for x in plain.graph.ranks[0].gpu_ops.name}
    assert dual.memory[0].weights > plain.memory[0].weights  # two stages' parameters per rank
    cfg = ReplayConfig(collectives="simulated")
    p, d = replay(plain.graph, dgx, cfg).summary(), replay(dual.graph, dgx, cfg).summary()
    assert d["breakdown"]["exposed_communication"] < p["breakdown"]["exposed_communication"]
    with pytest.raises(CosimInputError, match=r"layout\.schedule: dualpipe needs vpp 1 and an even pp"):
        ParallelLayout(pp=2, vpp=2, schedule="dualpipe").resolve(tiny(num_layers=4), 8)


def test_synthesis_and_its_replay_are_deterministic(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    kw = dict(layout=dict(pp=2, ep=4), routing="zipf:1.1", stragglers={"launch_jitter": {1: "2 us"}})
    a, b = _synth(tmp_path, dgx, **kw), _synth(tmp_path, dgx, **kw)
    for ra, rb in zip(a.graph.ranks, b.graph.ranks):
        for t in ("host_ops", "gpu_ops", "collectives", "edges"):
            ca, cb = getattr(ra, t).columns(), getattr(rb, t).columns()
            assert all(np.array_equal(ca[k], cb[k], equal_nan=True) for k in ca), t
    cfg = ReplayConfig(collectives="simulated")
    assert replay(a.graph, dgx, cfg).summary()["step_time_s"] == replay(b.graph, dgx, cfg).summary()["step_time_s"]


def test_sliding_window_attention_flops_and_tiles_by_hand() -> None:
    from cosim.models.synth_timing import KernelTimer
    from cosim.topology import load_topology
    from cosim.workload.synth.build import _model_flops_per_token
    from cosim.workload.synth.costs import window_pairs, window_tile_keys

    # a 128-key window over 4096 positions: the first 128 queries see 1..128 keys, the other 3968 see 128
    assert window_pairs(4096, 4096, 128) == 128 * 129 / 2 + (4096 - 128) * 128 == 516160
    assert window_pairs(64, 64, 64) == 64 * 65 / 2  # a window as long as the sequence: plain causal
    assert window_pairs(1024, 4096, 128) == 1024 * 128  # the last 1024 queries (context parallel): all full windows
    # flash tiles of 128 keys: a query tile meets its own key tile and the one before
    assert window_tile_keys(128, 4096) == 256 and window_tile_keys(200, 4096) == 384 and window_tile_keys(128, 64) == 64
    # gpt-oss pattern: layer 0 slides (window 16 over sequences of 64), layer 1 is full; 2 sequences of 64
    c = tiny(sliding_window=16, sliding_window_pattern=2)
    assert [c.window(i) for i in range(4)] == [16, None, 16, None]
    assert tiny(sliding_window=16).window(1) == 16 and tiny().window(0) is None
    core = [next(o for o in layer_ops(c, ly, 128.0, 64.0) if o.name == "attn.core") for ly in (0, 1)]
    pairs = 16 * 17 / 2 + (64 - 16) * 16  # 904 of the causal 64 * 64 / 2 = 2048
    assert core[0].flops == 4 * 2 * 4 * 16 * pairs and core[1].flops == 4 * 2 * 4 * 64 * 64 * 16 / 2
    assert core[0].keys == 64 and core[1].keys == 0  # window_tile_keys(16, 64): the whole sequence (one tile)
    rest = layer_forward_flops(tiny(), 0, 128, 64) - core[1].flops
    assert layer_forward_flops(c, 0, 128, 64) == rest + core[0].flops
    assert layer_forward_flops(c, 1, 128, 64) == rest + core[1].flops
    assert _model_flops_per_token(c, 64) == pytest.approx((2 * rest + core[0].flops + core[1].flops) / 128
                                                          + 2 * 256 * 64)
    # the kernel model times gpt-oss's sliding layers (window 128, seq 4096) by 256 key rows per query, not the
    # causal 2048: several times faster than its full layers
    oss = load_model_config("gpt-oss-120b")
    topo = load_topology("dgx-h100")
    timer = KernelTimer(topo.accelerator(topo.gpus[0]))
    slide, full = (next(o for o in layer_ops(oss, ly, 4096.0, 4096.0) if o.name == "attn.core") for ly in (0, 1))
    t_slide, t_full = timer([slide])[0], timer([full])[0]
    assert slide.keys == 256 and full.keys == 0 and 0 < t_slide < t_full / 3


def test_grouped_gemm_launches_one_gemm_per_local_expert(tmp_path: Path, dgx: object) -> None:
    from cosim.workload.synth.costs import Shard, backward_ops

    c = tiny()
    ops = layer_ops(c, 0, 256.0, 256.0, Shard(ep=4))
    moe = [o for o in ops if o.name.startswith("moe.")]
    # one MoE layer forward at bf16, EP4 (2 local experts): norm, router GEMM, top-k; the aux loss (scores, top-k
    # mask, counts, probability sum, mul, sum, scale, two logging ops); the dispatcher's counts (tokens per expert,
    # cast, input splits, their all-gather, local slice, output splits, TP splits, local counts, 4 host copies);
    # permute, dispatch and probabilities all-to-alls, chunk sort, fc1, SwiGLU, fc2, unsort, combine, unpermute,
    # residual: 35 ops, 37 kernel launches (fc1 and fc2 launch one GEMM per local expert)
    assert len(moe) == 35 and sum(o.launches for o in moe) == 37
    bwd = [o for o in backward_ops(ops) if o.name.startswith("moe.")]
    # backward: the 19 ops with a gradient (16 bookkeeping ops have none: top-k mask, counts, 2 logging ops and
    # the dispatcher's 12), the 3 GEMMs split into dgrad and wgrad: 22 ops, fc1's and fc2's 4 launching 2 GEMMs
    assert len(bwd) == 35 - 16 + 3 and sum(o.launches for o in bwd) == 22 + 4
    assert {o.launches for o in layer_ops(c, 0, 256.0, 256.0, Shard(ep=8)) if o.cls == "grouped_gemm"} == {1}
    # inference: the model's math only, one launch per grouped GEMM
    assert {o.launches for o in layer_ops(c, 0, 256.0, 256.0, Shard(ep=4, decode=True, q_len=1.0))
            if o.cls == "grouped_gemm"} == {1}

    # the host pays each expert GEMM beyond the first expert_gemm_host on top of the launch and dispatch
    # (the wgrad's per-parameter hooks left out here: test_backward_pays_one_host_step_per_parameter_it_completes)
    syn = _synth(tmp_path, dgx, dispatch_overhead="10 us", expert_gemm_host="30 us", eager_step_host="0 us")
    rg = syn.graph.ranks[0]
    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    cost = launch_costs(rg)
    for n in ("moe.experts_fc1", "moe.experts_fc2.dgrad", "moe.experts_fc1.wgrad"):
        assert cost[n] == pytest.approx(launch + 10e-6 + 30e-6, rel=1e-9)
    assert cost["moe.experts_swiglu"] == pytest.approx(launch + 10e-6, rel=1e-9)


def test_quantize_launches_one_cast_per_local_expert(tmp_path: Path, dgx: object) -> None:
    from cosim.workload.synth.costs import PRECISIONS, Shard, backward_ops

    c = tiny()  # 8 experts: EP4 leaves 2 local experts

    def loops(precision: str, shard: Shard) -> dict[str, int]:
        ops = layer_ops(c, 0, 256.0, 256.0, shard, precision)
        return {o.name: o.loop_launches for o in ops + backward_ops(ops) if o.name.endswith(("quantize", ".bwd"))
                and "quantize" in o.name}

    # MXFP8 / blockwise: split_quantize casts each local expert's rows with one kernel (2 kernels: 1 beyond the op's
    # own); a dense GEMM input is one cast; the grad outputs' casts (the quantize ops' backward) likewise
    for prec in ("mxfp8", "fp8"):
        got = loops(prec, Shard(ep=4))
        assert got["moe.experts_input.quantize"] == got["moe.experts_act.quantize"] == 1
        assert got["moe.experts_input.quantize.bwd"] == got["moe.experts_act.quantize.bwd"] == 1
        assert got["attn.input.quantize"] == got["attn.o_input.quantize"] == 0
    # per-tensor current scaling: zero amax, amax, scale, cast = 4 kernels per tensor: 2 experts -> 8 (7 beyond the
    # op's own), a dense cast 4 (3 beyond)
    got = loops("fp8-cs", Shard(ep=4))
    assert PRECISIONS["fp8-cs"].gemm == "fp8" and PRECISIONS["fp8-cs"].quant_kernels == 4
    assert got["moe.experts_input.quantize"] == got["moe.experts_act.quantize.bwd"] == 7
    assert got["attn.input.quantize"] == 3
    # split_quantize's outputs: per-tensor current scaling allocates each local expert's tensor on its own (one more
    # than the op's own: 1 eager step); MXFP8 and blockwise allocate in bulk (none); a dense cast has one output
    outs = {prec: {o.name: o.outputs for o in (lambda f: f + backward_ops(f))(layer_ops(c, 0, 256.0, 256.0,
                                                                                          Shard(ep=4), prec))
                   if o.outputs} for prec in ("fp8-cs", "mxfp8", "fp8")}
    assert outs["fp8-cs"] == {"moe.experts_input.quantize": 1, "moe.experts_act.quantize": 1,
                              "moe.experts_act.quantize.bwd": 1, "moe.experts_input.quantize.bwd": 1}
    assert outs["mxfp8"] == outs["fp8"] == {}
    # current scaling reads the BF16 input twice (the amax kernel, then the cast): one more 2-byte pass per element
    cs = {o.name: o.bytes for o in layer_ops(c, 0, 256.0, 256.0, Shard(ep=4), "fp8-cs")}
    bw = {o.name: o.bytes for o in layer_ops(c, 0, 256.0, 256.0, Shard(ep=4), "fp8")}
    assert cs["attn.input.quantize"] - bw["attn.input.quantize"] == pytest.approx(256 * 64 * 2.0)
    # inference (no TE GroupedLinear loop) and bf16 (no casts)
    assert loops("mxfp8", Shard(ep=4, decode=True, q_len=1.0))["moe.experts_input.quantize"] == 0
    assert loops("bf16", Shard(ep=4)) == {}

    # the host pays each looped kernel its CUDA launch call only (no Python / dispatcher cost)
    syn = _synth(tmp_path, dgx, precision="fp8", fp8_recipe="current", dispatch_overhead="10 us")
    rg = syn.graph.ranks[0]
    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    cost = launch_costs(rg)
    # (the per-split allocation: one eager step, here dispatch_overhead)
    assert cost["moe.experts_input.quantize"] == pytest.approx(launch + 10e-6 + 7 * launch + 10e-6, rel=1e-9)
    assert cost["attn.input.quantize"] == pytest.approx(launch + 10e-6 + 3 * launch, rel=1e-9)
    blockwise = _synth(tmp_path, dgx, precision="fp8", dispatch_overhead="10 us").graph.ranks[0]
    assert len(blockwise.gpu_ops) == len(rg.gpu_ops)  # the same kernels, cheaper launches
    assert float(blockwise.host_ops.dur.sum()) < float(rg.host_ops.dur.sum())


def test_backward_pays_one_host_step_per_parameter_it_completes(tmp_path: Path, dgx: object) -> None:
    from cosim.workload.synth.costs import Shard, backward_ops

    # one MoE layer backward at EP4 (2 local experts): every parameter tensor of the layer is completed by exactly
    # one backward op: the attention norm, qkv and o_proj weights, the MoE norm and router weights, and one fc1
    # and one fc2 weight per local expert (TE GroupedLinear's weight0, weight1): 9 autograd AccumulateGrad nodes
    # and Megatron DDP hooks; attention, activations, casts, collectives and bookkeeping complete none
    c = tiny()
    bwd = backward_ops(layer_ops(c, 0, 256.0, 256.0, Shard(ep=4), "mxfp8"))
    got = {o.name: o.params for o in bwd if o.params}
    assert got == {"attn.norm.bwd": 1, "attn.qkv.wgrad": 1, "attn.o_proj.wgrad": 1, "moe.norm.bwd": 1,
                   "moe.router.wgrad": 1, "moe.experts_fc1.wgrad": 2, "moe.experts_fc2.wgrad": 2}
    # 8 experts at EP1: 8 weights per grouped GEMM's wgrad, none in the forward
    ops8 = layer_ops(c, 0, 256.0, 256.0, Shard(ep=1))
    assert {o.name: o.params for o in backward_ops(ops8) if o.cls == "grouped_gemm" and o.params} == {
        "moe.experts_fc2.wgrad": 8, "moe.experts_fc1.wgrad": 8}
    assert all(o.params == 0 for o in ops8)
    # biased linears (card linear_bias, gpt-oss): each bias is a parameter of its own; qkv's and fc1's ride in
    # their GEMM epilogues (wgrad completes weight and bias: 2, and 2 per local expert), o_proj's and each expert's
    # fc2 bias are eager adds whose backward completes them (1 each): 9 + 1 + 2 + 1 + 2 = 15 parameters
    bb = backward_ops(layer_ops(tiny(linear_bias=True), 0, 256.0, 256.0, Shard(ep=4), "bf16"))
    got_b = {o.name: o.params for o in bb if o.params}
    assert got_b == {**got, "attn.qkv.wgrad": 2, "moe.experts_fc1.wgrad": 4, "attn.o_bias.bwd": 1,
                     "moe.experts_fc2_bias_scale.0.bwd": 1, "moe.experts_fc2_bias_scale.1.bwd": 1}
    assert sum(got_b.values()) == 15

    # the host pays eager_step_host per parameter on the launch of the op that completes it; the default is one
    # eager framework step (dispatch_overhead); "0 us" leaves the hooks out
    def costs(**kw: object) -> dict[str, float]:
        rg = _synth(tmp_path, dgx, dispatch_overhead="10 us", expert_gemm_host="30 us", **kw).graph.ranks[0]
        return launch_costs(rg)

    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    cost = costs(eager_step_host="7 us")
    assert cost["moe.experts_fc1.wgrad"] == pytest.approx(launch + 10e-6 + 30e-6 + 2 * 7e-6, rel=1e-9)
    assert cost["attn.qkv.wgrad"] == pytest.approx(launch + 10e-6 + 7e-6, rel=1e-9)
    assert cost["attn.qkv.dgrad"] == pytest.approx(launch + 10e-6, rel=1e-9)
    assert costs()["moe.router.wgrad"] == pytest.approx(launch + 10e-6 + 10e-6, rel=1e-9)
    assert costs(eager_step_host="0 us")["moe.experts_fc2.wgrad"] == pytest.approx(launch + 10e-6 + 30e-6, rel=1e-9)


def test_a_collective_call_costs_the_host_its_measured_time(tmp_path: Path, dgx: object) -> None:
    # every collective of a training step is a torch.distributed call (or DeepEP's Python API): its host launch costs
    # the CUDA launch call plus collective_host instead of an eager op's dispatch_overhead
    def costs(**kw: object) -> dict[str, float]:
        rg = _synth(tmp_path, dgx, dispatch_overhead="10 us", fold=False, collective_host_per_peer="0 us",
                    **kw).graph.ranks[0]  # the per-peer term: tests/test_round8_mech.py
        return launch_costs(rg)

    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    cost = costs(collective_host="50 us")
    for n in ("moe.dispatch", "moe.combine.bwd", "moe.counts_all_gather", "pp.send_fwd"):
        if n in cost:
            assert cost[n] == pytest.approx(launch + 50e-6, rel=1e-9), n
    assert cost["moe.dispatch"] == pytest.approx(launch + 50e-6, rel=1e-9)
    assert cost["moe.permute"] == pytest.approx(launch + 10e-6, rel=1e-9)  # a kernel: the eager dispatch only
    assert costs(collective_host=None)["moe.dispatch"] == pytest.approx(launch + 10e-6, rel=1e-9)


def test_collective_host_figure_is_the_measured_c10d_alltoall_and_the_default() -> None:
    from cosim.resources import shared_dir
    from validation.e2e.host_cost import C10D_FOLDER, alltoall_call_s

    root = shared_dir()
    folder = None if root is None else Path(root) / "traces" / C10D_FOLDER
    if folder is None or not folder.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not available")
    calls, median = alltoall_call_s(folder)
    assert calls == 40 and median == pytest.approx(83.0e-6, abs=0.05e-6)
    # the default (the median over every shared 2-8-rank job's calls, tests/test_c10d_host.py) is within 10 us of
    # this median less the DGX-1 host's launch call (cpus.yaml xeon-e5-2698v4: 5 us)
    from cosim.workload.synth.spec import C10D_CALL_HOST

    assert abs(C10D_CALL_HOST - (median - 5e-6)) < 10e-6
    assert SyntheticSpec.model_fields["collective_host"].default == C10D_CALL_HOST


def test_grace_host_launches_at_its_measured_speed(tmp_path: Path) -> None:
    from cosim.topology import load_topology

    # a GB200 tray's Grace runs eager framework work 2.75x slower than a DGX H100 Xeon (TE issue #2053,
    # cpus.yaml host_time_factor): each launch's call and dispatch cost 2.75x; a grouped GEMM's measured extra
    # expert launches (expert_gemm_host) are kept
    nvl = load_topology("gb200-nvl72")
    cpu = nvl.cpu_spec(nvl.cpu_of(nvl.gpus[0]))
    assert float(cpu.host_time_factor) == 2.75
    syn = _synth(tmp_path, nvl, batch={"global": 72, "micro": 1, "seq": 64}, dispatch_overhead="10 us",
                 expert_gemm_host="30 us")
    rg = syn.graph.ranks[0]  # type: ignore[attr-defined]
    cost = launch_costs(rg)
    per = 2.75 * (float(cpu.launch_overhead) + 10e-6)
    assert cost["moe.experts_swiglu"] == pytest.approx(per, rel=1e-9)
    assert cost["moe.experts_fc1"] == pytest.approx(per + 30e-6, rel=1e-9)  # 2 local experts: one extra GEMM


def test_training_dispatches_bf16_tokens_unless_asked(tmp_path: Path, dgx: object) -> None:
    # Megatron-Core dispatches the bf16 hidden states whatever the GEMM precision (MEGATRON_DISPATCH_SOURCE): at
    # fp8 the dispatch all-to-all of 64 tokens x top-2 rows of d 64 is 64 * 2 * 64 * 2 = 16384 bytes, as at bf16;
    # dispatch_precision fp8 (DeepSeek-V3's own) sends 1 byte + one fp32 scale per 128 channels: 8448 bytes
    from cosim.workload.synth.spec import MEGATRON_DISPATCH_SOURCE

    assert "fp8_dispatch = False" in MEGATRON_DISPATCH_SOURCE

    def a2a(**kw: object) -> Counter:
        rg = _synth(tmp_path, dgx, **kw).graph.ranks[0]  # type: ignore[attr-defined]
        C = rg.collectives
        return Counter(float(C.in_bytes[c]) for c in range(len(C)) if CollType(int(C.type[c])).name == "ALL_TO_ALL"
                       and float(C.in_bytes[c]) > 64 * 2 * 8)  # leave out the probabilities' all-to-all
    bf16 = a2a()
    assert bf16 == a2a(precision="fp8") == Counter({16384.0: 2 * 4})
    assert a2a(precision="fp8", dispatch_precision="fp8") == Counter({16384.0: 2 * 2, 64 * 2 * 64 * (1 + 4 / 128): 2 * 2})


def test_selective_recompute_reruns_the_named_modules(tmp_path: Path, dgx: object) -> None:
    from cosim.workload.synth.costs import Shard, recomputed, selective_saved

    def names(syn: object) -> list[str]:
        rg = syn.graph.ranks[0]  # type: ignore[attr-defined]
        return [rg.strings[int(x)] for x in rg.gpu_ops.name]

    # rank 0 = stage 0 of pp 2 (layer 0), 2 micro-batches per pipeline (global 8 over dp 4)
    none = names(_synth(tmp_path, dgx))
    attn = names(_synth(tmp_path, dgx, layout=dict(pp=2, ep=4, recompute="selective")))  # Megatron's default
    both = names(_synth(tmp_path, dgx, layout=dict(pp=2, ep=4, recompute="selective",
                                                   recompute_modules=["core_attn", "moe_act"])))
    rec = [n for n in both if n.endswith(".recompute")]
    assert not [n for n in none if n.endswith(".recompute")]
    assert [n for n in attn if n.endswith(".recompute")] == ["attn.core.recompute"] * 2
    assert Counter(rec) == {"attn.core.recompute": 2, "moe.experts_swiglu.recompute": 2}  # bf16: no act cast
    assert len(both) == len(none) + 4
    # each recomputed op is re-run before its layer's backward, with the forward's duration
    syn = _synth(tmp_path, dgx, layout=dict(pp=2, ep=4, recompute="selective"))
    rg = syn.graph.ranks[0]
    n = names(syn)
    dur = {nm: float(rg.gpu_ops.dur[i]) for i, nm in enumerate(n)}
    assert dur["attn.core.recompute"] == dur["attn.core"] > 0
    assert n.index("attn.core") < n.index("attn.core.recompute") < n.index("attn.core.bwd")
    # memory: a run of recomputed ops keeps only its first op's input
    ops = layer_ops(tiny(), 0, 64.0, 64.0, Shard(ep=4))
    assert recomputed("moe.experts_swiglu", ["moe_act"]) and not recomputed("moe.experts_fc2", ["moe_act"])
    swiglu = next(o for o in ops if o.name == "moe.experts_swiglu")
    assert selective_saved(ops, ["moe_act"]) == sum(o.saved for o in ops)  # one op: its input stays
    moe = [o for o in ops if recomputed(o.name, ["moe"])]
    assert selective_saved(ops, ["moe"]) == pytest.approx(sum(o.saved for o in ops) - sum(o.saved for o in moe[1:]))
    assert swiglu.saved > 0


def _pair_order(tmp_path: Path, dgx: object, delay: bool) -> tuple[list[str], object, float]:
    """The GPU ops of rank 0's first overlapped pair (forward of micro-batch 1, backward of micro-batch 0), and
    how long after the experts' last wgrad ended the first pair's dispatch backward started in a replay."""
    from cosim.replay import ReplayConfig, replay

    # TINY's layers at 2048 wide and 4096 tokens, so that kernels outlast their launches
    card = {**TINY, "hidden_size": 2048, "head_dim": 128, "expert_ffn_size": 1024}
    syn = _synth(tmp_path, dgx, card=card, layout=dict(ep=4, a2a_overlap=True, delay_wgrad=delay),
                 batch={"global": 24, "micro": 1, "seq": 4096})
    rg = syn.graph.ranks[0]
    assert syn.built.microbatches == 3
    assert [k for k, _ in syn.built.unit_keys[rg.rank]] == [
        (("F", 0, 0),), (("F", 1, 0), ("B", 0, 0)), (("F", 2, 0), ("B", 1, 0)), (("B", 2, 0),)]
    lo, hi, _ = syn.built.unit_spans[rg.rank][1]
    names = [rg.strings[int(rg.gpu_ops.name[j])] for j in range(lo, hi + 1)]
    run = replay(syn.graph, dgx, ReplayConfig(collectives="simulated")).runs[0]
    first = {}
    for j in range(lo, hi + 1):
        first.setdefault(rg.strings[int(rg.gpu_ops.name[j])], j)
    gap = float(run.gpu_start[first["moe.dispatch_probs.bwd"]] - run.gpu_end[first["moe.experts_fc1.wgrad"]])
    return names, rg, gap


def test_a2a_overlap_runs_megatrons_combined_1f1b_layer_order(tmp_path: Path, dgx: object) -> None:
    # Megatron-Core TransformerLayerSchedulePlan.run, forward layer i with backward layer n-1-i:
    #   comm:    combine_bwd | dispatch_fwd -> dispatch_bwd | combine_fwd
    #   compute: pre_dispatch_fwd | mlp_bwd -> mlp_bwd_dw -> mlp_fwd | pre_dispatch_bwd (-> its dw)
    # 2 layers, EP4 inside one node, 3 micro-batches, no pipeline: F0, F1+B0, F2+B1, B2
    keep = {"moe.combine.bwd", "attn.core", "moe.experts_fc1.dgrad", "moe.dispatch", "moe.experts_fc1.wgrad",
            "moe.dispatch.bwd", "moe.experts_fc1", "moe.combine", "attn.core.bwd", "attn.qkv.wgrad"}
    names, rg, gap = _pair_order(tmp_path, dgx, delay=True)
    assert gap < 0  # the dispatch backward starts while the experts' wgrad still runs
    got = [n for n in names if n in keep]
    one = ["moe.combine.bwd", "attn.core", "moe.experts_fc1.dgrad", "moe.dispatch", "moe.experts_fc1.wgrad",
           "moe.dispatch.bwd", "moe.experts_fc1", "moe.combine", "attn.core.bwd"]
    # delay_wgrad_compute: the attention wgrad of backward layer 1 runs after layer 0's combine backward is
    # issued; the last one (backward layer 0) at the end of the pair
    assert got == one + one[:1] + ["attn.qkv.wgrad"] + one[1:] + ["attn.qkv.wgrad"]
    # one communication stream for both micro-batches; the dispatch backward waits for the experts' data
    # gradients (their last op, sort_chunks.bwd), not for their wgrad, which runs beside it
    G, E = rg.gpu_ops, rg.edges
    idx = {rg.strings[int(G.name[j])]: j for j in range(len(G))}  # the last of each name
    streams = {int(G.stream[j]) for j in range(len(G)) if G.collective[j] >= 0 and rg.strings[int(G.name[j])]
               .startswith("moe.")}
    assert len(streams) == 1
    nh = len(rg.host_ops)  # edges number host ops first, then GPU ops
    d_bwd = idx["moe.dispatch_probs.bwd"] + nh
    waits = {int(E.src[e]) - nh for e in range(len(E)) if int(E.dst[e]) == d_bwd and int(E.kind[e]) == 3}
    assert {rg.strings[int(G.name[w])] for w in waits} == {"moe.sort_chunks.bwd"}
    # without delay_wgrad_compute each wgrad follows its dgrad inside the experts' (and attention's) backward
    names, _, gap = _pair_order(tmp_path, dgx, delay=False)
    assert gap >= 0  # the dispatch backward waits for the wgrad
    got = [n for n in names if n in keep]
    one = ["moe.combine.bwd", "attn.core", "moe.experts_fc1.dgrad", "moe.experts_fc1.wgrad", "moe.dispatch",
           "moe.dispatch.bwd", "moe.experts_fc1", "moe.combine", "attn.core.bwd", "attn.qkv.wgrad"]
    assert got == one + one


def test_combined_1f1b_hides_all_to_all_with_and_without_delayed_wgrad() -> None:
    from cosim.replay import ReplayConfig, replay
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, None, None, 2)

    def run(overlap: bool, delay: bool) -> dict:
        # collective_host null: the c10d host time would make this small step host-bound (the overlap is what is
        # checked here, on a communication-bound step)
        spec = SyntheticSpec.model_validate({"model": "qwen3-moe-mini", "batch": {"global": 64, "micro": 1, "seq": 4096},
                                             "layout": {"ep": 16, "a2a_overlap": overlap, "delay_wgrad": delay},
                                             "collective_host": None})
        return replay(synthesize(spec, topo, kernel_timer=synthetic_kernel_timer).graph, topo,
                      ReplayConfig(collectives="simulated", comm_share=False)).summary()  # same kernels, same speed

    plain, paired, delayed = run(False, False), run(True, False), run(True, True)
    # the same kernels; EP16 over two nodes is communication-bound (20 ms of exposed all-to-all, 9 ms of
    # compute): the combined 1F1B hides part of the all-to-alls under the other micro-batch's compute, at most
    # all of the compute. Deferring the weight gradients only moves compute within the pair (here within 1 ms).
    for s in (paired, delayed):
        assert s["breakdown"]["compute"] == pytest.approx(plain["breakdown"]["compute"], rel=1e-9)
        hidden = plain["breakdown"]["exposed_communication"] - s["breakdown"]["exposed_communication"]
        assert s["breakdown"]["compute"] / 3 < hidden <= s["breakdown"]["compute"]
        assert s["step_time_s"] < plain["step_time_s"]
    assert delayed["step_time_s"] == pytest.approx(paired["step_time_s"], abs=1e-3)


def test_quantized_grouped_mlp_pads_expert_rows_by_copies(tmp_path: Path, dgx: object) -> None:
    from cosim.workload.synth.costs import Shard, backward_ops

    # one MoE layer at EP4 (2 local experts), 256 tokens top-2: each local expert gets 256 x 2 x 4 / 8 = 256 rows,
    # 512 in all, d 64. Megatron-Core's TEGroupedMLP copies them into a buffer whose expert blocks start at multiples
    # of 32 (MXFP8) with the mean padding of a random count, 31 / 2 rows per expert: 512 + 31 = 543 rows; one read of
    # 512 rows and one write of 543 in bf16: (512 + 543) x 64 x 2 = 135040 bytes; the probabilities in fp32:
    # (512 + 543) x 4 = 4220; fc2's output is copied back (the same bytes)
    ops = layer_ops(tiny(), 0, 256.0, 256.0, Shard(ep=4), "mxfp8")
    names = [o.name for o in ops]
    i = names.index("moe.experts_pad")
    assert names[i - 1:i + 3] == ["moe.sort_chunks", "moe.experts_pad", "moe.experts_probs_pad",
                                  "moe.experts_input.quantize"]
    assert names[names.index("moe.experts_fc2") + 1:names.index("moe.experts_fc2") + 3] == [
        "moe.experts_unpad", "moe.unsort_chunks"]
    got = {o.name: o.bytes for o in ops if o.copy}
    assert got == {"moe.experts_pad": 135040.0, "moe.experts_probs_pad": 4220.0, "moe.experts_unpad": 135040.0}
    # the backward of a copy is the inverse copy of the gradient: the same bytes, in reverse order, no FLOPs
    bwd = [o for o in backward_ops(ops) if o.copy]
    assert [(o.name, o.bytes, o.flops) for o in bwd] == [
        ("moe.experts_unpad.bwd", 135040.0, 0.0), ("moe.experts_probs_pad.bwd", 4220.0, 0.0),
        ("moe.experts_pad.bwd", 135040.0, 0.0)]
    # FP8 aligns to 16 rows: 512 + 15 = 527; bf16 GEMMs need no alignment; a dispatcher that delivers aligned rows
    # (HybridEP) has none either
    fp8 = {o.name: o.bytes for o in layer_ops(tiny(), 0, 256.0, 256.0, Shard(ep=4), "fp8") if o.copy}
    assert fp8["moe.experts_pad"] == (512 + 527) * 64 * 2
    assert not [o for o in layer_ops(tiny(), 0, 256.0, 256.0, Shard(ep=4), "bf16") if o.copy]
    assert not [o for o in layer_ops(tiny(), 0, 256.0, 256.0, Shard(ep=4, expert_padding=False), "mxfp8") if o.copy]
    assert not [o for o in layer_ops(tiny(), 0, 256.0, 256.0, Shard(ep=4, dispatcher="hybridep"), "mxfp8")
                if o.copy and "pad" in o.name]
    # in a synthesized step each copy is one eager launch, forward and backward; spec expert_padding: false drops them
    def count(**kw: object) -> Counter[str]:
        rg = _synth(tmp_path, dgx, precision="fp8", **kw).graph.ranks[0]
        return Counter(n for n in (rg.strings[int(x)] for x in rg.gpu_ops.name) if "pad" in n)

    # pp 2 on 8 GPUs: dp 4, global 8 -> 2 micro-batches per pipeline; rank 0's stage holds one of the 2 layers
    names6 = ("moe.experts_pad", "moe.experts_probs_pad", "moe.experts_unpad", "moe.experts_pad.bwd",
              "moe.experts_probs_pad.bwd", "moe.experts_unpad.bwd")
    assert count() == Counter({n: 2 for n in names6})
    assert count(expert_padding=False) == Counter()


def test_hybridep_dispatch_bytes_and_calls_per_layer_by_hand(tmp_path: Path, dgx: object) -> None:
    """``dispatch: hybridep`` (Megatron-Core's flex dispatcher with HybridEP; costs.HYBRIDEP_DISPATCH_SOURCE). The
    tiny card (hidden 64, 8 experts, top-2) at EP4, 64 tokens per micro-batch, one MoE layer per stage, 2
    micro-batches; rank 0. Per layer and micro-batch, forward: the bool routing map [64, 8] all-gathered over EP
    (512 bytes in), one host sync after HybridEP's preprocessing, the dispatch (probabilities travel) and the
    combine; backward: the dispatch's transpose carries the probabilities' gradients, the combine's does not.
    None of the alltoall dispatcher's calls (counts all-gather, probabilities all-to-all, NCCL all-to-alls)."""
    from cosim.workload.synth.costs import Shard, hybridep_dispatch_ops, hybridep_rows_received

    syn = _synth(tmp_path, dgx, dispatch="hybridep", dispatch_overhead="10 us", collective_host="78 us")
    rg = syn.graph.ranks[0]
    names = [rg.strings[int(x)] for x in rg.collectives.name]
    got = Counter(names)
    # label: hybridep_<kind>:<tokens>:<hidden>:<probabilities 0|1>:<topk>:<experts>:<SMs>
    assert got["hybridep_dispatch:64:64:1:2:8:16"] == got["hybridep_combine:64:64:0:2:8:16"] == 2  # forward
    assert got["hybridep_combine:64:64:1:2:8:16"] == got["hybridep_dispatch:64:64:0:2:8:16"] == 2  # backward
    assert not any(n.startswith("all_to_all") for n in names)
    gathers = [float(b) for n, b in zip(names, rg.collectives.in_bytes) if n == "all_gather"]
    assert gathers[1:] == [64 * 8, 64 * 8] and len(gathers) == 3  # after the ZeRO-1 parameter all-gather (ahead)
    hn = [rg.strings[int(x)] for x in rg.host_ops.name]
    assert hn.count("cudaStreamSynchronize") == 2  # one per forward layer: permute preprocessing's count
    # host: the routing map's all-gather is the one c10d call (launch 4.6 us + 78 us); each HybridEP call is one
    # framework call (4.6 + 10 us) for its first kernel, the others launched from C++ (the launch call only)
    cost = launch_costs(rg)
    assert cost["moe.hybridep_routing_all_gather"] == pytest.approx(82.6e-6)
    for first in ("moe.hybridep_unpermute", "moe.combine.bwd", "moe.hybridep_permute.bwd"):
        assert cost[first] == pytest.approx(14.6e-6), first
    for cpp in ("moe.hybridep_preprocess", "moe.hybridep_permute_preprocess", "moe.dispatch", "moe.hybridep_permute",
                "moe.combine", "moe.dispatch.bwd", "moe.hybridep_unpermute.bwd"):
        assert cost[cpp] == pytest.approx(4.6e-6), cpp
    # bytes: each of 64 tokens goes once to each of the 4 ranks holding one of its 2 experts,
    # p = 1 - C(6, 2) / C(8, 2); 4 x 64 x p rows arrive; the permute reads them (BF16 + 8 fp32 probabilities)
    # and writes 128 rows of one (token, local expert) each (+ its fp32 probability); the unpermute the reverse
    c = tiny()
    recv = 4 * 64 * (1 - comb(6, 2) / comb(8, 2))
    assert hybridep_rows_received(c, 64.0, 4) == pytest.approx(recv)
    pre, post = hybridep_dispatch_ops(c, 64.0, 128.0, Shard(ep=4, dispatcher="hybridep"))
    by = {o.name: o.bytes for o in pre + post}
    assert by["moe.hybridep_permute"] == pytest.approx(recv * (128 + 32) + 128 * (128 + 4))
    assert by["moe.hybridep_unpermute"] == pytest.approx(128 * 128 + recv * 128)
    assert by["moe.hybridep_routing_all_gather"] == 64 * 8 * 4


def test_partial_cuda_graphs_launch_each_scope_once(tmp_path: Path, dgx: object) -> None:
    """``cuda_graph_scope: [attn, moe_router, moe_preprocess]`` (Transformer Engine graphs, costs.CUDA_GRAPH_SOURCE)
    on the tiny card at EP4, alltoall dispatcher, one layer per stage, 2 micro-batches: per layer and micro-batch
    one forward graph of 27 kernels (attention 6, pre-MLP norm and router 3, load-balancing loss 9, the
    dispatcher's preprocess 8 and the permutation) and one backward graph of their 18 backward kernels; the
    token counts' 4 host copies follow the graph (dtoh point before_ep_alltoall) and the host waits for the last
    one; the all-to-alls, experts and combine stay eager. Host time falls by the launches the graphs replace."""
    def run(**kw: object) -> tuple[Any, list[str], list[str]]:
        rg = _synth(tmp_path, dgx, dispatch_overhead="10 us", **kw).graph.ranks[0]
        hn = [rg.strings[int(x)] for x in rg.host_ops.name]
        return rg, hn, [rg.strings[int(x)] for x in rg.gpu_ops.name]

    rg0, hn0, _ = run()
    rg, hn, gn = run(cuda_graph_scope=["attn", "moe_router", "moe_preprocess"])
    graphs = [i for i, n in enumerate(hn) if n == "cudaGraphLaunch"]
    per = [int((rg.launches.host_op == h).sum()) for h in graphs]
    assert per == [27, 27, 18, 18]
    first = [gn[int(np.flatnonzero(rg.launches.host_op == h)[0])] for h in graphs]
    assert first == ["attn.norm", "attn.norm", "moe.permute.bwd", "moe.permute.bwd"]
    # eager launches: 154 - 2 x 27 - 2 x 18 = 64
    assert hn0.count("cudaLaunchKernel") == 154 and hn.count("cudaLaunchKernel") == 64
    for s in [i for i, n in enumerate(hn) if n == "cudaStreamSynchronize"]:  # right after the 4th copy's launch
        j = int(np.flatnonzero(rg.launches.host_op == s - 1)[0])
        assert gn[j] == "moe.splits_d2h" and gn[j - 4] == "moe.permute"
    # host time saved: the 90 graphed kernels' eager launches (launch call 4.6 us + dispatch 10 us each; the counts
    # all-gather a c10d call, 4.6 + 73.5 us, twice) and the 5 parameter hooks of each backward graph (10 us each),
    # less 4 graph launches (10 us)
    launch = float(dgx.cpu_spec(dgx.cpu_of(dgx.gpus[0])).launch_overhead)
    from cosim.workload.synth.spec import C10D_CALL_HOST

    saved = 88 * (launch + 10e-6) + 2 * (launch + C10D_CALL_HOST) + 10 * 10e-6 - 4 * 10e-6
    assert float(rg0.host_ops.dur[1:].sum()) - float(rg.host_ops.dur[1:].sum()) == pytest.approx(saved, rel=1e-9)
    with pytest.raises(CosimInputError, match="moe_preprocess needs moe_router"):
        run(cuda_graph_scope=["moe_preprocess"])
    with pytest.raises(CosimInputError, match=r"partial CUDA graphs exclude layout\.cuda_graphs"):
        run(cuda_graph_scope=["attn"], layout=dict(pp=2, ep=4, cuda_graphs=True))
    for kw in (dict(dispatch="hybridep"), dict(cuda_graph_scope=["attn"])):  # Megatron-Core training fields
        with pytest.raises(CosimInputError, match="hybridep and cuda_graph_scope are training fields"):
            run(mode="decode", batch={"requests_per_gpu": 4, "context": 64}, **kw)


def test_grad_reduce_in_fp32_doubles_the_gradient_reduction_and_buffer(tmp_path: Path, dgx: object) -> None:
    # Megatron-Core's DDP default (and every Megatron-Bridge config) reduces bf16 gradients; Megatron-LM's launcher
    # keeps them in fp32 in bf16 training unless --grad-reduce-in-bf16: twice the bytes and twice the buffer
    def grads(syn: object) -> list[float]:
        C = syn.graph.ranks[0].collectives  # type: ignore[attr-defined]
        return sorted(float(C.in_bytes[c]) for c in range(len(C)) if C.type[c] == CollType.REDUCE_SCATTER)

    bf16 = _synth(tmp_path, dgx, fold=False)
    fp32 = _synth(tmp_path, dgx, fold=False, grad_reduce_in_fp32=True)
    assert grads(bf16) and grads(fp32) == [2 * b for b in grads(bf16)]
    assert fp32.memory[0].gradients == 2 * bf16.memory[0].gradients  # type: ignore[attr-defined]


def test_deepep_permutes_received_rows_once_and_sorts_nothing() -> None:
    """Megatron-Core's alltoall dispatcher permutes before its all-to-all and sorts the received rows by local expert
    (sort_chunks_by_idxs, and the inverse before the combine); the flex dispatcher with DeepEP sends tokens and
    permutes the received rows once (get_permuted_hidden_states_by_experts), unpermuting before its combine."""
    from cosim.workload.synth.costs import Shard

    c = tiny()  # 8 experts, top-2, h 64: ep 4 -> 2 local experts
    names = {d: [o.name for o in layer_ops(c, 1, 64.0, 64.0, Shard(ep=4, dispatcher=d)) if o.name.startswith("moe.")]
             for d in ("alltoall", "deepep")}
    a2a, dep = names["alltoall"], names["deepep"]
    assert a2a.index("moe.permute") < a2a.index("moe.dispatch") < a2a.index("moe.sort_chunks")
    assert "moe.sort_chunks" not in dep and "moe.unsort_chunks" not in dep and dep.count("moe.permute") == 1
    assert dep.index("moe.dispatch") < dep.index("moe.permute") < dep.index("moe.unpermute") < dep.index("moe.combine")
    ops = {o.name: o for o in layer_ops(c, 1, 64.0, 64.0, Shard(ep=4, dispatcher="deepep"))}
    assert ops["moe.permute"].bytes == 2 * 64 * 2 * 64 * 2  # the 128 received rows of 64 bf16, read and written
    # skew: this rank's 2 local experts got 100 + 60 rows (not its 64 tokens x top-2 = 128): DeepEP permutes and
    # unpermutes those 160 rows on the expert side; the alltoall dispatcher unpermutes its own 128 after the combine
    sk = {d: {o.name: o for o in layer_ops(c, 1, 64.0, 64.0, Shard(ep=4, dispatcher=d, expert_tokens=[100.0, 60.0]))}
          for d in ("alltoall", "deepep")}
    assert sk["deepep"]["moe.permute"].bytes == 2 * 160 * 64 * 2
    assert sk["deepep"]["moe.unpermute"].bytes == 2 * 160 * 64 * 2 + 160 * 4.0
    assert sk["alltoall"]["moe.unpermute"].bytes == 2 * 128 * 64 * 2 + 128 * 4.0


def test_deepep_host_sync_is_at_the_dispatch(tmp_path: Path, dgx: object) -> None:
    """DeepEP's normal-mode dispatch hands the received counts back as a host list, so the host blocks inside the
    dispatch call (for the counts' copies), before the dispatch kernel and before the flex dispatcher's permute:
    per forward layer one cudaStreamSynchronize, and the next launch after it is the dispatch."""
    rg = _synth(tmp_path, dgx, dispatch="deepep").graph.ranks[0]  # type: ignore[attr-defined]
    hn = [rg.strings[int(x)] for x in rg.host_ops.name]
    gn = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    syncs = [i for i, n in enumerate(hn) if n == "cudaStreamSynchronize"]
    assert len(syncs) == 2  # one forward layer per stage x 2 micro-batches
    launched = {int(h): gn[j] for j, h in enumerate(rg.launches.host_op)}
    for s in syncs:
        nxt = min(h for h in launched if h > s)
        assert launched[nxt] == "moe.dispatch"
        assert launched[max(h for h in launched if h < s)].startswith("moe.splits_d2h")
