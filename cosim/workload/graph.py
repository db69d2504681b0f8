"""The execution graph: cosim's data contract between trace importers, workload
synthesis and the replay engine.

One :class:`ExecutionGraph` holds one :class:`RankGraph` per rank. A rank graph is
a handful of struct-of-arrays :class:`Table` objects (one numpy array per column,
one row per op) plus a string table; every name is an index into
``RankGraph.strings``. Units are SI: seconds (float64, relative to the rank's
``time_origin``), bytes, FLOPs. Unknown numbers are NaN, unknown indices -1.

Node ids for :attr:`RankGraph.edges`: host op ``i`` is node ``i``; GPU op ``j`` is
node ``len(host_ops) + j``.

The full contract (every column, edge kinds, step-time definitions, versioning)
is in docs/EXECUTION_GRAPH.md; :data:`TABLE_SCHEMAS` below is its source.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import operator
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from typing import Any

import numpy as np
from zlib_ng import zlib_ng

from cosim.errors import CosimInputError

__all__ = [
    "SCHEMA_VERSION",
    "TABLE_SCHEMAS",
    "CollType",
    "Column",
    "CopyKind",
    "EdgeKind",
    "ExecutionGraph",
    "GpuKind",
    "HostKind",
    "OpClass",
    "RankGraph",
    "SeqSource",
    "Table",
    "gc_paused",
]

SCHEMA_VERSION = "1.2"
"""Version of the execution-graph contract: ``MAJOR.MINOR``. Readers accept any
minor version of their own major version (new minor versions only add columns or
enum values, or fill values an older minor version left unknown); a different major
version is rejected. 1.1: ``gpu_ops.bytes`` / ``gpu_ops.flops`` of non-GEMM kernels
from their parent op's shapes (``cosim.workload.cost``); 1.0 graphs are filled on load."""


class HostKind(IntEnum):
    """What a host op is (``host_ops.kind``)."""

    OP = 0  #: an operator (cpu_op: aten::*, autograd nodes, record_param_comms, ...)
    ANNOTATION = 1  #: a user annotation (record_function, ProfilerStep#N, ## forward ##)
    RUNTIME = 2  #: a CUDA/HIP runtime or driver call that neither launches nor blocks
    LAUNCH = 3  #: a runtime call that enqueues GPU work (kernel, memcpy, memset, graph)
    SYNC = 4  #: a blocking runtime call that waits for GPU work (stream/device/event sync)
    LAUNCH_SYNC = 5  #: enqueues GPU work and waits for it (blocking cudaMemcpy, hipMemcpyWithStream)


class GpuKind(IntEnum):
    """``gpu_ops.kind``."""

    KERNEL = 0
    MEMCPY = 1
    MEMSET = 2


class OpClass(IntEnum):
    """Class of a GPU op (``gpu_ops.cls``); rules in :mod:`cosim.workload.classify`."""

    GEMM = 0
    GROUPED_GEMM = 1
    ATTENTION = 2
    ELEMENTWISE = 3
    REDUCTION = 4
    NORM = 5
    MEMCPY = 6
    MEMSET = 7
    COLLECTIVE = 8
    MOE_DISPATCH = 9
    MOE_COMBINE = 10
    OTHER = 11


class EdgeKind(IntEnum):
    """``edges.kind``: why ``dst`` cannot start (or, for SYNC, finish) before ``src`` ends."""

    LAUNCH = 0  #: host launch call -> the GPU op it enqueued (GPU op ready when the call ends)
    STREAM = 1  #: GPU op -> next GPU op on the same (device, stream)
    SYNC = 2  #: GPU op -> blocking host call that waits for it (the call ends after the GPU op)
    EVENT_WAIT = 3  #: GPU op -> GPU op on another stream (cudaEventRecord + cudaStreamWaitEvent)
    HOST = 4  #: host op -> next host op on the same thread, in pre-order (start order, parents first)


class CollType(IntEnum):
    """``collectives.type``."""

    ALL_REDUCE = 0
    ALL_GATHER = 1
    REDUCE_SCATTER = 2
    ALL_TO_ALL = 3
    BROADCAST = 4
    REDUCE = 5
    SEND = 6
    RECV = 7
    SEND_RECV = 8
    BARRIER = 9
    GATHER = 10
    SCATTER = 11
    OTHER = 12


class CopyKind(IntEnum):
    """``gpu_ops.copy_kind`` for memcpy ops (NONE for kernels and memsets)."""

    NONE = 0
    HTOD = 1
    DTOH = 2
    DTOD = 3
    HTOH = 4
    PTOP = 5
    OTHER = 6


class SeqSource(IntEnum):
    """Where ``collectives.seq`` came from."""

    TRACE = 0  #: the trace's own sequence number (Kineto "Seq"/"seq" arg)
    ET = 1  #: the Execution Trace's record_param_comms sequence argument
    COUNTER = 2  #: cosim's per-(process group, collective type) counter in issue order


