"""GPU model: in-order streams, cross-stream events, SM and HBM sharing, copy engines.

Streams execute their items in order; items are kernels, event records, event
waits, memcpys and communication kernels. Kernels on different streams run
concurrently and share the chip:

* **SMs.** A running communication kernel holds ``comm_sms`` SMs (NCCL: one
  CTA per channel) for its whole duration. Compute kernels share the rest:
  each asks for ``sm_demand`` SMs (default: all); when the demands exceed the
  free SMs every compute kernel gets the same fraction ``free / sum(demand)``.
* **HBM.** Each kernel uses ``hbm_fraction`` of HBM bandwidth when alone (its
  memory-boundness, 0..1); a running comm kernel uses ``comm_hbm_fraction``.
  When the sum exceeds 1, kernels that use HBM get ``1 / sum``.
* A compute kernel progresses at ``min(SM share rate, HBM share rate)`` of its
  standalone speed (roofline-style: it is slowed by the resource it lacks
  most); its ``duration`` is its standalone time. Rates are re-solved whenever a
  kernel starts or ends.

Copies: H2D / D2H move over the topology's PCIe path (GPU <-> its CPU), P2P
over the GPU-to-GPU route (NVLink); they are fabric flows and contend with all
other traffic. D2D runs as a copy kernel of ``2 * bytes / (HBM * d2d_efficiency)``
standalone time that uses all of HBM and no SMs (``sm_demand=0``): it slows the
memory-bound kernels beside it, not the compute-bound ones. Each direction class (H2D, D2H, P2P) has
``copy_engines`` engines; more concurrent copies queue.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

if TYPE_CHECKING:
    from cosim.engine.simulator import Simulator

__all__ = ["CudaEvent", "Gpu", "Kernel", "Stream", "sm_rate"]


def sm_rate(sm_count: float, comm_kernels: float, comm_sms: float, demand: float | None = None) -> float:
    """Speed (fraction of standalone) of compute kernels asking for ``demand`` SMs in total (None: the whole
    chip) while ``comm_kernels`` communication kernels hold ``comm_sms`` SMs each: ``free / demand`` when the
    demand exceeds the free SMs (at least one SM stays free), else 1. The one SM-sharing law of the engine,
    used by :class:`Gpu` and by the replay's communication-SM what-if (cosim.replay.interference)."""
    free = max(sm_count - comm_kernels * comm_sms, 1.0)
    want = sm_count if demand is None else demand
    return min(1.0, free / want) if want > 0 else 1.0


@dataclass(eq=False)
class Kernel:
    """A kernel (or copy) on a stream."""

    name: str
    duration: float
    """Standalone execution time (s)."""
    kind: str = "compute"
    """compute, comm, memcpy."""
    sm_demand: float | None = None
    """SMs it wants (None: all; 0: none, e.g. a D2D copy)."""
    hbm_fraction: float = 0.0
    """Fraction of HBM bandwidth it uses when alone (0..1)."""
    not_before: float = 0.0
    """Earliest start (launch time + launch latency), s."""
    start: float | None = None
    end: float | None = None
    done: simpy.Event | None = None
    stream: Stream | None = None
    remaining: float = 0.0
    rate: float = 1.0


@dataclass(eq=False)
class CudaEvent:
    """A CUDA event: recorded on a stream, waited on by streams or host threads."""

    name: str = "event"
    fired: simpy.Event | None = None
    time: float | None = None


@dataclass(eq=False)
class _Item:
    kind: str
    payload: Any
    done: simpy.Event
    extra: dict[str, Any] = field(default_factory=dict)


