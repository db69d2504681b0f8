"""Import a Kineto / torch.profiler Chrome trace (one rank) into a :class:`RankGraph`: reading.

The file is decoded in one pass by msgspec into typed event records (only the fields
cosim reads are kept, so a decoded event is a few small slots, not a dict), then
checked as a whole (:func:`check_events`, vectorized over numpy columns), then turned
into execution-graph tables by :mod:`cosim.workload.kineto_tables` (table building),
:mod:`cosim.workload.kineto_collectives` (collectives) and :mod:`cosim.workload.deps`
(dependency inference, shared with the Execution-Trace importer). What is read:

* host ops: ``cpu_op``, ``user_annotation`` and runtime calls (``cuda_runtime``,
  ``cuda_driver``; HIP names land in the same categories on ROCm);
* GPU ops: ``kernel``, ``gpu_memcpy``, ``gpu_memset``;
* links from runtime call to GPU op: the ``correlation`` arg, else ``ac2g`` /
  ``async_cpu_to_gpu`` flow events;
* ``cuda_sync`` events (newer Kineto): which stream or event a sync/wait is on.

Skipped: ``python_function``, ``cpu_instant_event``, ``gpu_user_annotation``,
``fwdbwd`` flows, memory and counter events.

Bad input is one :class:`~cosim.errors.CosimInputError` naming the file, the event
(``traceEvents[i]`` and its name) and the problem: a field of the wrong type, a
missing ``ts``/``dur``/``name`` (when no event has it, the message lists the fields a
Kineto event is expected to have and those the trace has instead), a timestamp or
duration that is negative or not finite, a duration longer than the trace itself.
A usable but suspicious trace gets warnings in ``RankGraph.source["warnings"]``
(``load_trace`` logs them; replay puts them in the summary's ``notes``).
"""

from __future__ import annotations

import itertools
import json
import re
import zlib
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

import msgspec
import numpy as np
import orjson
from zlib_ng import zlib_ng

from cosim.errors import CosimInputError
from cosim.fileio import open_maybe_gzip
from cosim.workload.classify import copy_kind
from cosim.workload.graph import GpuKind, RankGraph, StringTable
from cosim.workload.jsonstream import ChromeTraceReader
from cosim.workload.kineto_common import (
    EVENT_RECORD_APIS,
    FLOW_CATS,
    GPU_CATS,
    HOST_CATS,
    LAUNCH_SYNC_APIS,
    STREAM_WAIT_APIS,
    SYNC_APIS,
    as_int,
    col,
    detect_scale,
)
from cosim.workload.kineto_tables import build_rank, text_memos

__all__ = [
    "EVENT_RECORD_APIS",
    "KINETO_EVENT_FIELDS",
    "LAUNCH_SYNC_APIS",
    "STREAM_WAIT_APIS",
    "SYNC_APIS",
    "read_kineto",
]

#: Fields of a Kineto complete event ("ph": "X") that cosim reads; ts/dur/name are required.
KINETO_EVENT_FIELDS = ("ph", "cat", "name", "pid", "tid", "ts", "dur", "args")

#: A duration longer than this many times the trace's span of start times (plus one second) is corrupt.
SPAN_FACTOR = 10.0


def _dumps(x: Any) -> str:
    try:
        return orjson.dumps(x).decode()
    except TypeError:  # integers beyond 64 bits, lone surrogates: the standard library writes them
        return json.dumps(x, separators=(",", ":"))


#: An absent ``Input Dims`` / ``Input type`` (a present ``null`` is ``Raw(b"null")``).
_NO_RAW = msgspec.Raw(b"")


class _ArgsLite(msgspec.Struct, omit_defaults=True, gc=False):
    """The ``args`` members cosim reads of every event (any JSON value; checked where used).

    ``Input Dims`` and ``Input type`` are kept as their raw JSON text: an op's shapes repeat across
    a trace, so each distinct text is decoded (and checked: an array or null) once, not once per
    event; a bad one is reported as the typed decode (:class:`_ArgsStrict`) reports it."""

    external_id: int | None = msgspec.field(default=None, name="External id")
    rf_id: int | None = msgspec.field(default=None, name="Record function id")
    correlation: int | None = None
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    device: Any = None
    stream: Any = None
    grid: msgspec.Raw = _NO_RAW
    block: msgspec.Raw = _NO_RAW
    bytes: Any = None
    kind: Any = None
    name: Any = None
    cuda_sync_kind: Any = None
    wait_on_stream: int | None = None
    wait_on_cuda_event_record_corr_id: int | None = None
    coll_name: Any = msgspec.field(default=None, name="Collective name")
    """Tells a collective's event: its collective's members (:class:`_CommArgs`) are decoded on their own."""


