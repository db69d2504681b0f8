"""Tests of trace replay (cosim.replay, cosim.output.timeline, ``cosim replay``).

Three kinds of checks:

* exact small timelines on synthetic chrome traces written by the tests, with
  launch latency, kernel gap and sync cost set explicitly;
* identity replay of every shared real trace (measured durations and
  collectives) against its measured step time, and sensitivity tests that show
  the replay follows the dependency graph rather than copying timestamps;
* knobs, determinism, outputs (summary.json, Kineto-layout timeline) and the CLI.

Tests that read ../shared/traces skip when that folder is absent.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.output import write_result
from cosim.replay import SUMMARY_SCHEMA, ReplayConfig, ReplayResult, apply_sets, parse_sets, replay
from cosim.replay.executor import BOUND_COLL, BOUND_LAUNCH, BOUND_PRED
from cosim.replay.summary import BREAKDOWN_KEYS, without_wall_clock
from cosim.resources import shared_dir
from cosim.workload import ExecutionGraph, OpClass, detect_format, load_trace

REPO = Path(__file__).resolve().parents[1]
SHARED = shared_dir()
TRACES = SHARED / "traces" if SHARED else None
US = 1e-6

DLRM = "param-dlrm-v100x8/kineto"
BERT = "tracelens-h100/gaunernst_bert-small-uncased__1016001.json.gz"
QWEN = "tracelens-h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
V100_NS = "hta/v100-single-ns.json.gz"
MOE5 = "tracelens-b300-moe/moe_05_large_capacity.json.gz"


def _traces() -> Path:
    if TRACES is None:
        pytest.skip("../shared not found: real-trace replay tests skipped (set COSIM_SHARED)")
    return TRACES


# ---------------------------------------------------------------------------------------------
# synthetic chrome traces
# ---------------------------------------------------------------------------------------------

T0 = 1000.0  # trace clock of the first event (us); replay times are relative to it
PID, TID = 1, 1


def _host(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": PID, "tid": TID, "ts": T0 + ts, "dur": dur, "args": args}


def step(n: int, ts: float, dur: float) -> dict[str, Any]:
    return _host("user_annotation", f"ProfilerStep#{n}", ts, dur)


def annot(name: str, ts: float, dur: float) -> dict[str, Any]:
    return _host("user_annotation", name, ts, dur)


def cpu(name: str, ts: float, dur: float) -> dict[str, Any]:
    return _host("cpu_op", name, ts, dur)


def launch(ts: float, dur: float, corr: int) -> dict[str, Any]:
    return _host("cuda_runtime", "cudaLaunchKernel", ts, dur, correlation=corr)


def sync(name: str, ts: float, dur: float, corr: int) -> dict[str, Any]:
    return _host("cuda_runtime", name, ts, dur, correlation=corr)


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [1, 1, 1], "block": [128, 1, 1]}}


def write_trace(path: Path, events: list[dict[str, Any]]) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": events}
    path.write_text(json.dumps(doc))
    return path


def basic_events() -> list[dict[str, Any]]:
    """One step: two back-to-back kernels, a stream sync, host work, a launch-bound
    kernel, a device sync, more host work. Measured sync ends equal kernel ends, so
    the measured sync return latency is 0."""
    return [
        step(1, 0, 1000),
        launch(10, 5, 1), kernel("void k1_elementwise_kernel", 20, 100, 1),
        launch(20, 5, 2), kernel("void k2_elementwise_kernel", 125, 50, 2),
        sync("cudaStreamSynchronize", 30, 145, 3),
        cpu("aten::foo", 195, 10),
        launch(300, 5, 4), kernel("void k3_elementwise_kernel", 310, 20, 4),
        sync("cudaDeviceSynchronize", 310, 20, 5),
        cpu("aten::bar", 400, 10),
    ]


def timeline(res: ReplayResult) -> dict[str, tuple[float, float]]:
    """name -> (start, end) in us of every host and GPU op of rank 0 (names are unique here)."""
    rg, run = res.graph.ranks[0], res.runs[0]
    out = {}
    for i in range(len(rg.host_ops)):
        out[rg.strings[rg.host_ops.name[i]]] = (run.host_start[i] / US, run.host_end[i] / US)
    for j in range(len(rg.gpu_ops)):
        out[rg.strings[rg.gpu_ops.name[j]].split()[1].split("_")[0]] = (run.gpu_start[j] / US, run.gpu_end[j] / US)
    return out


def assert_times(got: dict[str, tuple[float, float]], want: list[tuple[str, float, float]]) -> None:
    for name, s, e in want:
        assert got[name] == pytest.approx((s, e), abs=1e-6), f"{name}: got {got[name]}, want {(s, e)}"


EXACT = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0)


def test_exact_basic_timeline(tmp_path: Path) -> None:
    """Kernel waits for its launch; same-stream order + kernel_gap; syncs block the
    thread until the GPU op ends and later host ops shift by exactly the stall."""
    res = replay(write_trace(tmp_path / "t.json", basic_events()), config=EXACT)
    got = timeline(res)
    assert_times(got, [
        ("cudaLaunchKernel", 292, 297),  # the last one of the name: L3 (after the stream sync)
        ("k1", 15, 115),                  # ready at launch start (10) + latency (5)
        ("k2", 117, 167),                 # launched at 20, queued behind k1: k1 end + gap
        ("cudaStreamSynchronize", 30, 167),  # blocks until k2 ends: stall 137
        ("aten::foo", 187, 197),          # measured gap 20 after the sync, shifted by the stall
        ("k3", 297, 317),                 # GPU idle: waits for its launch (292 + 5)
        ("cudaDeviceSynchronize", 302, 317),
        ("aten::bar", 387, 397),          # total stall 137 + 15
        ("ProfilerStep#1", 0, 987),
    ])
    rg, run = res.graph.ranks[0], res.runs[0]
    names = [rg.strings[n].split()[1].split("_")[0] for n in rg.gpu_ops.name]
    bound = dict(zip(names, run.gpu_bound.tolist()))
    assert bound == {"k1": BOUND_LAUNCH, "k2": BOUND_PRED, "k3": BOUND_LAUNCH}
    s = res.summary()
    assert s["step_time_s"] == pytest.approx(302 * US, abs=1e-12)  # GPU span of the one step
    assert s["measured_step_time_s"] == pytest.approx(310 * US, abs=1e-12)


def test_exact_launch_latency_and_gap_are_used(tmp_path: Path) -> None:
    res = replay(write_trace(tmp_path / "t.json", basic_events()),
                 config=ReplayConfig(launch_latency=8 * US, kernel_gap=0.0, sync_overhead=0.0))
    got = timeline(res)
    assert_times(got, [("k1", 18, 118), ("k2", 118, 168), ("cudaStreamSynchronize", 30, 168)])
    assert res.runs[0].launch_latency == 8 * US and res.summary()["ranks"][0]["launch_latency_source"] == "config"


def test_exact_launch_overhead_shifts_later_launches(tmp_path: Path) -> None:
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0, launch_overhead=10 * US)
    got = timeline(replay(write_trace(tmp_path / "t.json", basic_events()), config=cfg))
    assert_times(got, [
        ("k1", 15, 115),
        ("cudaStreamSynchronize", 40, 167),  # launches took 10 us, not 5: the sync is called 10 us later
        ("aten::foo", 187, 197),             # ... but the stall absorbs it
        ("cudaLaunchKernel", 292, 302),      # L3 lasts 10 us
        ("k3", 297, 317),
        ("cudaDeviceSynchronize", 307, 317),  # 5 us later than with measured launch calls
    ])


def test_exact_host_speed_halves_host_gaps(tmp_path: Path) -> None:
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0, host_speed=2.0)
    got = timeline(replay(write_trace(tmp_path / "t.json", basic_events()), config=cfg))
    assert_times(got, [
        ("k1", 10, 110),                      # launch at 5 (half of 10)
        ("k2", 112, 162),
        ("cudaStreamSynchronize", 15, 162),
        ("aten::foo", 172, 177),              # gap 10 (20 / 2), duration 5 (10 / 2)
        ("k3", 229.5, 249.5),                 # launched 47.5 us (95 / 2) after aten::foo
        ("cudaDeviceSynchronize", 229.5, 249.5),
        ("aten::bar", 284.5, 289.5),          # gap 35 (70 / 2)
    ])


def test_exact_slow_launch_delays_submission(tmp_path: Path) -> None:
    """A launch call longer than the rank's median spends the excess before submission."""
    ev = [
        step(1, 0, 200),
        launch(10, 5, 1), kernel("void k1_x", 20, 10, 1),
        launch(20, 5, 2), kernel("void k2_x", 30, 10, 2),
        launch(30, 25, 3), kernel("void k3_x", 60, 10, 3),
        launch(60, 5, 4), kernel("void k4_x", 72, 10, 4),
        sync("cudaDeviceSynchronize", 70, 12, 5),
    ]
    res = replay(write_trace(tmp_path / "t.json", ev), config=EXACT)
    got = timeline(res)
    assert_times(got, [("k1", 15, 25), ("k2", 27, 37),
                       ("k3", 55, 65),   # 30 + latency 5 + (25 - median 5)
                       ("k4", 67, 77), ("cudaDeviceSynchronize", 70, 77)])
    assert list(res.programs[0].launch_delay.values()) == [pytest.approx(20 * US)]


