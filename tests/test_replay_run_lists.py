"""The critical-path walk reads RankRun.lists (the executor's lists) in place of the run's arrays: the arrays are
read-only so the two cannot disagree, and both walks give the same paths."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest


def test_a_run_s_arrays_are_read_only_and_its_lists_walk_as_its_arrays() -> None:
    from cosim.replay import replay
    from cosim.replay.executor import BOUND_LAUNCH
    from cosim.replay.summary import critical_path, step_times
    from cosim.resources import shared_dir
    from cosim.workload import load_trace

    root = shared_dir()
    folder = None if root is None else Path(root) / "traces" / "param-dlrm-v100x8" / "kineto"
    if folder is None or not folder.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not present")
    res = replay(load_trace(folder, cache=False))
    rg, prog, run = res.graph.ranks[0], res.programs[0], res.runs[0]
    sim = step_times(rg.gpu_ops.step, run.gpu_start, run.gpu_end, rg.gpu_ops.launch >= 0)
    w, n = sim["window"], sim["n_periods"]
    # the walk reads the executor's lists, so the record's arrays are read-only: an in-place edit (a what-if on the
    # record) fails instead of making the critical path disagree with the breakdown, which reads the arrays
    for a in (run.gpu_start, run.gpu_end, run.gpu_bound, run.gpu_bound_src):
        with pytest.raises(ValueError):
            a[:1] = BOUND_LAUNCH
    plain = dataclasses.replace(run)  # the same arrays, no lists
    assert plain.lists is None
    assert critical_path(rg, prog, run, w, n) == critical_path(rg, prog, plain, w, n)


def test_critical_paths_from_the_executor_s_lists_equal_those_from_the_arrays() -> None:
    """The walk from RankRun.lists (summary._syncs_of, the lists of GPU times and bounds) against the walk from the
    same run's arrays (a copy without lists), per rank of the DLRM job, over its step window and a sub-window.
    (No test compared the two paths: a _syncs_of that returns the wrong releasing ops passes every other test.)"""
    from cosim.replay import replay
    from cosim.replay.summary import critical_paths, step_times
    from cosim.resources import shared_dir
    from cosim.workload import load_trace

    root = shared_dir()
    folder = None if root is None else Path(root) / "traces" / "param-dlrm-v100x8" / "kineto"
    if folder is None or not folder.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not present")
    res = replay(load_trace(folder, cache=False))
    walked = 0
    for rg, prog, run in zip(res.graph.ranks, res.programs, res.runs):
        assert run.lists is not None
        sim = step_times(rg.gpu_ops.step, run.gpu_start, run.gpu_end, rg.gpu_ops.launch >= 0)
        (a, b), n = sim["window"], sim["n_periods"]
        sub = (a + (b - a) / 3, b - (b - a) / 3)
        plain = dataclasses.replace(run)
        assert plain.lists is None
        got = critical_paths(rg, prog, run, (a, b), n, sub)
        assert got == critical_paths(rg, prog, plain, (a, b), n, sub), rg.rank
        walked += bool(got[0].get("total_s"))
    assert walked == len(res.runs)
