"""The link report recorded per class of links with identical interval streams (cosim/replay/links.py,
``_LinkClasses``): the classes are exactly the distinct streams, and every figure (busy time, windowed busy time
and bytes, peak) is bit for bit the plain per-link computation over every interval."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from cosim.replay.links import COLLECTIVE, LinkUsage, record_fabric
from tests._link_rows import link_data


def _plain(raw: list[tuple[np.ndarray, ...]], nl: int) -> dict[str, Any]:
    """Per-link figures from every interval, without classes: sorted by link then start (ties in the order
    added), the union's length from the running maximum of earlier ends, peak by a sweep of starts."""
    lk, s, e, c, nb = (np.concatenate([r[i] for r in raw]) for i in range(5))
    o = np.lexsort((s, lk))
    lk, s, e, c, nb = lk[o], s[o], e[o], c[o], nb[o]
    prev = np.full(lk.size, -math.inf)
    peak = np.zeros(nl, dtype=np.int64)
    for k in range(nl):
        i = np.flatnonzero(lk == k)
        if i.size > 1:
            prev[i[1:]] = np.maximum.accumulate(e[i[:-1]])
        best = 0.0
        for t in s[i]:  # concurrent at each start: started at or before it, not ended at or before it
            m = (s[i] <= t) & ~(e[i] <= t) & (e[i] > s[i])
            best = max(best, float(c[i][m].sum()))
        peak[k] = round(best)

    def busy(a: float, b: float) -> np.ndarray:
        w = np.maximum(np.clip(e, a, b) - np.maximum(np.clip(s, a, b), np.clip(prev, a, b)), 0.0)
        return np.bincount(lk, weights=w, minlength=nl)

    def bytes_in(a: float, b: float) -> np.ndarray:
        d = e - s
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(d > 0, (np.minimum(e, b) - np.maximum(s, a)) / d, ((s >= a) & (s <= b)).astype(float))
            w = np.where((d > 0) & (s >= a) & (e <= b), nb, nb * np.clip(np.nan_to_num(frac), 0.0, 1.0))
        return np.bincount(lk, weights=w, minlength=nl)

    return {"data": (lk, s, e, c, nb), "peak": peak, "busy": busy, "bytes_in": bytes_in}


def _same(x: np.ndarray, y: np.ndarray) -> bool:
    return bool(np.array_equal(np.isnan(x), np.isnan(y)) and np.array_equal(x[~np.isnan(x)], y[~np.isnan(y)]))


