"""A new user's bad input, through the CLI: one line on stderr naming the file, the place and the problem, exit
status 2, nothing on stdout and nothing written (README.md: "Bad input ... gets one line naming the file, the place
and the problem")."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.cli import main
from tests._cli import one_error_line

_SCENARIO = """name: bad
workload:
  synthetic:
    model: {model}
    layout: {layout}
    batch: {{global: {glob}, micro: 1, seq: 4096}}
topology: dgx-h100
"""


def _one_line(argv: list[str], capsys: pytest.CaptureFixture[str], out_root: Path) -> str:
    return one_error_line(argv, capsys, out_root, empty_ok=True)


@pytest.mark.parametrize(("model", "layout", "glob", "where", "problem"), [
    # 128 experts over ep 3: the layout line, at the value of ep
    ("qwen3-30b-a3b", "{ep: 3, recompute: full}", 64, ":5:18: workload.synthetic.layout.ep:",
     "not divisible by ep 3"),
    # tp 2 x dp 8 on 8 GPUs: the field the product is checked on (dp), written on line 5
    ("qwen3-30b-a3b", "{tp: 2, ep: 8, dp: 8}", 64, ":5:32: workload.synthetic.layout.dp:", "16 != 8 GPUs"),
    # 63 sequences over dp 8: the global batch's value on line 6
    ("qwen3-30b-a3b", "{ep: 8, recompute: full}", 63, ":6:21: workload.synthetic.batch.global:",
     "63 sequences are not divisible"),
    ("no-such-card", "{ep: 8}", 64, ":4:12: workload.synthetic.model:", "unknown model preset 'no-such-card'"),
])
def test_scenario_file_layout_errors_name_file_and_line(model: str, layout: str, glob: int, where: str,
                                                        problem: str, tmp_path: Path, monkeypatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "bad.yaml"
    f.write_text(_SCENARIO.format(model=model, layout=layout, glob=glob))
    line = _one_line(["run", str(f), "--out", "o"], capsys, tmp_path / "o")
    assert line.startswith(f"cosim: error: {f}{where}"), line
    assert problem in line


def test_set_layout_error_is_not_pinned_on_the_file(tmp_path: Path, monkeypatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """The bad value came from ``--set``: the file's own line (ep: 8) is not where the problem is."""
    monkeypatch.chdir(tmp_path)
    line = _one_line(["run", "--set", "workload.synthetic.layout.ep=3", "--out", "o"], capsys, tmp_path / "o")
    assert line == "cosim: error: workload.synthetic.layout.ep: 128 experts of qwen3-30b-a3b are not divisible by ep 3"


