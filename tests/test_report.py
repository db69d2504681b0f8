"""Run report and proposal report: HTML that parses and holds its figures; proposal JSON fields."""

from __future__ import annotations

import json
import re
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


class _Figures(HTMLParser):
    """The plotly figures of a page, parsed from each ``Plotly.newPlot(id, data, layout)`` call."""

    def __init__(self) -> None:
        super().__init__()
        self.divs: list[str] = []
        self.figures: list[dict] = []
        self._script: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "div" and "plotly-graph-div" in (a.get("class") or ""):
            self.divs.append(str(a.get("id")))
        if tag == "script":
            self._script = []

    def handle_data(self, data: str) -> None:
        if self._script is not None:
            self._script.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != "script" or self._script is None:
            return
        text, self._script = "".join(self._script), None
        i = text.find("Plotly.newPlot(")
        if i < 0:
            return
        dec = json.JSONDecoder()
        args, pos = [], i + len("Plotly.newPlot(")
        for _ in range(3):  # id, data, layout
            while text[pos] in " \n\t,":
                pos += 1
            v, pos = dec.raw_decode(text, pos)
            args.append(v)
        title = args[2].get("title") or {}
        self.figures.append({"id": args[0], "data": args[1], "layout": args[2],
                             "title": title.get("text", "") if isinstance(title, dict) else str(title)})


def plotly_figures(path: Path) -> list[dict]:
    """Every plotly figure of the HTML page at ``path`` (id, data traces, layout, title); each one has its div."""
    f = _Figures()
    f.feed(path.read_text())
    f.close()
    assert [x["id"] for x in f.figures] == f.divs, "a plotly div without its figure (or the other way)"
    return f.figures


def _table_rows(path: Path, table_id: str) -> list[list[str]]:
    """The body rows (cell texts) of the table with ``id=table_id``."""

    class _T(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.rows: list[list[str]] = []
            self._on = self._cell = False
            self._row: list[str] | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "table" and dict(attrs).get("id") == table_id:
                self._on = True
            elif self._on and tag == "tr":
                self._row = []
            elif self._on and tag == "td" and self._row is not None:
                self._row.append("")
                self._cell = True

        def handle_endtag(self, tag: str) -> None:
            if tag == "table":
                self._on = False
            elif tag == "td":
                self._cell = False
            elif tag == "tr" and self._on and self._row:
                self.rows.append(self._row)
                self._row = None

        def handle_data(self, data: str) -> None:
            if self._cell and self._row is not None:
                self._row[-1] += data

    t = _T()
    t.feed(path.read_text())
    t.close()
    return t.rows


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
    # every link with traffic has a row of the full (sortable) link table, not only the busiest 24
    rows = _table_rows(p, "all-links")
    assert len(rows) == len(d["links"]) > 0
    assert {r[0] for r in rows} == {f"{x['src']} -> {x['dst']}" for x in d["links"]}
    # links: the projected D2H copies are on PCIe, collectives on NVLink; shares over the step window
    assert "copies keep their measured or modeled durations" in text
    pcie = next(t for t in d["link_types"] if t["link"] == "pcie5x16")
    assert pcie["with_traffic"] > 0 and pcie["memcpy_bytes"] == pcie["bytes"] > 0
    from cosim.report.run import _step_window

    a, b, n = _step_window(res)
    busy = res.link_usage.busy(a, b)
    for x in d["links"]:
        i = res.link_usage.link_id[(x["src"], x["dst"])]
        assert x["busy_share"] == pytest.approx(busy[i] / (b - a)) and x["busy_s_per_step"] == pytest.approx(busy[i] / n)
        assert 0.0 < x["busy_share"] <= 1.0 and x["busy_time_s"] >= busy[i] - 1e-15
    links_sp = [x for x in d["stress_points"] if x["kind"].startswith("link:")]
    assert all(x["share"] == next(lk["busy_share"] for lk in d["links"] if x["what"].startswith(
        f"link {lk['src']} -> {lk['dst']} ")) for x in links_sp)
    figs = plotly_figures(p)
    assert len(figs) == s.plotly_divs
    busiest = next(f for f in figs if f["title"].startswith("Busiest directed links"))
    assert len(busiest["data"][0]["y"]) == min(24, len(d["links"]))


def test_run_report_lists_more_than_24_links(tmp_path: Path) -> None:
    from cosim.report import run_report_data, write_run_report
    from cosim.scenario import load_scenario, run_scenario

    # one rank per node on a cluster: the all-to-alls cross PCIe switches, NICs and the fabric
    _, res = run_scenario(load_scenario(SCN), {"topology": "dgx-h100-4node", "replay.ranks_per_node": "1"})
    d = run_report_data(res)
    p = write_run_report(res, tmp_path / "report.html")
    rows = _table_rows(p, "all-links")
    assert len(rows) == len(d["links"])
    kinds = {r[2] for r in rows}
    assert {"pcie", "infiniband"} <= kinds
    text = p.read_text()
    assert 'class="sortable"' in text and "<details" in text


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
    assert s.plotly_divs >= 1 and "x faster (Δ -" in s.headline
    assert p["label"] == "proposal-example, host_speed=4" and b["label"] == "dgx-h100, host_speed=1"
    assert re.fullmatch(r"\d\.\d\dx \(Δ -\d+\.\d ms\)", p["speedup_text"])
    assert not p["vs_baseline"]["unchanged"] and p["vs_baseline"]["bound"] == "host"
    assert "host_bound_gpu_idle" not in s.headline and "-bound" in s.headline
    html = out.read_text()
    # the hardware diff prints values with their units
    assert "450 GB/s" in html and "900 GB/s" in html  # per-GPU scale-up bandwidth, baseline and proposal
    assert not re.search(r"<td[^>]*>[0-9.]+e[+-]?[0-9]+</td>", html)


def test_report_bad_dir_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path), str(tmp_path), "--out", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "summary.json" in err[0]


