"""Run compiled rank programs on the simulation engine.

The executor is event-driven on the engine's simpy environment, and lean: at
most one simpy queue entry per host launch or synchronize call (each host thread
is a simpy event of its own, :class:`_HostThread`), none per GPU op that shares
nothing. A GPU op's start is ``max(ready, ends of its predecessors, the block
dispatcher)``; once every input is known its end is computed at once
(``start + duration``), even if it lies in the simulated future, and its
successors follow through a work list (list scheduling: exact, because nothing
else changes its speed). What shares a resource runs on the engine in
simulated-time order instead: host <-> device copies wait for a copy engine and
move as flows on the fabric (:mod:`cosim.replay.copies`), collectives meet at a
rendezvous of every participant (matched by process group and sequence number)
and then take the measured duration or run as flows on the same fabric. The
block dispatcher holds an op back while a kernel of another stream that fills
the GPU has more than its last wave to dispatch (:func:`cosim.replay.program.last_wave`).

Why the binding constraint is recorded: ``bound[j]`` says what set op ``j``'s
start — its launch (0: the host was late), a predecessor on the GPU or the
filling kernel that held the dispatcher (1), or collective peers (2) — and feeds
the breakdown and the critical path.
"""

from __future__ import annotations

import bisect
import math
import sys
import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from heapq import heappop, heappush, heappushpop
from typing import Any

import numpy as np
import simpy
from simpy.events import NORMAL

from cosim.replay.copies import CopyModel
from cosim.replay.interference import COMM, COMPUTE, GpuShare
from cosim.replay.program import LAUNCH, RankProgram, ThreadProgram, gpu_successors, gpu_waits
from cosim.workload.graph import GpuKind, RankGraph

__all__ = ["BOUND_COLL", "BOUND_LAUNCH", "BOUND_PRED", "Executor", "RankRun"]

BOUND_LAUNCH, BOUND_PRED, BOUND_COLL = 0, 1, 2

NAN = math.nan

@dataclass
class RankRun:
    """Simulated times of one rank (seconds, same origin as the trace's)."""

    rank: int
    gpu_start: np.ndarray
    gpu_end: np.ndarray
    gpu_ready: np.ndarray
    gpu_bound: np.ndarray
    """BOUND_LAUNCH / BOUND_PRED / BOUND_COLL per GPU op."""
    gpu_bound_src: np.ndarray
    """The predecessor GPU op that bound the start (BOUND_PRED), else -1."""
    gpu_meet: np.ndarray
    """When the op could start its work: for a collective, the arrival of its last peer (its interval before
    that is waiting for peers); for any other op, its start."""
    host_start: np.ndarray
    host_end: np.ndarray
    sync_stall: dict[int, np.ndarray]
    """Thread (row of ``threads``) -> stall of each SYNC event (s)."""
    sync_bound: dict[int, np.ndarray]
    """Thread -> GPU op that released each SYNC event last (-1: nothing to wait for)."""
    launch_latency: float
    launch_latency_source: str
    coll_algo: dict[int, tuple[str, str]] = field(default_factory=dict)
    """Simulated collectives: GPU op -> (algorithm, protocol) the engine chose (names the timeline's NCCL kernels)."""
    lists: tuple[list[float], list[float], list[int], list[int], dict[int, list[float]], dict[int, list[int]]] | None \
        = field(default=None, init=False, compare=False, repr=False)
    """The executor's lists these arrays were made from (GPU start, end, bound, bound source; per thread its
    synchronize calls' stalls and releasing ops), which the summary's critical-path walk reads instead of
    converting the arrays back (:class:`cosim.replay.summary._WalkData`); None for a run made otherwise (a copy
    made with ``dataclasses.replace`` too). The arrays are the record and read-only (an in-place edit would not
    reach these lists)."""


_SHARED_COMPUTE = 1
"""A GPU op's path in :meth:`Executor._drain` (:meth:`Executor._paths`): a compute kernel of the SM/HBM sharing."""

PROGRESS_MIN_OPS = 200_000
"""GPU ops (all ranks) from which a replay shows its progress on stderr."""


def _no_share(*_: Any) -> None:
    """:attr:`_Rank.hot`'s ``start_op`` without SM/HBM sharing (never called: no op takes that path then)."""
    raise AssertionError("a shared compute op without a GpuShare")


_Hot = tuple[list[float], list[float], list[float], list[float], list[int], list[int], Any, Any, Any, Any, Any,
             Any, Any, list[int], Callable[..., None], Any]
"""A rank's columns as :meth:`Executor._drain` reads them: ready, start, end, meet, bound, bound source, pending
predecessors, successors; the program's stream predecessor, gap, predecessors, durations; last waves, paths;
:meth:`GpuShare.start_op` and the rank's :meth:`GpuShare.ops_of`."""