def test_exact_ops_without_launch_follow_dependencies_not_timestamps(tmp_path: Path) -> None:
    """GPU ops whose launch is not in the trace (queued before profiling started)
    follow their stream predecessor, or the op that ended last before them, after
    the recorded idle time; only the head of the replay keeps its recorded offset."""
    ev = [
        step(1, 0, 400),
        kernel("void k1_x", 0, 100, 901),             # no launch: the head of the replay
        kernel("void k2_x", 130, 50, 902),            # no launch: 30 us after k1 on its stream
        kernel("void k3_x", 200, 10, 903, stream=9),  # no launch, first on stream 9: 20 us after k2
        launch(300, 5, 1), kernel("void k4_x", 310, 10, 1),
    ]
    path = write_trace(tmp_path / "t.json", ev)
    assert_times(timeline(replay(path, config=EXACT)),
                 [("k1", 0, 100), ("k2", 130, 180), ("k3", 200, 210), ("k4", 305, 315)])
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0, gpu_scale={"all": 2.0})
    res = replay(path, config=cfg)
    # twice as long: each follows its dependency, with the recorded idle time kept as a delay
    assert_times(timeline(res), [("k1", 0, 200), ("k2", 230, 330), ("k3", 350, 370), ("k4", 332, 352)])
    rg, run = res.graph.ranks[0], res.runs[0]
    names = [rg.strings[n].split()[1].split("_")[0] for n in rg.gpu_ops.name]
    assert dict(zip(names, run.gpu_bound.tolist()))["k3"] == BOUND_PRED
    assert names[int(run.gpu_bound_src[names.index("k3")])] == "k2"


