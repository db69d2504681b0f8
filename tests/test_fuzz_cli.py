"""Bad input through the command line, found by fuzzing the importers field by field (s15-fuzz): every case here
was a Python traceback (ValueError, OverflowError, MemoryError, AttributeError) before its fix. Each must now be
exit status 2, one line on stderr naming the file (and, where the file has lines, the place), nothing on stdout and
no output folder. tests/test_fuzz.py mutates at random through the API; these are the cases it did not reach."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests._cli import one_error_line

_SYNTH = """name: fz
workload:
  synthetic:
    model: {model}
    layout: {{ep: 2}}
    batch: {{global: {glob}, micro: 1, seq: 128}}
    routing: {routing}
topology: dgx-h100
{extra}"""

_CAPTURE = """name: fzcap
workload: moe-ep2-decode-cpu
topology: dgx-h100
{extra}"""


def _run(tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[str, Path]:
    f = tmp_path / "s.yaml"
    f.write_text(text)
    return one_error_line(["run", str(f), "--out", str(tmp_path / "o"), "--no-progress"], capsys, tmp_path / "o"), f


def _synth(model: str = "tiny-moe", glob: int | str = 8, routing: str = "uniform", extra: str = "") -> str:
    return _SYNTH.format(model=model, glob=glob, routing=routing, extra=extra)


@pytest.mark.parametrize(("extra", "where", "problem"), [
    # ReplayConfig's ValueError escaped: the scenario schema took any string and any positive float
    ("replay: {durations: soon}", ":9:21: replay.durations:", "Input should be 'measured' or 'modeled'"),
    ("replay: {collectives: soon}", ":9:23: replay.collectives:", "Input should be 'measured' or 'simulated'"),
    ("replay: {host_speed: .inf}", ":9:22: replay.host_speed:", "finite number"),
])
def test_replay_fields_of_a_scenario(extra: str, where: str, problem: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    line, f = _run(tmp_path, _synth(extra=extra), capsys)
    assert line.startswith(f"cosim: error: {f}{where}"), line
    assert problem in line


@pytest.mark.parametrize(("extra", "where", "problem"), [
    ("replay: {ranks_per_node: 0}", ":4:26: replay.ranks_per_node:", "greater than or equal to 1"),
    ("replay: {precision: {experts: fp9}}", ":4:31: replay.precision.experts:", "'bf16', 'fp8' or 'mxfp8'"),
    ("projection: {dtype: soon}", ":4:21: projection.dtype:", "expected 'captured' or one of"),
    ("projection: {host_speed: .inf}", ":4:26: projection.host_speed:", "finite number"),
])
def test_capture_scenario_fields(extra: str, where: str, problem: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    line, f = _run(tmp_path, _CAPTURE.format(extra=extra), capsys)
    assert line.startswith(f"cosim: error: {f}{where}"), line
    assert problem in line


def test_negative_routing_seed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """numpy's PCG64 refused it deep in synthesis ('expected non-negative integer')."""
    line, f = _run(tmp_path, _synth(routing="{model: 'zipf:1.2', seed: -1}"), capsys)
    assert line.startswith(f"cosim: error: {f}:7:40: workload.synthetic.routing.seed:"), line


