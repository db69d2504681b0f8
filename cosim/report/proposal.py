"""Proposal report: a baseline run against one or more proposal runs.

Inputs are folders written by ``cosim run`` (``summary.json`` and the resolved
``scenario.yaml`` with its ``replay_config``). For each proposal: step time and
speedup, how the breakdown shifted and whether the bottleneck moved, what
changed in the hardware (topology figures, parts, links, catalog fields and
overrides, scenario fields), and performance per watt and per dollar where the
catalog has TDPs and prices (sum over the topology's GPUs, CPUs and NICs).

JSON (``cosim report --json``), schema ``cosim.proposal/1``::

    {"schema", "baseline": RUN, "proposals": [RUN + {"speedup", "breakdown_shift_s",
     "bottleneck_moved", "bottleneck_from", "bottleneck_to", "hardware_diff": [{what, baseline, proposal}],
     "scenario_diff": [...], "perf_per_watt_ratio", "perf_per_dollar_ratio"}]}

where RUN is ``{"name", "dir", "step_time_s", "steps_per_s", "breakdown", "bottleneck", "critical_path_bound",
"topology", "power_W", "cost_usd", "steps_per_s_per_kW", "steps_per_s_per_kusd", "catalog_overrides"}``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError
from cosim.report.hardware import flatten, fmt_hw_value, hardware_diff, hardware_totals
from cosim.report.html import Page, fmt_pct, fmt_time
from cosim.report.run import BREAKDOWN_LABELS, headline

__all__ = ["bound_words", "load_run_dir", "proposal_report", "write_proposal_report"]


def _load_topology(scn: dict[str, Any], d: Path) -> Any:
    """The run's hardware: its topology with the catalog overrides and ``topology.<path>`` knobs it ran with."""
    from cosim.scenario import build_topology, split_topology_sets

    rc = scn.get("replay_config") or {}
    ref = rc.get("topology") or scn.get("topology") or "dgx-h100"
    overrides = dict(rc.get("catalog_overrides") or {}) or None
    tsets, _ = split_topology_sets({str(k): str(v) for k, v in (scn.get("set") or {}).items()})
    src = scn.get("source_file")
    return build_topology(str(ref), Path(src).parent if src else None, overrides, tsets)


def load_run_dir(d: str | Path) -> dict[str, Any]:
    """Read a ``cosim run`` output folder: summary, resolved scenario, topology and hardware totals."""
    import yaml

    p = Path(d)
    sp, cp = p / "summary.json", p / "scenario.yaml"
    if not sp.is_file():
        raise CosimInputError("no summary.json here: not a folder written by `cosim run`", file=p)
    try:
        summary = json.loads(sp.read_text())
    except ValueError as exc:
        raise CosimInputError(f"not JSON: {exc}", file=sp) from None
    scn: dict[str, Any] = {}
    if cp.is_file():
        try:
            scn = yaml.safe_load(cp.read_text()) or {}
        except yaml.YAMLError as exc:
            raise CosimInputError(f"bad YAML: {exc}".splitlines()[0], file=cp) from None
    if not scn:
        scn = {"name": p.name, "topology": summary.get("topology"), "replay_config": summary.get("config") or {}}
    topo = _load_topology(scn, p)
    hw = hardware_totals(topo)
    st = summary.get("step_time_s")
    bd = summary.get("breakdown") or {}
    sps = (1.0 / st) if st else None
    run = {
        "name": scn.get("name") or p.name,
        "dir": str(p),
        "step_time_s": st,
        "steps_per_s": sps,
        "breakdown": bd,
        "bottleneck": max(bd, key=lambda k: bd[k]) if bd else None,
        "critical_path_bound": (summary.get("critical_path") or {}).get("bound"),
        "headline": headline(summary),
        "topology": topo.name,
        "figures": topo.figures(),
        "hardware": hw,
        "power_W": hw["power_W"],
        "cost_usd": hw["cost_usd"],
        "steps_per_s_per_kW": (sps / (hw["power_W"] / 1e3)) if (sps and hw["power_W"]) else None,
        "steps_per_s_per_kusd": (sps / (hw["cost_usd"] / 1e3)) if (sps and hw["cost_usd"]) else None,
        "catalog_overrides": dict((scn.get("replay_config") or {}).get("catalog_overrides") or {}),
    }
    return {"run": run, "topology": topo, "scenario": scn}


