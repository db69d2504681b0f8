"""Calibrated kernel models: math, fits, profiles, CLI, held-out accuracy (docs/MODELS.md)."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.models import RooflineModel, bundled_profiles, load_profile, predict_durations
from cosim.models.calibrated import (
    GemmParams,
    HardwareFigures,
    MemoryParams,
    fit_gemm,
    fit_memory,
    gemm_time,
    memory_time,
)
from cosim.resources import shared_dir

H100 = load_catalog().accelerator("h100-sxm5")
HW = HardwareFigures.of(H100)


def test_wave_quantization_by_hand():
    # one 128x128 tile per SM: 132 tiles = 1 wave, 133 tiles = 2 waves (no small tiles, no split-K gain)
    p = GemmParams(efficiency=1.0, tile_overhead_s=0.0, memory_efficiency=1.0, floor_s=0.0, small_tile_alpha=0.0)
    k = 4096.0
    peak = HW.peak("bf16")
    one = gemm_time(np.array([128.0 * 132]), np.array([128.0]), np.array([k]), np.array([1.0]), np.array([0.0]),
                    peak, HW, p)[0]
    tile_t = 2 * 128 * 128 * k / (peak / 132)  # one full wave of 128x128 tiles
    assert one == pytest.approx(tile_t, rel=1e-9)
    two = gemm_time(np.array([128.0 * 133]), np.array([128.0]), np.array([k]), np.array([1.0]), np.array([0.0]),
                    peak, HW, p)[0]
    # the 133rd tile costs a partial wave: best is 64x32 tiles, 1064 tiles = 9 waves of tile_t / 8
    assert two == pytest.approx(9 / 8 * tile_t, rel=1e-9)


def test_roofline_limits():
    r = RooflineModel(H100)
    big = r.time("gemm", 1e15, 1e6, "bf16")
    assert big == pytest.approx(r.floor + 1e15 / (H100.peak("bf16") * r.compute_efficiency))
    mem = r.time("elementwise", 0.0, 1e10)
    assert mem == pytest.approx(r.floor + 1e10 / (H100.hbm_bandwidth * r.memory_efficiency))
    # memory-bound GEMM: operand bytes dominate
    p = GemmParams(floor_s=0.0, memory_efficiency=0.5)
    t = gemm_time(np.array([1.0]), np.array([8192.0]), np.array([8192.0]), np.array([1.0]), np.array([2 * 8192**2]),
                  H100.peak("bf16"), HW, p)[0]
    assert t == pytest.approx(2 * 8192**2 / (H100.hbm_bandwidth * 0.5))


def test_memory_model_saturates():
    p = MemoryParams(efficiency=0.8, floor_s=2e-6)
    nb = np.array([1e3, 1e6, 1e9])
    bw = nb / memory_time(nb, H100.hbm_bandwidth, p)
    assert bw[0] < bw[1] < bw[2] < 0.8 * H100.hbm_bandwidth
    assert bw[2] > 0.79 * H100.hbm_bandwidth


def test_fit_round_trip_synthetic():
    rng = np.random.default_rng(0)
    true = GemmParams(efficiency=0.6, tile_overhead_s=1.5e-6, memory_efficiency=0.7, floor_s=3e-6,
                      small_tile_alpha=0.3)
    m, n, k = (2.0 ** rng.integers(5, 14, 120) for _ in range(3))
    b = np.ones(120)
    nbytes = 2 * (m * k + k * n + m * n)
    dur = gemm_time(m, n, k, b, nbytes, H100.peak("bf16"), HW, true)
    got = fit_gemm(m, n, k, b, nbytes, H100.peak("bf16"), dur, HW)
    pred = gemm_time(m, n, k, b, nbytes, H100.peak("bf16"), HW, got)
    assert np.mean(np.abs(pred / dur - 1)) < 0.03
    assert got.efficiency == pytest.approx(0.6, rel=0.1)
    mp = MemoryParams(efficiency=0.55, floor_s=2.5e-6)
    nb = 10 ** rng.uniform(3, 9, 50)
    fm = fit_memory(nb, memory_time(nb, H100.hbm_bandwidth, mp), H100.hbm_bandwidth)
    assert fm.efficiency == pytest.approx(0.55, rel=0.02)
    assert fm.floor_s == pytest.approx(2.5e-6, rel=0.02)


def test_profile_round_trip(tmp_path):
    assert "h100-sxm5" in bundled_profiles()
    prof = load_profile("h100-sxm5")
    out = tmp_path / "p.yaml"
    prof.save(out)
    again = load_profile(out)
    assert again.models == prof.models and again.accelerator == prof.accelerator
    assert again.provenance["gpu"]


def test_saved_profile_header_names_its_own_schema(tmp_path):
    """A profile without a launch section is written as cosim.profile/1; its header comment said /2."""
    import dataclasses

    prof = dataclasses.replace(load_profile("h100-sxm5"), launch={})
    prof.save(tmp_path / "p.yaml")
    head, schema = (tmp_path / "p.yaml").read_text().splitlines()[:2]
    assert schema == "schema: cosim.profile/1" and "(cosim.profile/1)" in head


@pytest.mark.parametrize("text, needle", [
    ("schema: cosim.profile/1\nname: x\naccelerator: h100-sxm5\nmodels: {gemm: {default: {efficiency: 2}}}\n",
     "efficiency"),
    ("schema: cosim.profile/1\nname: x\naccelerator: nope\n", "accelerator"),
    ("schema: cosim.profile/1\nname: x\naccelerator: h100-sxm5\nmodels: {warp: {}}\n", "unknown model class"),
    ("schema: other\n", "schema"),
])
def test_bad_profile_one_line(tmp_path, text, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(CosimInputError) as ei:
        load_profile(p)
    msg = str(ei.value)
    assert "\n" not in msg and needle in msg and "bad.yaml" in msg


def test_unknown_profile_name():
    with pytest.raises(CosimInputError, match="unknown calibration profile"):
        load_profile("no-such-gpu")


needs_shared = pytest.mark.skipif(shared_dir() is None, reason="../shared not present")


@needs_shared
def test_held_out_h100_gemm_and_predict_durations():
    """Fit on two H100 traces, predict the third (Qwen, held out). Measured 14.2 % GEMM MAPE over the
    169 GEMMs with shapes (16.1 % over all 242, shape-less ones included; see
    validation/kernels/RESULTS.md): the issue's 15 % target is the bound."""
    from cosim.models.fit import KernelDB, class_errors, fit_profile
    from cosim.workload import load_trace

    d = shared_dir() / "traces" / "tracelens-h100"
    qwen = next(d.glob("Qwen*"))
    train = [p for p in sorted(d.glob("*.json.gz")) if p != qwen]
    prof = fit_profile(KernelDB.from_traces(train)["h100-sxm5"])
    errs = class_errors(KernelDB.from_traces([qwen])["h100-sxm5"], prof, all_ops=True)
    assert errs["gemm"]["mape"] <= 0.15 and errs["gemm"]["n"] > 100
    assert errs["gemm"]["n_all"] > errs["gemm"]["n"] and errs["gemm"]["mape_all"] >= errs["gemm"]["mape"]
    rg = load_trace(qwen).ranks[0]
    dur = predict_durations(rg, H100, prof)
    assert dur.shape == (len(rg.gpu_ops),) and np.all(np.isfinite(dur) | (rg.gpu_ops.cls == 8))
    assert np.all(dur[np.isfinite(dur)] > 0)


