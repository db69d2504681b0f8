"""Folding and the expert dispatchers against rank groups placed unlike each other (cosim.workload.synth.placement):
an EP group over NVLink domains of unequal size is refused before anything runs, folded or not; a group shaped
unlike its stage's first is not folded; evenly placed steps still fold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]


def _scenario(tmp_path: Path, name: str, nodes: int, synthetic: dict) -> Path:
    tmp_path.mkdir(exist_ok=True)
    f = tmp_path / f"{name}.yaml"
    f.write_text(yaml.safe_dump({"name": name, "topology": "gb200-nvl72", "nodes": nodes,
                                 "workload": {"synthetic": synthetic}}, sort_keys=False))
    return f


def _run(f: Path, tmp_path: Path, *sets: str) -> subprocess.CompletedProcess[str]:
    args = [a for s in sets for a in ("--set", s)]
    return subprocess.run([sys.executable, "-m", "cosim", "run", str(f), "--json", "--no-timeline", "--out",
                           str(tmp_path / "o"), *args], capture_output=True, text=True, cwd=ROOT)


QWEN30 = {"model": "qwen3-30b-a3b", "layout": {"ep": 64, "recompute": "full"},
          "batch": {"global": 128, "micro": 1, "seq": 4096}, "precision": "bf16", "dispatch": "hybridep"}


def test_hybridep_group_over_unequal_nvlink_domains_fails_folded_or_not(tmp_path: Path) -> None:
    """128 GB200 GPUs are racks of 72 + 56 (scaled_racks): the second EP64 group holds ranks 64..127, 8 in the
    first rack and 56 in the second. Folded (the default) and ``fold: false`` give the same one-line error, exit 2,
    at the scenario's ``dispatch`` line, before the simulation (the unfolded replay used to stop in moe_comm)."""
    errs = []
    for fold in ({}, {"fold": False}):
        f = _scenario(tmp_path / str(len(errs)), "q128", 32, {**QWEN30, **fold})
        out = _run(f, tmp_path)
        assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
        line = f.read_text().splitlines().index("    dispatch: hybridep") + 1
        assert out.stderr.startswith(f"cosim: error: {f}:{line}:")
        errs.append(out.stderr.replace(str(f), "FILE"))
    assert errs[0] == errs[1]
    for part in ("workload.synthetic.dispatch: HybridEP needs the same number of ranks in every NVLink domain",
                 "ranks 64..127 spans 2 NVLink domains of 8+56", "layout.ep 64 on 128 GPUs", "nodes"):
        assert part in errs[0]


def test_hybridep_evenly_placed_still_folds(tmp_path: Path) -> None:
    """144 GPUs = 2 full racks, EP8: every EP group lies in one rack (72 = 9 x 8); the step runs folded (one rank)."""
    f = _scenario(tmp_path, "q144", 36, {**QWEN30, "layout": {"ep": 8, "recompute": "full"},
                                          "batch": {"global": 144, "micro": 1, "seq": 4096}})
    out = _run(f, tmp_path)
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == 1 and d["step_time_s"] > 0


def test_group_placed_unlike_the_simulated_one_is_not_folded(tmp_path: Path) -> None:
    """80 GB200 GPUs = racks of 72 + 8, EP16 (NCCL all-to-all): the EP group of ranks 64..79 spans two NVLink
    domains (8 + 8) where the simulated one (0..15) is in one; the step builds all 80 ranks and says why. Forced
    ``fold: true`` still folds; EP8 groups (whole in a rack) fold."""
    f = _scenario(tmp_path, "mini80", 20, {"model": "qwen3-moe-mini", "layout": {"ep": 16, "pp": 1},
                                           "batch": {"global": 80, "micro": 1, "seq": 256}})
    d = json.loads(_run(f, tmp_path).stdout)
    assert not d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == 80
    assert any("not folded: the ep group of ranks 64..79 spans NVLink domains of 8+8 GPUs where the simulated group "
               "of ranks 0..15 spans 16" in n for n in d["notes"])
    for s, ranks in (("workload.synthetic.fold=true", 1), ("workload.synthetic.layout.ep=8", 1)):
        d = json.loads(_run(f, tmp_path, s).stdout)
        assert d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == ranks


def test_unlike_group_and_deepep_per_node_by_hand() -> None:
    """3 DGX H100 nodes (8 GPUs each), by hand: EP6 puts ranks 6..11 on nodes 0 and 1 (2 + 4 GPUs), unlike the
    group 0..5 (6 on node 0), and DeepEP refuses it (unequal ranks per node); pp 3 x EP8 puts each stage on one
    node and every group alike."""
    from cosim.errors import CosimInputError
    from cosim.scenario import build_topology
    from cosim.workload.synth.layout import ParallelLayout
    from cosim.workload.synth.placement import Placement, check_dispatch, unlike_group
    from cosim.workload.synth.spec import _card

    card = _card("qwen3-30b-a3b", None)
    where = Placement(build_topology("dgx-h100", None, None, None, 3))
    rm = ParallelLayout(ep=6).resolve(card.model_copy(update={"num_experts": 96}), 24)
    assert unlike_group(rm, where) == ("ep group of ranks 6..11 spans host nodes of 2+4 GPUs where the "
                                       "simulated group of ranks 0..5 spans 6")
    with pytest.raises(CosimInputError, match=r"DeepEP needs the same number of ranks in every host node: the EP "
                                              r"group of ranks 6\.\.11 spans 2 host nodes of 2\+4"):
        check_dispatch(rm, where, "deepep")
    check_dispatch(rm, where, "nccl")
    even = ParallelLayout(ep=8, pp=3).resolve(card, 24)
    assert unlike_group(even, where) is None
    check_dispatch(even, where, "deepep")


