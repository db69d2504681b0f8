"""DeepEP dispatch/combine model: traffic worked out by hand, flows on the fabric."""

from math import comb

import pytest

from cosim.engine import SimConfig, Simulator
from cosim.engine.moe_comm import (
    DeepEPRates,
    _flows,
    buffer_token_bytes,
    deepep,
    deepep_load,
    expected_traffic,
    token_bytes,
)


def test_token_bytes_by_hand() -> None:
    assert token_bytes(7168, "dispatch") == 7168 + 7168 / 128 * 4  # FP8 + fp32 scale per 128
    assert token_bytes(7168, "combine") == 2 * 7168
    with pytest.raises(ValueError):
        token_bytes(7168, "gather")


def test_buffer_token_bytes_from_deepep_layout() -> None:
    # intranode.cu channel buffers: FP8 payload + 56 fp32 scales + int32 src_idx + 8 int64 top-k idx + 8 fp32
    assert buffer_token_bytes(7168, "dispatch", 8, internode=False) == 7168 + 56 * 4 + 4 + 8 * 8 + 8 * 4
    assert buffer_token_bytes(7168, "combine", 8, internode=False) == 2 * 7168 + 4 + 8 * 4
    # internode.cu get_num_bytes_per_token: payload + SourceMeta (8) + scales + int32 idx + fp32 weights, 16 B
    assert buffer_token_bytes(7168, "dispatch", 8, internode=True) == 7472  # 7464 rounded up to 16
    assert buffer_token_bytes(7168, "combine", 8, internode=True) == 14384  # 14376 rounded up
    with pytest.raises(ValueError):
        buffer_token_bytes(7168, "gather", 8, internode=True)


def test_deepep_load_ep16_by_hand() -> None:
    """EP16 (2 nodes x 8) dispatch: with 2 node groups every token goes to both nodes (p_node), a GPU
    sends its own-node tokens to 7 peers and forwards its rail peer's tokens to 7 peers over NVLink
    (14 x T x p_rank x b), and its NIC carries only the other node's copy (T x p_node x b)."""
    t, b = 4096, 7472.0
    p_rank = 1 - comb(240, 8) / comb(256, 8)
    p_node = 1 - comb(128, 8) / comb(256, 8)
    load = deepep_load(2, 8, "dispatch", num_tokens=t, hidden=7168, num_topk=8, num_experts=256)
    assert load.nvlink_out == pytest.approx(14 * t * p_rank * b)
    assert load.nvlink_in == pytest.approx(load.nvlink_out)
    assert load.nic_out == pytest.approx(t * p_node * b)
    assert load.logical == pytest.approx(2 * t * p_node * token_bytes(7168, "dispatch"))
    # NVLink bytes per logical RDMA byte: ~2.9 at EP16 against ~1.8 at EP32 (why EP16 is NVLink-bound)
    ep32 = deepep_load(4, 8, "dispatch", num_tokens=t, hidden=7168, num_topk=8, num_experts=256)
    assert load.nvlink_out / load.logical == pytest.approx(2.90, abs=0.01)
    assert ep32.nvlink_out / ep32.logical == pytest.approx(1.78, abs=0.01)
    assert ep32.nic_out == pytest.approx(3 * t * (1 - comb(192, 8) / comb(256, 8)) * b)


def test_expected_traffic_by_hand() -> None:
    # 2 nodes x 2 ranks, 8 experts (2 per rank, 4 per node), top-2, both node groups allowed
    tr = expected_traffic(2, 2, 100, 2, 8, 2)
    p_rank = 1 - comb(6, 2) / comb(8, 2)  # 1 - 15/28
    p_node = 1 - comb(4, 2) / comb(8, 2)  # 1 - 6/28
    assert tr.rank_tokens[0, 3] == pytest.approx(100 * p_rank)
    assert tr.node_tokens[0, 1] == pytest.approx(100 * p_node)
    # one node group of two: half the tokens never reach a given node
    tr1 = expected_traffic(2, 2, 100, 2, 8, 1)
    assert tr1.node_tokens[0, 1] == pytest.approx(100 * 0.5)


