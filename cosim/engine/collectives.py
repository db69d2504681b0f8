"""Collectives decomposed into flows on the fabric.

Each (op, algorithm) becomes a *plan*: a list of phases, each a list of flows
``(src, dst, bytes-per-byte-of-size)``; phases run one after another, the flows
of a phase run together. A pipelined algorithm (ring, tree, NVLS) is one phase
whose flows carry everything each edge moves over the whole collective, coupled
so that they advance at one rate (the pipeline runs at its slowest edge). NCCL's
per-step latencies are a fixed delay before the flows (see :mod:`nccl`).

Plans (n ranks, size S as in nccl-tests):

=============== ======= ========================================================
op              algo    flows
=============== ======= ========================================================
all_reduce      ring    rank -> next: 2(n-1)/n S (several nodes: one ring per NIC
                        rail, 2(n-1)/n S/R per hop, leaving each node by PXN
                        through the rail's NIC: see ``_ring_orders``)
all_reduce      tree    two trees (chain in node, binary tree of nodes): S/2
                        up and S/2 down per tree edge
all_reduce      nvls    GPU <-> NVSwitch planes: S each way (in-switch reduction:
                        multimem ld_reduce pulls every GPU's copy of each shard,
                        multimem st multicasts the reduced shard back)
all_reduce      nvls_   NVLS inside each node (S each way) + per rail r (local
                tree    GPU r of each node) two mirrored binary trees of
                        nodes, S/(2 ppn) up and down per tree edge
all_reduce      hier    phases: intra-node ring reduce-scatter (g-1)/g S; ring
                        all-reduce among same-index GPUs across nodes, S/g; intra
                        all-gather (g-1)/g S
all_gather,     ring    rank -> next: (n-1)/n S
reduce_scatter  nvls    all_gather: GPU -> NVSwitch S/n (multicast store), NVSwitch
                        -> GPU (n-1)/n S; reduce_scatter: the reverse
broadcast       ring    chain from root: S per edge (several nodes: one chain per
                        rail ring from the root, S/R per hop)
reduce          ring    chain to root: S per edge (several nodes: as broadcast,
                        reversed)
all_to_all      p2p     every rank -> every other: S/n (uncoupled)
all_to_allv     p2p     rank i -> j: matrix[i][j] bytes (uncoupled)
send_recv       p2p     rank i -> i+1 (mod n): S (nccl-tests sendrecv)
=============== ======= ========================================================
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import simpy

from cosim.engine.nccl import BUSBW_FACTOR, OPS, Shape
from cosim.errors import CosimInputError

if TYPE_CHECKING:
    from cosim.engine.simulator import Simulator

__all__ = ["ALGOS_FOR", "CollectiveCall", "CollectiveResult", "Collectives"]

ALGOS_FOR = {
    "all_reduce": ("ring", "tree", "nvls", "nvls_tree", "hier"),
    "all_gather": ("ring", "nvls"),
    "reduce_scatter": ("ring", "nvls"),
    "broadcast": ("ring",),
    "reduce": ("ring",),
    "all_to_all": ("p2p",),
    "all_to_allv": ("p2p",),
    "send_recv": ("p2p",),
}

_NVSW = "@nvswitch"  # plan endpoint: the GPU's NVSwitch planes


@dataclass
class CollectiveResult:
    """Outcome of one collective."""

    op: str
    nbytes: float
    """Size S as nccl-tests defines it (bytes); total bytes for all_to_allv."""
    ranks: list[str]
    algo: str
    proto: str
    start: float
    end: float
    latency: float
    """The fixed latency part (s)."""
    bytes_on_fabric: float = 0.0
    """Payload bytes the collective's flows carried."""

    @property
    def time(self) -> float:
        return self.end - self.start

    @property
    def algbw(self) -> float:
        return self.nbytes / self.time if self.time > 0 else math.inf

    @property
    def busbw(self) -> float:
        return self.algbw * BUSBW_FACTOR(self.op, len(self.ranks))


_PLAN_IDS = itertools.count()


def _first_of(env: simpy.Environment, a: simpy.Event, b: simpy.Event) -> simpy.Event:
    """An event that succeeds (no value) as the first of ``a`` and ``b`` is processed: ``env.any_of([a, b])``
    scheduled at the same instant in the same order (the same event sequence), without a condition's value."""
    out = env.event()

    def fire(_: simpy.Event) -> None:
        if not out.triggered:
            out.succeed()

    for ev in (a, b):
        if ev.callbacks is None:
            fire(ev)
        else:
            ev.callbacks.append(fire)
    return out


def _urgent(env: simpy.Environment, fn: Callable[[simpy.Event], None]) -> None:
    """Call ``fn`` when an event scheduled now at urgent priority is processed: when a process started now
    (``env.process``) would take its first step."""
    ev = simpy.Event(env)
    ev._ok = True
    ev._value = None
    assert ev.callbacks is not None
    ev.callbacks.append(fn)
    env.schedule(ev, simpy.events.URGENT)


def _drive(gen: Generator[simpy.Event, Any, None]) -> None:
    """Run ``gen`` as a simpy process would (resumed as each event it yields is processed, at once when that
    event already was), without the process's own start and end events."""

    def step(ev: simpy.Event | None) -> None:
        while True:
            try:
                if ev is None or ev._ok:
                    nxt = gen.send(None if ev is None else ev._value)
                else:
                    ev._defused = True
                    nxt = gen.throw(ev._value)
            except StopIteration:
                return
            if nxt.callbacks is not None:
                nxt.callbacks.append(step)
                return
            ev = nxt

    step(None)


def _flat_usage(usage: list[tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, ...]:
    """Observer interval groups (links, starts, end, flows, bytes) as one set of arrays, the end per interval."""
    return (np.concatenate([u[0] for u in usage]), np.concatenate([u[1] for u in usage]),
            np.concatenate([np.full(len(u[0]), u[2]) for u in usage]), np.concatenate([u[3] for u in usage]),
            np.concatenate([u[4] for u in usage]))


@dataclass
class _Plan:
    names: list[str]
    """Endpoints (ranks, and ``@nvswitch`` for NVLS)."""
    phases: list[tuple[np.ndarray, np.ndarray, np.ndarray]]
    """Per phase: source index, destination index, bytes per byte of size."""
    coupled: bool
    rings: int = 1
    """Rings (channels' NIC rails) a multi-node ring plan runs side by side, each rank a row per ring:
    the per-rank rate cap is shared among them (each row gets ``cap / rings``)."""
    algo: str = ""
    """NCCL's algorithm the plan runs (its flows that cross nodes get its channels' network rate,
    ``NcclParams.net_flow_cap``); "" for other kernels (DeepEP)."""
    uid: int = field(default_factory=lambda: next(_PLAN_IDS))
    """Unique id (keys the fabric's prepared batches of this plan's phases)."""

    @classmethod
    def of(cls, phases: list[list[tuple[str, str, float]]], coupled: bool) -> _Plan:
        names: dict[str, int] = {}
        out = []
        for ph in phases:
            si = np.array([names.setdefault(a, len(names)) for a, _, _ in ph], dtype=np.int64)
            di = np.array([names.setdefault(b, len(names)) for _, b, _ in ph], dtype=np.int64)
            out.append((si, di, np.array([f for _, _, f in ph], dtype=float)))
        return cls(list(names), out, coupled)

    def max_factor(self) -> float:
        """Largest bytes per byte of size on one flow (for rate caps)."""
        return max((float(f.max()) for _, _, f in self.phases if len(f)), default=0.0)


@dataclass
class _Traj:
    """A memo run's trajectory: the state after each of its events (solves and phase starts), relative to its
    start. Between two events rates are constant, so the state at any time is the last checkpoint before it
    advanced linearly (what a scratch re-run up to that time would leave, without re-running it)."""

    start: float
    """The run's start on the scratch clock."""
    times: np.ndarray
    """Checkpoint times on the scratch clock, non-decreasing (compared with ``start + tau``: the same float
    comparison a scratch run stopped at ``tau`` makes, so an event exactly at ``tau`` stays after it)."""
    phase: np.ndarray
    """Phase running at each checkpoint (-1: fixed latency)."""
    ulen: np.ndarray
    """Observer interval groups closed by each checkpoint (a prefix of the memo's ``usage``)."""
    r_off: np.ndarray
    """Per checkpoint, its active rows in ``r_id`` / ``r_rem`` / ``r_rate`` (CSR offsets)."""
    r_id: np.ndarray
    """Active rows (index into the static row arrays)."""
    r_rem: np.ndarray
    """Wire bytes left per member when the row's rate was last set (at ``r_t0``, scratch clock)."""
    r_t0: np.ndarray
    r_rate: np.ndarray
    """Wire rate per member from the checkpoint on."""
    seg: np.ndarray
    """Per row of the run: scratch segment ids (x 3), multiplicity, wire rate cap, group, batch (below)."""
    mult: np.ndarray
    cap: np.ndarray
    group: np.ndarray
    batch: np.ndarray
    o_off: np.ndarray
    """Per checkpoint, the observer's open intervals (CSR offsets into the ``o_*`` arrays)."""
    o_link: np.ndarray
    o_t0: np.ndarray
    o_cnt: np.ndarray
    o_load: np.ndarray
    cnt: np.ndarray
    """Per checkpoint x memo link: wire bytes, busy s, peak flows so far; load and whether it carries a flow."""
    nbytes: np.ndarray
    busy: np.ndarray
    peak: np.ndarray
    load: np.ndarray

    def size(self) -> int:
        """Numbers held (for the memory cap)."""
        return sum(int(np.size(getattr(self, f.name))) for f in fields(self))


@dataclass
class _Memo:
    """A collective's run alone on an idle fabric (relative times, per-link counters)."""

    duration: float
    """Start to end, fixed latency included (s)."""
    moved: float
    """Payload bytes of its flows."""
    links: np.ndarray
    """Links its flows use."""
    bytes: np.ndarray
    """Wire bytes per link of ``links``."""
    busy: np.ndarray
    """Seconds each link of ``links`` carried a flow."""
    peak: np.ndarray
    """Most concurrent flows per link of ``links``."""
    usage: list[tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]]
    """Observer intervals (links, start, end, flows, bytes), times relative to its start."""
    phase: int
    """Phase running when the run stopped (-1: still in its fixed latency)."""
    traj: _Traj | None = None
    """Its trajectory (full runs, within :data:`_TRAJ_FLOATS`), for materializing without a re-run."""
    _flat: tuple[np.ndarray, ...] | None = None
    _off: list[int] | None = None

    def flat_usage(self) -> tuple[np.ndarray, ...]:
        """:attr:`usage` as one set of arrays (links, starts, ends, flows, bytes), built once: a hit hands the
        observer one call, not one per interval group (the link report concatenates far fewer parts)."""
        if self._flat is None:
            self._flat = _flat_usage(self.usage)
        return self._flat

    def usage_upto(self, n: int, extra: tuple[Any, ...] | None) -> tuple[np.ndarray, ...]:
        """The first ``n`` interval groups of :attr:`usage`, then ``extra`` (one more group, or None), as
        :func:`_flat_usage` of them gives them: slices of :meth:`flat_usage` (O(1)), one concatenation with
        ``extra``."""
        flat = self.flat_usage()
        if self._off is None:
            self._off = np.cumsum([0, *(len(u[0]) for u in self.usage)]).tolist()
        m = self._off[n]
        head = tuple(x[:m] for x in flat)
        if extra is None:
            return head
        return tuple(np.concatenate([h, e]) for h, e in zip(head, _flat_usage([extra])))


