"""Held-out checks of Transformer Engine's grouped GEMM as cosim times it.

Run from the repository root:  python validation/kernels/per_expert.py

1. The kernel timer (pooled tile waves plus a launch floor per round of TE's four compute streams,
   :data:`cosim.models.synth_timing.TE_GROUPED_STREAMS_SOURCE`) against TE PR #2045's measured
   ``general_grouped_gemm`` on H100 BF16 (TE 2.7, multi-stream cuBLAS), with the pooled rule alone and the serial
   bound beside it.
2. The serial bound's GEMMs (:func:`cosim.models.synth_timing.per_expert_gemm_time`: each expert's cuBLAS GEMM
   alone). Each of those GEMMs is a cuBLAS GEMM of one
expert's rows, which vidur measured on an H100 for dense layers of nearly the expert shapes of Qwen3-235B
(Llama-2-7B at TP8: ``mlp_up_proj`` N 2752, K 4096 ~ fc1's N 3072, K 4096; ``mlp_down_proj`` N 4096, K 1376
~ fc2's N 4096, K 1536) at 256-4096 rows (``../shared/measured/vidur-h100-compute``, never fitted: the bundled
h100-sxm5 profile is fitted on the tracelens-h100 traces). For 16 experts of each shape it prints one expert's
time as the pooled rule (the tiles of all experts in waves over the SMs, one kernel) and the per-expert rule
(each expert's own GEMM, the GEMMs one after another) give it, against vidur's measured GEMM.
"""

from __future__ import annotations

import csv
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's cosim, not an installed copy

from cosim.catalog import load_catalog
from cosim.models.calibrated import GemmParams, HardwareFigures
from cosim.models.synth_timing import KernelTimer, per_expert_gemm_time
from cosim.resources import shared_dir
from cosim.workload.synth.costs import Op

SHAPES = (("mlp_up_proj", 2752.0, 4096.0), ("mlp_down_proj", 4096.0, 1376.0))
"""vidur's Llama-2-7B TP8 GEMMs: (op, N, K)."""
EXPERTS = 16


def rows() -> list[dict[str, float | str]]:
    """One row per (shape, M): vidur's measured median, one expert's time under the pooled and the per-expert
    rule (the 16-expert grouped GEMM's time / 16), seconds."""
    base = shared_dir()
    if base is None:
        raise FileNotFoundError("../shared is absent")
    acc = load_catalog().accelerator("h100-sxm5")
    kt = KernelTimer(acc)
    hw = HardwareFigures.of(acc)
    p = kt._model_profile.params("gemm", "bf16")
    assert isinstance(p, GemmParams)
    out: list[dict[str, float | str]] = []
    seen: set[int] = set()
    with open(base / "measured" / "vidur-h100-compute" / "llama2-7b-mlp.csv") as f:
        for r in csv.DictReader(f):
            m = int(r["num_tokens"])
            if r["num_tensor_parallel_workers"] != "8" or m < 256 or m > 4096 or m in seen:
                continue
            seen.add(m)
            for op, n, k in SHAPES:
                g = EXPERTS
                nbytes = 2.0 * (m * k + k * n + m * n) * g
                o = Op("moe.experts_fc1", "grouped_gemm", 2.0 * m * n * k * g, nbytes, "bf16", float(m), n, k, g,
                       group_rows=(float(m),) * g)
                pooled = kt([o])[0]
                per = per_expert_gemm_time(np.full(g, float(m)), float(m), n, k, False, nbytes, hw.peak("bf16"), hw,
                                           p)
                out.append({"op": op, "m": float(m), "n": n, "k": k,
                            "measured": float(r[f"time_stats.{op}.median"]) * 1e-3,
                            "pooled": pooled / g, "per_expert": per / g})
    return sorted(out, key=lambda x: (str(x["op"]), float(x["m"])))


SHOWN = (256, 512, 768, 1024, 1536, 2048, 3072, 4096)
"""Rows printed one by one (the summary covers every M vidur measured)."""
BUCKETS = ((256, 768), (768, 1536), (1536, 3072), (3072, 4097))
"""M ranges of the summary, [lo, hi)."""