def test_normal_internode_flows_go_once_per_node_then_forward() -> None:
    tr = expected_traffic(2, 2, 100, 2, 8, 2)
    per_node = [["a0", "a1"], ["b0", "b1"]]
    f = {(s, d): v for s, d, v in _flows(per_node, tr, 1.0, "normal")}
    p_rank, p_node = 100 * (1 - 15 / 28), 100 * (1 - 6 / 28)
    # a0 -> b0 (rail peer): once per node over RDMA, plus b0's own tokens from a0 (forwarded from itself: none)
    assert f[("a0", "b0")] == pytest.approx(p_node)
    assert ("a0", "b1") not in f  # no direct cross-rail RDMA
    # b0 forwards a0's tokens for b1 and b1's... : from a0 (rail 0) and its own node's b0 tokens to b1
    assert f[("b0", "b1")] == pytest.approx(p_rank + p_rank)
    ll = {(s, d): v for s, d, v in _flows(per_node, tr, 1.0, "low_latency")}
    assert ll[("a0", "b1")] == pytest.approx(p_rank)


def test_deepep_runs_on_the_fabric_and_combine_reverses() -> None:
    from cosim.topology import load_topology

    topo = load_topology("h800-8node")
    ranks = [g for g in topo.gpus][:16]
    res = {}
    for kind in ("dispatch", "combine"):
        sim = Simulator(topo, SimConfig(record_trace=False))
        ev = deepep(sim, kind, ranks, num_tokens=1024, hidden=7168, num_topk=8, num_experts=256)
        sim.run()
        res[kind] = ev.value
    assert res["dispatch"].time > 0
    # combine moves BF16 (2 bytes) where dispatch moves FP8 (1.03 bytes): about twice the time
    assert res["combine"].time / res["dispatch"].time == pytest.approx(2 / 1.03125, rel=0.15)
    # NVLink-bound single node: logical NVL bandwidth <= (8/7) x the 8-link NVLink capacity
    sim = Simulator(topo, SimConfig(record_trace=False))
    ev = deepep(sim, "dispatch", ranks[:8], num_tokens=1024, hidden=7168, num_topk=8, num_experts=256)
    sim.run()
    assert ev.value.rdma_bytes == 0
    assert ev.value.nvl_bw <= 8 / 7 * 8 * 25e9 * 1.001


def test_sim_collective_deepep_intranode_by_hand() -> None:
    """EP8 dispatch on one H800 node through ``sim.collective``: each rank sends 7 x T x p x b bytes to its
    peers over its 8 NVLinks (25 GB/s each x DeepEP's NVLink fraction 0.655) after the p2p launch latency,
    where
    p = 1 - C(224, 8) / C(256, 8) is the chance that one of a token's 8 experts (of 256) is on a given
    rank (32 experts) and b = 7492 bytes, DeepEP's intranode buffer bytes per token (FP8 payload, scales,
    source index, top-k indices and weights)."""
    from cosim.topology import load_topology

    topo = load_topology("h800-8node")
    sim = Simulator(topo, SimConfig(record_trace=False))
    ev = sim.collective("deepep_dispatch", list(topo.gpus)[:8], num_tokens=4096, hidden=7168, num_topk=8,
                        num_experts=256)
    sim.run()
    r = ev.value
    p = 1 - comb(224, 8) / comb(256, 8)
    b = 7492
    fit = sim.nccl_params.fitted
    want = fit.p2p_latency + 7 * 4096 * p * b / (8 * 25e9 * 0.655)
    assert r.time == pytest.approx(want, rel=1e-6)
    # DeepEP's NVL counts the rank's own tokens, at the FP8 payload + scale bytes
    assert r.nvl_bytes == pytest.approx(8 * 4096 * p * 7168 * (1 + 4 / 128))
    with pytest.raises(ValueError, match="nbytes"):
        sim.collective("deepep_combine", list(topo.gpus)[:8], 1e6, num_tokens=1, hidden=8, num_topk=1,
                       num_experts=8)


