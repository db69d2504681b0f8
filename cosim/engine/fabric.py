"""Flow-level network model: max-min fair bandwidth sharing on directed links.

A transfer is a *flow* of bytes along a path of directed topology edges. All
flows that are in flight at the same time share every directed link they cross
by max-min fairness (progressive filling / water filling):

1. every unfrozen flow's rate rises at the same speed;
2. when a link's capacity is used up, the flows crossing it freeze at their
   current rate; when a flow reaches its own rate cap it freezes too;
3. repeat until every flow is frozen.

Rates are re-solved only when a flow starts or ends. Between those instants
rates are constant, so the engine advances with one simpy timeout to the next
completion (superseded timeouts are ignored by a generation counter).

The solver is vectorized with numpy over a flow x link incidence list (one
entry per flow per link of its path), so each water-filling round is a few
``bincount`` calls over all entries: thousands of flows cost milliseconds.

Units: bytes, seconds, bytes/s.

Modelling notes (see docs/ENGINE.md):

* Link capacity = topology ``bandwidth`` (raw, per direction, aggregate of
  ``count`` links) x link ``efficiency`` x :attr:`FabricConfig.bandwidth_scale`.
* A flow's ``efficiency`` (a protocol's payload fraction, e.g. NCCL LL carries
  8 payload bytes per 16 wire bytes) inflates its wire bytes:
  ``wire = nbytes / efficiency``. Link counters count wire bytes.
* A flow's completion fires ``latency`` after its last byte left: the sum of
  the path's link latencies plus any extra the caller adds. A single flow on
  an idle path thus takes ``latency + nbytes / (efficiency * capacity)``.
* A flow may stand for ``multiplicity`` identical flows on the same path
  (flow classes): it loads each link with ``multiplicity x rate``.
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

__all__ = ["Fabric", "FabricConfig", "Flow", "LinkStats"]

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
class Flow:
    """One transfer in flight (or a class of ``multiplicity`` identical ones)."""

    name: str
    """Label, also the trace entry's name."""
    nbytes: float
    """Payload bytes per member flow."""
    wire_bytes: float
    """Bytes on the wire per member flow (``nbytes / efficiency``)."""
    links: np.ndarray
    """Link indices of the path, in order."""
    latency: float
    """Seconds from the last byte leaving to completion (path + extra latency)."""
    done: simpy.Event
    """Succeeds (value: this flow) when the last byte has arrived."""
    start: float
    """Simulated time the flow started (s)."""
    multiplicity: int = 1
    """Number of identical flows this one stands for."""
    max_rate: float = _INF
    """Cap on each member's wire rate (bytes/s)."""
    group: int = -1
    """Coupled group id, or -1."""
    track: str = "fabric"
    """Timeline track the trace entry goes to."""
    end: float | None = None
    """Time the last byte left (s); set when the bandwidth phase ends."""
    slot: int = -1


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


@dataclass
class _Pool:
    """Growable per-slot arrays for flows (struct of arrays)."""

    size: int = 0
    rem: np.ndarray = field(default_factory=lambda: np.zeros(0))
    rate: np.ndarray = field(default_factory=lambda: np.zeros(0))
    cap: np.ndarray = field(default_factory=lambda: np.zeros(0))
    mult: np.ndarray = field(default_factory=lambda: np.zeros(0))
    group: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    active: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def grow(self, need: int) -> None:
        cur = len(self.rem)
        if need <= cur:
            return
        new = max(need, 2 * cur, 256)

        def ext(a: np.ndarray, fill: Any) -> np.ndarray:
            b = np.full(new, fill, dtype=a.dtype)
            b[:cur] = a
            return b

        self.rem = ext(self.rem, 0.0)
        self.rate = ext(self.rate, 0.0)
        self.cap = ext(self.cap, _INF)
        self.mult = ext(self.mult, 1.0)
        self.group = ext(self.group, -1)
        self.active = ext(self.active, False)


