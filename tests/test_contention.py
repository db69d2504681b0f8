"""Replay on the engine's shared resources: copies on PCIe, copy engines, GPUDirect sharing a PCIe switch,
communication SMs, HBM bandwidth, the block dispatcher, and host time kept (docs/ENGINE.md, docs/REPLAY.md).

Every expectation is worked out by hand in the test from the catalog's numbers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.catalog import load_catalog
from cosim.errors import CosimInputError
from cosim.replay import ReplayConfig, apply_sets, replay
from cosim.resources import shared_dir
from cosim.workload import load_trace
from cosim.workload.graph import CopyKind, GpuKind

US = 1e-6
T0 = 1000.0
MIB8 = 8 * 2**20
EXACT = ReplayConfig(launch_latency=5 * US, kernel_gap=0.0, sync_overhead=0.0)
SHARED = shared_dir()


def _host(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": T0 + ts, "dur": dur, "args": args}


def launch(ts: float, corr: int, name: str = "cudaLaunchKernel") -> dict[str, Any]:
    return _host("cuda_runtime", name, ts, 2, correlation=corr)


def copy(ts: float, dur: float, corr: int, nbytes: float, stream: int = 7, kind: str = "HtoD") -> dict[str, Any]:
    name = f"Memcpy {kind} (Pinned -> Device)" if kind == "HtoD" else f"Memcpy {kind} (Device -> Pinned)"
    return {"ph": "X", "cat": "gpu_memcpy", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "bytes": nbytes}}


def kernel(name: str, ts: float, dur: float, corr: int, stream: int = 7, grid: int = 1,
           block: int = 128) -> dict[str, Any]:
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": T0 + ts, "dur": dur,
            "args": {"device": 0, "stream": stream, "correlation": corr, "grid": [grid, 1, 1],
                     "block": [block, 1, 1]}}


def write(path: Path, events: list[dict[str, Any]]) -> Path:
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
           "traceEvents": [_host("user_annotation", "ProfilerStep#1", 0, 3000), *events]}
    path.write_text(json.dumps(doc))
    return path


def gpu_times(res: Any) -> list[tuple[float, float]]:
    """(start, end) in us of every GPU op of rank 0, in trace order."""
    run = res.runs[0]
    return [(round(s / US, 6), round(e / US, 6)) for s, e in zip(run.gpu_start, run.gpu_end)]


def _put(out: dict[str, tuple[float, float]], key: str) -> Any:
    """A copy's ``done(start, end)`` that records them under ``key``."""
    def done(s: float, e: float) -> None:
        out.setdefault(key, (s, e))
    return done


PCIE5 = load_catalog().link("pcie5x16")
C0 = PCIE5.bandwidth * PCIE5.efficiency  # H100's GPU <-> CPU route on dgx-h100: cpu0 -> pcie0 -> gpu0, PCIe 5 x16


def copies_trace(tmp_path: Path) -> Path:
    """A 4 KiB copy of 5 us (the rank's fixed per-copy cost o = 5 us), then an 8 MiB copy of 400 us."""
    return write(tmp_path / "copies.json", [
        launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
        launch(30, 2, "cudaMemcpyAsync"), copy(35, 400, 2, MIB8),
    ])


def test_copies_alone_keep_their_measured_duration(tmp_path: Path) -> None:
    res = replay(copies_trace(tmp_path), "dgx-h100", EXACT)
    assert gpu_times(res) == [(20, 25), (35, 435)]


def test_pcie_bandwidth_scales_the_wire_part_of_a_copy(tmp_path: Path) -> None:
    """Half the PCIe bandwidth: C0 / C = 2. The 8 MiB copy: o + (d - o) * 2 = 5 + 395 * 2 = 795 us; the
    4 KiB copy is all fixed cost (d = o) and keeps its 5 us."""
    cfg = apply_sets(EXACT, {"links.pcie5x16.bandwidth": f"{PCIE5.bandwidth / 2 / 1e9} GB/s"})
    res = replay(copies_trace(tmp_path), "dgx-h100", cfg)
    assert gpu_times(res) == [(20, 25), (35, 35 + 5 + 395 * 2)]
    # a Gen6-like doubling halves the wire part: 5 + 395 / 2 = 202.5 us
    cfg = apply_sets(EXACT, {"links.pcie5x16.bandwidth": f"{PCIE5.bandwidth * 2 / 1e9} GB/s"})
    assert gpu_times(replay(copies_trace(tmp_path), "dgx-h100", cfg))[1] == (35, 35 + 202.5)


