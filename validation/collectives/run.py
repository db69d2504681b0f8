"""Collective validation: simulated vs measured NCCL times on H100 machines.

Usage::

    python -m validation.collectives            # evaluate, print, write RESULTS.md
    python -m validation.collectives --refit    # refit calibrations, rewrite
                                                # cosim/engine/data/nccl_h100.yaml, then evaluate
    python -m validation.collectives --points   # also print every point

Protocol (documented in RESULTS.md):

* measured value: ``time_stats.<op>.min`` (ms) per size (see STAT); duplicate
  sizes are merged by their median; errors against ``.median`` also reported;
* model: cosim's NCCL model with 10 *global* parameters (base latency per
  protocol LL/LL128/Simple, NVLS latency, p2p latency, all 2-40 us; efficiency
  per protocol and NVLS efficiency, 0.3-1; a factor 0.5-3 on NCCL's per-step
  hardware latencies); protocol caps and p2p LL threshold are fixed; the tuner picks with
  NCCL's own constants (``defaults``), as the library does;
* fit: least squares on log(time) with a soft-L1 loss over all points of the
  fitted configurations (outliers excluded); residuals where the model is below
  the measurement weigh UNDER_WEIGHT (peer waits only add time);
* split: leave-one-configuration-out. For each target configuration, the
  parameters are fitted on the *other* target configurations and that
  configuration is simulated with them: its errors are held-out errors.
  The shipped parameters are fitted on all target configurations;
* noise filter: a point whose measured median differs by more than 25% from
  the rolling median of its 21 size-neighbours is an outlier (bimodal
  host-side jitter at small sizes); outliers are left out of fitting, and
  errors are reported with and without them;
* evaluation: every size is simulated by the engine (``Simulator.collective``),
  the tuner choosing algorithm and protocol; error = sim/measured - 1.

Targets: per GPU count, over held-out non-outlier points of target cases:
median |error| <= 10%, max |error| <= 25%.
"""

from __future__ import annotations

import argparse
import csv
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
STAT = "min"
"""Measured statistic per row. Each row holds 3 runs, each the median of 11 back-to-back
eager (non-graph) launches timed as rank 0's NCCL kernel duration (vidur collectives_wrapper.py);
a kernel also lasts while it waits for late peers, so host launch skew inflates runs
(DGX 2-GPU all-reduce < 8 MiB: runs of 6-10 us and of ~42 us at the same size). The
fastest run is the least peer-wait-contaminated estimate of the collective's own time."""
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
    outlier: np.ndarray
    """Excluded from fitting and from the filtered errors (noise rule or GPU-count consistency rule)."""
    inconsistent: np.ndarray = None  # type: ignore[assignment]
    """Flagged by the GPU-count consistency rule (:func:`load_all`)."""

    def __post_init__(self) -> None:
        if self.inconsistent is None:
            self.inconsistent = np.zeros(len(self.size), dtype=bool)


def load_points(case: Case, root: Path, stat: str = STAT) -> Points:
    """Measured times (s) of a case (statistic ``stat`` of each row's 3 runs), with outlier flags."""
    col = f"time_stats.{case.file.split('/')[-1].split('.')[0]}.{stat}"
    by_size: dict[int, list[float]] = defaultdict(list)
    with open(root / case.file, newline="") as fh:
        for row in csv.DictReader(fh):
            if int(row["num_workers"]) == case.workers and int(row["devices_per_node"]) == case.devices_per_node:
                by_size[int(row["size"])].append(float(row[col]) * 1e-3)
    sizes = np.array(sorted(by_size), dtype=float)
    times = np.array([float(np.median(by_size[int(s)])) for s in sizes])
    pad = OUTLIER_WINDOW // 2
    tp = np.pad(times, pad, mode="edge")
    roll = np.median(np.lib.stride_tricks.sliding_window_view(tp, OUTLIER_WINDOW), axis=1)
    outlier = np.abs(times / roll - 1) > OUTLIER_TOL
    return Points(sizes, times, outlier)


