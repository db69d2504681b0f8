"""Calibrated kernel-time models, class by class, and their least-squares fits.

Every model predicts a kernel's duration (seconds) from its features
(:mod:`cosim.models.features`) and the accelerator's catalog figures (dense peak
FLOP/s per dtype, HBM bandwidth, SM count, PCIe generation). The fitted
parameters are *efficiencies and overheads*, not absolute speeds, so a profile
fitted on one GPU predicts another by swapping the catalog figures (Habitat-style
cross-GPU prediction, see docs/MODELS.md).

* **GEMM / batched / grouped GEMM** — tile and wave quantization with split-K::

      for each tile (tm, tn) in TILES (both orientations) and split s in 1, 2, 4, ..., 64 (K/s >= 128):
          tiles  = batch * ceil(M/tm) * ceil(N/tn) * s
          waves  = ceil(tiles / SMs)
          t(s)   = waves * (tile_overhead + 2 tm tn (K/s) / (peak/SMs * eff * (tm tn / 32768)^alpha))
                   + [s > 1] * 8 M N batch s / (HBM * mem_eff)        # fp32 partial sums
      t_comp = min over candidates (the library's heuristic picks the fastest)
      t      = floor + max(t_comp, bytes / (HBM * mem_eff))

  parameters ``efficiency``, ``tile_overhead_s``, ``memory_efficiency``, ``floor_s``,
  ``small_tile_alpha``, fitted per dtype where the data has enough GEMMs of it. A kernel whose
  name spells its tile (:func:`named_tiles`) uses that tile, and with a recorded launch grid its
  split-K count and orientation (:func:`launch_split`), instead of the search; cuBLAS gemv /
  skinny kernels (:func:`gemv_kernels`) use their own parameter set (``gemv:`` keys).
* **Attention** (flash forward / backward) — one CTA per (batch, head, 128-query block)::

      waves = ceil(B H ceil(Sq/128) / SMs)
      t     = floor + waves * (tile_overhead + c 128 Sk D / (peak/SMs * eff))   c = 4 fwd, 10 bwd

  with separate ``efficiency`` for forward and ``bwd_efficiency`` for backward.
* **Memory-bound** (elementwise, reduction, norm, memset, device copies, other,
  MoE dispatch/combine): ``t = floor + bytes / (BW * efficiency)`` — achieved
  bandwidth ``bytes / t`` saturates towards ``BW * efficiency`` as bytes grow, with
  half of it reached at ``bytes = floor * BW * efficiency``. BW is HBM for device
  work and the PCIe link (per direction) for host copies.
* **Fallback** (no shapes): catalog roofline on the op's FLOPs/bytes, then the
  class floor.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields

import numpy as np

from cosim.catalog.models import Accelerator

__all__ = [
    "DEFAULTS",
    "ELEMENT_PATTERNS",
    "ELEMENT_RATE_PER_SM",
    "GEMM_CLASSES",
    "GEMV_PREFIX",
    "MEMORY_CLASSES",
    "PATTERN_PREFIX",
    "PATTERN_RATIO",
    "PATTERN_SM_BANDWIDTH",
    "REDUCED_AXIS_PATTERNS",
    "SOFTMAX_WARP_MAX",
    "TILES",
    "TILE_PREFIX",
    "AttentionParams",
    "GemmParams",
    "HardwareFigures",
    "MemoryParams",
    "access_patterns",
    "attention_time",
    "axis_pattern",
    "element_time",
    "fit_attention",
    "fit_gemm",
    "fit_memory",
    "gemm_tile_waves",
    "gemm_time",
    "gemm_total",
    "gemv_kernels",
    "launch_bound",
    "launch_split",
    "memory_params",
    "memory_time",
    "named_tiles",
    "parallel_time",
    "params_from_dict",
    "pattern_efficiency",
]

TILES: tuple[tuple[int, int], ...] = ((256, 128), (128, 128), (128, 64), (64, 64), (64, 32))
"""CTA output tiles (rows, columns) the GEMM model may pick (both orientations)."""
_TILE_REF = 256 * 128
_SPLITS = (1, 2, 4, 8, 16, 32, 64)
GEMM_CLASSES = ("gemm", "grouped_gemm")
MEMORY_CLASSES = ("elementwise", "reduction", "norm", "memset", "memcpy_dtod", "memcpy_htod", "memcpy_dtoh",
                  "other", "moe_dispatch", "moe_combine")
_PCIE_GBPS_PER_LANE = {3: 0.985e9, 4: 1.969e9, 5: 3.938e9, 6: 7.877e9, 7: 15.75e9}


def _check_frac(obj: object, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not (isinstance(v, (int, float)) and 0 < v <= 1):
            raise ValueError(f"{n} must be in (0, 1], got {v!r}")


def _check_nonneg(obj: object, *names: str) -> None:
    for n in names:
        v = getattr(obj, n)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
            raise ValueError(f"{n} must be a finite number >= 0, got {v!r}")


@dataclass(frozen=True)
class GemmParams:
    """Fitted parameters of the tile/wave GEMM model (SI units)."""

    efficiency: float = 0.75
    """Fraction of the per-SM dense peak a full-size (256x128) tile reaches in its main loop."""
    tile_overhead_s: float = 1.0e-6
    """Fixed time per wave of tiles: prologue, epilogue, pipeline fill (s)."""
    memory_efficiency: float = 0.8
    """Fraction of HBM bandwidth reached when the GEMM is bound by operand traffic."""
    floor_s: float = 2.5e-6
    """Launch-to-completion floor of the smallest GEMM (s)."""
    small_tile_alpha: float = 0.3
    """Exponent of the efficiency loss of smaller tiles: eff * (tm*tn/32768)**alpha."""
    max_throughput: float = 1.0
    """Ceiling on the FLOP rate a GEMM sustains, as a fraction of the dtype's dense peak: a GEMM takes at least
    ``flops / (max_throughput * peak)``. 1.0 (no ceiling) for fitted profiles; below 1 where a GPU's long GEMMs
    run at power-limited clocks (:data:`cosim.models.precision.BLACKWELL_GEMM`)."""

    def __post_init__(self) -> None:
        _check_frac(self, "efficiency", "memory_efficiency", "max_throughput")
        _check_nonneg(self, "tile_overhead_s", "floor_s")
        if not 0 <= self.small_tile_alpha <= 1:
            raise ValueError(f"small_tile_alpha must be in [0, 1], got {self.small_tile_alpha!r}")


@dataclass(frozen=True)
class AttentionParams:
    """Fitted parameters of the flash-attention model (SI units)."""

    efficiency: float = 0.5
    """Fraction of the per-SM dense peak a forward query block reaches."""
    bwd_efficiency: float = 0.4
    """Same for backward kernels."""
    tile_overhead_s: float = 2.0e-6
    """Fixed time per wave of query blocks (s)."""
    floor_s: float = 4.0e-6
    """Launch-to-completion floor (s)."""

    def __post_init__(self) -> None:
        _check_frac(self, "efficiency", "bwd_efficiency")
        _check_nonneg(self, "tile_overhead_s", "floor_s")


@dataclass(frozen=True)
class MemoryParams:
    """Fitted parameters of the saturating-bandwidth model of memory-bound kernels (SI units)."""

    efficiency: float = 0.7
    """Fraction of the reference bandwidth (HBM, or PCIe for host copies) reached by large kernels."""
    floor_s: float = 2.0e-6
    """Time of a kernel that moves no bytes (launch-to-completion floor), s."""

    def __post_init__(self) -> None:
        _check_frac(self, "efficiency")
        _check_nonneg(self, "floor_s")


ParamsT = GemmParams | AttentionParams | MemoryParams

DEFAULTS: dict[str, ParamsT] = {
    "gemm": GemmParams(),
    "grouped_gemm": GemmParams(efficiency=0.7, tile_overhead_s=1.5e-6),
    "attention": AttentionParams(),
    **{c: MemoryParams() for c in MEMORY_CLASSES},
    "memcpy_htod": MemoryParams(efficiency=0.5, floor_s=2e-6),
    "memcpy_dtoh": MemoryParams(efficiency=0.5, floor_s=2e-6),
    "memset": MemoryParams(efficiency=0.7, floor_s=1e-6),
}
"""Uncalibrated defaults (used for classes a profile does not fit): the roofline's
documented efficiencies, not fits to any trace."""


def params_type(cls: str) -> type:
    """Parameter dataclass of model class ``cls``."""
    if cls in GEMM_CLASSES:
        return GemmParams
    if cls == "attention":
        return AttentionParams
    return MemoryParams


def params_from_dict(cls: str, data: Mapping[str, float]) -> ParamsT:
    """Build the parameter dataclass of class ``cls`` from a mapping; ValueError on bad keys/values."""
    t = params_type(cls)
    known = {f.name for f in fields(t)}
    extra = set(data) - known
    if extra:
        raise ValueError(f"unknown parameter(s) {', '.join(sorted(extra))}; known: {', '.join(sorted(known))}")
    return t(**{k: float(v) for k, v in data.items()})


def params_to_dict(p: ParamsT) -> dict[str, float]:
    """Parameters as a plain dict (for YAML); a GEMM's ``max_throughput`` only when it sets a ceiling."""
    return {k: float(v) for k, v in asdict(p).items() if not (k == "max_throughput" and v == 1.0)}


