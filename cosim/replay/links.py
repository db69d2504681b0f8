"""Per-link traffic of a replay: the counters behind ``summary.json["links"]``.

Every directed link of the topology (the engine's fabric links) gets bytes, busy
time (the union of the intervals it carried something), peak concurrent
transfers and average utilization. Three sources feed it:

* **simulated collectives** (``collectives=simulated``): the fabric's own flows,
  recorded as they run (per-link flow count and load between rate solves);
  bytes are the fabric's wire-byte counters;
* **measured collectives** (``collectives=measured``): the engine's own
  decomposition of the collective into flows, for the algorithm and protocol its
  tuner picks at that size, attributed analytically: a *scratch* simulator runs
  the collective's plan with the fabric's ``start_rows`` recording each phase's
  flows instead of solving rates, and each flow's wire bytes go on the links of
  its segments (bytes per link are linear in the size, so one pass per
  (op, GPUs, algorithm, protocol) serves every size; all-to-allv per byte
  matrix). No max-min solve: the bytes are what the fabric's counters would
  show (tested against a solved run). The bytes are spread evenly over the collective kernel's replayed
  interval, from the last participant's start to the end;
* **memcpys** (both modes): an H2D copy's bytes on the route CPU -> GPU, D2H on
  GPU -> CPU (the GPU's PCIe path to its CPU, split over equal-cost paths as the
  engine would), spread over the copy's replayed interval. A device-local D2D
  copy or a memset uses no link; a peer copy (PtoP) is not attributed because
  the execution graph does not record the peer device.

This is attribution only: nothing here feeds back into the replay. Memcpys keep
their measured (or modeled) durations and do not contend with other traffic on
the links; measured collectives keep their measured durations.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from cosim.errors import CosimInputError
from cosim.replay.collective_map import collective_spec, gpu_of_rank
from cosim.replay.config import ReplayConfig
from cosim.workload.graph import CollType, CopyKind, GpuKind

if TYPE_CHECKING:
    from cosim.replay.copies import CopyModel
    from cosim.replay.executor import Executor, RankRun

__all__ = ["EngineRoutes", "LinkUsage", "rank_static", "record_fabric", "replay_end", "replay_link_usage"]

COLLECTIVE, MEMCPY = 0, 1
"""Source tags of an interval."""

_UNIT = float(2**30)
"""Size of the scratch probes (bytes); per-byte loads are rounded to 12 decimals."""


def _column(x: Any, n: int) -> np.ndarray:
    """``x`` (a scalar or ``n`` values) as a fresh float array of length ``n``."""
    if isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (n,):
        return x.copy()
    if isinstance(x, (float, int)):
        return np.full(n, float(x))
    return np.broadcast_to(np.asarray(x, dtype=float), (n,)).copy()


def _piece(x: Any, n: int) -> np.ndarray:
    """``x`` (a scalar or ``n`` values) as ``n`` floats, ``x`` itself when it already is (not copied: for
    :func:`np.concatenate`)."""
    if isinstance(x, np.ndarray) and x.dtype == np.float64 and x.shape == (n,):
        return x
    if isinstance(x, (float, int)):
        return np.full(n, float(x))
    return np.broadcast_to(np.asarray(x, dtype=float), (n,))


_F8 = np.dtype(np.float64)
_I8 = np.dtype(np.int64)

_KEPT = 4096
"""Link arrays whose occurrence groups are kept (a coalesced collective's memo hands the same
array at every hit)."""

_Part = tuple[np.ndarray, list[np.ndarray], list[int], list[float], int, "float | None"]
"""A queued part: (links, its array columns, per column (start, end, count, bytes) its row there or -1 for the
scalar in the next list, those scalars, source, shift). The shift is None, or a coalesced hit's start: then the
columns are its memo's (start, end, count, bytes) relative to it (:meth:`LinkUsage.observed_shifted`)."""

_HitRec = tuple[np.ndarray, np.ndarray]
"""What a coalesced hit records while the classes it touches do not split: per interval to record, in order, its
class, and its memo's (relative start, relative end, count, bytes) as the rows of a (4, k) array."""

_NAN4 = [math.nan] * 4
_ROWS4 = [0, 1, 2, 3]


