"""Kernel-time database from traces, and fitting a calibration profile on it.

The database is a CSV per GPU model (``<accelerator>.csv``), one row per measured
GPU op, columns (units in the name where there is one)::

    source,step,cls,kernel,op,dtype,m,n,k,batch,heads,bwd,flops,bytes,dur_s,grid_x,grid_y,grid_z,
    block_x,block_y,block_z,elems,red_len,red_stride

``cls`` is the model class (gemm, grouped_gemm, attention, elementwise, ...),
``op`` the parent ATen op, ``m, n, k, batch, heads, bwd`` the shape features of
:class:`cosim.models.features.KernelFeatures`, ``flops`` in FLOP, ``bytes`` in
bytes, ``dur_s`` the measured duration in seconds, ``grid_*`` / ``block_*`` the launch grid and block (-1
unknown; optional when reading), ``elems`` the elements of the op's largest tensor per kernel (optional),
``red_len`` / ``red_stride`` a reduction's, softmax's or norm's reduced axis (elements per output, stride in
elements; optional). Empty cells are unknown.
"""

from __future__ import annotations

import csv
import datetime as _dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.models.calibrated import (
    GEMM_CLASSES,
    GEMV_PREFIX,
    MEMORY_CLASSES,
    PATTERN_PREFIX,
    REDUCED_AXIS_PATTERNS,
    TILE_PREFIX,
    HardwareFigures,
    access_patterns,
    bandwidth_identifiable,
    fit_attention,
    fit_gemm,
    fit_memory,
    gemv_kernels,
    launch_bound,
    named_tiles,
    pattern_efficiency,
    reference_bandwidth,
)
from cosim.models.features import KernelFeatures, extract_features
from cosim.models.profile import CalibrationProfile

__all__ = ["DB_COLUMNS", "KERNEL_DB_MAX", "KernelDB", "build_kernel_db", "class_errors", "fit_kernel_scale",
           "fit_memory_patterns", "fit_profile", "launch_key_floor", "launch_keys", "load_db", "mape"]

DB_COLUMNS = ("source", "step", "cls", "kernel", "op", "dtype", "m", "n", "k", "batch", "heads", "bwd",
              "flops", "bytes", "dur_s")
GRID_COLUMNS = ("grid_x", "grid_y", "grid_z")
"""Optional trailing columns: the kernel's launch grid (-1 unknown); files without them still load."""
BLOCK_COLUMNS = ("block_x", "block_y", "block_z")
"""Optional columns after the grid: the kernel's thread-block dims (-1 unknown), which the reduction
parallelism bound needs; files without them still load."""
ELEMS_COLUMN = "elems"
"""Optional last column: elements of the op's largest tensor per kernel (``KernelFeatures.elems``; empty =
unknown), which the scalar-load bound needs; files without it still load."""
AXIS_COLUMNS = ("red_len", "red_stride")
"""Optional columns after ``elems``: the reduced axis (``KernelFeatures.red_len`` / ``red_stride``; empty =
unknown), which the reduced-axis patterns need; files without them still load."""
_MIN_SAMPLES = {"gemm": 4, "grouped_gemm": 1, "attention": 1}
_MIN_MEMORY = 3
_MIN_PER_DTYPE = 12
_MIN_GEMV = 8


