"""The hardware catalog: accelerators, host CPUs, NICs and link types.

Every number comes from a cited datasheet or public measurement and is an SI
float once loaded (bytes, bytes/s per direction, seconds, FLOP/s, hertz,
watts). See docs/CATALOG.md.

>>> from cosim.catalog import load_catalog
>>> cat = load_catalog()
>>> cat.accelerator("h100-sxm5").peak_flops["bf16"]
989400000000000.0
>>> cat.accelerator("h100-sxm5").scale_up.total_bandwidth  # 18 x 25 GB/s, per direction
450000000000.0
"""

from __future__ import annotations

from cosim.catalog.loader import DATA_DIR, SECTIONS, Catalog, load_catalog
from cosim.catalog.models import CPU, DTYPES, NIC, Accelerator, LinkType, PCIe, ScaleUp

__all__ = [
    "CPU",
    "DATA_DIR",
    "DTYPES",
    "NIC",
    "SECTIONS",
    "Accelerator",
    "Catalog",
    "LinkType",
    "PCIe",
    "ScaleUp",
    "load_catalog",
]