def _on(sets: dict[str, str], overrides: dict[str, str] | None = None) -> Any:
    """dgx-h100 with ``topology.<path>`` knobs and catalog overrides built in, as ``cosim replay --topology`` and
    scenarios pass it to replay (the config then carries no overrides)."""
    from cosim.scenario import build_topology

    return build_topology("dgx-h100", None, overrides, {f"topology.{k}": v for k, v in sets.items()})


def test_pcie_generation_and_width_of_the_gpu_link(tmp_path: Path) -> None:
    """The H2D route cpu0 -> pcie0 -> gpu0 is two PCIe 5 x16 links (C0 = 64 GB/s x 0.87 = 55.68 GB/s). The GPU's
    link as PCIe 4 x16 (`topology.links.gpu-pcie.type=pcie4x16`): C = 32 x 0.8 = 25.6 GB/s, the 8 MiB copy takes
    o + 395 x 55.68 / 25.6 = 5 + 859.125 us. As PCIe 5 x8 (width halved): C = 32 x 0.87, exactly half: 5 + 790 us.
    As PCIe 6 x16 alone: the switch -> CPU link (Gen5) still limits the route: no change; with that link Gen6 too:
    C = 2 C0, 5 + 197.5 us. The 4 KiB copy is fixed cost and keeps its 5 us throughout."""
    g4 = load_catalog().link("pcie4x16")
    assert (C0, g4.bandwidth * g4.efficiency) == (pytest.approx(55.68e9), pytest.approx(25.6e9))
    p = copies_trace(tmp_path)
    cases = [({"links.gpu-pcie.type": "pcie4x16"}, 5 + 395 * 55.68 / 25.6),
             ({"links.gpu-pcie.type": "pcie5x8"}, 5 + 395 * 2),
             ({"links.gpu-pcie.type": "pcie6x16"}, 400),
             ({"links.gpu-pcie.type": "pcie6x16", "links.pcie-cpu.type": "pcie6x16"}, 5 + 395 / 2)]
    for sets, want in cases:
        t = gpu_times(replay(p, _on(sets), EXACT))
        assert t[0] == (20, 25)
        assert t[1] == (35, pytest.approx(35 + want, abs=1e-6)), sets


def test_what_ifs_built_into_the_topology_act_as_config_overrides(tmp_path: Path) -> None:
    """Scenarios and `--set topology.<path>` build catalog overrides into the topology and clear them from the
    config: the copies (C0 from the topology file as traced) and the HBM law must see them all the same."""
    half = {"links.pcie5x16.bandwidth": f"{PCIE5.bandwidth / 2 / 1e9} GB/s"}
    assert gpu_times(replay(copies_trace(tmp_path), _on({}, half), EXACT)) == [(20, 25), (35, 35 + 5 + 395 * 2)]
    hbm = load_catalog().accelerator("h100-sxm5").hbm_bandwidth
    over = {"accelerators.h100-sxm5.hbm_bandwidth": f"{hbm / 2 / 1e12} TB/s"}
    via_cfg = gpu_times(replay(comm_trace(tmp_path), "dgx-h100", apply_sets(EXACT, over)))
    assert gpu_times(replay(comm_trace(tmp_path), _on({"links.gpu-pcie.type": "pcie5x16"}, over), EXACT)) == via_cfg
    assert via_cfg[2] == (605, 805)


def two_streams_trace(tmp_path: Path) -> Path:
    """The 5 us copy, then two 8 MiB copies of 400 us on streams 7 and 8 that overlap (ready at 40, 41)."""
    return write(tmp_path / "two.json", [
        launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
        launch(35, 2, "cudaMemcpyAsync"), copy(40, 400, 2, MIB8, stream=7),
        launch(36, 3, "cudaMemcpyAsync"), copy(41, 400, 3, MIB8, stream=8),
    ])


def test_copy_engine_count(tmp_path: Path) -> None:
    """Two engines (default): both copies run at their measured rates, 2 x 21.2 GB/s < C0, as traced.
    One engine: the second waits for the first (ends at 440) and then takes its 400 us."""
    assert 2 * MIB8 / (395 * US) < C0
    p = two_streams_trace(tmp_path)
    assert gpu_times(replay(p, "dgx-h100", EXACT))[1:] == [(40, 440), (41, 441)]
    one = apply_sets(EXACT, {"gpu.copy_engines": "1"})
    assert gpu_times(replay(p, "dgx-h100", one))[1:] == [(40, 440), (440, 840)]


