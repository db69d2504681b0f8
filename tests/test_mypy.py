"""mypy is clean on cosim/ (configuration: [tool.mypy] in pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_clean_on_cosim() -> None:
    pytest.importorskip("mypy", reason="mypy is in the dev extra (pip install -e .[dev])")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-error-summary", "--hide-error-context"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    errors = [ln for ln in proc.stdout.splitlines() if ": error:" in ln]
    assert proc.returncode == 0 and not errors, (
        f"mypy found {len(errors)} error(s) on cosim/ (rc {proc.returncode}):\n"
        + "\n".join(errors[:60]) + ("\n..." if len(errors) > 60 else "") + proc.stderr[-2000:]
    )
