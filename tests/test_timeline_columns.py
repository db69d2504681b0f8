"""The timeline written from the run's columns (``cosim.output.timeline._rank_blocks``: no event dicts) is byte for
byte what the event-dict path writes (``rank_events``, ``split_events``, orjson), for a plain run, a coalesced step
with every period drawn, and one with a ``coalesced`` tail standing for the periods not drawn."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import pytest

from cosim.output.timeline import write_timeline
from cosim.scenario import load_scenario, run_scenario


class _DictsOnly:
    """A result that offers ``split_events`` without its columnar twin: the writer takes the event-dict path."""

    def __init__(self, res: Any) -> None:
        self.graph, self.runs = res.graph, res.runs
        split = getattr(res, "split_events", None)
        self.split_events = split if split is not None else (lambda rank, evs: (evs, None))


def _texts(path: Path, res: Any) -> list[bytes]:
    return [gzip.decompress(p.read_bytes()) for p in write_timeline(path / "timeline.json.gz", res)]


def _same(tmp_path: Path, res: Any) -> None:
    want = _texts(tmp_path / "dicts", _DictsOnly(res))
    got = _texts(tmp_path / "columns", res)
    assert len(got) == len(want) > 1
    for g, w in zip(got, want):
        assert g == w


@pytest.fixture(scope="module")
def plain() -> Any:
    return run_scenario(load_scenario("moe-ep4-dgx-h100"))[1]


@pytest.fixture(scope="module")
def coalesced() -> Any:
    res = run_scenario(load_scenario("qwen3-30b-ep8-dgx-h100"))[1]
    if getattr(res, "periodic", None) is None or res.periodic.repeats < 2:
        pytest.skip("the scenario is no longer coalesced")
    return res


def test_plain_run_columns_equal_dicts(tmp_path: Path, plain: Any) -> None:
    _same(tmp_path, plain)


def test_coalesced_step_columns_equal_dicts(tmp_path: Path, coalesced: Any) -> None:
    coalesced._drawn = None
    assert coalesced.drawn_repeats() == coalesced.periodic.repeats
    _same(tmp_path, coalesced)


def test_coalesced_tail_columns_equal_dicts(tmp_path: Path, coalesced: Any) -> None:
    coalesced._drawn = 1  # fewer copies than periods: the "coalesced" span follows the copies
    try:
        _same(tmp_path, coalesced)
        text = gzip.decompress((tmp_path / "columns" / "timeline.json.gz").read_bytes())
        assert b'"cat":"coalesced"' in text
    finally:
        coalesced._drawn = None


@pytest.mark.parametrize("trace", ["hta/simple-add.json.gz", "hta/cpu-only.json.gz", "hta/mi250-rocm.json.gz"])
def test_captured_trace_columns_equal_dicts(tmp_path: Path, trace: str) -> None:
    """Captured traces: their own kernel names, copies with bytes and bandwidth, a trace without GPU ops."""
    from cosim.replay import ReplayConfig, replay
    from cosim.resources import shared_dir

    sh = shared_dir()
    path = sh / "traces" / trace if sh else None
    if path is None or not path.is_file():
        pytest.skip(f"shared trace {trace} absent")
    res = replay(str(path), None, ReplayConfig(collectives="simulated"))
    want = _texts(tmp_path / "dicts", _DictsOnly(res))
    assert _texts(tmp_path / "columns", res) == want
