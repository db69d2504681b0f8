"""The run's outputs after the replay: CPU seconds of ``summary()`` and of ``write_run_report`` (report.html and
report.json), their sizes, and how many critical-path walks the summary made (not a test).

    python benchmarks/bench_report.py [SCENARIO] [--out DIR] [--tree TREE]

Replays SCENARIO (default: the default scenario) once in this process with this tree's cosim, or ``--tree``'s
(put first on ``sys.path``), then times the summary (from scratch) and the report. Run it alternately for two
trees (``git archive`` of the base into /tmp) for a before/after; ``--out`` keeps summary.json (wall-clock
fields removed) and the report for comparing the trees' outputs. Figures: benchmarks/README.md, "Round 12:
s12-out".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scenario", nargs="?", default=None)
    ap.add_argument("--out", default=None, help="folder for summary.json, report.html, report.json")
    ap.add_argument("--tree", default=None, help="a cosim checkout to import instead of this one")
    args = ap.parse_args()
    sys.path.insert(0, str(Path(args.tree or Path(__file__).resolve().parents[1]).resolve()))
    import cosim.replay.summary as sm
    from cosim.report.run import write_run_report
    from cosim.scenario import load_scenario, run_scenario

    t = time.process_time()
    _, res = run_scenario(load_scenario(args.scenario))
    replay_s = time.process_time() - t
    count = {"critical_path": 0, "walks": 0}

    def counted(name: str, key: str) -> None:
        real = getattr(sm, name, None)
        if real is None:
            return

        def f(*a: Any, **k: Any) -> Any:
            count[key] += 1
            return real(*a, **k)

        setattr(sm, name, f)

    counted("critical_path", "critical_path")
    counted("_walk", "walks")  # this tree's walker (absent before round 12)
    res._summary = None
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_report."))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.process_time()
    s = res.summary()
    t1 = time.process_time()
    write_run_report(res, out / "report.html")
    t2 = time.process_time()
    wall = {"sim_wall_s", "ops_per_wall_s"}
    (out / "summary.json").write_text(json.dumps({k: v for k, v in s.items() if k not in wall}, indent=1,
                                                 sort_keys=True, default=str))
    js = out / "report.json"
    print(json.dumps({"scenario": args.scenario or "default", "replay_cpu_s": round(replay_s, 2),
                      "summary_cpu_s": round(t1 - t0, 3), "report_cpu_s": round(t2 - t1, 3),
                      "report_html_bytes": (out / "report.html").stat().st_size,
                      "report_json_bytes": js.stat().st_size if js.exists() else 0,
                      "critical_path_calls": count["critical_path"], "walks": count["walks"],
                      "load": round(os.getloadavg()[0], 1)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