def test_cli_collective_deepep_json_and_bad_input() -> None:
    import json
    import subprocess
    import sys

    def cli(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cosim", "collective", "-t", "h800-8node", *a],
                              capture_output=True, text=True, timeout=120)

    out = cli("--op", "deepep_combine", "--ranks", "16", "--tokens", "512,1024", "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    rows = doc["results"]
    assert [r["tokens"] for r in rows] == [512, 1024] and doc["op"] == "deepep_combine"
    # twice the tokens: twice the bytes, and (bandwidth-bound) nearly twice the time
    assert rows[1]["nvl_bytes"] == pytest.approx(2 * rows[0]["nvl_bytes"])
    assert 1.8 < rows[1]["time_s"] / rows[0]["time_s"] <= 2.0
    assert rows[0]["rdma_bw_Bps"] > 0  # two nodes: RDMA
    bad = cli("--op", "deepep_dispatch", "--experts", "100")
    assert bad.returncode == 2 and "multiple of the 64 ranks" in bad.stderr and "Traceback" not in bad.stderr


def test_internode_forwarding_rate_and_nic_rate_by_hand() -> None:
    """EP16 dispatch on 2 H800 nodes: the NVLink forwarding runs at the kernel's rate per GPU (the cap
    ``forward_dispatch`` over its 7 destination warps), below DeepEP's NVLink fraction (0.655 x 200
    GB/s), so t = latency + NVLink bytes per GPU / forward_dispatch; with a fast forwarder the NIC binds
    instead: t = latency + NIC bytes / (50 GB/s x min(rdma, catalog 0.94))."""
    from cosim.cli.collective import pick_ranks
    from cosim.topology import load_topology

    topo = load_topology("h800-8node")
    kw = dict(num_tokens=4096, hidden=7168, num_topk=8, num_experts=256)
    load = deepep_load(2, 8, "dispatch", **kw)
    lat = Simulator(topo, SimConfig(record_trace=False)).nccl_params.fitted.p2p_latency
    times = {}
    for fwd in (100e9, 1e15):
        sim = Simulator(topo, SimConfig(record_trace=False))
        ev = deepep(sim, "dispatch", pick_ranks(topo, 16, 8), rates=DeepEPRates(forward_dispatch=fwd), **kw)
        sim.run()
        times[fwd] = ev.value.time
    assert times[100e9] == pytest.approx(lat + load.nvlink_out / 100e9, rel=1e-6)
    # no forwarding cap: NVLink at 131 GB/s (1.33 ms) and the NIC at DeepEP's 47 GB/s (0.65 ms) side by side
    assert load.nvlink_out / (0.655 * 200e9) > load.nic_out / (0.94 * 50e9)
    assert times[1e15] == pytest.approx(lat + load.nvlink_out / (0.655 * 200e9), rel=1e-6)


def test_repeated_calls_reuse_the_flows_and_time_alike() -> None:
    """A training step repeats one dispatch thousands of times: the simulator keeps its flows (and their link
    efficiencies) per group and parameters, so a second call, back to back, takes exactly the first one's time,
    and another token count is worked out afresh."""
    from cosim.engine.moe_comm import _FLOW_CACHE
    from cosim.topology import load_topology

    topo = load_topology("h800-8node")
    ranks = list(topo.gpus)[:16]
    sim = Simulator(topo, SimConfig(record_trace=False))
    kw = dict(num_tokens=1024, hidden=7168, num_topk=8, num_experts=256)
    first = deepep(sim, "dispatch", ranks, **kw)
    sim.run()
    second = deepep(sim, "dispatch", ranks, **kw)
    sim.run()
    assert len(_FLOW_CACHE[sim]) == 1
    assert second.value.time == pytest.approx(first.value.time, rel=1e-12)
    half = deepep(sim, "dispatch", ranks, **{**kw, "num_tokens": 512})
    sim.run()
    assert len(_FLOW_CACHE[sim]) == 2 and half.value.time < first.value.time


def test_hybridep_load_by_hand() -> None:
    """HybridEP (one NVLink domain of 4 ranks, 8 experts, top-2, 100 tokens per rank, hidden 64): a token goes once
    to each rank holding one of its experts, p = 1 - C(6, 2) / C(8, 2) = 13/28, with its BF16 row (128 B) and, in
    the forward dispatch, the fp32 probabilities of the domain's 8 experts (32 B)."""
    from cosim.engine.moe_comm import hybridep_load, hybridep_token_bytes

    p = 1 - comb(6, 2) / comb(8, 2)
    assert p == pytest.approx(13 / 28)
    assert hybridep_token_bytes(64, 8) == 128 + 32 and hybridep_token_bytes(64) == 128
    ld = hybridep_load(1, 4, "dispatch", num_tokens=100, hidden=64, num_topk=2, num_experts=8, prob_row=8)
    assert ld.nvlink_out == pytest.approx(3 * 100 * p * 160) and ld.nvlink_in == pytest.approx(ld.nvlink_out)
    assert ld.nic_out == ld.nic_in == 0
    assert ld.logical == pytest.approx(4 * 100 * p * 128)  # HybridEP's NVL metric: own tokens, no probabilities
    # two domains of 2: once per destination domain to the rail peer (no domain limit: every token reaches the
    # other domain when one of its 2 experts is there, 1 - C(4, 2) / C(8, 2)), forwarded over NVLink
    two = hybridep_load(2, 2, "combine", num_tokens=100, hidden=64, num_topk=2, num_experts=8)
    assert two.nic_out == pytest.approx(100 * (1 - comb(4, 2) / comb(8, 2)) * 128)


def test_hybridep_intranode_reproduces_its_published_kernel_rate() -> None:
    """HybridEP's README benchmark setup (4096 tokens, hidden 7168, top-8 of 64 experts, forward dispatch with
    probabilities, 16 SMs) on 8 B200: each rank writes 7 x 4096 x p rows of 14336 + 4 x 64 bytes to its peers at
    the GB200 16-SM table's NVLink fraction (the same NVLink 5), after the p2p launch latency. Its NVL metric
    (received BF16 bytes, own included) over the kernel time is the GB200 table's 750 GB/s the fraction was taken
    from (a round trip: it checks the flows, not the rate); the combine is the reverse, no probabilities, at the
    combine fraction (684 GB/s); 32 SMs take the 32-SM table (764 GB/s). Held out: the same README's B200 table
    (deepseek-ai/DeepEP hybrid-ep @94a9f8f docs/README_Hybrid-EP.md, "B200 Platform", 8 ranks, 16 SMs, kernel
    time only) measured 734.95 GB/s dispatch (BF16) and 673.84 GB/s combine: within 3 %."""
    from cosim.engine.moe_comm import HYBRIDEP_RATES, hybridep, hybridep_rates, nvlink_domains
    from cosim.topology import load_topology

    topo = load_topology("hgx-b200")
    gpus = list(topo.gpus)
    p = 1 - comb(56, 8) / comb(64, 8)
    for kind, probs, rates, metric in (("dispatch", True, HYBRIDEP_RATES, 750.15e9),
                                       ("combine", False, HYBRIDEP_RATES, 684.27e9),
                                       ("dispatch", True, hybridep_rates(32), 764.03e9)):
        sim = Simulator(topo, SimConfig(record_trace=False))
        assert [len(d) for d in nvlink_domains(sim, gpus)] == [8]
        ev = hybridep(sim, kind, gpus, num_tokens=4096, hidden=7168, num_topk=8, num_experts=64, probs=probs,
                      rates=rates)
        sim.run()
        r = ev.value
        tb = 14336 + (4 * 64 if probs else 0)
        lat = sim.nccl_params.fitted.p2p_latency
        want = lat + 7 * 4096 * p * tb / (900e9 * rates.nvlink_fraction(kind, 8))
        assert r.time == pytest.approx(want, rel=1e-6) and r.rdma_bytes == 0
        assert 8 * 4096 * p * 14336 / (r.time - lat) == pytest.approx(metric, rel=1e-6)
        sms = 16 if rates is HYBRIDEP_RATES else 32
        b200 = {("dispatch", 16): 734.95e9, ("combine", 16): 673.84e9}.get((kind, sms))
        if b200 is not None:  # the held-out B200 row (kernel time: the latency is not in the kernel)
            assert 8 * 4096 * p * 14336 / (r.time - lat) == pytest.approx(b200, rel=0.03)
    with pytest.raises(ValueError, match="kind"):
        hybridep(Simulator(topo, SimConfig(record_trace=False)), "gather", gpus, num_tokens=1, hidden=8,
                 num_topk=1, num_experts=8)


def test_hybridep_torch_api_rows_are_the_kernel_plus_the_non_permute_copies() -> None:
    """HybridEP's README "Torch API" rows (B200 and GB200, 8 ranks, 16 SMs, BF16; both held out, nothing is fitted
    on them) time each Python call with CUDA events around it (tests/utils.py ``bench``) and are 126-161 us per
    call slower than the same README's kernel-only rows. The rows date from the commit that published them
    (deepseek-ai/DeepEP hybrid-ep @6ad6896, tests/test_mnnvlink_hybridep.py, unchanged in the README since): the
    non-permute API, ``buffer.dispatch`` without a handle and ``buffer.combine``. csrc/hybrid_ep.cu there: the
    dispatch builds the routing map (zeros + scatter, probabilities likewise), all-gathers it (NCCL), runs the
    metadata preprocessing kernel, blocks on ``.item()`` (the received-token count), launches the dispatch kernel
    and then copies the received tokens and probabilities out of the registered buffer into new tensors
    (``cudaMemcpyAsync`` device-to-device, 310 MB); the combine first copies its input into the registered buffer
    (the same 310 MB), then runs the combine kernel. cosim's pieces for that sequence (the engine's kernel and
    all-gather, a copy as an elementwise read + write at cosim's memory model, the preprocessing as a reduction
    over the gathered map, the sync's return and the next launch) give each call within 8 %. The copies are most
    of the gap and are not in the path Megatron-Core runs: ``dispatch_with_permute`` / ``combine_with_unpermute``
    (eb9cee7 executor.cu: "Use permute kernel to avoid standalone D2D memory copy") read from / write into the
    buffer from the permute / unpermute kernels cosim already charges (``costs.hybridep_dispatch_ops``), so the
    model adds no per-call time."""
    import numpy as np

    from cosim.engine.moe_comm import hybridep
    from cosim.models.calibrated import HardwareFigures, memory_time
    from cosim.models.predict import _default_profile
    from cosim.topology import load_topology

    p = 1 - comb(56, 8) / comb(64, 8)
    recv = 8 * 4096 * p  # tokens a rank receives (own included)
    metric = recv * 14336  # the README's NVL metric (received BF16 bytes)
    published = {"hgx-b200": {"dispatch": (535.94e9, 734.95e9), "combine": (530.86e9, 673.84e9)},
                 "gb200-nvl72": {"dispatch": (550.10e9, 750.15e9), "combine": (538.44e9, 684.27e9)}}
    for name, rows in published.items():
        topo = load_topology(name)
        gpus = list(topo.gpus)[:8]
        acc = topo.accelerator(gpus[0])
        hw, prof = HardwareFigures.of(acc), _default_profile(acc)

        def mem(nbytes: float, cls: str = "elementwise") -> float:
            return float(memory_time(np.array([nbytes]), hw.hbm_bandwidth, prof.params(cls))[0])  # noqa: B023

        copies = mem(2 * recv * 14336) + mem(2 * recv * 64 * 4)  # tokens and probabilities, read + write
        for kind, (api, kernel) in rows.items():
            sim = Simulator(topo, SimConfig(record_trace=False))
            ev = hybridep(sim, kind, gpus, num_tokens=4096, hidden=7168, num_topk=8, num_experts=64, probs=True)
            sim.run()
            t = ev.value.time + copies
            if kind == "dispatch":
                sim = Simulator(topo, SimConfig(record_trace=False))
                ag = sim.collective("all_gather", gpus, 8 * 4096 * 64)  # the bool routing map [tokens, experts]
                sim.run()
                t += (4 * mem(2 * 4096 * 64 * 4) + ag.value.time + mem(2 * 8 * 4096 * 64, "reduction")
                      + 3e-6 + 4.6e-6)  # routing map / probs built, all-gather, preprocessing, sync + launch
            want = metric / api
            assert metric / kernel < want  # the gap the reviewer saw: 126-161 us a call
            assert t == pytest.approx(want, rel=0.08), (name, kind, t * 1e6, want * 1e6)
            assert t - ev.value.time > 0.6 * (want - metric / kernel)  # the copies etc. are most of the gap


def test_hybridep_across_two_nodes_crosses_the_network_once_per_node() -> None:
    """EP16 over two DGX H100 (two NVLink domains): RDMA flows go only between rail peers (same local index)."""
    from cosim.engine.moe_comm import hybridep, nvlink_domains
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, None, None, 2)
    sim = Simulator(topo, SimConfig(record_trace=False))
    gpus = list(topo.gpus)
    assert [len(d) for d in nvlink_domains(sim, gpus)] == [8, 8]
    ev = hybridep(sim, "dispatch", gpus, num_tokens=1024, hidden=2048, num_topk=8, num_experts=128, probs=True)
    sim.run()
    r = ev.value
    assert r.rdma_bytes > 0 and r.time > 0
    # DeepEP's RDMA metric: tokens x destination nodes (own included); a token has one of its 8 experts on a
    # given node with probability 1 - C(64, 8) / C(128, 8); a row carries the domain's 64 probabilities
    assert r.rdma_bytes == pytest.approx(1024 * 2 * (1 - comb(64, 8) / comb(128, 8)) * (4096 + 4 * 64))