def test_absurd_global_batch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2**63 sequences: the pipeline schedule listed 2**60 units (MemoryError after ~15 s)."""
    line, f = _run(tmp_path, _synth(glob=2**63), capsys)
    assert line.startswith(f"cosim: error: {f}:6:21: workload.synthetic.batch.global:"), line
    assert "at most 1048576 are simulated" in line


_HF = {"model_type": "mixtral", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
       "num_key_value_heads": 2, "vocab_size": 1024, "num_local_experts": 8, "num_experts_per_tok": 2,
       "intermediate_size": 256}


_GPT_OSS = {"model_type": "gpt_oss", "hidden_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1024, "num_local_experts": 8, "experts_per_token": 2,
            "intermediate_size": 256, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]}


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("hidden_size", float("inf"), "hidden_size: expected a whole number, got inf"),  # OverflowError
    ("num_hidden_layers", 3.5, "num_hidden_layers: expected a whole number, got 3.5"),  # was taken as 3
    # gpt-oss: the expected layer_types were listed for 2**63 layers (MemoryError)
    ("num_hidden_layers", 2**63, "layer_types: 2 entries for num_hidden_layers 9223372036854775808"),
    ("hidden_size", 1e300, "hidden_size (card field): Input should be less than or equal to 1048576"),  # OverflowError
    ("hidden_size", 2**21, "hidden_size (card field): Input should be less than or equal to 1048576"),
    ("num_local_experts", 2**63, "num_experts (card field): Input should be less than or equal to 65536"),  # MemoryError
])
def test_hugging_face_config_numbers(field: str, value: float, problem: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**(_GPT_OSS if field == "num_hidden_layers" else _HF), field: value}))
    line, f = _run(tmp_path, _synth(model="config.json"), capsys)
    assert line.startswith(f"cosim: error: {f}:4:12: workload.synthetic.model: {cfg}: {problem}"), line


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("num_layers", "100000", "Input should be less than or equal to 4096"),  # 1e300: OverflowError in the layout
    ("rope_mscale", ".inf", "Input should be a finite number"),  # an infinite RoPE factor, accepted
])
def test_model_card_numbers(field: str, value: str, problem: str, tmp_path: Path,
                            capsys: pytest.CaptureFixture[str]) -> None:
    root = Path(__file__).resolve().parents[1]
    lines = (root / "cosim" / "capture" / "presets" / "tiny-moe.yaml").read_text().splitlines()
    lines = [ln for ln in lines if not ln.startswith(f"{field}:")] + [f"{field}: {value}"]
    card = tmp_path / "card.yaml"
    card.write_text("\n".join(lines) + "\n")
    line, _ = _run(tmp_path, _synth(model="card.yaml"), capsys)
    assert line.startswith(f"cosim: error: {card}:{len(lines)}:"), line
    assert f"{field}: {problem}" in line


_CAPTURE_ROUTING = {"routing": {"layers": [{"layer": 0, "tokens_per_expert": [[1] * 8, [2] * 8]},
                                           {"layer": 1, "tokens_per_expert": [[1] * 8, [2] * 8]}]}}


@pytest.mark.parametrize(("doc", "where", "problem"), [
    # AttributeError: 'str' object has no attribute 'get'
    ({"routing": {"layers": [_CAPTURE_ROUTING["routing"]["layers"][0], "x"]}}, ":21:5: routing.layers[1]:",
     "expected a mapping with tokens_per_expert"),
    # ValueError: inhomogeneous shape
    ({"routing": {"layers": [{"layer": 0, "tokens_per_expert": [[1] * 8, [1] * 7]}] * 2}},
     ":6:5: routing.layers[0].tokens_per_expert:", "all of one length"),
    # ValueError: could not convert string to float
    ({"experts": ["a"] * 8}, ":2:1: experts:", "expected a list of numbers"),
    # TypeError: 'int' object is not subscriptable
    ({"layers": [3], "experts": [1] * 8}, ":11:3: layers[0]:", "expected {layer: <whole number>, experts: [...]}"),
])
def test_routing_weights_file(doc: dict, where: str, problem: str, tmp_path: Path,
                              capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump(doc))
    line, _ = _run(tmp_path, _synth(routing="w.yaml"), capsys)
    assert line.startswith(f"cosim: error: {w}{where}"), line
    assert problem in line


def test_topology_repeat_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A link entry's ``repeat: 2**63`` listed every binding (MemoryError); a device's ``count`` was bounded."""
    f = tmp_path / "t.yaml"
    f.write_text("name: t\nextends: dgx-h100\nlinks:\n"
                 "  - {between: [\"gpu{i}\", \"pcie{i}\"], type: pcie5x16, repeat: 9223372036854775808}\n")
    line = one_error_line(["topo", "check", str(f)], capsys, tmp_path / "o")
    assert line.startswith(f"cosim: error: {f}:4:"), line
    assert "links[0].repeat: repeat generates 9223372036854775808 links; at most 100000" in line