@dataclass(frozen=True)
class HardwareFigures:
    """The catalog figures the models use (SI units)."""

    sm_count: int
    """Streaming multiprocessors / compute units."""
    hbm_bandwidth: float
    """Bytes/s."""
    pcie_bandwidth: float
    """Host link bytes/s per direction."""
    peaks: Mapping[str, float]
    """Dense peak FLOP/s by dtype name (through :meth:`Accelerator.peak`)."""

    @classmethod
    def of(cls, acc: Accelerator) -> HardwareFigures:
        """Figures of a catalog accelerator."""
        dts = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "mxfp8", "int8", "fp4", "mxfp4")
        peaks: dict[str, float] = {}
        for d in dts:
            try:
                peaks[d] = float(acc.peak(d))
            except KeyError:
                pass
        pcie = _PCIE_GBPS_PER_LANE.get(acc.pcie.generation, 3.938e9) * acc.pcie.lanes
        return cls(int(acc.sm_count), float(acc.hbm_bandwidth), pcie, peaks)

    def peak(self, dtype: str) -> float:
        """Dense peak FLOP/s of ``dtype`` (fp32 → vector rate; unknown → bf16)."""
        return self.peaks.get(dtype) or self.peaks.get("bf16") or self.peaks.get("fp16") or 1e12


# ----------------------------------------------------------------------------- GEMM

_NAMED_TILE = (
    re.compile(r"cutlass\w*?gemm\w*?_(\d+)x(\d+)_\d+x\d+"),       # cutlass_80_tensorop_s1688gemm_64x64_32x6
    re.compile(r"tilesize(\d+)x(\d+)x\d+"),                       # sm80_xmma_gemm_..._tilesize64x64x32
    re.compile(r"[a-z]*gemm_(\d+)x(\d+)_"),                         # ampere_sgemm_128x64_nn, volta_h884gemm_...
)
"""Kernel-name conventions that spell the CTA output tile (cuBLAS / CUTLASS)."""


