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
