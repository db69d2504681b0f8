"""Softmax exponentials as a second bound on flash attention: Blackwell (GB200) against Blackwell Ultra (GB300)
(s14-exp, issue 15).

Run from the repository root:  python validation/kernels/attention_exp.py

Data: NVIDIA/cudnn-frontend ``benchmark/sdpa_benchmark_training/results/{llama3.1,dsv3,kimiK26}/{gb200,gb300}``
(@3929da2, runs of 2026-04-24, cuDNN 9.22 backend, non-deterministic backward): the same SDPA shapes timed on
GB200 and GB300, whose BF16 / FP8 tensor peaks are equal (2.5 / 5 PFLOP/s) and whose exponential rates differ 2x
(catalog ``exp_rate``), so their time ratio isolates the exponential's share of the kernel.

Prints:

1. Each catalog GPU's exponential rate and the BF16 FLOPs one exponential stands for (``bf16 peak / exp_rate``).
2. The exposed share ``gamma`` (:data:`GAMMA`) refitted on the Llama-3.1 BF16
   pairs, and the GB200 / GB300 time ratio of every (model, dtype, pass) group, published median against three
   forms of the kernel per score element: ``max(MMA, exp)`` (full overlap), ``MMA + exp`` (serial), ``MMA + gamma
   exp``; the DeepSeek-V3 / Kimi-K2.6 (MLA) and every FP8 group are held out.
3. Absolute: cuDNN's published TFLOP/s at 32k tokens against ``MMA + gamma exp`` at the full tensor peak.
"""

from __future__ import annotations

import sys
from pathlib import Path
from statistics import median

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's cosim, not an installed copy

from cosim.catalog import load_catalog

SOURCE = ("NVIDIA/cudnn-frontend benchmark/sdpa_benchmark_training/results @3929da2 (cuDNN 9.22, GB200 and GB300, "
          "batch 2, non-deterministic backward)")
