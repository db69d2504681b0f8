"""The timeline writer's row numbering (``_codes``): rows with equal keys share a number, distinct keys get distinct
numbers, on both paths (one mixed-radix sort when the key columns' spans fit in int64, per-column factorization
otherwise), and the first-row indices point at a row of each number."""

from __future__ import annotations

import numpy as np
import pytest

from cosim.output.timeline import _codes, _Names


def _check(keys: np.ndarray) -> None:
    inv, first = _codes(keys)
    _, ref = np.unique(keys, axis=0, return_inverse=True)
    ref = ref.reshape(-1)
    # same partition: a one-to-one map between the two numberings
    pairs = set(zip(inv.tolist(), ref.tolist()))
    assert len(pairs) == len(set(inv.tolist())) == len(set(ref.tolist()))
    assert len(first) == len(set(ref.tolist()))
    np.testing.assert_array_equal(keys[first][inv], keys)  # each row's number leads back to its own key


@pytest.mark.parametrize("high", [5, 1 << 40])  # radix key (spans fit) / per-column factorization (they do not)
def test_codes_partition(high: int) -> None:
    rng = np.random.default_rng(7)
    keys = rng.integers(-1, 4, size=(2000, 4)).astype(np.int64)
    keys[:, 1] = rng.choice([-1, 3, high], size=2000)
    keys[:, 3] = rng.choice([0, high // 2, high], size=2000)
    _check(keys)


def test_codes_by_hand() -> None:
    keys = np.array([[0, 5], [1, 5], [0, 5], [1, -1], [1, 5]], dtype=np.int64)
    inv, first = _codes(keys)
    assert inv[0] == inv[2] and inv[1] == inv[4]
    assert len({int(inv[0]), int(inv[1]), int(inv[3])}) == 3
    assert sorted(first.tolist()) == [0, 1, 3]


def test_names_table() -> None:
    t = _Names(["a", "b"])
    assert (t[0], t[1]) == ("a", "b")
    c = t.code("ncclDevKernel_SendRecv(x)")
    assert c == 2 and t.code("ncclDevKernel_SendRecv(x)") == 2 and t[c] == "ncclDevKernel_SendRecv(x)"
    assert t.code("?") == 3 and t[3] == "?"


def test_codes_span_past_int64() -> None:
    """A column spanning more than int64 holds (-1 and the largest int64): per-column factorization, not a radix key
    whose span wrapped around and numbered distinct rows alike."""
    big = np.iinfo(np.int64).max
    _check(np.array([[-1, 0], [big, 0], [0, 1], [-1, 0], [big, 1]], dtype=np.int64))
