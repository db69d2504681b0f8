"""cosim's attention model form against published cuDNN attention on H100 (validation/kernels/attention_cudnn.py).

The flash-attention model fitted on cuDNN's causal forward curve at head dim 128 (FlashAttention-3 paper,
Figure 5) predicts the Megatron-Core report's held-out Table 9 (DeepSeek-V3 MLA, 128 heads, d 192 / 128, forward
and backward) within 15 %: the model's form carries cuDNN's efficiency to other shapes; the bundled profile's
constants (PyTorch's FlashAttention-2 at seq <= 559) are what is 1.9-2.3x slow there."""

from __future__ import annotations

from types import ModuleType

import numpy as np

from cosim.catalog import load_catalog
from cosim.models.calibrated import HardwareFigures
from tests._scripts import load_script


def _script() -> ModuleType:
    return load_script("validation/kernels/attention_cudnn.py", "attention_cudnn_validation")


def test_cudnn_fit_predicts_table9_held_out() -> None:
    mod = _script()
    hw = HardwareFigures.of(load_catalog().accelerator("h100-sxm5"))
    p = mod.fit_cudnn(hw)
    fitted = [mod.model_tflops(p, hw, *mod.fa3_shape(s, 128), s, 128) / tf - 1
              for s, tf in zip(mod.SEQS, mod.FA3_CAUSAL["cuDNN"][128])]
    assert float(np.mean(np.abs(fitted))) < 0.05
    for s, (ef, eb) in mod.table9_errors(p, hw).items():
        assert abs(ef) < 0.15 and abs(eb) < 0.15, (s, ef, eb)


def test_causal_flops_by_hand() -> None:
    """One sequence of 4096 tokens, one head of dim 128: two 4096 x 4096 x 128 GEMMs of 2 FLOPs a term, halved."""
    mod = _script()
    assert mod.causal_flops(1, 1, 4096, 128) == 2 * 2 * 4096 * 4096 * 128 / 2
    assert mod.causal_flops(1, 1, 4096, 128, bwd=True) == 2.5 * mod.causal_flops(1, 1, 4096, 128)