def test_sweep_report_pareto() -> None:
    from cosim.report.sweep_report import numeric_value, pareto_front

    assert pareto_front([1, 2, 3, 2], [5, 3, 4, 6]) == [0, 1]
    assert numeric_value("25 GB/s") == 25e9 and numeric_value("off") is None and numeric_value("2") == 2.0


def test_hardware_values_have_units() -> None:
    from cosim.report.hardware import fmt_hw_value

    assert fmt_hw_value("figure per_gpu_scale_up_bw_Bps", 1.8e12) == "1.8 TB/s"
    assert fmt_hw_value("catalog links.nvlink4.bandwidth", 2.5e10) == "25 GB/s"
    assert fmt_hw_value("catalog nics.cx7-ndr400.latency", 1e-6) == "1 us"
    assert fmt_hw_value("catalog accelerators.h100-sxm5.peak_flops.bf16", 9.89e14) == "989 TFLOP/s"
    assert fmt_hw_value("catalog accelerators.h100-sxm5.tdp", 700.0) == "700 W"
    assert fmt_hw_value("parts nic:cx8-xdr800", 8) == "8"


def test_sweep_report_figures(tmp_path: Path) -> None:
    from cosim.report.sweep_report import write_sweep_report

    rows = []
    for i, (bw, hs) in enumerate((a, b) for a in ("25 GB/s", "50 GB/s") for b in ("1", "2")):
        rows.append({"key": f"k{i}", "status": "ok", "links.nvlink4.bandwidth": bw, "host.speed": hs,
                     "step_time_s": 0.01 / float(hs) + (0.001 if bw == "25 GB/s" else 0.0),
                     "power_W": 1000.0 + 100 * i, "cost_usd": None, "compute_s": 0.001})
    p = write_sweep_report(tmp_path / "r.html", rows, ["links.nvlink4.bandwidth", "host.speed"], title="t")
    figs = plotly_figures(p)
    lines = [f for f in figs if f["title"].startswith("Step time vs ") and f["title"] != "Step time vs power_W"]
    assert sorted(f["title"] for f in lines) == ["Step time vs host.speed", "Step time vs links.nvlink4.bandwidth"]
    for f in lines:  # one line per combination of the other parameter, two points each
        assert len(f["data"]) == 2 and all("lines" in t["mode"] and len(t["y"]) == 2 for t in f["data"])
    by_bw = next(f for f in lines if f["title"] == "Step time vs links.nvlink4.bandwidth")
    assert by_bw["data"][0]["x"] == ["25 GB/s", "50 GB/s"] and by_bw["data"][0]["y"] == pytest.approx([11.0, 10.0])
    heat = [f for f in figs if f["data"] and f["data"][0]["type"] == "heatmap"]
    assert len(heat) == 1  # one pair of parameters
    z = heat[0]["data"][0]["z"]
    assert [row for row in z] == [pytest.approx([120.0, 100.0]), pytest.approx([20.0, 0.0])]  # % over the best
    pareto = next(f for f in figs if f["title"] == "Step time vs power_W")
    front = next(t for t in pareto["data"] if t["name"] == "Pareto front")
    assert front["x"] == pytest.approx([1.0, 1.1, 1.3]) and front["y"] == pytest.approx([11.0, 6.0, 5.0])
    assert not any(f["title"] == "Step time vs cost_usd" for f in figs)  # no prices: no cost front


