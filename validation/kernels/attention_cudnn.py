"""cosim's causal flash attention against FlashAttention-2, cuDNN and the Megatron-Core report (s13-attn, issue 15).

Run from the repository root:  python validation/kernels/attention_cudnn.py

All TFLOP/s are in one convention, the one of cosim (``costs._attention_ops``: ``2 sq sk (d_qk + d_v)`` per head and
sequence, halved when causal; backward 2.5x forward), of cuDNN frontend's ``benchmark/sdpa_benchmark`` (``flops()``:
``4 b s^2 h d``, ``// 2`` when causal, ``2.5 *`` for backward) and of flash-attention's benchmarks (causal halved).

Prints, on H100 SXM5 (BF16, forward unless said):

1. The bundled ``h100-sxm5`` attention model at FlashAttention-3's benchmark shapes (batch x seq = 16k, heads x
   head dim = 2048, causal) beside the published FlashAttention-2 / cuDNN / FlashAttention-3 figures of that paper.
2. The same model and a model fitted on the cuDNN curve (head dim 128, forward only; backward tied at 0.8 as in
   :func:`cosim.models.calibrated.fit_attention`) at the held-out Table 9 shapes of the Megatron-Core MoE report
   (DeepSeek-V3 MLA: 128 heads, d_qk 192 / d_v 128, one sequence), forward and backward.
3. With ``../shared`` present: the profile's own source kernels (tracelens-h100 Qwen1.5-0.5B, PyTorch's bundled
   FlashAttention-2, ``is_causal=True``) timed as a synthesized causal op (key length halved) against their
   measured durations.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's cosim, not an installed copy

from cosim.catalog import load_catalog
from cosim.models.calibrated import AttentionParams, HardwareFigures, attention_time, fit_attention
from cosim.models.profile import load_profile

FA3_SOURCE = ("Shah et al., FlashAttention-3 (arXiv:2407.08608) Figure 5, H100 80GB SXM5 BF16 forward with causal "
              "mask, batch x seq = 16k, heads x head dim = 2048 (bar labels as transcribed)")
SEQS = (512, 1024, 2048, 4096, 8192, 16384)
FA3_CAUSAL: dict[str, dict[int, tuple[float, ...]]] = {
    "FlashAttention-2": {64: (180, 229, 262, 284, 295, 299), 128: (191, 260, 298, 319, 333, 335)},
    "cuDNN": {64: (225, 288, 334, 363, 379, 388), 128: (315, 410, 484, 518, 529, 539)},
    "FlashAttention-3": {64: (197, 265, 371, 420, 460, 473), 128: (292, 423, 521, 579, 602, 616)},
}
"""Published causal forward TFLOP/s by library, head dim and :data:`SEQS` (:data:`FA3_SOURCE`)."""

TABLE9_SOURCE = ("NVIDIA, Scalable Training of Mixture-of-Experts Models with Megatron Core (arXiv:2603.07685) "
                 "Table 9, 'SDPA performance in cuDNN for DeepSeek-V3', Hopper")
TABLE9_H100: dict[int, tuple[float, float]] = {4096: (553.0, 422.0), 16384: (638.0, 523.0)}
"""Published cuDNN forward / backward TFLOP/s at 128 heads, d_qk 192, d_v 128, causal, by sequence length."""

MLA_HEADS, MLA_D = 128, (192 + 128) / 2.0  # cosim's d_core for MLA (costs._attention_ops)


def causal_flops(b: float, h: float, s: float, d: float, bwd: bool = False) -> float:
    """FLOPs of causal attention, ``4 b h s^2 d / 2`` (x2.5 backward)."""
    return 4.0 * b * h * s * s * d * 0.5 * (2.5 if bwd else 1.0)


def model_tflops(p: AttentionParams, hw: HardwareFigures, b: float, h: float, s: float, d: float,
                 bwd: bool = False) -> float:
    """TFLOP/s of :func:`attention_time` for a causal op as synthesis times it (key length halved)."""
    t = attention_time(np.array([b]), np.array([h]), np.array([s]), np.array([s / 2]), np.array([d]),
                       np.array([bwd]), hw.peak("bf16"), hw, p)[0]
    return causal_flops(b, h, s, d, bwd) / float(t) / 1e12


def fa3_shape(s: int, d: int) -> tuple[float, float]:
    """(batch, heads) of FlashAttention-3's benchmark at sequence ``s``, head dim ``d``."""
    return 16384.0 / s, 2048.0 / d