class _CommArgs(msgspec.Struct, omit_defaults=True, gc=False):
    """The ``record_param_comms`` members of an event's ``args``, in a fixed order: a collective's
    args as a dict of the members present (not null) come from ``msgspec.to_builtins`` in C (omitted defaults),
    not from a lookup per member."""

    coll_name: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    in_size: Any = msgspec.field(default=None, name="In msg size")
    out_size: Any = msgspec.field(default=None, name="Out msg size")
    dtype: Any = None
    group_size: Any = msgspec.field(default=None, name="Group size")
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_desc: Any = msgspec.field(default=None, name="Process Group Description")
    pg_ranks: Any = msgspec.field(default=None, name="Process Group Ranks")
    in_split: Any = msgspec.field(default=None, name="In split size")
    out_split: Any = msgspec.field(default=None, name="Out split size")
    seq_cap: Any = msgspec.field(default=None, name="Seq")
    seq: Any = None
    rank: Any = msgspec.field(default=None, name="Rank")
    rank_start: Any = msgspec.field(default=None, name="Global rank start")
    rank_stride: Any = msgspec.field(default=None, name="Global rank stride")


class _CommEvent(msgspec.Struct, gc=False):
    """An event with only its collective's args (see :class:`_CommArgs`)."""

    args: _CommArgs | None = None


