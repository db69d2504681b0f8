"""Sensitivity: the host-bound default scenario ranks host and launch parameters on top."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.sensitivity import parse_delta, run_sensitivity


def test_default_scenario_ranks_host_first(tmp_path: Path) -> None:
    params = ["host.speed", "cpus.xeon-8480c.launch_overhead", "links.nvlink4.bandwidth",
              "accelerators.h100-sxm5.hbm_bandwidth", "accelerators.h100-sxm5.peak_flops"]
    d = run_sensitivity(None, tmp_path, params=params, delta=0.2, progress=False)
    assert d["schema"] == "cosim.sensitivity/1" and d["baseline_bound"] == "host"
    keys = [e["key"] for e in d["parameters"]]
    assert keys[0] == "host.speed"
    assert keys[1] == "cpus.xeon-8480c.launch_overhead"
    top = d["parameters"][0]
    assert top["up_pct"] < -5 and top["down_pct"] > 5  # faster host: shorter step
    lo = d["parameters"][1]
    assert lo["up_pct"] > 0 > lo["down_pct"]  # more launch overhead: longer step
    for e in d["parameters"][2:]:  # GPU-side parameters barely matter on a host-bound step
        assert e["effect"] < 0.01
    html = (tmp_path / "tornado.html").read_text()
    assert "plotly-graph-div" in html and "tornado" in html
    assert json.loads((tmp_path / "sensitivity.json").read_text())["parameters"][0]["key"] == "host.speed"


def test_bad_inputs() -> None:
    assert parse_delta("20%") == pytest.approx(0.2) and parse_delta("0.1") == pytest.approx(0.1)
    with pytest.raises(CosimInputError):
        parse_delta("150%")
    with pytest.raises(CosimInputError, match="no such parameter"):
        run_sensitivity(None, "/nonexistent-never-written", params=["warp.drive"], progress=False)
