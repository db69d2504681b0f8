"""The output pipeline's shortcuts give what the plain computations give (benchmarks/README.md, "Round 6
pipeline"): the combined timeline's pids moved on the serialized bytes, the link report's covering windows, the
paused garbage collector, the CLI importing only the subcommand it runs."""

from __future__ import annotations

import gc
import subprocess
import sys

import numpy as np
import orjson

from cosim.output.timeline import _lines, _renumber, _repid
from cosim.replay.links import COLLECTIVE, MEMCPY, LinkUsage
from cosim.workload.graph import gc_paused


def _events(devices: list[int]) -> tuple[list[dict], list[dict]]:
    host = [{"name": "process_name", "ph": "M", "pid": 7, "tid": 0, "args": {"name": "python3"}},
            {"name": "process_sort_index", "ph": "M", "pid": 7, "tid": 0, "args": {"sort_index": 7}},
            {"ph": "X", "cat": "cpu_op", "name": 'say "pid":3, twice "pid":12,', "pid": 7, "tid": 1, "ts": 1.5,
             "dur": 2.0, "args": {"External id": 5}},
            {"ph": "s", "id": 9, "pid": 7, "tid": 1, "ts": 1.5, "cat": "ac2g", "name": "ac2g"}]
    gpu = [{"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": "python3"}} for d in devices]
    gpu += [{"name": "process_sort_index", "ph": "M", "pid": d, "tid": 0, "args": {"sort_index": 5_000_000 + d}}
            for d in devices]
    for k, d in enumerate(devices * 3):
        gpu.append({"ph": "X", "cat": "kernel", "name": f'k{k} "pid":{d},', "pid": d, "tid": 7, "ts": 3.0 + k,
                    "dur": 1.0, "args": {"device": d, "stream": 7}})
        gpu.append({"ph": "f", "id": 9, "pid": d, "tid": 7, "ts": 3.0 + k, "cat": "ac2g", "name": "ac2g", "bp": "e"})
    return host, gpu


def test_pids_moved_on_the_bytes_equal_the_renumbered_dicts() -> None:
    """One device and three devices (1 and 12 among them, so a pid is a prefix of another), names holding the
    text ``"pid":N,``: the combined file's lines are the per-rank lines with their pids moved as ``_renumber``
    moves the dicts."""
    for devices in ([0], [1, 2, 12]):
        for rank in (0, 5):
            host, gpu = _events(devices)
            want_h, want_g = [dict(e) for e in host], [dict(e) for e in gpu]
            _renumber(rank, want_h, want_g)
            off = (rank + 1) * 1000
            nh, ng = 2, 2 * len(devices)
            got_h = _repid(_lines(host[nh:]), [7], lambda _p, off=off: off)
            got_g = _repid(_lines(gpu[ng:]), devices, lambda p, off=off: off + 1 + p)
            assert _repid(_lines(gpu[ng:]), devices[:1], lambda p, off=off: off + 1 + p) == got_g  # incomplete: regex
            assert got_h == _lines(want_h[nh:])
            assert got_g == _lines(want_g[ng:])
            same = _lines([{**e, "pid": 1000} for e in host[nh:]])  # a new pid that is an old one: regex
            assert _repid(same, [1000, 7], lambda _p: 1000) == same
            assert [orjson.loads(x)["pid"] for x in got_g.split(b",\n")] == [off + 1 + e["pid"] for e in gpu[ng:]]


def _usage() -> tuple[LinkUsage, list[tuple[int, float, float, float]]]:
    rng = np.random.default_rng(3)
    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(5)], np.ones(5))
    rows = []
    for part in range(3):
        n = 50
        lk = rng.integers(0, 5, n)
        s = rng.integers(0, 30, n).astype(float) + 0.25
        e = s + rng.integers(0, 6, n)
        nb = rng.integers(1, 100, n).astype(float)
        u.add(lk, s, e, np.ones(n), nb, COLLECTIVE if part else MEMCPY)
        rows += list(zip(lk.tolist(), s.tolist(), e.tolist(), nb.tolist()))
    return u, rows


def test_covering_window_equals_the_clipped_computation() -> None:
    """busy and bytes_in over a window holding every interval (the run report's step window) take the unclipped
    figures; they equal a direct evaluation, and a window cutting the intervals still clips."""
    u, rows = _usage()
    lo, hi = min(r[1] for r in rows), max(r[2] for r in rows)
    whole = u.busy()
    for a, b in ((lo, hi), (lo - 1.0, hi + 3.0), (-np.inf, np.inf)):
        assert np.array_equal(u.busy(a, b), whole)
        got = u.bytes_in(a, b)
        for k in range(5):
            assert got[k] == sum(nb for lk, _s, _e, nb in rows if lk == k)
    cut = u.busy(lo + 5.0, hi - 5.0)
    for k in range(5):  # unit grid of starts at x.25: coverage counted on a quarter grid
        mine = [(s, e) for lk, s, e, _nb in rows if lk == k and e > s]
        ts = np.arange(lo + 5.0, hi - 5.0, 0.25)
        want = 0.25 * sum(1 for t in ts if any(s <= t < e for s, e in mine))
        assert abs(cut[k] - want) < 1e-9
    assert (cut <= whole).all() and (cut < whole).any()


def test_gc_paused_restores_the_collector() -> None:
    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_cli_imports_only_the_subcommand_it_runs() -> None:
    """``cosim topo list`` registers and imports only ``cosim.cli.topo`` (not capture's pydantic configuration);
    ``cosim --help`` and an unknown command still see every subcommand."""
    code = ("import sys; from cosim.cli import main; rc = main(['topo', 'list', '--json']); "
            "print(sorted(m for m in sys.modules if m.startswith('cosim.cli.') or m.startswith('cosim.capture')), "
            "file=sys.stderr); sys.exit(rc)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    mods = p.stderr.strip().splitlines()[-1]
    assert "'cosim.cli.topo'" in mods and "cosim.capture" not in mods and "cosim.cli.run" not in mods
    p = subprocess.run([sys.executable, "-m", "cosim", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and all(c in p.stdout for c in ("topo", "collective", "run", "capture", "export"))
    p = subprocess.run([sys.executable, "-m", "cosim", "nosuch"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "invalid choice" in p.stderr and "collective" in p.stderr


def test_cli_sets_and_restores_gc_thresholds(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A command runs under ``GC_THRESHOLDS``; an in-process caller of ``main`` gets its own back."""
    import cosim.cli as cli
    import cosim.topology as topology

    seen = []
    monkeypatch.setattr(topology, "list_presets", lambda: seen.append(gc.get_threshold()) or [])
    before = gc.get_threshold()
    assert cli.main(["topo", "list"]) == 0
    assert seen == [cli.GC_THRESHOLDS] and gc.get_threshold() == before


def test_lines_serialize_the_list_once_one_event_a_line() -> None:
    """_lines serializes a section in one call and breaks lines between events: the same bytes as one call per
    event, also for names holding ``},{"`` and for args holding a list of objects (then one call per event)."""
    evs = [{"ph": "X", "name": 'a},{"b', "pid": 1, "args": {"x": 1}},
           {"ph": "f", "id": 3, "pid": 2, "args": {}},
           {"ph": "X", "name": "n", "pid": 0, "args": {"grid": [1, 2, 3]}}]
    want = b",\n".join(orjson.dumps(e) for e in evs)
    assert _lines(evs) == want and _lines([]) == b""
    nested = [*evs, {"ph": "X", "pid": 0, "args": {"l": [{"a": 1}, {"b": 2}]}}]
    assert _lines(nested) == b",\n".join(orjson.dumps(e) for e in nested)