def named_tiles(kernels: list[str]) -> np.ndarray:
    """(rows, cols) CTA tile of each GEMM kernel read from its name, NaN where the name does not say.

    When a trace records which kernel the library picked, its tile replaces the model's "fastest
    tile" guess (both orientations are tried: cuBLAS computes the transposed product)."""
    out = np.full((len(kernels), 2), np.nan)
    for i, k in enumerate(kernels):
        for rx in _NAMED_TILE:
            mt = rx.search(k or "")
            if mt:
                a, b = int(mt.group(1)), int(mt.group(2))
                if 8 <= a <= 512 and 8 <= b <= 512:
                    out[i] = (a, b)
                break
    return out


def gemm_tile_waves(mg: np.ndarray, kg: np.ndarray, count: np.ndarray, n: np.ndarray, partials: np.ndarray,
                    peak_sm: np.ndarray, hw: HardwareFigures, p: GemmParams,
                    tiles: tuple[tuple[int, int], ...] = TILES, group_k: np.ndarray | None = None) -> np.ndarray:
    """Math time (s) of GEMMs made of groups at their fastest (tile, split-K) candidate: the tile/wave model of
    :func:`gemm_time` (batched GEMMs) and :func:`cosim.models.synth_timing.grouped_gemm_time` (grouped ones).

    ``mg``, ``kg``, ``count`` [ops, groups]: each group's M and K and how many such groups (a batched GEMM is one
    column, ``count`` = batch; a grouped GEMM one column per group, count 1, or 0 for an empty group);
    ``n``, ``partials``, ``peak_sm`` [ops]: N, the fp32 partial-sum bytes of one split-K slice
    (``8·Σ_g count_g·M_g·N``, summed by the caller) and the peak FLOP/s per SM. For each orientation of each of
    ``tiles`` and each split s (taken only where every non-empty group has ``K_g/s ≥ 128``):
    ``tiles = s·Σ_g count_g·⌈M_g/tm⌉·⌈N/tn⌉``, ``waves = ⌈tiles/SMs⌉``,
    ``t = waves·(tile_overhead + 2·tm·tn·(K̄/s)/(peak_sm·eff))`` (+ ``partials·s/(HBM·mem_eff)`` for s > 1) with
    ``eff = efficiency·(tm·tn/32768)^small_tile_alpha`` and ``K̄`` = K, or where ``group_k`` (the groups split K: a
    grouped wgrad) the tiles' mean K; the fastest wins (the library's heuristic). Cost: O(ops · groups ·
    candidates), one numpy pass over [ops, groups] per candidate."""
    best = np.full(len(n), np.inf)
    kmin = np.where(count > 0, kg, np.inf).min(axis=1)
    gk = None if group_k is None or not np.any(group_k) else np.asarray(group_k, dtype=bool)
    for a, b in tiles:
        for tm, tn in {(a, b), (b, a)}:
            eff = p.efficiency * (tm * tn / _TILE_REF) ** p.small_tile_alpha
            per = count * np.ceil(mg / tm) * np.ceil(n / tn)[:, None]
            base = per.sum(axis=1)
            kbar = kg[:, 0] if gk is None else np.where(gk, (per * kg).sum(axis=1) / np.maximum(base, 1.0), kg[:, 0])
            for s in _SPLITS:
                ok = kmin / s >= 128 if s > 1 else np.ones(len(n), dtype=bool)
                waves = np.ceil(base * s / hw.sm_count)
                t = waves * (p.tile_overhead_s + 2.0 * tm * tn * (kbar / s) / (peak_sm * eff))
                if s > 1:
                    t = t + partials * s / (hw.hbm_bandwidth * p.memory_efficiency)
                best = np.where(ok & (t < best), t, best)
    return best


def gemm_total(best: np.ndarray, flops: np.ndarray, nbytes: np.ndarray, peak: np.ndarray | float,
               hw: HardwareFigures, p: GemmParams) -> np.ndarray:
    """A GEMM's duration (s) from its math time ``best`` (:func:`gemm_tile_waves`): no faster than its ``flops``
    at the sustained-clock ceiling (``max_throughput`` of ``peak``) nor than moving ``nbytes`` through HBM
    (``memory_efficiency``), plus the launch floor."""
    t_mem = np.where(np.isfinite(nbytes), nbytes, 0.0) / (hw.hbm_bandwidth * p.memory_efficiency)
    if p.max_throughput < 1.0:  # sustained-clock ceiling: the math cannot run faster than this share of the peak
        best = np.maximum(best, flops / (np.asarray(peak, dtype=float) * p.max_throughput))
    return np.asarray(p.floor_s + np.maximum(best, t_mem))


def _batched_waves(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, peak_sm: np.ndarray,
                   hw: HardwareFigures, p: GemmParams, tiles: tuple[tuple[int, int], ...]) -> np.ndarray:
    """:func:`gemm_tile_waves` of batched GEMMs (``batch`` equal groups of M × K), any broadcastable shapes."""
    shape = np.broadcast(m, n, k, batch).shape

    def flat(x: np.ndarray) -> np.ndarray:
        return np.broadcast_to(x, shape).reshape(-1)

    return gemm_tile_waves(flat(m)[:, None], flat(k)[:, None], flat(batch)[:, None], flat(n),
                           flat(8.0 * m * n * batch), flat(peak_sm), hw, p, tiles).reshape(shape)


