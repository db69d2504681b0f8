"""The executor's host threads as simpy events (:class:`cosim.replay.executor._HostThread`): the simpy internals
they reproduce by hand (a simpy upgrade that changes them fails here, not as a silently reordered replay), an
error raised inside a thread, and a finished thread freed without the cyclic collector."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest
import simpy
from simpy.events import NORMAL, URGENT

from cosim.replay import executor as ex_mod
from cosim.replay import replay
from tests.test_replay import EXACT, basic_events, write_trace


def test_simpy_internals_the_host_threads_rely_on() -> None:
    """A thread's wait is the heap entry a ``Timeout`` would push, its start the entry of a process's
    ``Initialize``, and the engine's step hands a popped event to its callbacks with ``callbacks`` already None
    and raises only for an event whose ``_ok`` is false: checked on the installed simpy."""
    env = simpy.Environment(initial_time=1.5)
    t = env.timeout(0.25)
    (entry,) = [e for e in env._queue if e[3] is t]
    assert entry == (env._now + 0.25, NORMAL, entry[2], t)
    assert next(env._eid) == entry[2] + 1  # the sequence a thread draws its place from

    def body() -> Generator[simpy.Event, Any, None]:
        yield env.timeout(0)

    p = env.process(body())
    (init,) = [e for e in env._queue if e[3] is not t]
    assert init[:2] == (env._now, URGENT) and init[3].callbacks == [p._resume]

    seen: list[tuple[Any, Any]] = []

    class Bare(simpy.events.Event):
        def __init__(self) -> None:  # as _HostThread: no Event.__init__
            self.env = env
            self._ok = True
            self._value = None
            self.callbacks = [lambda e: seen.append((e, e.callbacks))]

    bare = Bare()
    env.schedule(bare, URGENT)
    env.run()
    assert seen == [(bare, None)] and bare.callbacks is None


def test_error_in_a_host_thread_surfaces_as_raised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An exception raised while a host thread runs a call (here its launch's GPU work) leaves ``replay`` as
    raised: its type, message and object (a simpy process re-raised a copy, ``type(e)(*e.args)``, which failed
    for an exception whose constructor takes other arguments)."""

    class Odd(Exception):
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"op {a} of rank {b}")

    raised: list[Exception] = []

    def drain(self: ex_mod.Executor) -> None:
        if self.env.now > 0:  # inside a thread's call, not the setup's drain
            raised.append(Odd(3, 0))
            raise raised[0]

    monkeypatch.setattr(ex_mod.Executor, "_drain", drain)
    path = write_trace(tmp_path / "t.json", basic_events())
    with pytest.raises(Odd, match=r"^op 3 of rank 0$") as got:
        replay(path, config=EXACT)
    assert got.value is raised[0]


def test_finished_host_threads_are_freed_without_the_collector(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread that ran its last call holds no cycle: with the collector off it is gone after the replay."""
    made: list[weakref.ref[Any]] = []
    init = ex_mod._HostThread.__init__

    def track(self: Any, *args: Any) -> None:
        init(self, *args)
        made.append(weakref.ref(self))

    monkeypatch.setattr(ex_mod._HostThread, "__init__", track)
    path = write_trace(tmp_path / "t.json", basic_events())
    was = gc.isenabled()
    gc.disable()
    try:
        replay(path, config=EXACT)
        assert made and all(r() is None for r in made)
    finally:
        if was:
            gc.enable()
