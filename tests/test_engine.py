"""The one engine: host threads, launches, streams, cross-stream events, syncs and the SM/HBM law, run the way
every replay runs them (cosim.replay's executor on the engine's simpy environment and fabric). Each test is a
small Kineto trace whose replayed times are worked out by hand (they were the old per-kernel GPU model's
tests; that model is gone)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import simpy

from cosim.catalog import load_catalog
from cosim.replay import ReplayConfig, apply_sets, replay
from cosim.replay.interference import COMM, COMPUTE, GpuShare
from cosim.workload.graph import RankGraph

US = 1e-6
T0 = 1000.0
EXACT = ReplayConfig(launch_latency=8 * US, kernel_gap=0.0, sync_overhead=0.0)


def ev(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": T0 + ts, "dur": dur, "args": args}


def launch(ts: float, corr: int, dur: float = 5, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return ev("cuda_runtime", name, ts, dur, correlation=corr)


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, grid: int = 1) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [grid, 1, 1], "block": [128, 1, 1]}}


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": [ev("user_annotation", "ProfilerStep#1", 0, 3000), *events]}
    path.write_text(json.dumps(doc))
    return path


def gpu(res: Any) -> list[tuple[float, float]]:
    run = res.runs[0]
    return [(round(s / US, 6), round(e / US, 6)) for s, e in zip(run.gpu_start, run.gpu_end)]


def host(res: Any, name: str) -> list[tuple[float, float]]:
    """(start, end) in us of the host ops called ``name``, relative to the trace's origin."""
    rg: RankGraph = res.graph.ranks[0]
    run = res.runs[0]
    sel = [i for i in range(len(rg.host_ops)) if rg.strings[int(rg.host_ops.name[i])] == name]
    return [(round(run.host_start[i] / US, 6), round(run.host_end[i] / US, 6)) for i in sel]


def test_kernel_waits_for_launch_and_sync_blocks_thread(tmp_path: Path) -> None:
    """CPU op 0-10, launch 10-15 (k1 ready 10 + 8 = 18, runs 18-118), cudaStreamSynchronize from 15 returns when
    k1 ends (118). The GEMM twice as long (gpu.scale.gemm = 2): k1 18-218, the sync returns at 218."""
    p = write(tmp_path / "t.json", [ev("cpu_op", "aten::op", 0, 10), launch(10, 1),
                                    kernel("sm90_xmma_gemm_k1", 18, 100, 1),
                                    ev("cuda_runtime", "cudaStreamSynchronize", 15, 103)])
    res = replay(p, "dgx-h100", EXACT)
    assert gpu(res) == [(18, 118)]
    assert host(res, "cudaStreamSynchronize") == [(15, 118)]
    res = replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.scale.gemm": "2"}))
    assert gpu(res) == [(18, 218)]
    assert host(res, "cudaStreamSynchronize") == [(15, 218)]


def launches_trace(tmp_path: Path) -> Path:
    """Three launches of 5 us at 0, 5, 10, kernels of 2 us: each starts 8 us after its launch began."""
    evs: list[dict[str, Any]] = []
    for i in range(3):
        evs += [launch(5 * i, i + 1), kernel(f"void k{i}", 5 * i + 8, 2, i + 1)]
    return write(tmp_path / "l.json", evs)


