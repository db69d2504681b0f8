"""One-at-a-time sensitivity of the step time to hardware parameters.

Each parameter is moved up and down by ``delta`` (20% by default) from its
value in the scenario's hardware, one at a time, and the scenario is replayed;
parameters are ranked by the largest step-time change either way. Candidate
parameters come from the scenario's topology:

* bandwidth and latency of every link type present (``links.<type>.bandwidth``,
  ``links.<type>.latency``);
* the GPU's HBM bandwidth and its peak FLOP/s in the projection datatype
  (``accelerators.<id>.hbm_bandwidth``, ``accelerators.<id>.peak_flops.<dtype>``;
  these move projected kernel durations, not measured ones);
* the host CPU's launch overhead and launch latency (``cpus.<id>.*``);
* the NIC's bandwidth and latency: ``nics.<id>.port_bandwidth`` moves the NIC's
  own bandwidth and its port link type's (``links.ib-ndr.bandwidth`` for a
  ConnectX-7) together, from the port rate (the smaller of the two), because a
  port runs at the slower of adapter and link type; ``nics.<id>.latency``;
* host speed (replay knob ``host.speed``: host time is divided by it) and, for
  projected CPU captures, the ATen dispatch overhead per op
  (``projection.aten_overhead``).

Runs go through :func:`cosim.sweep.run_points`, so they are cached in
``out/points/<key>`` and can use any executor. The result is the
``cosim.sensitivity/1`` dict written to ``out/sensitivity.json`` and the tornado
chart ``out/tornado.html``. Each parameter says its step-time change when it
gets better (``better_pct``: more bandwidth, FLOP/s or speed; less latency or
overhead) and worse; one that moves the step by less than the noise floor
(:data:`cosim.replay.summary.NOISE_FLOOR`) either way is ``no_effect`` and
ranked after the others.
"""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError
from cosim.replay.summary import NOISE_FLOOR

__all__ = ["Param", "candidate_params", "parse_delta", "run_sensitivity"]


@dataclass(frozen=True)
class Param:
    """A perturbable parameter: its ``--set`` key, label, value (SI) and unit kind."""

    key: str
    label: str
    value: float
    kind: str
    """units kind (bandwidth, time, flops) or "factor"."""

    def fmt(self, v: float) -> str:
        """``v`` as a ``--set`` value in engineering units ("30 GB/s", "4.8 us"; a factor as a number), to six
        significant digits so that the perturbation is what it says."""
        from cosim import units

        if self.kind in ("bandwidth", "time", "flops"):
            return units.fmt(v, self.kind, 6)  # type: ignore[arg-type]
        return f"{v:.6g}"


def parse_delta(text: str | float) -> float:
    """``"20%"`` or ``0.2`` -> 0.2 (must be in (0, 1))."""
    s = str(text).strip()
    try:
        d = float(s[:-1]) / 100 if s.endswith("%") else float(s)
    except ValueError:
        raise CosimInputError(f"--delta {text!r}: expected a percentage like 20% or a fraction like 0.2") from None
    if not (0 < d < 1):
        raise CosimInputError(f"--delta {text!r}: must be between 0% and 100% (exclusive)")
    return d


def _scenario_hw(scn: Any, sets: dict[str, str]) -> tuple[Any, Any, Any]:
    """(resolved scenario, replay config, topology) of ``scn`` with ``sets``, without replaying."""
    from cosim.replay import ReplayConfig, apply_sets
    from cosim.scenario import apply_scenario_sets, build_topology, expand_port_bandwidth, split_topology_sets

    scn, rest = apply_scenario_sets(scn, dict(sets))
    tsets, other = split_topology_sets({**scn.set, **rest})
    cfg = apply_sets(ReplayConfig(topology=scn.topology, host_speed=scn.replay.host_speed),
                     expand_port_bandwidth(other))
    base = Path(scn.source_file).parent if scn.source_file else None
    topo = build_topology(cfg.topology or scn.topology, base, dict(cfg.catalog_overrides), tsets)
    return scn, cfg, topo


