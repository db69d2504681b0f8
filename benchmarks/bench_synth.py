"""Synthetic DeepSeek-V3 training-step benchmark (not a test): ``cosim run dsv3-1024`` scaled.

The issue-15 layout (tp 2, pp 8, vpp 4, FP8, full recomputation) on ``N/8`` DGX H100 nodes of a
rail-optimized non-blocking fabric, dp = N / 16, ep = min(64, dp x tp), global batch
``--global-batch`` (default 8192, the issue's; ``--mb-per-pipeline K`` uses K x dp instead, K
micro-batches per pipeline, for sizes the full batch cannot finish). Each size runs in its own
process with a wall-clock ``--timeout``; printed per size: wall time of the whole ``cosim run`` in that
process (start-up, synthesis, replay), CPU seconds, peak RSS, simpy events, fabric rate solves and
rows re-rated by those solves (``rows_solved``; per solve: the solver's work) and coalesced collectives summed over
the run's fabrics (scratch fabrics included), simulated step time;
and the growth exponent of wall time, RSS, events and solves between successive sizes
(log(ratio) / log(GPU ratio)).

    python benchmarks/bench_synth.py [--sizes 64,256,1024,4096,8192] [--global-batch 8192 | --mb-per-pipeline 16]
                                     [--timeout 600] [--plain] [--timeline] [--json]
    python benchmarks/bench_synth.py graph dump SCENARIO OUT.npz     # synthesized graph's arrays (the probe's)
    python benchmarks/bench_synth.py graph compare BEFORE.npz AFTER.npz   # exit 1 unless array-identical
    python benchmarks/bench_synth.py graph time SCENARIO [N]         # synthesis CPU s

``--plain`` disables coalescing of collectives (every collective solved on the fabric);
``--no-coalesce-steps`` simulates every micro-batch (no steady-state period, docs/SYNTHESIS.md);
``probe_mb`` is the micro-batches per pipeline actually simulated when the period was used. A tqdm bar on stderr counts
sizes done (off with ``--json``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_CHILD = r"""
import json, resource, sys, time, io, contextlib
sys.path.insert(0, {root!r})
from cosim.engine import flows as F
fabs = []
orig = F.Fabric.__init__
def init(self, *a, **k):
    orig(self, *a, **k)
    fabs.append(self)
F.Fabric.__init__ = init
if {plain!r}:
    F.Fabric.links_idle = lambda self, links: False
from cosim.cli import main
t0, c0 = time.perf_counter(), time.process_time()
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    rc = main({args!r})
out = json.loads(buf.getvalue() or "{{}}")
print(json.dumps(dict(rc=rc, wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
                      rss_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      events=out.get("events"), step_time_s=out.get("step_time_s"),
                      solves=sum(f.n_solves for f in fabs), rows_solved=sum(f.n_rows_solved for f in fabs),
                      coalesced=sum(getattr(f, "n_coalesced", 0) for f in fabs),
                      materialized=sum(getattr(f, "n_materialized", 0) for f in fabs),
                      rate_hits=sum(getattr(f, "n_rate_hits", 0) for f in fabs),
                      simulated_ranks=(out.get("synthetic") or {{}}).get("simulated_ranks"),
                      microbatches=(out.get("synthetic") or {{}}).get("microbatches"),
                      probe_mb=(out.get("coalesced") or {{}}).get("simulated_microbatches"),
                      tokens_per_s_per_gpu=out.get("tokens_per_s_per_gpu"), mfu=out.get("mfu"),
                      bubble=out.get("bubble_fraction"))))
"""


def layout(gpus: int, gbs: int | None, mb: int | None) -> dict[str, int]:
    """dp, ep and global batch of the benchmark's layout on ``gpus`` GPUs."""
    dp = gpus // 16
    ep = min(64, dp * 2)
    return {"gpus": gpus, "dp": dp, "ep": ep, "global_batch": mb * dp if mb else (gbs or 8192)}