Key = tuple[str, str, int, str]
CUDNN: dict[str, tuple[tuple[int, int, int, int], dict[Key, tuple[float, float]]]] = {
    "llama3.1": ((128, 128, 2, 64), {
        ('bf16', 'no_mask', 2048, 'bwd'): (0.611, 0.567), ('bf16', 'no_mask', 2048, 'fwd'): (0.192, 0.152),
        ('bf16', 'no_mask', 4096, 'bwd'): (2.037, 1.924), ('bf16', 'no_mask', 4096, 'fwd'): (0.687, 0.579),
        ('bf16', 'no_mask', 8192, 'bwd'): (7.831, 7.181), ('bf16', 'no_mask', 8192, 'fwd'): (2.483, 2.181),
        ('bf16', 'no_mask', 16384, 'bwd'): (32.014, 28.638), ('bf16', 'no_mask', 16384, 'fwd'): (10.369, 8.734),
        ('bf16', 'no_mask', 32768, 'bwd'): (139.364, 123.272), ('bf16', 'no_mask', 32768, 'fwd'): (43.056, 38.317),
        ('bf16', 'top_left', 2048, 'bwd'): (0.389, 0.356), ('bf16', 'top_left', 2048, 'fwd'): (0.125, 0.1),
        ('bf16', 'top_left', 4096, 'bwd'): (1.198, 1.101), ('bf16', 'top_left', 4096, 'fwd'): (0.391, 0.323),
        ('bf16', 'top_left', 8192, 'bwd'): (4.127, 3.832), ('bf16', 'top_left', 8192, 'fwd'): (1.397, 1.185),
        ('bf16', 'top_left', 16384, 'bwd'): (16.554, 14.593), ('bf16', 'top_left', 16384, 'fwd'): (5.15, 4.593),
        ('bf16', 'top_left', 32768, 'bwd'): (71.756, 59.024), ('bf16', 'top_left', 32768, 'fwd'): (21.692, 18.014),
        ('fp8', 'no_mask', 2048, 'bwd'): (0.566, 0.494), ('fp8', 'no_mask', 2048, 'fwd'): (0.146, 0.101),
        ('fp8', 'no_mask', 4096, 'bwd'): (1.743, 1.495), ('fp8', 'no_mask', 4096, 'fwd'): (0.525, 0.368),
        ('fp8', 'no_mask', 8192, 'bwd'): (6.206, 5.209), ('fp8', 'no_mask', 8192, 'fwd'): (1.962, 1.392),
        ('fp8', 'no_mask', 16384, 'bwd'): (23.96, 20.203), ('fp8', 'no_mask', 16384, 'fwd'): (7.773, 5.529),
        ('fp8', 'no_mask', 32768, 'bwd'): (96.384, 80.754), ('fp8', 'no_mask', 32768, 'fwd'): (31.655, 23.072),
        ('fp8', 'top_left', 2048, 'bwd'): (0.414, 0.364), ('fp8', 'top_left', 2048, 'fwd'): (0.097, 0.07),
        ('fp8', 'top_left', 4096, 'bwd'): (1.167, 0.985), ('fp8', 'top_left', 4096, 'fwd'): (0.305, 0.217),
        ('fp8', 'top_left', 8192, 'bwd'): (3.781, 3.087), ('fp8', 'top_left', 8192, 'fwd'): (1.074, 0.759),
        ('fp8', 'top_left', 16384, 'bwd'): (13.476, 10.805), ('fp8', 'top_left', 16384, 'fwd'): (4.084, 2.88),
        ('fp8', 'top_left', 32768, 'bwd'): (52.155, 41.328), ('fp8', 'top_left', 32768, 'fwd'): (16.012, 11.319),
    }),
    "dsv3": ((192, 128, 2, 128), {
        ('bf16', 'no_mask', 2048, 'bwd'): (1.706, 1.6), ('bf16', 'no_mask', 2048, 'fwd'): (0.461, 0.388),
        ('bf16', 'no_mask', 4096, 'bwd'): (6.085, 5.641), ('bf16', 'no_mask', 4096, 'fwd'): (1.65, 1.419),
        ('bf16', 'no_mask', 8192, 'bwd'): (25.403, 21.973), ('bf16', 'no_mask', 8192, 'fwd'): (6.249, 5.439),
        ('bf16', 'no_mask', 16384, 'bwd'): (105.115, 91.189), ('bf16', 'no_mask', 16384, 'fwd'): (24.27, 21.64),
        ('bf16', 'no_mask', 32768, 'bwd'): (421.194, 366.969), ('bf16', 'no_mask', 32768, 'fwd'): (111.031, 91.788),
        ('bf16', 'top_left', 2048, 'bwd'): (1.056, 0.977), ('bf16', 'top_left', 2048, 'fwd'): (0.321, 0.268),
        ('bf16', 'top_left', 4096, 'bwd'): (3.383, 3.127), ('bf16', 'top_left', 4096, 'fwd'): (0.977, 0.864),
        ('bf16', 'top_left', 8192, 'bwd'): (11.984, 11.074), ('bf16', 'top_left', 8192, 'fwd'): (3.47, 3.013),
        ('bf16', 'top_left', 16384, 'bwd'): (50.424, 43.911), ('bf16', 'top_left', 16384, 'fwd'): (13.103, 11.178),
        ('bf16', 'top_left', 32768, 'bwd'): (212.546, 177.494), ('bf16', 'top_left', 32768, 'fwd'): (50.456, 44.189),
        ('fp8', 'no_mask', 2048, 'bwd'): (0.989, 0.851), ('fp8', 'no_mask', 2048, 'fwd'): (0.316, 0.225),
        ('fp8', 'no_mask', 4096, 'bwd'): (3.45, 2.971), ('fp8', 'no_mask', 4096, 'fwd'): (1.092, 0.832),
        ('fp8', 'no_mask', 8192, 'bwd'): (13.472, 11.395), ('fp8', 'no_mask', 8192, 'fwd'): (4.258, 3.233),
        ('fp8', 'no_mask', 16384, 'bwd'): (57.481, 44.344), ('fp8', 'no_mask', 16384, 'fwd'): (16.984, 12.794),
        ('fp8', 'no_mask', 32768, 'bwd'): (236.705, 185.459), ('fp8', 'no_mask', 32768, 'fwd'): (75.166, 52.327),
        ('fp8', 'top_left', 2048, 'bwd'): (0.681, 0.591), ('fp8', 'top_left', 2048, 'fwd'): (0.207, 0.15),
        ('fp8', 'top_left', 4096, 'bwd'): (2.112, 1.803), ('fp8', 'top_left', 4096, 'fwd'): (0.656, 0.493),
        ('fp8', 'top_left', 8192, 'bwd'): (7.296, 6.188), ('fp8', 'top_left', 8192, 'fwd'): (2.294, 1.758),
        ('fp8', 'top_left', 16384, 'bwd'): (29.05, 23.257), ('fp8', 'top_left', 16384, 'fwd'): (8.845, 6.653),
        ('fp8', 'top_left', 32768, 'bwd'): (123.181, 95.057), ('fp8', 'top_left', 32768, 'fwd'): (35.942, 26.146),
    }),
    "kimiK26": ((192, 128, 2, 64), {
        ('bf16', 'no_mask', 2048, 'bwd'): (0.879, 0.819), ('bf16', 'no_mask', 2048, 'fwd'): (0.237, 0.19),
        ('bf16', 'no_mask', 4096, 'bwd'): (3.009, 2.809), ('bf16', 'no_mask', 4096, 'fwd'): (0.841, 0.701),
        ('bf16', 'no_mask', 8192, 'bwd'): (11.719, 10.654), ('bf16', 'no_mask', 8192, 'fwd'): (3.087, 2.632),
        ('bf16', 'no_mask', 16384, 'bwd'): (50.963, 43.165), ('bf16', 'no_mask', 16384, 'fwd'): (12.457, 10.59),
        ('bf16', 'no_mask', 32768, 'bwd'): (213.066, 182.491), ('bf16', 'no_mask', 32768, 'fwd'): (51.776, 43.698),
        ('bf16', 'top_left', 2048, 'bwd'): (0.536, 0.492), ('bf16', 'top_left', 2048, 'fwd'): (0.167, 0.136),
        ('bf16', 'top_left', 4096, 'bwd'): (1.698, 1.548), ('bf16', 'top_left', 4096, 'fwd'): (0.518, 0.421),
        ('bf16', 'top_left', 8192, 'bwd'): (6.005, 5.466), ('bf16', 'top_left', 8192, 'fwd'): (1.733, 1.466),
        ('bf16', 'top_left', 16384, 'bwd'): (24.921, 21.253), ('bf16', 'top_left', 16384, 'fwd'): (6.398, 5.442),
        ('bf16', 'top_left', 32768, 'bwd'): (105.445, 88.821), ('bf16', 'top_left', 32768, 'fwd'): (25.72, 21.498),
        ('fp8', 'no_mask', 2048, 'bwd'): (0.512, 0.443), ('fp8', 'no_mask', 2048, 'fwd'): (0.165, 0.114),
        ('fp8', 'no_mask', 4096, 'bwd'): (1.723, 1.472), ('fp8', 'no_mask', 4096, 'fwd'): (0.575, 0.418),
        ('fp8', 'no_mask', 8192, 'bwd'): (6.535, 5.463), ('fp8', 'no_mask', 8192, 'fwd'): (2.155, 1.584),
        ('fp8', 'no_mask', 16384, 'bwd'): (27.238, 21.662), ('fp8', 'no_mask', 16384, 'fwd'): (8.242, 6.268),
        ('fp8', 'no_mask', 32768, 'bwd'): (113.717, 90.921), ('fp8', 'no_mask', 32768, 'fwd'): (36.262, 25.416),
        ('fp8', 'top_left', 2048, 'bwd'): (0.355, 0.304), ('fp8', 'top_left', 2048, 'fwd'): (0.11, 0.078),
        ('fp8', 'top_left', 4096, 'bwd'): (1.082, 0.904), ('fp8', 'top_left', 4096, 'fwd'): (0.338, 0.244),
        ('fp8', 'top_left', 8192, 'bwd'): (3.689, 3.064), ('fp8', 'top_left', 8192, 'fwd'): (1.139, 0.865),
        ('fp8', 'top_left', 16384, 'bwd'): (14.195, 11.276), ('fp8', 'top_left', 16384, 'fwd'): (4.326, 3.266),
        ('fp8', 'top_left', 32768, 'bwd'): (58.126, 45.48), ('fp8', 'top_left', 32768, 'fwd'): (18.194, 12.849),
    }),
}
"""Model -> ((d_qk, d_v, batch, query heads), {(dtype, mask, sequence, pass): (GB200 ms, GB300 ms)}) (:data:`SOURCE`)."""