@needs_shared
def test_cli_calibrate_from_traces(tmp_path):
    t = next((shared_dir() / "traces" / "tracelens-h100").glob("gaunernst*"))
    out = tmp_path / "p.yaml"
    r = subprocess.run([sys.executable, "-m", "cosim", "calibrate", "--from-traces", str(t), "--out", str(out),
                        "--db-out", str(tmp_path / "db"), "--kernel-db", "20"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    assert "gemm" in r.stdout and (tmp_path / "db" / "h100-sxm5.csv").exists()
    prof = load_profile(out)
    assert prof.provenance["inputs_hash"]
    assert 0 < len(prof.kernel_db) <= 20 and prof.kernel_scale
    from cosim.models.fit import load_db

    assert (load_db(tmp_path / "db" / "h100-sxm5.csv").feats.grid > 0).any()  # grid columns round-trip


def test_cli_microbench_cpu_quick(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "cpu.yaml"
    r = subprocess.run([sys.executable, "-m", "cosim", "calibrate", "--microbench", "--device", "cpu", "--quick",
                        "--out", str(out), "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert load_profile(out).provenance["method"].startswith("microbench cpu")


def test_microbench_times_attention_backward():
    """The sweep times SDPA backward (forward + backward minus forward), so a microbenchmarked profile fits
    the backward efficiency instead of tying it to the forward one; its FLOPs are 2.5x the forward's."""
    pytest.importorskip("torch")
    from cosim.models.microbench import MicrobenchConfig, run_microbench

    db, _ = run_microbench(MicrobenchConfig(device="cpu", quick=True, progress=False))
    att = [i for i, c in enumerate(db.feats.cls) if c == "attention"]
    assert [bool(db.feats.bwd[i]) for i in att] == [False, True]
    fwd, bwd = att
    assert db.feats.dur[bwd] > 0 and db.feats.flops[bwd] == pytest.approx(2.5 * db.feats.flops[fwd])


def test_cli_bad_args_one_line():
    r = subprocess.run([sys.executable, "-m", "cosim", "calibrate", "--out", "x.yaml"], capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 2 and r.stderr.count("\n") == 1


def test_quantize_factor():
    from cosim.models.precision import DISPATCH_BYTES_FACTOR

    assert DISPATCH_BYTES_FACTOR == pytest.approx((1 + 4 / 128) / 2)
    assert not math.isnan(DISPATCH_BYTES_FACTOR)


def test_modeled_replay_of_held_out_h100_trace_is_within_10_percent() -> None:
    """--durations modeled with a profile fitted without this trace (leave-one-trace-out)."""
    from cosim.replay import ReplayConfig, replay
    from cosim.resources import shared_dir

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: the real H100 traces are needed")
    from pathlib import Path

    prof = Path(__file__).resolve().parent.parent / "validation/kernels/profiles/h100-fold-qwen.yaml"
    trace = shared / "traces/tracelens-h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    s = replay(trace, None, ReplayConfig(durations="modeled", profile=str(prof))).summary()
    assert abs(s["error"]) <= 0.10, s["error"]
    measured = replay(trace, None, ReplayConfig()).summary()
    assert s["step_time_s"] != measured["step_time_s"]  # the models, not the trace, set the kernel times


def test_gather_bytes_from_kernel_launch():
    """aten::index's indices are an unsized TensorList: rows gathered come from the gather kernel's grid."""
    from cosim.models.features import _gather_bytes_from_launch, _mem_bytes

    shapes, types = [[8, 1024, 2048], []], ["c10::BFloat16", ""]
    row = 1024 * 2048 * 2
    got = _gather_bytes_from_launch("void at::native::vectorized_gather_kernel<16, long>(char*)",
                                    np.array([512, 1024, 1]), shapes, types)
    assert got == pytest.approx(512 * (2 * row + 8))
    got = _gather_bytes_from_launch("void at::native::index_elementwise_kernel<128, 4, X>(long, X)",
                                    np.array([10, 1, 1]), [[755000], []], ["double", ""])
    assert got == pytest.approx(10 * 512 * (2 * 8 + 8))
    assert math.isnan(_gather_bytes_from_launch("some_kernel", np.array([4, 1, 1]), shapes, types))
    # 1-D index_select and scatters touch the selected rows, not the whole table
    sel = _mem_bytes("aten::index_select", [[755000], [], [1024]], ["float", "Scalar", "int"], "elementwise")
    assert sel == pytest.approx(2 * 1024 * 4 + 1024 * 4)
    add = _mem_bytes("aten::index_add_", [[755000], [], [1024], [1024], []],
                     ["float", "Scalar", "int", "float", "Scalar"], "reduction")
    assert add < 20_000


def test_modeled_replay_of_held_out_b300_moe_is_within_10_percent() -> None:
    """Held-out modeled step time of the B300 MoE traces with the bundled b300 profile, which is fitted on
    moe_01/03/05: only moe_02/04/06 are scored (gathers dominate moe_06)."""
    from cosim.models import load_profile
    from cosim.replay import ReplayConfig, replay

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: the real B300 traces are needed")
    split = load_profile("b300").provenance["split"]
    for name in ("moe_02_few_experts_many_tokens", "moe_04_top2_dense", "moe_06_tiny_batch_many_experts"):
        assert f"{name}.json.gz" in split.split("test", 1)[1], split  # held out, not fitted
        trace = shared / f"traces/tracelens-b300-moe/{name}.json.gz"
        s = replay(trace, None, ReplayConfig(durations="modeled", profile="b300")).summary()
        assert abs(s["step_time_s"] / s["measured_step_time_s"] - 1) <= 0.10, (name, s["step_time_s"])


def test_split_k_reduce_is_not_a_second_gemm():
    """cuBLAS's splitKreduce kernel is memory-bound: the GEMM kernel keeps all of its parent's FLOPs."""
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found")
    from cosim.models.features import extract_features
    from cosim.workload import load_trace

    rg = load_trace(shared / "traces/hta/a100-rank3of8-control.json.gz").ranks[0]
    f = extract_features(rg)
    red = [j for j in range(len(f)) if "splitKreduce" in f.kernel[j]]
    assert red and all(f.cls[j] == "elementwise" and np.isfinite(f.bytes[j]) for j in red)
    assert not any(f.cls[j] == "gemm" and "fbgemm_gpu::permute" in f.kernel[j] for j in range(len(f)))


def test_named_tiles_and_tile_profile_keys():
    """A kernel name that spells its tile pins the tile; the profile's tile: keys are used only for those."""
    from cosim.models.calibrated import named_tiles

    t = named_tiles(["void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x128_32x3_nt_align4>(X)",
                     "ampere_sgemm_128x64_nn", "sm80_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize64x32x32_stage4",
                     "nvjet_sm90_tst_128x256_64x4_1x2_h_bz_TNT", "elementwise"])
    assert t[:3].tolist() == [[64, 128], [128, 64], [64, 32]]
    assert np.isnan(t[3:]).all()
    m, n, k = np.array([1024.0]), np.array([1024.0]), np.array([1024.0])
    p = GemmParams()
    free = gemm_time(m, n, k, np.ones(1), np.zeros(1), 1e15, HW, p)
    pinned = gemm_time(m, n, k, np.ones(1), np.zeros(1), 1e15, HW, p, np.array([[64.0, 32.0]]))
    assert pinned[0] >= free[0]  # the free choice is the fastest candidate
    prof = load_profile("h100-sxm5")
    assert any(key.startswith("tile:") for key in prof.models["gemm"])


def test_grid_derived_split_k_on_a100_trace_kernels():
    """Split-K count and tile orientation come from the launch grid of the traced kernel (grid_z = splits,
    grid_x*grid_y = the output tiles, padded by the threadblock swizzle)."""
    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found")
    from cosim.models.calibrated import launch_split, named_tiles
    from cosim.models.features import extract_features
    from cosim.workload import load_trace

    rg = load_trace(shared / "traces/hta/a100-rank3of8-control.json.gz").ranks[0]
    f = extract_features(rg)
    idx = [j for j in range(len(f)) if f.cls[j] == "gemm" and np.isfinite(f.m[j]) and f.grid[j][0] > 0
           and np.isfinite(named_tiles([f.kernel[j]])[0, 0])]
    assert len(idx) > 100
    tiles = named_tiles([f.kernel[j] for j in idx])
    m, n, b, g = f.m[idx], f.n[idx], f.batch[idx], f.grid[idx]
    tm, tn, s = launch_split(m, n, b, tiles, g)
    assert np.isfinite(s).all()
    # every launch covers its output tiles, and the splits are grid_z / batch
    assert (np.ceil(m / tm) * np.ceil(n / tn) <= g[:, 0] * g[:, 1]).mean() > 0.95
    assert np.array_equal(s, np.maximum(1, np.round(g[:, 2] / b)))
    assert (s > 1).sum() > 50  # the trace runs many split-K GEMMs
    # one known launch: cutlass 64x64 tile, M=1024, N=96, grid (32, 1, 2) -> 32 tiles x 2 K slices
    j = next(i for i, jj in enumerate(idx) if "64x64_32x6_tn" in f.kernel[jj] and tuple(g[i]) == (32, 1, 2)
             and m[i] == 1024 and n[i] == 96)
    assert (tm[j], tn[j], s[j]) == (64, 64, 2)
    # the launch pins the split: the modeled time is that of s = 2, not the best over all splits
    p = GemmParams(efficiency=0.5, tile_overhead_s=0.0, memory_efficiency=1.0, floor_s=0.0, small_tile_alpha=0.0)
    hw = HardwareFigures.of(load_catalog().accelerator("a100-sxm-80gb"))
    k = f.k[idx[j]]
    t = gemm_time(m[j:j + 1], n[j:j + 1], np.array([k]), np.ones(1), np.zeros(1), hw.peak("tf32"), hw, p,
                  tiles[j:j + 1], g[j:j + 1])[0]
    want = 2 * 64 * 64 * (k / 2) / (hw.peak("tf32") / hw.sm_count * 0.5) + 8.0 * 1024 * 96 * 2 / hw.hbm_bandwidth
    assert t == pytest.approx(want, rel=1e-9)


def test_kernel_db_hit_miss_and_round_trip(tmp_path):
    """An exact-key hit returns the stored median (source 'database'); a miss, another GPU or
    database=False fall back to the model; the database and kernel factors survive save/load."""
    from dataclasses import replace

    from cosim.models.features import KernelFeatures
    from cosim.models.predict import SOURCES, predict_features
    from cosim.models.profile import db_key

    kern = "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>(Params)"
    f = KernelFeatures(cls=["gemm", "gemm"], kernel=[kern, kern], op_name=["aten::mm"] * 2, dtype=["tf32"] * 2,
                       m=np.array([1024.0, 2048.0]), n=np.array([96.0, 96.0]), k=np.array([512.0, 512.0]),
                       batch=np.ones(2), heads=np.ones(2), bwd=np.zeros(2, bool), flops=np.full(2, np.nan),
                       bytes=np.array([1.0e6, 2.0e6]), dur=np.full(2, np.nan),
                       grid=np.array([[32, 1, 2], [64, 1, 2]]), block=np.array([[128, 1, 1]] * 2))
    a100 = load_catalog().accelerator("a100-sxm-80gb")
    base = replace(load_profile("a100-sxm-80gb"), kernel_db={}, kernel_scale={})
    model = predict_features(f, a100, base).dur
    key = db_key(kern, "gemm", "tf32", 1024.0, 96.0, 512.0, 1.0, 1.0, False, 1.0e6)
    prof = replace(base, kernel_db={key: (19.0e-6, 33)},
                   kernel_scale={"void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x6_tn_align4>":
                                 {"scale": 1.5, "n": 10}})
    pr = predict_features(f, a100, prof)
    assert pr.dur[0] == 19.0e-6 and SOURCES[pr.source[0]] == "database"
    assert pr.dur[1] == pytest.approx(1.5 * model[1]) and SOURCES[pr.source[1]] == "model"
    only = predict_features(f, a100, prof, kernel_scale=False, database=False).dur
    assert np.allclose(only, model)
    other = predict_features(f, load_catalog().accelerator("h100-sxm5"), prof)  # cross-GPU: model only
    assert np.allclose(other.dur, predict_features(f, load_catalog().accelerator("h100-sxm5"), base).dur)
    prof.save(tmp_path / "p.yaml")
    back = load_profile(tmp_path / "p.yaml")
    assert back.kernel_db == prof.kernel_db and back.kernel_scale == prof.kernel_scale
    assert predict_features(f, a100, back).dur[0] == 19.0e-6


def test_bundled_profiles_kernel_db_bounded_and_gemv_params():
    from cosim.models.calibrated import GEMV_PREFIX, gemv_kernels
    from cosim.models.fit import KERNEL_DB_MAX

    for name in bundled_profiles():
        assert len(load_profile(name).kernel_db) <= KERNEL_DB_MAX
    assert GEMV_PREFIX + "default" in load_profile("v100-sxm2-32gb").models["gemm"]
    assert gemv_kernels(["void gemmSN_TN_kernel<float, 128>", "void dot_kernel<float, 128, 0>",
                         "volta_sgemm_128x32_nt"]).tolist() == [True, True, False]


def test_modeled_replay_reports_kernel_error_by_class() -> None:
    """--durations modeled puts the per-class error against the measured kernels in the summary and the text."""
    from pathlib import Path

    from cosim.models.fit import KernelDB, class_errors
    from cosim.output.text import format_summary
    from cosim.replay import ReplayConfig, replay

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: the real H100 traces are needed")
    prof = Path(__file__).resolve().parent.parent / "validation/kernels/profiles/h100-fold-gaunernst.yaml"
    trace = shared / "traces/tracelens-h100/gaunernst_bert-small-uncased__1016001.json.gz"
    s = replay(trace, None, ReplayConfig(durations="modeled", profile=str(prof))).summary()
    ke = s["kernel_error_by_class"]
    assert {"gemm", "attention", "elementwise", "norm"} <= set(ke)
    # the same numbers as the validation's class_errors on that trace (one implementation)
    ref = class_errors(KernelDB.from_traces([trace])["h100-sxm5"], load_profile(prof), all_ops=True)
    for c, e in ref.items():
        assert ke[c] == e, c
    assert 0 < ke["gemm"]["mape"] < 0.5 and ke["gemm"]["n"] > 10
    text = format_summary(s)
    assert "kernel model error vs measured" in text and f"{100 * ke['gemm']['mape']:.1f}%" in text
    assert "kernel_error_by_class" not in replay(trace, None, ReplayConfig()).summary()  # measured: absent


def test_launch_laws_fit_predict_and_round_trip(tmp_path):
    """Launch-configuration laws (ops without shapes): work proxy, fit, profile section, prediction source."""
    from cosim.models.launch import fit_launch, launch_work
    from cosim.models.profile import CalibrationProfile

    cls = ["elementwise"] * 12 + ["gemm"] * 10 + ["collective"]
    kern = ["void k<4>(float*)"] * 12 + ["volta_sgemm_64x64_nt"] * 10 + ["nccl"]
    grid = np.array([[2 ** i, 1, 1] for i in range(12)] + [[4 * (i + 1), 2, 1] for i in range(10)] + [[1, 1, 1]])
    block = np.array([[128, 1, 1]] * 12 + [[256, 1, 1]] * 10 + [[64, 1, 1]])
    work, keys = launch_work(cls, kern, grid, block)
    assert work[0] == 128 and work[12] == 4 * 2 * 64 * 64 and keys[12] == "gemm:tile" and keys[-1] is None
    dur = np.where(np.isfinite(work), 2e-6 + np.nan_to_num(work) / np.where(np.array(cls) == "gemm", 1e10, 2e10), 1.0)
    la = fit_launch(cls, kern, grid, block, dur)
    assert la["laws"]["elementwise:threads"]["rate"] == pytest.approx(2e10, rel=0.05)
    assert la["laws"]["gemm:tile"]["rate"] == pytest.approx(1e10, rel=0.05)
    prof = CalibrationProfile(name="x", accelerator="v100-sxm2-32gb", launch=la)
    prof.save(tmp_path / "x.yaml")
    text = (tmp_path / "x.yaml").read_text()
    assert "schema: cosim.profile/2" in text and "gemm:tile" in text
    back = load_profile(tmp_path / "x.yaml")
    assert back.launch["laws"].keys() == la["laws"].keys()
    (tmp_path / "bad.yaml").write_text(text.replace("gemm:tile", "gemm:warp"))
    with pytest.raises(CosimInputError, match="launch"):
        load_profile(tmp_path / "bad.yaml")
    # old profiles (schema /1, no launch section) still load
    assert CalibrationProfile(name="y", accelerator="h100-sxm5").to_dict()["schema"] == "cosim.profile/1"


@needs_shared
def test_modeled_replay_of_shapeless_v100_single_ns_improves() -> None:
    """hta/v100-single-ns has no Input Dims: with the bundled v100 profile's launch laws (fitted on DLRM
    workers 0-3 and hta/v100-rank1of2-df, never on this trace), batch-norm bytes read off the neighbouring
    element-wise launches, and memset bandwidth left at its default (unidentifiable from DLRM's six tiny
    memsets), modeled replay is -5.6 % (was -23.0 % with twins / class floors, -12.5 % with the launch laws
    alone; validation/kernels/RESULTS.md)."""
    from cosim.models import load_profile
    from cosim.replay import ReplayConfig, replay

    trace = shared_dir() / "traces/hta/v100-single-ns.json.gz"
    prof = load_profile("v100-sxm2-32gb")
    assert prof.launch and "v100-single-ns.json.gz" not in prof.launch["sources"]
    s = replay(trace, None, ReplayConfig(durations="modeled", profile="v100-sxm2-32gb")).summary()
    err = s["step_time_s"] / s["measured_step_time_s"] - 1
    assert abs(err) <= 0.10, err
    ke = s["kernel_error_by_class"]
    assert abs(ke["gemm"]["time_err_all"]) < 0.5 and abs(ke["elementwise"]["time_err_all"]) < 0.3
    assert abs(ke["norm"]["time_err_all"]) < 0.5 and abs(ke["memset"]["time_err_all"]) < 0.5


@needs_shared
def test_norm_bytes_inferred_from_neighbouring_elementwise_launches() -> None:
    """cuDNN batch-norm kernels (grid = channels) get the element count of the element-wise kernel next to
    them (PyTorch's launch: prod(grid) * prod(block) * 4 elements): on hta/v100-single-ns every forward one
    then moves its 2 tensor passes at a physical rate, between 30 % and 100 % of V100 HBM (900 GB/s)."""
    from cosim.models.features import extract_features
    from cosim.workload import load_trace

    rg = load_trace(shared_dir() / "traces/hta/v100-single-ns.json.gz").ranks[0]
    f = extract_features(rg)
    fw = [j for j in range(len(f)) if "bn_fw_tr_1C11" in f.kernel[j]]
    assert fw and f.inferred is not None and f.inferred[fw].mean() > 0.95  # a few have no such neighbour
    rate = np.median([f.bytes[j] / f.dur[j] for j in fw if f.inferred[j]])
    assert 0.3 * 900e9 < rate < 900e9, rate
    # ops with shapes keep theirs: nothing inferred on a trace that records Input Dims
    bert = shared_dir() / "traces/tracelens-h100/gaunernst_bert-small-uncased__1016001.json.gz"
    assert extract_features(load_trace(bert).ranks[0]).inferred is None


def test_timed_kernels_keep_their_measured_duration():
    """``torch.cuda._sleep``'s spin_kernel runs as long as its argument says: modeled replay keeps its
    measured 36 us (hta/event-sync, A100) and leaves it out of the error table, instead of predicting
    a 1-thread kernel's few microseconds (which put that trace's modeled step at -15%)."""
    from cosim.models.features import extract_features
    from cosim.models.predict import SOURCES, predict_features
    from cosim.replay import ReplayConfig, replay
    from cosim.workload import load_trace

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: the HTA event-sync trace is needed")
    path = shared / "traces/hta/event-sync.json.gz"
    rg = load_trace(path).ranks[0]
    f = extract_features(rg)
    pred = predict_features(f, load_catalog().accelerator("a100-sxm-80gb"))
    spin = [i for i, k in enumerate(f.kernel) if "spin_kernel" in k]
    assert len(spin) == 1
    assert pred.dur[spin[0]] == f.dur[spin[0]] == pytest.approx(36e-6)
    assert pred.source[spin[0]] == SOURCES.index("measured")
    s = replay(path, None, ReplayConfig(durations="modeled")).summary()
    assert abs(s["error"]) < 0.10 and "other" not in s["kernel_error_by_class"]


def test_launch_key_floor_by_hand():
    """Rows sharing a launch get one prediction: durations 1, 1, 2 us under launch A are best served
    by 1 us (the 1/t-weighted median: APE 0, 0, 50%), launch B's single 3 us row exactly; the floor is
    0.5 / 3 GEMM rows, and the element-wise row does not count."""
    from cosim.models.features import KernelFeatures
    from cosim.models.fit import launch_key_floor, launch_keys

    g = np.array([[4, 1, 1], [4, 1, 1], [4, 1, 1], [8, 1, 1], [4, 1, 1]])
    f = KernelFeatures(cls=["gemm", "gemm", "gemm", "gemm", "elementwise"], kernel=["a", "a", "a", "b", "a"],
                       grid=g, block=np.full((5, 3), 128), dur=np.array([1e-6, 1e-6, 2e-6, 3e-6, 5e-6]))
    floor, rows, launches = launch_key_floor(f)
    assert (rows, launches) == (4, 2) and floor == pytest.approx(0.5 / 4)
    assert len(set(launch_keys(f))) == 2 and len(launch_keys(f, ("elementwise",))) == 1
    assert math.isnan(launch_key_floor(f, ("attention",))[0])


@needs_shared
def test_shapeless_gemms_need_data_not_a_new_model():
    """hta/a100-rank0of2-nccl records no Input Dims: its GEMM kernels (cuDNN convolutions, cutlass) are
    predictable from their launch alone to within ~5% MAPE -- given measurements of those launches --
    but the only other A100 trace with GEMMs (hta control) runs none of them (issue 6's open point)."""
    from cosim.models.fit import KernelDB, launch_key_floor, launch_keys

    hta = shared_dir() / "traces" / "hta"
    test = next(iter(KernelDB.from_traces([hta / "a100-rank0of2-nccl.json.gz"]).values()))
    calib = next(iter(KernelDB.from_traces([hta / "a100-rank3of8-control.json.gz"]).values()))
    assert test.accelerator == calib.accelerator
    floor, rows, launches = launch_key_floor(test.feats)
    assert rows > 500 and launches > 50 and floor < 0.10, (floor, rows, launches)
    assert not set(launch_keys(test.feats)) & set(launch_keys(calib.feats))
    gemm = np.array([c == "gemm" for c in test.feats.cls])
    assert np.isnan(test.feats.k[gemm]).all() and not np.isfinite(test.feats.flops[gemm]).any()  # no K, no work


def test_attention_time_by_hand():
    """One CTA per (batch, head, 128-query block): B=2, H=16, Sq=1024 -> 256 blocks on 132 SMs = 2 waves;
    each block does c*128*Sk*D FLOPs (c = 4 forward, 10 backward) at peak/SMs x efficiency."""
    from cosim.models.calibrated import AttentionParams, attention_time

    hw = HardwareFigures(sm_count=132, hbm_bandwidth=3.35e12, pcie_bandwidth=64e9, peaks={"bf16": 989e12})
    p = AttentionParams(efficiency=0.5, bwd_efficiency=0.25, tile_overhead_s=2e-6, floor_s=4e-6)
    t = attention_time([2, 2], [16, 16], [1024, 1024], [1024, 1024], [128, 128], [False, True], 989e12, hw, p)
    per_sm = 989e12 / 132
    fwd = 4e-6 + 2 * (2e-6 + 4 * 128 * 1024 * 128 / (per_sm * 0.5))
    bwd = 4e-6 + 2 * (2e-6 + 10 * 128 * 1024 * 128 / (per_sm * 0.25))
    assert t == pytest.approx([fwd, bwd], rel=1e-12)
    # one more query block past a full wave costs a whole wave
    assert attention_time([1], [1], [128 * 133], [1024], [128], [False], 989e12, hw, p)[0] == pytest.approx(
        4e-6 + 2 * (2e-6 + 4 * 128 * 1024 * 128 / (per_sm * 0.5)))


def test_cross_gpu_gemm_scales_with_the_target_peak():
    """A profile fitted on one GPU predicts another with the target's figures: a large compute-bound BF16 GEMM
    takes about the ratio of the two dense BF16 peaks (H100 SXM5 vs A100: ~3.2x faster); the shared
    efficiencies and overheads do not change."""
    from cosim.models.features import KernelFeatures
    from cosim.models.predict import predict_features

    prof = load_profile("h100-sxm5")
    cat = load_catalog()
    h100, a100 = cat.accelerator("h100-sxm5"), cat.accelerator("a100-sxm-80gb")
    one = np.ones(1)
    big = KernelFeatures(cls=["gemm"], kernel=["gemm"], op_name=["aten::mm"], dtype=["bf16"], m=8192 * one,
                         n=8192 * one, k=8192 * one, batch=one, heads=one, bwd=np.zeros(1, dtype=bool),
                         flops=2 * 8192.0**3 * one, bytes=3 * 2 * 8192.0**2 * one, dur=np.full(1, np.nan),
                         grid=-np.ones((1, 3), np.int64), block=-np.ones((1, 3), np.int64))
    th = predict_features(big, h100, prof).dur[0]
    ta = predict_features(big, a100, prof).dur[0]
    ratio = h100.peak("bf16") / a100.peak("bf16")
    assert ta / th == pytest.approx(ratio, rel=0.1)


def test_access_patterns_from_pytorch_kernel_names():
    from cosim.models.calibrated import access_patterns

    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3> >",
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<c10::BFloat16> > >",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)>",
        "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 3, 128, 1>",
        "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<...> >",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::TensorListMetadata<4> >",
        "Memcpy HtoD (Pageable -> Device)", "Memcpy HtoD (Pinned -> Device)", "Memcpy DtoH (Device -> Pageable)",
        "some_custom_kernel", "",
    ]
    assert access_patterns(names).tolist() == [
        "contiguous", "strided", "unrolled", "batched_copy", "reduce", "gather", "multi_tensor",
        "pageable", "pinned", "pageable", "", ""]


def test_memory_patterns_by_hand():
    """A batched copy without its own fit is capped at SMs x per-SM bandwidth, a pageable copy at
    PATTERN_RATIO of a pinned one; a profile's own ``pattern:`` fit wins."""
    from cosim.models.calibrated import (
        PATTERN_PREFIX,
        PATTERN_RATIO,
        PATTERN_SM_BANDWIDTH,
        memory_params,
        reference_bandwidth,
    )

    base = MemoryParams(efficiency=0.9, floor_s=2e-6)
    cap = 132 * PATTERN_SM_BANDWIDTH["batched_copy"] / HW.hbm_bandwidth
    assert memory_params(None, base, "batched_copy", HW, HW.hbm_bandwidth).efficiency == pytest.approx(min(0.9, cap))
    assert memory_params(None, base, "contiguous", HW, HW.hbm_bandwidth) is base
    own = MemoryParams(efficiency=0.3, floor_s=1e-6)
    assert memory_params({PATTERN_PREFIX + "strided": own}, base, "strided", HW, HW.hbm_bandwidth) is own
    pcie = reference_bandwidth("memcpy_htod", HW)
    pinned = MemoryParams(efficiency=0.5, floor_s=2e-6)
    pageable = memory_params(None, pinned, "pageable", HW, pcie)
    assert pageable.efficiency == pytest.approx(0.5 * PATTERN_RATIO["pageable"])
    nb = np.array([64e6])
    t_pin, t_page = memory_time(nb, pcie, pinned)[0], memory_time(nb, pcie, pageable)[0]
    assert t_page - 2e-6 == pytest.approx((t_pin - 2e-6) / PATTERN_RATIO["pageable"])


def test_scalar_load_kernels_are_bound_by_elements_not_bytes():
    """A strided (generic TensorIterator) kernel over 9.16 M elements takes elements / (SMs x rate) whether
    FP32 or BF16: on the H100 Qwen trace the FP32 mul [16,559,1024] x [16,559,1] ran 33.4 us and a BF16
    [1024] x [16,559,1024] one 25.1 us (validation/kernels/RESULTS.md), while bytes differ 2x."""
    from cosim.models.calibrated import ELEMENT_RATE_PER_SM, element_time
    from cosim.models.features import KernelFeatures
    from cosim.models.predict import predict_features

    t = element_time(np.array([9.16e6, np.nan]), HW)
    assert t[0] == pytest.approx(9.16e6 / (132 * ELEMENT_RATE_PER_SM)) and t[1] == 0.0
    k = "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<BinaryFunctor<float> > >"
    n = 2
    f = KernelFeatures(cls=["elementwise"] * n, kernel=[k] * n, op_name=["aten::mul"] * n, dtype=["fp32", "bf16"],
                       m=np.full(n, np.nan), n=np.full(n, np.nan), k=np.full(n, np.nan), batch=np.ones(n),
                       heads=np.ones(n), bwd=np.zeros(n, bool), flops=np.full(n, np.nan),
                       bytes=np.array([7.33e7, 3.66e7]), dur=np.full(n, np.nan), grid=-np.ones((n, 3), np.int64),
                       block=-np.ones((n, 3), np.int64), elems=np.array([9.16e6, 9.16e6]))
    prof = load_profile("h100-sxm5")
    d = predict_features(f, H100, prof).dur
    assert d[1] < d[0] < 1.5 * d[1]  # not the 2x of the bytes (measured 33.4 vs 25.1 us)
    assert 20e-6 < d[1] < d[0] < 40e-6


def test_reduction_parallelism_bound_by_hand():
    """One block of 128 threads reducing 1 MB: bytes / (128 x THREAD_BANDWIDTH), far above bytes / HBM;
    a full-GPU launch is bound by HBM; an unknown launch adds no bound."""
    from cosim.models.calibrated import THREAD_BANDWIDTH, parallel_time

    t = parallel_time(np.array([1e6, 1e6, 1e6]), np.array([[1, 1, 1], [10_000, 1, 1], [-1, -1, -1]]),
                      np.array([[128, 1, 1], [512, 1, 1], [-1, -1, -1]]), HW)
    assert t[0] == pytest.approx(1e6 / (128 * THREAD_BANDWIDTH))
    assert t[1] == pytest.approx(1e6 / (132 * 2048 * THREAD_BANDWIDTH))
    assert t[2] == 0.0
    p = MemoryParams(efficiency=0.8, floor_s=2e-6)
    assert memory_time(np.array([1e6]), HW.hbm_bandwidth, p, t[:1])[0] == pytest.approx(2e-6 + t[0])


@needs_shared
def test_leave_one_trace_out_h100_memory_classes():
    """Fit on bert-small + ViT, score the Qwen trace (leave-one-trace-out). Measured 21.2 % elementwise MAPE
    (31.9 % with one efficiency per class, before access patterns) and 16.9 % reduction MAPE
    (validation/kernels/RESULTS.md); the access-pattern model must keep elementwise below 25 %."""
    from cosim.models.calibrated import PATTERN_PREFIX
    from cosim.models.fit import KernelDB, class_errors, fit_profile

    d = shared_dir() / "traces" / "tracelens-h100"
    qwen = next(d.glob("Qwen*"))
    train = KernelDB.from_traces([p for p in sorted(d.glob("*.json.gz")) if p != qwen])["h100-sxm5"]
    prof = fit_profile(train, kernel_scale=False, launch=False)
    assert not any(k.startswith(PATTERN_PREFIX + "strided") for k in prof.models["elementwise"])  # held out: the cap
    errs = class_errors(KernelDB.from_traces([qwen])["h100-sxm5"], prof)
    assert errs["elementwise"]["n"] > 700 and errs["elementwise"]["mape"] <= 0.25, errs["elementwise"]
    assert errs["reduction"]["mape"] <= 0.20, errs["reduction"]


@needs_shared
def test_kernel_db_csv_keeps_launch_block_and_elements(tmp_path):
    """The database CSV carries what the memory bounds need (block dims, element counts): a profile fitted
    from the CSV predicts the Qwen trace's memory-bound kernels like one fitted from the trace."""
    from cosim.models.fit import KernelDB, fit_profile, load_db
    from cosim.models.predict import predict_features

    qwen = next((shared_dir() / "traces" / "tracelens-h100").glob("Qwen*"))
    db = KernelDB.from_traces([qwen])["h100-sxm5"]
    db.write_csv(tmp_path / "h100-sxm5.csv")
    back = load_db(tmp_path / "h100-sxm5.csv")
    assert np.array_equal(back.feats.block, db.feats.block)
    assert np.allclose(back.feats.elems, db.feats.elems, equal_nan=True)
    p1 = fit_profile(db, kernel_scale=False, launch=False)
    p2 = fit_profile(back, kernel_scale=False, launch=False)
    mem = np.isin(np.array(db.feats.cls), ["elementwise", "reduction"])
    d1 = predict_features(db.feats, H100, p1, database=False).dur[mem]
    d2 = predict_features(back.feats, H100, p2, database=False).dur[mem]
    assert np.allclose(d1, d2, rtol=1e-6, equal_nan=True)


def test_fused_adam_bytes_count_the_state_it_writes():
    """aten::_fused_adamw_ over 2 fp32 params of 1000 and 24 elements: reads params, grads, exp_avg,
    exp_avg_sq (and the empty max list, the steps), writes params, exp_avg, exp_avg_sq: 7 x 1024 x 4 B plus
    the two 4-byte steps; the generic rule (inputs + the largest) would say 5 x 1024 x 4."""
    from cosim.workload.cost import mem_bytes

    lst = [[1000], [24]]
    shapes = [lst, lst, lst, lst, [], [[], []]]
    types = ["TensorList"] * 6
    assert mem_bytes("aten::_fused_adamw_", shapes, types, "elementwise") == 7 * 1024 * 4 + 2 * 4
    assert mem_bytes("aten::_foreach_add_", [lst, lst], ["TensorList"] * 2, "elementwise") == 3 * 1024 * 4


def test_narrow_gemm_rule_worked_example() -> None:
    """An FP8 GEMM on H800 (M=4096, N=7168, K=2048) timed by the synthesized-step kernel timer, by hand: the
    profile's BF16 parameters (efficiency 0.7, no per-wave overhead, no small-tile loss) become the narrow-GEMM
    ones (efficiency 0.7 x 0.96 of the FP8 peak, 1.5 us per wave, 82.5 % of HBM, 2.5 us floor). Best candidate:
    256x128 tiles, 16 x 56 = 896 tiles over 132 SMs = 7 waves of (1.5 us + 2*256*128*2048 / (peak/132 x 0.672))."""
    from cosim.models.calibrated import GemmParams
    from cosim.models.precision import NARROW_GEMM, narrow_gemm_params
    from cosim.models.profile import CalibrationProfile
    from cosim.models.synth_timing import KernelTimer
    from cosim.workload.synth.costs import Op

    assert NARROW_GEMM == {"efficiency_ratio": 0.96, "tile_overhead_s": 1.5e-6, "memory_efficiency": 0.825,
                           "floor_s": 2.5e-6}
    bf16 = GemmParams(efficiency=0.7, tile_overhead_s=0.0, memory_efficiency=0.4, floor_s=5e-6, small_tile_alpha=0.0)
    nar = narrow_gemm_params(bf16)
    assert (nar.efficiency, nar.tile_overhead_s, nar.memory_efficiency, nar.floor_s) == pytest.approx(
        (0.672, 1.5e-6, 0.825, 2.5e-6))
    acc = load_catalog().accelerator("h800-sxm5")
    assert acc.sm_count == 132 and float(acc.peak("fp8")) == pytest.approx(1978.9e12)
    prof = CalibrationProfile("hand", "h800-sxm5", models={"gemm": {"bf16": bf16}})
    M, N, K = 4096, 7168, 2048
    ops = [Op("g8", "gemm", 2.0 * M * N * K, M * K + K * N + 2.0 * M * N, "fp8", M, N, K),
           Op("g16", "gemm", 2.0 * M * N * K, 2.0 * (M * K + K * N + M * N), "bf16", M, N, K)]
    t8, t16 = KernelTimer(acc, prof)(ops)
    tile = 2 * 256 * 128 * K / (1978.9e12 / 132 * 0.672)  # 13.32 us
    assert t8 == pytest.approx(2.5e-6 + 7 * (1.5e-6 + tile), rel=1e-9)  # 106.3 us: 1164 TFLOP/s
    # BF16 keeps its own parameters (0.7 of the BF16 peak, no per-wave cost, 5 us floor): without a per-wave
    # cost the finest tile wastes least, 64x32: 64 x 224 = 14336 tiles = 109 waves
    assert t16 == pytest.approx(5e-6 + 109 * 2 * 64 * 32 * K / (989.4e12 / 132 * 0.7), rel=1e-9)
    # a profile with its own FP8 fit keeps it
    own = GemmParams(efficiency=0.5, tile_overhead_s=0.0, memory_efficiency=0.5, floor_s=0.0, small_tile_alpha=0.0)
    prof2 = CalibrationProfile("hand2", "h800-sxm5", models={"gemm": {"bf16": bf16, "fp8": own}})
    assert KernelTimer(acc, prof2)(ops[:1])[0] == pytest.approx(109 * 2 * 64 * 32 * K / (1978.9e12 / 132 * 0.5))


def test_gemm_sustained_throughput_ceiling() -> None:
    """``GemmParams.max_throughput``: a GEMM runs at most that share of the dtype's peak (power-limited clocks),
    worked by hand; the Blackwell rule's 0.64 puts a B200's large BF16 GEMMs on the plateau pytorch/ao PR 2427
    measured (1.41-1.51 PFLOP/s from 3072^3 to 8192^3), where the tile/wave model alone reached 1.79 PFLOP/s."""
    from dataclasses import replace

    import numpy as np

    from cosim.models.calibrated import GemmParams, HardwareFigures, gemm_time, params_to_dict
    from cosim.models.precision import BLACKWELL_GEMM
    from cosim.models.synth_timing import KernelTimer
    from cosim.workload.synth.costs import Op
    from validation.kernels.published.score import HERE, score_source

    b200 = load_catalog().accelerator("b200")
    hw = HardwareFigures.of(b200)
    p = GemmParams(efficiency=1.0, tile_overhead_s=0.0, memory_efficiency=1.0, floor_s=1e-6, small_tile_alpha=0.0)
    M = N = K = 8192.0
    one = (np.array([M]), np.array([N]), np.array([K]), np.array([1.0]), np.array([3 * M * K * 2.0]))
    free = gemm_time(*one, 2.25e15, hw, p)[0]
    capped = gemm_time(*one, 2.25e15, hw, replace(p, max_throughput=0.5))[0]
    # 8192^3 on 148 SMs at full efficiency: 2 * 8192^3 / 2.25e15 = 489 us of math (+ tile quantisation) < the cap
    assert free < 1e-6 + 2 * M * N * K / 2.25e15 * 1.2
    assert capped == pytest.approx(1e-6 + 2 * M * N * K / (0.5 * 2.25e15), rel=1e-12)
    # a small GEMM below the ceiling is not touched
    small = (np.array([256.0]), np.array([256.0]), np.array([256.0]), np.array([1.0]), np.array([3 * 256**2 * 2.0]))
    assert gemm_time(*small, 2.25e15, hw, replace(p, max_throughput=0.5))[0] == gemm_time(*small, 2.25e15, hw, p)[0]
    with pytest.raises(ValueError, match="max_throughput"):
        GemmParams(max_throughput=0.0)
    assert "max_throughput" not in params_to_dict(p)  # fitted profiles keep their YAML
    # the Blackwell rule: a synthesized 8192^3 BF16 GEMM on a B200 runs at 0.64 of 2.25 PFLOP/s (+ the floor)
    rule = BLACKWELL_GEMM["bf16"]
    t = KernelTimer(b200)([Op("g", "gemm", 2 * M * N * K, 3 * M * K * 2.0, "bf16", M, N, K)])[0]
    assert t == pytest.approx(rule["floor_s"] + 2 * M * N * K / (rule["max_throughput"] * 2.25e15), rel=1e-9)
    # the same absolute rate on a GB200 (same die; its 2.5 PFLOP/s sheet peak is power headroom), also for MXFP8
    from cosim.models.precision import blackwell_ceiling

    gb200 = load_catalog().accelerator("gb200")
    assert blackwell_ceiling(gb200, "bf16") == pytest.approx(0.64 * 2.25 / 2.5)
    assert blackwell_ceiling(gb200, "mxfp8") == pytest.approx(0.64 * 4.5 / 5.0)
    assert blackwell_ceiling(b200, "bf16") == pytest.approx(0.64)
    tg = KernelTimer(gb200)([Op("g", "gemm", 2 * M * N * K, 3 * M * K * 2.0, "bf16", M, N, K)])[0]
    assert tg == pytest.approx(t, rel=1e-9)
    # the published plateau (rows of at least 10 us: 3072^3 .. 8192^3) within 11 %
    rows = {r["label"]: r["error"] for r in score_source(HERE / "torchao-b200-bf16.yaml")["rows"]}
    for n in (3072, 4096, 6144, 8192):
        assert abs(rows[f"dense bf16 1x{n}x{n}x{n}"]) < 0.11


def test_blackwell_library_gemm_rule() -> None:
    """On a Blackwell GPU timed with a profile fitted on another architecture, synthesized BF16 and one-byte GEMMs
    take the H100 BF16 parameters through :data:`BLACKWELL_GEMM` (efficiency x ratio, per-wave cost, streaming
    efficiency, floor); a Hopper GPU, or a Blackwell profile on a Blackwell GPU, is left as before."""
    from dataclasses import replace

    import numpy as np

    from cosim.models.calibrated import GemmParams, HardwareFigures, gemm_time
    from cosim.models.precision import (
        BLACKWELL_GEMM,
        LIBRARY_MEMORY_EFFICIENCY,
        architecture,
        library_profile,
        narrow_profile,
    )
    from cosim.models.profile import CalibrationProfile
    from cosim.models.synth_timing import KernelTimer
    from cosim.workload.synth.costs import Op

    assert [architecture(n) for n in ("b200", "gb200", "b300", "h100-sxm5", "NVIDIA B200 (HGX B200, 1000 W)")] == [
        "blackwell", "blackwell", "blackwell", "other", "blackwell"]
    bf16 = GemmParams(efficiency=0.7, tile_overhead_s=0.0, memory_efficiency=0.4, floor_s=5e-6, small_tile_alpha=0.0)
    prof = CalibrationProfile("hand", "h800-sxm5", models={"gemm": {"bf16": bf16}})
    cat = load_catalog()
    b200, h800 = cat.accelerator("b200"), cat.accelerator("h800-sxm5")
    hw = HardwareFigures.of(b200)
    for dt, ib in (("bf16", 2.0), ("fp8", 1.0), ("mxfp8", 1.0)):
        rule = BLACKWELL_GEMM["bf16" if dt == "bf16" else "fp8"]
        want = replace(bf16, efficiency=0.7 * rule["efficiency_ratio"], tile_overhead_s=rule["tile_overhead_s"],
                       memory_efficiency=rule["memory_efficiency"], floor_s=rule["floor_s"],
                       max_throughput=rule["max_throughput"])
        for M, N, K in ((16, 8192, 2048), (4096, 8192, 4096)):
            nb = (M * K + K * N) * ib + 2.0 * M * N
            t = KernelTimer(b200, prof)([Op("g", "gemm", 2.0 * M * N * K, nb, dt, M, N, K)])[0]
            ref = gemm_time(np.array([M]), np.array([N]), np.array([K]), np.array([1.0]), np.array([nb]),
                            float(b200.peak(dt)), hw, want)[0]
            assert t == pytest.approx(ref, rel=1e-9)
    # weight streaming (M = 16): 82.5 % of HBM instead of the trace fit's 40 %
    assert library_profile(prof, b200).params("gemm", "bf16").memory_efficiency == pytest.approx(0.825)
    # Hopper, or a Blackwell profile: the narrow-GEMM rule, and BF16 weight streaming at the library share of HBM
    stream = replace(bf16, memory_efficiency=LIBRARY_MEMORY_EFFICIENCY)
    assert LIBRARY_MEMORY_EFFICIENCY == pytest.approx(0.825)
    for p, acc in ((prof, h800), (CalibrationProfile("bw", "b300", models={"gemm": {"bf16": bf16}}), b200)):
        lib = library_profile(p, acc)
        assert lib.params("gemm", "bf16") == stream
        assert lib.params("gemm", "fp8") == narrow_profile(p).params("gemm", "fp8")