def test_exact_head_op_without_launch_follows_the_main_thread(tmp_path: Path) -> None:
    """A GPU op without launch that started before any GPU op ended is anchored to the
    main-thread op that last started before it, not to its timestamp."""
    ev = [step(1, 0, 300), cpu("aten::a", 100, 20), kernel("void k1_x", 150, 10, 901),
          launch(200, 5, 1), kernel("void k2_x", 210, 10, 1)]
    path = write_trace(tmp_path / "t.json", ev)
    assert_times(timeline(replay(path, config=EXACT)), [("k1", 150, 160), ("k2", 205, 215)])
    fast = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0, host_speed=2.0)
    # aten::a now starts at 50: k1 follows it by its recorded 50 us
    assert_times(timeline(replay(path, config=fast)), [("aten::a", 50, 60), ("k1", 100, 110), ("k2", 112, 122)])


def test_exact_second_thread_starts_after_its_anchor_on_the_main_thread(tmp_path: Path) -> None:
    """A host thread other than the main one starts at the recorded offset from the
    main-thread op that last started before it, after the main thread's stalls."""
    def on2(ev: dict[str, Any]) -> dict[str, Any]:
        return {**ev, "tid": 2}

    ev = [
        step(1, 0, 300),
        launch(10, 5, 1), kernel("void k1_x", 20, 100, 1),
        sync("cudaDeviceSynchronize", 30, 90, 2),
        cpu("aten::foo", 130, 10),
        on2(cpu("aten::bwd", 150, 20)),
        on2(launch(160, 5, 3)), kernel("void k2_x", 170, 10, 3, stream=9),
    ]
    path = write_trace(tmp_path / "t.json", ev)
    base = timeline(replay(path, config=EXACT))
    assert_times(base, [("k1", 15, 115), ("cudaDeviceSynchronize", 30, 115), ("aten::foo", 125, 135),
                        ("aten::bwd", 145, 165), ("k2", 160, 170)])
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0, gpu_scale={"all": 2.0})
    got = timeline(replay(path, config=cfg))
    # k1 takes 100 us longer: the main thread's sync stalls 100 us more, and thread 2 follows it
    assert_times(got, [("k1", 15, 215), ("aten::foo", 225, 235), ("aten::bwd", 245, 265), ("k2", 260, 280)])


def test_cpu_only_trace_step_is_mean_profiler_step(tmp_path: Path) -> None:
    """A CPU-only trace with nothing a GPU would run: its step time is the mean
    ProfilerStep duration, measured from the trace and simulated from the replay."""
    ev = [step(1, 0, 100), cpu("aten::empty", 10, 5), step(2, 150, 60), cpu("aten::empty", 160, 5)]
    path = write_trace(tmp_path / "t.json", ev)
    s = replay(path, config=EXACT).summary()
    assert s["measured_step_time_s"] == pytest.approx(80 * US) and s["step_time_s"] == pytest.approx(80 * US)
    assert [x["measured_step_time_s"] for x in s["ranks"][0]["steps"]] == [pytest.approx(100 * US),
                                                                            pytest.approx(60 * US)]
    fast = replay(path, config=apply_sets(EXACT, {"host.speed": "2"})).summary()
    assert fast["step_time_s"] == pytest.approx(40 * US) and fast["measured_step_time_s"] == pytest.approx(80 * US)
    assert fast["error"] == pytest.approx(-0.5)


def test_cpu_only_trace_without_profiler_steps(tmp_path: Path) -> None:
    """No ProfilerStep and no GPU ops: the whole trace is one step, the span of its host ops,
    on both sides (10..165 us here)."""
    ev = [cpu("aten::empty", 10, 5), cpu("aten::view", 100, 20), cpu("aten::empty", 160, 5)]
    path = write_trace(tmp_path / "t.json", ev)
    s = replay(path, config=EXACT).summary()
    assert s["measured_step_time_s"] == pytest.approx(155 * US) and s["step_time_s"] == pytest.approx(155 * US)
    fast = replay(path, config=apply_sets(EXACT, {"host.speed": "2"})).summary()
    assert fast["step_time_s"] == pytest.approx(77.5 * US)


