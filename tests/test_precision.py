"""Precision what-ifs wired into replay: ``precision.experts`` / ``precision.gemm`` (docs/MODELS.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.models import load_profile
from cosim.models.calibrated import HardwareFigures, gemm_time, memory_time
from cosim.models.features import extract_features
from cosim.models.precision import (
    DISPATCH_BYTES_FACTOR,
    PRECISION_DTYPES,
    PRECISION_SCOPES,
    dispatch_bytes_factor,
    expert_gemm_mask,
    narrow_gemm_params,
)
from cosim.replay import ReplayConfig, apply_sets, replay
from cosim.replay import config as replay_config
from cosim.resources import shared_dir
from cosim.workload import OpClass, load_trace

T0 = 1_000_000.0
BF16 = "c10::BFloat16"
H100 = load_catalog().accelerator("h100-sxm5")


def _ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": T0 + ts, "dur": dur, "args": args}


def _op(name: str, ts: float, dims: list, types: list) -> dict[str, Any]:
    return _ev("cpu_op", name, ts, 10, **{"Input Dims": dims, "Input type": types})


def _kernel(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": T0 + ts, "dur": dur,
            "args": {"device": 0, "stream": 7, "correlation": corr, "grid": [132, 1, 1], "block": [384, 1, 1]}}


def _launch(ts: float, corr: int) -> dict[str, Any]:
    return _ev("cuda_runtime", "cudaLaunchKernel", ts, 5, correlation=corr)


def moe_trace(path: Path) -> Path:
    """One GPU-bound step on an H100: a router GEMM inside ``MoE[experts=8, ...]`` (not an expert GEMM),
    a large BF16 grouped expert GEMM inside ``cosim::layer0.moe.experts``, and a dense GEMM after it."""
    evs = [
        _ev("user_annotation", "ProfilerStep#1", 0, 400),
        _ev("user_annotation", "MoE[experts=8, tokens=16384]", 10, 200),
        _op("aten::mm", 20, [[16384, 4096], [4096, 8]], [BF16, BF16]), _launch(25, 1),
        _kernel("nvjet_sm90_tst_128x64_64x6_1x2_h_bz_TNT", 40, 30, 1),
        _ev("user_annotation", "cosim::layer0.moe.experts", 100, 100),
        _op("aten::_grouped_mm", 110, [[16384, 4096], [8, 4096, 14336], [8]], [BF16, BF16, "int"]),
        _launch(115, 2),
        _kernel("nvjet_sm90_grouped_gemm_256x128", 130, 2500, 2),
        _op("aten::mm", 300, [[16384, 4096], [4096, 4096]], [BF16, BF16]), _launch(305, 3),
        _kernel("nvjet_sm90_tst_256x128_64x4_2x1_v_bz_TNN", 2640, 180, 3),
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": evs}
    path.write_text(json.dumps(doc))
    return path


def _names(res: Any) -> list[str]:
    rg = res.graph.ranks[0]
    return [rg.strings[int(x)] for x in rg.gpu_ops.name]


def _durs(res: Any) -> np.ndarray:
    return res.runs[0].gpu_end - res.runs[0].gpu_start


def test_knobs_parse_and_validate() -> None:
    assert PRECISION_SCOPES == replay_config.PRECISION_SCOPES and PRECISION_DTYPES == replay_config.PRECISION_DTYPES
    cfg = apply_sets(ReplayConfig(), {"precision.experts": "fp8"})
    assert dict(cfg.precision) == {"experts": "fp8"} and cfg.to_dict()["precision"] == {"experts": "fp8"}
    cfg = apply_sets(cfg, {"precision": "gemm:mxfp8,experts=bf16"})
    assert dict(cfg.precision) == {"gemm": "mxfp8"}
    assert dict(apply_sets(cfg, {"precision": "off"}).precision) == {}
    for bad in ({"precision.experts": "fp9"}, {"precision.weights": "fp8"}, {"precision": "fp8"}):
        with pytest.raises(CosimInputError, match="precision"):
            apply_sets(ReplayConfig(), bad)
    with pytest.raises(ValueError, match="precision"):
        ReplayConfig(precision={"experts": "int4"})
    assert DISPATCH_BYTES_FACTOR == dispatch_bytes_factor("fp8") == pytest.approx(0.515625)
    assert dispatch_bytes_factor("mxfp8") == pytest.approx((1 + 1 / 32) / 2)
    assert dispatch_bytes_factor("fp8", "fp32") == pytest.approx((1 + 1 / 32) / 4)
    assert dispatch_bytes_factor("fp8", "fp8") == 1.0


def test_expert_fp8_on_a_synthetic_moe_trace(tmp_path: Path) -> None:
    """The expert GEMM runs at the FP8 peak with the calibrated efficiency, a quantize kernel is added before
    it on the same stream and launch, the router and dense GEMMs are untouched, and the step gets shorter."""
    trace = moe_trace(tmp_path / "t.json")
    rg = load_trace(trace).ranks[0]
    f = extract_features(rg)
    assert expert_gemm_mask(rg).tolist() == [False, True, False]  # MoE[experts=8 ...] is not an expert label
    base = replay(trace, None, ReplayConfig())
    res = replay(trace, None, ReplayConfig(precision={"experts": "fp8"}))
    names = _names(res)
    assert names[1] == "cosim::quantize_fp8[aten::_grouped_mm]" and len(names) == 4
    d0, d1 = _durs(base), _durs(res)
    # expected: the calibrated tile/wave model at the FP8 peak over the same model at the BF16 peak
    prof = load_profile("h100-sxm5")
    hw = HardwareFigures.of(H100)
    p = prof.params("grouped_gemm", "bf16")
    m, n, k, b = (np.array([x[1]]) for x in (f.m, f.n, f.k, f.batch))
    t8 = gemm_time(m, n, k, b, b * (m * k + k * n) + 2 * b * m * n + b * (m + n) * k / 32, hw.peak("fp8"), hw,
                   narrow_gemm_params(p))
    t16 = gemm_time(m, n, k, b, 2 * b * (m * k + k * n + m * n), hw.peak("bf16"), hw, p)
    ratio = float(t8[0] / t16[0])
    assert 0.5 <= ratio < 0.65  # compute-bound: the peak ratio (2x) at the narrow-GEMM efficiency, plus overheads
    assert d1[2] == pytest.approx(d0[1] * ratio, rel=1e-9)
    assert d1[0] == pytest.approx(d0[0]) and d1[3] == pytest.approx(d0[2])  # router and dense GEMM unchanged
    act = float(m[0] * b[0] * k[0])
    q = memory_time(np.array([act * (2 + 1 + 1 / 32)]), hw.hbm_bandwidth, prof.params("elementwise"))[0]
    assert d1[1] == pytest.approx(q) and q > 0
    rg2, run = res.graph.ranks[0], res.runs[0]
    rg2.validate()
    G = rg2.gpu_ops
    assert G.stream[1] == G.stream[2] and G.launch[1] == G.launch[2] and G.cls[1] == OpClass.ELEMENTWISE
    assert run.gpu_end[1] <= run.gpu_start[2]  # quantize runs before its GEMM
    s0, s1 = base.summary(), res.summary()
    saved = d0[1] - d1[2] - d1[1]
    assert s1["step_time_s"] == pytest.approx(s0["step_time_s"] - saved, rel=0.02)
    pr = s1["precision"]
    assert pr["gemm_ops"] == 1 and pr["quantize_ops"] == 1 and pr["experts"] == "fp8"
    assert pr["gemm_time_after_s"] == pytest.approx(d1[2])
    assert "precision" not in s0
    # every GEMM: three quantize kernels, all three GEMMs faster
    allg = replay(trace, None, ReplayConfig(precision={"gemm": "fp8"}))
    assert sum(nm.startswith("cosim::quantize_fp8") for nm in _names(allg)) == 3
    dd = _durs(allg)
    assert dd[1] < d0[0] and dd[3] < d0[1] and dd[5] < d0[2]
    # modeled durations: the same ratio on the modeled expert GEMM
    mod = replay(trace, None, ReplayConfig(durations="modeled"))
    mod8 = replay(trace, None, ReplayConfig(durations="modeled", precision={"experts": "fp8"}))
    assert _durs(mod8)[2] == pytest.approx(_durs(mod)[1] * ratio, rel=1e-9)
    assert "kernel_error_by_class" in mod8.summary()


def test_expert_fp8_on_the_default_moe_scenario() -> None:
    """`cosim run --set precision.experts=fp8` on the bundled 4-rank MoE capture: expert GEMMs (the
    _grouped_mm calls, forward and backward) at the FP8 ratio, one quantize kernel per call, dispatch
    all-to-all payloads x 0.515, the other collectives unchanged, the step time moves."""
    from cosim.scenario import load_scenario, run_scenario

    sets = {"host.speed": "100"}  # GPU- and fabric-bound, so the GPU changes reach the step time
    _, base = run_scenario(load_scenario("moe-ep4-dgx-h100"), sets)
    _, fp8 = run_scenario(load_scenario("moe-ep4-dgx-h100"), {**sets, "precision.experts": "fp8"})
    sb, sf = base.summary(), fp8.summary()
    pr = sf["precision"]
    prof = load_profile("h100-sxm5")
    hw = HardwareFigures.of(H100)
    for rb, rf, run_b, run_f, per in zip(base.graph.ranks, fp8.graph.ranks, base.runs, fp8.runs, pr["ranks"]):
        f = extract_features(rb)
        mask = expert_gemm_mask(rb, f)
        H = rb.host_ops
        calls = set()
        for j in np.flatnonzero(mask):
            p = int(rb.gpu_ops.op[j])
            while p >= 0 and "_grouped_mm" not in rb.name(int(H.name[p])):
                p = int(H.parent[p])
            assert p >= 0  # every expert GEMM of this capture runs inside aten::_grouped_mm
            calls.add(p)
        names = [rf.strings[int(x)] for x in rf.gpu_ops.name]
        q = [i for i, nm in enumerate(names) if nm.startswith("cosim::quantize_fp8")]
        assert per["gemm_ops"] == mask.sum() > 0 and per["quantize_ops"] == len(q) == len(calls)
        d_f = run_f.gpu_end - run_f.gpu_start
        assert np.all(d_f[q] > 0)
        old = [i for i, nm in enumerate(names) if not nm.startswith("cosim::quantize")]
        assert len(old) == len(rb.gpu_ops)
        d_b = run_b.gpu_end - run_b.gpu_start
        new_of_old = np.array(old)
        p = prof.params("gemm", "bf16")
        for j in np.flatnonzero(mask):
            m, n, k, b = (np.array([x[j]]) for x in (f.m, f.n, f.k, f.batch))
            t8 = gemm_time(m, n, k, b, b * (m * k + k * n) + 2 * b * m * n + b * (m + n) * k / 32, hw.peak("fp8"), hw,
                           narrow_gemm_params(p))
            t16 = gemm_time(m, n, k, b, 2 * b * (m * k + k * n + m * n), hw.peak("bf16"), hw, p)
            assert d_f[new_of_old[j]] == pytest.approx(d_b[j] * t8[0] / t16[0], rel=1e-9)
            assert t8[0] <= t16[0]
        # collectives: the dispatch payload (float all-to-allv inside *.moe.dispatch) shrinks, nothing else
        Cb, Cf = rb.collectives, rf.collectives
        shrunk = 0
        for c in range(len(Cb)):
            h = int(Cb.host_op[c])
            anc = []
            while h >= 0:
                anc.append(rb.name(int(H.name[h])))
                h = int(H.parent[h])
            payload = any(a.endswith("moe.dispatch") for a in anc) and "Float" in rb.name(int(Cb.dtype[c]))
            want = DISPATCH_BYTES_FACTOR if payload else 1.0
            assert Cf.in_bytes[c] == pytest.approx(Cb.in_bytes[c] * want)
            assert Cf.out_bytes[c] == pytest.approx(Cb.out_bytes[c] * want)
            shrunk += payload
        assert shrunk == per["dispatch_collectives"] > 0
        assert per["dispatch_bytes_after"] == pytest.approx(per["dispatch_bytes_before"] * DISPATCH_BYTES_FACTOR)
    link_b = sum(x["bytes"] for x in sb["links"])
    link_f = sum(x["bytes"] for x in sf["links"])
    assert link_f < link_b
    # the GPU does the quantize work and the (tiny, floor-bound) GEMMs barely speed up: compute grows
    extra = pr["quantize_time_s"] + pr["gemm_time_after_s"] - pr["gemm_time_before_s"]
    assert extra > 0 and sf["breakdown"]["compute"] > sb["breakdown"]["compute"]
    assert sf["step_time_s"] != sb["step_time_s"]
    assert any(n.startswith("precision what-if experts=fp8") for n in sf["notes"])


def test_cli_replay_set_precision(tmp_path: Path) -> None:
    trace = moe_trace(tmp_path / "t.json")
    r = subprocess.run([sys.executable, "-m", "cosim", "replay", str(trace), "--set", "precision.experts=fp8",
                        "--json", "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["precision"]["quantize_ops"] == 1 and s["config"]["precision"] == {"experts": "fp8"}
    r = subprocess.run([sys.executable, "-m", "cosim", "replay", str(trace), "--set", "precision.experts=fp9"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "precision" in r.stderr


def test_b300_expert_bmm_selected_router_not() -> None:
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: the real B300 traces are needed")
    trace = shared / "traces/tracelens-b300-moe/moe_02_few_experts_many_tokens.json.gz"
    rg = load_trace(trace).ranks[0]
    f = extract_features(rg)
    mask = expert_gemm_mask(rg, f)
    ops = {f.op_name[j] for j in np.flatnonzero(mask)}
    gemms = [j for j in range(len(f)) if f.cls[j] == "gemm"]
    assert ops == {"aten::bmm"} and 0 < mask.sum() < len(gemms)  # expert_ffn bmm yes, router mm no
    s0 = replay(trace, None, ReplayConfig(durations="modeled", profile="b300")).summary()
    s1 = replay(trace, None, ReplayConfig(durations="modeled", profile="b300",
                                          precision={"experts": "mxfp8"})).summary()
    assert s1["precision"]["gemm_ops"] == mask.sum()
    assert s1["precision"]["gemm_time_after_s"] < s1["precision"]["gemm_time_before_s"]
    assert s1["step_time_s"] != s0["step_time_s"]
