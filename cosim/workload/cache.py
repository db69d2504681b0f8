"""The load cache: execution graphs of traces already imported, as ``.npz`` files keyed by content.

:func:`cosim.workload.load_trace` looks here before parsing a trace. The key is a SHA-256 of
the bytes of every input file (with its resolved path, so ``source["file"]`` stays true),
the ``time_unit`` override, the execution-graph schema version and the source code of the
importer modules (a changed importer never reads an older importer's graph). An entry is an
uncompressed ``.npz`` of :meth:`ExecutionGraph.npz_arrays` (``numpy.load`` reads it), written
atomically, with an index: a ``cosim_index`` member (JSON: each array's byte offset in the file,
dtype and shape) named by the zip comment. Reading an entry is then one copy-on-write map of the file (one
read where it cannot be mapped) and a ``numpy.frombuffer`` view per array, instead of ``numpy.load``'s member-by-member reading (about
60 us per array: 40 ms for the ~700 arrays of an 8-rank graph); an entry without an index is read
by ``numpy.load``. An entry read before in the process, still the same file, is not read again (:data:`_ENTRIES`). One that cannot be read (corrupt, truncated, another schema) is ignored,
removed and rebuilt. The newest :data:`MAX_ENTRIES` entries are kept.

Where: ``$COSIM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/cosim``, else ``~/.cache/cosim``;
``COSIM_CACHE_DIR=off`` (or ``none``, ``0``, empty) turns the cache off. A folder that cannot be
written is skipped silently: caching only ever saves time.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import mmap
import operator
import os
import stat
import struct
import threading
import time
import zlib
from functools import cache
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from cosim.workload.graph import SCHEMA_VERSION, TABLE_SCHEMAS, ExecutionGraph, RankGraph, Table, gc_paused

__all__ = ["cache_dir", "cache_key", "file_digest", "load_cached", "read_entry", "store", "write_entry"]

#: Entries kept in the cache folder; older ones are removed when a new one is written.
MAX_ENTRIES = 256
_OFF = {"", "0", "off", "none", "false", "no"}
_IMPORTER_MODULES = (
    "cache.py",
    "classify.py",
    "cost.py",
    "deps.py",
    "et.py",
    "graph.py",
    "jsonstream.py",
    "kineto.py",
    "kineto_collectives.py",
    "kineto_common.py",
    "kineto_tables.py",
    "load.py",
)


def cache_dir() -> Path | None:
    """The cache folder (see the module docstring), or None when the cache is off."""
    env = os.environ.get("COSIM_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cosim"


@cache
def _code_digest() -> bytes:
    h = hashlib.sha256(SCHEMA_VERSION.encode())
    here = Path(__file__).parent
    for name in _IMPORTER_MODULES:
        p = here / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.digest()


_DIGESTS: dict[tuple[str, int, int, int, int, int], bytes] = {}
"""SHA-256 of files hashed in this process, by (path, device, inode, size, modification and change times in ns)."""
_DIGESTS_KEPT = 4096
_RACY_NS = 2_000_000_000
"""A file changed less than this long ago is hashed on every load (its times may not yet tell a second write
within the file system's timestamp granularity, a few ms, from the first: git's "racily clean" rule)."""


def file_digest(f: Path | str) -> bytes:
    """SHA-256 of the bytes of ``f``, remembered for the process while the file's identity and times are those
    it was hashed with: a write changes its change time (``st_ctime_ns``, which no program can set back), so a
    file changed since is hashed again; repeated loads of one trace (a sweep, a calibration, the API in a loop)
    hash it once. A file changed within the last :data:`_RACY_NS` is always hashed."""
    return _real_digest(os.path.realpath(f))


def _real_digest(path: str) -> bytes:
    """:func:`file_digest` of ``path``, a real path (no symbolic link in it, as :func:`os.path.realpath`
    gives)."""
    st = os.stat(path)
    key = (path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    d = _DIGESTS.get(key)
    if d is None:
        with open(path, "rb") as fh:
            d = (hashlib.file_digest(fh, "sha256").digest() if hasattr(hashlib, "file_digest")
                 else hashlib.sha256(fh.read()).digest())
        if time.time_ns() - st.st_ctime_ns < _RACY_NS or os.stat(path).st_ctime_ns != st.st_ctime_ns:
            return d  # changed within the file system's timestamp granularity, or while hashed: not remembered
        if len(_DIGESTS) >= _DIGESTS_KEPT:
            del _DIGESTS[next(iter(_DIGESTS))]
        _DIGESTS[key] = d
    return d


def cache_key(files: list[Path], time_unit: str | None) -> str:
    """Hex digest naming the cache entry of ``files`` loaded with ``time_unit`` (each file's bytes hashed by
    :func:`file_digest`)."""
    h = hashlib.sha256(_code_digest())
    h.update(repr(time_unit).encode())
    real_dirs: dict[str, str] = {}
    for f in files:
        path = _realpath(f, real_dirs)
        h.update(path.encode() + b"\0")
        h.update(_real_digest(path))
    return h.hexdigest()[:40]


def _realpath(f: Path | str, real_dirs: dict[str, str]) -> str:
    """:func:`os.path.realpath` of ``f`` (Path.resolve's result, without its per-call objects), its folder's
    resolved once per folder in ``real_dirs``: a file that is not a symbolic link is its real folder's entry of
    the same name (one ``lstat`` instead of one per path component; the files of a multi-rank trace share a
    folder)."""
    p = os.fspath(f)
    if not os.path.isabs(p):
        p = os.path.join(os.getcwd(), p)
    head, name = os.path.split(p)
    if not name or name in (".", "..") or ".." in p.split(os.sep) or os.path.islink(p):
        return os.path.realpath(f)  # ".." after a link is resolved from the link's target
    real = real_dirs.get(head)
    if real is None:
        real = real_dirs[head] = os.path.realpath(head)
    return os.path.join(real, name)


def _entry(key: str) -> Path | None:
    d = cache_dir()
    return None if d is None else d / f"graph-{key}.npz"


def load_cached(key: str) -> ExecutionGraph | None:
    """The cached graph for ``key``, or None (no entry, cache off, or an unreadable entry, which is removed).
    An entry read before in this process, still the same file (:data:`_ENTRIES`), is not read again: the new
    graph's tables are views of the arrays it was read into."""
    p = _entry(key)
    if p is None:
        return None
    try:
        st = os.stat(p)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    ident = (str(p), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
    try:
        with gc_paused():  # the index and the tables are ~2,000 containers a job: no collection walks the process
            hit = _remembered(ident)
            if hit is None:
                arrays = _read_arrays(p)
                if arrays is None:  # an entry without an index
                    return _read_npz(p)
                hit = _remember(ident, arrays)
            return _graph(hit[0], hit[1], p, key, hit[2])
    except Exception:  # a corrupt or foreign entry: forget it, the caller rebuilds
        try:
            p.unlink()
        except OSError:
            pass
        return None


_Stored = tuple[list[np.ndarray], list[Any], list[Any]]
"""A rank's stored arrays in :meth:`RankGraph._arrays`' order, their shapes and dtypes (what its origin records:
:meth:`ExecutionGraph.set_origin_known`)."""

_Plan = tuple[str, str, tuple[tuple[tuple[tuple[str, int, dict[str, np.ndarray]], ...], tuple[str, ...]], ...],
              tuple[_Stored, ...]]
"""How to build an entry's graph again without reading its index (:func:`_plan_of`): (the entry's ``meta`` JSON
text, the graph's schema version, per rank (per table (name, rows, its stored arrays by name), the string
table), per rank its :data:`_Stored`)."""

_Hit = tuple[dict[str, np.ndarray], set[str], list[_Plan | None]]
"""A remembered entry (:data:`_ENTRIES`): its arrays, their names, and a one-item list holding its :data:`_Plan`
once one graph was built from it (None before, and for an entry whose graph converted an array)."""

_ENTRIES: dict[tuple[str, int, int, int, int], tuple[int, dict[str, np.ndarray], set[str], list[_Plan | None]]] = {}
"""Entries read in this process, by (path, device, inode, size, modification time in ns), least recently read
first: (bytes mapped, the entry's arrays, their names, its plan (:data:`_Hit`)). The arrays are read-only views of the entry's map that
cannot be made writeable (:func:`read_entry`), so graphs built from them share them safely: a column edited in one
graph is replaced there by an edited copy. A rewritten or replaced entry file has another identity and is read
again. Repeated loads of one trace in a process (a sweep, a calibration, the API in a loop) map and index it once:
the 8-rank DLRM job's 681 arrays took ~0.6 ms to index and view, and each new map's pages faulted in again as
the replay first read them."""
_ENTRIES_KEPT = 8
"""Entries :data:`_ENTRIES` keeps, at most."""
_ENTRIES_BYTES = 1 << 28
"""Mapped bytes of the entries :data:`_ENTRIES` keeps, at most (file pages, shared with the page cache); a larger
entry is read at every load."""
_ENTRIES_LOCK = threading.Lock()
"""Held while :data:`_ENTRIES` is read or changed."""


def _remembered(ident: tuple[str, int, int, int, int]) -> _Hit | None:
    """The entry ``ident`` read before in this process (:data:`_Hit`), now the most recently read; None if none."""
    with _ENTRIES_LOCK:
        hit = _ENTRIES.pop(ident, None)
        if hit is None:
            return None
        _ENTRIES[ident] = hit
    return hit[1], hit[2], hit[3]


def _remember(ident: tuple[str, int, int, int, int], arrays: dict[str, np.ndarray]) -> _Hit:
    """Keep ``arrays`` (of entry ``ident``) in :data:`_ENTRIES`, forgetting the least recently read entries until at
    most :data:`_ENTRIES_KEPT` entries of :data:`_ENTRIES_BYTES` mapped bytes remain with it; returns it as a
    :data:`_Hit` (no plan yet)."""
    size = ident[3]
    hit: _Hit = (arrays, set(arrays), [None])
    if size > _ENTRIES_BYTES:
        return hit
    with _ENTRIES_LOCK:
        _ENTRIES.pop(ident, None)
        held = size + sum(v[0] for v in _ENTRIES.values())
        for old in list(_ENTRIES):
            if len(_ENTRIES) < _ENTRIES_KEPT and held <= _ENTRIES_BYTES:
                break
            held -= _ENTRIES.pop(old)[0]
        _ENTRIES[ident] = (size, *hit)
    return hit


def _graph(arrays: dict[str, np.ndarray], names: set[str], path: Path, key: str | None,
           plan: list[_Plan | None] | None = None) -> ExecutionGraph:
    """The graph of an entry's ``arrays`` (``names``: their names; read from ``path``), each rank recording ``key``
    as its origin. ``plan``: the remembered entry's :data:`_Plan` slot: the graph is built from the plan when it
    holds one, else read by :meth:`ExecutionGraph.from_arrays` and its plan kept there."""
    if plan is not None and plan[0] is not None and _intact(plan[0][3]):
        g = _from_plan(plan[0])
        if key is not None:
            g.set_origin_known(key, plan[0][3])
        return g
    g = ExecutionGraph.from_arrays(arrays, names, path)
    if plan is not None:
        plan[0] = _plan_of(g, arrays)
    if key is not None:
        g.set_origin(key)
    return g


def _plan_of(g: ExecutionGraph, arrays: dict[str, np.ndarray]) -> _Plan | None:
    """The :data:`_Plan` of ``g``, just read from an entry's ``arrays`` by :meth:`ExecutionGraph.from_arrays`; None
    where a table converted an array (a writeable one: an older entry's column, filled or cast), which graphs must
    not share."""
    ranks = []
    stored = []
    for rg in g.ranks:
        tables = tuple((t, len(tab), tab.columns()) for t in TABLE_SCHEMAS for tab in (getattr(rg, t),))
        if any(a.flags.writeable for _, _, cols in tables for a in cols.values()):
            return None
        ranks.append((tables, tuple(rg.strings)))
        held = [a for _, _, cols in tables for a in cols.values()]
        stored.append((held, [a.shape for a in held], [a.dtype for a in held]))
    return bytes(arrays["meta"]).decode(), g.schema_version, tuple(ranks), tuple(stored)


_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def _intact(stored: tuple[_Stored, ...]) -> bool:
    """Whether every array of a plan still has the shape and dtype it was read with: the arrays are shared by the
    graphs built from the plan, and a caller may have reshaped one in place (``a.shape = ...``), which the plan's
    unchecked tables (:meth:`Table._kept`) would pass on; the graph is then read again (its tables make views of the
    entry's shape). ~85 attribute reads a rank."""
    return all(list(map(_SHAPE, held)) == shapes and list(map(_DTYPE, held)) == dtypes
               for held, shapes, dtypes in stored)


def _from_plan(plan: _Plan) -> ExecutionGraph:
    """The graph :meth:`ExecutionGraph.from_arrays` reads from the entry of ``plan``, the same tables of the same
    arrays (each kept as it is, as there, unchecked: :meth:`Table._kept`) and equal fields,
    without looking the ~680 arrays of an 8-rank entry up by name or decoding its string tables again (~0.17 ms of
    a cached DLRM job's ~0.85 ms load); the meta JSON is parsed again (each rank's ``source`` a new dict)."""
    text, version, per_rank, _ = plan
    ranks = [
        RankGraph(
            rank=rm["rank"],
            world_size=rm["world_size"],
            device_name=rm["device_name"],
            strings=list(strings),
            time_origin=rm.get("time_origin", 0.0),
            source=rm.get("source", {}),
            **_tables(tables),
        )
        for rm, (tables, strings) in zip(json.loads(text)["ranks"], per_rank)
    ]
    return ExecutionGraph(ranks, schema_version=version)


def _tables(tables: tuple[tuple[str, int, dict[str, np.ndarray]], ...]) -> dict[str, Any]:
    """New :class:`Table` objects of a plan's rank (the keyword arguments of :class:`RankGraph`)."""
    return {t: Table._kept(t, n, cols) for t, n, cols in tables}


def store(key: str, graph: ExecutionGraph) -> None:
    """Write ``graph`` as the entry for ``key`` (atomically); any failure to write is ignored."""
    p = _entry(key)
    if p is None:
        return
    try:
        write_entry(p, graph)
        _prune(p.parent)
    except Exception:  # a read-only or full disk: caching is only an optimisation
        pass


def _prune(d: Path) -> None:
    """Keep the newest :data:`MAX_ENTRIES` entries (least recently written go first)."""
    entries = list(d.glob("graph-*.npz"))
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda f: f.stat().st_mtime)
    for f in entries[: len(entries) - MAX_ENTRIES]:
        f.unlink(missing_ok=True)


_INDEX = "cosim_index"
_COMMENT = b"cosim-index "


def _npy_header(arr: np.ndarray) -> bytes:
    """The ``.npy`` header ``numpy.save`` writes before ``arr``'s data (format 1.0, else 2.0 when too long)."""
    d = np.lib.format.header_data_from_array_1_0(arr)
    hb = io.BytesIO()
    try:
        np.lib.format.write_array_header_1_0(hb, d)
    except ValueError:
        hb = io.BytesIO()
        np.lib.format.write_array_header_2_0(hb, d)
    return hb.getvalue()


_NPY_GROWTH = 21  # numpy.lib.format.GROWTH_AXIS_MAX_DIGITS: room to grow the first axis in place


def _npy_header_fast(arr: np.ndarray, descr: str) -> bytes:
    """:func:`_npy_header` of a C-contiguous array of a simple dtype (``descr``: its ``dtype.str``),
    formatted here (the same bytes: tests/test_load_cache.py) instead of by numpy's ~7 us of Python."""
    shape = arr.shape
    text = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape!r}, }}"
    if shape:
        text += " " * (_NPY_GROWTH - len(repr(shape[0])))
    hlen = len(text) + 1
    pad = -(10 + hlen) % 64
    if hlen + pad > 0xFFFF:
        return _npy_header(arr)
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", hlen + pad) + text.encode("latin1") + b" " * pad + b"\n"


