"""A synthetic scenario file's own capture knobs (``set: {profile: ...}``, ``replay: {durations: modeled}``) are
refused at their line as ``--set profile=...`` is (f0dffc9): the run ignored them and its note blamed "the trace's
measured" durations (s15-rev)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.scenario import load_scenario
from tests._cli import one_error_line

_SCN = """name: own
workload:
  synthetic:
    model: tiny-moe
    layout: {{ep: 2}}
    batch: {{global: 8, micro: 1, seq: 128}}
topology: dgx-h100
{extra}"""


@pytest.mark.parametrize(("extra", "where", "problem"), [
    ("set:\n  profile: b300\n", ":9:12: set.profile:", "re-predicts a captured trace's measured kernel times"),
    ("set:\n  models.profile: b300\n", ":9:19: set.models.profile:", "set workload.synthetic.profile"),
    ("set:\n  projection.dtype: fp8\n", ":9:21: set.projection.dtype:", "projection.* knobs project a captured"),
    ("replay:\n  durations: modeled\n", ":9:14: replay.durations:", "re-predicts a captured trace's measured"),
    ("replay:\n  profile: b300\n", ":9:12: replay.profile:", "set workload.synthetic.profile"),
    ("replay:\n  cuda_graphs: [fwd]\n", ":9:16: replay.cuda_graphs:", "workload.synthetic.layout.cuda_graphs=true"),
])
def test_own_capture_knobs_of_a_synthetic_scenario(extra: str, where: str, problem: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(_SCN.format(extra=extra))
    line = one_error_line(["run", str(f), "--out", str(tmp_path / "o"), "--no-progress"], capsys, tmp_path / "o")
    assert line.startswith(f"cosim: error: {f}{where}"), line
    assert problem in line, line


@pytest.mark.parametrize("extra", ["set:\n  host.speed: 2\n", "replay:\n  durations: measured\n  collectives: simulated\n",
                                   "replay:\n  profile: null\n  cuda_graphs: []\n"])
def test_knobs_a_synthetic_step_has_still_load(extra: str, tmp_path: Path) -> None:
    f = tmp_path / "s.yaml"
    f.write_text(_SCN.format(extra=extra))
    load_scenario(f)
