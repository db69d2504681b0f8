"""Published nccl-tests rows (validation/collectives/published): the targets hold on every row from 1 MiB
that no second measurement of the same setup contradicts (issue 17 point 2), and each contradicted row
says why."""

from __future__ import annotations

import numpy as np
import pytest


def test_published_rows_without_the_contradicted_ones_meet_the_targets() -> None:
    pub = pytest.importorskip("validation.collectives.published")
    clean: list[float] = []
    flagged = 0
    for sw in pub.load():
        bad = {int(k) for k in sw.get("conflict_rows") or []} if "conflict_rows" in sw else \
            ({int(r[0]) for r in sw["rows"]} if sw.get("conflict") else set())
        if sw.get("conflict"):
            assert "RESULTS.md" in sw["conflict"]  # the evidence is written down
        flagged += len(bad)
        clean += [abs(r["err"]) for r in pub.simulate(sw) if r["size"] >= pub.MIN_SIZE and r["size"] not in bad]
    assert flagged == 3  # Voltage Park's single-node all-gather and broadcast, the 2-node H200 16 MiB row
    assert max(clean) <= 0.20 and float(np.median(clean)) <= 0.08


def test_deepep_published_rows_stay_where_results_reports_them() -> None:
    """validation/moe_comm (issue 17 point 3): DeepEP's published H800 bandwidths (intranode EP8, internode
    EP16-64), nothing fitted. RESULTS.md reports 7 of 8 rows within the 10 % target, median 6.2 %, the one miss
    EP16 dispatch at -11.3 % (with the data that would close it); the intranode rows are NVLink-bound and the
    EP32/EP64 rows NIC-bound in cosim as in the published rows."""
    mc = pytest.importorskip("validation.moe_comm.run")
    rows = mc.rows()
    assert len(rows) == 8
    errs = {(r["ep"], r["kind"]): r["stated"]["err"] for r in rows}
    assert sum(abs(e) <= 0.10 for e in errs.values()) >= 7, errs
    assert abs(errs[(16, "dispatch")]) <= 0.12, errs
    assert float(np.median(np.abs(list(errs.values())))) <= 0.08, errs
    for r in rows:
        if r["ep"] == 8:
            assert r["nic_sim"] == 0.0 and r["nvl_sim"] > 100.0
        if r["ep"] >= 32:  # NIC-bound: the NIC near DeepEP's stated ~50 GB/s peak
            assert 40.0 < r["nic_sim"] < 50.0, r


def test_published_alltoall_rows() -> None:
    """Published nccl-tests alltoall_perf on GB200 / GB300 NVL72 (OCI, validation/collectives/published `alltoall`),
    held out. Across racks the all-to-all is bound by each GPU's one NDR NIC, worked by hand for 2 racks x 16
    trays: half of each GPU's peers are in the other rack, so it sends S x 64/128 through a 400 Gb/s port at
    the port's RDMA efficiency (0.94) x the Simple protocol's (fitted 0.980878): 8 GiB x 1/2 / (50e9 x 0.94 x
    0.980878) = 93.2 ms (published 95.0 ms). Inside one NVLink domain NCCL's p2p runs at NCCL's NVLink rate
    (18 x 40.1 GB/s): +3% to +25% (RESULTS.md, *Published all-to-all*; +10% to +33% at the port's rate)."""
    pub = pytest.importorskip("validation.collectives.published")
    sweeps = {sw["id"]: sw for sw in pub.load(kind="alltoall")}
    assert len(sweeps) == 8
    two = sweeps["gb200-2rack-alltoall-oci"]
    from cosim.topology import load_topology

    topo = load_topology(two["topology"])
    ranks = pub._ranks(topo, two)
    assert len(ranks) == 128 and sorted({topo.node_of(r) for r in ranks}) == [*range(16), *range(18, 34)]
    rows = {r["size"]: r for r in pub.simulate(two)}
    hand = 2**33 / 2 / (50e9 * 0.94 * 0.980878)
    assert rows[2**33]["sim_time_us"] == pytest.approx(hand * 1e6, rel=0.01)
    assert abs(rows[2**33]["err"]) <= 0.05
    nvl: list[float] = []
    for sw in sweeps.values():
        for r in pub.simulate(sw):
            if pub.nvlink_domain(sw):
                nvl.append(r["err"])
                assert 0.0 < r["err"] < 0.26, (sw["id"], r)  # NVLink-bound: cosim still fast (documented)
            else:
                assert abs(r["err"]) <= 0.15, (sw["id"], r)
    assert float(np.median(nvl)) <= 0.12
