"""Host threads, GPU streams, SM sharing, copies: exact timelines (name, time)."""

from __future__ import annotations

import pytest

from cosim.engine import GpuConfig, HostConfig, SimConfig, Simulator
from cosim.engine.topoview import nvswitch_node

US = 1e-6


def make(**host) -> Simulator:
    g = nvswitch_node(2, nvlink_bw=100e9, pcie_bw=50e9)
    cfg = SimConfig(host=HostConfig(launch_overhead=5 * US, launch_latency=8 * US, **host),
                    gpu=GpuConfig(sm_count=100, comm_sms=20, hbm_bandwidth=1e12))
    return Simulator(g, cfg)


def spans(sim: Simulator, track_part: str = "") -> list[tuple[str, float, float]]:
    return [(e.name, round(e.start / US, 6), round(e.end / US, 6)) for e in sim.trace if track_part in e.track]


def test_kernel_waits_for_launch_and_sync_blocks_thread():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    s = sim.gpu("gpu0").stream(7)
    marks = []

    def prog():
        yield t.cpu_op(10 * US, name="op")            # 0..10
        yield t.launch(s, 100 * US, name="k1")        # launch 10..15; k1 >= 10+8 = 18
        marks.append(("launched", sim.now / US))
        yield t.sync_stream(s)                        # blocks until k1 ends at 118
        marks.append(("synced", sim.now / US))

    sim.env.process(prog())
    sim.run()
    assert marks == [("launched", pytest.approx(15)), ("synced", pytest.approx(118))]
    assert spans(sim, "stream7") == [("k1", 18.0, 118.0)]
    assert ("cudaStreamSynchronize", 15.0, 118.0) in spans(sim, "rank0")
    assert s.track == "node0.gpu0.stream7"


def test_back_to_back_launches_are_launch_bound_then_queue():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    s = sim.gpu("gpu0").stream(0)

    def prog():
        for i in range(3):  # launches at 0,5,10 (5 us each); kernels 2 us each
            yield t.launch(s, 2 * US, name=f"k{i}")

    sim.env.process(prog())
    sim.run()
    # k_i starts at max(i*5 + 8, end of k_{i-1})
    assert spans(sim, "stream0") == [("k0", 8.0, 10.0), ("k1", 13.0, 15.0), ("k2", 18.0, 20.0)]


def test_cuda_graph_costs_one_launch():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    s = sim.gpu("gpu0").stream(0)

    def prog():
        yield t.graph_launch(s, [dict(name=f"g{i}", duration=1 * US) for i in range(4)])
        yield t.cpu_op(1 * US, name="after")

    sim.env.process(prog())
    sim.run()
    assert spans(sim, "stream0") == [("g0", 8.0, 9.0), ("g1", 9.0, 10.0), ("g2", 10.0, 11.0), ("g3", 11.0, 12.0)]
    assert ("after", 5.0, 6.0) in spans(sim, "rank0")


def test_faster_cpu_what_if_scales_launch_overhead():
    sim = make(launch_overhead_scale=0.5)
    t = sim.thread("rank0", gpu="gpu0")
    s = sim.gpu("gpu0").stream(0)

    def prog():
        yield t.launch(s, 1 * US, name="k")
        yield t.cpu_op(1 * US, name="next")

    sim.env.process(prog())
    sim.run()
    assert ("next", 2.5, 3.5) in spans(sim, "rank0")


def test_cross_stream_event_wait():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    gpu = sim.gpu("gpu0")
    a, b = gpu.stream(1), gpu.stream(2)

    def prog():
        yield t.launch(a, 50 * US, name="producer")    # 8..58
        ev = a.record()
        b.wait_event(ev)
        yield t.launch(b, 10 * US, name="consumer")     # launched 5..10, >= 13, waits for 58
        yield t.sync_event(ev)

    sim.env.process(prog())
    sim.run()
    assert ("consumer", 58.0, 68.0) in spans(sim, "stream2")
    assert ("cudaEventSynchronize", 10.0, 58.0) in spans(sim, "rank0")


def test_concurrent_kernels_share_sms_and_comm_sms_slow_compute():
    sim = make()
    gpu = sim.gpu("gpu0")
    from cosim.engine.gpu import Kernel

    # two full-chip kernels of 100 us on two streams: each gets half the SMs -> both end at 200 us
    gpu.stream(1).enqueue(Kernel("a", 100 * US))
    gpu.stream(2).enqueue(Kernel("b", 100 * US))
    sim.run()
    assert sorted(spans(sim, "gpu0")) == [("a", 0.0, 200.0), ("b", 0.0, 200.0)]

    sim = make()
    gpu = sim.gpu("gpu0")
    gpu.stream(1).enqueue(Kernel("k", 80 * US))
    gpu._comm_begin()  # a comm kernel holds 20 of 100 SMs: compute runs at 80/100
    sim.run()
    assert spans(sim, "gpu0") == [("k", 0.0, 100.0)]


