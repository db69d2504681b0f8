"""Kernel durations of synthesized ops from cosim's kernel models (:mod:`cosim.models`).

The ops become a :class:`cosim.models.features.KernelFeatures` table (class, dtype,
GEMM dims, attention dims, FLOPs, bytes) and go through
:func:`cosim.models.predict.predict_features` with the calibration profile of the
accelerator (the bundled one fitted on it, else the H100 fit predicted cross-GPU, or a
profile the user names). The per-kernel database and kernel-family factors are not
used: synthesized kernels have no recorded names. Attention is causal: the model sees half
the key length (flash kernels skip fully masked key blocks). A decode query (``causal=False``)
reads the whole KV cache: its time is a roofline, the larger of a memory-bound kernel moving its
bytes (the cache read, through the fitted memory model) and its FLOPs at
:data:`DECODE_ATTENTION_EFFICIENCY` of the bf16 peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.workload.synth.costs import Op

__all__ = ["DECODE_ATTENTION_EFFICIENCY", "KernelTimer"]

DECODE_ATTENTION_EFFICIENCY = 580.0 / 989.0
"""Share of the bf16 dense peak that decode attention reaches when compute-bound: FlashMLA's
580 TFLOP/s on H800 SXM5 (989 TFLOP/s bf16 dense), deepseek-ai/FlashMLA README, 2025-02. The fitted
flash-attention model (prefill tiles of 128 query rows, head dim 128) does not cover one query per
request with the heads packed as tile rows."""


class KernelTimer:
    """``timer(ops) -> [seconds]`` for one accelerator and calibration profile."""

    def __init__(self, accelerator: Accelerator, profile: Any = None) -> None:
        from cosim.models.predict import _default_profile

        self.accelerator = accelerator
        self.profile = profile if profile is not None else _default_profile(accelerator)

    def __call__(self, ops: Sequence[Op]) -> list[float]:
        from cosim.models.features import KernelFeatures
        from cosim.models.predict import predict_features

        n = len(ops)
        if n == 0:
            return []
        f = KernelFeatures(
            cls=[o.cls for o in ops], kernel=[f"synthetic:{o.name}" for o in ops], op_name=[o.name for o in ops],
            dtype=[o.dtype for o in ops],
            m=np.array([o.m if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            # causal attention: the kernel skips the masked half of the key blocks
            n=np.array([(o.keys if o.cls == "attention" and o.keys else
                         o.n * 0.5 if o.cls == "attention" and o.causal else o.n)
                        if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            k=np.array([o.k if o.cls in ("gemm", "grouped_gemm", "attention") else np.nan for o in ops]),
            batch=np.array([o.batch for o in ops], dtype=float), heads=np.array([o.heads for o in ops], dtype=float),
            bwd=np.array([o.bwd for o in ops], dtype=bool), flops=np.array([o.flops for o in ops], dtype=float),
            bytes=np.array([o.bytes for o in ops], dtype=float), dur=np.full(n, np.nan),
            grid=np.full((n, 3), -1, dtype=np.int64), block=np.full((n, 3), -1, dtype=np.int64))
        pred = predict_features(f, self.accelerator, self.profile, kernel_scale=False, database=False)
        out = np.where(np.array([o.cls == "collective" for o in ops]), 0.0, pred.dur)
        dec = [i for i, o in enumerate(ops) if o.cls == "attention" and not o.causal]
        if dec:  # decode attention: a roofline of its cache read and its FLOPs at the decode kernels' efficiency
            mem = self([replace(ops[i], name=f"{ops[i].name}.kv_read", cls="elementwise", flops=0.0) for i in dec])
            peak = float(self.accelerator.peak("bf16")) * DECODE_ATTENTION_EFFICIENCY
            for i, t in zip(dec, mem):
                out[i] = max(ops[i].flops / peak, t)
        return [float(x) if np.isfinite(x) else 0.0 for x in out]
