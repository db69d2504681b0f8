"""The critical path of a coalesced step's repeated period comes from the probe's own walk
(:func:`cosim.replay.summary.critical_paths`): identical to a walk of its own, to the last bit."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cosim.replay import summary as sm


@pytest.fixture(scope="module")
def coalesced() -> Any:
    from cosim.scenario import load_scenario, run_scenario

    _, res = run_scenario(load_scenario("qwen3-30b-ep8-dgx-h100"))
    assert res.periodic is not None and res.periodic.repeats > 0
    return res


def _window(rg: Any, run: Any) -> tuple[tuple[float, float], int]:
    st = sm.step_times(rg.gpu_ops.step, run.gpu_start, run.gpu_end, rg.gpu_ops.launch >= 0)
    return st["window"], st["n_periods"]


def test_the_period_path_is_the_walk_of_its_own_in_one_walk(coalesced: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    per = coalesced.periodic
    walks = []
    real = sm._walk

    def spy(*a: Any) -> Any:
        walks.append(a[3])
        return real(*a)

    checked = 0
    for rg, prog, run in zip(coalesced.graph.ranks, coalesced.programs, coalesced.runs):
        cut = per.cut.get(rg.rank)
        if cut is None:
            continue
        w, n = _window(rg, run)
        sub = (cut - per.period_s, cut)
        want = sm.critical_path(rg, prog, run, w, n), sm.critical_path(rg, prog, run, sub, 1)
        monkeypatch.setattr(sm, "_walk", spy)
        walks.clear()
        got = sm.critical_paths(rg, prog, run, w, n, sub)
        monkeypatch.setattr(sm, "_walk", real)
        assert got == want  # floats compared exactly
        assert len(walks) == 1  # the probe's walk met the period's start: no second walk
        assert want[1]["total_s"] > 0
        checked += 1
    assert checked == len(coalesced.graph.ranks)


def test_any_window_inside_the_step_agrees(coalesced: Any) -> None:
    """Windows the probe's walk may or may not meet (then walked on their own), a window reaching before the step,
    one past its end, an empty one: always what a walk of their own gives."""
    rng = np.random.default_rng(7)
    for rg, prog, run in zip(coalesced.graph.ranks, coalesced.programs, coalesced.runs):
        (a, b), n = _window(rg, run)
        subs = [(a - 1e-3, b), (a, b + 1e-3), (b, b + 1e-3), (a, a)]
        for _ in range(12):
            x, y = sorted(rng.uniform(a, b, 2))
            subs.append((float(x), float(y)))
        subs.append((float(run.gpu_start[0]), float(run.gpu_end[0])))
        for sub in subs:
            got = sm.critical_paths(rg, prog, run, (a, b), n, sub)
            assert got == (sm.critical_path(rg, prog, run, (a, b), n), sm.critical_path(rg, prog, run, sub, 1)), sub


def test_the_coalesced_summary_keeps_its_figures(coalesced: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full step's summary with the period's path from the probe's walk equals the one with a walk of its own
    (``critical_paths`` made to walk the period apart)."""
    from cosim.replay.periodic import extend_figures

    got = extend_figures(coalesced, coalesced.periodic)
    real = sm.critical_paths

    def apart(rg: Any, prog: Any, run: Any, w: Any, n: Any, sub: Any) -> Any:
        return real(rg, prog, run, w, n, None)[0], (sm.critical_path(rg, prog, run, sub, 1) if sub else None)

    monkeypatch.setattr(sm, "critical_paths", apart)
    assert extend_figures(coalesced, coalesced.periodic) == got
