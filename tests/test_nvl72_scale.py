"""``nodes:`` scales the GB200/GB300 NVL72 presets (issue 15 point 6): a node is one 4-GPU compute tray,
18 trays per NVLink rack, racks joined by the preset's rail-optimized scale-out fabric."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.errors import CosimInputError

GB = 1e9


def test_two_gb200_racks_one_nvlink_domain_each_joined_by_the_fabric() -> None:
    from cosim.scenario import build_topology

    topo = build_topology("gb200-nvl72", None, nodes=36)  # 144 GPUs: two full racks
    assert (topo.nodes, len(topo.gpus)) == (36, 144)
    assert topo.nvlink_domain_size() == 72
    assert topo.device_counts()["nvswitch"] == 2
    inside = topo.route("node18.gpu0", "node35.gpu3")  # rack 1, over its NVLink switch
    assert inside == ["node18.gpu0", "fabric.nvswitch1", "node35.gpu3"]
    across = topo.route("node0.gpu0", "node18.gpu0")  # rack 0 -> rack 1: C2C, Grace, ConnectX-7, fabric
    assert not any("nvswitch" in x for x in across)
    assert across[2:5] == ["node0.nic0", "fabric.leaf0", "node18.nic0"]
    # contiguous halves are the two racks: only the 18 x 4 NDR400 ports of a rack cross
    assert topo.figures()["bisection_bw_Bps"] == 18 * 4 * 50 * GB


def test_scaling_a_preset_to_its_own_size_changes_nothing() -> None:
    """72 trays of the single rack = the 4-rack preset (its fabric is the one added); 18 trays = the rack."""
    from cosim.scenario import build_topology
    from cosim.topology import load_topology

    def figs(topo: object) -> dict:
        return {k: v for k, v in topo.figures().items() if k != "name"}  # type: ignore[attr-defined]

    four = figs(load_topology("gb200-nvl72-4rack"))
    assert figs(build_topology("gb200-nvl72-4rack", None, nodes=72)) == four
    assert figs(build_topology("gb200-nvl72", None, nodes=72)) == four
    assert figs(build_topology("gb200-nvl72", None, nodes=18)) == figs(load_topology("gb200-nvl72"))


def test_gb300_racks_scale_and_a_single_rack_stays_one_domain() -> None:
    from cosim.scenario import build_topology

    two = build_topology("gb300-nvl72", None, nodes=36)
    assert two.figures()["bisection_bw_Bps"] == 18 * 4 * 100 * GB  # ConnectX-8 800 Gb/s per GPU
    one = build_topology("gb300-nvl72-4rack", None, nodes=4)  # 16 GPUs of one rack
    assert (len(one.gpus), one.nvlink_domain_size(), one.device_counts()["nvswitch"]) == (16, 16, 1)
    assert build_topology("gb200-nvl72", None, nodes=4).device_counts().get("fabric_switch") is None


def test_bad_node_counts_and_hand_written_clusters_are_one_line_errors(tmp_path: Path) -> None:
    from cosim.scenario import scaled_document
    from cosim.topology import find_topology

    for n in (0, 1025):
        with pytest.raises(CosimInputError, match=r"expected 1\.\.1024") as exc:
            scaled_document(find_topology("gb200-nvl72"), n)
        assert "\n" not in str(exc.value)
    f = tmp_path / "pair.yaml"
    f.write_text("name: pair\nnode: dgx-h100\nnodes: 2\nlinks:\n"
                 "  - {between: [node0.nic0, node1.nic0], type: ndr400}\n", encoding="utf-8")
    with pytest.raises(CosimInputError, match="hand-written cluster links"):
        scaled_document(f, 4)


def test_the_e2e_runner_cuts_racks_with_the_same_rule(tmp_path: Path) -> None:
    import yaml

    from validation.e2e.run import _gb200, _NotRun

    doc = yaml.safe_load(Path(_gb200(256, tmp_path)).read_text(encoding="utf-8"))  # 64 trays, 16 per rack
    assert doc["nodes"] == 64 and doc["devices"][0]["count"] == 4
    assert doc["links"][0]["between"][1] == "nvswitch{n//16}" and doc["fabric"]["topology"] == "rail-optimized"
    with pytest.raises(_NotRun, match="whole number of 4-GPU GB300"):
        _gb200(6, tmp_path, "gb300")


def test_a_synthetic_step_runs_on_four_gb200_trays() -> None:
    """``--set topology=gb200-nvl72 --set nodes=4`` (the default scenario on 16 GPUs) runs."""
    from cosim.scenario import DEFAULT_SCENARIO, apply_scenario_sets, load_scenario, run_scenario

    scn, _ = apply_scenario_sets(load_scenario(DEFAULT_SCENARIO), {"topology": "gb200-nvl72", "nodes": "4"})
    _, result = run_scenario(scn)
    s = result.summary()
    assert s["synthetic"]["gpus"] == 16 and s["topology"] == "gb200-nvl72-x4" and s["tokens_per_s_per_gpu"] > 0


def test_gb300_entry_extends_b300_and_takes_its_kernel_profile() -> None:
    from cosim.catalog import load_catalog
    from cosim.models.profile import profile_for
    from cosim.topology import load_topology

    cat = load_catalog()
    gb300 = cat.accelerator("gb300")
    assert cat.lineage("accelerators", "gb300") == ["gb300", "b300", "b200"]
    assert (gb300.peak("bf16"), gb300.peak("fp8"), gb300.tdp, gb300.host_link) == (2.5e15, 5e15, 1400.0, "nvlink-c2c")
    assert gb300.hbm_capacity == cat.accelerator("b300").hbm_capacity  # the rest is b300's
    prof = profile_for(gb300.name)
    assert prof is not None and prof.accelerator == "b300"  # no profile of its own: its parent's
    assert profile_for(cat.accelerator("gb200").name) is None  # b200 has none either
    for preset in ("gb300-nvl72", "gb300-nvl72-4rack"):
        topo = load_topology(preset)
        assert {topo.graph.nodes[g]["spec"] for g in topo.gpus} == {"gb300"}
