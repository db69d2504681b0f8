"""Run report and proposal report: HTML that parses and holds its figures; proposal JSON fields."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path

import pytest

from cosim.cli import main

SCN = "moe-ep2-decode-dgx-h100"


class _Scan(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.plotly_divs = 0
        self.scripts = 0
        self.headline = ""
        self._in_head = False
        self.tables = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and "plotly-graph-div" in (a.get("class") or ""):
            self.plotly_divs += 1
        if tag == "div" and a.get("id") == "headline":
            self._in_head = True
        if tag == "script":
            self.scripts += 1
        if tag == "table":
            self.tables += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "div":
            self._in_head = False

    def handle_data(self, data: str) -> None:
        if self._in_head:
            self.headline += data


def _scan(path: Path) -> _Scan:
    s = _Scan()
    s.feed(path.read_text())
    s.close()
    return s


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("runs")
    assert main(["run", SCN, "--out", str(d / "base"), "--no-timeline", "--json"]) == 0
    assert main(["run", SCN, "--set", "topology=proposal-example", "--set", "host.speed=4",
                 "--out", str(d / "prop"), "--no-timeline", "--json"]) == 0
    return d / "base", d / "prop"


def test_run_report_html(tmp_path: Path) -> None:
    from cosim.report import run_report_data, write_run_report
    from cosim.scenario import load_scenario, run_scenario

    _, res = run_scenario(load_scenario(SCN))
    p = write_run_report(res, tmp_path / "report.html")
    s = _scan(p)
    assert s.headline.startswith("Step ") and "host-bound" in s.headline and "% of the step" in s.headline
    assert s.plotly_divs >= 6  # breakdown, stress, utilization, links, critical path, timeline
    text = p.read_text()
    assert text.count("plotly.js v") <= 2  # plotly.js embedded once (its banner), offline
    for needle in ("Step-time breakdown", "Utilization of every resource", "Links (PCIe, NVLink, NIC, fabric)",
                   "Critical path", "Timeline overview", "Hardware", "nvlink4", "pcie5x16", "ms"):
        assert needle in text
    d = run_report_data(res)
    kinds = {r["kind"] for r in d["resources"]}
    assert {"sm", "stream", "host_thread"} <= kinds
    assert all(0.0 <= r["share"] <= 1.0 + 1e-9 for r in d["resources"])
    assert {t["link"] for t in d["link_types"]} >= {"nvlink4", "pcie5x16"}
    assert d["stress_points"][0]["kind"] == "host_thread"  # host-bound: the host thread is the busiest resource


def test_proposal_report_json_and_html(runs: tuple[Path, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    base, prop = runs
    capsys.readouterr()
    out = tmp_path / "proposal.html"
    assert main(["report", str(base), str(prop), "--out", str(out), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["schema"] == "cosim.proposal/1"
    b, p = data["baseline"], data["proposals"][0]
    for k in ("step_time_s", "breakdown", "bottleneck", "power_W", "steps_per_s_per_kW", "topology"):
        assert k in b and k in p
    assert p["topology"] == "proposal-example" and b["topology"] == "dgx-h100"
    assert p["speedup"] == pytest.approx(b["step_time_s"] / p["step_time_s"])
    assert p["speedup"] > 1.5  # 4x faster host on a host-bound step
    assert set(p["breakdown_shift_s"]) == set(b["breakdown"])
    assert p["breakdown_shift_s"]["host_bound_gpu_idle"] < 0
    assert isinstance(p["bottleneck_moved"], bool)
    whats = {x["what"] for x in p["hardware_diff"]}
    assert "catalog links.nvlink4.bandwidth" in whats and "parts nic:cx8-xdr800" in whats
    assert any(x["what"] == "replay_config.host_speed" for x in p["scenario_diff"])
    assert p["perf_per_watt_ratio"] is not None and p["perf_per_dollar_ratio"] is None  # no prices in the catalog
    s = _scan(out)
    assert s.plotly_divs >= 1 and "speedup" in s.headline


def test_report_bad_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json" in err[0]


def test_sweep_report_pareto() -> None:
    from cosim.report.sweep import numeric_value, pareto_front

    assert pareto_front([1, 2, 3, 2], [5, 3, 4, 6]) == [0, 1]
    assert numeric_value("25 GB/s") == 25e9 and numeric_value("off") is None and numeric_value("2") == 2.0