class _Rank:
    __slots__ = (
        "bound",
        "bound_src",
        "coll_algo",
        "coll_key",
        "comm_fallback",
        "copy_route",
        "end",
        "fill",
        "fillers",
        "horizon",
        "hot",
        "meet",
        "path",
        "pending",
        "prog",
        "ready",
        "rg",
        "share",
        "share_ops",
        "sm_free",
        "special",
        "start",
        "stream",
        "succ",
        "sync_bound",
        "sync_stall",
        "sync_watch",
        "waiters",
    )

    def __init__(self, rg: RankGraph, prog: RankProgram) -> None:
        n = len(rg.gpu_ops)
        self.rg = rg
        self.prog = prog
        self.ready = [NAN] * n
        self.start = [NAN] * n
        self.end = [NAN] * n
        self.meet = [NAN] * n
        self.bound = [BOUND_LAUNCH] * n
        self.bound_src = [-1] * n
        # compiled with the program; derived here for a program built without them
        waits = prog.gpu_waits if prog.gpu_waits is not None else gpu_waits(prog.gpu_preds, prog.gpu_stream_pred)
        self.pending = waits.copy()
        self.succ = (prog.gpu_succ if prog.gpu_succ is not None
                     else gpu_successors(prog.gpu_preds, prog.gpu_stream_pred))
        self.waiters: dict[int, list[list[Any]]] = {}
        self.coll_key: dict[int, Any] = {}
        self.coll_algo: dict[int, tuple[str, str]] = {}
        self.sync_stall: dict[int, list[float]] = {}
        self.sync_bound: dict[int, list[int]] = {}
        self.sync_watch: dict[int, list[tuple[int, simpy.Event]]] = {}
        """Thread -> ``(number of its synchronize calls, event)``: the threads (a :class:`_HostThread` is its own
        event) and GPU ops anchored to its first syncs, each succeeded once that many returned (:func:`_release`)."""
        self.comm_fallback = 0
        self.copy_route: list[int] | None = None
        self.share: list[int] | None = None
        self.share_ops: Any = None
        """:meth:`GpuShare.ops_of` this rank (None: not shared)."""
        """Per GPU op: its role in the executor's :class:`GpuShare` (COMM, COMPUTE, 0; None: not shared)."""
        """Per GPU op: its route in the executor's :class:`CopyModel`, or -1 (None: no fabric copies)."""
        self.fill = prog.gpu_last_wave
        """Per GPU op: its last wave's duration when it fills the GPU, else 0 (None: no op does)."""
        self.stream: list[int] = []
        self.sm_free: list[bool] = []
        self.special: list[bool] | None = None
        """Per GPU op: whether it shares a resource (set by the executor; None: no op does)."""
        self.path: list[int] = []
        """Per GPU op: how the executor starts it (:meth:`Executor._paths`)."""
        self.hot: _Hot = ()  # type: ignore[assignment]
        """:meth:`Executor._hot` (set by the executor)."""
        self.horizon = -math.inf
        """Latest end of all but the last wave of any filler: an op ready after it is never held back."""
        self.fillers: dict[int, dict[int, tuple[list[float], list[float], list[int]]]] = {}
        """Device -> stream -> (starts, ends of all but the last wave, ops) of its GPU-filling ops, by start."""
        if self.fill is not None:
            G = rg.gpu_ops
            self.stream = G.stream.tolist()
            self.sm_free = (G.kind == GpuKind.MEMCPY).tolist()  # copies run on copy engines, not SMs