def launch_split(m: np.ndarray, n: np.ndarray, batch: np.ndarray, tile: np.ndarray,
                 grid: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Tile orientation and split-K count of GEMM launches, read from their grid.

    cuBLAS / CUTLASS GEMM kernels launch the output tiles over ``grid_x * grid_y`` (padded by the
    threadblock swizzle, so possibly more CTAs than tiles) and the K slices of split-K — or the
    batch of a batched GEMM — over ``grid_z``. For each row with a finite ``tile`` (rows, cols) and
    a known grid (shape (n, 3)) this returns ``(tm, tn, splits)``: ``splits = max(1, round(grid_z /
    batch))`` and the orientation (cuBLAS may compute the transposed product) whose tile count
    ``ceil(M/tm) * ceil(N/tn)`` is closest to ``grid_x * grid_y`` from below (the swizzle only
    pads). NaN where unknown."""
    m, n, batch = (np.asarray(x, dtype=float) for x in (m, n, batch))
    tile = np.asarray(tile, dtype=float).reshape(-1, 2)
    g = np.asarray(grid, dtype=float).reshape(-1, 3)
    out_tm, out_tn, out_s = (np.full(len(m), np.nan) for _ in range(3))
    ok = np.isfinite(tile[:, 0]) & (g > 0).all(axis=1)
    xy = g[:, 0] * g[:, 1]
    s = np.maximum(1.0, np.round(g[:, 2] / np.maximum(batch, 1.0)))
    best_err = np.full(len(m), np.inf)
    for tm, tn in ((tile[:, 0], tile[:, 1]), (tile[:, 1], tile[:, 0])):
        with np.errstate(invalid="ignore", divide="ignore"):
            tiles = np.ceil(m / tm) * np.ceil(n / tn)
            # tiles <= grid_x*grid_y expected (swizzle padding); more tiles than CTAs is penalized
            err = np.where(tiles <= xy, np.log(xy / tiles), 4.0 * np.log(tiles / xy))
        better = ok & (err < best_err - 1e-12)
        out_tm[better], out_tn[better], out_s[better], best_err[better] = tm[better], tn[better], s[better], err[better]
    return out_tm, out_tn, out_s


def _gemm_launched(m, n, k, batch, peak_sm, hw: HardwareFigures, p: GemmParams, tm, tn, s) -> np.ndarray:
    """Time of GEMMs whose tile and split-K come from the launch (:func:`launch_split`)."""
    eff = p.efficiency * (tm * tn / _TILE_REF) ** p.small_tile_alpha
    waves = np.ceil(batch * np.ceil(m / tm) * np.ceil(n / tn) * s / hw.sm_count)
    t = waves * (p.tile_overhead_s + 2.0 * tm * tn * (k / s) / (peak_sm * eff))
    return t + np.where(s > 1, 8.0 * m * n * batch * s / (hw.hbm_bandwidth * p.memory_efficiency), 0.0)


def gemm_time(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, nbytes: np.ndarray,
              peak: np.ndarray | float, hw: HardwareFigures, p: GemmParams,
              tile: np.ndarray | None = None, grid: np.ndarray | None = None) -> np.ndarray:
    """Modeled GEMM durations (s) for arrays of shapes; ``peak`` is FLOP/s of the math dtype.

    ``tile`` (optional, shape (n, 2)): the CTA tile each GEMM ran with (:func:`named_tiles`); rows
    with a finite tile use it instead of the fastest of :data:`TILES`. ``grid`` (optional, shape
    (n, 3)): each kernel's launch grid (-1 if unknown); rows with both a tile and a grid take the
    tile orientation and split-K count from the launch (:func:`launch_split`) instead of trying
    every split."""
    m, n, k, batch = (np.asarray(x, dtype=float) for x in (m, n, k, batch))
    nbytes = np.asarray(nbytes, dtype=float)
    peak_sm = np.broadcast_to(np.asarray(peak, dtype=float) / hw.sm_count, np.broadcast(m, n, k).shape)
    best = _batched_waves(m, n, k, batch, peak_sm, hw, p, TILES)
    if tile is not None:
        tile = np.asarray(tile, dtype=float).reshape(-1, 2)
        known = np.isfinite(tile[:, 0])
        launched = np.zeros(len(m), dtype=bool)
        if grid is not None:
            tm, tn, s = launch_split(m, n, np.broadcast_to(batch, m.shape), tile, grid)
            launched = known & np.isfinite(s)
            if launched.any():
                L = launched
                best[L] = _gemm_launched(m[L], n[L], k[L], np.broadcast_to(batch, m.shape)[L], peak_sm[L], hw, p,
                                         tm[L], tn[L], s[L])
        for a, b in {(int(x), int(y)) for x, y in tile[known & ~launched]}:
            sel = known & ~launched & (tile[:, 0] == a) & (tile[:, 1] == b)
            best[sel] = _batched_waves(m[sel], n[sel], k[sel], batch[sel], peak_sm[sel], hw, p, ((a, b),))
    return gemm_total(best, 2.0 * m * n * k * batch, nbytes, peak, hw, p)


GEMV_PREFIX = "gemv:"
"""Profile key prefix of the GEMM parameters fitted on cuBLAS's matrix-vector / skinny-GEMM kernels
(:func:`gemv_kernels`: ``gemv*``, ``gemmSN``, ``gemmk1``, ``dot_kernel``): µs-scale, memory- and
launch-bound kernels with their own floor and bandwidth; used only for kernels named that way."""
_GEMV = re.compile(r"gemv|gemmSN_|gemmk1_|\bdot_kernel|gemvx", re.I)


def gemv_kernels(kernels: list[str]) -> np.ndarray:
    """True for kernels of cuBLAS's matrix-vector / skinny-GEMM family (gemv, gemmSN, gemmk1, dot)."""
    return np.array([bool(_GEMV.search(k or "")) for k in kernels], dtype=bool)


TILE_PREFIX = "tile:"
"""Profile key prefix of the GEMM parameters fitted with the kernels' named tiles (``tile:bf16``,
``tile:default``); used only for kernels whose name spells their tile."""


def attention_time(batch: np.ndarray, heads: np.ndarray, sq: np.ndarray, sk: np.ndarray, hd: np.ndarray,
                   bwd: np.ndarray, peak: np.ndarray | float, hw: HardwareFigures, p: AttentionParams) -> np.ndarray:
    """Modeled flash-attention durations (s)."""
    batch, heads, sq, sk, hd = (np.asarray(x, dtype=float) for x in (batch, heads, sq, sk, hd))
    bwd = np.asarray(bwd, dtype=bool)
    peak_sm = np.asarray(peak, dtype=float) / hw.sm_count
    waves = np.ceil(batch * heads * np.ceil(sq / 128.0) / hw.sm_count)
    c = np.where(bwd, 10.0, 4.0)
    eff = np.where(bwd, p.bwd_efficiency, p.efficiency)
    return p.floor_s + waves * (p.tile_overhead_s + c * 128.0 * sk * hd / (peak_sm * eff))


def memory_time(nbytes: np.ndarray, bandwidth: float, p: MemoryParams,
                parallel: np.ndarray | float = 0.0) -> np.ndarray:
    """Modeled duration (s) of memory-bound kernels moving ``nbytes`` bytes: ``floor + max(bytes / (bandwidth x
    efficiency), parallel)``, ``parallel`` being the launch's parallelism bound (:func:`parallel_time`)."""
    nb = np.where(np.isfinite(np.asarray(nbytes, dtype=float)), nbytes, 0.0)
    return p.floor_s + np.maximum(nb / (bandwidth * p.efficiency), parallel)


# ----------------------------------------------------------------------------- access patterns

PATTERN_PREFIX = "pattern:"
"""Profile key prefix of a memory class's parameters fitted on one access pattern (``pattern:strided``)."""

_ACCESS_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("pageable", re.compile(r"\(Pageable|Pageable\)")),
    ("pinned", re.compile(r"\(Pinned|Pinned\)")),
    ("multi_tensor", re.compile(r"multi_tensor_apply")),
    ("gather", re.compile(r"index_elementwise|gather|indexSelect|index_select|embedding|scatter|index_put|"
                          r"indexing_backward", re.I)),
    ("batched_copy", re.compile(r"CatArrayBatchedCopy")),
    ("contiguous", re.compile(r"vectorized_elementwise_kernel|triton_poi")),
    ("unrolled", re.compile(r"unrolled_elementwise_kernel")),
    ("strided", re.compile(r"\belementwise_kernel(?:_with_index)?<")),
    ("reduce", re.compile(r"\breduce_kernel<")),
    ("softmax_warp", re.compile(r"softmax_warp_(?:forward|backward)")),
    ("softmax_spatial", re.compile(r"SpatialSoftMax")),
    ("softmax_block", re.compile(r"cunn_SoftMax(?:Forward|Backward)")),
)
"""How a memory-bound kernel walks memory, read from the kernel PyTorch (or the driver) launched. PyTorch's
TensorIterator picks ``vectorized_elementwise_kernel`` when every operand is contiguous and aligned (16-byte
vector loads), ``unrolled_elementwise_kernel`` when contiguous but not vectorizable (a dtype cast, misaligned
storage), and the generic ``elementwise_kernel<nt, vt>`` with an offset calculator when any operand is
strided or broadcast (stride 0); ``CatArrayBatchedCopy`` copies several inputs into one output; gathers and
scatters touch rows picked by an index; ``multi_tensor_apply`` walks lists of tensors (foreach / fused
optimizers). Host copies are ``pinned`` (DMA straight from page-locked memory) or ``pageable`` (the driver
stages them through a pinned buffer: a CPU memcpy, then DMA, chunk by chunk)."""

