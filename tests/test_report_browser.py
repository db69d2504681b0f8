"""Reports rendered in a real headless browser (Debian's chromium): what the drawn figures show.

Each page is opened with ``chromium --headless --dump-dom`` after plotly.js ran, and the rendered SVG is read back:
tick labels (axis ranges), bar counts, annotations, titles and the page's tables. Where chromium is absent the
tests skip with a reason (``.ci/run`` installs it).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from cosim.cli import main

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")

SCN = "moe-ep2-decode-dgx-h100"


class _Rendered(HTMLParser):
    """The rendered plotly figures of a page (texts under their SVG classes, bar marks) and the page text."""

    def __init__(self) -> None:
        super().__init__()
        self.figures: list[dict[str, Any]] = []
        self.stack: list[tuple[str, set[str]]] = []
        self.fig_depth: int | None = None
        self.text: list[str] = []
        self.headline = ""
        self._head_depth: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        cls = set((a.get("class") or "").split())
        if tag in ("meta", "br", "img", "input", "link"):
            return
        self.stack.append((tag, cls))
        if tag == "div" and "plotly-graph-div" in cls:
            self.fig_depth = len(self.stack)
            self.figures.append({"texts": [], "bars": 0, "bar_traces": 0})
        if tag == "div" and a.get("id") == "headline":
            self._head_depth = len(self.stack)
        if self.fig_depth is not None:
            f = self.figures[-1]
            anc = set().union(*(c for _, c in self.stack))
            if tag == "g" and {"trace", "bars"} <= cls:
                f["bar_traces"] += 1
            if tag == "path" and "point" in anc and "bars" in anc and "legend" not in anc:
                d = a.get("d") or ""
                if d not in ("", "M0,0Z"):
                    f["bars"] += 1

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            t, _ = self.stack.pop()
            if self.fig_depth is not None and len(self.stack) < self.fig_depth:
                self.fig_depth = None
            if self._head_depth is not None and len(self.stack) < self._head_depth:
                self._head_depth = None
            if t == tag:
                break

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1][0] in ("script", "style"):
            return
        self.text.append(data)
        if self._head_depth is not None:
            self.headline += data
        if self.fig_depth is not None and self.stack and self.stack[-1][0] in ("text", "tspan"):
            anc = set().union(*(c for _, c in self.stack))
            self.figures[-1]["texts"].append((frozenset(anc), data))


def _texts(fig: dict[str, Any], cls: str) -> list[str]:
    return [t for anc, t in fig["texts"] if cls in anc]


def title(fig: dict[str, Any]) -> str:
    return "".join(_texts(fig, "gtitle"))


def render(path: Path, tmp: Path) -> _Rendered:
    """Open ``path`` in headless chromium, let plotly draw, and parse the rendered DOM."""
    profile = tmp / f"chromium-profile-{path.stem}"
    profile.mkdir(parents=True, exist_ok=True)
    cmd = [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", "--window-size=1300,2000", "--virtual-time-budget=8000", "--dump-dom",
           path.resolve().as_uri()]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0 and "</html>" in out.stdout, out.stderr[-2000:]
    r = _Rendered()
    r.feed(out.stdout)
    r.close()
    assert r.figures and all(f["texts"] for f in r.figures), "plotly did not draw the figures"
    return r


def _fig(r: _Rendered, prefix: str) -> dict[str, Any]:
    hits = [f for f in r.figures if title(f).startswith(prefix)]
    assert hits, [title(f) for f in r.figures]
    return hits[0]


def _num(tick: str) -> float:
    return float(tick.replace("%", "").replace(",", "").replace("\u2212", "-"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("browser-runs")
    # one scenario on two topologies, plus a what-if that leaves the step unchanged
    assert main(["run", SCN, "--out", str(d / "base"), "--no-timeline", "--json"]) == 0
    assert main(["run", SCN, "--set", "topology=hgx-b200", "--out", str(d / "b200"), "--no-timeline", "--json"]) == 0
    assert main(["run", SCN, "--set", "links.nvlink4.bandwidth=50 GB/s", "--out", str(d / "nvlink"),
                 "--no-timeline", "--json"]) == 0
    return d


def test_proposal_report_rendered(runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "proposal.html"
    assert main(["report", str(runs / "base"), str(runs / "b200"), str(runs / "nvlink"), "--out", str(out)]) == 0
    capsys.readouterr()
    r = render(out, tmp_path)
    step = _fig(r, "Step time per run")
    labels = _texts(step, "xtick")
    assert labels == ["dgx-h100", "hgx-b200", "dgx-h100, links.nvlink4.bandwidth=50 GB/s"]  # what differs
    assert len(set(labels)) == 3 and step["bars"] == 3  # one bar per run, never one stacked bar
    yt = [_num(t) for t in _texts(step, "ytick")]
    assert yt[0] == 0  # step time anchored at zero
    bar_text = " ".join(_texts(step, "bartext"))
    assert re.search(r"1\.00x \(Δ 0\.0 ms\)", bar_text), bar_text  # the NVLink what-if: no change
    bd = _fig(r, "Step-time breakdown per run")
    assert bd["bar_traces"] == 3  # grouped: one series per run
    cats = _texts(bd, "xtick")
    assert "exposed communication: transfer" in cats and "exposed communication: waiting for peers" in cats
    assert _num(_texts(bd, "ytick")[0]) == 0
    text = "".join(r.text)
    assert "dgx-h100 -> hgx-b200" in text and "moe-ep2-decode-dgx-h100 -> moe-ep2-decode-dgx-h100" not in text
    assert "no effect" in text and "unchanged (Δ 0.0 ms" in r.headline and "host-bound" in r.headline
    assert "2 of 8" in text and "per_gpu_scale" not in text and not re.search(r"\de[+-]\d", text)
    assert "ui.perfetto.dev" in text and "-0.000" not in text


def test_run_report_rendered(runs: Path, tmp_path: Path) -> None:
    r = render(runs / "base" / "report.html", tmp_path)
    for prefix in ("Busiest resources", "GPU streams, SM", "Busiest directed links"):
        f = _fig(r, prefix)
        ticks = _texts(f, "xtick")
        assert ticks[0] == "0%" and ticks[-1] == "100%", (prefix, ticks)  # utilization fixed at 0-100%
    text = "".join(r.text)
    assert "of which waiting for peers" in text and "of which transfer" in text
    assert "2 used by this run, of 8" in text and "per_gpu_scale" not in text
    assert "ui.perfetto.dev" in text and "timeline.json.gz" in text


def test_sweep_report_rendered_noise_is_no_effect(tmp_path: Path) -> None:
    from cosim.report.sweep_report import write_sweep_report

    # a host-speed axis that dominates and an NVLink axis whose effect is 0.03% (as issue 13 saw)
    rows = []
    for i, (bw, hs) in enumerate((a, b) for a in ("25 GB/s", "50 GB/s") for b in ("1", "2")):
        st = 0.1 / float(hs) + (0.0 if bw == "25 GB/s" else 0.00003 / float(hs))
        rows.append({"key": f"k{i}", "status": "ok", "links.nvlink4.bandwidth": bw, "host.speed": hs,
                     "step_time_s": st, "power_W": 1000.0, "cost_usd": None, "bound": "host"})
    p = write_sweep_report(tmp_path / "sweep.html", rows, ["links.nvlink4.bandwidth", "host.speed"], title="t")
    r = render(p, tmp_path)
    assert r.headline.startswith("Best step 50 ms at links.nvlink4.bandwidth=25 GB/s, host.speed=2 (and 1 more")
    text = "".join(r.text)
    assert re.search(r"links\.nvlink4\.bandwidth.*?no effect", text) and "moves the step" in text
    heat = _fig(r, "Step time: host.speed vs links.nvlink4.bandwidth")
    cells = _texts(heat, "hm")  # the heatmap's cell labels
    assert cells.count("no effect") == 2 and "+100.0%" in cells
    for f in r.figures:
        if title(f).startswith("Step time vs links") or title(f).startswith("Step time vs host"):
            assert _num(_texts(f, "ytick")[0]) == 0  # line charts from zero
    # every point within the floor: no "best" at all
    flat = [dict(x, step_time_s=0.051756 + 1e-6 * i) for i, x in enumerate(rows)]
    p2 = write_sweep_report(tmp_path / "flat.html", flat, ["links.nvlink4.bandwidth", "host.speed"], title="f")
    r2 = render(p2, tmp_path)
    assert r2.headline.startswith("No effect: every point's step is 51.8 ms") and "Best" not in r2.headline
    heat2 = _fig(r2, "Step time: host.speed vs")
    assert _texts(heat2, "hm").count("no effect") == 4


def test_tornado_rendered(tmp_path: Path) -> None:
    from cosim.report.sweep_report import write_tornado_report

    def row(key: str, label: str, kind: str, up: float, dn: float) -> dict[str, Any]:
        better, worse = (up, dn) if kind != "time" else (dn, up)
        eff = max(abs(up), abs(dn)) / 100
        return {"key": key, "label": label, "kind": kind, "baseline": "1", "up_value": "1.2", "down_value": "0.8",
                "status": "ok", "up_step_time_s": 0.1 * (1 + up / 100), "down_step_time_s": 0.1 * (1 + dn / 100),
                "up_pct": up, "down_pct": dn, "better_pct": better, "worse_pct": worse, "effect": eff,
                "no_effect": eff < 1e-3}

    data = {"scenario": "s", "baseline_step_time_s": 0.1, "delta": 0.2, "noise_floor": 1e-3,
            "parameters": [row("host.speed", "host speed", "factor", -14.7, 22.4),
                           row("cpus.x.launch_overhead", "launch overhead", "time", 0.6, -0.6),
                           row("links.nvlink4.bandwidth", "nvlink4 bandwidth", "bandwidth", 0.0, 0.0001)]}
    p = write_tornado_report(tmp_path / "tornado.html", data)
    r = render(p, tmp_path)
    assert "host speed: 20% better -> step -14.7%, 20% worse -> step +22.4%" in r.headline
    f = _fig(r, "Change of step time")
    assert f["bar_traces"] == 2 and f["bars"] == 4  # two parameters drawn; the no-effect one is not ranked
    assert set(_texts(f, "ytick")) == {"host speed", "launch overhead"}
    assert "No effect" in "".join(r.text) and "nvlink4 bandwidth" in "".join(r.text)


def test_topology_picture_has_link_labels(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "topo.html"
    assert main(["topo", "draw", "dgx-h100", "--out", str(out)]) == 0
    capsys.readouterr()
    r = render(out, tmp_path)
    labels = _texts(r.figures[0], "annotation")
    assert "18 x nvlink4, 450 GB/s" in labels and "4 x upi, 128 GB/s" in labels
    assert any(t.startswith("1 x pcie5x16, 64 GB/s") for t in labels)
