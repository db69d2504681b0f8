"""Engine benchmark (not a test): all-to-all on DGX H100 clusters, equal or uneven per-peer splits.

``--pattern equal`` (default): nccl-tests' all-to-all, ``--per-rank`` bytes split
equally over the peers (every flow ends at once). ``--pattern uneven``: an
all-to-allv whose per-peer byte counts are random (what MoE routing produces):
row i of the byte matrix is ``--per-rank`` bytes split over the n-1 peers in
proportion to uniform(0, 1) draws from ``numpy.random.default_rng(--seed)``, so
flows end one after another and the fabric re-solves rates at every completion.

Printed per size: wall time of the simulation (topology loading excluded),
logical flows, solver rows (flow classes), rate re-solves, rows touched per
solve (the rows whose rate a solve recomputed, averaged), peak Python memory
(tracemalloc, includes numpy arrays), the process's peak RSS (each size runs in
its own process), simulated time and bus bandwidth, and events per wall second
two ways: logical flow events (2 per logical flow + re-solves, what a per-flow
simulator would process) and simpy events the engine actually processed.
Sizes up to 256 GPUs use ``dgx-h100-32node`` (its first n GPUs); larger ones a
``n/8``-node variant of the same preset written to a temporary topology file.
``--completion-tolerance`` sets :attr:`FabricConfig.completion_tolerance` (the completion
window of a collective phase, as a fraction of its projected remaining time; default: the
engine's default; 0 = exact). ``--exact-up-to N`` also runs every size up to N exactly and
reports the windowed run's simulated time relative to the exact one. CPU time is
printed beside wall time (the machine may be shared). ``--max-wall`` (wall seconds) or ``--max-cpu`` (CPU seconds) stops a
size after that much simulation and reports how far it got (for extrapolating runs that would take hours).

    python benchmarks/bench_engine.py [--pattern equal|uneven] [--sizes 64,256,1024] [--per-rank 64MiB]
        [--completion-tolerance EPS] [--exact-up-to 128] [--max-cpu S] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from cosim import units


def topology(n_gpus: int):
    from cosim.topology import load_topology

    if n_gpus <= 256:
        return load_topology("dgx-h100-32node")
    nodes = -(-n_gpus // 8)
    text = (f"name: dgx-h100-{nodes}node\n"
            f"description: \"{nodes}x DGX H100, rail-optimized NDR400 (benchmark variant of dgx-h100-32node)\"\n"
            "source: \"cosim benchmark: dgx-h100-32node with more nodes\"\n"
            f"node: dgx-h100\nnodes: {nodes}\n"
            "fabric:\n  topology: rail-optimized\n  switch_radix: 64\n  oversubscription: 1\n")
    d = Path(tempfile.mkdtemp(prefix="cosim-bench-"))
    p = d / f"dgx-h100-{nodes}node.yaml"
    p.write_text(text)
    return load_topology(p)


def uneven_matrix(n: int, per_rank: float, seed: int):
    """Per-peer bytes: row i splits ``per_rank`` over the other ranks in proportion to uniform draws."""
    import numpy as np

    w = np.random.default_rng(seed).random((n, n))
    np.fill_diagonal(w, 0.0)
    return w / w.sum(axis=1, keepdims=True) * per_rank


def bench(n: int, per_rank: float, pattern: str, seed: int, max_wall: float, tol: float = 0.0,
          progress: bool = False, max_cpu: float = 0.0) -> dict[str, Any]:
    import numpy as np
    import simpy

    from cosim.engine import NcclConfig, SimConfig, Simulator
    from cosim.engine.flows import FabricConfig

    t0 = time.perf_counter()
    topo = topology(n)
    t_topo = time.perf_counter() - t0
    ranks = topo.gpus[:n]
    matrix = uneven_matrix(n, per_rank, seed) if pattern == "uneven" else None
    tracemalloc.start()
    w0 = time.perf_counter()
    c0 = time.process_time()
    fcfg = FabricConfig(completion_tolerance=tol, coalesce=False)  # one collective: solve it here, counted
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False, fabric=fcfg))
    fab = sim.fabric
    if not hasattr(fab, "n_rows_solved"):  # the solver before re-solves were selective: every active row
        orig = fab._solve
        fab.n_rows_solved = 0

        def counted() -> None:
            fab.n_rows_solved += fab._n_active
            orig()

        fab._solve = counted  # type: ignore[method-assign]
    if matrix is None:
        ev = sim.collective("all_to_all", ranks, per_rank, proto="simple")
    else:
        ev = sim.collective("all_to_allv", ranks, matrix=matrix, proto="simple")
    from tqdm import tqdm

    steps = 0
    finished = True
    bar = tqdm(total=fab.n_rows, desc=f"{pattern} all-to-all x{n}", unit="row", file=sys.stderr, disable=not progress,
               leave=False, mininterval=1.0)
    while True:  # sim.run(), counting the simpy events it processes
        try:
            sim.env.step()
        except simpy.core.EmptySchedule:
            break
        steps += 1
        if progress and not steps % 16:
            bar.total = fab.n_rows
            bar.update(fab.n_rows - fab.active_flows - bar.n)
        if not steps % 64 and ((max_wall and time.perf_counter() - w0 > max_wall)
                               or (max_cpu and time.process_time() - c0 > max_cpu)):
            finished = False
            break
    bar.close()
    wall = time.perf_counter() - w0
    cpu = time.process_time() - c0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    events = fab.n_flows * 2 + fab.n_solves  # logical flow start + end + re-solves
    import resource

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out: dict[str, Any] = {
        "gpus": n, "pattern": pattern, "finished": finished, "flows": fab.n_flows, "rows": fab.n_rows,
        "solves": fab.n_solves, "reused": getattr(fab, "n_reused", 0), "rows_per_solve": fab.n_rows_solved / max(fab.n_solves, 1),
        "wall_s": wall, "cpu_s": cpu, "completion_tolerance": tol, "max_rss_bytes": rss, "topology_load_s": t_topo, "peak_mem_bytes": peak,
        "events_per_wall_s": events / wall if wall > 0 else float("inf"), "simpy_events": steps,
        "simpy_events_per_wall_s": steps / wall if wall > 0 else float("inf")}
    if finished:
        r = ev.value
        assert r is not None
        out.update(sim_time_s=r.time, busbw_Bps=r.busbw)
    else:
        out["rows_done_fraction"] = 1.0 - fab.active_flows / max(fab.n_rows, 1)
        out["sim_time_s"] = float(sim.env.now)
    if matrix is not None:
        out["matrix_checksum"] = float(np.asarray(matrix).sum())
    return out


def _line(r: dict[str, Any]) -> str:
    s = (f"{r['gpus']:>5} GPUs {r['pattern']:>6}  flows {r['flows']:>8}  rows {r['rows']:>8}  solves {r['solves']:>7}  "
         f"rows/solve {r['rows_per_solve']:>10.1f}  wall {r['wall_s']:8.2f} s  cpu {r['cpu_s']:8.2f} s  "
         f"peak mem {units.fmt_size(r['peak_mem_bytes']):>10}  max RSS {units.fmt_size(r['max_rss_bytes']):>10}  "
         f"sim {units.fmt_time(r['sim_time_s']):>9}  ")
    if r["finished"]:
        s += f"busbw {units.fmt_bandwidth(r['busbw_Bps']):>10}  "
    else:
        s += f"STOPPED at --max-wall, {100 * r['rows_done_fraction']:.1f}% of rows done  "
    if "sim_time_rel_error" in r:
        s += (f"exact: {r['exact']['solves']} solves, cpu {r['exact']['cpu_s']:.2f} s, sim "
              f"{units.fmt_time(r['exact']['sim_time_s'])} ({100 * r['sim_time_rel_error']:+.3f}%)  ")
    return s + (f"flow events/s {r['events_per_wall_s']:,.0f}  simpy events {r['simpy_events']:,} "
                f"({r['simpy_events_per_wall_s']:,.0f}/s)  (topology load {r['topology_load_s']:.2f} s)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pattern", choices=("equal", "uneven"), default="equal",
                    help="equal: all-to-all; uneven: all-to-allv with random per-peer splits")
    ap.add_argument("--sizes", default="64,256,1024", help="GPU counts")
    ap.add_argument("--per-rank", default="64MiB", help="all-to-all send buffer per rank")
    ap.add_argument("--seed", type=int, default=0, help="seed of the uneven splits")
    ap.add_argument("--completion-tolerance", type=float, default=None,
                    help="FabricConfig.completion_tolerance (default: the engine's; 0: exact completion times)")
    ap.add_argument("--exact-up-to", type=int, default=0,
                    help="also run sizes up to this many GPUs exactly (completion_tolerance 0) and compare")
    ap.add_argument("--max-wall", type=float, default=0.0, help="stop a size after this many seconds (0: never)")
    ap.add_argument("--max-cpu", type=float, default=0.0,
                    help="stop a size after this many CPU seconds of simulation (0: never; robust on a shared machine)")
    ap.add_argument("--in-process", action="store_true", help="run every size in this process (peak RSS is then "
                    "the running maximum)")
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
    if args.completion_tolerance is None:
        from cosim.engine.flows import FabricConfig

        args.completion_tolerance = FabricConfig().completion_tolerance

    def run(n: int, tol: float) -> dict[str, Any]:
        if args.in_process or (len(counts) == 1 and not args.exact_up_to):
            return bench(n, per_rank, args.pattern, args.seed, args.max_wall, tol, progress=not args.json,
                         max_cpu=args.max_cpu)
        # a fresh process per size: honest peak RSS
        cmd = [sys.executable, __file__, "--pattern", args.pattern, "--sizes", str(n), "--per-rank",
               args.per_rank, "--seed", str(args.seed), "--max-wall", str(args.max_wall), "--max-cpu", str(args.max_cpu),
               "--completion-tolerance", str(tol), "--json"]
        return json.loads(subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout)["results"][0]

    rows = []
    for n in counts:
        r = run(n, args.completion_tolerance)
        if n <= args.exact_up_to and args.completion_tolerance > 0:
            x = run(n, 0.0)
            r["exact"] = {k: x[k] for k in ("solves", "cpu_s", "wall_s", "max_rss_bytes", "finished", "sim_time_s")}
            if r["finished"] and x["finished"]:
                r["sim_time_rel_error"] = r["sim_time_s"] / x["sim_time_s"] - 1.0
        rows.append(r)
        if not args.json:
            print(_line(rows[-1]), flush=True)
    if args.json:
        json.dump({"benchmark": f"all_to_all ({args.pattern})", "per_rank_bytes": per_rank, "seed": args.seed,
                   "results": rows}, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