def load_all(root: Path, stat: str = STAT) -> dict[str, Points]:
    """Points of every case, with the GPU-count consistency rule added to the outlier flags.

    On one node, an all-reduce on fewer GPUs of the same machine does no more
    work per GPU and has fewer steps (NCCL's ring 2(n-1), NVLS one), so it can
    not be slower: a point more than OUTLIER_TOL above the same machine's
    all-reduce on more GPUs (same size, single node) is flagged. Its time is
    set by something the NCCL model does not describe (rank 0 waiting for
    peers launched later by the host: DGX 4 GPUs take ~38 us from 2 KiB to
    1 MiB where 8 GPUs take 15-20 us).
    """
    pts = {c.name: load_points(c, root, stat) for c in CASES}
    for c in CASES:
        if c.op != "all_reduce" or c.devices_per_node != c.workers:
            continue
        bigger = [o for o in CASES if o.file == c.file and o.op == c.op and o.workers > c.workers
                  and o.devices_per_node == o.workers]
        p = pts[c.name]
        for o in bigger:
            q = pts[o.name]
            t = dict(zip(q.size.tolist(), q.time.tolist()))
            other = np.array([t.get(float(s), np.inf) for s in p.size])
            p.inconsistent |= p.time > (1 + OUTLIER_TOL) * other
        p.outlier |= p.inconsistent
    return pts


# ---------------------------------------------------------------- fitting
X0 = [20e-6, 25e-6, 30e-6, 30e-6, 8e-6, 0.6, 0.9, 0.9, 0.6, 1.0]
LO = [2e-6, 2e-6, 2e-6, 2e-6, 2e-6, 0.3, 0.3, 0.3, 0.3, 0.5]
HI = [40e-6, 40e-6, 40e-6, 40e-6, 40e-6, 1.0, 1.0, 1.0, 1.0, 3.0]
"""Physical bounds: launch/base latencies 2-40 us (NCCL's own baseLat + hwLat are
4-25 us; kernel launch alone ~2 us), efficiencies 0.3-1 of link capacity, factor on
NCCL's per-step hwLat 0.5-3 (0.3-1.8 us per NVLink LL step)."""
PRIOR = np.array([6.6e-6, 14e-6, 8.4e-6, 25e-6, 6e-6, 0.5, 0.92, 1.0, 0.85, 1.0])
"""NCCL's own values (tuning.cc: ring baseLat LL/LL128/Simple, NVLS baseLat + hwLat, p2p
baseLat; payload fractions LL 8/16, LL128 120/128, Simple 1; Hopper nvlsEfficiency):
one weak residual log(x / prior) each, so parameters the data do not determine (e.g.
LL128's efficiency where the tuner never picks LL128) stay at NCCL's value."""
PRIOR_WEIGHT = 1.0
UNDER_WEIGHT = 0.5
"""Weight of residuals where the model is below the measured time (peer wait only adds time)."""
SCALE = np.array([1e-6] * 5 + [1.0] * 5)
"""Optimizer units: latencies in us."""


def _sim(topo: Any, params: Any = None, use_calibration: bool = True) -> Any:
    from cosim.engine import NcclConfig, SimConfig, Simulator

    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=use_calibration), record_trace=False))
    if params is not None:
        sim.nccl_params = params
        sim.collectives.params = params
    return sim


@dataclass
class Table:
    """What the closed-form fit needs about a case: per candidate (algo, proto), the
    latency's fixed part and the engine's seconds per byte at efficiency 1."""

    case: Case
    pts: Points
    cands: list[tuple[str, str]]
    steps_lat: np.ndarray
    """NCCL per-step latency sum per candidate (s); the fitted base is added."""
    unit: np.ndarray
    """Engine seconds per byte of size at efficiency 1, no cap, per candidate."""
    fmax: np.ndarray
    """Largest bytes per byte of size on one flow (rate caps), per candidate."""
    cap: np.ndarray
    p2p: bool
    choice: np.ndarray | None = None
    """Per size, the candidate index NCCL's tuner (defaults) picks; None: min over fitted estimates."""


def table(case: Case, pts: Points) -> Table:
    from cosim.engine.nccl import Fitted

    topo = topology_for(case)
    sim = _sim(topo)
    zero = Fitted.from_vector([0.0] * 5 + [1.0] * 5)
    params = sim.nccl_params.with_fitted(zero)
    col = sim.collectives
    shape = col.shape(case.op, case.ranks)
    cands = col.candidates(case.op, case.ranks)
    steps, unit, fmax, caps = [], [], [], []
    for a, p in cands:
        lat, _, cap = params.cost(shape, a, p)
        steps.append(lat)
        unit.append(col.unit_time(case.op, tuple(case.ranks), a, 1.0, math.inf))
        fmax.append(col._plan(case.op, case.ranks, a).max_factor())
        caps.append(cap)
    tb = Table(case, pts, cands, np.array(steps), np.array(unit), np.array(fmax), np.array(caps),
               case.op in ("send_recv", "all_to_all"))
    if params.tuner == "nccl" and not tb.p2p:
        est = []
        for a, p in cands:
            lat, eff, cap = params.cost(shape, a, p, use_fit=False)
            u = col.unit_time(case.op, tuple(case.ranks), a, eff, cap)
            est.append(lat + pts.size * u)
        tb.choice = np.argmin(np.array(est), axis=0)
    return tb


