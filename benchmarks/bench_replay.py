"""Replay benchmark (not a test): throughput and memory of trace replay on the largest shared traces.

For each trace (hta/v100-rank1of2-df, hta/a100-rank3of8-control,
param-rtx2080ti/resnet_kineto, the 8-rank DLRM folder) it reports, each in a
fresh subprocess so that ``ru_maxrss`` belongs to that trace alone:

* graph ops = host ops + GPU ops;
* executor throughput: graph ops per wall second of the executor alone
  (``sim_wall_s`` in summary.json: the simpy run, after compiling);
* replay throughput: graph ops per CPU second of compile + run + summary
  (the graph already loaded);
* end-to-end throughput: graph ops per CPU second of load + compile + run +
  summary (what ``cosim replay --no-timeline`` spends, less interpreter start),
  on a first load (an empty load cache: parse, check and build the graph, then
  write the cache entry) and on a cached load (the ``.npz`` entry of
  :mod:`cosim.workload.cache` read back), the latter in the process that replayed the trace before (the
  rank programs come from :func:`cosim.replay.program.compile_rank`'s memo) and with the process's memos
  cleared (:func:`forget_memos`: what a fresh ``cosim replay`` process does); first loads always run with
  them cleared;
* peak Python heap (tracemalloc, in a second, traced run) of loading alone and
  of load + replay, and peak RSS (``ru_maxrss``) of the process, also less the
  RSS the process had after its imports, before reading the trace;
* memory against the file size (issue: "memory stays within a small multiple of
  the file size"): each of those peaks divided by the trace's size on disk
  (compressed) and by its uncompressed JSON size.

It also times two reference simpy kernel models on this machine (see
:func:`simpy_baseline`) as the reference point for "kernels per second".

    python benchmarks/bench_replay.py [--traces DIR] [--repeat 3] [--json]
    python benchmarks/bench_replay.py --engine   # executor: identity vs contended replay (engine_throughput)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TRACES = ("hta/v100-rank1of2-df.json.gz", "hta/a100-rank3of8-control.json.gz",
          "param-rtx2080ti/resnet_kineto.json.gz", "param-dlrm-v100x8/kineto")


def forget_memos() -> None:
    """Forget what this process remembers from earlier loads and replays (compiled programs, trace files'
    digests, decoded string tables, load-cache entries read), so that a timed run costs what it costs in a fresh process such as
    ``cosim replay``'s: every first load, and the "cached, memos cleared" runs (the load cache's entry read back,
    programs compiled)."""
    import cosim.replay.program as program
    import cosim.workload.cache as cache
    import cosim.workload.graph as graph

    for memo in (getattr(program, "_PROGRAMS", None), getattr(cache, "_DIGESTS", None),
                 getattr(graph, "_STRINGS", None), getattr(cache, "_ENTRIES", None)):
        if memo is not None:
            memo.clear()


def _replay_once(path: Path, cache_dir: str | None = None, forget: bool = False) -> dict[str, Any]:
    """Load + replay once; with ``cache_dir`` the load cache lives there (a new folder: a first load);
    ``forget``: :func:`forget_memos` first."""

    from cosim.replay import replay
    from cosim.workload import load_trace

    if cache_dir is not None:
        os.environ["COSIM_CACHE_DIR"] = cache_dir
    if forget:
        forget_memos()
    t0 = time.process_time()  # CPU seconds: the machine is shared
    g = load_trace(path)
    t1 = time.process_time()
    res = replay(g)
    s = res.summary()
    t2 = time.process_time()
    ops = sum(r["gpu_ops"] + r["host_ops"] for r in s["ranks"])
    return {"ranks": len(s["ranks"]), "gpu_ops": sum(r["gpu_ops"] for r in s["ranks"]),
            "host_ops": sum(r["host_ops"] for r in s["ranks"]), "ops": ops, "events": s["events"],
            "load_s": t1 - t0, "replay_s": t2 - t1, "sim_wall_s": s["sim_wall_s"], "end_to_end_s": t2 - t0,
            "error": s["error"]}


def trace_sizes(path: Path) -> tuple[int, int]:
    """(bytes on disk, uncompressed JSON bytes) of a trace file or a folder of rank traces."""
    files = sorted(f for f in path.iterdir() if f.name.endswith((".json", ".json.gz"))) if path.is_dir() else [path]
    disk = raw = 0
    for f in files:
        disk += f.stat().st_size
        if f.name.endswith(".gz"):
            with gzip.open(f, "rb") as fh:
                while chunk := fh.read(1 << 22):
                    raw += len(chunk)
        else:
            raw += f.stat().st_size
    return disk, raw


def _maxrss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def bench_one(path: Path, repeat: int) -> dict[str, Any]:
    """Best-of-``repeat`` timings, then traced runs for the Python heap peaks."""
    import tempfile

    import cosim.replay
    import cosim.workload  # noqa: F401

    rss0 = _maxrss()
    with tempfile.TemporaryDirectory() as tmp:
        runs = [_replay_once(path, f"{tmp}/cold{k}", forget=True) for k in range(repeat)]  # empty cache each time
        cached = [_replay_once(path, f"{tmp}/cold0") for _ in range(repeat)]  # the entry the first run wrote
        cold = [_replay_once(path, f"{tmp}/cold0", forget=True) for _ in range(repeat)]  # ... programs compiled
    best = min(runs, key=lambda r: r["end_to_end_s"])
    best["sim_wall_s"] = min(r["sim_wall_s"] for r in runs + cached)
    hot = min(cached, key=lambda r: r["end_to_end_s"])
    best["load_cached_s"] = hot["load_s"]
    best["end_to_end_cached_s"] = hot["end_to_end_s"]
    best["end_to_end_cached_ops_per_s"] = best["ops"] / hot["end_to_end_s"]
    best["end_to_end_cached_cleared_ops_per_s"] = best["ops"] / min(r["end_to_end_s"] for r in cold)
    best["load_ops_per_s"] = best["ops"] / best["load_s"]
    best["load_cached_ops_per_s"] = best["ops"] / hot["load_s"]
    os.environ["COSIM_CACHE_DIR"] = "off"  # the traced runs below measure parsing, not the cache
    best["maxrss_bytes"] = _maxrss()
    best["rss_after_imports_bytes"] = rss0
    from cosim.workload import load_trace

    tracemalloc.start()
    load_trace(path)
    _, load_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    tracemalloc.start()
    _replay_once(path)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    best["tracemalloc_load_peak_bytes"] = load_peak
    best["tracemalloc_peak_bytes"] = peak
    disk, raw = trace_sizes(path)
    best["file_bytes"], best["json_bytes"] = disk, raw
    grown = best["maxrss_bytes"] - rss0
    best["memory_per_file_size"] = {
        "load_heap/json": load_peak / raw, "load_heap/file": load_peak / disk,
        "heap/json": peak / raw, "heap/file": peak / disk,
        "rss_growth/json": grown / raw, "rss_growth/file": grown / disk,
    }
    best["executor_ops_per_s"] = best["ops"] / best["sim_wall_s"]
    best["end_to_end_ops_per_s"] = best["ops"] / best["end_to_end_s"]
    best["replay_ops_per_s"] = best["ops"] / best["replay_s"]
    best["executor_gpu_ops_per_s"] = best["gpu_ops"] / best["sim_wall_s"]
    return best


def simpy_baseline(n_kernels: int = 200_000, streams: int = 4) -> dict[str, Any]:
    """Two reference simpy kernel models on this machine.

    ``bare``: per stream, one process yielding one ``timeout`` per kernel (a lower
    bound on simpy's per-event cost). ``simple``: the usual first simpy model of a
    GPU -- a host process launches each kernel (a timeout for the launch call),
    each kernel is its own process that requests its stream (a ``Resource``) and
    holds it for its duration.
    """
    import simpy

    env = simpy.Environment()
    per = n_kernels // streams

    def stream(k: int):
        for i in range(per):
            yield env.timeout(1e-6 * (1 + (i + k) % 7))

    for k in range(streams):
        env.process(stream(k))
    t0 = time.perf_counter()
    env.run()
    bare = time.perf_counter() - t0

    env = simpy.Environment()
    res = [simpy.Resource(env, capacity=1) for _ in range(streams)]

    def kernel(k: int, dur: float):
        with res[k].request() as req:
            yield req
            yield env.timeout(dur)

    def host():
        for i in range(per * streams):
            yield env.timeout(4e-6)
            env.process(kernel(i % streams, 1e-6 * (1 + i % 7)))

    env.process(host())
    t0 = time.perf_counter()
    env.run()
    simple = time.perf_counter() - t0
    n = per * streams
    return {"kernels": n, "bare_wall_s": bare, "bare_kernels_per_s": n / bare, "simple_wall_s": simple,
            "simple_kernels_per_s": n / simple}


# --------------------------------------------------------------------------------------------------------
# Engine throughput (issue 14): identity vs contended replay, executor only
# --------------------------------------------------------------------------------------------------------

ENGINE_TRACES = ("param-dlrm-v100x8/kineto", "hta/v100-rank1of2-df.json.gz", "hta/a100-rank3of8-control.json.gz",
                 "hta/v100-single-ns.json.gz")
"""The largest shared traces: all 8 DLRM ranks together, the V100 and A100 HTA traces."""

ENGINE_MODES: dict[str, dict[str, Any]] = {
    "identity": {},
    "contended": {"collectives": "simulated"},
    "contended+comm_sms": {"collectives": "simulated", "comm_sms": 32},
    "what-ifs": {"collectives": "simulated", "comm_sms": 32, "hbm": 0.5, "pcie": 0.25},
}
"""identity: measured durations and collectives (copies still run on the fabric, alone); contended: collectives
as flows on the fabric beside the copies; +comm_sms: also the communication-SM law (compute kernels slowed while
they overlap a communication kernel in the simulation); what-ifs: all of that with the replayed accelerator's HBM
bandwidth halved (memory-bound kernels slower, the law's HBM share) and the GPU's PCIe link type at a quarter of its
bandwidth (copies four times slower on the wire, so they overlap each other and the collectives' traffic)."""


def _mode_config(g: Any, kw: dict[str, Any]) -> Any:
    """The ReplayConfig of ``kw`` for graph ``g`` on its default topology (``hbm``, ``pcie``: factors on the traced
    accelerator's HBM bandwidth and on its GPU's PCIe link type)."""
    from cosim.catalog import load_catalog
    from cosim.replay import ReplayConfig, apply_sets
    try:
        from cosim.replay.binding import default_topology, guess_accelerator
    except ImportError:  # before the renames (issue 14): for "before" figures
        from cosim.replay.hardware import default_topology, guess_accelerator  # type: ignore[no-redef]
    from cosim.topology import load_topology

    kw = dict(kw)
    hbm, pcie = kw.pop("hbm", None), kw.pop("pcie", None)
    cfg = ReplayConfig(**kw)
    sets: dict[str, str] = {}
    acc = guess_accelerator(g.ranks[0].device_name)
    cat = load_catalog()
    if hbm is not None and acc is not None:
        sets[f"accelerators.{acc}.hbm_bandwidth"] = f"{cat.accelerator(acc).hbm_bandwidth * hbm / 1e9} GB/s"
    if pcie is not None:
        topo = load_topology(default_topology(acc))
        gpu = topo.gpus[0]
        link = next(d["link"] for _, v, d in topo.graph.edges(gpu, data=True) if str(d.get("link", "")).startswith("pcie"))
        sets[f"links.{link}.bandwidth"] = f"{cat.link(link).bandwidth * pcie / 1e9} GB/s"
    return apply_sets(cfg, sets)


def engine_throughput(traces: Path, repeat: int = 3) -> list[dict[str, Any]]:
    """Executor throughput per trace and mode, best of ``repeat``: graph ops per CPU second of the executor's run
    (``time.process_time`` around :meth:`Executor.run`: the machine is shared, wall time is not a measure) and per
    wall second (``sim_wall_s``); also CPU seconds of the whole ``replay()`` (compile + run + link report; no
    summary). The graph is loaded once per trace."""
    from cosim.replay import replay
    from cosim.replay.executor import Executor
    from cosim.workload import load_trace

    cpu: list[float] = []
    orig = Executor.run

    def timed(self: Any) -> Any:
        t = time.process_time()
        out = orig(self)
        cpu.append(time.process_time() - t)
        return out

    Executor.run = timed  # type: ignore[method-assign]
    rows = []
    try:
        for rel in ENGINE_TRACES:
            p = traces / rel
            if not p.exists():
                continue
            g = load_trace(p)
            ops = sum(len(rg.gpu_ops) + len(rg.host_ops) for rg in g.ranks)
            for mode, kw in ENGINE_MODES.items():
                try:
                    cfg = _mode_config(g, kw)
                except TypeError:  # an older cosim without this knob
                    continue
                best_cpu = best_wall = best_replay = float("inf")
                step = None
                for _ in range(repeat):
                    t = time.process_time()
                    res = replay(g, None, cfg)
                    best_replay = min(best_replay, time.process_time() - t)
                    best_cpu, best_wall = min(best_cpu, cpu[-1]), min(best_wall, res.sim_wall_s)
                step = res.summary()["step_time_s"]
                rows.append({"trace": rel, "mode": mode, "ranks": len(g.ranks), "ops": ops, "events": res.events,
                             "executor_cpu_s": best_cpu, "ops_per_cpu_s": ops / best_cpu, "executor_s": best_wall,
                             "ops_per_s": ops / best_wall, "replay_cpu_s": best_replay, "step_time_s": step})
    finally:
        Executor.run = orig  # type: ignore[method-assign]
    return rows


def engine_main(traces: Path, repeat: int, as_json: bool) -> int:
    rows = engine_throughput(traces, repeat)
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print(f"{'trace':34s} {'mode':19s} {'ranks':>5} {'graph ops':>9} {'events':>8} {'exec CPU':>9} "
          f"{'ops/CPU s':>11} {'ops/wall s':>11} {'replay CPU':>10} {'step ms':>9}")
    for r in rows:
        print(f"{r['trace']:34s} {r['mode']:19s} {r['ranks']:>5} {r['ops']:>9} {r['events']:>8} "
              f"{r['executor_cpu_s']:>8.3f}s {r['ops_per_cpu_s']:>11,.0f} {r['ops_per_s']:>11,.0f} "
              f"{r['replay_cpu_s']:>9.3f}s {r['step_time_s'] * 1e3:>9.3f}")
    print("\nexec CPU: CPU seconds of the executor's run (best of --repeat); ops = host + GPU ops of all ranks; "
          "replay CPU: the whole replay() call (compile + run + link report)")
    return 0


def timing_one(path: Path, repeat: int) -> dict[str, Any]:
    """:func:`bench_one`'s timings alone (no traced runs): best first load and best cached load + replay."""
    import tempfile

    import cosim.replay
    import cosim.workload  # noqa: F401

    with tempfile.TemporaryDirectory() as tmp:
        runs = [_replay_once(path, f"{tmp}/cold{k}", forget=True) for k in range(repeat)]
        cached = [_replay_once(path, f"{tmp}/cold0") for _ in range(repeat)]
        cold = [_replay_once(path, f"{tmp}/cold0", forget=True) for _ in range(repeat)]
    best = min(runs, key=lambda r: r["end_to_end_s"])
    hot = min(cached, key=lambda r: r["end_to_end_s"])
    return {"ops": best["ops"], "load_s": best["load_s"], "replay_s": best["replay_s"], "end_to_end_s": best["end_to_end_s"],
            "load_cached_s": hot["load_s"], "replay_cached_s": hot["replay_s"], "end_to_end_cached_s": hot["end_to_end_s"],
            "end_to_end_cleared_s": min(r["end_to_end_s"] for r in cold)}


def against_main(traces: Path, before: Path, rounds: int, repeat: int, as_json: bool) -> int:
    """Before (``before``'s cosim) and after (this tree's), each trace in alternating fresh processes."""
    here = Path(__file__).resolve().parent.parent
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for _ in range(rounds):
        for rel in TRACES:
            for version, tree in (("before", before), ("after", here)):
                p = subprocess.run([sys.executable, __file__, "--only", str(traces / rel), "--repeat", str(repeat),
                                    "--timing-only", "--tree", str(tree)], capture_output=True, text=True, check=True)
                r = json.loads(p.stdout)
                for mode, key in (("first", "end_to_end_s"), ("cached", "end_to_end_cached_s"),
                                  ("cleared", "end_to_end_cleared_s")):
                    b = best.get((rel, version + mode))
                    if b is None or r[key] < b[key]:
                        best[(rel, version + mode)] = r
    rows = []
    for rel in TRACES:
        for version in ("before", "after"):
            f, c = best[(rel, version + "first")], best[(rel, version + "cached")]
            cl = best[(rel, version + "cleared")]
            rows.append({"trace": rel, "version": version, "ops": f["ops"], "first_load_s": f["load_s"],
                         "cached_load_s": c["load_cached_s"], "replay_s": c["replay_cached_s"],
                         "e2e_first_ops_per_s": f["ops"] / f["end_to_end_s"],
                         "e2e_cached_ops_per_s": c["ops"] / c["end_to_end_cached_s"],
                         "e2e_cached_cleared_ops_per_s": cl["ops"] / cl["end_to_end_cleared_s"]})
    if as_json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    print("| trace | ops | version | first load | cached load | replay | e2e ops/s, first load | e2e ops/s, cached "
          "| e2e ops/s, cached, memos cleared |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['trace'] if r['version'] == 'before' else ''} | {r['ops'] if r['version'] == 'before' else ''} | "
              f"{r['version']} | {r['first_load_s']:.3f} s | {r['cached_load_s'] * 1e3:.1f} ms | "
              f"{r['replay_s'] * 1e3:.1f} ms | {r['e2e_first_ops_per_s'] / 1e6:.3f} M | "
              f"{r['e2e_cached_ops_per_s'] / 1e6:.2f} M | {r['e2e_cached_cleared_ops_per_s'] / 1e6:.2f} M |")
    return 0


def _mb(b: float) -> str:
    return f"{b / 2**20:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", type=Path, help="trace folder (default ../shared/traces)")
    ap.add_argument("--repeat", type=int, default=2, help="timed runs per trace (best is reported)")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # child mode: one trace, JSON on stdout
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--engine", action="store_true", help="only the engine table: identity vs contended replay")
    ap.add_argument("--against", type=Path, metavar="TREE",
                    help="timing only, before/after: TREE's cosim (another checkout) and this one's, in alternating "
                         "fresh processes, --rounds rounds of --repeat runs each; best per version")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of --against (default 3)")
    ap.add_argument("--tree", type=Path, help=argparse.SUPPRESS)  # child mode: import cosim from this tree
    ap.add_argument("--timing-only", action="store_true", help=argparse.SUPPRESS)  # child mode: no traced runs
    args = ap.parse_args(argv)
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))
    if args.only:
        json.dump(timing_one(Path(args.only), args.repeat) if args.timing_only else bench_one(Path(args.only), args.repeat),
                  sys.stdout)
        return 0
    traces = args.traces
    if traces is None:
        from cosim.resources import shared_traces

        traces = shared_traces("pass --traces DIR")
        if traces is None:
            return 2
    if args.engine:
        return engine_main(traces, args.repeat, args.json)
    if args.against:
        return against_main(traces, args.against, args.rounds, args.repeat, args.json)
    rows = []
    for rel in TRACES:
        p = subprocess.run([sys.executable, __file__, "--only", str(traces / rel), "--repeat", str(args.repeat)],
                           capture_output=True, text=True, check=True)
        rows.append({"trace": rel, **json.loads(p.stdout)})
    base = simpy_baseline()
    if args.json:
        json.dump({"traces": rows, "simpy_baseline": base}, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    hdr = (f"{'trace':38s} {'ranks':>5} {'GPU ops':>8} {'host ops':>9} {'load':>7} {'cached':>7} {'replay':>7} "
           f"{'executor':>8} {'exec ops/s':>11} {'replay ops/s':>12} {'e2e ops/s':>10} {'e2e cached':>10} {'cleared':>10} "
           f"{'tracemalloc':>11} {'maxrss':>8}")
    print(hdr)
    for r in rows:
        print(f"{r['trace']:38s} {r['ranks']:>5} {r['gpu_ops']:>8} {r['host_ops']:>9} {r['load_s']:>6.2f}s "
              f"{r['load_cached_s']:>6.3f}s {r['replay_s']:>6.2f}s {r['sim_wall_s']:>7.3f}s "
              f"{r['executor_ops_per_s']:>11,.0f} {r['replay_ops_per_s']:>12,.0f} {r['end_to_end_ops_per_s']:>10,.0f} "
              f"{r['end_to_end_cached_ops_per_s']:>10,.0f} {r['end_to_end_cached_cleared_ops_per_s']:>10,.0f} "
              f"{_mb(r['tracemalloc_peak_bytes']):>11} "
              f"{_mb(r['maxrss_bytes']):>8}")
    print("\nmemory vs file size (file: on disk, gzip; json: uncompressed)")
    print(f"{'trace':38s} {'file':>8} {'json':>8} {'load heap':>9} {'heap':>8} {'RSS growth':>10} "
          f"{'load heap/json':>14} {'heap/json':>9} {'heap/file':>9} {'RSS growth/json':>15} {'RSS growth/file':>15}")
    for r in rows:
        m = r["memory_per_file_size"]
        print(f"{r['trace']:38s} {_mb(r['file_bytes']):>8} {_mb(r['json_bytes']):>8} "
              f"{_mb(r['tracemalloc_load_peak_bytes']):>9} {_mb(r['tracemalloc_peak_bytes']):>8} "
              f"{_mb(r['maxrss_bytes'] - r['rss_after_imports_bytes']):>10} {m['load_heap/json']:>14.2f} "
              f"{m['heap/json']:>9.2f} {m['heap/file']:>9.2f} {m['rss_growth/json']:>15.2f} "
              f"{m['rss_growth/file']:>15.2f}")
    print("\nheap: tracemalloc peak (Python allocations, numpy included) of load (+ replay); RSS growth: peak RSS "
          "less the RSS after imports (includes allocator slack and the timed runs)")
    print("\nload: parse the trace into the execution graph (first load: empty load cache, includes writing the "
          "entry); cached: load from the .npz load cache; replay: compile + run + summary; executor: the simpy run "
          "alone (summary.json sim_wall_s); ops = host ops + GPU ops; e2e = load + replay (e2e cached: with the "
          "cached load, in the process that replayed the trace before: its programs from compile's memo; cleared: "
          "the same with the process's memos cleared, as in a fresh `cosim replay`)")
    print(f"\nsimpy reference on this machine ({base['kernels']:,} kernels): one timeout per kernel "
          f"{base['bare_kernels_per_s']:,.0f} kernels/s; launch + stream Resource + timeout per kernel "
          f"{base['simple_kernels_per_s']:,.0f} kernels/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