_TRAJ_FLOATS = 16_000_000
"""Numbers the memos' trajectories may hold in all (128 MB); past it, new memos record none and their
materializations re-run the scratch copy up to the hit."""


class _Recorder:
    """Records a memo run's :class:`_Traj`: a checkpoint after each solve and phase start of the scratch fabric.
    Per checkpoint O(active rows + links) numpy; the link counters are kept as changes only."""

    def __init__(self, fab: Any, t0: float, b0: np.ndarray, z0: np.ndarray, phase: list[int],
                 usage: list[Any]) -> None:
        self.fab, self.t0, self.b0, self.z0, self.phase, self.usage = fab, t0, b0, z0, phase, usage
        self.s0 = fab._rows.size  # the run's rows are s0.. (no compaction while recording)
        self.t: list[float] = []
        self.ph: list[int] = []
        self.ul: list[int] = []
        self.ids: list[np.ndarray] = []
        self.rem: list[np.ndarray] = []
        self.t0s: list[np.ndarray] = []
        self.rate: list[np.ndarray] = []
        self.open: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
        nl = len(fab.links)
        self.last = [b0.copy(), z0.copy(), np.zeros(nl), np.zeros(nl), np.zeros(nl)]
        self.chg: list[list[tuple[np.ndarray, np.ndarray]]] = []

    def checkpoint(self) -> None:
        fab = self.fab
        p = fab._rows
        now = fab.env.now
        self.t.append(now)
        self.ph.append(self.phase[0])
        self.ul.append(len(self.usage))
        idx = np.flatnonzero(p.active[: p.size])
        rate = p.rate[idx]
        self.ids.append(idx - self.s0)
        self.rem.append(p.rem[idx])  # the rows' own lazy form: bytes left at t0, the rate since
        self.t0s.append(p.t0[idx])
        self.rate.append(rate.copy())
        o = fab._obs
        if o is None:
            self.open.append((np.zeros(0, dtype=np.int64), np.zeros(0), np.zeros(0), np.zeros(0)))
        else:
            k = np.flatnonzero(np.isfinite(o[0]))
            self.open.append((k, o[0][k], o[1][k], o[2][k]))
        dt = now - fab._t_last  # the counters as :meth:`Fabric._advance` would leave them now (without advancing)
        act = dt > 0 and fab._n_active
        cur = [fab.bytes_moved + fab._load * dt if act else fab.bytes_moved,
               fab.busy_time + (fab._nflows > 0.5) * dt if act else fab.busy_time,
               fab.peak_flows.astype(float), fab._load, (fab._nflows > 0.5).astype(float)]
        ch = []
        for c, last in zip(cur, self.last):
            k = np.flatnonzero(c != last)
            ch.append((k, c[k].copy()))
            last[k] = c[k]
        self.chg.append(ch)

    def finish(self, links: np.ndarray) -> _Traj:
        """The trajectory, its link counters over the memo's ``links``."""
        p = self.fab._rows
        sl = slice(self.s0, p.size)
        C = len(self.t)
        nl = len(self.fab.links)
        cur = [self.b0.copy(), self.z0.copy(), np.zeros(nl), np.zeros(nl), np.zeros(nl)]
        dense = [np.zeros((C, len(links))) for _ in cur]
        for i, ch in enumerate(self.chg):
            for j, (k, v) in enumerate(ch):
                cur[j][k] = v
                dense[j][i] = cur[j][links]
        dense[0] -= self.b0[links]
        dense[1] -= self.z0[links]

        def off(parts: list[Any]) -> np.ndarray:
            o = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([len(x) for x in parts], out=o[1:])
            return o

        def cat(parts: list[np.ndarray], dtype: Any = float) -> np.ndarray:
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        op = self.open
        return _Traj(self.t0, np.array(self.t), np.array(self.ph, dtype=np.int64), np.array(self.ul, dtype=np.int64),
                     off(self.ids), cat(self.ids, np.int64), cat(self.rem), cat(self.t0s), cat(self.rate),
                     p.seg[sl].copy(), p.mult[sl].copy(), p.cap[sl].copy(), p.group[sl].copy(), p.batch[sl].copy(),
                     off([x[0] for x in op]), cat([x[0] for x in op], np.int64), cat([x[1] for x in op]),
                     cat([x[2] for x in op]), cat([x[3] for x in op]),
                     dense[4], dense[0], dense[1], dense[2], dense[3])


def _at_state(memo: _Memo, tau: float) -> tuple[int, int, np.ndarray, tuple[np.ndarray, ...], int,
                                                 tuple[Any, ...] | None]:
    """The state of ``memo``'s run ``tau`` s after its start from its trajectory (what a scratch run stopped
    there leaves: events at tau not yet processed), but for the active rows' static columns (:func:`_static_rows`
    of the checkpoint): (phase, checkpoint (-1: none yet), the active rows' bytes left, link counters for
    :meth:`Fabric.add_counters`, closed observer groups (a prefix of ``memo.usage``: :meth:`_Memo.usage_upto`),
    the group of the intervals open at tau or None). O(rows + links)."""
    tr = memo.traj
    assert tr is not None
    tt = tr.start + tau
    i = int(np.searchsorted(tr.times, tt, side="left")) - 1
    if i < 0:
        z = np.zeros(len(memo.links))
        return -1, -1, np.zeros(0), (memo.links, z, z.copy(), np.zeros(len(memo.links), dtype=np.int64)), 0, None
    dt = tt - float(tr.times[i])
    sl = slice(int(tr.r_off[i]), int(tr.r_off[i + 1]))
    rem = np.maximum(tr.r_rem[sl] - tr.r_rate[sl] * (tt - tr.r_t0[sl]), 0.0)
    counters = (memo.links, tr.nbytes[i] + tr.load[i] * dt, tr.busy[i] + tr.cnt[i] * dt,
                tr.peak[i].astype(np.int64))
    o = slice(int(tr.o_off[i]), int(tr.o_off[i + 1]))
    st = tr.o_t0[o]
    ok = st < tt
    extra = None
    if ok.any():
        extra = (tr.o_link[o][ok], st[ok] - tr.start, tt - tr.start, tr.o_cnt[o][ok], tr.o_load[o][ok] * (tt - st[ok]))
    return int(tr.phase[i]), i, rem, counters, int(tr.ulen[i]), extra


def _static_rows(tr: _Traj, i: int) -> tuple[np.ndarray, ...]:
    """The rows active at checkpoint ``i`` (-1: none): (scratch segments, multiplicity, wire rate cap, group,
    batch), as :meth:`Fabric.snapshot_rows` gives them but for the bytes left."""
    if i < 0:
        e = np.zeros(0, dtype=np.int64)
        return np.zeros((0, 3), dtype=np.int64), np.zeros(0), np.zeros(0), e, e
    ids = tr.r_id[int(tr.r_off[i]) : int(tr.r_off[i + 1])]
    return tr.seg[ids], tr.mult[ids], tr.cap[ids], tr.group[ids], tr.batch[ids]


