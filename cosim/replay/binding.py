"""Binding a trace to hardware: which accelerator it was captured on, which
topology replays it by default, and first-order cross-accelerator scaling of
measured kernel times.

Cross-accelerator scaling (used when ``accelerator`` names another part than the
traced one, until calibrated kernel models replace it): compute-bound classes
(gemm, grouped_gemm, attention) scale by the ratio of dense bf16 peaks;
memory-bound classes (elementwise, reduction, norm, memset, device copies,
other) by the ratio of HBM bandwidths; host copies and communication are left
to the topology. This is Habitat's "wave scaling" reduced to its roofline
limits; it ignores cache-size and occupancy effects.
"""

from __future__ import annotations

import re

import numpy as np

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.workload.graph import CopyKind, OpClass, RankGraph

__all__ = ["DEFAULT_TOPOLOGY", "cross_accelerator_factor", "default_topology", "guess_accelerator"]

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

DEFAULT_TOPOLOGY = {
    "h100-sxm5": "dgx-h100",
    "h100-pcie": "dgx-h100",
    "h800-sxm5": "h800-8node",
    "h200-sxm": "hgx-h200",
    "b200": "hgx-b200",
    "b300": "hgx-b200",
    "gb200": "gb200-nvl72",
    "a100-sxm-80gb": "dgx-a100",
    "v100-sxm2-32gb": "dgx1-v100",
    "l40s": "pcie-8x-l40s",
}
"""Topology preset used when none is given, by traced accelerator."""


def guess_accelerator(device_name: str) -> str | None:
    """Catalog id of the accelerator named in a trace's device properties."""
    for pat, acc in _PATTERNS:
        if re.search(pat, device_name or "", re.I):
            return acc
    return None


def default_topology(accelerator: str | None) -> str:
    """Preset that replays a trace of ``accelerator`` (dgx-h100 when unknown)."""
    return DEFAULT_TOPOLOGY.get(accelerator or "", "dgx-h100")


_COMPUTE = (OpClass.GEMM, OpClass.GROUPED_GEMM, OpClass.ATTENTION)
_MEMORY = (OpClass.ELEMENTWISE, OpClass.REDUCTION, OpClass.NORM, OpClass.MEMSET, OpClass.OTHER)


def cross_accelerator_factor(rg: RankGraph, traced: str, target: str) -> np.ndarray:
    """Per-GPU-op factor on measured durations to move from ``traced`` to ``target``."""
    cat = load_catalog()
    try:
        a, b = cat.accelerator(traced), cat.accelerator(target)
    except CosimInputError:
        raise
    G = rg.gpu_ops
    f = np.ones(len(G))
    flop_ratio = a.peak("bf16") / b.peak("bf16")
    bw_ratio = a.hbm_bandwidth / b.hbm_bandwidth
    cls = G.cls
    f[np.isin(cls, _COMPUTE)] = flop_ratio
    f[np.isin(cls, _MEMORY)] = bw_ratio
    f[(cls == OpClass.MEMCPY) & (G.copy_kind == CopyKind.DTOD)] = bw_ratio
    return f