def test_hybridep_across_two_h100_nodes_runs_at_the_published_ib_rate() -> None:
    """HybridEP's RDMA part at the rate HybridEP's README measured on H100 (deepseek-ai/DeepEP docs/README_Hybrid-EP.md
    @41cad94, "H100 Platform", kernel only, BF16, 16 SMs, 16 ranks: dispatch 71.71 GB/s, combine 62.95 GB/s of its
    IB metric). By hand, the README's own shape on two DGX H100 (4096 tokens per rank, hidden 7168, top-8 of 128
    experts): a token routes to a given node with p = 1 - C(64, 8) / C(128, 8) = 0.99690; the IB metric counts
    (token, node) pairs with the own node, 4096 x 2p x 14336 bytes = 117.1 MB per rank, of which half crosses the
    400 Gb/s NIC: fraction 71.71 / 2 / 50 = 0.7171 (dispatch, x (1 + 4 x 64 / 14336) for the 64 probabilities a
    row carries: 0.7299), 62.95 / 2 / 50 = 0.6295 (combine). The RDMA write of 4096 p x (14336 + 256) bytes =
    59.58 MB then takes 1.633 ms (dispatch) and 4096 p x 14336 / (0.6295 x 50e9) = 1.860 ms (combine), longer
    than each rank's NVLink part, so the kernel time is the p2p latency plus that, and the IB metric over it
    gives back the published figures (a round trip: it checks the flows and the row taken, not the rate).
    32 and 64 ranks (4 and 8 domains) take their rows (0.88 / 0.86, 0.89 / 0.87); the former flat 0.94 (an NVSHMEM put benchmark)
    was 29 % / 49 % above what HybridEP's own kernels reach at two nodes."""
    from cosim.engine.moe_comm import HYBRIDEP_RATES, hybridep
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, None, None, 2)
    gpus = list(topo.gpus)
    p = 1 - comb(64, 8) / comb(128, 8)
    assert p == pytest.approx(0.99690, abs=1e-5)
    assert HYBRIDEP_RATES.rdma_fraction("dispatch", 2) == pytest.approx(0.7171 * (1 + 256 / 14336), rel=1e-4)
    assert HYBRIDEP_RATES.rdma_fraction("combine", 2) == pytest.approx(0.6295, rel=1e-4)
    assert HYBRIDEP_RATES.rdma_fraction("dispatch", 6) == HYBRIDEP_RATES.rdma_fraction("dispatch", 4)
    assert HYBRIDEP_RATES.rdma_fraction("combine", 16) == HYBRIDEP_RATES.rdma_fraction("combine", 8)
    for kind, probs, metric, ms in (("dispatch", True, 71.71e9, 1.633), ("combine", False, 62.95e9, 1.860)):
        sim = Simulator(topo, SimConfig(record_trace=False))
        ev = hybridep(sim, kind, gpus, num_tokens=4096, hidden=7168, num_topk=8, num_experts=128, probs=probs)
        sim.run()
        r = ev.value
        lat = sim.nccl_params.fitted.p2p_latency
        assert (r.time - lat) * 1e3 == pytest.approx(ms, rel=2e-3)
        assert 4096 * 2 * p * 14336 / (r.time - lat) == pytest.approx(metric, rel=2e-3)


