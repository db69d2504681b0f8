"""The load cache's indexed .npz entries (cosim.workload.cache): read back equal, read-only, still a plain .npz."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from cosim.workload import ExecutionGraph, cache, load_trace

DATA = Path(__file__).parent / "data" / "workload"


def _same_graph(a: ExecutionGraph, b: ExecutionGraph) -> None:
    assert a.schema_version == b.schema_version and len(a.ranks) == len(b.ranks)
    for ra, rb in zip(a.ranks, b.ranks):
        assert (ra.rank, ra.world_size, ra.device_name) == (rb.rank, rb.world_size, rb.device_name)
        assert ra.strings == rb.strings and ra.source == rb.source and ra.time_origin == rb.time_origin
        for t, tab in ra.tables().items():
            assert len(tab) == len(rb.tables()[t])
            for c, arr in tab.columns().items():
                other = rb.tables()[t].columns()[c]
                assert arr.dtype == other.dtype and arr.shape == other.shape, f"{t}.{c}"
                np.testing.assert_array_equal(arr, other, err_msg=f"{t}.{c}")


@pytest.fixture
def graph() -> ExecutionGraph:
    files = sorted(DATA.glob("*.json"))
    g = load_trace(files[0], cache=False)
    assert len(g.ranks[0].gpu_ops) and len(g.ranks[0].host_ops)
    return g


def test_indexed_entry_roundtrip(tmp_path: Path, graph: ExecutionGraph) -> None:
    p = tmp_path / "e.npz"
    cache.write_entry(p, graph)
    back = cache.read_entry(p)
    _same_graph(graph, back)
    # every array is a read-only view of the map that cannot be made writeable; assigning a column edits a copy
    g = back.ranks[0].gpu_ops
    assert not any(a.flags.writeable for t in back.ranks[0].tables().values() for a in t.columns().values())
    with pytest.raises(ValueError):
        g.start[0] = 1.0
    with pytest.raises(ValueError):
        g.start.flags.writeable = True
    old = g.start
    g.start = old + 1.0
    assert g.start is not old and g.start.flags.writeable and (g.start == old + 1.0).all()
    assert back.ranks[0].origin is None and back.ranks[0].cache_identity() is None  # no key given
    keyed = cache.read_entry(p, "k").ranks[0]
    assert keyed.cache_identity() == ("k", 0)
    keyed.make_writable()  # an in-place editor's first step: copies, no origin any more
    keyed.gpu_ops.start[0] = 1.0
    assert keyed.cache_identity() is None
    # still a plain .npz: numpy.load and ExecutionGraph.from_npz read it (the index is one more member)
    with np.load(p) as z:
        assert "cosim_index" in z.files and "meta" in z.files
    _same_graph(graph, ExecutionGraph.from_npz(p))


def test_entry_without_index_and_damaged_entries(tmp_path: Path, graph: ExecutionGraph) -> None:
    plain = tmp_path / "plain.npz"
    graph.to_npz(plain, compress=False)  # no index: numpy.load reads it
    _same_graph(graph, cache.read_entry(plain))
    p = tmp_path / "e.npz"
    cache.write_entry(p, graph)
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])  # truncated: no index, not a zip
    with pytest.raises((ValueError, zipfile.BadZipFile)):
        cache.read_entry(p)


def test_load_cache_reads_indexed_entries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path / "c"))
    src = sorted(DATA.glob("*.json"))[0]
    fresh = load_trace(src, cache=False)
    load_trace(src)
    (entry,) = (tmp_path / "c").glob("graph-*.npz")
    assert cache._index(bytearray(entry.read_bytes())) is not None
    cached = load_trace(src)
    _same_graph(fresh, cached)
    # the first (parsed) load and the cached one share the entry's key as their origin; cache=False gives none
    first = load_trace(src, cache=False)
    assert first.ranks[0].cache_identity() is None and not first.ranks[0].gpu_ops.dur.flags.writeable
    key = cache.cache_key([src], None)
    assert cached.ranks[0].cache_identity() == (key, 0)
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path / "d"))
    assert load_trace(src).ranks[0].cache_identity() == (key, 0)


def test_entries_read_once_per_process_until_the_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second cached load of one entry builds new tables over the arrays the first read (no second map); an edit
    to one graph's column leaves the other's as loaded; a rewritten entry (a new file) is read again, a removed one
    is not loaded at all, and the least recently read entries are forgotten past _ENTRIES_KEPT."""
    monkeypatch.setattr(cache, "_ENTRIES", {})
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path / "c"))
    src = sorted(DATA.glob("*.json"))[0]
    fresh = load_trace(src)  # parsed, the entry written
    a, b = load_trace(src), load_trace(src)
    _same_graph(fresh, b)
    assert len(cache._ENTRIES) == 1
    ga, gb = a.ranks[0].gpu_ops, b.ranks[0].gpu_ops
    assert ga is not gb and ga.start is gb.start and not ga.start.flags.writeable
    key = cache.cache_key([src], None)
    assert a.ranks[0].cache_identity() == b.ranks[0].cache_identity() == (key, 0)
    old = gb.start
    ga.start = ga.start + 1.0  # an edited copy in a's table only
    assert gb.start is old and (ga.start == old + 1.0).all() and b.ranks[0].cache_identity() == (key, 0)
    (entry,) = (tmp_path / "c").glob("graph-*.npz")
    cache.write_entry(entry, fresh)  # the same graph written again: a new file, read again
    c = load_trace(src)
    assert c.ranks[0].gpu_ops.start is not old and len(cache._ENTRIES) == 2
    _same_graph(fresh, c)
    entry.unlink()
    assert cache.load_cached(key) is None
    monkeypatch.setattr(cache, "_ENTRIES_KEPT", 2)
    for k in range(3):
        cache.write_entry(tmp_path / f"e{k}.npz", fresh)
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path))
    for k in range(3):
        (tmp_path / f"e{k}.npz").rename(tmp_path / f"graph-k{k}.npz")
        assert cache.load_cached(f"k{k}") is not None
    assert [i[0] for i in cache._ENTRIES] == [str(tmp_path / "graph-k1.npz"), str(tmp_path / "graph-k2.npz")]


