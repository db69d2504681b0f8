"""The cached multi-rank replay's shortcuts (issue 16 point 5): tables that keep a cache entry's arrays as they
are, every rank's copies attributed to the links in one part, the summary's per-program columns; each gives the
figures the long way gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosim.replay import ReplayConfig, replay
from cosim.replay.summary import breakdown, comm_split, op_masks, without_wall_clock
from cosim.resources import shared_dir
from cosim.workload import load_trace
from cosim.workload.graph import TABLE_SCHEMAS, Table


def test_table_keeps_stored_arrays_and_converts_the_rest() -> None:
    n = 3
    t = Table("collectives", n)
    cols = t.columns()
    kept = Table("collectives", n, **cols)
    assert all(kept.columns()[k] is a for k, a in cols.items())  # each of its dtype and shape: kept as given
    assert list(kept.columns()) == list(cols)
    # one column of another dtype, one missing, one of another length: converted and filled as before
    cols32 = dict(cols, type=np.zeros(n, np.int64))
    conv = Table("collectives", n, **cols32)
    assert conv.type.dtype == np.dtype(next(c.dtype for c in TABLE_SCHEMAS["collectives"] if c.name == "type"))
    assert list(conv.columns()) == list(cols)
    some = {k: a for k, a in cols.items() if k != "in_bytes"}
    filled = Table("collectives", n, **some)
    assert np.isnan(filled.in_bytes).all() and filled.in_bytes.shape == (n,)
    with pytest.raises(ValueError):
        Table("collectives", n + 1, **cols)  # the columns of 3 rows do not make a table of 4


def test_breakdown_with_program_masks_equals_without() -> None:
    files = sorted((Path(__file__).parent / "data" / "workload").glob("*.json"))
    g = load_trace(files[0], cache=False)
    res = replay(g)
    rg, run = g.ranks[0], res.runs[0]
    w = (float(np.nanmin(run.gpu_start)), float(np.nanmax(run.gpu_end)))
    m = op_masks(rg)
    assert breakdown(rg, run, w, 1) == breakdown(rg, run, w, 1, masks=m)
    assert comm_split(rg, run, w, 1) == comm_split(rg, run, w, 1, m)
    assert m["comm"].dtype == bool and m["comm"].shape == (len(rg.gpu_ops),)


@pytest.mark.parametrize("collectives", ["measured", "simulated"])
def test_cached_dlrm_job_replays_as_uncached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             collectives: str) -> None:
    """The 8-rank DLRM job (memcpys on every rank): read back from the load cache and replayed twice (the
    second time with the programs, their summary columns and the link attribution's routes remembered), every
    summary figure is the one of the graph imported without the cache."""
    sd = shared_dir()
    job = sd / "traces" / "param-dlrm-v100x8" / "kineto" if sd else None
    if job is None or not job.is_dir():
        pytest.skip("../shared not found: real-trace test skipped (set COSIM_SHARED)")
    cfg = ReplayConfig(collectives=collectives)
    want = json.dumps(without_wall_clock(replay(load_trace(job, cache=False), config=cfg).summary()), sort_keys=True)
    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path))
    load_trace(job)  # writes the entry
    for _ in range(2):
        g = load_trace(job)  # read back
        s = replay(g, config=cfg).summary()
        assert json.dumps(without_wall_clock(s), sort_keys=True) == want
        assert sum(lk["memcpy_bytes"] > 0 for lk in s["links"]) >= 8  # every rank's copies on its PCIe links


def test_cache_entry_mapped_copy_on_write(tmp_path: Path) -> None:
    """An entry's arrays are read-only views of a copy-on-write map; a column assigned (an edited copy) changes
    the graph, not the file, and the next read gives the stored values (and a string table of its own, equal to
    the first)."""
    from cosim.workload import cache

    files = sorted((Path(__file__).parent / "data" / "workload").glob("*.json"))
    g = load_trace(files[0], cache=False)
    p = tmp_path / "e.npz"
    cache.write_entry(p, g)
    before = p.read_bytes()
    a = cache.read_entry(p)
    dur = a.ranks[0].gpu_ops.dur
    assert not dur.flags.writeable
    want = dur.copy()
    a.ranks[0].gpu_ops.dur = -1.0
    assert (a.ranks[0].gpu_ops.dur == -1.0).all() and (dur == want).all()
    a.ranks[0].strings.append("added here")
    assert p.read_bytes() == before
    b = cache.read_entry(p)
    np.testing.assert_array_equal(b.ranks[0].gpu_ops.dur, want)
    assert b.ranks[0].strings == g.ranks[0].strings and b.ranks[0].strings is not a.ranks[0].strings


@pytest.mark.parametrize("collectives", ["measured", "simulated"])
def test_replay_frees_its_executor_by_reference_counting(monkeypatch: pytest.MonkeyPatch, collectives: str) -> None:
    """The copy model unhooks the fabric after the run (``CopyModel.close``): no reference cycle through the
    copies' closures keeps the executor (every rank's run state) alive until a collection. Replayed with the
    cyclic collector off, the DLRM job's executor (copies on every rank) is gone when ``replay`` returns."""
    import gc
    import weakref

    import cosim.replay.api as api

    sd = shared_dir()
    job = sd / "traces" / "param-dlrm-v100x8" / "kineto" if sd else None
    if job is None or not job.is_dir():
        pytest.skip("../shared not found: real-trace test skipped (set COSIM_SHARED)")
    seen: list[weakref.ref] = []

    class Watched(api.Executor):  # type: ignore[misc, name-defined]
        def __init__(self, *a: object, **kw: object) -> None:
            super().__init__(*a, **kw)
            seen.append(weakref.ref(self))

    monkeypatch.setattr(api, "Executor", Watched)
    g = load_trace(job, cache=False)
    was = gc.isenabled()
    gc.disable()
    try:
        res = replay(g, config=ReplayConfig(collectives=collectives))
        assert len(seen) == 1 and seen[0]() is None
        assert res.summary()["links"]  # the copies' link figures were read from it before
    finally:
        if was:
            gc.enable()


