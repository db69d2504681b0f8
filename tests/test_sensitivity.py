"""Sensitivity: a host-bound capture ranks host and launch parameters on top; the GPU-bound default (a synthetic
MoE training step) ranks the GPU's compute first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.sensitivity import parse_delta, run_sensitivity


def test_host_bound_capture_ranks_host_first(tmp_path: Path) -> None:
    params = ["host.speed", "cpus.xeon-8480c.launch_overhead", "links.nvlink4.bandwidth",
              "accelerators.h100-sxm5.hbm_bandwidth", "accelerators.h100-sxm5.peak_flops"]
    d = run_sensitivity("moe-ep4-dgx-h100", tmp_path, params=params, delta=0.2, progress=False)
    assert d["schema"] == "cosim.sensitivity/1" and d["baseline_bound"] == "host"
    keys = [e["key"] for e in d["parameters"]]
    assert keys[0] == "host.speed"
    assert keys[1] == "cpus.xeon-8480c.launch_overhead"
    top = d["parameters"][0]
    assert top["up_pct"] < -5 and top["down_pct"] > 5  # faster host: shorter step
    assert top["better_pct"] == top["up_pct"] and not top["no_effect"]
    from cosim.report.sweep_report import tornado_headline

    assert f"host time / speed): 20% better -> step {top['up_pct']:+.1f}%" in tornado_headline(d)
    lo = d["parameters"][1]
    assert lo["up_pct"] > 0 > lo["down_pct"]  # more launch overhead: longer step
    assert lo["better_pct"] == lo["down_pct"] < 0  # less overhead is better
    for e in d["parameters"][2:]:  # GPU-side parameters barely matter on a host-bound step
        assert e["effect"] < 0.01
    from test_report import plotly_figures

    figs = plotly_figures(tmp_path / "tornado.html")
    assert len(figs) == 1 and "tornado" in figs[0]["title"]
    bars = figs[0]["data"]
    assert [t["type"] for t in bars] == ["bar", "bar"] and all(t["orientation"] == "h" for t in bars)
    labels = [e["label"] for e in d["parameters"] if not e["no_effect"]]  # no-effect ones are not ranked
    assert bars[0]["y"] == labels[::-1] and bars[1]["y"] == labels[::-1]  # one bar per parameter, largest on top
    assert bars[0]["x"][-1] == pytest.approx(top["better_pct"]) and bars[1]["x"][-1] == pytest.approx(top["worse_pct"])
    assert json.loads((tmp_path / "sensitivity.json").read_text())["parameters"][0]["key"] == "host.speed"


def test_gpu_bound_default_ranks_compute_above_the_host(tmp_path: Path) -> None:
    d = run_sensitivity(None, tmp_path, params=["host.speed", "accelerators.h100-sxm5.peak_flops.bf16"], delta=0.2,
                        progress=False)
    assert d["baseline_bound"] == "gpu"
    by = {e["key"]: e for e in d["parameters"]}
    flops, host = by["accelerators.h100-sxm5.peak_flops.bf16"], by["host.speed"]
    assert d["parameters"][0]["key"] == "accelerators.h100-sxm5.peak_flops.bf16"
    assert flops["better_pct"] < -1 and flops["worse_pct"] > 1  # more FLOP/s: a shorter step
    # the eager host (12 us per launch, a GEMM launch per local expert) is close behind: a 20% slower host costs
    # 8% on the default Qwen3-30B EP8 step, 20% fewer FLOP/s 10%
    assert host["effect"] < flops["effect"]


def test_bad_inputs() -> None:
    assert parse_delta("20%") == pytest.approx(0.2) and parse_delta("0.1") == pytest.approx(0.1)
    with pytest.raises(CosimInputError):
        parse_delta("150%")
    with pytest.raises(CosimInputError, match="no such parameter"):
        run_sensitivity(None, "/nonexistent-never-written", params=["warp.drive"], progress=False)


def test_nic_bandwidth_raised_speeds_up_a_nic_bound_step(tmp_path: Path) -> None:
    # 2 ranks on 2 nodes with a fast host and slow (10 Gb/s) NIC ports: the all-to-alls wait on the NICs
    sets = {"topology": "dgx-h100-4node", "replay.ranks_per_node": "1", "host.speed": "100",
            "nics.cx7-ndr400.port_bandwidth": "10 Gb/s"}
    d = run_sensitivity("moe-ep2-decode-dgx-h100", tmp_path, delta=0.2, sets=sets, progress=False,
                        params=["nics.cx7-ndr400.port_bandwidth", "links.ib-ndr.bandwidth"])
    by = {e["key"]: e for e in d["parameters"]}
    nic = by["nics.cx7-ndr400.port_bandwidth"]
    assert nic["baseline"] == "1.25 GB/s"  # the port rate: min(NIC, link type), in engineering units
    assert nic["up_pct"] < 0 < nic["down_pct"]  # a faster NIC port shortens the step, a slower one lengthens it
    link = by["links.ib-ndr.bandwidth"]
    assert link["up_pct"] == 0.0 and link["down_pct"] > 0  # the link type alone cannot go above the NIC


def test_synthetic_scenario_offers_no_projection_knob(tmp_path: Path) -> None:
    """A synthesized step has no CPU capture to project: `projection.*` is refused on it (check_capture_knobs), so
    offering projection.aten_overhead made both of its runs fail on the default scenario."""
    from cosim.scenario import load_scenario
    from cosim.sensitivity import candidate_params

    keys = [p.key for p in candidate_params(load_scenario(None))]
    assert "host.speed" in keys and not any(k.startswith("projection.") for k in keys)
    d = run_sensitivity(None, tmp_path, params=["host.speed"], delta=0.2, progress=False)
    assert not any(e.get("failed") for e in d["parameters"])