def fit_cudnn(hw: HardwareFigures, dims: tuple[int, ...] = (128,)) -> AttentionParams:
    """:class:`AttentionParams` fitted on the published cuDNN causal forward curve at head dims ``dims``."""
    rows = [(*fa3_shape(s, d), s, d, causal_flops(*fa3_shape(s, d), s, d) / (tf * 1e12))
            for d in dims for s, tf in zip(SEQS, FA3_CAUSAL["cuDNN"][d])]
    b, h, s, d, dur = (np.array(c, dtype=float) for c in zip(*rows))
    return fit_attention(b, h, s, s / 2, d, np.zeros(len(b), bool), np.full(len(b), hw.peak("bf16")), dur, hw)


def table9_errors(p: AttentionParams, hw: HardwareFigures) -> dict[int, tuple[float, float]]:
    """Model / Table 9 TFLOP/s - 1 (negative: the model slower), forward and backward, by sequence length."""
    return {s: (model_tflops(p, hw, 1, MLA_HEADS, s, MLA_D) / f - 1,
                model_tflops(p, hw, 1, MLA_HEADS, s, MLA_D, bwd=True) / bw - 1)
            for s, (f, bw) in TABLE9_H100.items()}


def trace_check(hw: HardwareFigures, p: AttentionParams, trace: Path) -> tuple[int, float] | None:
    """(kernels, modeled / measured total - 1) of the causal FlashAttention-2 forward kernels of ``trace``."""
    if not trace.exists():
        return None
    ev = json.load(gzip.open(trace))["traceEvents"]
    ops = [e for e in ev if e.get("ph") == "X" and e.get("name") == "aten::_flash_attention_forward"]
    launch = {e["args"].get("correlation"): e for e in ev if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"}
    shapes, durs = [], []
    for k in ev:
        if k.get("ph") != "X" or k.get("cat") != "kernel" or "flash_fwd" not in k["name"]:
            continue
        r = launch.get(k["args"].get("correlation"))
        par = [o for o in ops if r and o["tid"] == r["tid"] and o["ts"] <= r["ts"] <= o["ts"] + o["dur"]]
        if par and par[0]["args"]["Concrete Inputs"][8] == "True":  # is_causal of _flash_attention_forward
            q = par[0]["args"]["Input Dims"][0]  # [batch, seq, heads, head dim]
            shapes.append((q[0], q[2], q[1], q[3]))
            durs.append(k["dur"] * 1e-6)
    if not durs:
        return None
    b, h, s, d = (np.array(c, dtype=float) for c in zip(*shapes))
    t = attention_time(b, h, s, s / 2, d, np.zeros(len(b), bool), hw.peak("bf16"), hw, p)
    return len(durs), float(t.sum() / sum(durs) - 1)


def main() -> None:
    """Print the three comparisons (module docstring)."""
    hw = HardwareFigures.of(load_catalog().accelerator("h100-sxm5"))
    prof = load_profile("h100-sxm5").params("attention")
    assert isinstance(prof, AttentionParams)
    cud = fit_cudnn(hw)
    print(f"1. causal forward TFLOP/s, {FA3_SOURCE}")
    for d in (64, 128):
        print(f"   head dim {d}: seq " + " ".join(f"{s:>6}" for s in SEQS))
        print("   cosim (h100-sxm5) " + " ".join(f"{model_tflops(prof, hw, *fa3_shape(s, d), s, d):6.0f}" for s in SEQS))
        for lib, tab in FA3_CAUSAL.items():
            print(f"   {lib:<18} " + " ".join(f"{v:6.0f}" for v in tab[d]))
    print(f"2. held out: {TABLE9_SOURCE}; TFLOP/s fwd / bwd (error vs published)")
    print(f"   cuDNN fit (head dim 128 curve): {cud}")
    for name, p in (("cosim h100-sxm5", prof), ("cuDNN fit", cud)):
        for s, (ef, eb) in table9_errors(p, hw).items():
            print(f"   {name:<16} seq {s:>5}: {model_tflops(p, hw, 1, MLA_HEADS, s, MLA_D):4.0f} ({ef:+.1%}) / "
                  f"{model_tflops(p, hw, 1, MLA_HEADS, s, MLA_D, bwd=True):4.0f} ({eb:+.1%})")
    trace = Path(__file__).resolve().parents[3] / "shared/traces/tracelens-h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    got = trace_check(hw, prof, trace)
    if got is not None:
        print(f"3. {trace.name}: {got[0]} causal FlashAttention-2 kernels as synthesized causal ops: "
              f"{got[1]:+.1%} (fitted with the full key length: the fit ignores is_causal)")


if __name__ == "__main__":
    main()