PATTERN_SM_BANDWIDTH: dict[str, float] = {
    "batched_copy": 11.5e9,
}
"""Sustained bytes/s **per SM** of access patterns that do not reach HBM bandwidth (used where a profile has
no fit of that pattern, ``pattern:<name>``): ``efficiency = min(class efficiency, SMs x this / HBM)``. Value:
the median of the ``CatArrayBatchedCopy`` rows moving >= 8 MB of hta/a100-rank3of8-control (A100, 108 SMs,
0.61 of its 2.04 TB/s; another GPU than the H100 traces scored leave-one-out). H100 Qwen trace: 0.52 of HBM
measured, 0.45 predicted."""

REDUCED_AXIS_PATTERNS = ("reduce_inner", "reduce_strided", "softmax_warp", "softmax_block", "softmax_spatial")
"""Patterns of kernels that reduce over an axis, told apart by their reduced axis or their kernel: each is a
different kernel with its own launch cost (B300: a one-warp-per-row softmax 2.1-2.7 us where a
``reduce_kernel`` or a top-k takes 5.5-7 us), so a profile fits each its own floor where it has rows enough
(:func:`cosim.models.fit.fit_memory_patterns`), even where their bytes do not identify a bandwidth."""

ELEMENT_PATTERNS = ("strided", "unrolled")
"""Access patterns whose kernels load one element per operand per thread at a time (no vector loads): their
time is bound by :func:`element_time`."""

ELEMENT_RATE_PER_SM = 2.3e9
"""Elements/s per SM of a kernel that keeps one scalar load per operand in flight per thread: by Little's law,
resident threads (2048 per SM) over the loaded memory latency (~0.9 us), whatever the element size, so a
strided FP32 op moves twice the bytes per second of a BF16 one. Value: the median over vidur's H100 SiLU-and-mul
(vLLM ``silu_and_mul``, scalar loads; Llama-2-7B 2.21, Llama-2-70B 2.42 G elements/s/SM at >= 1024 tokens,
../shared/measured/vidur-h100-compute). The same law matches, without refitting, the H100 Qwen trace's PyTorch
strided and unrolled kernels (2.1-2.8) and vidur's RMSNorm (2.2-2.5 per pass) and rotary embedding (2.9)."""


