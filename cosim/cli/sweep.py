"""``cosim sweep``: run a sweep spec (grid / zip / random) on a local pool or Dask."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosim.cli import add_json_flag

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sweep", help="run a parameter sweep over a scenario (local pool or Dask)",
                       description="Run every point of SWEEP.yaml (base: scenario, parameters: dotted --set keys; "
                                   "combine: grid|zip|random). Each point gets its own folder under OUT/points, "
                                   "keyed by a content hash, so a rerun skips finished points. Writes "
                                   "OUT/results.csv (+ .parquet with pyarrow) and OUT/report.html. Ctrl-C "
                                   "stops it at once (exit 130): finished points are kept, running ones "
                                   "cancelled; rerun to compute the rest.")
    p.add_argument("spec", type=Path, metavar="SWEEP.yaml", help="sweep specification")
    p.add_argument("--out", type=Path, help="output folder (default cosim-out/sweep-<name>)")
    p.add_argument("--executor", choices=("local", "dask"), default="local",
                   help="local process pool (default), or Dask distributed")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="Dask scheduler address (tcp://host:8786); default: an in-process LocalCluster")
    p.add_argument("--workers", type=int, help="local processes / Dask threads (default: CPUs available; "
                                              "1 runs in this process)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cosim.cli import emit_json
    from cosim.sweep import SweepInterrupted, load_sweep, make_executor, run_sweep
    from cosim.sweep.executors import default_workers

    spec = load_sweep(args.spec)
    out = args.out or Path("cosim-out") / f"sweep-{spec.name}"
    n = len(spec.points())
    workers = args.workers or (min(n, default_workers()) if args.executor == "local" else None)
    try:
        with make_executor(args.executor, workers, args.scheduler) as ex:
            res = run_sweep(spec, out, ex, progress=not args.no_progress)
    except SweepInterrupted as exc:  # Ctrl-C: running points cancelled, finished ones kept
        sys.stderr.write(f"cosim: {exc}\n")
        return 130
    if args.json:
        emit_json(res.to_dict())
    else:
        ok = [r for r in res.rows if r.get("status") == "ok"]
        best = min(ok, key=lambda r: r["step_time_s"]) if ok else None
        print(f"{len(res.rows)} points: {res.computed} computed, {res.skipped} already done, {res.failed} failed")
        if best:
            print(f"best step {best['step_time_s'] * 1e3:.4g} ms at "
                  + ", ".join(f"{k}={best.get(k)}" for k in res.parameters))
        for r in res.rows:
            if r.get("status") != "ok":
                print(f"failed {r['key']}: {r.get('error')}")
        print("wrote " + ", ".join(str(p) for p in res.files.values()))
    return 1 if res.failed and res.failed == len(res.rows) else 0
