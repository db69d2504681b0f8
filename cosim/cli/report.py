"""``cosim report``: compare a baseline run with proposal runs (HTML, or JSON)."""

from __future__ import annotations

import argparse
from pathlib import Path

from cosim.cli import add_json_flag

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("report", help="proposal report: baseline run vs proposal runs, side by side",
                       description="Compare folders written by `cosim run` (summary.json + scenario.yaml): step "
                                   "time and speedup, breakdown shift and where the bottleneck moved, hardware "
                                   "diff, performance per watt and per dollar. Writes an offline HTML page.")
    p.add_argument("baseline", type=Path, metavar="BASELINE_DIR")
    p.add_argument("proposals", type=Path, nargs="+", metavar="PROPOSAL_DIR")
    p.add_argument("--out", type=Path, default=Path("cosim-out/proposal-report.html"),
                   help="HTML file to write (default cosim-out/proposal-report.html)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cosim.cli import emit_json
    from cosim.report import proposal_report, write_proposal_report
    from cosim.report.html import fmt_time
    from cosim.report.proposal import bound_words
    from cosim.scenario import run_folder

    # cosim-out/<scenario> stands for its latest run (cosim-out/<scenario>/latest)
    data = proposal_report(run_folder(args.baseline), [run_folder(p) for p in args.proposals])
    write_proposal_report(args.out, data)
    if args.json:
        emit_json({k: v for k, v in data.items()} | {"html": str(args.out)})
        return 0
    b = data["baseline"]
    print(f"baseline {b['label']}: step {fmt_time(b['step_time_s'])}, {bound_words(b['bottleneck'], short=True)}")
    for p in data["proposals"]:
        print(f"{p['label']}: step {fmt_time(p['step_time_s'])}, speedup {p['speedup_text']}; "
              f"{p['vs_baseline']['text']}; {len(p['hardware_diff'])} hardware change(s)")
    print(f"wrote {args.out}")
    return 0