@dataclass
class KernelDB:
    """Measured kernels of one GPU model: features plus source file and step per row."""

    accelerator: str
    """Catalog id of the GPU the rows were measured on."""
    device_name: str
    """Device name as the traces record it."""
    feats: KernelFeatures
    """Features and measured durations (s)."""
    source: list[str]
    """Trace file of each row."""
    step: np.ndarray
    """Step index (row of the rank's steps table) of each row, -1 if none."""

    @staticmethod
    def trace_files(paths: Sequence[str | Path]) -> list[Path]:
        """Every file :meth:`from_traces` reads for ``paths``, in argument order.

        A directory stands for its ``.json``/``.json.gz`` files (sorted by name, not recursive), exactly the
        files :func:`cosim.workload.load_trace` loads from it; a file stands for itself.
        """
        from cosim.workload.load import trace_files_in

        out: list[Path] = []
        for p in map(Path, paths):
            out += trace_files_in(p) if p.is_dir() else [p]
        return out

    @classmethod
    def from_traces(cls, paths: Sequence[str | Path], accelerator: str | None = None) -> dict[str, KernelDB]:
        """Databases by accelerator id from Kineto traces (all ranks of each).

        Each path is a Kineto file (one rank), a directory (all its ranks, each Execution Trace in it attached to
        its Kineto rank by :func:`cosim.workload.load_trace`), or an Execution Trace file. ET files given next
        to Kineto files are attached to the Kineto traces they belong to by the same rule
        (:func:`cosim.workload.load.attach_ets`), so ``[trace.json.gz, et.json.gz]`` gives the shapes, dtypes
        and bytes that the two files in one directory give. With no Kineto file among ``paths``, an ET file
        loads alone (an ET-only rank: no GPU ops).
        Rows of a Kineto file are labelled with its path, rows of a directory with the directory.
        """
        from cosim.catalog.scaling import guess_accelerator
        from cosim.workload import load_trace
        from cosim.workload.graph import RankGraph
        from cosim.workload.load import attach_ets, detect_format

        loaded: list[tuple[Path, list[RankGraph]]] = []
        ets: list[Path] = []
        kineto: list[RankGraph] = []  # ranks of single Kineto files, which an ET file given beside them may belong to
        for p in map(Path, paths):
            if not p.is_dir() and detect_format(p) == "et":
                ets.append(p)
                continue
            ranks = list(load_trace(p).ranks)
            loaded.append((p, ranks))
            if not p.is_dir():
                kineto += ranks
        if ets and kineto:
            attach_ets(kineto, ets)
        else:
            loaded += [(p, list(load_trace(p).ranks)) for p in ets]

        parts: dict[str, list[tuple[KernelFeatures, str, np.ndarray, str]]] = {}
        for p, ranks in loaded:
            for rg in ranks:
                acc = accelerator or guess_accelerator(rg.device_name)
                if acc is None:
                    raise CosimInputError(f"cannot tell the GPU of rank {rg.rank} (device {rg.device_name!r}); "
                                          "give --accelerator", file=p)
                f = extract_features(rg)
                parts.setdefault(acc, []).append((f, str(p), np.asarray(rg.gpu_ops.step, dtype=np.int64),
                                                  rg.device_name))
        out = {}
        for acc, items in parts.items():
            feats = concat([it[0] for it in items])
            src = [s for f, s, _, _ in items for _ in range(len(f))]
            out[acc] = cls(acc, items[0][3], feats, src, np.concatenate([it[2] for it in items]))
        return out

    def subset(self, mask: np.ndarray) -> KernelDB:
        """Rows where ``mask`` is true."""
        idx = np.flatnonzero(mask)
        return KernelDB(self.accelerator, self.device_name, take(self.feats, idx),
                        [self.source[i] for i in idx], self.step[idx])

    def write_csv(self, path: str | Path) -> None:
        """Write the database (see the module docstring for the columns)."""
        from cosim.fileio import atomic_open

        with atomic_open(path, "w") as fh:
            w = csv.writer(fh)
            w.writerow(DB_COLUMNS + GRID_COLUMNS + BLOCK_COLUMNS + (ELEMS_COLUMN, *AXIS_COLUMNS))
            el, rl, rs = self.feats.elems, self.feats.red_len, self.feats.red_stride
            for i in range(len(self.feats)):
                r = self.feats.row(i)
                w.writerow([self.source[i], int(self.step[i]), r["cls"], r["kernel"], r["op"], r["dtype"],
                            *(_fmt(r[c]) for c in ("m", "n", "k", "batch", "heads")), r["bwd"],
                            _fmt(r["flops"]), _fmt(r["bytes"]), _fmt(r["dur_s"]),
                            *(int(x) for x in self.feats.grid[i]), *(int(x) for x in self.feats.block[i]),
                            _fmt(float(el[i])) if el is not None else "",
                            _fmt(float(rl[i])) if rl is not None else "",
                            _fmt(float(rs[i])) if rs is not None else ""])