def test_back_to_back_launches_are_launch_bound_then_queue(tmp_path: Path) -> None:
    """As traced: k_i at (5i + 8, 5i + 10), launch-bound. Kernels 4x longer (8 us): k0 8-16, k1 (ready 13)
    16-24, k2 (ready 18) 24-32: the stream queues. A host half as fast (host_speed 0.5): launches at 0, 10, 20,
    kernels at (8, 10), (18, 20), (28, 30)."""
    p = launches_trace(tmp_path)
    assert gpu(replay(p, "dgx-h100", EXACT)) == [(8, 10), (13, 15), (18, 20)]
    assert gpu(replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.scale.all": "4"}))) == [(8, 16), (16, 24), (24, 32)]
    slow = ReplayConfig(launch_latency=8 * US, kernel_gap=0.0, sync_overhead=0.0, host_speed=0.5)
    assert gpu(replay(p, "dgx-h100", slow)) == [(8, 10), (18, 20), (28, 30)]


def test_faster_cpu_what_if_scales_host_time(tmp_path: Path) -> None:
    """A 5 us launch then a 1 us CPU op: with a 2x faster host the CPU op runs 2.5-3.0 (both halved)."""
    p = write(tmp_path / "f.json", [launch(0, 1), kernel("void k", 8, 1, 1), ev("cpu_op", "next", 5, 1)])
    assert host(replay(p, "dgx-h100", EXACT), "next") == [(5, 6)]
    fast = ReplayConfig(launch_latency=8 * US, kernel_gap=0.0, sync_overhead=0.0, host_speed=2.0)
    assert host(replay(p, "dgx-h100", fast), "next") == [(2.5, 3.0)]


def event_trace(tmp_path: Path) -> Path:
    """Producer GEMM on stream 1 (launched at 0: 8-58), cudaEventRecord, cudaStreamWaitEvent, consumer on
    stream 2 (launched at 7, ready 15, waits for the producer: 58-68), cudaEventSynchronize 12-58."""
    return write(tmp_path / "e.json", [
        launch(0, 1), kernel("sm90_xmma_gemm_producer", 8, 50, 1, stream=1),
        ev("cuda_runtime", "cudaEventRecord", 5, 1), ev("cuda_runtime", "cudaStreamWaitEvent", 6, 1),
        launch(7, 2), kernel("void elementwise_consumer", 58, 10, 2, stream=2),
        ev("cuda_runtime", "cudaEventSynchronize", 12, 46)])


def test_cross_stream_event_wait(tmp_path: Path) -> None:
    """As traced, then with the producer twice as long (gpu.scale.gemm = 2: 8-108): the consumer still waits
    for it (108-118) and the event sync returns at 108."""
    p = event_trace(tmp_path)
    res = replay(p, "dgx-h100", EXACT)
    assert gpu(res) == [(8, 58), (58, 68)]
    assert host(res, "cudaEventSynchronize") == [(12, 58)]
    res = replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.scale.gemm": "2"}))
    assert gpu(res) == [(8, 108), (108, 118)]
    assert host(res, "cudaEventSynchronize") == [(12, 108)]


def test_device_synchronize_waits_all_streams(tmp_path: Path) -> None:
    """A GEMM on stream 1 (8-38) and a kernel on stream 2 (13-23), then cudaDeviceSynchronize from 10: it returns
    at the later end, 38; with the GEMM 3x longer (8-98), at 98."""
    p = write(tmp_path / "d.json", [launch(0, 1), kernel("sm90_xmma_gemm_a", 8, 30, 1, stream=1),
                                    launch(5, 2), kernel("void b", 13, 10, 2, stream=2),
                                    ev("cuda_runtime", "cudaDeviceSynchronize", 10, 28)])
    assert host(replay(p, "dgx-h100", EXACT), "cudaDeviceSynchronize") == [(10, 38)]
    res = replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.scale.gemm": "3"}))
    assert gpu(res) == [(8, 98), (13, 23)]
    assert host(res, "cudaDeviceSynchronize") == [(10, 98)]


def test_comm_kernel_holds_sms_and_compute_runs_at_the_rest() -> None:
    """The law on the engine's clock: S = 100 SMs, a communication kernel holding 20 of them over [0, 100]; a
    compute kernel of 80 us standalone work started at 0 runs at 80/100 while it is held: it ends at 100.
    Started at 50 instead, it runs 50 us at 0.8 (40 us of work) and its last 40 us at full speed: ends at 140.
    A kernel that overlaps nothing ends exactly at start + work."""
    env = simpy.Environment()
    plan = {"roles": np.array([COMM, COMPUTE, COMPUTE, COMPUTE]), "h": np.zeros(4), "sms": np.ones(4, dtype=bool),
            "work": np.ones(4), "device": np.zeros(4, dtype=np.int64), "sm_count": 100.0, "comm_sms": 20.0,
            "h_comm": 0.0, "traced_comm_sms": 20.0}
    share = GpuShare(env, {0: plan})
    ends: dict[int, tuple[float, float]] = {}
    share.start_comm(0, 0, 0.0)
    share.end_comm(0, 0, 100 * US)
    share.start(0, 1, 0.0, 80 * US, lambda s, e: ends.setdefault(1, (s, e)))
    share.start(0, 2, 50 * US, 80 * US, lambda s, e: ends.setdefault(2, (s, e)))
    share.start(0, 3, 300 * US, 7 * US, lambda s, e: ends.setdefault(3, (s, e)))
    env.run()
    assert ends[1][1] == pytest.approx(100 * US, rel=1e-12)
    assert ends[2][1] == pytest.approx(140 * US, rel=1e-12)
    assert ends[3] == (300 * US, 300 * US + 7 * US)


def comm_trace(tmp_path: Path) -> Path:
    """An NCCL kernel of 16 blocks on stream 20 over [100, 300]; a D2D copy on stream 8 over [200, 300]."""
    return write(tmp_path / "c.json", [
        launch(90, 1, dur=2), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200, 1, stream=20, grid=16),
        launch(190, 2, dur=2, name="cudaMemcpyAsync"),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD (Device -> Device)", "pid": 0, "tid": 8,
         "ts": T0 + 200, "dur": 100, "args": {"device": 0, "stream": 8, "correlation": 2, "bytes": 2**28}}])


def test_d2d_copy_uses_hbm_not_sms(tmp_path: Path) -> None:
    """A device copy takes no SMs: communication kernels holding 32 SMs instead of 16 leave it as traced (it
    overlapped the NCCL kernel all along, f = 1, at rate 1 / (1 + 0.1) of HBM both times: 195-295).
    Half the HBM bandwidth: standalone 2 x 100 us, work 200 / 1.1 (the traced HBM share); over [195, 295]
    the NCCL kernel needs 0.2 of HBM, the copy runs at 1 / 1.2 and does 100 / 1.2 of it, then at 1: it ends
    at 295 + 200 / 1.1 - 100 / 1.2."""
    p = comm_trace(tmp_path)
    cfg = ReplayConfig(launch_latency=5 * US, kernel_gap=0.0, sync_overhead=0.0)
    assert gpu(replay(p, "dgx-h100", cfg)) == [(95, 295), (195, 295)]
    assert gpu(replay(p, "dgx-h100", apply_sets(cfg, {"gpu.comm_sms": "32"}))) == [(95, 295), (195, 295)]
    hbm = load_catalog().accelerator("h100-sxm5").hbm_bandwidth
    half = apply_sets(cfg, {"accelerators.h100-sxm5.hbm_bandwidth": f"{hbm / 2 / 1e12} TB/s"})
    assert gpu(replay(p, "dgx-h100", half)) == [(95, 295), (195, round(295 + 200 / 1.1 - 100 / 1.2, 6))]


def test_engine_deterministic(tmp_path: Path) -> None:
    p = event_trace(tmp_path)
    cfg = apply_sets(EXACT, {"gpu.scale.gemm": "1.7"})

    def once() -> tuple[Any, ...]:
        r = replay(p, "dgx-h100", cfg).runs[0]
        return (r.gpu_start.tobytes(), r.gpu_end.tobytes(), r.host_start.tobytes(), r.host_end.tobytes())

    assert once() == once()