class _EventLite(msgspec.Struct, gc=False):
    """One ``traceEvents`` element: the fields cosim reads, typed (others are skipped); its args
    without a collective's members. A flow event's ``id`` is not kept (:func:`read_flows` reads flows
    in a pass of its own when a trace needs them): skipping it saves ~4 ms of the v100 trace's decode."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _ArgsLite | None = None


class _ArgsStrict(_ArgsLite, omit_defaults=True, gc=False):
    """:class:`_ArgsLite` with the shapes typed: decodes a chunk again to report its first bad field (a
    collective's members are of any type: they cannot fail it)."""

    input_dims: list[Any] | None = msgspec.field(default=None, name="Input Dims")  # type: ignore[assignment]
    input_type: list[Any] | None = msgspec.field(default=None, name="Input type")  # type: ignore[assignment]


class _EventStrict(_EventLite, gc=False):
    args: _ArgsStrict | None = None  # type: ignore[assignment]


class _RawDoc(msgspec.Struct, gc=False):
    traceEvents: list[msgspec.Raw]
    distributedInfo: dict[str, Any] | None = None
    deviceProperties: list[Any] | None = None
    schemaVersion: Any = None
    displayTimeUnit: Any = None


#: Events decoded at a time: the file is checked whole (syntax, top level), the events in chunks,
#: so that typed records of only one chunk are alive at once. 2048 rather than 8192: a chunk's text and records
#: then stay in the core's caches while the loop reads them (the v100 trace's `read_kineto` ~4% less CPU:
#: benchmarks/README.md, round 14). A divisor of :data:`ERROR_CHUNK_EVENTS`.
CHUNK_EVENTS = 2048
#: Events of the chunk a bad field is reported from (:func:`_strict_failure`: the first error a fully typed decode
#: of the chunk holding the bad event meets), as when chunks were decoded 8192 at a time: the same message for
#: the same file whatever :data:`CHUNK_EVENTS` is.
ERROR_CHUNK_EVENTS = 8192
_RAW_DECODER = msgspec.json.Decoder(_RawDoc | list[msgspec.Raw])
_CHUNK_DECODER = msgspec.json.Decoder(list[_EventLite])
_COMM_DECODER = msgspec.json.Decoder(_CommEvent)
_STRICT_DECODER = msgspec.json.Decoder(list[_EventStrict])
_LIST_DECODER = msgspec.json.Decoder(list[Any] | None)
_ANY_DECODER = msgspec.json.Decoder()
_AT = re.compile(r"^(.*?)(?: - at `\$(.*)`)?$", re.S)
_EVENT_PATH = re.compile(r"^(?:\.traceEvents)?\[(\d+)\](?:\.(\w+))?(.*)$")


#: zlib-ng's error class (its stub declares it as an instance)
_ZNG_ERROR = cast(type[Exception], zlib_ng.error)


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, un-gzipped. A gzip file of one member is inflated by one zlib-ng call (header and
    CRC checked in C; zlib-ng inflates the v100 trace's 53 MB in ~41 ms of CPU, the standard zlib in ~95, giving
    the same bytes; ISA-L's inflate, ``isal.isal_zlib``, takes ~36 ms alone but left the whole load 6-15 ms
    slower: benchmarks/README.md, round 14); anything else (several members, trailing bytes, a damaged or
    unreadable file) goes through :func:`open_maybe_gzip`, which reads it or names its problem."""
    try:
        with open(path, "rb") as f:
            raw: bytes | None = f.read()
    except OSError:
        raw = None
    if raw is not None:
        if raw[:2] != b"\x1f\x8b":
            return raw
        d = zlib_ng.decompressobj(wbits=31)
        try:
            out = d.decompress(raw)
            if d.eof and not d.unused_data:
                return out
        except _ZNG_ERROR:
            pass
        del raw
    try:
        fh = open_maybe_gzip(path)
        try:
            return fh.read()
        finally:
            fh.close()
    except CosimInputError:
        raise
    except EOFError:
        raise CosimInputError("truncated gzip file (compressed stream ended early)", file=path) from None
    except (OSError, zlib.error) as exc:
        raise CosimInputError(f"corrupt gzip data ({exc})", file=path) from None


def _generic_event(data: bytes | Path, k: int) -> Any:
    """Event ``k`` decoded without a schema (error path only; ``data`` is the file's bytes or its path), or None."""
    if isinstance(data, Path):
        data = _read_bytes(data)
    try:
        doc = json.loads(data)  # the standard library reads 1e400 (as inf), msgspec refuses it
    except (ValueError, RecursionError):
        return None
    evs = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if isinstance(evs, list) and 0 <= k < len(evs):
        return evs[k]
    return None


def _event_label(k: int, ev: Any) -> str:
    name = ev.get("name") if isinstance(ev, dict) else None
    return f"traceEvents[{k}]" + (f" {name!r}" if isinstance(name, str) else "")


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
        type(v), type(v).__name__
    )


def _validation_error(path: Path, data: bytes, exc: msgspec.ValidationError, offset: int = 0) -> CosimInputError:
    """A one-line error from msgspec's type error, naming the event and its name (events of a chunk
    that starts at event ``offset``)."""
    m = _AT.match(str(exc))
    problem, where = (m.group(1), m.group(2) or "") if m else (str(exc), "")
    problem = problem.replace("`", "")
    em = _EVENT_PATH.match(where)
    if em is None:
        if "missing required field" in problem and "traceEvents" in problem:
            return CosimInputError("no 'traceEvents' array: not a Chrome/Kineto trace", file=path)
        return CosimInputError(f"{problem}", file=path, path=where.lstrip(".") or None)
    k, field, rest = int(em.group(1)) + offset, em.group(2), em.group(3)
    ev = _generic_event(data, k)
    if not isinstance(ev, dict):
        return CosimInputError(
            f"an event must be an object with fields {', '.join(KINETO_EVENT_FIELDS)}; got {_type_name(ev)} {ev!r:.60}",
            file=path,
            path=f"traceEvents[{k}]",
        )
    if field is None:
        return CosimInputError(problem, file=path, path=_event_label(k, ev))
    value = ev.get(field)
    if "out of range" in problem:
        return CosimInputError(f"{field}: {value!r:.60} is not a finite number", file=path, path=_event_label(k, ev))
    if field == "args" and rest:
        return CosimInputError(f"args{rest}: {problem.lower()}", file=path, path=_event_label(k, ev))
    want = {"ts": "a number", "dur": "a number"}.get(field, problem.split(",")[0].replace("Expected ", "").lower())
    return CosimInputError(
        f"{field}: expected {want}, got {_type_name(value)} {value!r:.60}", file=path, path=_event_label(k, ev)
    )


def decode_trace(path: str | Path) -> tuple[dict[str, Any], Iterator[_EventLite]]:
    """Decode a Chrome-trace file: (top-level members other than the events, the typed events in order;
    their args without a collective's members)."""
    meta, chunks, _, _ = decode_trace_chunks(path)
    return meta, (e for chunk in chunks for e in chunk)


def decode_trace_chunks(
    path: str | Path,
) -> tuple[dict[str, Any], Iterator[list[_EventLite]], Callable[[int], NoReturn], Callable[[int], dict[str, Any]]]:
    """Decode a Chrome-trace file: (top-level members other than the events, the typed events in order,
    in lists of :data:`CHUNK_EVENTS`, with :class:`_ArgsLite`).

    The third member raises the error of the chunk holding event ``k`` as a fully typed decode
    reports it (for a raw member found bad later); the fourth decodes event ``k``'s collective
    members (:class:`_CommArgs`, as a dict of those present) from its raw text. The whole file is parsed once into raw event slices (syntax and top-level types checked), then
    the events are decoded into typed records :data:`CHUNK_EVENTS` at a time as the iterator is
    consumed. Malformed JSON is located (line:column, ``traceEvents[i]``) by
    :class:`ChromeTraceReader`; a field of the wrong type names the event.
    """
    path = Path(path)
    data = _read_bytes(path)
    try:
        doc = _RAW_DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise _validation_error(path, data, exc) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _syntax_error(path, data, exc) from None
    raws: list[msgspec.Raw] = doc if isinstance(doc, list) else doc.traceEvents

    def fail(k: int) -> NoReturn:
        _strict_failure(path, data, raws, k - k % ERROR_CHUNK_EVENTS)

    def comm_args(k: int) -> dict[str, Any]:  # the chunk holding k decoded: so does k, with the same values
        a = _COMM_DECODER.decode(raws[k]).args
        return {} if a is None else cast(dict[str, Any], msgspec.to_builtins(a))

    if isinstance(doc, list):
        return {}, _chunks(path, data, doc), fail, comm_args
    meta = {
        k: getattr(doc, k)
        for k in ("distributedInfo", "deviceProperties", "schemaVersion", "displayTimeUnit")
        if getattr(doc, k) is not None
    }
    return meta, _chunks(path, data, doc.traceEvents), fail, comm_args


def _syntax_error(path: Path, data: bytes, exc: Exception) -> CosimInputError:
    # the streaming reader locates syntax errors precisely (line:column, event index)
    reader = ChromeTraceReader(path)
    for _ in reader.events():
        pass
    if not data.strip():
        return CosimInputError("empty file", file=path)
    return CosimInputError(f"invalid JSON: {exc}", file=path)


def _chunks(path: Path, data: bytes, raws: list[msgspec.Raw]) -> Iterator[list[_EventLite]]:
    """The typed events, :data:`CHUNK_EVENTS` at a time (a list per chunk: no per-event generator step)."""
    for lo in range(0, len(raws), CHUNK_EVENTS):
        try:
            yield _CHUNK_DECODER.decode(_json_array(raws, lo))
        except msgspec.ValidationError:
            _strict_failure(path, data, raws, lo - lo % ERROR_CHUNK_EVENTS)
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise _syntax_error(path, data, exc) from None


def _json_array(raws: list[msgspec.Raw], lo: int) -> bytes:
    """The events ``lo`` to ``lo + CHUNK_EVENTS`` as the text of one JSON array, copied once (the brackets
    go onto the first and last events' texts: ~12 ms less per first load of the v100 trace than adding
    them to the joined text)."""
    part: list[Any] = raws[lo : lo + CHUNK_EVENTS]
    part[0] = b"[" + bytes(part[0])
    part[-1] = bytes(part[-1]) + b"]"
    return b",".join(part)


def _strict_failure(path: Path, data: bytes, raws: list[msgspec.Raw], lo: int) -> NoReturn:
    """Decode the :data:`ERROR_CHUNK_EVENTS` events at event ``lo`` with every field typed and raise their first
    error (the one a fully typed decode meets first), as a one-line :class:`CosimInputError`."""
    try:
        _STRICT_DECODER.decode(b"[" + b",".join(raws[lo : lo + ERROR_CHUNK_EVENTS]) + b"]")
    except msgspec.ValidationError as exc:
        raise _validation_error(path, data, exc, offset=lo) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise _syntax_error(path, data, exc) from None
    raise CosimInputError("an event's args do not decode", file=path, path=f"traceEvents[{lo}:]")


class _FlowEvent(msgspec.Struct, gc=False):
    """The fields of a ``traceEvents`` element that a flow event's end needs (see :func:`read_flows`)."""

    ph: str | None = None
    cat: str | None = None
    ts: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    id: Any = None


class _FlowDoc(msgspec.Struct, gc=False):
    traceEvents: list[_FlowEvent]


_FLOW_DECODER = msgspec.json.Decoder(_FlowDoc | list[_FlowEvent])


def read_flows(path: Path) -> tuple[dict[Any, tuple], dict[Any, tuple]]:
    """The ends of the ``ac2g`` / ``async_cpu_to_gpu`` flow events, by flow id: (starts, finishes), each
    (pid, tid, ts) as read, the last event of an id winning.

    Only a trace with GPU ops that no runtime call's ``correlation`` links to needs them (of the shared
    traces, the DLRM job's ranks), so :func:`read_kineto` does not collect them in its per-event loop (a third of
    the events of a trace are flows: ~20 ms of that loop on the v100 trace, and the maps' memory) but
    reads them here, when the table building asks, in a second pass over the file (gunzip and one
    typed decode of five fields an event). The first pass has checked every field this one reads."""
    try:
        doc = _FLOW_DECODER.decode(_read_bytes(path))
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise CosimInputError(f"the trace changed while it was read ({exc})", file=path) from None
    flow_s: dict[Any, tuple] = {}
    flow_f: dict[Any, tuple] = {}
    for e in doc if isinstance(doc, list) else doc.traceEvents:
        ph = e.ph
        if (ph == "s" or ph == "f") and e.cat in FLOW_CATS:
            fid = e.id
            if isinstance(fid, (list, dict)):
                fid = _dumps(fid)
            (flow_s if ph == "s" else flow_f)[fid] = (e.pid, e.tid, e.ts)
    return flow_s, flow_f


_NO_DIM3 = (-1, -1, -1)
_LIM31 = 1 << 31
_LIM15 = 1 << 15
_LIM63 = 1 << 63


def _json_list(raw: bytes, fail: Callable[[int], NoReturn], k: int) -> list[Any] | None:
    """The array (or null) of a raw ``Input Dims`` / ``Input type`` of event ``k``; anything else raises
    the error a typed decode of the event's chunk reports."""
    try:
        v: list[Any] | None = _LIST_DECODER.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError):
        fail(k)
    return v