class Executor:
    """Replays ranks on one simpy environment.

    Args:
        env: the environment (shared with the engine's fabric); host threads push their waits on its queue
            and read its clock and id sequence directly (:class:`_HostThread`).
        ranks: (graph, program) per rank.
        collective_runner: for simulated collectives, a callable
            ``(op, participants: list[(rank, gpu_op)], nbytes, matrix) -> simpy.Event | None``
            that starts the collective now; None means measured durations.
        copies: host <-> device copies as flows on the engine's fabric (:mod:`cosim.replay.copies`);
            None: every copy keeps its duration.
        share: SM / HBM sharing between communication and compute kernels (:mod:`cosim.replay.interference`);
            None: every kernel keeps its duration.
    """

    def __init__(self, env: simpy.Environment, ranks: Sequence[tuple[RankGraph, RankProgram]],
                 collective_runner: Callable[..., simpy.Event | None] | None = None,
                 copies: CopyModel | None = None, share: GpuShare | None = None) -> None:
        self.env = env
        self.ranks = [_Rank(rg, prog) for rg, prog in ranks]
        self.by_rank = {r.rg.rank: r for r in self.ranks}
        self.collective_runner = collective_runner
        self.copies = copies
        if copies is not None:
            for r in self.ranks:
                route = copies.route.get(r.rg.rank)
                if route is not None and any(x >= 0 for x in route):
                    r.copy_route = route
        self.share = share
        if share is not None:
            share.sink = self._shared_end
            for r in self.ranks:
                r.share = share.roles.get(r.rg.rank)
                if r.share is not None:
                    r.share_ops = share.ops_of(r.rg.rank)
        self.work: list[tuple[_Rank, int]] = []
        self.arrivals: dict[Any, list[tuple[_Rank, int, float]]] = {}
        self.needed: dict[Any, int] = {}
        self.events = 0
        self.fused = False
        """Whether :func:`_run_all` steps the engine (a host thread's wait then hands it the next event): set by
        :meth:`_run_env` before the threads first run."""
        self._match_collectives()
        for r in self.ranks:
            r.special = self._special(r)
            r.path = self._paths(r)
            r.hot = self._hot(r)

    def _special(self, r: _Rank) -> list[bool] | None:
        """Per GPU op of ``r``: whether it shares a resource (``_start_shared``), else None when none does."""
        n = len(r.rg.gpu_ops)
        if r.share is not None:
            return [True] * n
        special = [x >= 0 for x in r.copy_route] if r.copy_route is not None else [False] * n
        for j in r.coll_key:
            special[j] = True
        if self.collective_runner is not None:
            for j in np.flatnonzero(r.rg.gpu_ops.collective >= 0).tolist():
                special[j] = True
        return special if True in special else None

    @staticmethod
    def _paths(r: _Rank) -> list[int]:
        """Per GPU op of ``r``, how :meth:`_drain` starts it: 0 (it shares nothing: it ends at once),
        :data:`_SHARED_COMPUTE` (a compute kernel of :meth:`GpuShare.start_op`), 2 (:meth:`_start_shared`)."""
        n = len(r.rg.gpu_ops)
        if r.special is None:
            return [0] * n
        if r.share is None:
            return [2 if x else 0 for x in r.special]
        return [_SHARED_COMPUTE if x == COMPUTE else 2 for x in r.share]

    # ----------------------------------------------------------------- setup
    def _match_collectives(self) -> None:
        present = set(self.by_rank)
        # a graph folded into classes (skewed synthetic routing): a group matches among its simulated members
        classes = bool(self.ranks) and all(r.rg.source.get("fold") == "classes" for r in self.ranks)
        for r in self.ranks:
            G, C, grp = r.rg.gpu_ops, r.rg.collectives, r.rg.groups
            js = np.flatnonzero(G.collective >= 0)
            if not js.size:
                continue
            group, seq, typ = C.group.tolist(), C.seq.tolist(), C.type.tolist()
            # group -> (members, matched here, members simulated: the participants a match waits for)
            of_group: dict[int, tuple[tuple[int, ...], bool, int]] = {}
            for j, c in zip(js.tolist(), G.collective[js].tolist()):
                g = group[c]
                m = of_group.get(g)
                if m is None:
                    members = tuple(int(x) for x in grp.ragged("ranks", g)) if g >= 0 else ()
                    here = sum(1 for x in members if x in present)
                    m = of_group[g] = (members, here > 1 and (classes or here == len(members))
                                       and r.rg.rank in members, here)
                if m[1]:
                    key = (m[0], seq[c], typ[c])
                    r.coll_key[j] = key
                    self.needed[key] = m[2]

    # ----------------------------------------------------------------- GPU side
    def _set_ready(self, r: _Rank, j: int, t: float) -> None:
        r.ready[j] = t
        r.pending[j] -= 1
        if r.pending[j] == 0:
            self.work.append((r, j))

    def _drain(self) -> None:
        """Start the ops of the work list, last in first out, until it is empty: an op's start is the latest of its
        ready time, its predecessors' ends and the block dispatcher; a plain op ends at once and releases its
        successors here, a shared one is handed to what models its resource. Per op O(predecessors + successors);
        a rank's columns are read from :meth:`_hot` once per run of ops of one rank."""
        work = self.work
        cur = None
        while work:
            r, j = work.pop()
            if r is not cur:
                cur = r
                (ready, start_, end_, meet, bound_, bsrc, pending, succ, spred, gap, preds, dur, fl, paths,
                 start_op, sops) = r.hot
            start = ready[j]
            bound, src = BOUND_LAUNCH, -1
            sp = spred[j]
            if sp >= 0:
                e = end_[sp] + gap[j]
                if e > start:
                    start, bound, src = e, BOUND_PRED, sp
            for p in preds[j]:
                e = end_[p]
                if e > start:
                    start, bound, src = e, BOUND_PRED, p
            if fl is not None and (fl[j] > 0 or start < r.horizon) and not r.sm_free[j]:
                t, by = self._dispatch(r, j, start)
                if by >= 0:
                    start, bound, src = t, BOUND_PRED, by
            bound_[j] = bound
            bsrc[j] = src
            path = paths[j]
            if path == _SHARED_COMPUTE:  # _start_shared's first branch, inlined (the hot path)
                start_op(sops, r, j, start, dur[j])
            elif path:
                self._start_shared(r, j, start)
            else:  # _finish and _release (a change to either is made here) of an op that shares nothing
                end = start + dur[j]
                start_[j] = start
                end_[j] = end
                meet[j] = start
                self.events += 1
                for s in succ[j]:
                    pending[s] -= 1
                    if pending[s] == 0:
                        work.append((r, s))
                if r.waiters:
                    ws = r.waiters.pop(j, None)
                    if ws:
                        self._wake(ws, end, j)

    def _hot(self, r: _Rank) -> _Hot:
        """What :meth:`_drain` and :meth:`_shared_end` read of rank ``r`` (lists mutated in place, never rebound:
        made once, after :meth:`_paths`)."""
        prog = r.prog
        share = self.share
        return (r.ready, r.start, r.end, r.meet, r.bound, r.bound_src, r.pending, r.succ, prog.gpu_stream_pred,
                prog.gpu_pred_gap, prog.gpu_preds, prog.gpu_dur, r.fill, r.path,
                share.start_op if share is not None else _no_share, r.share_ops)

    def _start_shared(self, r: _Rank, j: int, start: float) -> None:
        """Op ``j`` may start at ``start`` and shares a resource (SMs / HBM, a collective's peers or the
        fabric, a copy engine): hand it to what models that resource, which finishes it."""
        if r.share is not None and r.share[j]:
            if r.share[j] == COMPUTE:  # a compute kernel on a GPU whose communication kernels take SMs / HBM
                self.share.start_op(r.share_ops, r, j, start, r.prog.gpu_dur[j])  # type: ignore[union-attr]
                return
            self.share.comm_op(r.share_ops, j, start, 1)  # type: ignore[union-attr]
        key = r.coll_key.get(j)
        if key is not None:
            self._arrive(key, r, j, start)
        elif self.collective_runner is not None and r.rg.gpu_ops.collective[j] >= 0:
            self._start_collective([(r, j, start)], start)
        elif r.copy_route is not None and r.copy_route[j] >= 0:
            self._copy(r, j, start)
        else:
            self._finish(r, j, start, start + r.prog.gpu_dur[j])

    def _finish(self, r: _Rank, j: int, start: float, end: float, meet: float | None = None) -> None:
        """Op ``j`` of rank ``r`` ran from ``start`` to ``end`` (its peers met at ``meet``): recorded, its
        communication kernel ended, its successors released. Inlined in :meth:`_drain` and :meth:`_shared_end`
        (their per-op paths): a change here is made there."""
        r.start[j] = start
        r.end[j] = end
        r.meet[j] = start if meet is None else max(meet, start)
        self.events += 1
        if r.share is not None and r.share[j] == COMM:
            self.share.comm_op(r.share_ops, j, end, -1)  # type: ignore[union-attr]
        self._release(r, j, end)

    def _release(self, r: _Rank, j: int, end: float) -> None:
        """Op ``j`` of rank ``r`` ended at ``end``: its successors whose last predecessor it was join the work
        list, and the host waiters on it are counted off (:meth:`_wake`). Inlined in :meth:`_drain` and
        :meth:`_shared_end` (their per-op paths): a change here is made there."""
        pending = r.pending
        work = self.work
        for s in r.succ[j]:
            pending[s] -= 1
            if pending[s] == 0:
                work.append((r, s))
        if r.waiters:
            ws = r.waiters.pop(j, None)
            if ws:
                self._wake(ws, end, j)

    @staticmethod
    def _wake(ws: list[Any], end: float, j: int) -> None:
        """Op ``j`` ended at ``end``: each waiter ``[left, latest, event, by, lag]`` counts it off, keeps the
        latest end + lag and the op that set it, and its event succeeds with ``(latest, by)`` at zero."""
        for w in ws:
            w[0] -= 1
            if end + w[4] > w[1]:
                w[1], w[3] = end + w[4], j
            if w[0] == 0:
                w[2].succeed((w[1], w[3]))

    @staticmethod
    def _dispatch(r: _Rank, j: int, t: float) -> tuple[float, int]:
        """Block dispatcher: ``j`` (ready at ``t``) gets SMs only once every kernel of another stream that
        fills the GPU and started before it is in its last wave (program.last_wave). Returns its start and
        the op that delayed it (-1: none). ``j`` itself is registered if it fills the GPU.

        Fillers of one stream never overlap (stream order), so per stream a bisection finds the one that
        could hold ``t``: O(streams with fillers x log fillers) per op."""
        assert r.fill is not None
        dev = r.prog.gpu_device[j] if r.prog.gpu_device is not None else 0
        per_stream = r.fillers.get(dev)
        stream = r.stream[j]
        by = -1
        if per_stream is not None:
            moved = True
            while moved:
                moved = False
                for st, (starts, lws, ops) in per_stream.items():
                    if st == stream:
                        continue
                    k = bisect.bisect_right(starts, t) - 1
                    if k >= 0 and lws[k] > t:
                        t, by, moved = lws[k], ops[k], True
        lw = r.fill[j]
        if lw > 0:
            if per_stream is None:
                per_stream = r.fillers[dev] = {}
            ent = per_stream.get(stream)
            if ent is None:
                ent = per_stream[stream] = ([], [], [])
            k = bisect.bisect_right(ent[0], t)
            ent[0].insert(k, t)
            ent[1].insert(k, t + r.prog.gpu_dur[j] - lw)
            ent[2].insert(k, j)
            if ent[1][k] > r.horizon:
                r.horizon = ent[1][k]
        return t, by

    def _copy(self, r: _Rank, j: int, start: float) -> None:
        """A host <-> device copy: a flow on its route once it has a copy engine (ends in simulated time)."""

        def done(t0: float, end: float) -> None:
            self._finish(r, j, t0, end)
            self._drain()

        assert self.copies is not None
        self.copies.start(r.rg.rank, j, float(r.rg.gpu_ops.bytes[j]), r.prog.gpu_dur[j], start, done)

    def _shared_end(self, k: Any, end: float) -> None:
        """A compute kernel of :meth:`GpuShare.start_op` ended at ``end``: :meth:`_finish` it and drain the work it
        releases (the per-op path of a shared replay). :meth:`_finish` and :meth:`_release` inlined for a compute
        kernel (no communication kernel to end): a change to either is made here (and in :meth:`_drain`)."""
        r, j, start = k.rank, k.op, k.start
        _, start_, end_, meet, _, _, pending, succ, _, _, _, _, _, _, _, _ = r.hot
        start_[j] = start
        end_[j] = end
        meet[j] = start
        self.events += 1
        work = self.work
        for s in succ[j]:
            pending[s] -= 1
            if pending[s] == 0:
                work.append((r, s))
        if r.waiters:
            ws = r.waiters.pop(j, None)
            if ws:
                self._wake(ws, end, j)
        if work:
            self._drain()

    def _arrive(self, key: Any, r: _Rank, j: int, start: float) -> None:
        arr = self.arrivals.setdefault(key, [])
        arr.append((r, j, start))
        if len(arr) < self.needed[key]:
            return
        del self.arrivals[key]
        t_all = max(a[2] for a in arr)
        if self.collective_runner is not None:
            self._start_collective(arr, t_all)
            return
        # Measured: each rank's kernel time includes waiting for the last peer; the
        # last to arrive waited least, so the shortest measured time is the transfer.
        d = min(rr.prog.gpu_dur[jj] for rr, jj, _ in arr)
        for rr, jj, st in arr:
            if st < t_all:
                rr.bound[jj] = BOUND_COLL
            self._finish(rr, jj, st, t_all + d, t_all)

    def _start_collective(self, arr: list[tuple[_Rank, int, float]], t_all: float) -> None:
        def go(_: Any = None) -> None:
            ev = self.collective_runner(arr) if self.collective_runner else None
            if ev is None:  # cannot simulate (unknown bytes/type): measured duration
                d = min(rr.prog.gpu_dur[jj] for rr, jj, _ in arr)
                for rr, jj, st in arr:
                    rr.comm_fallback += 1
                    self._finish(rr, jj, st, t_all + d, t_all)
                self._drain()
                return

            def done(fin: Any) -> None:
                now = self.env.now
                res = fin.value
                for rr, jj, st in arr:
                    rr.coll_algo[jj] = (res.algo, res.proto)
                    if st < t_all:
                        rr.bound[jj] = BOUND_COLL
                    self._finish(rr, jj, st, now, t_all)
                self._drain()

            ev.callbacks.append(done)

        delay = t_all - self.env.now
        if delay > 0:
            self.env.timeout(delay).callbacks.append(go)
        else:
            go()

    # ----------------------------------------------------------------- run
    def run(self) -> tuple[list[RankRun], float]:
        """Run to completion; returns per-rank results and the wall time (s)."""
        t0 = time.perf_counter()
        for r in self.ranks:
            for j, t in r.prog.gpu_orphan_ready.items():
                self._set_ready(r, j, t)
            for j, (thread, nsync, t) in r.prog.gpu_host_anchor.items():
                if nsync == 0:
                    self._set_ready(r, j, t)
                    continue
                ev = self.env.event()  # ready once the anchor thread returned from its first syncs

                def anchored(_: Any, r: _Rank = r, j: int = j, thread: int = thread, nsync: int = nsync,
                             t: float = t) -> None:
                    self._set_ready(r, j, t + sum(r.sync_stall[thread][:nsync]))
                    self._drain()

                ev.callbacks.append(anchored)
                r.sync_watch.setdefault(thread, []).append((nsync, ev))
        self._drain()
        for r in self.ranks:
            for tp in r.prog.threads:
                if tp.ev_kind:
                    _HostThread(self, r, tp).start()
        self._run_env()
        self._drain()
        if self.share is not None:
            self.share.close()
        wall = time.perf_counter() - t0
        return [self._result(r) for r in self.ranks], wall

    def _run_env(self) -> None:
        """``env.run()`` to the end; a run of more than :data:`PROGRESS_MIN_OPS` GPU ops shows a tqdm bar on
        stderr of the ops done (GPU ops finished and host events passed) out of their total (only where stderr
        is a terminal, so logs and ``--json`` stay clean). Same events in the same order as ``env.run()``: one
        ``step()`` per event either way (:func:`_run_all` without the bar)."""
        gpu_ops = sum(len(r.rg.gpu_ops) for r in self.ranks)
        if gpu_ops < PROGRESS_MIN_OPS or not sys.stderr.isatty():
            self.fused = True
            _run_all(self.env)
            return
        self.fused = False
        from tqdm import tqdm

        total = gpu_ops + sum(len(tp.ev_kind) for r in self.ranks for tp in r.prog.threads)
        step = self.env.step
        with tqdm(total=total, desc="simulating", unit=" ops", disable=None, leave=False, mininterval=0.5,
                  file=sys.stderr) as bar:
            n = 0
            try:
                while True:
                    step()
                    n += 1
                    if not n & 0xFFF:
                        bar.update(min(self.events, total) - bar.n)
            except simpy.core.EmptySchedule:
                bar.update(min(self.events, total) - bar.n)

    def unresolved(self) -> list[tuple[int, int]]:
        """(rank, gpu op) pairs that never ran: dependency cycles or missing peers."""
        out = []
        for r in self.ranks:
            total = sum(r.end)
            if total == total:  # no NaN among them (a NaN sum without one, inf - inf, takes the loop: same answer)
                continue
            for j, e in enumerate(r.end):
                if e != e:
                    out.append((r.rg.rank, j))
        return out

    def _result(self, r: _Rank) -> RankRun:
        prog = r.prog
        hs = prog.host_static_start.copy()
        he = prog.host_static_end.copy()
        prefixes = []
        for tp in prog.threads:
            st = np.asarray(r.sync_stall.get(tp.thread, []), dtype=float)
            base = 0.0
            if tp.anchor_syncs > 0:  # stall inherited from the anchor thread
                base = float(sum(r.sync_stall.get(tp.anchor_thread, [])[:tp.anchor_syncs]))
            prefixes.append(np.concatenate([[base], base + np.cumsum(st)]))
        index = _host_index(r.rg, prog, tuple(len(p) - 1 for p in prefixes)) if prefixes else None
        if index is not None:  # each host op of a thread moved by its thread's stall before it starts / ends
            rows, at_start, at_end = index
            stall = np.concatenate(prefixes)
            hs[rows] += stall[at_start]
            he[rows] += stall[at_end]
        else:  # threads sharing host ops (not made by compile): each adds its own, in turn
            for prefix, (rows, before_start, before_end) in zip(prefixes, _thread_rows(r.rg, prog)):
                nb = len(prefix) - 1
                hs[rows] += prefix[np.minimum(before_start, nb)]
                he[rows] += prefix[np.minimum(before_end, nb)]
        run = RankRun(
            rank=r.rg.rank,
            gpu_start=np.asarray(r.start, dtype=float),
            gpu_end=np.asarray(r.end, dtype=float),
            gpu_ready=np.asarray(r.ready, dtype=float),
            gpu_bound=np.asarray(r.bound, dtype=np.int8),
            gpu_bound_src=np.asarray(r.bound_src, dtype=np.int64),
            gpu_meet=np.asarray(r.meet, dtype=float),
            host_start=hs,
            host_end=he,
            sync_stall={t: np.asarray(v, dtype=float) for t, v in r.sync_stall.items()},
            sync_bound={t: np.asarray(v, dtype=np.int64) for t, v in r.sync_bound.items()},
            launch_latency=prog.launch_latency,
            launch_latency_source=prog.launch_latency_source,
            coll_algo=dict(r.coll_algo),
        )
        for a in (run.gpu_start, run.gpu_end, run.gpu_bound, run.gpu_bound_src, *run.sync_stall.values(),
                  *run.sync_bound.values()):
            a.flags.writeable = False  # the lists below are read instead: an in-place edit would not reach them
        run.lists = (r.start, r.end, r.bound, r.bound_src, r.sync_stall, r.sync_bound)
        return run