def _check_figures(u: LinkUsage, ref: dict[str, Any], nl: int) -> None:
    """``u``'s interval data, peak, busy time and windowed busy time and bytes equal ``ref``'s (:func:`_plain`)."""
    lk, s, e, c, nb, _src, off = link_data(u)
    for x, y in zip((lk, s, e, c, nb), ref["data"]):
        assert _same(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
    assert np.array_equal(np.diff(off), np.bincount(ref["data"][0], minlength=nl))
    assert np.array_equal(u.peak(), ref["peak"])
    assert np.array_equal(u.busy(), ref["busy"](-math.inf, math.inf))
    for a, b in ((3.0, 17.5), (0.5, 0.5), (10.25, 60.0), (-5.0, 12.0), (-1.0, 50.0)):
        assert np.array_equal(u.busy(a, b), ref["busy"](a, b))
        assert _same(u.bytes_in(a, b), ref["bytes_in"](a, b))


@pytest.mark.parametrize("batch", [256, 7, 1])
def test_classes_are_the_distinct_streams_and_figures_are_per_link_bit_for_bit(batch: int,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """(Queued parts refined in batches of ``batch``: the repeats test runs over each batch; with 256, every part
    is still queued when the figures are first asked for, and they are first computed from one row per link
    (``LinkUsage._per_link``, the few-intervals path), then from the classes.) Links in symmetric groups get equal intervals in most parts; some parts hold a group only in part, give
    one link other bytes (or -0.0 for 0.0), repeat links within the part, hand the same link array again (a
    coalesced collective's memo, now and then with one interval different) or pass scalars. The classes end up exactly the links' distinct streams, and busy / windowed busy / windowed bytes /
    peak equal the plain per-link computation bit for bit."""
    monkeypatch.setattr(LinkUsage, "_BATCH_PARTS", batch)
    rng = np.random.default_rng(5)
    nl = 24
    group = np.arange(nl) % 6
    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(nl)], np.ones(nl))
    raw: list[tuple[np.ndarray, ...]] = []
    streams: list[list[Any]] = [[] for _ in range(nl)]
    hits = 0
    memo_lk = np.flatnonzero(group < 2)
    memo_lk = np.concatenate([memo_lk, memo_lk, memo_lk[group[memo_lk] == 0]])
    memo_a = np.where(np.arange(memo_lk.size) < memo_lk.size // 2, 0.0, 0.0625)
    memo_b = memo_a + 0.125
    memo_c = np.ones(memo_lk.size)
    memo_nb = np.arange(memo_lk.size) // (memo_lk.size // 3 + 1) * 2.0 + 1.0
    for part in range(160):
        t = part * 0.25
        lk = np.flatnonzero(np.isin(group, rng.choice(6, size=int(rng.integers(1, 4)), replace=False)))
        r = rng.random()
        if r < 0.08 and part < 80:  # splits in the first half only: the second meets whole, uniform classes
            lk = lk[rng.random(lk.size) < 0.6]
        if not lk.size:
            continue
        s = np.full(lk.size, t - float(rng.integers(0, 3)) * 0.5)
        c = np.full(lk.size, float(rng.integers(1, 4)))
        nb = np.full(lk.size, float(rng.integers(0, 5)) * 1.5)
        if r > 0.95 and part < 80:
            nb[0] = -0.0 if nb[0] == 0.0 else nb[0] + 1.0
        if 0.9 < r <= 0.95:
            nb[:] = math.nan
        end: Any = t
        if 0.7 < r <= 0.8:  # a coalesced collective's memo: the same link array (repeats) at every hit, shifted
            lk = memo_lk
            s = t + memo_a
            c, nb = memo_c, memo_nb.copy()
            hits += 1
            if hits == 3:
                nb[-1] += 0.5  # one link's interval differs at this hit
            end = t + memo_b
        if 0.8 < r <= 0.9:  # every link twice in one part: first and second occurrences kept in order
            lk = np.concatenate([lk, lk])
            s = np.concatenate([s, s - 0.125])
            c, nb = np.concatenate([c, c]), np.concatenate([nb, nb])
            end = np.full(lk.size, t)
        count: Any = 1.0 if r < 0.3 else c
        u.add(lk, s, end, count, nb, COLLECTIVE, count_bytes=False)
        cc = np.broadcast_to(np.asarray(count, dtype=float), lk.shape)
        ee = np.broadcast_to(np.asarray(end, dtype=float), lk.shape)
        raw.append((lk, s, ee, cc, nb))
        for i, k in enumerate(lk.tolist()):
            streams[k].append((part, s[i].tobytes(), ee[i].tobytes(), cc[i].tobytes(), nb[i].tobytes()))
    distinct = {tuple(x) for x in streams}
    ref = _plain(raw, nl)
    if batch == 256:
        assert u._classes.n == 1 and 0 < u._pend_n <= u._DIRECT  # nothing refined: one row per link
        _check_figures(u, ref, nl)
        assert u._fmap.size == nl and u._classes.n == 1
    assert 6 < len(np.unique(u.classes.cls)) == len(distinct) < nl
    _check_figures(u, ref, nl)


def test_a_symmetric_collective_records_a_class_per_distinct_link_stream() -> None:
    """The fabric's own recording (the observer of ``record_fabric``) of an all-to-all over two DGX H100 nodes:
    the 16 GPUs' NVLink and NIC links carry equal streams by symmetry, so the report records far fewer classes
    than links used, and every link's busy time and peak equal the plain per-link computation."""
    from cosim.engine import SimConfig, Simulator
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=2)
    sim = Simulator(topo, SimConfig(record_trace=False))
    fab = sim.fabric
    u = LinkUsage(fab.links, fab.capacity)
    finish = record_fabric(fab, u)
    raw: list[tuple[np.ndarray, ...]] = []
    inner = fab.observer

    def observe(idx: np.ndarray, a: Any, b: Any, cnt: np.ndarray, nb: np.ndarray) -> None:
        n = len(idx)
        raw.append(tuple(np.array(np.broadcast_to(np.asarray(x, dtype=float), (n,))) for x in (idx, a, b, cnt, nb)))
        inner(idx, a, b, cnt, nb)

    fab.observer = observe
    sim.collective("all_to_all", topo.gpus, 64e6)
    sim.collective("all_reduce", topo.gpus, 32e6)
    sim.run()
    finish()
    raw = [(r[0].astype(np.int64), *r[1:]) for r in raw]
    nl = len(fab.links)
    used = int((u.total_bytes > 0).sum())
    classes = len(np.unique(u.classes.cls))
    assert used > 100 and classes < used // 4
    ref = _plain(raw, nl)
    assert np.array_equal(u.busy(), ref["busy"](-math.inf, math.inf))
    assert np.array_equal(u.peak(), ref["peak"])
    end = float(max(r[2].max() for r in raw))
    assert np.array_equal(u.busy(0.25 * end, 0.75 * end), ref["busy"](0.25 * end, 0.75 * end))
    assert _same(u.bytes_in(0.25 * end, 0.75 * end), ref["bytes_in"](0.25 * end, 0.75 * end))
