"""Sweep and sensitivity reports.

* :func:`write_sweep_report`: step time (and breakdown) against each parameter
  as lines (one line per value of the other parameter when there are two or
  more), a heatmap for each pair of parameters, and the Pareto front of step
  time against power (TDP sum) and, where the catalog has prices, cost.
* :func:`write_tornado_report`: the tornado chart of ``cosim sensitivity``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosim.replay.summary import NOISE_FLOOR
from cosim.report.html import Page, fmt_time

__all__ = ["numeric_value", "parameter_effects", "pareto_front", "sweep_headline", "write_sweep_report",
           "write_tornado_report"]

_KINDS = ("bandwidth", "time", "size", "flops", "frequency", "power", "rate")


def numeric_value(v: Any) -> float | None:
    """A parameter value as a number in SI units (unit strings parsed), or None if it is not numeric."""
    from cosim import units

    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    s = str(v).strip()
    try:
        return float(s)
    except ValueError:
        pass
    for kind in _KINDS:
        try:
            return float(units.parse(s, kind))  # type: ignore[arg-type]
        except Exception:
            continue
    return None


def pareto_front(xs: Sequence[float], ys: Sequence[float]) -> list[int]:
    """Indices of points not dominated when minimizing both x and y, sorted by x."""
    idx = sorted((i for i in range(len(xs)) if xs[i] is not None and ys[i] is not None),
                 key=lambda i: (xs[i], ys[i]))
    out, best = [], math.inf
    for i in idx:
        if ys[i] < best:
            out.append(i)
            best = ys[i]
    return out


def _label(v: Any) -> str:
    return str(v)


def _sorted_values(vals: list[Any]) -> list[Any]:
    uniq = list(dict.fromkeys(vals))
    nums = [numeric_value(v) for v in uniq]
    if all(n is not None for n in nums):
        return [u for _, u in sorted(zip(nums, uniq), key=lambda t: t[0])]
    return uniq


HEAT_MIN_SPAN = 0.01
"""A heatmap's colour scale spans at least this fraction of the best step (1%)."""


def sweep_headline(ok: list[dict[str, Any]], params: Sequence[str], metric: str = "step_time_s",
                   failed: int = 0) -> str:
    """The sweep's headline: the best step and where, unless the points differ by less than the noise floor
    (then "no effect"); points within the floor of the best are named as tied, not ranked."""
    if not ok:
        return f"No point finished; {failed} failed"
    best = min(ok, key=lambda r: r[metric])
    worst = max(ok, key=lambda r: r[metric])
    b, w = best[metric], worst[metric]
    tail = f"; {failed} failed point(s)" if failed else ""
    if w / b - 1 < NOISE_FLOOR:
        return (f"No effect: every point's step is {fmt_time(b)} to within {NOISE_FLOOR:.1%} (spread "
                f"{fmt_time(w - b)}), below the noise floor; nothing to rank{tail}")
    ties = [r for r in ok if r[metric] / b - 1 < NOISE_FLOOR]
    desc = ", ".join(f"{p}={best.get(p)}" for p in params)
    tied = f" (and {len(ties) - 1} more point(s) within the {NOISE_FLOOR:.1%} noise floor)" if len(ties) > 1 else ""
    return (f"Best step {fmt_time(b)} at {desc}{tied}; worst {fmt_time(w)} (+{w / b - 1:.1%}, "
            f"{w / b:.2f}x slower){tail}")


def parameter_effects(ok: list[dict[str, Any]], params: Sequence[str],
                      metric: str = "step_time_s") -> dict[str, dict[str, Any]]:
    """Per parameter: the range of the mean step over its values (mean over the other parameters), its spread
    relative to the smallest, and whether that is below the noise floor (``no_effect``)."""
    out: dict[str, dict[str, Any]] = {}
    for p in params:
        means = []
        for v in dict.fromkeys(r.get(p) for r in ok):
            vals = [r[metric] for r in ok if r.get(p) == v]
            means.append(sum(vals) / len(vals))
        if not means:
            continue
        lo, hi = min(means), max(means)
        spread = hi / lo - 1 if lo > 0 else 0.0
        out[p] = {"min_s": lo, "max_s": hi, "spread": spread, "no_effect": spread < NOISE_FLOOR}
    return out


