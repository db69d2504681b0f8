"""Host model: CPU sockets with cores, and host threads that run CPU ops and launch GPU work.

* A host thread is sequential: the caller (one simpy process per thread)
  yields its methods in program order.
* ``cpu_op`` runs on one of the socket's cores (a simpy Resource of
  ``cores``): more runnable threads than cores queue.
* ``launch`` costs the thread ``launch_overhead`` CPU seconds (catalog
  ``CPU.launch_overhead``; overridable and scalable in :class:`HostConfig`);
  the kernel starts no earlier than ``launch_latency`` after the call began,
  and after the work queued before it on its stream.
* ``graph_launch`` costs one launch for all kernels of a CUDA graph.
* ``sync_stream`` / ``sync_device`` / ``sync_event`` and blocking copies
  block the thread (off-core) until the GPU work they wait on is done.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import simpy

from cosim.engine.gpu import CudaEvent, Gpu, Kernel, Stream

if TYPE_CHECKING:
    from cosim.engine.collectives import CollectiveCall
    from cosim.engine.simulator import Simulator

__all__ = ["CpuSocket", "HostThread"]


class CpuSocket:
    """A CPU socket: cores shared by host threads, launch costs from its spec."""

    def __init__(self, sim: Simulator, cpu: str) -> None:
        self.sim = sim
        self.name = cpu
        cfg = sim.config.host
        spec = sim._spec("cpu_spec", cpu)
        cores = cfg.cores_per_socket or getattr(spec, "cores", None) or 1_000_000
        self.cores = simpy.Resource(sim.env, capacity=int(cores))
        self.launch_overhead = (cfg.launch_overhead if cfg.launch_overhead is not None
                                else getattr(spec, "launch_overhead", None) or cfg.default_launch_overhead)
        self.launch_overhead *= cfg.launch_overhead_scale
        """CPU seconds per kernel launch."""
        self.launch_latency = (cfg.launch_latency if cfg.launch_latency is not None
                               else getattr(spec, "launch_latency", None) or cfg.default_launch_latency)
        """Launch call start to earliest kernel start (s)."""


class HostThread:
    """A host thread (e.g. a rank's main thread); dotted track ``node0.cpu0.<name>``."""

    def __init__(self, sim: Simulator, name: str, socket: CpuSocket | None) -> None:
        self.sim = sim
        self.env = sim.env
        self.name = name
        self.socket = socket
        self.track = name if name.startswith("node") else (
            f"{sim.track_of(socket.name)}.{name}" if socket is not None else f"host.{name}")
        cfg = sim.config.host
        self.launch_overhead = socket.launch_overhead if socket else cfg.default_launch_overhead * \
            cfg.launch_overhead_scale
        self.launch_latency = socket.launch_latency if socket else cfg.default_launch_latency

    def _on_core(self, seconds: float, name: str):
        """Hold a core of the socket for ``seconds``; returns the time the work started (after any
        wait for a free core), which is also where its recorded span starts."""
        if self.socket is not None:
            with self.socket.cores.request() as req:
                yield req
                t0 = self.env.now
                yield self.env.timeout(seconds)
        else:
            t0 = self.env.now
            yield self.env.timeout(seconds)
        if name:
            self.sim.record(name, t0, self.env.now, self.track)
        return t0

    def cpu_op(self, duration: float, name: str = "cpu_op") -> simpy.Process:
        """Run a CPU op of ``duration`` s (scaled by ``cpu_op_scale``) on a core."""
        return self.env.process(self._on_core(duration * self.sim.config.host.cpu_op_scale, name))

    def launch(self, stream: Stream, duration: float, name: str = "kernel", *, kind: str = "compute",
               sm_demand: float | None = None, hbm_fraction: float = 0.0) -> simpy.Process:
        """cudaLaunchKernel: costs the thread ``launch_overhead``; value: the :class:`Kernel`."""
        return self.env.process(self._launch(stream, [dict(duration=duration, name=name, kind=kind,
                                                           sm_demand=sm_demand, hbm_fraction=hbm_fraction)],
                                             f"launch {name}"))

    def graph_launch(self, stream: Stream, kernels: Sequence[dict[str, Any]], name: str = "graph") -> simpy.Process:
        """cudaGraphLaunch: one launch cost for all ``kernels`` (dicts of :class:`Kernel` fields);
        value: the list of kernels."""
        return self.env.process(self._launch(stream, list(kernels), f"graph_launch {name}", many=True))

    def _launch(self, stream: Stream, specs: list[dict[str, Any]], label: str, many: bool = False):
        t0 = yield from self._on_core(self.launch_overhead, label)
        out = []
        for sp in specs:
            k = Kernel(**sp)
            k.not_before = t0 + self.launch_latency
            out.append(stream.enqueue(k))
        return out if many else out[0]

    def launch_comm(self, stream: Stream, call: CollectiveCall, rank: str, name: str | None = None) -> simpy.Process:
        """Launch a communication kernel for ``call`` on ``stream``: it holds the GPU's comm SMs
        from when it reaches the head of the stream until the collective ends; value: the
        event that succeeds with the :class:`CollectiveResult`."""
        return self.env.process(self._launch_comm(stream, call, rank, name or call.op))

    def _launch_comm(self, stream: Stream, call: CollectiveCall, rank: str, name: str):
        t0 = yield from self._on_core(self.launch_overhead, f"launch {name}")
        return stream._put("comm", (call, rank, name, t0 + self.launch_latency))

    def memcpy(self, gpu: Gpu, stream: Stream, kind: str, nbytes: float, peer: str | None = None,
               blocking: bool = False, name: str | None = None) -> simpy.Process:
        """cudaMemcpyAsync (or blocking cudaMemcpy with ``blocking``)."""
        return self.env.process(self._memcpy(gpu, stream, kind, nbytes, peer, blocking, name))

    def _memcpy(self, gpu: Gpu, stream: Stream, kind: str, nbytes: float, peer: str | None, blocking: bool,
                name: str | None):
        t0 = yield from self._on_core(self.launch_overhead, f"memcpy {kind}")
        ev = gpu.memcpy(stream, kind, nbytes, peer, not_before=t0 + self.launch_latency, name=name)
        if blocking:
            yield from self._blocked(ev, f"memcpy {kind} (blocking)")
        return ev

    def _blocked(self, ev: simpy.Event, name: str):
        t0 = self.env.now
        yield ev
        self.sim.record(name, t0, self.env.now, self.track)

    def sync_stream(self, stream: Stream) -> simpy.Process:
        """cudaStreamSynchronize: block until the stream's queued work is done."""
        return self.env.process(self._blocked(stream.marker(), "cudaStreamSynchronize"))

    def sync_device(self, gpu: Gpu) -> simpy.Process:
        """cudaDeviceSynchronize: block until every stream of ``gpu`` is idle."""
        return self.env.process(self._blocked(gpu.synchronize(), "cudaDeviceSynchronize"))

    def sync_event(self, ev: CudaEvent) -> simpy.Process:
        """cudaEventSynchronize: block until ``ev`` has fired."""
        target = ev.fired if ev.fired is not None else self.env.timeout(0)
        return self.env.process(self._blocked(target, "cudaEventSynchronize"))