def test_run_labels_say_what_differs(runs: tuple[Path, Path]) -> None:
    from cosim.report.proposal import load_run_dir, run_labels

    base, prop = runs
    b, p = load_run_dir(base), load_run_dir(prop)
    assert run_labels([b, p]) == ["dgx-h100, host_speed=1", "proposal-example, host_speed=4"]
    assert run_labels([b, b]) == ["base #1", "base #2"]  # nothing differs: the folder, numbered
    assert b["run"]["hardware"]["gpus"] == 2 and b["run"]["hardware"]["topology_gpus"] == 8  # 2 ranks: 2 GPUs
    assert b["run"]["power_W"] < 8 * 700  # only the GPUs the run used (with their CPUs and NICs)


def test_explain_change_by_hand() -> None:
    from cosim.replay.summary import explain_change, fmt_delta

    cp = {"bound": "host", "by_resource": {"host": 0.08, "gpu": 0.02}}
    links = {"nvlink4": {"kind": "nvlink", "link": "gpu0 -> nvswitch0", "busy_s_per_step": 2e-6,
                         "busy_share": 2e-6 / 0.1}}
    base = {"step_time_s": 0.1, "critical_path": cp, "busiest_links": links, "config": {"catalog_overrides": {}}}
    same = dict(base, step_time_s=0.1 + 3e-6, config={"catalog_overrides": {"links.nvlink4.bandwidth": "50 GB/s"}})
    e = explain_change(base, same)
    assert e["unchanged"] and e["text"] == ("unchanged (Δ 0.0 ms, below the 0.1% noise floor): host-bound (host 80% "
                                            "of the critical path); NVLink busy <0.01% of the step (2 us per step)")
    fast = dict(base, step_time_s=0.08)
    e = explain_change(base, fast)
    assert not e["unchanged"] and e["speedup"] == 1.25 and e["text"].startswith("1.25x faster (Δ -20.0 ms, -20.0%)")
    assert fmt_delta(-1e-7, 0.09) == "0.0 ms" and fmt_delta(-0.0401, 0.0908) == "-40.1 ms"


def test_exposed_communication_split() -> None:
    from cosim.scenario import load_scenario, run_scenario

    _, res = run_scenario(load_scenario(SCN))
    s = res.summary()
    for r in [s, *s["ranks"]]:
        sp = r["exposed_communication_split"]
        assert sp["transfer_s"] + sp["wait_for_peers_s"] == pytest.approx(r["breakdown"]["exposed_communication"])
    # host-bound: the collectives mostly wait for the slower rank's launch; the transfer is short
    sp = s["exposed_communication_split"]
    assert sp["wait_for_peers_s"] > 10 * sp["transfer_s"] > 0
    # transfer can be no longer than the collectives' intervals after their last peer arrived
    from cosim.replay.program import is_comm

    run, rg = res.runs[0], res.graph.ranks[0]
    comm = is_comm(rg.gpu_ops.cls) & (rg.gpu_ops.collective >= 0)
    assert (run.gpu_meet[comm] >= run.gpu_start[comm]).all() and (run.gpu_meet[comm] <= run.gpu_end[comm]).all()
    assert s["busiest_links"] and all(0 < x["busy_share"] <= 1 for x in s["busiest_links"].values())
    assert [r["gpu"] for r in s["ranks"]] == ["gpu0", "gpu1"]


