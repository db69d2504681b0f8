"""Binding a trace to hardware: which accelerator it was captured on
(:func:`cosim.catalog.scaling.guess_accelerator`), which topology replays it by default, and the
per-op factors of cross-accelerator scaling of measured kernel times (the ratios and their law:
:mod:`cosim.catalog.scaling`).
"""

from __future__ import annotations

import numpy as np

from cosim.catalog import load_catalog
from cosim.catalog.scaling import COMPUTE_CLASSES, MEMORY_CLASSES, guess_accelerator, time_ratios
from cosim.workload.graph import CopyKind, OpClass, RankGraph

__all__ = ["DEFAULT_TOPOLOGY", "cross_accelerator_factor", "default_topology", "guess_accelerator"]

DEFAULT_TOPOLOGY = {
    "h100-sxm5": "dgx-h100",
    "h100-pcie": "dgx-h100",
    "h800-sxm5": "h800-8node",
    "h200-sxm": "hgx-h200",
    "b200": "hgx-b200",
    "b300": "hgx-b300",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
    "a100-sxm-80gb": "dgx-a100",
    "v100-sxm2-32gb": "dgx1-v100",
    "l40s": "pcie-8x-l40s",
}
"""Topology preset used when none is given, by traced accelerator."""


def default_topology(accelerator: str | None) -> str:
    """Preset that replays a trace of ``accelerator`` (dgx-h100 when unknown)."""
    return DEFAULT_TOPOLOGY.get(accelerator or "", "dgx-h100")


_COMPUTE = tuple(OpClass[c.upper()] for c in COMPUTE_CLASSES)
_MEMORY = tuple(OpClass[c.upper()] for c in MEMORY_CLASSES)


def cross_accelerator_factor(rg: RankGraph, traced: str, target: str) -> np.ndarray:
    """Per-GPU-op factor on measured durations to move from ``traced`` to ``target``."""
    cat = load_catalog()
    flop_ratio, bw_ratio = time_ratios(cat.accelerator(traced), cat.accelerator(target))
    G = rg.gpu_ops
    f = np.ones(len(G))
    cls = G.cls
    f[np.isin(cls, _COMPUTE)] = flop_ratio
    f[np.isin(cls, _MEMORY)] = bw_ratio
    f[(cls == OpClass.MEMCPY) & (G.copy_kind == CopyKind.DTOD)] = bw_ratio
    return f