def _scenario_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    fa, fb = flatten(a), flatten(b)
    skip = ("name", "description", "source_file", "replay_config.record_timeline")
    return [{"what": k, "baseline": fa.get(k), "proposal": fb.get(k)} for k in sorted(fa.keys() | fb.keys())
            if not k.startswith(skip) and fa.get(k) != fb.get(k)]


def _ratio(a: float | None, b: float | None) -> float | None:
    return (b / a) if (a and b) else None


def proposal_report(baseline: str | Path, proposals: list[str | Path]) -> dict[str, Any]:
    """Compare ``proposals`` (run folders) with ``baseline``; the ``cosim.proposal/1`` dict."""
    if not proposals:
        raise CosimInputError("give at least one proposal folder after the baseline")
    b = load_run_dir(baseline)
    base = b["run"]
    out = []
    for d in proposals:
        p = load_run_dir(d)
        r = dict(p["run"])
        bst, pst = base["step_time_s"], r["step_time_s"]
        r["speedup"] = (bst / pst) if (bst and pst) else None
        r["breakdown_shift_s"] = {k: (r["breakdown"].get(k, 0.0) - base["breakdown"].get(k, 0.0))
                                  for k in base["breakdown"]}
        r["bottleneck_from"] = base["bottleneck"]
        r["bottleneck_to"] = r["bottleneck"]
        r["bottleneck_moved"] = base["bottleneck"] != r["bottleneck"]
        r["hardware_diff"] = hardware_diff(b["topology"], p["topology"])
        r["scenario_diff"] = _scenario_diff(b["scenario"], p["scenario"])
        r["perf_per_watt_ratio"] = _ratio(base["steps_per_s_per_kW"], r["steps_per_s_per_kW"])
        r["perf_per_dollar_ratio"] = _ratio(base["steps_per_s_per_kusd"], r["steps_per_s_per_kusd"])
        out.append(r)
    return {"schema": "cosim.proposal/1", "baseline": base, "proposals": out}


_BOUND_WORDS = {
    "compute": "compute-bound (running kernels is the largest part of the step)",
    "exposed_communication": "communication-bound (exposed communication is the largest part of the step)",
    "memcpy": "copy-bound (memcpy/memset is the largest part of the step)",
    "host_bound_gpu_idle": "host-bound (the GPU waiting for launches is the largest part of the step)",
    "other_idle": "dependency-bound (the GPU waiting on peers is the largest part of the step)",
}


def bound_words(part: str | None, short: bool = False) -> str:
    """A breakdown part as the bottleneck it means, in words: "host-bound (the GPU waiting for launches is the
    largest part of the step)", or with ``short`` just "host-bound"."""
    words = _BOUND_WORDS.get(str(part), f"bound by {part}")
    return words.split(" (", 1)[0] if short else words


_bound = bound_words