class Stream:
    """An in-order queue of GPU work (dotted track ``node0.gpu3.stream7``)."""

    def __init__(self, gpu: Gpu, sid: int | str) -> None:
        self.gpu = gpu
        self.id = sid
        self.track = f"{gpu.track}.stream{sid}"
        self._q: simpy.Store = simpy.Store(gpu.env)
        self.pending = 0
        self._last: simpy.Event | None = None
        gpu.env.process(self._loop())

    def _put(self, kind: str, payload: Any, **extra: Any) -> simpy.Event:
        done = self.gpu.env.event()
        self._q.put(_Item(kind, payload, done, extra))
        self.pending += 1
        self._last = done
        return done

    def enqueue(self, k: Kernel) -> Kernel:
        """Queue a kernel; ``k.done`` succeeds when it ends."""
        k.stream = self
        k.done = self._put("kernel", k)
        return k

    def record(self, ev: CudaEvent | None = None) -> CudaEvent:
        """cudaEventRecord: ``ev`` fires when the stream reaches this point."""
        ev = ev or CudaEvent()
        ev.fired = self._put("record", ev)
        return ev

    def wait_event(self, ev: CudaEvent) -> None:
        """cudaStreamWaitEvent: later work on this stream waits for ``ev``."""
        self._put("wait", ev)

    def marker(self) -> simpy.Event:
        """An event that fires when everything queued so far is done."""
        return self._put("record", CudaEvent("sync"))

    def _loop(self):
        env = self.gpu.env
        while True:
            item: _Item = yield self._q.get()
            if item.kind == "kernel":
                k: Kernel = item.payload
                if env.now < k.not_before:
                    yield env.timeout(k.not_before - env.now)
                yield self.gpu._execute(k)
                item.done.succeed(k)
            elif item.kind == "record":
                ev: CudaEvent = item.payload
                ev.time = env.now
                item.done.succeed(ev)
            elif item.kind == "wait":
                ev = item.payload
                if ev.fired is not None:
                    yield ev.fired
                item.done.succeed(None)
            elif item.kind == "memcpy":
                yield env.process(self.gpu._memcpy(item.payload, self.track))
                item.done.succeed(item.payload)
            elif item.kind == "comm":
                call, rank, name, nb = item.payload
                if env.now < nb:
                    yield env.timeout(nb - env.now)
                t0 = env.now
                self.gpu._comm_begin()
                res = yield call.arrive(rank)
                self.gpu._comm_end()
                self.gpu.sim.record(name, t0, env.now, self.track)
                item.done.succeed(res)
            self.pending -= 1