def _dims_text(
    raw: bytes, memo: dict[bytes, tuple[str, str] | None], fail: Callable[[int], NoReturn], k: int
) -> tuple[str, str] | None:
    """An ``Input Dims`` text (event ``k``'s) as (its value's key, the text to intern), None for null; kept in
    ``memo``. The key is Python's repr of the lists (valid JSON for lists of ints), the text that repr unless
    it holds a quote (then JSON)."""
    dims = _json_list(raw, fail, k)
    kt = None
    if dims is not None:
        key = str(dims)
        kt = (key, key if "'" not in key else _dumps(dims))
    memo[raw] = kt
    return kt


def _dim3(x: Any) -> tuple[int, int, int]:
    if x is None:
        return _NO_DIM3
    if type(x) is list and len(x) == 3:
        a, b, c = x
        if type(a) is int and type(b) is int and type(c) is int and 0 <= a < _LIM31 and 0 <= b < _LIM31 \
                and 0 <= c < _LIM31:
            return (a, b, c)
        return (as_int(a, bits=32), as_int(b, bits=32), as_int(c, bits=32))
    if isinstance(x, list) and len(x) == 3:
        return (as_int(x[0], bits=32), as_int(x[1], bits=32), as_int(x[2], bits=32))
    return (-1, -1, -1)


