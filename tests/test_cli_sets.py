"""`--set` knobs that a scenario's workload cannot honour are refused, not silently ignored (the run would
otherwise print the baseline's step as the what-if's answer)."""

from __future__ import annotations

import pytest

from cosim.cli import build_parser, main


@pytest.mark.parametrize(("cmd", "knob", "instead"), [
    ("run", "projection.dtype=fp8", "workload.synthetic.precision"),
    ("sensitivity", "projection.dtype=fp8", "workload.synthetic.precision"),
    ("run", "cuda_graphs=true", "workload.synthetic.layout.cuda_graphs=true"),
    ("run", "durations=modeled", "workload.synthetic.profile"),
    ("run", "profile=b300", "workload.synthetic.profile"),
])
def test_capture_knob_on_synthetic_scenario_is_one_line(cmd: str, knob: str, instead: str,
                                                        capsys: pytest.CaptureFixture[str], tmp_path,
                                                        monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    # the default scenario is a synthesized Qwen3-30B step: these knobs only act on captured traces
    assert main([cmd, "--set", knob, "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "qwen3-30b-ep8-dgx-h100.yaml" in lines[0]
    assert f"--set {knob.split('=')[0]}:" in lines[0] and instead in lines[0]
    assert not (tmp_path / "cosim-out").exists()  # nothing half-written


def test_projection_knob_still_applies_with_a_captured_workload() -> None:
    from cosim.scenario import apply_scenario_sets, load_scenario

    scn, _ = apply_scenario_sets(load_scenario("moe-ep4-dgx-h100"), {"projection.dtype": "fp8"})  # a capture: fine
    assert scn.projection.dtype == "fp8"
    # replacing the synthetic workload in the same sets makes projection.* meaningful again
    scn, _ = apply_scenario_sets(load_scenario(None), {"workload": "moe-ep4-cpu", "projection.dtype": "fp8"})
    assert scn.workload == "moe-ep4-cpu" and scn.projection.dtype == "fp8"


@pytest.mark.parametrize("knob", ["projection.dtype", "cuda_graphs", "host.cuda_graphs", "replay.cuda_graphs",
                                  "durations", "replay.profile", "models.profile"])
def test_python_api_refuses_capture_knobs_on_a_synthetic_workload(knob: str) -> None:
    """The layer that knows the workload refuses them, so every caller (run, sensitivity, sweep, the Python API,
    the Chakra export) does; they used to pass through the API and return the baseline's figures."""
    from cosim.errors import CosimInputError
    from cosim.scenario import apply_scenario_sets, load_scenario, run_scenario

    for call in (apply_scenario_sets, run_scenario):
        with pytest.raises(CosimInputError) as exc:
            call(load_scenario(None), {knob: "fp8" if knob.startswith("projection") else "on"})  # type: ignore[operator]
        assert exc.value.message.startswith(f"--set {knob}: ") and "workload is synthetic" in exc.value.message
        assert str(exc.value).startswith(str(load_scenario(None).source_file))


@pytest.mark.parametrize("where", ["parameters:\n  projection.dtype: [bf16, fp8]\n",
                                   "parameters:\n  nodes: [1, 2]\nset:\n  projection.dtype: fp8\n"])
def test_sweep_refuses_capture_knobs_on_a_synthetic_base(where: str, capsys: pytest.CaptureFixture[str], tmp_path,
                                                         monkeypatch) -> None:
    """A sweep over a projection knob of a synthetic base is refused before anything runs (exit 2, one line at the
    key's line), not run as N copies of the baseline."""
    monkeypatch.chdir(tmp_path)
    spec = tmp_path / "sweep.yaml"
    spec.write_text(f"base: qwen3-30b-ep8-dgx-h100\n{where}")
    assert main(["sweep", str(spec), "--json"]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert out == "" and len(lines) == 1, err
    line = 3 if where.startswith("parameters:\n  projection") else 5
    assert f"sweep.yaml:{line}" in lines[0] and "--set projection.dtype:" in lines[0], lines[0]
    assert "workload.synthetic.precision" in lines[0]
    assert not (tmp_path / "cosim-out").exists()
    # with a workload parameter (a capture per point) the same knob is a fine sweep
    spec.write_text("base: qwen3-30b-ep8-dgx-h100\nparameters:\n  projection.dtype: [bf16]\n"
                    "set:\n  workload: moe-ep4-cpu\n")
    from cosim.sweep import load_sweep

    assert load_sweep(spec).parameters == {"projection.dtype": ["bf16"]}


def test_run_help_names_the_synthetic_knobs() -> None:
    """The --set examples of `cosim run --help` are ones the default (synthetic) scenario honours."""
    sub = build_parser(["run"], everything=False)._subparsers._group_actions[0].choices["run"]  # type: ignore[union-attr]
    help_text = next(a.help for a in sub._actions if a.dest == "sets") or ""
    for key in ("workload.synthetic.precision=fp8", "workload.synthetic.layout.ep=32", "nodes=64",
                "workload.synthetic.routing=zipf:1.2", "docs/WHATIF.md"):
        assert key in help_text, key


def test_what_if_run_says_what_changed_and_against_what(capsys: pytest.CaptureFixture[str], tmp_path,
                                                         monkeypatch) -> None:
    """A `--set` run names its knobs and the baseline it was compared with; without a baseline it says how to
    get one (it used to print nothing, so a user could not tell a what-if from a baseline)."""
    import json

    name = "moe-ep2-decode-dgx-h100"
    monkeypatch.chdir(tmp_path)
    assert main(["run", name, "--no-timeline", "--set", "host.speed=2"]) == 0  # no baseline yet
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == (f"what-if: host.speed=2; no baseline to compare with: run `cosim run {name}` without --set "
                    "first, or pass --baseline RUN_DIR")
    assert main(["run", name, "--no-timeline"]) == 0
    assert not capsys.readouterr().out.splitlines()[-1].startswith("what-if")  # a baseline run says nothing
    assert main(["run", name, "--no-timeline", "--set", "host.speed=2"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"what-if: host.speed=2 vs cosim-out/{name}/baseline"
    assert main(["run", name, "--no-timeline", "--json", "--set", "host.speed=2"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sets"] == {"host.speed": "2"} and out["baseline_dir"] == f"cosim-out/{name}/baseline"
    assert out["vs_baseline"]["text"]