def test_hbm_sharing():
    sim = make()
    gpu = sim.gpu("gpu0")
    from cosim.engine.gpu import Kernel

    # two memory-bound kernels, 30 SMs each (SMs suffice), each using 100% HBM alone: half speed each
    gpu.stream(1).enqueue(Kernel("m1", 10 * US, sm_demand=30, hbm_fraction=1.0))
    gpu.stream(2).enqueue(Kernel("m2", 10 * US, sm_demand=30, hbm_fraction=1.0))
    gpu.stream(3).enqueue(Kernel("c", 10 * US, sm_demand=30, hbm_fraction=0.0))  # compute-bound: unaffected
    sim.run()
    assert sorted(spans(sim, "gpu0")) == [("c", 0.0, 10.0), ("m1", 0.0, 20.0), ("m2", 0.0, 20.0)]


def test_d2d_copy_uses_hbm_not_sms():
    """A D2D copy (all of HBM, no SMs) beside a compute-bound full-chip kernel: neither slows the other;
    beside a memory-bound kernel they split HBM."""
    from cosim.engine.gpu import Kernel

    sim = make()
    gpu = sim.gpu("gpu0")
    gpu.stream(1).enqueue(Kernel("k", 100 * US))
    gpu.memcpy(gpu.stream(2), "d2d", 50e6)  # 2 * 50 MB / (1 TB/s * d2d_efficiency)
    sim.run()
    d2d = 2 * 50e6 / (1e12 * sim.config.gpu.d2d_efficiency) / US
    assert sorted(spans(sim, "gpu0")) == [("k", 0.0, 100.0), ("memcpy_d2d", 0.0, round(d2d, 6))]

    sim = make()
    gpu = sim.gpu("gpu0")
    gpu.stream(1).enqueue(Kernel("m", d2d * US, sm_demand=30, hbm_fraction=1.0))
    gpu.memcpy(gpu.stream(2), "d2d", 50e6)
    sim.run()
    assert sorted(spans(sim, "gpu0")) == [("m", 0.0, round(2 * d2d, 6)), ("memcpy_d2d", 0.0, round(2 * d2d, 6))]


def test_launch_latency_counts_from_when_the_launch_runs():
    """One core: thread b's launch waits for a's 50 us CPU op, runs 50..55, and its kernel starts at
    50 + 8 us launch latency, not at 0 + 8 (the request time) nor at 55."""
    sim = make(cores_per_socket=1)
    cpu = sim.topo.cpu_of("gpu0")
    a, b = sim.thread("a", cpu=cpu), sim.thread("b", gpu="gpu0", cpu=cpu)
    s = sim.gpu("gpu0").stream(0)
    a.cpu_op(50 * US, name="busy")  # asks for the core first
    b.launch(s, 10 * US, name="k")
    sim.run()
    assert ("launch k", 50.0, 55.0) in spans(sim, ".b")
    assert spans(sim, "stream0") == [("k", 58.0, 68.0)]


def test_h2d_copy_over_pcie_and_contention():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    gpu = sim.gpu("gpu0")
    s = gpu.stream(0)

    def prog():
        # 1 MB H2D over 50 GB/s PCIe (cpu0 -> pcie0 -> gpu0): 20 us, starts at launch + latency = 8 us
        yield t.memcpy(gpu, s, "h2d", 1e6, blocking=True)

    sim.env.process(prog())
    sim.run()
    assert spans(sim, "stream0") == [("memcpy_h2d", 8.0, 28.0)]
    assert ("memcpy h2d (blocking)", 5.0, 28.0) in spans(sim, "rank0")

    # two GPUs copying H2D at once share nothing (own PCIe switch); the same GPU twice shares its link
    sim = make()
    g0 = sim.gpu("gpu0")
    g0.memcpy(g0.stream(1), "h2d", 1e6)
    g0.memcpy(g0.stream(2), "h2d", 1e6)
    sim.run()
    assert sorted(spans(sim, "gpu0")) == [("memcpy_h2d", 0.0, 40.0), ("memcpy_h2d", 0.0, 40.0)]


def test_device_synchronize_waits_all_streams():
    sim = make()
    t = sim.thread("rank0", gpu="gpu0")
    gpu = sim.gpu("gpu0")

    def prog():
        yield t.launch(gpu.stream(1), 30 * US, name="a")   # 8..(shared)
        yield t.launch(gpu.stream(2), 10 * US, name="b")
        yield t.sync_device(gpu)
        return sim.now

    p = sim.env.process(prog())
    sim.run()
    last_end = max(e.end for e in sim.trace if "stream" in e.track)
    assert p.value == pytest.approx(last_end)


def test_engine_deterministic():
    def once():
        sim = make()
        t = sim.thread("rank0", gpu="gpu0")
        gpu = sim.gpu("gpu0")

        def prog():
            for i in range(5):
                yield t.launch(gpu.stream(i % 2), (i + 1) * US, name=f"k{i}", hbm_fraction=0.3 * (i % 3))
            yield t.sync_device(gpu)

        sim.env.process(prog())
        sim.run()
        return sim.trace

    assert once() == once()
