"""Atomic output: a bad output path is one line (exit status 2), and nothing half-written stays."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.fileio import atomic_open, write_json, write_text


def test_output_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(CosimInputError, match="it is a directory"):
        write_text(tmp_path, "x")
    assert list(tmp_path.iterdir()) == []


def test_output_under_a_file(tmp_path: Path) -> None:
    blocker = tmp_path / "afile"
    blocker.write_text("keep me")
    with pytest.raises(CosimInputError, match=r"afile/x\.json: cannot write: .*afile is a file, not a directory"):
        write_json(blocker / "x.json", {"a": 1})
    assert blocker.read_text() == "keep me"


def test_failure_inside_the_block_leaves_the_old_file(tmp_path: Path) -> None:
    out = tmp_path / "out.txt"
    out.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(out) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert out.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_cli_bad_output_path_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cosim.cli import main

    blocker = tmp_path / "afile"
    blocker.write_text("")
    capture = Path(__file__).resolve().parents[1] / "workloads" / "moe-ep2-decode-cpu"
    assert main(["replay", str(capture), "--out", str(blocker / "run")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a file, not a directory" in err