def write_sweep_report(path: str | Path, rows: list[dict[str, Any]], params: Sequence[str],
                       title: str = "sweep", metric: str = "step_time_s") -> Path:
    """Write the sweep report for ``rows`` (results.csv rows as dicts) over ``params``."""
    import plotly.graph_objects as go

    page = Page(f"cosim sweep report: {title}")
    page.h1(f"Sweep: {title}", sub=f"{len(rows)} points; parameters: {', '.join(params)}")
    ok = [r for r in rows if r.get("status") == "ok" and r.get(metric) is not None]
    failed = [r for r in rows if r.get("status") != "ok"]
    page.headline(sweep_headline(ok, params, metric, len(failed)))
    effects = parameter_effects(ok, params, metric)
    if effects:
        page.table(["parameter", "step-time range over its values (mean over the others)", "effect"],
                   [[p, f"{fmt_time(e['min_s'])} .. {fmt_time(e['max_s'])} ({e['spread']:.2%})",
                     "no effect" if e["no_effect"] else "moves the step"] for p, e in effects.items()],
                   table_id="effects")
        page.p(f"Differences below the noise floor ({NOISE_FLOOR:.1%} of the step) are marked 'no effect' and not "
               "ranked: the replay is deterministic, but such differences come from reordered ties, far below "
               "cosim's accuracy against measurements.", "note")
    # lines: metric vs each parameter, one line per combination of the others
    page.h2("Step time against each parameter")
    for p in params:
        others = [q for q in params if q != p]
        xs_order = _sorted_values([r.get(p) for r in ok])
        numeric = all(numeric_value(v) is not None for v in xs_order)
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for r in ok:
            groups.setdefault(tuple(r.get(q) for q in others), []).append(r)
        fig = go.Figure()
        for g, rs in sorted(groups.items(), key=lambda kv: str(kv[0]))[:20]:
            rs = sorted(rs, key=lambda r: xs_order.index(r.get(p)))
            name = ", ".join(f"{q}={v}" for q, v in zip(others, g)) or "step time"
            fig.add_trace(go.Scatter(x=[_label(r.get(p)) for r in rs], y=[r[metric] * 1e3 for r in rs],
                                     mode="lines+markers", name=name))
        fig.update_layout(title=f"Step time vs {p}", xaxis_title=p + (" (as given)" if numeric else ""),
                          yaxis_title="step time (ms, axis from zero)", height=420,
                          margin=dict(l=60, r=20, t=50, b=50))
        fig.update_yaxes(rangemode="tozero")
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=[_label(v) for v in xs_order])
        page.fig(fig)
    # heatmaps for pairs
    if len(params) >= 2 and ok:
        best_s = min(r[metric] for r in ok)
        page.h2("Heatmaps (step time as % over the sweep's best step; mean over the other parameters)")
        page.p(f"Colour runs from 0% to the largest change, and at least to {HEAT_MIN_SPAN:.0%}, so that "
               f"differences below the {NOISE_FLOOR:.1%} noise floor look alike; such cells read 'no effect'.",
               "note")
        for p, q in itertools.combinations(params, 2):
            xv, yv = _sorted_values([r.get(p) for r in ok]), _sorted_values([r.get(q) for r in ok])
            z: list[list[float | None]] = []
            text: list[list[str]] = []
            for y in yv:
                line: list[float | None] = []
                tl: list[str] = []
                for x in xv:
                    vals = [r[metric] for r in ok if r.get(p) == x and r.get(q) == y]
                    v = (sum(vals) / len(vals) / best_s - 1) * 100 if vals else None
                    line.append(v)
                    tl.append("" if v is None else (f"{fmt_time(sum(vals) / len(vals))}<br>"
                                                    + ("no effect" if v < NOISE_FLOOR * 100 else f"+{v:.1f}%")))
                z.append(line)
                text.append(tl)
            vmax = max((v for row in z for v in row if v is not None), default=0.0)
            fig = go.Figure(go.Heatmap(z=z, x=[_label(v) for v in xv], y=[_label(v) for v in yv], text=text,
                                       colorscale="Viridis_r", zmin=0.0, zmax=max(vmax, HEAT_MIN_SPAN * 100),
                                       colorbar=dict(title="% over best", ticksuffix="%"),
                                       texttemplate="%{text}", hovertemplate=f"{p}=%{{x}}<br>{q}=%{{y}}<br>"
                                                                              "%{text}<extra></extra>"))
            fig.update_layout(title=f"Step time: {q} vs {p}", xaxis_title=p, yaxis_title=q, height=420,
                              margin=dict(l=60, r=20, t=50, b=50))
            fig.update_xaxes(type="category")
            fig.update_yaxes(type="category")
            page.fig(fig)
    # breakdown across points
    if ok:
        page.h2("Breakdown per point")
        labels = [", ".join(str(r.get(p)) for p in params) for r in ok]
        fig = go.Figure()
        for k, col in (("compute_s", "#2ca02c"), ("exposed_communication_s", "#d62728"), ("memcpy_s", "#9467bd"),
                       ("host_bound_gpu_idle_s", "#ff7f0e"), ("other_idle_s", "#7f7f7f")):
            fig.add_trace(go.Bar(x=labels, y=[(r.get(k) or 0.0) * 1e3 for r in ok], name=k[:-2], marker_color=col))
        fig.update_layout(barmode="stack", title="Step-time breakdown per point", yaxis_title="ms per step",
                          xaxis_title=" / ".join(params), height=440, margin=dict(l=60, r=20, t=50, b=120))
        page.fig(fig)
    # Pareto
    page.h2("Pareto front")
    for cost_key, cost_label, scale in (("power_W", "power: TDP of GPUs+CPUs+NICs (kW)", 1e-3),
                                        ("cost_usd", "cost (k$)", 1e-3)):
        pts = [r for r in ok if r.get(cost_key) is not None]
        if not pts:
            page.p(f"No {cost_key} for any point (the catalog has no figure for these parts; set e.g. "
                   "accelerators.<id>.price_usd).", "note")
            continue
        xs = [r[cost_key] * scale for r in pts]
        ys = [r[metric] * 1e3 for r in pts]
        front = pareto_front(xs, ys)
        text = [", ".join(f"{p}={r.get(p)}" for p in params) for r in pts]
        fig = go.Figure()
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="markers", name="points", text=text,
                                 marker=dict(color="#aaaaaa", size=9),
                                 hovertemplate="%{text}<br>%{x:.4g}, %{y:.4g} ms<extra></extra>"))
        fig.add_trace(go.Scatter(x=[xs[i] for i in front], y=[ys[i] for i in front], mode="lines+markers",
                                 name="Pareto front", text=[text[i] for i in front],
                                 marker=dict(color="#d62728", size=11),
                                 hovertemplate="%{text}<br>%{x:.4g}, %{y:.4g} ms<extra></extra>"))
        fig.update_layout(title=f"Step time vs {cost_key}", xaxis_title=cost_label, yaxis_title="step time (ms)",
                          height=420, margin=dict(l=60, r=20, t=50, b=50))
        page.fig(fig)
    # table
    page.h2("All points")
    cols = ["key", *params, "status", "step_time_s", "bound", "power_W", "error"]
    heads = ["key", *params, "status", "step time", "bound", "power (TDP)", "error"]

    def cell(r: dict[str, Any], c: str) -> Any:
        v = r.get(c)
        if v is None:
            return ""
        if c == "step_time_s":
            return fmt_time(v)
        if c == "power_W":
            return f"{float(v):,.0f} W"
        if c == "bound":
            from cosim.replay.summary import bound_label

            return bound_label(v)
        return v

    page.table(heads, [[cell(r, c) for c in cols] for r in rows], left=len(params) + 2, table_id="points")
    return page.write(path)