@pytest.mark.parametrize(("param", "values", "where", "problem"), [
    ("workload.synthetic.routng", "[uniform]", ":5:31: workload.synthetic.routng[0]:",
     "unknown key 'routng' (did you mean 'routing'?)"),
    ("workload.synthetic.layout.ep", "[8, x]", ":5:37: workload.synthetic.layout.ep[1]:",
     "unable to parse string as an integer (got 'x')"),
    ("nodes", "[2, 0]", ":5:14: nodes[1]:", "expected 1..1024"),
])
def test_sweep_scenario_knob_refused_before_any_point(param: str, values: str, where: str, problem: str,
                                                      tmp_path: Path, monkeypatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """docs/STUDIES.md: every key and value of a sweep is checked before anything runs; a misspelled synthetic
    field used to run every point, each failing, and exit 1 with a results folder of failures."""
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "sw.yaml"
    f.write_text(f"name: sw\nbase: qwen3-30b-ep8-dgx-h100\ncombine: grid\nparameters:\n  {param}: {values}\n")
    line = _one_line(["sweep", str(f), "--out", "o"], capsys, tmp_path / "o")
    assert line.startswith(f"cosim: error: {f}{where}"), line
    assert problem in line


@pytest.mark.parametrize(("knob", "expected"), [
    ("ranks_per_node=abc", "--set ranks_per_node=abc: expected a whole number"),  # was a ValueError traceback
    ("host.speed=-2", "--set host.speed=-2: must be > 0, got -2.0"),  # was '--set: host_speed must ...'
    ("gpu.scale.gemm=nan", "--set gpu.scale.gemm=nan: must be a factor >= 0, got nan"),
    ("durations=foo", "--set durations=foo: must be 'measured' or 'modeled', got 'foo'"),
])
def test_replay_knob_errors_name_the_knob(knob: str, expected: str, tmp_path: Path, monkeypatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    line = _one_line(["run", "moe-ep4-dgx-h100", "--set", knob, "--out", "o"], capsys, tmp_path / "o")
    assert line == f"cosim: error: {expected}"


def test_model_level_check_points_at_the_field_it_names(tmp_path: Path, monkeypatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """A card's cross-field check (top_k <= num_experts) is at top_k's line, not at the document's first key."""
    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[1]
    card = (root / "cosim" / "capture" / "presets" / "qwen3-30b-a3b.yaml").read_text()
    lines = card.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("top_k:"))
    lines[at] = "top_k: 200"
    (tmp_path / "card.yaml").write_text("\n".join(lines) + "\n")
    f = tmp_path / "s.yaml"
    f.write_text(_SCENARIO.format(model="card.yaml", layout="{ep: 8}", glob=64))
    line = _one_line(["run", str(f), "--out", "o"], capsys, tmp_path / "o")
    assert line == f"cosim: error: {tmp_path / 'card.yaml'}:{at + 1}:8: top_k (200) must be <= num_experts (128)"


def test_set_in_the_same_section_is_not_pinned_on_the_file(tmp_path: Path, monkeypatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """``--set layout.pp=7`` fails the tp*cp*pp check, which names layout.tp: the file's tp line is not the cause."""
    monkeypatch.chdir(tmp_path)
    line = _one_line(["run", "--set", "workload.synthetic.layout.pp=7", "--out", "o"], capsys, tmp_path / "o")
    assert line.startswith("cosim: error: workload.synthetic.layout."), line
    assert ".yaml:" not in line


@pytest.mark.parametrize(("knob", "expected"), [
    ("workload.synthetic.layout={ep: 8", "--set workload.synthetic.layout: malformed YAML: did not find expected ',' "
                                          "or '}'"),
    ("workload.synthetic.layout.pipeline_layers=[7, 8", "--set workload.synthetic.layout.pipeline_layers: malformed "
                                                         "YAML: did not find expected ',' or ']'"),
])
def test_malformed_flow_value_in_set_says_so(knob: str, expected: str, tmp_path: Path, monkeypatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """An unclosed ``{``/``[`` was taken as a string ('Input should be a valid dictionary or instance of
    ParallelLayout (got '{ep: 8')')."""
    monkeypatch.chdir(tmp_path)
    assert _one_line(["run", "--set", knob, "--out", "o"], capsys, tmp_path / "o") == f"cosim: error: {expected}"


def test_baseline_of_another_file_with_the_same_name_is_not_used(tmp_path: Path, monkeypatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A user's edited copy of a bundled scenario keeps its ``name:``, so its runs share cosim-out/<name>/ with the
    bundled one's; a what-if of the copy was compared with the bundled baseline (the default scenario copied at
    twice the global batch, --set host.speed=2: '0.54x slower (+85.7%)'). The baseline that ran other settings is
    passed over, and the what-if line says why; the copy's own baseline is then used."""
    import json

    monkeypatch.chdir(tmp_path)
    root = Path(__file__).resolve().parents[1]
    src = (root / "workloads" / "scenarios" / "moe-ep4-dgx-h100.yaml").read_text()
    (tmp_path / "my.yaml").write_text(src.replace("aten_overhead: 4 us", "aten_overhead: 8 us"))
    assert main(["run", "moe-ep4-dgx-h100", "--json"]) == 0  # the bundled baseline
    capsys.readouterr()
    assert main(["run", "my.yaml", "--set", "host.speed=4"]) == 0
    out = capsys.readouterr().out
    assert "vs baseline" not in out
    assert "cosim-out/moe-ep4-dgx-h100/baseline ran other settings" in out and "run `cosim run my.yaml`" in out
    assert main(["run", "./my.yaml", "--json"]) == 0  # the copy's own baseline (the path spelled differently)
    base = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(["run", "my.yaml", "--set", "host.speed=4", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["baseline_dir"] == "cosim-out/moe-ep4-dgx-h100/baseline"
    assert got["vs_baseline"]["delta_s"] == pytest.approx(got["step_time_s"] - base)


def test_set_of_the_gpus_is_not_pinned_on_the_file(tmp_path: Path, monkeypatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``dsv3-1024`` (tp 2, pp 8) with ``--set nodes=129``: 1032 GPUs, which tp*cp*pp = 16 does not divide; the
    file's ``tp: 2`` is fine (it divides the file's 1024 GPUs), so the error is not put at its line (s11-read3)."""
    monkeypatch.chdir(tmp_path)
    line = _one_line(["run", "dsv3-1024", "--set", "nodes=129", "--out", "o"], capsys, tmp_path / "o")
    assert line.startswith("cosim: error: workload.synthetic.layout.tp: tp*cp*pp = 2*1*8 = 16 does not divide"), line
    assert ".yaml:" not in line


def test_set_of_another_section_is_not_pinned_on_the_file(tmp_path: Path, monkeypatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """8 GPUs, tp 2, global batch 12: dp 4 divides it. ``--set workload.synthetic.layout.tp=1`` makes dp 8, and the
    check of ``batch.global`` (12 not divisible by 8) fails: the file's ``global: 12`` is not the problem (s11-read3)."""
    monkeypatch.chdir(tmp_path)
    f = tmp_path / "s.yaml"
    f.write_text(_SCENARIO.format(model="qwen3-30b-a3b", layout="{tp: 2, ep: 4, recompute: full}", glob=12))
    line = _one_line(["run", str(f), "--set", "workload.synthetic.layout.tp=1", "--out", "o"], capsys, tmp_path / "o")
    assert line.startswith("cosim: error: workload.synthetic.batch.global: 12 sequences are not divisible"), line
    assert ".yaml:" not in line


def test_a_value_applied_through_the_api_is_not_blamed_on_the_file() -> None:
    """``apply_scenario_sets`` then ``run_scenario`` (the Python API's two steps) is ``cosim run --set``: the value
    is not in the scenario file, so the error names the field without a file line (it pointed at the file's
    ``model:`` line before the scenario remembered the keys applied to it)."""
    from cosim.errors import CosimInputError
    from cosim.scenario import apply_scenario_sets, load_scenario, run_scenario

    dec, _ = apply_scenario_sets(load_scenario("dsv3-decode-ep128"), {"workload.synthetic.moe_router_fusion": "false"})
    with pytest.raises(CosimInputError, match=r"^workload\.synthetic\.moe_router_fusion: a training field") as ei:
        run_scenario(dec)
    assert not ei.value.location.file
