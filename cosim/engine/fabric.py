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

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import networkx as nx
import numpy as np
import simpy

__all__ = ["Fabric", "FabricConfig", "LinkStats"]

_INF = math.inf


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
    """At most this many equal-cost paths per transfer with ``multipath="split"``."""
    router: str = "auto"
    """"auto": on multi-node topologies compose paths from cached segments
    (:class:`cosim.engine.topoview.ClusterRouter`, fast for all-to-all on big
    clusters); "topology": always ask the topology's ``paths``."""
    time_tolerance: float = 1e-12
    """A flow whose remaining time at its current rate is below this (seconds)
    counts as finished; absorbs floating-point round-off."""

    def __post_init__(self) -> None:
        if not (self.bandwidth_scale > 0 and math.isfinite(self.bandwidth_scale)):
            raise ValueError(f"bandwidth_scale must be > 0, got {self.bandwidth_scale}")
        if not (self.latency_scale >= 0 and math.isfinite(self.latency_scale)):
            raise ValueError(f"latency_scale must be >= 0, got {self.latency_scale}")
        if self.multipath not in ("split", "hash"):
            raise ValueError(f"multipath must be 'split' or 'hash', got {self.multipath!r}")
        if self.router not in ("auto", "topology"):
            raise ValueError(f"router must be 'auto' or 'topology', got {self.router!r}")
        if self.max_paths < 1:
            raise ValueError(f"max_paths must be >= 1, got {self.max_paths}")


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


_K = 3
"""Segments per row (cluster route: up-segment, fabric bundle, down-segment)."""


