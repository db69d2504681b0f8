"""Host-op nesting of the Kineto importer (cosim.workload.kineto_tables.nest): the vectorized version equals
the op-by-op stack walk, on a hand-worked thread, on random (also badly nested) intervals and on real traces."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cosim.resources import shared_dir
from cosim.workload.kineto_tables import nest, nest_loop


def _same(a: tuple[np.ndarray, ...], b: tuple[np.ndarray, ...]) -> None:
    for name, x, y in zip(("parent", "depth", "pre_gap", "tail", "self"), a, b):
        assert x.dtype == y.dtype, name
        assert np.array_equal(x, y), name


def test_nest_worked_by_hand() -> None:
    """Thread 0: A [0, 10] holds B [1, 4] and C [5, 9]; D [12, 13] is top-level. Thread 1: E [2, 3].
    B's pre-gap is 1 (after A's start), C's 1 (after B's end), D's 2 (after A's end), E's 0 (first of its
    thread); A's tail is 1 (after C's end), its self time 10 - 3 - 4 = 3."""
    thread = np.array([0, 0, 0, 0, 1])
    s = np.array([0.0, 1.0, 5.0, 12.0, 2.0])
    e = np.array([10.0, 4.0, 9.0, 13.0, 3.0])
    out = nest(thread, s, e, e - s)
    assert out[0].tolist() == [-1, 0, 0, -1, -1]
    assert out[1].tolist() == [0, 1, 1, 0, 0]
    assert out[2].tolist() == [0.0, 1.0, 1.0, 2.0, 0.0]
    assert out[3].tolist() == [1.0, 3.0, 4.0, 1.0, 1.0]
    assert out[4].tolist() == [3.0, 3.0, 4.0, 1.0, 1.0]
    _same(out, nest_loop(thread, s, e, e - s))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40), st.integers(0, 15)), min_size=1, max_size=60))
def test_nest_equals_the_stack_walk_on_any_intervals(ops: list[tuple[int, int, int]]) -> None:
    """Random threads, starts and durations (overlapping, not nested, zero-length, ties): same tables."""
    a = np.array(ops, dtype=float)
    o = np.lexsort((-(a[:, 1] + a[:, 2]), a[:, 1], a[:, 0]))
    thread, s, d = a[o, 0].astype(np.int64), a[o, 1] * 0.37, a[o, 2] * 0.11
    _same(nest(thread, s, s + d, d), nest_loop(thread, s, s + d, d))


@pytest.mark.parametrize("rel", ["hta/v100-rank1of2-df.json.gz", "param-dlrm-v100x8/kineto"])
def test_nest_equals_the_stack_walk_on_real_traces(rel: str) -> None:
    shared = shared_dir()
    if shared is None or not (shared / "traces" / rel).exists():
        pytest.skip("../shared not found: real-trace test skipped (set COSIM_SHARED)")
    from cosim.workload import load_trace

    for rg in load_trace(shared / "traces" / rel).ranks:
        H = rg.host_ops
        s, d = H.start.astype(float), H.dur.astype(float)
        _same(nest(H.thread, s, s + d, d), nest_loop(H.thread, s, s + d, d))