class Fabric:
    """Directed links of a topology graph, shared by flows with max-min fairness.

    Args:
        env: the simpy environment.
        graph: topology graph; every directed edge needs ``bandwidth`` (bytes/s),
            and may have ``efficiency`` (0..1, default 1) and ``latency`` (s, default 0).
        config: :class:`FabricConfig`.
        router: ``router(src, dst) -> list of paths`` (lists of node ids); default:
            all shortest paths by hop count in ``graph``.
        trace: optional callback ``trace(name, start, end, track)`` called when a
            flow completes.
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
        """Most concurrent flows per link."""
        self._load = np.zeros(nl)  # current wire rate per link (bytes/s)
        self._nflows = np.zeros(nl)  # current flow count per link
        self._pool = _Pool()
        self._flows: list[Flow | None] = []
        self._inc_f = np.zeros(0, dtype=np.int64)
        self._inc_l = np.zeros(0, dtype=np.int64)
        self._inc_parts_f: list[np.ndarray] = []
        self._inc_parts_l: list[np.ndarray] = []
        self._n_active = 0
        self._t_last = env.now
        self._gen = 0
        self._solve_pending = False
        self._next_group = 0
        self._path_cache: dict[tuple[str, str], list[tuple[np.ndarray, float, float]]] = {}
        self.n_solves = 0
        """Number of rate re-solves so far (a cost counter)."""
        self.n_flows = 0
        """Number of flows started so far (multiplicity counted once)."""

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

    def _routes(self, src: str, dst: str) -> list[tuple[np.ndarray, float, float]]:
        """Cached (links, share, latency) per path for a src/dst pair (split mode)."""
        key = (src, dst)
        hit = self._path_cache.get(key)
        if hit is not None:
            return hit
        ps = self.paths(src, dst)[: self.config.max_paths]
        links = [self.path_links(p) for p in ps]
        caps = np.array([self.capacity[li].min() if len(li) else _INF for li in links])
        if not np.all(np.isfinite(caps)):
            caps = np.ones(len(links))
        shares = caps / caps.sum()
        out = [(li, float(s), float(self.latency[li].sum())) for li, s in zip(links, shares)]
        self._path_cache[key] = out
        return out

    def path_capacity(self, src: str, dst: str) -> float:
        """Idle-fabric bandwidth from ``src`` to ``dst`` over all used paths (bytes/s)."""
        if src == dst:
            return _INF
        routes = self._routes(src, dst) if self.config.multipath == "split" else self._routes(src, dst)[:1]
        if self.config.multipath == "hash":
            li = routes[0][0]
            return float(self.capacity[li].min())
        return float(min(self.capacity[li].min() / s for li, s, _ in routes if s > 0))

    def path_latency(self, src: str, dst: str) -> float:
        """Latency of the first path from ``src`` to ``dst`` (s)."""
        if src == dst:
            return 0.0
        return self._routes(src, dst)[0][2]

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
                capacity (protocol efficiency, usually <= 1; a calibrated value may exceed
                1 a little where a path beats the catalog's link efficiency; at most 2).
            max_rate: cap on the payload rate of the whole transfer (bytes/s),
                e.g. a NIC message-rate limit or SM-limited copy speed.
            extra_latency: seconds added after the last byte (NIC, protocol).
            link_latency: add the path's link latencies.
            name, track: trace entry of the flow.
            group: coupled-group id from :meth:`new_group`, or -1.
            multiplicity: identical flows this call stands for.
            key: ECMP hash key with ``multipath="hash"``.
        """
        if not (0 < efficiency <= 2.0):
            raise ValueError(f"efficiency must be in (0, 2], got {efficiency}")
        if nbytes < 0 or not math.isfinite(nbytes):
            raise ValueError(f"nbytes must be finite and >= 0, got {nbytes}")
        if multiplicity < 1:
            raise ValueError("multiplicity must be >= 1")
        if dst is None:
            path = list(src)  # type: ignore[arg-type]
            if len(path) < 2:
                return self._instant(name, extra_latency, track)
            li = self.path_links(path)
            routes = [(li, 1.0, float(self.latency[li].sum()))]
        else:
            if src == dst:
                return self._instant(name, extra_latency, track)
            routes = self._routes(str(src), dst)
            if self.config.multipath == "hash":
                routes = [(routes[key % len(routes)][0], 1.0, routes[key % len(routes)][2])]
        done = self.env.event()
        subs: list[simpy.Event] = []
        for li, share, lat in routes:
            if share <= 0:
                continue
            wire = nbytes * share / efficiency
            cap = max_rate * share / efficiency if math.isfinite(max_rate) else _INF
            latency = (lat if link_latency else 0.0) + extra_latency
            subs.append(self._start(name, wire, nbytes * share, li, latency, cap, group, multiplicity, track))
        if len(subs) == 1:
            return subs[0]
        cond = self.env.all_of(subs)
        cond.callbacks.append(lambda _ev: done.succeed(None))
        return done

    def _instant(self, name: str, latency: float, track: str) -> simpy.Event:
        ev = self.env.timeout(latency)
        if self._trace is not None:
            t0 = self.env.now
            ev.callbacks.append(lambda _e: self._trace(name, t0, self.env.now, track))  # type: ignore[misc]
        return ev

    def _start(
        self, name: str, wire: float, payload: float, links: np.ndarray, latency: float, cap: float,
        group: int, mult: int, track: str,
    ) -> simpy.Event:
        env = self.env
        ev = env.event()
        flow = Flow(name, payload, wire, links, latency, ev, env.now, mult, cap, group, track)
        self.n_flows += 1
        if wire <= 0 or len(links) == 0:
            flow.end = env.now
            self._finish_latency(flow)
            return ev
        self._advance()
        p = self._pool
        slot = p.size
        p.grow(slot + 1)
        p.size = slot + 1
        p.rem[slot] = wire
        p.rate[slot] = 0.0
        p.cap[slot] = cap
        p.mult[slot] = float(mult)
        p.group[slot] = group
        p.active[slot] = True
        flow.slot = slot
        self._flows.append(flow)
        self._inc_parts_f.append(np.full(len(links), slot, dtype=np.int64))
        self._inc_parts_l.append(links)
        self._n_active += 1
        self._request_solve()
        return ev

    def _finish_latency(self, flow: Flow) -> None:
        def fire(_e: Any = None) -> None:
            if self._trace is not None:
                self._trace(flow.name, flow.start, self.env.now, flow.track)
            flow.done.succeed(flow)

        if flow.latency > 0:
            self.env.timeout(flow.latency).callbacks.append(fire)
        else:
            fire()

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
            p = self._pool
            n = p.size
            p.rem[:n] -= p.rate[:n] * dt
            self.bytes_moved += self._load * dt
            self.busy_time += (self._nflows > 0) * dt
        self._t_last = now

    def _flush_incidence(self) -> None:
        if self._inc_parts_f:
            self._inc_f = np.concatenate([self._inc_f, *self._inc_parts_f])
            self._inc_l = np.concatenate([self._inc_l, *self._inc_parts_l])
            self._inc_parts_f.clear()
            self._inc_parts_l.clear()

    def _compact(self) -> None:
        """Drop finished flows from the slot arrays and incidence list."""
        p = self._pool
        n = p.size
        keep = np.flatnonzero(p.active[:n])
        remap = np.full(n, -1, dtype=np.int64)
        remap[keep] = np.arange(len(keep))
        for name in ("rem", "rate", "cap", "mult", "group", "active"):
            arr = getattr(p, name)
            new = arr[keep].copy()
            full = np.zeros(max(len(keep), 256), dtype=arr.dtype)
            if name == "cap":
                full[:] = _INF
            elif name == "mult":
                full[:] = 1.0
            elif name == "group":
                full[:] = -1
            full[: len(keep)] = new
            setattr(p, name, full)
        p.size = len(keep)
        self._flows = [self._flows[i] for i in keep]
        for i, f in enumerate(self._flows):
            assert f is not None
            f.slot = i
        if len(self._inc_f):
            m = remap[self._inc_f] >= 0
            self._inc_f = remap[self._inc_f[m]]
            self._inc_l = self._inc_l[m]

    def _complete_finished(self) -> None:
        p = self._pool
        n = p.size
        if not self._n_active:
            return
        act = p.active[:n]
        rate = p.rate[:n]
        rem = p.rem[:n]
        with np.errstate(divide="ignore", invalid="ignore"):
            fin = act & ((rem <= 1e-6) | ((rate > 0) & (rem <= rate * self.config.time_tolerance)))
        idx = np.flatnonzero(fin)
        if not idx.size:
            return
        p.active[idx] = False
        p.rate[idx] = 0.0
        p.rem[idx] = 0.0
        self._n_active -= len(idx)
        now = self.env.now
        for i in idx:  # slot order = start order: deterministic
            f = self._flows[i]
            assert f is not None
            f.end = now
            self._finish_latency(f)
        if p.size > 1024 and p.size > 4 * max(self._n_active, 1):
            self._flush_incidence()
            self._compact()

    def _solve_and_schedule(self) -> None:
        self._gen += 1
        gen = self._gen
        self._solve()
        if not self._n_active:
            return
        p = self._pool
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
        """Progressive filling over the active flows; sets rates, link loads."""
        self.n_solves += 1
        self._flush_incidence()
        p = self._pool
        n = p.size
        nl = len(self.links)
        p.rate[:n] = 0.0
        if not self._n_active:
            self._load[:] = 0.0
            self._nflows[:] = 0.0
            return
        active = p.active[:n]
        emask = active[self._inc_f]
        ef = self._inc_f[emask]
        el = self._inc_l[emask]
        mult = p.mult[:n]
        w = mult[ef]
        fcap = p.cap[:n]
        group = p.group[:n]
        has_groups = bool((group[active] >= 0).any())
        rate = np.zeros(n)
        frozen = ~active
        rem_cap = self.capacity.copy()
        nflows = np.bincount(el, weights=w, minlength=nl)
        for _ in range(n + nl + 2):
            unf_e = ~frozen[ef]
            if not unf_e.any():
                break
            cnt = np.bincount(el[unf_e], weights=w[unf_e], minlength=nl)
            used = cnt > 0
            share = np.full(nl, _INF)
            share[used] = np.maximum(rem_cap[used], 0.0) / cnt[used]
            unf_f = np.flatnonzero(~frozen)
            head = fcap[unf_f] - rate[unf_f]
            delta = min(float(share.min()), float(head.min()) if head.size else _INF)
            if not math.isfinite(delta):
                raise RuntimeError("fabric: unbounded flow rate (a flow crosses no capacity-limited link)")
            rate[unf_f] += delta
            rem_cap -= delta * cnt
            sat = used & (rem_cap <= 1e-9 * self.capacity)
            newly = np.zeros(n, dtype=bool)
            newly[ef[unf_e & sat[el]]] = True
            capped = np.isfinite(head)
            if capped.any():
                uc = unf_f[capped]
                newly[uc[head[capped] - delta <= 1e-12 * np.maximum(fcap[uc], 1.0)]] = True
            if has_groups:
                g = group[newly]
                g = g[g >= 0]
                if g.size:
                    newly |= np.isin(group, g) & ~frozen
            if not newly.any():  # numerical safety: freeze the tightest link's flows
                j = int(np.argmin(share))
                newly[ef[unf_e & (el == j)]] = True
            frozen |= newly
        p.rate[:n] = rate
        self._load = np.bincount(el, weights=rate[ef] * w, minlength=nl)
        self._nflows = nflows
        np.maximum(self.peak_flows, nflows.astype(np.int64), out=self.peak_flows)

    # ---------------------------------------------------------------- reports
    @property
    def active_flows(self) -> int:
        """Flows in their bandwidth phase now."""
        return self._n_active

    def current_rate(self, flow: Flow) -> float:
        """Current wire rate of one member of ``flow`` (bytes/s)."""
        if flow.slot < 0 or not self._pool.active[flow.slot]:
            return 0.0
        return float(self._pool.rate[flow.slot])

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