_SIMPLE = frozenset("biuf")  # dtype kinds whose ``dtype.str`` is numpy's ``descr`` (no fields, no subarray)
_FF = 0xFFFFFFFF
_ZIP64_FROM = _FF  # sizes and offsets from here on go into zip64 fields (lower in a test)


def _dos_time() -> tuple[int, int]:
    """Now as a zip member's (time, date) fields, as :class:`zipfile.ZipInfo` sets them."""
    t = time.localtime()
    return ((t.tm_hour << 11) | (t.tm_min << 5) | (t.tm_sec // 2),
            ((max(t.tm_year, 1980) - 1980) << 9) | (t.tm_mon << 5) | t.tm_mday)


def write_entry(path: Path, graph: ExecutionGraph) -> None:
    """Write ``graph`` as an indexed, uncompressed ``.npz`` (module docstring), atomically. The zip
    structure is written here, front to back: per member a local header holding its size and CRC, the
    ``.npy`` header and the array's bytes straight from the array (no copy of the entry in memory), then
    the central directory (zip64 records where a size, an offset or the member count needs them).
    :mod:`zipfile`'s per-member Python was most of the ~12 ms of writing the DLRM job's ~700 members."""
    from cosim.fileio import atomic_open

    arrays = {k: np.ascontiguousarray(a) for k, a in graph.npz_arrays().items()}
    dtime, ddate = _dos_time()
    central: list[bytes] = []
    pos = 0
    with atomic_open(path, "wb", gz=False) as out:
        write = out.write

        def member(name: str, arr: np.ndarray) -> int:
            """Write ``arr`` as member ``name``.npy; the byte offset of its data in the file."""
            nonlocal pos
            dt = arr.dtype
            if dt.hasobject:
                raise ValueError(f"{name}: object arrays are not cached")
            head = _npy_header_fast(arr, dt.str) if dt.kind in _SIMPLE and not dt.fields else _npy_header(arr)
            body = arr.reshape(-1).view(np.uint8).data if arr.size else b""
            size = len(head) + arr.nbytes
            crc = zlib.crc32(body, zlib.crc32(head))
            fname = (name + ".npy").encode()
            big = size >= _ZIP64_FROM
            extra = struct.pack("<HHQQ", 1, 16, size, size) if big else b""
            need = 45 if big else 20
            s32 = _FF if big else size
            local = struct.pack("<IHHHHHIIIHH", 0x04034B50, need, 0, 0, dtime, ddate, crc, s32, s32,
                                len(fname), len(extra))
            write(local + fname + extra + head)
            at = pos + len(local) + len(fname) + len(extra) + len(head)
            if arr.size:
                write(body)
            cx = [size, size] if big else []
            if pos >= _ZIP64_FROM:
                cx.append(pos)
            cextra = struct.pack("<HH" + "Q" * len(cx), 1, 8 * len(cx), *cx) if cx else b""
            cneed = 45 if cx else 20
            central.append(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, (3 << 8) | cneed, cneed, 0, 0,
                                       dtime, ddate, crc, s32, s32, len(fname), len(cextra), 0, 0, 0,
                                       0o600 << 16, _FF if pos >= _ZIP64_FROM else pos) + fname + cextra)
            pos = at + arr.nbytes
            return at

        index = {name: [member(name, a), a.dtype.str, list(a.shape)] for name, a in arrays.items()}
        blob = np.frombuffer(json.dumps({"version": 1, "arrays": index}).encode(), np.uint8)
        at = member(_INDEX, blob)
        comment = _COMMENT + f"{at} {blob.size}".encode()
        cd = b"".join(central)
        n, cd_at = len(central), pos
        tail = b""
        z64 = n >= 0xFFFF or cd_at >= _ZIP64_FROM or len(cd) >= _ZIP64_FROM
        if z64:
            z64_at = cd_at + len(cd)
            tail = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(cd), cd_at)
            tail += struct.pack("<IIQI", 0x07064B50, 0, z64_at, 1)
        tail += struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF),
                            _FF if z64 else len(cd), _FF if z64 else cd_at, len(comment)) + comment
        write(cd + tail)