GAMMA = 0.49
"""Share of the exponential time the tensor cores do not hide (per score element the kernel takes MMA + GAMMA x exp):
:func:`fit_gamma` on the :data:`FIT_ON` BF16 pairs gives 0.490."""

FIT_ON = "llama3.1"
"""The model whose BF16 pairs ``gamma`` is fitted on; the others are held out."""


def exp_flops(gpu: str) -> float:
    """BF16 FLOPs at the tensor peak that one hardware exponential takes on ``gpu`` (``bf16 peak / exp_rate``)."""
    acc = load_catalog().accelerator(gpu)
    assert acc.exp_rate is not None
    return float(acc.peak("bf16")) / float(acc.exp_rate)


def mma_flops(model: str, dtype: str, pss: str) -> float:
    """BF16-equivalent tensor FLOPs per score element: ``2 (d_qk + d_v)`` forward, x2.5 backward, /2 in FP8."""
    dqk, dv = CUDNN[model][0][:2]
    return 2.0 * (dqk + dv) * (2.5 if pss == "bwd" else 1.0) / (2.0 if dtype == "fp8" else 1.0)


def kernel_ratio(form: str, model: str, dtype: str, pss: str, gamma: float = GAMMA) -> float:
    """GB200 / GB300 time per score element of ``form``: ``max`` (MMA and exp overlapped), ``serial`` (summed),
    ``exposed`` (MMA + gamma exp)."""
    m, x200, x300 = mma_flops(model, dtype, pss), exp_flops("gb200"), exp_flops("gb300")
    if form == "max":
        return max(m, x200) / max(m, x300)
    g = 1.0 if form == "serial" else gamma
    return (m + g * x200) / (m + g * x300)


