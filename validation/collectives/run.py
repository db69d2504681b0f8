"""Collective validation: simulated vs measured NCCL times on H100 machines.

Usage::

    python -m validation.collectives            # evaluate, print, write RESULTS.md
    python -m validation.collectives --refit    # refit calibrations, rewrite
                                                # cosim/engine/data/nccl_h100.yaml, then evaluate
    python -m validation.collectives --points   # also print every point

Protocol (documented in RESULTS.md):

* measured value: ``time_stats.<op>.median`` (ms) per size; duplicate sizes
  are merged by their median;
* split: sizes sorted ascending; even-indexed sizes (0, 2, 4, ...) are the
  training set, odd-indexed sizes the held-out set;
* noise filter: a point whose measured median differs by more than 25% from
  the rolling median of its 21 size-neighbours is an outlier (bimodal
  host-side jitter at small sizes); outliers are left out of fitting and of the
  targets, counted, and their errors reported separately;
* fit (per case, training points only): for each alternative set of
  algorithm/protocol pairs, latency and efficiency per pair minimizing the
  mean absolute log error of ``min over pairs (latency + size * u / efficiency)``,
  where ``u`` is the engine's own time per byte for the pair's flow plan on the
  idle topology; the best set wins;
* evaluation: every size is simulated by the engine (``Simulator.collective``),
  with the tuner choosing among the calibrated pairs; error = sim/measured - 1.

Targets: per GPU count, over held-out non-outlier points of the cases counted
in targets: median |error| <= 10%, max |error| <= 25%.
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from validation.collectives.cases import CASES, SOURCE, Case, topology_for

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "RESULTS.md"
OUTLIER_WINDOW = 21
OUTLIER_TOL = 0.25
TARGET_MEDIAN = 0.10
TARGET_MAX = 0.25


def measured_dir() -> Path | None:
    from cosim.resources import shared_dir

    d = shared_dir()
    if d is None or not (d / "measured").is_dir():
        return None
    return d / "measured"


@dataclass
class Points:
    size: np.ndarray
    time: np.ndarray
    """Measured median time (s)."""
    train: np.ndarray
    """Bool: even-indexed size."""
    outlier: np.ndarray


def load_points(case: Case, root: Path) -> Points:
    """Measured median times (s) of a case, with split and outlier flags."""
    col = f"time_stats.{case.file.split('/')[-1].split('.')[0]}.median"
    by_size: dict[int, list[float]] = defaultdict(list)
    with open(root / case.file, newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_workers"]) == case.workers and int(row["devices_per_node"]) == case.devices_per_node:
                by_size[int(row["size"])].append(float(row[col]) * 1e-3)
    sizes = np.array(sorted(by_size), dtype=float)
    times = np.array([float(np.median(by_size[int(s)])) for s in sizes])
    idx = np.arange(len(sizes))
    pad = OUTLIER_WINDOW // 2
    tp = np.pad(times, pad, mode="edge")
    roll = np.median(np.lib.stride_tricks.sliding_window_view(tp, OUTLIER_WINDOW), axis=1)
    outlier = np.abs(times / roll - 1) > OUTLIER_TOL
    return Points(sizes, times, idx % 2 == 0, outlier)


# ---------------------------------------------------------------- fitting
EFF_MAX = 1.3
"""Upper bound of a fitted efficiency (relative to the catalog's link efficiency)."""
IRLS_ROUNDS = 1
"""1: plain least squares on relative error (best medians; tried 6 rounds towards minimax: worse medians)."""
GRID = 40
"""Candidate switch points for the dynamic program (refined point by point afterwards)."""


def _segment(s: np.ndarray, t: np.ndarray, u: float) -> tuple[float, float, float]:
    """Least-squares fit of t ~ L + s * u / eff on one segment, on relative errors
    (``IRLS_ROUNDS`` > 1 reweights towards a minimax fit). Returns (cost, L, eff)."""
    wmin = 1.0 / EFF_MAX
    a0, a1 = 1.0 / t, s * u / t
    wt = np.ones_like(t)
    lat, w = 0.0, wmin
    for _ in range(IRLS_ROUNDS):
        b0, b1 = a0 * wt, a1 * wt
        m = np.array([[b0 @ a0, b0 @ a1], [b0 @ a1, b1 @ a1]])
        rhs = np.array([b0.sum(), b1.sum()])
        try:
            lat, w = np.linalg.solve(m, rhs)
        except np.linalg.LinAlgError:
            lat, w = 0.0, max(rhs[1] / max(m[1, 1], 1e-300), wmin)
        if lat < 0:
            lat, w = 0.0, rhs[1] / m[1, 1]
        if w < wmin:
            w = wmin
            lat = max(0.0, float((b0 @ (1 - a1 * w)) / (b0 @ a0)))
        r = lat * a0 + w * a1 - 1
        wt = np.maximum(r * r, 1e-6)
    r = lat * a0 + w * a1 - 1
    return float((r * r).sum()), float(lat), float(1.0 / w)


def fit_case(case: Case, pts: Points, sim_units: dict[str, float]) -> tuple[list[str], list[float], list[float],
                                                                               list[float], float]:
    """Piecewise fit: segments of sizes, each one algo/proto with its latency and efficiency.

    Protocols appear in the order of the case's combo lists (LL, LL128, Simple: NCCL's
    order as size grows); a protocol may be skipped. Returns (combos, latencies s,
    efficiencies, up_to bytes, cost).
    """
    m = pts.train & ~pts.outlier
    s, t = pts.size[m], pts.time[m]
    n = len(s)
    protos: list[str] = []
    for combos in case.combos:
        for c in combos:
            p = c.split("/")[1]
            if p not in protos:
                protos.append(p)
    protos.sort(key=["ll", "ll128", "simple"].index)
    algos_for = {p: sorted({c.split("/")[0] for cs in case.combos for c in cs if c.endswith("/" + p)})
                 for p in protos}
    grid = sorted(set(np.linspace(0, n, GRID + 1).round().astype(int).tolist()))

    def best_seg(i: int, j: int, p: str) -> tuple[float, str, float, float]:
        out = (math.inf, "", 0.0, 1.0)
        for a in algos_for[p]:
            c = f"{a}/{p}"
            cost, lat, eff = _segment(s[i:j], t[i:j], sim_units[c])
            if cost < out[0]:
                out = (cost, c, lat, eff)
        return out

    def solve(bounds: list[int], labels: list[str]) -> tuple[float, list[tuple[str, float, float]]]:
        total, segs = 0.0, []
        for (i, j), p in zip(itertools.pairwise(bounds), labels):
            cost, c, lat, eff = best_seg(i, j, p)
            total += cost
            segs.append((c, lat, eff))
        return total, segs

    # dynamic program over grid positions and protocol order
    P, G = len(protos), len(grid)
    dp = np.full((G, P), math.inf)
    back: dict[tuple[int, int], tuple[int, int]] = {}
    for k in range(1, G):
        for p in range(P):
            c0 = best_seg(0, grid[k], protos[p])[0]
            if c0 < dp[k, p]:
                dp[k, p], back[(k, p)] = c0, (0, -1)
            for k2 in range(1, k):
                for p2 in range(p):
                    if not math.isfinite(dp[k2, p2]):
                        continue
                    c = dp[k2, p2] + best_seg(grid[k2], grid[k], protos[p])[0]
                    if c < dp[k, p]:
                        dp[k, p], back[(k, p)] = c, (k2, p2)
    p = int(np.argmin(dp[G - 1]))
    k = G - 1
    bounds, labels = [grid[k]], []
    while True:
        labels.append(protos[p])
        k2, p2 = back[(k, p)]
        bounds.append(grid[k2])
        if p2 < 0:
            break
        k, p = k2, p2
    bounds, labels = bounds[::-1], labels[::-1]
    # refine each inner switch point over every point between its neighbours
    for _ in range(3):
        for b in range(1, len(bounds) - 1):
            lo, hi = bounds[b - 1] + 1, bounds[b + 1] - 1
            best = (solve(bounds, labels)[0], bounds[b])
            for x in range(lo, hi + 1):
                trial = [*bounds[:b], x, *bounds[b + 1:]]
                c = solve(trial, labels)[0]
                if c < best[0]:
                    best = (c, x)
            bounds[b] = best[1]
    cost, segs = solve(bounds, labels)
    up_to = [float((s[j - 1] + s[j]) / 2) for j in bounds[1:-1]] + [math.inf]
    return [c for c, _, _ in segs], [lat for _, lat, _ in segs], [eff for _, _, eff in segs], up_to, cost


# ---------------------------------------------------------------- engine
def _sim(topo: Any, use_calibration: bool = True) -> Any:
    from cosim.engine import NcclConfig, SimConfig, Simulator

    return Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=use_calibration), record_trace=False))


