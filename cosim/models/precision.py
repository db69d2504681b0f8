"""Precision what-ifs: BF16 → FP8 / MXFP8 GEMMs (expert GEMMs, or all), wired into replay.

Library functions:

* :func:`fp8_gemm_times` — the GEMMs' modeled time at the FP8 (or MXFP8) catalog peak
  with the profile's calibrated efficiency (the dtype's own fit when the profile has
  one, else the class default: efficiencies are relative to the dtype's peak).
  Operand bytes: 1-byte inputs, 2-byte (BF16) output, plus block scales.
* :func:`quantize_times` — the cast/quantize kernels the switch adds: one per GEMM
  activation input (read BF16 ``M x K``, write FP8 ``M x K`` plus per-block scales)
  timed with the profile's ``elementwise`` memory model. Weights are assumed
  pre-quantized (no per-step cost).
* :data:`DISPATCH_BYTES_FACTOR` — MoE dispatch payload bytes scale by
  ``(1 + 4/128) / 2 = 0.515`` (FP8 values plus one fp32 scale per 128 elements,
  DeepSeek-V3 style); combine stays BF16 (factor 1).

The replay what-if (``--set precision.experts=fp8``, ``precision.gemm=fp8``) is
:func:`apply_precision`: it rewrites one rank's execution graph (see docs/MODELS.md,
"Precision what-ifs"):

* **Which GEMMs** (:func:`expert_gemm_mask`): GPU ops of model class ``gemm`` /
  ``grouped_gemm`` with known shapes that are grouped GEMMs (``OpClass.GROUPED_GEMM``,
  or an enclosing host op named ``*_grouped_mm*``), or that run inside a host op whose
  *label* (its name up to the first ``[`` or ``(``) contains ``expert``
  (``cosim::layer0.moe.experts``, ``expert_ffn[...]``, ``shared_experts``; not
  ``MoE[experts=8, ...]``, whose label is ``MoE``). ``precision.gemm`` takes every GEMM.
* **GEMM time**: ``new = old x t_model(fp8) / t_model(base)``, where ``old`` is the op's
  duration in this replay (measured, or modeled with ``durations=modeled``) and
  ``t_model`` the calibrated tile/wave GEMM model on the accelerator at the dtype's
  catalog peak with the profile's efficiency for that dtype. ``base`` is the GEMM's
  traced dtype (or the projection dtype of a projected CPU capture). GEMMs already at
  one byte per element or narrower, and GEMMs without shapes, are left alone.
* **Quantize kernels**: one new ``elementwise`` GPU op per GEMM *call* (an
  ``aten::_grouped_mm`` and all the kernels it runs count once; otherwise the GEMM's
  parent ATen op), on the same stream, launched by the same host call, immediately
  before the call's first GEMM kernel: read ``sum(batch x M x K)`` activation elements
  at the base dtype, write them as FP8 plus scales, timed by the profile's
  ``elementwise`` memory model. Weights are taken as pre-quantized.
* **Dispatch payload**: all-to-all collectives with a floating-point payload inside a
  host op whose label contains ``dispatch`` (``cosim::layer0.moe.dispatch``), and GPU ops
  of class ``moe_dispatch``, move ``(1 + scale bytes) / base bytes`` of their bytes
  (0.515 from BF16 to FP8 with one fp32 scale per 128 values; MXFP8: one byte per 32
  values, 0.516); simulated collectives see the smaller bytes, measured ones have
  their duration scaled by the same factor (bandwidth-bound). Combine and the
  backward all-to-alls stay in the base dtype.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from cosim.catalog.models import Accelerator
from cosim.models.calibrated import GEMM_CLASSES, GemmParams, HardwareFigures, gemm_time, memory_time
from cosim.models.features import KernelFeatures, elem_bytes, extract_features
from cosim.models.profile import CalibrationProfile
from cosim.workload.graph import CollType, CopyKind, EdgeKind, GpuKind, OpClass, RankGraph, StringTable, Table

__all__ = [
    "BLACKWELL_CEILING_SOURCE",
    "BLACKWELL_GEMM",
    "BLACKWELL_GEMM_SOURCE",
    "COMBINE_BYTES_FACTOR",
    "DISPATCH_BYTES_FACTOR",
    "LIBRARY_MEMORY_EFFICIENCY",
    "NARROW_GEMM",
    "NARROW_GEMM_SOURCE",
    "PRECISION_DTYPES",
    "PRECISION_SCOPES",
    "PrecisionResult",
    "apply_precision",
    "architecture",
    "dispatch_bytes_factor",
    "dispatch_mask",
    "expert_gemm_mask",
    "fp8_gemm_times",
    "library_profile",
    "narrow_gemm_params",
    "narrow_profile",
    "quantize_times",
]

SCALE_BLOCK = 128
"""Elements per scaling factor (1x128 activation tiles; MXFP8 uses 32 with 1-byte E8M0 scales)."""
DISPATCH_BYTES_FACTOR = (1 + 4 / SCALE_BLOCK) / 2
"""Factor on MoE dispatch payload bytes when BF16 activations travel in FP8 with fp32 block scales."""
COMBINE_BYTES_FACTOR = 1.0
"""Factor on combine payload bytes (outputs return in BF16)."""
PRECISION_DTYPES = ("bf16", "fp8", "mxfp8")
"""Values of the ``precision.*`` knobs: ``bf16`` leaves the ops as traced."""
PRECISION_SCOPES = ("experts", "gemm")
"""Keys of the ``precision.*`` knobs: the MoE expert GEMMs, or every GEMM."""
_NARROW = 1.0
"""Bytes per element at or below which a GEMM / payload is already low precision."""


NARROW_GEMM = {"efficiency_ratio": 0.96, "tile_overhead_s": 1.5e-6, "memory_efficiency": 0.825, "floor_s": 2.5e-6}
"""GEMMs in a one-byte dtype (fp8, mxfp8) that the profile has no fit for: the BF16 parameters with the
main-loop efficiency (a fraction of the narrow dtype's own peak) x ``efficiency_ratio``, a fixed cost per
wave of tiles ``tile_overhead_s`` (prologue, scale loads, epilogue: it does not shrink with the faster math,
so a short K loses more of the doubled peak), the operands streamed at ``memory_efficiency`` of HBM when the
GEMM is bound by its (one-byte) weights, and a launch-to-completion ``floor_s``. Fitted by
validation/kernels/published/fit.py on one source, DeepGEMM's H800 FP8 table (:data:`NARROW_GEMM_SOURCE`;
28 dense and grouped shapes, median |error| 3 %); the other published sources are held out
(validation/kernels/RESULTS.md, "Published GEMM throughputs")."""
NARROW_GEMM_SOURCE = "deepseek-ai/DeepGEMM README.md @55ab91f (2025-03-25), H800 SXM5 FP8 normal / grouped GEMMs"
"""Where :data:`NARROW_GEMM` was fitted."""
_NARROW_DTYPES = ("fp8", "mxfp8")


BLACKWELL_GEMM: dict[str, dict[str, float]] = {
    "bf16": {"efficiency_ratio": 1.26, "tile_overhead_s": 4.0e-6, "memory_efficiency": 0.825, "floor_s": 2.5e-6,
             "max_throughput": 0.64},
    "fp8": {"efficiency_ratio": 0.88, "tile_overhead_s": 1.5e-6, "memory_efficiency": 0.825, "floor_s": 2.5e-6,
            "max_throughput": 0.64},
}
"""Library GEMMs (cuBLAS / cuBLASLt / CUTLASS) on a Blackwell GPU (SM100: B200, GB200, B300, GB300) timed with a
profile fitted on another architecture (the bundled H100 fit): the H100 BF16 parameters with the main-loop
efficiency x ``efficiency_ratio`` (of the dtype's own peak), a per-wave cost ``tile_overhead_s``, weight streaming
at ``memory_efficiency`` of HBM and a ``floor_s``. ``bf16`` for BF16 GEMMs, ``fp8`` for one-byte GEMMs (FP8 with
per-tensor scales and MXFP8: Blackwell's tensor cores apply the block scales in the MMA, so no CUDA-core promotion
as in Hopper's block-scaled kernels). Fitted by validation/kernels/published/fit.py on XLA's B200 matmul table
(rows of at least 10 µs; floor and memory efficiency held at the DeepGEMM fit's, which that table, M >= 256, cannot
identify) and scored held-out on vLLM's B200 tables and Primus-Turbo's GB200 MXFP8 averages
(validation/kernels/RESULTS.md, "round 5"). ``max_throughput``: the sustained-clock ceiling (a GEMM runs at most
this share of the dtype's dense peak): a B200's BF16 GEMMs plateau at 1.41-1.51 PFLOP/s from 3072^3 to 8192^3
(pytorch/ao PR 2427, :data:`BLACKWELL_CEILING_SOURCE`), 0.64 of the 2.25 PFLOP/s peak, where the tile/wave model
fitted on XLA's shapes (at most 4096) kept rising to 0.80 at 8192^3. Fitted on that source alone (rows of at
least 10 µs, the other parameters held); held out: XLA's table (no row binds), cuBLAS MXFP8 16384^3 / 32768^3
(0.58-0.59 of the FP8 peak: the FP8 rule stays below the ceiling) and cuBLAS BF16 4096 x 8192 x 4096 (1634
TFLOP/s, another B200 setup: -13 %). One absolute rate per die: :func:`blackwell_ceiling` scales the share by the
B200's sheet peak over the part's (GB200: 1.44 PFLOP/s BF16 like the B200, 0.576 of its own 2.5)."""
BLACKWELL_CEILING_REFERENCE = "b200"
"""The catalog part whose dense peaks the ceiling's share refers to: the B200 (HGX, 1000 W). A GB200's sheet peaks
are 11 % higher (its 1200 W allows higher boost clocks; same die, 148 SMs, the catalog's same 1.98 GHz) but its
training throughput is not: Megatron-Bridge 25.11 (docs/performance-summary.md, NeMo 25.11 tables) runs Llama-3-8B
(8 GPUs, FP8-CS and MXFP8, GBS 128, MBS 2, seq 8192, the same layout on both) at 31508 / 29789 tokens/s/GPU on
GB200 and 30624 / 29521 on B200, +2.9 % / +0.9 %, not +11 %."""
BLACKWELL_CEILING_SOURCE = ("pytorch/ao PR 2427 (benchmarks/float8/bench_matmul.py on an NVIDIA B200): torch.mm BF16 "
                            "square GEMMs 1024^3..8192^3, 1.41-1.51 PFLOP/s from 3072^3 up")
BLACKWELL_GEMM_SOURCE = ("XLA default matmul perf table, sm_100_B200 (xla/service/gpu/model/matmul_interpolator_data.h): "
                         "125 shapes M, N, K in 256..4096, BF16 (cuBLAS) and FP8 E4M3 per-tensor (cuBLASLt)")
_BLACKWELL = re.compile(r"\bG?B[23]00\b")


def architecture(name: str) -> str:
    """``blackwell`` for an SM100 part's catalog name or key (B200, GB200, B300, GB300), else ``other``."""
    return "blackwell" if _BLACKWELL.search(name.upper()) else "other"


LIBRARY_MEMORY_EFFICIENCY = NARROW_GEMM["memory_efficiency"]
"""Share of HBM at which a synthesized (library: cuBLAS / CUTLASS) BF16 GEMM streams its operands when it is
bound by them, at least: the narrow-GEMM rule's 0.825 (DeepGEMM's weight streaming). The bundled H100 fit's 0.41
comes from the traces' small CUTLASS kernels; library kernels stream at 0.7-0.9 (held out: vLLM's H100 and B200
``torch.mm`` rows, M = 1...256, −53 % → −14 %; XLA's H100 cuBLAS table −15 % → −5 %; validation/kernels/RESULTS.md)."""


def library_profile(profile: CalibrationProfile, accelerator: Accelerator) -> CalibrationProfile:
    """The profile synthesized GEMMs are timed with on ``accelerator``: :func:`narrow_profile` of ``profile`` with
    BF16 GEMMs streaming at :data:`LIBRARY_MEMORY_EFFICIENCY` of HBM at least, and, where ``profile`` was fitted on another architecture than a Blackwell ``accelerator``, BF16 and one-byte GEMM
    parameters from :data:`BLACKWELL_GEMM` (a copy; ``profile`` is left alone)."""
    from dataclasses import replace

    out = narrow_profile(profile)
    models = {c: dict(by) for c, by in out.models.items()}
    for cls in GEMM_CLASSES:  # library kernels stream their operands at the narrow rule's share of HBM
        own = out.params(cls, "bf16")
        if isinstance(own, GemmParams) and own.memory_efficiency < LIBRARY_MEMORY_EFFICIENCY:
            models.setdefault(cls, {})["bf16"] = replace(own, memory_efficiency=LIBRARY_MEMORY_EFFICIENCY)
    if architecture(accelerator.name) != "blackwell" or architecture(profile.accelerator) == "blackwell":
        return replace(out, models=models)
    for cls in GEMM_CLASSES:
        base = profile.params(cls, "bf16")
        if not isinstance(base, GemmParams):
            continue
        for dt, rule in (("bf16", BLACKWELL_GEMM["bf16"]), *((d, BLACKWELL_GEMM["fp8"]) for d in _NARROW_DTYPES)):
            models.setdefault(cls, {})[dt] = replace(
                base, efficiency=min(1.0, base.efficiency * rule["efficiency_ratio"]),
                tile_overhead_s=rule["tile_overhead_s"], memory_efficiency=rule["memory_efficiency"],
                floor_s=rule["floor_s"], max_throughput=blackwell_ceiling(accelerator, dt))
    return replace(out, models=models)


def blackwell_ceiling(accelerator: Accelerator, dtype: str) -> float:
    """The sustained-clock ceiling of :data:`BLACKWELL_GEMM` on ``accelerator``, as a share of its own ``dtype``
    peak: ``max_throughput`` scaled by the B200's sheet peak over the part's sheet peak in the bundled catalog
    (:data:`BLACKWELL_CEILING_REFERENCE`; only parts rated above the B200 are held back): the same absolute rate on
    every part of the B200 die (GB200: 2.25 / 2.5 x 0.64 = 0.576 of its 2.5 PFLOP/s BF16). The share applies to the
    accelerator's own peak, so a what-if that raises the peak raises the ceiling with it."""
    from cosim.catalog import load_catalog

    share = float(BLACKWELL_GEMM["bf16" if dtype == "bf16" else "fp8"]["max_throughput"])
    cat = load_catalog()
    sheet = next((a for a in cat.accelerators.values() if a.name == accelerator.name), None)
    if sheet is None:
        return share
    try:
        ratio = float(cat.accelerator(BLACKWELL_CEILING_REFERENCE).peak(dtype)) / float(sheet.peak(dtype))
    except KeyError:
        return share
    return share * min(1.0, ratio)


def narrow_gemm_params(p: GemmParams) -> GemmParams:
    """The parameters of a one-byte GEMM from the profile's BF16 (or default) GEMM parameters ``p``
    (rule: :data:`NARROW_GEMM`)."""
    from dataclasses import replace

    return replace(p, efficiency=min(1.0, p.efficiency * NARROW_GEMM["efficiency_ratio"]),
                   tile_overhead_s=NARROW_GEMM["tile_overhead_s"],
                   memory_efficiency=NARROW_GEMM["memory_efficiency"], floor_s=NARROW_GEMM["floor_s"])


def narrow_profile(profile: CalibrationProfile) -> CalibrationProfile:
    """``profile`` with ``fp8`` / ``mxfp8`` GEMM and grouped-GEMM parameters from :func:`narrow_gemm_params`
    wherever it has no fit of its own for them (a copy; ``profile`` is left alone)."""
    from dataclasses import replace

    models = {c: dict(by) for c, by in profile.models.items()}
    for cls in GEMM_CLASSES:
        for dt in _NARROW_DTYPES:
            if _fitted(profile, cls, dt):
                continue
            base = profile.params(cls, "bf16")
            if isinstance(base, GemmParams):
                models.setdefault(cls, {})[dt] = narrow_gemm_params(base)
    return replace(profile, models=models)


def _scale_bytes(dtype: str) -> float:
    """Scale bytes per element: MXFP8 one E8M0 byte per 32 values, FP8 one fp32 per 128."""
    return 1.0 / 32 if dtype == "mxfp8" else 4.0 / SCALE_BLOCK


def dispatch_bytes_factor(dtype: str, base: str = "bf16") -> float:
    """Factor on a dispatch payload sent in ``dtype`` instead of ``base`` (1 if not narrower)."""
    eb = elem_bytes(base)
    if dtype not in ("fp8", "mxfp8") or eb <= _NARROW:
        return 1.0
    return (1.0 + _scale_bytes(dtype)) / eb


def _gemm_rows(f: KernelFeatures, ops: Sequence[int]) -> np.ndarray:
    idx = np.asarray(list(ops), dtype=np.int64)
    bad = [int(j) for j in idx if f.cls[j] not in GEMM_CLASSES or not np.isfinite(f.m[j])]
    if bad:
        raise ValueError(f"GPU ops {bad[:5]} are not GEMMs with known shapes")
    return idx


def _fitted(profile: CalibrationProfile, cls: str, dtype: str) -> bool:
    """Whether the profile has parameters fitted on ``dtype`` itself for GEMM class ``cls``."""
    return dtype in (profile.models.get(cls) or {}) or (cls == "grouped_gemm" and dtype in (profile.models.get("gemm") or {}))


def _gemm_model(f: KernelFeatures, idx: np.ndarray, dtype: str, hw: HardwareFigures,
                profile: CalibrationProfile, like: str | None = None) -> np.ndarray:
    """Plain tile/wave model time (s) of GEMM rows ``idx`` run in ``dtype`` (no kernel-name effects).

    FP8/MXFP8: 1-byte operands, BF16 output, block scales; else every operand at ``dtype``'s width.
    Parameters: the profile's fit for ``dtype`` if it has one; else, for FP8/MXFP8, the narrow-GEMM rule
    (:func:`narrow_gemm_params` of the BF16 fit); else those of ``like`` (the dtype the GEMM was measured in:
    efficiencies are fractions of the dtype's own peak), else the class default."""
    out = np.empty(len(idx))
    low = dtype in ("fp8", "mxfp8")
    eb = 1.0 if low else elem_bytes("fp32" if dtype == "tf32" else dtype)
    for i, j in enumerate(idx):
        own = like is None or _fitted(profile, f.cls[j], dtype)
        p = profile.params(f.cls[j], dtype if own or like is None else like)
        if low and not _fitted(profile, f.cls[j], dtype) and isinstance(p, GemmParams):
            p = narrow_gemm_params(profile.params(f.cls[j], "bf16"))  # type: ignore[arg-type]
        m, n, k, b = f.m[j], f.n[j], f.k[j], f.batch[j]
        nbytes = b * (m * k + k * n) * eb + b * m * n * (2.0 if low else eb)
        if low:
            nbytes += b * (m + n) * k * _scale_bytes(dtype)
        out[i] = gemm_time(np.array([m]), np.array([n]), np.array([k]), np.array([b]), np.array([nbytes]),
                           hw.peak(dtype), hw, p)[0]  # type: ignore[arg-type]
    return out


def fp8_gemm_times(rg: RankGraph, ops: Sequence[int], accelerator: Accelerator, profile: CalibrationProfile,
                   dtype: str = "fp8") -> np.ndarray:
    """Modeled seconds of GEMM GPU ops ``ops`` (rows of ``rg.gpu_ops``) run in ``dtype`` ("fp8"/"mxfp8")."""
    f = extract_features(rg)
    return _gemm_model(f, _gemm_rows(f, ops), dtype, HardwareFigures.of(accelerator), profile)


def quantize_times(rg: RankGraph, ops: Sequence[int], accelerator: Accelerator, profile: CalibrationProfile,
                   dtype: str = "fp8") -> np.ndarray:
    """Seconds of the quantize kernel added before each GEMM op in ``ops`` (BF16 activations → ``dtype``)."""
    f = extract_features(rg)
    idx = _gemm_rows(f, ops)
    hw = HardwareFigures.of(accelerator)
    act = f.batch[idx] * f.m[idx] * f.k[idx]
    nbytes = act * (2.0 + 1.0 + _scale_bytes(dtype))
    return memory_time(nbytes, hw.hbm_bandwidth, profile.params("elementwise"))  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- selection

def _label(name: str) -> str:
    """A host op's label: its name up to the first '[' or '(' (annotation arguments dropped)."""
    return re.split(r"[\[(]", name, maxsplit=1)[0].lower()


def _enclosing(rg: RankGraph, pred) -> np.ndarray:  # type: ignore[no-untyped-def]
    """Host ops that match ``pred(name)`` or lie inside one that does (pre-order: parents first)."""
    H = rg.host_ops
    n = len(H)
    hit = np.array([bool(pred(rg.name(int(H.name[i])))) for i in range(n)], dtype=bool)
    out = hit.copy()
    par = H.parent
    for i in range(n):
        p = int(par[i])
        if p >= 0 and out[p]:
            out[i] = True
    return out


def _host_mask_to_gpu(rg: RankGraph, host: np.ndarray) -> np.ndarray:
    """GPU ops whose parent op, or whose launch call, is inside ``host``."""
    G, L = rg.gpu_ops, rg.launches
    out = np.zeros(len(G), dtype=bool)
    if not len(host):
        return out
    op = np.asarray(G.op, dtype=np.int64)
    ok = op >= 0
    out[ok] = host[op[ok]]
    li = np.asarray(G.launch, dtype=np.int64)
    okl = li >= 0
    lh = np.asarray(L.host_op, dtype=np.int64)[li[okl]]
    out[okl] |= host[lh]
    return out


def _is_grouped(name: str) -> bool:
    return "_grouped_mm" in name.lower()


def expert_gemm_mask(rg: RankGraph, f: KernelFeatures | None = None) -> np.ndarray:
    """GPU ops of ``rg`` that are MoE expert GEMMs with known shapes (rule in the module docs)."""
    f = f if f is not None else extract_features(rg)
    gemm = np.array([c in GEMM_CLASSES for c in f.cls], dtype=bool) & np.isfinite(f.m)
    host = _enclosing(rg, lambda nm: _is_grouped(nm) or "expert" in _label(nm))
    return gemm & ((np.asarray(rg.gpu_ops.cls) == OpClass.GROUPED_GEMM) | _host_mask_to_gpu(rg, host))


def dispatch_mask(rg: RankGraph) -> tuple[np.ndarray, np.ndarray]:
    """(collective rows, GPU ops) carrying MoE dispatch payload (rule in the module docs)."""
    C = rg.collectives
    host = _enclosing(rg, lambda nm: "dispatch" in _label(nm))
    rows = np.zeros(len(C), dtype=bool)
    for c in range(len(C)):
        h = int(C.host_op[c])
        if int(C.type[c]) != CollType.ALL_TO_ALL or h < 0 or not host[h]:
            continue
        dt = rg.name(int(C.dtype[c])).lower() if C.dtype[c] >= 0 else ""
        rows[c] = not any(s in dt for s in ("long", "int", "bool", "char", "byte"))
    gpu = np.asarray(rg.gpu_ops.cls) == OpClass.MOE_DISPATCH
    return rows, gpu


# ----------------------------------------------------------------------------- the what-if

@dataclass
class PrecisionResult:
    """One rank after :func:`apply_precision`. Indices refer to ``graph``'s tables; times in s."""

    graph: RankGraph
    """The rank with quantize ops inserted and dispatch bytes scaled."""
    durations: np.ndarray
    """Seconds per GPU op of ``graph`` that replace its recorded duration where finite (NaN: keep)."""
    gemm_ops: np.ndarray
    """GEMM ops switched to the low-precision dtype."""
    gemm_dtype: list[str]
    """Dtype each of ``gemm_ops`` now runs in."""
    gemm_time_before_s: float
    gemm_time_after_s: float
    quantize_ops: np.ndarray
    """The inserted quantize kernels."""
    quantize_time_s: float
    dispatch_collectives: np.ndarray
    """Collective rows whose payload shrank."""
    dispatch_bytes_before: float
    dispatch_bytes_after: float
    skipped_gemms: int = 0
    """Selected GEMM kernels left alone (no shapes, or already one byte per element)."""
    info: dict = field(default_factory=dict)

    def summary(self) -> dict:
        """JSON-ready totals."""
        return {
            "gemm_ops": len(self.gemm_ops), "gemm_time_before_s": self.gemm_time_before_s,
            "gemm_time_after_s": self.gemm_time_after_s, "quantize_ops": len(self.quantize_ops),
            "quantize_time_s": self.quantize_time_s, "dispatch_collectives": len(self.dispatch_collectives),
            "dispatch_bytes_before": self.dispatch_bytes_before, "dispatch_bytes_after": self.dispatch_bytes_after,
            "skipped_gemms": self.skipped_gemms,
        }


def _projection_dtype(rg: RankGraph) -> str | None:
    if not rg.source.get("projected"):
        return None
    try:
        dt = json.loads(rg.source.get("projection") or "{}").get("dtype")
    except (TypeError, ValueError):
        return None
    return None if dt in (None, "captured") else str(dt)


def _check(dtype: str | None, key: str) -> str | None:
    if dtype is None or dtype in ("", "bf16", "off", "none"):
        return None
    if dtype not in PRECISION_DTYPES:
        raise ValueError(f"precision.{key} must be one of {', '.join(PRECISION_DTYPES)}, got {dtype!r}")
    return dtype


def apply_precision(rg: RankGraph, accelerator: Accelerator, profile: CalibrationProfile | None = None, *,
                    experts: str | None = None, gemm: str | None = None,
                    durations: np.ndarray | None = None) -> PrecisionResult:
    """Run ``rg``'s expert GEMMs in ``experts`` and/or every GEMM in ``gemm`` ("fp8" | "mxfp8"; None /
    "bf16": as traced) on ``accelerator`` with ``profile`` (None: the accelerator's bundled profile).

    ``durations`` (s per GPU op, NaN = recorded duration) are the durations the replay would use
    (modeled replay); None means the recorded ones. Returns the rewritten rank (see module docs)."""
    from cosim.models.predict import _default_profile

    experts, gemm = _check(experts, "experts"), _check(gemm, "gemm")
    prof = profile if profile is not None else _default_profile(accelerator)
    hw = HardwareFigures.of(accelerator)
    G = rg.gpu_ops
    n = len(G)
    f = extract_features(rg)
    base_dur = np.asarray(G.dur, dtype=float).copy()
    if durations is not None:
        d = np.asarray(durations, dtype=float)
        base_dur = np.where(np.isfinite(d), d, base_dur)
    proj = _projection_dtype(rg)
    base_dt = [proj if (proj and f.cls[j] in GEMM_CLASSES) else (f.dtype[j] or "bf16") for j in range(n)]

    target: list[str | None] = [None] * n
    is_gemm = np.array([c in GEMM_CLASSES for c in f.cls], dtype=bool)
    if gemm:
        for j in np.flatnonzero(is_gemm).tolist():
            target[j] = gemm
    exp_mask = expert_gemm_mask(rg, f)
    exp_dt = experts or gemm
    if experts:
        for j in np.flatnonzero(exp_mask).tolist():
            target[j] = experts
    chosen = np.array([t is not None for t in target], dtype=bool)
    narrow = np.array([elem_bytes("fp32" if b == "tf32" else b) <= _NARROW for b in base_dt], dtype=bool)
    use = chosen & np.isfinite(f.m) & np.isfinite(f.n) & np.isfinite(f.k) & ~narrow
    skipped = int(np.sum(chosen & ~use))

    new_dur = np.full(n, np.nan)
    if durations is not None:
        new_dur[:] = np.asarray(durations, dtype=float)
    gidx = np.flatnonzero(use)
    before = after = 0.0
    for dt in sorted({target[j] for j in gidx}):  # type: ignore[type-var]
        for b in sorted({base_dt[j] for j in gidx if target[j] == dt}):
            s = np.array([j for j in gidx if target[j] == dt and base_dt[j] == b], dtype=np.int64)
            ratio = _gemm_model(f, s, dt, hw, prof, like=b) / _gemm_model(f, s, b, hw, prof)  # type: ignore[arg-type]
            new_dur[s] = base_dur[s] * ratio
            before += float(base_dur[s].sum())
            after += float(new_dur[s].sum())

    # one quantize kernel per GEMM call, before its first kernel
    H = rg.host_ops
    grouped = _enclosing(rg, _is_grouped) if len(gidx) else np.zeros(len(H), dtype=bool)
    calls: dict[int, list[int]] = {}
    for j in gidx.tolist():
        o = int(G.op[j])
        key = -(int(j) + 1)
        if o >= 0:
            key = o
            p = o
            while p >= 0 and grouped[p]:  # innermost *_grouped_mm* op enclosing the GEMM
                if _is_grouped(rg.name(int(H.name[p]))):
                    key = p
                    break
                p = int(H.parent[p])
        calls.setdefault(key, []).append(int(j))
    q_before: list[int] = []
    q_dur: list[float] = []
    q_bytes: list[float] = []
    q_name: list[str] = []
    qp = prof.params("elementwise")
    for _key, js in sorted(calls.items(), key=lambda kv: min(kv[1])):
        j0 = min(js)
        dt = target[j0] or "fp8"
        act = float(sum(f.batch[j] * f.m[j] * f.k[j] for j in js))
        nb = act * (elem_bytes(base_dt[j0]) + 1.0 + _scale_bytes(dt))
        q_before.append(j0)
        q_dur.append(float(memory_time(np.array([nb]), hw.hbm_bandwidth, qp)[0]))  # type: ignore[arg-type]
        q_bytes.append(nb)
        call = rg.name(int(H.name[_key])) if _key >= 0 else (f.op_name[j0] or f.kernel[j0])
        q_name.append(f"cosim::quantize_{dt}[{call}]")

    # dispatch payload
    rows, dgpu = dispatch_mask(rg) if exp_dt else (np.zeros(len(rg.collectives), dtype=bool), np.zeros(n, bool))
    C = rg.collectives
    in_b, out_b = np.asarray(C.in_bytes, float).copy(), np.asarray(C.out_bytes, float).copy()
    dbefore = dafter = 0.0
    drows = []
    for c in np.flatnonzero(rows).tolist():
        base = proj or ({1: "fp8", 2: "bf16", 4: "fp32", 8: "fp64"}.get(int(C.elem_bytes[c]), "bf16"))
        fac = dispatch_bytes_factor(exp_dt or "fp8", base)
        if fac >= 1.0:
            continue
        drows.append(int(c))
        dbefore += float(np.nan_to_num(in_b[c]))
        in_b[c] *= fac
        out_b[c] *= fac
        dafter += float(np.nan_to_num(in_b[c]))
        j = int(C.gpu_op[c])
        if 0 <= j < n:
            new_dur[j] = base_dur[j] * fac
    for j in np.flatnonzero(dgpu).tolist():
        fac = dispatch_bytes_factor(exp_dt or "fp8", base_dt[j] if f.dtype[j] else "bf16")
        new_dur[j] = base_dur[j] * fac

    graph = _insert_ops(rg, q_before, q_dur, q_bytes, q_name, in_b, out_b) if (q_before or drows) else rg
    remap = np.arange(n) + np.searchsorted(np.sort(np.array(q_before, dtype=np.int64)), np.arange(n), side="right")
    out_dur = np.full(n + len(q_before), np.nan)
    out_dur[remap] = new_dur
    q_idx = remap[np.array(q_before, dtype=np.int64)] - 1 if q_before else np.zeros(0, dtype=np.int64)
    out_dur[q_idx] = q_dur
    return PrecisionResult(
        graph=graph, durations=out_dur, gemm_ops=remap[gidx], gemm_dtype=[str(target[j]) for j in gidx],
        gemm_time_before_s=before, gemm_time_after_s=after, quantize_ops=q_idx,
        quantize_time_s=float(sum(q_dur)), dispatch_collectives=np.array(drows, dtype=np.int64),
        dispatch_bytes_before=dbefore, dispatch_bytes_after=dafter, skipped_gemms=skipped,
        info={"experts": experts, "gemm": gemm, "base_dtype_projection": proj})


def _insert_ops(rg: RankGraph, before: list[int], dur: list[float], nbytes: list[float], names: list[str],
                in_bytes: np.ndarray, out_bytes: np.ndarray) -> RankGraph:
    """A copy of ``rg`` with one new elementwise GPU op inserted before each GPU op in ``before``
    (same stream, device, launch and step; recorded duration 0, start = the next op's start), edges and
    indices remapped, and the collectives' bytes replaced."""
    from dataclasses import replace

    G, L, E = rg.gpu_ops, rg.launches, rg.edges
    n_host, n = len(rg.host_ops), len(G)
    pos = np.array(sorted(before), dtype=np.int64)
    order = np.argsort(np.array(before, dtype=np.int64), kind="stable")
    dur_s = [dur[i] for i in order]
    bytes_s = [nbytes[i] for i in order]
    names_s = [names[i] for i in order]
    intern = StringTable(rg.strings)
    strings = intern.strings

    remap = np.arange(n) + np.searchsorted(pos, np.arange(n), side="right")
    new_cols = {}
    vals = {
        "cls": np.full(len(pos), OpClass.ELEMENTWISE), "kind": np.full(len(pos), GpuKind.KERNEL),
        "copy_kind": np.full(len(pos), CopyKind.NONE), "dur": np.zeros(len(pos)),
        "name": np.array([intern(s) for s in names_s]), "op": np.full(len(pos), -1),
        "ext_id": np.full(len(pos), -1), "bytes": np.array(bytes_s, dtype=float), "flops": np.full(len(pos), np.nan),
        "collective": np.full(len(pos), -1), "grid": np.full((len(pos), 3), -1), "block": np.full((len(pos), 3), -1),
    }
    for c, arr in G.columns().items():
        v = vals[c] if c in vals else arr[pos]
        new_cols[c] = np.insert(arr, pos, v, axis=0)
    del dur_s  # durations travel in PrecisionResult.durations (the trace never measured these kernels)
    ng = n + len(pos)
    gpu_ops = Table("gpu_ops", ng, **new_cols)
    qidx = remap[pos] - 1

    # launches: the new op is enqueued by the same call, first in it
    lcols = dict(L.columns())
    first = lcols["first_gpu_op"].copy()
    ok = first >= 0
    first[ok] = remap[first[ok]]
    nops = lcols["n_gpu_ops"].copy()
    for q, j in zip(qidx.tolist(), pos.tolist()):
        li = int(G.launch[j])
        if li >= 0:
            nops[li] += 1
            if first[li] == remap[j]:
                first[li] = q
    lcols.update(first_gpu_op=first, n_gpu_ops=nops)
    launches = Table("launches", len(L), **lcols)

    # edges: remap GPU node ids; stream and event-wait edges into j now enter q; q -> j on the stream
    src, dst = E.src.astype(np.int64).copy(), E.dst.astype(np.int64).copy()
    kind = E.kind.copy()
    for a in (src, dst):
        g = a >= n_host
        a[g] = n_host + remap[a[g] - n_host]
    qnode = {int(n_host + remap[j]): int(n_host + q) for q, j in zip(qidx.tolist(), pos.tolist())}
    redirect = (kind == EdgeKind.STREAM) | (kind == EdgeKind.EVENT_WAIT)
    for k in np.flatnonzero(redirect):
        q = qnode.get(int(dst[k]))
        if q is not None:
            dst[k] = q
    add_s, add_d, add_k = [], [], []
    launch_src = {int(d): int(s) for s, d, kd in zip(src, dst, kind) if kd == EdgeKind.LAUNCH}
    for jn, qn in qnode.items():
        add_s.append(qn)
        add_d.append(jn)
        add_k.append(EdgeKind.STREAM)
        if jn in launch_src:
            add_s.append(launch_src[jn])
            add_d.append(qn)
            add_k.append(EdgeKind.LAUNCH)
    ecols = dict(E.columns())
    m = len(add_s)
    ecols.update(src=np.concatenate([src, add_s]).astype(ecols["src"].dtype),
                 dst=np.concatenate([dst, add_d]).astype(ecols["dst"].dtype),
                 kind=np.concatenate([kind, np.array(add_k, dtype=kind.dtype)]),
                 inferred=np.concatenate([ecols["inferred"], np.ones(m, dtype=ecols["inferred"].dtype)]))
    edges = Table("edges", len(E) + m, **ecols)

    ccols = dict(rg.collectives.columns())
    gop = ccols["gpu_op"].copy()
    okc = gop >= 0
    gop[okc] = remap[gop[okc]]
    ccols.update(gpu_op=gop, in_bytes=in_bytes, out_bytes=out_bytes)
    colls = Table("collectives", len(rg.collectives), **ccols)
    return replace(rg, strings=strings, gpu_ops=gpu_ops, launches=launches, edges=edges, collectives=colls)


def precision_sets(precision: Mapping[str, str]) -> dict[str, str | None]:
    """``{"experts": ..., "gemm": ...}`` keyword arguments of :func:`apply_precision` from a config mapping."""
    return {k: precision.get(k) for k in PRECISION_SCOPES}
