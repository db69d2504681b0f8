"""Fuzz campaign (not a test): the fuzz suite of tests/test_fuzz.py with a larger, random budget.

CI runs every fuzz target with 25 derandomized examples; this runs ``--fuzz-budget`` random
examples per target (hypothesis draws new cases on every run) and reports, per target, the
wall time and whether any input gave an exception other than ``CosimInputError`` (the
failing example and its traceback are in pytest's output).

    python benchmarks/bench_fuzz.py [--fuzz-budget 1000] [-k kineto] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def targets() -> list[str]:
    """Test ids of the fuzz targets (pytest collection)."""
    p = subprocess.run([sys.executable, "-m", "pytest", "tests/test_fuzz.py", "--collect-only", "-q",
                        "-p", "no:cacheprovider"], cwd=ROOT, capture_output=True, text=True, check=False)
    return [ln for ln in p.stdout.splitlines() if ln.startswith("tests/test_fuzz.py::test_fuzz_")]


def run_target(test_id: str, budget: int) -> dict[str, object]:
    env = {**os.environ, "COSIM_FUZZ_EXAMPLES": str(budget), "COSIM_FUZZ_RANDOM": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "pytest", test_id, "-q", "-p", "no:cacheprovider", "--tb=short"],
                       cwd=ROOT, capture_output=True, text=True, env=env, check=False)
    wall = time.perf_counter() - t0
    errors = sorted(set(re.findall(r"^E\s+(\w+(?:Error|Exception)): ", p.stdout, re.M)))
    return {"target": test_id.split("::", 1)[1], "examples": budget, "wall_s": round(wall, 1),
            "ok": p.returncode == 0, "skipped": " skipped" in p.stdout and " passed" not in p.stdout,
            "errors": errors, "output_tail": "" if p.returncode == 0 else p.stdout[-4000:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fuzz-budget", type=int, default=1000, help="random examples per fuzz target")
    ap.add_argument("-k", dest="select", default="", help="only targets whose id contains this text")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args(argv)
    rows = [run_target(t, args.fuzz_budget) for t in targets() if args.select in t]
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        print(f"{'target':58s} {'examples':>8} {'wall':>8}  result")
        for r in rows:
            res = "skipped" if r["skipped"] else "ok" if r["ok"] else "FAILED " + ", ".join(r["errors"])
            print(f"{r['target']:58s} {r['examples']:>8} {r['wall_s']:>7.1f}s  {res}")
        for r in rows:
            if not r["ok"]:
                print(f"\n--- {r['target']} ---\n{r['output_tail']}")
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