class _LinkClasses:
    """The links partitioned into classes of identical interval streams, refined as intervals are added.

    Two links are in one class while every part added so far either holds both with the same (start, end,
    count, bytes, source), bit for bit, in the same order, or neither: then every figure of the link report
    (busy time, peak, windowed bytes: the same terms in the same order) is the same for both, and the
    intervals are recorded once per class. A class that a part splits is frozen: its members move to new
    classes (one per distinct interval, one for the members the part does not hold) whose streams continue
    its own (``parent``). Per part of k intervals: O(k log k) numpy (a stable sort by class); a split adds
    O(links) (the relabelling)."""

    def __init__(self, n_links: int) -> None:
        self.cls = np.zeros(n_links, dtype=np.int64)
        """Current class per link."""
        self.size = np.array([n_links], dtype=np.int64)
        """Links per class (0 once frozen)."""
        self.parent = np.array([-1], dtype=np.int64)
        """The class each class split from (-1 for the first)."""
        self.n = 1
        """Class ids handed out so far (those of :attr:`size` and :attr:`parent` in use)."""
        self._pos = np.full(max(n_links, 1), -1, dtype=np.int64)  # scratch: a position per link
        self._subs: dict[int, tuple[np.ndarray, list[np.ndarray]]] = {}  # id(link array) -> (it, occurrence groups)

    def _grow(self, k: int) -> np.ndarray:
        """``k`` new class ids (their size and parent are the caller's to set)."""
        n = self.n + k
        if n > self.size.size:
            cap = max(n, 2 * self.size.size)
            self.size = np.concatenate([self.size, np.zeros(cap - self.size.size, dtype=np.int64)])
            self.parent = np.concatenate([self.parent, np.full(cap - self.parent.size, -1, dtype=np.int64)])
        ids = np.arange(self.n, n, dtype=np.int64)
        self.n = n
        return ids

    def occurrences(self, link: np.ndarray) -> list[np.ndarray] | None:
        """None when no link repeats in ``link``; else the positions of each link's first, second, ...
        occurrence (a link's intervals keep their order). Kept per array object for the last few (a coalesced
        collective's memo hands the same link array at every hit). :meth:`LinkUsage.add` asks only of arrays
        that are not increasing (an increasing one is distinct)."""
        hit = self._subs.get(id(link))
        if hit is not None and hit[0] is link:
            return hit[1]
        n = link.size
        ar = np.arange(n, dtype=np.int64)
        self._pos[link] = ar
        if bool((self._pos[link] == ar).all()):
            return None
        o = np.argsort(link, kind="stable")
        ls = link[o]
        head = np.r_[True, ls[1:] != ls[:-1]]
        first = np.maximum.accumulate(np.where(head, ar, 0))
        rank = ar - first
        by = np.argsort(rank, kind="stable")
        cuts = np.flatnonzero(np.diff(rank[by])) + 1
        subs = [o[g] for g in np.split(by, cuts)]
        if len(self._subs) >= _KEPT:
            del self._subs[next(iter(self._subs))]
        self._subs[id(link)] = (link, subs)
        return subs

    def refine(self, link: np.ndarray, vals: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """Refine by one part of distinct ``link`` whose intervals' array-valued columns are the rows of ``vals``
        (None when every column is one scalar), a part that does not meet whole, uniform classes
        (:meth:`LinkUsage._batch` records those): (the class of each interval to record, the positions of those
        intervals in the part)."""
        n = link.size
        cl = self.cls[link]
        bits = None if vals is None else vals.view(np.int64)
        arrs = [] if bits is None else list(bits)
        o = np.argsort(cl, kind="stable")
        cs = cl[o]
        head = np.flatnonzero(np.r_[True, cs[1:] != cs[:-1]])
        runlen = np.diff(np.r_[head, n])
        arrs = [a[o] for a in arrs]
        rc = cs[head]
        # groups of equal (class, values)
        g = np.lexsort((*arrs[::-1], cs)) if arrs else np.arange(n)
        key = [cs[g], *(a[g] for a in arrs)]
        gh = np.r_[True, np.logical_or.reduce([k[1:] != k[:-1] for k in key])]
        gstart = np.flatnonzero(gh)
        gcls = key[0][gstart]
        ng = np.bincount(np.searchsorted(rc, gcls), minlength=rc.size)  # groups per touched class
        split = (ng > 1) | (runlen != self.size[rc])
        gsplit = split[np.searchsorted(rc, gcls)]
        gid = gcls.copy()
        if gsplit.any():
            new = self._grow(int(gsplit.sum()))
            gid[gsplit] = new
            gsize = np.diff(np.r_[gstart, n])
            self.size[new] = gsize[gsplit]
            self.parent[new] = gcls[gsplit]
            sc = rc[split]
            rest = self.size[sc] - runlen[split]
            if (rest > 0).any():
                rid = self._grow(int((rest > 0).sum()))
                m = np.arange(self.n, dtype=np.int64)
                m[sc[rest > 0]] = rid
                self.size[rid] = rest[rest > 0]
                self.parent[rid] = sc[rest > 0]
                self.cls = m[self.cls]
            self.size[sc] = 0
            ent = np.repeat(gid, np.diff(np.r_[gstart, n]))  # the new class of each interval, in g's order
            pos = o[g]
            self.cls[link[pos]] = ent
        return gid, o[g[gstart]]


class LinkUsage:
    """Traffic intervals per directed link: (start, end, concurrent transfers, bytes, source).

    ``links`` and ``capacity`` are the fabric's (edge order, bytes/s). Bytes of an
    interval are spread evenly over it (for windowed figures). The intervals are recorded once per class of
    links with identical streams (:class:`_LinkClasses`: the NIC links of equivalent GPUs, the rails of a
    leaf); every figure is computed per class and read out per link."""

    def __init__(self, links: Sequence[tuple[str, str]], capacity: np.ndarray) -> None:
        self.links = list(links)
        self.link_id = {lk: i for i, lk in enumerate(self.links)}
        self.capacity = np.asarray(capacity, dtype=float)
        self.total_bytes = np.zeros(len(self.links))
        """Bytes per link (wire bytes of collectives + memcpy bytes)."""
        self.memcpy_bytes = np.zeros(len(self.links))
        self._classes = _LinkClasses(len(self.links))
        self._pend: list[_Part] = []
        self._pend_n = 0
        self._hits: dict[int, tuple[tuple[np.ndarray, ...], int, _HitRec | None]] = {}
        """id(memo's links) -> (the memo's columns, :attr:`_LinkClasses.n` it is of, its :data:`_HitRec` or None
        when a hit does not meet whole, uniform classes): :meth:`_hit_rec`."""
        self._scratch = np.empty(0, dtype=np.int64)  # :meth:`_batch`'s (part, class) -> interval table
        self._buf: list[np.ndarray] = [np.zeros(0, dtype=np.int64), *(np.zeros(0) for _ in range(4)), np.zeros(0, dtype=np.int8)]
        """(class, start, end, count, bytes, source) of the recorded intervals (the first :attr:`_m`), in order."""
        self._m = 0
        self._window_state: tuple[np.ndarray, tuple[bool, np.ndarray]] | None = None  # (data[0], state)
        self._compiled: tuple[np.ndarray, ...] | None = None  # per class: see :meth:`_cdata`
        self._fmap = np.zeros(len(self.links), dtype=np.int64)  # link -> row of :meth:`_cdata`'s classes
        self._prev: tuple[tuple[np.ndarray, ...], np.ndarray] | None = None  # (data it is of, :meth:`_prev_of`)
        self._busy_all: tuple[tuple[np.ndarray, ...], np.ndarray] | None = None  # (data it is of, unclipped busy)
        self._hull: tuple[tuple[np.ndarray, ...], float, float] | None = None  # (data, first start, last end)

    def add(self, link: np.ndarray, start: Any, end: Any, count: Any, nbytes: Any, source: int,
            count_bytes: bool = True) -> None:
        """Intervals on ``link[k]`` over [start[k], end[k]) with ``count[k]`` transfers moving ``nbytes[k]``.

        ``count_bytes=False`` records the interval only (its bytes are counted elsewhere). Recorded once per
        class of links whose streams are still identical (:class:`_LinkClasses`); callers hand over arrays they
        no longer change."""
        if not (isinstance(link, np.ndarray) and link.dtype == np.int64 and link.ndim == 1):
            link = np.asarray(link, dtype=np.int64).reshape(-1)  # (else the caller's array itself: see _KEPT)
        n = link.size
        if not n:
            return
        if count_bytes:
            nbytes = self._count(link, n, nbytes, source)
        arrs: list[np.ndarray] = []
        which: list[int] = []  # per column: its row in ``vals``, or -1 for a scalar
        scal: list[float] = []
        for x in (start, end, count, nbytes):
            t = type(x)
            if t is float or t is int:
                which.append(-1)
                scal.append(float(x))
                continue
            if t is np.ndarray and x.dtype == _F8 and x.shape == (n,):
                which.append(len(arrs))
                arrs.append(x)
            elif not isinstance(x, (float, int)) and np.ndim(x):
                which.append(len(arrs))
                arrs.append(_piece(x, n))
            else:
                which.append(-1)
                scal.append(float(x))
                continue
            scal.append(math.nan)
        self._pend.append((link, arrs, which, scal, source, None))  # its links' repeats are split off in :meth:`_flush`
        self._pend_n += n
        self._compiled = None
        if len(self._pend) >= self._BATCH_PARTS or self._pend_n >= self._BATCH_INTERVALS:
            self._flush()

    def observed(self, link: np.ndarray, start: Any, end: Any, count: Any, nbytes: Any) -> None:
        """:meth:`add` of the fabric's observer (collective intervals whose bytes the fabric counts), O(1) Python
        for its usual columns (what :meth:`add` keeps of them, checked the same way): int64 links, float64
        columns of their length, the end one such column or a float."""
        if not (type(link) is np.ndarray and type(start) is np.ndarray and type(count) is np.ndarray
                and type(nbytes) is np.ndarray and link.dtype == _I8 and start.dtype == _F8 and count.dtype == _F8
                and nbytes.dtype == _F8 and link.ndim == 1 and start.shape == count.shape == nbytes.shape == link.shape):
            self.add(link, start, end, count, nbytes, COLLECTIVE, count_bytes=False)
            return
        n = link.size
        if not n:
            return
        nan = math.nan
        if type(end) is float:
            self._pend.append((link, [start, count, nbytes], [0, -1, 1, 2], [nan, end, nan, nan], COLLECTIVE, None))
        elif type(end) is np.ndarray and end.dtype == _F8 and end.shape == link.shape:
            self._pend.append((link, [start, end, count, nbytes], [0, 1, 2, 3], [nan, nan, nan, nan], COLLECTIVE, None))
        else:
            self.add(link, start, end, count, nbytes, COLLECTIVE, count_bytes=False)
            return
        self._pend_n += n
        self._compiled = None
        if len(self._pend) >= self._BATCH_PARTS or self._pend_n >= self._BATCH_INTERVALS:
            self._flush()

    def observed_shifted(self, link: np.ndarray, t0: float, start: np.ndarray, end: np.ndarray, count: np.ndarray,
                         nbytes: np.ndarray) -> None:
        """:meth:`observed` of ``(link, t0 + start, t0 + end, count, nbytes)``: a coalesced collective's hit at
        ``t0`` handing its memo's intervals (times relative to its start; the same arrays at every hit). Queued
        as they are, O(1); the flush records the hit from its memo's class pattern (:meth:`_hit_rec`) without
        shifting every interval. Other columns than int64 links and float64 columns of their length: shifted
        here, then :meth:`observed`."""
        if not (type(link) is np.ndarray and type(start) is np.ndarray and type(end) is np.ndarray
                and type(count) is np.ndarray and type(nbytes) is np.ndarray and type(t0) is float
                and link.dtype == _I8 and start.dtype == end.dtype == count.dtype == nbytes.dtype == _F8
                and link.ndim == 1 and start.shape == end.shape == count.shape == nbytes.shape == link.shape):
            self.observed(link, t0 + start, t0 + end, count, nbytes)
            return
        n = link.size
        if not n:
            return
        self._pend.append((link, [start, end, count, nbytes], _ROWS4, _NAN4, COLLECTIVE, t0))
        self._pend_n += n
        self._compiled = None
        if len(self._pend) >= self._BATCH_PARTS or self._pend_n >= self._BATCH_INTERVALS:
            self._flush()

    @staticmethod
    def _unshift(p: _Part) -> _Part:
        """A queued part with its times absolute (a coalesced hit's shifted by its start)."""
        if p[5] is None:
            return p
        t0 = p[5]
        a, b, c, nb = p[1]
        return (p[0], [t0 + a, t0 + b, c, nb], _ROWS4, _NAN4, COLLECTIVE, None)

    def _count(self, link: np.ndarray, n: int, nbytes: Any, source: int) -> np.ndarray:
        """Add the ``n`` intervals' bytes to the links' counters (one addition per interval, in order); returns
        the bytes as a column."""
        b = _column(nbytes, n)
        if n < 2 or bool((link[1:] > link[:-1]).all()):  # one addition per link: np.add.at's sums, without its loop
            self.total_bytes[link] += b
            if source == MEMCPY:
                self.memcpy_bytes[link] += b
        else:
            np.add.at(self.total_bytes, link, b)
            if source == MEMCPY:
                np.add.at(self.memcpy_bytes, link, b)
        return b

    def _split_repeats(self, pend: list[_Part]) -> list[_Part]:
        """``pend`` with each part whose links repeat replaced by its links' first occurrences, then their second
        ones, ... (parts of distinct links, in order); coalesced hits are left whole (:meth:`_batch` records them
        from their memo's pattern; :meth:`_expand` splits one that cannot be). Which parts are increasing
        (distinct; the fabric's observer hands those) is one numpy pass over the other parts' links together."""
        idx = [k for k, p in enumerate(pend) if p[5] is None]
        if not idx:
            return pend
        ns = np.fromiter((pend[k][0].size for k in idx), dtype=np.int64, count=len(idx))
        L = np.concatenate([pend[k][0] for k in idx])
        down = np.r_[False, L[1:] <= L[:-1]]
        down[np.cumsum(ns[:-1])] = False  # a part's first link follows nothing of its own
        rep = [idx[k] for k in np.flatnonzero(np.logical_or.reduceat(down, np.r_[0, np.cumsum(ns[:-1])])).tolist()]
        if not rep:
            return pend
        out: list[_Part] = []
        i = 0
        for k in rep:
            out.extend(pend[i:k])
            out.extend(self._expand(pend[k]))
            i = k + 1
        out.extend(pend[i:])
        return out

    def _expand(self, p: _Part) -> list[_Part]:
        """Part ``p`` (times absolute) as parts of distinct links: its links' first occurrences, then their second
        ones, ... (itself when its links are distinct)."""
        link, arrs, which, scal, source, _ = p = self._unshift(p)
        subs = self._classes.occurrences(link)
        if subs is None:
            return [p]
        return [(link[sel], [a[sel] for a in arrs], which, scal, source, None) for sel in subs]

    _SMALL_REST = 4096
    """After a split, the parts left are batched all together when they hold at most this many intervals."""
    _BATCH_PARTS = 256
    _BATCH_INTERVALS = 1 << 18
    """Parts of distinct links refined together (:meth:`_flush`): at most this many, or this many intervals."""

    @property
    def classes(self) -> _LinkClasses:
        """The links' classes, with every part added so far refined in."""
        self._flush()
        return self._classes

    def _flush(self) -> None:
        """Refine by the waiting parts of distinct links, in order, as :meth:`_LinkClasses.refine` of each would:
        while no class splits, a part's touched classes are whole and its intervals equal their representatives'
        for every part of the batch at once (O(intervals) numpy over the batch; a coalesced hit O(classes it
        touches), :meth:`_hit_rec`); from the first part that fails, that part alone (it splits a class; a
        coalesced hit split into parts of distinct links first), then the rest again."""
        pend, self._pend, self._pend_n = self._pend, [], 0
        if not pend:
            return
        pend = self._split_repeats(pend)
        i = 0
        size = len(pend)  # after a split, batches of 1, 2, 4, ... parts (splits come in runs) ...
        left = self._left(pend)
        C = self._classes
        while i < len(pend):
            if C.n == 1 and pend[i][0].size < C.cls.size:  # one class, not every link: the part splits it
                f, failed = 0, True
            else:
                batch = pend[i : i + size]
                f = self._batch(batch)
                failed = f < len(batch)
            i += f
            size = min(2 * size, len(pend))
            if failed:
                if pend[i][5] is not None:  # a hit that does not meet whole, uniform classes: its parts, again
                    pend[i : i + 1] = self._expand(pend[i])
                    left, size = self._left(pend), 1
                    continue
                # ... unless the rest is small: then all of it again (a batch's fixed cost exceeds its O(intervals))
                size = len(pend) if i + 1 < len(pend) and left[i + 1] <= self._SMALL_REST else 1
                link, arrs, which, scal, source, _ = pend[i]
                vals = np.vstack(arrs) if arrs else None
                cid, pos = self._classes.refine(link, vals)
                self._record(cid, pos, vals, which, scal, source)
                i += 1

    @staticmethod
    def _left(pend: list[_Part]) -> list[int]:
        """Intervals from each part of ``pend`` on."""
        return np.cumsum([p[0].size for p in pend][::-1])[::-1].tolist()

    def _batch(self, parts: list[_Part]) -> int:
        """Record the longest prefix of ``parts`` (distinct links each, or coalesced hits) that meets whole, uniform
        classes: one interval per touched class and part, in order. Returns the prefix's length. A hit is
        recorded from its memo's :meth:`_hit_rec` (O(classes it touches)); the other parts are checked together
        (:meth:`_check`)."""
        m = len(parts)
        g = m  # the first hit that fails
        hits: list[tuple[int, float, _HitRec]] = []
        for i, p in enumerate(parts):
            if p[5] is not None:
                r = self._hit_rec(p)
                if r is None:
                    g = i
                    break
                hits.append((i, p[5], r))
        if not hits:
            f, rec = self._check(parts[:g])
            if rec is not None:
                self._record(rec[0], np.arange(rec[0].size), rec[1], _ROWS4, _NAN4, rec[2])
            return f
        plain = [i for i in range(g) if parts[i][5] is None]
        f, rec = self._check([parts[i] for i in plain])
        f = plain[f] if f < len(plain) else g
        hits = [h for h in hits if h[0] < f]
        if not hits:
            if rec is not None:
                keep = np.asarray(plain, dtype=np.int64)[rec[3]] < f
                self._record(rec[0][keep], np.arange(int(keep.sum())), rec[1][:, keep], _ROWS4, _NAN4, rec[2][keep])
            return f
        ks = [h[2][0].size for h in hits]
        cid = np.concatenate([h[2][0] for h in hits])
        v = np.concatenate([h[2][1] for h in hits], axis=1)
        t = np.repeat(np.asarray([h[1] for h in hits]), ks)
        v[0] = t + v[0]  # each hit's start plus its memo's relative times: (t0 + a)[k] bit for bit
        v[1] = t + v[1]
        src = np.full(cid.size, COLLECTIVE, dtype=np.int8)
        if rec is not None:
            pid = np.asarray(plain, dtype=np.int64)[rec[3]]
            keep = pid < f
            at = np.concatenate([pid[keep], np.repeat(np.asarray([h[0] for h in hits], dtype=np.int64), ks)])
            o = np.argsort(at, kind="stable")  # in part order, a part's intervals in their order
            cid = np.concatenate([rec[0][keep], cid])[o]
            v = np.concatenate([rec[1][:, keep], v], axis=1)[:, o]
            src = np.concatenate([rec[2][keep], src])[o]
        self._record(cid, np.arange(cid.size), v, _ROWS4, _NAN4, src)
        return f

    def _hit_rec(self, p: _Part) -> _HitRec | None:
        """What coalesced hit ``p`` records under the current classes, None when it does not meet whole, uniform
        classes. Its memo's relative intervals equal on two links stay equal once shifted by the hit's start, so
        the check on the relative ones (:meth:`_check` of its parts of distinct links) holds for every hit until
        a class it touches splits (a class only ever splits: one that has not keeps its members): kept per memo,
        O(its intervals) once, then O(1) while no class splits and O(classes it touches) after a split elsewhere.
        A memo that fails is checked again after the next split, and its hit is refined shifted, as any part (a
        shift can make unequal values equal)."""
        C = self._classes
        link, cols = p[0], p[1]
        got = self._hits.get(id(link))
        if got is not None and got[0][0] is link and all(x is y for x, y in zip(got[0][1:], cols)):
            r = got[2]
            if got[1] == C.n:
                return r
            if r is not None and bool(C.size[r[0]].all()):  # no class it touches was split (frozen: size 0)
                self._hits[id(link)] = (got[0], C.n, r)
                return r
        subs = C.occurrences(link)
        sels = [np.arange(link.size, dtype=np.int64)] if subs is None else subs
        parts: list[_Part] = [(link[s], [x[s] for x in cols], _ROWS4, _NAN4, COLLECTIVE, None) for s in sels]
        f, rec = self._check(parts)
        out: _HitRec | None = None
        if f == len(parts) and rec is not None:
            at = np.concatenate(sels)[rec[4]]
            out = (rec[0], np.vstack([x[at] for x in cols]))
        if len(self._hits) >= _KEPT and id(link) not in self._hits:
            del self._hits[next(iter(self._hits))]
        self._hits[id(link)] = ((link, *cols), C.n, out)
        return out

    def _check(self, parts: list[_Part]) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                             np.ndarray] | None]:
        """The longest prefix of ``parts`` (distinct links each, times absolute) that meets whole, uniform
        classes, and what it records (None when nothing): per interval to record, in order, its class, its
        (start, end, count, bytes) as rows, its source, its part and its position in the parts' concatenation."""
        C = self._classes
        m = len(parts)
        if not m:
            return 0, None
        ns = np.fromiter((p[0].size for p in parts), dtype=np.int64, count=m)
        link = np.concatenate([p[0] for p in parts])
        E = link.size
        cols = []
        same = []  # columns scalar in every part: equal within a part, nothing to compare
        for j in range(4):
            ws = [p[2][j] for p in parts]
            same.append(max(ws) < 0)
            if same[-1]:
                cols.append(np.repeat(np.asarray([p[3][j] for p in parts]), ns))
            elif min(ws) >= 0:
                cols.append(np.concatenate([p[1][w] for p, w in zip(parts, ws)]))
            else:
                cols.append(np.concatenate([p[1][w] if w >= 0 else np.full(n, p[3][j])
                                            for p, w, n in zip(parts, ws, ns.tolist())]))
        pid = np.repeat(np.arange(m, dtype=np.int64), ns)
        cl = C.cls[link]
        key = pid * C.n + cl
        if self._scratch.size < m * C.n:  # kept between calls: only the entries written below are read
            self._scratch = np.empty(max(m * C.n, 2 * self._scratch.size), dtype=np.int64)
        scratch = self._scratch
        ar = np.arange(E, dtype=np.int64)
        scratch[key] = ar
        rep = scratch[key]
        head = np.flatnonzero(rep == ar)
        whole = np.bincount(pid[head], weights=C.size[cl[head]], minlength=m) == ns
        bad = np.zeros(E, dtype=bool)
        for c, s in zip(cols, same):
            if not s:
                b = c.view(np.int64)
                bad |= b.take(rep) != b
        ok = whole & (np.bincount(pid, weights=bad, minlength=m) == 0)
        f = int(np.argmin(ok)) if not ok.all() else m
        h = head[pid[head] < f]
        if not h.size:
            return f, None
        src = np.fromiter((p[4] for p in parts), dtype=np.int8, count=m)[pid[h]]
        return f, (cl[h], np.vstack([c[h] for c in cols]), src, pid[h], h)

    def _record(self, cid: np.ndarray, pos: np.ndarray, v: np.ndarray | None, which: list[int], scal: list[float],
                source: int | np.ndarray) -> None:
        """Append intervals of classes ``cid``: rows ``pos`` of the part's array columns ``v`` (``which``: each
        column's row, -1 for the scalar in ``scal``)."""
        k = cid.size
        m = self._m
        if m + k > self._buf[0].size:
            cap = max(m + k, 2 * self._buf[0].size)
            self._buf = [np.concatenate([b, np.zeros(cap - b.size, dtype=b.dtype)]) for b in self._buf]
        self._buf[0][m : m + k] = cid
        vp = None if v is None else v.take(pos, axis=1)
        for i, w in enumerate(which):
            self._buf[i + 1][m : m + k] = scal[i] if w < 0 or vp is None else vp[w]
        self._buf[5][m : m + k] = source
        self._m = m + k
        self._compiled = None

    def _columns(self) -> list[np.ndarray]:
        """Every recorded interval as (class, start, end, count, bytes, source) columns, in the order recorded."""
        return [b[: self._m] for b in self._buf]

    def _cdata(self) -> tuple[np.ndarray, ...]:
        """Per class of identical links (rows: ``self._fmap[link]``): (class row, start, end, count, bytes,
        source, offsets) sorted by class row then start, ties in the order added: each class's stream is its
        ancestors' intervals then its own (:class:`_LinkClasses`), so a row's intervals are, in order, those of
        every link of the class."""
        if self._compiled is None and self._classes.n == 1 and self._m == 0 and 0 < self._pend_n <= self._DIRECT:
            self._compiled = self._per_link()
            self._window_state = None
        if self._compiled is None:
            C = self.classes
            cid, *vals = self._columns()
            final, fmap = np.unique(C.cls, return_inverse=True)
            self._fmap = fmap.astype(np.int64).reshape(-1)
            by = np.argsort(cid, kind="stable")
            coff = np.zeros(C.n + 1, dtype=np.int64)
            np.cumsum(np.bincount(cid, minlength=C.n), out=coff[1:])
            par = C.parent[: C.n].tolist()
            coffl = coff.tolist()
            pieces: list[np.ndarray] = []
            rows: list[int] = []
            for f, c in enumerate(final.tolist()):
                chain = []
                while c >= 0:
                    if coffl[c + 1] > coffl[c]:
                        chain.append(by[coffl[c] : coffl[c + 1]])
                    c = par[c]
                for p in chain[::-1]:
                    pieces.append(p)
                    rows.append(f)
            nf = final.size
            if pieces:
                idx = np.concatenate(pieces)
                row = np.repeat(np.asarray(rows, dtype=np.int64), [p.size for p in pieces])
            else:
                idx, row = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
            cols = [row, *(v[idx] for v in vals)]
            # the row key as 16-bit ints where the rows allow: numpy sorts those by radix (the same stable
            # permutation as the int64 key's merge sort)
            key = row.astype(np.uint16) if nf <= 1 << 16 else row
            o = np.lexsort((cols[1], key))
            if o.size and not (o[1:] > o[:-1]).all():
                cols = [c[o] for c in cols]
            cnt = np.bincount(cols[0], minlength=nf)
            off = np.zeros(nf + 1, dtype=np.int64)
            np.cumsum(cnt, out=off[1:])
            self._compiled = (*cols, off)
            self._window_state = None
        return self._compiled

    _DIRECT = 1 << 12
    """At most this many intervals added, none refined yet (every part still queued): :meth:`_cdata` lays them out
    one row per link (:meth:`_per_link`) instead of refining the classes first, whose fixed cost (~1 ms: a sort
    per part, the repeats' split, the batches) exceeds the O(intervals) of so few."""

    def _per_link(self) -> tuple[np.ndarray, ...]:
        """:meth:`_cdata` of the queued parts with one row per link (rows: the links themselves): each link's
        intervals in the order added, then sorted by start (ties in that order), the stream its class would
        record, so every figure is the same bit for bit. The queue is left as it is (:attr:`classes` refines
        it when asked)."""
        pend = [self._unshift(p) for p in self._pend]
        ns = np.fromiter((p[0].size for p in pend), dtype=np.int64, count=len(pend))
        link = np.concatenate([p[0] for p in pend])
        cols = [np.concatenate([p[1][p[2][j]] if p[2][j] >= 0 else np.full(n, p[3][j])
                                for p, n in zip(pend, ns.tolist())]) for j in range(4)]
        src = np.repeat(np.fromiter((p[4] for p in pend), dtype=np.int8, count=len(pend)), ns)
        o = np.lexsort((cols[0], link))
        out = [link[o], *(c[o] for c in cols), src[o]]
        nl = len(self.links)
        off = np.zeros(nl + 1, dtype=np.int64)
        np.cumsum(np.bincount(link, minlength=nl), out=off[1:])
        self._fmap = np.arange(nl, dtype=np.int64)
        return (*out, off)

    def used(self) -> np.ndarray:
        """Indices of links that carried bytes."""
        return np.flatnonzero(self.total_bytes > 0)

    _CHUNK = 1 << 21
    """Intervals handled at once by :meth:`busy` and :meth:`peak` (whole links per chunk): bounds their
    temporaries (~a dozen arrays of this length) whatever the run's size."""

    def _chunks(self, off: np.ndarray) -> list[tuple[int, int]]:
        """Interval ranges ``[i, j)`` cut at link boundaries, each about :attr:`_CHUNK` long (one link longer
        than that is a chunk of its own)."""
        n = int(off[-1])
        out = []
        i = 0
        while i < n:
            k = int(np.searchsorted(off, i + self._CHUNK, side="right")) - 1
            j = int(off[k]) if int(off[k]) > i else int(off[np.searchsorted(off, i, side="right")])
            out.append((i, j))
            i = j
        return out

    def busy(self, a: float = -math.inf, b: float = math.inf) -> np.ndarray:
        """Seconds per link within [a, b] with at least one transfer (union of intervals).

        Vectorized over all links at once: intervals are sorted by link then start, so the union's length is
        the sum of ``max(0, e_i - max(s_i, M_{i-1}))`` with ``M`` the running maximum of the ends within the
        link (:meth:`_prev_of`, computed once). O(intervals of the classes) per window after :meth:`_cdata`'s
        sort, in chunks of whole classes; a link's figure is its class's (the same terms in the same order)."""
        data = self._cdata()
        lk_all, s_all, e_all, *_rest, off = data
        nf = len(off) - 1
        whole = self._covers(a, b)  # no clipping: clip to a window holding every interval is the identity
        if whole and self._busy_all is not None and self._busy_all[0] is data:
            return self._busy_all[1][self._fmap]
        prev_all = self._prev_of(data)
        out = np.zeros(nf)
        if not whole and self._windows()[0]:
            # only intervals crossing the window add a non-zero term (the others' is max(<= 0, 0) = 0.0): the same
            # terms in the same order, so the same sums bit for bit (x + 0.0 == x)
            k = np.flatnonzero((s_all < b) & (e_all > a))
            ss, ee, pm = np.clip(s_all[k], a, b), np.clip(e_all[k], a, b), np.clip(prev_all[k], a, b)
            out += np.bincount(lk_all[k], weights=np.maximum(ee - np.maximum(ss, pm), 0.0), minlength=nf)
            return out[self._fmap]
        for i, j in self._chunks(off):
            lk, s, e, prev = lk_all[i:j], s_all[i:j], e_all[i:j], prev_all[i:j]
            ss, ee, pm = (s, e, prev) if whole else (np.clip(s, a, b), np.clip(e, a, b), np.clip(prev, a, b))
            out += np.bincount(lk, weights=np.maximum(ee - np.maximum(ss, pm), 0.0), minlength=nf)
        if whole:
            self._busy_all = (data, out)
        return out[self._fmap]

    def _windows(self) -> tuple[bool, np.ndarray]:
        """(whether every start and end is finite, the intervals that are empty or reversed or whose bytes are not
        finite), once per :meth:`_cdata`: the windowed figures (:meth:`busy`, :meth:`bytes_in`) then look only at
        the intervals that cross the window, plus these."""
        data = self._cdata()
        if self._window_state is None or self._window_state[0] is not data[0]:
            _lk, s, e, _c, nb, *_ = data
            finite = bool(np.isfinite(s).all() and np.isfinite(e).all())
            with np.errstate(invalid="ignore"):
                sp = np.flatnonzero(~(e - s > 0) | ~np.isfinite(nb))
            self._window_state = (data[0], (finite, sp))
        return self._window_state[1]

    def _covers(self, a: float, b: float) -> bool:
        """Whether [a, b] holds every interval (then clipping to it changes nothing: ``max(s, a) = s`` for every
        start, and a link's first interval's ``max(s, clip(-inf)) = max(s, a) = s``), from the extreme start and end
        (computed once per :meth:`_cdata`)."""
        if a == -math.inf and b == math.inf:
            return True
        data = self._cdata()
        if self._hull is None or self._hull[0] is not data:
            s, e = data[1], data[2]
            self._hull = (data, float(s.min()) if s.size else math.inf, float(e.max()) if e.size else -math.inf)
        return a <= self._hull[1] and b >= self._hull[2]

    def _prev_of(self, data: tuple[np.ndarray, ...]) -> np.ndarray:
        """Per interval of :meth:`_cdata`'s ``data``, the latest end of the intervals before it in its class (-inf for
        a class's first): a running maximum per class (:meth:`_running_max`), kept until intervals are added.
        Clipping to a window is monotone, so the window's running maximum is this one clipped (:meth:`busy`)."""
        if self._prev is not None and self._prev[0] is data:
            return self._prev[1]
        out = self._running_max(data)
        self._prev = (data, out)
        return out

    @staticmethod
    def _running_max(data: tuple[np.ndarray, ...]) -> np.ndarray:
        """Per interval of ``data`` (sorted by link or class then start), the latest end before it in its
        link or class (-inf for the first)."""
        _lk, _s, e_all, *_rest, off = data
        out = np.full(len(e_all), -math.inf)
        offl = off.tolist()
        for k in np.flatnonzero(np.diff(off) > 1).tolist():
            i, j = offl[k], offl[k + 1]
            np.maximum.accumulate(e_all[i : j - 1], out=out[i + 1 : j])
        return out

    def bytes_in(self, a: float, b: float) -> np.ndarray:
        """Bytes per link moved within [a, b] (each interval's bytes spread evenly over it): O(intervals), the
        fraction computed only for intervals that cross an end of the window (the rest count 0 or all their bytes)."""
        lk, s, e, _c, nb, *_, off = self._cdata()
        nf = len(off) - 1
        if self._covers(a, b) and self._hull is not None and math.isfinite(self._hull[1]) \
                and math.isfinite(self._hull[2]):  # every fraction is 1: (e - s) / (e - s), or an empty interval in [a, b]
            return np.bincount(lk, weights=nb, minlength=nf)[self._fmap]
        finite, special = self._windows()
        if finite:
            # only intervals that cross the window, are empty or have non-finite bytes can weigh other than 0.0 (an
            # interval wholly outside it, of positive length, weighs 0.0): the same weights of those, in the same
            # order, so the same sums bit for bit
            m = (s < b) & (e > a)
            m[special] = True
            sel = np.flatnonzero(m)
            del m
            lk, s, e, nb = lk[sel], s[sel], e[sel], nb[sel]
        d = e - s
        pos = d > 0
        inside = pos & (s >= a) & (e <= b)  # fraction (e - s) / d = 1 exactly: the interval's bytes
        w = np.where(inside, nb, 0.0)
        # the fraction of the rest where it may be other than 0 (or nb is not finite: nb * 0 is not 0)
        k = np.flatnonzero(~inside & (~pos | ((e > a) & (s < b)) | ~np.isfinite(nb)))
        sk, ek, dk = s[k], e[k], d[k]
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(dk > 0, (np.minimum(ek, b) - np.maximum(sk, a)) / dk, ((sk >= a) & (sk <= b)).astype(float))
            w[k] = nb[k] * np.clip(np.nan_to_num(frac), 0.0, 1.0)  # a non-finite nb times 0 stays nan, as summed
        return np.bincount(lk, weights=w, minlength=nf)[self._fmap]

    def peak(self) -> np.ndarray:
        """Most concurrent transfers per link (flows of a collective counted with multiplicity): per link, the
        maximum over its intervals' starts of (counts started at or before that start) - (counts ended at or
        before it) (ends before starts at one instant: back-to-back is not concurrent; empty intervals count 0).

        The intervals are sorted by link then start (:meth:`_data`), so only each link's ends are sorted (a
        stable sort of a nearly sorted segment) and the starts are looked up in them: O(n log n) per link of n
        intervals, one Python iteration per link that carried intervals. Counts are integers held in floats
        (exact sums below 2**53)."""
        row_all, s_all, e_all, c_all, *_rest, off = self._cdata()
        out = np.zeros(len(off) - 1, dtype=np.int64)
        if c_all.size and bool(np.isfinite(c_all).all()) and bool((c_all == np.round(c_all)).all()) \
                and float(np.abs(c_all).sum()) < 2.0**53:
            for i, j in self._chunks(off):
                self._peak_rows(row_all[i:j], s_all[i:j], e_all[i:j], c_all[i:j], out)
            return out[self._fmap]
        offl = off.tolist()
        for k in np.flatnonzero(np.diff(off)).tolist():
            i, j = offl[k], offl[k + 1]
            s, e = s_all[i:j], e_all[i:j]
            w = np.where(e > s, c_all[i:j], 0.0)
            o = np.argsort(e, kind="stable")
            ended = np.cumsum(w[o])
            idx = np.searchsorted(e[o], s, side="right")  # ends at or before each start
            val = np.cumsum(w) - np.where(idx > 0, ended[idx - 1], 0.0)
            out[k] = round(float(val.max()))
        return out[self._fmap]

    @staticmethod
    def _peak_rows(row: np.ndarray, s: np.ndarray, e: np.ndarray, c: np.ndarray, out: np.ndarray) -> None:
        """:meth:`peak` of the whole classes ``row`` (sorted by class row then start), integer counts: every
        class at once. A class's running sums are the whole range's minus the classes' before it, and the
        counts ended at or before each start come from one sort of the starts and ends together (by row, time,
        ends before starts): integers below 2**53 in floats, so every difference is exact and each class's
        maximum is the per-class loop's."""
        n = row.size
        w = np.where(e > s, c, 0.0)
        tot = np.bincount(row, weights=w, minlength=out.size)
        base = np.cumsum(tot) - tot  # the weight of the classes before each
        kind = np.r_[np.zeros(n, dtype=np.int8), np.ones(n, dtype=np.int8)]  # ends, then starts
        order = np.lexsort((kind, np.r_[e, s], np.r_[row, row]))
        ended = np.cumsum(np.r_[w, np.zeros(n)][order])
        at = np.empty(2 * n, dtype=np.int64)
        at[order] = np.arange(2 * n, dtype=np.int64)
        base_of = base[row]
        val = (np.cumsum(w) - base_of) - (ended[at[n:]] - base_of)
        heads = np.flatnonzero(np.r_[True, row[1:] != row[:-1]])
        out[row[heads]] = np.rint(np.maximum.reduceat(val, heads)).astype(np.int64)

    def report(self, elapsed: float) -> list[dict[str, Any]]:
        """``summary.json["links"]``: every link that carried bytes, in edge order."""
        idx = self.used()
        if not idx.size:
            return []
        busy, peak = self.busy(), self.peak()
        out = []
        for i in idx.tolist():
            cap = float(self.capacity[i])
            nb = float(self.total_bytes[i])
            out.append({"src": self.links[i][0], "dst": self.links[i][1], "capacity_Bps": cap, "bytes": nb,
                        "memcpy_bytes": float(self.memcpy_bytes[i]), "busy_time_s": float(busy[i]),
                        "peak_flows": int(peak[i]),
                        "utilization": nb / (cap * elapsed) if elapsed > 0 and cap > 0 else 0.0})
        return out