def test_entry_strings_ascii_and_not(tmp_path: Path, graph: ExecutionGraph) -> None:
    # byte offsets are character offsets only for ASCII tables: both reads give the strings back
    p = tmp_path / "e.npz"
    cache.write_entry(p, graph)
    assert cache.read_entry(p).ranks[0].strings == graph.ranks[0].strings
    graph.ranks[0].strings.extend(["dépôt", "", "カーネル", "a\udcffb"])
    cache.write_entry(p, graph)
    assert cache.read_entry(p).ranks[0].strings == graph.ranks[0].strings


def test_string_tables_remembered_by_value_least_recent_forgotten(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph._decode_strings' memo: keyed by the offsets' values (int32 [0, 0, 0, 0] and int64 [0, 0] have the same
    16 bytes but are three empty strings and one), a new list at every read, at most _STRINGS_KEPT tables of
    _STRINGS_BYTES stored bytes, the least recently read forgotten first, a table larger than the bound not kept.
    Each table below is 16 offset bytes + 3 UTF-8 bytes = 19 stored bytes."""
    from cosim.workload import graph as g

    monkeypatch.setattr(g, "_STRINGS", {})
    monkeypatch.setattr(g, "_STRINGS_KEPT", 2)
    monkeypatch.setattr(g, "_STRINGS_BYTES", 40)
    empty = np.zeros(0, np.uint8)
    assert g._decode_strings(np.zeros(2, np.int64), empty) == [""]
    assert g._decode_strings(np.zeros(4, np.int32), empty) == ["", "", ""]
    g._STRINGS.clear()

    def table(text: str) -> list[str]:
        return g._decode_strings(np.array([0, len(text)], np.int64), np.frombuffer(text.encode(), np.uint8))

    def kept() -> list[bytes]:
        return [blob for _, blob in g._STRINGS]

    assert table("abc") == ["abc"] and table("def") == ["def"] and kept() == [b"abc", b"def"]  # 38 bytes
    first = table("abc")
    first.append("x")  # a new list: the memo is untouched
    assert table("abc") == ["abc"] and kept() == [b"def", b"abc"]  # read again: the most recent
    assert table("ghi") == ["ghi"] and kept() == [b"abc", b"ghi"]  # two tables at most: def forgotten
    monkeypatch.setattr(g, "_STRINGS_KEPT", 64)
    assert table("0123456789012345678901234") == ["0123456789012345678901234"]  # 41 bytes: not kept
    assert kept() == [b"abc", b"ghi"]
    assert table("jk") == ["jk"] and kept() == [b"ghi", b"jk"]  # 19 + 18 + 19 > 40: abc forgotten


def test_entry_zip_structure(tmp_path: Path, graph: ExecutionGraph, monkeypatch: pytest.MonkeyPatch) -> None:
    # the hand-written zip: numpy's own .npy headers byte for byte, CRCs zipfile accepts, zip64 records
    # (forced here by a lower threshold) that zipfile and numpy.load read
    for a in (np.zeros(0), np.arange(5, dtype=np.int8), np.zeros((3, 4), np.float32), np.zeros((7,), ">i4"),
              np.zeros(3, np.uint64), np.zeros((), np.float64), np.zeros(2, bool), np.zeros((10**12, 0))):
        assert cache._npy_header_fast(a, a.dtype.str) == cache._npy_header(a), (a.dtype, a.shape)
    for limit in (None, 64):
        if limit is not None:
            monkeypatch.setattr(cache, "_ZIP64_FROM", limit)
        p = tmp_path / f"e{limit}.npz"
        cache.write_entry(p, graph)
        with zipfile.ZipFile(p) as zf:
            assert zf.testzip() is None
        with np.load(p) as z:
            arrays = graph.npz_arrays()
            assert set(z.files) == set(arrays) | {"cosim_index"}
            for k, a in arrays.items():
                assert z[k].dtype == a.dtype and z[k].tobytes() == np.ascontiguousarray(a).tobytes(), k
        _same_graph(graph, cache.read_entry(p))


def test_file_digests_remembered_until_the_file_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """cache_key hashes a file's bytes once per process while its identity and times stay those it was hashed
    with; a file changed since (same size, modification time set back) gets its new content's key; a file
    changed within the racy window is hashed on every call."""
    import hashlib
    import os

    monkeypatch.setattr(cache, "_DIGESTS", {})
    f = tmp_path / "t.json"
    f.write_bytes(b"[1, 2, 3]")
    old = 1_600_000_000_000_000_000
    os.utime(f, ns=(old, old))
    monkeypatch.setattr(cache, "_RACY_NS", 0)  # ctime is now: let it be remembered
    k1 = cache.cache_key([f], None)
    assert cache.file_digest(f) == hashlib.sha256(b"[1, 2, 3]").digest() and len(cache._DIGESTS) == 1
    reads: list[Path] = []
    real_open = open
    monkeypatch.setattr("builtins.open", lambda p, *a, **k: reads.append(Path(p)) or real_open(p, *a, **k))
    assert cache.cache_key([f], None) == k1 and not reads  # remembered: not read again
    monkeypatch.setattr("builtins.open", real_open)
    f.write_bytes(b"[1, 2, 4]")  # same size
    os.utime(f, ns=(old, old))  # modification time set back: the change time still moves
    k2 = cache.cache_key([f], None)
    if os.stat(f).st_ctime_ns == next(iter(cache._DIGESTS))[5]:
        pytest.skip("the file system's change time did not move (granularity)")
    assert k2 != k1 and cache.file_digest(f) == hashlib.sha256(b"[1, 2, 4]").digest()
    monkeypatch.setattr(cache, "_DIGESTS", {})
    monkeypatch.setattr(cache, "_RACY_NS", 10**18)  # every file "just changed": never remembered
    assert cache.cache_key([f], None) == k2 and not cache._DIGESTS


def test_string_tables_read_from_several_threads_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph._decode_strings from four threads at once (ranks loaded by a threaded caller, a Dask worker's
    threads), the memo full and forgetting: every table decoded right and no error (the memo's bytes summed and
    its oldest tables deleted while another thread changed it: 'dictionary changed size during iteration',
    KeyError). The interpreter switches threads every microsecond here so that the interleaving happens."""
    import sys
    import threading

    from cosim.workload import graph as g

    monkeypatch.setattr(g, "_STRINGS", {})
    monkeypatch.setattr(g, "_STRINGS_KEPT", 8)
    errors: list[BaseException] = []

    def load(worker: int) -> None:
        try:
            for i in range(2000):
                text = f"w{worker}-{i}"
                got = g._decode_strings(np.array([0, len(text)], np.int64), np.frombuffer(text.encode(), np.uint8))
                assert got == [text]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    was = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(was)
    assert not errors, errors[:3]
    assert len(g._STRINGS) <= 8


def test_string_tables_told_apart_by_value_when_their_hashes_collide(monkeypatch: pytest.MonkeyPatch) -> None:
    """graph._decode_strings' memo keys hash by a CRC-32 (_TableKey) but compare by their bytes: with every CRC
    forced to 0, tables of one offsets length (one hash) still each read back their own strings."""
    import types

    from cosim.workload import graph as g

    monkeypatch.setattr(g, "_STRINGS", {})
    monkeypatch.setattr(g, "zlib_ng", types.SimpleNamespace(crc32=lambda data, start=0: 0))

    def read(text: str) -> list[str]:
        return g._decode_strings(np.array([0, len(text)], np.int64), np.frombuffer(text.encode(), np.uint8))

    keys = [g._TableKey((np.array([0, 2], np.int64).tobytes(), t.encode())) for t in ("ab", "cd")]
    assert hash(keys[0]) == hash(keys[1]) and keys[0] != keys[1]
    for _ in range(2):  # decoded, then from the memo
        assert read("ab") == ["ab"] and read("cd") == ["cd"] and read("ef") == ["ef"]
    assert len(g._STRINGS) == 3


def test_cache_key_resolves_a_trace_folder_given_through_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                               ) -> None:
    """cache_key resolves each folder once (cache._realpath) and gives what os.path.realpath gives: a trace read
    through a linked folder, relative or absolute, has its real folder's key; a rank file that is itself a link
    is its target's entry; '..' after a linked folder is resolved from the link's target."""
    import os

    monkeypatch.setattr(cache, "_DIGESTS", {})
    real, other = tmp_path / "real", tmp_path / "other"
    (real / "sub").mkdir(parents=True)
    other.mkdir()
    for i, d in enumerate((real, real, other)):
        (d / f"r{i}.json").write_text(f"[{i}]")
    (tmp_path / "lnk").symlink_to("real")
    (real / "sublink").symlink_to("sub")
    (real / "r3.json").symlink_to(other / "r2.json")
    names = ["r0.json", "r1.json", "r3.json"]
    want = cache.cache_key([real / n for n in names[:2]] + [other / "r2.json"], None)
    monkeypatch.chdir(tmp_path)
    for folder in (tmp_path / "lnk", Path("lnk"), Path("./lnk/"), Path("lnk/sublink/..")):
        assert cache.cache_key([folder / n for n in names], None) == want, folder
    paths = [Path("lnk/sublink/../r0.json"), Path("lnk//sub/./../r1.json"), Path("lnk/r3.json"), Path("lnk/nope")]
    real_dirs: dict[str, str] = {}
    assert [cache._realpath(p, real_dirs) for p in paths] == [os.path.realpath(p) for p in paths]


