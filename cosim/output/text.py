"""Human-readable summary tables (with units) for ``cosim replay`` and ``cosim run``."""

from __future__ import annotations

from typing import Any

from cosim.units import fmt_bandwidth, fmt_time

__all__ = ["format_hardware", "format_summary"]


def _t(x: float | None) -> str:
    return "-" if x is None else fmt_time(x)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.2f}%"


def format_hardware(topology: Any) -> str:
    """One line of the topology's headline figures (bytes/s per direction), e.g. for ``cosim run``."""
    fig = topology.figures()
    specs: dict[str, int] = {}
    for g in topology.gpus:
        name = topology.accelerator(g).name
        specs[name] = specs.get(name, 0) + 1
    gpus = ", ".join(f"{n} x {name}" for name, n in specs.items())
    return (f"hardware {topology.name}: {gpus}; per GPU per direction: scale-up "
            f"{fmt_bandwidth(fig['per_gpu_scale_up_bw_Bps'])}, scale-out {fmt_bandwidth(fig['per_gpu_scale_out_bw_Bps'])}, "
            f"host {fmt_bandwidth(fig['per_gpu_host_bw_Bps'])}; bisection {fmt_bandwidth(fig['bisection_bw_Bps'])}")


def _breakdown_title(s: dict[str, Any]) -> str:
    """Which rank the breakdown is: the summary's ``slowest_rank`` (and ``slowest_rank_ties``, cosim.summary/2)."""
    rank, tied = s.get("slowest_rank"), s.get("slowest_rank_ties", 1)
    if rank is None:
        return "breakdown per step:"
    if tied > 1:
        return f"breakdown per step of rank {rank} (the first of {tied} ranks tied for the slowest step):"
    return f"breakdown per step of rank {rank} (the slowest):"


def _busiest_other_rank(s: dict[str, Any]) -> dict[str, Any] | None:
    """The rank with the most compute, when it is not the headline rank and computes noticeably (0.5%) more:
    under skewed routing the hot rank, which the others wait for."""
    head = s.get("slowest_rank")
    ranks = [r for r in s.get("ranks", []) if isinstance(r.get("breakdown"), dict)]
    if head is None or len(ranks) < 2:
        return None
    busy = max(ranks, key=lambda r: r["breakdown"].get("compute") or 0.0)
    shown = s["breakdown"].get("compute") or 0.0
    if busy["rank"] == head or (busy["breakdown"].get("compute") or 0.0) <= shown * 1.005:
        return None
    return busy


def format_summary(s: dict[str, Any], max_ranks: int = 16, baseline: dict[str, Any] | None = None) -> str:
    """The summary as text: per-rank step times, breakdown (exposed communication split into transfer and
    waiting for peers) and critical path; with ``baseline`` (the baseline run's summary) a last line says
    how the step changed against it, or what bounds it when it did not change."""
    lines = []
    durations = "kernel models (synthesized step)" if s.get("synthetic") else s["config"]["durations"]
    lines.append(f"topology {s.get('topology')}   durations {durations}   collectives {s['config']['collectives']}")
    lines.append("")
    lines.append(f"{'rank':>5}  {'measured step':>14}  {'simulated step':>14}  {'error':>8}  {'host step (sim)':>15}")
    ranks = s["ranks"]
    for r in ranks[:max_ranks]:
        lines.append(f"{r['rank']:>5}  {_t(r['measured_step_time_s']):>14}  {_t(r['step_time_s']):>14}  "
                     f"{_pct(r['error']):>8}  {_t(r['cpu_step_time_s']):>15}")
    if len(ranks) > max_ranks:
        lines.append(f"  ... {len(ranks) - max_ranks} more ranks (see summary.json)")
    lines.append("(host step: the simulated host CPU thread's time per step, its ProfilerStep span; the GPU's work "
                 "may end later)")
    lines.append("")
    lines.append(f"step time {_t(s['step_time_s'])} (slowest rank)   measured {_t(s['measured_step_time_s'])}   "
                 f"error {_pct(s['error'])}")
    st = s["step_time_s"] or 0.0
    lines.append(_breakdown_title(s))
    for k, v in s["breakdown"].items():
        share = f"{100 * v / st:5.1f}%" if st else ""
        lines.append(f"  {k:<24} {_t(v):>12} {share}")
        split = s.get("exposed_communication_split")
        if k == "exposed_communication" and split and v > 0:
            for sk, label in (("transfer_s", "transfer"), ("wait_for_peers_s", "waiting for peers")):
                sv = split.get(sk) or 0.0
                lines.append(f"    {label:<22} {_t(sv):>12} {100 * sv / st:5.1f}%" if st else f"    {label}")
    busy = _busiest_other_rank(s)
    if busy is not None:
        bd = busy["breakdown"]
        split = busy.get("exposed_communication_split") or {}
        lines.append(f"busiest rank {busy['rank']} (most compute): compute {_t(bd.get('compute'))}, exposed communication "
                     f"{_t(bd.get('exposed_communication'))} (waiting for peers {_t(split.get('wait_for_peers_s'))}); "
                     "every rank's breakdown: ranks in summary.json (--json)")
    cp = s.get("critical_path") or {}
    if cp.get("by_resource"):
        lines.append(f"critical path: bound by {cp.get('bound')}")
        for k, v in cp["by_resource"].items():
            if v > 0:
                lines.append(f"  {k:<24} {_t(v):>12}")
        for op in cp.get("top_ops", [])[:3]:
            lines.append(f"  top op {_t(op['time_s']):>10}  {op['name'][:90]}")
    ke = s.get("kernel_error_by_class")
    if ke:
        lines.append(f"kernel model error vs measured, per op by class (step time error {_pct(s['error'])}):")
        lines.append(f"  {'class':<14} {'n':>6} {'MAPE':>8} {'median':>8} {'time err':>9}   "
                     f"{'all ops':>7} {'MAPE':>8} {'time err':>9}")
        for c, e in ke.items():
            def pc(x: float | None) -> str:
                return "-" if x is None else f"{100 * x:.1f}%"
            lines.append(f"  {c:<14} {e['n']:>6} {pc(e['mape']):>8} {pc(e['median_ape']):>8} "
                         f"{_pct(e['time_err']) if e['time_err'] is not None else '-':>9}   {e.get('n_all', '-'):>7} "
                         f"{pc(e.get('mape_all')):>8} {_pct(e.get('time_err_all')):>9}")
    for n in s.get("notes", []):
        lines.append(f"note: {n}")
    if baseline is not None:
        from cosim.replay.summary import explain_change

        lines.append(f"vs baseline ({_t(baseline.get('step_time_s'))}): {explain_change(baseline, s)['text']}")
    lines.append(f"simulated {s['events']} events in {s['sim_wall_s']:.3f} s wall")
    return "\n".join(lines)