def _v(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "" if x is None else str(x)


def write_proposal_report(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the proposal report page for a :func:`proposal_report` dict."""
    import plotly.graph_objects as go

    base, props = data["baseline"], data["proposals"]
    runs = [base, *props]
    page = Page("cosim proposal report")
    page.h1("Proposal report", sub=f"baseline {base['name']} ({base['dir']}) vs "
                                   + ", ".join(f"{p['name']} ({p['dir']})" for p in props))
    lines = []
    for p in props:
        sp = p.get("speedup")
        moved = (f"bottleneck moved from {_bound(p['bottleneck_from'])} to {_bound(p['bottleneck_to'])}"
                 if p["bottleneck_moved"] else f"still {_bound(p['bottleneck_to'])}")
        lines.append(f"{p['name']}: step {fmt_time(p['step_time_s'])} vs {fmt_time(base['step_time_s'])}, "
                     f"{sp:.2f}x speedup, {moved}" if sp else f"{p['name']}: no step time")
    page.headline("; ".join(lines))
    page.h2("Step time and speedup")
    page.table(["run", "topology", "step time", "speedup", "bound (largest breakdown share)", "critical path",
                "power (TDP)", "steps/s per kW", "cost", "steps/s per k$"],
               [[r["name"], r["topology"], fmt_time(r["step_time_s"]),
                 f"{r.get('speedup', 1.0) or 0:.3f}x", f"{r['bottleneck']}", r["critical_path_bound"],
                 f"{r['power_W']:.0f} W", _v(r["steps_per_s_per_kW"]),
                 f"${r['cost_usd']:,.0f}" if r["cost_usd"] is not None else "n/a (no price in catalog)",
                 _v(r["steps_per_s_per_kusd"]) or "n/a"] for r in runs])
    fig = go.Figure()
    keys = list(base["breakdown"])
    colors = {"compute": "#2ca02c", "exposed_communication": "#d62728", "memcpy": "#9467bd",
              "host_bound_gpu_idle": "#ff7f0e", "other_idle": "#7f7f7f"}
    for k in keys:
        fig.add_trace(go.Bar(x=[r["name"] for r in runs], y=[(r["breakdown"].get(k) or 0.0) * 1e3 for r in runs],
                             name=BREAKDOWN_LABELS.get(k, k), marker_color=colors.get(k)))
    fig.update_layout(barmode="stack", title="Step-time breakdown, side by side", yaxis_title="ms per step",
                      height=440, margin=dict(l=60, r=20, t=50, b=40))
    page.fig(fig)
    page.h2("Breakdown shift (proposal minus baseline)")
    page.table(["category", *[p["name"] for p in props]],
               [[BREAKDOWN_LABELS.get(k, k), *[f"{p['breakdown_shift_s'][k] * 1e3:+.3f} ms "
                                             f"({fmt_pct(p['breakdown'][k] / p['step_time_s'] if p['step_time_s'] else None)} of step)"
                                             for p in props]] for k in keys])
    page.h2("Performance per watt and per dollar")
    page.table(["run", "steps/s", "power (W)", "steps/s per kW", "vs baseline", "cost (USD)", "steps/s per k$",
                "vs baseline"],
               [[r["name"], _v(r["steps_per_s"]), f"{r['power_W']:.0f}", _v(r["steps_per_s_per_kW"]),
                 _v(r.get("perf_per_watt_ratio", 1.0)), _v(r["cost_usd"]) or "n/a", _v(r["steps_per_s_per_kusd"]) or "n/a",
                 _v(r.get("perf_per_dollar_ratio", 1.0 if r["cost_usd"] else None)) or "n/a"] for r in runs])
    miss = sorted({m for r in runs for m in r["hardware"]["missing_price"]})
    if miss:
        page.p("No price_usd in the catalog for " + ", ".join(miss) + ": per-dollar figures need e.g. "
               "`--set accelerators.h100-sxm5.price_usd=25000` on both runs.", "note")
    for p in props:
        page.h2(f"Hardware diff: {base['name']} -> {p['name']}")
        hd = p["hardware_diff"]
        if hd:
            page.table(["what changed", "baseline", "proposal"],
                       [[x["what"], fmt_hw_value(x["what"], x["baseline"]), fmt_hw_value(x["what"], x["proposal"])]
                        for x in hd])
        else:
            page.p("Same hardware.", "note")
        sd = [x for x in p["scenario_diff"] if not x["what"].startswith("replay_config.catalog_overrides")]
        co_a, co_b = base["catalog_overrides"], p["catalog_overrides"]
        co = [[k, _v(co_a.get(k)), _v(co_b.get(k))] for k in sorted(co_a.keys() | co_b.keys()) if co_a.get(k) != co_b.get(k)]
        if co:
            page.table(["catalog override", "baseline", "proposal"], co)
        if sd:
            page.table(["scenario field", "baseline", "proposal"], [[x["what"], _v(x["baseline"]), _v(x["proposal"])]
                                                                    for x in sd])
    page.h2("Headlines")
    page.table(["run", "headline"], [[r["name"], r["headline"]] for r in runs])
    return page.write(path)
