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

from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError
from cosim.fileio import read_summary
from cosim.replay.summary import NOISE_FLOOR, bound_label, explain_change, fmt_delta
from cosim.report.hardware import flatten, fmt_hw_value, hardware_diff, hardware_totals, hw_label
from cosim.report.html import Page, fmt_pct, fmt_time
from cosim.report.run import BREAKDOWN_LABELS, headline, perfetto_note

__all__ = ["bound_words", "load_run_dir", "proposal_report", "run_labels", "speedup_text", "write_proposal_report"]


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
    """Read a ``cosim run`` output folder: summary, resolved scenario, topology and hardware totals
    (of the GPUs the run used, with their CPUs and NICs)."""
    import yaml

    p = Path(d)
    sp, cp = p / "summary.json", p / "scenario.yaml"
    if not sp.is_file():
        raise CosimInputError("no summary.json here: not a folder written by `cosim run`", file=p)
    summary = read_summary(sp)
    scn: dict[str, Any] = {}
    if cp.is_file():
        try:
            scn = yaml.safe_load(cp.read_text()) or {}
        except yaml.YAMLError as exc:
            raise CosimInputError(f"bad YAML: {exc}".splitlines()[0], file=cp) from None
        if not isinstance(scn, dict):
            raise CosimInputError(f"expected a mapping (the resolved scenario), got {type(scn).__name__}", file=cp)
    if not scn:
        scn = {"name": p.name, "topology": summary.get("topology"), "replay_config": summary.get("config") or {}}
    topo = _load_topology(scn, p)
    gpus = [r.get("gpu") for r in summary.get("ranks") or [] if r.get("gpu")]
    hw = hardware_totals(topo, gpus or None)
    st = summary.get("step_time_s")
    bd = summary.get("breakdown") or {}
    sps = (1.0 / st) if st else None
    run = {
        "name": scn.get("name") or p.name,
        "label": scn.get("name") or p.name,
        "dir": str(p),
        "step_time_s": st,
        "steps_per_s": sps,
        "breakdown": bd,
        "exposed_communication_split": summary.get("exposed_communication_split"),
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
    return {"run": run, "topology": topo, "scenario": scn, "summary": summary}


_SKIP = ("name", "description", "source_file", "replay_config.record_timeline")


def _scenario_diff(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    fa, fb = flatten(a), flatten(b)
    return [{"what": k, "baseline": fa.get(k), "proposal": fb.get(k)} for k in sorted(fa.keys() | fb.keys())
            if not k.startswith(_SKIP) and fa.get(k) != fb.get(k)]


def _short_key(k: str) -> str | None:
    """A scenario field as the ``--set`` key a user would write, or None for fields that mirror another
    (``replay.*`` is copied into ``replay_config``; the topology is labelled on its own)."""
    if k.startswith(("replay.", "topology", "replay_config.topology")):
        return None
    for pre in ("replay_config.catalog_overrides.", "replay_config.", "set."):
        if k.startswith(pre):
            return k[len(pre):]
    return k


def _value_text(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:g}"
    return "-" if v is None else str(v)


def run_labels(loaded: list[dict[str, Any]]) -> list[str]:
    """A label per run saying what differs between the runs: the topology (when they differ), then the
    settings that differ (``links.nvlink4.bandwidth=50 GB/s``), else the folder; never two the same."""
    flat = [flatten(x["scenario"]) for x in loaded]
    keys = sorted({k for f in flat for k in f if not k.startswith(_SKIP)})
    varying = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    names = {x["run"]["name"] for x in loaded}
    topos = {x["run"]["topology"] for x in loaded}
    labels = []
    for x, f in zip(loaded, flat):
        parts = []
        if len(names) > 1:
            parts.append(str(x["run"]["name"]))
        if len(topos) > 1:
            parts.append(str(x["run"]["topology"]))
        for k in varying:
            sk = _short_key(k)
            if sk is not None and k in f and f.get(k) not in (None, {}, []):
                parts.append(f"{sk}={_value_text(f[k])}")
        labels.append(", ".join(dict.fromkeys(parts)) or "")
    for i, x in enumerate(loaded):  # nothing differs (or only defaults): the folder says which run it is
        if not labels[i] or labels.count(labels[i]) > 1:
            folder = Path(x["run"]["dir"]).name
            labels[i] = f"{labels[i]} ({folder})" if labels[i] else folder
    seen: dict[str, int] = {}
    first = list(labels)
    for i, lb in enumerate(first):
        if first.count(lb) > 1:  # the same folder name twice: number them
            seen[lb] = seen.get(lb, 0) + 1
            labels[i] = f"{lb} #{seen[lb]}"
    return labels


def _ratio(a: float | None, b: float | None) -> float | None:
    return (b / a) if (a and b) else None


def speedup_text(base_s: float | None, new_s: float | None) -> str:
    """Speedup with the step-time difference: "1.00x (Δ 0.0 ms)", "1.79x (Δ -40.1 ms)"."""
    if not base_s or not new_s:
        return "n/a"
    return f"{base_s / new_s:.2f}x (Δ {fmt_delta(new_s - base_s, base_s)})"


def proposal_report(baseline: str | Path, proposals: list[str | Path]) -> dict[str, Any]:
    """Compare ``proposals`` (run folders) with ``baseline``; the ``cosim.proposal/1`` dict."""
    if not proposals:
        raise CosimInputError("give at least one proposal folder after the baseline")
    b = load_run_dir(baseline)
    loaded = [load_run_dir(d) for d in proposals]
    labels = run_labels([b, *loaded])
    base = b["run"]
    base["label"] = labels[0]
    out = []
    for p, label in zip(loaded, labels[1:]):
        r = dict(p["run"])
        r["label"] = label
        bst, pst = base["step_time_s"], r["step_time_s"]
        r["speedup"] = (bst / pst) if (bst and pst) else None
        r["speedup_text"] = speedup_text(bst, pst)
        r["vs_baseline"] = explain_change(b["summary"], p["summary"])
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
    return {"schema": "cosim.proposal/1", "noise_floor": NOISE_FLOOR, "baseline": base, "proposals": out}


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


def _v(x: Any) -> str:
    if isinstance(x, float):
        return f"{x:.4g}"
    return "n/a" if x is None else str(x)


def _parts(r: dict[str, Any], split_comm: bool = True) -> dict[str, float]:
    """The breakdown with exposed communication split into transfer and waiting for peers (ms per step)."""
    bd, split = r["breakdown"], r.get("exposed_communication_split") if split_comm else None
    out: dict[str, float] = {}
    for k, v in bd.items():
        if k == "exposed_communication" and split:
            out["exposed communication: transfer"] = (split.get("transfer_s") or 0.0) * 1e3
            out["exposed communication: waiting for peers"] = (split.get("wait_for_peers_s") or 0.0) * 1e3
        else:
            out[BREAKDOWN_LABELS.get(k, k)] = (v or 0.0) * 1e3
    return out


def _step_figure(runs: list[dict[str, Any]]) -> Any:
    """Step time per run, one bar each, from zero, with the speedup against the baseline on the bar."""
    import plotly.graph_objects as go

    base = runs[0]["step_time_s"]
    text = [f"{fmt_time(r['step_time_s'])}<br>" + ("baseline" if i == 0 else speedup_text(base, r["step_time_s"]))
            for i, r in enumerate(runs)]
    fig = go.Figure(go.Bar(x=[r["label"] for r in runs], y=[(r["step_time_s"] or 0.0) * 1e3 for r in runs],
                           text=text, textposition="outside", marker_color=["#7f7f7f", *["#1f77b4"] * len(runs[1:])],
                           hovertemplate="%{x}<br>%{y:.3f} ms<extra></extra>"))
    top = max((r["step_time_s"] or 0.0) * 1e3 for r in runs) or 1.0
    fig.update_layout(title="Step time per run (axis from zero)", yaxis_title="step time (ms)", height=420,
                      margin=dict(l=60, r=20, t=50, b=80), showlegend=False)
    fig.update_yaxes(range=[0, top * 1.2], rangemode="tozero")
    return fig


def _breakdown_figure(runs: list[dict[str, Any]]) -> Any:
    """Grouped bars: for each part of the step, one bar per run (ms per step, from zero)."""
    import plotly.graph_objects as go

    split = all(r.get("exposed_communication_split") for r in runs)
    parts = [_parts(r, split) for r in runs]
    cats = list(parts[0])
    fig = go.Figure()
    for r, pt in zip(runs, parts):
        fig.add_trace(go.Bar(x=cats, y=[pt.get(c, 0.0) for c in cats], name=r["label"],
                             hovertemplate="%{x}<br>%{y:.3f} ms<extra>" + r["label"].replace("<", "&lt;")
                             + "</extra>"))
    fig.update_layout(barmode="group", title="Step-time breakdown per run (grouped; ms per step)",
                      yaxis_title="ms per step", height=460, margin=dict(l=60, r=20, t=50, b=120),
                      legend=dict(orientation="h", y=-0.35))
    fig.update_yaxes(rangemode="tozero")
    return fig


def _money(x: float | None) -> str:
    return "n/a (no price in catalog)" if x is None else f"${x:,.0f}"


def _per(x: float | None, unit: str) -> str:
    return "n/a" if x is None else f"{x:.4g} {unit}"


def write_proposal_report(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the proposal report page for a :func:`proposal_report` dict."""
    base, props = data["baseline"], data["proposals"]
    runs = [base, *props]
    page = Page("cosim proposal report")
    page.h1("Proposal report", sub=f"baseline: {base['label']} ({base['dir']}); proposals: "
                                   + "; ".join(f"{p['label']} ({p['dir']})" for p in props))
    page.headline("; ".join(f"{p['label']}: {p['vs_baseline']['text']}" for p in props))
    floor = data.get("noise_floor", NOISE_FLOOR)
    page.p(f"Differences below {floor:.1%} of the baseline step are marked 'no effect': the replay is "
           "deterministic, but a change that does not touch the bound resource still moves the step by a few "
           "microseconds, far below cosim's accuracy against measurements.", "note")
    page.h2("Step time and speedup")
    page.fig(_step_figure(runs))
    page.table(["run (what differs)", "topology", "GPUs used", "step time", "speedup vs baseline", "effect",
                "bound (critical path)", "largest part of the step", "power (TDP)", "cost"],
               [[r["label"], r["topology"], f"{r['hardware']['gpus']} of {r['hardware'].get('topology_gpus', '?')}",
                 fmt_time(r["step_time_s"]),
                 "baseline" if r is base else r["speedup_text"],
                 "" if r is base else ("no effect" if r["vs_baseline"]["unchanged"] else
                                       ("faster" if (r["speedup"] or 1) > 1 else "slower")),
                 bound_label(r["critical_path_bound"]) if r["critical_path_bound"] else "n/a",
                 bound_words(r["bottleneck"], short=True),
                 f"{r['power_W']:,.0f} W", _money(r["cost_usd"])] for r in runs], left=2, table_id="runs")
    page.h2("Step-time breakdown")
    page.fig(_breakdown_figure(runs))
    page.p("Exposed communication is split into transfer (the collective has all its peers and moves data) and "
           "waiting for peers (the collective kernel runs but its slowest peer has not arrived: a sync, which a "
           "faster fabric does not shorten).", "note")
    page.h2("Breakdown shift (proposal minus baseline)")
    split = all(r.get("exposed_communication_split") for r in runs)
    bp = _parts(base, split)
    cats = list(bp)
    pps = [_parts(p, split) for p in props]
    page.table(["part of the step", "baseline", *[p["label"] for p in props]],
               [[c, f"{bp[c]:.4g} ms", *[f"{fmt_delta((pp.get(c, 0.0) - bp[c]) / 1e3, base['step_time_s'] or 0.0)}"
                                        f" ({fmt_pct(pp.get(c, 0.0) / 1e3 / p['step_time_s'] if p['step_time_s'] else None)}"
                                        " of step)" for p, pp in zip(props, pps)]] for c in cats],
               table_id="shift")
    page.h2("Performance per watt and per dollar")
    page.table(["run", "steps/s", "power (TDP of the GPUs used, their CPUs and NICs)", "steps/s per kW",
                "vs baseline", "cost", "steps/s per k$", "vs baseline"],
               [[r["label"], _per(r["steps_per_s"], "/s"), f"{r['power_W']:,.0f} W",
                 _per(r["steps_per_s_per_kW"], "/s/kW"),
                 "baseline" if r is base else (f"{r['perf_per_watt_ratio']:.2f}x" if r["perf_per_watt_ratio"] else "n/a"),
                 _money(r["cost_usd"]), _per(r["steps_per_s_per_kusd"], "/s/k$"),
                 "baseline" if r is base else (f"{r['perf_per_dollar_ratio']:.2f}x" if r["perf_per_dollar_ratio"]
                                               else "n/a")] for r in runs], table_id="perf")
    miss = sorted({m for r in runs for m in r["hardware"]["missing_price"]})
    if miss:
        page.p("No price_usd in the catalog for " + ", ".join(miss) + ": per-dollar figures need e.g. "
               "`--set accelerators.h100-sxm5.price_usd=25000` on both runs.", "note")
    for p in props:
        page.h2(f"What changed: {base['label']} -> {p['label']}")
        hd = p["hardware_diff"]
        if hd:
            page.table(["hardware", "baseline", "proposal"],
                       [[hw_label(x["what"]), fmt_hw_value(x["what"], x["baseline"]),
                         fmt_hw_value(x["what"], x["proposal"])] for x in hd], table_id=None)
        else:
            page.p("Same hardware.", "note")
        sd = [x for x in p["scenario_diff"] if not x["what"].startswith("replay_config.catalog_overrides")
              and _short_key(x["what"]) is not None]
        co_a, co_b = base["catalog_overrides"], p["catalog_overrides"]
        co = [[k, _v(co_a.get(k)), _v(co_b.get(k))] for k in sorted(co_a.keys() | co_b.keys()) if co_a.get(k) != co_b.get(k)]
        if co:
            page.table(["catalog override (--set)", "baseline", "proposal"], co)
        if sd:
            page.table(["setting", "baseline", "proposal"],
                       [[_short_key(x["what"]), _value_text(x["baseline"]), _value_text(x["proposal"])] for x in sd])
    page.h2("Headlines")
    page.table(["run", "headline"], [[r["label"], r["headline"]] for r in runs])
    page.h2("Timelines")
    page.p(perfetto_note([r["dir"] for r in runs]), "note")
    page.link("https://ui.perfetto.dev", "Open ui.perfetto.dev")
    return page.write(path)