def test_shared_sort_breakdown_and_split_equal_the_two_functions_bit_for_bit() -> None:
    """summary._sim_breakdown_split (one sort of the window's ops shared by the unions) against breakdown and
    comm_split themselves: random runs with ties, ops ending before they start, NaN starts, infinite ends, ops
    across the window's ends, with and without bound columns, empty and NaN windows."""
    import math
    import types

    from cosim.replay.summary import _sim_breakdown_split

    rng = np.random.default_rng(5)
    for it in range(1500):
        n = int(rng.integers(0, 25))
        s = np.round(rng.uniform(0, 10, n), int(rng.integers(0, 3)))  # rounded: ties
        e = s + np.round(rng.uniform(-0.5 if it % 7 == 0 else 0.0, 3, n), int(rng.integers(0, 3)))
        if n and it % 5 == 0:
            s[rng.integers(0, n)] = np.nan
        if n and it % 11 == 0:
            e[rng.integers(0, n)] = np.inf
        meet = np.where(rng.random(n) < 0.3, np.nan, s + rng.uniform(0, 1, n))
        run = types.SimpleNamespace(gpu_start=s, gpu_end=e, gpu_meet=meet,
                                    gpu_bound=rng.integers(0, 4, n) if it % 3 else None)
        comm = rng.random(n) < 0.4
        masks = {"comm": comm, "compute": ~comm & (rng.random(n) < 0.7)}
        w = (math.nan, 1.0) if it % 13 == 0 else (float(rng.uniform(-1, 3)), float(rng.uniform(2, 12)))
        k = int(rng.integers(0, 3))
        want = (breakdown(None, run, w, k, masks=masks), comm_split(None, run, w, k, masks))  # type: ignore[arg-type]
        assert _sim_breakdown_split(None, run, w, k, masks) == want, it  # type: ignore[arg-type]


def test_breakdown_and_split_of_a_job_equal_each_rank_s_bit_for_bit() -> None:
    """summary._sim_breakdown_splits (a job's ranks in one pass) against _sim_breakdown_split of each rank: random
    jobs of 1-9 ranks, each as in the test above (ties, ops ending before they start, NaN starts, infinite ends,
    empty ranks, with and without bound columns, empty and NaN windows), compared by repr (signed zeros too)."""
    import math
    import types

    from cosim.replay.summary import _sim_breakdown_split, _sim_breakdown_splits

    rng = np.random.default_rng(7)
    for it in range(400):
        rows = []
        for r in range(int(rng.integers(1, 10))):
            n = int(rng.integers(0, 40))
            s = np.round(rng.uniform(0, 10, n), int(rng.integers(0, 3)))
            e = s + np.round(rng.uniform(-0.5 if (it + r) % 9 == 0 else 0.0, 3, n), int(rng.integers(0, 3)))
            if n and (it + r) % 5 == 0:
                s[rng.integers(0, n)] = np.nan
            if n and (it + r) % 11 == 0:
                e[rng.integers(0, n)] = np.inf
            meet = np.where(rng.random(n) < 0.3, np.nan, s + rng.uniform(0, 1, n))
            run = types.SimpleNamespace(gpu_start=s, gpu_end=e, gpu_meet=meet if r % 4 else None,
                                        gpu_bound=rng.integers(0, 4, n) if (it + r) % 6 else None)
            comm = rng.random(n) < 0.4
            masks = {"comm": comm, "compute": ~comm & (rng.random(n) < 0.7)}
            w = (math.nan, 1.0) if (it + r) % 13 == 0 else (float(rng.uniform(-1, 3)), float(rng.uniform(2, 12)))
            rows.append((None, run, w, int(rng.integers(0, 3)), masks))
        want = [_sim_breakdown_split(*row) for row in rows]  # type: ignore[arg-type]
        assert repr(_sim_breakdown_splits(rows)) == repr(want), it  # type: ignore[arg-type]
