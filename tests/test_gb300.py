"""The GB300 NVL72 presets (topologies/gb300-nvl72*.yaml) and the round-9 e2e rows that run on them."""

from __future__ import annotations

from pathlib import Path

GB = 1e9


def test_gb300_rack_loads_with_b300_gpus_and_connectx8() -> None:
    """One rack: 18 trays x 4 Blackwell Ultra GPUs (the catalog's gb300 (extends b300)), one 72-GPU NVLink5 domain (18 links x
    50 GB/s per GPU), NVLink-C2C to Grace, one ConnectX-8 800 Gb/s (100 GB/s) per GPU behind its own PCIe switch."""
    from cosim.topology import load_topology

    topo = load_topology("gb300-nvl72")
    f = topo.figures()
    assert (f["gpus"], f["nodes"], f["gpus_per_node"], f["nvlink_domain_gpus"]) == (72, 18, 4, 72)
    assert f["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB and f["per_gpu_scale_out_bw_Bps"] == 800 / 8 * GB
    assert f["per_gpu_host_bw_Bps"] == 900 / 2 * GB  # NVLink-C2C, as GB200
    acc = topo.accelerator(topo.gpus[0])
    assert "B300" in acc.name and float(acc.hbm_capacity) == 288e9
    # GPUDirect RDMA: GPU -> ConnectX-8's PCIe switch -> NIC, not through Grace
    (path,) = topo.paths("node3.gpu2", "node3.nic2")[:1]
    assert not any("cpu" in n for n in path), path


def test_gb300_racks_cut_to_a_job_and_scale(tmp_path: Path) -> None:
    """The e2e runner cuts GB300 racks as GB200's: 256 GPUs = 64 trays, 16 per rack, 4 NVLink domains joined by
    the ConnectX-8 fabric (XDR links); 64 GPUs: one rack cut to 16 trays; the 4-rack preset loads with 288 GPUs."""
    from cosim.engine.topoview import ClusterRouter
    from cosim.topology import load_topology
    from validation.e2e.run import _gb200

    assert len(load_topology("gb300-nvl72-4rack").gpus) == 288
    topo = load_topology(_gb200(256, tmp_path, "gb300"))
    f = topo.figures()
    assert len(topo.gpus) == 256 and f["nvlink_domain_gpus"] == 64 and f["links"]["ib-xdr"] >= 256
    assert f["per_gpu_scale_out_bw_Bps"] == 100 * GB
    router = ClusterRouter(topo)
    assert router("node16.gpu0", "node31.gpu3") == [["node16.gpu0", "fabric.nvswitch1", "node31.gpu3"]]
    assert any(n.startswith("fabric.leaf") for n in router("node15.gpu0", "node16.gpu0")[0])
    one = load_topology(_gb200(64, tmp_path, "gb300"))
    assert len(one.gpus) == 64 and one.figures()["nvlink_domain_gpus"] == 64


ROUND9_IDS = {
    "mb2511-dsv3-gb300-256-bf16", "mb2511-dsv3-gb300-256-mxfp8", "mb2511-gpt-oss-120b-gb300-64-bf16",
    "mb2511-qwen3-30b-gb300-8-mxfp8", "mb2511-qwen3-235b-gb300-256-bf16",
    "mb2602-dsv3-gb300-256-mxfp8", "mb2602-gpt-oss-120b-gb300-64-bf16", "mb2602-qwen3-30b-gb300-8-mxfp8",
    "mb2602-qwen3-235b-gb300-256-mxfp8",
    "mb2604-dsv3-gb300-256-mxfp8", "mb2604-gpt-oss-120b-gb300-64-bf16", "mb2604-qwen3-30b-gb300-8-mxfp8",
    "mb2604-qwen3-235b-gb300-256-mxfp8", "mb2604-kimi-k2-gb300-256-mxfp8",
    "mb2606-gpt-oss-120b-gb300-64-bf16", "mb2606-kimi-k2-gb300-256-mxfp8"}


def test_round9_rows_are_the_gb300_moe_rows_with_sources() -> None:
    """Round 9: every MoE row of Megatron-Bridge 25.11's and 26.02's DGX-GB300 tables, and the 26.04 / 26.06 GB300
    MoE rows cosim expresses (Kimi-K2 with its card), each with a source, a config, and a layout that divides."""
    from cosim.capture.config import load_model_config
    from validation.e2e.run import load_cases, microbatches

    sources, cases = load_cases()
    new = [c for c in cases if c.system == "gb300-nvl72"]
    assert {c.id for c in new} == ROUND9_IDS
    assert {"MB2604", "MB2604CFG", "MB2606", "MB2606CFG"} <= set(sources)
    for c in new:
        lay = c.layout
        assert c.config and c.source.row and c.gpus % (lay.tp * lay.pp * lay.cp) == 0 and microbatches(c) >= 1, c.id
    kimi = load_model_config("kimi-k2")
    assert (kimi.num_experts, kimi.top_k, kimi.num_heads, kimi.dense_layers, kimi.mtp_layers) == (384, 8, 64, 1, 0)
    assert abs(sum(kimi.param_counts().values()) / 1e12 - 1.03) < 0.01  # Kimi K2 report: 1.04T (1026.4 B counted)
