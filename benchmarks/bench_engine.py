"""Engine benchmark (not a test): all-to-all among 64, 256 and 1024 GPUs of DGX H100 clusters.

Prints wall time, peak Python memory (tracemalloc, includes numpy arrays), the
process's peak RSS, logical flows, solver rows (flow classes), rate re-solves
and simulated events per wall second, two ways: logical flow events (2 per logical flow + re-solves, what a
per-flow simulator would process) and simpy events the engine actually processed (the fabric moves a collective's
phase as one vectorized event). 64 and 256 GPUs use ``dgx-h100-32node``
(first 8 nodes / all 32 nodes); 1024 GPUs a 128-node variant of the same
preset written to a temporary topology file.

    python benchmarks/bench_engine.py [--sizes 64,256,1024] [--per-rank 64MiB] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cosim import units


def topology(n_gpus: int):
    from cosim.topology import load_topology

    if n_gpus <= 256:
        return load_topology("dgx-h100-32node")
    nodes = n_gpus // 8
    text = (f"name: dgx-h100-{nodes}node\n"
            f"description: \"{nodes}x DGX H100, rail-optimized NDR400 (benchmark variant of dgx-h100-32node)\"\n"
            "source: \"cosim benchmark: dgx-h100-32node with more nodes\"\n"
            f"node: dgx-h100\nnodes: {nodes}\n"
            "fabric:\n  topology: rail-optimized\n  switch_radix: 64\n  oversubscription: 1\n")
    d = Path(tempfile.mkdtemp(prefix="cosim-bench-"))
    p = d / f"dgx-h100-{nodes}node.yaml"
    p.write_text(text)
    return load_topology(p)


def bench(n: int, per_rank: float) -> dict:
    from cosim.engine import NcclConfig, SimConfig, Simulator

    t0 = time.perf_counter()
    topo = topology(n)
    t_topo = time.perf_counter() - t0
    tracemalloc.start()
    w0 = time.perf_counter()
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False))
    ranks = topo.gpus[:n]
    ev = sim.collective("all_to_all", ranks, per_rank, proto="simple")
    import simpy

    steps = 0
    while True:  # sim.run(), counting the simpy events it processes
        try:
            sim.env.step()
        except simpy.core.EmptySchedule:
            break
        steps += 1
    wall = time.perf_counter() - w0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    r = ev.value
    events = sim.fabric.n_flows * 2 + sim.fabric.n_solves  # logical flow start + end + re-solves
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"gpus": n, "flows": sim.fabric.n_flows, "rows": sim.fabric.n_rows, "solves": sim.fabric.n_solves,
            "wall_s": wall, "max_rss_bytes": rss,
            "topology_load_s": t_topo, "peak_mem_bytes": peak, "sim_time_s": r.time, "busbw_Bps": r.busbw,
            "events_per_wall_s": events / wall if wall > 0 else float("inf"), "simpy_events": steps,
            "simpy_events_per_wall_s": steps / wall if wall > 0 else float("inf")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,256,1024", help="GPU counts")
    ap.add_argument("--per-rank", default="64MiB", help="all-to-all send buffer per rank")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        per_rank = units.parse_size(args.per_rank, "--per-rank")
        counts = [int(x) for x in args.sizes.split(",")]
    except units.UnitError as exc:
        ap.error(str(exc))
    except ValueError:
        ap.error(f"--sizes takes GPU counts like 64,256, got {args.sizes!r}")
    if any(n < 2 for n in counts):
        ap.error("--sizes: each GPU count must be >= 2")
    rows = []
    for n in counts:
        rows.append(bench(n, per_rank))
        if not args.json:
            r = rows[-1]
            print(f"{r['gpus']:>5} GPUs  flows {r['flows']:>8}  rows {r['rows']:>8}  solves {r['solves']:>4}  "
                  f"wall {r['wall_s']:8.2f} s  peak mem {units.fmt_size(r['peak_mem_bytes']):>10}  "
                  f"max RSS {units.fmt_size(r['max_rss_bytes']):>10}  sim {units.fmt_time(r['sim_time_s']):>9}  "
                  f"busbw {units.fmt_bandwidth(r['busbw_Bps']):>10}  flow events/s {r['events_per_wall_s']:,.0f}  "
                  f"simpy events {r['simpy_events']:,} ({r['simpy_events_per_wall_s']:,.0f}/s)  "
                  f"(topology load {r['topology_load_s']:.2f} s)", flush=True)
    if args.json:
        json.dump({"benchmark": "all_to_all", "per_rank_bytes": per_rank, "results": rows}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
