"""Capture MoE workloads from real PyTorch runs: a reference MoE model, run
over torch.distributed (expert and data parallelism) and profiled.

Importing this package does not import torch; :func:`run_capture` (that is,
:func:`cosim.capture.capture.capture`) does.
See docs/CAPTURE.md.
"""

from __future__ import annotations

from cosim.capture.capture import CaptureFailed
from cosim.capture.capture import capture as run_capture
from cosim.capture.config import (
    CaptureOptions,
    MoEModelConfig,
    Skew,
    list_presets,
    load_model_config,
    parse_skew,
)

__all__ = [
    "CaptureFailed",
    "CaptureOptions",
    "MoEModelConfig",
    "Skew",
    "list_presets",
    "load_model_config",
    "parse_skew",
    "run_capture",
]

