"""The run report (report.html of ``cosim run`` / ``cosim replay``).

One offline page: a headline sentence naming the bottleneck, the summary with
units, the step-time breakdown, the utilization of every resource (GPU streams,
SM share, copy engines, host threads, every link of the fabric), the composition
of the critical path, the top stress points, a downsampled timeline of one step
of rank 0 and the hardware (topology figures, parts, power).

Resource utilization is the busy time (union of op intervals) of a GPU stream /
host thread over the step window of its rank (the same window as the
breakdown), divided by the window. Links are measured on the same basis: a
link's busy time (union of the intervals it carried something) within the step
window of the job (from the earliest rank's window start to the latest rank's
window end), divided by that window; its load is the bytes it moved in the
window over capacity x window. The traffic is ``summary["links"]`` and its
intervals (:mod:`cosim.replay.links`): collectives (simulated on the fabric, or
with measured collectives the engine's decomposition over the replayed kernel)
and host<->device memcpys on the GPU's PCIe path, in both modes. A coalesced synthetic step
(:mod:`cosim.replay.periodic`) is measured as the full step: the probe's window plus its repeated period.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from cosim.replay.summary import bound_label, merge_intervals
from cosim.report.hardware import hardware_totals, link_kinds
from cosim.report.html import Page, fmt_pct, fmt_time

__all__ = ["PERFETTO_URL", "headline", "perfetto_note", "run_report_data", "run_report_html", "write_run_report"]

PERFETTO_URL = "https://ui.perfetto.dev"


def perfetto_note(dirs: list[str] | None = None) -> str:
    """How to open a run's timeline in Perfetto (it runs in the browser; the file stays local)."""
    where = (" (" + ", ".join(f"{d}/timeline.json.gz" for d in dirs) + ")") if dirs else ""
    return (f"Timeline: open {PERFETTO_URL} and choose 'Open trace file', then pick timeline.json.gz from the "
            f"run's folder{where}. Perfetto reads the file in the browser; nothing is uploaded. Runs written "
            "with --no-timeline have none.")

BREAKDOWN_LABELS = {
    "compute": "compute (kernels run)",
    "exposed_communication": "exposed communication",
    "memcpy": "memcpy / memset only",
    "host_bound_gpu_idle": "GPU idle waiting for launches (host-bound)",
    "other_idle": "GPU idle waiting on peers / dependencies",
}
_COLORS = {"compute": "#2ca02c", "exposed_communication": "#d62728", "memcpy": "#9467bd",
           "host_bound_gpu_idle": "#ff7f0e", "other_idle": "#7f7f7f"}
_HEAD = {
    "compute": "compute-bound: kernels run {p} of the step",
    "exposed_communication": "communication-bound: exposed communication {p} of the step",
    "memcpy": "copy-bound: memcpy/memset alone {p} of the step",
    "host_bound_gpu_idle": "host-bound: GPU idle waiting for launches {p} of the step",
    "other_idle": "dependency-bound: GPU idle waiting on peers or dependencies {p} of the step",
}


def _busy(s: np.ndarray, e: np.ndarray, a: float, b: float) -> float:
    ok = np.isfinite(s) & np.isfinite(e) & (e > a) & (s < b)
    ms, me = merge_intervals(np.clip(s[ok], a, b), np.clip(e[ok], a, b))
    return float((me - ms).sum())


def _window(rg: Any, run: Any) -> tuple[float, float, int, tuple[float, float]]:
    """(a, b, n_periods, one-step window) of a rank's simulated step."""
    from cosim.replay.summary import step_times

    G = rg.gpu_ops
    st = step_times(G.step, run.gpu_start, run.gpu_end, G.launch >= 0)
    a, b = st["window"]
    n = st["n_periods"]
    if not (math.isfinite(a) and math.isfinite(b) and b > a):
        vals = np.concatenate([run.gpu_start, run.gpu_end, run.host_start, run.host_end]) if len(G) or len(
            rg.host_ops) else np.zeros(2)
        vals = vals[np.isfinite(vals)]
        a, b, n = (float(vals.min()), float(vals.max()), 1) if vals.size else (0.0, 1.0, 1)
    one = (a, b)
    if st["first"].size >= 2:
        one = (float(st["first"][0]), float(st["first"][1]))
    return a, b, n, one