class _HostThread(simpy.events.Event):
    """One host thread of a rank: its program's launch and synchronize calls, each at its static time plus the
    stall its synchronize calls accumulated so far (s).

    The thread is itself the one simpy event it waits on, and its step on the engine resumes its body (a
    generator) directly. Where a simpy process would wait (a later call's time while other events are due
    first, a synchronize call's GPU ops, the anchor thread's first syncs), it puts itself on the engine's queue
    where simpy would have put the timeout, the event or the process's start (same time, same priority, the
    next place in the sequence): the same events in the same order as one simpy process per thread, without a
    ``Process``, its ``Initialize`` and end events or an event object per wait (a wait costs one heap push and
    pop). A call due before any other event runs at once (the clock moved to it, the same float a timeout
    reaches), so consecutive calls run in one step until a real wait. O(1) a call besides the GPU work it
    releases."""

    def __init__(self, ex: Executor, r: _Rank, tp: ThreadProgram) -> None:
        self.env = ex.env
        self._ok = True
        self._value: Any = None
        body = self._body(ex, r, tp)
        next(body)  # to its first yield: from now on the engine's step resumes it with ``send``
        self._cbs: list[Callable[[Any], Any]] = [body.send]
        self.callbacks = self._cbs

    def start(self) -> None:
        """Schedule the thread's start now, urgent, as ``env.process`` schedules a process's first step."""
        self.env.schedule(self, simpy.events.URGENT)

    def succeed(self, value: Any = None) -> _HostThread:
        """The wait is over (``value``: a synchronize call's ``(return time, op that set it)``): step again now."""
        self._value = value
        self.callbacks = self._cbs
        self.env.schedule(self)
        return self

    def _body(self, ex: Executor, r: _Rank, tp: ThreadProgram) -> Generator[Any, Any, None]:
        """The thread's calls in order; each wait is a ``yield`` here (hence one function: a helper could not
        yield for it without a generator of its own per call)."""
        yield  # started by the engine's step
        env = ex.env
        prog = r.prog
        lat, hidden = prog.launch_latency, prog.gpu_hidden_delay
        launch_gpu, sync_deps, delay = prog.launch_gpu, prog.sync_deps, prog.launch_delay
        kinds, hosts, statics, costs = tp.ev_kind, tp.ev_host, tp.ev_static, tp.ev_cost
        stalls: list[float] = []
        bounds: list[int] = []
        r.sync_stall[tp.thread] = stalls
        r.sync_bound[tp.thread] = bounds
        stall = 0.0
        if tp.anchor_syncs > 0:  # start after the anchor thread's first syncs; inherit their stall
            done = r.sync_stall.get(tp.anchor_thread)
            if done is None or len(done) < tp.anchor_syncs:
                r.sync_watch.setdefault(tp.anchor_thread, []).append((tp.anchor_syncs, self))
                yield
                done = r.sync_stall[tp.anchor_thread]
            stall = sum(done[:tp.anchor_syncs])
        watch = r.sync_watch
        end_, ready, pending = r.end, r.ready, r.pending
        work = ex.work
        queue = env._queue  # simpy's event heap: (time, priority, id, event)
        eid = env._eid
        cbs = self._cbs
        thread = tp.thread
        now = env._now  # the clock moves only at this body's waits (or where it steps over one, below)
        counted = 0  # calls passed, added to ``ex.events`` before each wait and at the end
        fused = ex.fused  # stepped by _run_all: a wait hands it the next event (set once the engine runs)
        for k in range(len(kinds)):
            t = statics[k] + stall
            if t > now:
                if queue and queue[0][0] <= t:  # something else is due first: wait where a timeout would go
                    self.callbacks = cbs
                    ex.events += counted
                    counted = 0
                    if fused:
                        yield heappushpop(queue, (now + (t - now), NORMAL, next(eid), self))
                    else:
                        heappush(queue, (now + (t - now), NORMAL, next(eid), self))
                        yield
                    now = env._now
                else:  # nothing else is due by t: the timeout would be the next event, step over it
                    now += t - now  # the same float the timeout would reach
                    env._now = now
            counted += 1
            h = hosts[k]
            if kinds[k] == LAUNCH:  # _set_ready per op, inlined
                rdy = t + lat + (delay.get(h, 0.0) if delay else 0.0)
                for j in launch_gpu[h]:
                    ready[j] = rdy + hidden.get(j, 0.0) if hidden else rdy
                    pending[j] -= 1
                    if pending[j] == 0:
                        work.append((r, j))
                if work:
                    ex._drain()
                continue
            cost = costs[k]  # a sync returns ``cost`` after its start and after its GPU work
            end_min = t + cost
            m, by, missing = end_min, -1, 0
            deps = sync_deps.get(h, ())
            for d in deps:
                e = end_[d]
                if e != e:  # NaN: not resolved yet
                    missing += 1
                elif e + cost > m:
                    m, by = e + cost, d
            if missing:  # wait for them: _wake succeeds this thread with (return time, op that set it)
                w = [missing, m, self, by, cost]
                for d in deps:
                    if end_[d] != end_[d]:
                        r.waiters.setdefault(d, []).append(w)
                ex.events += counted
                counted = 0
                yield
                now = env._now
                m, by = self._value
            stalls.append(m - end_min)
            bounds.append(by)
            stall += m - end_min
            if thread in watch:
                _release(watch[thread], len(stalls))
        ex.events += counted
        self._cbs.clear()  # drop the one reference to this body: it is freed (closed) once the step returns
        yield  # never resumed