class CollectiveCall:
    """A rendezvous: a collective that starts when every rank has arrived.

    Get one from :meth:`Simulator.collective_call`; each rank calls
    :meth:`arrive` (from its own process) and waits on the returned event,
    which succeeds with the :class:`CollectiveResult` when the collective ends.
    """

    def __init__(self, sim: Simulator, key: Any, op: str, ranks: Sequence[str], nbytes: float, **kw: Any) -> None:
        self.sim = sim
        self.key = key
        self.op = op
        self.ranks = list(ranks)
        self.nbytes = nbytes
        self.kw = kw
        self.arrived: dict[str, float] = {}
        self.done = sim.env.event()
        """Succeeds with the :class:`CollectiveResult`."""

    def arrive(self, rank: str) -> simpy.Event:
        if rank not in self.ranks:
            raise ValueError(f"{rank} is not a member of collective {self.key!r}")
        if rank in self.arrived:
            raise ValueError(f"{rank} arrived twice at collective {self.key!r}")
        self.arrived[rank] = self.sim.env.now
        if len(self.arrived) == len(self.ranks):
            ev = self.sim.collectives.run(self.op, self.ranks, self.nbytes, **self.kw)
            def finish(e: simpy.Event) -> None:
                self.done.succeed(e.value)

            ev.callbacks.append(finish)
            self.sim.forget_call(self.key)
        return self.done