def _thread_label(rg: Any, t: int) -> str:
    th = rg.threads
    try:
        nm = int(th.name[t])
        name = rg.strings[nm] if nm >= 0 else ""
        tid = int(th.tid[t])
    except (IndexError, AttributeError):
        name, tid = "", t
    if name and str(tid) in name:
        return name
    return f"thread {tid}" + (f" ({name})" if name else "")


def _over_step(result: Any, rank: int | None, a: float, b: float, busy: Callable[[float, float], Any]) -> tuple[Any, float]:
    """(``busy(a, b)``, ``b - a``) over a simulated window; for a coalesced step (:mod:`cosim.replay.periodic`) the
    full step's: plus ``repeats`` times the busy of the repeated period before the rank's cut (``rank`` None: the
    earliest cut, for job-wide counters), and the span extended by the inserted time."""
    per = getattr(result, "periodic", None)
    cuts = per.cut if per is not None else {}
    cut = cuts.get(rank) if rank is not None else (min(cuts.values()) if cuts else None)
    if per is None or cut is None:
        return busy(a, b), b - a
    return busy(a, b) + per.repeats * busy(cut - per.period_s, cut), b - a + per.extra_s


def _rank_resources(result: Any, rg: Any, run: Any) -> list[dict[str, Any]]:
    from cosim.replay.program import is_comm
    from cosim.workload.graph import GpuKind, OpClass

    a, b, n, _ = _window(rg, run)
    G, H = rg.gpu_ops, rg.host_ops
    out: list[dict[str, Any]] = []
    r = int(rg.rank)

    def add(name: str, kind: str, s: np.ndarray, e: np.ndarray) -> None:
        busy, span = _over_step(result, r, a, b, lambda x, y: _busy(s, e, x, y))
        out.append({"rank": r, "resource": f"rank{r} {name}", "kind": kind, "busy_s_per_step": busy / n,
                    "share": busy / span if span > 0 else 0.0})

    if len(G):
        s, e = run.gpu_start, run.gpu_end
        cls = G.cls
        comm = is_comm(cls)
        copy = (G.kind != GpuKind.KERNEL) | (cls == OpClass.MEMCPY) | (cls == OpClass.MEMSET)
        comp = ~comm & ~copy
        for dev in np.unique(G.device):
            on = G.device == dev
            add(f"GPU{int(dev)} SM (compute kernels)", "sm", s[on & comp], e[on & comp])
            if (on & comm).any():
                add(f"GPU{int(dev)} communication kernels", "comm", s[on & comm], e[on & comm])
            if (on & copy).any():
                add(f"GPU{int(dev)} copy engines (memcpy/memset)", "copy", s[on & copy], e[on & copy])
            for st in np.unique(G.stream[on]):
                m = on & (G.stream == st)
                add(f"GPU{int(dev)} stream {int(st)}", "stream", s[m], e[m])
    if len(H):
        for t in np.unique(H.thread):
            m = H.thread == t
            add(f"host {_thread_label(rg, int(t))}", "host_thread", run.host_start[m], run.host_end[m])
    return out


def _step_window(result: Any) -> tuple[float, float, int]:
    """(a, b, n_periods) of the job: the hull of every rank's step window."""
    ws = [_window(rg, run) for rg, run in zip(result.graph.ranks, result.runs)]
    if not ws:
        return 0.0, 0.0, 1
    return min(w[0] for w in ws), max(w[1] for w in ws), max(w[2] for w in ws)


