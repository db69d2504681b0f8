"""Held-out check of cosim's Blackwell MXFP8 GEMM times (issue 15 point 7, round 7, lead 3).

Published: flashinfer-ai/flashinfer PR #2464 ("feat: Add MXFP8 GEMM mm_mxfp8 (cutlass)", 2026-02-02), B200,
``benchmarks/flashinfer_benchmark.py --routine mm_mxfp8 --backends cutlass --autotune``, BF16 output, median
time per shape. Nothing in cosim is fitted to these figures: the B200 MXFP8 GEMMs are the H100 fit predicted
cross-GPU under the Blackwell GEMM ceiling (:data:`cosim.models.precision.BLACKWELL_GEMM`).

The check says what RESULTS.md "Round 7" concludes from it: at the sizes of the MoE rows' expert GEMMs
(1024-2048 rows) cosim's MXFP8 GEMM is within 7% of the published kernel time, and at no shape is cosim more
than 10% faster than the published kernel, so a too-fast MXFP8 GEMM model is not what makes the Blackwell
MXFP8 rows too fast."""

from __future__ import annotations

import pytest

from cosim.catalog import load_catalog
from cosim.models.synth_timing import KernelTimer
from cosim.workload.synth.costs import PRECISIONS, _gemm

# (m, n, k, published TFLOP/s): flashinfer PR #2464's B200 MXFP8 CUTLASS table (median times 0.005, 0.017,
# 0.172, 2.838 ms)
FLASHINFER_2464_B200_MXFP8 = [
    (1024, 2048, 1024, 789.981),
    (1024, 4096, 4096, 2014.903),
    (8192, 8192, 4096, 3200.870),
    (16384, 16384, 16384, 3099.690),
]


@pytest.fixture(scope="module")
def timer() -> KernelTimer:
    return KernelTimer(load_catalog().accelerator("b200"))


@pytest.mark.parametrize("m,n,k,tflops", FLASHINFER_2464_B200_MXFP8)
def test_b200_mxfp8_gemm_against_published_cutlass(timer: KernelTimer, m: int, n: int, k: int,
                                                   tflops: float) -> None:
    op = _gemm("heldout", m, n, k, PRECISIONS["mxfp8"])
    assert op.dtype == "mxfp8" and op.flops == 2.0 * m * n * k
    cosim = timer([op])[0]
    published = 2.0 * m * n * k / (tflops * 1e12)
    # never more than 10% faster than the measured kernel; within 25% of it
    assert published <= 1.10 * cosim
    assert abs(published / cosim - 1.0) <= 0.25
    if m <= 2048:  # the expert-GEMM sizes of the MoE rows: within 7%
        assert abs(published / cosim - 1.0) <= 0.07