def _fmt(v: float) -> str:
    return "" if not math.isfinite(v) else repr(float(v))


def load_db(path: str | Path, accelerator: str | None = None) -> KernelDB:
    """Read a database CSV written by :meth:`KernelDB.write_csv` (accelerator from the file name)."""
    p = Path(path)
    try:
        with open(p, newline="") as fh:
            rows = list(csv.DictReader(fh))
    except OSError as exc:
        raise CosimInputError(f"cannot read kernel database: {exc}", file=p) from None
    if rows and set(DB_COLUMNS) - set(rows[0]):
        raise CosimInputError(f"not a kernel database: missing columns {sorted(set(DB_COLUMNS) - set(rows[0]))}",
                              file=p)

    def col(name: str) -> np.ndarray:
        return np.array([float(r[name]) if r[name] != "" else np.nan for r in rows], dtype=float)

    n = len(rows)
    grid = -np.ones((n, 3), np.int64)
    if rows and not set(GRID_COLUMNS) - set(rows[0]):
        grid = np.array([[int(float(r[c])) if r[c] not in ("", None) else -1 for c in GRID_COLUMNS] for r in rows],
                        dtype=np.int64).reshape(n, 3)
    block = -np.ones((n, 3), np.int64)
    if rows and not set(BLOCK_COLUMNS) - set(rows[0]):
        block = np.array([[int(float(r[c])) if r[c] not in ("", None) else -1 for c in BLOCK_COLUMNS] for r in rows],
                         dtype=np.int64).reshape(n, 3)
    elems = col(ELEMS_COLUMN) if rows and ELEMS_COLUMN in rows[0] else None
    red_len, red_stride = (col(c) if rows and c in rows[0] else None for c in AXIS_COLUMNS)
    if red_len is None or red_stride is None or not np.isfinite(red_len).any():
        red_len = red_stride = None
    f = KernelFeatures(cls=[r["cls"] for r in rows], kernel=[r["kernel"] for r in rows], op_name=[r["op"] for r in rows],
                       dtype=[r["dtype"] for r in rows], m=col("m"), n=col("n"), k=col("k"), batch=col("batch"),
                       heads=col("heads"), bwd=col("bwd").astype(bool), flops=col("flops"), bytes=col("bytes"),
                       dur=col("dur_s"), grid=grid, block=block,
                       elems=elems if elems is not None and np.isfinite(elems).any() else None,
                       red_len=red_len, red_stride=red_stride)
    return KernelDB(accelerator or p.stem, "", f, [r["source"] for r in rows],
                    np.array([int(r["step"]) for r in rows], dtype=np.int64))


def concat(items: Sequence[KernelFeatures]) -> KernelFeatures:
    """Concatenate feature tables."""
    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(f, name) for f in items]) if items else np.zeros(0)

    return KernelFeatures(
        cls=[c for f in items for c in f.cls], kernel=[c for f in items for c in f.kernel],
        op_name=[c for f in items for c in f.op_name], dtype=[c for f in items for c in f.dtype],
        m=cat("m"), n=cat("n"), k=cat("k"), batch=cat("batch"), heads=cat("heads"),
        bwd=cat("bwd").astype(bool), flops=cat("flops"), bytes=cat("bytes"), dur=cat("dur"),
        grid=np.concatenate([f.grid for f in items]) if items else np.zeros((0, 3), np.int64),
        block=np.concatenate([f.block for f in items]) if items else np.zeros((0, 3), np.int64),
        elems=_cat_optional(items, "elems"), red_len=_cat_optional(items, "red_len"),
        red_stride=_cat_optional(items, "red_stride"),
    )


