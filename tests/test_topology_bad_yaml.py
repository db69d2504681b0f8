"""The bad-YAML corpus: every tests/bad_yaml/X.yaml with a sibling X.expected must fail with
that one-line message (file:line:col: field.path: problem), from the API and from the CLI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cosim.cli import main
from cosim.errors import CosimInputError
from cosim.topology import check_topology

ROOT = Path(__file__).resolve().parents[1]
CORPUS = Path(__file__).resolve().parent / "bad_yaml"
CASES = sorted(p for p in CORPUS.glob("*.yaml") if p.with_suffix(".expected").exists())

# every error kind the issue lists has at least one file
KINDS = {
    "unknown key": "unknown_key", "missing field": "missing_field", "bare number": "bare_number_unit",
    "bad unit": "bad_unit", "dangling endpoint": "dangling_endpoint", "duplicate device": "duplicate_device",
    "disconnected accelerator": "disconnected_gpu", "duplicate YAML key": "duplicate_key",
    "YAML 1.1 boolean": "yaml11_bool", "YAML 1.1 octal": "yaml11_octal", "extends missing": "extends_missing",
    "extends cycle": "extends_cycle_a",
}


def _expected(p: Path) -> str:
    return p.with_suffix(".expected").read_text().strip()


def test_corpus_covers_every_error_kind():
    names = {p.stem for p in CASES}
    assert set(KINDS.values()) <= names


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_api_error(path):
    with pytest.raises(CosimInputError) as info:
        check_topology(path)
    msg = str(info.value)
    assert "\n" not in msg
    assert _expected(path) in msg


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.stem)
def test_cli_error_in_process(path, capsys):
    assert main(["topo", "check", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cosim: error: ")
    assert _expected(path) in lines[0]


def test_cli_errors_subprocess():
    """The real command line, one process per stage that can fail (YAML parser, schema, units,
    graph builder, extends resolution); run in parallel to stay fast. Every file goes through
    the same CLI code in process above."""
    stems = ["duplicate_key", "yaml11_bool", "unknown_key", "bare_number_unit", "dangling_endpoint", "extends_cycle_a"]
    cases = [CORPUS / f"{stem}.yaml" for stem in stems]
    procs = {p: subprocess.Popen([sys.executable, "-m", "cosim", "topo", "check", str(p)], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for p in cases}
    for p, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (p, out, err)
        assert "Traceback" not in err
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert lines[0].startswith("cosim: error: ")
        assert _expected(p) in lines[0], (lines[0], _expected(p))
        assert out == ""