@dataclass(frozen=True)
class Column:
    """One column of a table: name, numpy dtype, trailing shape, unit, meaning.

    ``ragged`` columns hold a variable-length int64 list per row, stored as
    ``<name>_offsets`` (length n+1) and ``<name>_values``.
    """

    name: str
    dtype: str
    unit: str
    doc: str
    width: int = 0  #: 0 for a scalar column, else a fixed trailing dimension
    ragged: bool = False

    @property
    def fill(self) -> Any:
        if self.dtype.startswith("float"):
            return np.nan
        return -1


S, B, F, ID, N = "s", "bytes", "FLOP", "index", "-"

TABLE_SCHEMAS: dict[str, tuple[Column, ...]] = {
    "threads": (
        Column("pid", "int64", N, "process id in the trace"),
        Column("tid", "int64", N, "thread id in the trace"),
        Column("name", "int32", ID, "thread name (strings), -1 if unknown"),
    ),
    "host_ops": (
        Column("thread", "int32", ID, "host thread (threads row)"),
        Column("start", "float64", S, "recorded start, relative to time_origin (reference only; replay uses pre_gap)"),
        Column("dur", "float64", S, "recorded duration (NaN when unknown, e.g. an ET without timings)"),
        Column("name", "int32", ID, "op name (strings)"),
        Column("kind", "int8", "HostKind", "what the op is"),
        Column("parent", "int32", ID, "enclosing host op on the same thread, -1 for top-level"),
        Column("depth", "int16", N, "nesting depth, 0 for top-level"),
        Column(
            "pre_gap",
            "float64",
            S,
            "unprofiled host time before this op: from the parent's start or the previous sibling's end (top-level: the previous top-level op's end) to this op's start",
        ),
        Column("tail", "float64", S, "time from the last child's end (or own start for a leaf) to this op's end"),
        Column("self_time", "float64", S, "exclusive time: dur minus the children's durations (>= 0)"),
        Column("step", "int32", ID, "steps row whose ProfilerStep contains this op's start, -1 if none"),
        Column(
            "input_shapes",
            "int32",
            ID,
            "JSON text of the input shapes (Kineto 'Input Dims' or ET input shapes), -1 if none",
        ),
        Column(
            "input_types",
            "int32",
            ID,
            "JSON text of the input dtypes ('Input type' / ET types with Tensor(...) removed), -1 if none",
        ),
        Column("output_shapes", "int32", ID, "JSON text of the output shapes (ET only), -1 if none"),
        Column(
            "concrete_inputs",
            "int32",
            ID,
            "JSON text of Kineto 'Concrete Inputs' (scalar arguments' values as strings, '' for tensors: "
            "a reduction's dim and keepdim, a softmax's dim), -1 if none",
        ),
        Column("rf_id", "int64", N, "record-function id ('Record function id' / ET rf_id), -1 if none"),
        Column("ext_id", "int64", N, "Kineto 'External id', -1 if none"),
        Column("correlation", "int64", N, "runtime correlation id (runtime calls), -1 otherwise"),
        Column("et_node", "int64", N, "id of the linked Execution Trace node, -1 if none"),
        Column("flops", "float64", F, "arithmetic work of the op from its shapes (GEMM-like ops), NaN if unknown"),
        Column(
            "bytes", "float64", B, "minimum memory traffic of the op from its shapes (inputs + output), NaN if unknown"
        ),
    ),
    "gpu_ops": (
        Column("device", "int16", N, "GPU index"),
        Column("stream", "int64", N, "stream id as recorded"),
        Column("start", "float64", S, "measured start, relative to time_origin"),
        Column("dur", "float64", S, "measured duration"),
        Column("name", "int32", ID, "kernel name, or 'Memcpy HtoD (Host -> Device)' etc. (strings)"),
        Column("kind", "int8", "GpuKind", "kernel, memcpy or memset"),
        Column("cls", "int8", "OpClass", "class from classify.py"),
        Column("copy_kind", "int8", "CopyKind", "direction of a memcpy"),
        Column("grid", "int32", N, "grid dimensions (x, y, z), -1 if unknown", width=3),
        Column("block", "int32", N, "block dimensions (x, y, z), -1 if unknown", width=3),
        Column("launch", "int32", ID, "launches row that enqueued this op, -1 if not found"),
        Column(
            "op", "int32", ID, "innermost host op of kind OP enclosing the launch (the 'parent ATen op'), -1 if none"
        ),
        Column("correlation", "int64", N, "runtime correlation id, -1 if none"),
        Column("ext_id", "int64", N, "Kineto 'External id', -1 if none"),
        Column(
            "step", "int32", ID, "steps row whose ProfilerStep contains the launch (or, with no launch, the op's start)"
        ),
        Column(
            "bytes",
            "float64",
            B,
            "bytes moved: memcpy/memset size from the trace; GEMM/attention traffic from the parent op's shapes, "
            "split over its compute kernels; other kernels: the parent op's minimum traffic from its shapes "
            "(inputs + an output, cost.mem_bytes), split over its kernels of the same class; NaN if unknown",
        ),
        Column(
            "flops",
            "float64",
            F,
            "FLOPs from the parent op's shapes: GEMM/attention split over its compute kernels, other kernels "
            "cost.op_flops split over its kernels of the same class; 0 for memcpy/memset; NaN if unknown",
        ),
        Column("collective", "int32", ID, "collectives row, -1 for non-communication ops"),
    ),
    "launches": (
        Column("host_op", "int32", ID, "host op of kind LAUNCH or LAUNCH_SYNC"),
        Column("correlation", "int64", N, "correlation id linking the call to its GPU ops"),
        Column("first_gpu_op", "int32", ID, "first GPU op enqueued, -1 if none was recorded"),
        Column("n_gpu_ops", "int32", N, "GPU ops enqueued (several for cudaGraphLaunch)"),
        Column("device", "int16", N, "device of the GPU op(s), -1 if none"),
        Column("stream", "int64", N, "stream of the first GPU op, -1 if none"),
    ),
    "collectives": (
        Column("host_op", "int32", ID, "record_param_comms (or nccl:*/c10d:: annotation) host op, -1 if none"),
        Column("gpu_op", "int32", ID, "communication kernel (NCCL/RCCL), -1 if none (CPU backends, ET-only)"),
        Column("type", "int8", "CollType", "collective type"),
        Column("name", "int32", ID, "collective name as recorded ('allreduce', 'all_to_allv', ...)"),
        Column("dtype", "int32", ID, "element type name, -1 if unknown"),
        Column("elem_bytes", "int16", B, "bytes per element, -1 if unknown"),
        Column("in_nelems", "int64", N, "input elements on this rank, -1 if unknown"),
        Column("out_nelems", "int64", N, "output elements on this rank, -1 if unknown"),
        Column("in_bytes", "float64", B, "input message size, NaN if unknown"),
        Column("out_bytes", "float64", B, "output message size, NaN if unknown"),
        Column("group", "int32", ID, "groups row (process group), -1 if unknown"),
        Column("group_size", "int32", N, "ranks in the process group, -1 if unknown"),
        Column("seq", "int64", N, "sequence number for matching the same collective across ranks"),
        Column("seq_source", "int8", "SeqSource", "where seq came from"),
        Column("algo", "int32", ID, "NCCL algorithm from the kernel name (RING, TREE, ...), -1 if unknown"),
        Column("protocol", "int32", ID, "NCCL protocol from the kernel name (LL, LL128, SIMPLE), -1 if unknown"),
        Column("in_splits", "int64", N, "per-peer input split sizes (elements), empty if even/unknown", ragged=True),
        Column("out_splits", "int64", N, "per-peer output split sizes (elements), empty if even/unknown", ragged=True),
    ),
    "groups": (
        Column("name", "int32", ID, "process group name ('0', ...), -1 if unknown"),
        Column("desc", "int32", ID, "process group description ('default_pg', ...), -1 if unknown"),
        Column("ranks", "int64", N, "global ranks in the group", ragged=True),
    ),
    "steps": (
        Column("number", "int64", N, "N of ProfilerStep#N; -1 when the whole trace is one step"),
        Column("host_op", "int32", ID, "the ProfilerStep#N host op, -1 if none"),
        Column("cpu_start", "float64", S, "ProfilerStep start (no ProfilerStep: first host op start)"),
        Column("cpu_dur", "float64", S, "ProfilerStep duration (no ProfilerStep: host span)"),
        Column("gpu_start", "float64", S, "start of the step's first GPU op, NaN if none"),
        Column("gpu_end", "float64", S, "end of the step's last-ending GPU op, NaN if none"),
        Column("n_gpu_ops", "int32", N, "GPU ops in the step"),
    ),
    "edges": (
        Column("src", "int32", ID, "source node (host op i -> i; GPU op j -> n_host + j)"),
        Column("dst", "int32", ID, "destination node"),
        Column("kind", "int8", "EdgeKind", "dependency kind"),
        Column("inferred", "int8", N, "1 if guessed conservatively (no stream/event info in the trace), else 0"),
    ),
}


