"""TP communication overlap (Transformer Engine userbuffers, cosim/workload/synth/tpoverlap.py): the op-list
rewrite by hand, and the exposed TP time of a tiny tp2 / tp4 dense step by hand, overlapped and not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.workload.graph import OpClass
from cosim.workload.synth import SyntheticSpec, synthesize
from cosim.workload.synth.costs import PRECISIONS, Shard, backward_ops, layer_ops
from cosim.workload.synth.tpoverlap import overlap_ops

# a dense 2-layer model, d 1024, 8 heads of 128 (2 KV heads), SwiGLU FFN 4096
DENSE = dict(name="dense2", hidden_size=1024, num_layers=2, num_heads=8, num_kv_heads=2, head_dim=128,
             vocab_size=256, num_experts=0, top_k=0, dense_layers=2, dense_ffn_size=4096)


def _card() -> Any:
    from cosim.capture.config import MoEModelConfig

    return MoEModelConfig(**DENSE)


@pytest.mark.parametrize("tp", [2, 4])
def test_overlap_rewrite_by_hand(tp: int) -> None:
    p = PRECISIONS["fp8"]
    fwd = layer_ops(_card(), 0, 4096.0, 4096.0, Shard(tp=tp, sequence_parallel=True), p)
    bwd = backward_ops(fwd)
    for ops in (fwd, bwd):
        new = overlap_ops(ops, tp, p, 132)
        coll = [o for o in ops if o.cls == "collective"]
        ncoll = [o for o in new if o.cls == "collective"]
        # every TP collective's bytes are still sent, in pieces; the GEMMs keep their FLOPs (x132/131 or x132/108
        # where a communication kernel holds SMs)
        assert sum(o.comm.nbytes for o in ncoll) == pytest.approx(sum(o.comm.nbytes for o in coll))
        gf = sum(o.flops for o in ops if o.cls == "gemm")
        assert gf <= sum(o.flops for o in new if o.cls == "gemm") <= gf * 132 / 108
    names = [o.name for o in overlap_ops(fwd, tp, p, 132)]
    # forward: qkv and fc1 in tp chunks after tp-1 ring steps each; o_proj and fc2 in tp chunks, a step after each
    for lin, ag in (("attn.qkv", "attn.sp_all_gather"), ("mlp.fc1", "mlp.sp_all_gather")):
        assert [n for n in names if n.startswith(lin + ".ub")] == [f"{lin}.ub{i}" for i in range(tp)]
        assert [n for n in names if n.startswith(ag + ".ub")] == [f"{ag}.ub{i}" for i in range(1, tp)]
    i = names.index("mlp.fc2.ub0")
    assert names[i:i + 3] == ["mlp.fc2.ub0", "mlp.sp_reduce_scatter.ub1", "mlp.fc2.ub1"]
    new = overlap_ops(fwd, tp, p, 132)
    chunk = next(o for o in new if o.name == "attn.qkv.ub1")
    assert chunk.waits == ("attn.sp_all_gather.ub1",)  # chunk 0 is the rank's own shard: it waits for nothing
    assert next(o for o in new if o.name == "attn.qkv.ub0").waits == ("-",)
    # one framework call: its first piece a full dispatch, the others launched from TE's C++ loop
    assert [o.launches for o in new if ".ub" in o.name and o.name.startswith(("attn.sp_all", "attn.qkv"))] == \
        [1] + [0] * (2 * tp - 2)
    # backward: the data gradient of fc1 / qkv, then its reduce-scatter under the weight gradient (bulk)
    bn = [o.name for o in overlap_ops(bwd, tp, p, 132)]
    j = bn.index("mlp.fc1.wgrad")
    assert bn[j - 1] == "mlp.sp_all_gather.bwd" and bn.index("mlp.fc1.dgrad") < j - 1
    assert f"mlp.fc2.dgrad.ub{tp - 1}" in bn and "mlp.sp_reduce_scatter.bwd.ub1" in bn
    assert overlap_ops(fwd, 1, p, 132) is fwd


def _step(tmp_path: Path, tp: int, overlap: bool, rate: float) -> tuple[Any, Any]:
    """Rank 0 of a step of DENSE on one DGX H100 (tp x dp 8 / tp, one micro-batch of 16k tokens) with a hand timer: a GEMM takes
    flops / rate seconds, every other kernel 200 us, no gap between kernels; collectives are the engine's (NVLink)."""
    import yaml

    from cosim.replay import ReplayConfig, replay
    from cosim.topology import load_topology

    f = tmp_path / "dense2.yaml"
    f.write_text(yaml.safe_dump(DENSE))
    spec = SyntheticSpec.model_validate({"model": str(f), "layout": {"tp": tp}, "precision": "fp8",
                                         "batch": {"global": 8 // tp, "micro": 1, "seq": 16384},
                                         "tp_comm_overlap": overlap, "dispatch_overhead": "0 us"})

    def timer(_s: Any, _a: Any, _b: Any) -> Any:
        return lambda ops: [o.flops / rate if o.cls == "gemm" else 200e-6 for o in ops]

    topo = load_topology("dgx-h100")
    syn = synthesize(spec, topo, kernel_timer=timer)
    run = replay(syn.graph, topo, ReplayConfig(collectives="simulated", kernel_gap=0.0)).runs[0]
    return syn.graph.ranks[0], run


def _exposed(rg: Any, run: Any) -> tuple[float, float]:
    """(cosim's exposed TP time: TP collective time outside every compute kernel, the same by hand: each
    overlapped collective (a userbuffers piece, or a reduce-scatter issued before a weight gradient) less the
    compute kernel issued next, which starts with it; every other collective in full)."""
    G = rg.gpu_ops
    comp = G.cls != OpClass.COLLECTIVE
    tpc = np.array(["sp_" in rg.strings[int(n)] for n in G.name])  # the layers' TP collectives (not DP's)
    s, e = np.asarray(run.gpu_start), np.asarray(run.gpu_end)
    ci = np.flatnonzero(comp)
    grid = np.unique(np.concatenate([s, e]))
    mid = (grid[:-1] + grid[1:]) / 2
    busy_c = np.zeros(len(mid), bool)
    busy_n = np.zeros(len(mid), bool)
    for j in range(len(s)):
        if comp[j] or tpc[j]:
            (busy_c if comp[j] else busy_n)[(mid > s[j]) & (mid < e[j])] = True
    cosim = float(np.sum(np.diff(grid)[busy_n & ~busy_c]))
    hand = 0.0
    for j in np.flatnonzero(tpc & ~comp):
        nxt = ci[ci > j]
        name = rg.strings[int(G.name[j])]
        partner = int(nxt[0]) if len(nxt) else -1
        pname = rg.strings[int(G.name[partner])] if partner >= 0 else ""
        d = float(e[j] - s[j])
        if ".ub" in name or pname.endswith(".wgrad"):
            hand += max(0.0, d - float(e[partner] - s[partner]))
        else:
            hand += d
    return cosim, hand


@pytest.mark.parametrize("tp", [2, 4])
def test_exposed_tp_time_by_hand_when_gemms_hide_it(tmp_path: Path, tp: int) -> None:
    # GEMMs at 20 TFLOP/s: every GEMM chunk outlasts its ring step / reduce-scatter piece
    plain, over = _step(tmp_path, tp, False, 20e12), _step(tmp_path, tp, True, 20e12)
    cp, hp = _exposed(*plain)
    co, ho = _exposed(*over)
    assert cp == pytest.approx(hp, rel=1e-6) and cp > 1e-3  # not overlapped: every TP collective in full
    # overlapped: exposed only what no userbuffers method covers (the embedding's and LM head's gathers)
    assert co == pytest.approx(ho, rel=1e-6) and co < cp / 5


def test_exposed_tp_time_by_hand_when_communication_dominates(tmp_path: Path) -> None:
    # GEMMs at 2 PFLOP/s: tp2 ring steps and reduce-scatters outlast their GEMM chunks; what they exceed stays
    # exposed, the rest hides
    cp, hp = _exposed(*_step(tmp_path, 2, False, 2e15))
    co, ho = _exposed(*_step(tmp_path, 2, True, 2e15))
    assert cp == pytest.approx(hp, rel=1e-6)
    assert co == pytest.approx(ho, rel=1e-6)
    assert 0 < co < cp


def test_bf16_pipelined_reduce_scatter_by_hand() -> None:
    # Megatron-Bridge's BF16 H100 cfg: proj_fprop pipeline, 4 splits, 24 SMs margin; fc2_fprop 16 SMs
    p = PRECISIONS["bf16"]
    fwd = layer_ops(_card(), 0, 4096.0, 4096.0, Shard(tp=2, sequence_parallel=True), p)
    new = overlap_ops(fwd, 2, p, 132)
    o = next(x for x in fwd if x.name == "attn.o_proj")
    rs = next(x for x in fwd if x.name == "attn.sp_reduce_scatter")
    i = [x.name for x in new].index("attn.o_proj.ub0")
    assert [x.name for x in new[i:i + 8]] == [
        "attn.o_proj.ub0", "attn.sp_reduce_scatter.ub1", "attn.o_proj.ub1", "attn.sp_reduce_scatter.ub2",
        "attn.o_proj.ub2", "attn.sp_reduce_scatter.ub3", "attn.o_proj.ub3", "attn.sp_reduce_scatter.ub4"]
    chunk = new[i]
    assert chunk.m == o.m / 4 and chunk.flops == pytest.approx(o.flops / 4 * 132 / 108)
    assert new[i + 1].comm.nbytes == rs.comm.nbytes / 4
    fc2 = next(x for x in new if x.name == "mlp.fc2.ub0")
    assert fc2.flops == pytest.approx(next(x for x in fwd if x.name == "mlp.fc2").flops / 4 * 132 / 116)