class _Observer:
    """The fabric's observer of :func:`record_fabric`: ``observer(links, starts, end, flows, bytes)`` is
    :meth:`LinkUsage.observed`; ``observer.shifted(links, t0, starts, ends, flows, bytes)``, which the engine's
    coalesced collectives call when the observer has it, the same intervals shifted by ``t0``
    (:meth:`LinkUsage.observed_shifted`)."""

    __slots__ = ("_observed", "shifted")

    def __init__(self, usage: LinkUsage) -> None:
        self._observed = usage.observed
        self.shifted = usage.observed_shifted

    def __call__(self, link: np.ndarray, start: Any, end: Any, count: Any, nbytes: Any) -> None:
        self._observed(link, start, end, count, nbytes)


def record_fabric(fabric: Any, usage: LinkUsage) -> Callable[[], None]:
    """Record the fabric's per-link flow count and load between rate changes (and the intervals of
    coalesced collectives) into ``usage`` through the fabric's ``observer`` hook: one interval per
    link that carries flows between two solves, O(links in use) per solve; the solve itself is
    unchanged. Returns ``finish()``, which closes the last interval and adds the fabric's wire-byte
    counters."""

    fabric.observer = _Observer(usage)

    def finish() -> None:
        fabric._advance()
        fabric.close_observer()
        fabric.observer = None
        usage.total_bytes += fabric.bytes_moved

    return finish


