"""Tests of replay compilation's host walk (cosim.replay.program): the vectorized static times equal the
op-by-op pre-order walk, worked by hand on a small thread and exactly (bit for bit) on real traces."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest

from cosim.replay.program import _HostCosts, _HostWalk, _preorder_ends, _walk_block, _walk_block_loop
from cosim.replay.summary import without_wall_clock
from cosim.resources import shared_dir
from cosim.workload.graph import Table


def _walk(costs: _HostCosts, parent: np.ndarray, base: float, vectorized: bool, graph_cost: float = 0.0) -> _HostWalk:
    n = parent.size
    out = _HostWalk(np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                    np.full(n, -1, dtype=np.int64), [], None)
    region = costs.region
    root = region & ((parent < 0) | ~region[np.maximum(parent, 0)])
    (_walk_block if vectorized else _walk_block_loop)(costs, graph_cost, root, parent, 0, n, base, out)
    return out


def _costs(pre: list[float], tail: list[float], sync: list[bool], cost: list[float],
           region: list[bool] | None = None) -> _HostCosts:
    n = len(pre)
    return _HostCosts(np.array(pre), np.array(tail), np.array(cost), np.zeros(n, dtype=bool), np.array(sync),
                      np.array(region if region is not None else [False] * n))


def test_static_times_worked_by_hand() -> None:
    """Thread: A(0) { B(1) { C(2) }, D(3) sync }, E(4). Pre-gaps 1, 2, 3, 4, 5; tails 10, 20, 30, -, 50; D is a
    sync costing 7. Walk from base 100: A opens at 101, B at 103, C at 106, C closes 136, B closes 156, D opens
    160, closes 167, A closes 177, E opens 182 and closes 232. SYNC counts: D is the thread's SYNC 0, so
    everything opening after it (E) has one SYNC before it, and A, which closes after D, ends after one."""
    parent = np.array([-1, 0, 1, 0, -1])
    costs = _costs([1, 2, 3, 4, 5], [10, 20, 30, 0, 50], [False, False, False, True, False], [0, 0, 0, 7, 0])
    for vec in (True, False):
        w = _walk(costs, parent, 100.0, vec)
        assert w.static_start.tolist() == [101, 103, 106, 160, 182]
        assert w.static_end.tolist() == [177, 156, 136, 167, 232]
        assert w.sb_start.tolist() == [0, 0, 0, 0, 1]
        assert w.sb_end.tolist() == [1, 0, 0, 1, 1]
        assert w.sync_ev.tolist() == [-1, -1, -1, 0, -1]


def test_cuda_graph_launch_cost_on_region_roots() -> None:
    """A region root (op 1, inside a CUDA-graph region with its child 2) pays the graph launch cost (0.5) once
    after its pre-gap; its child does not."""
    parent = np.array([-1, 0, 1])
    costs = _costs([1, 2, 3], [4, 5, 6], [False] * 3, [0] * 3, region=[False, True, True])
    for vec in (True, False):
        w = _walk(costs, parent, 0.0, vec, graph_cost=0.5)
        assert w.static_start.tolist() == [1, 3.5, 6.5]
        assert w.static_end.tolist() == [21.5, 17.5, 12.5]


def test_inconsistent_parents_fall_back_to_the_walk() -> None:
    """A parent that is not open when its child starts (op 3 names op 1, which op 2 closed) is not a
    pre-order: the vectorized walk declines and the op-by-op walk treats op 3 as a new top-level op."""
    parent = np.array([-1, 0, -1, 1])
    assert _preorder_ends(parent, 0, 4) is None
    assert _preorder_ends(np.array([-1, 0, 0, -1]), 0, 4).tolist() == [3, 2, 3, 4]
    costs = _costs([1, 1, 1, 1], [1, 1, 1, 1], [False] * 4, [0] * 4)
    w = _walk(costs, parent, 0.0, True)
    assert w.static_start.tolist() == [1, 2, 5, 7]
    assert w.static_end.tolist() == [4, 3, 6, 8]


@pytest.mark.parametrize("rel", ["hta/v100-rank1of2-df.json.gz", "param-dlrm-v100x8/kineto",
                                 "tracelens-mi300/resnet_act_checkpoint.json.gz"])
def test_vectorized_walk_is_exact_on_real_traces(rel: str) -> None:
    """Every thread of every rank: the vectorized static times are the op-by-op walk's, bit for bit, with
    host what-ifs that change every cost (host speed, launch overhead)."""
    shared = shared_dir()
    if shared is None or not (shared / "traces" / rel).exists():
        pytest.skip("../shared not found: real-trace test skipped (set COSIM_SHARED)")
    from cosim.replay import ReplayConfig
    from cosim.replay.program import _blocking_kinds, _gpu_deps, _host_costs, _launch_map, _thread_blocks
    from cosim.workload import load_trace

    cfg = ReplayConfig(host_speed=1.7, launch_overhead=3e-6)
    for rg in load_trace(shared / "traces" / rel).ranks:
        lhost, launch_gpu, _ = _launch_map(rg)
        _, _, sync_deps = _gpu_deps(rg)
        costs = _host_costs(rg, cfg, _blocking_kinds(rg, lhost, launch_gpu, sync_deps), sync_deps)
        parent = rg.host_ops.parent
        n = parent.size
        region = np.zeros(n, dtype=bool)
        for i, j in _thread_blocks(rg.host_ops.thread):
            assert _preorder_ends(parent, i, j) is not None  # the importer's tables are a pre-order
            outs = []
            for fn, kw in ((_walk_block, {}), (_walk_block, {"depth": rg.host_ops.depth}), (_walk_block_loop, {})):
                out = _HostWalk(np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64),
                                np.full(n, -1, dtype=np.int64), [], None)
                fn(costs, 1e-5, region, parent, i, j, 12.25, out, **kw)
                outs.append(out)
            ref = outs[-1]
            for got in outs[:-1]:
                for name in ("static_start", "static_end", "sb_start", "sb_end", "sync_ev"):
                    assert np.array_equal(getattr(got, name)[i:j], getattr(ref, name)[i:j]), name
        # the launch map's per-GPU-op host op (RankProgram.gpu_launch_host) inverts host op -> GPU ops
        inverted = np.full(len(rg.gpu_ops), -1, dtype=np.int64)
        for h, js in launch_gpu.items():
            inverted[js] = h
        assert lhost.dtype == np.int64 and np.array_equal(lhost, inverted)


class _Rows:
    def __init__(self, n: int, **cols: np.ndarray) -> None:
        self.n = n
        self.__dict__.update(cols)

    def __len__(self) -> int:
        return self.n


def _launch_map_loop(lhost: np.ndarray) -> tuple[dict[int, list[int]], list[int]]:
    launch_gpu: dict[int, list[int]] = {}
    orphans: list[int] = []
    for j, h in enumerate(lhost.tolist()):
        if h >= 0:
            launch_gpu.setdefault(h, []).append(j)
        else:
            orphans.append(j)
    return launch_gpu, orphans


@pytest.mark.parametrize("per_launch", [1, 3])
def test_launch_map_and_deps_equal_the_loops(per_launch: int) -> None:
    """The vectorized launch map (keys in order of their first GPU op, GPU ops in order, one or several per
    launch, interleaved) and stream predecessors (the last edge into an op wins) equal the per-op loops."""
    from types import SimpleNamespace

    from cosim.replay.program import _gpu_deps, _launch_map
    from cosim.workload.graph import EdgeKind

    rng = np.random.default_rng(per_launch)
    n_gpu, n_host, n_launch = 400, 300, 120
    host_op = rng.permutation(n_host)[:n_launch].astype(np.int64)
    if per_launch > 1:  # launch rows shared by several GPU ops, interleaved, and orphans (-1)
        launch = rng.integers(-1, n_launch, n_gpu)
    else:  # each launch row used once, in shuffled order, the other GPU ops orphans
        launch = np.full(n_gpu, -1, dtype=np.int64)
        launch[rng.permutation(n_gpu)[:n_launch]] = rng.permutation(n_launch)
    rg = SimpleNamespace(gpu_ops=_Rows(n_gpu, launch=launch), launches=_Rows(n_launch, host_op=host_op))
    lhost, launch_gpu, orphans = _launch_map(rg)  # type: ignore[arg-type]
    ref, ref_orphans = _launch_map_loop(lhost)
    assert orphans == ref_orphans
    assert list(launch_gpu.items()) == list(ref.items())

    src = np.concatenate([n_host + rng.integers(0, n_gpu, 900), n_host + rng.integers(0, n_gpu, 50)])
    dst = np.concatenate([n_host + rng.integers(0, n_gpu, 900), rng.integers(0, n_host, 50)])
    kind = np.concatenate([rng.choice([EdgeKind.STREAM, EdgeKind.EVENT_WAIT], 900),
                           np.full(50, EdgeKind.SYNC)]).astype(np.int8)
    rg2 = SimpleNamespace(host_ops=_Rows(n_host), gpu_ops=_Rows(n_gpu),
                          edges=SimpleNamespace(src=src.astype(np.int32), dst=dst.astype(np.int32), kind=kind))
    stream_pred, preds, sync_deps = _gpu_deps(rg2)  # type: ignore[arg-type]
    ref_sp = [-1] * n_gpu
    ref_preds: list[list[int]] = [[] for _ in range(n_gpu)]
    for s, d, k in zip(src.tolist(), dst.tolist(), kind.tolist()):
        if k == EdgeKind.STREAM and s != d:
            ref_sp[d - n_host] = s - n_host
    for s, d, k in zip(src.tolist(), dst.tolist(), kind.tolist()):
        if k == EdgeKind.EVENT_WAIT and s != d and s - n_host != ref_sp[d - n_host]:
            ref_preds[d - n_host].append(s - n_host)
    assert stream_pred == ref_sp
    assert preds == ref_preds
    assert sum(map(len, sync_deps.values())) == 50


def test_depth_column_used_only_when_it_agrees() -> None:
    """The table's depth column stands for the counted depths only when it agrees with the parents: wrong
    ones (op 3 at depth 2, every op one level too deep, all zero) give the counted depths, and a parent
    column that is no pre-order is refused whatever the depths say."""
    from cosim.replay.program import _preorder

    parent = np.array([-1, 0, 1, 0, -1, 4])
    ref = _preorder(parent, 0, 6)
    assert ref is not None and ref[1].tolist() == [0, 1, 2, 1, 0, 1] and ref[0].tolist() == [4, 3, 3, 4, 6, 6]
    for depth in ([0, 1, 2, 1, 0, 1], [0, 1, 2, 2, 0, 1], [1, 2, 3, 2, 1, 2], [0, 0, 0, 0, 0, 0]):
        got = _preorder(parent, 0, 6, np.array(depth, np.int16))
        assert got is not None and got[0].tolist() == ref[0].tolist() and got[1].tolist() == ref[1].tolist()
    assert _preorder(np.array([-1, 0, -1, 1]), 0, 4, np.array([0, 1, 0, 2], np.int16)) is None
    sub = _preorder(parent, 1, 4, np.array([0, 1, 2, 1, 0, 1], np.int16))  # a block not starting at 0
    assert sub is None  # op 1's parent lies before the block


def test_compiled_programs_remembered_by_content(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """compile_rank compiles a rank of identical content, durations and settings once per process (a cached
    reload gets the program compiled for the first load); a graph changed in place, other durations or another
    config compile anew; the executor's starting countdown and successor lists compiled with the program are
    those it would build itself; and a replay with the remembered programs gives the same summary."""
    shared = shared_dir()
    rel = "param-dlrm-v100x8/kineto/worker0_step_12.1694128201545.pt.trace.json.gz"
    if shared is None or not (shared / "traces" / rel).exists():
        pytest.skip("../shared not found: real-trace test skipped (set COSIM_SHARED)")
    from cosim.replay import ReplayConfig, replay
    from cosim.replay import program as P
    from cosim.workload import load_trace

    monkeypatch.setenv("COSIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(P, "_PROGRAMS", type(P._PROGRAMS)())
    calls: list[int] = []
    orig = P.compile_program
    monkeypatch.setattr(P, "compile_program", lambda *a, **k: calls.append(1) or orig(*a, **k))
    cfg = ReplayConfig()
    first = load_trace(shared / "traces" / rel)
    again = load_trace(shared / "traces" / rel)  # from the load cache: new arrays, same content
    rg, rg2 = first.ranks[0], again.ranks[0]
    dur = rg.gpu_ops.dur.copy()
    p1 = P.compile_rank(rg, cfg, 4e-6, dur)
    assert P.compile_rank(rg2, cfg, 4e-6, dur.copy()) is p1 and len(calls) == 1
    assert P.compile_rank(rg2, ReplayConfig(host_speed=2.0), 4e-6, dur) is not p1  # another config
    assert P.compile_rank(rg2, cfg, 4e-6, dur * 2) is not p1  # other durations
    assert P.compile_rank(rg2, cfg, 4e-6, dur, offset=1e-3) is not p1
    assert P.rank_digest(rg2)[0] == "cache"  # keyed on its load-cache entry, no byte read
    with pytest.raises(ValueError):
        rg2.host_ops.dur[3] += 1e-6  # a loaded graph's arrays are read-only ...
    with pytest.raises(ValueError):
        rg2.host_ops.dur.flags.writeable = True  # ... and cannot be made writeable
    edited = rg2.host_ops.dur.copy()
    edited[3] += 1e-6
    rg2.host_ops.dur = edited  # assigning a column replaces it by an edited copy: same origin, another content
    assert P.rank_digest(rg2)[0] == "bytes"
    p2 = P.compile_rank(rg2, cfg, 4e-6, dur)
    assert p2 is not p1 and len(calls) == 5
    rg3 = load_trace(shared / "traces" / rel).ranks[0]
    assert P.compile_rank(rg3, cfg, 4e-6, dur) is p1  # the same entry again
    ops = rg3.gpu_ops.columns()
    ops["dur"] = ops["dur"] * 2
    rg4 = dataclasses.replace(rg3, gpu_ops=Table("gpu_ops", len(rg3.gpu_ops), **ops))  # origin copied, table new
    assert rg4.origin is rg3.origin and rg4.cache_identity() is None
    assert P.compile_rank(rg4, cfg, 4e-6, dur) is not p1 and len(calls) == 6
    rg3.strings.append("edited")  # strings are a list: hashed whatever the origin
    assert P.compile_rank(rg3, cfg, 4e-6, dur) is not p1 and len(calls) == 7
    rg3.strings.pop()
    rg3.gpu_ops.dur.shape = (1, -1)  # an array's view changed in place
    assert rg3.cache_identity() is None
    # the countdown and successors compiled with the program are those the executor derives
    assert p1.gpu_waits == [len(p) + 1 + (s >= 0) for p, s in zip(p1.gpu_preds, p1.gpu_stream_pred)]
    succ: list[list[int]] = [[] for _ in p1.gpu_preds]
    for d, ps in enumerate(p1.gpu_preds):
        for p in ps:
            succ[p].append(d)
    for d, p in enumerate(p1.gpu_stream_pred):
        if p >= 0:
            succ[p].append(d)
    assert p1.gpu_succ == succ
    a = replay(first, config=cfg).summary()
    b = replay(load_trace(shared / "traces" / rel), config=cfg).summary()  # its programs from the memo
    assert without_wall_clock(a) == without_wall_clock(b)
