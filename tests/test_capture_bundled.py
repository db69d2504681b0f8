"""The bundled captures in workloads/: each capture.yaml agrees with its own
traces, and workloads/README.md describes each one. Needs no torch."""

from __future__ import annotations

from pathlib import Path

import pytest
from capture_checks import check_capture

from cosim.resources import bundled_dir

WORKLOADS = bundled_dir("workloads")
CAPTURES = sorted(p.parent for p in WORKLOADS.glob("*/capture.yaml"))


def test_there_are_bundled_captures() -> None:
    names = [p.name for p in CAPTURES]
    assert "moe-ep4-cpu" in names
    total = sum(f.stat().st_size for p in CAPTURES for f in p.iterdir())
    assert total < 3 * 2**20, f"bundled captures take {total} bytes"


@pytest.mark.parametrize("folder", CAPTURES, ids=[p.name for p in CAPTURES])
def test_bundled_capture_is_consistent(folder: Path) -> None:
    doc = check_capture(folder)
    assert doc["command"].startswith("cosim capture ")
    assert f"--out workloads/{folder.name}" in doc["command"]


@pytest.mark.parametrize("folder", CAPTURES, ids=[p.name for p in CAPTURES])
def test_bundled_capture_is_documented(folder: Path) -> None:
    readme = (WORKLOADS / "README.md").read_text()
    assert f"## {folder.name}" in readme
    import yaml

    doc = yaml.safe_load((folder / "capture.yaml").read_text())
    assert doc["command"] in readme, "README must give the exact command"