def test_serving_step_placed_unlike_is_not_folded(tmp_path: Path) -> None:
    """The serving build folds too (infer.build_infer_step): a decode step, EP16 over 80 GB200 GPUs, builds all 80
    ranks for the same reason as training; on one rack (72 GPUs are not divisible by 16: 64 GPUs) it folds."""
    syn = {"model": "qwen3-moe-mini", "mode": "decode", "layout": {"ep": 16},
           "batch": {"requests_per_gpu": 8, "context": 1024}}
    d = json.loads(_run(_scenario(tmp_path, "dec80", 20, syn), tmp_path).stdout)
    assert not d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == 80
    assert any(n.startswith("not folded: the ep group of ranks 64..79") for n in d["notes"])
    d = json.loads(_run(_scenario(tmp_path, "dec64", 16, syn), tmp_path).stdout)
    assert d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == 1


def test_forced_fold_is_noted_and_stragglers_skip_the_check() -> None:
    """80 GB200 GPUs, EP16 (the EP group 64..79 over two racks): ``fold: true`` keeps the fold and now says which
    group it stands for; with a straggler (every rank built anyway, build.py ``calm``) no 'not folded' note blames
    the placement (s11-read3)."""
    from cosim.scenario import build_topology
    from cosim.workload.synth.build import BuildOptions
    from cosim.workload.synth.layout import ParallelLayout
    from cosim.workload.synth.spec import SyntheticSpec, _card, _placed

    topo = build_topology("gb200-nvl72", None, None, None, 20)
    rm = ParallelLayout(ep=16).resolve(_card("qwen3-moe-mini", None), 80)
    syn = {"model": "qwen3-moe-mini", "layout": {"ep": 16}, "batch": {"global": 80, "micro": 1, "seq": 256}}
    unlike = "the ep group of ranks 64..79 spans NVLink domains of 8+8 GPUs"
    opts, notes = _placed(SyntheticSpec(**syn), rm, topo, BuildOptions(), "nccl")
    assert opts.fold is False and len(notes) == 1 and notes[0].startswith(f"not folded: {unlike}")
    opts, notes = _placed(SyntheticSpec(**syn, fold=True), rm, topo, BuildOptions(), "nccl")
    assert opts.fold is None and len(notes) == 1 and notes[0].startswith(f"folded (fold: true) though {unlike}")
    opts, notes = _placed(SyntheticSpec(**syn), rm, topo, BuildOptions(gpu_slowdown={3: 1.5}), "nccl")
    assert opts.fold is None and notes == []


RAIL8 = """name: rail8
description: 8 DGX H100 on a rail-optimized fabric whose leaves take 6 nodes per rail (scalable units of 6), 6:1
node: dgx-h100
nodes: 8
fabric: {topology: rail-optimized, switch_radix: 64, leaf_down_ports: 6, oversubscription: 6}
"""


def test_group_over_two_leaves_is_not_folded_onto_one_on_a_leaf(tmp_path: Path) -> None:
    """By hand: 8 DGX H100 nodes on a rail-optimized fabric whose leaves take 6 nodes per rail (nodes 0-5 on one leaf
    of each rail, 6-7 on another). EP32 groups are nodes 0-3 and 4-7: the same GPUs per node (8+8+8+8) and per
    NVLink domain, but the first lies on one leaf per rail (4 GPUs each) and the second over two (2 + 2): its
    all-to-all crosses the spine, which the first's never loads. Folding used to let the first stand for both
    (node and domain shapes equal); now the step builds all 64 ranks and says why, and its figure is the unfolded
    one. ``fold: true`` still folds, and is faster by the second group's extra switch hops."""
    from cosim.scenario import build_topology
    from cosim.workload.synth.layout import ParallelLayout
    from cosim.workload.synth.placement import Placement, unlike_group
    from cosim.workload.synth.spec import _card

    (tmp_path / "rail8.yaml").write_text(RAIL8)
    where = Placement(build_topology(str(tmp_path / "rail8.yaml"), None, None, None, None))
    rm = ParallelLayout(ep=32, pp=1).resolve(_card("qwen3-moe-mini", None), 64)
    assert where.shape(rm.group("ep", 32)) == where.shape(rm.group("ep", 0))  # node / domain shapes alike
    assert unlike_group(rm, where) == ("ep group of ranks 32..63 reaches the fabric through leaf switches of "
                                       + "+".join(["2"] * 16) + " GPUs where the simulated group of ranks 0..31 "
                                       "reaches " + "+".join(["4"] * 8))
    one_unit = Placement(build_topology("dgx-h100", None, None, None, 8))  # one switch: every group alike
    assert unlike_group(rm, one_unit) is None
    f = tmp_path / "mini64.yaml"
    f.write_text(yaml.safe_dump({"name": "mini64", "topology": "rail8.yaml", "workload": {"synthetic": {
        "model": "qwen3-moe-mini", "layout": {"ep": 32, "pp": 1}, "batch": {"global": 64, "micro": 1, "seq": 2048}}}}))
    runs = {}
    for fold in ("", "workload.synthetic.fold=false", "workload.synthetic.fold=true"):
        out = _run(f, tmp_path, *([fold] if fold else []))
        assert out.returncode == 0, out.stderr
        runs[fold] = json.loads(out.stdout)
    d = runs[""]
    assert not d["synthetic"]["folded"] and d["synthetic"]["simulated_ranks"] == 64
    assert any(n.startswith("not folded: the ep group of ranks 32..63 reaches the fabric through leaf switches")
               for n in d["notes"])
    assert d["step_time_s"] == runs["workload.synthetic.fold=false"]["step_time_s"]
    assert runs["workload.synthetic.fold=true"]["step_time_s"] < d["step_time_s"]
