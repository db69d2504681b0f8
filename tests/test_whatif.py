"""docs/WHATIF.md's tested block: every command runs as written and gives the figures its comment quotes.

Each line is `cosim run ARGS  # ...: A ms -> B ms` (step without and with the line's --sets, compared by cosim with
the scenario's baseline run above it) or `# ...: A ms per step` (a baseline). The test runs the lines in order in
a fresh folder, as a user would, and checks the step time (within 1%: the doc rounds) and the direction cosim
reports (`vs_baseline.delta_s`)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from cosim.cli import main

DOC = Path(__file__).resolve().parents[1] / "docs" / "WHATIF.md"
MARK = "<!-- whatif: tested -->"
CHANGE = re.compile(r"([\d.]+) ms -> ([\d.]+) ms")
BASE = re.compile(r"([\d.]+) ms per step")


def whatif_lines() -> list[tuple[list[str], str]]:
    """(argv after `cosim`, comment) of each command in the block that follows MARK."""
    text = DOC.read_text()
    assert MARK in text, f"{DOC}: no '{MARK}' block"
    block = text.split(MARK, 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    out = []
    for line in block.strip().splitlines():
        cmd, _, comment = line.partition("  #")
        argv = shlex.split(cmd)
        assert argv[:2] == ["cosim", "run"], line
        out.append((argv[1:], comment.strip()))
    return out


def test_block_is_found_and_every_line_quotes_a_step() -> None:
    lines = whatif_lines()
    assert len(lines) >= 7
    for _, comment in lines:
        assert CHANGE.search(comment) or BASE.search(comment), comment


@pytest.fixture(scope="module")
def block_runs(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[list[str], str, dict]]:
    """Each tested line run in order, in a fresh folder (baselines are the block's own runs): (argv, comment,
    its --json summary). ``--json`` must print nothing but JSON on stdout."""
    import contextlib
    import io

    runs = []
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path_factory.mktemp("whatif"))
        for argv, comment in whatif_lines():
            buf = io.StringIO()
            with contextlib.redirect_stdout(buf):
                code = main([*argv, "--json", "--no-timeline"])
            assert code == 0, argv
            runs.append((argv, comment, json.loads(buf.getvalue())))
    return runs


def test_whatif_commands_give_their_figures(block_runs: list[tuple[list[str], str, dict]]) -> None:
    for argv, comment, summary in block_runs:
        step_ms = summary["step_time_s"] * 1e3
        if m := CHANGE.search(comment):
            before, after = float(m[1]), float(m[2])
            vs = summary["vs_baseline"]
            assert vs is not None, (argv, "not compared with the scenario's baseline")
            assert (step_ms - vs["delta_s"] * 1e3) == pytest.approx(before, rel=0.01), argv
            assert step_ms == pytest.approx(after, rel=0.01), (argv, step_ms)
            assert (vs["delta_s"] > 0) == (after > before), (argv, vs["text"])
        else:
            m = BASE.search(comment)
            assert m is not None
            assert step_ms == pytest.approx(float(m[1]), rel=0.01), (argv, step_ms)
            assert "--set" not in argv  # a baseline


def test_whatif_directions_are_physical(block_runs: list[tuple[list[str], str, dict]]) -> None:
    """What the cookbook's table says on the default scenario, from the runs' own figures: more NVLink or a
    faster host never slows the step; FP8 does not slow compute (FP8 experts alone hold less memory than all-FP8); skew slows the step and its hot rank computes
    more than any rank does under uniform routing; EP64 decode holds more per GPU than EP128."""
    by = {" ".join(argv): s for argv, _, s in block_runs}
    base = by["run"]
    nvl = by["run --set links.nvlink4.bandwidth=50 GB/s"]
    host = by["run --set host.speed=2"]
    fp8 = by["run --set workload.synthetic.precision=fp8"]
    zipf = by["run --set workload.synthetic.routing=zipf:1.2"]
    experts = by["run --set workload.synthetic.expert_precision=fp8"]
    assert nvl["step_time_s"] < base["step_time_s"]
    assert nvl["breakdown"]["exposed_communication"] < base["breakdown"]["exposed_communication"]
    assert host["step_time_s"] < base["step_time_s"]
    assert fp8["breakdown"]["compute"] <= base["breakdown"]["compute"]
    assert zipf["step_time_s"] > base["step_time_s"]
    # FP8 routed experts only: their FP8 weight copies, not the dense ones; the dispatch's exposure as in BF16
    assert base["memory_per_gpu_bytes"] < experts["memory_per_gpu_bytes"] < fp8["memory_per_gpu_bytes"]
    assert experts["breakdown"]["exposed_communication"] == pytest.approx(base["breakdown"]["exposed_communication"],
                                                                          rel=1e-3)
    hot = max(r["breakdown"]["compute"] for r in zipf["ranks"])
    assert hot > max(r["breakdown"]["compute"] for r in base["ranks"])
    ep128 = by["run dsv3-decode-ep128"]
    ep64 = by["run dsv3-decode-ep128 --set workload.synthetic.layout.ep=64 --set nodes=8"]
    assert ep64["memory_per_gpu_bytes"] > ep128["memory_per_gpu_bytes"]  # twice the experts per GPU
