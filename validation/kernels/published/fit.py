"""Refit :data:`cosim.models.precision.NARROW_GEMM` on one published source (default: DeepGEMM's H800 table).

Grid search over (efficiency ratio on the BF16 main-loop efficiency, per-wave tile overhead, HBM efficiency of
weight streaming, floor), minimising median |log error| + max |log error| / 2 of the tile/wave GEMM model with the
``h100-sxm5`` profile's BF16 parameters on the source's catalog GPU at the FP8 peak.

``python -m validation.kernels.published.fit [SOURCE.yaml ...] [--dtype D] [--min-us T] [--fix NAME=VALUE]`` prints
the best point and its errors. The Blackwell rule (``cosim.models.precision.BLACKWELL_GEMM``)::

    python -m validation.kernels.published.fit validation/kernels/published/xla-b200.yaml --dtype bf16 \
        --min-us 10 --fix floor_s=2.5e-6 --fix memory_efficiency=0.825     # and --dtype fp8

Its sustained-clock ceiling (``max_throughput``) on pytorch/ao's B200 plateau, the other parameters held::

    python -m validation.kernels.published.fit validation/kernels/published/torchao-b200-bf16.yaml --dtype bf16 \
        --min-us 10 --ceiling --fix efficiency_ratio=1.26 --fix tile_overhead_s=4e-6 --fix floor_s=2.5e-6 \
        --fix memory_efficiency=0.825
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

import numpy as np
import yaml

from cosim.catalog import load_catalog
from cosim.models import load_profile
from cosim.models.calibrated import GemmParams, HardwareFigures, gemm_time

HERE = Path(__file__).resolve().parent


def source_rows(src: dict, dtype: str) -> np.ndarray:
    """``[g, m, n, k, TFLOP/s]`` rows of ``dtype`` from either row format of the published YAML files."""
    if src.get("dtype"):  # [layout, groups, m, n, k, tflops], one dtype
        return np.array([r[1:] for r in src["rows"]] if src["dtype"] == dtype else np.zeros((0, 5)), dtype=float)
    return np.array([[1, *r[1:5]] for r in src["rows"] if r[0] == dtype], dtype=float).reshape(-1, 5)


def fit(path: Path | list[Path], dtype: str = "fp8", min_us: float = 0.0,
        fixed: dict[str, float] | None = None, ceiling: bool = False) -> tuple[dict[str, float], np.ndarray]:
    """Grid fit on the rows of ``dtype`` whose published time is at least ``min_us`` (µs); ``ceiling``: also search
    the sustained-throughput ceiling ``max_throughput`` (else held at 1.0, no ceiling)."""
    paths = path if isinstance(path, list) else [path]
    srcs = [yaml.safe_load(p.read_text()) for p in paths]
    src = srcs[0]
    if len({s["gpu"] for s in srcs}) != 1:
        raise ValueError("fit: sources of one GPU at a time")
    base = load_profile("h100-sxm5").params("gemm", "bf16")
    assert isinstance(base, GemmParams)
    hw = HardwareFigures.of(load_catalog().accelerator(src["gpu"]))
    R = np.concatenate([source_rows(s, dtype) for s in srcs])
    R = R[2 * R[:, 0] * R[:, 1] * R[:, 2] * R[:, 3] / (R[:, 4] * 1e12) >= min_us * 1e-6]
    g, m, n, k, tf = R.T
    ib = 2.0 if dtype == "bf16" else 1.0
    nbytes = g * ((m * k + k * n) * ib + 2.0 * m * n)
    t = 2 * g * m * n * k / (tf * 1e12)

    def err(rc: float, to: float, me: float, fl: float, mt: float = 1.0) -> np.ndarray:
        p = replace(base, efficiency=min(1.0, base.efficiency * rc), tile_overhead_s=to, memory_efficiency=me,
                    floor_s=fl, max_throughput=mt)
        return np.asarray(np.log(gemm_time(m, n, k, g, nbytes, hw.peak(dtype), hw, p) / t))

    best: tuple[float, tuple[float, ...]] | None = None
    grid = (np.arange(0.80, 1.42, 0.02), [0.0, 0.5e-6, 1e-6, 1.5e-6, 2e-6, 3e-6, 4e-6, 5e-6],
            np.arange(0.6, 1.0, 0.025), np.arange(1e-6, 5.1e-6, 0.5e-6),
            [1.0, *np.arange(0.55, 0.80, 0.01)] if ceiling else [1.0])
    names = ("efficiency_ratio", "tile_overhead_s", "memory_efficiency", "floor_s", "max_throughput")
    grid = tuple([fixed[nm]] if fixed and nm in fixed else list(gr) for nm, gr in zip(names, grid))
    for x in itertools.product(*grid):
        e = np.abs(err(*x))
        s = float(np.median(e) + 0.5 * e.max())
        if best is None or s < best[0]:
            best = (s, tuple(float(v) for v in x))
    assert best is not None
    rc, to, me, fl, mt = best[1]
    return ({"efficiency_ratio": round(rc, 3), "tile_overhead_s": to, "memory_efficiency": round(me, 3),
             "floor_s": fl, "max_throughput": round(mt, 3)}, np.exp(-err(rc, to, me, fl, mt)) - 1)


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m validation.kernels.published.fit")
    ap.add_argument("source", nargs="*", default=[str(HERE / "deepgemm-h800-fp8.yaml")], help="YAML files of one GPU")
    ap.add_argument("--dtype", default="fp8")
    ap.add_argument("--min-us", type=float, default=0.0, help="leave out rows faster than this (µs)")
    ap.add_argument("--fix", action="append", default=[], help="NAME=VALUE: hold a parameter (e.g. floor_s=2.5e-6)")
    ap.add_argument("--ceiling", action="store_true", help="also fit max_throughput (the sustained-clock ceiling)")
    a = ap.parse_args(argv)
    fixed = {k: float(v) for k, v in (f.split("=", 1) for f in a.fix)}
    params, e = fit([Path(p) for p in a.source], a.dtype, a.min_us, fixed or None, a.ceiling)
    print(params)
    print(f"median |error| {np.median(np.abs(e)):.1%}, max {np.abs(e).max():.1%} (cosim TFLOP/s / published - 1)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