def groups(model: str) -> dict[tuple[str, str], list[float]]:
    """Published GB200 / GB300 time ratios of ``model`` by (dtype, pass)."""
    out: dict[tuple[str, str], list[float]] = {}
    for (dt, _mask, _s, pss), (t200, t300) in CUDNN[model][1].items():
        out.setdefault((dt, pss), []).append(t200 / t300)
    return out


def fit_gamma(model: str = FIT_ON) -> float:
    """``gamma`` minimizing the squared log error of the ``exposed`` form over ``model``'s BF16 pairs (grid of
    0.001 on [0, 2])."""
    rows = [(pss, r) for (dt, pss), rs in groups(model).items() if dt == "bf16" for r in rs]
    grid = np.arange(0.0, 2.0005, 0.001)
    err = [sum((np.log(kernel_ratio("exposed", model, "bf16", p, g)) - np.log(r)) ** 2 for p, r in rows) for g in grid]
    return float(grid[int(np.argmin(err))])


def absolute_tflops(model: str, dtype: str, pss: str, gpu: str, gamma: float = GAMMA) -> float:
    """TFLOP/s (cuDNN's convention) of the ``exposed`` form at ``gpu``'s full tensor peak."""
    acc = load_catalog().accelerator(gpu)
    m = mma_flops(model, dtype, pss)
    return float(acc.peak(dtype)) * m / (m + gamma * exp_flops(gpu)) / 1e12


def published_tflops(model: str, key: Key, gpu_index: int) -> float:
    """cuDNN's TFLOP/s of one published row (its ``flops()``: ``4 b h s^2 (d_qk + d_v) / 2``, halved when causal,
    x2.5 backward); ``gpu_index`` 0 GB200, 1 GB300."""
    (dqk, dv, b, h), (_dt, mask, s, pss) = CUDNN[model][0], key
    flops = 4.0 * b * h * s * s * (dqk + dv) / 2.0 * (0.5 if mask == "top_left" else 1.0) * (2.5 if pss == "bwd" else 1.0)
    return flops / (CUDNN[model][1][key][gpu_index] * 1e-3) / 1e12


def main() -> None:
    """Print the three comparisons (module docstring)."""
    cat = load_catalog()
    print("1. exponential rates (catalog exp_rate; BF16 FLOPs per exponential)")
    for g in ("a100-sxm-80gb", "h100-sxm5", "b200", "gb200", "b300", "gb300"):
        acc = cat.accelerator(g)
        print(f"   {g:<14} {float(acc.exp_rate or 0) / 1e12:6.3f} T/s  {exp_flops(g):6.1f}")
    gamma = fit_gamma()
    print(f"2. GB200 / GB300 time, {SOURCE}; gamma fitted on {FIT_ON} BF16: {gamma:.3f} "
          f"(GAMMA {GAMMA})")
    print("   model     dtype pass  n  published  max    serial exposed")
    for model in CUDNN:
        for (dt, pss), rs in sorted(groups(model).items()):
            held = "" if (model == FIT_ON and dt == "bf16") else " (held out)"
            print(f"   {model:<9} {dt:<5} {pss:<4} {len(rs):2d}  {median(rs):6.3f}    "
                  + "  ".join(f"{kernel_ratio(f, model, dt, pss):5.3f}" for f in ("max", "serial", "exposed")) + held)
    print("3. absolute forward TFLOP/s at 32k tokens, causal, BF16: published cuDNN vs MMA + gamma exp at the full "
          "peak (the backward is bound by shared memory, FlashAttention-4, which this form does not cover)")
    for model in CUDNN:
        for gpu, i in (("gb200", 0), ("gb300", 1)):
            print(f"   {model:<9} {gpu}: published {published_tflops(model, ('bf16', 'top_left', 32768, 'fwd'), i):5.0f}"
                  f", model {absolute_tflops(model, 'bf16', 'fwd', gpu):5.0f}")


if __name__ == "__main__":
    main()