class EngineRoutes:
    """Per-link loads of transfers and collectives as the engine's fabric would place them,
    from a scratch simulator (its own simpy environment).

    ``solve=False`` (default): analytic, each flow's wire bytes on its segments' links, no
    rate solve; ``solve=True``: the flows run on the scratch fabric and its counters are read
    (the reference the analytic attribution is tested against)."""

    def __init__(self, topology: Any, config: Any = None, *, solve: bool = False) -> None:
        import dataclasses

        from cosim.engine import SimConfig, Simulator

        cfg = config or SimConfig(record_trace=False)  # no coalescing: every batch of flows must reach start_rows
        self.sim = Simulator(topology, dataclasses.replace(cfg, fabric=dataclasses.replace(cfg.fabric, coalesce=False)))
        self.solve = solve
        self._cache: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}

    @property
    def fabric(self) -> Any:
        return self.sim.fabric

    def _probe(self, start: Callable[[], Any], size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(link indices, wire bytes per byte of ``size``, peak flows) of what ``start()`` puts on the fabric."""
        if not self.solve:
            return self._attribute(start, size)
        fab = self.sim.fabric
        before = fab.bytes_moved.copy()
        fab.reset_peak_flows()
        start()
        self.sim.run()
        d = fab.bytes_moved - before
        idx = np.flatnonzero(d > 0)
        return idx, np.round(d[idx] / size, 12), fab.peak_flows[idx].astype(float)

    def _attribute(self, start: Callable[[], Any], size: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`_probe` without a rate solve: the fabric's ``start_rows`` records each batch of flows
        (segments, wire bytes, multiplicity) and returns at once, one simulated second later so that
        batches started together count as concurrent and successive phases do not."""
        fab, env = self.sim.fabric, self.sim.env
        calls: list[tuple[float, np.ndarray, np.ndarray, np.ndarray]] = []

        def record(segs: Any, nbytes: Any, *, efficiency: float = 1.0, multiplicity: Any = None,
                   **_kw: Any) -> Any:
            sg = np.asarray(segs, dtype=np.int64).reshape(-1, 3)
            nb = np.asarray(nbytes, dtype=float).reshape(-1)
            m = np.ones(len(nb)) if multiplicity is None else np.asarray(multiplicity, dtype=float).reshape(-1)
            calls.append((env.now, sg, nb / efficiency * m, m))
            return env.timeout(1.0)

        fab.start_rows = record  # type: ignore[method-assign]
        try:
            start()
            self.sim.run()
        finally:
            del fab.start_rows
        fab._flush_segments()
        nl = len(fab.links)
        moved = np.zeros(nl)
        flows: dict[float, np.ndarray] = {}
        for t, sg, wire, m in calls:
            moved += fab._to_links(sg.reshape(-1), np.repeat(wire, 3))
            f = fab._to_links(sg.reshape(-1), np.repeat(m, 3), weighted=False)
            flows[t] = flows[t] + f if t in flows else f
        peak = np.max(np.stack(list(flows.values())), axis=0) if flows else np.zeros(nl)
        idx = np.flatnonzero(moved > 0)
        return idx, np.round(moved[idx] / size, 12), np.rint(peak[idx])

    def transfer(self, src: str, dst: str) -> tuple[np.ndarray, np.ndarray]:
        """(link indices, bytes per byte) of a copy from ``src`` to ``dst``."""
        key = ("transfer", src, dst)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._probe(lambda: self.sim.transfer(src, dst, _UNIT), _UNIT)
            self._cache[key] = hit
        return hit[0], hit[1]

    def collective(self, op: str, gpus: Sequence[str], nbytes: float,
                   matrix: Sequence[Sequence[float]] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(link indices, wire bytes, flows per link) of one collective as the engine decomposes it."""
        gpus = list(gpus)
        if matrix is not None:
            key: tuple[Any, ...] = (op, tuple(gpus), tuple(tuple(float(x) for x in row) for row in matrix))
            hit = self._cache.get(key)
            if hit is None:
                hit = self._probe(lambda: self.sim.collective(op, gpus, matrix=matrix, name=op), 1.0)
                self._cache[key] = hit
            return hit
        cfg = self.sim.config.nccl
        a, p = self.sim.collectives.choose(op, gpus, nbytes, cfg.algo, cfg.proto)
        key = (op, tuple(gpus), a, p)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._probe(lambda: self.sim.collective(op, gpus, _UNIT, algo=a, proto=p, name=op), _UNIT)
            self._cache[key] = hit
        return hit[0], hit[1] * nbytes, hit[2]


_ROUTES: dict[int, tuple[Any, EngineRoutes]] = {}
_ROUTES_KEPT = 8


def _routes_of(topology: Any) -> EngineRoutes:
    """The :class:`EngineRoutes` of ``topology`` (default engine config), kept for the last
    :data:`_ROUTES_KEPT` topologies: replays of one topology in a process probe each distinct collective
    and copy route once (a probe runs alone on the scratch engine, so its answer does not depend on the
    probes before it)."""
    hit = _ROUTES.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    rt = EngineRoutes(topology)
    if len(_ROUTES) >= _ROUTES_KEPT:
        del _ROUTES[next(iter(_ROUTES))]
    _ROUTES[id(topology)] = (topology, rt)
    return rt


def replay_end(now: float, runs: list[RankRun]) -> float:
    """End of the replay (s from the trace origin): the last host or GPU op end, or the engine's clock. Every
    rank's ends at once (one maximum over the finite ones: the maximum of the ranks' maxima)."""
    ends = np.concatenate([np.asarray(a, dtype=float) for run in runs for a in (run.gpu_end, run.host_end)]) \
        if runs else np.zeros(0)
    v = ends[np.isfinite(ends)]
    return max(now, float(v.max())) if v.size else now


def _single_keys(rg: Any, js: np.ndarray) -> list[tuple[int, float, int, int]]:
    """Per collective GPU op ``js`` of ``rg``: (type, bytes as :func:`nbytes_of` reads them, group,
    group size), what :func:`collective_spec` of the op alone depends on."""
    C = rg.collectives
    c = rg.gpu_ops.collective[js].astype(np.int64)
    ct = C.type[c].astype(np.int64)
    ag = ct == int(CollType.ALL_GATHER)
    b = np.where(ag, C.out_bytes[c], C.in_bytes[c]).astype(float)
    eb = C.elem_bytes[c].astype(np.int64)
    n = np.where(ag, C.out_nelems[c], C.in_nelems[c]).astype(np.int64)
    alt = np.where((eb > 0) & (n > 0), (eb * n).astype(float), math.nan)
    b = np.where(np.isfinite(b) & (b > 0), b, alt)
    return list(zip(ct.tolist(), b.tolist(), C.group[c].astype(np.int64).tolist(),
                    C.group_size[c].astype(np.int64).tolist()))


def _spec(arr: list, topology: Any, cfg: ReplayConfig,
          gpu_of: dict[int, str] | None = None) -> tuple[str, list[str], float, Any] | None:
    """:func:`collective_spec` (``gpu_of``: its cache of rank -> GPU), None when its group does not fit the
    topology."""
    try:
        return collective_spec(arr, topology, cfg, gpu_of)
    except CosimInputError:
        return None


def rank_static(prog: Any, rg: Any) -> tuple[list[int], list[tuple[int, float, int, int]],
                                             list[tuple[int, np.ndarray, np.ndarray]]]:
    """What the attribution reads of rank graph ``rg`` alone (``prog``: its compiled program): its collective GPU
    ops and their :func:`_single_keys`, and per copy kind (H2D, D2H, PtoP, in that order, those it has) the kind,
    its memcpy ops and their bytes. Kept on the program (:attr:`~cosim.replay.program.RankProgram.link_static`),
    which :func:`cosim.replay.program.compile_rank` shares between replays of the same content, so a cached
    replay reads them once."""
    got = prog.link_static
    if got is not None:
        return cast(tuple[list[int], list[tuple[int, float, int, int]], list[tuple[int, np.ndarray, np.ndarray]]],
                    got)
    G = rg.gpu_ops
    js = np.flatnonzero(G.collective >= 0)
    mem = G.kind == GpuKind.MEMCPY
    kinds: list[tuple[int, np.ndarray, np.ndarray]] = []
    if mem.any():
        for kind in (CopyKind.HTOD, CopyKind.DTOH, CopyKind.PTOP):
            sel = np.flatnonzero(mem & (G.copy_kind == kind))
            if sel.size:
                kinds.append((int(kind), sel, G.bytes[sel]))
    got = prog.link_static = (js.tolist(), _single_keys(rg, js), kinds)
    return got


def replay_link_usage(ex: Executor, topology: Any, cfg: ReplayConfig, fabric_usage: LinkUsage | None,
                      finish_fabric: Any, copies: CopyModel | None = None) -> tuple[LinkUsage | None, dict[str, int]]:
    """Per-link traffic of the finished replay and the ops left off the links (reason -> count).

    Attribution only, no replayed time changes. Simulated collectives: the fabric's recorded
    flows. Measured collectives: the engine's decomposition over the kernel's replayed interval.
    Memcpys (both modes): bytes on the copy's route over its replayed interval (docs/REPLAY.md); with simulated
    collectives the fabric's counters hold the copies' flows too, so their wire bytes are not counted twice."""
    skipped: dict[str, int] = {}
    state: dict[str, Any] = {"usage": fabric_usage, "routes": None}
    gpu_of: dict[int, str] = {}  # rank -> GPU, for this call (topology.gpus builds a list each time)
    if fabric_usage is not None:
        finish_fabric()

    def skip(reason: str, n: int = 1) -> None:
        if n:
            skipped[reason] = skipped.get(reason, 0) + n

    def routes() -> tuple[LinkUsage, EngineRoutes]:
        if state["routes"] is None:
            rt = state["routes"] = _routes_of(topology)
            if state["usage"] is None:
                fab = rt.fabric
                state["usage"] = LinkUsage(fab.links, fab.capacity)
        return state["usage"], state["routes"]

    if fabric_usage is None:  # measured collectives: the instances the simulated mode would run, over their kernels
        _measured_collectives(ex, topology, cfg, routes, skip, gpu_of)
    _copies(ex, topology, cfg, fabric_usage, copies, routes, skip, gpu_of)
    return state["usage"], skipped


def _measured_collectives(ex: Executor, topology: Any, cfg: ReplayConfig,
                          routes: Callable[[], tuple[LinkUsage, EngineRoutes]], skip: Callable[[str, int], None],
                          gpu_of: dict[int, str]) -> None:
    """Measured collectives' traffic: the engine's decomposition of each instance the simulated mode would run
    (the ranks' matched collectives, and each lone one), spread over its kernels' replayed interval."""
    instances: dict[Any, list] = {}
    singles: list[tuple[Any, int, tuple[int, int, float, int, int]]] = []
    for r in ex.ranks:
        js, keys, _ = rank_static(r.prog, r.rg)
        ck_of = r.coll_key
        for j, (ct, size, grp, gsize) in zip(js, keys):
            ck = ck_of.get(j)
            if ck is None:
                singles.append((r, j, (id(r), ct, size, grp, gsize)))
            else:
                instances.setdefault(ck, []).append((r, j, r.start[j]))
    specs: dict[tuple[int, int, float, int, int], Any] = {}  # a rank's repeated collectives
    got: list[tuple[tuple[np.ndarray, np.ndarray, np.ndarray], float, float]] = []
    for arr in instances.values():
        t0 = max(float(r.start[j]) for r, j, _ in arr)  # the last participant's start
        t1 = max(float(r.end[j]) for r, j, _ in arr)
        spec = _spec(arr, topology, cfg, gpu_of) if math.isfinite(t0 + t1) else None
        if spec is None:
            skip("collectives (type, size or GPUs unknown)", 1)
            continue
        got.append((routes()[1].collective(*spec), t0, t1))
    for r, j, key in singles:  # its spec depends on its rank, type, size and group only
        t0, t1 = float(r.start[j]), float(r.end[j])
        if not math.isfinite(t0 + t1 + key[2]):  # collective_spec: None for an unknown size
            skip("collectives (type, size or GPUs unknown)", 1)
            continue
        if key not in specs:
            specs[key] = _spec([(r, j, r.start[j])], topology, cfg, gpu_of)
        spec = specs[key]
        if spec is None:
            skip("collectives (type, size or GPUs unknown)", 1)
            continue
        got.append((routes()[1].collective(*spec), t0, t1))
    if got:  # one add, in the order of the instances (the same sums as one add each)
        usage, _ = routes()
        ks = [g[0][0].size for g in got]
        usage.add(np.concatenate([g[0][0] for g in got]), np.repeat([g[1] for g in got], ks),
                  np.repeat([g[2] for g in got], ks), np.concatenate([g[0][2] for g in got]),
                  np.concatenate([g[0][1] for g in got]), COLLECTIVE)


def _copy_groups(ex: Executor, topology: Any, cfg: ReplayConfig, gpu_of: dict[int, str]
                 ) -> tuple[list[tuple[Any, np.ndarray, np.ndarray, tuple[str, str]]], list[list[Any]]]:
    """The ranks' H2D and D2H copies by rank and kind, in order: (rank, its copy ops, their bytes, (source,
    destination) of the route); and the reasons copies are left out, in the order met: [reason, count], or [None,
    group index] for that group's copies of unknown size or times (counted by the caller)."""
    groups: list[tuple[Any, np.ndarray, np.ndarray, tuple[str, str]]] = []  # (rank, ops, bytes, (src, dst))
    why: list[list[Any]] = []  # skip reasons in the order met: [reason, count], or [None, group] (unknown size)
    for r in ex.ranks:
        kinds = rank_static(r.prog, r.rg)[2]
        if not kinds:
            continue
        gpu: str | None
        cpu: str | None
        try:
            rank = r.rg.rank
            gpu = gpu_of[rank] if rank in gpu_of else gpu_of.setdefault(rank, gpu_of_rank(topology, rank, cfg))
            cpu = topology.cpu_of(gpu)
        except Exception:  # a rank beyond the topology, or a GPU without a CPU
            gpu = cpu = None
        for kind, sel, nb in kinds:
            if kind == CopyKind.PTOP or gpu is None or cpu is None:
                why.append(["peer copies (the trace names no peer GPU)" if kind == CopyKind.PTOP
                            else "memcpys of ranks with no GPU and CPU on the topology", int(sel.size)])
                continue
            why.append([None, len(groups)])
            groups.append((r, sel, nb, (cpu, gpu) if kind == CopyKind.HTOD else (gpu, cpu)))
    return groups, why


