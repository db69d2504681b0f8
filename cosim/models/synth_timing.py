"""Kernel durations of synthesized ops from cosim's kernel models (:mod:`cosim.models`).

:func:`synthetic_kernel_timer` is what the scenario layer passes to
:func:`cosim.workload.synth.synthesize` (synthesis, a lower layer, takes its kernel timer as an argument).

The ops become a :class:`cosim.models.features.KernelFeatures` table (class, dtype,
GEMM dims, attention dims, FLOPs, bytes) and go through
:func:`cosim.models.predict.predict_features` with the calibration profile of the
accelerator (the bundled one fitted on it, else the H100 fit predicted cross-GPU, or a
profile the user names; FP8/MXFP8 GEMMs without a fit of their own follow the narrow-GEMM rule,
:data:`cosim.models.precision.NARROW_GEMM`). The per-kernel database and kernel-family factors are not
used: synthesized kernels have no recorded names. Attention is causal: the model sees half
the key length (flash kernels skip fully masked key blocks). A decode query (``causal=False``)
reads the whole KV cache: its time is a roofline, the larger of a memory-bound kernel moving its
bytes (the cache read, through the fitted memory model) and its FLOPs at
:data:`DECODE_ATTENTION_EFFICIENCY` of the bf16 peak.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.errors import CosimInputError
from cosim.workload.synth.costs import Op
from cosim.workload.synth.spec import SyntheticSpec

__all__ = ["DECODE_ATTENTION_EFFICIENCY", "KernelTimer", "calibrated_profile", "synthetic_kernel_timer"]

DECODE_ATTENTION_EFFICIENCY = 580.0 / 989.0
"""Share of the bf16 dense peak that decode attention reaches when compute-bound: FlashMLA's
580 TFLOP/s on H800 SXM5 (989 TFLOP/s bf16 dense), deepseek-ai/FlashMLA README, 2025-02. The fitted
flash-attention model (prefill tiles of 128 query rows, head dim 128) does not cover one query per
request with the heads packed as tile rows."""


class KernelTimer:
    """``timer(ops) -> [seconds]`` for one accelerator and calibration profile."""

    def __init__(self, accelerator: Accelerator, profile: Any = None) -> None:
        from cosim.models.precision import library_profile
        from cosim.models.predict import _default_profile

        self.accelerator = accelerator
        self.profile = profile if profile is not None else _default_profile(accelerator)
        self._model_profile = library_profile(self.profile, accelerator)
        """The profile the GEMMs are timed with: FP8/MXFP8 GEMMs the profile has no fit for follow the
        narrow-GEMM rule (:data:`cosim.models.precision.NARROW_GEMM`); on a Blackwell GPU with a profile of
        another architecture, BF16 and one-byte GEMMs follow :data:`cosim.models.precision.BLACKWELL_GEMM`."""

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
        pred = predict_features(f, self.accelerator, self._model_profile, kernel_scale=False, database=False)
        out = np.where(np.array([o.cls == "collective" for o in ops]), 0.0, pred.dur)
        dec = [i for i, o in enumerate(ops) if o.cls == "attention" and not o.causal]
        if dec:  # decode attention: a roofline of its cache read and its FLOPs at the decode kernels' efficiency
            mem = self([replace(ops[i], name=f"{ops[i].name}.kv_read", cls="elementwise", flops=0.0) for i in dec])
            peak = float(self.accelerator.peak("bf16")) * DECODE_ATTENTION_EFFICIENCY
            for i, t in zip(dec, mem):
                out[i] = max(ops[i].flops / peak, t)
        return [float(x) if np.isfinite(x) else 0.0 for x in out]


def synthetic_kernel_timer(spec: SyntheticSpec, accelerator: Accelerator, base: Path | None = None) -> KernelTimer:
    """The kernel timer of a ``workload: synthetic:`` block on ``accelerator``: with the profile it names
    (a file relative to ``base`` or a bundled name), one fitted to its ``calibrate_from`` traces, or the
    accelerator's default profile."""
    if spec.profile and spec.calibrate_from:
        raise CosimInputError("workload.synthetic: give profile or calibrate_from, not both")
    prof = None
    if spec.profile:
        from cosim.models import load_profile

        prof = load_profile(str(base / spec.profile) if base and (base / spec.profile).is_file() else spec.profile)
    if spec.calibrate_from:
        prof = calibrated_profile(spec.calibrate_from, base)
    return KernelTimer(accelerator, prof)


def calibrated_profile(traces: str | list[str], base: Path | None = None) -> Any:
    """A calibration profile fitted to the kernels of ``traces`` (files or folders, relative to ``base``)."""
    from cosim.models.fit import KernelDB, fit_profile

    paths = []
    for t in [traces] if isinstance(traces, str) else traces:
        p = Path(t)
        if base is not None and not p.is_absolute() and (base / p).exists():
            p = base / p
        if not p.exists():
            raise CosimInputError(f"workload.synthetic.calibrate_from: {t}: no such trace file or folder")
        paths.append(p)
    files = sorted(KernelDB.trace_files(paths), key=str)
    key = tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    if key in _FITTED:
        return _FITTED[key]
    dbs = KernelDB.from_traces(paths, None)
    if len(dbs) != 1:
        raise CosimInputError(f"workload.synthetic.calibrate_from: the traces come from {len(dbs)} GPU models "
                              f"({', '.join(sorted(dbs)) or 'none recognised'}); give traces of one GPU model")
    prof = _FITTED[key] = fit_profile(next(iter(dbs.values())), name="calibrate_from",
                                      provenance={"sources": [str(p) for p in paths]})
    return prof


_FITTED: dict[tuple[Any, ...], Any] = {}
"""Profiles fitted by :func:`calibrated_profile` in this process, by the traces' identity (sweeps refit once)."""