def predict(tb: Table, x: np.ndarray, sizes: np.ndarray | None = None) -> np.ndarray:
    """Closed-form time per size: the tuner's min over candidates (p2p: NCCL's LL threshold)."""
    s = tb.pts.size if sizes is None else sizes
    b_ll, b_128, b_s, l_nvls, l_p2p, e_ll, e_128, e_s, e_nvls, hw_k = x
    base = {"ll": b_ll, "ll128": b_128, "simple": b_s}
    eff = {"ll": e_ll, "ll128": e_128, "simple": e_s}
    out = np.full(len(s), np.inf)
    for k, (a, p) in enumerate(tb.cands):
        if a == "p2p":
            lat = l_p2p + hw_k * tb.steps_lat[k]
        elif a == "nvls":
            lat = l_nvls
        else:
            lat = base[p] + hw_k * tb.steps_lat[k]
        e = min(eff[p] * (e_nvls if a == "nvls" else 1.0), 1.0)
        u = max(tb.unit[k] / e, tb.fmax[k] / tb.cap[k])
        t = lat + s * u
        if tb.p2p:
            ll = s <= 16384
            t = np.where(ll == (p == "ll"), t, np.inf)
        if tb.choice is not None and sizes is None:
            out = np.where(tb.choice == k, t, out)
        else:
            out = np.minimum(out, t)
    return out


def fit(tables: list[Table]) -> np.ndarray:
    """Global parameters minimizing a soft-L1 loss of log(sim/measured) over the tables' non-outliers."""
    from scipy.optimize import least_squares

    def resid(z: np.ndarray) -> np.ndarray:
        x = z * SCALE
        r = np.concatenate([np.log(predict(tb, x)[~tb.pts.outlier] / tb.pts.time[~tb.pts.outlier])
                            for tb in tables])
        # a rank's kernel time is the collective's own time plus any wait for late peers:
        # measured >= model, so the model running below a point is penalized less
        prior = PRIOR_WEIGHT * np.log(x / PRIOR)
        return np.concatenate([np.where(r < 0, UNDER_WEIGHT * r, r), prior])

    best = None
    for start in (X0, [8e-6, 15e-6, 12e-6, 20e-6, 5e-6, 0.4, 0.7, 0.8, 0.5, 1.5]):
        r = least_squares(resid, np.array(start) / SCALE, bounds=(np.array(LO) / SCALE, np.array(HI) / SCALE),
                          loss="soft_l1", f_scale=0.1, x_scale="jac")
        if best is None or r.cost < best.cost:
            best = r
    assert best is not None
    return best.x * SCALE


def refit(root: Path, params_path: Path | None = None, verbose: bool = True) -> dict[str, Any]:
    """Fit the global parameters on all target cases, record the leave-one-out folds, rewrite the params file."""
    import datetime

    from cosim.engine import nccl
    from cosim.engine.nccl import Fitted

    path = params_path or nccl.DEFAULT_PARAMS
    allp = load_all(root)
    tables = {c.name: table(c, allp[c.name]) for c in CASES}
    target = [c for c in CASES if c.targets and c.fitted]
    x = fit([tables[c.name] for c in target])
    folds = {}
    for c in target:
        xf = fit([tables[o.name] for o in target if o is not c])
        folds[c.name] = [float(v) for v in xf]
        if verbose:
            print(f"fold without {c.name}: " + ", ".join(f"{n}={v:.4g}" for n, v in zip(Fitted.NAMES, xf)))
    fitted = Fitted.from_vector(x, {
        "data": "all fitted target cases of validation/collectives/cases.py",
        "source": SOURCE,
        "method": f"least squares on log(time), soft-L1 loss (f_scale 0.1), outliers excluded, measured "
                  f"statistic time_stats.{STAT}, residuals below measured weighted {UNDER_WEIGHT}, bounds "
                  "latencies 2-40 us, efficiencies 0.3-1, hwLat factor 0.5-3; weak prior toward NCCL's values; "
                  "tuner: NCCL defaults",
        "split": "leave-one-configuration-out: each target configuration is evaluated with the parameters "
                 "fitted on the others (folds below); these parameters are fitted on all target configurations",
        "date": datetime.date.today().isoformat(),
        "folds": {k: {n: round(v, 9) for n, v in zip(Fitted.NAMES, xf)} for k, xf in folds.items()},
    })
    doc = yaml.safe_load(path.read_text())
    doc["fitted"] = fitted.to_yaml()
    header = "".join(line + "\n" for line in path.read_text().splitlines() if line.startswith("#"))
    from cosim.fileio import write_text

    write_text(path, header + yaml.safe_dump(doc, sort_keys=False, width=120))
    nccl.clear_cache()
    if verbose:
        print("fitted (all): " + ", ".join(f"{n}={v:.4g}" for n, v in zip(Fitted.NAMES, x)))
    return folds