def test_entries_memo_bounded_by_mapped_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """_ENTRIES holds at most _ENTRIES_BYTES of entry files: an entry larger than the bound is read at every load
    (never kept), and keeping a new one forgets the least recently read until the bytes fit."""
    monkeypatch.setattr(cache, "_ENTRIES", {})
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path))
    g = load_trace(sorted(DATA.glob("*.json"))[0], cache=False)
    for k in range(3):
        cache.write_entry(tmp_path / f"graph-k{k}.npz", g)
    size = (tmp_path / "graph-k0.npz").stat().st_size
    monkeypatch.setattr(cache, "_ENTRIES_BYTES", size - 1)
    assert cache.load_cached("k0") is not None and cache._ENTRIES == {}
    monkeypatch.setattr(cache, "_ENTRIES_BYTES", 2 * size)
    for k in (0, 1, 2):
        assert cache.load_cached(f"k{k}") is not None
    assert [i[0] for i in cache._ENTRIES] == [str(tmp_path / "graph-k1.npz"), str(tmp_path / "graph-k2.npz")]
    assert sum(v[0] for v in cache._ENTRIES.values()) <= cache._ENTRIES_BYTES


def test_entry_without_index_read_once_per_load(tmp_path: Path, graph: ExecutionGraph,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """load_cached of an entry without an index (an older writer's, a plain .npz) maps and looks for the index once,
    then reads it by numpy.load (it mapped the file and parsed its zip directory twice before), read-only and not
    remembered."""
    monkeypatch.setattr(cache, "_ENTRIES", {})
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path))
    graph.to_npz(tmp_path / "graph-plain.npz", compress=False)
    calls: list[Path] = []
    read = cache._read_arrays
    monkeypatch.setattr(cache, "_read_arrays", lambda p: calls.append(p) or read(p))
    g = cache.load_cached("plain")
    assert g is not None and len(calls) == 1 and cache._ENTRIES == {}
    _same_graph(graph, g)
    assert not g.ranks[0].gpu_ops.start.flags.writeable