def _run_all(env: simpy.Environment) -> None:
    """``env.run()`` to the end: simpy's ``Environment.step`` inlined in its loop (the same pop, callbacks and
    failure check per event, one Python call less: the replay's hottest loop). A host thread's step (a
    :class:`_HostThread`, its one callback its body's ``send``, never failed) resumes the body directly; a body
    that waits for a later time pushes its wake-up and pops the next event in one ``heappushpop`` and hands that
    entry back (the same entry the next pop would give: entries are distinct, so which one is smallest does not
    depend on the heap's layout), which is stepped next."""
    queue = env._queue
    host = _HostThread
    while queue:
        env._now, _, _, event = heappop(queue)
        while event.__class__ is host:
            event.callbacks = None  # type: ignore[assignment]
            entry = event._cbs[0](event)
            if entry is None:
                break
            env._now, _, _, event = entry
        else:  # any other event (popped, or handed over by a host thread): simpy's step
            callbacks: Any = event.callbacks
            event.callbacks = None  # type: ignore[assignment]
            for callback in callbacks:
                callback(event)
            if not event._ok and not hasattr(event, "_defused"):  # a failed event nobody handled: crash, as step does
                exc = type(event._value)(*event._value.args)
                exc.__cause__ = event._value
                raise exc


def _thread_rows(rg: RankGraph, prog: RankProgram) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """:attr:`RankProgram.thread_rows`, worked out once per program (O(host ops x threads))."""
    got = prog.thread_rows
    if got is None:
        thread = rg.host_ops.thread
        got = []
        for tp in prog.threads:
            rows = np.flatnonzero(thread == tp.thread)
            got.append((rows, prog.host_syncs_before_start[rows], prog.host_syncs_before_end[rows]))
        prog.thread_rows = got
    return got


