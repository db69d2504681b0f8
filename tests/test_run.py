"""Scenarios, CPU-capture projection and `cosim run` on the bundled default."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from cosim.errors import CosimInputError
from cosim.models.roofline import RooflineModel
from cosim.replay.summary import BREAKDOWN_KEYS
from cosim.scenario import DEFAULT_SCENARIO, list_scenarios, load_scenario, run_scenario
from cosim.topology import load_topology
from cosim.workload import load_trace
from cosim.workload.graph import CollType, HostKind, OpClass
from cosim.workload.project import ProjectionConfig, op_class, project_to_gpu


@pytest.fixture(scope="module")
def default_run():
    return run_scenario(load_scenario("moe-ep4-dgx-h100"))


def test_bundled_scenarios_load() -> None:
    names = list_scenarios()
    assert DEFAULT_SCENARIO in names
    for n in names:
        assert load_scenario(n).name == n


def test_default_run_summary_adds_up(default_run) -> None:
    _, res = default_run
    s = res.summary()
    assert s["step_time_s"] > 0
    assert len(s["ranks"]) == 4
    for r in s["ranks"]:
        assert r["step_time_s"] > 0
        assert sum(r["breakdown"][k] for k in BREAKDOWN_KEYS) == pytest.approx(r["step_time_s"], rel=1e-9)
        assert r["measured_step_time_s"] is None  # a projected CPU capture has no measured GPU step
    assert sum(s["breakdown"].values()) == pytest.approx(s["step_time_s"], rel=1e-9)


def test_scenario_replay_fields_as_sets_and_projection_note(default_run) -> None:
    _, res = default_run
    assert res.summary()["notes"][0].startswith("CPU capture: its ATen ops were projected onto NVIDIA H100")
    # --set replay.<field> is the scenario file's spelling of the knob <field>
    _, a = run_scenario(load_scenario("moe-ep4-dgx-h100"), {"replay.collectives": "measured", "replay.host_speed": "4"})
    _, b = run_scenario(load_scenario("moe-ep4-dgx-h100"), {"collectives": "measured", "host.speed": "4"})
    assert a.summary()["step_time_s"] == b.summary()["step_time_s"] != res.summary()["step_time_s"]
    with pytest.raises(CosimInputError, match="unknown replay field"):
        run_scenario(load_scenario("moe-ep4-dgx-h100"), {"replay.colour": "red"})
    # a scenario's replay section selects the calibration profile of modeled durations
    modeled = load_scenario("moe-ep4-dgx-h100").model_copy(update={"replay": load_scenario("moe-ep4-dgx-h100").replay.model_copy(
        update={"durations": "modeled", "profile": "no-such-profile"})})
    with pytest.raises(CosimInputError, match="unknown calibration profile 'no-such-profile'"):
        run_scenario(modeled)
    # ... and the precision what-if, the same as --set precision.experts=fp8
    fp8 = load_scenario("moe-ep4-dgx-h100").model_copy(update={"replay": load_scenario("moe-ep4-dgx-h100").replay.model_copy(
        update={"precision": {"experts": "fp8"}})})
    _, p1 = run_scenario(fp8)
    _, p2 = run_scenario(load_scenario("moe-ep4-dgx-h100"), {"replay.precision": "experts:fp8"})
    assert p1.summary()["precision"] == p2.summary()["precision"] and p1.summary()["precision"]
    assert "precision" not in res.summary() or not res.summary()["precision"]
    assert p1.summary()["step_time_s"] == p2.summary()["step_time_s"]
    # the bundled what-if scenario carries its overrides in set:
    what_if = load_scenario("moe-ep4-dgx-h100-half-nvlink")
    assert what_if.set == {"links.nvlink4.bandwidth": "12.5 GB/s", "host.speed": "100"}
    _, w = run_scenario(what_if)
    assert w.summary()["step_time_s"] < res.summary()["step_time_s"] / 3  # the 100x faster host


def test_projection_maps_ops_to_kernels() -> None:
    from cosim.resources import bundled_dir

    g = load_trace(bundled_dir("workloads") / "moe-ep4-cpu")
    topo = load_topology("dgx-h100")
    pg = project_to_gpu(g, topo.accelerator("gpu0"), topo.cpu_spec("cpu0"), ProjectionConfig(), kernel_model=RooflineModel)
    for src, rg in zip(g.ranks, pg.ranks):
        G, H = rg.gpu_ops, rg.host_ops
        assert len(G) > 0 and len(src.gpu_ops) == 0
        # one launch per kernel, each from a LAUNCH / LAUNCH_SYNC host op
        assert np.isin(H.kind[rg.launches.host_op], [HostKind.LAUNCH, HostKind.LAUNCH_SYNC]).all()
        # every collective of the capture became one communication kernel
        assert (G.cls == OpClass.COLLECTIVE).sum() == len(src.collectives)
        assert (rg.collectives.gpu_op >= 0).all()
        # GEMMs come from aten::mm-like ops and take at least the kernel floor
        gemm = G.cls == OpClass.GEMM
        assert gemm.any() and (G.dur[gemm] >= 2e-6).all()
        # bf16 halves the float payload of the token all-to-allv
        c = int(np.nonzero(src.collectives.type == CollType.ALL_TO_ALL)[0][1])
        assert rg.collectives.in_bytes[c] == pytest.approx(src.collectives.in_bytes[c] / 2)


def test_op_class_rules() -> None:
    assert op_class("aten::mm") == OpClass.GEMM
    assert op_class("aten::_grouped_mm") == OpClass.GROUPED_GEMM
    assert op_class("aten::_scaled_dot_product_flash_attention_for_cpu") == OpClass.ATTENTION
    assert op_class("aten::_fused_rms_norm") == OpClass.NORM
    assert op_class("aten::topk") == OpClass.REDUCTION
    assert op_class("aten::silu") == OpClass.ELEMENTWISE


def test_faster_nvlink_cannot_slow_down_and_sets_apply(default_run) -> None:
    base = default_run[1].summary()["step_time_s"]
    _, res = run_scenario(load_scenario("moe-ep4-dgx-h100"), {"links.nvlink4.bandwidth": "0.5 GB/s"})
    slow = res.summary()["step_time_s"]
    assert slow > base  # a 50x slower NVLink makes the all-to-alls expensive
    assert res.config.catalog_overrides == {"links.nvlink4.bandwidth": "0.5 GB/s"}


def test_bad_scenario_inputs(tmp_path) -> None:
    with pytest.raises(CosimInputError, match="unknown scenario 'moe-ep4-dgx-h10'; did you mean 'moe-ep4-dgx-h100'"):
        load_scenario("moe-ep4-dgx-h10")
    bad = tmp_path / "s.yaml"
    bad.write_text("name: x\nworkload: moe-ep4-cpu\nprojection: {host_speed: 2, colour: red}\n")
    with pytest.raises(CosimInputError) as e:
        load_scenario(bad)
    assert str(e.value).startswith(f"{bad}:3:") and "projection.colour: unknown key 'colour'" in str(e.value)
    with pytest.raises(CosimInputError, match="unknown knob"):
        run_scenario(load_scenario("moe-ep4-dgx-h100"), {"gpu.colour": "red"})


SYN = "\n  synthetic:\n    model: qwen3-30b-a3b\n    layout: {ep: 8}\n    batch: {global: 8, micro: 1, seq: 4096}\n"


@pytest.mark.parametrize("workload, want", [
    (SYN + "    bogus: 3", "s.yaml:7:12: workload.synthetic.bogus: unknown key 'bogus'"),
    (SYN + "    dispatch_overhead: 5", "s.yaml:7:24: workload.synthetic.dispatch_overhead: time: bare number 5 needs a unit"),
    (" 5", "s.yaml:2:11: workload: workload must be a workload name or path, or {synthetic: {...}} (got 5)"),
    (SYN.replace("seq: 4096}", "seq: 4096, bogus: 3}"), "s.yaml:6:52: workload.synthetic.batch.bogus: unknown key 'bogus'"),
])
def test_synthetic_workload_errors_name_their_own_key(tmp_path, workload, want) -> None:
    """A mistake inside ``workload: {synthetic: ...}`` is reported at its key (it was reported as the other form
    of the field, 'workload.str: Input should be a valid string', for any mistake in any synthetic scenario)."""
    f = tmp_path / "s.yaml"
    f.write_text(f"name: t\nworkload:{workload}\ntopology: dgx-h100\n")
    with pytest.raises(CosimInputError) as e:
        load_scenario(f)
    assert str(e.value).startswith(str(tmp_path / want)), str(e.value)


@pytest.mark.parametrize("line, want", [
    ("set: {gpu.colour: 2}", "s.yaml:3:19: set.gpu.colour: unknown knob"),
    ("set: {links.nvlink4.bandwidth: 50}", "s.yaml:3:32: set.links.nvlink4.bandwidth: bare number '50' needs a unit"),
    ("set: {topology.links.gpu-pcie.type: pcie9x16}", "s.yaml:3:37: set.topology.links.gpu-pcie.type: "),
    ("topology: dgx-h1000", "s.yaml:3:11: topology: unknown topology 'dgx-h1000'"),
])
def test_scenario_set_and_topology_errors_are_located(tmp_path, line, want) -> None:
    """A bad knob or topology in a scenario file is reported at its line, like any other field."""
    f = tmp_path / "s.yaml"
    f.write_text(f"name: t\nworkload: moe-ep2-decode-cpu\n{line}\n")
    with pytest.raises(CosimInputError) as e:
        load_scenario(f)
    assert str(e.value).startswith(str(tmp_path / want)), str(e.value)


def test_cli_run_json_and_outputs(tmp_path) -> None:
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-m", "cosim", "run", "moe-ep2-decode-dgx-h100", "--json", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    assert s["schema"] == "cosim.summary/2" and s["step_time_s"] > 0
    assert {"summary.json", "timeline.json.gz", "scenario.yaml"} <= {x.name for x in out.iterdir()}
    p = subprocess.run([sys.executable, "-m", "cosim", "run", "moe-ep2-decode-dgx-h100", "--out", str(out)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    # the README's main job prints the DGX H100 figures: 18 x 25 GB/s NVLink, 400 Gb/s NIC, Gen5 x16, 4 x 450 GB/s
    assert p.stdout.splitlines()[0] == ("hardware dgx-h100: 8 x NVIDIA H100 SXM5 80GB; per GPU per direction: "
                                        "scale-up 450 GB/s, scale-out 50 GB/s, host 64 GB/s; bisection 1.8 TB/s")
    p = subprocess.run([sys.executable, "-m", "cosim", "run", "nope"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_replay_projects_a_graph_without_gpu_ops() -> None:
    """An Execution Trace alone (no timings, no kernels) is projected onto the topology's GPU."""
    from cosim.replay import ReplayConfig, replay
    from cosim.resources import shared_dir

    shared = shared_dir()
    if shared is None:
        pytest.skip("../shared not found: needs the PARAM DLRM Execution Trace")
    res = replay(shared / "traces/param-dlrm-v100x8/et/dlrm_eg_0.json.gz", "dgx-h100", ReplayConfig())
    s = res.summary()
    assert len(res.graph.ranks[0].gpu_ops) > 0
    assert s["step_time_s"] > 0 and any("projected" in n for n in s["notes"])


