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

from cosim.report.html import Page, fmt_time

__all__ = ["numeric_value", "pareto_front", "write_sweep_report", "write_tornado_report"]

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


def write_sweep_report(path: str | Path, rows: list[dict[str, Any]], params: Sequence[str],
                       title: str = "sweep", metric: str = "step_time_s") -> Path:
    """Write the sweep report for ``rows`` (results.csv rows as dicts) over ``params``."""
    import plotly.graph_objects as go

    page = Page(f"cosim sweep report: {title}")
    page.h1(f"Sweep: {title}", sub=f"{len(rows)} points; parameters: {', '.join(params)}")
    ok = [r for r in rows if r.get("status") == "ok" and r.get(metric) is not None]
    failed = [r for r in rows if r.get("status") != "ok"]
    if ok:
        best = min(ok, key=lambda r: r[metric])
        worst = max(ok, key=lambda r: r[metric])
        desc = ", ".join(f"{p}={best.get(p)}" for p in params)
        page.headline(f"Best step {fmt_time(best[metric])} at {desc}; worst {fmt_time(worst[metric])} "
                      f"({worst[metric] / best[metric]:.2f}x slower); {len(failed)} failed point(s)")
    else:
        page.headline(f"No point finished; {len(failed)} failed")
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
                          yaxis_title="step time (ms)", height=420, margin=dict(l=60, r=20, t=50, b=50))
        fig.update_xaxes(type="category", categoryorder="array", categoryarray=[_label(v) for v in xs_order])
        page.fig(fig)
    # heatmaps for pairs
    if len(params) >= 2 and ok:
        page.h2("Heatmaps (step time, ms; mean over the other parameters)")
        for p, q in itertools.combinations(params, 2):
            xv, yv = _sorted_values([r.get(p) for r in ok]), _sorted_values([r.get(q) for r in ok])
            z = []
            for y in yv:
                line = []
                for x in xv:
                    vals = [r[metric] for r in ok if r.get(p) == x and r.get(q) == y]
                    line.append(sum(vals) / len(vals) * 1e3 if vals else None)
                z.append(line)
            fig = go.Figure(go.Heatmap(z=z, x=[_label(v) for v in xv], y=[_label(v) for v in yv],
                                       colorscale="Viridis_r", colorbar=dict(title="ms"),
                                       texttemplate="%{z:.3g}", hovertemplate=f"{p}=%{{x}}<br>{q}=%{{y}}<br>"
                                                                              "%{z:.4g} ms<extra></extra>"))
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
    page.table(cols, [[fmt_time(r.get(c)) if c == "step_time_s" else ("" if r.get(c) is None else r.get(c))
                       for c in cols] for r in rows], left=len(params) + 2)
    return page.write(path)


def write_tornado_report(path: str | Path, data: dict[str, Any]) -> Path:
    """Write the tornado chart of a sensitivity analysis (``cosim.sensitivity/1`` dict)."""
    import plotly.graph_objects as go

    base = data["baseline_step_time_s"]
    rows = [r for r in data["parameters"] if r.get("status") == "ok"]
    page = Page(f"cosim sensitivity: {data.get('scenario')}")
    page.h1(f"Sensitivity of the step time: {data.get('scenario')}",
            sub=f"baseline step {fmt_time(base)}; each parameter moved by +/-{data['delta'] * 100:g}%")
    if rows:
        top = rows[0]
        page.headline(f"Step {fmt_time(base)}; most sensitive: {top['label']} "
                      f"({top['effect']:+.1%} step time per {data['delta'] * 100:g}% better; "
                      f"{top['up_pct']:+.1f}% when raised, {top['down_pct']:+.1f}% when lowered)")
    rs = rows[::-1]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=[r["label"] for r in rs], x=[r["down_pct"] for r in rs], orientation="h",
                         name=f"parameter -{data['delta'] * 100:g}%", marker_color="#ff7f0e",
                         hovertemplate="%{y}: %{x:+.2f}%<extra>lowered</extra>"))
    fig.add_trace(go.Bar(y=[r["label"] for r in rs], x=[r["up_pct"] for r in rs], orientation="h",
                         name=f"parameter +{data['delta'] * 100:g}%", marker_color="#1f77b4",
                         hovertemplate="%{y}: %{x:+.2f}%<extra>raised</extra>"))
    fig.update_layout(barmode="overlay", title="Change of step time when each parameter moves (tornado)",
                      xaxis_title="step-time change (%)", height=max(300, 30 * len(rs) + 120),
                      margin=dict(l=20, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.12))
    fig.update_yaxes(automargin=True)
    page.fig(fig)
    page.table(["rank", "parameter", "key", "baseline", "lowered", "raised", "step lowered", "step raised",
                "change lowered", "change raised"],
               [[i + 1, r["label"], r["key"], r["baseline"], r["down_value"], r["up_value"],
                 fmt_time(r["down_step_time_s"]), fmt_time(r["up_step_time_s"]), f"{r['down_pct']:+.2f}%",
                 f"{r['up_pct']:+.2f}%"] for i, r in enumerate(data["parameters"]) if r.get("status") == "ok"],
               left=3)
    bad = [r for r in data["parameters"] if r.get("status") != "ok"]
    for r in bad:
        page.p(f"{r['key']}: failed: {r.get('error')}", "note")
    page.p("Step-time change = perturbed step / baseline step - 1. Parameters are hardware figures from the "
           "catalog (via catalog overrides) or replay knobs; 'raised' means the number is larger (a larger latency "
           "or overhead is worse, a larger bandwidth or speed is better).", "note")
    return page.write(path)