def summary(rs: list[dict[str, float | str]]) -> list[dict[str, float]]:
    """Per M bucket: GEMMs, and for each rule the total time error and the mean absolute error vs vidur."""
    out = []
    for lo, hi in BUCKETS:
        sel = [r for r in rs if lo <= float(r["m"]) < hi]
        t = sum(float(r["measured"]) for r in sel)
        row = {"lo": float(lo), "hi": float(hi), "n": float(len(sel))}
        for rule in ("pooled", "per_expert"):
            row[f"{rule}_total"] = sum(float(r[rule]) for r in sel) / t - 1
            row[f"{rule}_mape"] = sum(abs(float(r[rule]) / float(r["measured"]) - 1) for r in sel) / len(sel)
        out.append(row)
    return out


TE_PR_2045 = ((8, 4096.0, 768.0, 2048.0, 627.903e12), (16, 2048.0, 768.0, 2048.0, 553.945e12))
"""NVIDIA/TransformerEngine PR #2045 (yaox12's update): ``general_grouped_gemm`` with TE 2.7 and CUDA 12.9 on H100
BF16, multi-stream cuBLAS: (experts, rows per expert, N, K, FLOP/s)."""


def te_grouped() -> list[dict[str, float]]:
    """TE PR #2045's grouped GEMMs: measured FLOP/s and cosim's under the timer's rule, the pooled rule alone and
    the serial bound."""
    acc = load_catalog().accelerator("h100-sxm5")
    kt = KernelTimer(acc)
    hw = HardwareFigures.of(acc)
    p = kt._model_profile.params("gemm", "bf16")
    assert isinstance(p, GemmParams)
    out = []
    for g, m, n, k, measured in TE_PR_2045:
        flops = 2 * g * m * n * k
        nbytes = 2.0 * (m * k + k * n + m * n) * g
        o = Op("x", "grouped_gemm", flops, nbytes, "bf16", m, n, k, g, group_rows=(m,) * g, launches=g)
        te, pooled = kt([o, replace(o, launches=1)])
        serial = per_expert_gemm_time(np.full(g, m), m, n, k, False, nbytes, hw.peak("bf16"), hw, p)
        out.append({"g": float(g), "m": m, "n": n, "k": k, "measured": measured, "te": flops / te,
                    "pooled": flops / pooled, "serial": flops / serial})
    return out


def main() -> int:
    print("| TE PR #2045 (H100 BF16) | measured TFLOP/s | cosim (streams) | pooled alone | serial bound |")
    print("|---|---:|---:|---:|---:|")
    for r in te_grouped():
        t = r["measured"]
        cells = " | ".join(f"{r[c] / 1e12:.0f} ({r[c] / t - 1:+.1%})" for c in ("te", "pooled", "serial"))
        print(f"| {r['g']:.0f} x {r['m']:.0f} rows, N {r['n']:.0f}, K {r['k']:.0f} | {t / 1e12:.0f} | {cells} |")
    print()
    rs = rows()
    print("One expert GEMM of 16 vs vidur's single cuBLAS GEMM of that shape:")
    print()
    print("| M | GEMMs | pooled / 16: total time error / MAPE | alone (serial bound / 16): total time error / MAPE |")
    print("|---|---:|---:|---:|")
    for b in summary(rs):
        print(f"| {b['lo']:.0f}-{b['hi'] - 1:.0f} | {b['n']:.0f} | {b['pooled_total']:+.1%} / {b['pooled_mape']:.1%} | "
              f"{b['per_expert_total']:+.1%} / {b['per_expert_mape']:.1%} |")
    print()
    print("| vidur op | M | N | K | measured us | pooled / 16 us (err) | alone us (err) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rs:
        if int(float(r["m"])) not in SHOWN:
            continue
        t = float(r["measured"])
        p, e = float(r["pooled"]), float(r["per_expert"])
        print(f"| {r['op']} | {r['m']:.0f} | {r['n']:.0f} | {r['k']:.0f} | {t * 1e6:.1f} | {p * 1e6:.1f} "
              f"({p / t - 1:+.0%}) | {e * 1e6:.1f} ({e / t - 1:+.0%}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