def test_sweep_samples_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``samples: 2**63`` drew every point before the first ran (MemoryError, and nothing said why)."""
    (tmp_path / "base.yaml").write_text(_synth())
    f = tmp_path / "w.yaml"
    f.write_text("name: w\nbase: base.yaml\ncombine: random\nsamples: 9223372036854775808\n"
                 "parameters:\n  host.speed: [1, 2]\n")
    line = one_error_line(["sweep", str(f), "--out", str(tmp_path / "o"), "--workers", "1", "--no-progress"], capsys,
                     tmp_path / "o")
    assert line == f"cosim: error: {f}:4:10: samples: 9223372036854775808 points; a sweep runs at most 65536", line


@pytest.mark.parametrize(("summary", "problem"), [
    ("[]", "summary.json: expected a JSON object (a summary.json of cosim run), got list"),  # AttributeError
    ('{"step_time_s": "x"}', "summary.json: step_time_s: expected seconds >= 0 or null, got 'x'"),  # TypeError
    ('{"step_time_s": 1.0, "breakdown": {"gpu": "x"}}', "summary.json: breakdown.gpu: expected seconds, got 'x'"),
])
def test_baseline_and_report_of_a_foreign_summary(summary: str, problem: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A run folder whose summary.json was edited or is not cosim's: ``cosim run --baseline`` failed after the new
    run's files were written (a half-written folder and a traceback), ``cosim report`` in the middle of its page."""
    base = tmp_path / "b"
    base.mkdir()
    (base / "summary.json").write_text(summary)
    line = one_error_line(["run", "moe-ep4-dgx-h100", "--baseline", str(base), "--out", str(tmp_path / "o"),
                      "--no-progress"], capsys, tmp_path / "o")
    assert line == f"cosim: error: {base}/{problem}", line
    line = one_error_line(["report", str(base), str(base), "--out", str(tmp_path / "o" / "r.html")], capsys, tmp_path / "o")
    assert line == f"cosim: error: {base}/{problem}", line


