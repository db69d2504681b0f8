"""Which catalog accelerator a trace ran on, and first-order scaling of kernel times between two parts.

* :func:`guess_accelerator`: the catalog id of the part a trace's device properties name
  (``"NVIDIA H100 80GB HBM3"`` -> ``h100-sxm5``).
* :func:`time_ratios`: how much longer a kernel takes on ``target`` than on ``traced``, by bound:
  compute-bound classes (:data:`COMPUTE_CLASSES`) by the ratio of dense bf16 peaks, memory-bound
  classes (:data:`MEMORY_CLASSES`, and device-to-device copies) by the ratio of HBM bandwidths.
  Host copies and communication are left to the topology. This is Habitat's "wave scaling" reduced
  to its roofline limits; it ignores cache-size and occupancy effects, and is what replay uses when
  ``accelerator`` names another part than the traced one, until calibrated kernel models replace it.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from cosim.catalog.models import Accelerator

__all__ = ["COMPUTE_CLASSES", "MEMORY_CLASSES", "TimeRatios", "guess_accelerator", "time_ratios"]

COMPUTE_CLASSES = ("gemm", "grouped_gemm", "attention")
"""Op classes (``OpClass`` names, lower case) whose time scales with the dense bf16 peak."""
MEMORY_CLASSES = ("elementwise", "reduction", "norm", "memset", "other")
"""Op classes whose time scales with HBM bandwidth (device-to-device copies too)."""

_PATTERNS: tuple[tuple[str, str], ...] = (
    (r"H100.*PCIe", "h100-pcie"),
    (r"H100", "h100-sxm5"),
    (r"H800", "h800-sxm5"),
    (r"H200", "h200-sxm"),
    (r"GB200", "gb200"),
    (r"B300", "b300"),
    (r"B200", "b200"),
    (r"A100", "a100-sxm-80gb"),
    (r"V100", "v100-sxm2-32gb"),
    (r"MI300", "mi300x"),
    (r"L40S", "l40s"),
)


def guess_accelerator(device_name: str) -> str | None:
    """Catalog id of the accelerator named in a trace's device properties (None when none matches)."""
    for pat, acc in _PATTERNS:
        if re.search(pat, device_name or "", re.I):
            return acc
    return None


class TimeRatios(NamedTuple):
    """Factors on a kernel's time when it moves from one part to another (dimensionless)."""

    compute: float
    """For compute-bound classes: traced bf16 dense peak / target bf16 dense peak."""
    memory: float
    """For memory-bound classes and device copies: traced HBM bandwidth / target HBM bandwidth."""


def time_ratios(traced: Accelerator, target: Accelerator) -> TimeRatios:
    """The factors on kernel times measured on ``traced`` to estimate them on ``target``."""
    return TimeRatios(compute=float(traced.peak("bf16")) / float(target.peak("bf16")),
                      memory=float(traced.hbm_bandwidth) / float(target.hbm_bandwidth))