def test_graphs_from_a_remembered_entry_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the second read of a remembered entry on, its graph is built from the plan the first read kept: the
    same arrays, equal fields, new tables, string lists and source dicts (an edit to one graph's leaves the next
    one's as stored), and the same origin; a plan is not kept where a table converted an array."""
    monkeypatch.setattr(cache, "_ENTRIES", {})
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path / "c"))
    src = sorted(DATA.glob("*.json"))[0]
    fresh = load_trace(src)
    a = load_trace(src)  # the entry mapped, read by from_arrays, its plan kept
    ((_, arrays, _, plan),) = cache._ENTRIES.values()
    assert plan[0] is not None
    ra = a.ranks[0]
    ra.strings.append("edited")
    ra.source["edited"] = True
    b = load_trace(src)  # from the plan
    _same_graph(fresh, b)
    rb = b.ranks[0]
    assert rb.strings is not ra.strings and rb.source is not ra.source and "edited" not in rb.source
    for t, tab in rb.tables().items():
        assert tab is not ra.tables()[t]
        for c, arr in tab.columns().items():
            assert arr is ra.tables()[t].columns()[c] and not arr.flags.writeable, f"{t}.{c}"
    assert rb.cache_identity() == (cache.cache_key([src], None), 0)
    known = rb.origin  # from the plan: the origin set_origin records from the arrays themselves
    b.set_origin(cache.cache_key([src], None))
    assert known is not None and rb.origin is not None and known[:2] == rb.origin[:2]
    assert [x is y for x, y in zip(known[2], rb.origin[2])] == [True] * len(rb.origin[2]) == [True] * len(known[2])
    assert known[3:] == rb.origin[3:]
    rb.gpu_ops.start = rb.gpu_ops.start + 1.0  # an edited column (a copy): no identity; the next graph unedited
    assert rb.cache_identity() is None
    c = load_trace(src)
    _same_graph(fresh, c)
    assert c.ranks[0].cache_identity() == (cache.cache_key([src], None), 0)
    c.ranks[0].gpu_ops.start.shape = (1, -1)  # a shared array reshaped in place: the next graph is read again
    d = load_trace(src)
    _same_graph(fresh, d)
    assert d.ranks[0].gpu_ops.start.shape == fresh.ranks[0].gpu_ops.start.shape
    # a table that converts an array (here: int32 stored where the schema says int64) shares nothing
    cast = dict(arrays)
    name = next(k for k, v in cast.items() if k.startswith("r0/gpu_ops/") and v.dtype == np.int64 and v.ndim == 1)
    cast[name] = cast[name].astype(np.int32)
    slot: list[cache._Plan | None] = [None]
    g = cache._graph(cast, set(cast), tmp_path / "x.npz", None, slot)
    assert slot[0] is None and g.ranks[0].gpu_ops.columns()[name.rsplit("/", 1)[1]].flags.writeable