def _index(data: memoryview) -> dict[str, Any] | None:
    """The entry's index (module docstring), or None when the zip comment does not name one."""
    tail = max(0, len(data) - 22 - 64)
    eocd = bytes(data[tail:]).rfind(b"PK\x05\x06")
    eocd = eocd + tail if eocd >= 0 else -1
    if eocd < 0:
        return None
    (clen,) = struct.unpack_from("<H", data, eocd + 20)
    comment = bytes(data[eocd + 22 : eocd + 22 + clen])
    if not comment.startswith(_COMMENT):
        return None
    at, size = (int(x) for x in comment[len(_COMMENT) :].split())
    if at < 0 or at + size > len(data):
        raise ValueError("index past the end of the entry")
    index: dict[str, Any] = msgspec.json.decode(data[at : at + size])
    return index


def read_entry(path: Path, key: str | None = None) -> ExecutionGraph:
    """Read an entry written by :func:`write_entry`: the file mapped copy-on-write (``mmap.ACCESS_COPY``), every
    array a read-only view of the map that cannot be made writeable (a column is edited by assigning it, which
    replaces it by an edited copy: :class:`cosim.workload.graph.Table`); where the file cannot be mapped, one read
    into memory, read-only the same way. With ``key`` (the entry's :func:`cache_key`), each rank records it as its
    origin (:meth:`ExecutionGraph.set_origin`: the replay's program memo keys on it instead of the bytes). An
    ``.npz`` without an index is read by :meth:`ExecutionGraph.from_npz` (its arrays made read-only, no origin).
    Raises on a damaged entry.

    The map, and the file descriptor Python's :mod:`mmap` keeps with it, live as long as any of the graph's
    arrays: entries are replaced by a rename and removed by unlinking (:func:`store`, :func:`_prune`), which
    leave a mapped file's pages in place. Mapping instead of reading spares a fresh process-memory buffer (its
    pages zeroed by the kernel as they are first written: ~1.7 ms of the 8-rank DLRM job's 3.3 MB entry when
    the previous graph is still alive) and the copy."""
    arrays = _read_arrays(path)
    if arrays is None:
        return _read_npz(path)
    return _graph(arrays, set(arrays), path, key)


