"""Simulation core: flow-level fabric, NICs and collectives on one simpy environment;
replay (cosim.replay) runs host threads, kernels and copies on it. See docs/ENGINE.md for the models and their limits.

Public API::

    from cosim.engine import Simulator, SimConfig
    sim = Simulator(topology, SimConfig())
    ev = sim.collective("all_reduce", sim.topo.gpus, 64 * 2**20)
    sim.run(); res = ev.value   # CollectiveResult: time, algbw, busbw, algo, proto
"""

from __future__ import annotations

from cosim.engine.collectives import CollectiveCall, CollectiveResult
from cosim.engine.config import FabricConfig, GpuConfig, NcclConfig, NicConfig, SimConfig
from cosim.engine.flows import Fabric, LinkStats
from cosim.engine.nccl import BUSBW_FACTOR, NcclParams, load_params
from cosim.engine.simulator import Simulator, TraceEvent
from cosim.engine.topoview import GraphTopology

__all__ = [
    "BUSBW_FACTOR",
    "CollectiveCall",
    "CollectiveResult",
    "Fabric",
    "FabricConfig",
    "GpuConfig",
    "GraphTopology",
    "LinkStats",
    "NcclConfig",
    "NcclParams",
    "NicConfig",
    "SimConfig",
    "Simulator",
    "TraceEvent",
    "load_params",
]