def test_hybridep_rdma_row_is_keyed_by_domains_not_ranks() -> None:
    """The H100 IB table's 16 / 32 / 64 ranks are 2 / 4 / 8 nodes of 8, and a rank's RDMA sends go once per remote
    NVLink domain, so a group's row is its domain count's. EP32 over two GB200 NVL72 racks (16 ranks in each, the
    racks' 400 Gb/s ConnectX-7) is the table's two-node case: combine fraction 0.6295, not the 32-rank row's 0.86.
    By hand: 4 experts per rank, 64 per rack; a token routes to the other rack with p = 1 - C(64, 8) / C(128, 8),
    so each rank writes 4096 p x 14336 B = 58.54 MB over its NIC: 58.54e6 / (0.6295 x 50e9) = 1.860 ms (the
    NVLink part, 15 peers at NVLink 5, is shorter)."""
    from cosim.engine.moe_comm import HYBRIDEP_RATES, hybridep, nvlink_domains
    from cosim.scenario import build_topology

    assert HYBRIDEP_RATES.rdma_fraction("combine", 2) == pytest.approx(0.6295, rel=1e-4)
    assert HYBRIDEP_RATES.rdma_fraction("combine", 4) > 0.85
    topo = build_topology("gb200-nvl72", None, None, None, 36)
    gpus = list(topo.gpus)
    ranks = gpus[:16] + gpus[72:88]
    sim = Simulator(topo, SimConfig(record_trace=False))
    assert [len(d) for d in nvlink_domains(sim, ranks)] == [16, 16]
    ev = hybridep(sim, "combine", ranks, num_tokens=4096, hidden=7168, num_topk=8, num_experts=128, probs=False)
    sim.run()
    p = 1 - comb(64, 8) / comb(128, 8)
    lat = sim.nccl_params.fitted.p2p_latency
    assert (ev.value.time - lat) * 1e3 == pytest.approx(4096 * p * 14336 / (0.6295 * 50e9) * 1e3, rel=2e-3)
    assert (ev.value.time - lat) * 1e3 == pytest.approx(1.860, rel=2e-3)
