"""Roofline kernel-time model from the accelerator catalog.

``time = floor + max(flops / (peak(dtype) * compute_efficiency),
                     bytes / (hbm_bandwidth * memory_efficiency))``

It is the fallback of cosim's kernel models, and what projects a CPU capture
onto a GPU until calibrated models (fitted on measured kernels) replace it. The
efficiencies and the floor are the documented defaults below, not fits to any
trace: dense GEMMs on H100-class parts reach roughly 60-75% of peak, streaming
kernels 75-90% of HBM bandwidth, and no kernel takes less than about 2 us
(launch-to-completion of an empty kernel).
"""

from __future__ import annotations

from dataclasses import dataclass

from cosim.catalog.models import Accelerator

__all__ = ["RooflineModel"]

COMPUTE_CLASSES = ("gemm", "grouped_gemm", "attention")


@dataclass(frozen=True)
class RooflineModel:
    """Roofline time of a GPU op on ``accelerator``; SI units."""

    accelerator: Accelerator
    compute_efficiency: float = 0.7
    """Fraction of the dense peak that GEMM-like kernels reach."""
    other_compute_efficiency: float = 0.3
    """Fraction of the peak that non-GEMM kernels reach on their arithmetic (vector units)."""
    memory_efficiency: float = 0.8
    """Fraction of HBM bandwidth that memory-bound kernels reach."""
    floor: float = 2e-6
    """Minimum kernel duration (s)."""

    def __post_init__(self) -> None:
        for n in ("compute_efficiency", "other_compute_efficiency", "memory_efficiency"):
            v = getattr(self, n)
            if not 0 < v <= 1:
                raise ValueError(f"{n} must be in (0, 1], got {v}")
        if self.floor < 0:
            raise ValueError("floor must be >= 0")

    def time(self, cls: str, flops: float, nbytes: float, dtype: str = "bf16") -> float:
        """Seconds for an op of class ``cls`` doing ``flops`` FLOPs and moving ``nbytes`` bytes."""
        acc = self.accelerator
        eff = self.compute_efficiency if cls in COMPUTE_CLASSES else self.other_compute_efficiency
        peak = acc.peak(dtype) if cls in COMPUTE_CLASSES else acc.peak("fp32")
        t_c = flops / (peak * eff) if flops > 0 else 0.0
        t_m = nbytes / (acc.hbm_bandwidth * self.memory_efficiency) if nbytes > 0 else 0.0
        return self.floor + max(t_c, t_m)
