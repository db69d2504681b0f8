"""A Blackwell-fitted profile (the bundled ``b300``, which GB300 inherits) times synthesized kernels with its own fits
only where its samples identify them (:func:`cosim.models.synth_timing.blackwell_own_profile`): classes it has no fit
for, and GEMMs when none of its GEMM samples ran compute-bound, are timed as on every other Blackwell part."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cosim.catalog import load_catalog
from cosim.models.profile import DB_KEY, compute_bound_gemm_samples, db_key, load_profile, profile_for
from cosim.models.synth_timing import KernelTimer, blackwell_own_profile
from cosim.workload.synth.costs import Op

M = N = K = 8192.0
BIG_GEMM = Op("g", "gemm", 2 * M * N * K, 3 * M * K * 2.0, "bf16", M, N, K)
BIG_FP8 = Op("g8", "gemm", 2 * M * N * K, 3 * M * K * 1.0, "mxfp8", M, N, K)
# one causal flash-attention forward: batch 1, 32 heads, 4096 queries, head dim 128
ATTN = Op("a", "attention", 4 * 32 * 4096 * 4096 * 128 / 2, 3 * 32 * 4096 * 128 * 2.0, "bf16", 4096, 4096, 128,
          batch=1, heads=32)


def test_compute_bound_samples_of_the_bundled_profiles() -> None:
    cat = load_catalog()
    b300, h100 = load_profile("b300"), load_profile("h100-sxm5")
    # the b300 fit's 9 GEMM shapes (toy MoE traces) are all memory-bound: six batched M = 1 GEMMs at 1 FLOP/B, the
    # router-sized ones at 8-14 FLOP/B, against a ridge of ~280
    gemms = [dict(zip(DB_KEY, k)) for k in b300.kernel_db if k[1] == "gemm"]
    assert len(gemms) == 9
    intensity = [2 * r["gemm_m"] * r["gemm_n"] * r["gemm_k"] * r["batch"] / r["bytes"] for r in gemms]
    assert max(intensity) == pytest.approx(13.8, abs=0.1) and sorted(intensity)[5] == pytest.approx(1.0, abs=0.01)
    assert compute_bound_gemm_samples(b300, cat.accelerator("b300")) == 0
    assert compute_bound_gemm_samples(h100, cat.accelerator("h100-sxm5")) == 5
    assert compute_bound_gemm_samples(replace(b300, kernel_db={}), cat.accelerator("b300")) is None


def test_b300_times_unidentified_kernels_as_b200() -> None:
    cat = load_catalog()
    b200, b300 = cat.accelerator("b200"), cat.accelerator("b300")
    # same BF16 / MXFP8 peaks and SMs: an MXFP8 GEMM (never sampled) and attention (no fit) take the B200's time
    # (the library rule; the H100 attention fit cross-GPU), no longer the narrow rule on 0.86 / DEFAULTS' 0.5
    for op in (BIG_FP8, ATTN):
        assert KernelTimer(b300)([op])[0] == pytest.approx(KernelTimer(b200)([op])[0], rel=1e-9)
    # a large BF16 GEMM runs at the library rule's sustained-clock ceiling, 0.64 of 2.25 PFLOP/s, after b300's floor
    own = load_profile("b300")
    p = own.params("gemm", "bf16")
    t = KernelTimer(b300)([BIG_GEMM])[0]
    assert t == pytest.approx(p.floor_s + 2 * M * N * K / (0.64 * 2.25e15), rel=1e-9)
    assert t > 1.2 * 2 * M * N * K / (p.efficiency * 2.25e15)  # type: ignore[union-attr]  # 0.86: >20 % faster
    # what the b300 fit did measure stays: its element-wise and reduction fits, and all its BF16 GEMM parameters but
    # the main loop and the ceiling
    used = blackwell_own_profile(own, b300)
    assert used.models["elementwise"] == own.models["elementwise"]
    assert used.models["reduction"] == own.models["reduction"]
    assert "attention" in used.models and "attention" not in own.models
    g = used.params("gemm", "bf16")
    assert (g.tile_overhead_s, g.floor_s, g.memory_efficiency, g.small_tile_alpha) == (  # type: ignore[union-attr]
        p.tile_overhead_s, p.floor_s, p.memory_efficiency, p.small_tile_alpha)  # type: ignore[union-attr]
    assert g.max_throughput == pytest.approx(0.64)  # type: ignore[union-attr]
    # so small GEMMs (the held-out B300 ones, moe_02/04/06: overhead- and memory-bound) are timed as before, within 1 %
    small = Op("s", "gemm", 2 * 128 * 1024 * 512, (128 * 512 + 512 * 1024 + 128 * 1024) * 2.0, "bf16", 128, 1024, 512)
    from cosim.models.precision import library_profile
    from cosim.models.synth_timing import blackwell_memory_profile

    before = KernelTimer(b300)
    before._model_profile = blackwell_memory_profile(library_profile(own, b300), b300)
    assert KernelTimer(b300)([small])[0] == pytest.approx(before([small])[0], rel=0.01)


def test_a_profile_with_a_compute_bound_gemm_keeps_its_gemm_fit() -> None:
    cat = load_catalog()
    b300 = cat.accelerator("b300")
    own = load_profile("b300")
    db = dict(own.kernel_db)  # one 8192^3 BF16 GEMM measured: 2.2 ms, compute-bound on a B300
    db[db_key("nvjet_big", "gemm", "bf16", M, N, K, 1.0, 1.0, False, 3 * M * K * 2.0)] = (2.2e-3, 3)
    fitted = replace(own, kernel_db=db)
    assert compute_bound_gemm_samples(fitted, b300) == 1
    assert compute_bound_gemm_samples(fitted, b300, ("fp8", "mxfp8")) == 0
    used = blackwell_own_profile(fitted, b300)
    assert used.models["gemm"]["default"] == own.models["gemm"]["default"]  # its own BF16 fit, uncapped
    assert KernelTimer(b300, fitted)([BIG_GEMM])[0] < KernelTimer(b300)([BIG_GEMM])[0]
    # no one-byte GEMM sampled: MXFP8 GEMMs still take the Blackwell library rule whole, as on B200
    assert KernelTimer(b300, fitted)([BIG_FP8])[0] == pytest.approx(
        KernelTimer(cat.accelerator("b200"))([BIG_FP8])[0], rel=1e-9)
    # a profile of another architecture, or a GPU that is not Blackwell, is left alone
    h100 = load_profile("h100-sxm5")
    assert blackwell_own_profile(h100, b300) is h100
    assert blackwell_own_profile(own, cat.accelerator("h100-sxm5")) is own


def test_gb300_inherits_the_rule_through_the_b300_profile() -> None:
    cat = load_catalog()
    gb200, gb300 = cat.accelerator("gb200"), cat.accelerator("gb300")
    prof = profile_for(gb300.name)
    assert prof is not None and prof.accelerator == "b300"  # catalog ``extends``: GB300 is timed with the b300 fit
    # same BF16 / MXFP8 peaks as GB200: an MXFP8 GEMM and attention take the GB200's time, and a large BF16 GEMM
    # GB200's sustained-clock ceiling (0.576 of 2.5 PFLOP/s: B200's absolute rate) after b300's floor
    for op in (BIG_FP8, ATTN):
        assert KernelTimer(gb300)([op])[0] == pytest.approx(KernelTimer(gb200)([op])[0], rel=1e-9)
    p = prof.params("gemm", "bf16")
    t = KernelTimer(gb300)([BIG_GEMM])[0]
    assert t == pytest.approx(p.floor_s + 2 * M * N * K / (0.576 * 2.5e15), rel=1e-9)  # type: ignore[union-attr]


def test_identification_is_per_dtype() -> None:
    """A compute-bound MXFP8 sample identifies the MXFP8 fit, not the BF16 one (a user's MXFP8 recipe trace whose
    BF16 GEMMs are all router-sized): BF16 GEMMs keep the library main loop and ceiling."""
    cat = load_catalog()
    b300 = cat.accelerator("b300")
    own = load_profile("b300")
    db = dict(own.kernel_db)  # one 8192^3 MXFP8 GEMM measured: 0.35 ms, compute-bound on a B300
    db[db_key("nvjet_mx", "gemm", "mxfp8", M, N, K, 1.0, 1.0, False, 3 * M * K * 1.0)] = (0.35e-3, 3)
    mx = replace(own.params("gemm", "bf16"), efficiency=0.7)  # its own MXFP8 fit
    fitted = replace(own, kernel_db=db, models={**own.models, "gemm": {**own.models["gemm"], "mxfp8": mx}})
    assert compute_bound_gemm_samples(fitted, b300) == 1
    assert compute_bound_gemm_samples(fitted, b300, ("bf16",)) == 0
    used = blackwell_own_profile(fitted, b300)
    assert used.models["gemm"]["mxfp8"] == mx
    assert KernelTimer(b300, fitted)([BIG_GEMM])[0] == pytest.approx(KernelTimer(b300)([BIG_GEMM])[0], rel=1e-9)
    from cosim.models.precision import library_profile
    from cosim.models.synth_timing import blackwell_memory_profile

    as_fitted = KernelTimer(b300, fitted)
    as_fitted._model_profile = blackwell_memory_profile(library_profile(fitted, b300), b300)
    assert KernelTimer(b300, fitted)([BIG_FP8])[0] == pytest.approx(as_fitted([BIG_FP8])[0], rel=1e-9)
    assert KernelTimer(b300, fitted)([BIG_FP8])[0] < KernelTimer(b300)([BIG_FP8])[0]  # 0.7 of 4.5 PFLOP/s uncapped