def run_size(lay: dict[str, int], timeout: float, plain: bool, steps: bool = True, timeline: bool = False) -> dict[str, Any]:
    """One size in its own process (``--timeout`` seconds of wall time at most); ``timeline``: also write the
    timeline (``cosim run``'s default), into a temporary folder."""
    import tempfile

    extra = [] if steps else ["--set", "workload.synthetic.coalesce=false"]
    out = tempfile.mkdtemp(prefix="bench_synth_")
    extra += ["--out", out] + ([] if timeline else ["--no-timeline"])
    args = ["run", "dsv3-1024", "--set", f"nodes={lay['gpus'] // 8}", "--set",
            f"workload.synthetic.layout.ep={lay['ep']}", "--set",
            f"workload.synthetic.batch.global={lay['global_batch']}", "--set", "workload.synthetic.allow_oom=true",
            "--json", *extra]
    code = _CHILD.format(root=str(ROOT), plain=plain, args=args)
    t0 = time.perf_counter()
    try:
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {**lay, "status": f"timeout after {timeout:.0f} s"}
    finally:
        import shutil

        shutil.rmtree(out, ignore_errors=True)
    if p.returncode != 0:
        return {**lay, "status": "failed: " + (p.stderr.strip().splitlines() or ["?"])[-1]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    return {**lay, "status": "ok", **res, "process_wall_s": time.perf_counter() - t0}


def growth(rows: list[dict[str, Any]]) -> None:
    """Add each figure's growth exponent against the previous finished size."""
    prev = None
    for r in rows:
        if r.get("status") != "ok":
            continue
        if prev is not None:
            k = math.log(r["gpus"] / prev["gpus"])
            for f in ("wall_s", "cpu_s", "rss_mib", "events", "solves"):
                a, b = prev.get(f), r.get(f)
                if a and b:
                    r[f"{f}_exp"] = round(math.log(b / a) / k, 2)
        prev = r


def _synth_graph(scenario: str) -> tuple[Any, float]:
    """The graph a scenario's ``cosim run`` synthesizes (the coalescing probe when the step is coalesced) and the
    CPU seconds of :func:`cosim.workload.synth.synthesize`. The cosim of ``PYTHONPATH`` (this checkout's without it)."""
    if not os.environ.get("PYTHONPATH"):
        sys.path.insert(0, str(ROOT))
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.scenario import _probe_spec, build_topology, load_scenario
    from cosim.workload.synth import synthesize

    scn = load_scenario(scenario)
    topo = build_topology(scn.topology, None, {}, {}, scn.nodes)
    spec = scn.workload.synthetic  # type: ignore[union-attr]
    probe = _probe_spec(spec, topo, None)
    c0 = time.process_time()
    syn = synthesize(probe[0] if probe else spec, topo, None, kernel_timer=synthetic_kernel_timer)
    return syn, time.process_time() - c0


def graph_check(argv: list[str]) -> int:
    """``graph dump SCENARIO OUT.npz`` (the synthesized graph's arrays, ``ExecutionGraph.npz_arrays``, and the
    build's unit spans and keys), ``graph compare A.npz B.npz`` (exit 1 unless array-identical), ``graph time
    SCENARIO [REPEAT]`` (synthesis CPU s). Dump with each version (PYTHONPATH=...) and compare: a synthesis speed-up
    must leave the graph unchanged."""
    import pickle

    import numpy as np

    cmd = argv[0] if argv else ""
    if cmd == "compare" and len(argv) == 3:
        a, b = np.load(argv[1]), np.load(argv[2])
        bad = sorted(set(a.files) ^ set(b.files))
        for k in sorted(set(a.files) & set(b.files)):
            x, y = a[k], b[k]
            if x.dtype != y.dtype or x.shape != y.shape or not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                bad.append(k)
        print("identical" if not bad else f"differ: {bad[:20]}", f"({len(a.files)} arrays)")
        return 1 if bad else 0
    if cmd == "dump" and len(argv) == 3:
        syn, cpu = _synth_graph(argv[1])
        arrays = syn.graph.npz_arrays()
        b = syn.built
        arrays["built"] = np.frombuffer(pickle.dumps((b.ranks, b.folded, b.microbatches, b.tokens_per_step,
                                                      b.model_flops, b.unit_spans, b.notes, b.unit_keys)), np.uint8)
        np.savez(argv[2], **arrays)
        print(f"synthesis {cpu:.3f} CPU s, {sum(len(rg.gpu_ops) for rg in syn.graph.ranks)} GPU ops -> {argv[2]}")
        return 0
    if cmd == "time" and len(argv) in (2, 3):
        for _ in range(int(argv[2]) if len(argv) == 3 else 3):
            print(f"synthesis {_synth_graph(argv[1])[1]:.3f} CPU s")
        return 0
    print("usage: bench_synth.py graph dump SCENARIO OUT.npz | graph compare A.npz B.npz | graph time SCENARIO [N]",
          file=sys.stderr)
    return 2


def main() -> int:
    if sys.argv[1:2] == ["graph"]:
        return graph_check(sys.argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,256,1024,4096,8192")
    ap.add_argument("--global-batch", type=int, default=8192)
    ap.add_argument("--mb-per-pipeline", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--plain", action="store_true", help="no coalescing: solve every collective")
    ap.add_argument("--no-coalesce-steps", action="store_true", help="simulate every micro-batch")
    ap.add_argument("--timeline", action="store_true", help="also write the timeline (cosim run's default)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    from tqdm import tqdm

    sizes = [int(x) for x in a.sizes.split(",")]
    rows = []
    for n in tqdm(sizes, desc="sizes", unit="size", file=sys.stderr, disable=a.json):
        rows.append(run_size(layout(n, a.global_batch, a.mb_per_pipeline), a.timeout, a.plain, not a.no_coalesce_steps,
                                a.timeline))
    growth(rows)
    if a.json:
        print(json.dumps(rows, indent=1))
        return 0
    cols = ["gpus", "dp", "ep", "global_batch", "microbatches", "probe_mb", "status", "wall_s", "cpu_s", "rss_mib",
            "events", "solves", "rows_solved", "coalesced", "materialized", "step_time_s", "mfu", "wall_s_exp", "cpu_s_exp", "rss_mib_exp", "events_exp", "solves_exp"]
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(f"{r[c]:.4g}" if isinstance(r.get(c), float) else str(r.get(c, "")) for c in cols))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