def _read_npz(path: Path) -> ExecutionGraph:
    """The graph of an entry without an index (``numpy.load``), its arrays read-only."""
    g = ExecutionGraph.from_npz(path)
    g.set_read_only()
    return g


def _read_arrays(path: Path) -> dict[str, np.ndarray] | None:
    """The arrays of the indexed entry at ``path`` by name, read-only views of its map (:func:`read_entry`); None
    when the entry has no index. Raises on a damaged entry."""
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        try:  # copy-on-write map of the file: its pages come from the page cache as they are read
            buf = np.frombuffer(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
        except (OSError, ValueError):  # no map (out of descriptors, an empty file): read into memory
            buf = np.empty(size, np.uint8)  # not zeroed first, as a bytearray is: the read fills it
            if fh.readinto(buf.data) != size:
                raise ValueError("short read") from None
    if buf.size != size:
        raise ValueError("short read")
    buf.flags.writeable = False  # every array a view that cannot be made writeable: the key names its bytes
    data = buf.data
    index = _index(data)
    if index is None or index.get("version") != 1:
        return None
    arrays: dict[str, np.ndarray] = {}
    dtypes: dict[str, np.dtype] = {}
    frombuffer = np.frombuffer
    for name, (off, dtype, shape) in index["arrays"].items():
        dt = dtypes.get(dtype)
        if dt is None:
            dt = dtypes[dtype] = np.dtype(dtype)
        count = shape[0] if len(shape) == 1 else math.prod(shape)
        if off < 0 or count < 0 or off + count * dt.itemsize > size:
            raise ValueError(f"array {name} past the end of the entry")
        a = frombuffer(data, dt, count, off)
        arrays[name] = a if len(shape) == 1 else a.reshape(shape)
    return arrays
