"""``cosim sensitivity``: rank hardware parameters by their effect on the step time."""

from __future__ import annotations

import argparse
from pathlib import Path

from cosim.cli import add_json_flag

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("sensitivity", help="tornado chart: which hardware parameter moves the step time most",
                       description="Move each hardware parameter of the scenario (link bandwidths and latencies, "
                                   "HBM bandwidth, peak FLOP/s, launch overhead and latency, NIC bandwidth, host "
                                   "speed, ...) up and down by --delta, replay, and rank them by the step-time "
                                   "change. Writes OUT/sensitivity.json, OUT/tornado.html, OUT/results.csv.")
    p.add_argument("scenario", nargs="?", help="bundled scenario name or scenario YAML (default qwen3-30b-ep8-dgx-h100)")
    p.add_argument("--params", nargs="+", metavar="P",
                   help="parameters to perturb: keys or substrings (links.nvlink4.bandwidth, host.speed, nvlink4)")
    p.add_argument("--delta", default="20%", help="relative perturbation, e.g. 20%% or 0.1 (default 20%%)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every run, as with cosim run (repeatable)")
    p.add_argument("--out", type=Path, help="output folder (default cosim-out/sensitivity-<scenario>)")
    p.add_argument("--executor", choices=("local", "dask"), default="local")
    p.add_argument("--scheduler", metavar="ADDRESS", help="Dask scheduler address")
    p.add_argument("--workers", type=int, default=1,
                   help="parallel runs (default 1: in this process, which reuses the loaded trace)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cosim.cli import emit_json
    from cosim.replay import parse_sets
    from cosim.report.html import fmt_time
    from cosim.scenario import load_scenario
    from cosim.sensitivity import parse_delta, run_sensitivity
    from cosim.sweep import make_executor

    delta = parse_delta(args.delta)
    scn = load_scenario(args.scenario)
    sets = parse_sets(args.sets)
    out = args.out or Path("cosim-out") / f"sensitivity-{scn.name}"
    with make_executor(args.executor, args.workers, args.scheduler) as ex:
        data = run_sensitivity(scn.source_file or args.scenario, out, params=args.params, delta=delta,
                               sets=sets, executor=ex, progress=not args.no_progress)
    if args.json:
        emit_json(data)
        return 0
    from cosim.replay.summary import bound_label
    from cosim.report.sweep_report import tornado_headline

    print(f"{data['scenario']}: baseline step {fmt_time(data['baseline_step_time_s'])} "
          f"({bound_label(data['baseline_bound'])}), each parameter +/-{delta * 100:g}%")
    print(tornado_headline(data))
    print(f"{'rank':>4}  {'parameter':48s} {'better':>10} {'worse':>10}")
    for i, e in enumerate(data["parameters"], 1):
        if e["status"] != "ok":
            print(f"{i:>4}  {e['key']:48s} failed: {e['error']}")
        elif e.get("no_effect"):
            print(f"{'-':>4}  {e['key']:48s} {'no effect':>10} {'no effect':>10}")
        else:
            print(f"{i:>4}  {e['key']:48s} {e['better_pct']:+9.2f}% {e['worse_pct']:+9.2f}%")
    print("wrote " + ", ".join(data["files"].values()))
    return 0