def test_coalesced_run_report_measures_the_full_step() -> None:
    """The default scenario's step is coalesced (a probe of 3 of its 8 micro-batches per pipeline, extended by its
    period): the report's busy time per resource and link is the full step's, as in the plain run of every
    micro-batch (within 2% of the step), not the probe's."""
    from cosim.report.run import run_report_data
    from cosim.scenario import load_scenario, run_scenario

    scn = load_scenario("qwen3-30b-ep8-dgx-h100")
    _, co = run_scenario(scn)
    _, plain = run_scenario(scn, {"workload.synthetic.coalesce": "false"})
    assert co.summary()["coalesced"]["repeats"] > 0 and "coalesced" not in plain.summary()
    dc, dp = run_report_data(co), run_report_data(plain)
    step = dp["step_time_s"]
    assert dc["step_time_s"] == pytest.approx(step, rel=5e-3)
    want = {r["resource"]: r for r in dp["resources"]}
    assert {r["resource"] for r in dc["resources"]} == set(want)
    for r in dc["resources"]:
        assert r["busy_s_per_step"] <= dc["step_time_s"] * (1 + 1e-9)
        assert r["busy_s_per_step"] == pytest.approx(want[r["resource"]]["busy_s_per_step"], abs=0.02 * step)
        assert r["share"] == pytest.approx(want[r["resource"]]["share"], abs=0.02)
    links = {(x["src"], x["dst"]): x for x in dp["links"]}
    for x in dc["links"]:
        y = links[(x["src"], x["dst"])]
        assert x["busy_s_per_step"] == pytest.approx(y["busy_s_per_step"], abs=0.02 * step)
        assert x["step_load"] == pytest.approx(y["step_load"], abs=0.02)


def test_run_report_tables_show_the_busiest_rows_and_report_json_every_row(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``TABLE_ROWS`` rows the page lists the busiest (busy share, descending), says how busy the rest are at
    most, and report.json beside it holds every resource and link (what run_report_data gives)."""
    import cosim.report.run as rr
    from cosim.report.html import fmt_pct
    from cosim.scenario import load_scenario, run_scenario

    _, res = run_scenario(load_scenario(SCN), {"topology": "dgx-h100-4node", "replay.ranks_per_node": "1"})
    d = rr.run_report_data(res)
    keep = 5
    assert len(d["links"]) > keep and len(d["resources"]) > keep
    monkeypatch.setattr(rr, "TABLE_ROWS", keep)
    p = rr.write_run_report(res, tmp_path / "report.html")
    links = _table_rows(p, "all-links")
    assert [r[0] for r in links] == [f"{x['src']} -> {x['dst']}" for x in d["links"][:keep]]
    shares = sorted((r["share"] for r in d["resources"]), reverse=True)
    got = _table_rows(p, "resources")
    assert len(got) == keep
    by_name = {r["resource"]: r["share"] for r in d["resources"]}
    assert sorted((by_name[r[0]] for r in got), reverse=True) == shares[:keep]
    text = p.read_text()
    n = len(d["links"])
    assert f"The {keep} busiest of {n:,} directed links with traffic; each of the other {n - keep:,} is busy at most " \
           f"{fmt_pct(d['links'][keep]['busy_share'], 2)} of the step window" in text
    assert f"busiest of {len(d['resources']):,} resources" in text
    full = json.loads((tmp_path / "report.json").read_text())
    assert full["schema"] == "cosim.run-report/1"
    assert [(x["src"], x["dst"], x["busy_share"]) for x in full["links"]] == \
        [(x["src"], x["dst"], x["busy_share"]) for x in d["links"]]
    assert [r["resource"] for r in full["resources"]] == [r["resource"] for r in d["resources"]]


def test_timeline_busy_prefix_sums_match_the_clipped_sum() -> None:
    """The heatmap's busy time before each bin edge (prefix sums over the merged intervals) is the sum over every
    interval of its part before the edge: by hand on three intervals, and on 2,000 random ones."""
    import numpy as np

    from cosim.replay.summary import merge_intervals
    from cosim.report.run import _busy_before

    ms, me = np.array([1.0, 3.0, 6.0]), np.array([2.0, 5.0, 6.5])
    x = np.array([0.0, 1.0, 1.5, 2.5, 4.0, 6.25, 9.0])
    assert _busy_before(ms, me, x).tolist() == [0.0, 0.0, 0.5, 1.0, 2.0, 3.25, 3.5]
    rng = np.random.default_rng(3)
    s = np.sort(rng.uniform(0, 1, 2000))
    ms, me = merge_intervals(s, s + rng.uniform(0, 2e-3, 2000))
    x = np.linspace(-0.1, 1.1, 301)
    want = np.clip(x[:, None] - ms[None, :], 0, (me - ms)[None, :]).sum(axis=1)
    assert np.abs(_busy_before(ms, me, x) - want).max() <= 1e-12
