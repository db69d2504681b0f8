"""NCCL's network channels vs the NIC's wire (issue 17, round 5): worked cases by hand.

The ib-ndr link carries the wire's RDMA write rate (0.94 x 50 GB/s); a NCCL channel moves at most
``net_channel_bw`` (18.30 GB/s of wire bytes: vidur's 35.9 GB/s of payload on 2 channels / Simple's efficiency) over the network; a point-to-point peer pair across nodes
runs on 2 channels (NCCL_NCHANNELS_PER_NET_PEER), a ring on 2 channels per NDR NIC (NCCL's search plus
its duplications). So a lone send/recv runs at 2 x 18.30 x the Simple efficiency = 35.9 GB/s, an all-to-all over many
peers at the wire, and a multi-node ring at 8 NICs x 2 channels.
"""

from __future__ import annotations

import pytest

from cosim.engine import SimConfig, Simulator, load_params
from cosim.topology import load_topology

WIRE = 50e9 * 0.94  # ib-ndr: 400 Gb/s x the RDMA write efficiency
S = 256 * 2**20


def _sim() -> Simulator:
    return Simulator(load_topology("dgx-h100-4node"), SimConfig(record_trace=False))


def _time(op: str, ranks: list[str], nbytes: float) -> float:
    sim = _sim()
    ev = sim.collective(op, ranks, nbytes)
    sim.run()
    return float(ev.value.time)


def _gpus(nodes: int) -> list[str]:
    topo = load_topology("dgx-h100-4node")
    from cosim.cli.collective import pick_ranks

    return list(pick_ranks(topo, 8 * nodes, 8))


def _simple_eff() -> float:
    p = load_params()
    assert p.fitted is not None
    return p.fitted.efficiency["simple"]


def test_net_channels_by_nccls_rules() -> None:
    """p2p: 2 per peer, halved while 2 x nranks > 4 x p2pnChannels (16); rings: 2 per NDR NIC (1 searched
    at 48 GB/s, doubled by ncclTopoPostset), 4 per XDR NIC (2 searched, doubled); a 4-NIC node duplicates
    in the search too (4 channels is not more than 4)."""
    p = load_params()
    assert p.net_channel_bw == pytest.approx(18.30e9)
    assert p.net_channels("p2p", 2, 50e9) == 2
    assert p.net_channels("p2p", 32, 50e9) == 2  # 2 x 32 = 64 <= 64
    assert p.net_channels("p2p", 33, 50e9) == 1
    assert p.net_channels("ring", 16, 50e9, 8) == 2
    assert p.net_channels("ring", 16, 100e9, 8) == 4
    assert p.net_channels("ring", 8, 50e9, 4) == 4
    assert p.net_flow_cap("p2p", 2, 50e9) == pytest.approx(2 * 18.30e9)
    assert p.net_flow_cap("normal", 16, 50e9) == float("inf")  # DeepEP's kernels are not NCCL's


def test_lone_send_recv_across_two_nodes_at_ncclS_two_channels() -> None:
    """One GPU to one GPU on another node: 2 channels x 18.30 GB/s x Simple's efficiency = 35.9 GB/s of
    payload (vidur's measured 35.9 GB/s at 64 MiB), below the wire's 47: the extra S bytes take
    S / 35.9 GB/s."""
    g = _gpus(2)
    a, b = g[0], g[8]
    rate = 2 * 18.30e9 * _simple_eff()
    assert rate == pytest.approx(35.9e9, rel=1e-3)
    dt = _time("send_recv", [a, b], 2 * S) - _time("send_recv", [a, b], S)
    assert dt == pytest.approx(S / rate, rel=1e-3)
    assert S / dt < 0.8 * WIRE


def test_many_peer_all_to_all_reaches_the_wire() -> None:
    """All-to-all over 2 nodes x 8 GPUs: each rank sends S/16 to each of 8 peers on the other node, S/2
    through its NIC in 8 peer pairs of 5.8 GB/s each (each far below its 2-channel cap), so the NIC's wire
    binds: the extra S per rank takes (S / 2) / (0.94 x 50 GB/s x Simple's efficiency)."""
    g = _gpus(2)
    dt = _time("all_to_all", g, 2 * S) - _time("all_to_all", g, S)
    assert dt == pytest.approx((S / 2) / (WIRE * _simple_eff()), rel=0.02)


def test_multinode_ring_at_two_channels_per_nic() -> None:
    """Ring all-gather over 2 nodes x 8 GPUs: one ring per rail, each crossing its NIC at 2 channels x
    18.30 GB/s x Simple's efficiency; the 8 rings carry (n - 1) / n of the output each way per rank, so
    busbw = 8 x 35.9 GB/s and the extra S takes (15 / 16) S / (8 x 35.9 GB/s)."""
    g = _gpus(2)
    sim = _sim()
    a, _ = sim.collectives.choose("all_gather", g, float(S), "auto", "auto", None)
    assert a == "ring"
    dt = _time("all_gather", g, 2 * S) - _time("all_gather", g, S)
    assert dt == pytest.approx((15 / 16) * S / (8 * 2 * 18.30e9 * _simple_eff()), rel=0.02)
