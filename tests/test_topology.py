"""Topology presets, graph contract, routing and figures (numbers worked by hand)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.topology import NoRouteError, check_topology, list_presets, load_topology

GB = 1e9
ROOT = Path(__file__).resolve().parents[1]

PRESETS = ["dgx-h100", "dgx-a100", "dgx1-v100", "hgx-h200", "hgx-b200", "hgx-b300", "gb200-nvl72", "gb200-nvl72-4rack",
           "gb300-nvl72", "gb300-nvl72-4rack", "pcie-8x-l40s",
           "dgx-h100-4node", "dgx-h100-32node", "h800-8node", "proposal-example"]


def test_presets_listed():
    assert set(PRESETS) <= set(list_presets())


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_loads_and_checks(name):
    topo = check_topology(name)
    assert topo.name == name
    assert topo.gpus
    assert topo.source_file is not None and topo.source_file.name == f"{name}.yaml"
    # every preset names its source
    assert topo.source and len(topo.source) > 20
    g = topo.graph
    for n, a in g.nodes(data=True):
        assert a["kind"] in {"gpu", "cpu", "pcie_switch", "nvswitch", "nic", "fabric_switch", "nvme"}
        assert isinstance(a["node"], int) and isinstance(a["index"], int)
        assert (a["node"] == -1) == n.startswith("fabric.")
    for u, v, e in g.edges(data=True):
        assert g.has_edge(v, u) and g.edges[v, u] == e
        lt = topo.catalog.links[e["link"]]
        assert e["bandwidth"] == e["count"] * lt.bandwidth
        assert e["efficiency"] == lt.efficiency and e["latency"] == lt.latency
    for gpu in topo.gpus:
        assert topo.route(gpu, topo.cpu_of(gpu))[-1] == topo.cpu_of(gpu)


# --- figures, by hand ------------------------------------------------------------------------

def test_dgx_h100_figures():
    f = load_topology("dgx-h100").figures()
    assert f["gpus"] == 8 and f["nodes"] == 1
    assert f["per_gpu_scale_up_bw_Bps"] == 18 * 25 * GB  # 18 NVLink4 x 25 GB/s = 450 GB/s
    assert f["per_gpu_scale_out_bw_Bps"] == 400 / 8 * GB  # 400 Gb/s = 50 GB/s
    assert f["per_gpu_host_bw_Bps"] == 64 * GB  # PCIe Gen5 x16 raw
    assert f["bisection_bw_Bps"] == 4 * 18 * 25 * GB  # 4 GPUs x 450 GB/s into the NVSwitch
    assert f["devices"] == {"cpu": 2, "gpu": 8, "nic": 8, "nvswitch": 1, "pcie_switch": 8}
    assert f["links"] == {"nvlink4": 8 * 18, "pcie5x16": 3 * 8, "upi": 4}


def test_cluster_figures_rail_optimized():
    f = load_topology("dgx-h100-32node").figures()
    assert f["gpus"] == 256 and f["nodes"] == 32
    # non-blocking: 128 GPUs on one side, each with its own 50 GB/s NIC
    assert f["bisection_bw_Bps"] == 256 / 2 * 50 * GB
    topo = load_topology("dgx-h100-32node")
    roles = [topo.graph.nodes[n]["role"] for n in topo.devices("fabric_switch")]
    assert roles.count("leaf") == 8  # one 64-port leaf per rail: 32 down + 32 up
    assert roles.count("spine") == 4  # 8 x 32 uplinks / 64 ports
    assert load_topology("dgx-h100-4node").figures()["bisection_bw_Bps"] == 16 * 50 * GB


def _cluster(tmp_path: Path, topology: str, over: float, nodes: int = 32) -> Path:
    p = tmp_path / f"c-{topology}-{over}.yaml"
    p.write_text(f"name: c\nnode: dgx-h100\nnodes: {nodes}\nfabric:\n  topology: {topology}\n"
                 f"  switch_radix: 64\n  oversubscription: {over}\n")
    return p


def test_leaf_spine_oversubscription_halves_bisection(tmp_path):
    full = load_topology(_cluster(tmp_path, "leaf-spine", 1)).figures()["bisection_bw_Bps"]
    half = load_topology(_cluster(tmp_path, "leaf-spine", 2)).figures()["bisection_bw_Bps"]
    # 32 down ports per leaf = 4 nodes; 8 leaves; 1:1 -> 32 uplinks of 50 GB/s per leaf,
    # 2:1 -> 16. Half of the nodes = 4 leaves, all traffic crosses the spines.
    assert full == 4 * 32 * 50 * GB == 6.4e12
    assert half == 4 * 16 * 50 * GB == full / 2
    fat = load_topology(_cluster(tmp_path, "fat-tree", "'2:1'")).figures()["bisection_bw_Bps"]
    assert fat == half


@pytest.mark.parametrize("kind", ["single-switch", "dragonfly", "torus"])
def test_other_fabrics_route(tmp_path, kind):
    p = tmp_path / "f.yaml"
    extra = "  dims: [2, 2]\n" if kind == "torus" else ""
    p.write_text(f"node: dgx-h100\nnodes: 4\nfabric:\n  topology: {kind}\n{extra}")
    topo = load_topology(p)
    path = topo.route("node0.gpu0", "node3.gpu7")
    assert path[:3] == ["node0.gpu0", "node0.pcie0", "node0.nic0"]
    assert path[-3:] == ["node3.nic7", "node3.pcie7", "node3.gpu7"]
    assert all(topo.kind_of(x) == "fabric_switch" for x in path[3:-3])
    if kind == "single-switch":
        assert topo.figures()["bisection_bw_Bps"] == 16 * 50 * GB


def test_other_preset_figures():
    a100 = load_topology("dgx-a100").figures()
    assert a100["per_gpu_scale_up_bw_Bps"] == 12 * 25 * GB
    assert a100["per_gpu_scale_out_bw_Bps"] == 200 / 8 * GB
    assert a100["per_gpu_host_bw_Bps"] == 32 * GB
    v100 = load_topology("dgx1-v100").figures()
    assert v100["per_gpu_scale_up_bw_Bps"] == 6 * 25 * GB
    assert v100["per_gpu_scale_out_bw_Bps"] == 100 / 8 * GB / 2  # one EDR NIC per 2 GPUs
    # halves {0..3} / {4..7}: NVLink pairs 0-4 (2), 1-5 (2), 2-6 (1), 3-7 (1) = 6 links
    assert v100["bisection_bw_Bps"] == 6 * 25 * GB
    b200 = load_topology("hgx-b200").figures()
    assert b200["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB
    nvl = load_topology("gb200-nvl72").figures()
    assert nvl["gpus"] == 72 and nvl["nodes"] == 18 and nvl["nvlink_domain_gpus"] == 72
    assert nvl["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB
    assert nvl["per_gpu_host_bw_Bps"] == 450 * GB  # NVLink-C2C, per direction
    assert nvl["bisection_bw_Bps"] == 36 * 18 * 50 * GB
    l40s = load_topology("pcie-8x-l40s").figures()
    assert l40s["per_gpu_scale_up_bw_Bps"] == 0
    assert l40s["per_gpu_host_bw_Bps"] == 32 * GB  # L40S is PCIe Gen4 x16
    assert l40s["per_gpu_scale_out_bw_Bps"] == 50 * GB / 2
    # min(UPI 4 x 32 GB/s between sockets, even/odd split: 4 GPU links x 32 GB/s)
    assert l40s["bisection_bw_Bps"] == 4 * 32 * GB
    h800 = load_topology("h800-8node")
    assert h800.figures()["per_gpu_scale_up_bw_Bps"] == 8 * 25 * GB
    assert h800.accelerator("node3.gpu5").name.startswith("NVIDIA H800")
    assert h800.figures()["gpus"] == 64 and h800.figures()["per_gpu_scale_out_bw_Bps"] == 50 * GB


# Every preset's five headline figures, bytes/s per direction, with their arithmetic:
# (gpus, nodes, scale-up per GPU, scale-out per GPU, host per GPU, bisection).
FIGURES = {
    "dgx-h100": (8, 1, 18 * 25 * GB, 400 / 8 * GB, 64 * GB, 4 * 18 * 25 * GB),  # NVLink4 x18, CX-7 400G, Gen5 x16
    "hgx-h200": (8, 1, 18 * 25 * GB, 400 / 8 * GB, 64 * GB, 4 * 18 * 25 * GB),  # same board as DGX H100
    "dgx-a100": (8, 1, 12 * 25 * GB, 200 / 8 * GB, 32 * GB, 4 * 12 * 25 * GB),  # NVLink3 x12, CX-6 200G, Gen4 x16
    # hybrid cube mesh: halves {0..3}/{4..7} joined by 0-4 (2), 1-5 (2), 2-6 (1), 3-7 (1) = 6 NVLink2 links
    "dgx1-v100": (8, 1, 6 * 25 * GB, 100 / 8 * GB / 2, 16 * GB, 6 * 25 * GB),  # one EDR NIC per 2 GPUs, Gen3 x16
    "hgx-b200": (8, 1, 18 * 50 * GB, 400 / 8 * GB, 64 * GB, 4 * 18 * 50 * GB),  # NVLink5 x18
    # one ConnectX-8 800G per GPU (its Gen6 switch); host is that switch's Gen5 x16 uplink to the Xeon
    "hgx-b300": (8, 1, 18 * 50 * GB, 800 / 8 * GB, 64 * GB, 4 * 18 * 50 * GB),
    # 18 compute trays x 4 GPUs; host is NVLink-C2C (900 GB/s both ways); NVLink domain of 72
    "gb200-nvl72": (72, 18, 18 * 50 * GB, 400 / 8 * GB, 900 / 2 * GB, 36 * 18 * 50 * GB),
    # 4 such racks (72 trays) on a rail-optimized fabric: the bisection cuts between racks, half the GPUs x 50 GB/s
    "gb200-nvl72-4rack": (288, 72, 18 * 50 * GB, 400 / 8 * GB, 900 / 2 * GB, 288 / 2 * 50 * GB),
    # GB300: the same trays with one ConnectX-8 800G per GPU (its own PCIe switch); racks joined at 100 GB/s per GPU
    "gb300-nvl72": (72, 18, 18 * 50 * GB, 800 / 8 * GB, 900 / 2 * GB, 36 * 18 * 50 * GB),
    "gb300-nvl72-4rack": (288, 72, 18 * 50 * GB, 800 / 8 * GB, 900 / 2 * GB, 288 / 2 * 100 * GB),
    # PCIe only; 400G NIC per 2 GPUs; bisection min(UPI 4 x 32 GB/s, 4 GPU Gen4 links x 32 GB/s)
    "pcie-8x-l40s": (8, 1, 0.0, 400 / 8 * GB / 2, 32 * GB, 4 * 32 * GB),
    # rail-optimized clusters: bisection = half of the GPUs x their 50 GB/s NIC
    "dgx-h100-4node": (32, 4, 18 * 25 * GB, 50 * GB, 64 * GB, 32 / 2 * 50 * GB),
    "dgx-h100-32node": (256, 32, 18 * 25 * GB, 50 * GB, 64 * GB, 256 / 2 * 50 * GB),
    "h800-8node": (64, 8, 8 * 25 * GB, 400 / 8 * GB, 64 * GB, 64 / 2 * 50 * GB),  # H800: 8 NVLink4 links
    # the proposal: NVLink 2x per link, ConnectX-8 800G, root ports stay Gen5
    "proposal-example": (8, 1, 18 * 50 * GB, 800 / 8 * GB, 64 * GB, 4 * 18 * 50 * GB),
}


def test_figures_table_covers_every_preset():
    assert set(FIGURES) == set(PRESETS) == set(list_presets())


@pytest.mark.parametrize("name", sorted(FIGURES))
def test_every_preset_figures(name):
    f = load_topology(name).figures()
    gpus, nodes, up, out, host, bisection = FIGURES[name]
    got = (f["gpus"], f["nodes"], f["per_gpu_scale_up_bw_Bps"], f["per_gpu_scale_out_bw_Bps"],
           f["per_gpu_host_bw_Bps"], f["bisection_bw_Bps"])
    assert got == pytest.approx((gpus, nodes, up, out, host, bisection), rel=1e-12)


def test_hgx_b300_preset():
    """DGX/HGX B300: B300 GPUs, each behind its own ConnectX-8's Gen6 switch (GPUDirect RDMA without a root
    port), Xeon 6776P hosts; nodes: scales it on an 800G fabric like hgx-b200."""
    from cosim.scenario import build_topology
    topo = load_topology("hgx-b300")
    assert topo.accelerator("gpu7").name.startswith("NVIDIA B300")
    assert topo.graph.edges["gpu3", "pcie3"]["link"] == "pcie6x16"
    assert topo.graph.edges["pcie3", "cpu0"]["link"] == "pcie5x16"
    assert topo.graph.edges["pcie4", "cpu1"]["link"] == "pcie5x16"
    assert topo.catalog.cpu("xeon-6776p").cores == 64
    big = build_topology("hgx-b300", None, nodes=4).figures()
    assert (big["gpus"], big["nodes"], big["per_gpu_scale_out_bw_Bps"]) == (32, 4, 100 * GB)
    assert big["bisection_bw_Bps"] == 32 / 2 * 100 * GB


# --- proposals ---------------------------------------------------------------------------------

def test_proposal_example():
    topo = load_topology("proposal-example")
    f = topo.figures()
    assert f["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB  # NVLink 2x per link
    assert f["per_gpu_scale_out_bw_Bps"] == 800 / 8 * GB  # ConnectX-8 800G
    assert f["per_gpu_host_bw_Bps"] == 64 * GB  # CPU root port stays Gen5
    assert topo.graph.edges["gpu0", "pcie0"]["link"] == "pcie6x16"
    assert topo.catalog.link("nvlink4").bandwidth == 50 * GB
    assert load_topology("dgx-h100").catalog.link("nvlink4").bandwidth == 25 * GB


def test_api_overrides():
    topo = load_topology("dgx-h100", overrides={"links.nvlink4.bandwidth": "900 GB/s"})
    assert topo.graph.edges["gpu0", "nvswitch0"]["bandwidth"] == 18 * 900 * GB
    with pytest.raises(CosimInputError):
        load_topology("dgx-h100", overrides={"links.nvlink9.bandwidth": "1 GB/s"})


def test_extends_chain_and_set(tmp_path):
    (tmp_path / "a.yaml").write_text("extends: dgx-h100\nset:\n  topology.links.gpu-nvlink.count: 9\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\nname: b\nset:\n  links.nvlink4.bandwidth: '40 GB/s'\n"
                                     "devices:\n  - {id: nvme0, kind: nvme}\nlinks:\n  - {between: [nvme0, cpu0], type: pcie4x16}\n")
    topo = load_topology(tmp_path / "b.yaml")
    assert topo.name == "b"
    assert topo.figures()["per_gpu_scale_up_bw_Bps"] == 9 * 40 * GB
    assert topo.route("gpu0", "nvme0") == ["gpu0", "pcie0", "cpu0", "nvme0"]


def test_extends_errors(tmp_path):
    (tmp_path / "x.yaml").write_text("extends: y.yaml\n")
    (tmp_path / "y.yaml").write_text("extends: x.yaml\n")
    with pytest.raises(CosimInputError, match=r"y.yaml:1:10: extends: extends cycle: x.yaml -> y.yaml -> x.yaml"):
        load_topology(tmp_path / "x.yaml")
    (tmp_path / "m.yaml").write_text("extends: nope\n")
    with pytest.raises(CosimInputError, match=r"m.yaml:1:10: extends: extends 'nope': no such preset or file"):
        load_topology(tmp_path / "m.yaml")
    with pytest.raises(CosimInputError, match="unknown topology 'nope'"):
        load_topology("nope")


# --- routing -----------------------------------------------------------------------------------

def test_routes_dgx_h100():
    t = load_topology("dgx-h100")
    assert t.gpus == [f"gpu{i}" for i in range(8)]
    assert t.paths("gpu0", "gpu5") == [["gpu0", "nvswitch0", "gpu5"]]  # NVSwitch, not PCIe
    assert t.route("gpu0", "cpu0") == ["gpu0", "pcie0", "cpu0"]
    assert t.route("gpu5", "cpu0") == ["gpu5", "pcie5", "cpu1", "cpu0"]  # crosses UPI
    assert t.route("gpu2", "nic2") == ["gpu2", "pcie2", "nic2"]
    assert [t.nic_of(g) for g in t.gpus] == [f"nic{i}" for i in range(8)]
    assert [t.cpu_of(g) for g in t.gpus] == ["cpu0"] * 4 + ["cpu1"] * 4
    assert t.has_nvswitch(0)
    assert t.accelerator("gpu0").name.startswith("NVIDIA H100")
    assert t.cpu_spec("cpu0").name and t.nic_spec("nic0").bandwidth == 50 * GB
    assert t.node_of("gpu3") == 0 and t.nodes == 1 and t.gpus_on(0) == t.gpus


def test_routes_cluster_gpudirect():
    t = load_topology("dgx-h100-4node")
    assert t.nodes == 4 and t.gpus[8] == "node1.gpu0" and t.gpus_on(3)[0] == "node3.gpu0"
    assert t.node_of("node2.nic1") == 2 and t.node_of("fabric.leaf0") == -1
    assert t.paths("node0.gpu0", "node1.gpu0") == [
        ["node0.gpu0", "node0.pcie0", "node0.nic0", "fabric.leaf0", "node1.nic0", "node1.pcie0", "node1.gpu0"]]
    assert t.paths("node0.gpu0", "node1.gpu3") == [
        ["node0.gpu0", "node0.pcie0", "node0.nic0", "fabric.leaf0", "fabric.spine0", "fabric.leaf3",
         "node1.nic3", "node1.pcie3", "node1.gpu3"]]
    assert t.route("node0.gpu0", "node0.gpu1") == ["node0.gpu0", "node0.nvswitch0", "node0.gpu1"]


def test_routes_ecmp_over_spines():
    t = load_topology("dgx-h100-32node")
    ps = t.paths("node0.gpu0", "node1.gpu3")
    assert [p[4] for p in ps] == [f"fabric.spine{s}" for s in range(4)]
    assert all(p[3] == "fabric.leaf0" and p[5] == "fabric.leaf3" for p in ps)
    assert t.route("node0.gpu0", "node1.gpu3", key=6) == ps[2]


def test_routes_dgx1_hybrid_cube_mesh():
    t = load_topology("dgx1-v100")
    assert t.paths("gpu0", "gpu1") == [["gpu0", "gpu1"]]
    assert t.paths("gpu0", "gpu4") == [["gpu0", "gpu4"]]
    # no NVLink between 0 and 5; a GPU is never transit, so over PCIe + QPI
    assert t.paths("gpu0", "gpu5") == [["gpu0", "pcie0", "cpu0", "cpu1", "pcie2", "gpu5"]]
    assert [t.nic_of(g) for g in t.gpus] == ["nic0", "nic0", "nic1", "nic1", "nic2", "nic2", "nic3", "nic3"]
    assert not t.has_nvswitch(0)


def test_routes_pcie_only():
    t = load_topology("pcie-8x-l40s")
    assert t.paths("gpu0", "gpu1") == [["gpu0", "pcie0", "gpu1"]]
    assert t.paths("gpu0", "gpu2") == [["gpu0", "pcie0", "cpu0", "pcie1", "gpu2"]]
    assert t.paths("gpu0", "gpu5") == [["gpu0", "pcie0", "cpu0", "cpu1", "pcie2", "gpu5"]]


def test_routes_gb200_nvl72():
    t = load_topology("gb200-nvl72")
    assert t.paths("node0.gpu0", "node17.gpu3") == [["node0.gpu0", "fabric.nvswitch0", "node17.gpu3"]]
    assert t.route("node0.gpu2", "node0.cpu1") == ["node0.gpu2", "node0.cpu1"]  # NVLink-C2C
    assert t.route("node0.gpu1", t.nic_of("node0.gpu1")) == ["node0.gpu1", "node0.cpu0", "node0.nic1"]
    assert t.has_nvswitch(5)
    with pytest.raises(NoRouteError):
        t.route("node0.gpu0", "node1.cpu0")  # no scale-out fabric in a single rack


def test_nic_never_transit_inside_node():
    t = load_topology("dgx-h100-4node")
    for src, dst in [("node0.gpu0", "node0.cpu1"), ("node0.nic0", "node0.gpu7"), ("node0.gpu3", "node2.cpu0")]:
        for p in t.paths(src, dst):
            inner = p[1:-1]
            assert not any(t.kind_of(x) == "gpu" for x in inner)
            for i, x in enumerate(p[1:-1], 1):
                if t.kind_of(x) == "nic":  # only at the host/fabric boundary
                    kinds = {t.kind_of(p[i - 1]) == "fabric_switch", t.kind_of(p[i + 1]) == "fabric_switch"}
                    assert kinds == {True, False}


# --- CLI ---------------------------------------------------------------------------------------

def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cosim", "topo", *args], capture_output=True, text=True, cwd=ROOT, timeout=60)


def test_cli_show_list_check_draw(tmp_path, capsys):
    from cosim.cli import main

    r = _cli("show", "dgx-h100")
    assert r.returncode == 0, r.stderr
    for text in ("450 GB/s", "50 GB/s", "64 GB/s", "1.8 TB/s", "├── pcie0", "cpu0 <-> cpu1"):
        assert text in r.stdout
    assert main(["topo", "show", "dgx-h100-4node", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gpus"] == 32 and doc["per_gpu_scale_up_bw_Bps"] == 450 * GB
    assert {"per_gpu_scale_out_bw_Bps", "per_gpu_host_bw_Bps", "bisection_bw_Bps", "devices", "links"} <= set(doc)
    # the host tree as data: socket -> Gen5 switch -> GPU and NIC, and the UPI links between sockets
    tree = doc["host_tree"]
    sw = tree["sockets"][0]["children"][0]
    assert sw["kind"] == "pcie_switch" and sw["bandwidth_Bps"] == 64 * GB
    assert [(c["id"], c["kind"], c["link"]) for c in sw["children"]] == [("gpu0", "gpu", "pcie5x16"),
                                                                       ("nic0", "nic", "pcie5x16")]
    assert tree["socket_links"] == [{"between": ["cpu0", "cpu1"], "link": "upi", "count": 4,
                                     "bandwidth_Bps": 4 * 32 * GB}]
    assert main(["topo", "list", "--json"]) == 0
    assert {row["name"] for row in json.loads(capsys.readouterr().out)} >= set(PRESETS)
    assert main(["topo", "check", str(ROOT / "topologies/dgx-a100.yaml")]) == 0
    assert capsys.readouterr().out.startswith("ok: dgx-a100")
    out = tmp_path / "t.html"
    assert main(["topo", "draw", "dgx-h100", "--out", str(out)]) == 0
    html = out.read_text()
    assert "Plotly.newPlot" in html and '<script src="http' not in html and len(html) > 1_000_000  # plotly.js inline
    capsys.readouterr()
    assert main(["topo", "draw", "dgx-h100", "--out", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"out": str(out), "name": "dgx-h100", "devices": 27,
                                                   "directed_links": 66}


def test_derived_link_part_given_bidirectional(tmp_path):
    """A part that extends a catalog link and gives ``bidirectional:`` (no source of its own) is halved
    to its per-direction bandwidth, and its sources record that field as bandwidth."""
    f = tmp_path / "bi.yaml"
    f.write_text("""name: bi
