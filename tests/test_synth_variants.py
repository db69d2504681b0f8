"""benchmarks/synth_variants.py compare: the refactor check must not pass vacuously (an empty or mistyped folder,
a variant dumped on one side only)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests._scripts import synth_variants


def test_compare_refuses_empty_and_one_sided(tmp_path: Path) -> None:
    cmp = synth_variants().compare
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    assert cmp(a, b) == 1  # nothing dumped: not "identical"
    assert cmp(tmp_path / "typo", b) == 1
    np.savez(a / "v.npz", x=np.arange(3.0))
    assert cmp(a, b) == 1  # v only in a (was a FileNotFoundError traceback)
    np.savez(b / "v.npz", x=np.arange(3.0))
    assert cmp(a, b) == 0
    np.savez(b / "w.npz", x=np.arange(3.0))
    assert cmp(a, b) == 1  # w only in b (was ignored)
    np.savez(a / "w.npz", x=np.asarray([0.0, 1.0, np.nan]))
    np.savez(b / "w.npz", x=np.asarray([0.0, 1.0, np.nan]))
    assert cmp(a, b) == 0  # NaN columns (unscheduled starts) compare equal
    np.savez(b / "w.npz", x=np.asarray([0.0, 2.0, np.nan]))
    assert cmp(a, b) == 1