def _link_rows(result: Any, s: dict[str, Any], topo: Any, kinds: dict[str, str]) -> list[dict[str, Any]]:
    """The summary's links with their busy share, busy time per step and load over the step window."""
    a, b, n = _step_window(result)
    span = b - a
    usage = getattr(result, "link_usage", None)
    busy: np.ndarray | None = None
    load_b: np.ndarray | None = None
    if usage is not None and span > 0:
        busy, span = _over_step(result, None, a, b, usage.busy)
        load_b, _ = _over_step(result, None, a, b, usage.bytes_in)
    elapsed = _elapsed(result)
    links = []
    for lk in s.get("links") or []:
        key = (lk["src"], lk["dst"])
        e = topo.graph.edges[key] if topo is not None and topo.graph.has_edge(*key) else {}
        lt = e.get("link", "?")
        i = usage.link_id.get(key) if usage is not None and busy is not None else None
        if i is not None and busy is not None and load_b is not None:
            cap = lk.get("capacity_Bps") or 0.0
            row = {"busy_share": float(busy[i]) / span, "busy_s_per_step": float(busy[i]) / n,
                   "step_load": float(load_b[i]) / (cap * span) if cap > 0 else 0.0}
        else:  # no intervals (a result without them): the whole simulated time
            bt = lk.get("busy_time_s", 0.0)
            row = {"busy_share": bt / elapsed if elapsed > 0 else 0.0, "busy_s_per_step": bt / n,
                   "step_load": lk.get("utilization") or 0.0}
        links.append({**lk, "link": lt, "kind": kinds.get(lt, "?"), **row})
    links.sort(key=lambda x: (-x["busy_share"], -x["step_load"], -(x.get("bytes") or 0.0)))
    return links


def _elapsed(result: Any) -> float:
    hi = 0.0
    for run in result.runs:
        for arr in (run.gpu_end, run.host_end):
            v = arr[np.isfinite(arr)]
            if v.size:
                hi = max(hi, float(v.max()))
    return hi


def run_report_data(result: Any) -> dict[str, Any]:
    """Everything the run report shows, JSON-ready (schema ``cosim.run-report/1``)."""
    s = result.summary()
    topo = result.topology
    res = []
    for rg, run in zip(result.graph.ranks, result.runs):
        res.extend(_rank_resources(result, rg, run))
    kinds = link_kinds(topo) if topo is not None else {}
    elapsed = _elapsed(result)
    links = _link_rows(result, s, topo, kinds)
    # per link type present in the topology, used or not
    types: dict[str, dict[str, Any]] = {}
    if topo is not None:
        for _u, _v, e in topo.graph.edges(data=True):
            t = types.setdefault(e.get("link", "?"), {"link": e.get("link", "?"), "kind": kinds.get(e.get("link"), "?"),
                                                      "directed_links": 0, "with_traffic": 0, "bytes": 0.0,
                                                      "memcpy_bytes": 0.0, "max_step_load": 0.0,
                                                      "max_busy_share": 0.0})
            t["directed_links"] += 1
        for lk in links:
            used = types.get(lk["link"])
            if used is None:
                continue
            used["with_traffic"] += 1
            used["bytes"] += lk.get("bytes") or 0.0
            used["memcpy_bytes"] += lk.get("memcpy_bytes") or 0.0
            used["max_step_load"] = max(used["max_step_load"], lk["step_load"])
            used["max_busy_share"] = max(used["max_busy_share"], lk["busy_share"])
    stress = [{"what": r["resource"], "kind": r["kind"], "share": r["share"]} for r in res]
    stress += [{"what": f"link {lk['src']} -> {lk['dst']} ({lk['link']})", "kind": f"link:{lk['kind']}",
                "share": lk["busy_share"], "load": lk["step_load"]} for lk in links]
    stress.sort(key=lambda x: -x["share"])
    gpus = [r.get("gpu") for r in s.get("ranks") or [] if r.get("gpu")]
    hw = hardware_totals(topo, gpus or None) if topo is not None else None
    return {"schema": "cosim.run-report/1", "headline": headline(s), "step_time_s": s.get("step_time_s"),
            "breakdown": s.get("breakdown"), "critical_path": s.get("critical_path"), "resources": res,
            "links": links, "link_types": sorted(types.values(), key=lambda t: t["link"]),
            "stress_points": stress[:12], "simulated_time_s": elapsed, "hardware": hw,
            "figures": topo.figures() if topo is not None else None}


