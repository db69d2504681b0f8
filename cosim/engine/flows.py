"""Flow-level network model: max-min fair bandwidth sharing on directed links.

A transfer is a *flow* of bytes along a route of directed topology edges. All
flows in flight at the same time share every directed link they cross by
max-min fairness (progressive filling / water filling):

1. every unfrozen flow's rate rises at the same speed;
2. when a link's capacity is used up, the flows crossing it freeze at their
   current rate; when a flow reaches its own rate cap it freezes too;
3. repeat until every flow is frozen.

Rates are re-solved only when flows start or end. Between those instants rates
are constant, so the engine advances with one simpy timeout to the next
completion (superseded timeouts are ignored by a generation counter).

Data layout (built for ~1M logical flows, no per-flow Python objects):

* **Segments**: a weighted set of links (``link``, ``weight``), registered
  once and cached: a whole route between two endpoints (its equal-cost paths
  bundled, each link weighted by the share of the bytes that cross it), or a
  piece of one (GPU -> leaf switch up-segment, leaf -> leaf fabric bundle, leaf
  -> GPU down-segment on clusters).
* **Rows** (flow classes): up to three segment ids, bytes left per member, a
  rate per member, a rate cap, a *multiplicity* (identical flows the row stands
  for: same segments and size share one row), a coupled-group id and a batch.
* **Batches**: one simpy event per batch of rows (a collective phase, or one
  :meth:`Fabric.transfer`); it succeeds when the last row of the batch has
  arrived (its end plus its latency).

The solver works on the two-level incidence row -> segment -> link, so a round
of water filling costs O(rows + segment entries) numpy work: an all-to-all
among 1024 GPUs of a rail-optimized cluster is ~1M rows but only ~3M
row-segment entries and a few thousand segments.

Units: bytes, seconds, bytes/s.

Modelling notes (see docs/ENGINE.md):

* Link capacity = topology ``bandwidth`` (raw, per direction, aggregate of
  ``count`` links) x link ``efficiency`` x :attr:`FabricConfig.bandwidth_scale`.
* A flow's ``efficiency`` (a protocol's payload fraction) inflates its wire
  bytes: ``wire = nbytes / efficiency``. Link counters count wire bytes.
* A flow's completion fires ``latency`` after its last byte left: the path's
  link latencies (first path of a bundle) plus any extra the caller adds. A
  single flow on an idle path thus takes ``latency + nbytes / (efficiency * capacity)``.
* ``multipath="split"``: a transfer's bytes are spread over up to
  ``max_paths`` equal-cost paths in fixed proportion to the paths' idle
  bottleneck capacities, and the transfer moves at one rate (the bundle
  freezes when any of its links saturates); on cluster fabrics the leaf ->
  spine -> leaf part is split in proportion to those links' capacities only.
* Flows of one *coupled group* move at one common rate (the group freezes when
  any member is bottlenecked), as the steps of a pipelined ring do.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import networkx as nx
import numpy as np
import simpy

from cosim.topology.routing import iter_links

__all__ = ["Fabric", "FabricConfig", "LinkStats"]

_INF = math.inf


@runtime_checkable
class SegmentRouter(Protocol):
    """A router that also hands out cluster route pieces (:class:`cosim.engine.topoview.ClusterRouter`)."""

    def __call__(self, src: str, dst: str) -> list[list[str]]: ...

    def up_path(self, gpu: str) -> list[str] | None: ...

    def mid_paths(self, la: str, lb: str) -> list[list[str]]: ...

    def node(self, dev: str) -> int: ...


_SMALL_LINK_MATRIX = 65536
_SMALL_LINK_WORK = 20_000_000
""":meth:`Fabric._link_matrix` is a :class:`_SmallLinkMatrix` (numpy only) while it has fewer than
``_SMALL_LINK_MATRIX`` segment entries, the products so far have multiplied fewer than ``_SMALL_LINK_WORK`` entries
and ``scipy.sparse`` is not imported yet: a small run then never imports it (about 0.08 CPU s, most of a small
collective's own cost). Its product costs about 1.2-1.5 ns per entry more than scipy's (5k-50k entries), so the
budget's extra, about 30 ms, stays below the import; past it, scipy's CSR (the same floats)."""


class _SmallLinkMatrix:
    """The links x segments matrix of :meth:`Fabric._link_matrix` as its CSR entries (rows ascending, each row's
    entries in CSR order), multiplied by one ``np.bincount``: per row, ``0.0 + w0 * v[s0] + w1 * v[s1] + ...`` in
    entry order, the operations and order of scipy's ``csr_matvec``, so the same floats."""

    __slots__ = ("cols", "data", "n_rows", "rows")

    def __init__(self, rows: np.ndarray, cols: np.ndarray, data: np.ndarray | None, n_rows: int) -> None:
        self.rows, self.cols, self.data, self.n_rows = rows, cols, data, n_rows

    def __matmul__(self, v: np.ndarray) -> np.ndarray:
        x = v[self.cols]
        return np.bincount(self.rows, weights=x if self.data is None else self.data * x, minlength=self.n_rows)


@dataclass
class FabricConfig:
    """Settings of the flow-level network model."""

    bandwidth_scale: float = 1.0
    """Multiplies every link's capacity (what-if: faster or slower links)."""
    latency_scale: float = 1.0
    """Multiplies every link's latency."""
    multipath: str = "split"
    """How a transfer uses equal-cost paths: "split" spreads its bytes over up to
    ``max_paths`` shortest paths in proportion to their bottleneck capacity (NCCL
    channels spread over all NVLinks/NVSwitch planes; adaptive routing); "hash"
    puts it on one path chosen by a deterministic key (ECMP)."""
    max_paths: int = 8
    """At most this many equal-cost paths per transfer with ``multipath="split"``. On
    cluster fabrics the leaf -> spine -> leaf bundle always spreads over every spine
    (switch ECMP / adaptive routing use all uplinks; capping it would leave spines idle)."""
    router: str = "auto"
    """"auto": on multi-node topologies compose paths from cached segments
    (:class:`cosim.engine.topoview.ClusterRouter`, fast for all-to-all on big
    clusters); "topology": always ask the topology's ``paths``."""
    time_tolerance: float = 1e-12
    """A flow whose remaining time at its current rate is below this (seconds)
    counts as finished; absorbs floating-point round-off."""
    completion_tolerance: float = 0.01
    """Completion window of a batch (one collective phase, or one :meth:`Fabric.transfer`), as a
    fraction eps of the batch's projected remaining time D (from the last solve to the latest end of
    its rows at the rates then in force). When a row is due, every row of its batch due within 2h of it
    (h = eps/2 x D) ends at one event, at the middle of those ends: each row's bandwidth is released
    within h of its exact end at those rates (late or early; the bytes it still had, or had in excess,
    are charged to its links, so link bytes are exact) and its batch completes at its projected end.
    Rows of other batches end exactly. A batch's events are then at least h apart, h shrinking with what
    is left: about (2/eps) ln(D0 / last gap) solves per collective phase, where an exact uneven
    all-to-all needs one per distinct flow end, N(N-1). 0: exact (every row ends at its own time);
    the default 0.01 keeps uneven all-to-alls of 32-128 GPUs within 0.06% of exact (docs/ENGINE.md)."""

    def __post_init__(self) -> None:
        if not (self.bandwidth_scale > 0 and math.isfinite(self.bandwidth_scale)):
            raise ValueError(f"bandwidth_scale must be > 0, got {self.bandwidth_scale}")
        if not (self.latency_scale >= 0 and math.isfinite(self.latency_scale)):
            raise ValueError(f"latency_scale must be >= 0, got {self.latency_scale}")
        if self.multipath not in ("split", "hash"):
            raise ValueError(f"multipath must be 'split' or 'hash', got {self.multipath!r}")
        if self.router not in ("auto", "topology"):
            raise ValueError(f"router must be 'auto' or 'topology', got {self.router!r}")
        if not (0 <= self.time_tolerance < _INF):
            raise ValueError(f"time_tolerance must be finite and >= 0, got {self.time_tolerance}")
        if not (0 <= self.completion_tolerance < 1):
            raise ValueError(f"completion_tolerance must be in [0, 1), got {self.completion_tolerance}")
        if self.max_paths < 1:
            raise ValueError(f"max_paths must be >= 1, got {self.max_paths}")

    coalesce: bool = True
    """Coalesce repeated collectives (exact): a collective whose links are all idle when it starts
    reuses the duration and link counters of its first run on an idle scratch fabric instead of
    solving rates; if another flow arrives on its links while it runs, it is materialized as real
    flows with the bytes left at that instant (docs/ENGINE.md, *Coalescing*). False: always solve."""
    flow_classes: bool = True
    """One row per class of equivalent flows: the rows of a batch (no coupled group) with equal bytes, latency
    and rate cap that cross the same number of segments (e.g. the inter-node pairs of an equal-split
    all-to-all) start as one row of their summed multiplicity on a *class segment* (their links, weighted by
    their summed weights over that multiplicity). After every solve that re-rates it the class is checked
    against the per-flow max-min conditions (every member crosses a saturated link on which no row is faster,
    or all run at their cap); one that fails is split, exactly, into its member rows with the bytes it has left
    and the solve is redone. Results agree with per-flow rows within round-off (the per-link sums add other
    terms), not bit for bit (docs/ENGINE.md, *Performance*)."""
    trajectory: bool = True
    """Materialize a coalesced collective from its memo's recorded trajectory (the last state before the hit
    advanced linearly) instead of re-running its scratch copy up to the hit: equal to the re-run within
    round-off (tested), ~10% less CPU on the 1024-GPU DeepSeek-V3 step; those round-off differences move that
    step's time by 7e-7 relative (docs/ENGINE.md, *Coalescing*). False: the scratch re-run."""


@dataclass
class LinkStats:
    """Counters of one directed link over the run so far."""

    src: str
    dst: str
    capacity: float
    """Effective capacity (bytes/s)."""
    bytes: float
    """Wire bytes that crossed the link."""
    busy_time: float
    """Seconds with at least one flow on the link."""
    peak_flows: int
    """Most flows on the link at once (multiplicity counted)."""

    def utilization(self, elapsed: float) -> float:
        """Average fraction of capacity used over ``elapsed`` seconds."""
        if elapsed <= 0 or self.capacity <= 0:
            return 0.0
        return self.bytes / (self.capacity * elapsed)

    def to_dict(self) -> dict[str, Any]:
        return {
            "src": self.src,
            "dst": self.dst,
            "capacity_Bps": self.capacity,
            "bytes": self.bytes,
            "busy_time_s": self.busy_time,
            "peak_flows": self.peak_flows,
        }


_REM_EPS = 1e-6
"""Bytes left below which a row's bandwidth phase is over (bytes)."""

_K = 3
"""Segments per row (cluster route: up-segment, fabric bundle, down-segment)."""


@dataclass(slots=True, eq=False)
class _FlowClass:
    """A flow class: member rows of one batch with equal wire bytes, latency, cap and segment count, run as one
    row on the class segment ``sid`` (their summed multiplicity; see :meth:`Fabric._form_classes`)."""

    segs: np.ndarray
    """The members' segments (rows x :data:`_K`, -1 padded)."""
    mult: np.ndarray
    """The members' multiplicity."""
    lat: np.ndarray
    """The members' latency (s)."""
    cap: np.ndarray
    """The members' wire rate cap (bytes/s; inf: none)."""
    sid: int
    """Its class segment."""
    tables: tuple[np.ndarray, np.ndarray, np.ndarray, int, list[np.ndarray]] | None = None
    """The members' segment tables of :meth:`Fabric._class_ok` (built at the first check)."""
    split: tuple[np.ndarray, list[_FlowClass]] | None = None
    """What a split made of it (its members left as plain rows, its sub-classes): a later start of the same
    prepared batch begins split like this."""

    row_parts: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
    """:meth:`row`, kept (its parts are only read: callers concatenate them)."""

    def row(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Its row but the bytes: (segments 1 x :data:`_K`, multiplicity, latency, cap), one value each; built
        at the first call (O(members)), then O(1)."""
        if self.row_parts is None:
            seg = np.full((1, _K), -1, dtype=np.int64)
            seg[0, 0] = self.sid
            self.row_parts = (seg, np.array([float(self.mult.sum())]), self.lat[:1], self.cap[:1])
        return self.row_parts


@dataclass
class _Rows:
    """Growable struct-of-arrays of flow classes (rows).

    Remaining bytes are lazy (SimGrid's lazy action update): ``rem`` is what was left
    at time ``t0``, when the row's ``rate`` was last set; ``tend`` is the predicted end
    of its bandwidth phase at that rate. A solve touches only the rows it re-rates."""

    size: int = 0
    rem: np.ndarray = field(default_factory=lambda: np.zeros(0))
    t0: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tend: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tbeg: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mult: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    comp: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    active: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    seg: np.ndarray = field(default_factory=lambda: np.zeros((0, _K), dtype=np.int64))
    segc: tuple[np.ndarray, ...] = field(default_factory=lambda: tuple(np.zeros(0, dtype=np.int64) for _ in range(_K)))
    """``seg`` by slot: one contiguous array per segment slot (the frontier search gathers each slot's column
    of the active rows without a 2-D gather and transpose)."""
    tcand: np.ndarray = field(default_factory=lambda: np.full(0, _INF))
    """A lower bound on the time the row can first be due (its end less the slack of the bytes test,
    :meth:`Fabric._due_from`); ``inf`` for inactive rows and rows not yet rated that still have bytes:
    the completion test looks only at rows whose bound has passed."""
    cls: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Flow class of the row (:attr:`FabricConfig.flow_classes`; -1: a plain row)."""
    bott: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Link that froze the row in its last solve (-1: its rate cap; -2: unknown): the solve structure
    :meth:`Fabric._reuse_structure` tries first."""

    _FILL = {"rem": 0.0, "t0": 0.0, "tend": _INF, "tbeg": 0.0, "rate": 0.0, "cap": _INF, "mult": 1.0, "lat": 0.0,
             "group": -1, "batch": -1, "comp": -1, "active": False, "seg": -1,
             "tcand": _INF, "bott": -2, "cls": -1}

    def grow(self, need: int) -> None:
        cur = len(self.rem)
        if need <= cur:
            return
        new = max(need, 2 * cur, 256)
        for name, fill in self._FILL.items():
            a = getattr(self, name)
            b = np.full((new, *a.shape[1:]), fill, dtype=a.dtype)
            b[:cur] = a
            setattr(self, name, b)
        self.segc = tuple(np.concatenate([c, np.full(new - cur, -1, dtype=np.int64)]) for c in self.segc)

    def set_seg(self, sl: slice, segs: np.ndarray) -> None:
        """Rows ``sl`` cross segments ``segs`` (rows x :data:`_K`, -1 padding)."""
        self.seg[sl] = segs
        for k, c in enumerate(self.segc):
            c[sl] = segs[:, k]

    def keep(self, idx: np.ndarray) -> None:
        """Keep rows ``idx`` (ascending), moved to the front in place: the capacity stays, so the next rows
        started need no new arrays (a shrink here made nearly every later start re-allocate all of them)."""
        n, old = len(idx), self.size
        for name, fill in self._FILL.items():
            a = getattr(self, name)
            a[:n] = a[idx]
            a[n:old] = fill
        for c in self.segc:
            c[:n] = c[idx]
            c[n:old] = -1
        self.size = n


def _nzf(a: np.ndarray) -> np.ndarray:
    """``np.flatnonzero(a)`` of an array, without numpy's Python-level wrappers (called ~10^5 times a step)."""
    return a.ravel().nonzero()[0]


def _nseg(segs: np.ndarray) -> np.ndarray:
    """Segments per row of ``segs`` (rows x :data:`_K`, -1 padded): ``np.count_nonzero(segs >= 0, axis=1)`` by
    column, without its slow axis reduction on a narrow array."""
    n = (segs[:, 0] >= 0).astype(np.int64)
    for k in range(1, segs.shape[1]):
        n += segs[:, k] >= 0
    return n


def _row_sum(counts: np.ndarray, inv: np.ndarray) -> np.ndarray:
    """``counts[inv].sum(axis=1)`` for whole-number ``counts`` (exact in any order), column by column: a sum
    along the narrow axis of ``inv`` (rows x :data:`_K`) is slow."""
    out = counts[inv[:, 0]]
    for k in range(1, inv.shape[1]):
        out = out + counts[inv[:, k]]
    return out


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Concatenation of ``arange(starts[i], starts[i] + lens[i])`` over i."""
    if not lens.size:
        return np.zeros(0, dtype=np.int64)
    cs = lens.cumsum()
    tot = int(cs[-1])  # (integer sums: the same as lens.sum())
    if not tot:
        return np.zeros(0, dtype=np.int64)
    return (starts - (cs - lens)).repeat(lens) + np.arange(tot)


def _compact(ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(ids, return_inverse=True)`` for ids in 0..n-1: a mark and a lookup table, O(len + n),
    instead of a sort when ``ids`` is long."""
    ids = ids.reshape(-1)
    if ids.size * 4 < n and n > 8192:  # few ids of many: a sort; else (and always below 8192 ids) the table
        u, inv = np.unique(ids, return_inverse=True)
        return u, inv.reshape(-1)
    mark = np.zeros(n, dtype=bool)
    mark[ids] = True
    u = mark.nonzero()[0]
    lut = np.zeros(n, dtype=np.int64)
    lut[u] = np.arange(len(u))
    return u, lut[ids]


class _Compactor:
    """:func:`_compact` with its mark and lookup table kept between calls (grown to the largest ``n``): the same
    ``(u, inverse)``, without allocating and zeroing two length-``n`` arrays per call. The mark is cleared
    after use at the marked ids only; the table is read only where this call wrote it."""

    __slots__ = ("lut", "mark")

    def __init__(self) -> None:
        self.mark = np.zeros(0, dtype=bool)
        self.lut = np.zeros(0, dtype=np.int64)

    def _grow(self, n: int) -> None:
        if self.mark.size < n:
            cap = max(n, 2 * self.mark.size)
            self.mark = np.zeros(cap, dtype=bool)
            self.lut = np.zeros(cap, dtype=np.int64)

    def unique(self, ids: np.ndarray, n: int) -> np.ndarray:
        """``np.unique(ids)`` for ids in 0..n-1, by the mark: O(len + n), no sort."""
        self._grow(n)
        mark = self.mark
        mark[ids] = True
        u = mark[:n].nonzero()[0]
        mark[u] = False
        return u

    def __call__(self, ids: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        ids = ids.reshape(-1)
        if ids.size * 4 < n and n > 8192:
            u, inv = np.unique(ids, return_inverse=True)
            return u, inv.reshape(-1)
        u = self.unique(ids, n)
        lut = self.lut
        lut[u] = np.arange(len(u))
        return u, lut[ids]


def _counts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.unique(keys, return_counts=True)``; O(len) run lengths when ``keys`` is already sorted (the batch
    ids of ascending row ids: rows are appended batch by batch and compaction keeps their order), else a sort."""
    if len(keys) > 1:
        d = np.diff(keys)
        if d.min() < 0:
            return np.unique(keys, return_counts=True)
        cut = _nzf(d) + 1
        first = np.concatenate(([0], cut))
        return keys[first], np.diff(np.concatenate((first, [len(keys)])))
    return keys.copy(), np.ones(len(keys), dtype=np.int64)


_FIRST_SEEN_SCALAR = 128
"""Longest group-id array :func:`_first_seen` relabels in pure Python."""


def _first_seen(g: np.ndarray) -> np.ndarray:
    """Group ids ``g`` (-1: none) relabelled 0, 1, ... by first appearance (-1 kept, and counted as an id):
    equal results for arrays equal up to a renaming of the groups. O(len + span of the ids) by a table of first positions
    when there are 1024 ids or more spanning at most 4 x len (they are recent: ids are handed out in order), else a
    sort; a constant -1 array unchanged. Up to :data:`_FIRST_SEEN_SCALAR` ids: a dict in one Python pass (measured
    1-25 us for 4-128 ids against the sort's 30-39 us; break-even near 256)."""
    if len(g) <= _FIRST_SEEN_SCALAR:
        label: dict[int, int] = {}
        labs = []
        for x in g.tolist():
            lab = label.get(x)
            if lab is None:
                lab = label[x] = len(label)
            labs.append(lab if x >= 0 else -1)
        return np.array(labs, dtype=np.int64)
    pos = g >= 0
    if not np.count_nonzero(pos):
        return g
    gv = g[pos]
    lo = int(gv.min())
    span = int(gv.max()) - lo + 1
    if len(g) < 1024 or span > 4 * len(g):  # the sort: fewer numpy calls on short arrays (measured)
        _, first, inv = np.unique(g, return_index=True, return_inverse=True)
        rank = np.argsort(np.argsort(first))
        return np.where(pos, rank[inv.reshape(-1)], -1)
    n = len(g)
    first_at = np.full(span, n, dtype=np.int64)
    np.minimum.at(first_at, gv - lo, _nzf(pos))
    seen = _nzf(first_at < n)  # distinct ids (less lo), ascending
    order = seen[np.argsort(first_at[seen], kind="stable")]
    r = np.arange(len(seen))
    if len(gv) < n:  # -1 takes a rank of its own at its first appearance (as it does in the sort's labels)
        r += first_at[order] > int(np.argmin(pos))
    rank = np.zeros(span, dtype=np.int64)
    rank[order] = r
    out = np.full(len(g), -1, dtype=np.int64)
    out[pos] = rank[gv - lo]
    return out


@dataclass(slots=True, frozen=True, eq=False)
class _Expansion:
    """A list of segment ids (-1 padded) expanded to its segments' link entries (:meth:`Fabric._expansion`):
    what :meth:`Fabric._to_links` derived on every call, kept per list since segments never change."""

    sel: np.ndarray | None
    """Positions of the list's non-padding entries (None: all of them)."""
    us: np.ndarray
    """Its distinct segments, ascending."""
    inv: np.ndarray
    """Per kept entry, its segment's position in ``us``."""
    ln: np.ndarray
    """Link entries per segment of ``us``."""
    we: np.ndarray
    """Weight of each link entry (segments of ``us`` in order, each one's entries in registration order)."""
    ne: np.ndarray
    """Flows per unit of multiplicity of each link entry (1; a class segment's: its members' share)."""
    ul: np.ndarray
    """The distinct links of the entries, ascending."""
    li: np.ndarray
    """Per link entry, its link's position in ``ul``."""
    tiled: dict[tuple[int, bool], tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(
        default_factory=dict)
    """Per (vectors, flow classes on): the indices and entry factors of :meth:`Fabric._row_link_sums`."""


def _csr(keys: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, offsets): positions of ``keys`` grouped by key value 0..n-1 (stable)."""
    order = np.argsort(keys, kind="stable")
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(keys, minlength=n), out=off[1:])
    return order, off


class Fabric:
    """Directed links of a topology graph, shared by flows with max-min fairness.

    Args:
        env: the simpy environment.
        graph: topology graph; every directed edge needs ``bandwidth`` (bytes/s),
            and may have ``efficiency`` (0..1, default 1) and ``latency`` (s, default 0).
        config: :class:`FabricConfig`.
        router: ``router(src, dst) -> list of paths`` (lists of node ids); default:
            all shortest paths by hop count in ``graph``. A router with ``up_path``,
            ``mid_paths`` and ``node`` methods (:class:`cosim.engine.topoview.ClusterRouter`)
            lets :meth:`route_segments` build cluster routes from cached pieces.
        trace: optional callback ``trace(name, start, end, track)`` called when a
            transfer (or a batch of rows) completes.
    """

    def __init__(
        self,
        env: simpy.Environment,
        graph: nx.DiGraph,
        config: FabricConfig | None = None,
        *,
        router: Callable[[str, str], Sequence[Sequence[str]]] | None = None,
        trace: Callable[[str, float, float, str], None] | None = None,
    ) -> None:
        self.env = env
        self.graph = graph
        self.config = config or FabricConfig()
        self._router = router
        self._trace = trace
        self.links: list[tuple[str, str]] = []
        self.link_id: dict[tuple[str, str], int] = {}
        caps: list[float] = []
        lats: list[float] = []
        for ln in iter_links(graph):
            self.link_id[(ln.src, ln.dst)] = len(self.links)
            self.links.append((ln.src, ln.dst))
            caps.append(ln.bandwidth * ln.efficiency * self.config.bandwidth_scale)
            lats.append(ln.latency * self.config.latency_scale)
        self.capacity = np.asarray(caps, dtype=float)
        """Effective capacity per link (bytes/s)."""
        self.latency = np.asarray(lats, dtype=float)
        """Latency per link (s)."""
        nl = len(self.links)
        self.bytes_moved = np.zeros(nl)
        """Wire bytes per link so far."""
        self.busy_time = np.zeros(nl)
        """Seconds each link carried at least one flow."""
        self.peak_flows = np.zeros(nl, dtype=np.int64)
        """Most concurrent flows per link (multiplicity counted), sampled at each batch start; reset it with
        :meth:`reset_peak_flows`."""
        self._peak_all = False  # the next batch start samples every link (after a reset)
        self._peak_more: list[np.ndarray] = []  # links whose flow count a class split changed since the last sample
        self._load = np.zeros(nl)
        self._nflows = np.zeros(nl)
        # segments
        self._seg_ids: dict[Any, int] = {}
        self._seg_lat: list[float] = []
        self._cpx = _Compactor()  # :func:`_compact` with kept scratch arrays
        self._seg_cap: list[float] = []
        self._seg_nlinks: list[int] = []
        self._se_parts: list[tuple[np.ndarray, ...]] = []
        self._se_n = np.zeros(0)  # flows per unit of multiplicity on each entry (1; a class segment: its share)
        self._has_cls = False  # a class segment is registered (unweighted sums then take ``_se_n``)
        self.flow_classes = self.config.flow_classes
        """Form flow classes (:attr:`FabricConfig.flow_classes`); off on scratch fabrics."""
        self._cls: dict[int, _FlowClass] = {}  # class id -> the class
        self._cls_ok: set[bytes] = set()  # rate-memo keys whose flow classes passed the check
        self._cls_bad: dict[bytes, list[tuple[int, np.ndarray]]] = {}  # ... that failed: (row in R, split key)
        self._cls_plans: dict[int, tuple[Any, ...]] = {}  # id(prepared segs) -> (segs, class rows, members)
        self._cls_tables: dict[int, Any] = {}  # class segment -> its members' tables (:meth:`_class_ok`)
        self._cls_parts: dict[Any, tuple[Any, ...]] = {}  # start_rows' ``classes`` key -> partition (_form_classes)
        self._next_cls = 0
        self.n_class_rows = 0
        """Flow-class rows started (a cost counter)."""
        self.n_class_splits = 0
        """Flow classes split back into their member rows."""
        self._se_seg = np.zeros(0, dtype=np.int64)
        self._se_link = np.zeros(0, dtype=np.int64)
        self._se_w = np.zeros(0)
        self._se_off = np.zeros(1, dtype=np.int64)  # segment -> its entries (CSR offsets)
        self._seg_m = np.zeros(0)  # active multiplicity per segment
        self._seg_arr: tuple[int, np.ndarray, np.ndarray] | None = None  # cache of :meth:`_seg_arrays`
        self._exp_cache: dict[bytes, _Expansion] = {}  # segment list -> its expansion (:meth:`_expansion`)
        self._exp_bytes = 0  # what it holds (:data:`_CACHE_BYTES`)
        self._der_cache: dict[tuple[str, bool, bytes], tuple[Any, ...]] = {}  # :meth:`_derived`
        self._der_bytes = 0  # what it holds (:data:`_DERIVED_BYTES`)
        self._next_comp = 0
        self._lm: tuple[tuple[int, int, bool], Any, Any] | None = None  # (key, weighted, ones): :meth:`_link_matrix`
        self._lm_small_work = 0  # entries multiplied by the numpy link matrix (:data:`_SMALL_LINK_WORK`)
        self.n_link_matrix = 0
        """Times :meth:`_link_matrix` was built (a cost counter)."""
        self._comp_n = np.zeros(2, dtype=np.int64)  # active rows per component label (last slot: label -1, kept 0)
        self._bind_cache: tuple[tuple[int, bool], np.ndarray, np.ndarray] | None = None
        self._ep: dict[str, tuple[int, int, int, int]] = {}  # endpoint -> (node, up seg, down seg, leaf code)
        self._leaf_code: dict[str, int] = {}
        # rows and batches
        self._rows = _Rows()
        self._n_active = 0
        self._b_event: list[simpy.Event | None] = []
        self._b_meta: list[tuple[str, float, str]] = []
        self._b_left = np.zeros(0, dtype=np.int64)
        self._b_deadline = np.zeros(0)
        self._b_start = np.zeros(0)
        self._win: tuple[int, float] = (-1, 0.0)  # (batch, half window h) of the pending completion tick
        self._t_last = env.now
        self._adv_buf = (np.empty(nl), np.empty(nl, dtype=bool))  # scratch of :meth:`_advance`
        self._live = np.zeros(nl, dtype=bool)  # links of the rows started since the fabric was last idle
        self._live_idx: np.ndarray | None = None  # their ids (cache of :meth:`_advance`)
        self._gen = 0
        self._solve_pending = False
        self._next_group = 0
        self.n_solves = 0
        """Number of rate re-solves so far (a cost counter)."""
        self.n_flows = 0
        """Logical flows started so far (a row of multiplicity m counts m)."""
        self.n_rows = 0
        """Solver rows (flow classes) started so far."""
        self.n_rows_solved = 0
        """Rows whose rate the solves recomputed, summed over solves (a cost counter)."""
        self.observer: Callable[[np.ndarray, np.ndarray, Any, np.ndarray, np.ndarray], None] | None = None
        """``observer(links, starts, end, flows, bytes)``: per-link intervals of constant flow count and
        load (and those of coalesced collectives; ``end`` one time or one per interval); set by link-usage
        reports."""
        self._obs: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None  # per link: open since, flows, load
        self._obs_dirty = True  # load or flow counts changed since the last :meth:`_observe` (else it has nothing to do)
        self._obs_all = True  # ... anywhere (else only on the links marked in ``_obs_mark``: :meth:`_touch`)
        self._obs_mark = np.zeros(len(self.links), dtype=bool)
        self._obs_buf: tuple[np.ndarray, np.ndarray, np.ndarray] = (np.zeros(0), np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))
        self._wake_all = False
        self._A: np.ndarray | None = None  # active row ids (cache of :meth:`_active_idx`)
        self._free, self._free_share = self._never_binding()
        self._bindable = ~self._free  # (kept: the complement, read per search and check)
        self._binding: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # id(links) -> (links, binding ones)
        self._free_on = bool(self._free.any())
        self._held = np.full(len(self.links), -1, dtype=np.int64)  # coalesced collective holding each link
        self._holders: dict[int, Callable[[], object]] = {}  # hold id -> materialize callback
        self._next_hold = 0
        self._key_of: list[Any] = []  # segment id -> key (built on demand by _seg_key)
        self._closed = False  # the pending solve's rows are whole components (arrivals)
        self._rate_memo: dict[bytes, np.ndarray] = {}
        self._rate_memo_size = 0
        self.n_rate_hits = 0
        """Solves whose rates came from an identical earlier row set (a cost counter)."""
        self.n_coalesced = 0
        """Collectives that ran from a memo without a solve (a cost counter)."""
        self.n_materialized = 0
        """Coalesced collectives turned into real flows because another flow arrived on their links."""
        self.n_reused = 0
        """Solves answered by re-solving the previous bottleneck structure (:meth:`_reuse_structure`)."""
        self._batch_cache: dict[Any, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, float,
                                           float]] = {}
        self.on_solved: Callable[[], None] | None = None
        """Called after every solve (the rates in force until the next event): a scratch fabric records a
        coalesced collective's trajectory with it (:meth:`cosim.engine.collectives.Collectives._memo_run`)."""
        self.compact_rows = True
        """Whether solves may compact the row arrays (row ids change); off while a trajectory is recorded."""
        self._arrived: list[np.ndarray] = []  # rows started since the last solve
        self._departed: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # (segs, rate, comp) since then

    def _never_binding(self) -> tuple[np.ndarray, float]:
        """Links no max-min allocation can saturate beyond what its rows' own host links allow (bool per link),
        and the share of a leaf-spine bundle each such link carries: on a two-tier non-blocking fabric (every
        leaf linked once each way to each of S spines, all those links of one capacity c, each leaf's host
        links at most S c each way) whose routes between leaves are the cluster router's split bundles over
        every spine (share 1/S per spine link), a leaf's uplink carries 1/S of what enters the leaf from its
        hosts, at most c (and a spine's downlink 1/S of what leaves the leaf to its hosts): it never binds, so
        it neither couples rates (components, :meth:`_reach`) nor blocks coalescing (:meth:`links_idle`).
        Checked per segment as routes are registered (:meth:`segment`); none on other fabrics."""
        nl = len(self.links)
        none = (np.zeros(nl, dtype=bool), 0.0)
        if not (isinstance(self._router, SegmentRouter) and self.config.multipath == "split"):
            return none
        g = self.graph
        sw = {n for n, d in g.nodes(data=True) if d.get("kind") == "fabric_switch"}
        if not sw:
            return none
        leaves = {n for n in sw if any(v not in sw for v in g.successors(n)) or any(u not in sw for u in g.predecessors(n))}
        spines = sw - leaves
        if not leaves or not spines:
            return none
        free = np.zeros(nl, dtype=bool)
        caps = []
        for (u, v), i in self.link_id.items():
            if u in sw and v in sw:
                if (u in leaves) == (v in leaves):  # leaf-leaf or spine-spine: not two-tier
                    return none
                free[i] = True
                caps.append(self.capacity[i])
        c = float(caps[0])
        if not np.allclose(caps, c, rtol=1e-12, atol=0.0):
            return none
        S = len(spines)
        for leaf in leaves:
            up = [v for v in g.successors(leaf) if v in sw]
            dn = [u for u in g.predecessors(leaf) if u in sw]
            if sorted(up) != sorted(spines) or sorted(dn) != sorted(spines):
                return none
            h_in = sum(self.capacity[self.link_id[(u, leaf)]] for u in g.predecessors(leaf) if u not in sw)
            h_out = sum(self.capacity[self.link_id[(leaf, v)]] for v in g.successors(leaf) if v not in sw)
            if max(h_in, h_out) > S * c * (1 + 1e-12):
                return none
        return free, 1.0 / S

    # ------------------------------------------------------------------ paths
    def paths(self, src: str, dst: str) -> list[list[str]]:
        """Equal-cost paths from ``src`` to ``dst`` (node id lists)."""
        if self._router is not None:
            ps = [list(p) for p in self._router(src, dst)]
        else:
            try:
                ps = [list(p) for p in nx.all_shortest_paths(self.graph, src, dst)]
            except nx.NetworkXNoPath:
                ps = []
        if not ps:
            raise ValueError(f"no path from {src} to {dst}")
        ps.sort()
        return ps

    def path_links(self, path: Sequence[str]) -> np.ndarray:
        """Link indices of a node path."""
        try:
            return np.fromiter((self.link_id[(path[i], path[i + 1])] for i in range(len(path) - 1)), dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"path {list(path)} uses a missing edge {exc.args[0]}") from None

    # --------------------------------------------------------------- segments
    def segment(self, key: Any, paths: Sequence[Sequence[str]], *, all_paths: bool = False) -> int:
        """Id of the segment ``key``: ``paths`` bundled (bytes split in proportion to
        each path's idle bottleneck capacity; at most ``max_paths`` paths unless
        ``all_paths``). Cached by key."""
        sid = self._seg_ids.get(key)
        if sid is not None:
            return sid
        ps = [list(p) for p in paths]
        if not all_paths:
            ps = ps[: self.config.max_paths]
        links = [self.path_links(p) for p in ps]
        caps = np.array([self.capacity[li].min() if len(li) else _INF for li in links])
        if not np.all(np.isfinite(caps)) or caps.sum() <= 0:
            caps = np.ones(len(links))
        shares = caps / caps.sum()
        w: dict[int, float] = {}
        for li, s in zip(links, shares):
            for lk in li.tolist():
                w[lk] = w.get(lk, 0.0) + float(s)
        sid = len(self._seg_lat)
        lk = np.fromiter(w.keys(), dtype=np.int64, count=len(w))
        wt = np.fromiter(w.values(), dtype=float, count=len(w))
        if self._free_on:
            f = self._free[lk]
            if f.any() and not (all_paths and isinstance(key, tuple) and key[:1] == ("mid",)
                                and (wt[f] <= self._free_share * (1 + 1e-9)).all()):
                self._free_broken()
        self._se_parts.append((np.full(len(lk), sid, dtype=np.int64), lk, wt))
        self._seg_lat.append(float(self.latency[links[0]].sum()) if links else 0.0)
        self._seg_cap.append(float(caps.sum()) if len(lk) else _INF)
        self._seg_nlinks.append(len(lk))
        self._seg_ids[key] = sid
        return sid

    def pair_segment(self, src: str, dst: str, key: int = 0) -> int:
        """Segment of the whole route ``src -> dst`` (hash mode: one path chosen by ``key``)."""
        if self.config.multipath == "hash":
            ps = self.paths(src, dst)
            k = key % len(ps)
            return self.segment(("pair", src, dst, k), [ps[k]])
        sid = self._seg_ids.get(("pair", src, dst))
        if sid is not None:
            return sid
        return self.segment(("pair", src, dst), self.paths(src, dst))

    def _endpoint(self, name: str) -> tuple[int, int, int, int]:
        """(node, up-segment, down-segment, leaf code) of a GPU behind a cluster router, else -1s."""
        hit = self._ep.get(name)
        if hit is not None:
            return hit
        r = self._router
        out = (-1, -1, -1, -1)
        if isinstance(r, SegmentRouter):
            up = r.up_path(name)
            if up is not None:
                leaf = up[-1]
                code = self._leaf_code.setdefault(leaf, len(self._leaf_code))
                out = (int(r.node(name)), self.segment(("path", tuple(up)), [up]),
                       self.segment(("path", tuple(reversed(up))), [list(reversed(up))]), code)
            else:
                out = (int(r.node(name)), -1, -1, -1)
        self._ep[name] = out
        return out

    def route_segments(self, names: Sequence[str], si: np.ndarray, di: np.ndarray) -> np.ndarray:
        """Segment ids (rows x 3, -1 padded) of the routes ``names[si[k]] -> names[di[k]]``.

        On cluster routers (split mode) a GPU-to-GPU route between nodes is the
        source's up-segment, the leaf-to-leaf bundle and the destination's
        down-segment, built with numpy from cached pieces; other routes are whole
        cached pair segments. ``si == di`` gives an empty route (all -1)."""
        si = np.asarray(si, dtype=np.int64)
        di = np.asarray(di, dtype=np.int64)
        out = np.full((len(si), _K), -1, dtype=np.int64)
        rest = _nzf(si != di)
        r = self._router
        if isinstance(r, SegmentRouter) and self.config.multipath == "split" and rest.size:
            info = np.array([self._endpoint(n) for n in names], dtype=np.int64).reshape(len(names), 4)
            a, b = si[rest], di[rest]
            cross = (info[a, 0] != info[b, 0]) & (info[a, 1] >= 0) & (info[b, 2] >= 0)
            c = rest[cross]
            if c.size:
                a, b = si[c], di[c]
                out[c, 0] = info[a, 1]
                out[c, 2] = info[b, 2]
                nleaf = max(len(self._leaf_code), 1)
                code = info[a, 3] * nleaf + info[b, 3]
                uc, inv = np.unique(code, return_inverse=True)
                leaves = list(self._leaf_code)
                mids = np.empty(len(uc), dtype=np.int64)
                for k, cc in enumerate(uc.tolist()):
                    la, lb = leaves[cc // nleaf], leaves[cc % nleaf]
                    mids[k] = -1 if la == lb else self.segment(("mid", la, lb), r.mid_paths(la, lb),
                                                                           all_paths=True)
                out[c, 1] = mids[inv]
            rest = rest[~cross]
        if rest.size:
            code = si[rest] * len(names) + di[rest]
            uc, inv = np.unique(code, return_inverse=True)
            sids = np.array([self.pair_segment(names[cc // len(names)], names[cc % len(names)])
                             for cc in uc.tolist()], dtype=np.int64)
            out[rest, 0] = sids[inv]
        return out

    def path_capacity(self, src: str, dst: str) -> float:
        """Idle-fabric bandwidth from ``src`` to ``dst`` over all used paths (bytes/s)."""
        if src == dst:
            return _INF
        return self._seg_cap[self.pair_segment(src, dst)]

    def path_latency(self, src: str, dst: str) -> float:
        """Latency of the first path from ``src`` to ``dst`` (s)."""
        if src == dst:
            return 0.0
        return self._seg_lat[self.pair_segment(src, dst)]

    # -------------------------------------------------------------- transfers
    def new_group(self) -> int:
        """A fresh coupled-group id (flows of a group move at one rate)."""
        self._next_group += 1
        return self._next_group

    def transfer(
        self,
        src: str | Sequence[str],
        dst: str | None = None,
        nbytes: float = 0.0,
        *,
        efficiency: float = 1.0,
        max_rate: float = _INF,
        extra_latency: float = 0.0,
        link_latency: bool = True,
        name: str = "flow",
        track: str = "fabric",
        group: int = -1,
        multiplicity: int = 1,
        key: int = 0,
    ) -> simpy.Event:
        """Start moving ``nbytes`` and return an event that succeeds on arrival.

        Args:
            src, dst: endpoints (node ids), routed on the topology; or ``src`` is a
                full path (list of node ids) and ``dst`` is None.
            nbytes: payload bytes (per member when ``multiplicity`` > 1).
            efficiency: payload bytes per wire byte, relative to the links' effective
                capacity (a protocol's efficiency, in (0, 1]).
            max_rate: cap on the payload rate of the transfer (bytes/s).
            extra_latency: seconds added after the last byte (NIC, protocol).
            link_latency: add the path's link latencies.
            name, track: trace entry of the transfer.
            group: coupled-group id from :meth:`new_group`, or -1.
            multiplicity: identical flows this call stands for.
            key: ECMP hash key with ``multipath="hash"``.
        """
        if dst is None:
            path = list(src)  # type: ignore[arg-type]
            if len(path) < 2:
                return self._instant(name, extra_latency, track)
            seg = self.segment(("path", tuple(path)), [path])
        else:
            if src == dst:
                return self._instant(name, extra_latency, track)
            seg = self.pair_segment(str(src), dst, key)
        segs = np.array([[seg] + [-1] * (_K - 1)], dtype=np.int64)
        return self.start_rows(segs, np.array([float(nbytes)]), efficiency=efficiency, max_rate=max_rate,
                               extra_latency=extra_latency, link_latency=link_latency, name=name, track=track,
                               group=group, multiplicity=np.array([multiplicity]))

    def _instant(self, name: str, latency: float, track: str) -> simpy.Event:
        ev = self.env.timeout(latency)
        if self._trace is not None:
            t0 = self.env.now
            ev.callbacks.append(lambda _e: self._trace(name, t0, self.env.now, track))  # type: ignore[misc]
        return ev

    def start_rows(
        self, segs: np.ndarray, nbytes: np.ndarray, *, efficiency: float = 1.0,
        max_rate: float | np.ndarray = _INF,
        extra_latency: float = 0.0, link_latency: bool = True, name: str = "flows", track: str = "fabric",
        group: int = -1, multiplicity: np.ndarray | None = None, merge: bool = True, cache: Any = None,
        classes: Any = None,
    ) -> simpy.Event:
        """Start a batch of flows; the event succeeds when the last one has arrived.

        ``segs[k]``: the segment ids of flow k's route (rows x 3, -1 padded, from
        :meth:`route_segments`, :meth:`pair_segment` or :meth:`segment`);
        ``nbytes[k]``: its payload bytes (per member); ``multiplicity[k]``: identical
        flows it stands for. With ``merge``, flows with the same route and size are
        merged into one row (a flow class) with the summed multiplicity.
        ``max_rate`` caps each flow's payload rate (one figure, or one per flow); ``group`` couples all rows.
        ``cache``: a hashable key the caller guarantees stands for these exact arguments (but ``group`` and
        ``name``): the checked, merged rows are kept under it and a later call with the same key skips the
        checks and the merge (a repeated collective phase: O(rows) copies instead of a sort).
        ``classes``: a hashable key the caller guarantees stands for these exact arguments but ``nbytes``,
        ``group`` and ``name`` (a materialized collective's rows at one checkpoint of its trajectory): the
        partition of its flow classes is kept under it and reused when the bytes order the rows alike
        (:meth:`_form_classes`).
        """
        hit = self._batch_cache.get(cache) if cache is not None else None
        if hit is not None:
            return self._start_prepared(*hit, name=name, track=track, group=group, cached=True)
        if not (0 < efficiency <= 1.0):
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        segs = np.asarray(segs, dtype=np.int64).reshape(-1, _K)
        nb = np.asarray(nbytes, dtype=float).reshape(-1)
        if len(nb) != len(segs):
            raise ValueError("segs and nbytes differ in length")
        if len(nb) and ((nb < 0).any() or not np.isfinite(nb).all()):
            raise ValueError("nbytes must be finite and >= 0")
        mult = np.ones(len(nb)) if multiplicity is None else np.asarray(multiplicity, dtype=float).reshape(-1)
        mr = np.broadcast_to(np.asarray(max_rate, dtype=float), nb.shape)
        if len(mr) and (np.isnan(mr).any() or (mr <= 0).any()):
            raise ValueError("max_rate must be > 0 (inf: no cap)")
        wcap = np.where(np.isfinite(mr), mr / efficiency, _INF)
        if len(mult) and (mult < 1).any():
            raise ValueError("multiplicity must be >= 1")
        self._flush_segments()
        nlk, slat = self._seg_arrays()
        has_links = nlk[segs[:, 0]] > 0  # (by column: a sum along the narrow axis is slow)
        for k in range(1, _K):
            has_links |= nlk[segs[:, k]] > 0
        wire = nb / efficiency
        lat = (slat[segs].sum(axis=1) if link_latency else np.zeros(len(nb))) + extra_latency
        moving = has_links & (wire > 0)
        nflows = float(mult.sum())
        still = float(lat[~moving].max()) if (~moving).any() else 0.0
        idx = _nzf(moving)
        segs, wire, lat, mult, wcap = segs[idx], wire[idx], lat[idx], mult[idx], wcap[idx]
        if merge and len(idx) > 1:
            # flows with the same route and size become one row; only when some share a route (a cheap 1-D test)
            us = np.unique(((segs[:, 0] + 1) << 42) | ((segs[:, 1] + 1) << 21) | (segs[:, 2] + 1)) \
                if len(self._seg_lat) < 0x1FFFFF else np.zeros(0)
            if len(us) < len(idx):
                key = np.column_stack([segs.astype(float), wire, lat, wcap])
                uk, inv = np.unique(key, axis=0, return_inverse=True)
                if len(uk) < len(idx):
                    inv = inv.reshape(-1)
                    mult = np.bincount(inv, weights=mult, minlength=len(uk))
                    segs, wire, lat = uk[:, :_K].astype(np.int64), uk[:, _K], uk[:, _K + 1]
                    wcap = uk[:, _K + 2]
        prep = (segs, wire, lat, mult, wcap, nflows, still)
        if cache is not None:
            if len(self._batch_cache) >= self._BATCH_CACHE:
                self._batch_cache.clear()
            self._batch_cache[cache] = prep
        if classes is not None and len(idx) < len(nb):  # (the key stands for every row: all must move)
            classes = None
        return self._start_prepared(*prep, name=name, track=track, group=group, cached=cache is not None,
                                    classes=classes)

    _BATCH_CACHE = 4096
    """Prepared batches kept by :meth:`start_rows`' ``cache`` key (cleared when full)."""

    def _start_prepared(self, segs: np.ndarray, wire: np.ndarray, lat: np.ndarray, mult: np.ndarray,
                        wcap: np.ndarray, nflows: float, still: float, *, name: str, track: str,
                        group: int, cached: bool = False, classes: Any = None) -> simpy.Event:
        """Start checked, merged rows (moving ones only) as one batch; ``still``: the latest end of the
        batch's flows that move no bytes (their latency)."""
        env = self.env
        self.n_flows += int(nflows)
        b = len(self._b_event)
        ev = env.event()
        self._b_event.append(ev)
        self._b_meta.append((name, env.now, track))
        if b >= len(self._b_left):
            nn = max(2 * len(self._b_left), 64)
            self._b_left = np.concatenate([self._b_left, np.zeros(nn - len(self._b_left), dtype=np.int64)])
            self._b_deadline = np.concatenate([self._b_deadline, np.zeros(nn - len(self._b_deadline))])
            self._b_start = np.concatenate([self._b_start, np.zeros(nn - len(self._b_start))])
        self._b_start[b] = env.now
        self._b_deadline[b] = env.now + still
        if not len(wire):
            self._b_left[b] = 0
            self._fire(b)
            return ev
        if self._holders:
            self._wake_holders(segs)
        cls_of: np.ndarray | None = None
        if self.flow_classes and group < 0 and len(wire) >= self._CLASS_MIN:
            plan = self._cls_plans.get(id(segs))
            if plan is None or plan[0] is not segs:  # (the plan holds ``segs``: its id stays unique)
                plan = (segs, *self._form_classes(segs, wire, lat, mult, wcap, classes))
                if cached:  # a prepared batch that repeats (start_rows' ``cache``)
                    if len(self._cls_plans) >= self._BATCH_CACHE:
                        self._cls_plans.clear()
                    self._cls_plans[id(segs)] = plan
            if plan[6]:
                segs, wire, lat, mult, wcap = plan[1:6]
                mem = plan[6]
                if any(fc.split is not None for fc in mem):  # start as the sub-classes it split into last time
                    segs, wire, lat, mult, wcap, mem = self._learned(segs, wire, lat, mult, wcap, mem)
                cls_of = np.full(len(wire), -1, dtype=np.int64)
                pos = len(wire) - len(mem)  # the class rows come last
                for j, fc in enumerate(mem):
                    self._cls[self._next_cls] = fc
                    cls_of[pos + j] = self._next_cls
                    self._next_cls += 1
                self.n_class_rows += len(mem)
        k = len(wire)
        self._b_left[b] = k
        self._advance()
        p = self._rows
        s0 = p.size
        p.grow(s0 + k)
        sl = slice(s0, s0 + k)
        p.rem[sl] = wire
        p.t0[sl] = env.now
        p.tbeg[sl] = env.now
        p.tend[sl] = _INF
        p.tcand[sl] = np.where(wire <= _REM_EPS, -_INF, _INF)
        p.comp[sl] = -1
        p.rate[sl] = 0.0
        p.cap[sl] = wcap
        p.mult[sl] = mult
        p.lat[sl] = lat
        p.group[sl] = group
        p.batch[sl] = b
        p.active[sl] = True
        self._A = None
        p.set_seg(sl, segs)
        p.bott[sl] = -2
        p.cls[sl] = -1 if cls_of is None else cls_of
        p.size = s0 + k
        self._n_active += k
        self.n_rows += k
        self._arrived.append(np.arange(s0, s0 + k))
        self._seg_flows(segs, mult, +1.0)
        self._sample_peak(self._mark_live(segs))
        self._request_solve()
        return ev

    def _sample_peak(self, lk: np.ndarray) -> None:
        """At a batch start on links ``lk``: the peak flow count of every link, ``max(peak, rint(flow count))``,
        taken on ``lk`` and the links a class split changed since the last sample (every link after
        :meth:`reset_peak_flows`). Exact: elsewhere the flow counts only fell since the last sample (rows
        ending), so the maximum is unchanged there. O(those links), not O(links)."""
        pf, nf = self.peak_flows, self._nflows
        if self._peak_all:
            self._peak_all = False
            self._peak_more.clear()
            np.maximum(pf, np.rint(nf).astype(np.int64), out=pf)
            return
        if self._peak_more:
            lk = np.concatenate([lk, *self._peak_more])
            self._peak_more.clear()
        pf[lk] = np.maximum(pf[lk], np.rint(nf[lk]).astype(np.int64))

    def reset_peak_flows(self) -> None:
        """Zero :attr:`peak_flows` (a probe's or a memo run's own peak); the next batch start samples every link."""
        self.peak_flows[:] = 0
        self._peak_all = True

    # ------------------------------------------------------------ flow classes
    _CLASS_MIN = 16
    """Rows of a batch that form a flow class: at least this many with equal bytes, latency, cap and segment
    count (smaller sets stay plain rows: a class saves less than its check costs)."""

    def _form_classes(self, segs: np.ndarray, wire: np.ndarray, lat: np.ndarray, mult: np.ndarray,
                      wcap: np.ndarray, key: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                  np.ndarray, list[_FlowClass]]:
        """A batch's rows with equal (bytes, latency, cap, segment count), when at least :data:`_CLASS_MIN`,
        become one class row each (their summed multiplicity on a class segment), after the rows that stay.
        Returns the new rows and the classes (none: no class). O(k log k) for the k rows, once per prepared batch
        (kept by its ``segs``); a new class segment O(their entries + links) once (cached by its members).
        ``key`` (:meth:`start_rows`' ``classes``): the partition is kept under it; a later batch with that key
        reuses it when its bytes, in the kept order, still ascend with equal neighbours exactly where they were
        equal (then that order is the sort's, and every group the same): O(k), no sort and no hashing."""
        if key is not None:
            part = self._cls_parts.get(key)
            if part is not None:
                got = self._reuse_partition(part, segs, wire, lat, mult, wcap)
                if got is not None:
                    return got
        nseg = _nseg(segs)
        order = np.lexsort((nseg, wcap, lat, wire))
        cols = (wire[order], lat[order], wcap[order], nseg[order])
        new = np.ones(len(order), dtype=bool)
        same_w = cols[0][1:] == cols[0][:-1]
        new[1:] = ~same_w | (cols[1][1:] != cols[1][:-1]) | (cols[2][1:] != cols[2][:-1]) | \
            (cols[3][1:] != cols[3][:-1])
        st = _nzf(new)
        cnt = np.diff(np.append(st, len(order)))
        big = _nzf(cnt >= self._CLASS_MIN)
        mem: list[_FlowClass] = []
        if not big.size:
            return segs, wire, lat, mult, wcap, mem
        isbig = np.zeros(len(st), dtype=bool)  # per group (a table: ``np.isin`` sorts)
        isbig[big] = True
        inbig = np.zeros(len(order), dtype=bool)
        inbig[order] = isbig[np.cumsum(new) - 1]
        keep = _nzf(~inbig)
        groups = [np.sort(order[st[g]:st[g] + cnt[g]]) for g in big.tolist()]
        for idx in groups:
            mem.append(self._new_class(segs[idx], mult[idx], lat[idx], wcap[idx]))
        if key is not None:
            if len(self._cls_parts) >= self._BATCH_CACHE:
                self._cls_parts.clear()
            self._cls_parts[key] = (order, same_w, keep, groups, mem)
        return self._class_rows(segs, wire, lat, mult, wcap, keep, groups, mem)

    def _reuse_partition(self, part: tuple[Any, ...], segs: np.ndarray, wire: np.ndarray, lat: np.ndarray,
                         mult: np.ndarray, wcap: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                                       np.ndarray, list[_FlowClass]] | None:
        """:meth:`_form_classes` from a kept partition (order, equal neighbours' bytes, rows left, groups, their
        classes), or None when ``wire`` orders the rows otherwise. Fresh classes (nothing learned) on the kept
        class segments and members."""
        order, same_w, keep, groups, proto = part
        if len(order) != len(wire):
            return None
        w = wire[order]
        if not ((w[1:] >= w[:-1]).all() and np.array_equal(w[1:] == w[:-1], same_w)):
            return None
        mem = [_FlowClass(fc.segs, fc.mult, fc.lat, fc.cap, fc.sid, row_parts=fc.row_parts) for fc in proto]
        return self._class_rows(segs, wire, lat, mult, wcap, keep, groups, mem)

    @staticmethod
    def _class_rows(segs: np.ndarray, wire: np.ndarray, lat: np.ndarray, mult: np.ndarray, wcap: np.ndarray,
                    keep: np.ndarray, groups: list[np.ndarray], mem: list[_FlowClass]
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, list[_FlowClass]]:
        """The rows ``keep`` then one class row per class of ``mem`` (members ``groups``, their first's bytes)."""
        o_s, o_w, o_l, o_m, o_c = [segs[keep]], [wire[keep]], [lat[keep]], [mult[keep]], [wcap[keep]]
        for idx, fc in zip(groups, mem):
            for o, x in zip((o_s, o_m, o_l, o_c), fc.row()):
                o.append(x)
            o_w.append(wire[idx[:1]])
        cat = np.concatenate
        return cat(o_s), cat(o_w), cat(o_l), cat(o_m), cat(o_c), mem

    def _learned(self, segs: np.ndarray, wire: np.ndarray, lat: np.ndarray, mult: np.ndarray, wcap: np.ndarray,
                 mem: list[_FlowClass]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                                 list[_FlowClass]]:
        """A prepared batch's rows (the class rows last, one per ``mem``) with each class that was split at an
        earlier start replaced by what it split into (recursively): its plain member rows, then its
        sub-classes. Still exact: the sub-classes are checked at every solve like any class."""
        nc = len(mem)
        base = len(wire) - nc
        o_s, o_w, o_l, o_m, o_c = [segs[:base]], [wire[:base]], [lat[:base]], [mult[:base]], [wcap[:base]]
        out: list[tuple[_FlowClass, float]] = []

        def expand(fc: _FlowClass, w: float) -> None:
            if fc.split is None:
                out.append((fc, w))
                return
            plain, subs = fc.split
            o_s.append(fc.segs[plain])
            o_w.append(np.full(len(plain), w))
            o_l.append(fc.lat[plain])
            o_m.append(fc.mult[plain])
            o_c.append(fc.cap[plain])
            for sub in subs:
                expand(sub, w)

        for j, fc in enumerate(mem):
            expand(fc, float(wire[base + j]))
        for fc, w in out:
            for o, x in zip((o_s, o_m, o_l, o_c), fc.row()):
                o.append(x)
            o_w.append(np.full(1, w))
        cat = np.concatenate
        return cat(o_s), cat(o_w), cat(o_l), cat(o_m), cat(o_c), [fc for fc, _ in out]

    def _new_class(self, ms: np.ndarray, mm: np.ndarray, ml: np.ndarray, mc: np.ndarray) -> _FlowClass:
        """The flow class of member rows with segments ``ms``, multiplicity ``mm``, latency ``ml`` (s) and cap
        ``mc`` (bytes/s), on its class segment."""
        return _FlowClass(ms, mm, ml, mc, self._class_segment(ms, mm))

    def _class_segment(self, ms: np.ndarray, mm: np.ndarray) -> int:
        """The class segment of member rows ``ms`` (segments) x ``mm`` (multiplicity): their links, each
        weighted by the members' summed weight on it over the summed multiplicity M (so a rate r on the class
        row loads each link as its members would), with a flow count of (members on it) / M."""
        h = hashlib.sha256(np.ascontiguousarray(ms, dtype=np.int64).tobytes())
        h.update(np.ascontiguousarray(mm, dtype=float).tobytes())
        key = ("class", h.digest())
        sid = self._seg_ids.get(key)
        if sid is not None:
            return sid
        self._flush_segments()
        mk = np.repeat(mm, _K)
        W, C = self._to_links_many(ms.reshape(-1), [mk, mk], [True, False])
        lk = _nzf(C > 0)
        M = float(mm.sum())
        sid = len(self._seg_lat)
        self._se_parts.append((np.full(len(lk), sid, dtype=np.int64), lk, W[lk] / M, C[lk] / M))
        self._seg_lat.append(0.0)
        self._seg_cap.append(_INF)
        self._seg_nlinks.append(len(lk))
        self._seg_ids[key] = sid
        self._has_cls = True
        return sid

    def _class_checks(self, R: np.ndarray, C: np.ndarray) -> list[tuple[int, np.ndarray]]:
        """The flow-class rows ``R[C]`` that fail the per-flow max-min check (:meth:`_class_ok`), as (position
        in ``R``, split key). A class row at its cap passes (every member is at its cap); the per-link tables
        the other checks share (:meth:`_link_tables`) are built once, at the first of them."""
        p = self._rows
        tabs: tuple[np.ndarray, np.ndarray] | None = None
        bad = []
        for j in C.tolist():
            c = int(R[j])
            if p.cap[c] <= p.rate[c] * (1.0 + self._SAT_TOL):  # at its cap: the parallel fill's cap test
                continue
            if tabs is None:
                tabs = self._link_tables()
            mk = self._class_ok(c, *tabs)
            if mk is not None:
                bad.append((j, mk))
        return bad

    def _link_tables(self) -> tuple[np.ndarray, np.ndarray]:
        """Per link, for the flow-class checks after a solve: whether the fill's saturation test holds (never
        on a never-binding link), and the rate of the fastest active row crossing it (bytes/s; -inf: none).
        O(links + the active rows' distinct segments' entries), once per solve instead of per check."""
        p = self._rows
        sat = self._load >= self.capacity * (1.0 - self._SAT_TOL)
        if self._free_on:
            sat &= self._bindable
        ai = self._active_idx()
        segs = p.seg[ai].reshape(-1)
        ok = segs >= 0
        us, inv = self._cpx(segs[ok], len(self._seg_lat))
        smax = np.full(len(us), -_INF)
        np.maximum.at(smax, inv, p.rate[ai].repeat(_K)[ok])
        st = self._se_off[us]
        ln = self._se_off[us + 1] - st
        fastest = np.full(len(self.links), -_INF)
        np.maximum.at(fastest, self._se_link[_ranges(st, ln)], smax.repeat(ln))
        return sat, fastest

    def _class_ok(self, c: int, sat: np.ndarray, fastest: np.ndarray) -> np.ndarray | None:
        """``None`` when class row ``c``'s rate (below its cap) is every member's per-flow max-min rate: every
        member crosses a saturated (binding) link on which no active row runs faster (its bottleneck); ``sat``
        and ``fastest``: :meth:`_link_tables`. With the per-link loads those of the members (the class
        segment's weights), that is the per-flow max-min certificate, and the max-min allocation is unique.
        Otherwise a key per member for the split: members with equal counts of such links, of saturated links
        and of links with a faster row among their own stay together. O(n + entries of the members' segments)."""
        p = self._rows
        r = float(p.rate[c])
        fc = self._cls[int(p.cls[c])]
        if fc.tables is None:  # tables of the members' segments, built at the first check (shared by the starts)
            fc.tables = self._cls_tables.get(fc.sid)
        if fc.tables is None:  # (a class segment stands for its members' segments: a materialized class reuses them)
            flat = fc.segs.reshape(-1)
            ok = flat >= 0
            us = np.unique(flat[ok])
            invf = np.full(flat.size, len(us), dtype=np.int64)
            invf[ok] = np.searchsorted(us, flat[ok])
            st = self._se_off[us]
            ln = self._se_off[us + 1] - st
            e = _ranges(st, ln)
            eu = np.repeat(np.arange(len(us)), ln)
            inv2 = invf.reshape(fc.segs.shape)
            fc.tables = (inv2, self._se_link[e], eu, len(us) + 1, [np.unique(inv2[:, k]) for k in range(_K)])
            if len(self._cls_tables) >= self._BATCH_CACHE:
                self._cls_tables.clear()
            self._cls_tables[fc.sid] = fc.tables
        inv, el, eu, nu, cols = fc.tables  # (entries of registered segments never move: new ones are appended)
        es = sat[el]  # (the members' links are the class segment's)
        thr = r * (1.0 + self._SAT_TOL)
        # per distinct segment (last: the padding, 0): its saturated links with no faster row (``fastest`` is a
        # rate or -inf, never nan: ``<=`` is the negation of ``>``)
        gs = np.bincount(eu, weights=es & (fastest[el] <= thr), minlength=nu)
        for u in cols:
            if np.count_nonzero(gs[u]) == len(u):
                return None  # every member's k-th segment has such a link: O(distinct segments), not O(members)
        good = _row_sum(gs, inv)
        if np.count_nonzero(good) == len(good):
            return None
        ef = fastest[el] > thr
        ns = _row_sum(np.bincount(eu, weights=es, minlength=nu), inv)
        nf = _row_sum(np.bincount(eu, weights=ef, minlength=nu), inv)
        return ((good * 64 + ns) * 64 + nf).astype(np.int64)

    def _split_class(self, c: int, key: np.ndarray) -> None:
        """Class row ``c`` split by the members' ``key``: each set of at least :data:`_CLASS_MIN` members with
        one key becomes a class of its own, the rest member rows; all with the class's bytes left (unrated:
        they arrive now, so the solve that follows re-rates their component). A class whose members all have
        one key is split into member rows (the split always refines)."""
        p = self._rows
        now = self.env.now
        fc = self._cls.pop(int(p.cls[c]))
        ms, mm, ml, mc = fc.segs, fc.mult, fc.lat, fc.cap
        rem = float(p.rem[c] - p.rate[c] * (now - p.t0[c]))
        b = int(p.batch[c])
        tbeg = float(p.tbeg[c])
        seg1, m1 = p.seg[c:c + 1].copy(), p.mult[c:c + 1].copy()
        self._seg_flows(seg1, m1, -1.0)
        s1, d1 = seg1.reshape(-1), np.repeat(p.rate[c:c + 1] * m1, _K)
        if self._dense_entries(s1.size):
            self._load -= self._to_links(s1, d1)
            self._touch()
        else:  # the class segment's links only (elsewhere the sum is +0.0: what subtracting it leaves)
            xc, _, (v,) = self._link_sums(s1, [d1], [True])
            self._load[xc.ul] -= v
            self._touch(xc.ul)
        self._unlabel(p.comp[c:c + 1])
        p.active[c] = False
        p.rate[c] = 0.0
        p.rem[c] = 0.0
        p.tend[c] = _INF
        p.tcand[c] = _INF
        p.cls[c] = -1
        p.comp[c] = -1
        self._n_active -= 1
        subs: list[_FlowClass] = []
        uk, inv, cnt = np.unique(key, return_inverse=True, return_counts=True)
        inv = inv.reshape(-1)
        if len(uk) > 1:
            big = cnt >= self._CLASS_MIN
        else:
            big = np.zeros(1, dtype=bool)
        plain = _nzf(~big[inv])
        o_s, o_m, o_l, o_c = [ms[plain]], [mm[plain]], [ml[plain]], [mc[plain]]
        o_id = [np.full(len(plain), -1, dtype=np.int64)]
        fc.split = (plain, subs)  # learned: a later start of the same prepared batch begins split like this
        for g in _nzf(big).tolist():
            idx = _nzf(inv == g)
            sub = self._new_class(ms[idx], mm[idx], ml[idx], mc[idx])
            subs.append(sub)
            self._cls[self._next_cls] = sub
            for o, x in zip((o_s, o_m, o_l, o_c), sub.row()):
                o.append(x)
            o_id.append(np.array([self._next_cls], dtype=np.int64))
            self._next_cls += 1
            self.n_class_rows += 1
        cat = np.concatenate
        segs, mult, lat, wcap, cid = cat(o_s), cat(o_m), cat(o_l), cat(o_c), cat(o_id)
        k = len(mult)
        self._b_left[b] += k - 1
        s0 = p.size
        p.grow(s0 + k)
        sl = slice(s0, s0 + k)
        p.rem[sl] = rem
        p.t0[sl] = now
        p.tbeg[sl] = tbeg
        p.tend[sl] = _INF
        p.tcand[sl] = -_INF if rem <= _REM_EPS else _INF
        p.comp[sl] = -1
        p.rate[sl] = 0.0
        p.cap[sl] = wcap
        p.mult[sl] = mult
        p.lat[sl] = lat
        p.group[sl] = -1
        p.batch[sl] = b
        p.active[sl] = True
        p.set_seg(sl, segs)
        p.bott[sl] = -2
        p.cls[sl] = cid
        p.size = s0 + k
        self._n_active += k
        self.n_rows += k
        self._A = None
        self._arrived.append(np.arange(s0, s0 + k))
        self._seg_flows(segs, mult, +1.0)
        self._peak_more.append(self._seg_links(seg1))  # (the members' links are the class segment's)
        self.n_class_splits += 1

    def _fire(self, b: int) -> None:
        """Batch ``b`` has no bytes left: succeed its event at its deadline."""
        ev = self._b_event[b]
        name, start, track = self._b_meta[b]
        self._b_event[b] = None

        def fire(_e: Any = None) -> None:
            if self._trace is not None:
                self._trace(name, start, self.env.now, track)
            assert ev is not None
            ev.succeed(None)

        delay = float(self._b_deadline[b]) - self.env.now
        if delay > 0:
            self.env.timeout(delay).callbacks.append(fire)
        else:
            fire()

    def _seg_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """Links and latency per segment as arrays, a 0 appended (for the -1 padding); rebuilt only when
        segments were added (segments are append-only), not per call: O(1) per batch instead of O(segments)."""
        n = len(self._seg_lat)
        if self._seg_arr is None or self._seg_arr[0] != n:
            self._seg_arr = (n, np.append(np.asarray(self._seg_nlinks, dtype=np.int64), 0),
                             np.append(np.asarray(self._seg_lat, dtype=float), 0.0))
        return self._seg_arr[1], self._seg_arr[2]

    def _flush_segments(self) -> None:
        if self._se_parts:
            self._se_seg = np.concatenate([self._se_seg, *(x[0] for x in self._se_parts)])
            self._se_link = np.concatenate([self._se_link, *(x[1] for x in self._se_parts)])
            self._se_w = np.concatenate([self._se_w, *(x[2] for x in self._se_parts)])
            self._se_n = np.concatenate([self._se_n, *(x[3] if len(x) > 3 else np.ones(len(x[1]))
                                                       for x in self._se_parts)])
            self._se_parts.clear()
            nseg = len(self._seg_lat)
            self._se_off = np.searchsorted(self._se_seg, np.arange(nseg + 1)).astype(np.int64)
            self._seg_m = np.concatenate([self._seg_m, np.zeros(nseg - len(self._seg_m))])

    def _dense_entries(self, k: int) -> bool:
        """Sum ``k`` segment values over every registered segment entry (the per-segment sums gathered onto all
        entries, one ``bincount`` by link: O(k + segments + entries + links) in 3 numpy calls) rather than over
        the entries of the distinct segments among them (a compaction and a ranges expansion: about 12 calls).
        Both add, per link, its segments' terms in ascending segment order; the absent segments' terms are
        +0.0, so the sums are the same floats. Measured break-even (1,300 segments, 19k entries, 11.5k links):
        k about entries / 32 (37 us either way); a completion of 1-2 rows (k = 3-6) keeps the compaction (12 us)."""
        return 32 * k >= len(self._se_link)

    def _link_matrix(self, weighted: bool) -> Any:
        """Links x segments sparse matrix (CSR, segments ascending in each link's row) of the registered
        segment entries: their weights, or ones. Its product with per-segment values adds, per link, the terms
        in ascending segment order from 0.0, as ``np.bincount`` over the entries does: the same floats (one
        compiled pass, no gather). Rebuilt when segments were added: O(entries log entries)."""
        n = len(self._se_link)
        small = (n < _SMALL_LINK_MATRIX and self._lm_small_work < _SMALL_LINK_WORK
                 and "scipy.sparse" not in sys.modules)
        key = (n, len(self._seg_lat), small)
        if small:
            self._lm_small_work += n
        if self._lm is None or self._lm[0] != key:
            nl, nseg = len(self.links), len(self._seg_lat)
            order = np.argsort(self._se_link, kind="stable")
            idx = self._se_seg[order].astype(np.int64)
            if small:
                rows = self._se_link[order]
                w: Any = _SmallLinkMatrix(rows, idx, self._se_w[order], nl)
                one: Any = _SmallLinkMatrix(rows, idx, self._se_n[order] if self._has_cls else None, nl)
            else:
                from scipy.sparse import csr_array

                indptr = np.zeros(nl + 1, dtype=np.int64)
                np.cumsum(np.bincount(self._se_link, minlength=nl), out=indptr[1:])
                w = csr_array((self._se_w[order], idx, indptr), shape=(nl, nseg))
                one = csr_array((self._se_n[order], idx, indptr), shape=(nl, nseg))
            self._lm = (key, w, one)
            self.n_link_matrix += 1
        return self._lm[1] if weighted else self._lm[2]

    _CACHE_BYTES = 64_000_000
    """Bytes :meth:`_expansion` keeps (its keys, arrays and their objects, :data:`_EXP_OVERHEAD` each; cleared
    when full)."""
    _EXP_OVERHEAD = 1536
    """Bytes a kept expansion holds besides its arrays' data (the key's and the arrays' object headers, the dict
    entry), measured with tracemalloc."""
    _EXPANSION_LEN = 16384
    """Longer segment lists are expanded but not kept (a big collective's rows: rarely repeated, costly to hash)."""

    def _expansion(self, segs: np.ndarray) -> _Expansion:
        """The :class:`_Expansion` of the segment list ``segs`` (flat, -1 padded; its segments registered and
        flushed), cached by the list's bytes: a segment's entries never change once registered. A miss costs
        O(len + its entries) numpy (about 20 calls), a hit one hash of the list."""
        if segs.dtype != np.int64:
            segs = segs.astype(np.int64)
        key = segs.tobytes() if segs.size <= self._EXPANSION_LEN else None
        x = self._exp_cache.get(key) if key is not None else None
        if x is not None:
            return x
        ok = segs >= 0
        sel = None if ok.all() else _nzf(ok)
        us, inv = self._cpx(segs if sel is None else segs[sel], len(self._seg_lat))
        st = self._se_off[us]
        ln = self._se_off[us + 1] - st
        e = _ranges(st, ln)
        le = self._se_link[e]
        ul, li = self._cpx(le, len(self.links))
        x = _Expansion(sel, us, inv, ln, self._se_w[e], self._se_n[e], ul, li)
        if key is not None:
            nb = len(key) + self._EXP_OVERHEAD + sum(a.nbytes for a in (us, inv, ln, x.we, x.ne, ul, li))
            nb += 0 if sel is None else sel.nbytes
            self._exp_bytes += nb
            if self._exp_bytes > self._CACHE_BYTES:
                self._exp_cache.clear()
                self._exp_bytes = nb
            self._exp_cache[key] = x
        return x

    def _link_sums(self, segs: np.ndarray, vals: Sequence[np.ndarray], weighted: Sequence[bool]
                   ) -> tuple[_Expansion, list[np.ndarray], list[np.ndarray]]:
        """Sums of value vectors ``vals`` (one value per entry of the flat segment list ``segs``, -1 padding
        ignored) on the list's :class:`_Expansion`: per vector, its per-segment sums (over ``us``) and its per-link
        sums (over ``ul``; x the link's weight in each segment where ``weighted``). Each per-segment sum adds its
        entries in list order, each per-link sum its terms in ascending segment order, from 0.0: the floats a
        ``np.bincount`` over every segment or link gives at those places (+0.0 elsewhere)."""
        x = self._expansion(segs)
        seg_sums, link_sums = [], []
        for val, wt in zip(vals, weighted):
            v = np.bincount(x.inv, weights=val if x.sel is None else val[x.sel], minlength=len(x.us))
            w = v.repeat(x.ln)
            if wt:
                w = w * x.we
            elif self._has_cls:
                w = w * x.ne
            seg_sums.append(v)
            link_sums.append(np.bincount(x.li, weights=w, minlength=len(x.ul)))
        return x, seg_sums, link_sums

    def _row_link_sums(self, segs: np.ndarray, P: np.ndarray) -> tuple[_Expansion, np.ndarray, np.ndarray]:
        """:meth:`_link_sums` of ``nv`` per-row value vectors ``P`` (nv x rows, a row's value on each of its
        :data:`_K` slots of ``segs``; the first vector unweighted, the others weighted) in two ``bincount`` calls
        instead of ``2 nv``: vector i's indices are offset by i bins, so each bin still adds its own terms in entry
        order from 0.0 (the same floats). Returns the expansion, the per-segment sums (nv x ``us``) and the
        per-link sums (nv x ``ul``). O(nv (k + e) + l) numpy in about 8 calls."""
        x = self._expansion(segs.reshape(-1))
        nv = len(P)
        key = (nv, self._has_cls)
        t = x.tiled.get(key)
        if t is None:
            t = self._tile(x, nv, segs.size)
            if segs.size <= self._EXPANSION_LEN:  # (else the expansion is not kept: nor are they)
                x.tiled[key] = t
                self._exp_bytes += sum(a.nbytes for a in t if a is not None)
        sel_t, inv_t, ln_t, li_t, fac = t
        vk = P.reshape(-1).repeat(_K)  # (the rows' slots, vector after vector)
        if sel_t is not None:
            vk = vk[sel_t]
        nu, nl = len(x.us), len(x.ul)
        w = np.bincount(inv_t, weights=vk, minlength=nv * nu)
        v = w.reshape(nv, nu)
        w = w.repeat(ln_t)
        w *= fac  # (x 1.0 where the original multiplied by nothing: the same floats)
        return x, v, np.bincount(li_t, weights=w, minlength=nv * nl).reshape(nv, nl)

    def _tile(self, x: _Expansion, nv: int, k: int) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray,
                                                              np.ndarray]:
        """Flat indices of :meth:`_row_link_sums` for ``nv`` vectors on expansion ``x`` of a ``k``-long list (kept
        slots, segment positions, entries per segment, link positions: offset by vector) and each link entry's
        factor (the first vector: the class share, or 1; the others: the link weight)."""
        off = np.arange(nv)[:, None]
        sel_t = None if x.sel is None else (x.sel + k * off).reshape(-1)
        inv_t = (x.inv + len(x.us) * off).reshape(-1)
        li_t = (x.li + len(x.ul) * off).reshape(-1)
        ln_t = np.tile(x.ln, nv)
        fac = np.empty((nv, len(x.we)))
        fac[0] = x.ne if self._has_cls else 1.0
        fac[1:] = x.we
        return sel_t, inv_t, ln_t, li_t, fac.reshape(-1)

    def _to_links(self, segs: np.ndarray, vals: np.ndarray, weighted: bool = True) -> np.ndarray:
        """Per-link sum of ``vals[k]`` put on segment ``segs[k]`` (x the link's weight in it); ``segs`` may hold
        the -1 padding (ignored)."""
        return self._to_links_many(segs, [vals], [weighted])[0]

    def _to_links_many(self, segs: np.ndarray, vals: Sequence[np.ndarray], weighted: Sequence[bool]
                       ) -> list[np.ndarray]:
        """:meth:`_to_links` of several value vectors over the same ``segs``, the segments' entries expanded once
        (the same sums, in the same order)."""
        nl = len(self.links)
        if self._dense_entries(segs.size):
            s1, ns1 = segs + 1, len(self._seg_lat) + 1
            return [np.asarray(self._link_matrix(wt) @ np.bincount(s1, weights=val, minlength=ns1)[1:])
                    for val, wt in zip(vals, weighted)]
        x, _, sums = self._link_sums(segs, vals, weighted)
        out = []
        for s in sums:
            full = np.zeros(nl)
            full[x.ul] = s
            out.append(full)
        return out

    def _seg_flows(self, segs: np.ndarray, mult: np.ndarray, sign: float) -> None:
        """Add (sign +1) or remove (-1) rows' multiplicity on their segments and links' flow counts."""
        s = segs.reshape(-1)
        m = mult.repeat(_K)
        self._flush_segments()
        if self._dense_entries(s.size):  # the per-segment sums once, for both counters (same floats)
            v = np.bincount(s + 1, weights=m, minlength=len(self._seg_lat) + 1)[1:]
            self._seg_m += sign * v
            self._nflows += sign * np.asarray(self._link_matrix(False) @ v)
            self._touch()
            return
        # only the touched segments and links (elsewhere the sums are +0.0, which adds nothing)
        x, (v,), (c,) = self._link_sums(s, [m], [False])
        self._seg_m[x.us] += sign * v
        self._nflows[x.ul] += sign * c
        self._touch(x.ul)

    # ----------------------------------------------------------------- solver
    def _request_solve(self) -> None:
        """Re-solve once for all arrivals at this instant."""
        if self._solve_pending:
            return
        self._solve_pending = True
        self._gen += 1  # cancels the pending completion timeout
        ev = self.env.timeout(0.0)
        ev.callbacks.append(self._deferred_solve)

    def _deferred_solve(self, _ev: Any) -> None:
        self._solve_pending = False
        self._advance()
        self._complete_finished()
        self._solve_and_schedule()

    def _advance(self) -> None:
        """Move the link counters forward to ``env.now`` (rows' bytes are lazy: see :class:`_Rows`)."""
        now = self.env.now
        dt = now - self._t_last
        if dt > 0 and self._n_active:
            live = self._live_idx
            if live is None:
                live = self._live_idx = _nzf(self._live)
            if 4 * len(live) < len(self._load):  # the live links only: elsewhere the load and flow counts are 0
                self.bytes_moved[live] += self._load[live] * dt
                self.busy_time[live] += (self._nflows[live] > 0.5) * dt
            else:  # in place, on kept scratch (the same floats: x + 0.0 is x, x + 1.0 * dt is x + dt; a product
                # and a plain add are faster than ``np.add(..., where=)``)
                buf, on = self._adv_buf
                np.add(self.bytes_moved, np.multiply(self._load, dt, out=buf), out=self.bytes_moved)
                np.greater(self._nflows, 0.5, out=on)
                np.add(self.busy_time, np.multiply(on, dt, out=buf), out=self.busy_time)
        self._t_last = now

    def _complete_finished(self) -> None:
        """End the bandwidth phase of every row due now (within the tolerances)."""
        if not self._n_active:
            return
        p = self._rows
        now = self.env.now
        wb, half = self._win
        windowed = wb >= 0 and half > 0
        # candidates: rows whose lower bound on their due time has passed (a superset of the rows due; the
        # exact test below runs on them alone, as it ran on every active row)
        A = _nzf(p.tcand[: p.size] <= now + max(self.config.time_tolerance, half if windowed else 0.0))
        if not A.size:
            return
        tend, rate = p.tend[A], p.rate[A]
        rem = p.rem[A] - rate * (now - p.t0[A])
        # (tend is finite or +inf, never nan: tend - now <= x for a finite x already excludes the unrated rows)
        due_in = tend - now
        fin = (rem <= _REM_EPS) | (due_in <= self.config.time_tolerance)
        if windowed:  # the tick's batch: rows due within its half window end now (late or early)
            fin |= (p.batch[A] == wb) & (due_in <= half)
        j = _nzf(fin)
        if not j.size:
            return
        idx = A[j]
        self._A = None
        segs, m, r = p.seg[idx], p.mult[idx], rate[j]
        # an early row's batch still completes at its end; a row not yet rated (zero bytes: tend inf) ends now
        due = np.maximum(np.where(np.isfinite(tend[j]), tend[j], now), now) if windowed else now
        left = rem[j] if windowed else np.maximum(rem[j], 0.0)
        # bytes of rows ended early still cross their links (late rows' excess is taken back); their load and
        # flow counts leave (the flow counts by the per-segment sums shared with the segments' counts)
        early = bool(np.count_nonzero(left != 0))
        self._flush_segments()
        self._leave_links(segs, m, r, left, early)
        comps = p.comp[idx]
        self._departed.append((segs, r, comps))  # (fancy-indexed: copies already)
        self._unlabel(comps)
        if self._cls:
            ci = p.cls[idx]
            for cid in ci[ci >= 0].tolist():
                self._cls.pop(cid, None)
            p.cls[idx] = -1
        self._clear_rows(idx)
        self._end_batches(p.batch[idx], due + p.lat[idx])
        if not self._n_active:
            self._go_idle()

    def _leave_links(self, segs: np.ndarray, m: np.ndarray, r: np.ndarray, left: np.ndarray, early: bool) -> None:
        """Ending rows (segments ``segs``, multiplicities ``m``, rates ``r``, bytes ``left``) leave their segments'
        and links' flow counts and loads; with ``early``, their bytes left cross their links. The flow counts,
        loads and early bytes come from one expansion of the segments (the sums :meth:`_seg_flows` and a second
        :meth:`_to_links_many` computed apart)."""
        sf = segs.reshape(-1)
        if self._dense_entries(sf.size):
            mk = m.repeat(_K)
            vals = [mk, (r * m).repeat(_K)] + ([(left * m).repeat(_K)] if early else [])
            sums = self._to_links_many(sf, vals, [False, True, True][: len(vals)])
            self._seg_m += -1.0 * np.bincount(sf + 1, weights=mk, minlength=len(self._seg_lat) + 1)[1:]
            self._nflows += -1.0 * sums[0]
            if early:
                self.bytes_moved += sums[2]
            self._load -= sums[1]
            self._touch()
            return
        # the touched segments and links only (elsewhere the sums are +0.0); the vectors m, r m, left m
        P = np.empty((3 if early else 2, len(m)))
        P[:] = m
        P[1] *= r
        if early:
            P[2] *= left
        x, v, ls = self._row_link_sums(segs, P)
        self._seg_m[x.us] += -1.0 * v[0]
        self._nflows[x.ul] += -1.0 * ls[0]
        if early:
            self.bytes_moved[x.ul] += ls[2]
        self._load[x.ul] -= ls[1]
        self._touch(x.ul)

    def _clear_rows(self, idx: np.ndarray) -> None:
        """Rows ``idx`` (ascending ids) end: inactive, no rate, no bytes left, no end."""
        p = self._rows
        if len(idx) == 1:  # scalar stores (a completion of one row: a third of them)
            i = int(idx[0])
            p.active[i] = False
            p.rate[i] = p.rem[i] = 0.0
            p.tend[i] = p.tcand[i] = _INF
        else:
            p.active[idx] = False
            p.rate[idx] = 0.0
            p.rem[idx] = 0.0
            p.tend[idx] = _INF
            p.tcand[idx] = _INF
        self._n_active -= len(idx)

    def _end_batches(self, bs: np.ndarray, ends: np.ndarray) -> None:
        """Rows of batches ``bs`` (ascending row ids' batches) ended, their last byte arriving at ``ends``: each
        batch's deadline is the latest; a batch with no row left fires (in batch order = start order)."""
        if bs[0] == bs[-1] and not np.count_nonzero(bs != bs[0]):  # one batch (the usual tick): no scatter
            b0 = int(bs[0])
            self._b_deadline[b0] = max(self._b_deadline[b0], float(ends.max()))
            self._b_left[b0] -= len(bs)
            if self._b_left[b0] == 0:
                self._fire(b0)
            return
        np.maximum.at(self._b_deadline, bs, ends)
        ub, cnt = _counts(bs)
        self._b_left[ub] -= cnt
        for b in ub[self._b_left[ub] == 0].tolist():
            self._fire(b)

    @staticmethod
    def _due_from(tend: np.ndarray, rem: np.ndarray, rate: np.ndarray) -> np.ndarray:
        """A lower bound on the first time rows rated ``rate`` at ``tend`` (their end, ``rem`` bytes left
        when rated) can pass the completion test: their bytes left cross :data:`_REM_EPS` about
        ``_REM_EPS / rate`` before ``tend``; the slack doubles that and adds the rounding of ``rem`` and
        of the times (far above a few ulps), so the bound never excludes a row the exact test ends."""
        return tend - (2.0 * _REM_EPS + 1e-12 * np.abs(rem)) / rate - 1e-9 * np.abs(tend)

    def _active_idx(self) -> np.ndarray:
        """Ids of the active rows, ascending (cached until a row starts or ends, or the rows are compacted)."""
        if self._A is None:
            self._A = _nzf(self._rows.active[: self._rows.size])
        return self._A

    def _solve_and_schedule(self) -> None:
        self._gen += 1
        gen = self._gen
        self._solve()
        if self.on_solved is not None:
            self.on_solved()
        if not self._n_active:
            return
        dt = self._next_tick() - self.env.now
        if not math.isfinite(dt):
            raise RuntimeError("fabric deadlock: active flows with zero rate (a zero-capacity link?)")
        ev = self.env.timeout(max(dt, 0.0))
        def tick(_e: simpy.Event, g: int = gen) -> None:
            self._on_tick(g)

        ev.callbacks.append(tick)

    def _next_tick(self) -> float:
        """Time of the next completion event: the earliest row end, or with a completion window
        (:attr:`FabricConfig.completion_tolerance`) the middle of the ends of the earliest row's batch
        that fall within 2h of it (h: the batch's half window), never after another batch's first end.
        Sets :attr:`_win` for :meth:`_complete_finished`. O(active rows) numpy."""
        p = self._rows
        n = p.size
        self._win = (-1, 0.0)
        eps = self.config.completion_tolerance
        if eps <= 0:
            return float(p.tend[:n].min(initial=_INF, where=p.active[:n]))
        # over all rows, not gathered active ones: inactive rows have tend = inf
        tend = p.tend[:n]
        j = int(tend.argmin())
        e = float(tend[j])
        if not math.isfinite(e):
            return e
        b = int(p.batch[j])
        inb = p.batch[:n] == b
        tb = tend[inb & p.active[:n]]
        half = 0.5 * eps * (float(tb.max()) - self.env.now)
        if not (half > 0 and math.isfinite(half)):  # a row of the batch without a projected end: no window
            return e
        other = float(tend.min(initial=_INF, where=~inb))
        hi = float(tb.max(initial=e, where=tb <= e + 2.0 * half))
        self._win = (b, half)
        return min(0.5 * (e + hi), other)

    def _on_tick(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later solve
        self._advance()
        self._complete_finished()
        self._solve_and_schedule()

    def _reach(self, act: np.ndarray, seed_rows: np.ndarray, seed_links: np.ndarray) -> np.ndarray:
        """Active rows (positions in ``act``) connected to ``seed_rows`` (row ids) or to the links
        ``seed_links`` (bool per link) through shared links and coupled groups: a frontier search over
        every registered segment's entries (when few: :meth:`_dense_entries`) or the distinct segments of the
        active rows, O(d x (active rows + entries)) for a component of link-diameter d (2-4 on fat trees;
        1-2 rounds measured on the 1024-GPU step), no graph library."""
        p = self._rows
        cols: Sequence[np.ndarray]
        if self._dense_entries(_K * len(act)):  # every registered segment (few): no compaction, entries cached
            nu = len(self._seg_lat)
            # one contiguous column per slot; the -1 padding indexes the sentinel slot nu of the (nu + 1)-long
            # tables below (as a -1 index), which stays False
            cols = [c[act] for c in p.segc]
            e_link, e_seg = self._bind_entries()
        else:  # the distinct segments of the active rows
            S = p.seg[act]
            valid = S >= 0
            us, inv = self._cpx(S[valid], len(self._seg_lat))
            nu = len(us)
            Lp = np.full(S.shape, nu, dtype=np.int64)  # segment positions in ``us``; padding -> a sentinel
            Lp[valid] = inv
            cols = list(Lp.T.copy())  # one contiguous column per segment slot: K gathers instead of an any(axis=1)
            st = self._se_off[us]
            ln = self._se_off[us + 1] - st
            e_link = self._se_link[_ranges(st, ln)]
            e_seg = np.repeat(np.arange(nu), ln)
            if self._free_on:  # never-binding links couple no rates (:meth:`_never_binding`)
                keep = self._bindable[e_link]
                e_link, e_seg = e_link[keep], e_seg[keep]
        lk = seed_links & self._bindable if self._free_on else seed_links.copy()
        grp = p.group[act]
        has_grp = bool(np.count_nonzero(grp >= 0))
        gl = np.zeros(max(self._next_group, int(grp.max())) + 2 if has_grp else 1, dtype=bool)
        inr = np.zeros(len(act), dtype=bool)
        inr[np.searchsorted(act, seed_rows)] = True
        new = inr.copy()
        while True:
            if has_grp:  # rows coupled to a reached row (a table of group ids; -1 hits the last slot, cleared)
                gl[grp[new]] = True
                gl[-1] = False
                more = gl[grp] > inr
                inr |= more
                new |= more
            seg_new = np.zeros(nu + 1, dtype=bool)
            for c in cols:
                seg_new[c[new]] = True
            lk[e_link[seg_new[e_seg]]] = True
            seg_hit = np.zeros(nu + 1, dtype=bool)
            seg_hit[e_seg[lk[e_link]]] = True
            seg_hit[-1] = False
            hit = seg_hit[cols[0]]
            for c in cols[1:]:
                hit |= seg_hit[c]
            new = hit > inr  # hit and not yet reached
            if not np.count_nonzero(new):
                return inr
            inr |= new

    def _derived(self, use: str, key: bytes) -> tuple[Any, ...] | None:
        """What :meth:`_fill_entries` (``use``) kept for the rows' segment list ``key``
        (its bytes), or None; kept while the segments and the never-binding links are those it was built on."""
        return self._der_cache.get((use, self._free_on, key))

    def _keep_derived(self, use: str, key: bytes, got: tuple[Any, ...]) -> None:
        """Keep ``got`` for :meth:`_derived` (its own cache, :data:`_DERIVED_BYTES`, cleared when full; lists over
        :data:`_DERIVED_LEN` ids are not kept)."""
        if len(key) > 8 * self._DERIVED_LEN:
            return
        nb = len(key) + self._EXP_OVERHEAD + sum(sum(c.nbytes for c in a) if isinstance(a, list) else
                                                 getattr(a, "nbytes", 0) for a in got)
        self._der_bytes += nb
        if self._der_bytes > self._DERIVED_BYTES:
            self._der_cache.clear()
            self._der_bytes = nb
        self._der_cache[(use, self._free_on, key)] = got

    _DERIVED_BYTES = 32_000_000
    """Bytes :meth:`_keep_derived` keeps (the fills' per-list arrays; cleared when full)."""
    _DERIVED_LEN = 768
    """Longer lists (over 256 rows) are not kept by :meth:`_keep_derived`: a big set of rows rarely repeats, and
    its arrays would clear the cache of the small ones that do."""

    def _bind_entries(self) -> tuple[np.ndarray, np.ndarray]:
        """(link, segment) of every registered segment entry whose link can bind (:meth:`_never_binding`),
        cached until segments are added or the never-binding links are gone."""
        key = (len(self._se_link), self._free_on)
        if self._bind_cache is None or self._bind_cache[0] != key:
            e_link, e_seg = self._se_link, self._se_seg
            if self._free_on:
                keep = self._bindable[e_link]
                e_link, e_seg = e_link[keep], e_seg[keep]
            self._bind_cache = (key, e_link, e_seg)
        return self._bind_cache[1], self._bind_cache[2]

    def _label(self, R: np.ndarray) -> None:
        """Give the active rows ``R`` a fresh component label (counting the active rows per label)."""
        p = self._rows
        self._unlabel(p.comp[R])
        self._next_comp += 1
        if len(self._comp_n) < self._next_comp + 2:
            self._comp_n = np.concatenate([self._comp_n, np.zeros(len(self._comp_n), dtype=np.int64)])
        p.comp[R] = self._next_comp
        self._comp_n[self._next_comp] = len(R)

    def _unlabel(self, comps: np.ndarray) -> None:
        """Rows of labels ``comps`` (one per row; -1: not yet labelled) leave their labels' counts."""
        if len(comps) <= 8:  # a completion's few rows: scalar decrements (``subtract.at`` costs ~5 us a call)
            for c in comps.tolist():
                if c >= 0:
                    self._comp_n[c] -= 1
            return
        comps = comps[comps >= 0]
        if comps.size:
            np.subtract.at(self._comp_n, comps, 1)

    def _select(self) -> np.ndarray:
        """Rows whose rate the pending arrivals and departures can change (see docs/ENGINE.md).

        Arrivals: every active row connected to an arrived or departed row's links (:meth:`_reach`;
        they get one fresh component label). Departures only: in the (possibly coarser, never finer) components of the
        departed rows, the rows whose rate is at least the smallest departed rate there; max-min
        filling below that level is unchanged by a departure, so slower rows keep their rates."""
        p = self._rows
        self._closed = bool(self._arrived)
        ai = self._active_idx()
        if self._arrived:
            seed = np.zeros(len(self.links), dtype=bool)
            if self._departed:
                segs = np.concatenate([d[0].reshape(-1) for d in self._departed])
                seed = self._to_links(segs, np.ones(segs.size), weighted=False) > 0
            arrived = np.concatenate(self._arrived)
            arrived = arrived[p.active[arrived]]
            if not self._departed and arrived.size and (p.group[arrived] < 0).all():
                # fast path: no other active row on the arrivals' links (those that can bind): they are a
                # component of their own, what the frontier search would find, at O(their entries)
                lk, mine = self._own_links(p.seg[arrived].reshape(-1), np.repeat(p.mult[arrived], _K))
                if (np.abs(self._nflows[lk] - mine) < 0.5).all():
                    self._label(arrived)
                    return arrived
            R = ai[self._reach(ai, arrived, seed)]
            self._label(R)  # one label for the union of touched components: coarser, never finer
            return R
        if not self._departed:
            return np.zeros(0, dtype=np.int64)
        comps = np.concatenate([d[2] for d in self._departed])
        if not np.count_nonzero(self._comp_n[comps]):  # no active row left in their components: O(departed)
            return np.zeros(0, dtype=np.int64)
        rates = np.concatenate([d[1] for d in self._departed])
        if len(comps) <= self._FLOOR_SCALAR:  # few departures: their labels' floors in a dict, a pass per label
            got = self._above_floors(ai, comps, rates)
            if got is not None:
                return got
        # the smallest departed rate per label, by a table over the labels (inf: no departure there; the last
        # slot, inf, takes the -1 of an unlabelled row)
        floor = np.full(self._next_comp + 2, _INF)
        np.minimum.at(floor, comps, rates)
        return ai[p.rate[ai] >= floor[p.comp[ai]] * (1.0 - 1e-9)]

    _FLOOR_SCALAR = 8
    """Most departed rows whose labels' floors :meth:`_select` takes in Python (:meth:`_above_floors`)."""

    def _above_floors(self, ai: np.ndarray, comps: np.ndarray, rates: np.ndarray) -> np.ndarray | None:
        """The active rows ``ai`` whose rate is at least the smallest rate departed from their label (``comps``,
        ``rates``: one per departed row; -1 an unlabelled one, as the table's last slot takes it): the table
        of :meth:`_select` as a dict, O(departed + distinct labels x active rows) in place of an O(labels)
        table (labels are never reused: the table grows with every search). The same comparisons."""
        floor: dict[int, float] = {}
        for c, r in zip(comps.tolist(), rates.tolist()):
            f = floor.get(c)
            if f is None or r < f:
                floor[c] = r
        p = self._rows
        ca, ra = p.comp[ai], p.rate[ai]
        if not (np.isfinite(rates).all() and np.isfinite(ra).all()):
            return None  # NaN floors (the table's np.minimum keeps them) or infinite rates (inf >= inf, no departure)
        keep: np.ndarray | None = None
        for c, f in floor.items():
            k = (ca == c) & (ra >= f * (1.0 - 1e-9))
            keep = k if keep is None else keep | k
        assert keep is not None
        return ai[keep]

    def _own_links(self, segs: np.ndarray, mult: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The links that can bind (:meth:`_never_binding`) with flows of the segment list ``segs`` (flat, -1
        padded; ``mult``: multiplicity per entry), ascending, and those flows (:meth:`_to_links`, unweighted)."""
        if self._dense_entries(segs.size):
            mine = self._to_links(segs, mult, weighted=False)
            lk = mine > 0
            if self._free_on:
                lk &= self._bindable
            return _nzf(lk), mine[lk]
        x, _, (mine,) = self._link_sums(segs, [mult], [False])
        keep = mine > 0
        if self._free_on:
            keep &= self._bindable[x.ul]
        return x.ul[keep], mine[keep]

    def _solve(self) -> None:
        """Re-solve the rates of the rows the pending arrivals/departures can affect (selective update)."""
        self._flush_segments()
        R = self._select()
        self._arrived.clear()
        self._departed.clear()
        if not R.size:
            self._observe()
            return
        self.n_solves += 1
        self.n_rows_solved += len(R)
        p = self._rows
        full = len(R) == self._n_active
        old = p.rate[R].copy()
        key = self._rate_key(R) if self._closed else None
        new = self._rate_memo.get(key) if key is not None else None
        if new is not None:
            self.n_rate_hits += 1
            d = np.repeat((new - old) * p.mult[R], _K) if not full else np.repeat(new * p.mult[R], _K)
            sR = p.seg[R].reshape(-1)
            if full:
                self._load[:] = self._to_links(sR, d)
                self._touch()
            elif self._dense_entries(sR.size):
                self._load += self._to_links(sR, d)
                self._touch()
            else:  # the rows' links only (elsewhere the sums are +0.0)
                x, _, (upd,) = self._link_sums(sR, [d], [True])
                self._load[x.ul] += upd
                self._touch(x.ul)
        else:
            new = self._fill(R, full)
            if key is not None and (new > 0).all():
                self._rate_memo_size += len(new)
                if self._rate_memo_size > self._RATE_MEMO_FLOATS:
                    self._rate_memo.clear()
                    self._rate_memo_size = len(new)
                self._rate_memo[key] = new
        if not full and np.count_nonzero(new <= 0):  # numerical safety: re-solve everything
            R = _nzf(p.active[: p.size])
            old = p.rate[R].copy()
            new = self._fill(R, True)
            full = True
        if np.count_nonzero(new <= 0):
            raise RuntimeError("fabric deadlock: active flows with zero rate (a zero-capacity link?)")
        now = self.env.now
        p.rem[R] -= old * (now - p.t0[R])
        p.t0[R] = now
        p.rate[R] = new
        p.tend[R] = now + p.rem[R] / new
        p.tcand[R] = self._due_from(p.tend[R], p.rem[R], new)
        if self._cls and (key is None or key not in self._cls_ok):
            # flow classes re-rated: check each against the per-flow max-min conditions (a closed set's check
            # is a function of its rate-memo key, like its rates: a key that passed once passes again)
            C = _nzf(p.cls[R] >= 0)
            if C.size:
                known = self._cls_bad.get(key) if key is not None else None
                if known is not None:  # this closed set failed before: the same rates, the same split
                    bad = [(int(R[j]), mk) for j, mk in known]
                else:
                    badj = self._class_checks(R, C)
                    if badj and key is not None:
                        if len(self._cls_bad) >= self._BATCH_CACHE:
                            self._cls_bad.clear()
                        self._cls_bad[key] = badj
                    bad = [(int(R[j]), mk) for j, mk in badj]
                if bad:  # split (exactly: the members have the class's bytes left) and solve again
                    for c, mk in bad:
                        self._split_class(c, mk)
                    self._solve()
                    return
                if key is not None:
                    if len(self._cls_ok) >= self._RATE_MEMO_ROWS:
                        self._cls_ok.clear()
                    self._cls_ok.add(key)
        n = p.size
        if n > 1024 and n > 4 * max(self._n_active, 1) and self.compact_rows:
            p.keep(_nzf(p.active[:n]))
            self._A = None
        self._observe()

    # ------------------------------------------------------- usage observer
    def _touch(self, links: np.ndarray | None = None) -> None:
        """The load or flow count of ``links`` (None: of any link) may have changed: :meth:`_observe` compares
        them (a link left unmarked holds the values it had at the last observation)."""
        self._obs_dirty = True
        if links is None:
            self._obs_all = True
        elif not self._obs_all:
            self._obs_mark[links] = True

    def _observe(self) -> None:
        """After a solve: hand the observer each link's interval whose flow count or load just changed
        (closed at ``now``) and open new ones; links left unchanged keep their open interval, so the
        intervals are per-link changes, not solves x links. The change test runs on the links marked by
        :meth:`_touch` since the last call (O(marked) numpy and one O(links) scan of the marks), or on every link
        (O(links) numpy) after a change anywhere."""
        if self.observer is None or (self._obs is not None and not self._obs_dirty):
            return
        self._obs_dirty = False
        now = self.env.now
        nl = len(self.links)
        if self._obs is None:
            self._obs = (np.full(nl, np.nan), np.zeros(nl), np.zeros(nl))
            self._obs_buf = (np.zeros(nl), np.zeros(nl, dtype=bool), np.zeros(nl, dtype=bool))
            self._obs_all = True
        t0, c0, l0 = self._obs
        if self._obs_all:
            self._obs_all = False
            self._obs_mark[:] = False
            cnt, changed, ch2 = self._obs_buf  # kept scratch: the O(links) passes write in place
            np.rint(self._nflows, out=cnt)
            np.not_equal(cnt, c0, out=changed)
            np.logical_or(changed, np.not_equal(self._load, l0, out=ch2), out=changed)
            if not np.count_nonzero(changed):
                return
            idx = _nzf(changed)
            ci = cnt[idx]
        else:  # the marked links only (the others' values are those last observed: unchanged)
            mk = _nzf(self._obs_mark)
            if not mk.size:
                return
            self._obs_mark[mk] = False
            cm = np.rint(self._nflows[mk])
            changed = (cm != c0[mk]) | (self._load[mk] != l0[mk])
            if not np.count_nonzero(changed):
                return
            idx, ci = mk[changed], cm[changed]
        st = t0[idx]
        ok = st < now
        if np.count_nonzero(ok):
            k = idx[ok]
            self.observer(k, st[ok], now, c0[k], l0[k] * (now - st[ok]))
        c0[idx] = ci
        l0[idx] = self._load[idx]
        t0[idx] = np.where(ci > 0, now, np.nan)

    def close_observer(self, now: float | None = None) -> None:
        """Hand the observer every interval still open, up to ``now``."""
        o, self._obs = self._obs, None
        now = self.env.now if now is None else now
        if o is None or self.observer is None:
            return
        t0, c0, l0 = o
        k = _nzf(t0 < now)
        if k.size:
            self.observer(k, t0[k], now, c0[k], l0[k] * (now - t0[k]))

    def _free_broken(self) -> None:
        """A route crosses a spine link other than by an even leaf-spine bundle: no link is never-binding from
        now on (coalesced collectives still running are materialized by the next :meth:`start_rows`)."""
        self._free = np.zeros(len(self.links), dtype=bool)
        self._bindable = ~self._free
        self._free_on = False
        self._binding.clear()
        self._wake_all = bool(self._holders)

    # ------------------------------------------------------------ coalescing
    def binding(self, links: np.ndarray) -> np.ndarray:
        """The links of ``links`` that can bind (see :meth:`_never_binding`); kept per ``links`` array (a coalesced
        collective's memo asks with the same one at every start) until the never-binding links are gone."""
        if not self._free_on:
            return links
        hit = self._binding.get(id(links))
        if hit is None or hit[0] is not links:  # (the entry holds ``links``: its id stays unique)
            if len(self._binding) >= self._BATCH_CACHE:
                self._binding.clear()
            hit = self._binding[id(links)] = (links, links[self._bindable[links]])
        return hit[1]

    def links_idle(self, links: np.ndarray) -> bool:
        """No flow and no coalesced collective on any of ``links`` that can bind (a never-binding link shared
        with other flows changes no rate: :meth:`_never_binding`)."""
        links = self.binding(links)
        return not np.count_nonzero(self._nflows[links] > 0.5) and not np.count_nonzero(self._held[links] >= 0)

    def hold(self, links: np.ndarray, wake: Callable[[], object]) -> int:
        """Reserve idle ``links`` (those that can bind) for a coalesced collective; ``wake()`` is called (and the
        hold released) when a flow is about to start on any of them. Returns the hold id."""
        self._next_hold += 1
        h = self._next_hold
        self._held[self.binding(links)] = h
        self._holders[h] = wake
        return h

    def release(self, h: int, links: np.ndarray) -> None:
        """End hold ``h`` on ``links``."""
        if self._holders.pop(h, None) is not None:
            self._held[links[self._held[links] == h]] = -1

    def add_counters(self, links: np.ndarray, nbytes: np.ndarray, busy: np.ndarray, peak: np.ndarray) -> None:
        """Add a coalesced collective's wire bytes and busy time to ``links`` (peak flows: maximum)."""
        self.bytes_moved[links] += nbytes
        self.busy_time[links] += busy
        np.maximum(self.peak_flows[links], peak, out=peak)
        self.peak_flows[links] = peak

    def _wake_holders(self, segs: np.ndarray) -> None:
        """Materialize every coalesced collective holding a link of the segments ``segs`` (all of them once
        the never-binding links are gone: :meth:`_free_broken`)."""
        self._flush_segments()
        if self._wake_all:
            self._wake_all = False
            hs = np.array(sorted(self._holders), dtype=np.int64)
        else:
            hs = self._held[self._seg_links(segs)]
            hs = np.unique(hs[hs >= 0]) if np.count_nonzero(hs >= 0) else hs[:0]
        for h in hs[hs >= 0].tolist():  # hold order = start order: deterministic
            wake = self._holders.get(h)
            if wake is not None:
                self.n_materialized += 1
                wake()

    def _mark_live(self, segs: np.ndarray) -> np.ndarray:
        """The links of a starting batch's segments become live: until the fabric is next idle only live links
        can carry load or flows (rows split from a class cross its links; solves load their rows' links), so
        :meth:`_advance` moves their counters alone, O(live links) instead of O(L). Returns those links."""
        lk = self._seg_links(segs)
        if not self._live[lk].all():
            self._live[lk] = True
            self._live_idx = None
        return lk

    def _go_idle(self) -> None:
        """The fabric is idle: every link's load and flow count and every segment's multiplicity are 0 (set
        exactly, dropping rounding residue), and no link is live."""
        self._load[:] = 0.0
        self._nflows[:] = 0.0
        self._seg_m[:] = 0.0
        self._touch()
        live = self._live_idx if self._live_idx is not None else _nzf(self._live)
        self._live[live] = False
        self._live_idx = np.zeros(0, dtype=np.int64)

    def _seg_links(self, segs: np.ndarray) -> np.ndarray:
        """The distinct links of the segments ``segs`` (-1 padding ignored), ascending: the entries of their
        distinct segments (:meth:`_expansion`), O(those entries), not O(links) (every entry's flow count is > 0,
        so these are the links a per-link count of ``segs`` marks)."""
        return self._expansion(segs.reshape(-1)).ul

    def copy_segment(self, other: Fabric, sid: int) -> int:
        """This fabric's id of segment ``sid`` of ``other`` (a fabric over the same graph)."""
        key = other._seg_key(sid)
        hit = self._seg_ids.get(key)
        if hit is not None:
            return hit
        other._flush_segments()
        a, b = other._se_off[sid], other._se_off[sid + 1]
        new = len(self._seg_lat)
        self._se_parts.append((np.full(b - a, new, dtype=np.int64), other._se_link[a:b].copy(),
                               other._se_w[a:b].copy(), other._se_n[a:b].copy()))
        self._has_cls |= other._has_cls
        self._seg_lat.append(other._seg_lat[sid])
        self._seg_cap.append(other._seg_cap[sid])
        self._seg_nlinks.append(other._seg_nlinks[sid])
        self._seg_ids[key] = new
        return new

    def _seg_key(self, sid: int) -> Any:
        keys = self._key_of
        if len(keys) <= sid:
            keys = [None] * len(self._seg_lat)
            for k, v in self._seg_ids.items():
                keys[v] = k
            self._key_of = keys
        return keys[sid]

    def drop_all(self, env: simpy.Environment) -> None:
        """Forget every row and batch (their events never fire) and continue on ``env`` (a fresh environment at
        the same time): a scratch fabric whose in-flight collective is no longer needed becomes idle without
        running it to its end. Counters are kept."""
        self.env = env
        p = self._rows
        p.active[: p.size] = False
        p.size = 0
        self._A = None
        self._n_active = 0
        self._comp_n[:] = 0
        self._go_idle()
        self._b_event.clear()
        self._b_meta.clear()
        self._b_left[:] = 0
        self._win = (-1, 0.0)
        self._t_last = env.now
        self._gen += 1
        self._solve_pending = False
        self._arrived.clear()
        self._departed.clear()
        self._obs = None
        self._cls.clear()
        p.cls[:] = -1

    def snapshot_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Active rows now: (segments, wire bytes left per member, multiplicity, wire rate cap, group, batch)."""
        p = self._rows
        idx = _nzf(p.active[: p.size])
        if (p.cls[idx] >= 0).any():
            raise RuntimeError("snapshot_rows of a fabric with flow-class rows (their members are not rows); "
                               "scratch fabrics run with FabricConfig.flow_classes off")
        rem = np.maximum(p.rem[idx] - p.rate[idx] * (self.env.now - p.t0[idx]), 0.0)
        return p.seg[idx].copy(), rem, p.mult[idx].copy(), p.cap[idx].copy(), p.group[idx].copy(), p.batch[idx].copy()

    _RATE_MEMO_FLOATS = 4_000_000
    """Rates kept for reuse, summed over the memoized solves (32 MB; the memo is cleared when full)."""
    _RATE_MEMO_ROWS = 65536
    """Solves of more rows are not memoized (hashing them costs about what solving does)."""

    def _rate_key(self, R: np.ndarray) -> bytes | None:
        """Signature of the closed row set ``R`` (whole components): segments, caps, multiplicities and
        coupled groups (relabelled by first appearance), in row order. Max-min rates of a closed set
        depend on nothing else, so equal signatures give equal rates."""
        if len(R) > self._RATE_MEMO_ROWS:
            return None
        p = self._rows
        g = _first_seen(p.group[R]).astype(np.int32)  # relabelled: below R <= _RATE_MEMO_ROWS
        seg = p.seg[R]
        if len(self._seg_lat) < 2**31:  # the same ids in half the bytes to hash
            seg = seg.astype(np.int32)
        # SHA-256 (hardware-accelerated on x86 and ARM: ~3x blake2b's speed here); 256-bit: collisions negligible
        h = hashlib.sha256(seg.tobytes())
        for a in (p.cap[R], p.mult[R], g):
            h.update(a.tobytes())
        return h.digest()

    def _fill(self, R: np.ndarray, full: bool) -> np.ndarray:
        """Progressive filling of rows ``R`` on what the other active rows leave of each link.

        Small solves: one round per saturation level (:meth:`_fill_dense`); big ones: one round per
        link of bottleneck chains (:meth:`_fill_parallel`), O(rounds x (|R| + entries)) plus the
        O(|R| log |R|) set-up. Updates ``_load`` for the new rates and returns them."""
        p = self._rows
        k = len(R)
        S = p.seg[R]
        m = p.mult[R]
        old = p.rate[R]
        ent_row, lseg, LS, e_seg, e_off, ulinks, e_link, e_w = self._fill_entries(S)
        ns = len(e_off) - 1
        nlk = len(ulinks)
        old_seg = np.bincount(lseg, weights=(old * m)[ent_row], minlength=ns)
        old_load = np.bincount(e_link, weights=old_seg[e_seg] * e_w, minlength=nlk)
        capl = self.capacity[ulinks]
        fixed = np.zeros(nlk) if full else np.maximum(self._load[ulinks] - old_load, 0.0)
        rem_cap = np.maximum(capl - fixed, 0.0)
        cap = p.cap[R]
        grp = p.group[R]
        rate = None
        if k <= self._DENSE_ROWS:
            rate = self._fill_dense(m, cap, grp, ent_row, lseg, ns, e_seg, e_link, e_w, nlk, rem_cap, capl)
            p.bott[R] = -2
        else:
            bott = p.bott[R]
            unk = bott < -1
            if unk.any() and 8 * int(unk.sum()) < k and not (grp >= 0).any():
                bott = bott.copy()
                bott[unk] = self._guess_bottleneck(S[unk])  # a guess: the structure's pivots correct it
            if (bott >= -1).all() and not (grp >= 0).any():
                got = self._reuse_structure(bott, old, m, cap, ent_row, lseg, e_off, e_seg, e_link, e_w, ulinks,
                                            rem_cap, capl)
                if got is not None and np.isfinite(got[0]).all() and (got[0] > 0).all():
                    rate, lb = got  # else the reference filling below: a reused structure must give finite rates
                    p.bott[R] = np.where(lb >= 0, ulinks[np.maximum(lb, 0)], lb)
            if rate is not None:
                self.n_reused += 1
            else:
                lo, l_off = _csr(e_link, nlk)  # entries of local link j: lo[l_off[j]:l_off[j+1]]
                seg_cnt = np.bincount(lseg, weights=m[ent_row], minlength=ns)
                seg_nrows = np.bincount(lseg, minlength=ns)
                rate, lb = self._fill_parallel(m, cap, grp, LS, ns, e_off, e_seg, e_link, e_w, nlk, lo, l_off,
                                               seg_cnt, seg_nrows, rem_cap.copy())
                p.bott[R] = np.where(lb >= 0, ulinks[np.maximum(lb, 0)], lb)
        new_seg = np.bincount(lseg, weights=(rate * m)[ent_row], minlength=ns)
        new_load = np.bincount(e_link, weights=new_seg[e_seg] * e_w, minlength=nlk)
        if full:
            self._load[:] = 0.0
            self._load[ulinks] = new_load
            self._touch()
        else:
            self._load[ulinks] += new_load - old_load
            self._touch(ulinks)
        return rate

    def _fill_entries(self, S: np.ndarray) -> tuple[np.ndarray, ...]:
        """For :meth:`_fill` over rows with segments ``S`` (rows x :data:`_K`): per kept (non-padding) entry its
        row and its segment's position among the distinct segments; those positions as rows x :data:`_K` (-1:
        padding); per link entry of the distinct segments (in order) its segment position, the entries' offsets
        per segment, the distinct links, each entry's link position among them and its weight. Kept per list
        (:meth:`_derived`): 87% of the 8,637 fills of the 1024-GPU step repeat a list (rate-memo misses on a set
        of rows solved before); a hit costs a hash of the list, a miss O(rows + entries) numpy as before."""
        key = S.tobytes()
        got = self._derived("fill", key)
        if got is not None:
            return got
        valid = S >= 0
        ent_row = np.nonzero(valid)[0]
        useg, lseg = self._cpx(S[valid], len(self._seg_lat))
        ns = len(useg)
        LS = np.full(S.shape, -1, dtype=np.int64)
        LS[valid] = lseg
        st = self._se_off[useg]
        ln = self._se_off[useg + 1] - st
        e = _ranges(st, ln)
        e_seg = np.repeat(np.arange(ns), ln)
        e_off = np.zeros(ns + 1, dtype=np.int64)
        np.cumsum(ln, out=e_off[1:])
        ulinks, e_link = self._cpx(self._se_link[e], len(self.links))
        got = (ent_row, lseg, LS, e_seg, e_off, ulinks, e_link, self._se_w[e])
        self._keep_derived("fill", key, got)
        return got

    def _guess_bottleneck(self, S: np.ndarray) -> np.ndarray:
        """Per row (its segments ``S``): the lowest-capacity link of its first segment, as a starting
        bottleneck for :meth:`_reuse_structure` where the last solve left none (rows frozen by the
        filling's numerical fallback)."""
        first = S[np.arange(len(S)), np.argmax(S >= 0, axis=1)]
        out = np.empty(len(S), dtype=np.int64)
        for k, sg in enumerate(first.tolist()):
            lk = self._se_link[self._se_off[sg]:self._se_off[sg + 1]]
            out[k] = lk[int(np.argmin(self.capacity[lk]))] if len(lk) else -1  # -1: the structure's pivots decide
        return out

    _DENSE_ROWS = 64
    """Solves of at most this many rows use the sequential :meth:`_fill_dense` (fewer numpy calls when
    there are few levels); bigger ones :meth:`_fill_parallel` (same rates, far fewer rounds)."""

    @staticmethod
    def _fill_dense(m: np.ndarray, cap: np.ndarray, grp: np.ndarray, ent_row: np.ndarray, lseg: np.ndarray, ns: int,
                    e_seg: np.ndarray, e_link: np.ndarray, e_w: np.ndarray, nlk: int, rem_cap: np.ndarray,
                    capl: np.ndarray) -> np.ndarray:
        """Progressive filling, one round per saturation level over the unfrozen rows' entries:
        O(levels x (rows + entries)), few numpy calls per round (small solves)."""
        k = len(m)
        rate = np.zeros(k)
        frozen = np.zeros(k, dtype=bool)
        capped = np.isfinite(cap)
        any_capped = bool(np.count_nonzero(capped))
        has_groups = bool(np.count_nonzero(grp >= 0))
        ur, us = ent_row, lseg
        for _ in range(k + nlk + 2):
            if not ur.size:
                break
            seg_cnt = np.bincount(us, weights=m[ur], minlength=ns)
            cnt = np.bincount(e_link, weights=seg_cnt[e_seg] * e_w, minlength=nlk)
            used = cnt > 0
            share = np.full(nlk, _INF)
            share[used] = rem_cap[used] / cnt[used]
            j = int(np.argmin(share))
            delta = float(share[j])
            unf = _nzf(~frozen)
            if any_capped:
                head = cap[unf] - rate[unf]
                delta = min(delta, float(head.min()))
            if not math.isfinite(delta):
                raise RuntimeError("fabric: unbounded flow rate (a flow crosses no capacity-limited link)")
            rate[unf] += delta
            rem_cap -= delta * cnt
            sat = used & (rem_cap <= 1e-9 * capl)
            newly = np.zeros(k, dtype=bool)
            if np.count_nonzero(sat):
                seg_sat = np.zeros(ns, dtype=bool)
                seg_sat[e_seg[sat[e_link]]] = True
                newly[ur[seg_sat[us]]] = True
            if any_capped:
                newly[unf[capped[unf] & (head - delta <= 1e-12 * np.maximum(cap[unf], 1.0))]] = True
            if has_groups:
                g = grp[newly]
                g = g[g >= 0]
                if g.size:
                    newly |= np.isin(grp, g)
            newly &= ~frozen
            if not np.count_nonzero(newly):  # numerical safety: freeze the tightest link's rows
                seg_j = np.zeros(ns, dtype=bool)
                seg_j[e_seg[e_link == j]] = True
                newly[ur[seg_j[us]]] = True
            frozen |= newly
            keep = ~frozen[ur]
            ur, us = ur[keep], us[keep]
        return rate

    _REUSE_MAX_CLASSES = 4096
    """Most bottleneck links :meth:`_reuse_structure` solves for (a B x B system; triangular when the
    levels keep their order, O(B^2), else a dense O(B^3) solve, tried only up to 1024)."""
    _REUSE_DENSE_MAX = 2560
    """Largest system :meth:`_reuse_structure` solves densely when its levels changed order."""
    _REUSE_PIVOTS = 24
    """Most pivots (rows moved to the bottleneck the last levels show them) :meth:`_reuse_structure`
    tries before it gives up and the caller fills."""

    @staticmethod
    def _reuse_structure(bott: np.ndarray, old: np.ndarray, m: np.ndarray, cap: np.ndarray, ent_row: np.ndarray,
                         lseg: np.ndarray, e_off: np.ndarray, e_seg: np.ndarray, e_link: np.ndarray, e_w: np.ndarray,
                         ulinks: np.ndarray, rem_cap: np.ndarray,
                         capl: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """Max-min rates of the rows from the bottleneck structure of their last solve, or None.

        A structure gives every row a bottleneck: a link (its *class*) or its rate cap. Saturating each
        class link is a square linear system in one level per class link (rows of other classes enter at
        their own level, capped rows at their cap). Max-min puts a row crossing class link L at most at
        L's level, so with the classes ordered by level the system is lower triangular: one forward
        substitution, O(B^2) for B class links (ordered by the last levels; a dense solve if the order
        changed). The answer is then *verified* against the max-min conditions: every link within its
        capacity, every row at most at the level of every class link it crosses, every rate within its
        cap. The max-min allocation is unique, so a verified answer is exactly progressive filling's.
        A failed check *pivots* (active-set style) and solves again: rows faster than a class link they
        cross move to the lowest such link; an overloaded link becomes a class link holding the rows
        above its water level (filled on that link alone). After a departure the structure seldom moves
        by more than a few rows, so most solves of a long uneven exchange end here in O(entries + B^2)
        numpy with a fixed number of calls per pivot, instead of a round per link of the bottleneck chains.

        Returns (rates, bottleneck per row: a local link index or -1 for its cap)."""
        import scipy.linalg

        tol = Fabric._SAT_TOL
        nlk = len(capl)
        capped = bott == -1
        pos = np.searchsorted(ulinks, bott)
        pos[capped] = 0
        pos = np.minimum(pos, nlk - 1)
        if (ulinks[pos][~capped] != bott[~capped]).any():
            return None
        pos[capped] = -1
        ns = len(e_off) - 1
        cand = np.zeros(nlk, dtype=bool)  # links whose (row, link) pairs are expanded: class links, overloaded
        cand[pos[~capped]] = True
        pr, pl, pw = Fabric._pairs(cand, ent_row, lseg, e_seg, e_link, e_w, m, ns)
        guess = np.zeros(nlk)  # level per local link, for the order of the classes
        np.maximum.at(guess, pos[~capped], old[~capped])
        for _ in range(Fabric._REUSE_PIVOTS + 1):
            nc = pos >= 0
            mark = np.zeros(nlk, dtype=bool)
            mark[pos[nc]] = True
            cl = _nzf(mark)  # = np.unique(pos[nc]), O(rows + links) without a sort
            B = len(cl)
            if B > Fabric._REUSE_MAX_CLASSES:
                return None
            ci = np.full(nlk, -1, dtype=np.int64)  # local link -> class index (position in cl)
            ci[cl] = np.arange(B)
            pc = np.where(nc[pr], ci[np.maximum(pos[pr], 0)], -1)  # the pair's row class (-1: capped)
            pk = ci[pl]  # the pair's link class (-1: not a class link)
            fr = (pk >= 0) & (pc >= 0)
            cross = fr & (pk != pc)
            order = Fabric._level_order(guess[cl], pc[cross], pk[cross])
            inv = np.empty(B, dtype=np.int64)  # class index -> rank in level order
            inv[order] = np.arange(B)
            rk, rc = inv[pk[fr]], inv[pc[fr]]
            M = np.bincount(rk * B + rc, weights=pw[fr], minlength=B * B).reshape(B, B)
            cp = (pk >= 0) & (pc < 0)
            rhs = np.zeros(B)
            rhs[inv] = rem_cap[cl]
            rhs -= np.bincount(inv[pk[cp]], weights=pw[cp] * cap[pr[cp]], minlength=B)
            try:
                perm = None if not B or not (rk < rc).any() else Fabric._topo_order(M)
                if B and not (rk < rc).any():  # lower triangular in level order
                    lev = scipy.linalg.solve_triangular(M, rhs, lower=True, check_finite=False)
                elif perm is not None:  # triangular in a dependency order the levels did not show
                    lev = np.empty(B)
                    lev[perm] = scipy.linalg.solve_triangular(M[np.ix_(perm, perm)], rhs[perm], lower=True,
                                                              check_finite=False)
                elif B <= Fabric._REUSE_DENSE_MAX:
                    lev = np.linalg.solve(M, rhs) if B else np.zeros(0)
                else:
                    return None
            except (np.linalg.LinAlgError, scipy.linalg.LinAlgError):
                return None
            if not np.isfinite(lev).all():
                return None
            # a level <= 0: rows of other classes overload that link; a tiny level lets the checks below
            # flag it as overloaded and pivot (its water level takes the rows above it)
            lev = np.maximum(lev, 1e-9 * np.maximum(capl[cl][order], 1.0))
            guess[cl] = lev[inv]
            level = np.full(nlk, _INF)
            level[cl] = guess[cl]
            x = np.where(nc, level[np.maximum(pos, 0)], cap)
            # rows above the level of a class link they cross: move to the lowest such link
            fast = x[pr] > level[pl] * (1.0 + tol)
            over_cap = nc & (x > cap * (1.0 + tol))
            seg_x = np.bincount(lseg, weights=(x * m)[ent_row], minlength=ns)
            load = np.bincount(e_link, weights=seg_x[e_seg] * e_w, minlength=nlk)
            over = load > rem_cap + tol * capl
            if not np.count_nonzero(fast) and not np.count_nonzero(over_cap) and not np.count_nonzero(over):
                return x, pos
            if np.count_nonzero(over_cap):
                pos[over_cap] = -1
            if np.count_nonzero(fast):
                lo_lvl = np.full(len(m), _INF)
                np.minimum.at(lo_lvl, pr[fast], level[pl[fast]])
                best = fast & (level[pl] <= lo_lvl[pr])
                pos[pr[best]] = pl[best]
            if np.count_nonzero(over):  # water level of each overloaded link, the rows' other rates fixed
                ov = _nzf(over)
                if not cand[ov].all():
                    cand[ov] = True
                    pr, pl, pw = Fabric._pairs(cand, ent_row, lseg, e_seg, e_link, e_w, m, ns)
                t = Fabric._link_water_level(ov, over, pr, pl, pw, x, rem_cap)
                hit = over[pl] & (x[pr] > t[pl] * (1.0 + tol))
                lo_lvl = np.full(len(m), _INF)
                np.minimum.at(lo_lvl, pr[hit], t[pl[hit]])
                best = hit & (t[pl] <= lo_lvl[pr])
                pos[pr[best]] = pl[best]
                guess[ov] = t[ov]
        return None

    @staticmethod
    def _pairs(cand: np.ndarray, ent_row: np.ndarray, lseg: np.ndarray, e_seg: np.ndarray, e_link: np.ndarray,
               e_w: np.ndarray, m: np.ndarray, ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The (row, link) pairs through the rows' segments on the links ``cand``: row, local link, and
        the link's weight x the row's multiplicity."""
        ce = _nzf(cand[e_link])
        c_cnt = np.bincount(e_seg[ce], minlength=ns)
        c_off = np.zeros(ns + 1, dtype=np.int64)
        np.cumsum(c_cnt, out=c_off[1:])
        n_per = c_cnt[lseg]
        pr = np.repeat(ent_row, n_per)
        pe = ce[_ranges(c_off[lseg], n_per)]
        return pr, e_link[pe], e_w[pe] * m[pr]

    @staticmethod
    def _topo_order(M: np.ndarray) -> np.ndarray | None:
        """An order of the classes in which ``M`` (row: class link, column: the class of rows crossing it)
        is lower triangular: every class after the classes whose rows cross its link (Kahn's peeling on
        the dense pattern, O(B^2) numpy in all plus a few calls per round); None if they form a cycle."""
        A = M != 0
        np.fill_diagonal(A, False)
        indeg = A.sum(axis=1)
        done = np.zeros(len(M), dtype=bool)
        out: list[np.ndarray] = []
        while not done.all():
            ready = _nzf((indeg == 0) & ~done)
            if not ready.size:
                return None
            done[ready] = True
            out.append(ready)
            indeg = indeg - A[:, ready].sum(axis=1)
        return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)

    @staticmethod
    def _level_order(level: np.ndarray, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Order of the classes for forward substitution: by ``level``; among levels equal to 1e-9 (ties),
        rows' classes (``src``) before the class links they cross (``dst``), by longest-path depth over
        those edges (a few numpy passes: the chains within a tie are short)."""
        B = len(level)
        o = np.argsort(level, kind="stable")
        lv = level[o]
        gap = np.ones(B, dtype=bool)
        gap[1:] = lv[1:] > lv[:-1] * (1.0 + 1e-9) + 1e-300
        grp = np.empty(B, dtype=np.int64)
        grp[o] = np.cumsum(gap)
        tie = grp[src] == grp[dst]
        s, d = src[tie], dst[tie]
        depth = np.zeros(B, dtype=np.int64)
        for _ in range(min(B, 64)):
            if not s.size:
                break
            nd = depth.copy()
            np.maximum.at(nd, d, depth[s] + 1)
            if (nd == depth).all():
                break
            depth = nd
        return np.lexsort((depth, grp))

    @staticmethod
    def _link_water_level(ov: np.ndarray, over: np.ndarray, pr: np.ndarray, pl: np.ndarray, pw: np.ndarray,
                          x: np.ndarray, rem_cap: np.ndarray) -> np.ndarray:
        """Per link in ``ov``: the level t at which its rows, each at min(its rate, t), fill its
        capacity (one link's progressive filling, the other links ignored); INF elsewhere."""
        sel = over[pl]
        lk, w, r = pl[sel], pw[sel], x[pr[sel]]
        o = np.lexsort((r, lk))
        lk, w, r = lk[o], w[o], r[o]
        nlk = len(rem_cap)
        t = np.full(nlk, _INF)
        # along each link's rows by rate: below row k the load is sum(w r) up to k, plus level x weight above
        cw = np.cumsum(w)
        cwr = np.cumsum(w * r)
        first = np.searchsorted(lk, ov)
        last = np.searchsorted(lk, ov, side="right")
        base_w = np.where(first > 0, cw[np.maximum(first - 1, 0)], 0.0)
        base_wr = np.where(first > 0, cwr[np.maximum(first - 1, 0)], 0.0)
        tot_w = cw[last - 1] - base_w
        idx = np.repeat(np.arange(len(ov)), last - first)
        below_wr = cwr - w * r - base_wr[idx]  # rows strictly before this one
        above_w = tot_w[idx] - (cw - w - base_w[idx])  # this row and the ones after
        lvl = (rem_cap[ov][idx] - below_wr) / above_w  # level if this row is the first one above it
        prev_r = np.where(np.arange(len(r)) > first[idx], np.roll(r, 1), -_INF)
        ok = (lvl <= r * (1.0 + 1e-12)) & (lvl >= prev_r * (1.0 - 1e-12))
        best = np.full(len(ov), _INF)
        np.minimum.at(best, idx[ok], lvl[ok])
        t[ov] = best
        return t

    _SAT_TOL = 1e-9
    """Relative tolerance of the parallel filling's saturation test (the sequential one's is the same), also used
    by the flow-class checks (:meth:`_class_checks`, :meth:`_class_ok`) for "at its cap", "saturated" and "faster"."""

    @staticmethod
    def _fill_parallel(m: np.ndarray, cap: np.ndarray, grp: np.ndarray, LS: np.ndarray, ns: int, e_off: np.ndarray,
                       e_seg: np.ndarray, e_link: np.ndarray, e_w: np.ndarray, nlk: int, lo: np.ndarray,
                       l_off: np.ndarray, seg_cnt: np.ndarray, seg_nrows: np.ndarray,
                       rem_cap: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Progressive filling in rounds of *local bottlenecks* (Bertsekas and Gallager's max-min
        characterization): the same rates as the sequential filling, in far fewer rounds.

        A link's *share* is its capacity left over its unfrozen rows' weight; a row's *bound* is the
        smallest share on its route (or its cap; a coupled group's: its members' smallest). A link whose
        share is at most the bound of every unfrozen row crossing it saturates at exactly its share:
        shares never fall while rows freeze at or below them, so nothing it carries freezes earlier.
        Each round freezes the rows of *every* such link (and the rows held by their caps) at once,
        where the sequential filling freezes only the globally tightest link; the rounds are the
        length of the longest chain of bottlenecks that lean on one another, not the number of
        distinct rates. A round costs O(unfrozen rows + entries) numpy.

        Returns the rates and, per row, the local link that froze it (-1: its cap; -2: its coupled
        group or a numerical fallback)."""
        k = len(m)
        tol = Fabric._SAT_TOL
        rate = np.zeros(k)
        froze = np.full(k, -2, dtype=np.int64)
        seg_fl = np.full(ns + 1, -2, dtype=np.int64)
        LSx = np.where(LS >= 0, LS, ns)  # -1 -> a padding segment with no links
        U = np.arange(k)
        seg_cnt = seg_cnt.copy()
        seg_nrows = seg_nrows.copy()
        has_seg = e_off[1:] > e_off[:-1]
        seg_start = e_off[:-1][has_seg]
        link_order = e_seg[lo]
        has_lnk = l_off[1:] > l_off[:-1]
        lnk_start = l_off[:-1][has_lnk]
        grouped = grp >= 0
        g_of = np.zeros(k, dtype=np.int64)
        ng = 0
        if np.count_nonzero(grouped):
            ug, inv = np.unique(grp[grouped], return_inverse=True)
            g_of[grouped] = inv.reshape(-1)
            ng = len(ug)
        seg_min = np.full(ns + 1, _INF)
        seg_rmin = np.full(ns + 1, _INF)
        seg_fin = np.zeros(ns + 1, dtype=bool)
        link_rmin = np.full(nlk, _INF)
        while U.size:
            cnt = np.bincount(e_link, weights=seg_cnt[e_seg] * e_w, minlength=nlk)
            live = cnt > 0
            share = np.full(nlk, _INF)
            share[live] = np.maximum(rem_cap[live], 0.0) / cnt[live]
            seg_min[:ns][has_seg] = np.minimum.reduceat(share[e_link], seg_start)
            LU = LSx[U]
            bound = np.minimum(seg_min[LU].min(axis=1), cap[U])
            gU = grouped[U]
            if ng and np.count_nonzero(gU):
                gm = np.full(ng, _INF)
                np.minimum.at(gm, g_of[U][gU], bound[gU])
                bound[gU] = gm[g_of[U][gU]]
            seg_rmin[:] = _INF
            np.minimum.at(seg_rmin, LU.reshape(-1), np.repeat(bound, LU.shape[1]))
            seg_rmin[ns] = _INF
            link_rmin[has_lnk] = np.minimum.reduceat(seg_rmin[link_order], lnk_start)
            final = live & (share <= link_rmin * (1.0 + tol))
            seg_fin[:] = False
            seg_fin[e_seg[final[e_link]]] = True
            seg_fin[ns] = False
            by_link = seg_fin[LU]
            by_cap = cap[U] <= bound * (1.0 + tol)
            new = by_link.any(axis=1) | by_cap
            fe = _nzf(final[e_link])
            seg_fl[e_seg[fe]] = e_link[fe]
            who = np.where(by_cap, -1, seg_fl[LU[np.arange(len(U)), np.argmax(by_link, axis=1)]])
            if ng and np.count_nonzero(gU) and np.count_nonzero(new):
                hit = np.zeros(ng, dtype=bool)
                hit[g_of[U][gU & new]] = True
                new |= gU & hit[g_of[U]]
            if not np.count_nonzero(new):  # numerical safety: the tightest link is always a local bottleneck
                j = int(np.argmin(share))
                sj = np.zeros(ns + 1, dtype=bool)
                sj[e_seg[e_link == j]] = True
                new = sj[LU].any(axis=1)
                bound = np.where(new, np.minimum(bound, share[j]), bound)
                who = np.full(len(U), -2, dtype=np.int64)
            r = bound[new]
            if not np.isfinite(r).all():
                raise RuntimeError("fabric: unbounded flow rate (a flow crosses no capacity-limited link)")
            F = U[new]
            rate[F] = r
            froze[F] = np.where(by_link[new].any(axis=1) | by_cap[new], who[new], -2)
            LF = LSx[F].reshape(-1)
            nk = LSx.shape[1]
            use = np.bincount(LF, weights=np.repeat(r * m[F], nk), minlength=ns + 1)[:ns]
            rem_cap -= np.bincount(e_link, weights=use[e_seg] * e_w, minlength=nlk)
            seg_cnt -= np.bincount(LF, weights=np.repeat(m[F], nk), minlength=ns + 1)[:ns]
            seg_nrows -= np.bincount(LF, minlength=ns + 1)[:ns]
            seg_cnt[seg_nrows <= 0] = 0.0
            U = U[~new]
        return rate, froze

    # ---------------------------------------------------------------- reports
    @property
    def active_flows(self) -> int:
        """Rows (flow classes) in their bandwidth phase now."""
        return self._n_active

    def active_rates(self) -> dict[str, float]:
        """Current wire rate per member of the first active row of each batch, by batch name."""
        p = self._rows
        out: dict[str, float] = {}
        for i in _nzf(p.active[: p.size]).tolist():
            out.setdefault(self._b_meta[int(p.batch[i])][0], float(p.rate[i]))
        return out

    def link_stats(self) -> list[LinkStats]:
        """Counters of every directed link, in edge order."""
        self._advance()
        return [
            LinkStats(u, v, float(self.capacity[i]), float(self.bytes_moved[i]), float(self.busy_time[i]),
                      int(self.peak_flows[i]))
            for i, (u, v) in enumerate(self.links)
        ]

    def link(self, src: str, dst: str) -> LinkStats:
        """Counters of the directed link ``src -> dst``."""
        self._advance()
        i = self.link_id[(src, dst)]
        return LinkStats(src, dst, float(self.capacity[i]), float(self.bytes_moved[i]), float(self.busy_time[i]),
                         int(self.peak_flows[i]))