def _concrete_id(raw: msgspec.Raw, ids: dict[bytes, int], st: StringTable) -> int:
    """String id of an op's ``Concrete Inputs`` (the values of its scalar arguments, as strings: a
    reduction's ``dim`` and ``keepdim``, a softmax's ``dim``, a layer norm's ``normalized_shape``), kept as
    JSON text for ``host_ops.concrete_inputs``; -1 when it is not an array of strings. Decoded once per
    distinct text."""
    k = bytes(raw)
    i = ids.get(k)
    if i is None:
        try:
            v = _ANY_DECODER.decode(k)
        except msgspec.DecodeError:
            v = None
        ok = isinstance(v, list) and any(x for x in v) and all(isinstance(x, str) for x in v)
        i = ids[k] = st(_dumps(v)) if ok else -1
    return i


_NO_ARGS = _ArgsLite()
#: Fields of a host row and of a GPU row (see :func:`read_kineto`; the last: the event's index in ``traceEvents``).
_HOST_FIELDS = 14
_GPU_FIELDS = 15


def read_kineto(path: str | Path, *, time_unit: str | None = None) -> RankGraph:
    """Read one Kineto trace file into a :class:`RankGraph`.

    ``time_unit`` ("us" or "ns") overrides the detection of the timestamp unit.
    Chrome traces store ``ts``/``dur`` in microseconds (Kineto's ns-resolution
    traces, ``displayTimeUnit: "ns"``, still do, with 3 decimals); timestamps
    larger than 1e17 can only be nanoseconds since the epoch and are read as ns.
    Raises :class:`CosimInputError` (one line: file, event, problem) on a trace that
    cannot be trusted; see :func:`check_events`.
    """
    path = Path(path)
    meta, chunks, fail, comm_args = decode_trace_chunks(path)
    st = StringTable()
    host: list[tuple] = []
    gpu: list[tuple] = []
    syncs: dict[int, tuple] = {}
    thread_names: dict[tuple[Any, Any], str] = {}
    dims_ids: dict[str, int] = {}
    dims_raw: dict[bytes, int] = {}  # raw Input Dims text -> string id (-1: null)
    texts = text_memos()  # raw texts -> values, shared by the ranks of a load
    types_raw = texts.types  # raw Input type text -> its value (checked once)
    dims_text = texts.dims
    types_ids: dict[bytes, int] = {}
    concrete_ids: dict[bytes, int] = {}  # raw Concrete Inputs text -> string id (see _concrete_id)
    dim3_of = texts.dim3  # raw grid / block text -> its triple (decoded once)
    host_cats: dict[str | None, int] = {c: int(k) for c, k in HOST_CATS.items()}
    gpu_cats: dict[str | None, int] = {c: int(k) for c, k in GPU_CATS.items()}
    no_args, memcpy, sid_of, intern = _NO_ARGS, int(GpuKind.MEMCPY), st.ids.get, st

    base = 0
    for chunk in chunks:
        for k, e in enumerate(chunk, base):
            ph = e.ph
            if ph == "X":
                cat = e.cat
                hk = host_cats.get(cat)
                if hk is not None:
                    a = e.args or no_args
                    name = e.name
                    tr = a.input_type
                    if tr:  # checked on every event, as a typed decode would
                        tk = bytes(tr)
                        if tk not in types_raw:
                            types_raw[tk] = _json_list(tk, fail, k)
                    dr = a.input_dims
                    did = tid_ = -1
                    if dr:
                        dk = bytes(dr)
                        d_id = dims_raw.get(dk)
                        if d_id is None:
                            kt = dims_text[dk] if dk in dims_text else _dims_text(dk, dims_text, fail, k)
                            d_id = -1
                            if kt is not None:
                                d_id = dims_ids.get(kt[0])
                                if d_id is None:
                                    d_id = dims_ids[kt[0]] = st(kt[1])
                            dims_raw[dk] = d_id
                        did = d_id
                        if did >= 0 and tr and types_raw[tk] is not None:
                            tid_ = types_ids.get(tk, -1)
                            if tid_ < 0:
                                tid_ = types_ids[tk] = st(_dumps(types_raw[tk]))
                    comm = None
                    if name == "record_param_comms" or a.coll_name is not None:
                        comm = comm_args(k)
                    host.append(
                        (
                            e.pid,
                            e.tid,
                            e.ts,
                            e.dur,
                            (sid_of(name) or intern(name)) if name is not None else -1,
                            hk,
                            -1 if (x := a.external_id) is None else x,
                            -1 if (x := a.rf_id) is None else x,
                            -1 if (x := a.correlation) is None else x,
                            did,
                            tid_,
                            comm,
                            -1 if not (cr := a.concrete) else (
                                ci if (ci := concrete_ids.get(bytes(cr))) is not None
                                else _concrete_id(cr, concrete_ids, st)),
                            k,
                        )
                    )
                    continue
                gk = gpu_cats.get(cat)
                if gk is not None:
                    a = e.args or no_args
                    name = e.name
                    gpu.append(
                        (
                            # as_int(x, 0, bits): a plain int in range as it is, anything else through as_int
                            dv
                            if type(dv := a.device if a.device is not None else e.pid) is int and -_LIM15 <= dv < _LIM15
                            else as_int(dv, 0, bits=16),
                            sv
                            if type(sv := a.stream if a.stream is not None else e.tid) is int and -_LIM63 <= sv < _LIM63
                            else as_int(sv, 0),
                            e.ts,
                            e.dur,
                            (sid_of(name) or intern(name)) if name is not None else -1,
                            gk,
                            -1 if (x := a.correlation) is None else x,
                            -1 if (x := a.external_id) is None else x,
                            _NO_DIM3 if not (gx := a.grid) else (
                                dim3_of.get(xk := bytes(gx)) or dim3_of.setdefault(xk, _dim3(_ANY_DECODER.decode(xk)))),
                            _NO_DIM3 if not (gx := a.block) else (
                                dim3_of.get(xk := bytes(gx)) or dim3_of.setdefault(xk, _dim3(_ANY_DECODER.decode(xk)))),
                            a.bytes,
                            int(copy_kind(name or "", a.kind)) if gk == memcpy else 0,
                            e.pid,
                            e.tid,
                            k,
                        )
                    )
                    continue
                if cat == "cuda_sync":
                    a = e.args or no_args
                    c = as_int(a.correlation)
                    if c >= 0:
                        syncs[c] = (
                            e.name if e.name is not None else (a.cuda_sync_kind or ""),
                            as_int(a.wait_on_stream),
                            as_int(a.wait_on_cuda_event_record_corr_id),
                            as_int(a.stream),
                            as_int(a.device),
                        )
            elif ph == "M":
                if e.name == "thread_name":
                    thread_names[(e.pid, e.tid)] = str((e.args or no_args).name or "")
        base += len(chunk)

    # the file's bytes and raw events go with the decoder and its error path: error messages re-read them
    del chunks, fail, comm_args
    chunk = []
    # rows -> columns once, in C (zip): the checks and the table building read columns
    hcols: list[tuple] = list(zip(*host)) if host else [()] * _HOST_FIELDS
    gcols: list[tuple] = list(zip(*gpu)) if gpu else [()] * _GPU_FIELDS
    h_idx, g_idx = hcols[-1], gcols[-1]  # each row's event index (the rows' last field)
    arrays: dict[tuple[str, int], np.ndarray] = {}  # columns the checks convert, reused by the tables
    warnings = check_events(path, host, gpu, h_idx, g_idx, time_unit, hcols, gcols, arrays)
    rg = build_rank(
        path, meta, st, host, gpu, syncs, lambda: read_flows(path), thread_names, time_unit, hcols, gcols, arrays
    )
    warnings += _suspicious(path, rg)
    if warnings:
        rg.source["warnings"] = warnings
    return rg


