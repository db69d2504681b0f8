"""NCCL point-to-point through a GPU's NVLink port at NCCL's own NVLink rate (NcclParams.p2p_nvlink_factor,
cosim/engine/data/nccl_h100.yaml p2p_nvlink_bw: src/graph/topo.h SMxx_NVLINK_BW), worked by hand."""

from __future__ import annotations

from typing import Any

import pytest

from cosim.engine import SimConfig, Simulator
from cosim.engine.nccl import load_params
from cosim.topology import load_topology


def _run(preset: str, op: str, n: int, size: float) -> Any:
    topo = load_topology(preset)
    sim = Simulator(topo, SimConfig(record_trace=False))
    ev = sim.collective(op, list(topo.gpus)[:n], size)
    sim.run()
    return ev.value, sim


def test_factor_by_hand() -> None:
    p = load_params()
    # NVLink 5: 18 links x 40.1 GB/s = 721.8 GB/s of the port's 18 x 50 x 0.856 = 770.4 GB/s
    assert p.p2p_nvlink_factor("nvlink5", 18, 900e9 * 0.856) == pytest.approx(721.8 / 770.4)
    # NVLink 4: 18 x 20.6 = 370.8 GB/s is above the port's 450 x 0.77 = 346.5 GB/s: no limit
    assert p.p2p_nvlink_factor("nvlink4", 18, 450e9 * 0.77) == 1.0
    assert p.p2p_nvlink_factor("pcie5x16", 1, 64e9) == 1.0  # no NCCL NVLink constant: no limit


def test_gb200_alltoall_at_nccls_nvlink_rate() -> None:
    """4 GPUs of one GB200 tray, 8 GiB all-to-all: each GPU sends 3/4 x 8 GiB through its NVLink port at
    18 x 40.1 GB/s x the Simple efficiency (fitted 0.980878): 6442450944 / 708.0e9 = 9.099 ms, plus the
    p2p latency (a few us); before this rule the port's 770.4 GB/s gave 8.53 ms."""
    p = load_params()
    r, _ = _run("gb200-nvl72", "all_to_all", 4, 2.0**33)
    assert p.fitted is not None
    bw = 18 * 40.1e9 * p.fitted.efficiency["simple"]
    assert r.time == pytest.approx(2.0**33 * 3 / 4 / bw, rel=0.002)
    assert r.busbw == pytest.approx(bw, rel=0.002)


def test_h100_alltoall_unchanged() -> None:
    """8 x H100: the port (0.77 x 450 GB/s, NCCL's own send/recv) is below NCCL's 18 x 20.6 GB/s: the
    all-to-all runs at the port, 8 GiB x 7/8 / (346.5 GB/s x 0.980878) = 22.1 ms."""
    p = load_params()
    r, _ = _run("dgx-h100", "all_to_all", 8, 2.0**33)
    assert p.fitted is not None
    assert r.time == pytest.approx(2.0**33 * 7 / 8 / (450e9 * 0.77 * p.fitted.efficiency["simple"]), rel=0.002)


def test_b200_send_recv_and_ring_collectives() -> None:
    """The rule is NCCL p2p's: a B200 send/recv runs at 722 GB/s of wire bytes, a ring all-gather on the same
    GPUs keeps the port's 770 GB/s."""
    p = load_params()
    assert p.fitted is not None
    eff = p.fitted.efficiency["simple"]
    r, _ = _run("hgx-b200", "send_recv", 2, 2.0**32)
    assert r.time == pytest.approx(2.0**32 / (18 * 40.1e9 * eff), rel=0.003)
    r_ag, _ = _run("hgx-b200", "all_gather", 8, 2.0**33)
    assert r_ag.algo != "p2p"
    assert r_ag.busbw > 18 * 40.1e9 * eff * 1.02  # above NCCL's p2p NVLink rate: the port's rate


def test_a_faster_nvlink_what_if_scales_nccls_per_link_rate() -> None:
    """NCCL's per-link constants are for the real links: links built at twice the catalog's line rate (a 2x
    NVLink what-if) get twice NCCL's rate, so the cap still gives 721.8 / 770.4 of the faster port."""
    from cosim.engine.collectives import _line_scale

    p = load_params()
    assert _line_scale("nvlink5", 18, 18 * 100e9) == pytest.approx(2.0)
    assert _line_scale("nvlink5", 18, 18 * 50e9) == pytest.approx(1.0)
    assert _line_scale("no-such-link", 18, 1e12) == 1.0
    assert p.p2p_nvlink_factor("nvlink5", 18, 1800e9 * 0.856, scale=2.0) == pytest.approx(721.8 / 770.4)
    # without the scale, the 2x port would be capped at the real links' 721.8 GB/s: factor 0.47
    assert p.p2p_nvlink_factor("nvlink5", 18, 1800e9 * 0.856) == pytest.approx(721.8 / 1540.8)
