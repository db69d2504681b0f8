"""Timeline-writing benchmark (not a test): what ``timeline.json.gz`` + ``timeline/rank{r}.json.gz`` cost.

Cases: the default ``cosim run`` scenario (``cosim.scenario.DEFAULT_SCENARIO``), any scenario given with
``--scenario`` (a bundled name or a YAML file, e.g. ``workloads/scenarios/dsv3-1024.yaml``, the 1024-GPU
DeepSeek-V3 step), and, when ``../shared`` is present, the 8-rank PARAM DLRM trace replayed with simulated NCCL.
For each it reports CPU seconds (``time.process_time``: the machine is shared) of the run (synthesis or loading,
and the simulation), the summary, and the timeline write (best of ``--repeat``), with the write split by phase
(``--phases``: building the rows from the run's columns, serializing the numbers, joining the rows, moving the
combined file's pids, gzip), the events and the bytes written (compressed and not).

    python benchmarks/bench_timeline.py [--repeat 3] [--scenario NAME_OR_YAML] [--no-default] [--phases] [--json]
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _scenario_case(name: str) -> Callable[[], Any]:
    def run() -> Any:
        from cosim.scenario import load_scenario, run_scenario

        return run_scenario(load_scenario(name))[1]

    return run


def _cases(extra: list[str], default: bool) -> list[tuple[str, Callable[[], Any]]]:
    from cosim.resources import shared_dir
    from cosim.scenario import DEFAULT_SCENARIO

    out = [(f"cosim run ({DEFAULT_SCENARIO})", _scenario_case(DEFAULT_SCENARIO))] if default else []
    out += [(f"cosim run ({Path(s).stem})", _scenario_case(s)) for s in extra]
    sh = shared_dir()
    dlrm = sh / "traces/param-dlrm-v100x8/kineto" if sh else None
    if default and dlrm is not None and dlrm.is_dir():
        def replay_dlrm() -> Any:
            from cosim.replay import ReplayConfig, replay

            return replay(str(dlrm), None, ReplayConfig(collectives="simulated"))

        out.append(("DLRM 8 ranks, simulated NCCL", replay_dlrm))
    return out


_PHASES = {  # writer function -> phase (CPU seconds summed over calls; phases nest: "rows" holds "numbers")
    "_rank_blocks": "rows from columns", "_nums": "numbers (orjson)", "_join": "row joins",
    "_repid": "combined pids", "lines": "gzip", "gpu_annotation_events": "annotations",
}


def _instrument(acc: collections.Counter) -> Callable[[], None]:
    """Wrap the writer's phase functions to add their CPU seconds to ``acc``; returns the undo."""
    import cosim.output.timeline as T

    undo = []
    for name, phase in _PHASES.items():
        owner: Any = T._TraceWriter if name == "lines" else (T._Block if name == "_join" else T)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        f = raw.__func__ if isinstance(raw, staticmethod) else raw

        def timed(*a: Any, _f: Callable[..., Any] = f, _p: str = phase, **k: Any) -> Any:
            t = time.process_time()
            try:
                return _f(*a, **k)
            finally:
                acc[_p] += time.process_time() - t

        setattr(owner, name, staticmethod(timed) if isinstance(raw, staticmethod) else timed)
        undo.append((owner, name, raw))

    def restore() -> None:
        for owner, name, raw in undo:
            setattr(owner, name, raw)

    return restore


def _measure(name: str, make: Callable[[], Any], repeat: int, phases: bool) -> dict[str, Any]:
    from cosim.output.timeline import write_timeline

    t0 = time.process_time()
    res = make()
    t1 = time.process_time()
    res.summary()
    t2 = time.process_time()
    best = float("inf")
    acc: collections.Counter = collections.Counter()
    tmp = Path(tempfile.mkdtemp(prefix="cosim-bench-timeline-"))
    try:
        for k in range(repeat + int(phases)):
            restore = _instrument(acc) if k == repeat else None  # the last, extra write when phases
            try:
                a = time.process_time()
                files = write_timeline(tmp / "timeline.json.gz", res)
                dt = time.process_time() - a
            finally:
                if restore is not None:
                    restore()
            if restore is None:
                best = min(best, dt)
        size = sum(p.stat().st_size for p in files)
        raw = 0
        for p in files:
            with gzip.open(p) as fh:
                while chunk := fh.read(1 << 24):
                    raw += len(chunk)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    gpu = sum(len(rg.gpu_ops) for rg in res.graph.ranks)
    host = sum(len(rg.host_ops) for rg in res.graph.ranks)
    return {"case": name, "ranks": len(res.graph.ranks), "gpu_ops": gpu, "host_ops": host,
            "run_cpu_s": t1 - t0, "summary_cpu_s": t2 - t1, "timeline_cpu_s": best, "timeline_bytes": size,
            "timeline_json_bytes": raw, "json_MB_per_cpu_s": raw / 1e6 / best if best > 0 else None,
            "phases_cpu_s": {k: round(v, 3) for k, v in acc.items()}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scenario", action="append", default=[], help="a scenario (name or YAML) to add (repeatable)")
    ap.add_argument("--no-default", action="store_true", help="only the --scenario cases")
    ap.add_argument("--phases", action="store_true",
                    help="one more write, instrumented: CPU seconds per phase (not counted in the best)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = [_measure(n, m, max(a.repeat, 1), a.phases) for n, m in _cases(a.scenario, not a.no_default)]
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{'case':40} {'ranks':>5} {'ops':>8} {'run CPU s':>9} {'summary':>8} {'timeline':>8} {'gz MB':>7} "
          f"{'JSON MB':>8} {'JSON MB/s':>9}")
    for r in rows:
        print(f"{r['case']:40} {r['ranks']:5d} {r['gpu_ops'] + r['host_ops']:8d} {r['run_cpu_s']:9.2f} "
              f"{r['summary_cpu_s']:8.3f} {r['timeline_cpu_s']:8.3f} {r['timeline_bytes'] / 1e6:7.1f} "
              f"{r['timeline_json_bytes'] / 1e6:8.1f} {r['json_MB_per_cpu_s']:9.0f}")
        if r["phases_cpu_s"]:
            print("    phases (CPU s): " + ", ".join(f"{k} {v:.3f}" for k, v in r["phases_cpu_s"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