def test_cpu_only_shared_trace_step_time() -> None:
    p = _traces() / "hta/cpu-only.json.gz"
    s = replay(p).summary()
    with gzip.open(p, "rt") as f:
        durs = [e["dur"] * US for e in json.load(f)["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#")]
    assert durs and s["measured_step_time_s"] == pytest.approx(statistics.mean(durs))
    assert s["step_time_s"] == pytest.approx(s["measured_step_time_s"], rel=1e-9)
    assert s["ranks"][0]["measured_cpu_step_time_s"] == pytest.approx(statistics.mean(durs))


def test_exact_cuda_graph_region_removes_host_time(tmp_path: Path) -> None:
    """Host time inside a CUDA-graph region disappears (one graph launch instead);
    the gaps outside it stay."""
    ev = [
        step(1, 0, 500),
        cpu("aten::pre", 5, 10),
        annot("## fwd ##", 40, 160),
        cpu("aten::a", 50, 50), launch(60, 5, 1), kernel("void k1_x", 70, 30, 1),
        cpu("aten::b", 120, 60), launch(150, 5, 2), kernel("void k2_x", 155, 30, 2),
        cpu("aten::post", 250, 10),
        sync("cudaDeviceSynchronize", 270, 5, 3),
    ]
    path = write_trace(tmp_path / "t.json", ev)
    base = timeline(replay(path, config=EXACT))
    assert_times(base, [("## fwd ##", 40, 200), ("k1", 65, 95), ("k2", 155, 185), ("aten::post", 250, 260)])
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0,
                       cuda_graphs=("## fwd ##",), graph_launch_overhead=10 * US)
    got = timeline(replay(path, config=cfg))
    # aten::pre ends at 15; the region starts after its measured 25 us gap plus one graph launch (10 us)
    # and takes no host time; its kernels are ready one launch latency later.
    assert_times(got, [
        ("aten::pre", 5, 15),
        ("## fwd ##", 50, 50),
        ("aten::a", 50, 50),
        ("k1", 55, 85),
        ("k2", 87, 117),
        ("aten::post", 100, 110),  # 50 us gap after the region, as measured
    ])


# ---------------------------------------------------------------------------------------------
# real traces: identity replay
# ---------------------------------------------------------------------------------------------