# ---------------------------------------------------------------- evaluate
@dataclass
class CaseResult:
    case: Case
    pts: Points
    sim: np.ndarray
    """Engine times with the shipped parameters (fitted on all target cases, this one included)."""
    held: np.ndarray
    """Engine times with the parameters fitted without this case (its leave-one-out fold)."""
    picks: list[str]
    alt: Points | None = None
    """The same sizes measured by the median of the 3 runs (the previous protocol), for comparison."""

    def err(self, held: bool = True, alt: bool = False) -> np.ndarray:
        pts = self.alt if alt and self.alt is not None else self.pts
        return (self.held if held else self.sim) / pts.time - 1

    def stats(self, held: bool, filtered: bool = True) -> tuple[int, float, float]:
        m = ~self.pts.outlier if filtered else np.ones(len(self.pts.size), dtype=bool)
        e = np.abs(self.err(held)[m])
        return int(m.sum()), float(np.median(e)) if e.size else math.nan, float(e.max()) if e.size else math.nan


def simulate(case: Case, topo: Any, sizes: np.ndarray, params: Any = None) -> tuple[np.ndarray, list[str]]:
    """Engine times (s) and chosen algo/proto per size."""
    sim = _sim(topo, params)
    times, picks = [], []
    for s in sizes:
        ev = sim.collective(case.op, case.ranks, float(s))
        sim.run()
        r = ev.value
        times.append(r.time)
        picks.append(f"{r.algo}/{r.proto}")
    return np.array(times), picks


def evaluate(root: Path) -> list[CaseResult]:
    from cosim.engine import load_params
    from cosim.engine.nccl import Fitted

    params = load_params()
    folds = (params.fitted.fit.get("folds") or {}) if params.fitted else {}
    allp, alts = load_all(root), load_all(root, "median")
    out = []
    for case in CASES:
        topo = topology_for(case)
        pts = allp[case.name]
        sim, picks = simulate(case, topo, pts.size)
        held = sim
        if case.name in folds:
            fp = params.with_fitted(Fitted.from_vector([folds[case.name][n] for n in Fitted.NAMES]))
            held, _ = simulate(case, topo, pts.size, fp)
        alt = alts[case.name]
        out.append(CaseResult(case, pts, sim, held, picks, alt if np.array_equal(alt.size, pts.size) else None))
    return out