class Gpu:
    """One GPU: streams, SM/HBM sharing among concurrent kernels, copy engines."""

    def __init__(self, sim: Simulator, name: str) -> None:
        self.sim = sim
        self.env = sim.env
        self.name = name
        self.track = sim.track_of(name)
        cfg = sim.config.gpu
        acc = sim._spec("accelerator", name)
        self.sm_count = cfg.sm_count or (getattr(acc, "sm_count", None) or cfg.default_sm_count)
        """SMs on the chip."""
        self.hbm_bandwidth = cfg.hbm_bandwidth or (getattr(acc, "hbm_bandwidth", None) or cfg.default_hbm_bandwidth)
        """HBM bytes/s."""
        self.comm_sms = cfg.comm_sms
        self.streams: dict[int | str, Stream] = {}
        self._running: list[Kernel] = []
        self._comm_active = 0
        self._t_last = self.env.now
        self._gen = 0
        self._copy: dict[str, simpy.Resource] = {}

    def stream(self, sid: int | str = 0) -> Stream:
        """Stream ``sid`` (created on first use)."""
        s = self.streams.get(sid)
        if s is None:
            s = Stream(self, sid)
            self.streams[sid] = s
        return s

    # ------------------------------------------------------------ sharing
    def _sms(self, k: Kernel) -> float:
        """SMs kernel ``k`` asks for (its ``sm_demand``; all of them when None)."""
        return self.sm_count if k.sm_demand is None else k.sm_demand

    def _rates(self) -> None:
        compute = [k for k in self._running if k.kind != "comm"]
        demand = sum(self._sms(k) for k in compute)
        sm_share = sm_rate(self.sm_count, self._comm_active, self.comm_sms, demand)
        hbm = sum(k.hbm_fraction for k in compute) + self._comm_active * self.sim.config.gpu.comm_hbm_fraction
        hbm_rate = min(1.0, 1.0 / hbm) if hbm > 0 else 1.0
        for k in compute:
            k.rate = min(sm_share, hbm_rate if k.hbm_fraction > 0 else 1.0)

    def _advance(self) -> None:
        dt = self.env.now - self._t_last
        if dt > 0:
            for k in self._running:
                k.remaining -= k.rate * dt
        self._t_last = self.env.now

    def _reschedule(self) -> None:
        self._gen += 1
        gen = self._gen
        self._rates()
        if not self._running:
            return
        dt = min(k.remaining / k.rate for k in self._running)
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e: self._tick(gen))

    def _tick(self, gen: int) -> None:
        if gen != self._gen:
            return
        self._advance()
        fin = [k for k in self._running if k.remaining <= 1e-15 + 1e-12 * k.duration]
        for k in fin:
            self._running.remove(k)
            k.end = self.env.now
            self.sim.record(k.name, k.start or 0.0, k.end, k.stream.track if k.stream else self.track)
            k._ev.succeed(k)  # type: ignore[attr-defined]
        self._reschedule()

    def _execute(self, k: Kernel) -> simpy.Event:
        """Run ``k`` (sharing the chip) and return its completion event."""
        ev = self.env.event()
        k.start = self.env.now
        k._ev = ev  # type: ignore[attr-defined]
        if k.duration <= 0:
            k.end = k.start
            self.sim.record(k.name, k.start, k.end, k.stream.track if k.stream else self.track)
            ev.succeed(k)
            return ev
        self._advance()
        k.remaining = k.duration
        self._running.append(k)
        self._reschedule()
        return ev

    def _comm_begin(self) -> None:
        self._advance()
        self._comm_active += 1
        self._reschedule()

    def _comm_end(self) -> None:
        self._advance()
        self._comm_active -= 1
        self._reschedule()

    # ------------------------------------------------------------ copies
    def memcpy(self, stream: Stream, kind: str, nbytes: float, peer: str | None = None, not_before: float = 0.0,
               name: str | None = None) -> simpy.Event:
        """Queue a copy on ``stream``; kind: h2d, d2h, d2d, p2p (``peer`` GPU)."""
        kind = kind.lower()
        if kind not in ("h2d", "d2h", "d2d", "p2p"):
            raise ValueError(f"memcpy kind must be h2d, d2h, d2d or p2p, got {kind!r}")
        if kind == "p2p" and peer is None:
            raise ValueError("p2p memcpy needs a peer GPU")
        return stream._put("memcpy", {"kind": kind, "nbytes": float(nbytes), "peer": peer, "not_before": not_before,
                                      "name": name or f"memcpy_{kind}"})

    def _memcpy(self, spec: dict[str, Any], track: str):
        env = self.env
        if env.now < spec["not_before"]:
            yield env.timeout(spec["not_before"] - env.now)
        kind, nb = spec["kind"], spec["nbytes"]
        t0 = env.now
        if kind == "d2d":
            k = Kernel(spec["name"], 2 * nb / (self.hbm_bandwidth * self.sim.config.gpu.d2d_efficiency), "memcpy",
                       sm_demand=0.0, hbm_fraction=1.0)
            yield self._execute(k)
            return
        res = self._copy.get(kind)
        if res is None:
            res = self._copy[kind] = simpy.Resource(env, capacity=self.sim.config.gpu.copy_engines)
        with res.request() as req:
            yield req
            if kind == "h2d":
                ev = self.sim.transfer(self.sim.topo.cpu_of(self.name), self.name, nb, name=spec["name"])
            elif kind == "d2h":
                ev = self.sim.transfer(self.name, self.sim.topo.cpu_of(self.name), nb, name=spec["name"])
            else:
                ev = self.sim.transfer(self.name, spec["peer"], nb, name=spec["name"])
            yield ev
        self.sim.record(spec["name"], t0, env.now, track)

    def synchronize(self) -> simpy.Event:
        """An event that fires when every stream's queued work is done (cudaDeviceSynchronize)."""
        evs = [s.marker() for s in self.streams.values()]
        return self.env.all_of(evs)

    @property
    def utilization_now(self) -> float:
        """Fraction of SMs held by running kernels right now (for reports)."""
        used = self._comm_active * self.comm_sms
        used += sum(min(self._sms(k), self.sm_count) * k.rate for k in self._running)
        return min(1.0, used / self.sm_count) if math.isfinite(used) else 1.0