_STORED: dict[str, tuple[tuple[str, np.dtype, int, int], ...]] = {
    t: tuple((f"{c.name}{sfx}", np.dtype(np.int64 if c.ragged else c.dtype), -1 if c.ragged else c.width, off)
             for c in cols for sfx, off in ((("_offsets", 1), ("_values", -1)) if c.ragged else (("", 0),)))
    for t, cols in TABLE_SCHEMAS.items()
}
"""Per table, its stored arrays (:meth:`Table.columns`' names) in schema order: (name, dtype, width (0: one
value a row, -1: a ragged column's array), ``_offsets``: 1 (n + 1 rows), ``_values``: -1 (any length), else 0)."""


_STORED_KEYS: dict[str, tuple[str, ...]] = {t: tuple(c[0] for c in spec) for t, spec in _STORED.items()}
"""Per table, the names of its stored arrays (:data:`_STORED`'s first fields)."""


def _stored_as_is(table: str, n: int, cols: dict[str, np.ndarray]) -> bool:
    """Whether ``cols`` holds exactly ``table``'s stored arrays, each a numpy array of its column's dtype and
    shape (what :class:`Table` would otherwise convert them to: a graph read back from the load cache), so that
    :class:`Table` can keep them as they are; their order is the schema's (:meth:`Table.columns` keeps it)."""
    spec = _STORED[table]
    if len(cols) != len(spec):
        return False
    for (name, dt, width, off), (have, arr) in zip(spec, cols.items()):
        if have != name or type(arr) is not np.ndarray or (arr.dtype is not dt and arr.dtype != dt):
            return False
        shape = arr.shape
        if width == -1:
            if len(shape) != 1 or (off == 1 and shape[0] != n + 1):
                return False
        elif shape != ((n, width) if width else (n,)):
            return False
    return True


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


