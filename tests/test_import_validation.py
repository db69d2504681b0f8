"""Semantic validation at the importer boundary (issue 13, "Why" bullets and point 1).

Each corrupt input must give ONE line naming the file, the event and the problem (a
:class:`CosimInputError`, exit status 2 from the CLI), never confident numbers or a
traceback; a usable but suspicious trace gives a warning that the replay summary's
``notes`` repeat.
"""

from __future__ import annotations

import copy
import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cosim.cli import main as cli_main
from cosim.errors import CosimInputError
from cosim.resources import shared_dir
from cosim.workload import load_trace

SHARED = shared_dir()
TRACES = SHARED / "traces" if SHARED else None
needs_shared = pytest.mark.skipif(SHARED is None, reason="../shared/traces not found")


def _trace(events: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": events}


def _small() -> list[dict[str, Any]]:
    """One step: an aten op that launches one kernel (hand-written, 1 us = 1 unit)."""
    return [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#1", "pid": 1, "tid": 1, "ts": 1000, "dur": 500},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1010, "dur": 40,
         "args": {"External id": 2}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020, "dur": 10,
         "args": {"correlation": 7}},
        {"ph": "X", "cat": "kernel", "name": "elementwise_kernel", "pid": 0, "tid": 7, "ts": 1100, "dur": 50,
         "args": {"device": 0, "stream": 7, "correlation": 7}},
    ]


