"""gpt-oss's attention on Hopper against cuDNN's published SDPA benchmark, held out (issue 15 point 7, round 9).

Source: NVIDIA/cudnn-frontend @df73764 (v1.19.0) benchmark/sdpa_benchmark_training/results/h200_919_only_cudnn/
gpt_oss_20260227_034819.csv: cuDNN 9.19.1 on an NVIDIA H200, BF16, gpt-oss's own heads (64 query / 8 KV, head dim
64), top-left causal with a 1024-token sliding window, batch 2, non-deterministic backward. Nothing is fitted.

What it shows (validation/e2e/RESULTS.md, "Round 9: gpt-oss"): cosim's Hopper attention, fitted to PyTorch's
FlashAttention-2 kernels (cosim/models/data/h100-sxm5.yaml), is 1.6-1.9x slower than cuDNN's fused attention,
which Transformer Engine runs for Megatron-Core (and for gpt-oss's sinks, the only backend it keeps). The backward
to forward ratio (2.5x the FLOPs at its own efficiency) agrees within 6 %. A known miss, kept: making attention
faster moves every Hopper Megatron row further above its published figure (gpt-oss-120b H100: +22.0% -> +26.4%)."""

from __future__ import annotations

import pytest

from cosim.capture.config import load_model_config
from cosim.catalog import load_catalog
from cosim.models.synth_timing import KernelTimer
from cosim.workload.synth.costs import Shard, backward_ops, layer_ops, window_pairs

# seq -> (fwd ms, bwd ms), the csv's fwd_time_ms / bwd_time_ms
CUDNN_919_H200_GPT_OSS = {2048: (0.166, 0.488), 4096: (0.358, 1.042), 8192: (0.738, 2.149),
                          16384: (1.499, 4.392), 32768: (3.021, 9.045)}


@pytest.fixture(scope="module")
def timer() -> KernelTimer:
    return KernelTimer(load_catalog().accelerator("h200-sxm"))


@pytest.mark.parametrize("seq", sorted(CUDNN_919_H200_GPT_OSS))
def test_h200_gpt_oss_attention_against_cudnn_919(timer: KernelTimer, seq: int) -> None:
    """The card's attention with the benchmark's window (1024) on a 2-sequence micro-batch: the op has the
    benchmark's FLOPs exactly (its csv's TFLOP/s x time), cosim is 1.5-2.0x slower forward and backward (the
    known miss above), and its backward / forward ratio is within 6 % of cuDNN's."""
    card = load_model_config("gpt-oss-120b").model_copy(update={"sliding_window": 1024})
    fwd = [o for o in layer_ops(card, 0, 2 * seq, seq, Shard(), "bf16") if o.cls == "attention"]
    assert len(fwd) == 1 and (fwd[0].batch, fwd[0].heads, fwd[0].k) == (2, 64, 64)
    assert fwd[0].flops == 4 * 2 * 64 * 64 * window_pairs(seq, seq, 1024)
    bwd = [o for o in backward_ops(fwd) if o.cls == "attention"]
    tf, tb = timer(fwd)[0], timer(bwd)[0]
    pub_f, pub_b = (t * 1e-3 for t in CUDNN_919_H200_GPT_OSS[seq])
    assert 1.5 <= tf / pub_f <= 2.0 and 1.5 <= tb / pub_b <= 2.0
    assert abs((tb / tf) / (pub_b / pub_f) - 1.0) <= 0.06
