"""Timeline-writing benchmark (not a test): how long ``timeline.json.gz`` + ``timeline/rank{r}.json.gz`` take.

Cases: the bundled ``cosim run`` scenario (4 ranks, a projected CPU capture) and, when
``../shared`` is present, the 8-rank PARAM DLRM trace replayed with simulated NCCL.
For each it reports the simulation (``sim_wall_s``: the engine run alone), the whole
replay (compile + run, the graph loaded), the summary, and the timeline write (best
of ``--repeat``): wall seconds, events and bytes written, events per second.

    python benchmarks/bench_timeline.py [--repeat 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _cases() -> list[tuple[str, Any]]:
    from cosim.resources import shared_dir

    def scenario() -> Any:
        from cosim.scenario import load_scenario, run_scenario

        return run_scenario(load_scenario("moe-ep4-dgx-h100"))[1]

    out = [("cosim run (default scenario)", scenario)]
    sh = shared_dir()
    dlrm = sh / "traces/param-dlrm-v100x8/kineto" if sh else None
    if dlrm is not None and dlrm.is_dir():
        def replay_dlrm() -> Any:
            from cosim.replay import ReplayConfig, replay

            return replay(str(dlrm), None, ReplayConfig(collectives="simulated"))

        out.append(("DLRM 8 ranks, simulated NCCL", replay_dlrm))
    return out


def _measure(name: str, make: Any, repeat: int) -> dict[str, Any]:
    from cosim.output.timeline import write_timeline

    t0 = time.perf_counter()
    res = make()
    t1 = time.perf_counter()
    res.summary()
    t2 = time.perf_counter()
    best = float("inf")
    tmp = Path(tempfile.mkdtemp(prefix="cosim-bench-timeline-"))
    try:
        for _ in range(repeat):
            a = time.perf_counter()
            files = write_timeline(tmp / "timeline.json.gz", res)
            best = min(best, time.perf_counter() - a)
        size = sum(p.stat().st_size for p in files)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gpu = sum(len(rg.gpu_ops) for rg in res.graph.ranks)
    host = sum(len(rg.host_ops) for rg in res.graph.ranks)
    events = 2 * (gpu + host)  # each op goes to its rank file and to the combined file (flows not counted)
    return {"case": name, "ranks": len(res.graph.ranks), "gpu_ops": gpu, "host_ops": host,
            "sim_wall_s": res.sim_wall_s, "load_and_replay_s": t1 - t0, "summary_s": t2 - t1,
            "timeline_s": best, "timeline_bytes": size, "op_events_per_s": events / best if best > 0 else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [_measure(n, m, a.repeat) for n, m in _cases()]
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':32} {'ranks':>5} {'ops':>7} {'sim s':>7} {'load+replay s':>13} {'summary s':>9} "
          f"{'timeline s':>10} {'MB':>6} {'op events/s':>12}")
    for r in rows:
        print(f"{r['case']:32} {r['ranks']:5d} {r['gpu_ops'] + r['host_ops']:7d} {r['sim_wall_s']:7.3f} "
              f"{r['load_and_replay_s']:13.2f} {r['summary_s']:9.3f} {r['timeline_s']:10.3f} "
              f"{r['timeline_bytes'] / 1e6:6.2f} {r['op_events_per_s']:12.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
