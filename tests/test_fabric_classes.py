"""Flow classes (`FabricConfig.flow_classes`): one row per class of equivalent flows agrees with per-flow rows."""

from __future__ import annotations

import numpy as np
import pytest

from cosim.engine import FabricConfig, NcclConfig, SimConfig, Simulator
from cosim.topology import load_topology

N = 64
PER_RANK = 64 * 2**20


def _run(kind: str, classes: bool) -> tuple[float, np.ndarray, np.ndarray, Simulator]:
    """``kind`` among the first 64 GPUs of dgx-h100-32node: "equal" (nccl-tests' all-to-all), "uneven" (an
    all-to-allv with seeded random splits), "mixed" (the all-to-all, and 0.2 ms later an all-reduce on 16 of
    its ranks, whose ring crosses part of the all-to-all's links) or "repeated" (mixed twice in a row). Returns the end time, every link's bytes and
    busy time, and the simulator."""
    topo = load_topology("dgx-h100-32node")
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False,
                                    fabric=FabricConfig(coalesce=False, flow_classes=classes)))
    g = topo.gpus[:N]
    if kind == "uneven":
        w = np.random.default_rng(0).random((N, N))
        np.fill_diagonal(w, 0.0)
        sim.collective("all_to_allv", g, matrix=w / w.sum(axis=1, keepdims=True) * PER_RANK, proto="simple")
    elif kind != "repeated":
        sim.collective("all_to_all", g, PER_RANK, proto="simple")
    if kind == "mixed":
        def later():  # type: ignore[no-untyped-def]
            yield sim.env.timeout(2e-4)
            yield sim.collective("all_reduce", g[:16], 256 * 2**20, proto="simple")

        sim.env.process(later())
    if kind == "repeated":  # "mixed" twice more, one after the other: later starts begin as the learned split
        def again():  # type: ignore[no-untyped-def]
            yield sim.env.timeout(2e-4)
            yield sim.collective("all_reduce", g[:16], 256 * 2**20, proto="simple")

        def rep():  # type: ignore[no-untyped-def]
            for _ in range(2):
                sim.env.process(again())
                yield sim.collective("all_to_all", g, PER_RANK, proto="simple")

        sim.env.process(rep())
    sim.run()
    st = sim.fabric.link_stats()
    return sim.env.now, np.array([s.bytes for s in st]), np.array([s.busy_time for s in st]), sim


@pytest.mark.parametrize("kind", ["equal", "uneven", "mixed", "repeated"])
def test_flow_classes_agree_with_per_flow_rows(kind: str) -> None:
    t_ref, b_ref, busy_ref, ref = _run(kind, False)
    t, b, busy, sim = _run(kind, True)
    assert t == pytest.approx(t_ref, rel=1e-9, abs=0.0)
    assert np.allclose(b, b_ref, rtol=1e-9, atol=1e-6)
    assert np.allclose(busy, busy_ref, rtol=1e-9, atol=1e-15)
    f, fr = sim.fabric, ref.fabric
    assert fr.n_class_rows == 0
    if kind == "equal":  # the intra- and inter-node pairs: a few class rows, never split
        assert 0 < f.n_class_rows <= 4 and f.n_class_splits == 0
        assert f.n_rows_solved <= 8 < fr.n_rows_solved
    elif kind == "uneven":  # every flow has its own size: no class, the same rows as per-flow
        assert f.n_class_rows == 0 and f.n_rows_solved == fr.n_rows_solved
    elif kind == "mixed":  # the all-reduce loads part of the classes' links: they split (sub-classes and rows)
        assert f.n_class_splits > 0
        assert f.n_rows_solved < fr.n_rows_solved
    else:  # the second all-to-all (a prepared batch) starts as the first one split: no split again
        assert 0 < f.n_class_splits <= 3
        assert f.n_rows_solved < fr.n_rows_solved / 10


def test_flow_classes_off_on_scratch_fabric() -> None:
    """Coalesced collectives' memo runs (a scratch fabric whose rows may be materialized on the main one) keep
    per-flow rows."""
    topo = load_topology("dgx-h100-32node")
    sim = Simulator(topo, SimConfig(record_trace=False, fabric=FabricConfig(flow_classes=True)))
    assert sim.fabric.flow_classes
    assert not sim.collectives._scratch_sim().fabric.flow_classes