def tornado_headline(data: dict[str, Any]) -> str:
    """The sensitivity headline: the most sensitive parameter and what a better and a worse value of it do to
    the step ("host speed: 20% better -> step -22.4%, 20% worse -> +33.6%"), or "no effect" when nothing moves
    the step by more than the noise floor."""
    base = data["baseline_step_time_s"]
    rows = [r for r in data["parameters"] if r.get("status") == "ok"]
    dp = f"{data['delta'] * 100:g}%"
    moving = [r for r in rows if not r.get("no_effect")]
    if not moving:
        return (f"Step {fmt_time(base)}; no parameter moves it by more than the "
                f"{data.get('noise_floor', NOISE_FLOOR):.1%} noise floor (each moved by {dp})")
    top = moving[0]
    better = top.get("better_pct", top["up_pct"])
    worse = top.get("worse_pct", top["down_pct"])
    return (f"Step {fmt_time(base)}; most sensitive: {top['label']}: {dp} better -> step {better:+.1f}%, "
            f"{dp} worse -> step {worse:+.1f}%")


def write_tornado_report(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the tornado chart of a sensitivity analysis (``cosim.sensitivity/1`` dict); parameters below the
    noise floor are listed as "no effect", not drawn as ranked bars."""
    import plotly.graph_objects as go

    base = data["baseline_step_time_s"]
    ok = [r for r in data["parameters"] if r.get("status") == "ok"]
    rows = [r for r in ok if not r.get("no_effect")]
    flat = [r for r in ok if r.get("no_effect")]
    dp = f"{data['delta'] * 100:g}%"
    floor = data.get("noise_floor", NOISE_FLOOR)
    page = Page(f"cosim sensitivity: {data.get('scenario')}")
    page.h1(f"Sensitivity of the step time: {data.get('scenario')}",
            sub=f"baseline step {fmt_time(base)}; each parameter moved by +/-{dp}")
    page.headline(tornado_headline(data))
    rs = rows[::-1]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=[r["label"] for r in rs], x=[r.get("better_pct", r["up_pct"]) for r in rs],
                         orientation="h", name=f"parameter {dp} better", marker_color="#1f77b4",
                         hovertemplate="%{y}: %{x:+.2f}%<extra>better</extra>"))
    fig.add_trace(go.Bar(y=[r["label"] for r in rs], x=[r.get("worse_pct", r["down_pct"]) for r in rs],
                         orientation="h", name=f"parameter {dp} worse", marker_color="#ff7f0e",
                         hovertemplate="%{y}: %{x:+.2f}%<extra>worse</extra>"))
    fig.update_layout(barmode="overlay", title="Change of step time when each parameter moves (tornado)",
                      xaxis_title="step-time change (%; negative = shorter step)",
                      height=max(300, 30 * len(rs) + 120), margin=dict(l=20, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.12))
    fig.update_xaxes(ticksuffix="%", zeroline=True)
    fig.update_yaxes(automargin=True)
    page.fig(fig)
    if flat:
        page.p(f"No effect (step moves by less than the {floor:.1%} noise floor either way; not ranked): "
               + ", ".join(r["label"] for r in flat) + ".", "note")
    page.table(["rank", "parameter", "key", "baseline", "lowered", "raised", "step lowered", "step raised",
                "change when better", "change when worse"],
               [["-" if r.get("no_effect") else i + 1, r["label"], r["key"], r["baseline"], r["down_value"],
                 r["up_value"], fmt_time(r["down_step_time_s"]), fmt_time(r["up_step_time_s"]),
                 "no effect" if r.get("no_effect") else f"{r.get('better_pct', r['up_pct']):+.2f}%",
                 "no effect" if r.get("no_effect") else f"{r.get('worse_pct', r['down_pct']):+.2f}%"]
                for i, r in enumerate(ok)], left=3, table_id="parameters")
    bad = [r for r in data["parameters"] if r.get("status") != "ok"]
    for r in bad:
        page.p(f"{r['key']}: failed: {r.get('error')}", "note")
    page.p("Step-time change = perturbed step / baseline step - 1. 'Better' is a larger bandwidth, FLOP/s or "
           "speed, or a smaller latency or overhead; 'worse' the other way. Parameters are hardware figures from "
           "the catalog (via catalog overrides) or replay knobs.", "note")
    return page.write(path)