def _copies(ex: Executor, topology: Any, cfg: ReplayConfig, fabric_usage: LinkUsage | None,
            copies: CopyModel | None, routes: Callable[[], tuple[LinkUsage, EngineRoutes]],
            skip: Callable[[str, int], None], gpu_of: dict[int, str]) -> None:
    """Every rank's host <-> device copies: bytes on their route over their replayed interval, as one part (a
    link's intervals in the order of the ranks and kinds), the bytes counted in the order one addition per rank
    and kind would count them (then the fabric's share taken off again). Every rank's copies at once: O(copies
    x route links) numpy over the job, a few calls per rank and kind."""
    groups, why = _copy_groups(ex, topology, cfg, gpu_of)
    if not groups:
        for reason, n in why:
            skip(reason, n)
        return
    ns = [g[1].size for g in groups]
    gid = np.repeat(np.arange(len(groups), dtype=np.int64), ns)
    times: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(rank) -> its (start, end) as arrays, once a rank
    for r, _, _, _ in groups:
        if id(r) not in times:
            times[id(r)] = (np.asarray(r.start, dtype=float), np.asarray(r.end, dtype=float))
    start = np.concatenate([times[id(r)][0][sel] for r, sel, _, _ in groups])
    end = np.concatenate([times[id(r)][1][sel] for r, sel, _, _ in groups])
    nb = np.concatenate([g[2] for g in groups])
    ok = np.isfinite(nb) & (nb > 0) & np.isfinite(start) & np.isfinite(end)
    bad = np.bincount(gid[~ok], minlength=len(groups)).tolist()
    for reason, n in why:
        skip("memcpys of unknown size", bad[n]) if reason is None else skip(reason, n)
    good = np.bincount(gid[ok], minlength=len(groups)).tolist()
    if not any(good):
        return
    usage, rt = routes()
    route_idx: list[np.ndarray] = []
    route_w: list[np.ndarray] = []
    for (_, _, _, pair), n in zip(groups, good):
        idx, w = rt.transfer(*pair) if n else (np.zeros(0, dtype=np.int64), np.zeros(0))
        route_idx.append(idx)
        route_w.append(w)
    k = np.fromiter((i.size for i in route_idx), dtype=np.int64, count=len(groups))
    roff = np.zeros(len(groups), dtype=np.int64)
    np.cumsum(k[:-1], out=roff[1:])
    g_ok, nb_ok = gid[ok], nb[ok]
    kc = k[g_ok]  # route links of each copy
    rep = np.repeat(np.arange(g_ok.size, dtype=np.int64), kc)  # copy of each (copy, link) element
    first = np.cumsum(kc) - kc
    at = roff[g_ok][rep] + (np.arange(rep.size, dtype=np.int64) - first[rep])  # its link's place in the routes
    R, W = np.concatenate(route_idx), np.concatenate(route_w)
    lk, w_el = R[at], W[at]
    b = nb_ok[rep] * w_el  # np.outer(bytes, w) of each rank and kind, row by row
    np.add.at(usage.memcpy_bytes, lk, b)
    on_fab: list[np.ndarray | None] = [None] * len(groups)
    if fabric_usage is not None and copies is not None:  # already in the fabric's byte counters
        on_fab = [None if (f := copies.bytes_on_fabric.get(r.rg.rank)) is None else f[sel]
                  for r, sel, _, _ in groups]
    _count_copy_bytes(usage, lk, b, w_el, on_fab, ns, ok, g_ok[rep], rep)
    usage.add(lk, start[ok][rep], end[ok][rep], 1.0, b, MEMCPY, count_bytes=False)