@pytest.mark.parametrize("cap_gbps", [1.0, 40.0])
def test_a_class_at_its_rate_cap_passes_the_check(cap_gbps: float) -> None:
    """Every GPU pair of two DGX H100 nodes, 64 MiB each, capped at ``cap_gbps`` GB/s: the intra- and inter-node
    pairs form classes. At 1 GB/s every flow runs at its cap (no link saturates: the check passes by the cap
    test alone, no split) and ends at its route's latency + bytes / cap; at 40 GB/s the inter-node pairs share
    their NICs (8 pairs x 40 GB/s > 50 GB/s) and the intra-node ones stay capped. Either way the end time is
    the per-flow one within the documented 1e-9."""
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    cap = cap_gbps * 1e9
    out = []
    for classes in (False, True):
        sim = Simulator(topo, SimConfig(record_trace=False, fabric=FabricConfig(coalesce=False, flow_classes=classes)))
        fab = sim.fabric
        g = topo.gpus
        segs = np.array([[fab.pair_segment(a, b), -1, -1] for a in g for b in g if a != b], dtype=np.int64)
        lat = max(fab._seg_lat[s] for s in segs[:, 0].tolist())  # (each route: one segment)
        fab.start_rows(segs, np.full(len(segs), float(PER_RANK)), max_rate=cap)
        sim.run()
        out.append((sim.env.now, fab.n_class_rows, fab.n_class_splits, lat))
    (t_ref, rows_ref, _, lat), (t, rows, splits, _) = out
    assert rows_ref == 0 and rows >= 2
    assert t == pytest.approx(t_ref, rel=1e-9, abs=0.0)
    if cap_gbps == 1.0:
        assert splits == 0 and t == pytest.approx(lat + PER_RANK / cap, rel=1e-12)


def _crossing_twice(seed: int, classes: bool) -> tuple[float, np.ndarray, np.ndarray, int, int]:
    """1-3 batches of 20-200 GPU-pair flows of two DGX H100, seeded: a third route over their pair segment twice
    (they cross each of its links twice), a fifth add another pair's segment, most 16 MiB (else 32 MiB), half
    the batches capped (5, 20 or 1000 GB/s), a fifth of the rows of multiplicity 2; the batches start within
    0.1 ms. Returns the end time, every link's bytes and busy time, and the class rows and splits."""
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    g = list(topo.gpus)
    rng = np.random.default_rng(seed)
    sim = Simulator(topo, SimConfig(record_trace=False, fabric=FabricConfig(coalesce=False, flow_classes=classes)))
    fab = sim.fabric
    pairs = [(a, b) for a in g for b in g if a != b]

    def batch(delay: float, k: int):  # type: ignore[no-untyped-def]
        yield sim.env.timeout(delay)
        segs = np.full((k, 3), -1, dtype=np.int64)
        for i, j in enumerate(rng.choice(len(pairs), size=k, replace=False).tolist()):
            segs[i, 0] = fab.pair_segment(*pairs[j])
            r = rng.random()
            if r < 0.3:
                segs[i, 1] = segs[i, 0]
            elif r < 0.5:
                segs[i, 1] = fab.pair_segment(*pairs[int(rng.integers(len(pairs)))])
        nb = np.where(rng.random(k) < 0.8, 2.0**24, 2.0**25)
        cap = np.where(rng.random(k) < 0.5, float(rng.choice([5e9, 20e9, 1e12])), np.inf)
        yield fab.start_rows(segs, nb, max_rate=cap, multiplicity=np.where(rng.random(k) < 0.2, 2.0, 1.0))

    for _ in range(int(rng.integers(1, 4))):
        sim.env.process(batch(float(rng.random()) * 1e-4, int(rng.integers(20, 200))))
    sim.run()
    st = fab.link_stats()
    return (sim.env.now, np.array([s.bytes for s in st]), np.array([s.busy_time for s in st]), fab.n_class_rows,
            fab.n_class_splits)


