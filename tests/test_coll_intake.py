"""How coalesced collectives hand their intervals over (cosim/engine/collectives.py, cosim/replay/links.py):
the fabric observer's fast intake (``LinkUsage.observed``) records exactly what ``LinkUsage.add`` records, a coalesced
hit handed over relative to its start (``LinkUsage.observed_shifted``) exactly what the shifted intervals record, and a
coalesced collective's wait (``_first_of``, callbacks instead of a process) resumes at the same point of simpy's
event order as ``env.any_of`` in a process did."""

from __future__ import annotations

import numpy as np
import simpy

from cosim.engine.collectives import _first_of, _urgent
from cosim.replay.links import COLLECTIVE, LinkUsage


def _parts(rng: np.random.Generator, nl: int) -> list[tuple[object, ...]]:
    """Observer calls as the fabric and coalesced collectives make them (distinct and repeated links, the end a
    float, a numpy float or a column), plus forms only :meth:`LinkUsage.add` handles (int columns, lists)."""
    out: list[tuple[object, ...]] = []
    for j in range(60):
        n = int(rng.integers(0, 12))
        lk = np.sort(rng.choice(nl, n, replace=False)) if j % 3 else rng.integers(0, nl, n)
        s = np.round(rng.uniform(0, 4, n), 1)
        d = np.round(rng.uniform(0, 2, n), 1)
        c = rng.integers(1, 3, n).astype(float)
        nb = np.round(rng.uniform(0, 9, n), 1)
        end: object = [float(j), np.float64(j), s + d][j % 3]
        if j % 7 == 0:
            c = c.astype(np.int64)  # not float64: the generic path
        if j % 11 == 0:
            out.append((lk.tolist(), s, end, c, nb))
        else:
            out.append((lk.astype(np.int64), s, end, c, nb))
    return out


def test_observed_records_what_add_records() -> None:
    rng = np.random.default_rng(5)
    nl = 16
    fast, plain = LinkUsage([(str(i), "x") for i in range(nl)], np.ones(nl)), \
        LinkUsage([(str(i), "x") for i in range(nl)], np.ones(nl))
    for lk, s, end, c, nb in _parts(rng, nl):
        fast.observed(lk, s, end, c, nb)  # type: ignore[arg-type]
        plain.add(lk, s, end, c, nb, COLLECTIVE, count_bytes=False)  # type: ignore[arg-type]
    assert np.array_equal(fast.classes.cls, plain.classes.cls)
    for a, b in zip(fast._columns(), plain._columns()):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert fast._m > 0
    assert fast.report(10.0) == plain.report(10.0)


def _memos(rng: np.random.Generator, nl: int) -> list[tuple[np.ndarray, ...]]:
    """Coalesced collectives' memos as ``flat_usage`` gives them (links, relative starts, ends, flows, bytes):
    links in pairs of equal intervals (classes stay whole and uniform), some repeated, one whose relative starts
    differ by an ulp (equal once shifted by a large start: the shift makes unequal values equal), two that share
    one link array."""
    out = []
    for j in range(6):
        lk = rng.choice(nl, 8, replace=False).astype(np.int64)
        if j % 3 == 1:
            lk = np.r_[lk, lk[:4]]
        if j == 5:  # the link array of another memo (the same object), other intervals
            lk = out[0][0]
        n = lk.size
        a = np.repeat(np.round(rng.uniform(0, 1, (n + 1) // 2), 2), 2)[:n]
        if j == 4:
            a[1] = np.nextafter(a[0], 2.0)
        b = a + 0.5
        c = np.repeat(rng.integers(1, 3, (n + 1) // 2).astype(float), 2)[:n]
        out.append((lk, a, b, c, c * 3.0))
    return out


def test_shifted_hits_record_what_shifting_them_records() -> None:
    """``LinkUsage.observed_shifted`` (a coalesced hit: its memo's relative intervals and its start, the class
    pattern kept per memo) records exactly what :meth:`LinkUsage.observed` of the shifted intervals records,
    across class splits by other parts, repeated links, a shift that makes two relative starts equal and two memos
    of one link array."""
    rng = np.random.default_rng(11)
    nl = 24
    memos = _memos(rng, nl)
    fast, plain = LinkUsage([(str(i), "x") for i in range(nl)], np.ones(nl)), \
        LinkUsage([(str(i), "x") for i in range(nl)], np.ones(nl))
    for j in range(400):
        if j % 9 == 0:  # a fabric part: splits classes now and then
            lk = np.sort(rng.choice(nl, int(rng.integers(1, nl)), replace=False)).astype(np.int64)
            s = np.full(lk.size, float(j))
            fast.observed(lk, s, float(j) + 1.0, np.ones(lk.size), np.ones(lk.size))
            plain.observed(lk, s, float(j) + 1.0, np.ones(lk.size), np.ones(lk.size))
        lk, a, b, c, nb = memos[int(rng.integers(0, len(memos)))]
        t0 = 2.0**40 if j % 50 == 7 else float(j) + 0.25
        fast.observed_shifted(lk, t0, a, b, c, nb)
        plain.observed(lk, t0 + a, t0 + b, c, nb)
        if j % 97 == 0:  # flushes at other points
            _ = (fast.classes, plain.classes)  # reading the property flushes
    assert np.array_equal(fast.classes.cls, plain.classes.cls)
    assert fast.classes.n == plain.classes.n > 1
    for x, y in zip(fast._columns(), plain._columns()):
        assert x.dtype == y.dtype and x.tobytes() == y.tobytes()
    assert fast._m > 0 and fast._hits
    assert np.array_equal(fast.busy(), plain.busy()) and np.array_equal(fast.bytes_in(0.0, 9.0), plain.bytes_in(0.0, 9.0))


def _order(first_of: bool, woken: bool) -> list[tuple[str, float]]:
    """Who resumes when: a waiter (by ``_first_of`` callbacks, or a process yielding ``any_of``) on a timeout
    and a wake-up (at 1 s when ``woken``), among processes whose timeouts tie with them."""
    env = simpy.Environment()
    log: list[tuple[str, float]] = []
    wake = env.event()

    def other(name: str, d: float):
        yield env.timeout(d)
        log.append((name, env.now))

    def waiter():
        yield env.any_of([env.timeout(2.0), wake])
        log.append(("waiter", env.now))

    def start() -> None:
        if first_of:
            def wait(_: simpy.Event) -> None:
                ev = _first_of(env, env.timeout(2.0), wake)
                ev.callbacks.append(lambda _: log.append(("waiter", env.now)))  # type: ignore[union-attr]
            _urgent(env, wait)
        else:
            env.process(waiter())

    def driver():
        env.process(other("a", 2.0))
        start()
        env.process(other("b", 2.0))
        yield env.timeout(0.0)
        env.process(other("c", 2.0))
        if woken:
            env.process(other("d", 1.0))
            yield env.timeout(1.0)
            wake.succeed()
            env.process(other("e", 0.0))

    env.process(driver())
    env.run()
    return log


def test_first_of_resumes_where_any_of_did() -> None:
    for woken, names in ((False, ["a", "b", "c", "waiter"]), (True, ["d", "e", "waiter", "a", "b", "c"])):
        got, want = _order(True, woken), _order(False, woken)
        assert got == want
        assert [n for n, _ in want] == names  # (the condition resumes the waiter one event after its timeout)
