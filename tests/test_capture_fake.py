"""Fake-tensor capture (issue 15 point 11): full-size models recorded without their memory,
lowered onto GPU kernels, and checked against hand arithmetic and the synthesis cost model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from capture_checks import comm_events, parse_list, read_gz_json

from cosim.capture.config import CaptureOptions, MoEModelConfig, load_model_config, parse_skew
from cosim.errors import CosimInputError
from cosim.models.roofline import RooflineModel
from cosim.topology import load_topology
from cosim.workload import load_trace
from cosim.workload.graph import HostKind, OpClass, RankGraph
from cosim.workload.project import ProjectionConfig, attention_flops, project_to_gpu


def _first_layers(card: MoEModelConfig, n: int, dense: int) -> MoEModelConfig:
    """``card`` with its real widths and only ``n`` layers, ``dense`` of them dense."""
    return MoEModelConfig.model_validate({**card.model_dump(), "num_layers": n, "dense_layers": dense})


def _capture(tmp: Path, model: MoEModelConfig, ws: int, **kw) -> Path:
    from cosim.capture.fake import capture_fake

    opts = CaptureOptions(model=model, world_size=ws, ep=kw.pop("ep", ws), steps=1, warmup=kw.pop("warmup", 0),
                          skew=parse_skew(kw.pop("skew", "balanced")), **kw)
    out = tmp / "cap"
    capture_fake(opts, out, progress=False)
    return out


def _layer_forward_flops(rg: RankGraph, classes: set[OpClass] | None = None) -> dict[int, float]:
    """Per layer, FLOPs of the projected GPU kernels launched inside ``cosim::forward`` and a
    ``cosim::layer{L}.*`` annotation (only kernels of ``classes`` if given)."""
    H, G = rg.host_ops, rg.gpu_ops
    names = [rg.name(int(x)) for x in H.name]
    layer = np.full(len(H), -1)
    fwd = np.zeros(len(H), dtype=bool)
    for i in range(len(H)):  # parents come before children
        p = int(H.parent[i])
        if p >= 0:
            layer[i], fwd[i] = layer[p], fwd[p]
        if H.kind[i] == HostKind.ANNOTATION:
            if names[i] == "cosim::forward":
                fwd[i] = True
            elif names[i].startswith("cosim::layer"):
                layer[i] = int(names[i][len("cosim::layer"):].split(".")[0])
    out: dict[int, float] = {}
    for j in range(len(G)):
        h = int(G.op[j])
        if fwd[h] and layer[h] >= 0 and (classes is None or OpClass(int(G.cls[j])) in classes) \
                and np.isfinite(G.flops[j]):
            out[int(layer[h])] = out.get(int(layer[h]), 0.0) + float(G.flops[j])
    return out


def _projected(folder: Path):
    topo = load_topology("dgx-h100")
    return project_to_gpu(load_trace(folder), topo.accelerator("gpu0"), topo.cpu_spec("cpu0"), ProjectionConfig(),
                          kernel_model=RooflineModel)


# (a) full size, no memory -------------------------------------------------------------------------

_RSS_SCRIPT = """
import json, resource, sys
from pathlib import Path
from cosim.capture.config import CaptureOptions, MoEModelConfig, load_model_config, parse_skew
from cosim.capture.fake import capture_fake
card = load_model_config("deepseek-v3")
model = MoEModelConfig.model_validate({**card.model_dump(), "num_layers": 2, "dense_layers": 1})
opts = CaptureOptions(model=model, world_size=2, ep=2, steps=1, warmup=1, skew=parse_skew("balanced"),
                      batch=1, seq=4096)