def candidate_params(scn: Any, sets: dict[str, str] | None = None) -> list[Param]:
    """The hardware parameters of ``scn`` (see the module doc), with their current values."""
    from cosim.scenario import SyntheticWorkload

    scn, cfg, topo = _scenario_hw(scn, dict(sets or {}))
    cat = topo.catalog
    out: list[Param] = []
    nic_links = {cat.nic(topo.graph.nodes[d]["spec"]).link for d in topo.devices("nic")}
    for lt in topo.link_counts():
        e = cat.link(lt)
        what = f"{lt} ({e.kind}{', NIC port' if lt in nic_links else ''})"
        out.append(Param(f"links.{lt}.bandwidth", f"{what} bandwidth", float(e.bandwidth), "bandwidth"))
        out.append(Param(f"links.{lt}.latency", f"{what} latency", float(e.latency), "time"))
    gspecs = sorted({topo.graph.nodes[g]["spec"] for g in topo.gpus})
    for g in gspecs:
        acc = cat.accelerator(g)
        out.append(Param(f"accelerators.{g}.hbm_bandwidth", f"{g} HBM bandwidth", float(acc.hbm_bandwidth),
                         "bandwidth"))
        dt = scn.projection.dtype if scn.projection.dtype in acc.peak_flops else "bf16"
        if dt in acc.peak_flops:
            out.append(Param(f"accelerators.{g}.peak_flops.{dt}", f"{g} peak {dt} FLOP/s",
                             float(acc.peak_flops[dt]), "flops"))
    for c in sorted({topo.graph.nodes[d]["spec"] for d in topo.devices("cpu")}):
        cpu = cat.cpu(c)
        out.append(Param(f"cpus.{c}.launch_overhead", f"{c} launch overhead", float(cpu.launch_overhead), "time"))
        out.append(Param(f"cpus.{c}.launch_latency", f"{c} launch latency", float(cpu.launch_latency), "time"))
    for n in sorted({topo.graph.nodes[d]["spec"] for d in topo.devices("nic")}):
        nic = cat.nic(n)
        # A NIC port runs at min(NIC bandwidth, port link type bandwidth) (cosim.topology.build), and the NIC
        # model also caps each transfer by its own bandwidth (cosim.engine.nic); moving either alone does
        # nothing upward once it is above the other. nics.<id>.port_bandwidth moves both, from the port rate.
        port = min(float(nic.bandwidth), float(cat.link(nic.link).bandwidth))
        out.append(Param(f"nics.{n}.port_bandwidth", f"{n} NIC bandwidth (NIC and its {nic.link} port)", port,
                         "bandwidth"))
        out.append(Param(f"nics.{n}.latency", f"{n} NIC latency", float(nic.latency), "time"))
    out.append(Param("host.speed", "host speed (host time / speed)", float(cfg.host_speed), "factor"))
    if cfg.launch_overhead is not None:
        out.append(Param("host.launch_overhead", "launch overhead (replay knob)", float(cfg.launch_overhead), "time"))
    if not isinstance(scn.workload, SyntheticWorkload):  # a synthesized step has no capture to project
        out.append(Param("projection.aten_overhead", "ATen dispatch overhead per op (projection)",
                         float(scn.projection.aten_overhead), "time"))
    return out


def run_sensitivity(scenario: str | Path | None, out: str | Path, *, params: list[str] | None = None,
                    delta: float = 0.2, sets: dict[str, str] | None = None, executor: Executor | None = None,
                    progress: bool = True) -> dict[str, Any]:
    """Perturb each parameter by +/-``delta``; return (and write) the ranked ``cosim.sensitivity/1`` dict.

    ``params`` picks parameters by key or by a substring of the key
    (``nvlink4``, ``host.speed``); None takes every candidate.
    """
    from cosim.fileio import write_json
    from cosim.report.sweep_report import write_tornado_report
    from cosim.scenario import load_scenario
    from cosim.sweep.runner import run_points

    scn = load_scenario(scenario)
    base_ref = scn.source_file or str(scenario)
    sets = dict(sets or {})
    cands = candidate_params(scn, sets)
    if params:
        chosen = []
        for p in params:
            hit = [c for c in cands if c.key == p] or [c for c in cands if p in c.key]
            if not hit:
                raise CosimInputError(f"--params {p}: no such parameter in this scenario; known: "
                                      + ", ".join(c.key for c in cands))
            chosen += [c for c in hit if c not in chosen]
        cands = chosen
    points: list[dict[str, str]] = [{}]
    for c in cands:
        points.append({c.key: c.fmt(c.value * (1 + delta))})
        points.append({c.key: c.fmt(c.value * (1 - delta))})
    out = Path(out)
    res = run_points(base_ref, points, out, executor, fixed=sets, progress=progress, label="sensitivity",
                     report=False)
    rows = res.rows
    base_row = rows[0]
    if base_row.get("status") != "ok" or not base_row.get("step_time_s"):
        raise CosimInputError(f"the baseline run failed: {base_row.get('error')}", file=scn.source_file)
    bst = float(base_row["step_time_s"])
    ranked = []
    for i, c in enumerate(cands):
        up, dn = rows[1 + 2 * i], rows[2 + 2 * i]
        entry: dict[str, Any] = {"key": c.key, "label": c.label, "kind": c.kind, "baseline": c.fmt(c.value),
                                 "up_value": c.fmt(c.value * (1 + delta)), "down_value": c.fmt(c.value * (1 - delta))}
        if up.get("status") != "ok" or dn.get("status") != "ok":
            entry.update(status="error", error=up.get("error") or dn.get("error"), effect=-1.0)
        else:
            u, d = float(up["step_time_s"]), float(dn["step_time_s"])
            up_pct, down_pct = (u / bst - 1) * 100, (d / bst - 1) * 100
            raised_better = c.kind != "time"  # more bandwidth / FLOP/s / speed is better, more latency worse
            effect = max(abs(u / bst - 1), abs(d / bst - 1))
            entry.update(status="ok", up_step_time_s=u, down_step_time_s=d, up_pct=up_pct, down_pct=down_pct,
                         better_pct=up_pct if raised_better else down_pct,
                         worse_pct=down_pct if raised_better else up_pct, effect=effect,
                         no_effect=effect < NOISE_FLOOR, up_bound=up.get("bound"), down_bound=dn.get("bound"))
        ranked.append(entry)
    ranked.sort(key=lambda e: (bool(e.get("no_effect")), -e["effect"], e["key"]))
    data = {"schema": "cosim.sensitivity/1", "scenario": scn.name, "baseline_step_time_s": bst,
            "noise_floor": NOISE_FLOOR,
            "baseline_bound": base_row.get("bound"), "delta": delta, "sets": sets, "parameters": ranked,
            "files": {"json": str(out / "sensitivity.json"), "html": str(out / "tornado.html"),
                      "csv": str(out / "results.csv")}}
    for e in ranked:
        for k in ("up_pct", "down_pct", "better_pct", "worse_pct", "effect"):
            if k in e and isinstance(e[k], float) and not math.isfinite(e[k]):
                e[k] = None
    write_json(out / "sensitivity.json", data)
    write_tornado_report(out / "tornado.html", data)
    return data
