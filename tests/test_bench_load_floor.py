"""benchmarks/bench_load_floor.py --json on a small shared trace: the counts and the budget arithmetic it reports
are those of the trace (its timings are figures, never asserted), and a trace that is not Kineto is skipped with a
line naming it."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import pytest

from cosim.resources import shared_dir
from tests._scripts import ROOT

SHARED = shared_dir()
pytestmark = pytest.mark.skipif(SHARED is None, reason="../shared (the real traces) is absent")


def test_bench_load_floor_json_on_a_small_trace() -> None:
    from cosim.workload import load_trace

    assert SHARED is not None
    kineto, et = "hta/simple-add.json.gz", "hta/simple-add-et.json.gz"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_load_floor.py"), "--traces", kineto, et,
                           "--repeat", "1", "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert f"{et}: skipped, not a Kineto trace: simple-add-et.json.gz" in proc.stderr
    (row,) = json.loads(proc.stdout)
    path = SHARED / "traces" / kineto
    g = load_trace(path, cache=False)
    with gzip.open(path) as fh:
        events = len(json.load(fh)["traceEvents"])
    assert row["trace"] == kineto and row["files"] == 1 and row["events"] == events
    assert row["ops"] == sum(len(r.host_ops) + len(r.gpu_ops) for r in g.ranks)
    assert row["budget_s"] == row["ops"] / 0.5e6
    assert row["load_budget_s"] == row["budget_s"] - row["replay_s"]
    f = row["floors"]
    assert f["floor_s"] == f["read_s"] + f["inflate_zlib_ng_s"] + f["decode5_s"]
    assert f["floor_records_s"] == f["read_s"] + f["inflate_zlib_ng_s"] + f["decode_records_s"]
    stages = ("format", "inflate", "raw split", "typed decode", "per-event loop", "checks", "tables", "flows",
              "warnings", "graph")
    assert tuple(k for k in row["stages"] if k != "total") == stages
    assert all(v >= 0 for v in row["stages"].values())