@dataclass
class _Rows:
    """Growable struct-of-arrays of flow classes (rows)."""

    size: int = 0
    rem: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mult: np.ndarray = field(default_factory=lambda: np.zeros(0))
    lat: np.ndarray = field(default_factory=lambda: np.zeros(0))
    group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    batch: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    active: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    seg: np.ndarray = field(default_factory=lambda: np.zeros((0, _K), dtype=np.int64))

    _FILL = {"rem": 0.0, "rate": 0.0, "cap": _INF, "mult": 1.0, "lat": 0.0, "group": -1, "batch": -1,
             "active": False, "seg": -1}

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

    def keep(self, idx: np.ndarray) -> None:
        for name in self._FILL:
            a = getattr(self, name)
            b = np.full((max(len(idx), 256), *a.shape[1:]), self._FILL[name], dtype=a.dtype)
            b[: len(idx)] = a[idx]
            setattr(self, name, b)
        self.size = len(idx)


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
        for u, v, d in graph.edges(data=True):
            if "bandwidth" not in d:
                raise ValueError(f"edge {u}->{v} has no bandwidth")
            self.link_id[(u, v)] = len(self.links)
            self.links.append((u, v))
            caps.append(float(d["bandwidth"]) * float(d.get("efficiency", 1.0)) * self.config.bandwidth_scale)
            lats.append(float(d.get("latency", 0.0)) * self.config.latency_scale)
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
        """Most concurrent flows per link (multiplicity counted)."""
        self._load = np.zeros(nl)
        self._nflows = np.zeros(nl)
        # segments
        self._seg_ids: dict[Any, int] = {}
        self._seg_lat: list[float] = []
        self._seg_cap: list[float] = []
        self._seg_nlinks: list[int] = []
        self._se_parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._se_seg = np.zeros(0, dtype=np.int64)
        self._se_link = np.zeros(0, dtype=np.int64)
        self._se_w = np.zeros(0)
        self._ep: dict[str, tuple[int, int, int, int]] = {}  # endpoint -> (node, up seg, down seg, leaf code)
        self._leaf_code: dict[str, int] = {}
        # rows and batches
        self._rows = _Rows()
        self._n_active = 0
        self._b_event: list[simpy.Event | None] = []
        self._b_meta: list[tuple[str, float, str]] = []
        self._b_left = np.zeros(0, dtype=np.int64)
        self._b_deadline = np.zeros(0)
        self._t_last = env.now
        self._gen = 0
        self._solve_pending = False
        self._next_group = 0
        self.n_solves = 0
        """Number of rate re-solves so far (a cost counter)."""
        self.n_flows = 0
        """Logical flows started so far (a row of multiplicity m counts m)."""
        self.n_rows = 0
        """Solver rows (flow classes) started so far."""

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
    def segment(self, key: Any, paths: Sequence[Sequence[str]]) -> int:
        """Id of the segment ``key``: ``paths`` bundled (bytes split in proportion to
        each path's idle bottleneck capacity; at most ``max_paths`` paths). Cached by key."""
        sid = self._seg_ids.get(key)
        if sid is not None:
            return sid
        ps = [list(p) for p in paths][: self.config.max_paths]
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
        if r is not None and hasattr(r, "up_path"):
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
        rest = np.flatnonzero(si != di)
        r = self._router
        if r is not None and hasattr(r, "up_path") and self.config.multipath == "split" and rest.size:
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
                    mids[k] = -1 if la == lb else self.segment(("mid", la, lb), r.mid_paths(la, lb))
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
        self, segs: np.ndarray, nbytes: np.ndarray, *, efficiency: float = 1.0, max_rate: float = _INF,
        extra_latency: float = 0.0, link_latency: bool = True, name: str = "flows", track: str = "fabric",
        group: int = -1, multiplicity: np.ndarray | None = None, merge: bool = True,
    ) -> simpy.Event:
        """Start a batch of flows; the event succeeds when the last one has arrived.

        ``segs[k]``: the segment ids of flow k's route (rows x 3, -1 padded, from
        :meth:`route_segments`, :meth:`pair_segment` or :meth:`segment`);
        ``nbytes[k]``: its payload bytes (per member); ``multiplicity[k]``: identical
        flows it stands for. With ``merge``, flows with the same route and size are
        merged into one row (a flow class) with the summed multiplicity.
        ``max_rate`` caps each flow's payload rate; ``group`` couples all rows.
        """
        if not (0 < efficiency <= 1.0):
            raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
        segs = np.asarray(segs, dtype=np.int64).reshape(-1, _K)
        nb = np.asarray(nbytes, dtype=float).reshape(-1)
        if len(nb) != len(segs):
            raise ValueError("segs and nbytes differ in length")
        if len(nb) and ((nb < 0).any() or not np.isfinite(nb).all()):
            raise ValueError("nbytes must be finite and >= 0")
        mult = np.ones(len(nb)) if multiplicity is None else np.asarray(multiplicity, dtype=float).reshape(-1)
        if len(mult) and (mult < 1).any():
            raise ValueError("multiplicity must be >= 1")
        env = self.env
        self.n_flows += int(mult.sum())
        self._flush_segments()
        nlk = np.append(np.asarray(self._seg_nlinks, dtype=np.int64), 0)
        slat = np.append(np.asarray(self._seg_lat, dtype=float), 0.0)
        has_links = nlk[segs].sum(axis=1) > 0
        wire = nb / efficiency
        lat = (slat[segs].sum(axis=1) if link_latency else np.zeros(len(nb))) + extra_latency
        moving = has_links & (wire > 0)
        b = len(self._b_event)
        ev = env.event()
        self._b_event.append(ev)
        self._b_meta.append((name, env.now, track))
        if b >= len(self._b_left):
            nn = max(2 * len(self._b_left), 64)
            self._b_left = np.concatenate([self._b_left, np.zeros(nn - len(self._b_left), dtype=np.int64)])
            self._b_deadline = np.concatenate([self._b_deadline, np.zeros(nn - len(self._b_deadline))])
        self._b_deadline[b] = env.now + (float(lat[~moving].max()) if (~moving).any() else 0.0)
        idx = np.flatnonzero(moving)
        if not idx.size:
            self._b_left[b] = 0
            self._fire(b)
            return ev
        segs, wire, lat, mult = segs[idx], wire[idx], lat[idx], mult[idx]
        if merge and len(idx) > 1:
            key = np.column_stack([segs.astype(float), wire, lat])
            uk, inv = np.unique(key, axis=0, return_inverse=True)
            if len(uk) < len(idx):
                inv = inv.reshape(-1)
                mult = np.bincount(inv, weights=mult, minlength=len(uk))
                segs, wire, lat = uk[:, :_K].astype(np.int64), uk[:, _K], uk[:, _K + 1]
        k = len(wire)
        self._b_left[b] = k
        self._advance()
        p = self._rows
        s0 = p.size
        p.grow(s0 + k)
        sl = slice(s0, s0 + k)
        p.rem[sl] = wire
        p.rate[sl] = 0.0
        p.cap[sl] = max_rate / efficiency if math.isfinite(max_rate) else _INF
        p.mult[sl] = mult
        p.lat[sl] = lat
        p.group[sl] = group
        p.batch[sl] = b
        p.active[sl] = True
        p.seg[sl] = segs
        p.size = s0 + k
        self._n_active += k
        self.n_rows += k
        self._request_solve()
        return ev

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

    def _flush_segments(self) -> None:
        if self._se_parts:
            self._se_seg = np.concatenate([self._se_seg, *(x[0] for x in self._se_parts)])
            self._se_link = np.concatenate([self._se_link, *(x[1] for x in self._se_parts)])
            self._se_w = np.concatenate([self._se_w, *(x[2] for x in self._se_parts)])
            self._se_parts.clear()

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
        """Move remaining bytes and counters forward to ``env.now``."""
        now = self.env.now
        dt = now - self._t_last
        if dt > 0 and self._n_active:
            p = self._rows
            n = p.size
            p.rem[:n] -= p.rate[:n] * dt
            self.bytes_moved += self._load * dt
            self.busy_time += (self._nflows > 0) * dt
        self._t_last = now

    def _complete_finished(self) -> None:
        if not self._n_active:
            return
        p = self._rows
        n = p.size
        act = p.active[:n]
        rate = p.rate[:n]
        rem = p.rem[:n]
        fin = act & ((rem <= 1e-6) | ((rate > 0) & (rem <= rate * self.config.time_tolerance)))
        idx = np.flatnonzero(fin)
        if not idx.size:
            return
        p.active[idx] = False
        p.rate[idx] = 0.0
        p.rem[idx] = 0.0
        self._n_active -= len(idx)
        now = self.env.now
        bs = p.batch[idx]
        np.maximum.at(self._b_deadline, bs, now + p.lat[idx])
        ub, cnt = np.unique(bs, return_counts=True)
        self._b_left[ub] -= cnt
        for b in ub[self._b_left[ub] == 0].tolist():  # batch order = start order: deterministic
            self._fire(b)
        if n > 1024 and n > 4 * max(self._n_active, 1):
            p.keep(np.flatnonzero(p.active[:n]))

    def _solve_and_schedule(self) -> None:
        self._gen += 1
        gen = self._gen
        self._solve()
        if not self._n_active:
            return
        p = self._rows
        n = p.size
        act = p.active[:n]
        rate = p.rate[:n]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(act & (rate > 0), p.rem[:n] / rate, _INF)
        dt = float(t.min())
        if not math.isfinite(dt):
            raise RuntimeError("fabric deadlock: active flows with zero rate (a zero-capacity link?)")
        ev = self.env.timeout(max(dt, 0.0))
        ev.callbacks.append(lambda _e, g=gen: self._on_tick(g))

    def _on_tick(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later solve
        self._advance()
        self._complete_finished()
        self._solve_and_schedule()

    def _solve(self) -> None:
        """Progressive filling over the active rows (two-level incidence row -> segment -> link)."""
        self.n_solves += 1
        self._flush_segments()
        p = self._rows
        n = p.size
        nl = len(self.links)
        p.rate[:n] = 0.0
        if not self._n_active:
            self._load[:] = 0.0
            self._nflows[:] = 0.0
            return
        act = np.flatnonzero(p.active[:n])
        k = len(act)
        S = p.seg[act]
        valid = S >= 0
        rs_row = np.broadcast_to(np.arange(k)[:, None], S.shape)[valid]
        rs_seg = S[valid]
        m = p.mult[act]
        cap = p.cap[act]
        grp = p.group[act]
        nseg = len(self._seg_lat)
        seg_m = np.bincount(rs_seg, weights=m[rs_row], minlength=nseg)
        esel = seg_m[self._se_seg] > 0
        es, el, ew = self._se_seg[esel], self._se_link[esel], self._se_w[esel]
        nflows = np.bincount(el, weights=seg_m[es], minlength=nl)
        has_groups = bool((grp >= 0).any())
        capped = np.isfinite(cap)
        any_capped = bool(capped.any())
        rate = np.zeros(k)
        frozen = np.zeros(k, dtype=bool)
        rem_cap = self.capacity.copy()
        ur, us = rs_row, rs_seg  # row-segment entries of unfrozen rows
        for _ in range(k + nl + 2):
            if not ur.size:
                break
            seg_cnt = np.bincount(us, weights=m[ur], minlength=nseg)
            cnt = np.bincount(el, weights=seg_cnt[es] * ew, minlength=nl)
            used = cnt > 0
            share = np.full(nl, _INF)
            share[used] = np.maximum(rem_cap[used], 0.0) / cnt[used]
            delta = float(share.min())
            unf = np.flatnonzero(~frozen)
            if any_capped:
                head = cap[unf] - rate[unf]
                delta = min(delta, float(head.min()))
            if not math.isfinite(delta):
                raise RuntimeError("fabric: unbounded flow rate (a flow crosses no capacity-limited link)")
            rate[unf] += delta
            rem_cap -= delta * cnt
            sat = used & (rem_cap <= 1e-9 * self.capacity)
            newly = np.zeros(k, dtype=bool)
            if sat.any():
                seg_sat = np.zeros(nseg, dtype=bool)
                seg_sat[es[sat[el]]] = True
                newly[ur[seg_sat[us]]] = True
            if any_capped:
                newly[unf[capped[unf] & (head - delta <= 1e-12 * np.maximum(cap[unf], 1.0))]] = True
            if has_groups:
                g = grp[newly]
                g = g[g >= 0]
                if g.size:
                    newly |= np.isin(grp, g)
            newly &= ~frozen
            if not newly.any():  # numerical safety: freeze the tightest link's rows
                j = int(np.argmin(share))
                seg_j = np.zeros(nseg, dtype=bool)
                seg_j[es[el == j]] = True
                newly[ur[seg_j[us]]] = True
            frozen |= newly
            keep = ~frozen[ur]
            ur, us = ur[keep], us[keep]
        p.rate[act] = rate
        seg_rate = np.bincount(rs_seg, weights=(rate * m)[rs_row], minlength=nseg)
        self._load = np.bincount(el, weights=seg_rate[es] * ew, minlength=nl)
        self._nflows = nflows
        np.maximum(self.peak_flows, np.rint(nflows).astype(np.int64), out=self.peak_flows)

    # ---------------------------------------------------------------- reports
    @property
    def active_flows(self) -> int:
        """Rows (flow classes) in their bandwidth phase now."""
        return self._n_active

    def active_rates(self) -> dict[str, float]:
        """Current wire rate per member of the first active row of each batch, by batch name."""
        p = self._rows
        out: dict[str, float] = {}
        for i in np.flatnonzero(p.active[: p.size]).tolist():
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