class _Cache:
    """Loads each shared trace once per module and remembers identity replays."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.graphs: dict[str, ExecutionGraph] = {}
        self.results: dict[str, ReplayResult] = {}

    def graph(self, rel: str) -> ExecutionGraph:
        if rel not in self.graphs:
            self.graphs[rel] = load_trace(self.root / rel)
        return self.graphs[rel]

    def identity(self, rel: str) -> ReplayResult:
        if rel not in self.results:
            self.results[rel] = replay(self.graph(rel))
        return self.results[rel]


@pytest.fixture(scope="module")
def cache() -> Iterator[_Cache]:
    yield _Cache(_traces())


def gpu_trace_names(root: Path) -> list[str]:
    """Every shared Kineto trace (the DLRM rank folder as one entry); traces with no
    GPU op are dropped by the caller after loading."""
    out = []
    for p in sorted(root.rglob("*.json.gz")):
        rel = str(p.relative_to(root))
        if rel.startswith(DLRM + "/"):
            continue
        if detect_format(p) == "kineto":
            out.append(rel)
    return [*out, DLRM]


def test_identity_replay_of_every_shared_trace(cache: _Cache) -> None:
    """Measured durations and collectives: every trace within 5%, median within 2%."""
    rows = []
    for rel in gpu_trace_names(cache.root):
        g = cache.graph(rel)
        if sum(len(r.gpu_ops) for r in g.ranks) == 0:
            continue
        s = cache.identity(rel).summary()
        rows.append((rel, s["measured_step_time_s"], s["step_time_s"], s["error"]))
    assert len(rows) >= 20
    table = "\n".join(f"{r:70s} {m * 1e3:12.4f} ms {x * 1e3:12.4f} ms {e:+.2%}" for r, m, x, e in rows)
    errs = [abs(e) for *_, e in rows]
    bad = [r for r in rows if abs(r[3]) > 0.05]
    assert not bad, f"traces off by more than 5%:\n{table}"
    assert statistics.median(errs) <= 0.02, table


def test_identity_multirank_dlrm(cache: _Cache) -> None:
    """8 ranks from one folder: collectives matched across ranks, every rank within 5%."""
    res = cache.identity(DLRM)
    s = res.summary()
    assert [r["rank"] for r in s["ranks"]] == list(range(8))
    for r in s["ranks"]:
        assert abs(r["error"]) <= 0.05, r
    # the job's step is its slowest rank
    assert s["step_time_s"] == max(r["step_time_s"] for r in s["ranks"])
    # a matched collective ends at the same time on every participant
    ends: dict[tuple, list[float]] = {}
    for rg, run in zip(res.graph.ranks, res.runs):
        C, G = rg.collectives, rg.gpu_ops
        for j in np.nonzero(G.collective >= 0)[0]:
            c = int(G.collective[j])
            g = int(C.group[c])
            members = tuple(int(x) for x in rg.groups.ragged("ranks", g)) if g >= 0 else ()
            if len(members) > 1:
                ends.setdefault((members, int(C.seq[c]), int(C.type[c])), []).append(float(run.gpu_end[j]))
    full = {k: v for k, v in ends.items() if len(v) == len(k[0])}
    assert len(full) >= 4
    for k, v in full.items():
        assert max(v) - min(v) < 1e-12, (k, v)
    assert any((run.gpu_bound == BOUND_COLL).any() for run in res.runs)


# ---------------------------------------------------------------------------------------------
# sensitivity: the replay follows the graph
# ---------------------------------------------------------------------------------------------


def _with_dur(g: ExecutionGraph, j: int, new: float) -> ReplayResult:
    G = g.ranks[0].gpu_ops
    old = float(G.dur[j])
    dur = G.dur.copy()
    dur[j] = new
    G.dur = dur
    try:
        return replay(g)
    finally:
        dur[j] = old
        G.dur = dur


def _first_per_step(rg: Any, start: np.ndarray) -> np.ndarray:
    G = rg.gpu_ops
    steps = np.unique(G.step[G.step >= 0])
    return np.array([int(np.nonzero(G.step == s)[0][np.argmin(start[G.step == s])]) for s in steps])


def test_lengthening_a_critical_kernel_lengthens_the_step(cache: _Cache) -> None:
    g = cache.graph(V100_NS)
    base = cache.identity(V100_NS)
    rg, run = g.ranks[0], base.runs[0]
    s0 = base.summary()
    n_periods = len(s0["ranks"][0]["steps"]) - 1
    assert n_periods >= 2
    # walk back from the first GPU op of the last step through the ops that bound each start
    firsts = _first_per_step(rg, run.gpu_start)
    j = int(firsts[-1])
    chain = []
    while run.gpu_bound[j] == BOUND_PRED and run.gpu_bound_src[j] >= 0:
        j = int(run.gpu_bound_src[j])
        chain.append(j)
    after_first = [k for k in chain if run.gpu_start[k] > run.gpu_start[firsts[0]]]
    assert len(after_first) > 100, "the GPU-bound trace should have a long chain of back-to-back kernels"
    k = max(after_first, key=lambda x: rg.gpu_ops.dur[x])
    delta = 1e-3
    bumped = _with_dur(g, k, float(rg.gpu_ops.dur[k]) + delta)
    s1 = bumped.summary()
    # the step-to-step total (first op of the last step minus first of the first) grows by delta
    growth = (s1["step_time_s"] - s0["step_time_s"]) * n_periods
    assert growth == pytest.approx(delta, rel=1e-6)


def test_lengthening_a_kernel_off_the_critical_path_changes_nothing(cache: _Cache) -> None:
    g = cache.graph(BERT)
    base = cache.identity(BERT)
    rg, run = g.ranks[0], base.runs[0]
    G = rg.gpu_ops
    # a kernel followed on its stream by a long GPU idle gap (the next op waits for its launch)
    succ = {int(p): d for d, p in enumerate(base.programs[0].gpu_stream_pred) if p >= 0}
    best, slack = -1, 0.0
    for j, d in succ.items():
        if run.gpu_bound[d] == BOUND_LAUNCH and G.cls[j] != OpClass.MEMCPY:
            sl = run.gpu_start[d] - run.gpu_end[j]
            if sl > slack:
                best, slack = j, float(sl)
    assert best >= 0 and slack > 20 * US
    bumped = _with_dur(g, best, float(G.dur[best]) + slack / 4)
    s0, s1 = base.summary(), bumped.summary()
    assert s1["step_time_s"] == pytest.approx(s0["step_time_s"], rel=1e-12)
    assert bumped.runs[0].gpu_end[best] == pytest.approx(run.gpu_end[best] + slack / 4)


def _scaled(cache: _Cache, rel: str, **sets: str) -> float:
    s0 = cache.identity(rel).summary()["step_time_s"]
    cfg = apply_sets(ReplayConfig(), sets)
    return replay(cache.graph(rel), config=cfg).summary()["step_time_s"] / s0


def test_gpu_scale_on_host_bound_trace_barely_moves(cache: _Cache) -> None:
    assert abs(_scaled(cache, BERT, **{"gpu.scale.all": "0.5"}) - 1) < 0.05


def test_gpu_scale_on_gpu_bound_trace_nearly_halves(cache: _Cache) -> None:
    assert 0.5 <= _scaled(cache, MOE5, **{"gpu.scale.all": "0.5"}) <= 0.6


# ---------------------------------------------------------------------------------------------
# what-if knobs
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("sets, words", [
    (["gpu.scael.gemm=0.5"], "unknown knob"),
    (["gpu.scale.convolution=0.5"], "unknown class"),
    (["gpu.scale.gemm=fast"], "expected a number"),
    (["host.launch_overhead=5 parsecs"], "host.launch_overhead"),
    (["host.launch_overhead=-2 us"], "launch_overhead"),
    (["host.speed=0"], "--set host.speed=0: must be > 0"),
    (["durations=guessed"], "durations"),
    (["novalue"], "KEY=VALUE"),
])
def test_bad_knobs_are_one_line_errors(sets: list[str], words: str) -> None:
    with pytest.raises(CosimInputError) as ei:
        apply_sets(ReplayConfig(), parse_sets(sets))
    msg = str(ei.value)
    assert "\n" not in msg and words in msg, msg


def test_every_knob_the_message_names_is_a_knob() -> None:
    """The unknown-knob message and its "did you mean" candidates come from one table
    (cosim.replay.config._KNOBS): every key it names is one apply_sets takes, and the message lists it."""
    from cosim.replay.config import _KNOBS, _KNOWN_KNOBS, _knob_candidates

    cands = set(_knob_candidates())
    for name, keys in _KNOBS:
        assert name in _KNOWN_KNOBS
        for key in keys:
            assert key in cands
            try:
                apply_sets(ReplayConfig(), {key: "1"})
            except CosimInputError as exc:
                assert "unknown knob" not in exc.message, key
    with pytest.raises(CosimInputError, match=r"did you mean gpu\.scale\.gemm\?"):
        apply_sets(ReplayConfig(), {"gpu.scael.gemm": "0.5"})


def test_knobs_parse() -> None:
    cfg = apply_sets(ReplayConfig(), parse_sets([
        "host.launch_overhead=2 us", "gpu.kernel_gap=1.5us", "host.speed=2", "gpu.scale.gemm=0.5",
        "gpu.scale.all=0.9", "cuda_graphs=## fwd ##, ProfilerStep*", "accelerator=b200", "collectives=simulated",
        "links.nvlink4.bandwidth=450 GB/s"]))
    assert cfg.launch_overhead == pytest.approx(2e-6) and cfg.kernel_gap == pytest.approx(1.5e-6)
    assert cfg.host_speed == 2.0 and dict(cfg.gpu_scale) == {"gemm": 0.5, "all": 0.9}
    assert cfg.cuda_graphs == ("## fwd ##", "ProfilerStep*") and cfg.accelerator == "b200"
    assert cfg.collectives == "simulated" and cfg.catalog_overrides == {"links.nvlink4.bandwidth": "450 GB/s"}
    assert apply_sets(cfg, {"host.launch_overhead": "auto"}).launch_overhead is None


def test_accelerator_b200_scales_gemms_by_bf16_peak(cache: _Cache) -> None:
    g = cache.graph(QWEN)
    base = cache.identity(QWEN)
    res = replay(g, config=apply_sets(ReplayConfig(), {"accelerator": "b200"}))
    cat = load_catalog()
    h100, b200 = cat.accelerator("h100-sxm5"), cat.accelerator("b200")
    G = g.ranks[0].gpu_ops
    gemm = G.cls == OpClass.GEMM
    assert gemm.sum() > 50
    d0 = (base.runs[0].gpu_end - base.runs[0].gpu_start)[gemm].sum()
    d1 = (res.runs[0].gpu_end - res.runs[0].gpu_start)[gemm].sum()
    assert d1 / d0 == pytest.approx(h100.peak("bf16") / b200.peak("bf16"), rel=1e-9)
    ew = G.cls == OpClass.ELEMENTWISE
    e1 = (res.runs[0].gpu_end - res.runs[0].gpu_start)[ew].sum()
    assert e1 / G.dur[ew].sum() == pytest.approx(h100.hbm_bandwidth / b200.hbm_bandwidth, rel=1e-9)
    assert res.summary()["step_time_s"] < base.summary()["step_time_s"]
    assert any("b200" in n for n in res.notes)


# ---------------------------------------------------------------------------------------------
# determinism and outputs
# ---------------------------------------------------------------------------------------------

def test_deterministic(cache: _Cache, tmp_path: Path) -> None:
    g = cache.graph(DLRM)
    a, b = replay(g), replay(g)
    sa, sb = a.summary(), b.summary()
    assert without_wall_clock(sa) == without_wall_clock(sb)
    write_result(a, tmp_path / "a")
    write_result(b, tmp_path / "b")
    assert (tmp_path / "a/timeline.json.gz").read_bytes() == (tmp_path / "b/timeline.json.gz").read_bytes()
    for r in range(8):
        assert (tmp_path / f"a/timeline/rank{r}.json.gz").read_bytes() == \
            (tmp_path / f"b/timeline/rank{r}.json.gz").read_bytes()


SUMMARY_KEYS = {"schema", "cosim_version", "sources", "topology", "config", "step_time_s", "measured_step_time_s",
                "error", "breakdown", "critical_path", "ranks", "sim_wall_s", "events", "ops_per_wall_s", "notes", "links",
                "host", "exposed_communication_split", "busiest_links", "slowest_rank", "slowest_rank_ties"}
RANK_KEYS = {"rank", "device", "gpu", "exposed_communication_split", "step_time_s", "measured_step_time_s", "error", "cpu_step_time_s",
             "measured_cpu_step_time_s", "steps", "breakdown", "measured_breakdown", "critical_path",
             "launch_latency_s", "launch_latency_source", "gpu_ops", "host_ops"}


def _check_summary(s: dict[str, Any]) -> None:
    assert set(s) == SUMMARY_KEYS and s["schema"] == SUMMARY_SCHEMA == "cosim.summary/2"
    slow = [r for r in s["ranks"] if r["step_time_s"] == s["step_time_s"]]
    assert s["slowest_rank"] == slow[0]["rank"] and s["slowest_rank_ties"] == len(slow)
    assert s["breakdown"] == slow[0]["breakdown"]
    assert set(s["breakdown"]) == set(BREAKDOWN_KEYS)
    for r in s["ranks"]:
        assert set(r) == RANK_KEYS
        total = sum(r["breakdown"].values())
        assert total == pytest.approx(r["step_time_s"], rel=1e-9), (r["rank"], r["breakdown"], r["step_time_s"])
        for st in r["steps"]:
            assert set(st) == {"step", "step_time_s", "measured_step_time_s"}
        cp = r["critical_path"]
        assert {"total_s", "by_resource", "by_class", "top_ops", "bound"} <= set(cp)


def _check_kineto_layout(doc: dict[str, Any], rg: Any) -> None:
    ev = doc["traceEvents"]
    xs = [e for e in ev if e["ph"] == "X" and e["cat"] != "gpu_user_annotation"]
    gpu = [e for e in xs if e["cat"] in ("kernel", "gpu_memcpy", "gpu_memset")]
    host = [e for e in xs if e not in gpu]
    assert len(gpu) == len(rg.gpu_ops) and len(host) == len(rg.host_ops)
    devices = set(rg.gpu_ops.device.tolist())
    for e in gpu:
        assert e["pid"] in devices and e["tid"] == e["args"]["stream"] and e["dur"] >= 0
    pids, tids = set(rg.threads.pid.tolist()), set(rg.threads.tid.tolist())
    for e in host:
        assert e["pid"] in pids and e["tid"] in tids
        assert e["cat"] in ("cpu_op", "user_annotation", "cuda_runtime", "cuda_driver")
    s = {e["id"]: e for e in ev if e["ph"] == "s"}
    f = {e["id"]: e for e in ev if e["ph"] == "f"}
    assert s and set(s) == set(f)
    for i, e in f.items():
        assert e["cat"] == s[i]["cat"] == "ac2g" and e["bp"] == "e" and e["ts"] >= s[i]["ts"]
    assert doc["distributedInfo"]["rank"] == rg.rank


def test_outputs_single_rank(cache: _Cache, tmp_path: Path) -> None:
    res = cache.identity(QWEN)
    paths = write_result(res, tmp_path / "out")
    s = json.loads(paths["summary"].read_text())
    _check_summary(s)
    assert s == json.loads(json.dumps(res.summary()))
    doc = json.loads(gzip.decompress(paths["timeline"].read_bytes()))
    _check_kineto_layout(doc, res.graph.ranks[0])
    # kernel times in the timeline are the simulated ones (us, 3 decimals)
    k = next(e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "kernel")
    starts = np.round(res.runs[0].gpu_start * 1e6, 3)
    assert k["ts"] in set(starts.tolist())


def test_outputs_multi_rank(cache: _Cache, tmp_path: Path) -> None:
    res = cache.identity(DLRM)
    write_result(res, tmp_path / "out")
    _check_summary(json.loads((tmp_path / "out/summary.json").read_text()))
    merged = json.loads(gzip.decompress((tmp_path / "out/timeline.json.gz").read_bytes()))
    names = {e["args"]["name"] for e in merged["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert {f"rank{r}.host" for r in range(8)} <= names
    for rg in res.graph.ranks:
        doc = json.loads(gzip.decompress((tmp_path / f"out/timeline/rank{rg.rank}.json.gz").read_bytes()))
        _check_kineto_layout(doc, rg)


def test_synthetic_summary_breakdown(tmp_path: Path) -> None:
    s = replay(write_trace(tmp_path / "t.json", basic_events()), config=EXACT).summary()
    _check_summary(s)
    bd = s["breakdown"]
    # GPU busy 100 + 50 + 20 with 2 us between k1 and k2; idle 130 before k3 waiting for its launch
    assert bd["compute"] == pytest.approx(170 * US) and bd["host_bound_gpu_idle"] == pytest.approx(130 * US)
    assert bd["other_idle"] == pytest.approx(2 * US)


@pytest.mark.filterwarnings("ignore")
def test_hta_reads_simulated_rank_folder(cache: _Cache, tmp_path: Path) -> None:
    pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed")
    import logging

    from hta.trace_analysis import TraceAnalysis

    res = cache.identity(DLRM)
    write_result(res, tmp_path / "out")
    logging.disable(logging.WARNING)
    try:
        ta = TraceAnalysis(trace_dir=str(tmp_path / "out/timeline"))
        df = ta.get_temporal_breakdown(visualize=False)
    finally:
        logging.disable(logging.NOTSET)
    assert sorted(df["rank"].tolist()) == list(range(8))
    assert (df["compute_time(us)"] > 0).all()


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "cosim", "replay", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_json(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", basic_events())
    p = _cli(str(trace), "--json", "--out", str(tmp_path / "out"), "--set", "host.launch_latency=5 us",
             "--set", "gpu.kernel_gap=2 us", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    _check_summary(s)
    assert s["config"]["launch_latency"] == pytest.approx(5e-6)
    assert (tmp_path / "out/summary.json").is_file() and (tmp_path / "out/timeline.json.gz").is_file()
    assert json.loads((tmp_path / "out/summary.json").read_text())["step_time_s"] == s["step_time_s"]


@pytest.mark.parametrize("damage", ["truncated", "corrupt"])
def test_cli_bad_gzip(tmp_path: Path, damage: str) -> None:
    raw = bytearray(gzip.compress(json.dumps({"schemaVersion": 1, "traceEvents": basic_events()}).encode()))
    if damage == "truncated":
        raw = raw[: len(raw) // 2]
    else:
        raw[30:60] = b"\xff" * 30
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(raw))
    out = tmp_path / "out"
    p = _cli(str(bad), "--json", "--out", str(out), cwd=tmp_path)
    assert p.returncode == 2
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1 and "bad.json.gz" in p.stderr
    assert p.stdout == ""
    assert not out.exists() or not any(out.iterdir())


def test_cli_bad_knob(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", basic_events())
    p = _cli(str(trace), "--set", "gpu.scale.gemm=lots", "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_cli_topology_knobs() -> None:
    """``--set topology.<path>`` edits the topology document (as its own ``set:`` block would), together
    with catalog overrides: 2 instead of 18 NVLink4 links per GPU at 20 GB/s x 0.77 efficiency each."""
    from cosim.cli import main

    def gpu0_capacity(*sets: str) -> tuple[float, dict]:
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            assert main(["replay", str(_traces() / DLRM), "--collectives", "simulated", "--topology", "dgx-h100",
                         "--no-timeline", "--json", "--out", str(Path(tempfile.mkdtemp()) / "o"),
                         *[a for kv in sets for a in ("--set", kv)]]) == 0
        s = json.loads(out.getvalue())
        (cap,) = [x["capacity_Bps"] for x in s["links"] if (x["src"], x["dst"]) == ("gpu0", "nvswitch0")]
        return cap, s["config"]["catalog_overrides"]

    cap, ov = gpu0_capacity("links.nvlink4.bandwidth=20 GB/s", "topology.links.gpu-nvlink.count=2")
    assert cap == pytest.approx(2 * 20e9 * 0.77) and ov == {"links.nvlink4.bandwidth": "20 GB/s"}
    assert gpu0_capacity("links.nvlink4.bandwidth=20 GB/s")[0] == pytest.approx(18 * 20e9 * 0.77)


def test_cli_knobs_file(tmp_path: Path) -> None:
    """--knobs FILE.yaml: nested or dotted --set keys; --set wins over the file."""
    trace = write_trace(tmp_path / "t.json", basic_events())
    knobs = tmp_path / "knobs.yaml"
    knobs.write_text("gpu:\n  scale:\n    gemm: 0.5\n    all: 0.8\nhost.launch_overhead: 2 us\n"
                     "cuda_graphs: ['## fwd ##', 'ProfilerStep*']\ncollectives: simulated\n")
    p = _cli(str(trace), "--json", "--no-timeline", "--out", str(tmp_path / "out"), "--knobs", str(knobs),
             "--set", "gpu.scale.all=0.9", "--collectives", "measured", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    cfg = json.loads(p.stdout)["config"]
    assert cfg["gpu_scale"] == {"all": pytest.approx(0.9), "gemm": pytest.approx(0.5)}  # --set wins
    assert cfg["launch_overhead"] == pytest.approx(2e-6)
    assert cfg["cuda_graphs"] == ["## fwd ##", "ProfilerStep*"]
    assert cfg["collectives"] == "measured"  # the flag wins too


@pytest.mark.parametrize(("text", "want"), [
    ("gpu.scale.gemm: 0.5\nhost:\n  speed: fast\n", r":3:\d+: host\.speed: expected a number"),
    ("gpu.scale.gemm: 0.5\nbogus.knob: 3\n", r":2:\d+: bogus\.knob: unknown knob"),
    ("host.launch_overhead: 2\n", r":1:\d+: host\.launch_overhead: .*unit"),
    ("- gpu.scale.gemm\n", r":1:\d+: expected a mapping"),
    ("gpu: {scale: [1\n", r":2:\d+: malformed YAML"),
])
def test_cli_bad_knobs_file(tmp_path: Path, text: str, want: str) -> None:
    """A bad knobs file is one line, file:line:col: key: problem, exit 2."""
    import re

    trace = write_trace(tmp_path / "t.json", basic_events())
    knobs = tmp_path / "knobs.yaml"
    knobs.write_text(text)
    p = _cli(str(trace), "--knobs", str(knobs), "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and re.search(re.escape(str(knobs)) + want, lines[0]), lines


def test_progress_path_runs_the_same_events(monkeypatch) -> None:
    """A long replay steps the environment itself to show progress: same simulated figures as env.run()."""
    import cosim.replay.executor as ex
    from cosim.scenario import load_scenario, run_scenario

    _, plain = run_scenario(load_scenario("moe-ep2-decode-dgx-h100"))
    monkeypatch.setattr(ex, "PROGRESS_MIN_OPS", 0)
    _, stepped = run_scenario(load_scenario("moe-ep2-decode-dgx-h100"))
    a, b = plain.summary(), stepped.summary()
    assert a["step_time_s"] == b["step_time_s"] and a["breakdown"] == b["breakdown"]
    assert a["events"] == b["events"]