def _cat_optional(items: Sequence[KernelFeatures], name: str) -> np.ndarray | None:
    """Concatenation of an optional feature column (NaN for tables without it); None if no table has it."""
    cols = [getattr(f, name) for f in items]
    if all(c is None for c in cols):
        return None
    return np.concatenate([c if c is not None else np.full(len(f), np.nan) for c, f in zip(cols, items)])


def take(f: KernelFeatures, idx: np.ndarray) -> KernelFeatures:
    """Rows ``idx`` of a feature table."""
    return KernelFeatures(
        cls=[f.cls[i] for i in idx], kernel=[f.kernel[i] for i in idx], op_name=[f.op_name[i] for i in idx],
        dtype=[f.dtype[i] for i in idx], m=f.m[idx], n=f.n[idx], k=f.k[idx], batch=f.batch[idx],
        heads=f.heads[idx], bwd=f.bwd[idx], flops=f.flops[idx], bytes=f.bytes[idx], dur=f.dur[idx],
        grid=f.grid[idx], block=f.block[idx], elems=f.elems[idx] if f.elems is not None else None,
        red_len=f.red_len[idx] if f.red_len is not None else None,
        red_stride=f.red_stride[idx] if f.red_stride is not None else None,
    )


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    """Mean absolute percentage error as a fraction (NaN when empty)."""
    ok = np.isfinite(pred) & np.isfinite(meas) & (meas > 0)
    return float(np.mean(np.abs(pred[ok] - meas[ok]) / meas[ok])) if ok.any() else math.nan


def launch_keys(f: KernelFeatures, classes: Sequence[str] = GEMM_CLASSES) -> list[tuple]:
    """Per row of ``classes`` (others: skipped), the launch a shape-less predictor can see:
    (kernel name, grid, block)."""
    return [(f.kernel[i], tuple(int(v) for v in f.grid[i]), tuple(int(v) for v in f.block[i]))
            for i in range(len(f)) if f.cls[i] in classes and f.dur[i] > 0]


def launch_key_floor(f: KernelFeatures, classes: Sequence[str] = GEMM_CLASSES) -> tuple[float, int, int]:
    """The lowest per-op MAPE that any predictor seeing only each kernel's launch (name, grid, block)
    can reach on the rows of ``classes``, given measured rows of exactly those launches: rows sharing a
    launch get one prediction, at best the MAPE-optimal constant of their durations (the median
    weighted by 1/duration). Returns (floor as a fraction, rows, distinct launches); NaN without rows."""
    groups: dict[tuple, list[float]] = {}
    rows = [i for i in range(len(f)) if f.cls[i] in classes and f.dur[i] > 0]
    for i, key in zip(rows, launch_keys(f, classes)):
        groups.setdefault(key, []).append(float(f.dur[i]))
    if not rows:
        return math.nan, 0, 0
    ape = 0.0
    for durs in groups.values():
        t = np.sort(np.asarray(durs))
        w = np.cumsum(1.0 / t)
        best = t[int(np.searchsorted(w, w[-1] / 2))]
        ape += float(np.abs(best / t - 1).sum())
    return ape / len(rows), len(rows), len(groups)


def _usable(f: KernelFeatures) -> np.ndarray:
    return np.isfinite(f.dur) & (f.dur > 0)


KERNEL_SCALE_PRIOR = 2.0
"""Shrinkage of the per-kernel-family factors: a family seen n times gets ``exp(median log residual
* n / (n + KERNEL_SCALE_PRIOR))``."""
KERNEL_SCALE_MAX = 256
"""At most this many kernel families (the most frequent) get a factor."""
KERNEL_DB_MAX = 2000
"""Default size bound of a profile's kernel database (entries, the most frequent keys)."""