@pytest.mark.parametrize(("knob", "expected"), [
    ("projection.dtype=foo", "--set projection.dtype=foo: expected 'captured' or one of"),  # was 'dtype: ...'
    ("projection.host_speed=-1", "--set projection.host_speed=-1: Input should be greater than 0"),
])
def test_projection_set_names_the_knob(knob: str, expected: str, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    line = one_error_line(["run", "moe-ep4-dgx-h100", "--set", knob, "--out", str(tmp_path / "o")], capsys, tmp_path / "o")
    assert line.startswith(f"cosim: error: {expected}"), line


def test_sequence_length_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """2**63 tokens per sequence (with allow_oom, past the memory check) overflowed the step's int64 byte counts."""
    text = _synth(extra="").replace("seq: 128}", "seq: 9223372036854775808}\n    allow_oom: true")
    line, f = _run(tmp_path, text, capsys)
    assert line.startswith(f"cosim: error: {f}:6:39: workload.synthetic.batch.seq: Input should be less than or "
                           "equal to 1073741824"), line


_E2E_CASE = """sources: {{MB2602: "https://example.org"}}
cases:
  - id: fz-1
    model: tiny-moe
    system: dgx-h100
    gpus: 8
    layout: {{tp: {tp}, pp: 1, vpp: 1, cp: 1, ep: 8}}
    fsdp: false
    batch: {{global: {glob}, micro: 1, seq: {seq}}}
    precision: bf16
    measured: {{tokens_per_s_per_gpu: 9691}}
    source: {{ref: MB2602, table: t, row: r}}
"""


def test_e2e_case_file_layout_wider_than_the_gpus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """tp 16 on 8 GPUs: dp = 8 // 16 = 0, a ZeroDivisionError."""
    from validation.e2e.run import main as e2e

    f = tmp_path / "cases.yaml"
    f.write_text(_E2E_CASE.format(tp=16, glob=64, seq=128))
    assert e2e(["--cases", str(f), "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == f"error: {f}:3:5: cases[0]: layout: tp x pp x cp = 16 does not divide gpus 8"


@pytest.mark.parametrize(("glob", "seq", "reason"), [
    # 4 sequences over dp 8: a step of no micro-batch, pydantic's ValidationError
    (4, 128, "error: batch: global 4 is not divisible by micro 1 x dp 8"),
    (64, 2**63, "error: workload.synthetic.batch.seq: Input should be less than or equal to 1073741824"),
])
def test_e2e_row_refused_is_not_run(glob: int, seq: int, reason: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A row's value the synthetic step refuses is that row's "not run" reason, as the runner reports every row it
    cannot run; these were tracebacks that stopped every row."""
    from validation.e2e.run import main as e2e

    f = tmp_path / "cases.yaml"
    f.write_text(_E2E_CASE.format(tp=1, glob=glob, seq=seq))
    assert e2e(["--cases", str(f), "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["status"] == "not run" and row["reason"].startswith(reason), row["reason"]


def test_more_redundant_experts_than_experts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``redundant: 2**63`` on 8 experts ran, silently as 8 (one replica of each expert)."""
    line, f = _run(tmp_path, _synth(routing="{model: 'zipf:1.2', redundant: 9}"), capsys)
    assert line.startswith(f"cosim: error: {f}:7:45: workload.synthetic.routing.redundant: 9 replicas of the hottest "
                           "experts, but tiny-moe has 8 experts"), line


@pytest.mark.parametrize("value", ["x", [], -1])
def test_kineto_copy_bytes_of_the_wrong_type(value: object, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A copy's ``args.bytes`` was converted with float() (ValueError / TypeError on a string or a list; -1 bytes
    was taken)."""
    root = Path(__file__).resolve().parent
    doc = json.loads((root / "data" / "workload" / "ns_epoch.json").read_text())
    t0 = doc["traceEvents"][0]["ts"]
    doc["traceEvents"] += [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": 10, "tid": 10, "ts": t0 + 70000,
         "dur": 2000, "args": {"correlation": 7}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "pid": 0, "tid": 7,
         "ts": t0 + 75000, "dur": 3000, "args": {"device": 0, "stream": 7, "correlation": 7, "bytes": value}}]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(doc))
    line = one_error_line(["replay", str(f), "--out", str(tmp_path / "o")], capsys, tmp_path / "o")
    assert line == (f"cosim: error: {f}: args.bytes of the copy or memset 'Memcpy HtoD (Pageable -> Device)': "
                    f"expected a number of bytes >= 0, got {value!r}"), line


def _et_doc() -> dict:
    """A minimal Chakra-layout Execution Trace: a root and one CPU op with a tensor input."""
    attrs = [{"name": "rf_id", "type": "uint64", "value": 1}, {"name": "tid", "type": "uint64", "value": 1},
             {"name": "scope", "type": "uint64", "value": 0}]
    return {"schema": "1.0.2-chakra.0.0.4", "pid": 1, "nodes": [
        {"id": 1, "name": "[pytorch|profiler|execution_trace|process]", "ctrl_deps": 0, "inputs": {}, "outputs": {},
         "attrs": [{**a, "value": 0} for a in attrs]},
        {"id": 2, "name": "aten::add", "ctrl_deps": 1, "attrs": attrs,
         "inputs": {"values": [[3, 4, 0, 8, 4, "cpu"]], "shapes": [[8]], "types": ["Tensor(float)"]},
         "outputs": {"values": [], "shapes": [], "types": []}}]}


@pytest.mark.parametrize(("where", "value", "problem"), [
    # project.py: 'unhashable type: list' when the ATen op was projected onto a GPU
    ("types", [[1, "a"]], "nodes[1] (id 2, 'aten::add'): input types must be strings, got [1, 'a']"),
    # OverflowError: Python int too large to convert to C long (the rf_id column)
    ("rf_id", 2**63, "nodes[1] (id 2, 'aten::add'): rf_id must be an integer (64-bit), got 9223372036854775808"),
])
def test_execution_trace_node_fields(where: str, value: object, problem: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    doc = _et_doc()
    node = doc["nodes"][1]
    if where == "types":
        node["inputs"]["types"] = value
    else:
        node["attrs"][0]["value"] = value
    f = tmp_path / "et.json"
    f.write_text(json.dumps(doc))
    line = one_error_line(["replay", str(f), "--out", str(tmp_path / "o")], capsys, tmp_path / "o")
    assert line == f"cosim: error: {f}: {problem}", line


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("oversubscription", ".inf", "fabric.oversubscription: Input should be a finite number"),  # a 'fabric deadlock'
    ("nics", "[]", "fabric.nics: List should have at least 1 item after validation, not 0"),  # IndexError
])
def test_fabric_fields(field: str, value: str, problem: str, tmp_path: Path,
                       capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "t.yaml"
    f.write_text(f"name: t\nnode: dgx-h100\nnodes: 4\nfabric: {{topology: leaf-spine, switch_radix: 16, {field}: {value}}}\n")
    line = one_error_line(["collective", "--topology", str(f), "--sizes", "1MiB", "--op", "all_to_all"], capsys,
                     tmp_path / "o")
    assert line.startswith(f"cosim: error: {f}:4:"), line
    assert problem in line, line


@pytest.mark.parametrize(("edit", "problem"), [
    # int() of a string / float('inf') of a sample count: ValueError, OverflowError
    (lambda d: next(iter(d["kernel_scale"].values())).update(n="x"), "expected a sample count (a whole number >= 0), "
                                                                      "got 'x'"),
    # an infinite launch floor was taken
    (lambda d: next(iter(d["launch"]["laws"].values())).update(floor_s=float("inf")),
     "the law needs floor_s > 0 and rate > 0"),
    # list() of an int: TypeError
    (lambda d: d["kernel_db"].update(key=5), "needs key: ['kernel', 'cls'"),
    # a row's kernel family None: TypeError in kernel_family
    (lambda d: d["kernel_db"]["rows"][0].__setitem__(0, None), "row 0: expected 10 key fields"),
])
def test_calibration_profile_fields(edit: object, problem: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    root = Path(__file__).resolve().parents[1]
    doc = yaml.safe_load((root / "cosim" / "models" / "data" / "b300.yaml").read_text())
    edit(doc)  # type: ignore[operator]
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    text = _synth(extra="").replace("topology: dgx-h100", "topology: hgx-b300").replace(
        "    routing: uniform", "    routing: uniform\n    profile: p.yaml")
    line, _ = _run(tmp_path, text, capsys)
    assert line.startswith(f"cosim: error: {tmp_path / 'p.yaml'}:"), line
    assert problem in line, line


def test_a_full_disk_isone_error_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    """ENOSPC while writing the run's files was an OSError traceback (met when this fuzzing filled a disk); the
    temporary file is removed and the error names the file that could not be written."""
    import errno
    import os

    import cosim.fileio

    def full(src: str, dst: object) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(cosim.fileio.os, "replace", full)
    line = one_error_line(["run", "moe-ep4-dgx-h100", "--out", str(tmp_path / "o"), "--no-progress"], capsys,
                     tmp_path / "o" / "scenario.yaml")
    assert line == f"cosim: error: {tmp_path / 'o' / 'scenario.yaml'}: cannot write: No space left on device", line
    assert not [p for p in (tmp_path / "o").iterdir()], "a temporary file was left"