def per_gpu_count(results: list[CaseResult], held: bool = True, filtered: bool = True,
                  alt: bool = False) -> dict[int, dict[str, Any]]:
    """Errors of target cases pooled per GPU count (held-out: leave-one-configuration-out);
    ``alt``: against the median-of-runs statistic (its own outlier flags)."""
    pool: dict[int, list[np.ndarray]] = defaultdict(list)
    for r in results:
        if not r.case.targets:
            continue
        pts = r.alt if alt and r.alt is not None else r.pts
        m = ~pts.outlier if filtered else np.ones(len(pts.size), dtype=bool)
        pool[r.case.workers].append(np.abs(r.err(held, alt)[m]))
    out = {}
    for n, es in sorted(pool.items()):
        e = np.concatenate(es)
        out[n] = {"points": int(e.size), "median": float(np.median(e)), "max": float(e.max()),
                  "p95": float(np.percentile(e, 95)), "over_25pct": int((e > TARGET_MAX).sum())}
    return out


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def render(results: list[CaseResult]) -> str:
    from cosim.engine import load_params
    from cosim.engine.nccl import Fitted

    params = load_params()
    f = params.fitted
    lines = [
        "# Collective validation: simulated vs measured (H100)",
        "",
        f"Measured data: {SOURCE}: `time_stats.<op>.{STAT}` per size (ms), rank 0 (each row: 3 runs, each the "
        "median of 11 eager back-to-back launches' NCCL kernel durations; `min` = the run least inflated by "
        "waiting for late peers; the `median` statistic is compared below).",
        "Generated by `python -m validation.collectives` (refit: `--refit`); parameters in "
        "`cosim/engine/data/nccl_h100.yaml` (`fitted:`).",
        "",
        "Model: NCCL's cost structure with 10 global parameters (no per-configuration calibration): base latency per "
        "protocol, NVLS latency, p2p latency (all bounded to 2-40 us), efficiency per protocol (0.3-1 of the "
        "fabric's link capacity), NVLS efficiency (0.3-1). NCCL's per-step hardware latencies (hwLat "
        "NVLink/PCI/net), LL/LL128 caps, the p2p LL threshold (16 KiB) are fixed; the tuner picks the "
        "algorithm/protocol as NCCL does, by NCCL's own constants (`defaults`, bandwidth from the fabric), and "
        "the fitted parameters then give the time. Fit: least squares on log(time), soft-L1 loss; residuals "
        f"where the model is below a measured point weigh {UNDER_WEIGHT} (a kernel's time is the collective's "
        "plus any wait for late peers, so measured >= model).",
        "",
        "Split: leave-one-configuration-out. Each target configuration is simulated with parameters fitted on the "
        "other target configurations (its fold): those are the **held-out** errors. The shipped parameters are "
        "fitted on all target configurations (**fit** columns). "
        f"Outlier rule: a point whose measured time differs by more than {OUTLIER_TOL:.0%} from the rolling median "
        f"of its {OUTLIER_WINDOW} size-neighbours (bimodal host jitter), or, for a single-node all-reduce, more than "
        f"{OUTLIER_TOL:.0%} above the same machine's all-reduce on more GPUs at the same size (GPU-count consistency: "
        "fewer GPUs can not be slower; such points are set by host launch skew); excluded from fitting; errors shown "
        "with and without. Error = |simulated / measured - 1|.",
        "",
        "## Per GPU count (held-out, target cases)",
        "",
        "| GPUs | points | median | p95 | max | points > 25% | max incl. outliers | median incl. outliers | "
        "target (median <= 10%, max <= 25%) |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    allp = per_gpu_count(results, filtered=False)
    for n, st in per_gpu_count(results).items():
        ok = st["median"] <= TARGET_MEDIAN and st["max"] <= TARGET_MAX
        verdict = "met" if ok else ("median met, max MISSED" if st["median"] <= TARGET_MEDIAN else "MISSED")
        lines.append(f"| {n} | {st['points']} | {_pct(st['median'])} | {_pct(st['p95'])} | {_pct(st['max'])} | "
                     f"{st['over_25pct']} | {_pct(allp[n]['max'])} | {_pct(allp[n]['median'])} | {verdict} |")
    lines += ["", "Same held-out simulations against the `median` statistic (median of the 3 runs, its own outlier "
              "flags): ", "", "| GPUs | points | median | p95 | max | points > 25% | max incl. outliers | "
              "median incl. outliers |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    alla = per_gpu_count(results, filtered=False, alt=True)
    for n, st in per_gpu_count(results, alt=True).items():
        lines.append(f"| {n} | {st['points']} | {_pct(st['median'])} | {_pct(st['p95'])} | {_pct(st['max'])} | "
                     f"{st['over_25pct']} | {_pct(alla[n]['max'])} | {_pct(alla[n]['median'])} |")
    lines += [
        "",
        "## Per case",
        "",
        "| case | points | outliers (of which GPU-count rule) | fit median | fit max | held-out median | held-out max | "
        "held-out median incl. outliers | held-out max incl. outliers | in targets |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        n, mf, xf = r.stats(False)
        _, mh, xh = r.stats(True)
        _, ma, xa = r.stats(True, filtered=False)
        lines.append(f"| {r.case.name} | {n} | {int(r.pts.outlier.sum())} ({int(r.pts.inconsistent.sum())}) | {_pct(mf)} | {_pct(xf)} | {_pct(mh)} | "
                     f"{_pct(xh)} | {_pct(ma)} | {_pct(xa)} | {'yes' if r.case.targets else 'no (not fitted)'} |")
    if f is not None:
        from cosim import units

        lines += ["", "## Fitted parameters (all target configurations)", "", "| parameter | value |", "|---|---:|"]
        for name, v in zip(Fitted.NAMES, f.vector()):
            lines.append(f"| {name} | {units.fmt_time(v) if name.startswith(('base', 'nvls_lat', 'p2p')) else f'{v:.3f}'} |")
        lines += ["", f"Fit: {f.fit.get('method', '')}; date {f.fit.get('date', '')}."]
    lines += ["", "## Where the model misses", ""]
    for r in results:
        if not r.case.targets:
            continue
        e = r.err(True)
        bad = (np.abs(e) > TARGET_MAX) & ~r.pts.outlier
        if bad.any():
            from cosim import units

            sz = r.pts.size[bad]
            lines.append(f"* {r.case.name}: {int(bad.sum())} held-out points over 25% "
                         f"({units.fmt_size(sz.min())} - {units.fmt_size(sz.max())}; "
                         f"sim {'above' if np.median(e[bad]) > 0 else 'below'} measured)")
    lines += [
        "",
        "Why (read from the points, `python -m validation.collectives --points`):",
        "",
        "* Small sizes, all-reduce: rank 0's kernel time includes waiting for peers the host launched later "
        "(eager mode, 11 back-to-back launches). Runs of one size differ 5x (DGX 2 GPUs: 6-10 us vs ~42 us); where "
        "even the fastest run sits at the ~40 us host floor while the model says 10-25 us, the model is below "
        "(DGX 2/4 GPUs up to ~4 MiB). The GPU-count rule removes the points slower than the same machine on more "
        "GPUs, not the rest of that regime.",
        "* Protocol switch region (DGX 8 GPUs 0.4-1.6 MiB, 31 us measured vs 22-25 us): NCCL's own constants keep "
        "ring/LL there, the measurement looks like NVLS's ~25-31 us latency already; the NCCL version of the "
        "measurement is not recorded, so its tuner tables are not known.",
        "* Pairwise-NVLink all-reduce below ~1 MiB: 2 GPUs take 7-11 us (model 9-13 us), 4 GPUs over PCIe "
        "29-44 us at 250-600 KiB (model above): one LL latency/efficiency for NVSwitch, bridge and PCIe rings is "
        "too coarse there.",
        "* Pairwise-NVLink send/recv (same node): from 8 MiB the sender's kernel time implies 310-340 GB/s, above "
        "the bridge's documented 300 GB/s per direction, while the same pair's all-reduce reaches ~205 GB/s per "
        "direction; no link capacity reproduces both, so the case is a target but no fit uses it (47% median). "
        "A likely cause is that rank 0 is the sender and its kernel can end before the receiver has drained "
        "NCCL's buffers; not verified.",
        "* DGX send/recv across nodes 0.4-0.6 MiB: model 25-38% above (the measured curve has a knee there that "
        "one p2p latency + NIC bandwidth does not follow).",
    ]
    notes = [r for r in results if r.case.note]
    if notes:
        lines += ["", "## Notes", ""] + [f"* {r.case.name}: {r.case.note}" for r in notes]
    lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m validation.collectives", description=__doc__.split("\n")[0])
    ap.add_argument("--refit", action="store_true", help="refit the global parameters and rewrite the params file")
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
        n, mf, xf = r.stats(False)
        _, mh, xh = r.stats(True)
        print(f"{r.case.name:52s} {n:4d} pts | fit median {_pct(mf):>6} max {_pct(xf):>6} | held-out median "
              f"{_pct(mh):>6} max {_pct(xh):>6} | outliers {int(r.pts.outlier.sum())}"
              + ("" if r.case.targets else "  (not in targets)"))
        if args.points:
            for i in range(len(r.pts.size)):
                print(f"    {units.fmt_size(r.pts.size[i]):>10} measured {units.fmt_time(r.pts.time[i]):>10} "
                      f"sim {units.fmt_time(r.sim[i]):>10} held {units.fmt_time(r.held[i]):>10} "
                      f"err {100 * r.err(True)[i]:+7.1f}% {r.picks[i]:12s}{' outlier' if r.pts.outlier[i] else ''}")
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
