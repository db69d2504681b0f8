"""The fabric's kept-scratch compaction (`_Compactor`) equals ``np.unique(..., return_inverse=True)`` call
after call, with its scratch reused across sizes (round 10, s10i-cut)."""
import numpy as np

from cosim.engine.flows import _compact, _Compactor, _ranges


def test_compactor_matches_unique_across_calls() -> None:
    rng = np.random.default_rng(7)
    c = _Compactor()
    for n in (5, 300, 20000, 40, 9000, 100000):
        for size in (1, 7, n // 3 + 1, 3 * n):
            ids = rng.integers(0, n, size=size)
            u, inv = c(ids, n)
            eu, einv = np.unique(ids, return_inverse=True)
            assert np.array_equal(u, eu) and np.array_equal(inv, einv.reshape(-1))
            u2, inv2 = _compact(ids, n)
            assert np.array_equal(u2, eu) and np.array_equal(inv2, einv.reshape(-1))
    assert not c.mark.any()  # cleared after every call


def test_ranges() -> None:
    st = np.array([4, 0, 9], dtype=np.int64)
    ln = np.array([2, 0, 3], dtype=np.int64)
    assert _ranges(st, ln).tolist() == [4, 5, 9, 10, 11]
    assert _ranges(st[:0], ln[:0]).size == 0
    assert _ranges(st, ln * 0).size == 0
