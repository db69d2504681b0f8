"""Precision what-ifs: BF16 → FP8 / MXFP8 expert GEMMs.

* :func:`fp8_gemm_times` — the GEMMs' modeled time at the FP8 (or MXFP8) catalog peak
  with the profile's calibrated efficiency (the dtype's own fit when the profile has
  one, else the class default: efficiencies are relative to the dtype's peak).
  Operand bytes halve (1-byte inputs, 2-byte output).
* :func:`quantize_times` — the cast/quantize kernels the switch adds: one per GEMM
  activation input (read BF16 ``M x K``, write FP8 ``M x K`` plus per-block scales)
  timed with the profile's ``elementwise`` memory model. Weights are assumed
  pre-quantized (no per-step cost).
* :data:`DISPATCH_BYTES_FACTOR` — MoE dispatch payload bytes scale by
  ``(1 + 4/128) / 2 = 0.515`` (FP8 values plus one fp32 scale per 128 elements,
  DeepSeek-V3 style); combine stays BF16 (factor 1).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.models.calibrated import HardwareFigures, gemm_time, memory_time
from cosim.models.features import KernelFeatures, extract_features
from cosim.models.profile import CalibrationProfile
from cosim.workload.graph import RankGraph

__all__ = ["COMBINE_BYTES_FACTOR", "DISPATCH_BYTES_FACTOR", "fp8_gemm_times", "quantize_times"]

SCALE_BLOCK = 128
"""Elements per scaling factor (1x128 activation tiles; MXFP8 uses 32 with 1-byte E8M0 scales)."""
DISPATCH_BYTES_FACTOR = (1 + 4 / SCALE_BLOCK) / 2
"""Factor on MoE dispatch payload bytes when activations travel in FP8 with fp32 block scales."""
COMBINE_BYTES_FACTOR = 1.0
"""Factor on combine payload bytes (outputs return in BF16)."""


def _scale_bytes(dtype: str) -> float:
    return 1.0 / 32 if dtype == "mxfp8" else 4.0 / SCALE_BLOCK


def _gemm_rows(f: KernelFeatures, ops: Sequence[int]) -> np.ndarray:
    idx = np.asarray(list(ops), dtype=np.int64)
    bad = [int(j) for j in idx if f.cls[j] not in ("gemm", "grouped_gemm") or not np.isfinite(f.m[j])]
    if bad:
        raise ValueError(f"GPU ops {bad[:5]} are not GEMMs with known shapes")
    return idx


def fp8_gemm_times(rg: RankGraph, ops: Sequence[int], accelerator: Accelerator, profile: CalibrationProfile,
                   dtype: str = "fp8") -> np.ndarray:
    """Modeled seconds of GEMM GPU ops ``ops`` (rows of ``rg.gpu_ops``) run in ``dtype`` ("fp8"/"mxfp8")."""
    f = extract_features(rg)
    idx = _gemm_rows(f, ops)
    hw = HardwareFigures.of(accelerator)
    out = np.empty(len(idx))
    for i, j in enumerate(idx):
        p = profile.params(f.cls[j], dtype)
        m, n, k, b = f.m[j], f.n[j], f.k[j], f.batch[j]
        nbytes = b * (m * k + k * n) * 1.0 + b * m * n * 2.0 + b * (m + n) * k * _scale_bytes(dtype)
        out[i] = gemm_time(np.array([m]), np.array([n]), np.array([k]), np.array([b]), np.array([nbytes]),
                           hw.peak(dtype), hw, p)[0]
    return out


def quantize_times(rg: RankGraph, ops: Sequence[int], accelerator: Accelerator, profile: CalibrationProfile,
                   dtype: str = "fp8") -> np.ndarray:
    """Seconds of the quantize kernel added before each GEMM op in ``ops`` (BF16 activations → ``dtype``)."""
    f = extract_features(rg)
    idx = _gemm_rows(f, ops)
    hw = HardwareFigures.of(accelerator)
    act = f.batch[idx] * f.m[idx] * f.k[idx]
    nbytes = act * (2.0 + 1.0 + _scale_bytes(dtype))
    return memory_time(nbytes, hw.hbm_bandwidth, profile.params("elementwise"))