def _host_index(rg: RankGraph, prog: RankProgram, syncs: tuple[int, ...]
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The host ops of ``prog``'s threads (each thread's rows of :func:`_thread_rows` in turn) and, at each, the
    index of its stall before it starts and before it ends in the threads' stall prefixes laid end to end
    (thread k's ``syncs[k] + 1`` of them, its count of synchronize calls passed clipped to ``syncs[k]``); None
    where two threads share a host op (one indexed add would not add both). Kept on the program per ``syncs``
    (:attr:`RankProgram.host_index`; a run passes every call: one entry)."""
    memo = prog.host_index
    if memo is None:
        memo = prog.host_index = {}
    if syncs in memo:
        return memo[syncs]
    rows, at_start, at_end = [], [], []
    off = 0
    for (r, before_start, before_end), nb in zip(_thread_rows(rg, prog), syncs):
        rows.append(r)
        at_start.append(np.minimum(before_start, nb) + off)
        at_end.append(np.minimum(before_end, nb) + off)
        off += nb + 1
    all_rows = np.concatenate(rows)
    seen = np.zeros(len(prog.host_static_start), dtype=bool)
    seen[all_rows] = True
    got = memo[syncs] = ((all_rows, np.concatenate(at_start), np.concatenate(at_end))
                         if np.count_nonzero(seen) == all_rows.size else None)
    return got


def _release(watching: list[tuple[int, simpy.Event]], syncs: int) -> None:
    """A thread's ``syncs``-th synchronize call returned: succeed the events of ``watching`` (``(number of
    syncs, event)``: threads and GPU ops anchored to its first syncs) whose syncs have all returned."""
    for sw in [sw for sw in watching if sw[0] <= syncs]:
        watching.remove(sw)
        sw[1].succeed()