class Table:
    """A struct-of-arrays table: one numpy array per column, all of one length.

    Columns are attributes (``t.start``); ragged columns are read with
    :meth:`ragged`. ``len(t)`` is the number of rows.
    """

    __slots__ = ("_cols", "_n", "table")

    def __init__(self, table: str, n: int = 0, /, **cols: np.ndarray) -> None:
        self.table = table
        self._n = n
        self._cols: dict[str, np.ndarray] = {}
        if _stored_as_is(table, n, cols):  # every column present, of its dtype and shape: kept as given
            self._cols.update(cols)
            return
        for c in TABLE_SCHEMAS[table]:
            if c.ragged:
                off = cols.pop(f"{c.name}_offsets", None)
                val = cols.pop(f"{c.name}_values", None)
                if off is None:
                    off = np.zeros(n + 1, np.int64)
                    val = np.zeros(0, np.int64)
                self._cols[f"{c.name}_offsets"] = np.asarray(off, np.int64)
                self._cols[f"{c.name}_values"] = np.asarray(val, np.int64)
                continue
            arr = cols.pop(c.name, None)
            shape = (n, c.width) if c.width else (n,)
            if arr is None:
                arr = np.full(shape, c.fill, dtype=c.dtype)
            else:
                arr = np.asarray(arr, dtype=c.dtype).reshape(shape)
            self._cols[c.name] = arr
        if cols:
            raise ValueError(f"{table}: unknown columns {sorted(cols)}")

    @classmethod
    def _kept(cls, table: str, n: int, cols: dict[str, np.ndarray]) -> Table:
        """A table of ``cols`` as they are, unchecked: ``cols`` are the stored arrays of a :class:`Table` of ``table``
        with ``n`` rows made before (which checked or made them: a load-cache entry's plan,
        :func:`cosim.workload.cache._from_plan`); the dict is copied (a table replaces its edited columns)."""
        t = object.__new__(cls)
        object.__setattr__(t, "table", table)
        object.__setattr__(t, "_n", n)
        object.__setattr__(t, "_cols", dict(cols))
        return t

    def __len__(self) -> int:
        return self._n

    def __getattr__(self, name: str) -> np.ndarray:
        try:
            return self._cols[name]
        except KeyError:
            raise AttributeError(f"{self.table} has no column {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name in Table.__slots__:
            object.__setattr__(self, name, value)
        elif name in self._cols:
            a = self._cols[name]
            if not a.flags.writeable:  # a loaded graph's column: replaced by an edited copy
                a = self._cols[name] = a.copy()
            a[...] = value
        else:
            raise AttributeError(f"{self.table} has no column {name!r}")

    def columns(self) -> dict[str, np.ndarray]:
        """All stored arrays by name (ragged columns as ``_offsets``/``_values``)."""
        return dict(self._cols)

    def ragged(self, name: str, i: int) -> np.ndarray:
        """Row ``i`` of ragged column ``name``."""
        off = self._cols[f"{name}_offsets"]
        return self._cols[f"{name}_values"][off[i] : off[i + 1]]

    def __repr__(self) -> str:
        return f"<Table {self.table}: {self._n} rows>"


def ragged_arrays(lists: Iterable[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, values) for a ragged column from per-row lists."""
    lists = list(lists)
    lens = [len(x) for x in lists]
    off = np.zeros(len(lens) + 1, np.int64)
    np.cumsum(lens, out=off[1:])
    vals = np.fromiter((v for x in lists for v in x), np.int64, count=int(off[-1]))
    return off, vals


class StringTable:
    """Interns strings; ``ids[s]`` gives the index in ``strings``."""

    __slots__ = ("ids", "strings")

    def __init__(self, strings: Iterable[str] = ()) -> None:
        self.strings: list[str] = list(strings)
        self.ids: dict[str, int] = {s: i for i, s in enumerate(self.strings)}

    def __call__(self, s: str | None) -> int:
        if s is None:
            return -1
        i = self.ids.get(s)
        if i is None:
            i = self.ids[s] = len(self.strings)
            self.strings.append(s)
        return i


@dataclass
class RankGraph:
    """The execution graph of one rank: its host threads, host ops, launches,
    GPU ops, collectives, process groups, steps and dependency edges.

    Times are seconds relative to ``time_origin`` (the earliest event of this
    rank, in the trace's own clock, seconds).
    """

    rank: int
    world_size: int
    device_name: str
    strings: list[str]
    threads: Table
    host_ops: Table
    gpu_ops: Table
    launches: Table
    collectives: Table
    groups: Table
    steps: Table
    edges: Table
    time_origin: float = 0.0
    source: dict[str, Any] = field(default_factory=dict)
    origin: tuple[Any, ...] | None = field(default=None, repr=False, compare=False)
    """Where the rank's arrays came from, set by :meth:`ExecutionGraph.set_origin` for a rank read from the load
    cache: ((entry key, rank index), the tables, their arrays, the arrays' shapes, their dtypes); read through
    :meth:`cache_identity`. None: built in memory (import, synthesis, edits)."""

    # -- helpers -----------------------------------------------------------------------
    def name(self, idx: int) -> str:
        """The string with index ``idx`` ('' for -1)."""
        return self.strings[idx] if idx >= 0 else ""

    def gpu_node(self, j: int | np.ndarray) -> int | np.ndarray:
        """Edge node id of GPU op ``j``."""
        return len(self.host_ops) + j

    def shapes(self, i: int) -> list[Any] | None:
        """Decoded input shapes of host op ``i`` (None if not recorded)."""
        k = int(self.host_ops.input_shapes[i])
        return json.loads(self.strings[k]) if k >= 0 else None

    def types(self, i: int) -> list[Any] | None:
        """Decoded input dtypes of host op ``i`` (None if not recorded)."""
        k = int(self.host_ops.input_types[i])
        return json.loads(self.strings[k]) if k >= 0 else None

    def measured_step_times(self) -> dict[str, np.ndarray]:
        """Measured step times of this rank, seconds, one entry per step.

        Keys: ``step`` (N of ProfilerStep#N), ``cpu`` (ProfilerStep duration),
        ``gpu_span`` (first GPU op start to last GPU op end among the ops whose
        launch lies in the step), ``gpu_step_to_step`` (start of step N+1's first
        launched GPU op minus step N's, as ``cosim.replay.summary.step_times``; NaN
        for the last step), and ``gpu``: the rank's measured step time per step —
        step-to-step where the trace has several steps, otherwise the GPU span.
        """
        st = self.steps
        span = st.gpu_end - st.gpu_start
        s2s = np.full(len(st), np.nan)
        if len(st) >= 2:
            G = self.gpu_ops
            first = np.full(len(st), np.nan)
            for s in range(len(st)):
                mine = (G.step == s) & (G.launch >= 0)
                first[s] = G.start[mine].min() if mine.any() else st.gpu_start[s]
            s2s[:-1] = np.diff(first)
        gpu = s2s if len(st) >= 2 else span.copy()
        return {
            "step": st.number.copy(),
            "cpu": st.cpu_dur.copy(),
            "gpu_span": span,
            "gpu_step_to_step": s2s,
            "gpu": gpu,
        }

    def class_names(self) -> np.ndarray:
        """``gpu_ops.cls`` as lower-case class names."""
        names = np.array([c.name.lower() for c in OpClass])
        return names[self.gpu_ops.cls]

    def summary(self) -> dict[str, Any]:
        """Counts and totals for a quick look (JSON-serialisable)."""
        g = self.gpu_ops
        by_cls: dict[str, dict[str, float]] = {}
        for c in OpClass:
            m = g.cls == c
            if m.any():
                by_cls[c.name.lower()] = {"count": int(m.sum()), "time_s": float(g.dur[m].sum())}
        edge_counts = {k.name.lower(): int((self.edges.kind == k).sum()) for k in EdgeKind}
        coll = {
            t.name.lower(): int((self.collectives.type == t).sum())
            for t in CollType
            if (self.collectives.type == t).any()
        }
        times = self.measured_step_times()
        return {
            "rank": self.rank,
            "world_size": self.world_size,
            "device_name": self.device_name,
            "threads": len(self.threads),
            "host_ops": len(self.host_ops),
            "launches": len(self.launches),
            "gpu_ops": len(g),
            "gpu_ops_by_class": by_cls,
            "collectives": coll,
            "edges": edge_counts,
            "steps": [int(x) for x in times["step"]],
            "step_time_gpu_s": [None if np.isnan(x) else float(x) for x in times["gpu"]],
            "step_time_cpu_s": [None if np.isnan(x) else float(x) for x in times["cpu"]],
        }

    def tables(self) -> dict[str, Table]:
        return {k: getattr(self, k) for k in TABLE_SCHEMAS}

    def _arrays(self) -> tuple[list[Table], list[np.ndarray]]:
        """The rank's tables (schema order) and every stored array of them, in that order."""
        tabs = [getattr(self, k) for k in TABLE_SCHEMAS]
        return tabs, [a for t in tabs for a in t._cols.values()]

    def make_writable(self) -> None:
        """Replace every read-only array (a loaded graph's) by a writable copy: the first step of an editor
        that writes into the tables in place (:func:`cosim.workload.et.link_et`). The rank then no longer
        holds the arrays it was loaded with (:meth:`cache_identity` is None)."""
        for t in self._arrays()[0]:
            cols = t._cols
            for name, a in cols.items():
                if not a.flags.writeable:
                    cols[name] = a.copy()

    def cache_identity(self) -> tuple[str, int] | None:
        """(load-cache entry key, rank index) when this rank still holds exactly the tables and read-only arrays
        it was read with (same objects, shapes and dtypes: their bytes cannot have changed, as no array of
        them can be made writeable), else None. Identity fields and strings are not covered (callers hash
        them)."""
        o = self.origin
        if o is None:
            return None
        tabs, arrays = self._arrays()
        if not (all(map(operator.is_, tabs, o[1])) and len(arrays) == len(o[2])
                and all(map(operator.is_, arrays, o[2]))
                and list(map(_SHAPE, arrays)) == o[3] and list(map(_DTYPE, arrays)) == o[4]):
            return None
        return o[0]

    def validate(self) -> None:
        """Check internal consistency (index ranges, edge node ids); raises ValueError."""
        nh, ng = len(self.host_ops), len(self.gpu_ops)
        ns = len(self.strings)

        def rng(name: str, arr: np.ndarray, hi: int) -> None:
            if len(arr) and (arr.min() < -1 or arr.max() >= hi):
                raise ValueError(f"rank {self.rank}: {name} out of range [-1, {hi})")

        h = self.host_ops
        for col in ("name", "input_shapes", "input_types", "output_shapes", "concrete_inputs"):
            rng(f"host_ops.{col}", getattr(h, col), ns)
        rng("host_ops.parent", h.parent, nh)
        rng("host_ops.thread", h.thread, len(self.threads))
        rng("gpu_ops.launch", self.gpu_ops.launch, len(self.launches))
        rng("gpu_ops.op", self.gpu_ops.op, nh)
        rng("gpu_ops.collective", self.gpu_ops.collective, len(self.collectives))
        rng("launches.host_op", self.launches.host_op, nh)
        rng("collectives.host_op", self.collectives.host_op, nh)
        rng("collectives.gpu_op", self.collectives.gpu_op, ng)
        e = self.edges
        if len(e) and (e.src.min() < 0 or e.dst.min() < 0 or max(e.src.max(), e.dst.max()) >= nh + ng):
            raise ValueError(f"rank {self.rank}: edge node id out of range")


@dataclass
class ExecutionGraph:
    """Execution graphs of all ranks of one job (``ranks`` sorted by rank)."""

    ranks: list[RankGraph]
    schema_version: str = SCHEMA_VERSION

    def set_read_only(self) -> None:
        """Make every stored array a read-only view of a read-only array, which numpy will not make writeable
        again (a loaded graph's: a column is edited by assigning it, ``table.col = values``, which replaces it by
        an edited copy, or by a new table)."""
        for rg in self.ranks:
            for t in rg._arrays()[0]:
                cols = t._cols
                for name, a in cols.items():
                    a.flags.writeable = False
                    cols[name] = a.view()

    def set_origin(self, key: str) -> None:
        """Record each rank as the content of load-cache key ``key`` (:attr:`RankGraph.origin`; the key is a
        function of the trace files' bytes and the importer's code, :func:`cosim.workload.cache.cache_key`).
        Called only where every array was made a view of a read-only buffer or array
        (:func:`cosim.workload.cache.read_entry`, :meth:`set_read_only`): a read-only one then cannot be made
        writeable, and the key identifies its bytes as long as :meth:`RankGraph.cache_identity` finds it in
        place; a rank with a writeable array (a column the table converted) gets none."""
        for k, rg in enumerate(self.ranks):
            tabs, arrays = rg._arrays()
            if any(a.flags.writeable for a in arrays):
                rg.origin = None
                continue
            rg.origin = ((key, k), tabs, arrays, list(map(_SHAPE, arrays)), list(map(_DTYPE, arrays)))

    def set_origin_known(self, key: str, stored: Sequence[tuple[list[np.ndarray], list[Any], list[Any]]]) -> None:
        """:meth:`set_origin` of a graph whose rank ``k`` holds, in :meth:`RankGraph._arrays`' order, exactly the
        read-only arrays ``stored[k][0]`` (shapes ``stored[k][1]``, dtypes ``stored[k][2]``: a load-cache entry's
        plan, which :meth:`set_origin` checked when its first graph was read): the same origins, without looking at
        the ~85 arrays of each rank again."""
        for k, (rg, (arrays, shapes, dtypes)) in enumerate(zip(self.ranks, stored)):
            rg.origin = ((key, k), [getattr(rg, t) for t in TABLE_SCHEMAS], arrays, shapes, dtypes)

    @property
    def world_size(self) -> int:
        return max((r.world_size for r in self.ranks), default=0)

    def warnings(self) -> list[str]:
        """The importers' warnings about usable but suspicious input, every rank's, in rank order."""
        return [w for rg in self.ranks for w in rg.source.get("warnings", [])]

    def rank(self, r: int) -> RankGraph:
        for rg in self.ranks:
            if rg.rank == r:
                return rg
        raise KeyError(r)

    def summary(self) -> dict[str, Any]:
        """Job-wide counts (per class totals summed over ranks) and per-rank summaries."""
        per = [r.summary() for r in self.ranks]
        tot: dict[str, dict[str, float]] = {}
        for s in per:
            for k, v in s["gpu_ops_by_class"].items():
                t = tot.setdefault(k, {"count": 0, "time_s": 0.0})
                t["count"] += v["count"]
                t["time_s"] += v["time_s"]
        return {
            "schema_version": self.schema_version,
            "n_ranks": len(self.ranks),
            "world_size": self.world_size,
            "host_ops": sum(s["host_ops"] for s in per),
            "gpu_ops": sum(s["gpu_ops"] for s in per),
            "gpu_ops_by_class": tot,
            "ranks": per,
        }

    # -- persistence -----------------------------------------------------------------------
    def to_npz(self, path: str | Path, *, compress: bool = True) -> None:
        """Write the graph to one ``.npz`` (no pickles; versioned); ``compress=False`` writes it
        uncompressed (larger, faster to read)."""
        arrays = self.npz_arrays()
        from cosim.fileio import atomic_open

        with atomic_open(path, "wb", gz=False) as fh:
            if compress:
                np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]
            else:
                np.savez(fh, **arrays)  # type: ignore[arg-type]

    def npz_arrays(self) -> dict[str, np.ndarray]:
        """The named arrays of :meth:`to_npz` (``meta``: the JSON header as bytes)."""
        arrays: dict[str, np.ndarray] = {}
        meta: dict[str, Any] = {"format": "cosim.execution_graph", "schema_version": self.schema_version, "ranks": []}
        for k, rg in enumerate(self.ranks):
            p = f"r{k}"
            meta["ranks"].append(
                {
                    "rank": rg.rank,
                    "world_size": rg.world_size,
                    "device_name": rg.device_name,
                    "time_origin": rg.time_origin,
                    "source": rg.source,
                    "rows": {t: len(tab) for t, tab in rg.tables().items()},
                }
            )
            enc = [s.encode("utf-8", "surrogatepass") for s in rg.strings]
            off = np.zeros(len(enc) + 1, np.int64)
            np.cumsum([len(b) for b in enc], out=off[1:])
            arrays[f"{p}/strings_offsets"] = off
            arrays[f"{p}/strings_blob"] = np.frombuffer(b"".join(enc), np.uint8)
            for tname, tab in rg.tables().items():
                for cname, arr in tab.columns().items():
                    arrays[f"{p}/{tname}/{cname}"] = arr
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        return arrays

    @classmethod
    def from_npz(cls, path: str | Path) -> ExecutionGraph:
        """Read a graph written by :meth:`to_npz`; rejects other major schema versions."""
        try:
            z = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            raise CosimInputError("file not found", file=path) from None
        except (OSError, ValueError) as exc:
            raise CosimInputError(f"not a cosim execution-graph .npz ({exc})", file=path) from None
        with z:
            return cls.from_arrays(z, set(z.files), path)

    @classmethod
    def from_arrays(cls, z: Any, names: set[str], path: str | Path | None = None) -> ExecutionGraph:
        """A graph from the named arrays of :meth:`npz_arrays` (``z[name]``; ``names``: those present)."""
        if "meta" not in names:
            raise CosimInputError("not a cosim execution-graph .npz (no 'meta')", file=path)
        meta = json.loads(bytes(z["meta"]).decode())
        ver = str(meta.get("schema_version", ""))
        if meta.get("format") != "cosim.execution_graph":
            raise CosimInputError("not a cosim execution-graph .npz", file=path)
        if ver.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
            raise CosimInputError(
                f"execution-graph schema version {ver} is not supported (this cosim reads {SCHEMA_VERSION.split('.')[0]}.x)",
                file=path,
                path="schema_version",
            )
        ranks = []
        for k, rm in enumerate(meta["ranks"]):
            p = f"r{k}"
            strings = _decode_strings(z[f"{p}/strings_offsets"], z[f"{p}/strings_blob"])
            tabs: dict[str, Any] = {}
            rows = rm["rows"]
            for tname, stored in _STORED_KEYS.items():
                n = int(rows.get(tname, 0))
                head = f"{p}/{tname}/"
                cols = {cn: z[head + cn] for cn in stored if head + cn in names}
                tabs[tname] = Table(tname, n, **cols)
            ranks.append(
                RankGraph(
                    rank=rm["rank"],
                    world_size=rm["world_size"],
                    device_name=rm["device_name"],
                    strings=strings,
                    time_origin=rm.get("time_origin", 0.0),
                    source=rm.get("source", {}),
                    **tabs,
                )
            )
        parts = ver.split(".")
        if len(parts) < 2 or not parts[1].isdigit() or int(parts[1]) < 1:
            # 1.0: gpu_ops bytes/FLOPs were GEMM/memcpy-only; fill the other kernels as 1.1 does
            from cosim.workload.cost import fill_gpu_costs

            for rg in ranks:
                fill_gpu_costs(rg)
            ver = "1.1"
        return cls(ranks, schema_version=ver)


class _TableKey(tuple[bytes, bytes]):
    """A stored string table, (offsets as int64 bytes, UTF-8 bytes), as a key of :data:`_STRINGS`: equal as the
    tuple, hashed by zlib-ng's CRC-32 of both (a few us for the ~50 kB of a DLRM rank, where hashing the bytes
    themselves, new objects at each read, took ~35 us)."""

    __slots__ = ()

    def __hash__(self) -> int:
        return zlib_ng.crc32(self[1], zlib_ng.crc32(self[0])) | (len(self[0]) << 32)

    def __eq__(self, other: object) -> bool:
        return tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return tuple.__ne__(self, other)


_STRINGS: dict[_TableKey, tuple[str, ...]] = {}
"""String tables decoded in this process (:func:`_decode_strings`), by their stored bytes (offsets as int64, UTF-8),
least recently read first."""
_STRINGS_KEPT = 64
"""Tables :data:`_STRINGS` keeps, at most."""
_STRINGS_BYTES = 1 << 24
"""Stored bytes (offsets and UTF-8) of the tables :data:`_STRINGS` keeps, at most; a larger table is decoded at
every read."""
_STRINGS_LOCK = threading.Lock()
"""Held while :data:`_STRINGS` is read or changed: ranks may be loaded by several threads at once."""


def _decode_strings(offsets: np.ndarray, blob: np.ndarray) -> list[str]:
    """A rank's string table from its stored form (``strings_offsets``: n + 1 byte offsets into ``strings_blob``,
    UTF-8), a new list each call. Tables read before in this process (the ranks of a cached job read back again)
    come from :data:`_STRINGS`, by the offsets' values and the blob's bytes: Python strings are immutable, so only
    the list is new."""
    data = blob.tobytes()
    key = _TableKey((offsets.astype(np.int64, copy=False).tobytes(), data))  # by value: int32 [0, 0] is not int64 [0]
    with _STRINGS_LOCK:
        hit = _STRINGS.pop(key, None)
        if hit is not None:
            _STRINGS[key] = hit  # now the most recently read
    if hit is not None:
        return list(hit)
    off = offsets.tolist()
    text = data.decode("utf-8", "surrogatepass")
    if len(text) == len(data):  # ASCII: byte offsets are character offsets; slice in C
        strings = list(map(text.__getitem__, map(slice, off[:-1], off[1:])))
    else:
        strings = [data[a:b].decode("utf-8", "surrogatepass") for a, b in itertools.pairwise(off)]
    with _STRINGS_LOCK:
        _remember_strings(key, tuple(strings))
    return strings


def _remember_strings(key: _TableKey, strings: tuple[str, ...]) -> None:
    """Keep ``strings`` in :data:`_STRINGS` under ``key``, forgetting the least recently read tables until at most
    :data:`_STRINGS_KEPT` tables of :data:`_STRINGS_BYTES` stored bytes remain with it; a table of more bytes than
    that alone is not kept. The caller holds :data:`_STRINGS_LOCK`. The bytes held are counted from the memo itself
    (at most 64 entries), so a memo cleared from outside (benchmarks' ``forget_memos``) stays consistent."""
    size = len(key[0]) + len(key[1])
    if size > _STRINGS_BYTES:
        return
    held = size + sum(len(a) + len(b) for a, b in _STRINGS)
    for old in list(_STRINGS):
        if len(_STRINGS) < _STRINGS_KEPT and held <= _STRINGS_BYTES:
            break
        held -= len(old[0]) + len(old[1])
        del _STRINGS[old]
    _STRINGS[key] = strings


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for a block that allocates millions of acyclic containers (a
    synthesized rank's op rows, a timeline's event dicts): each collection would walk every tracked object of the
    process (the run's graph, topology and results included), O(live objects) per ~700 allocations, which made up
    most of the timeline writer's time. Reference counting still frees everything; the collector's previous state
    is restored on exit (so nesting is harmless)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
