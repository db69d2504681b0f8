"""Host <-> device copies of a replayed graph as flows on the engine's fabric.

A traced H2D or D2H copy of ``b`` bytes that took ``d`` seconds is split into a
fixed part and a wire part:

* fixed ``o``: the shortest copy of that direction on the rank (DMA setup,
  driver and completion cost that no link speeds up), at most ``d``;
* wire ``d - o``: ``b`` bytes at the measured rate ``b / (d - o)``.

Replayed, the copy first waits for one of its GPU's copy engines (``copy_engines``
per GPU, shared by both directions: CUDA's ``asyncEngineCount``, from the
catalog; more concurrent copies queue in FIFO order), then moves as one fabric flow on its topology route (CPU -> PCIe switch
-> GPU, or the reverse) and ends ``o`` after its last byte. The flow is capped
at the measured rate times ``C / C0``: ``C`` is the route's idle capacity on the
replayed topology, ``C0`` on the topology without catalog overrides (the traced
hardware). So:

* alone on its route, a copy takes ``o + (d - o) * C0 / C`` — its measured
  duration exactly when the links are as traced (identity replay);
* a slower or faster PCIe link (``--set links.pcie4x16.bandwidth=...``) scales
  its wire part;
* copies, collectives (``--collectives simulated``) and GPUDirect RDMA traffic
  that cross the same link at the same time share it max-min fairly, so they
  slow each other only where they overlap.

A copy measured faster than ``C0`` (the catalog's PCIe is slower than the traced
machine's) keeps its measured wire time: its flow carries ``(d - o) * C0`` wire
bytes instead of ``b``. Peer and device-local copies, copies of unknown size and
copies of ranks that have no GPU/CPU on the topology keep their measured
duration (the trace names no peer GPU).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import numpy as np
import simpy

from cosim.workload.graph import CopyKind, GpuKind, RankGraph

__all__ = ["CopyModel", "copy_engines_of", "copy_ops", "copy_static"]

_DIRS = {int(CopyKind.HTOD): "h2d", int(CopyKind.DTOH): "d2h"}


def copy_ops(rg: RankGraph, dur: np.ndarray) -> tuple[int, list[tuple[int, np.ndarray, float]]]:
    """What the copy model reads of rank ``rg`` with GPU op durations ``dur`` (s): its GPU op count and, per
    direction (H2D, then D2H, those it has), the direction, its memcpy ops of known size and positive duration,
    and their fixed part (s: the shortest of them; 0 for a synthesized copy, whose duration is its bytes over
    the route)."""
    G = rg.gpu_ops
    n = len(G)
    kinds: list[tuple[int, np.ndarray, float]] = []
    if not n:
        return n, kinds
    mem = (G.kind == GpuKind.MEMCPY) & np.isfinite(G.bytes) & (G.bytes > 0) & (dur > 0)
    for kind in _DIRS:
        sel = np.flatnonzero(mem & (G.copy_kind == kind))
        if sel.size:
            kinds.append((kind, sel, 0.0 if rg.source.get("synthetic") else float(dur[sel].min())))
    return n, kinds


def copy_static(prog: Any, rg: RankGraph) -> tuple[int, list[tuple[int, np.ndarray, float]]]:
    """:func:`copy_ops` of rank ``rg`` and its program ``prog``'s durations, kept on the program
    (:attr:`~cosim.replay.program.RankProgram.copy_static`: :func:`cosim.replay.program.compile_rank` shares it
    between replays of the same content and durations)."""
    got = prog.copy_static
    if got is None:
        got = prog.copy_static = copy_ops(rg, np.asarray(prog.gpu_dur, dtype=float))
    return cast(tuple[int, list[tuple[int, np.ndarray, float]]], got)


def copy_engines_of(topology: Any, gpu: str, configured: int | None, default: int) -> int:
    """Copy engines of ``gpu`` (host <-> device copies that run at once, both directions together): the
    config's, else the accelerator spec's ``copy_engines`` (the catalog's asyncEngineCount), else ``default``."""
    if configured is not None:
        return int(configured)
    try:
        acc = topology.accelerator(gpu)
    except Exception:  # a topology without accelerator specs
        acc = None
    n = getattr(acc, "copy_engines", None)
    return int(n) if n else int(default)


class CopyModel:
    """Routes, fixed costs and copy-engine queues of the copies of every replayed rank.

    Args:
        env: the replay's simpy environment.
        fabric: the engine's :class:`~cosim.engine.flows.Fabric` (shared with collectives).
        baseline_capacity: ``(src, dst) -> C0`` idle route capacity on the traced hardware (bytes/s).
        ranks: per rank, ``(graph, durations, gpu or None, cpu or None, copy engines)``.
        solo_ok: a copy that starts while no flow is in flight runs as one timeout (no rate solve) and joins the
            fabric, with the bytes it has left, when any other flow starts (wraps ``fabric.start_rows``).
        static: per rank, :func:`copy_ops` of its graph and durations where the caller keeps it
            (:func:`copy_static`); default: worked out here.
        capacity: ``(src, dst) -> C``, ``fabric.path_capacity``'s answers (the idle route capacity, bytes/s)
            from another source (a fabric of the same topology and configuration kept between replays, whose
            route segments are built once); default: ``fabric.path_capacity``.
    """

    def __init__(self, env: simpy.Environment, fabric: Any, baseline_capacity: Callable[[str, str], float],
                 ranks: list[tuple[RankGraph, list[float], str | None, str | None, int]],
                 solo_ok: bool = True, capacity: Callable[[str, str], float] | None = None,
                 static: list[tuple[int, list[tuple[int, np.ndarray, float]]]] | None = None) -> None:
        self.env = env
        self.fabric = fabric
        self.capacity: Callable[[str, str], float] = capacity or fabric.path_capacity
        """Idle route capacity ``C`` (bytes/s) by (src, dst)."""
        self.route: dict[int, list[int]] = {}
        """Rank -> per GPU op: index into ``specs`` of its copy route, or -1 (not a fabric copy)."""
        self.specs: list[tuple[str, str, str, float]] = []
        """(src, dst, engine key, C0 / C) per route."""
        self.fixed: dict[int, np.ndarray] = {}
        """Rank -> fixed cost of each GPU op (s; meaningful for fabric copies only)."""
        self.engines: dict[str, list[Any]] = {}
        """Engine key (the GPU, "gpu3") -> [free engines, FIFO of waiting starts]."""
        self.count = 0
        """Copies that ran on the fabric."""
        self.bytes_on_fabric: dict[int, np.ndarray] = {}
        """Rank -> wire bytes each copy moved as a fabric flow (0 for copies that ran alone as a timeout), so
        that link reports count every copy's bytes once."""
        self.solo_ok = solo_ok
        self.running = 0
        """Copies in flight."""
        self.solo: list[dict[str, Any]] = []
        """Copies running alone as one timeout each (``solo_ok``), not yet on the fabric."""
        for k, (rg, dur, gpu, cpu, engines) in enumerate(ranks):
            ops = static[k] if static is not None else copy_ops(rg, np.asarray(dur, dtype=float))
            self._add_rank(rg.rank, ops, gpu, cpu, engines, baseline_capacity)
        self._joined: Callable[..., simpy.Event] | None = None
        if solo_ok:  # any flow that starts (a collective's, another copy's) first moves lone copies onto the fabric
            start_rows = fabric.start_rows

            def joined(*args: Any, **kw: Any) -> simpy.Event:
                if self.solo:
                    self._to_fabric()
                return start_rows(*args, **kw)

            fabric.start_rows = joined
            self._joined = joined

    def close(self) -> None:
        """After the run: unhook ``fabric.start_rows`` and drop the finished copies' records and queues. Each
        held closures over the executor's ``done`` and over this model (fabric -> ``joined`` -> model ->
        fabric, model -> record -> ``fin`` -> ``done`` -> executor -> model): reference cycles that kept the
        executor and every rank's run state alive until a collection of the oldest generation.
        :attr:`bytes_on_fabric`, :attr:`count` and the routes stay readable."""
        joined = self._joined
        if joined is not None and self.fabric.__dict__.get("start_rows") is joined:
            del self.fabric.start_rows  # the class's method again
        self._joined = None
        self.solo = []
        for eng in self.engines.values():
            eng[1].clear()

    def _add_rank(self, rank: int, ops: tuple[int, list[tuple[int, np.ndarray, float]]], gpu: str | None,
                  cpu: str | None, engines: int, baseline_capacity: Callable[[str, str], float]) -> None:
        """Routes and fixed parts of rank ``rank``'s copies (``ops``: :func:`copy_ops`) on its GPU and CPU."""
        n, kinds = ops
        route = np.full(n, -1, dtype=np.int64)
        fixed = np.zeros(n)
        if gpu is not None and cpu is not None and n:
            for kind, sel, fix in kinds:
                src, dst = (cpu, gpu) if _DIRS[kind] == "h2d" else (gpu, cpu)
                cap = self.capacity(src, dst)
                cap0 = baseline_capacity(src, dst)
                if not (math.isfinite(cap) and cap > 0 and math.isfinite(cap0) and cap0 > 0):
                    continue
                key = gpu
                self.engines.setdefault(key, [engines, deque()])
                self.specs.append((src, dst, key, cap0 / cap))
                route[sel] = len(self.specs) - 1
                fixed[sel] = fix
        self.route[rank] = route.tolist()
        self.fixed[rank] = fixed
        self.bytes_on_fabric[rank] = np.zeros(n)

    # ------------------------------------------------------------------ run
    def start(self, rank: int, j: int, nbytes: float, dur: float, at: float,
              done: Callable[[float, float], None]) -> None:
        """Run copy ``j`` of ``rank`` (measured/effective duration ``dur`` s, ``nbytes``), ready at ``at``;
        ``done(start, end)`` is called at its end (start: when it got a copy engine)."""
        delay = at - self.env.now
        if delay > 0:
            self.env.timeout(delay).callbacks.append(lambda _e: self._acquire(rank, j, nbytes, dur, at, done))
        else:
            self._acquire(rank, j, nbytes, dur, at, done)

    def _acquire(self, rank: int, j: int, nbytes: float, dur: float, at: float,
                 done: Callable[[float, float], None]) -> None:
        key = self.specs[self.route[rank][j]][2]
        eng = self.engines[key]
        if eng[0] > 0:
            eng[0] -= 1
            self._run(rank, j, nbytes, dur, at, done)
        else:
            eng[1].append((rank, j, nbytes, dur, done))

    def _release(self, key: str) -> None:
        eng = self.engines[key]
        if eng[1]:
            rank, j, nbytes, dur, done = eng[1].popleft()
            self._run(rank, j, nbytes, dur, self.env.now, done)
        else:
            eng[0] += 1

    def _run(self, rank: int, j: int, nbytes: float, dur: float, t0: float,
             done: Callable[[float, float], None]) -> None:
        src, dst, key, ratio = self.specs[self.route[rank][j]]
        t0 = max(t0, self.env.now)
        o = min(float(self.fixed[rank][j]), dur)
        wire = dur - o
        alone = o + wire * ratio  # its time alone on the route
        self.count += 1

        def fin(_e: Any = None) -> None:
            self.running -= 1
            end = self.env.now
            if abs(end - (t0 + alone)) <= 1e-9 * alone + 1e-12:  # alone on its route: exact, no round-off
                end = t0 + alone
            self._release(key)
            done(t0, end)

        self.running += 1
        if wire <= 0:
            self.env.timeout(o).callbacks.append(fin)
            return
        cap = self.capacity(src, dst)
        w = min(nbytes, wire * cap * ratio)  # wire bytes: at most what C0 moves in the measured wire time
        rate = w / (wire * ratio)
        if self.solo_ok and self.running == 1 and self.fabric.active_flows == 0:
            # the only flow in flight: one timeout, no rate solve, until another flow starts on the fabric
            # (then it moves onto the fabric with the bytes it has left)
            rec = {"live": True, "t0": t0, "w": w, "rate": rate, "o": o, "src": src, "dst": dst, "fin": fin,
                   "rank": rank, "j": j}
            self.solo.append(rec)

            def solo_done(_e: Any) -> None:
                if rec["live"]:
                    rec["live"] = False
                    fin()

            self.env.timeout(alone).callbacks.append(solo_done)
            return
        self._to_fabric()
        self.bytes_on_fabric[rank][j] = w
        self.fabric.transfer(src, dst, w, max_rate=rate, extra_latency=o, link_latency=False,
                             name="memcpy").callbacks.append(fin)

    def _to_fabric(self) -> None:
        """Move the copies running alone onto the fabric (another copy is about to share their links)."""
        now = self.env.now
        solos, self.solo = self.solo, []
        for rec in solos:
            left = rec["w"] - rec["rate"] * (now - rec["t0"])
            if not rec["live"] or left <= 0:  # done, or in its fixed tail: no link in use
                continue
            rec["live"] = False
            self.bytes_on_fabric[rec["rank"]][rec["j"]] = left
            self.fabric.transfer(rec["src"], rec["dst"], left, max_rate=rec["rate"], extra_latency=rec["o"],
                                 link_latency=False, name="memcpy").callbacks.append(rec["fin"])
