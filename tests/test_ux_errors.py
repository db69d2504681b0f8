"""First-use friction: the one-line errors of a mistyped ``--set`` name the key, the valid ones and the nearest."""
from __future__ import annotations

import pytest

from cosim.errors import CosimInputError
from cosim.replay import ReplayConfig, apply_sets
from cosim.scenario import apply_scenario_sets, load_scenario


def _err(sets: dict[str, str]) -> str:
    with pytest.raises(CosimInputError) as info:
        _, rest = apply_scenario_sets(load_scenario(), sets)
        apply_sets(ReplayConfig(), rest)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_knob_names_run_families_and_nearest() -> None:
    msg = _err({"host.speedd": "2"})
    assert "did you mean host.speed?" in msg
    for family in ("workload.synthetic.", "nodes", "topology.<path>", "links.nvlink4.bandwidth", "host.speed",
                   "projection."):
        assert family in msg, family
    assert "did you mean links.nvlink4.bandwidth?" in _err({"link.nvlink4.bandwidth": "1 GB/s"})
    assert "did you mean" not in _err({"zzz": "1"})


@pytest.mark.parametrize(("key", "bad", "near", "valid"), [
    ("workload.synthetic.layout.epp", "epp", "ep", "vpp"),
    ("workload.synthetic.batch.globl", "globl", "global", "micro"),
    ("workload.synthetic.foo", "foo", None, "routing"),
])
def test_unknown_synthetic_key_names_valid_ones(key: str, bad: str, near: str | None, valid: str) -> None:
    msg = _err({key: "32"})
    assert msg.startswith(f"--set {key}: unknown key {bad!r}"), msg
    assert "tagged-union" not in msg and "Extra inputs" not in msg
    assert f"did you mean {near!r}" in msg if near else "did you mean" not in msg
    assert valid in msg.split("valid:", 1)[1]


def test_unknown_key_in_a_union_member() -> None:
    msg = _err({"workload.synthetic.routing": '{model: "zipf:1.2", foo: 1}'})
    assert msg.startswith("--set workload.synthetic.routing.foo: unknown key 'foo'"), msg
    assert "placement" in msg


def test_scenario_file_unknown_key_valid_ones(tmp_path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text("name: s\nworkload:\n  synthetic:\n    model: qwen3-30b-a3b\n    batch: {global: 64, seq: 4096, micr: 1}\n"
                 "topology: dgx-h100\n")
    with pytest.raises(CosimInputError) as info:
        load_scenario(str(p))
    msg = str(info.value)
    assert "s.yaml:5:" in msg and "workload.synthetic.batch.micr: unknown key 'micr' (did you mean 'micro'?)" in msg


@pytest.mark.parametrize(("scenario", "sets"), [
    (None, {"workload.synthetic.layout.ep": "1"}),
    ("dsv3-decode-ep128", {"workload.synthetic.batch.requests_per_gpu": "4000"}),
])
def test_out_of_memory_names_the_set_key(scenario: str | None, sets: dict[str, str]) -> None:
    from cosim.scenario import run_scenario

    with pytest.raises(CosimInputError, match="out of memory") as info:
        run_scenario(load_scenario(scenario), sets)
    assert "--set workload.synthetic.allow_oom=true" in str(info.value)


def test_bare_zipf_is_documented_and_a_glued_exponent_refused() -> None:
    from pathlib import Path

    from cosim.scenario import run_scenario

    root = Path(__file__).resolve().parents[1]
    assert "a bare `zipf` means `zipf:1.0`" in (root / "docs" / "SYNTHESIS.md").read_text()
    assert "a bare ``zipf`` is ``zipf:1.0``" in (root / "cosim" / "workload" / "synth" / "spec.py").read_text()
    with pytest.raises(CosimInputError, match=r"'zipf1\.2'.*zipf:1\.2"):
        run_scenario(load_scenario(), {"workload.synthetic.routing": "zipf1.2"})