@pytest.mark.parametrize("seed", [1, 4, 9])
def test_classes_of_flows_that_cross_a_link_twice_agree_with_per_flow_rows(seed: int) -> None:
    """Flow classes whose members cross their links twice (a route of one segment given twice: its links
    weighted 2 in the class segment), share NIC links with each other and with other classes, run at caps
    near or far from their share and are split after later batches load their links: the end time and every
    link's bytes and busy time are the per-flow rows' within the documented 1e-9."""
    t_ref, b_ref, busy_ref, rows_ref, _ = _crossing_twice(seed, False)
    t, b, busy, rows, splits = _crossing_twice(seed, True)
    assert rows_ref == 0 and rows > 0 and splits > 0
    assert t == pytest.approx(t_ref, rel=1e-9, abs=0.0)
    assert np.allclose(b, b_ref, rtol=1e-9, atol=1e-6)
    assert np.allclose(busy, busy_ref, rtol=1e-9, atol=1e-15)


def _a2a_rows(n: int) -> tuple[Simulator, np.ndarray]:
    """A simulator on dgx-h100-32node and the route segments of an all-to-all among its first ``n`` GPUs."""
    topo = load_topology("dgx-h100-32node")
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(use_calibration=False), record_trace=False))
    ii, jj = np.divmod(np.arange(n * n), n)
    off = ii != jj
    return sim, sim.fabric.route_segments(topo.gpus[:n], ii[off], jj[off])


def test_a_kept_class_partition_gives_the_rows_of_a_fresh_one() -> None:
    """``start_rows(classes=key)``: a partition kept under a key is reused when the bytes order the rows alike,
    with the rows and class segments a fresh formation gives and fresh classes; bytes that order them otherwise
    (two rows that were equal now differ) form anew, as without a key."""
    sim, segs = _a2a_rows(32)
    f = sim.fabric
    k = len(segs)
    lat, mult, cap = np.zeros(k), np.ones(k), np.full(k, np.inf)
    wire = np.full(k, 1e6)
    wire[:40] = 2e6  # two byte sizes: the groups are (bytes, segment count)

    def same(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
        for x, y in zip(a[:5], b[:5]):
            assert np.array_equal(x, y)
        assert [c.sid for c in a[5]] == [c.sid for c in b[5]]
        assert all(np.array_equal(c.segs, d.segs) and np.array_equal(c.mult, d.mult) for c, d in zip(a[5], b[5]))

    fresh = f._form_classes(segs, wire, lat, mult, cap)
    assert len(fresh[5]) >= 2
    first = f._form_classes(segs, wire, lat, mult, cap, ("key",))
    same(first, fresh)
    first[5][0].split = (np.zeros(0, dtype=np.int64), [])  # learned by the first start: not carried over
    w2 = wire * 0.5  # the same order: reused
    again = f._form_classes(segs, w2, lat, mult, cap, ("key",))
    same(again, f._form_classes(segs, w2, lat, mult, cap))
    assert all(c.split is None and c is not d for c, d in zip(again[5], first[5]))
    w3 = wire.copy()
    w3[100] = 3e6  # one row of a group leaves it: not the kept partition
    assert f._reuse_partition(f._cls_parts[("key",)], segs, w3, lat, mult, cap) is None
    same(f._form_classes(segs, w3, lat, mult, cap, ("key",)), f._form_classes(segs, w3, lat, mult, cap))


def test_peaks_sampled_on_the_batch_links_equal_peaks_sampled_on_every_link(monkeypatch: pytest.MonkeyPatch) -> None:
    """`_sample_peak` takes `max(peak, rint(flow count))` on a starting batch's links and on the links of class
    splits since the last sample; at every batch start of runs with class splits (and learned splits) the peaks
    must equal that maximum taken over every link. (It fails when a batch's links are not sampled; a split changes
    no rounded count on these runs, so the split links' sample is exact by construction, not shown here.)"""
    from cosim.engine.flows import Fabric

    orig = Fabric._sample_peak
    n = [0]

    def checked(self: Fabric, lk: np.ndarray) -> None:
        want = np.maximum(self.peak_flows, np.rint(self._nflows).astype(np.int64))
        orig(self, lk)
        assert np.array_equal(self.peak_flows, want)
        n[0] += 1

    monkeypatch.setattr(Fabric, "_sample_peak", checked)
    splits = 0
    for kind in ("mixed", "repeated"):
        splits += _run(kind, True)[3].fabric.n_class_splits
    assert n[0] > 10 and splits > 0