def element_time(elems: np.ndarray, hw: HardwareFigures) -> np.ndarray:
    """Lower bound (s) on the time of a scalar-load kernel (:data:`ELEMENT_PATTERNS`) producing ``elems``
    elements: ``elems / (SMs x ELEMENT_RATE_PER_SM)``; 0 where unknown."""
    e = np.asarray(elems, dtype=float)
    return np.where(np.isfinite(e), e, 0.0) / (hw.sm_count * ELEMENT_RATE_PER_SM)


PATTERN_RATIO: dict[str, float] = {"pageable": 0.35}
"""Bandwidth of a host-copy pattern relative to the class's reference (pinned) fit, where a profile has no fit
of it. Pageable copies are staged by the driver through a pinned buffer (a CPU memcpy, then DMA, chunk by
chunk), about a third of a pinned copy's bandwidth; no trace in ../shared has a pageable copy large enough to
fit it, so this is an assumption (docs/MODELS.md)."""


def pattern_efficiency(pattern: str, efficiency: float, hw: HardwareFigures, bandwidth: float) -> float:
    """Efficiency (fraction of ``bandwidth``) of a kernel with access ``pattern`` in a class whose reference
    pattern reaches ``efficiency``: capped by the pattern's per-SM bandwidth (:data:`PATTERN_SM_BANDWIDTH`),
    or scaled by :data:`PATTERN_RATIO`; unchanged for other patterns."""
    if pattern in PATTERN_SM_BANDWIDTH:
        return min(efficiency, hw.sm_count * PATTERN_SM_BANDWIDTH[pattern] / bandwidth)
    return min(1.0, max(efficiency * PATTERN_RATIO.get(pattern, 1.0), 1e-4))


SOFTMAX_WARP_MAX = 1024
"""Longest reduced axis PyTorch's softmax runs as ``softmax_warp_forward`` (one warp per row, the row held in
registers: one read, one write; aten/src/ATen/native/cuda/SoftMax.cu, ``dim_size <= 1024`` and
``dim_size * sizeof <= 4096``, contiguous inner axis); longer rows take ``cunn_SoftMaxForward`` (a block per
row, passes over the row for the max, the sum and the output), a strided axis ``cunn_SpatialSoftMaxForward``."""


def axis_pattern(pattern: str, op: str, red_len: float, red_stride: float) -> str:
    """Access pattern of a reduction, softmax or norm kernel refined by its reduced axis (``red_len`` elements
    per output, ``red_stride`` elements apart: :func:`cosim.models.features.reduced_axis`; NaN when unknown).
    ``reduce_kernel`` becomes ``reduce_inner`` (the axis is the contiguous one: threads read it with vector
    loads and combine across a warp) or ``reduce_strided`` (each thread walks one output's axis with a stride,
    coalesced across the outputs). A softmax whose kernel name does not say (fused, synthesized) takes the
    kernel PyTorch dispatches for its axis (:data:`SOFTMAX_WARP_MAX`). Anything else is left as it is."""
    from cosim.models.features import SOFTMAX_BACKWARD_OPS, SOFTMAX_OPS

    if not (np.isfinite(red_len) and np.isfinite(red_stride)):
        return pattern
    if pattern == "reduce":
        return "reduce_inner" if red_stride <= 1 else "reduce_strided"
    if not pattern and (op in SOFTMAX_OPS or op in SOFTMAX_BACKWARD_OPS):
        if red_stride > 1:
            return "softmax_spatial"
        return "softmax_warp" if red_len <= SOFTMAX_WARP_MAX else "softmax_block"
    return pattern


def access_patterns(kernels: list[str], f: object | None = None) -> np.ndarray:
    """Access pattern (:data:`_ACCESS_PATTERNS` names; '' when the name does not say) of each kernel; with the
    kernels' features ``f`` (:class:`cosim.models.features.KernelFeatures`), reductions and softmax refined by
    their reduced axis where it is known (:func:`axis_pattern`)."""
    out = np.full(len(kernels), "", dtype=object)
    for i, k in enumerate(kernels):
        for name, rx in _ACCESS_PATTERNS:
            if k and rx.search(k):
                out[i] = name
                break
    red_len = getattr(f, "red_len", None)
    red_stride = getattr(f, "red_stride", None)
    if red_len is not None and red_stride is not None:
        ops: list[str] = getattr(f, "op_name", None) or [""] * len(kernels)
        for j in np.flatnonzero(np.isfinite(red_len)).tolist():
            out[j] = axis_pattern(str(out[j]), ops[j], float(red_len[j]), float(red_stride[j]))
    return out


def memory_params(by: Mapping[str, ParamsT] | None, base: MemoryParams, pattern: str, hw: HardwareFigures,
                  bandwidth: float) -> MemoryParams:
    """Parameters of a memory-bound kernel with access ``pattern`` moving data at up to ``bandwidth``: the
    profile's fit of that pattern (``by["pattern:<pattern>"]``), else the class's ``base`` with the pattern's
    efficiency (:func:`pattern_efficiency`)."""
    if pattern and by and PATTERN_PREFIX + pattern in by:
        return by[PATTERN_PREFIX + pattern]  # type: ignore[return-value]
    if pattern in ("reduce_inner", "reduce_strided") and by and PATTERN_PREFIX + "reduce" in by:
        return by[PATTERN_PREFIX + "reduce"]  # type: ignore[return-value]  # fitted without the axis
    e = pattern_efficiency(pattern, base.efficiency, hw, bandwidth)
    return base if e == base.efficiency else MemoryParams(efficiency=e, floor_s=base.floor_s)


