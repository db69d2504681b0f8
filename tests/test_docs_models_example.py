"""docs/MODELS.md's precision example names the capture scenario it needs, and its figures hold."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from cosim.scenario import load_scenario, run_scenario

DOC = Path(__file__).resolve().parents[1] / "docs" / "MODELS.md"


def _example_lines() -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in DOC.read_text().splitlines():
        m = re.match(r"cosim run (.*?)\s+# step ([\d.]+) ms$", line)
        if m:
            args = shlex.split(m.group(1))
            assert args and not args[0].startswith("--"), f"{line!r}: name the scenario (precision.* needs a capture)"
            sets = dict(a.split("=", 1) for a in args[2::2])
            assert all(a == "--set" for a in args[1::2]), line
            out.append((args[0], sets, float(m.group(2))))
    return out


def test_models_precision_example_runs() -> None:
    lines = _example_lines()
    assert len(lines) == 2
    for scenario, sets, want_ms in lines:
        _, res = run_scenario(load_scenario(scenario), sets)
        assert res.summary()["step_time_s"] * 1e3 == pytest.approx(want_ms, rel=0.005), (scenario, sets)
