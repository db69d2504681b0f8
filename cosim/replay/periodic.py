"""Coalescing repeated micro-batches: a long pipelined training step from a short one.

In the steady phase of a 1F1B or interleaved 1F1B schedule every group of ``pp`` micro-batches
issues the same units in the same order, so once the pipeline is full the whole simulated state
(every rank's position in its program, the flows on the fabric, relative to now) repeats with a
period ``P``. A step of ``M`` micro-batches per pipeline is then the step of a shorter ``m`` with
``K = (M - m) / pp`` more periods inserted: step time ``T(M) = T(m) + K P``, each windowed figure
(breakdown, exposed-communication split, critical path, bubble idle time) its value over the
``m`` step plus ``K`` times its value over one period, and the timeline the ``m`` step's events with
one period's events replicated ``K`` times.

The period is not assumed, it is measured and checked: :func:`detect_period` compares, on every
simulated rank, the GPU start and end of each steady-state schedule unit with those of the same
unit ``pp`` micro-batches earlier, and accepts only when every shift equals the period within
``tol`` (relative), and every GPU op of the repeated window repeats the one before it. The probe count
is the smallest ``m`` whose steady phase holds 7/4 periods of such pairs on every stage (the pipeline's
fill, a transient of at least 3/4 of a period, then a full period of equal shifts); when the check fails, a
probe one period longer is tried, then probes of doubling length while shorter than the step, and then the plain run
(``cosim.scenario`` does the fallback). DualPipe, launch jitter (random per launch) and steps too
short to hold a probe and a period more are not coalesced.

Cost: the replay of ``m`` micro-batches instead of ``M`` (O(m) events instead of O(M)); the check
and the figures are O(ops of the probe); the timeline is O(events of the full step) (it is the full
step's timeline).
"""

from __future__ import annotations

import gc
import itertools
import math
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from cosim.replay.api import ReplayResult
from cosim.workload.synth.schedule import Unit, stage_order, steady_bounds

__all__ = ["Periodic", "PeriodicResult", "RepeatedWindow", "detect_period", "extend_figures", "probe_microbatches"]

TOL = 5e-3
"""Largest accepted deviation of a unit's (or GPU op's) shift from the period, relative to the period: the
steady state of a large folded step repeats to about 0.2-0.4% per period (contended collectives
settle slightly differently), so the inserted time is exact to within this bound (the 0.5% of the
exactness test); small steps repeat to ~1e-14."""


@dataclass
class Periodic:
    """A measured steady-state period of a simulated probe step and how it extends to the full step."""

    simulated_microbatches: int
    """Micro-batches per pipeline simulated (the probe)."""
    microbatches: int
    """Micro-batches per pipeline of the full step."""
    period_microbatches: int
    """Micro-batches per period (pp)."""
    period_s: float
    """The period (s): how much later each steady unit starts than its counterpart one period earlier."""
    repeats: int
    """Periods inserted: (microbatches - simulated_microbatches) / period_microbatches."""
    max_deviation_s: float
    """Largest deviation of a compared unit's shift from the period (s)."""
    pairs: int
    """Unit pairs compared over all simulated ranks."""
    cut: dict[int, float] = field(default_factory=dict)
    """Rank -> end of its replicated window (s): events in ``[cut - period, cut)`` are repeated."""

    @property
    def extra_s(self) -> float:
        """Time inserted into the step (s)."""
        return self.repeats * self.period_s

    def as_dict(self) -> dict[str, Any]:
        """The ``coalesced`` field of the summary."""
        return {"simulated_microbatches": self.simulated_microbatches, "microbatches": self.microbatches,
                "period_microbatches": self.period_microbatches, "period_s": self.period_s,
                "repeats": self.repeats, "max_deviation_s": self.max_deviation_s, "pairs": self.pairs}