THREAD_BANDWIDTH = 128e6
"""Bytes/s one thread of a PyTorch reduction kernel sustains when it loops over its share of the reduced axis:
by Little's law, the bytes it keeps in flight (``reduce_kernel`` unrolls 4 vector loads: ~64-80 B) over the
memory latency (~0.6 us). Value: the 90th percentile of bytes / duration / threads of the ``reduce_kernel`` rows
of hta/a100-rank3of8-control (A100) launched with fewer threads than a quarter of the GPU holds (rows below it
are floor-bound, so the limit is an upper envelope: aten::sum over 256 threads, 410 KB in 12 us = 133 MB/s per
thread). See :func:`parallel_time`."""
RESIDENT_THREADS_PER_SM = 2048
"""Threads an SM holds at once (H100, A100, B200, V100)."""
PARALLEL_PATTERNS = ("reduce", "reduce_inner", "reduce_strided")
"""Access patterns whose kernels get the parallelism limit :func:`parallel_time`: PyTorch's ``reduce_kernel``,
whose threads loop over the reduced axis. (Not cub's scans and sorts, nor kernels that share their op's bytes
with others: their launch does not bound the op's traffic.)"""


def parallel_time(nbytes: np.ndarray, grid: np.ndarray, block: np.ndarray, hw: HardwareFigures) -> np.ndarray:
    """Lower bound (s) on a reduction kernel's time from the parallelism its launch exposes: the bytes over
    ``min(threads, SMs x resident threads) x`` :data:`THREAD_BANDWIDTH`. A reduction over a long axis into few
    outputs (a bias gradient summed over tokens, a loss summed to a scalar, a norm over all parameters) runs
    few blocks, each looping over the reduced axis, and reaches a fraction of HBM however large its input:
    the launch records the parallelism PyTorch chose for that reduced axis. 0 where the launch is unknown."""
    g = np.asarray(grid, dtype=float).reshape(-1, 3)
    b = np.asarray(block, dtype=float).reshape(-1, 3)
    threads = np.where((g > 0).all(axis=1) & (b > 0).all(axis=1), g.prod(axis=1) * b.prod(axis=1), np.nan)
    live = np.minimum(threads, hw.sm_count * RESIDENT_THREADS_PER_SM)
    nb = np.where(np.isfinite(np.asarray(nbytes, dtype=float)), nbytes, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        t = nb / (live * THREAD_BANDWIDTH)
    return np.where(np.isfinite(t), t, 0.0)


def launch_bound(f, sel: np.ndarray, pattern: str, hw: HardwareFigures) -> np.ndarray | float:  # type: ignore[no-untyped-def]
    """Lower bound (s) on the memory-bound rows ``sel`` of features ``f`` (all of access ``pattern``) from how
    their kernel works: the reduction parallelism bound (:func:`parallel_time`) for :data:`PARALLEL_PATTERNS`,
    the scalar-load element bound (:func:`element_time`) for :data:`ELEMENT_PATTERNS` when the element counts
    are known; 0 otherwise."""
    if pattern in PARALLEL_PATTERNS:
        return parallel_time(f.bytes[sel], f.grid[sel], f.block[sel], hw)
    if pattern in ELEMENT_PATTERNS and getattr(f, "elems", None) is not None:
        return element_time(f.elems[sel], hw)
    return 0.0


def reference_bandwidth(cls: str, hw: HardwareFigures) -> float:
    """Bandwidth (bytes/s) a memory class is measured against: PCIe for host copies, else HBM."""
    return hw.pcie_bandwidth if cls in ("memcpy_htod", "memcpy_dtoh") else hw.hbm_bandwidth


# ----------------------------------------------------------------------------- fits

PRIOR_WEIGHT = 0.05
"""Weight of the prior pull towards the default parameters (per parameter, in units of one
log-time residual over the parameter's bounds); keeps parameters the data cannot identify
(e.g. small-tile efficiency from a trace with only large GEMMs) near documented defaults."""


def _lsq(fun: Callable[[np.ndarray], np.ndarray], x0: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Robust least squares on log-time residuals plus a weak prior at ``x0``; a few starts, best wins."""
    from scipy.optimize import least_squares

    prior0 = x0.copy()
    span = hi - lo
    def objective(x: np.ndarray) -> np.ndarray:
        r = fun(x)
        return np.concatenate([r, PRIOR_WEIGHT * math.sqrt(max(len(r), 1)) * (x - prior0) / span])

    best_x, best_c = x0, math.inf
    starts = [x0, lo + 0.25 * (hi - lo), lo + 0.6 * (hi - lo)]
    for s in starts:
        s = np.clip(s, lo + 1e-9, hi - 1e-9)
        try:
            r = least_squares(objective, s, bounds=(lo, hi), loss="soft_l1", f_scale=0.1, max_nfev=400)
        except ValueError:
            continue
        if r.cost < best_c:
            best_x, best_c = r.x, r.cost
    return best_x


def fit_gemm(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, nbytes: np.ndarray,
             peak: np.ndarray | float, dur: np.ndarray, hw: HardwareFigures,
             start: GemmParams | None = None, tile: np.ndarray | None = None,
             grid: np.ndarray | None = None) -> GemmParams:
    """Fit :class:`GemmParams` to measured GEMM durations (s) by robust least squares on log time."""
    x0p = start or GemmParams()
    logd = np.log(dur)

    def build(x: np.ndarray) -> GemmParams:
        return GemmParams(efficiency=float(np.exp(x[0])), tile_overhead_s=float(np.exp(x[1])),
                          memory_efficiency=float(np.exp(x[2])), floor_s=float(np.exp(x[3])),
                          small_tile_alpha=float(x[4]))

    def fun(x: np.ndarray) -> np.ndarray:
        return np.log(gemm_time(m, n, k, batch, nbytes, peak, hw, build(x), tile, grid)) - logd

    x0 = np.array([math.log(x0p.efficiency), math.log(max(x0p.tile_overhead_s, 1e-8)),
                   math.log(x0p.memory_efficiency), math.log(max(x0p.floor_s, 1e-7)), x0p.small_tile_alpha])
    lo = np.array([math.log(1e-4), math.log(1e-8), math.log(1e-3), math.log(2e-7), 0.0])
    hi = np.array([0.0, math.log(5e-5), 0.0, math.log(5e-5), 1.0])
    return build(_lsq(fun, np.clip(x0, lo, hi), lo, hi))


def fit_attention(batch: np.ndarray, heads: np.ndarray, sq: np.ndarray, sk: np.ndarray, hd: np.ndarray,
                  bwd: np.ndarray, peak: np.ndarray, dur: np.ndarray, hw: HardwareFigures) -> AttentionParams:
    """Fit :class:`AttentionParams` (backward efficiency tied to forward when no backward kernels)."""
    logd = np.log(dur)
    has_bwd = bool(np.any(bwd))
    has_fwd = bool(np.any(~np.asarray(bwd, dtype=bool)))

    def build(x: np.ndarray) -> AttentionParams:
        e = float(np.exp(x[0]))
        eb = float(np.exp(x[1])) if has_bwd else min(1.0, 0.8 * e)
        if not has_fwd:
            e = min(1.0, eb / 0.8)
        return AttentionParams(efficiency=e, bwd_efficiency=eb, tile_overhead_s=float(np.exp(x[2])),
                               floor_s=float(np.exp(x[3])))

    def fun(x: np.ndarray) -> np.ndarray:
        return np.log(attention_time(batch, heads, sq, sk, hd, bwd, peak, hw, build(x))) - logd

    lo = np.array([math.log(1e-4), math.log(1e-4), math.log(1e-8), math.log(2e-7)])
    hi = np.array([0.0, 0.0, math.log(1e-4), math.log(1e-4)])
    x0 = np.array([math.log(0.5), math.log(0.4), math.log(2e-6), math.log(3e-6)])
    return build(_lsq(fun, x0, lo, hi))


MIN_MEMORY_EFFICIENCY = 0.05
"""Lower bound of a fitted memory-class bandwidth efficiency. Calibration rows that are all floor-bound
(a few µs-scale memsets) cannot identify the bandwidth; without the bound the fit drifted to 0.6 %
of HBM (V100 memset), which made a 12.8 MB memset of another trace take 2.4 ms instead of 16 µs."""


MIN_BANDWIDTH_ROWS = 8
"""Rows a memory-class fit needs before it may fit the bandwidth efficiency."""


BANDWIDTH_SHARE = 0.1
"""Share of the rows' median time the largest transfer's bandwidth term must reach (at half the reference
bandwidth) for a fit to identify the efficiency."""


def bandwidth_identifiable(nbytes: np.ndarray, dur: np.ndarray, bandwidth: float) -> bool:
    """True when calibration rows can tell a memory class's bandwidth: at least :data:`MIN_BANDWIDTH_ROWS`
    rows, and a largest transfer whose time at half the reference bandwidth is at least
    :data:`BANDWIDTH_SHARE` of the rows' median time. Otherwise every row is floor-bound and the efficiency
    is a free parameter: 6 DLRM memsets of 16 B - 5 KB once fitted V100 memset bandwidth to 5 % of HBM,
    making a 12.8 MB memset of another trace 18x too slow."""
    return (len(dur) >= MIN_BANDWIDTH_ROWS
            and float(np.max(nbytes)) / (0.5 * bandwidth) >= BANDWIDTH_SHARE * float(np.median(dur)))


def fit_memory(nbytes: np.ndarray, dur: np.ndarray, bandwidth: float,
               parallel: np.ndarray | float = 0.0, efficiency: float | None = None) -> MemoryParams:
    """Fit :class:`MemoryParams` (floor and bandwidth efficiency >= :data:`MIN_MEMORY_EFFICIENCY`) on log time.

    The efficiency is fitted only when the rows can identify it (:func:`bandwidth_identifiable`);
    otherwise it stays at ``efficiency`` (default: the model's default) and only the floor is fitted.
    ``parallel``: each row's parallelism bound (:func:`parallel_time`), part of the model being fitted."""
    logd = np.log(dur)
    if not bandwidth_identifiable(nbytes, dur, bandwidth):
        eff = MemoryParams().efficiency if efficiency is None else efficiency

        def fun1(x: np.ndarray) -> np.ndarray:
            return np.log(memory_time(nbytes, bandwidth, MemoryParams(eff, float(np.exp(x[0]))), parallel)) - logd

        lo1, hi1 = np.array([math.log(1e-7)]), np.array([math.log(1e-3)])
        x1 = np.array([math.log(max(float(np.median(dur)) * 0.5, 2e-7))])
        return MemoryParams(efficiency=eff, floor_s=float(np.exp(_lsq(fun1, np.clip(x1, lo1, hi1), lo1, hi1)[0])))

    def build(x: np.ndarray) -> MemoryParams:
        return MemoryParams(efficiency=float(np.exp(x[0])), floor_s=float(np.exp(x[1])))

    def fun(x: np.ndarray) -> np.ndarray:
        return np.log(memory_time(nbytes, bandwidth, build(x), parallel)) - logd

    lo = np.array([math.log(MIN_MEMORY_EFFICIENCY), math.log(1e-7)])
    hi = np.array([0.0, math.log(1e-3)])
    x0 = np.array([math.log(0.5), math.log(max(float(np.median(dur)) * 0.5, 2e-7))])
    return build(_lsq(fun, np.clip(x0, lo, hi), lo, hi))