parts:
  links:
    foo: {extends: nvlink4, name: foo, bidirectional: "50 GB/s"}
devices:
  - {id: cpu0, kind: cpu, spec: xeon-8480c}
  - {id: "gpu{i}", kind: gpu, spec: h100-sxm5, count: 2}
  - {id: sw, kind: nvswitch}
links:
  - {between: ["gpu{i}", cpu0], type: pcie5x16, repeat: 2}
  - {between: ["gpu{i}", sw], type: foo, repeat: 2}
""")
    topo = load_topology(f)
    assert topo.figures()["per_gpu_scale_up_bw_Bps"] == 50 / 2 * GB
    assert "bandwidth" in topo.catalog.links["foo"].sources and "bidirectional" not in topo.catalog.links["foo"].sources


def test_python_api_at_top_level():
    """The notebook API: ``cosim.load_topology(...)`` and friends, imported lazily."""
    code = ("import sys, cosim; assert 'networkx' not in sys.modules; "
            "t = cosim.load_topology('dgx-h100'); print(t.figures()['per_gpu_scale_up_bw_Bps']); "
            "print(all(getattr(cosim, n) is not None for n in cosim.__all__))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["450000000000.0", "True"]


def test_nic_bandwidth_bounds_its_network_port() -> None:
    # A 400G NDR cable on a NIC overridden to 25 GB/s runs at the NIC's 25 GB/s per direction:
    # scale-out per GPU 25 GB/s, and the 4-node rail-optimized bisection halves from 800 to 400 GB/s.
    base = load_topology("dgx-h100-4node").figures()
    slow = load_topology("dgx-h100-4node", overrides={"nics.cx7-ndr400.bandwidth": "25 GB/s"}).figures()
    assert base["per_gpu_scale_out_bw_Bps"] == 50e9
    assert slow["per_gpu_scale_out_bw_Bps"] == 25e9
    assert slow["bisection_bw_Bps"] == base["bisection_bw_Bps"] / 2


def test_preset_names_are_looked_up_in_the_working_directory_first(tmp_path, monkeypatch):
    """An edited ``topologies/dgx-h100.yaml`` in the working directory wins over the installed preset (also where
    another preset names it: ``node: dgx-h100``), may itself ``extends`` the installed one, and ``cosim topo show``
    says which file it used."""
    from cosim.resources import bundled_dir
    from cosim.topology.loader import preset_path

    installed = bundled_dir("topologies") / "dgx-h100.yaml"
    (tmp_path / "topologies").mkdir()
    local = tmp_path / "topologies" / "dgx-h100.yaml"
    local.write_text(installed.read_text() + 'set: {links.nvlink4.bandwidth: "50 GB/s"}\n')  # the edit: 2x NVLink
    monkeypatch.chdir(tmp_path)
    assert preset_path("dgx-h100") == local and preset_path("dgx-a100") == bundled_dir("topologies") / "dgx-a100.yaml"
    topo = load_topology("dgx-h100")
    assert topo.source_file == local
    assert topo.figures()["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB  # not the installed 18 x 25 GB/s
    assert load_topology("dgx-h100-4node").figures()["per_gpu_scale_up_bw_Bps"] == 18 * 50 * GB
    assert set(PRESETS) <= set(list_presets())
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cosim", "topo", "show", "dgx-h100"], capture_output=True, text=True,
                       timeout=120, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1] == (f"file: {local} (./topologies first; it hides the installed "
                                        f"{installed.resolve()})")
    p = subprocess.run([sys.executable, "-m", "cosim", "topo", "show", "dgx-h100", "--json"], capture_output=True,
                       text=True, timeout=120, env=env, cwd=tmp_path)
    assert json.loads(p.stdout)["file"] == str(local)
    # a working-directory preset that extends the installed one of its own name
    local.write_text('name: dgx-h100\nextends: dgx-h100\nset: {links.nvlink4.bandwidth: "12.5 GB/s"}\n')
    topo = load_topology("dgx-h100")
    assert topo.source_file == local and topo.figures()["per_gpu_scale_up_bw_Bps"] == 18 * 12.5 * GB
    # elsewhere, the installed preset
    monkeypatch.chdir(tmp_path.parent)
    assert load_topology("dgx-h100").figures()["per_gpu_scale_up_bw_Bps"] == 18 * 25 * GB


@pytest.mark.parametrize("name", sorted(list_presets()))
def test_figures_scale_out_is_the_least_over_the_gpus(name: str) -> None:
    """The figure counts each NIC's sharers once per NIC; it is the least of the per-GPU figures."""
    topo = load_topology(name)
    want = min((topo.scale_out_bandwidth(g) for g in topo.gpus), default=0.0)
    assert topo.figures()["per_gpu_scale_out_bw_Bps"] == want
