"""Fabric._above_floors (a departure-only select's floors in a dict, up to 8 departed rows) must
select the rows the O(labels) table of Fabric._select selects, for every rate the rows can hold (a row of an
empty route has the infinite cap of Fabric's route caps; a NaN rate is what a solve's fallback may leave)."""

from __future__ import annotations

import types

import numpy as np

from cosim.engine.flows import Fabric


def _table(comp: np.ndarray, rate: np.ndarray, ai: np.ndarray, comps: np.ndarray, rates: np.ndarray,
           n_labels: int) -> np.ndarray:
    floor = np.full(n_labels + 2, np.inf)
    np.minimum.at(floor, comps, rates)
    return ai[rate[ai] >= floor[comp[ai]] * (1.0 - 1e-9)]


def test_floors_in_a_dict_select_the_table_s_rows() -> None:
    rng = np.random.default_rng(5)
    bad = []
    for it in range(3000):
        n, labels = int(rng.integers(1, 30)), int(rng.integers(1, 6))
        comp = rng.integers(-1, labels, n)
        rate = rng.choice([0.0, 1.0, 2.0, 3.0, np.inf, np.nan], n, p=[.2, .25, .25, .2, .05, .05])
        ai = np.flatnonzero(rng.random(n) < 0.8)
        k = int(rng.integers(1, 9))
        comps = rng.integers(-1, labels, k)
        rates = rng.choice([0.0, 1.0, 2.0, 3.0, np.inf, np.nan], k, p=[.2, .25, .25, .2, .05, .05])
        me = types.SimpleNamespace(_rows=types.SimpleNamespace(comp=comp, rate=rate))
        got = Fabric._above_floors(me, ai, comps, rates)  # type: ignore[arg-type]
        if got is None:  # left to the table (the caller, Fabric._select)
            assert not (np.isfinite(rates).all() and np.isfinite(rate[ai]).all())
            continue
        want = _table(comp, rate, ai, comps, rates, labels)
        if got.tolist() != want.tolist():
            bad.append(it)
    assert not bad, f"{len(bad)} of 3000 differ, first {bad[:5]}"