def _write(tmp_path: Path, doc: Any, name: str = "t.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc))
    return p


def _one_line_error(path: Path | list[Path], *needles: str) -> str:
    with pytest.raises(CosimInputError) as ei:
        load_trace(path)
    s = str(ei.value)
    assert "\n" not in s, s
    for n in needles:
        assert n in s, s
    return s


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = cli_main(argv)
    err = capsys.readouterr().err
    return rc, err


# -- the Why bullets -------------------------------------------------------------------------------


def test_negative_dur_is_refused(tmp_path: Path) -> None:
    ev = _small()
    ev[3]["dur"] = -50
    p = _write(tmp_path, _trace(ev))
    _one_line_error(p, "t.json", "traceEvents[3] 'elementwise_kernel'", "negative duration dur=-50")


def test_huge_dur_is_refused(tmp_path: Path) -> None:
    ev = _small()
    ev[3]["dur"] = 1e300
    p = _write(tmp_path, _trace(ev))
    _one_line_error(p, "traceEvents[3] 'elementwise_kernel'", "dur=1e+300", "longer than the trace")


def test_dur_renamed_names_the_schema(tmp_path: Path) -> None:
    ev = _small()
    for e in ev:
        e["duration"] = e.pop("dur")
    p = _write(tmp_path, _trace(ev))
    s = _one_line_error(p, "traceEvents[0] 'ProfilerStep#1'", "no event has 'dur'", "expected fields")
    assert "duration" in s  # says what the trace has instead


def test_ts_renamed_names_the_real_problem(tmp_path: Path) -> None:
    ev = _small()
    for e in ev:
        e["timestamp"] = e.pop("ts")
    p = _write(tmp_path, _trace(ev))
    s = _one_line_error(p, "no event has 'ts'", "timestamp")
    assert "cyclic" not in s


def test_one_event_without_dur(tmp_path: Path) -> None:
    ev = _small()
    del ev[2]["dur"]
    p = _write(tmp_path, _trace(ev))
    _one_line_error(p, "traceEvents[2] 'cudaLaunchKernel'", "no 'dur' field")


def test_trace_holding_a_list_of_numbers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = tmp_path / "nums.json"
    p.write_text("[1,2,3]")
    _one_line_error(p, "nums.json", "traceEvents[0]", "must be an object")
    rc, err = _cli(["replay", str(p), "--json", "--no-timeline", "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err


def test_string_ts_and_negative_dur(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _write(tmp_path, {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": "soon", "dur": -5}]})
    _one_line_error(p, "t.json", "traceEvents[0] 'k'", "ts: expected a number, got a string 'soon'")
    rc, err = _cli(["replay", str(p), "--json", "--no-timeline", "--out", str(tmp_path / "o")], capsys)
    assert rc == 2 and err.count("\n") == 1 and "traceEvents[0] 'k'" in err


def test_wrong_types_elsewhere(tmp_path: Path) -> None:
    ev = _small()
    ev[1]["cat"] = ["cpu_op"]
    _one_line_error(_write(tmp_path, _trace(ev)), "traceEvents[1] 'aten::add'", "cat: expected")
    ev = _small()
    ev[3]["args"] = "device 0"
    _one_line_error(_write(tmp_path, _trace(ev)), "traceEvents[3] 'elementwise_kernel'", "args")
    ev = _small()
    ev[0]["ts"] = True
    _one_line_error(_write(tmp_path, _trace(ev)), "traceEvents[0] 'ProfilerStep#1'", "ts: expected a number")
    doc = _trace(_small())
    doc["distributedInfo"] = "rank 0"
    _one_line_error(_write(tmp_path, doc), "distributedInfo")


def test_infinite_ts(tmp_path: Path) -> None:
    text = json.dumps(_trace(_small())).replace('"ts": 1100', '"ts": 1e400')
    p = tmp_path / "inf.json"
    p.write_text(text)
    _one_line_error(p, "traceEvents[3] 'elementwise_kernel'", "ts: inf is not a finite number")


@needs_shared
def test_et_with_ctrl_deps_renamed(tmp_path: Path) -> None:
    src = TRACES / "chakra-et/1.0.2-chakra.0.0.4.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    for n in doc["nodes"]:
        n["parents"] = n.pop("ctrl_deps")
    p = _write(tmp_path, doc, "et.json")
    s = _one_line_error(p, "et.json", "nodes[0]", "no node has 'ctrl_deps'", "expected fields")
    assert "parents" in s


@needs_shared
def test_et_node_and_dependency_fields(tmp_path: Path) -> None:
    src = TRACES / "hta/simple-add-et.json.gz"
    base = json.loads(gzip.decompress(src.read_bytes()))
    doc = copy.deepcopy(base)
    doc["nodes"][5]["parent"] = 987654
    _one_line_error(_write(tmp_path, doc, "et.json"), "nodes[5]", "parent 987654 names no node")
    doc = copy.deepcopy(base)
    doc["nodes"][3]["id"] = doc["nodes"][4]["id"]
    _one_line_error(_write(tmp_path, doc, "et.json"), "duplicate node id")
    doc = copy.deepcopy(base)
    doc["nodes"][6]["rf_id"] = "seven"
    _one_line_error(_write(tmp_path, doc, "et.json"), "nodes[6]", "rf_id must be an integer")
    doc = copy.deepcopy(base)  # a -> b -> a
    a, b = doc["nodes"][6], doc["nodes"][7]
    a["parent"], b["parent"] = b["id"], a["id"]
    _one_line_error(_write(tmp_path, doc, "et.json"), "cyclic parent")


def test_topology_yaml_with_nul(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cosim.topology import load_topology

    p = tmp_path / "nul.yaml"
    p.write_text("name: x\nnodes:\n  - id: gpu\x00\n")
    with pytest.raises(CosimInputError) as ei:
        load_topology(p)
    s = str(ei.value)
    assert "\n" not in s and "nul.yaml:3:" in s and "#x0000" in s
    rc, err = _cli(["topo", "check", str(p)], capsys)
    assert rc == 2 and err.count("\n") == 1


@needs_shared
def test_real_trace_negative_dur_refused(tmp_path: Path) -> None:
    src = TRACES / "kineto-h100/before_fix_trace.json.gz"
    doc = json.loads(gzip.decompress(src.read_bytes()))
    k = next(i for i, e in enumerate(doc["traceEvents"]) if e.get("cat") == "kernel")
    doc["traceEvents"][k]["dur"] = -abs(doc["traceEvents"][k]["dur"]) - 1
    _one_line_error(_write(tmp_path, doc), f"traceEvents[{k}]", "negative duration")


# -- usable but suspicious: warning + summary notes -------------------------------------------------


def test_gpu_ops_outside_steps_warn_and_reach_notes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from cosim.replay import replay

    ev = _small()
    ev.append({"ph": "X", "cat": "kernel", "name": "late_kernel", "pid": 0, "tid": 7, "ts": 5000, "dur": 20,
               "args": {"device": 0, "stream": 7}})
    p = _write(tmp_path, _trace(ev))
    with caplog.at_level(logging.WARNING, logger="cosim"):
        g = load_trace(p)
    msgs = [r.getMessage() for r in caplog.records]
    assert any("1 of 2 GPU ops lie outside every ProfilerStep" in m and "\n" not in m for m in msgs), msgs
    assert any("no 'correlation' arg" in m for m in msgs), msgs
    notes = replay(g, "dgx-h100").summary()["notes"]
    assert any("outside every ProfilerStep" in n for n in notes), notes


def test_clean_trace_has_no_warnings(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    p = _write(tmp_path, _trace(_small()))
    with caplog.at_level(logging.WARNING, logger="cosim"):
        g = load_trace(p)
    assert not caplog.records and g.warnings() == []


def test_int_list_reads_lists_and_json_text_alike() -> None:
    """Rank lists and split sizes come as lists (Chakra ET attributes) or as JSON text (Kineto's args): one reader
    (kineto_common.int_list) for both importers; a non-integer item is -1 (Kineto's rank lists) or dropped (ET)."""
    from cosim.workload.kineto_common import int_list

    assert int_list([0, 2, 4]) == int_list("[0, 2, 4]") == [0, 2, 4]
    assert int_list("") == int_list("not json") == int_list('{"a": 1}') == int_list(None) == int_list(7) == []
    assert int_list([1, "x", 3.0, None]) == [1, -1, 3, -1]
    assert int_list([1, "x", 3.0, None, float("nan")], drop=True) == [1, 3]
    assert int_list("[5, 6]", drop=True) == [5, 6]


def test_scatters_are_the_accumulating_and_the_overwriting_ones() -> None:
    """cost.SCATTERS is the accumulating indexed updates (a FLOP per source element) and the overwriting ones
    (data movement, 0 FLOPs), each listed once."""
    from cosim.workload.cost import SCATTERS, op_flops

    assert len(set(SCATTERS)) == 14
    assert op_flops("aten::index_add_", [[8, 4], [2], [2, 4]], "elementwise") == 8  # one FLOP per source element
    assert op_flops("aten::index_put_", [[8, 4], [2], [2, 4]], "elementwise") == 0.0  # an overwrite moves data