def _count_copy_bytes(usage: LinkUsage, lk: np.ndarray, b: np.ndarray, w: np.ndarray, on_fab: list[np.ndarray | None],
                      ns: list[int], ok: np.ndarray, group: np.ndarray, rep: np.ndarray) -> None:
    """Add the copies' bytes ``b`` (per copy and route link ``lk``: its bytes times the link's weight ``w``;
    ``group``: its rank-and-kind group, ``rep``: its copy among those kept, ``ok``) to ``usage.total_bytes``, less
    what the fabric already counted of them (``on_fab``: per group, its copies' bytes on the fabric, None where
    none; ``ns``: its copies), in the order one addition per group, then its fabric share taken off, adds them."""
    if not any(f is not None for f in on_fab):
        np.add.at(usage.total_bytes, lk, b)
        return
    f_all = np.concatenate([np.full(n, math.nan) if f is None else f for f, n in zip(on_fab, ns)])[ok]
    has = np.fromiter((f is not None for f in on_fab), dtype=bool, count=len(on_fab))[group]
    minus = -(f_all[rep][has] * w[has])
    o = np.argsort(np.concatenate([2 * group, 2 * group[has] + 1]), kind="stable")
    np.add.at(usage.total_bytes, np.concatenate([lk, lk[has]])[o], np.concatenate([b, minus])[o])
