"""The executor's own event loop (:func:`cosim.replay.executor._run_all`) and the SM-sharing devices' bare wake-ups
(:class:`cosim.replay.interference._Wake`): the same events in the same order as simpy's own ``run`` and
``Timeout``, an unhandled failure raised as simpy raises it, and a finished share that holds no reference back."""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import numpy as np
import pytest
import simpy

from cosim.replay.executor import _run_all
from cosim.replay.interference import COMM, COMPUTE, GpuShare

US = 1e-6


def _scenario(env: simpy.Environment, log: list[tuple[str, float]]) -> None:
    """Processes, timeouts at equal times and an event succeeded from a callback: same-time order matters."""

    def worker(name: str, gaps: list[float]) -> Generator[simpy.Event, Any, None]:
        for g in gaps:
            yield env.timeout(g)
            log.append((name, env.now))

    gate = env.event()
    gate.callbacks.append(lambda e: log.append(("gate", env.now)))
    env.timeout(0.5).callbacks.append(lambda e: gate.succeed())
    for i, gaps in enumerate(([0.25, 0.25, 0.5], [0.5, 0.0, 0.125], [0.125, 0.375, 0.5])):
        env.process(worker(f"w{i}", gaps))


def test_run_all_steps_the_events_of_env_run_in_order() -> None:
    """The log of a scenario with ties at 0.5 s is the same, entry for entry, under ``env.run()`` and ``_run_all``."""
    logs = []
    for run in (lambda env: env.run(), _run_all):
        env = simpy.Environment()
        log: list[tuple[str, float]] = []
        _scenario(env, log)
        run(env)
        logs.append(log)
    assert logs[0] == logs[1] and len(logs[0]) == 10
    assert [n for n, t in logs[0] if t == 0.5] == ["w1", "w2", "w0", "gate", "w1"]  # by the order of making


def test_run_all_raises_an_unhandled_failure_as_simpy_does() -> None:
    """A failed event nobody defused: a copy of its exception, the original as its cause (``Environment.step``)."""
    runs: tuple[Callable[[simpy.Environment], None], ...] = (lambda env: env.run(), _run_all)
    for run in runs:
        env = simpy.Environment()
        ev = env.event()
        def fail(_: Any, ev: simpy.Event = ev) -> None:
            ev.fail(ValueError("boom", 7))

        env.timeout(1.0).callbacks.append(fail)
        with pytest.raises(ValueError) as got:
            run(env)
        assert got.value.args == ("boom", 7) and isinstance(got.value.__cause__, ValueError)


def _plan(n: int, roles: list[int]) -> dict[str, Any]:
    return {"roles": np.array(roles, dtype=np.int8), "h": np.zeros(n), "sms": np.ones(n, dtype=bool),
            "work": np.ones(n), "device": np.zeros(n, dtype=np.int64), "sm_count": 132.0, "comm_sms": 16.0,
            "h_comm": 0.0, "traced_comm_sms": 16.0, "op_sms": None}


def test_a_device_wake_up_takes_the_place_a_timeout_would() -> None:
    """A GEMM of 100 us from 0 beside a 16-SM communication kernel over [20, 60] us ends at
    60 + (100 - 20 - 40 x 116 / 132) us, its end reported from the device's wake-up (never synchronously), and a
    timeout made at that end runs after it."""
    env = simpy.Environment()
    share = GpuShare(env, {0: _plan(2, [COMM, COMPUTE])})
    order: list[str] = []
    ends: dict[int, float] = {}
    end = (60 + (100 - 20 - 40 * 116 / 132)) * US
    share.start_comm(0, 0, 20 * US)
    share.end_comm(0, 0, 60 * US)

    def mark(name: str) -> Callable[[Any], None]:
        return lambda e: order.append(name)

    def done(s: float, e: float) -> None:
        ends[1] = e
        order.append("gemm")
        env.timeout(0.0).callbacks.append(mark("after-end"))

    share.start(0, 1, 0.0, 100 * US, done)
    _run_all(env)
    assert ends[1] == pytest.approx(end, rel=1e-12) and order == ["gemm", "after-end"]


