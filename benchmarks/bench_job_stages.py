"""Where a cached replay's CPU time goes, stage by stage, and the executor alone before/after (not a test).

    python benchmarks/bench_job_stages.py [--trace DIR] [--jobs 60] [--tree TREE]
    python benchmarks/bench_job_stages.py --executor-against TREE [--jobs 80]

The first form replays ``--trace`` (default: the 8-rank DLRM job of ``../shared/traces``) from the load cache
(a cache folder under /tmp, filled by warm-up jobs) ``--jobs`` times in this process and prints the CPU ms a job
spent in each stage (load, compile, copy model, executor init / run / results, link attribution, link report,
summary, ...; ``other`` is the rest), mean and best of the job totals, with this tree's cosim or ``--tree``'s.
Run it alternately for two trees for a before/after.

The second form loads TREE's ``cosim/replay/executor.py`` beside this tree's and replays the job with each in
turn (everything else from this tree), so both executors meet the same load: CPU ms of the whole job and of
``Executor.run`` alone, best and median of ``--jobs`` each. Figures: benchmarks/README.md, round 11.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STAGES = (("cosim.replay.api", None, "compile_rank", "compile"), ("cosim.replay.api", None, "_copy_model", "copy model"),
          ("cosim.replay.api", None, "replay_link_usage", "link attribution"),
          ("cosim.replay.api", None, "summarize", "summary"), ("cosim.replay.api", None, "_simulator", "simulator"),
          ("cosim.replay.api", None, "gpu_durations", "durations"),
          ("cosim.replay.links", "LinkUsage", "report", "link report"),
          ("cosim.replay.executor", "Executor", "__init__", "executor init"),
          ("cosim.replay.executor", "Executor", "_run_env", "executor run"),
          ("cosim.replay.executor", "Executor", "_result", "executor results"))
"""(module, class or None, function, stage name): the functions timed."""


def _timed(acc: dict[str, float], f: Callable[..., Any], stage: str) -> Callable[..., Any]:
    def run(*a: Any, **kw: Any) -> Any:
        t0 = time.process_time()
        try:
            return f(*a, **kw)
        finally:
            acc[stage] += time.process_time() - t0
    return run


def _job(trace: Path, acc: dict[str, float]) -> float:
    """One cached load + replay + summary; CPU seconds (the load's added to ``acc['load']``)."""
    from cosim.replay import replay
    from cosim.workload import load_trace

    t0 = time.process_time()
    g = load_trace(trace)
    acc["load"] += time.process_time() - t0
    replay(g).summary()
    return time.process_time() - t0


def stages(trace: Path, jobs: int) -> str:
    """The stage table's line for this tree."""
    import importlib

    acc: dict[str, float] = defaultdict(float)
    for mod, cls, name, stage in STAGES:
        owner: Any = importlib.import_module(mod)
        owner = getattr(owner, cls) if cls else owner
        setattr(owner, name, _timed(acc, getattr(owner, name), stage))
    for _ in range(5):
        _job(trace, acc)
    acc.clear()
    tot = [_job(trace, acc) for _ in range(jobs)]
    other = sum(tot) - sum(acc.values())
    parts = [*sorted(acc.items(), key=lambda kv: -kv[1]), ("other", other)]
    return (f"total mean {sum(tot) / jobs * 1e3:.2f} ms, best {min(tot) * 1e3:.2f}; "
            + ", ".join(f"{k} {v / jobs * 1e3:.2f}" for k, v in parts))


def executor_against(trace: Path, tree: Path, jobs: int) -> str:
    """Whole job and ``Executor.run`` alone, TREE's executor module against this tree's, alternating."""
    import cosim.replay.api as api
    import cosim.replay.executor as here

    spec = importlib.util.spec_from_file_location("before_executor", tree / "cosim/replay/executor.py")
    assert spec is not None and spec.loader is not None
    before = importlib.util.module_from_spec(spec)
    sys.modules["before_executor"] = before
    spec.loader.exec_module(before)
    runs: list[float] = []

    def timing(cls: Any) -> Any:
        class Timed(cls):  # type: ignore[misc, valid-type]
            def run(self) -> Any:
                t0 = time.process_time()
                out = super().run()
                runs.append(time.process_time() - t0)
                return out
        return Timed

    versions = {"before": timing(before.Executor), "after": timing(here.Executor)}
    got: dict[str, tuple[list[float], list[float]]] = {v: ([], []) for v in versions}
    acc: dict[str, float] = defaultdict(float)
    for i in range(jobs + 3):
        for v, cls in versions.items():
            api.Executor = cls  # type: ignore[attr-defined]
            t = _job(trace, acc)
            if i >= 3:
                got[v][0].append(t)
                got[v][1].append(runs[-1])
    return "\n".join(f"{v}: job best {min(a) * 1e3:.2f} median {statistics.median(a) * 1e3:.2f} ms; executor run best "
                     f"{min(b) * 1e3:.2f} median {statistics.median(b) * 1e3:.2f} ms" for v, (a, b) in got.items())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, help="trace file or folder (default: the 8-rank DLRM job)")
    ap.add_argument("--jobs", type=int, default=60, help="timed jobs (per version with --executor-against)")
    ap.add_argument("--executor-against", type=Path, metavar="TREE", help="TREE's executor.py against this tree's")
    ap.add_argument("--tree", type=Path, help="stage mode: import cosim from this tree (another checkout)")
    args = ap.parse_args(argv)
    if args.tree:
        sys.path.insert(0, str(args.tree.resolve()))
    trace = args.trace
    if trace is None:
        from cosim.resources import shared_traces

        traces = shared_traces("pass --trace")
        if traces is None:
            return 2
        trace = traces / "param-dlrm-v100x8" / "kineto"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["COSIM_CACHE_DIR"] = tmp
        if args.executor_against:
            print(executor_against(trace, args.executor_against, args.jobs))
        else:
            print(stages(trace, args.jobs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
