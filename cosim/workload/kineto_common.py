"""Names shared by the Kineto importer's modules: event categories, the runtime
calls that launch, block or wait, and small helpers."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from cosim.errors import CosimInputError
from cosim.workload.graph import GpuKind, HostKind

__all__ = [
    "EVENT_RECORD_APIS",
    "FLOW_CATS",
    "GPU_CATS",
    "HOST_CATS",
    "LAUNCH_SYNC_APIS",
    "STREAM_WAIT_APIS",
    "SYNC_APIS",
    "as_int",
    "col",
    "col3",
    "detect_scale",
    "int_list",
    "nearest_ancestor",
]


#: Chrome-trace categories of host ops and the kind each starts as (runtime calls are refined later).
HOST_CATS = {
    "cpu_op": HostKind.OP,
    "operator": HostKind.OP,
    "user_annotation": HostKind.ANNOTATION,
    "cuda_runtime": HostKind.RUNTIME,
    "cuda_driver": HostKind.RUNTIME,
    "runtime": HostKind.RUNTIME,
    "driver": HostKind.RUNTIME,
}
#: Categories of GPU ops.
GPU_CATS = {
    "kernel": GpuKind.KERNEL,
    "gpu_memcpy": GpuKind.MEMCPY,
    "gpu_memset": GpuKind.MEMSET,
    "memcpy": GpuKind.MEMCPY,
    "memset": GpuKind.MEMSET,
}
#: Flow-event categories that link a runtime call to the GPU op it enqueued.
FLOW_CATS = {"ac2g", "async_cpu_to_gpu"}

#: Blocking host calls that wait for GPU work.
SYNC_APIS = frozenset(
    {
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaEventSynchronize",
        "cudaThreadSynchronize",
        "cuCtxSynchronize",
        "cuStreamSynchronize",
        "cuEventSynchronize",
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "hipCtxSynchronize",
    }
)
#: Calls that enqueue a copy and block until it is done.
LAUNCH_SYNC_APIS = frozenset(
    {
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cudaMemcpyToSymbol",
        "cudaMemcpyFromSymbol",
        "cuMemcpy",
        "cuMemcpyDtoH",
        "cuMemcpyHtoD",
        "cuMemcpyDtoH_v2",
        "cuMemcpyHtoD_v2",
        "hipMemcpy",
        "hipMemcpyWithStream",
        "hipMemcpyDtoH",
        "hipMemcpyHtoD",
        "hipMemcpy2D",
    }
)
EVENT_RECORD_APIS = frozenset(
    {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord", "hipEventRecord", "hipEventRecordWithFlags"}
)
STREAM_WAIT_APIS = frozenset({"cudaStreamWaitEvent", "cuStreamWaitEvent", "hipStreamWaitEvent"})


def _int(x: Any, default: int = -1) -> int:
    try:
        return int(x)
    except (TypeError, ValueError):
        return default


def _dim3(x: Any) -> tuple[int, int, int]:
    if isinstance(x, list) and len(x) == 3:
        return (_int(x[0]), _int(x[1]), _int(x[2]))
    return (-1, -1, -1)


def as_int(x: Any, default: int = -1, bits: int = 64) -> int:
    """``int(x)``, or ``default`` when ``x`` is not a number (None, a string, a list...) or does not fit
    a signed integer of ``bits`` bits (the column it goes to)."""
    try:
        v = int(x)
    except (TypeError, ValueError, OverflowError):
        return default
    lim = 1 << (bits - 1)
    return v if -lim <= v < lim else default


def int_list(x: Any, drop: bool = False) -> list[int]:
    """The integers of ``x``: a list, or a list in JSON text (how Kineto's and Chakra ET's records hold rank lists and
    split sizes); [] for anything else. An item that is no integer becomes -1 (:func:`as_int`), or, with ``drop``,
    is left out."""
    if isinstance(x, str):
        try:
            x = json.loads(x) if x.strip() else None
        except ValueError:
            return []
    if not isinstance(x, list):
        return []
    if drop:
        return [as_int(v) for v in x if isinstance(v, (int, float)) and math.isfinite(v)]
    return [as_int(v) for v in x]


def col(values: Sequence[Any], dtype: Any) -> np.ndarray:
    """A column of the importer's rows as an array (``numpy.fromiter``: one pass, no type discovery;
    None becomes NaN in a float column, as with ``numpy.array``)."""
    return np.fromiter(values, dtype, len(values))


def col3(values: Sequence[Any]) -> np.ndarray:
    """A column of int triples (grid, block) as an (n, 3) int32 array."""
    return np.fromiter(itertools.chain.from_iterable(values), np.int32, 3 * len(values)).reshape(len(values), 3)


def nearest_ancestor(parent: np.ndarray, is_target: np.ndarray) -> np.ndarray:
    """For each host op, the nearest ancestor-or-self with ``is_target``, else -1.

    Pointer jumping (Wyllie): every op points at its parent until it reaches a target or a root, then
    pointers are doubled until they stop moving, O(n log depth) vectorized.
    """
    n = len(parent)
    idx = np.arange(n, dtype=np.int64)
    tgt = np.asarray(is_target, bool)
    par = np.asarray(parent, np.int64)
    # terminal ops point at themselves: targets (answer: themselves) and roots that are not targets (-1)
    terminal = tgt | (par < 0)
    nxt = np.where(terminal, idx, par)
    while True:
        nn = nxt[nxt]
        if np.array_equal(nn, nxt):
            break
        nxt = nn
    return np.where(tgt[nxt], nxt, -1).astype(np.int32)


def detect_scale(ts_max: float, time_unit: str | None) -> float:
    """Seconds per trace time unit: ``time_unit`` ("us" or "ns") when given, else microseconds,
    except that timestamps of 1e17 and more can only be nanoseconds since the epoch."""
    if time_unit is not None:
        if time_unit not in ("us", "ns"):
            raise CosimInputError(f"time_unit must be 'us' or 'ns', not {time_unit!r}")
        return 1e-6 if time_unit == "us" else 1e-9
    return 1e-9 if ts_max >= 1e17 else 1e-6