def test_a_closed_share_holds_no_reference_back() -> None:
    """``start_op``'s kernels end in ``sink(kernel, end)`` with their tag and op; ``close`` drops the sink and
    each device's wake-up callback (what would keep the executor and the device alive in a cycle)."""
    env = simpy.Environment()
    share = GpuShare(env, {3: _plan(2, [COMM, COMPUTE])})
    got: list[tuple[Any, int, float, float]] = []
    share.sink = lambda k, end: got.append((k.rank, k.op, k.start, end))
    ops = share.ops_of(3)
    share.start_op(ops, "tag", 1, 10 * US, 5 * US)
    _run_all(env)
    assert got == [("tag", 1, 10 * US, 10 * US + 5 * US)]
    share.close()
    assert share.sink is None and all(d.sink is None and d._cbs == () for d in share.devices.values())


def _chains(monkeypatch: pytest.MonkeyPatch, seed: int, general: bool) -> tuple[list[tuple[int, float, float, float, int]],
                                                                               int]:
    """A chain of compute kernels on one GPU (each next kernel starts at its predecessor's end plus a gap of 0
    or 3 us; now and then a second kernel of its own beside it) and communication kernels registered ahead of time
    and from the kernels' ends; ``general``: every wake-up through :meth:`_Device._tick` (the fast path of one
    lone kernel off). The log (op, start, end, clock, next queue id at each end) and the number of general ticks."""
    from cosim.replay import interference

    rng = np.random.default_rng(seed)
    if general:
        monkeypatch.setattr(interference._Device, "_on_wake",
                            lambda self, ev: self._tick(ev.target) if ev.gen == self.gen else None)
    ticks = [0]
    tick = interference._Device._tick

    def counted(self: Any, target: float) -> None:
        ticks[0] += 1
        tick(self, target)

    monkeypatch.setattr(interference._Device, "_tick", counted)
    n_comm, n_comp = 12, 40
    plan = _plan(n_comm + n_comp, [COMM] * n_comm + [COMPUTE] * n_comp)
    plan["h"] = rng.integers(0, 2, n_comm + n_comp).astype(float)
    plan["h_comm"] = 0.25
    env = simpy.Environment()
    share = GpuShare(env, {0: plan})
    log: list[tuple[int, float, float, float, int]] = []
    nxt = iter(range(n_comm + 1, n_comm + n_comp))
    late = iter(range(n_comm // 2, n_comm))

    def start(t: float, tag: int) -> bool:
        j = next(nxt, None)
        if j is not None:
            share.start_op(ops, tag, j, t, float(rng.integers(5, 40)) * US)
        return j is not None

    def sink(k: Any, end: float) -> None:
        log.append((k.op, k.start, end, env.now, next(env._eid)))
        c = next(late, None)
        if c is not None and rng.random() < 0.5:
            share.comm_op(ops, c, end, 1)
            share.comm_op(ops, c, end + float(rng.integers(1, 30)) * US, -1)
        if k.rank == 0 and start(end + float(rng.integers(0, 2)) * 3 * US, 0) and rng.random() < 0.2:
            start(end + float(rng.integers(0, 20)) * US, 1)  # a kernel beside the chain (tag 1: none follows it)

    share.sink = sink
    ops = share.ops_of(0)
    for c in range(n_comm // 2):
        t = float(rng.integers(0, 400)) * US
        share.comm_op(ops, c, t, 1)
        share.comm_op(ops, c, t + float(rng.integers(1, 60)) * US, -1)
    share.start_op(ops, 0, n_comm, 0.0, float(rng.integers(5, 40)) * US)
    _run_all(env)
    return log, ticks[0]


def test_the_lone_kernel_wake_up_is_the_general_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Random chains of kernels beside communication kernels (slowed, slowed until their end, alone with a change
    to come): the same ends, clock and queue ids at every end with the lone-kernel fast path as with every
    wake-up through the general tick, which the fast path spared most of."""
    for seed in range(20):
        with monkeypatch.context() as m:
            fast, fast_ticks = _chains(m, seed, False)
        with monkeypatch.context() as m:
            slow, slow_ticks = _chains(m, seed, True)
        assert fast == slow and len(fast) > 5
        assert 0 < fast_ticks < slow_ticks


def test_a_kernel_is_its_own_wake_up() -> None:
    """``start_op`` pushes the kernel itself (no separate wake-up object), once, where ``env.timeout(end - now)``
    would go. A second kernel ending first supersedes it: the first stays queued, stale by its generation, and
    ends from the general tick's new wake-up at 100 us, which the stale entry (the earlier id) precedes."""
    env = simpy.Environment()
    share = GpuShare(env, {0: _plan(3, [COMM, COMPUTE, COMPUTE])})
    got: list[tuple[int, float, float]] = []
    share.sink = lambda k, end: got.append((k.op, env.now, end))
    ops = share.ops_of(0)
    share.start_op(ops, "r", 1, 0.0, 100 * US)
    share.start_op(ops, "r", 2, 0.0, 50 * US)
    queued = [e[3] for e in sorted(env._queue, key=lambda e: e[2])]  # in the order pushed
    assert [k.op for k in queued] == [1, 2] and [k.target for k in queued] == [100 * US, 50 * US]
    assert queued[0].gen < queued[1].gen == ops[3][1].gen  # the first is stale once the second is pushed
    _run_all(env)
    assert got == [(2, 50 * US, 50 * US), (1, 100 * US, 100 * US)]


def test_host_index_lays_the_threads_stall_prefixes_end_to_end() -> None:
    """executor._host_index: each thread's host ops and where each reads its stall (its syncs passed, clipped to
    the thread's count, offset by the earlier threads' prefixes); None where two threads share a host op (one
    indexed add would add only one of them); kept on the program per count of syncs."""
    import types

    from cosim.replay.executor import _host_index

    before = np.array([0, 1])
    prog = types.SimpleNamespace(thread_rows=[(np.array([0, 2]), before, before + 1),
                                              (np.array([1, 3]), before, before + 1)], host_index=None,
                                 host_static_start=np.zeros(4))
    rows, at_start, at_end = _host_index(None, prog, (0, 1))  # type: ignore[arg-type, misc]
    assert rows.tolist() == [0, 2, 1, 3]
    assert at_start.tolist() == [0, 0, 1, 2] and at_end.tolist() == [0, 0, 2, 2]
    assert _host_index(None, prog, (0, 1)) is prog.host_index[(0, 1)]  # type: ignore[arg-type]
    shared = types.SimpleNamespace(thread_rows=[(np.array([0, 2]), before, before),
                                                (np.array([1, 2]), before, before)], host_index=None,
                                   host_static_start=np.zeros(4))
    assert _host_index(None, shared, (1, 1)) is None  # type: ignore[arg-type]


def test_host_waits_handed_to_the_run_loop_step_the_same_events() -> None:
    """A host thread's wait under _run_all pushes its wake-up and pops the next event in one ``heappushpop`` and
    hands that entry to the loop (``Executor.fused``): the 8-rank DLRM job (16 host threads, ~2,100 such waits,
    copies on the fabric) gives the same summary, event count and per-op times as stepping the engine with
    ``env.run()`` (each wait pushed, the next event popped by simpy)."""
    from pathlib import Path

    import cosim.replay.executor as ex_mod
    from cosim.replay import replay
    from cosim.replay.summary import without_wall_clock
    from cosim.resources import shared_dir
    from cosim.workload import load_trace

    root = shared_dir()
    folder = None if root is None else Path(root) / "traces" / "param-dlrm-v100x8" / "kineto"
    if folder is None or not folder.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not present")
    g = load_trace(folder, cache=False)
    fused = replay(g)
    plain_run = ex_mod.Executor._run_env

    def plain(self: ex_mod.Executor) -> None:
        self.fused = False
        self.env.run()

    ex_mod.Executor._run_env = plain  # type: ignore[method-assign]
    try:
        stepped = replay(g)
    finally:
        ex_mod.Executor._run_env = plain_run  # type: ignore[method-assign]
    assert without_wall_clock(fused.summary()) == without_wall_clock(stepped.summary())
    assert fused.events == stepped.events
    for a, b in zip(fused.runs, stepped.runs):
        assert a.gpu_start.tobytes() == b.gpu_start.tobytes() and a.host_end.tobytes() == b.host_end.tobytes()