def _missing_field_error(path: Path, k: int, field: str, n_missing: int, n_total: int) -> CosimInputError:
    ev = _generic_event(path, k)
    label = _event_label(k, ev)
    if n_missing == n_total and isinstance(ev, dict):
        have = ", ".join(sorted(map(str, ev)))
        return CosimInputError(
            f"no event has {field!r}: not the Kineto schema this importer reads (expected fields "
            f"{', '.join(KINETO_EVENT_FIELDS)}; this event has {have})",
            file=path,
            path=label,
        )
    more = f" ({n_missing} of {n_total} host/GPU events lack it)" if n_missing > 1 else ""
    return CosimInputError(f"no {field!r} field: a complete event needs ts, dur and name{more}", file=path, path=label)


def check_events(
    path: Path,
    host: list[tuple],
    gpu: list[tuple],
    h_idx: Sequence[int],
    g_idx: Sequence[int],
    time_unit: str | None,
    hcols: list[tuple] | None = None,
    gcols: list[tuple] | None = None,
    arrays: dict[tuple[str, int], np.ndarray] | None = None,
) -> list[str]:
    """Semantic checks of the host and GPU events, vectorized: required fields, finite and
    non-negative ``ts``, finite non-negative ``dur`` no longer than the trace's span.

    Raises :class:`CosimInputError` on the first (lowest-index) bad event; returns warnings. The
    numeric columns it converts (``ts``, ``dur`` and the integer ids) go into ``arrays``, keyed by
    ("h" or "g", column), for the table building.
    """
    if hcols is None:
        hcols = list(zip(*host)) if host else [()] * _HOST_FIELDS
    if gcols is None:
        gcols = list(zip(*gpu)) if gpu else [()] * _GPU_FIELDS
    n = len(host) + len(gpu)
    if n == 0:
        raise CosimInputError(
            "no host or GPU events: nothing to replay (expected complete events, ph 'X', with cat cpu_op, "
            "user_annotation, cuda_runtime, cuda_driver, kernel, gpu_memcpy or gpu_memset)",
            file=path,
        )
    if not host:
        raise CosimInputError(
            f"{len(gpu)} GPU events and no host events: the GPU ops' launches cannot be replayed (expected "
            "complete events, ph 'X', with cat cpu_op, user_annotation, cuda_runtime or cuda_driver too)",
            file=path,
        )
    h_ts, g_ts = col(hcols[2], np.float64), col(gcols[2], np.float64)  # None (missing) -> NaN
    h_dur, g_dur = col(hcols[3], np.float64), col(gcols[3], np.float64)
    ts, dur = np.concatenate([h_ts, g_ts]), np.concatenate([h_dur, g_dur])
    names = col(hcols[4] + gcols[4], np.int64)
    if arrays is not None:
        arrays.update({("h", 2): h_ts, ("g", 2): g_ts, ("h", 3): h_dur, ("g", 3): g_dur})

    def event_index() -> np.ndarray:  # each row's event index (error paths only: ~5 ms on the v100 trace)
        return np.fromiter(itertools.chain(h_idx, g_idx), np.int64, n)

    def first(mask: np.ndarray) -> int:
        return int(np.argmin(np.where(mask, event_index(), np.iinfo(np.int64).max)))

    for field, bad in (("name", names < 0), ("ts", np.isnan(ts)), ("dur", np.isnan(dur))):
        if bad.any():
            raise _missing_field_error(path, int(event_index()[first(bad)]), field, int(bad.sum()), n)

    _check_int_ranges(path, hcols, gcols, h_idx, g_idx, arrays)

    def fail(mask: np.ndarray, problem: str) -> None:
        j = first(mask)
        k = int(event_index()[j])
        raise CosimInputError(
            problem.format(ts=ts[j], dur=dur[j]), file=path, path=_event_label(k, _generic_event(path, k))
        )

    if np.isinf(ts).any():
        fail(np.isinf(ts), "ts {ts} is not a finite time")
    if np.isinf(dur).any():
        fail(np.isinf(dur), "dur {dur} is not a finite duration")
    if (ts < 0).any():
        fail(ts < 0, "negative timestamp ts={ts:g}")
    if (dur < 0).any():
        fail(dur < 0, "negative duration dur={dur:g}")
    scale = detect_scale(float(ts.max()), time_unit)
    span = float(ts.max() - ts.min())
    limit = SPAN_FACTOR * span + 1.0 / scale
    too_long = dur > limit
    if too_long.any():
        fail(
            too_long,
            f"dur={{dur:g}} is longer than the trace itself (its events start within {span * scale:.6g} s; "
            f"a duration may be at most {SPAN_FACTOR:g}x that + 1 s)",
        )
    return []