def test_copies_share_the_link_when_it_is_too_slow_for_both(tmp_path: Path) -> None:
    """PCIe at a quarter (C = C0 / 4): alone each 8 MiB copy would move at 21.2 / 4 GB/s; together they
    fit (2 x 5.3 GB/s < C = 13.9 GB/s), so only their own slowdown applies: o + 395 * 4 = 1585 us each."""
    cfg = apply_sets(EXACT, {"links.pcie5x16.bandwidth": f"{PCIE5.bandwidth / 4 / 1e9} GB/s"})
    assert 2 * MIB8 / (395 * US) / 4 < C0 / 4
    t = gpu_times(replay(two_streams_trace(tmp_path), "dgx-h100", cfg))
    assert t[1:] == [(40, 40 + 5 + 395 * 4), (41, 41 + 5 + 395 * 4)]


def test_gpudirect_rdma_through_the_pcie_switch_slows_a_copy(tmp_path: Path) -> None:
    """An RDMA write NIC -> PCIe switch -> GPU (GPUDirect) and an H2D copy CPU -> switch -> GPU share the
    switch -> GPU link (capacity C0). The copy alone: 8 MiB at 8 MiB / 200 us = 41.9 GB/s > C0 / 2, so with a
    long RDMA flow beside it max-min gives each C0 / 2: the copy takes o + 8 MiB / (C0 / 2)."""
    from cosim.engine import SimConfig, Simulator
    from cosim.replay.copies import CopyModel
    from cosim.topology import load_topology

    p = write(tmp_path / "rdma.json", [launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
                                       launch(30, 2, "cudaMemcpyAsync"), copy(35, 205, 2, MIB8)])
    rg = load_trace(p).ranks[0]
    topo = load_topology("dgx-h100")
    assert topo.paths("nic0", "gpu0") == [["nic0", "pcie0", "gpu0"]]
    assert topo.paths("cpu0", "gpu0") == [["cpu0", "pcie0", "gpu0"]]
    sim = Simulator(topo, SimConfig(record_trace=False))
    assert sim.fabric.path_capacity("nic0", "pcie0") >= C0 / 2  # the RDMA flow is not limited before the switch
    dur = rg.gpu_ops.dur.astype(float).tolist()
    cm = CopyModel(sim.env, sim.fabric, sim.fabric.path_capacity, [(rg, dur, "gpu0", "cpu0", 2)])
    out: dict[str, tuple[float, float]] = {}
    sim.fabric.transfer("nic0", "gpu0", 10 * MIB8, link_latency=False)  # GPUDirect RDMA write, outlasts the copy
    cm.start(0, 1, float(MIB8), dur[1], 0.0, _put(out, "copy"))
    sim.run()
    assert out["copy"][1] == pytest.approx(5 * US + MIB8 / (C0 / 2), rel=1e-9)
    # the RDMA write starting 50 us into the copy (which ran alone until then at 8 MiB / 200 us): the copy
    # moves its remaining 8 MiB * 150 / 200 at C0 / 2
    late = Simulator(topo, SimConfig(record_trace=False))
    cm = CopyModel(late.env, late.fabric, late.fabric.path_capacity, [(rg, dur, "gpu0", "cpu0", 2)])
    cm.start(0, 1, float(MIB8), dur[1], 0.0, _put(out, "late"))

    def rdma(_e: Any) -> None:
        late.fabric.transfer("nic0", "gpu0", 10 * MIB8)

    late.env.timeout(50 * US).callbacks.append(rdma)
    late.run()
    assert out["late"][1] == pytest.approx(50 * US + MIB8 * 150 / 200 / (C0 / 2) + 5 * US, rel=1e-9)
    alone = Simulator(topo, SimConfig(record_trace=False))
    cm = CopyModel(alone.env, alone.fabric, alone.fabric.path_capacity, [(rg, dur, "gpu0", "cpu0", 2)])
    cm.start(0, 1, float(MIB8), dur[1], 0.0, _put(out, "alone"))
    alone.run()
    assert out["alone"][1] == 205 * US


def comm_trace(tmp_path: Path) -> Path:
    """An NCCL kernel of 16 blocks on stream 20 over [100, 300]; a compute kernel on stream 7 over [200, 400]
    (overlap f = 0.5) and an elementwise kernel and a GEMM after it (no overlap)."""
    return write(tmp_path / "comm.json", [
        launch(90, 1), kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 100, 200, 1, stream=20, grid=16),
        launch(190, 2), kernel("void vectorized_elementwise_kernel_a", 200, 200, 2, grid=100),
        launch(600, 3), kernel("void vectorized_elementwise_kernel_b", 610, 100, 3, grid=100),
        launch(800, 4), kernel("sm90_xmma_gemm_bf16bf16_bf16f32", 810, 100, 4, grid=100),
    ])