_CP_BOUND = {
    "host": "host-bound",
    "gpu": "compute-bound",
    "communication": "communication-bound",
    "memcpy": "copy-bound",
    "launch_latency": "launch-latency-bound",
}


def headline(summary: dict[str, Any]) -> str:
    """One sentence naming the step time and the bottleneck, e.g. "Step 90.6 ms,
    host-bound (87% of the critical path); GPU idle waiting for launches 69% of the step".

    The critical path decides what bounds the step; the largest part of the
    GPU-side breakdown says what the GPU does meanwhile.
    """
    st = summary.get("step_time_s")
    bd = summary.get("breakdown") or {}
    if not st or not bd:
        return f"Step {fmt_time(st)}: no GPU step to break down"
    key = max(bd, key=lambda k: bd[k])
    gpu_side = _HEAD.get(key, key + " {p}").format(p=fmt_pct(bd[key] / st))
    cp = summary.get("critical_path") or {}
    br = cp.get("by_resource") or {}
    tot = sum(br.values())
    bound = cp.get("bound")
    if bound and tot > 0:
        label = _CP_BOUND.get(bound, f"{bound}-bound")
        return (f"Step {fmt_time(st)}, {label} ({fmt_pct(br[bound] / tot)} of the critical path); "
                f"GPU side: {gpu_side.split(': ', 1)[-1]}")
    return f"Step {fmt_time(st)}, {gpu_side}"


def _bar_breakdown(bd: dict[str, float], title: str) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    for k, v in bd.items():
        fig.add_trace(go.Bar(y=["step"], x=[v * 1e3], name=BREAKDOWN_LABELS.get(k, k), orientation="h",
                             marker_color=_COLORS.get(k), hovertemplate="%{x:.3f} ms<extra>" + k + "</extra>"))
    fig.update_layout(barmode="stack", title=title, xaxis_title="time per step (ms)", height=230,
                      margin=dict(l=60, r=20, t=50, b=40), legend=dict(orientation="h", y=-0.45))
    return fig


def _hbar(labels: list[str], values: list[float], title: str, xtitle: str, colors: list[str] | None = None,
          height: int | None = None, pct: bool = True) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(y=labels[::-1], x=values[::-1], orientation="h",
                           marker_color=(colors[::-1] if colors else "#1f77b4"),
                           text=[fmt_pct(v / 100, 1) if pct else f"{v:.3g}" for v in values[::-1]],
                           textposition="auto"))
    fig.update_layout(title=title, xaxis_title=xtitle, height=height or max(220, 26 * len(labels) + 90),
                      margin=dict(l=20, r=20, t=50, b=40))
    fig.update_yaxes(automargin=True)
    if pct:  # a share is read against the whole: 0.1% busy must look empty, not like a full bar
        fig.update_xaxes(range=[0, 100], ticksuffix="%")
    return fig


_KIND_COLORS = {"sm": "#2ca02c", "stream": "#98df8a", "comm": "#d62728", "copy": "#9467bd",
                "host_thread": "#ff7f0e"}
_LINK_NOTE = ("Link traffic: collectives (simulated: the fabric's flows; measured: the engine's decomposition of each "
              "collective into flows for the algorithm its tuner picks, spread over the collective kernel's replayed "
              "interval) and host<->device memcpys on the GPU's PCIe path to its CPU over the copy's replayed "
              "interval. Memcpy bytes are attributed only: copies keep their measured or modeled durations and do "
              "not contend with other traffic in the replay. Busy share and load are over the step window, as for "
              "the other resources; 'load (whole replay)' is bytes / (capacity x simulated time).")


