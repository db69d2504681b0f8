"""A CLI call that must fail on bad input as the brief says: exit status 2, nothing on stdout, one line on stderr
and no traceback, nothing half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.cli import main


def one_error_line(argv: list[str], capsys: pytest.CaptureFixture[str], out: Path, empty_ok: bool = False) -> str:
    """The one stderr line of ``cosim argv``; ``out`` (the output folder given) must not exist, or, with
    ``empty_ok``, hold no file."""
    assert main(argv) == 2
    got_out, err = capsys.readouterr()
    assert got_out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert not out.exists() or (empty_ok and not any(out.rglob("*"))), "half-written output"
    return lines[0]