def fit_kernel_scale(db: KernelDB, prof: CalibrationProfile, max_families: int = KERNEL_SCALE_MAX) -> dict:
    """Per-kernel-family factors on the model's GEMM times: the shrunk median of the fitted rows'
    log(measured / modeled), clipped to [1/4, 4] (a kernel's efficiency relative to its class curve)."""
    from cosim.models.predict import SOURCES, predict_features
    from cosim.models.profile import kernel_family

    acc = load_catalog().accelerator(db.accelerator)
    pr = predict_features(db.feats, acc, prof, kernel_scale=False, database=False)
    f = db.feats
    res: dict[str, list[float]] = {}
    for j in np.flatnonzero(_usable(f) & (pr.source == SOURCES.index("model"))):
        if f.cls[j] in GEMM_CLASSES and pr.dur[j] > 0:
            res.setdefault(kernel_family(f.kernel[j]), []).append(math.log(f.dur[j] / pr.dur[j]))
    top = sorted(res.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:max_families]
    out = {}
    for fam, r in top:
        n = len(r)
        out[fam] = {"scale": float(np.clip(math.exp(float(np.median(r)) * n / (n + KERNEL_SCALE_PRIOR)), 0.25, 4.0)),
                    "n": n}
    return out


def build_kernel_db(db: KernelDB, max_entries: int = KERNEL_DB_MAX) -> dict[tuple, tuple[float, int]]:
    """Measured median duration per exact key (:func:`cosim.models.profile.db_key`) of the rows with
    shapes or bytes (collectives excluded), keeping the ``max_entries`` most frequent keys."""
    from cosim.models.profile import db_key

    f = db.feats
    by: dict[tuple, list[float]] = {}
    for j in np.flatnonzero(_usable(f)):
        if f.cls[j] == "collective" or not (np.isfinite(f.m[j]) or np.isfinite(f.bytes[j])):
            continue
        key = db_key(f.kernel[j], f.cls[j], f.dtype[j], f.m[j], f.n[j], f.k[j], f.batch[j], f.heads[j], f.bwd[j],
                     f.bytes[j])
        by.setdefault(key, []).append(float(f.dur[j]))
    top = sorted(by.items(), key=lambda kv: (-len(kv[1]), tuple(str(x) for x in kv[0])))[:max(int(max_entries), 0)]
    return {k: (float(np.median(v)), len(v)) for k, v in top}


def fit_memory_patterns(nbytes: np.ndarray, dur: np.ndarray, patterns: np.ndarray, bandwidth: float,
                        hw: HardwareFigures, parallel: np.ndarray | float = 0.0) -> dict:
    """Parameters of one memory class by access pattern (:func:`cosim.models.calibrated.access_patterns`).

    ``default`` is the reference pattern's (contiguous / pinned) fit on every row, each row's bytes divided
    by its pattern's relative bandwidth (:func:`cosim.models.calibrated.pattern_efficiency` at a reference
    efficiency of :data:`REFERENCE_EFFICIENCY`), so a strided row counts as the contiguous traffic it costs;
    a pattern whose own rows identify a bandwidth (:func:`bandwidth_identifiable`) also gets its own fit,
    ``pattern:<name>``. Patterns without one are predicted from ``default`` by their pattern rule.
    ``parallel``: the rows' parallelism bounds (:func:`cosim.models.calibrated.parallel_time`), 0 if none."""
    par = np.broadcast_to(np.asarray(parallel, dtype=float), np.shape(nbytes))
    ratio = np.array([pattern_efficiency(p, REFERENCE_EFFICIENCY, hw, bandwidth) / REFERENCE_EFFICIENCY
                      for p in patterns])
    out: dict = {"default": fit_memory(nbytes / ratio, dur, bandwidth, par)}
    if len(set(patterns)) > 1 or np.any(ratio != 1.0):
        for pat in sorted(set(patterns) - {""}):
            s = patterns == pat
            if bandwidth_identifiable(nbytes[s], dur[s], bandwidth):
                out[PATTERN_PREFIX + pat] = fit_memory(nbytes[s], dur[s], bandwidth, par[s])
            elif pat in REDUCED_AXIS_PATTERNS and s.sum() >= MIN_AXIS_PATTERN_ROWS:
                # its own floor; the efficiency it would get from the class fit without one
                eff = pattern_efficiency(pat, out["default"].efficiency, hw, bandwidth)
                out[PATTERN_PREFIX + pat] = fit_memory(nbytes[s], dur[s], bandwidth, par[s], efficiency=eff)
    return out


