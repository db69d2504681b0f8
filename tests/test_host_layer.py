"""cosim's own host time per layer and micro-batch of a synthesized e2e row (validation.e2e.host_cost
.synthetic_layer_host), checked by hand on Qwen3-30B at micro-batch 1 on 8 B200 (round 14, RESULTS.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cosim.errors import CosimInputError
from validation.e2e import run as e2e
from validation.e2e.host_cost import main, synthetic_layer_host

US = 1e-6


@pytest.fixture(scope="module")
def b200() -> dict[str, float]:
    return synthetic_layer_host("qwen3-30b-b200-8-mxfp8")


def test_expert_grouped_gemms_cost_the_host_what_the_spec_says(b200: dict) -> None:
    # one launch call on the hgx-b200 preset's Xeon: 4 us launch + 12 us dispatch_overhead, then expert_gemm_host
    # 33 us for each of the other 15 local experts (EP8: 128 / 8 = 16): 16 + 15 x 33 = 511 us per grouped GEMM
    per_gemm = (4 + 12 + 15 * 33) * US
    assert b200["host_by_op"]["moe.experts_fc#"] == pytest.approx(2 * per_gemm)  # fc1 and fc2 forward
    assert b200["host_by_op"]["moe.experts_fc#.dgrad"] == pytest.approx(2 * per_gemm)
    # the wgrad completes one parameter per local expert: 16 eager steps of 12 us (DDP hook, AccumulateGrad)
    assert b200["host_by_op"]["moe.experts_fc#.wgrad"] == pytest.approx(2 * (per_gemm + 16 * 12 * US))


def test_the_parts_add_up(b200: dict) -> None:
    assert sum(b200["host_by_op"].values()) == pytest.approx(b200["host_busy_s"])
    # a layer and micro-batch of one rank: its GPU is computing, waiting on communication or on the host (idle
    # otherwise: under 0.1 ms here, no bubble at pp 1)
    parts = b200["compute_s"] + b200["exposed_comm_s"] + b200["host_bound_idle_s"]
    assert parts <= b200["step_s"] + 1e-9
    assert b200["step_s"] - parts < 0.1e-3
    # the host is busy or waiting in the dropless sync nearly the whole layer (host-bound regime)
    assert b200["host_busy_s"] + b200["sync_stall_s"] > 0.95 * b200["step_s"]
    assert b200["layers_per_stage"] == 48


def test_unknown_row_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(CosimInputError, match="no row 'nope'"):
        synthetic_layer_host("nope")
    assert main(["--layer", "nope"]) == 2
    assert "no row 'nope'" in capsys.readouterr().err


def test_row_that_is_not_whole_nodes_is_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """(Round-14 review.) run.py reports such a row as not run (its _NotRun); --layer must answer one line and exit 2, not a
    traceback: 4 GPUs of an 8-GPU hgx-b200 node."""
    doc = yaml.safe_load(e2e.CASES.read_text())
    row = next(c for c in doc["cases"] if c["id"] == "qwen3-30b-b200-8-mxfp8")
    row = dict(row, gpus=4, layout=dict(row["layout"], ep=4), batch=dict(row["batch"], **{"global": 256}))
    doc["cases"] = [row]
    p = tmp_path / "cases.yaml"
    p.write_text(yaml.safe_dump(doc, sort_keys=False))
    assert main(["--layer", row["id"], "--cases", str(p)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "4 GPUs" in err, err


def test_per_layer_divides_by_rank_0_layers() -> None:
    """mb260401-dsv3-b300-256-mxfp8: pp 8, pipeline_layers [8]*7 + [5]: rank 0 (the rank measured) holds 8 decoder
    layers (its graph: 8 forward attn.norm per micro-batch), not 61 / 8 = 7.625; dividing by 7.625 makes every
    per-layer figure 8 / 7.625 = 4.9 % too large."""
    r = synthetic_layer_host("mb260401-dsv3-b300-256-mxfp8")
    assert r["layers_per_stage"] == 8