class Collectives:
    """Builds plans, picks algorithm and protocol, and runs collectives on a simulator's fabric."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.params = sim.nccl_params
        self._plans: dict[tuple[Any, ...], _Plan] = {}
        self._shapes: dict[tuple[Any, ...], Shape] = {}
        self.results: list[CollectiveResult] = []
        self._unit: dict[tuple[Any, ...], float] = {}
        self._memo: dict[Any, _Memo] = {}
        self._chosen: dict[tuple[Any, ...], tuple[str, str]] = {}
        self._scratch: Simulator | None = None
        self._seg_map = np.full(0, -1, dtype=np.int64)
        self._rec: Any = None  # a memo run's checkpoint recorder (scratch simulator only)
        self._runs: dict[Any, tuple[str, str, _Plan, float, Any, float, float, float, float | None]] = {}
        """(op, ranks, size, algo, proto, root, channels) -> what :meth:`run` works out for it (not all_to_allv)."""
        self._traj_floats = 0  # numbers held by the memos' trajectories
        """Scratch fabric's segment id -> this fabric's (both append-only): materializing copies each once."""
        self._nic: dict[str, tuple[int, float, float, float, bool, float]] = {}
        self._netcap: dict[tuple[str, tuple[str, ...]], float] = {}
        self._nvlf: dict[str, float] = {}
        self._a2av_plans: dict[Any, _Plan] = {}
        self._phases: dict[tuple[Any, ...], list[tuple[np.ndarray, np.ndarray, float, float | np.ndarray, int]]] = {}
        self._moved: dict[tuple[int, float, int], float] = {}  # (plan, scale, k) -> payload of phases 0..k-1
        self._mat: dict[Any, list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]]] = {}
        """(trajectory, checkpoint) -> its rows by batch (:meth:`_row_batches`), for materializations there."""
        """(plan, phase, size, efficiencies, cap) -> the phase's batches (segments, bytes, efficiency, rate cap,
        group slot): routes and NIC caps computed once per repeated phase."""

    # ----------------------------------------------------------- topology facts
    def _hw_class(self, src: str, dst: str) -> str:
        """nvswitch, nvlink, pci or net: the slowest kind of hop from src to dst."""
        topo = self.sim.topo
        path = self.sim.fabric.paths(src, dst)[0]
        kinds = {topo.kind_of(n) for n in path[1:-1]}
        if "nic" in kinds or "fabric_switch" in kinds:
            return "net"
        if kinds & {"pcie_switch", "cpu"}:
            return "pci"
        if "nvswitch" in kinds:
            return "nvswitch"
        return "nvlink"

    def shape(self, op: str, ranks: Sequence[str]) -> Shape:
        key = (op, tuple(ranks))
        s = self._shapes.get(key)
        if s is not None:
            return s
        topo = self.sim.topo
        nodes: dict[int, list[str]] = {}
        for r in ranks:
            nodes.setdefault(topo.node_of(r), []).append(r)
        order = {"nvswitch": 0, "nvlink": 1, "pci": 2}
        worst = "none"
        for local in nodes.values():
            for a, b in zip(local, local[1:] + local[:1]):
                if a == b:
                    continue
                c = self._hw_class(a, b)
                if c != "net" and (worst == "none" or order[c] > order[worst]):
                    worst = c
        nn = len(nodes)
        ppn = max(len(v) for v in nodes.values())
        nvls = False
        # NCCL enables NVLS only with more than 2 GPUs per node (nvls.cc: gpuCount <= 2 -> no NVLS)
        if (ppn > 2 and self.params.nvls_enable and worst == "nvswitch"
                and all(topo.has_nvswitch(k) for k in nodes)):
            nvls = self.sim.supports_nvls(ranks[0])
        acc = self.sim._spec("accelerator", ranks[0])
        s = Shape(op=op, nranks=len(ranks), nnodes=nn, ppn=ppn, intra=worst,
                  machine=getattr(topo, "name", None), nvls=nvls, accel=getattr(acc, "name", None))
        self._shapes[key] = s
        return s

    def _by_node(self, ranks: Sequence[str]) -> list[list[str]]:
        nodes: dict[int, list[str]] = {}
        for r in ranks:
            nodes.setdefault(self.sim.topo.node_of(r), []).append(r)
        return list(nodes.values())

    def _rails(self, per_node: list[list[str]]) -> list[int]:
        """Local indices of the ring channels' entry GPUs: one per distinct NIC (rail) of the first node,
        the first GPU on each (NCCL's graph search puts channel c on NIC c mod nNICs); at most the
        smallest node's GPU count. One channel (local index 0) on one node or without NICs."""
        if len(per_node) <= 1:
            return [0]
        topo = self.sim.topo
        m = min(len(x) for x in per_node)
        heads: list[int] = []
        seen: set[str] = set()
        for k, r in enumerate(per_node[0][:m]):
            nic = topo.nic_of(r) if topo.kind_of(r) == "gpu" else None
            if nic is not None and nic not in seen:
                seen.add(nic)
                heads.append(k)
        return heads or [0]

    def _ring_orders(self, ranks: Sequence[str]) -> list[list[list[tuple[str, str]]]]:
        """NCCL's rings over several nodes, one per rail: per ring, its steps in ring order (step i: rank
        i -> rank i+1, wrapping), each step the hops it takes.

        Ring c enters every node at the GPU of rail c (local index ``h``) and runs through the node's
        GPUs from there (``local[h:] + local[:h]``); it leaves from the last of them towards the next
        node's rail-c GPU through the node's own rail-c NIC (NCCL's ring graphs enter and leave a node by
        the same NIC; the leaving GPU reaches it with PXN, an NVLink hop to the rail's GPU whose NIC then
        posts the send): a cross-node step is the hops ``exit -> rail GPU`` (same node) and
        ``rail GPU -> next node's rail GPU`` (same rail). Without NVLink between the two (PCIe-only
        nodes) or when the exit GPU's NIC is already the rail's, one direct hop."""
        per_node = self._by_node(ranks)
        topo = self.sim.topo
        out: list[list[list[tuple[str, str]]]] = []
        for h in self._rails(per_node):
            order: list[str] = []
            heads: list[str] = []
            for local in per_node:
                k = h % len(local)
                order += local[k:] + local[:k]
                heads.append(local[k])
            node_of = {r: j for j, local in enumerate(per_node) for r in local}
            n = len(order)
            steps: list[list[tuple[str, str]]] = []
            for i in range(n):
                a, b = order[i], order[(i + 1) % n]
                ja, jb = node_of[a], node_of[b]
                rail = heads[ja]
                if ja == jb or a == rail or not self._pxn(a, rail, topo):
                    steps.append([(a, b)])
                else:
                    steps.append([(a, rail), (rail, b)])
            out.append(steps)
        return out

    def _pxn(self, a: str, rail: str, topo: Any) -> bool:
        """Whether GPU ``a`` sends through the NIC of GPU ``rail`` (same node) with PXN: their NICs
        differ and an NVLink path joins them (NCCL's PXN needs NVLink between the two GPUs)."""
        if topo.kind_of(a) != "gpu" or topo.kind_of(rail) != "gpu" or topo.nic_of(a) == topo.nic_of(rail):
            return False
        return self._hw_class(a, rail) in ("nvswitch", "nvlink")

    def _ring_edges(self, ranks: Sequence[str], factor: float) -> list[tuple[str, str, float]]:
        """Ring flows: every hop of every ring carries ``factor / rings`` (one node: one ring, merged)."""
        per_node = self._by_node(ranks)
        if len(per_node) == 1:
            n = len(ranks)
            return [(ranks[i], ranks[(i + 1) % n], factor) for i in range(n)] if n > 1 else []
        rings = self._ring_orders(ranks)
        # not merged: each ring's hops are rows of equal bytes, so a coupled group's common rate is the
        # rings' (merging hops of different rings into rows of unequal bytes would break that)
        return [(a, b, factor / len(rings)) for steps in rings for hops in steps for a, b in hops]

    def _chain_edges(self, ranks: Sequence[str], root: int) -> list[tuple[str, str, float]]:
        """Broadcast: one pipelined chain per ring, from the root along the ring (its n-1 steps), each
        carrying S / rings (NCCL splits the buffer over its channels); one node: one chain."""
        n = len(ranks)
        per_node = self._by_node(ranks)
        if len(per_node) == 1:
            order = list(ranks[root:]) + list(ranks[:root])
            return [(order[i], order[i + 1], 1.0) for i in range(n - 1)]
        rings = self._ring_orders(ranks)
        src = ranks[root]
        flows: list[tuple[str, str, float]] = []
        for steps in rings:
            start = next(i for i, hops in enumerate(steps) if hops[0][0] == src)
            for i in range(n - 1):
                flows += [(a, b, 1.0 / len(rings)) for a, b in steps[(start + i) % n]]
        return flows

    def _plan(self, op: str, ranks: Sequence[str], algo: str, root: int = 0) -> _Plan:
        key = (op, tuple(ranks), algo, root)
        hit = self._plans.get(key)
        if hit is not None:
            return hit
        n = len(ranks)
        phases: list[list[tuple[str, str, float]]]
        coupled = True
        if n <= 1:
            phases = []
        elif op == "all_reduce" and algo == "ring":
            phases = [self._ring_edges(ranks, 2.0 * (n - 1) / n)]
        elif op in ("all_gather", "reduce_scatter") and algo == "ring":
            phases = [self._ring_edges(ranks, (n - 1) / n)]
        elif op == "all_reduce" and algo == "nvls":
            f = 1.0  # in-switch reduction: each GPU's whole buffer goes up, the whole result comes down
            phases = [[(r, _NVSW, f) for r in ranks] + [(_NVSW, r, f) for r in ranks]]
        elif op in ("all_gather", "reduce_scatter") and algo == "nvls":
            up, down = (1.0 / n, (n - 1) / n) if op == "all_gather" else ((n - 1) / n, 1.0 / n)
            phases = [[(r, _NVSW, up) for r in ranks] + [(_NVSW, r, down) for r in ranks]]
        elif op == "all_reduce" and algo == "nvls_tree":
            f = 1.0  # as single-node NVLS, on the node's GPUs
            phases = [[(r, _NVSW, f) for r in ranks] + [(_NVSW, r, f) for r in ranks]
                      + self._rail_tree_edges(ranks)]
        elif op == "all_reduce" and algo == "tree":
            phases = [self._tree_edges(ranks)]
        elif op == "all_reduce" and algo == "hier":
            per_node = self._by_node(ranks)
            g = min(len(x) for x in per_node)
            nn = len(per_node)
            intra = [e for local in per_node for e in _ring(local, (len(local) - 1) / len(local))]
            inter = [e for i in range(g) for e in _ring([local[i] for local in per_node], 2.0 * (nn - 1) / nn / g)]
            phases = [p for p in (intra, inter, intra) if p]
        elif op in ("broadcast", "reduce") and algo == "ring":
            chain = self._chain_edges(ranks, root)
            if op == "reduce":
                chain = [(b, a, f) for a, b, f in reversed(chain)]
            phases = [chain]
        elif op == "all_to_all":
            ii, jj = np.divmod(np.arange(n * n, dtype=np.int64), n)
            off = ii != jj
            plan = _Plan(list(ranks), [(ii[off], jj[off], np.full(int(off.sum()), 1.0 / n))], False)
            plan.algo = algo
            self._plans[key] = plan
            return plan
        elif op == "send_recv":
            phases = [[(ranks[i], ranks[(i + 1) % n], 1.0) for i in range(n)]] if n > 2 else \
                [[(ranks[0], ranks[1], 1.0)]]
            coupled = False
        else:
            raise ValueError(f"{op} has no algorithm {algo!r} (choose from {ALGOS_FOR.get(op)})")
        plan = _Plan.of(phases, coupled)
        if algo == "ring":
            plan.rings = len(self._rails(self._by_node(ranks)))
        plan.algo = algo
        self._plans[key] = plan
        return plan

    def _tree_edges(self, ranks: Sequence[str]) -> list[tuple[str, str, float]]:
        per_node = self._by_node(ranks)
        nn = len(per_node)
        flows: list[tuple[str, str, float]] = []
        for t in range(2):
            heads = []
            for local in per_node:
                chain = local if t == 0 else list(reversed(local))
                heads.append(chain[0])
                for i in range(len(chain) - 1):  # chain inside the node
                    flows += [(chain[i + 1], chain[i], 0.5), (chain[i], chain[i + 1], 0.5)]
            idx = list(range(nn)) if t == 0 else [nn - 1 - i for i in range(nn)]
            for pos in range(1, nn):  # binary tree of nodes; tree 2 mirrored
                child, parent = heads[idx[pos]], heads[idx[(pos - 1) // 2]]
                flows += [(child, parent, 0.5), (parent, child, 0.5)]
        return _merge(flows)

    def _rail_tree_edges(self, ranks: Sequence[str]) -> list[tuple[str, str, float]]:
        """NVLS-tree's network part: the node's reduced data is split over its ppn GPUs (rails); per
        rail, two mirrored binary trees of nodes each move half of the rail's S/ppn up and down."""
        per_node = self._by_node(ranks)
        g = min(len(x) for x in per_node)
        nn = len(per_node)
        flows: list[tuple[str, str, float]] = []
        for r in range(g):
            heads = [local[r] for local in per_node]
            for t in range(2):
                idx = list(range(nn)) if t == 0 else [nn - 1 - i for i in range(nn)]
                for pos in range(1, nn):
                    child, parent = heads[idx[pos]], heads[idx[(pos - 1) // 2]]
                    flows += [(child, parent, 0.5 / g), (parent, child, 0.5 / g)]
        return _merge(flows)

    def _nvswitch_segment(self, gpu: str, up: bool) -> int:
        """Fabric segment GPU -> its NVSwitch planes (or back), split by capacity."""
        g = self.sim.topo.graph
        sws = sorted(s for s in (g.successors(gpu) if up else g.predecessors(gpu))
                     if g.nodes[s].get("kind") == "nvswitch")
        return self.sim.fabric.segment(("nvsw", gpu, up), [[gpu, s] if up else [s, gpu] for s in sws])

    # ------------------------------------------------------------------- tuner
    def estimate(self, op: str, ranks: Sequence[str], nbytes: float, algo: str, proto: str,
                 channels: int | None = None, use_fit: bool | None = None) -> float:
        """Idle-fabric time of one collective (s): the tuner's cost function.

        The bandwidth part is exact for the engine's own flows: the plan is run
        once on an idle scratch fabric (per op, ranks, algorithm, efficiency and
        cap) and scales linearly with size, since flow phases have no latency.
        """
        shape = self.shape(op, ranks)
        fit = self.sim.config.nccl.use_calibration if use_fit is None else use_fit
        lat, eff, cap = self.params.cost(shape, algo, proto, channels, fit, nbytes)
        fill = self.params.pipeline_fill(shape, algo, nbytes, fit)  # NVLS: the pipeline's fill and drain
        return lat + (nbytes + fill) * self.unit_time(op, tuple(ranks), algo, eff, cap,
                                                      self._net_eff(shape, algo, proto, fit))

    def _net_eff(self, shape: Shape, algo: str, proto: str, use_fit: bool) -> float | None:
        """NVLS-tree's network flows: the protocol's efficiency without the NVLS factor."""
        return self.params.efficiency(shape, "ring", proto, use_fit) if algo == "nvls_tree" else None

    def unit_time(self, op: str, ranks: tuple[str, ...], algo: str, eff: float, cap: float,
                  net_eff: float | None = None) -> float:
        """Seconds per byte of size for the flow phases of a plan on the idle fabric."""
        key = (op, ranks, algo, eff, cap, net_eff)
        hit = self._unit.get(key)
        if hit is not None:
            return hit
        scratch = self._scratch_sim()  # idle between runs: one fabric for every estimate and memo
        size = 1e9
        plan = self._plan(op, ranks, algo)
        t0 = scratch.env.now
        res = CollectiveResult(op, size, list(ranks), algo, "", t0, t0, 0.0)
        done = scratch.env.event()
        scratch.env.process(scratch.collectives._execute(plan, size, 0.0, eff, cap / plan.rings, "est", res, done,
                                                         net_eff))
        scratch.run()
        scratch.collectives.results.clear()
        u = res.time / size
        self._unit[key] = u
        return u

    def candidates(self, op: str, ranks: Sequence[str]) -> list[tuple[str, str]]:
        """(algo, proto) pairs this communicator can use."""
        shape = self.shape(op, ranks)
        out = []
        for a in ALGOS_FOR[op]:
            if a == "nvls" and not (shape.nvls and shape.nnodes == 1):
                continue
            if a == "nvls_tree" and not (shape.nvls and shape.nnodes > 1):
                continue
            if a == "hier":
                continue  # not one of NCCL's algorithms: run only when asked for (algo="hier")
            if a == "tree" and shape.nnodes < 2:
                continue  # NCCL uses trees between nodes only
            for p in ("ll", "ll128", "simple"):
                if a == "p2p" and p == "ll128":
                    continue  # NCCL p2p: LL or Simple
                if a in ("nvls", "nvls_tree") and p != "simple":
                    continue
                if p == "ll128" and shape.intra == "pci":
                    continue  # NCCL enables LL128 only over NVLink
                out.append((a, p))
        return out

    def choose(self, op: str, ranks: Sequence[str], nbytes: float, algo: str = "auto", proto: str = "auto",
               channels: int | None = None) -> tuple[str, str]:
        """Pick (algo, proto) like NCCL's tuner: the lowest estimated time; honours overrides (cached)."""
        key = (op, tuple(ranks), float(nbytes), algo, proto, channels)
        hit = self._chosen.get(key)
        if hit is None:
            hit = self._choose(op, ranks, nbytes, algo, proto, channels)
            self._chosen[key] = hit
        return hit

    def _choose(self, op: str, ranks: Sequence[str], nbytes: float, algo: str, proto: str,
                channels: int | None) -> tuple[str, str]:
        cands = self.candidates(op, ranks)
        if algo not in ("auto", None):
            if op in ("all_to_all", "all_to_allv", "send_recv"):
                algo = "p2p"  # a configured default algorithm applies to the collectives that can use it
            elif algo not in ALGOS_FOR[op]:
                raise ValueError(f"{op} cannot use algorithm {algo!r} (choose from {', '.join(ALGOS_FOR[op])})")
            sh = self.shape(op, ranks)
            if algo in ("nvls", "nvls_tree") and not (sh.nvls and (sh.nnodes == 1) == (algo == "nvls")):
                why = ("the ranks span several nodes (use nvls_tree)" if algo == "nvls" and sh.nnodes > 1 else
                       "the ranks are on one node (use nvls)" if algo == "nvls_tree" and sh.nnodes == 1 else
                       "NVLS is disabled (nvls_enable: false)" if not self.params.nvls_enable else
                       "NCCL uses NVLS only with more than 2 GPUs per node" if sh.ppn <= 2 else
                       "the ranks are not all on one NVSwitch" if sh.intra != "nvswitch" else
                       f"the GPU ({sh.accel or 'unknown'}) predates Hopper")
                where = "one node" if algo == "nvls" else "several nodes"
                raise ValueError(f"algorithm {algo} needs NVLink SHARP (NVSwitch, Hopper or newer, {where}): {why}")
            cands = [(a, p) for a, p in cands if a == algo] or [(algo, p) for p in ("ll", "ll128", "simple")
                                                               if not (algo in ("nvls", "nvls_tree")
                                                                       and p != "simple")]
        if proto not in ("auto", None):
            kept = [(a, p) for a, p in cands if p == proto]
            if not kept and any(a in ("nvls", "nvls_tree", "p2p") for a, _ in cands):
                raise ValueError(f"protocol {proto!r} is not available with algorithm {cands[0][0]} "
                                 f"(it runs {', '.join(sorted({p for _, p in cands}))})")
            cands = kept or [(c[0], proto) for c in cands[:1]]
        if not cands:
            raise ValueError(f"no algorithm/protocol available for {op} on {len(ranks)} ranks")
        if len(cands) == 1:
            return cands[0]
        if op in ("all_to_all", "send_recv"):
            # NCCL p2p: LL up to NCCL_P2P_LL_THRESHOLD bytes per peer, else Simple (no tuner)
            per_peer = nbytes / len(ranks) if op == "all_to_all" else nbytes
            want = "ll" if per_peer <= self.params.p2p_ll_threshold else "simple"
            return next((c for c in cands if c[1] == want), cands[-1])
        # NCCL decides with its own constants, not with the fitted ones: with tuner "nccl"
        # the choice uses the defaults (bandwidth still from the fabric), the time the fit
        use_fit = False if self.params.tuner == "nccl" else None
        best = min(cands, key=lambda ap: (self.estimate(op, ranks, nbytes, ap[0], ap[1], channels, use_fit), ap))
        return best

    # --------------------------------------------------------------------- run
    def run(
        self,
        op: str,
        ranks: Sequence[str],
        nbytes: float = 0.0,
        *,
        algo: str | None = None,
        proto: str | None = None,
        matrix: Sequence[Sequence[float]] | None = None,
        root: int = 0,
        channels: int | None = None,
        name: str | None = None,
        replicas: Sequence[Sequence[str]] = (),
        quiet: bool = False,
    ) -> simpy.Event:
        """Start a collective now; the event succeeds with its :class:`CollectiveResult`.

        ``replicas``: rank lists of equivalent groups a folded rank stands for (symmetry folding):
        each runs the same collective at the same time as its own flows, loading its links as in the
        full run; the event and the result are those of ``ranks``. ``quiet``: no result entry, no
        timeline record (what replicas use).

        ``nbytes`` is the nccl-tests size (all_reduce/broadcast/reduce: the buffer;
        all_gather: the output; reduce_scatter: the input; all_to_all: each rank's
        send buffer; send_recv: the message). ``matrix[i][j]`` gives all_to_allv's
        bytes from rank i to rank j.
        """
        cfg = self.sim.config.nccl
        algo = algo or cfg.algo
        proto = proto or cfg.proto
        ck = (op, tuple(ranks), float(nbytes), algo, proto, root, channels) if op != "all_to_allv" else None
        known = self._runs.get(ck) if ck is not None else None
        if known is not None:  # a repeated collective: its plan and costs as computed the first time
            a, p, plan, scale, mkey, lat, eff, cap, net_eff = known
            return self._launch(op, list(ranks), nbytes, a, p, plan, scale, mkey, lat, eff, cap, net_eff, matrix,
                                root, channels, name, replicas, quiet)
        if op not in OPS:
            raise ValueError(f"unknown collective {op!r} (choose from {', '.join(OPS)})")
        ranks = list(ranks)
        if len(set(ranks)) != len(ranks):
            raise ValueError("ranks must be distinct")
        if op == "all_to_allv":
            if matrix is None:
                raise ValueError("all_to_allv needs a matrix of per-peer byte counts")
            m = np.asarray(matrix, dtype=float)
            if m.shape != (len(ranks), len(ranks)) or (m < 0).any() or not np.isfinite(m).all():
                raise ValueError(f"all_to_allv matrix must be {len(ranks)}x{len(ranks)} of finite bytes >= 0")
            nbytes = float(m.sum())
            a, p = "p2p", (proto if proto not in ("auto", None) else "simple")
            mkey = ("a2av", tuple(ranks), m.tobytes(), p)
            hit = self._a2av_plans.get(mkey)
            if hit is None:
                ii, jj = np.nonzero(m)
                off = ii != jj
                hit = _Plan(list(ranks), [(ii[off].astype(np.int64), jj[off].astype(np.int64), m[ii[off], jj[off]])],
                            False, algo="p2p")
                if len(self._a2av_plans) >= 4096:
                    self._a2av_plans.clear()
                self._a2av_plans[mkey] = hit
            plan = hit
            scale = 1.0
        else:
            a, p = self.choose(op, ranks, nbytes, algo, proto, channels)
            plan = self._plan(op, ranks, a, root)
            scale = nbytes
            mkey = (op, tuple(ranks), a, p, root, float(nbytes), channels)
        shape = self.shape(op, ranks)
        lat, eff, cap = self.params.cost(shape, a, p, channels, cfg.use_calibration, nbytes)
        fill = self.params.pipeline_fill(shape, a, nbytes, cfg.use_calibration) if op != "all_to_allv" else 0.0
        if fill > 0:  # NVLS: the pipeline's fill and drain, a fixed delay like the latency
            lat += fill * self.unit_time(op, tuple(ranks), a, eff, cap, self._net_eff(shape, a, p, cfg.use_calibration))
        net_eff = self._net_eff(shape, a, p, cfg.use_calibration)
        if ck is not None:
            if len(self._runs) >= 65536:
                self._runs.clear()
            self._runs[ck] = (a, p, plan, scale, mkey, lat, eff, cap, net_eff)
        return self._launch(op, ranks, nbytes, a, p, plan, scale, mkey, lat, eff, cap, net_eff, matrix, root, channels,
                            name, replicas, quiet)

    def _launch(self, op: str, ranks: list[str], nbytes: float, a: str, p: str, plan: _Plan, scale: float,
                mkey: Any, lat: float, eff: float, cap: float, net_eff: float | None,
                matrix: Sequence[Sequence[float]] | None, root: int, channels: int | None, name: str | None,
                replicas: Sequence[Sequence[str]], quiet: bool) -> simpy.Event:
        """Start a collective whose plan and costs :meth:`run` has worked out; returns its event."""
        env = self.sim.env
        label = name or f"{op}"
        res = CollectiveResult(op, nbytes, ranks, a, p, env.now, env.now, lat)
        res.quiet = quiet  # type: ignore[attr-defined]
        done = env.event()
        self._start(plan, scale, lat, eff, cap / plan.rings, label, res, done, net_eff, mkey)
        for rep in replicas:  # equivalent groups: the primary's algorithm and protocol
            self.run(op, rep, nbytes, algo=a, proto=p, matrix=matrix, root=root, channels=channels, name=name,
                     quiet=True)
        return done

    # ------------------------------------------------------------------ NICs
    def _endpoint_nic(self, name: str) -> tuple[int, float, float, float, bool, float]:
        """(node, message rate msg/s, per-message overhead s, port bandwidth B/s, GPUDirect RDMA, the port's
        usable capacity on the fabric B/s) of the NIC a rank's inter-node traffic leaves by
        (``topo.nic_of``); a rank without one: no limits."""
        hit = self._nic.get(name)
        if hit is None:
            from cosim.engine.nic import nic_params

            topo, fab = self.sim.topo, self.sim.fabric
            node = int(topo.node_of(name)) if name in topo.graph else -1
            nic = topo.nic_of(name) if name in topo.graph and topo.graph.nodes[name].get("kind") == "gpu" else None
            if nic is not None:  # a GPU on an NVLink switch shared by several hosts (an NVL72 rack): its traffic
                # to the rack's other hosts stays on NVLink; "node" becomes the rack's NVLink domain
                g = topo.graph
                shared = sorted(v for v in g.successors(name) if g.nodes[v].get("kind") == "nvswitch"
                                and int(g.nodes[v].get("node", -1)) < 0)
                if shared:
                    node = 1_000_000 + sorted(n for n, d in g.nodes(data=True)
                                              if d.get("kind") == "nvswitch").index(shared[0])
            if nic is None:
                hit = (node, math.inf, 0.0, math.inf, True, math.inf)
            else:
                p = nic_params(self.sim, nic)
                out = [fab.capacity[fab.link_id[(nic, v)]] for v in topo.graph.successors(nic)
                       if topo.graph.nodes[v].get("kind") == "fabric_switch"]
                hit = (node, p["message_rate"], p["per_message_overhead"], p["bandwidth"], p["gpudirect"],
                       float(max(out)) if out else math.inf)
            self._nic[name] = hit
        return hit

    def _p2p_nvlink_factor(self, gpu: str) -> float:
        """Efficiency factor of NCCL point-to-point flows through ``gpu``'s NVLink port to its NVSwitch planes
        (``NcclParams.p2p_nvlink_factor`` of the port's link type, link count and usable capacity on the
        fabric); 1 for a rank without NVSwitch links."""
        hit = self._nvlf.get(gpu)
        if hit is None:
            g, fab = self.sim.topo.graph, self.sim.fabric
            hit = 1.0
            if gpu in g:
                sws = [v for v in g.successors(gpu) if g.nodes[v].get("kind") == "nvswitch"]
                types = {str(g.edges[gpu, v].get("link", "")) for v in sws}
                if sws and len(types) == 1:
                    link = types.pop()
                    count = sum(int(g.edges[gpu, v].get("count", 1)) for v in sws)
                    cap = sum(float(fab.capacity[fab.link_id[(gpu, v)]]) for v in sws)
                    line = sum(float(g.edges[gpu, v].get("bandwidth", 0.0)) for v in sws)
                    hit = self.params.p2p_nvlink_factor(link, count, cap, _line_scale(link, count, line))
            self._nvlf[gpu] = hit
        return hit

    def _bounce_segment(self, src: str, dst: str) -> int:
        """One segment over the host-staged route of a GPU pair whose NIC lacks GPUDirect RDMA:
        GPU -> its CPU (host memory), CPU -> remote CPU over the NICs, CPU -> GPU; a single flow over
        all of those links, as NCCL's chunked staging pipelines them (a link used twice carries the
        bytes twice)."""
        fab, topo = self.sim.fabric, self.sim.topo
        a, b = topo.cpu_of(src), topo.cpu_of(dst)
        walk = fab.paths(src, a)[0] + fab.paths(a, b)[0][1:] + fab.paths(b, dst)[0][1:]
        return fab.segment(("bounce", src, dst), [walk])

    def _network(self, names: Sequence[str], si: np.ndarray, di: np.ndarray, nb: np.ndarray,
                 segs: np.ndarray, algo: str = "", eff: float = 1.0) -> np.ndarray | None:
        """For the flows of a phase that cross nodes: reroute those whose NIC lacks GPUDirect RDMA
        through host memory (in ``segs``), and return each flow's NIC rate cap (bytes/s; inf where none
        binds): ``min(message_rate * m, m / (per_message_overhead + m / bandwidth))`` at both ends, m the
        message (``nic.message_size``, or the flow's bytes when smaller). None: no flow crosses a node.
        NIC latency is not added: NCCL's network per-step latency already holds it. ``algo``: NCCL's
        algorithm of the flows; a crossing flow of one also runs at most its channels' network rate
        (``NcclParams.net_flow_cap``, a wire rate: x ``eff`` of payload)."""
        info = [self._endpoint_nic(n) if n != _NVSW else (-2, math.inf, 0.0, math.inf, True, math.inf) for n in names]
        node = np.array([x[0] for x in info], dtype=np.int64)
        if (node < 0).all() or (node == node[0]).all():
            return None
        ns, nd = node[si], node[di]  # (all-to-alls have millions of rows: few temporaries)
        cross = ns != nd
        cross &= ns >= 0
        cross &= nd >= 0
        del ns, nd
        if not cross.any():
            return None
        rate, ovh, bw, port = (np.array([x[k] for x in info], dtype=float) for k in (1, 2, 3, 5))
        gdr = np.array([x[4] for x in info], dtype=bool)
        if not gdr.all():
            for k in np.flatnonzero(cross & ~(gdr[si] & gdr[di])).tolist():
                segs[k] = (self._bounce_segment(names[si[k]], names[di[k]]), -1, -1)
        from cosim.engine.nic import message_cap

        lim = np.minimum(np.minimum(bw, port)[si], np.minimum(bw, port)[di])
        # a point-to-point peer pair runs on its own channels (NCCL_NCHANNELS_PER_NET_PEER): a per-flow cap;
        # a collective's channels per NIC are its NIC rate (see net_efficiency)
        chan = self._net_channel_cap(names, algo, bw) * eff if algo == "p2p" else math.inf
        m0 = min(self.sim.config.nic.message_size, float(nb.min(where=cross, initial=np.inf)))
        # caps grow with the message: if none binds at the smallest, none binds at all
        if (message_cap(rate, ovh, bw, m0) >= np.minimum(bw, port)).all():
            if not np.isfinite(chan):
                return None
            rc = np.full(len(nb), chan)
        else:
            m = np.minimum(self.sim.config.nic.message_size, nb)
            rc = np.minimum(np.minimum(*(message_cap(rate[x], ovh[x], bw[x], m) for x in (si, di))), chan)
        rc[~cross | (rc >= lim)] = np.inf  # at or above what the ports carry: never binds
        return rc

    def _xeff(self, plan: _Plan, eff: float, si: np.ndarray, di: np.ndarray) -> tuple[float, np.ndarray]:
        """(efficiency of the phase's flows that cross nodes, which flows cross) for ``plan``'s algorithm
        (:meth:`net_efficiency`; ``eff`` and no flow where none crosses or no limit binds)."""
        e = self.net_efficiency(plan.names, plan.algo, eff)
        if e >= eff:
            return eff, np.zeros(len(si), dtype=bool)
        node = np.array([self._endpoint_nic(n)[0] if n != _NVSW else -2 for n in plan.names], dtype=np.int64)
        cross = (node[si] != node[di]) & (node[si] >= 0) & (node[di] >= 0)
        return (e, cross) if cross.any() else (eff, cross)

    def net_efficiency(self, names: Sequence[str], algo: str, eff: float) -> float:
        """Efficiency of a NCCL collective's flows that cross nodes: its channels on a NIC move at most
        ``net_channels x net_channel_bw`` through it (``NcclParams.net_flow_cap``), below the port's wire
        rate; as a flow's efficiency inflates its wire bytes, ``chan / port capacity`` makes the NIC carry
        at most that much of the collective, shared among its flows as the fabric shares the port.
        ``net_channel_bw`` is a wire rate (the protocol's bytes), so the flows' efficiency becomes
        ``eff x min(1, chan / port)``: LL128 still moves less payload than Simple. ``eff`` where no such
        limit binds (p2p: a per-flow cap instead, see :meth:`_network`)."""
        if algo in ("p2p", "") or not names:
            return eff
        info = [self._endpoint_nic(n) for n in names if n != _NVSW]
        bw = np.array([x[3] for x in info], dtype=float)
        port = min((x[5] for x in info), default=math.inf)
        chan = self._net_channel_cap(names, algo, bw)
        if not (math.isfinite(chan) and math.isfinite(port)) or port <= 0:
            return eff
        return eff * min(1.0, chan / port)

    def _net_channel_cap(self, names: Sequence[str], algo: str, bw: np.ndarray) -> float:
        """Most one flow of NCCL's ``algo`` crossing nodes carries: its channels x one channel's network rate
        (``NcclParams.net_flow_cap``; the NIC's line rate and the node's NICs set the channel count)."""
        key = (algo, tuple(names))
        hit = self._netcap.get(key)
        if hit is not None:
            return hit
        nic_bw = float(np.min(bw)) if bw.size else math.inf
        out = math.inf
        if math.isfinite(nic_bw):
            topo = self.sim.topo
            ranks = [n for n in names if n != _NVSW]
            nics = len({topo.nic_of(r) for r in ranks if topo.node_of(r) == topo.node_of(ranks[0])} - {None})
            out = self.params.net_flow_cap(algo, len(ranks), nic_bw, max(nics, 1))
        self._netcap[key] = out
        return out

    def _start(self, plan: _Plan, scale: float, lat: float, eff: float, cap: float, label: str,
               res: CollectiveResult, done: simpy.Event, net_eff: float | None, memo_key: Any) -> None:
        """Run the collective: coalesced from its memo when all its links are idle, else on the fabric."""
        sim = self.sim
        fab = sim.fabric
        if memo_key is not None and sim.config.fabric.coalesce and not sim.config.trace_flows:
            memo = self._memo.get(memo_key)
            if memo is None:
                memo = self._memo_run(plan, scale, lat, eff, cap, net_eff)
                self._memo[memo_key] = memo
            if memo.links.size and fab.links_idle(memo.links):
                t0 = sim.env.now
                wake = sim.env.event()  # the hold starts now: a flow starting later at this instant wakes it

                def on_wake() -> None:
                    wake.succeed(self._materialize(h, memo, plan, scale, lat, eff, cap, label, net_eff, t0))

                h = fab.hold(memo.links, on_wake)
                fab.n_coalesced += 1
                self._coalesced(memo, plan, scale, eff, cap, label, res, done, net_eff, h, wake, t0)
                return
        sim.env.process(self._execute(plan, scale, lat, eff, cap, label, res, done, net_eff))

    def _scratch_sim(self) -> Simulator:
        """An idle simulator on the same topology (no traces, no coalescing) for memo runs."""
        if self._scratch is None:
            import dataclasses

            from cosim.engine.simulator import Simulator

            cfg = self.sim.config_for_scratch()
            cfg = dataclasses.replace(cfg, fabric=dataclasses.replace(cfg.fabric, coalesce=False,
                                                                     flow_classes=False))
            self._scratch = Simulator(self.sim.topo, cfg)
            self._scratch.collectives._plans = self._plans
        return self._scratch

    def _memo_run(self, plan: _Plan, scale: float, lat: float, eff: float, cap: float,
                  net_eff: float | None, until: float | None = None) -> _Memo:
        """Run the collective alone on the idle scratch fabric; with ``until`` (s after its start) stop
        there, leaving its flows in flight on the scratch fabric (the caller finishes it). A full run also
        records its trajectory (:class:`_Traj`) while the trajectories held stay within :data:`_TRAJ_FLOATS`."""
        sc = self._scratch_sim()
        fab, env = sc.fabric, sc.env
        fab._advance()
        t0 = env.now
        b0, z0 = fab.bytes_moved.copy(), fab.busy_time.copy()
        fab.reset_peak_flows()
        usage: list[tuple[np.ndarray, np.ndarray, float, np.ndarray, np.ndarray]] = []
        fab.observer = lambda lk, a, b, c, nb: usage.append((lk, a - t0, b - t0, c, nb))
        res = CollectiveResult("", scale, [], "", "", t0, t0, lat)
        done = env.event()
        phase = [-1]
        rec = _Recorder(fab, t0, b0, z0, phase, usage) if (until is None and self.sim.config.fabric.trajectory
                                                           and self._traj_floats < _TRAJ_FLOATS) else None
        env.process(sc.collectives._execute(plan, scale, lat, eff, cap, "memo", res, done, net_eff, phase=phase))
        try:
            if rec is not None:
                fab.on_solved = sc.collectives._rec = rec.checkpoint
                fab.compact_rows = False
            sc.run(until=None if until is None else t0 + until)
            fab._advance()
            fab.close_observer()
        finally:
            fab.observer = None
            fab.on_solved = sc.collectives._rec = None
            fab.compact_rows = True
        sc.collectives.results.clear()
        d = fab.bytes_moved - b0
        busy = fab.busy_time - z0
        links = np.flatnonzero((d > 0) | (busy > 0) | (fab.peak_flows > 0))
        memo = _Memo(res.end - t0, res.bytes_on_fabric, links, d[links], busy[links],
                     fab.peak_flows[links].copy(), usage, phase[0])
        if rec is not None:
            memo.traj = rec.finish(links)
            self._traj_floats += memo.traj.size()
        return memo

    def _coalesced(self, memo: _Memo, plan: _Plan, scale: float, eff: float, cap: float, label: str,
                   res: CollectiveResult, done: simpy.Event, net_eff: float | None, h: int, wake: simpy.Event,
                   t0: float) -> None:
        """A collective on idle links: its memo's duration and counters, unless a flow arrives on its
        links first; then the flows it has at that instant (bytes left from a scratch run up to it)
        become real flows and the rest of its plan runs on the fabric (:meth:`_woken`). Callbacks, not a
        process: the same events at the same instants (:func:`_urgent`, :func:`_first_of`), fewer of them."""
        env, fab = self.sim.env, self.sim.fabric

        def end(_: simpy.Event) -> None:
            if wake.triggered:
                _drive(self._woken(plan, scale, eff, cap, label, res, done, net_eff, wake))
                return
            fab.release(h, memo.links)
            fab.add_counters(memo.links, memo.bytes, memo.busy, memo.peak.copy())
            obs = fab.observer
            if obs is not None and memo.usage:
                lk, a, b, c, nb = memo.flat_usage()
                shifted = getattr(obs, "shifted", None)  # the intervals relative to t0, when the observer takes them
                if shifted is not None:
                    shifted(lk, t0, a, b, c, nb)
                else:
                    obs(lk, t0 + a, t0 + b, c, nb)
            res.bytes_on_fabric = memo.moved
            self._finish(res, label, done)

        def wait(_: simpy.Event) -> None:
            ev = _first_of(env, env.timeout(memo.duration), wake)
            assert ev.callbacks is not None
            ev.callbacks.append(end)

        _urgent(env, wait)

    def _woken(self, plan: _Plan, scale: float, eff: float, cap: float, label: str, res: CollectiveResult,
               done: simpy.Event, net_eff: float | None, wake: simpy.Event):
        """A coalesced collective woken by a flow on its links: its flows at that instant run on the fabric
        (:meth:`_materialize` started them), then the rest of its plan."""
        env = self.sim.env
        self.sim.fabric.n_coalesced -= 1
        evs, k, wait, moved = cast(tuple[list[simpy.Event], int, float, float], wake.value)
        if wait > 0:
            yield env.timeout(wait)
        if evs:
            yield env.all_of(evs)
        sub = CollectiveResult(res.op, scale, [], "", "", env.now, env.now, 0.0)
        yield from self._execute(plan, scale, 0.0, eff, cap, label, sub, None, net_eff, first=k + 1)
        res.bytes_on_fabric = moved + sub.bytes_on_fabric
        self._finish(res, label, done)

    def _materialize(self, h: int, memo: _Memo, plan: _Plan, scale: float, lat: float, eff: float, cap: float,
                     label: str, net_eff: float | None, t0: float) -> tuple[list[simpy.Event], int, float, float]:
        """Turn a coalesced collective into real flows now: (events of its current phase's flows, that
        phase, latency still to wait, payload bytes of the phases before it)."""
        fab, env = self.sim.fabric, self.sim.env
        fab.release(h, memo.links)
        tau = env.now - t0
        if tau < lat or tau <= 0:  # still in its fixed latency: nothing on the links yet
            return [], -1, lat - tau, 0.0
        sc = self._scratch_sim()
        cls_key: Any = None
        tr = memo.traj
        if tr is not None:  # the state at tau from the recorded trajectory
            k, i, rem, counters, n_closed, extra = _at_state(memo, tau)
            flat = memo.usage_upto(n_closed, extra) if n_closed or extra is not None else None
            # its rows (but their bytes) are those of its checkpoint: a key for the fabric's flow-class partition
            # (memos are kept for the whole run, so the trajectory's id stays unique)
            cls_key = ("traj", id(tr), i + 1)
            sc.drop_all(sc.env.now + tau)  # the scratch clock where a run up to tau would have left it
        else:  # a scratch re-run up to tau
            part = self._memo_run(plan, scale, lat, eff, cap, net_eff, until=tau)
            segs, rem, mult, wcap, grp, bat = sc.fabric.snapshot_rows()
            sc.drop_all()  # the scratch copy's rest is not needed: idle it
            sc.collectives.results.clear()
            k, counters = part.phase, (part.links, part.bytes, part.busy, part.peak.copy())
            flat = _flat_usage(part.usage) if part.usage else None
        fab._advance()
        fab.add_counters(*counters)
        if fab.observer is not None and flat is not None:
            lk, a, b, c, nb = flat
            fab.observer(lk, t0 + a, t0 + b, c, nb)
        moved = self._moved_before(plan, scale, k)
        if tr is not None:
            parts = self._mat.get(cls_key)
            if parts is None:  # (static per checkpoint: materializations at one repeat it)
                if len(self._mat) >= 4096:
                    self._mat.clear()
                parts = self._mat[cls_key] = self._row_batches(*_static_rows(tr, i))
        else:
            parts = self._row_batches(segs, mult, wcap, grp, bat)
        evs = []
        groups: dict[int, int] = {}
        for sel, rsegs, m, wc, g, bt in parts:  # one batch per batch of the scratch run (its rate caps per row)
            ng = -1 if g < 0 else groups.setdefault(g, fab.new_group())
            evs.append(fab.start_rows(rsegs, rem[sel], max_rate=wc, link_latency=False, group=ng, name=label,
                                      multiplicity=m, merge=False, classes=None if cls_key is None else (*cls_key, bt)))
        if k >= 0:
            moved += float((plan.phases[k][2] * scale).sum())
        return evs, k, 0.0, moved

    def _moved_before(self, plan: _Plan, scale: float, k: int) -> float:
        """Payload bytes of ``plan``'s phases before phase ``k`` (none for -1) at size ``scale``."""
        mk = (plan.uid, scale, k)
        moved = self._moved.get(mk)
        if moved is None:  # (a pure function of the plan: materializations repeat it)
            moved = float(sum(float((f * scale).sum()) for _, _, f in plan.phases[:max(k, 0)]))
            if len(self._moved) >= 65536:
                self._moved.clear()
            self._moved[mk] = moved
        return moved

    def _row_batches(self, segs: np.ndarray, mult: np.ndarray, wcap: np.ndarray, grp: np.ndarray,
                     bat: np.ndarray) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int, int]]:
        """Scratch rows (segments, multiplicity, wire rate cap, group, batch) by batch: (the batch's rows, their
        segments on this fabric (copied once each), multiplicity, cap, scratch group, scratch batch) each."""
        fab, sc = self.sim.fabric, self._scratch_sim()
        real = np.full(segs.shape, -1, dtype=np.int64)
        ok = segs >= 0
        ids = segs[ok]
        if ids.size:
            smap = self._seg_map
            if smap.size <= int(ids.max()):
                smap = self._seg_map = np.concatenate([smap, np.full(int(ids.max()) + 1 - smap.size, -1,
                                                                      dtype=np.int64)])
            for x in np.unique(ids[smap[ids] < 0]).tolist():
                smap[x] = fab.copy_segment(sc.fabric, x)
            real[ok] = smap[ids]
        out = []
        for b in np.unique(bat).tolist():
            sel = np.flatnonzero(bat == b)
            out.append((sel, real[sel], mult[sel], wcap[sel], int(grp[sel[0]]), b))
        return out

    def _finish(self, res: CollectiveResult, label: str, done: simpy.Event) -> None:
        res.end = self.sim.env.now
        if getattr(res, "quiet", False):
            done.succeed(res)
            return
        self.results.append(res)
        if self.sim.config.record_trace:  # (record is a no-op otherwise: skip the per-rank track names)
            rec, name = self.sim.record, f"{label} {res.algo}/{res.proto}"
            for r in res.ranks:
                rec(name, res.start, res.end, f"{self.sim.track_of(r)}.comm")
        done.succeed(res)

    def _slot_group(self, grp: int, slot: int, slots: dict[int, int]) -> int:
        """The fabric group of a phase's batch: slot 0 joins the phase's group ``grp``, every other slot a
        new group of its own (one per slot and phase run); -1 (no coupling) where ``grp`` is -1."""
        if grp < 0:
            return -1
        if slot == 0:
            return grp
        if slot not in slots:
            slots[slot] = self.sim.fabric.new_group()
        return slots[slot]

    def _phase_batches(self, plan: _Plan, k: int, scale: float, eff: float, cap: float,
                       net_eff: float) -> list[tuple[np.ndarray, np.ndarray, float, float | np.ndarray, int]]:
        """Phase ``k``'s batches: (segments, payload bytes, efficiency, rate cap, group slot) each; the routes
        (NVSwitch segments, cluster routes, host-staged bounces) and the NIC rate caps of its flows."""
        fab = self.sim.fabric
        names = plan.names
        nv = names.index(_NVSW) if _NVSW in names else -1
        si, di, f = plan.phases[k]
        nb = f * scale
        sel = nb > 0
        if not sel.any():
            return []
        si, di, nb = si[sel], di[sel], nb[sel]
        segs = np.full((len(nb), 3), -1, dtype=np.int64)
        isnv = (si == nv) | (di == nv)
        if isnv.any():
            for x in np.flatnonzero(isnv).tolist():
                up = di[x] == nv
                segs[x, 0] = self._nvswitch_segment(names[si[x]] if up else names[di[x]], up)
        if (~isnv).any():
            real = names if nv < 0 else [n if n != _NVSW else names[0 if nv else 1] for n in names]
            segs[~isnv] = fab.route_segments(real, si[~isnv], di[~isnv])
        rc = self._network(names, si, di, nb, segs, plan.algo, eff)
        if isnv.any() and (~isnv).any():
            # NVLS-tree: the switch part and the network part are two pipelined stages that run
            # side by side, each at its own rate and efficiency (NVLS factor only on the switch part)
            rest = ~isnv
            crc: float | np.ndarray = cap if rc is None else np.minimum(cap, rc[rest])
            return [(segs[isnv], nb[isnv], eff, cap, 0),
                    (segs[rest], nb[rest], self._xeff(plan, net_eff, si, di)[0], crc, 1)]
        xe, cross = self._xeff(plan, eff, si, di)
        if plan.algo == "p2p" and xe >= eff:
            fac = min((self._p2p_nvlink_factor(n) for n in names if n != _NVSW), default=1.0)
            if fac < 1.0:
                # NCCL p2p through NVLink: SM-driven copies at NCCL's own NVLink rate (p2p_nvlink_factor),
                # the flows that cross a NIC at the protocol's efficiency and their NIC / channel caps
                node = np.array([self._endpoint_nic(n)[0] for n in names], dtype=np.int64)
                nvl = node[si] == node[di]
                parts: list[tuple[np.ndarray, np.ndarray, float, float | np.ndarray, int]] = []
                for slot, (m, e) in enumerate(((nvl, eff * fac), (~nvl, eff)), start=1):
                    if m.any():
                        parts.append((segs[m], nb[m], e, cap if rc is None else np.minimum(cap, rc[m]), slot))
                return parts
        if xe < eff:
            # a collective across nodes: the flows that cross run at the NIC's channel rate (their
            # efficiency), the others at the protocol's; two pipelined parts, side by side
            out: list[tuple[np.ndarray, np.ndarray, float, float | np.ndarray, int]] = []
            for slot, (sel, e) in enumerate(((cross, xe), (~cross, eff)), start=1):
                if sel.any():
                    c2: float | np.ndarray = cap if rc is None else np.minimum(cap, rc[sel])
                    out.append((segs[sel], nb[sel], e, c2, slot))
            return out
        if rc is None or np.isinf(rc).all():
            return [(segs, nb, eff, cap, 0)]
        return [(segs, nb, eff, np.minimum(cap, rc), 0)]  # one batch, a NIC rate cap per flow

    def _execute(self, plan: _Plan, scale: float, lat: float, eff: float, cap: float, label: str,
                 res: CollectiveResult, done: simpy.Event | None, net_eff: float | None = None, *,
                 first: int = 0, phase: list[int] | None = None):
        """The plan's phases from ``first`` on the fabric (``phase[0]``: the one running now); then
        ``done`` succeeds with ``res`` (None: the caller finishes)."""
        net_eff = eff if net_eff is None else net_eff
        env = self.sim.env
        fab = self.sim.fabric
        if lat > 0:
            yield env.timeout(lat)
        moved = 0.0
        for k in range(first, len(plan.phases)):
            if phase is not None:
                phase[0] = k
                if self._rec is not None:
                    self._rec()
            ck = (plan.uid, k, scale, eff, cap, net_eff)
            parts = self._phases.get(ck)
            if parts is None:
                parts = self._phase_batches(plan, k, scale, eff, cap, net_eff)
                if len(self._phases) >= 8192:
                    self._phases.clear()
                self._phases[ck] = parts
            if not parts:
                continue
            moved += float(sum(float(x[1].sum()) for x in parts))
            grp = fab.new_group() if (plan.coupled and self.sim.config.nccl.couple_ring) else -1
            slots: dict[int, int] = {}
            evs = [fab.start_rows(segs, nb, efficiency=e, max_rate=mr, link_latency=False,
                                  group=self._slot_group(grp, slot, slots), name=label, cache=(ck, j))
                   for j, (segs, nb, e, mr, slot) in enumerate(parts)]
            yield evs[0] if len(evs) == 1 else env.all_of(evs)
        res.bytes_on_fabric = moved
        if done is not None:
            self._finish(res, label, done)




def _ring(order: Sequence[str], factor: float) -> list[tuple[str, str, float]]:
    n = len(order)
    return [(order[i], order[(i + 1) % n], factor) for i in range(n)] if n > 1 else []


def _merge(flows: list[tuple[str, str, float]]) -> list[tuple[str, str, float]]:
    """Sum factors of flows with the same endpoints (keeps first-seen order)."""
    acc: dict[tuple[str, str], float] = {}
    for a, b, f in flows:
        acc[(a, b)] = acc.get((a, b), 0.0) + f
    return [(a, b, f) for (a, b), f in acc.items()]


def _line_scale(link: str, count: int, line: float) -> float:
    """How much faster ``count`` links of type ``link`` run here (``line`` bytes/s in all, as the topology built
    them) than the catalog's line rate of that type: NCCL's per-link constants are for the real links, and a
    what-if that changes a link's bandwidth scales them with it. 1 for a link type the catalog lacks."""
    from cosim.catalog import load_catalog

    try:
        nominal = float(load_catalog().link(link).bandwidth) * count
    except CosimInputError:
        return 1.0
    return line / nominal if nominal > 0 and line > 0 else 1.0
