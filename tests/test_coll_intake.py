"""How coalesced collectives hand their intervals over (cosim/engine/collectives.py, cosim/replay/links.py):
the fabric observer's fast intake (``LinkUsage.observed``) records exactly what ``LinkUsage.add`` records, and a
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