_I64 = (-(1 << 63), 1 << 63)
#: (rows, column, name, [lo, hi)) of the integer fields that land in fixed-width columns.
_INT_FIELDS = (
    ("host", 6, "args.External id", _I64),
    ("host", 7, "args.Record function id", _I64),
    ("host", 8, "args.correlation", _I64),
    ("gpu", 0, "args.device", (0, 1 << 15)),
    ("gpu", 1, "args.stream", _I64),
    ("gpu", 6, "args.correlation", _I64),
    ("gpu", 7, "args.External id", _I64),
)


def _check_int_ranges(
    path: Path,
    hcols: list[tuple],
    gcols: list[tuple],
    h_idx: Sequence[int],
    g_idx: Sequence[int],
    arrays: dict[tuple[str, int], np.ndarray] | None = None,
) -> None:
    """Integer ids that do not fit their column (a device beyond 32767, an id beyond 64 bits) are refused.
    The columns, as int64 arrays, go into ``arrays`` (key: "h" or "g", column)."""
    cols = {"host": (hcols, h_idx), "gpu": (gcols, g_idx)}
    for which, c, field, (lo, hi) in _INT_FIELDS:
        cs, idx = cols[which]
        vals = cs[c]
        if not vals:
            continue
        try:
            arr = np.fromiter(vals, np.int64, len(vals))
        except OverflowError:  # beyond 64 bits: found below
            j = next(j for j, v in enumerate(vals) if not lo <= v < hi)
        else:
            bad = None if (lo, hi) == _I64 else (arr < lo) | (arr >= hi)
            if bad is None or not bad.any():
                if arrays is not None:
                    arrays[(which[0], c)] = arr
                continue
            j = int(np.flatnonzero(bad)[0])
        k = idx[j]
        raise CosimInputError(
            f"{field} {vals[j]} is out of range [{lo}, {hi})", file=path, path=_event_label(k, _generic_event(path, k))
        )


def _suspicious(path: Path, rg: RankGraph) -> list[str]:
    """Warnings for a usable but suspicious trace (computed on the built tables)."""
    out: list[str] = []
    g, steps = rg.gpu_ops, rg.steps
    if len(g) and len(steps) and steps.host_op[0] >= 0:
        outside = int((g.step < 0).sum())
        if outside:
            out.append(f"{path}: {outside} of {len(g)} GPU ops lie outside every ProfilerStep (left out of step times)")
    if len(g):
        no_corr = int((g.correlation < 0).sum())
        if 0 < no_corr < len(g):  # a field dropped from some events only
            out.append(
                f"{path}: {no_corr} of {len(g)} GPU ops have no 'correlation' arg and no flow event: their launch "
                "call is unknown (replay starts them after their stream predecessor)"
            )
    return out
