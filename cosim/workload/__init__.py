"""Workloads as execution graphs: import PyTorch traces (Kineto / torch.profiler
chrome traces and Execution Traces) into cosim's versioned, struct-of-arrays
execution graph, the input of the replay engine.

>>> from cosim.workload import load_trace
>>> g = load_trace("trace.json.gz")              # doctest: +SKIP
>>> g.ranks[0].measured_step_times()["gpu"]      # doctest: +SKIP
"""

from __future__ import annotations

from cosim.workload.graph import (
    SCHEMA_VERSION,
    TABLE_SCHEMAS,
    CollType,
    CopyKind,
    EdgeKind,
    ExecutionGraph,
    GpuKind,
    HostKind,
    OpClass,
    RankGraph,
    SeqSource,
    Table,
)
from cosim.workload.load import detect_format, load_trace

__all__ = [
    "SCHEMA_VERSION",
    "TABLE_SCHEMAS",
    "CollType",
    "CopyKind",
    "EdgeKind",
    "ExecutionGraph",
    "GpuKind",
    "HostKind",
    "OpClass",
    "RankGraph",
    "SeqSource",
    "Table",
    "detect_format",
    "load_trace",
]