MIN_AXIS_PATTERN_ROWS = 6
"""Rows of a reduced-axis pattern (:data:`cosim.models.calibrated.REDUCED_AXIS_PATTERNS`) from which it gets its
own fit even where its bytes do not identify a bandwidth (then its floor only, :func:`fit_memory`, the efficiency
being the one the class fit gives the pattern)."""

REFERENCE_EFFICIENCY = 0.8
"""Efficiency of a contiguous kernel assumed when weighting other patterns' rows in a class fit."""


def fit_profile(db: KernelDB, name: str | None = None, provenance: dict | None = None, *,
                kernel_scale: bool = True, kernel_db: int = 0, launch: bool = True,
                launch_extra: KernelDB | None = None) -> CalibrationProfile:
    """Fit every class with enough modeled samples in ``db``; report in-sample errors.

    ``kernel_scale``: also fit per-kernel-family factors (:func:`fit_kernel_scale`). ``kernel_db``:
    store up to this many measured medians (:func:`build_kernel_db`; 0 = none). ``launch``: also fit
    the launch-configuration laws for ops without shapes (:func:`cosim.models.launch.fit_launch`) on
    the rows of ``db`` plus ``launch_extra`` (more calibration traces of the same GPU, e.g. ones without
    Input Dims: they feed the launch laws only, never the shape models). The in-sample ``fit_errors``
    never use the database."""
    acc = load_catalog().accelerator(db.accelerator)
    hw = HardwareFigures.of(acc)
    f = db.feats
    cls = np.array(f.cls, dtype=object)
    dts = np.array(f.dtype, dtype=object)
    use = _usable(f)
    models: dict[str, dict] = {}
    for c in GEMM_CLASSES:
        ok = use & (cls == c) & np.isfinite(f.m) & np.isfinite(f.n) & np.isfinite(f.k)
        if ok.sum() < _MIN_SAMPLES[c]:
            continue
        peaks = np.array([hw.peak(d) for d in dts[ok]])
        base = fit_gemm(f.m[ok], f.n[ok], f.k[ok], f.batch[ok], f.bytes[ok], peaks, f.dur[ok], hw)
        models[c] = {"default": base}
        for dt in sorted(set(dts[ok])):
            s = ok & (dts == dt)
            if s.sum() >= _MIN_PER_DTYPE and len(set(dts[ok])) > 1:
                models[c][dt] = fit_gemm(f.m[s], f.n[s], f.k[s], f.batch[s], f.bytes[s], hw.peak(dt), f.dur[s],
                                         hw, start=base)
        # second set for kernels whose name spells their CTA tile (used only together with that tile;
        # the launch grid, when recorded, gives the split-K count and waves)
        tiles = named_tiles(f.kernel)
        okt = ok & np.isfinite(tiles[:, 0])
        if okt.sum() >= _MIN_SAMPLES[c]:
            peaks = np.array([hw.peak(d) for d in dts[okt]])
            tbase = fit_gemm(f.m[okt], f.n[okt], f.k[okt], f.batch[okt], f.bytes[okt], peaks, f.dur[okt], hw,
                             start=base, tile=tiles[okt], grid=f.grid[okt])
            models[c][TILE_PREFIX + "default"] = tbase
            for dt in sorted(set(dts[okt])):
                s = okt & (dts == dt)
                if s.sum() >= _MIN_PER_DTYPE and len(set(dts[okt])) > 1:
                    models[c][TILE_PREFIX + dt] = fit_gemm(f.m[s], f.n[s], f.k[s], f.batch[s], f.bytes[s],
                                                           hw.peak(dt), f.dur[s], hw, start=tbase, tile=tiles[s],
                                                           grid=f.grid[s])
        # third set for cuBLAS's gemv / skinny kernels (launch- and memory-bound, their own floor)
        okv = ok & gemv_kernels(f.kernel)
        if okv.sum() >= _MIN_GEMV:
            peaks = np.array([hw.peak(d) for d in dts[okv]])
            models[c][GEMV_PREFIX + "default"] = fit_gemm(f.m[okv], f.n[okv], f.k[okv], f.batch[okv], f.bytes[okv],
                                                          peaks, f.dur[okv], hw, start=base)
    ok = use & (cls == "attention") & np.isfinite(f.m) & np.isfinite(f.k)
    if ok.sum() >= _MIN_SAMPLES["attention"]:
        peaks = np.array([hw.peak(d) for d in dts[ok]])
        models["attention"] = {"default": fit_attention(f.batch[ok], f.heads[ok], f.m[ok], f.n[ok], f.k[ok],
                                                        f.bwd[ok], peaks, f.dur[ok], hw)}
    pats = access_patterns(f.kernel, f)
    for c in MEMORY_CLASSES:
        ok = use & (cls == c) & np.isfinite(f.bytes)
        if ok.sum() >= _MIN_MEMORY:
            par = np.zeros(int(ok.sum()))
            for pat in set(pats[ok]):
                s = pats[ok] == pat
                par[s] = launch_bound(f, np.flatnonzero(ok)[s], pat, hw)
            models[c] = fit_memory_patterns(f.bytes[ok], f.dur[ok], pats[ok], reference_bandwidth(c, hw), hw, par)
    prof = CalibrationProfile(name=name or db.accelerator, accelerator=db.accelerator, models=models)
    prov = {
        "gpu": db.device_name or acc.name,
        "method": "traces",
        "sources": sorted({Path(s).name for s in db.source}),
        "date": _dt.date.today().isoformat(),
        "n_kernels": int(use.sum()),
    }
    prov.update(provenance or {})
    prof.provenance = prov
    if kernel_scale:
        prof.kernel_scale = fit_kernel_scale(db, prof)
    if kernel_db:
        prof.kernel_db = build_kernel_db(db, kernel_db)
    if launch:
        from cosim.models.launch import fit_launch

        lf = concat([db.feats, launch_extra.feats]) if launch_extra is not None else db.feats
        prof.launch = fit_launch(lf.cls, lf.kernel, lf.grid, lf.block, lf.dur)
        if prof.launch:
            srcs = set(db.source) | (set(launch_extra.source) if launch_extra is not None else set())
            prof.launch["sources"] = sorted({Path(s).name for s in srcs})
    prof.fit_errors = class_errors(db, prof, database=False)
    return prof


def class_errors(db: KernelDB, prof: CalibrationProfile, accelerator: str | None = None, *,
                 kernel_scale: bool = True, database: bool = False, all_ops: bool = False) -> dict[str, dict]:
    """Per-class MAPE of ``prof`` on the *modeled* rows of ``db`` (rows with shapes/bytes), predicted on
    ``accelerator`` (default: the DB's GPU). Keys: n, mape, median_ape, time_err (error of the class total);
    with ``all_ops`` also n_all, mape_all, time_err_all over every row with a prediction (shape-less rows
    predicted from a twin / kernel name / class floor included). ``database=True`` lets the profile's
    kernel database answer exact-key hits (scored too). See :mod:`cosim.models.accuracy`."""
    from cosim.models.accuracy import class_error_table
    from cosim.models.predict import predict_features

    acc = load_catalog().accelerator(accelerator or db.accelerator)
    pr = predict_features(db.feats, acc, prof, kernel_scale=kernel_scale, database=database)
    return class_error_table([db.feats], [pr], all_ops=all_ops)