def test_scenario_profile_file_resolves_beside_the_scenario(tmp_path, monkeypatch) -> None:
    """A profile file named in a scenario (replay section or set:) is looked up beside the scenario, like
    its workload and topology; the same name from another working directory still finds it."""
    import shutil

    from cosim.models.profile import _DATA

    d = tmp_path / "sc"
    d.mkdir()
    shutil.copy(_DATA / "h100-sxm5.yaml", d / "myprof.yaml")
    (d / "s.yaml").write_text("name: s\nworkload: moe-ep2-decode-cpu\ntopology: dgx-h100\n"
                              "replay: {durations: modeled, profile: myprof.yaml}\n")
    (d / "t.yaml").write_text("name: t\nworkload: moe-ep2-decode-cpu\ntopology: dgx-h100\n"
                              "set: {durations: modeled, profile: myprof.yaml}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    _, a = run_scenario(load_scenario(d / "s.yaml"))
    _, b = run_scenario(load_scenario(d / "t.yaml"))
    _, c = run_scenario(load_scenario(d / "s.yaml"), {"replay.profile": "h100-sxm5"})
    assert a.config.profile == b.config.profile == str(d / "myprof.yaml")
    assert a.summary()["step_time_s"] == b.summary()["step_time_s"] == c.summary()["step_time_s"]


def test_scenario_and_workload_names_are_looked_up_in_the_working_directory_first(tmp_path, monkeypatch) -> None:
    """``./workloads/scenarios/<name>.yaml`` and ``./workloads/<name>`` win over the installed ones of the same
    name; the other installed ones are still found."""
    import shutil
    from pathlib import Path

    from cosim.resources import bundled_dir
    from cosim.scenario import find_workload

    inst = bundled_dir("workloads")
    sdir = tmp_path / "workloads" / "scenarios"
    sdir.mkdir(parents=True)
    (sdir / f"{DEFAULT_SCENARIO}.yaml").write_text(f"name: {DEFAULT_SCENARIO}\nworkload: moe-ep2-decode-cpu\n")
    (sdir / "mine.yaml").write_text("name: mine\nworkload: my-capture\ntopology: dgx-h100\n")
    shutil.copytree(inst / "moe-ep2-decode-cpu", tmp_path / "workloads" / "my-capture")
    monkeypatch.chdir(tmp_path)
    scn = load_scenario()  # the default name: the working directory's file
    assert Path(scn.source_file) == sdir / f"{DEFAULT_SCENARIO}.yaml" and scn.workload == "moe-ep2-decode-cpu"
    assert {"mine", DEFAULT_SCENARIO, "moe-ep2-decode-dgx-h100"} <= set(list_scenarios())
    assert load_scenario("moe-ep2-decode-dgx-h100").source_file == str(inst / "scenarios/moe-ep2-decode-dgx-h100.yaml")
    assert find_workload("my-capture") == tmp_path / "workloads" / "my-capture"
    assert find_workload("moe-ep4-cpu") == inst / "moe-ep4-cpu" and find_workload("nope") is None
    _, res = run_scenario(load_scenario("mine"))
    assert res.sources == [str(tmp_path / "workloads" / "my-capture")] and res.summary()["step_time_s"] > 0


def test_each_run_writes_its_own_folder_and_a_latest_link(tmp_path, monkeypatch, capsys) -> None:
    """`cosim run` writes cosim-out/<scenario>/<hash of the settings>/ and points cosim-out/<scenario>/latest at
    it: a what-if does not overwrite its baseline; the same settings spelled otherwise reuse their folder; where
    symlinks cannot be made, ``latest`` is a text file; `cosim report` reads cosim-out/<scenario> as its latest."""
    import os
    from pathlib import Path

    import yaml

    from cosim.cli import main
    from cosim.scenario import link_latest, run_folder

    name = "moe-ep2-decode-dgx-h100"
    monkeypatch.chdir(tmp_path)
    root = Path("cosim-out") / name
    assert main(["run", name, "--no-timeline"]) == 0
    text = capsys.readouterr().out
    (base,) = [d for d in root.iterdir() if d.name not in ("latest", "baseline")]
    assert (root / "baseline").resolve() == base.resolve()  # a run without --set is the scenario's baseline
    assert text.splitlines()[-1] == f"run folder: {base} (also {root / 'latest'})"
    assert {"summary.json", "scenario.yaml", "report.html"} <= {p.name for p in base.iterdir()}
    before = (base / "summary.json").read_bytes()

    assert main(["run", name, "--no-timeline", "--json", "--set", "host.speed=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    what_if = Path(out["out"])
    base_step = json.loads(before)["step_time_s"]
    vs = out["vs_baseline"]  # compared with the baseline by itself
    assert vs["delta_s"] == pytest.approx(out["step_time_s"] - base_step, abs=1e-12) and vs["text"]
    assert (root / "baseline").resolve() == base.resolve()  # a what-if does not move the baseline
    assert what_if.parent == root and what_if != base
    assert (base / "summary.json").read_bytes() == before  # the baseline is kept
    assert (root / "latest").is_symlink() and (root / "latest").resolve() == what_if.resolve()
    assert yaml.safe_load((what_if / "scenario.yaml").read_text())["replay_config"]["host_speed"] == 2.0
    assert yaml.safe_load((base / "scenario.yaml").read_text())["replay_config"]["host_speed"] == 1.0
    assert main(["run", name, "--no-timeline", "--json", "--set", "replay.host_speed=2.0"]) == 0
    assert Path(json.loads(capsys.readouterr().out)["out"]) == what_if  # same settings, same folder
    assert sorted(p.name for p in root.iterdir()) == sorted([base.name, what_if.name, "latest", "baseline"])
    assert run_folder(root).resolve() == what_if.resolve() and run_folder(base) == base

    assert main(["report", str(base), str(root), "--out", "r.html", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["proposals"][0]["step_time_s"] == json.loads((what_if / "summary.json").read_text())["step_time_s"]

    def no_symlinks(*a, **k):
        raise OSError("symlinks not supported here")

    monkeypatch.setattr(os, "symlink", no_symlinks)
    assert link_latest(base) == root / "latest"
    assert not (root / "latest").is_symlink() and (root / "latest").read_text() == f"{base.name}\n"
    assert run_folder(root) == root / base.name


def test_synthetic_summary_text_says_where_durations_come_from() -> None:
    """A synthesized step has no measured durations: the text summary names the kernel models."""
    from cosim.output.text import format_summary

    _, res = run_scenario(load_scenario())  # the default: a synthetic training step
    first = format_summary(res.summary()).splitlines()[0]
    assert first == "topology dgx-h100   durations kernel models (synthesized step)   collectives simulated"
    _, cap = run_scenario(load_scenario("moe-ep2-decode-dgx-h100"))
    assert "durations measured" in format_summary(cap.summary()).splitlines()[0]