def _busy_before(ms: np.ndarray, me: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Busy time before each ``x`` of the sorted disjoint intervals ``[ms, me)``: the lengths of those ending before
    it (a prefix sum) plus the part of the one it falls in. O((intervals + len(x)) log); the same sums as
    ``clip(x - ms, 0, me - ms).sum()`` per ``x`` to rounding (an order of ~1e-16 of the step)."""
    length = me - ms
    done = np.concatenate([[0.0], np.cumsum(length)])
    k = np.searchsorted(ms, x, side="right")  # intervals starting at or before x: all but the last end by x
    last = np.maximum(k - 1, 0)
    part = np.clip(x - ms[last], 0.0, length[last])
    return np.where(k > 0, done[last] + part, 0.0)


def _timeline(result: Any, bins: int = 300) -> Any | None:
    """Heatmap of busy fraction per track (host threads, GPU streams) over one step of rank 0."""
    import plotly.graph_objects as go

    if not result.graph.ranks:
        return None
    rg, run = result.graph.ranks[0], result.runs[0]
    _, _, _, (a, b) = _window(rg, run)
    if not b > a:
        return None
    edges = np.linspace(a, b, bins + 1)
    tracks: list[tuple[str, np.ndarray, np.ndarray]] = []
    H, G = rg.host_ops, rg.gpu_ops
    for t in np.unique(H.thread) if len(H) else []:
        m = H.thread == t
        tracks.append((f"host {_thread_label(rg, int(t))}", run.host_start[m], run.host_end[m]))
    if len(G):
        for dev in np.unique(G.device):
            for st in np.unique(G.stream[G.device == dev]):
                m = (G.device == dev) & (G.stream == st)
                tracks.append((f"GPU{int(dev)} stream {int(st)}", run.gpu_start[m], run.gpu_end[m]))
    z, names = [], []
    width = (b - a) / bins
    for name, s, e in tracks:
        ok = np.isfinite(s) & np.isfinite(e) & (e > a) & (s < b)
        ms, me = merge_intervals(np.clip(s[ok], a, b), np.clip(e[ok], a, b))
        if ms.size == 0:
            z.append(np.zeros(bins))
        else:
            z.append(np.diff(_busy_before(ms, me, edges)) / width)
        names.append(name)
    x = (edges[:-1] + edges[1:]) / 2
    fig = go.Figure(go.Heatmap(z=np.array(z), x=(x - a) * 1e3, y=names, colorscale="Blues", zmin=0, zmax=1,
                               colorbar=dict(title="busy"),
                               hovertemplate="%{y}<br>t=%{x:.3f} ms<br>busy %{z:.0%}<extra></extra>"))
    fig.update_layout(title=f"Timeline of one step, rank {int(rg.rank)} ({fmt_time(b - a)}; "
                            f"{bins} bins of {fmt_time(width)}, shade = busy fraction)",
                      xaxis_title="time since step start (ms)", height=max(220, 40 * len(names) + 110),
                      margin=dict(l=20, r=20, t=50, b=40))
    fig.update_yaxes(automargin=True, autorange="reversed")
    return fig


def _gbps(x: float | None) -> str:
    from cosim.units import fmt_bandwidth

    return "n/a" if x is None else fmt_bandwidth(x)


TABLE_ROWS = 256
"""Rows a report table shows at most: beyond, the busiest this many (the rest summed up in a note; every row is in
``report.json`` beside the page). 1024 GPUs put ~7,000 directed links with traffic on the fabric (3 MB of HTML)."""


def _capped(rows: list[dict[str, Any]], ranked: list[dict[str, Any]], field: str, what: str
            ) -> tuple[list[dict[str, Any]], str | None]:
    """The rows a table shows: ``rows`` when they are at most :data:`TABLE_ROWS`; else the first :data:`TABLE_ROWS`
    of ``ranked`` (``rows`` by decreasing ``field``) and a note on the others (the busiest of them: the next one of
    ``ranked``)."""
    if len(rows) <= TABLE_ROWS:
        return rows, None
    return ranked[:TABLE_ROWS], (
        f"The {TABLE_ROWS:,} busiest of {len(rows):,} {what}; each of the other {len(rows) - TABLE_ROWS:,} is busy at "
        f"most {fmt_pct(ranked[TABLE_ROWS][field], 2)} of the step window. Every row is in report.json beside this "
        "page (run_report_data: 'resources', 'links').")


def run_report_html(result: Any, title: str | None = None, data: dict[str, Any] | None = None) -> str:
    """The run report page for ``result`` (a :class:`cosim.replay.ReplayResult`); ``data`` is its
    :func:`run_report_data` where the caller has it already."""
    from cosim import units

    s = result.summary()
    d = data if data is not None else run_report_data(result)
    name = title or f"cosim run report: {s.get('topology') or ''}"
    page = Page(name)
    page.h1(name, sub=" ".join(s.get("sources") or []))
    page.headline(d["headline"])
    st = s.get("step_time_s")
    # --- summary
    page.h2("Summary")
    rows = [["simulated step time", fmt_time(st)],
            ["measured step time (trace)", fmt_time(s.get("measured_step_time_s"))],
            ["error vs measured", fmt_pct(s.get("error"), 1) if s.get("error") is not None else "n/a"],
            ["steps per second", f"{1 / st:.4g} /s" if st else "n/a"],
            ["topology", str(s.get("topology"))],
            ["ranks", str(len(s.get("ranks") or []))],
            ["collectives", str((s.get("config") or {}).get("collectives"))],
            ["critical path bound", bound_label((s.get("critical_path") or {}).get("bound"))
             if (s.get("critical_path") or {}).get("bound") else "n/a"],
            ["simulation wall time", fmt_time(s.get("sim_wall_s"))]]
    page.table(["quantity", "value"], rows, left=1)
    for n in s.get("notes") or []:
        page.p("note: " + n, "note")
    # --- breakdown
    bd = s.get("breakdown") or {}
    page.h2("Step-time breakdown (slowest rank)")
    if st:
        page.fig(_bar_breakdown(bd, f"Where the {fmt_time(st)} step goes"))
        rows = []
        split = s.get("exposed_communication_split")
        for k, v in bd.items():
            rows.append([BREAKDOWN_LABELS.get(k, k), fmt_time(v), fmt_pct(v / st, 1)])
            if k == "exposed_communication" and split:
                for sk, label in (("transfer_s", "of which transfer (all peers present, data moving)"),
                                  ("wait_for_peers_s", "of which waiting for peers (sync)")):
                    rows.append([label, fmt_time(split.get(sk) or 0.0), fmt_pct((split.get(sk) or 0.0) / st, 1)])
        page.table(["category", "time per step", "share of step"], rows, table_id="breakdown")
        per_rank = [[f"rank {r['rank']}", fmt_time(r.get("step_time_s")),
                     *(fmt_pct((r["breakdown"][k] / r["step_time_s"]) if r.get("step_time_s") else None)
                       for k in bd)] for r in s.get("ranks") or []]
        page.table(["rank", "step time", *(BREAKDOWN_LABELS.get(k, k) for k in bd)], per_rank)
    # --- stress points
    page.h2("Top stress points")
    page.p("Most loaded resources and links: busy share of the step window (GPU streams, SM, copy engines, host "
           "threads and links alike). A host thread near 100% with the GPU idle means host-bound.", "note")
    sp = d["stress_points"][:10]
    if sp:
        page.fig(_hbar([x["what"] for x in sp], [x["share"] * 100 for x in sp], "Busiest resources",
                       "busy share of step window (%)",
                       [_KIND_COLORS.get(x["kind"], "#17becf" if x["kind"].startswith("link:") else "#1f77b4")
                        for x in sp]))
    # --- utilization
    page.h2("Utilization of every resource")
    res = d["resources"]
    ranked = sorted(res, key=lambda r: -r["share"])
    shown, note = _capped(res, ranked, "share", "resources")
    if note is not None:
        page.p(note, "note")
    page.table(["resource", "kind", "busy per step", "busy share of step"],
               [[r["resource"], r["kind"], fmt_time(r["busy_s_per_step"]), fmt_pct(r["share"], 1)] for r in shown],
               table_id="resources")
    if res:
        top = ranked[:30]
        page.fig(_hbar([r["resource"] for r in top], [r["share"] * 100 for r in top],
                       "GPU streams, SM, copy engines and host threads", "busy share of step window (%)",
                       [_KIND_COLORS.get(r["kind"], "#1f77b4") for r in top]))
    page.h2("Links (PCIe, NVLink, NIC, fabric)")
    page.p(_LINK_NOTE, "note")
    if d["link_types"]:
        page.table(["link type", "kind", "directed links", "with traffic", "bytes", "of which memcpy",
                    "max load (step window)", "max busy share of step"],
                   [[t["link"], t["kind"], t["directed_links"], t["with_traffic"], units.fmt_size(t["bytes"]),
                     units.fmt_size(t["memcpy_bytes"]), fmt_pct(t["max_step_load"], 3),
                     fmt_pct(t["max_busy_share"], 2)] for t in d["link_types"]])
    if d["links"]:
        lk = d["links"][:24]
        page.fig(_hbar([f"{x['src']}->{x['dst']} ({x['link']})" for x in lk], [x["busy_share"] * 100 for x in lk],
                       f"Busiest directed links (top {len(lk)} of {len(d['links'])} with traffic)",
                       "busy share of step window (%)"))
        n = len(d["links"])
        shown_links, note = _capped(d["links"], d["links"], "busy_share", "directed links with traffic")
        if note is not None:  # (run_report_data lists the links busiest first)
            page.p(note, "note")
            what = f"The {len(shown_links)} busiest of the {n} directed links with traffic"
        else:
            what = f"Every link with traffic: {n} directed links"
        page.details_start(f"{what} (click a column header to sort)", open_=n <= 24)
        page.table(["link", "type", "kind", "capacity", "bytes", "memcpy bytes", "busy per step",
                    "busy share of step", "load (step window)", "load (whole replay)", "peak transfers"],
                   [[f"{x['src']} -> {x['dst']}", x["link"], x["kind"],
                     (_gbps(x.get("capacity_Bps")), x.get("capacity_Bps") or 0.0),
                     (units.fmt_size(x["bytes"]), x.get("bytes") or 0.0),
                     (units.fmt_size(x.get("memcpy_bytes") or 0.0), x.get("memcpy_bytes") or 0.0),
                     (fmt_time(x["busy_s_per_step"]), x["busy_s_per_step"]),
                     (fmt_pct(x["busy_share"], 2), x["busy_share"]),
                     (fmt_pct(x["step_load"], 3), x["step_load"]),
                     (fmt_pct(x.get("utilization"), 3), x.get("utilization") or 0.0),
                     x.get("peak_flows")] for x in shown_links], left=3, sortable=True, table_id="all-links")
        page.details_end()
    else:
        page.p("No link traffic: no collective or host<->device copy of this replay put bytes on a link.", "note")
    # --- critical path
    cp = s.get("critical_path") or {}
    page.h2("Critical path")
    br = cp.get("by_resource") or {}
    if br:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        bc = cp.get("by_class") or {}
        fig = make_subplots(rows=1, cols=2, subplot_titles=("by resource", "by GPU op class"))
        fig.add_trace(go.Bar(x=list(br), y=[v * 1e3 for v in br.values()], marker_color="#1f77b4"), 1, 1)
        fig.add_trace(go.Bar(x=list(bc), y=[v * 1e3 for v in bc.values()], marker_color="#17becf"), 1, 2)
        fig.update_layout(title=f"Critical path composition ({fmt_time(cp.get('total_s'))} per step)",
                          showlegend=False, height=340, margin=dict(l=50, r=20, t=70, b=60))
        fig.update_yaxes(title_text="ms per step")
        page.fig(fig)
        page.table(["top op on the critical path", "time per step"],
                   [[o["name"], fmt_time(o["time_s"])] for o in cp.get("top_ops") or []])
    # --- timeline
    page.h2("Timeline overview")
    tl = _timeline(result)
    if tl is not None:
        page.fig(tl)
    page.p(perfetto_note(), "note")
    page.link(PERFETTO_URL, "Open ui.perfetto.dev (then open this run's timeline.json.gz)")
    # --- hardware
    page.h2("Hardware")
    f = d.get("figures") or {}
    hw = d.get("hardware")
    if f:
        page.table(["figure", "value"], [
            ["topology", f.get("name")], ["host nodes", f.get("nodes")],
            ["GPUs", f"{hw['gpus']} used by this run, of {f.get('gpus')}" if hw else f.get("gpus")],
            ["GPUs per node", f.get("gpus_per_node")], ["NVLink domain (GPUs)", f.get("nvlink_domain_gpus")],
            ["scale-up bandwidth per GPU (per direction)", _gbps(f.get("per_gpu_scale_up_bw_Bps"))],
            ["scale-out bandwidth per GPU (per direction)", _gbps(f.get("per_gpu_scale_out_bw_Bps"))],
            ["host (PCIe) bandwidth per GPU (per direction)", _gbps(f.get("per_gpu_host_bw_Bps"))],
            ["bisection bandwidth", _gbps(f.get("bisection_bw_Bps"))],
            ["devices", ", ".join(f"{k} x{v}" for k, v in (f.get("devices") or {}).items())],
            ["physical links", ", ".join(f"{k} x{v}" for k, v in (f.get("links") or {}).items())]])
    hw = d.get("hardware")
    if hw:
        page.table(["part", "catalog id", "count", "TDP", "price"],
                   [[p["name"], p["spec"], p["count"], f"{p['tdp_W']:.0f} W" if p["tdp_W"] is not None else "n/a",
                     f"${p['price_usd']:,.0f}" if p["price_usd"] is not None else "n/a"] for p in hw["parts"]])
        page.p(f"Total TDP of the {hw['gpus']} GPUs this run used, their CPU sockets and NICs: "
               f"{hw['power_W']:,.0f} W"
               + (f" (no TDP in the catalog for {', '.join(hw['missing_power'])})" if hw["missing_power"] else "")
               + (f"; cost ${hw['cost_usd']:,.0f}" if hw["cost_usd"] is not None else "") + ".", "note")
    return page.render()


def write_run_report(result: Any, path: str | Path, title: str | None = None) -> Path:
    """Write the run report of ``result`` to ``path`` (atomically) and its data (:func:`run_report_data`: every
    resource and link, where the page lists at most :data:`TABLE_ROWS` of each) to ``report.json`` beside it
    (compact JSON; a value that is not finite as null); returns the page's path."""
    import orjson

    from cosim.fileio import atomic_open, write_text
    from cosim.workload.graph import gc_paused

    p = Path(path)
    with gc_paused():  # per-link and per-resource rows, plotly's figure objects
        data = run_report_data(result)
        html = run_report_html(result, title, data)
        raw = orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS)
    write_text(p, html)
    with atomic_open(p.with_suffix(".json"), "wb") as fh:
        fh.write(raw + b"\n")
    return p
