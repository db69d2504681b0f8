"""Hardware topologies: host nodes, racks and clusters as a networkx graph.

>>> from cosim.topology import load_topology
>>> topo = load_topology("dgx-h100")
>>> topo.route("gpu0", "gpu5")
['gpu0', 'nvswitch0', 'gpu5']

A topology file lists devices (catalog ids) and links (catalog link types with
a multiplicity); clusters replicate a host node and add a generated scale-out
fabric. All bandwidths are raw bytes/s per direction, latencies seconds. The
schema, routing rules and figure definitions are in docs/TOPOLOGY.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError

from .build import build_from_path
from .loader import list_presets, preset_path, resolve_ref
from .model import NoRouteError, Topology, natural_key

__all__ = [
    "NoRouteError",
    "Topology",
    "check_topology",
    "find_topology",
    "list_presets",
    "load_topology",
    "natural_key",
]


def find_topology(name_or_path: str | Path) -> Path:
    """The file for a preset name or a path.

    Raises:
        CosimInputError: neither an existing file nor a preset.
    """
    p = Path(name_or_path).expanduser()
    if p.is_file():
        return p
    s = str(name_or_path)
    found = resolve_ref(s, None)
    if found is not None:
        return found
    if s.endswith((".yaml", ".yml")) or "/" in s:
        raise CosimInputError("file not found", file=s)
    presets = ", ".join(list_presets()) or "none"
    raise CosimInputError(f"unknown topology {s!r}: not a file and not a preset (presets: {presets})")


def load_topology(name_or_path: str | Path, overrides: dict[str, Any] | None = None) -> Topology:
    """Load a preset (``"dgx-h100"``) or a topology YAML file and build its graph.

    Args:
        name_or_path: preset name (see :func:`list_presets`) or path to a YAML file.
        overrides: extra catalog overrides, e.g. ``{"links.nvlink4.bandwidth": "900 GB/s"}``,
            applied after the file's own ``set``.

    Raises:
        CosimInputError: any problem with the file, located as ``file:line:col: field: problem``.
    """
    path = find_topology(name_or_path)
    return Topology(build_from_path(path, overrides), source_file=path)


def check_topology(name_or_path: str | Path) -> Topology:
    """Load and fully check a topology (graph, routes from every GPU, figures); return it.

    Raises:
        CosimInputError: the first problem found.
    """
    topo = load_topology(name_or_path)
    for gpu in topo.gpus:
        topo.cpu_of(gpu)
    topo.figures()
    return topo


_ = preset_path  # re-exported helper for the CLI