def unit_times(case: Case, topo: Any) -> dict[str, float]:
    """Engine seconds per byte at efficiency 1 for each algo of the case's combos."""
    sim = _sim(topo, use_calibration=False)
    out = {}
    for combos in case.combos:
        for c in combos:
            algo = c.split("/")[0]
            out[c] = sim.collectives._unit_time(case.op, tuple(case.ranks), algo, 1.0, math.inf)
    return out


def simulate(case: Case, topo: Any, sizes: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """Engine times (s) and chosen algo/proto per size."""
    sim = _sim(topo)
    times, picks = [], []
    for s in sizes:
        ev = sim.collective(case.op, case.ranks, float(s))
        sim.run()
        r = ev.value
        times.append(r.time)
        picks.append(f"{r.algo}/{r.proto}")
    return np.array(times), picks


def shape_match(case: Case, topo: Any) -> dict[str, Any]:
    sim = _sim(topo, use_calibration=False)
    shape = sim.collectives.shape(case.op, case.ranks)
    return {k: getattr(shape, k) for k in case.match}


# ---------------------------------------------------------------- refit
def refit(root: Path, params_path: Path | None = None, verbose: bool = True) -> None:
    """Fit every case on its training points and rewrite the calibrations in the params file."""
    from cosim.engine import nccl
    from cosim.engine.nccl import Calibration

    path = params_path or nccl.DEFAULT_PARAMS
    doc = yaml.safe_load(path.read_text())
    cals = []
    for case in CASES:
        topo = topology_for(case)
        pts = load_points(case, root)
        u = unit_times(case, topo)
        combos, lat, eff, up_to, cost = fit_case(case, pts, u)
        cal = Calibration(
            name=case.name,
            match=shape_match(case, topo),
            latency={c: float(v) for c, v in zip(combos, lat)},
            efficiency={c: float(v) for c, v in zip(combos, eff)},
            up_to={c: float(v) for c, v in zip(combos, up_to)},
            fit={"data": f"{case.file} num_workers={case.workers} devices_per_node={case.devices_per_node}",
                 "source": SOURCE, "split": "even-indexed sizes (ascending) train, odd-indexed held out",
                 "train_points": int((pts.train & ~pts.outlier).sum()),
                 "train_sum_sq_rel_error": round(cost, 5)},
        )
        cals.append(cal)
        if verbose:
            print(f"fit {case.name}: " + ", ".join(f"{c} <= {b:.3g} B: {v * 1e6:.2f} us eff {e:.3f}"
                                                   for c, v, e, b in zip(combos, lat, eff, up_to)))
    doc["calibrations"] = [c.to_yaml() for c in cals]
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    from cosim.fileio import write_text

    write_text(path, header + yaml.safe_dump(doc, sort_keys=False, width=120))
    nccl.clear_cache()


# ---------------------------------------------------------------- evaluate
@dataclass
class CaseResult:
    case: Case
    pts: Points
    sim: np.ndarray
    picks: list[str]

    @property
    def err(self) -> np.ndarray:
        return self.sim / self.pts.time - 1

    def stats(self, train: bool, filtered: bool = True) -> tuple[int, float, float]:
        m = self.pts.train if train else ~self.pts.train
        if filtered:
            m = m & ~self.pts.outlier
        e = np.abs(self.err[m])
        return int(m.sum()), float(np.median(e)) if e.size else math.nan, float(e.max()) if e.size else math.nan


def evaluate(root: Path) -> list[CaseResult]:
    out = []
    for case in CASES:
        topo = topology_for(case)
        pts = load_points(case, root)
        sim, picks = simulate(case, topo, pts.size)
        out.append(CaseResult(case, pts, sim, picks))
    return out


def per_gpu_count(results: list[CaseResult]) -> dict[int, dict[str, float]]:
    """Held-out, non-outlier errors of target cases pooled per GPU count."""
    pool: dict[int, list[np.ndarray]] = defaultdict(list)
    for r in results:
        if not r.case.targets:
            continue
        m = ~r.pts.train & ~r.pts.outlier
        pool[r.case.workers].append(np.abs(r.err[m]))
    out = {}
    for n, es in sorted(pool.items()):
        e = np.concatenate(es)
        out[n] = {"points": int(e.size), "median": float(np.median(e)), "max": float(e.max())}
    return out


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def render(results: list[CaseResult]) -> str:
    from cosim.engine import load_params

    params = load_params()
    lines = [
        "# Collective validation: simulated vs measured (H100)",
        "",
        f"Measured data: {SOURCE}: `time_stats.<op>.median` per size (ms), rank 0.",
        "Generated by `python -m validation.collectives` (refit: `--refit`); calibrations in "
        "`cosim/engine/data/nccl_h100.yaml`.",
        "",
        "Protocol: sizes sorted ascending; even-indexed sizes are used for fitting, odd-indexed sizes are held out. "
        f"Points whose measured median differs by more than {OUTLIER_TOL:.0%} from the rolling median of their "
        f"{OUTLIER_WINDOW} size-neighbours are outliers (bimodal host jitter at small sizes): excluded from fit and "
        "targets, counted below, and their errors shown separately. Error = simulated / measured - 1; the table "
        "gives |error|.",
        "",
        "## Per GPU count (held-out, non-outlier points of target cases)",
        "",
        "| GPUs | points | median | max | target (median <= 10%, max <= 25%) |",
        "|---:|---:|---:|---:|---|",
    ]
    for n, st in per_gpu_count(results).items():
        ok = st["median"] <= TARGET_MEDIAN and st["max"] <= TARGET_MAX
        lines.append(f"| {n} | {st['points']} | {_pct(st['median'])} | {_pct(st['max'])} | {'met' if ok else 'MISSED'} |")
    lines += [
        "",
        "## Per case",
        "",
        "| case | fit pts | fit median | fit max | held-out pts | held-out median | held-out max | outliers | "
        "held-out max incl. outliers | in targets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        nt, mt, xt = r.stats(True)
        nh, mh, xh = r.stats(False)
        _, _, xa = r.stats(False, filtered=False)
        lines.append(f"| {r.case.name} | {nt} | {_pct(mt)} | {_pct(xt)} | {nh} | {_pct(mh)} | {_pct(xh)} | "
                     f"{int(r.pts.outlier.sum())} | {_pct(xa)} | {'yes' if r.case.targets else 'no'} |")
    lines += ["", "## Fitted parameters", "", "| case | algo/proto | latency | efficiency | sizes where chosen |",
              "|---|---|---:|---:|---|"]
    from cosim import units

    for r in results:
        cal = next((c for c in params.calibrations if c.name == r.case.name), None)
        if cal is None:
            continue
        for k in cal.latency:
            chosen = [s for s, p in zip(r.pts.size, r.picks) if p == k]
            rng = f"{units.fmt_size(min(chosen))} - {units.fmt_size(max(chosen))}" if chosen else "never"
            lines.append(f"| {r.case.name} | {k} | {units.fmt_time(cal.latency[k])} | {cal.efficiency[k]:.3f} | "
                         f"{rng} |")
    notes = [r for r in results if r.case.note]
    if notes:
        lines += ["", "## Notes", ""] + [f"* {r.case.name}: {r.case.note}" for r in notes]
    lines += ["", "Efficiency is relative to the path's effective capacity (catalog bandwidth x link efficiency); "
              "values above 1 mean NCCL beats the catalog's link efficiency on that path.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.collectives", description=__doc__.split("\n")[0])
    ap.add_argument("--refit", action="store_true", help="refit calibrations and rewrite the params file")
    ap.add_argument("--points", action="store_true", help="print every point")
    ap.add_argument("--no-write", action="store_true", help="do not rewrite RESULTS.md")
    args = ap.parse_args(argv)
    root = measured_dir()
    if root is None:
        print("skipped: ../shared/measured not found (set COSIM_SHARED to the shared folder)", file=sys.stderr)
        return 0
    if args.refit:
        refit(root)
    results = evaluate(root)
    from cosim import units

    for r in results:
        nt, mt, xt = r.stats(True)
        nh, mh, xh = r.stats(False)
        print(f"{r.case.name:52s} fit {nt:4d} pts median {_pct(mt):>6} max {_pct(xt):>6} | held-out {nh:4d} pts "
              f"median {_pct(mh):>6} max {_pct(xh):>6} | outliers {int(r.pts.outlier.sum())}"
              + ("" if r.case.targets else "  (not in targets)"))
        if args.points:
            for i in range(len(r.pts.size)):
                tag = "fit" if r.pts.train[i] else "held"
                tag += " outlier" if r.pts.outlier[i] else ""
                print(f"    {units.fmt_size(r.pts.size[i]):>10} measured {units.fmt_time(r.pts.time[i]):>10} "
                      f"sim {units.fmt_time(r.sim[i]):>10} err {100 * r.err[i]:+7.1f}% {r.picks[i]:12s} {tag}")
    ok = True
    for n, st in per_gpu_count(results).items():
        met = st["median"] <= TARGET_MEDIAN and st["max"] <= TARGET_MAX
        ok &= met
        print(f"{n} GPUs: held-out {st['points']} pts median {_pct(st['median'])} max {_pct(st['max'])} "
              f"{'met' if met else 'MISSED'}")
    if not args.no_write:
        from cosim.fileio import write_text

        write_text(RESULTS, render(results))
        print(f"wrote {RESULTS.relative_to(HERE.parent.parent)}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