def _pairs_per_stage(pp: int, vpp: int, m: int, extra_warmup: int, overlap: bool) -> tuple[int, int]:
    """Fewest steady unit pairs one period apart over the stages, and the units of one period."""
    best = math.inf
    for stage in range(pp):
        order = stage_order(stage, pp, vpp, m, extra_warmup)
        lo, hi = steady_bounds(order)
        steady = {u for u in order[lo:hi]}
        n = sum(1 for k, mb, v in steady if (k, mb - pp, v) in steady)
        best = min(best, n)
    per_period = 2 * pp * vpp
    return int(best), per_period


def probe_microbatches(pp: int, vpp: int, microbatches: int, extra_warmup: int = 0,
                       overlap: bool = False) -> int | None:
    """The smallest micro-batch count whose steady phase holds, on every stage, a full period of unit pairs after
    a transient of at least 3/4 of a period (7/4 periods of pairs) and that leaves a whole number of periods (``pp``
    micro-batches) to the full step; None when that is not shorter than the step by at least one period. For pp 8
    vpp 4: 32 (116 pairs on stage 0, 64 a period; 24 has 52, less than one period). Rounds 4-5 kept the longer rule
    (two periods of pairs: 40 for pp 8 vpp 4) because 32 failed or passed narrowly on the 1024-GPU DeepSeek-V3
    step; on the round-7 fabric it passes there with a largest deviation of 0.16% of the period (40: 0.16% too) and
    the step within 0.07% of the 40 probe's and 0.06% of the plain step's (benchmarks/README.md, "Round 8 engine").
    A probe whose check fails is followed by one a period longer (``cosim.scenario``)."""
    step = pp if vpp > 1 else 1
    start = max(pp, 2 * pp if overlap and pp > 1 else 1)
    m = -(-start // step) * step
    while m + pp <= microbatches:
        if (microbatches - m) % pp == 0:
            n, per = _pairs_per_stage(pp, vpp, m, extra_warmup, overlap)
            if 4 * n >= 7 * per:  # the pipeline's fill (a transient of >= 3/4 period) and a full period after it
                return m
        m += step
    return None


def _ops_repeat(s: np.ndarray, e: np.ndarray, names: np.ndarray | None, lo: int, hi: int, shift: int,
                period: float, tol: float) -> bool:
    """Whether the GPU ops ``lo..hi-1`` (issue order) repeat the ops ``shift`` earlier moved by ``period``:
    same names, every start and end shifted by ``period`` within ``tol`` x ``period``."""
    if hi <= lo or lo - shift < 0:
        return False
    b = np.arange(lo, hi)
    a = b - shift
    if names is not None and not np.array_equal(names[a], names[b]):
        return False
    lim = tol * period
    return bool((np.abs(s[b] - s[a] - period) <= lim).all() and (np.abs(e[b] - e[a] - period) <= lim).all())


def _window_complete(s: np.ndarray, names: np.ndarray | None, cut: float, period: float, tol: float) -> bool:
    """Whether every GPU op (any stream) starting in the period before ``cut`` has a counterpart of the same name
    starting one period earlier, and every op of the period before that one a counterpart one period later (each
    within ``tol`` x ``period``): the replicated window ``[cut - period, cut)`` then holds each repeating op
    exactly once, also ops that run ahead of the schedule's units (a pipeline receive posted for a later
    micro-batch on its own stream, which the probe may not have)."""
    ok = np.isfinite(s)
    idx = np.flatnonzero(ok & (s >= cut - 2 * period) & (s < cut))
    if not idx.size:
        return False
    lim = tol * period
    nm = names[idx] if names is not None else np.zeros(idx.size, dtype=np.int64)
    allv = np.flatnonzero(ok)
    alln = names[allv] if names is not None else np.zeros(allv.size, dtype=np.int64)
    for name in np.unique(nm).tolist():
        mine = s[idx[nm == name]]
        pool = np.sort(s[allv[alln == name]])
        later = mine >= cut - period
        want = np.where(later, mine - period, mine + period)
        k = np.clip(np.searchsorted(pool, want), 1, max(pool.size - 1, 1))
        near = np.minimum(np.abs(pool[k - 1] - want), np.abs(pool[np.minimum(k, pool.size - 1)] - want))
        if not (near <= lim).all():
            return False
    return True


def detect_period(unit_keys: dict[int, list[tuple[tuple[Unit, ...], bool]]],
                  unit_spans: dict[int, list[tuple[int, int, bool]]], runs: list[Any], q: int,
                  tol: float = TOL, names: dict[int, np.ndarray] | None = None
                  ) -> tuple[float, float, int, dict[int, float]] | None:
    """The common period of every simulated rank's steady units ``q`` micro-batches apart.

    Per rank, the steady units with a counterpart ``q`` micro-batches earlier, in issue order, each give two
    shifts (of its GPU start and end). A cut (the start of such a unit) is accepted when the pairs of the
    full period up to it (the units of ``q`` micro-batches) all shift by the same period (their median)
    within ``tol`` x the period, every GPU op starting in the period before the cut repeats
    the one before it (:func:`_ops_repeat`: same names, shifted by the period), and the window is complete
    (:func:`_window_complete`: every op of any stream starting in the two periods before the cut has its
    counterpart one period away): this excludes the pipeline's
    fill and the end of the step (the last micro-batch's gradient buckets) from the repeated window. The
    latest accepted cut is taken; every rank needs one and the ranks' periods must agree within ``tol``.
    Returns ``(period, max deviation, pairs compared, cut per rank)`` or None. Cost: O(units x units of a
    period) for the pairs, O(ops of a period) for each candidate cut tried (latest first)."""
    periods: dict[int, float] = {}
    cuts: dict[int, float] = {}
    devs: list[float] = []
    n_pairs = 0
    by_rank = {run.rank: run for run in runs}
    for rank, keys in unit_keys.items():
        run = by_rank.get(rank)
        spans = unit_spans.get(rank, [])
        if run is None or len(spans) != len(keys):
            return None
        index = {k: i for i, (k, steady) in enumerate(keys) if steady}
        s, e = run.gpu_start, run.gpu_end
        rows: list[tuple[float, float, float]] = []  # (start shift, end shift, start)
        idx: list[tuple[int, int]] = []  # (first op of the unit, of its counterpart)
        for i, (k, steady) in enumerate(keys):
            j = index.get(tuple((kind, mb - q, v) for kind, mb, v in k)) if steady else None
            if j is not None:
                a, b = spans[i], spans[j]
                rows.append((float(s[a[0]] - s[b[0]]), float(e[a[1]] - e[b[1]]), float(s[a[0]])))
                idx.append((a[0], b[0]))
        per_period = sum(1 for k, _ in keys if k[0][1] < q)
        if len(rows) < per_period:
            return None
        pairs = np.asarray(rows)
        if not np.isfinite(pairs).all():
            return None
        nm = names.get(rank) if names is not None else None
        found = None
        for i in range(len(rows) - 1, per_period - 2, -1):  # latest cut first
            tail = pairs[i - per_period + 1:i + 1, :2]
            ref = float(pairs[i, 0])
            if ref <= 0 or not (np.abs(tail - ref) <= tol * ref).all():
                continue
            p_r = float(np.median(tail))
            lo, hi = idx[i - per_period + 1][0], idx[i][0]
            if _ops_repeat(s, e, nm, lo, hi, idx[i][0] - idx[i][1], p_r, tol) \
                    and _window_complete(s, nm, float(pairs[i, 2]), p_r, tol):
                found = (i, tail, p_r)
                break
        if found is None:
            return None
        i, tail, p_r = found
        periods[rank] = p_r
        devs.append(float(np.abs(tail - p_r).max()))
        cuts[rank] = float(pairs[i, 2])
        n_pairs += per_period
    if not periods:
        return None
    vals = np.asarray(list(periods.values()))
    period = float(np.median(vals))
    dev = max(max(devs), float(np.abs(vals - period).max()))
    if dev > tol * period:
        return None
    return period, dev, n_pairs, cuts


def _add(base: dict[str, Any], per: dict[str, Any], k: int) -> dict[str, Any]:
    """``base + k * per`` for the numeric leaves (dicts recursively; others from ``base``)."""
    out = dict(base)
    for key, v in per.items():
        if isinstance(v, dict):
            out[key] = _add(base.get(key) or {}, v, k)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            b = base.get(key)
            out[key] = (b if isinstance(b, (int, float)) and b is not None else 0.0) + k * v
    return out


def extend_figures(result: Any, per: Periodic) -> dict[str, Any]:
    """The summary of the full step from the probe's ``result`` (a ReplayResult) and its period."""
    from cosim.replay.summary import slowest_rank, summarize_with

    base, period = summarize_with(result, {r: (c - per.period_s, c) for r, c in per.cut.items()})
    summ = dict(base)
    k = per.repeats
    ranks = []
    for rs, rg in zip(summ["ranks"], result.graph.ranks):
        r = dict(rs)
        cut = per.cut.get(rg.rank)
        if r.get("step_time_s") is not None:
            r["step_time_s"] += per.extra_s
            r["steps"] = [{**st, "step_time_s": st["step_time_s"] + per.extra_s
                           if st.get("step_time_s") is not None else None} for st in r.get("steps", [])]
        if cut is not None:
            one = period[rg.rank]  # breakdown, comm_split and critical_path over (cut - period_s, cut), n_periods 1
            r["breakdown"] = _add(r["breakdown"], one["breakdown"], k)
            r["exposed_communication_split"] = _add(r["exposed_communication_split"],
                                                    one["exposed_communication_split"], k)
            cp = one["critical_path"]
            base_cp = r.get("critical_path") or {}
            merged = _add(base_cp, {x: cp[x] for x in ("total_s", "by_resource", "by_class")}, k)
            merged["top_ops"] = base_cp.get("top_ops", [])
            merged["bound"] = max(merged["by_resource"], key=lambda x: merged["by_resource"][x]) \
                if merged.get("by_resource") else base_cp.get("bound")
            r["critical_path"] = merged
        ranks.append(r)
    summ["ranks"] = ranks
    slow, ties = slowest_rank(ranks)
    if slow is not None:
        summ["slowest_rank"], summ["slowest_rank_ties"] = slow["rank"], ties
        summ["step_time_s"] = slow["step_time_s"]
        summ["breakdown"] = slow["breakdown"]
        summ["exposed_communication_split"] = slow["exposed_communication_split"]
        summ["critical_path"] = slow["critical_path"]
    summ["coalesced"] = per.as_dict()
    return summ


def bubble_fraction(unit_spans: dict[int, list[tuple[int, int, bool]]], runs: list[Any], per: Periodic) -> float:
    """The pipeline bubble of the full step (as :func:`cosim.workload.synth.spec.bubble_fraction`): the
    probe's idle time before receiving units plus ``repeats`` times that of one period, over the probe's
    span plus the inserted time; mean over ranks."""
    fr = []
    by_rank = {run.rank: run for run in runs}
    for rank, spans in unit_spans.items():
        run = by_rank.get(rank)
        cut = per.cut.get(rank)
        if run is None or not spans or cut is None:
            continue
        s, e = run.gpu_start, run.gpu_end
        eps = 1e-6 * per.period_s  # unit starts one period apart agree far closer (TOL); gaps are wider
        lo, hi = cut - per.period_s - eps, cut - eps
        idle = idle_p = 0.0
        for prev, (a, _, recv) in itertools.pairwise(spans):
            if recv:
                gap = max(0.0, float(s[a] - e[prev[1]]))
                idle += gap
                if lo <= float(s[a]) < hi:
                    idle_p += gap
        window = float(e[spans[-1][1]] - s[spans[0][0]]) + per.extra_s
        if window > 0:
            fr.append((idle + per.repeats * idle_p) / window)
    return float(sum(fr) / len(fr)) if fr else math.nan


_ID_STEP = 1 << 40
"""Offset added to the ids of each repeated copy of the period's events (ids stay distinct)."""


TIMELINE_MAX_GPU_OPS = 1_000_000
"""Most GPU ops (over the simulated ranks) the timeline of a coalesced step draws: past it, the repeated period
is drawn fewer times than it repeats, and one span per rank (``cat`` ``coalesced``) stands for the periods not
drawn; the step's end and every event after the repeated window keep their full-step times. (A 1024-GPU
DeepSeek-V3 step is ~2.9M GPU ops over its 8 simulated ranks, ~11M trace events: minutes to write and more than
Perfetto opens.)"""


def round3(x: np.ndarray) -> list[float]:
    """``[round(v, 3) for v in x]`` exactly (:func:`round3_array` as a list)."""
    return round3_array(x).tolist()  # type: ignore[no-any-return]


def round3_array(x: np.ndarray) -> np.ndarray:
    """``round(v, 3)`` of every ``v`` of ``x`` exactly, vectorized, as a float64 column: ``rint(1000 v) / 1000`` is
    Python's correctly rounded result wherever ``1000 v``'s rounding error cannot cross a half (checked per value;
    those that might, and non-finite ones, go through ``round``). O(len(x)) numpy work."""
    y = np.asarray(x, dtype=np.float64) * 1000.0
    r = np.rint(y)
    out = r / 1000.0
    with np.errstate(invalid="ignore"):
        unsure = ~(np.abs(y - r) < 0.5 - 4.0 * np.spacing(np.abs(y)))
    for k in np.flatnonzero(unsure).tolist():
        out[k] = round(float(x[k]), 3)
    return out


ID_KEYS = ("External id", "correlation")
"""The ``args`` keys whose ids each copy of the period moves by its id offset (with the event's own ``id``)."""


@dataclass
class RepeatedWindow:
    """The drawn copies of one rank's repeated period, not yet materialized: copy ``j`` (1..``copies``) of every
    event of ``events`` has ``ts`` = ``round(ts + j * period_us, 3)`` (:func:`round3`, a column at once) and its
    ``id`` and ``args`` ids (:data:`ID_KEYS`) plus ``j * id_step``; ``tail`` (the span standing for the periods
    not drawn, when any) follows the copies. :meth:`expanded` gives them as event dicts; a writer may instead
    serialize ``events`` once and substitute the moved numbers per copy (:mod:`cosim.output.timeline`)."""

    events: list[dict[str, Any]]
    """The probe's events of the window ``[cut - period, cut)`` (shared with the probe's list: read only)."""
    copies: int
    """Copies drawn."""
    period_us: float
    """The period (us)."""
    id_step: int
    """Id offset between consecutive copies."""
    tail: list[dict[str, Any]] = field(default_factory=list)
    """Events after the copies (the ``coalesced`` span of the periods not drawn)."""

    def ts(self) -> np.ndarray:
        """The window events' ``ts`` (us) as a float column."""
        return np.asarray([ev["ts"] for ev in self.events], dtype=float)

    def copy_times(self, ts: np.ndarray, j: int) -> list[float]:
        """Copy ``j``'s ``ts`` of every window event (``ts``: :meth:`ts`)."""
        return round3(ts + j * self.period_us)

    def expanded(self) -> list[dict[str, Any]]:
        """Every copy's events (ids made distinct; args without ids to move stay shared), then ``tail``."""
        out: list[dict[str, Any]] = []
        add = out.append
        tmpl = [(ev, "id" in ev, ev.get("args"),
                 [k for k in ID_KEYS if ev.get("args") and k in ev["args"]]) for ev in self.events]
        wts = self.ts()
        for j in range(1, self.copies + 1):
            off = j * self.id_step
            for (ev, has_id, args, keys), t in zip(tmpl, self.copy_times(wts, j)):
                c = ev.copy()
                c["ts"] = t
                if has_id:
                    c["id"] += off
                if keys and args:  # args without ids to shift stay shared (the writers only read them)
                    a = args.copy()
                    for key in keys:
                        a[key] += off
                    c["args"] = a
                add(c)
        out.extend(self.tail)
        return out


def _shift_events(evs: list[dict[str, Any]], cut_us: float, per: Periodic, id_step: int,
                  copies: int | None = None) -> tuple[list[dict[str, Any]], RepeatedWindow]:
    """One rank's events of the full step: those at or after the cut moved by the inserted time, those in
    the period before it to be repeated ``copies`` times (default: ``repeats``; the returned
    :class:`RepeatedWindow`), spans across the window stretched."""
    sh = EventShift.of(cut_us, per, id_step, copies)  # the cut, window, inserted time and copies
    paused = gc.isenabled()
    gc.disable()  # millions of new acyclic dicts: the collector's passes would cost as much as building them
    try:
        return _shift(evs, sh)
    finally:
        if paused:
            gc.enable()


def _shift(evs: list[dict[str, Any]], sh: EventShift) -> tuple[list[dict[str, Any]], RepeatedWindow]:
    """:func:`_shift_events` once its window is known. New times are ``round(t + shift, 3)``, rounded for a whole
    column at once (:func:`round3`)."""
    cut_us, lo, extra = sh.cut_us, sh.lo, sh.extra
    out: list[dict[str, Any]] = []
    window: list[dict[str, Any]] = []
    after: list[dict[str, Any]] = []
    after_ts: list[float] = []
    add, keep = out.append, window.append
    for ev in evs:
        ts = ev.get("ts")
        if ts is None or ev.get("ph") == "M":
            add(ev)
        elif ts >= cut_us:
            c = ev.copy()
            add(c)
            after.append(c)
            after_ts.append(ts)
        elif ts >= lo:
            keep(ev)
            add(ev)
        elif ev.get("ph") == "X" and ts + ev.get("dur", 0.0) > cut_us:
            c = ev.copy()
            c["dur"] = round(ev["dur"] + extra, 3)
            add(c)
        else:
            add(ev)
    for c, v in zip(after, round3(np.asarray(after_ts, dtype=float) + extra)):
        c["ts"] = v
    rw = RepeatedWindow(window, sh.copies, sh.period_us, sh.id_step)
    if sh.copies < sh.repeats and window:
        first = next((ev for ev in evs if ev.get("ph") == "X"), window[0])
        rw.tail.append(sh.tail_event(first["pid"], first["tid"]))
    return out, rw


@dataclass(frozen=True)
class EventShift:
    """How one rank's timeline events become the full step's, for a writer working on columns (no event dicts;
    :mod:`cosim.output.timeline`) what :func:`_shift_events` does to dicts: an event with ``ts >= cut_us`` gets
    ``round(ts + extra, 3)`` (:func:`round3`); one with ``lo <= ts < cut_us`` is in the window, drawn ``copies``
    times (copy ``j``: ``round(ts + j * period_us, 3)``, ids plus ``j * id_step``); an ``X`` event before ``lo``
    ending after ``cut_us`` gets ``dur = round(dur + extra, 3)``; the others stay. When ``copies < repeats`` and the
    window holds events, :meth:`tail_event` follows the copies."""

    cut_us: float
    """The cut (us), less half a nanosecond (the unit starting at the cut belongs after it)."""
    lo: float
    """The window's start (us)."""
    extra: float
    """Time inserted at the cut (us)."""
    copies: int
    """Copies drawn."""
    repeats: int
    """Periods inserted."""
    period_us: float
    """The period (us)."""
    period_s: float
    """The period (s), as :class:`Periodic` has it."""
    id_step: int
    """Id offset between consecutive copies."""

    @classmethod
    def of(cls, cut_us: float, per: Periodic, id_step: int, copies: int | None = None) -> EventShift:
        """The shift of a rank cut at ``cut_us`` (us), for both writers (:func:`_shift_events` too)."""
        p_us = per.period_s * 1e6
        cut = cut_us - 5e-4  # timestamps are rounded to 1 ns: the unit starting at the cut belongs after it
        return cls(cut, cut - p_us, per.repeats * p_us, per.repeats if copies is None else min(copies, per.repeats),
                   per.repeats, p_us, per.period_s, id_step)

    def tail_event(self, pid: int, tid: int) -> dict[str, Any]:
        """The ``coalesced`` span of the periods not drawn, on ``pid``/``tid`` (the group's first ``X`` event's): both
        writers append it (:func:`_shift` too)."""
        left = self.repeats - self.copies
        return {"ph": "X", "cat": "coalesced", "pid": pid, "tid": tid,
                "name": f"{left} more periods of {self.period_s * 1e3:.3f} ms (coalesced; not drawn)",
                "ts": round(self.cut_us + self.copies * self.period_us, 3), "dur": round(left * self.period_us, 3),
                "args": {"periods": left, "period_us": round(self.period_us, 3), "drawn": self.copies}}


@dataclass
class PeriodicResult(ReplayResult):
    """A replayed probe standing for the full step: ``summary()`` gives the full step's figures and
    ``split_events`` its timeline (through :func:`cosim.output.write_result`) (``periodic`` says how); graph, runs and links are the probe's."""

    periodic: Periodic | None = None
    _drawn: int | None = field(default=None, repr=False)

    @classmethod
    def of(cls, probe: ReplayResult, per: Periodic) -> PeriodicResult:
        """Wrap the probe's result."""
        return cls(**{f.name: getattr(probe, f.name) for f in fields(ReplayResult) if f.name != "_summary"},
                   periodic=per)

    def summary(self) -> dict[str, Any]:
        """The full step's ``summary.json`` (with ``coalesced``)."""
        if self._summary is None:
            assert self.periodic is not None
            self._summary = extend_figures(self, self.periodic)
        return self._summary

    def drawn_repeats(self) -> int:
        """How many times the timeline draws the repeated period: every repeat while the full step stays within
        :data:`TIMELINE_MAX_GPU_OPS` GPU ops over the simulated ranks, else as many as fit (at least 0)."""
        per = self.periodic
        assert per is not None
        if self._drawn is None:
            probe = win = 0
            for run in self.runs:
                s = run.gpu_start
                ok = np.isfinite(s)
                probe += int(ok.sum())
                cut = per.cut.get(run.rank)
                if cut is not None:
                    win += int((ok & (s >= cut - per.period_s) & (s < cut)).sum())
            room = TIMELINE_MAX_GPU_OPS - probe
            self._drawn = per.repeats if probe + per.repeats * win <= TIMELINE_MAX_GPU_OPS else \
                max(0, min(per.repeats, room // max(win, 1)))
        return self._drawn

    def split_events(self, rank: int, evs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], RepeatedWindow | None]:
        """One rank's timeline events of the probe turned into the full step's: the probe's events with those
        after the repeated window moved, and the drawn copies of the window (None for a rank without a cut):
        the hook :func:`cosim.output.timeline.write_timeline` applies to every event group."""
        assert self.periodic is not None
        cut = self.periodic.cut.get(rank)
        if cut is None:
            return evs, None
        return _shift_events(evs, cut * 1e6, self.periodic, _ID_STEP, self.drawn_repeats())

    def event_shift(self, rank: int) -> EventShift | None:
        """:meth:`split_events` for a writer working on columns: how rank ``rank``'s events move (None for a rank
        without a cut)."""
        assert self.periodic is not None
        cut = self.periodic.cut.get(rank)
        if cut is None:
            return None
        return EventShift.of(cut * 1e6, self.periodic, _ID_STEP, self.drawn_repeats())
