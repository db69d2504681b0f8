"""Modeled replay: per-class kernel error only against real measurements, and notes on the profile used.

Tests that read ../shared/traces skip when that folder is absent.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.output.text import format_summary
from cosim.replay import ReplayConfig, replay
from cosim.resources import bundled_dir, shared_dir

SHARED = shared_dir()
BERT = "traces/tracelens-h100/gaunernst_bert-small-uncased__1016001.json.gz"


def _shared(rel: str) -> Path:
    if SHARED is None:
        pytest.skip("../shared not found: needs the public traces (set COSIM_SHARED)")
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{rel} not in ../shared")
    return path


def test_projected_cpu_capture_has_no_kernel_error_by_class() -> None:
    res = replay(bundled_dir("workloads") / "moe-ep2-decode-cpu", "dgx-h100", ReplayConfig(durations="modeled"))
    s = res.summary()
    assert res.kernel_errors is None and "kernel_error_by_class" not in s
    assert "kernel model error vs measured" not in format_summary(s)
    assert any("no kernel model error by class: the projected GPU op durations are not measurements" in n
               for n in s["notes"])


def test_execution_trace_alone_has_no_kernel_error_by_class() -> None:
    s = replay(_shared("traces/hta/simple-add-et.json.gz"), None, ReplayConfig(durations="modeled")).summary()
    assert "kernel_error_by_class" not in s
    assert any("projected" in n for n in s["notes"])


def test_cross_accelerator_modeled_replay_names_its_profile_and_omits_the_error() -> None:
    trace = _shared(BERT)
    s = replay(trace, None, ReplayConfig(durations="modeled", accelerator="b200")).summary()
    assert "kernel_error_by_class" not in s and "kernel model error vs measured" not in format_summary(s)
    note = next(n for n in s["notes"] if n.startswith("GPU op durations predicted"))
    assert "NVIDIA B200" in note and "bundled for the accelerator" not in note
    assert "profile h100-sxm5" in note and "cross-GPU" in note
    assert "measured on NVIDIA H100" in note
    same = replay(trace, None, ReplayConfig(durations="modeled")).summary()  # the traced GPU: scored
    assert same["kernel_error_by_class"]["gemm"]["n"] > 0
    assert any("profile h100-sxm5, bundled for the accelerator" in n for n in same["notes"])


def test_profile_without_modeled_durations_is_noted_as_unused() -> None:
    wl = bundled_dir("workloads") / "moe-ep2-decode-cpu"
    s = replay(wl, "dgx-h100", ReplayConfig(profile="b300")).summary()
    assert any(n.startswith("profile b300 unused") for n in s["notes"])
    assert "profile b300 unused" in format_summary(s)
    assert not any("unused" in n for n in replay(wl, "dgx-h100", ReplayConfig()).summary()["notes"])


def test_cli_replay_profile_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """``cosim replay --durations modeled --profile NAME`` predicts with that profile (a B300 profile on an
    H100 trace: cross-GPU, a different step time than the bundled H100 one) and its note says so."""
    import json

    from cosim.cli import main

    t = str(_shared(BERT))
    assert main(["replay", t, "--durations", "modeled", "--profile", "b300", "--json"]) == 0
    b300 = json.loads(capsys.readouterr().out)
    assert main(["replay", t, "--durations", "modeled", "--json"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert b300["step_time_s"] != own["step_time_s"]
    assert any("profile b300, fitted on b300: predicted cross-GPU" in n for n in b300["notes"])
    assert any("profile h100-sxm5, bundled for the accelerator" in n for n in own["notes"])