def test_comm_sms_slow_the_compute_they_overlap_in_the_simulation(tmp_path: Path) -> None:
    """H100: S = 132 SMs; traced c0 = 16 (the NCCL kernel's grid), h_c = 0.1 of HBM. The elementwise kernel
    (memory-bound, h_k = 1) overlapped the NCCL kernel for f = 0.5 of its 200 us in the trace, at
    rate0 = min((132 - 16) / 132, 1 / (1 + 0.1)) = 116 / 132: its standalone work is
    w = 200 (0.5 + 0.5 * 116 / 132) = 200 * 124 / 132 us.
    c1 = 32: in the simulation the NCCL kernel runs [95, 295], the elementwise kernel starts at 195 and runs
    at 100 / 132 until 295 (it does 100 * 100 / 132 us of work), then at 1: it ends at
    295 + (200 * 124 - 100 * 100) / 132. c1 = 16 (as traced): nothing moves. Kernels that overlap nothing keep
    their time."""
    p = comm_trace(tmp_path)
    base = gpu_times(replay(p, "dgx-h100", EXACT))
    assert base == [(95, 295), (195, 395), (605, 705), (805, 905)]
    t = gpu_times(replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.comm_sms": "32"})))
    assert t == [(95, 295), (195, round(295 + (200 * 124 - 100 * 100) / 132, 6)), (605, 705), (805, 905)]
    assert gpu_times(replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.comm_sms": "16"}))) == base
    with pytest.raises(CosimInputError, match="only 132 SMs"):
        replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.comm_sms": "132"}))


def test_comm_sms_use_the_simulated_overlap_not_the_traced_one(tmp_path: Path) -> None:
    """The same trace with communication kernels twice as long (gpu.scale.collective = 2): the NCCL kernel runs
    [95, 495] in the simulation, so the elementwise kernel now overlaps it all along (in the trace: half):
    with c1 = 32 it takes w / (100 / 132) = 200 * 124 / 100 = 248 us. Without the SM what-if it keeps its
    measured 200 us (the law is off)."""
    p = comm_trace(tmp_path)
    slow = apply_sets(EXACT, {"gpu.scale.collective": "2"})
    assert gpu_times(replay(p, "dgx-h100", slow))[:2] == [(95, 495), (195, 395)]
    t = gpu_times(replay(p, "dgx-h100", apply_sets(slow, {"gpu.comm_sms": "32"})))
    assert t[:2] == [(95, 495), (195, 195 + 248)]


def test_hbm_bandwidth_scales_memory_bound_kernels_and_their_share(tmp_path: Path) -> None:
    """Half the H100's HBM bandwidth (B0 / B = 2): memory-bound kernels (elementwise) take 2x standalone, the
    GEMM keeps its time. The elementwise kernel that overlaps the NCCL kernel: standalone work
    w = 2 * 200 * 124 / 132 (as above, doubled); the NCCL kernel now needs h_c = 0.1 * 2 of HBM, so over
    [195, 295] the kernel runs at min(116 / 132, 1 / 1.2) = 1 / 1.2 and does 100 / 1.2 us of work, then at 1:
    it ends at 295 + w - 100 / 1.2; the next elementwise kernel (ready 605) takes 200 us."""
    hbm = load_catalog().accelerator("h100-sxm5").hbm_bandwidth
    cfg = apply_sets(EXACT, {"accelerators.h100-sxm5.hbm_bandwidth": f"{hbm / 2 / 1e12} TB/s"})
    t = gpu_times(replay(comm_trace(tmp_path), "dgx-h100", cfg))
    end = round(295 + 2 * 200 * 124 / 132 - 100 / 1.2, 6)
    assert t == [(95, 295), (195, end), (605, 805), (805, 905)]


def test_what_ifs_move_the_step_time_by_the_worked_amount(tmp_path: Path) -> None:
    """One-step traces: the step time is the GPU span (first GPU op start to last end, docs/REPLAY.md), so a
    what-if that moves the last op moves the step by exactly as much (expectations as in the tests above).
    Copy engines 3 -> 1 (H2D beside D2H): the D2H copy ends at 840, not 441: step 421 -> 820 us. GPU link
    PCIe 5 -> 4: the last copy's wire part x 55.68 / 25.6: step 415 -> 415 + 395 x (55.68 / 25.6 - 1) us.
    The NCCL kernel and the elementwise kernel it overlaps (the rest of comm_trace dropped): identity step
    395 - 95 = 300 us; comm SMs 16 -> 32: 295 + (200 x 124 - 100 x 100) / 132 - 95; HBM bandwidth halved:
    295 + 2 x 200 x 124 / 132 - 100 / 1.2 - 95."""
    def step(p: Path, topo: Any, cfg: ReplayConfig) -> float:
        return round(float(replay(p, topo, cfg).summary()["step_time_s"]) / US, 6)

    hd = write(tmp_path / "hd.json", [
        launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
        launch(25, 4, "cudaMemcpyAsync"), copy(30, 5, 4, 4096, stream=8, kind="DtoH"),
        launch(35, 2, "cudaMemcpyAsync"), copy(40, 400, 2, MIB8, stream=7),
        launch(36, 3, "cudaMemcpyAsync"), copy(41, 400, 3, MIB8, stream=8, kind="DtoH")])
    assert step(hd, "dgx-h100", EXACT) == 421
    assert step(hd, "dgx-h100", apply_sets(EXACT, {"gpu.copy_engines": "1"})) == 820
    cp = copies_trace(tmp_path)
    assert step(cp, "dgx-h100", EXACT) == 415
    assert step(cp, _on({"links.gpu-pcie.type": "pcie4x16"}), EXACT) == pytest.approx(
        415 + 395 * (55.68 / 25.6 - 1), abs=1e-6)
    ev = json.loads(comm_trace(tmp_path).read_text())["traceEvents"][:5]  # ProfilerStep + 2 launches + 2 kernels
    two = tmp_path / "comm2.json"
    two.write_text(json.dumps({"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}],
                               "traceEvents": ev}))
    assert step(two, "dgx-h100", EXACT) == 300
    assert step(two, "dgx-h100", apply_sets(EXACT, {"gpu.comm_sms": "32"})) == round(
        295 + (200 * 124 - 100 * 100) / 132 - 95, 6)
    hbm = load_catalog().accelerator("h100-sxm5").hbm_bandwidth
    half = apply_sets(EXACT, {"accelerators.h100-sxm5.hbm_bandwidth": f"{hbm / 2 / 1e12} TB/s"})
    assert step(two, "dgx-h100", half) == round(295 + 2 * 200 * 124 / 132 - 100 / 1.2 - 95, 6)


def test_block_dispatcher_holds_other_streams_until_the_last_wave(tmp_path: Path) -> None:
    """A kernel of 132 x 2 x 4 blocks of 1024 threads fills an H100 in 4 waves (2 blocks per SM): over
    [100, 500] its last wave starts at 400. A kernel launched on another stream at 190 (ready 195) starts
    at 400, not 195; one of a single wave (132 x 2 blocks) does not hold it."""
    ev = [launch(90, 1), kernel("void big_kernel", 100, 400, 1, grid=132 * 2 * 4, block=1024),
          launch(190, 2), kernel("void small_kernel", 400, 50, 2, stream=8)]
    t = gpu_times(replay(write(tmp_path / "fill.json", ev), "dgx-h100", EXACT))
    assert t == [(95, 495), (395, 445)]
    ev[1] = kernel("void big_kernel", 100, 400, 1, grid=132 * 2, block=1024)
    ev[3] = kernel("void small_kernel", 195, 50, 2, stream=8)
    assert gpu_times(replay(write(tmp_path / "one.json", ev), "dgx-h100", EXACT)) == [(95, 495), (195, 245)]


@pytest.fixture(scope="module")
def a100_control() -> Any:
    if SHARED is None:
        pytest.skip("../shared not found")
    p = SHARED / "traces" / "hta" / "a100-rank3of8-control.json.gz"
    if not p.exists():
        pytest.skip(f"{p} not found")
    return load_trace(p)


def test_host_bound_trace_keeps_its_host_time(a100_control: Any) -> None:
    """The host-bound HTA A100 trace: CPU step and step time within 1% of the measured ones."""
    s = replay(a100_control, "dgx-a100").summary()
    r = s["ranks"][0]
    assert s["critical_path"]["bound"] == "host"
    assert r["cpu_step_time_s"] == pytest.approx(r["measured_cpu_step_time_s"], rel=0.01)
    assert s["step_time_s"] == pytest.approx(s["measured_step_time_s"], rel=0.01)


def test_pcie_what_if_on_a_real_trace(a100_control: Any) -> None:
    """dgx-a100, PCIe 4 x16 halved: every H2D / D2H copy that shares its link with no other copy takes
    o + (d - o) * 2, o the shortest copy of its direction; identity keeps every copy's measured time."""
    rg = a100_control.ranks[0]
    G = rg.gpu_ops
    cp = np.flatnonzero((G.kind == GpuKind.MEMCPY) & np.isin(G.copy_kind, [CopyKind.HTOD, CopyKind.DTOH])
                        & (G.bytes > 0))
    assert cp.size > 100
    ident = replay(a100_control, "dgx-a100").runs[0]
    assert np.array_equal(ident.gpu_end[cp] - ident.gpu_start[cp], G.dur[cp].astype(float)) or np.allclose(
        ident.gpu_end[cp] - ident.gpu_start[cp], G.dur[cp], rtol=0, atol=1e-12)
    bw = load_catalog().link("pcie4x16").bandwidth
    res = replay(a100_control, "dgx-a100", apply_sets(ReplayConfig(), {"links.pcie4x16.bandwidth":
                                                                       f"{bw / 2 / 1e9} GB/s"}))
    run = res.runs[0]
    d = G.dur.astype(float)
    want = np.empty(cp.size)
    for kind in (CopyKind.HTOD, CopyKind.DTOH):
        k = G.copy_kind[cp] == kind
        o = d[cp][k].min()
        want[k] = o + (d[cp][k] - o) * 2
    got = run.gpu_end[cp] - run.gpu_start[cp]
    s, e = run.gpu_start[cp], run.gpu_end[cp]
    alone = np.ones(cp.size, dtype=bool)
    for i in range(cp.size):  # another copy of the same direction overlapping it shares the link
        same = G.copy_kind[cp] == G.copy_kind[cp[i]]
        alone[i] = not ((s < e[i]) & (e > s[i]) & same & (np.arange(cp.size) != i)).any()
    assert alone.sum() > 0.9 * cp.size
    np.testing.assert_allclose(got[alone], want[alone], rtol=1e-9, atol=1e-12)
    assert got.sum() > 1.5 * d[cp].sum()  # the copies' total time moves, not only the lone ones


@pytest.mark.parametrize("gpudirect, nic", [(True, "100 Gb/s"), (True, "800 Gb/s"), (False, "800 Gb/s")])
def test_nic_bandwidth_gpudirect_vs_host_staged_beside_a_copy(tmp_path: Path, gpudirect: bool, nic: str) -> None:
    """dgx-h100-4node: node1.gpu0 sends a long message to node0.gpu0 while node0.gpu0 runs an 8 MiB H2D copy
    (alone: 5 us + 200 us at 8 MiB / 200 us = 41.9 GB/s). GPUDirect enters node0.gpu0 through nic0 -> pcie0 ->
    gpu0; host-staged through node0.cpu0 -> pcie0 -> gpu0: both cross the copy's pcie0 -> gpu0 link (C0).
    100 Gb/s NIC: the message is capped at 12.5 GB/s, C0 - 12.5 = 43.2 GB/s >= 41.9 left: the copy keeps 205 us.
    800 Gb/s NIC (100 GB/s): the message wants more than C0 / 2, max-min gives each C0 / 2 and the copy takes
    5 us + 8 MiB / (C0 / 2), GPUDirect or host-staged alike (host-staged also loads cpu0 -> pcie0, which the
    copy shares too)."""
    from cosim.engine import SimConfig, Simulator
    from cosim.replay.copies import CopyModel
    from cosim.topology import load_topology

    over = {"nics.cx7-ndr400.bandwidth": nic, "links.ib-ndr.bandwidth": nic,
            "nics.cx7-ndr400.gpudirect_rdma": "true" if gpudirect else "false"}
    topo = load_topology("dgx-h100-4node", overrides=over)
    p = write(tmp_path / "c.json", [launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
                                    launch(30, 2, "cudaMemcpyAsync"), copy(35, 205, 2, MIB8)])
    rg = load_trace(p).ranks[0]
    dur = rg.gpu_ops.dur.astype(float).tolist()
    sim = Simulator(topo, SimConfig(record_trace=False))
    assert sim.fabric.path_capacity("node0.cpu0", "node0.gpu0") == pytest.approx(C0)
    cm = CopyModel(sim.env, sim.fabric, sim.fabric.path_capacity, [(rg, dur, "node0.gpu0", "node0.cpu0", 2)])
    out: dict[str, tuple[float, float]] = {}
    sim.transfer("node1.gpu0", "node0.gpu0", 200 * MIB8)
    cm.start(0, 1, float(MIB8), dur[1], 0.0, _put(out, "copy"))
    sim.run()
    if nic == "100 Gb/s":
        assert C0 - 12.5e9 >= MIB8 / (200 * US)
        assert out["copy"][1] == 205 * US
    else:
        assert out["copy"][1] == pytest.approx(5 * US + MIB8 / (C0 / 2), rel=1e-9)


def test_a_long_copy_call_runs_its_copy_during_the_call(tmp_path: Path) -> None:
    """A cudaMemcpyAsync of 1000 us (median launch call: 2 us) whose copy the trace shows starting 5 us into
    the call (a pageable copy stages while it copies): the slow-launch submission delay (call - median =
    998 us) must not push the copy after the call; it runs at 55-1045 as traced, not at 1053-2043. A kernel
    launch of the same length still gets the delay (its kernel waits for the call, as before)."""
    ev = [launch(10, 1), kernel("void k1", 15, 10, 1), launch(30, 2), kernel("void k2", 35, 10, 2),
          _host("cuda_runtime", "cudaMemcpyAsync", 50, 1000, correlation=3), copy(55, 990, 3, MIB8)]
    assert gpu_times(replay(write(tmp_path / "p.json", ev), "dgx-h100", EXACT))[2] == (55, 1045)
    ev[4] = _host("cuda_runtime", "cudaLaunchKernel", 50, 1000, correlation=3)
    ev[5] = kernel("void k3", 1053, 990, 3)
    assert gpu_times(replay(write(tmp_path / "k.json", ev), "dgx-h100", EXACT))[2] == (1053, 2043)


def test_copy_engines_from_the_catalog_and_one_vs_two_on_h2d_plus_d2h(tmp_path: Path) -> None:
    """The catalog gives the H100 3 copy engines (asyncEngineCount). An 8 MiB H2D copy of 400 us ready at 40 and
    an 8 MiB D2H copy of 400 us ready at 41 (d - o = 395 us each, o = 5 us the rank's shortest copy of each
    direction): with 2 engines they overlap and each keeps its measured time (each direction has its own link:
    no sharing); with 1 engine the D2H copy waits for the H2D one (ends at 440) and runs 440-840."""
    assert load_catalog().accelerator("h100-sxm5").copy_engines == 3
    p = write(tmp_path / "hd.json", [
        launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
        launch(25, 4, "cudaMemcpyAsync"), copy(30, 5, 4, 4096, stream=8, kind="DtoH"),
        launch(35, 2, "cudaMemcpyAsync"), copy(40, 400, 2, MIB8, stream=7),
        launch(36, 3, "cudaMemcpyAsync"), copy(41, 400, 3, MIB8, stream=8, kind="DtoH"),
    ])
    assert gpu_times(replay(p, "dgx-h100", EXACT))[2:] == [(40, 440), (41, 441)]
    two = apply_sets(EXACT, {"gpu.copy_engines": "2"})
    assert gpu_times(replay(p, "dgx-h100", two))[2:] == [(40, 440), (41, 441)]
    one = apply_sets(EXACT, {"accelerators.h100-sxm5.copy_engines": "1"})
    assert gpu_times(replay(p, "dgx-h100", one))[2:] == [(40, 440), (440, 840)]
    assert gpu_times(replay(p, "dgx-h100", apply_sets(EXACT, {"gpu.copy_engines": "1"})))[2:] == [(40, 440),
                                                                                                   (440, 840)]


def test_idle_route_capacity_kept_per_topology_equals_the_replay_fabrics() -> None:
    """The copies' idle route capacity comes from a scratch fabric kept per topology and fabric configuration
    (its segments built once, not by each replay's fabric): the same answers as a fresh fabric's, per config."""
    import dataclasses

    import simpy

    from cosim.engine import SimConfig, Simulator
    from cosim.replay import api
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100")
    pairs = [(topo.cpu_of(g), g) for g in topo.gpus[:3]] + [(g, topo.cpu_of(g)) for g in topo.gpus[5:]]
    for scale in (1.0, 0.5):
        cfg = SimConfig(record_trace=False)
        cfg = dataclasses.replace(cfg, fabric=dataclasses.replace(cfg.fabric, bandwidth_scale=scale))
        sim = Simulator(topo, cfg, env=simpy.Environment())
        cap = api._idle_capacity(topo, sim)
        assert [cap(a, b) for a, b in pairs] == [sim.fabric.path_capacity(a, b) for a, b in pairs]
        assert cap(*pairs[0]) == pytest.approx(C0 * scale)
        assert api._idle_capacity(topo, Simulator(topo, cfg, env=simpy.Environment())) is cap  # kept
    assert len(api._IDLE[id(topo)][1]) == 2


def test_idle_route_capacity_keeps_few_topologies() -> None:
    """The idle-capacity scratch fabrics are kept for a few topologies only, and a topology dropped from them is
    freed (the scratch fabric refers to its topology: a weakly keyed table would hold every one for good)."""
    import gc
    import weakref

    import simpy

    from cosim.engine import SimConfig, Simulator
    from cosim.replay import api
    from cosim.topology import load_topology

    refs = []
    for _ in range(api._IDLE_KEPT + 2):
        t = load_topology("dgx-h100")
        api._idle_capacity(t, Simulator(t, SimConfig(record_trace=False), env=simpy.Environment()))
        refs.append(weakref.ref(t))
        del t
    gc.collect()
    assert len(api._IDLE) <= api._IDLE_KEPT
    assert refs[0]() is None and refs[-1]() is not None


def test_copy_ops_kept_on_the_program_give_the_same_routes_and_fixed_parts(tmp_path: Path) -> None:
    """copies.copy_static keeps copy_ops' answer on the compiled program (RankProgram.copy_static): the same object
    at the next call, and a CopyModel built from it has the routes, route specs and fixed parts of one that works
    them out itself (the shortest copy of each direction, by hand here)."""
    from cosim.engine import SimConfig, Simulator
    from cosim.replay.copies import CopyModel, copy_static
    from cosim.replay.program import compile_program
    from cosim.topology import load_topology

    p = write(tmp_path / "copies.json", [launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096),
                                         launch(30, 2, "cudaMemcpyAsync"), copy(35, 205, 2, MIB8),
                                         launch(260, 3, "cudaMemcpyAsync"), copy(265, 9, 3, 4096, kind="DtoH")])
    rg = load_trace(p, cache=False).ranks[0]
    sim = Simulator(load_topology("dgx-h100"), SimConfig(record_trace=False))
    prog = compile_program(rg, ReplayConfig(), 4e-6, rg.gpu_ops.dur.astype(float))
    assert prog.copy_static is None
    got = copy_static(prog, rg)
    assert prog.copy_static is got and copy_static(prog, rg) is got
    G = rg.gpu_ops
    assert [(k, sel.size, fix) for k, sel, fix in got[1]] == [(CopyKind.HTOD, 2, 5 * US), (CopyKind.DTOH, 1, 9 * US)]
    for kind, sel, _ in got[1]:
        assert (G.kind[sel] == GpuKind.MEMCPY).all() and (G.copy_kind[sel] == kind).all()
    cap = sim.fabric.path_capacity
    a = CopyModel(sim.env, sim.fabric, cap, [(rg, prog.gpu_dur, "gpu0", "cpu0", 2)])
    b = CopyModel(sim.env, sim.fabric, cap, [(rg, prog.gpu_dur, "gpu0", "cpu0", 2)], static=[got])
    assert a.route == b.route and a.specs == b.specs and a.engines.keys() == b.engines.keys()
    assert np.array_equal(a.fixed[rg.rank], b.fixed[rg.rank]) and any(r >= 0 for r in a.route[rg.rank])


def test_copy_statics_follow_the_synthetic_flag(tmp_path: Path) -> None:
    """A synthesized copy has no measured fixed part (copies.copy_ops: 0), a measured one the shortest copy's
    duration: a graph marked synthetic after a replay of the same tables compiled must not get the measured fixed
    parts kept on the first one's program (program.rank_digest names the flag, so it gets a program of its own)."""
    from cosim.replay.copies import copy_static
    from cosim.replay.program import compile_rank

    p = write(tmp_path / "copies.json", [launch(15, 1, "cudaMemcpyAsync"), copy(20, 5, 1, 4096)])
    rg = load_trace(p, cache=False).ranks[0]
    dur = rg.gpu_ops.dur.astype(float)
    measured = copy_static(compile_rank(rg, ReplayConfig(), 4e-6, dur), rg)
    assert [fix for _, _, fix in measured[1]] == [5 * US]
    rg.source["synthetic"] = True
    synth = copy_static(compile_rank(rg, ReplayConfig(), 4e-6, dur), rg)
    assert [fix for _, _, fix in synth[1]] == [0.0]


def test_gc_frozen_collects_the_cycles_a_replay_leaves() -> None:
    """api._gc_frozen collects the young generation before it unfreezes: a cycle made inside (as simpy's
    environment and the engine's simulator are) and dropped is gone on the way out, not moved into the oldest
    generation with the unfrozen objects (where it would wait for a full collection)."""
    import gc
    import weakref

    from cosim.replay.api import _gc_frozen

    class Node:
        me: object = None

    if not gc.isenabled() or gc.get_freeze_count():
        pytest.skip("the collector is off or objects are frozen already")
    with _gc_frozen():
        n = Node()
        n.me = n
        ref = weakref.ref(n)
        del n
        assert ref() is not None  # a cycle: reference counting alone does not free it
    assert ref() is None
