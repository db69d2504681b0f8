"""Score cosim's kernel model (the synthesized-step kernel timer) on published GEMM / grouped-GEMM throughputs.

Each ``*.yaml`` here is one source (shape, dtype, GPU, TFLOP/s, with its URL). A row's cosim figure is the time
:class:`cosim.models.synth_timing.KernelTimer` gives the same op on the catalog GPU with its default profile,
i.e. exactly what a synthesized training step uses. Error = cosim TFLOP/s / published TFLOP/s - 1 (positive:
cosim too fast).

``python -m validation.kernels.published.score [--json]`` prints per-source median / max |error|.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from cosim.catalog import load_catalog
from cosim.models.synth_timing import KernelTimer
from cosim.workload.synth.costs import PRECISIONS, Op, _quant

HERE = Path(__file__).resolve().parent
OUT_BYTES = 2.0
"""BF16 output of every published GEMM here."""


def _gemm(name: str, dtype: str, g: float, m: float, n: float, k: float) -> Op:
    ib = 2.0 if dtype == "bf16" else 1.0
    cls = "gemm" if g == 1 else "grouped_gemm"
    return Op(name, cls, 2.0 * g * m * n * k, g * ((m * k + k * n) * ib + m * n * OUT_BYTES), dtype, m, n, k, g)


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def rows_of(src: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows ``{label, gpu, ops, flops, tflops}``: the ops cosim times for one published figure."""
    out = []
    if "models" in src:  # Primus-Turbo: average over TE Linear shapes, forward and backward
        p = PRECISIONS[src["dtype"]]
        for direction, meas in src["average_tflops"].items():
            shapes = []
            for name, (seq, h, f, heads, kv, hd) in src["models"].items():
                for mbs in src["mbs"]:
                    M = seq * mbs
                    for N, K in (((heads + 2 * kv) * hd, h), (h, h), (2 * f, h), (h, f)):
                        if direction == "forward":
                            ops = [*_quant("x", M * K, p), *_quant("w", N * K, p), _gemm("fprop", p.gemm, 1, M, N, K)]
                            fl = 2.0 * M * N * K
                        else:
                            ops = [*_quant("dy", M * N, p), _gemm("dgrad", p.gemm, 1, M, K, N),
                                   _gemm("wgrad", p.gemm, 1, N, K, M)]
                            fl = 4.0 * M * N * K
                        shapes.append({"ops": ops, "flops": fl, "shape": f"{name} mbs{mbs} {M}x{N}x{K}"})
            out.append({"label": f"TE Linear {direction} (mean of {len(shapes)} shapes)", "gpu": src["gpu"],
                        "average": shapes, "tflops": float(meas), "layout": direction})
        return out
    for r in src["rows"]:
        if src.get("dtype"):  # [layout, groups, m, n, k, tflops]
            layout, g, m, n, k, tf = r
            dt = src["dtype"]
        else:  # [dtype, m, n, k, tflops] or [dtype, m, n, k, tflops, scaling label]
            dt, m, n, k, tf = r[:5]
            layout, g = ("dense" if len(r) < 6 else f"dense {r[5]}"), 1
        short = bool(src.get("short_us")) and 2.0 * g * m * n * k / (tf * 1e12) < float(src["short_us"]) * 1e-6
        lay = f"{layout} {dt}" + (f" <{src['short_us']:g}us" if short else "")
        out.append({"label": f"{layout} {dt} {g}x{m}x{n}x{k}", "gpu": src["gpu"], "layout": lay,
                    "ops": [_gemm("gemm", dt, g, m, n, k)], "flops": 2.0 * g * m * n * k, "tflops": float(tf)})
    return out


def score_source(path: Path, timers: dict[str, KernelTimer] | None = None) -> dict[str, Any]:
    """Per-row cosim vs published TFLOP/s of one source file."""
    src = load(path)
    cat = load_catalog()
    timers = {} if timers is None else timers
    rows = []
    for r in rows_of(src):
        t = timers.get(r["gpu"]) or timers.setdefault(r["gpu"], KernelTimer(cat.accelerator(r["gpu"])))
        if "average" in r:
            tfs = [s["flops"] / sum(t(s["ops"])) / 1e12 for s in r["average"]]
            pred = float(np.mean(tfs))
        else:
            pred = r["flops"] / sum(t(r["ops"])) / 1e12
        rows.append({"label": r["label"], "layout": r["layout"], "published_tflops": r["tflops"],
                     "cosim_tflops": round(pred, 1), "error": round(pred / r["tflops"] - 1, 4)})
    err = np.abs([x["error"] for x in rows])
    groups: dict[str, list[float]] = {}
    for x in rows:
        groups.setdefault(x["layout"], []).append(x["error"])
    by = {k: {"n": len(v), "median_error": round(float(np.median(v)), 4),
              "max_abs_error": round(float(np.abs(v).max()), 4)} for k, v in groups.items()}
    return {"by_layout": by, "source": src["source"], "url": src["url"], "gpu": src["gpu"], "n": len(rows),
            "median_abs_error": round(float(np.median(err)), 4), "max_abs_error": round(float(err.max()), 4),
            "median_error": round(float(np.median([x["error"] for x in rows])), 4), "rows": rows}


def score_all() -> dict[str, Any]:
    return {p.stem: score_source(p) for p in sorted(HERE.glob("*.yaml"))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--rows", action="store_true", help="print every row")
    ap.add_argument("--params", help="JSON overriding cosim.models.precision.NARROW_GEMM (held-out checks of a refit)")
    ap.add_argument("--off", action="store_true", help="without the narrow-GEMM rule (the profile's own FP8 parameters)")
    ap.add_argument("--blackwell", help="JSON {dtype: {...}} overriding cosim.models.precision.BLACKWELL_GEMM")
    ap.add_argument("--no-blackwell", action="store_true", help="without the Blackwell library-GEMM rule (round 4)")
    a = ap.parse_args(argv)
    import cosim.models.precision as prec

    if a.params:
        prec.NARROW_GEMM.update(json.loads(a.params))
    if a.blackwell:
        for dt, v in json.loads(a.blackwell).items():
            prec.BLACKWELL_GEMM[dt].update(v)
    if a.no_blackwell:
        prec.library_profile = lambda p, acc: prec.narrow_profile(p)  # type: ignore[assignment]
    if a.off:
        prec.narrow_profile = lambda p: p  # type: ignore[assignment]
    res = score_all()
    if a.json:
        json.dump(res, sys.stdout, indent=1)
        return 0
    print("| source | GPU | n | median error | median abs error | max abs error |")
    print("|---|---|---:|---:|---:|---:|")
    for k, v in res.items():
        print(f"| {k} | {v['gpu']} | {v['n']} | {v['median_error']:+.1%} | {v['median_abs_error']:.1%} | "
              f"{v['max_abs_error']:.1%} |")
    print("\n| source | rows | n | median error | max abs error |\n|---|---|---:|---:|---:|")
    for k, v in res.items():
        for lay, g in v["by_layout"].items():
            print(f"| {k} | {lay} | {g['n']} | {g['median_error']:+.1%} | {g['max_abs_error']:.1%} |")
    if a.rows:
        for k, v in res.items():
            print(f"\n{k}")
            for r in v["rows"]:
                print(f"  {r['label']:40s} pub {r['published_tflops']:8.1f}  cosim {r['cosim_tflops']:8.1f}  "
                      f"{r['error']:+.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