capture_fake(opts, Path(sys.argv[1]), progress=False)
print(json.dumps({"rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                  "real": opts.memory_per_rank()}))
"""


def test_full_size_deepseek_v3_records_without_its_memory(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    proc = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(out)], capture_output=True, text=True, check=True)
    fig = json.loads(proc.stdout.strip().splitlines()[-1])
    # 2 layers of DeepSeek-V3 at EP 2 in a real capture: fp32 weights, gradients and two AdamW
    # moments of 4 dense 7168-wide layers' worth plus 128 experts x 3 x 7168 x 2048: ~110 GiB.
    assert fig["real"] > 100 * 2**30
    assert fig["rss"] < 2 * 2**30 < fig["real"] / 50, fig  # no real storage: the process stays small

    trace = read_gz_json(out / "rank0.trace.json.gz")
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    dims = {(e["name"], json.dumps(e["args"]["Input Dims"][:2])) for e in ops if "Input Dims" in e["args"]}
    T = 4096
    # MLA's real projections (Hugging Face modeling_deepseek): q 7168 -> 1536 -> 128 x 192,
    # kv 7168 -> 512 + 64, 512 -> 128 x (128 + 128), o 128 x 128 -> 7168.
    for k, n in ((7168, 1536), (1536, 128 * 192), (7168, 576), (512, 128 * 256), (128 * 128, 7168)):
        assert ("aten::mm", json.dumps([[T, k], [k, n]])) in dims, (k, n)
    att = [e for e in ops if e["name"] == "aten::_scaled_dot_product_flash_attention"]
    assert [a["args"]["Input Dims"][:3] for a in att] == [[[1, 128, T, 192], [1, 128, T, 192], [1, 128, T, 128]]] * 2
    assert all(a["args"]["Concrete Inputs"][4] == "True" for a in att)  # causal
    # routed experts: this rank's 128 of 256 experts, fused up/gate 2 x 2048, uniform routing
    # sends T * 8 / 2 rows to each EP peer
    gmm = [e for e in ops if e["name"] == "aten::_grouped_mm"]
    assert gmm[0]["args"]["Input Dims"][:2] == [[T * 8, 7168], [128, 7168, 4096]]
    a2av = [e["args"] for e in comm_events(trace) if e["args"]["Collective name"] == "all_to_allv"]
    assert [a["cosim tag"] for a in a2av] == ["layer1.moe.dispatch.fwd", "layer1.moe.combine.fwd",
                                              "layer1.moe.combine.bwd", "layer1.moe.dispatch.bwd"]
    assert all(parse_list(a["In split size"]) == [T * 4, T * 4] for a in a2av)
    assert a2av[0]["In msg nelems"] == T * 8 * 7168 and a2av[0]["dtype"] == "BFloat16"
    # backward and the optimizer are recorded too
    names = {e["name"] for e in ops}
    assert {"aten::_scaled_dot_product_flash_attention_backward", "aten::_foreach_addcdiv_"} <= names


# (b) per-layer forward FLOPs by hand ----------------------------------------------------------------

SMALL = MoEModelConfig(name="small", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                       vocab_size=128, num_experts=8, top_k=2, expert_ffn_size=32, num_shared_experts=1,
                       dense_layers=1, dense_ffn_size=96)


def test_per_layer_forward_flops_by_hand(tmp_path: Path) -> None:
    out = _capture(tmp_path, SMALL, 2, batch=2, seq=8)
    b, s, h, T = 2, 8, 64, 16
    attn = (2 * T * h * 64 + 2 * 2 * T * h * 32 + 2 * T * 64 * h  # q, k, v (2 kv heads x 16), o
            + 2 * b * 4 * s * s * (16 + 16) / 2)  # causal QK^T and PV
    rows = T * 2  # balanced routing: each rank's 4 experts receive 2 ranks x 16 tokens x 2 / 2 ranks
    dense = attn + 2 * T * h * 192 + 2 * T * 96 * h
    moe = attn + 2 * T * h * 8 + 2 * rows * h * 64 + 2 * rows * 32 * h + 2 * T * h * 64 + 2 * T * 32 * h
    gemm_like = {OpClass.GEMM, OpClass.GROUPED_GEMM, OpClass.ATTENTION}
    for rg in _projected(out).ranks:
        got = _layer_forward_flops(rg, gemm_like)
        assert got == pytest.approx({0: dense, 1: moe}, rel=1e-12), rg.rank


def test_attention_flops_rule() -> None:
    q, k, v = [2, 4, 8, 24], [2, 4, 8, 24], [2, 4, 8, 16]
    assert attention_flops([q, k, v], False) == 2 * 2 * 4 * 8 * 8 * (24 + 16) / 2  # causal: sq == sk
    assert attention_flops([[2, 4, 1, 24], [2, 4, 9, 24], [2, 4, 9, 16]], False) == 2 * 2 * 4 * 9 * 40  # decode
    assert attention_flops([[2, 4, 8, 16], q, k, v, [2, 4, 8, 16], [2, 4, 8]], True) == 2.5 * 2 * 2 * 4 * 64 * 40 / 2


# (c) agreement with synthesis -------------------------------------------------------------------

@pytest.mark.parametrize(("card", "layers", "dense"), [
    ("llama-3-70b", 1, 1),       # dense FFN, GQA
    ("qwen3-30b-a3b", 1, 0),     # MoE, GQA
    ("deepseek-v3", 2, 1),       # MLA, dense layer 0 and MoE layer 1 (+ shared expert)
])
def test_forward_flops_agree_with_synthesis(tmp_path: Path, card: str, layers: int, dense: int) -> None:
    costs = pytest.importorskip("cosim.workload.synth.costs",
                                reason="cosim.workload.synth.costs (h15-synth) is not merged in this branch")
    model = _first_layers(load_model_config(card), layers, dense)
    seq = 4096
    out = _capture(tmp_path, model, 1, batch=1, seq=seq)
    got = _layer_forward_flops(_projected(out).ranks[0])
    for layer in range(layers):
        want = costs.layer_forward_flops(model, layer, seq, seq)
        assert got[layer] == pytest.approx(want, rel=0.01), (card, layer, got[layer] / want)


# capture folder and errors ------------------------------------------------------------------------

def test_fake_capture_folder_replays_and_matches_its_routing(tmp_path: Path) -> None:
    out = _capture(tmp_path, SMALL, 4, ep=2, skew="zipf:1.2", batch=2, seq=16, warmup=1)
    import yaml

    doc = yaml.safe_load((out / "capture.yaml").read_text())
    assert doc["device"]["kind"] == "fake" and doc["profiled_steps"] == [1]
    assert sorted(p.name for p in out.iterdir()) == ["capture.yaml"] + [f"rank{r}.trace.json.gz" for r in range(4)]
    layer = doc["routing"]["layers"][0]
    e_local = 4
    for r in range(4):
        row = layer["tokens_per_expert_by_rank"][r][0]
        assert sum(row) == 2 * 16 * 2
        trace = read_gz_json(out / f"rank{r}.trace.json.gz")
        disp = [e["args"] for e in comm_events(trace) if e["args"]["cosim tag"] == "layer1.moe.dispatch.fwd"]
        assert parse_list(disp[0]["In split size"]) == [sum(row[j * e_local:(j + 1) * e_local]) for j in range(2)]
    assert len({tuple(layer["tokens_per_expert_by_rank"][r][0]) for r in range(4)}) > 1  # skewed, per rank

    from cosim.replay import ReplayConfig, replay

    res = replay(out, "dgx-h100", ReplayConfig(collectives="simulated"))
    assert res.summary()["step_time_s"] > 0


def test_fake_capture_refuses_what_it_cannot_record(tmp_path: Path) -> None:
    from cosim.capture.fake import capture_fake

    opts = CaptureOptions(model=SMALL, world_size=2, ep=2, steps=1, skew=parse_skew("natural"))
    with pytest.raises(CosimInputError, match="--skew balanced"):
        capture_fake(opts, tmp_path / "x", progress=False)
    capped = SMALL.model_copy(update={"capacity_factor": 1.0})
    opts = CaptureOptions(model=capped, world_size=2, ep=2, steps=1, skew=parse_skew("balanced"))
    with pytest.raises(CosimInputError, match="capacity"):
        capture_fake(opts, tmp_path / "y", progress=False)
    assert not any(tmp_path.iterdir())
