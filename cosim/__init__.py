"""cosim: a hardware/software co-design simulator for AI systems.

The public Python API; the ``cosim`` command line is a thin layer over it. The
names below are imported on first use, so ``import cosim`` stays cheap::

    import cosim
    topo = cosim.load_topology("dgx-h100")
    result = cosim.run_scenario(cosim.load_scenario())   # the bundled default
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

from cosim.errors import CosimError, CosimInputError

_API: dict[str, str] = {
    "load_topology": "cosim.topology",
    "check_topology": "cosim.topology",
    "list_presets": "cosim.topology",
    "Topology": "cosim.topology",
    "load_catalog": "cosim.catalog",
    "load_trace": "cosim.workload",
    "ExecutionGraph": "cosim.workload",
    "replay": "cosim.replay",
    "ReplayConfig": "cosim.replay",
    "ReplayResult": "cosim.replay",
    "load_scenario": "cosim.scenario",
    "run_scenario": "cosim.scenario",
    "Simulator": "cosim.engine",
    "SimConfig": "cosim.engine",
    "load_profile": "cosim.models",
    "predict_durations": "cosim.models",
}

__all__ = ["CosimError", "CosimInputError", "__version__", *_API]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'cosim' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
