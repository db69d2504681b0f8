"""The simulator: one simpy environment, the fabric, GPUs, host threads, collectives.

Typical use by a replay layer::

    sim = Simulator(load_topology("dgx-h100"), SimConfig())
    t = sim.thread("node0.rank0.main", gpu="gpu0")
    s = sim.gpu("gpu0").stream(7)

    def rank0():
        yield t.cpu_op(5e-6, name="aten::linear")
        k = yield t.launch(s, 120e-6, name="gemm")          # returns a Kernel
        call = sim.collective_call(("tp", 0), "all_reduce", sim.topo.gpus, 64 << 20)
        yield from t.comm(s, call, "gpu0")                  # comm kernel on stream s
        yield t.sync_stream(s)

    sim.env.process(rank0()); sim.run()
    sim.trace   # [(name, start, end, track), ...]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import networkx as nx
import simpy

from cosim.engine.collectives import CollectiveCall, Collectives
from cosim.engine.config import SimConfig
from cosim.engine.flows import Fabric
from cosim.engine.nccl import load_params
from cosim.engine.topoview import GraphTopology, TopologyLike

__all__ = ["Simulator", "TraceEvent"]

_NVLS_PARTS = ("h100", "h200", "h800", "h20", "gh200", "b100", "b200", "b300", "gb200", "gb300", "hopper", "blackwell")


class TraceEvent(NamedTuple):
    """One interval on a timeline: what ran, when (s), on which dotted track."""

    name: str
    start: float
    end: float
    track: str


class Simulator:
    """Discrete-event simulation of one machine or cluster.

    Args:
        topology: a :class:`cosim.topology.Topology` (or anything with the same
            attributes, see :class:`TopologyLike`), or a bare ``nx.DiGraph``.
        config: :class:`SimConfig`.
        env: an existing simpy environment to share; default a new one.
    """

    def __init__(self, topology: TopologyLike | nx.DiGraph, config: SimConfig | None = None,
                 env: simpy.Environment | None = None) -> None:
        if isinstance(topology, nx.DiGraph):
            topology = GraphTopology(topology)
        self.topo: Any = topology
        self.config = config or SimConfig()
        self.env = env or simpy.Environment()
        self.trace: list[TraceEvent] = []
        """Everything recorded so far (when ``config.record_trace``)."""
        flow_trace = self.record if self.config.trace_flows else None
        router = topology.paths
        if self.config.fabric.router == "auto" and any(
                d.get("kind") == "fabric_switch" for _, d in topology.graph.nodes(data=True)):
            from cosim.engine.topoview import ClusterRouter

            router = ClusterRouter(topology)
        self.fabric = Fabric(self.env, topology.graph, self.config.fabric, router=router, trace=flow_trace)
        self.nccl_params = load_params(self.config.nccl.params)
        self.collectives = Collectives(self)
        self._gpus: dict[str, Any] = {}
        self._threads: dict[str, Any] = {}
        self._sockets: dict[str, Any] = {}
        self._calls: dict[Any, CollectiveCall] = {}

    # ------------------------------------------------------------- basics
    @property
    def now(self) -> float:
        return self.env.now

    def run(self, until: float | simpy.Event | None = None) -> None:
        """Run the event loop (until no events are left, a time, or an event)."""
        self.env.run(until=until)

    def record(self, name: str, start: float, end: float, track: str) -> None:
        """Add a timeline interval (no-op unless ``config.record_trace``)."""
        if self.config.record_trace:
            self.trace.append(TraceEvent(name, start, end, track))

    def track_of(self, dev: str) -> str:
        """Dotted timeline name of a device: ``node0.gpu3`` (cluster ids are kept)."""
        if dev.startswith("node") and "." in dev:
            return dev
        try:
            node = self.topo.node_of(dev)
        except Exception:
            node = 0
        return f"node{max(node, 0)}.{dev}" if node >= 0 else dev

    def config_for_scratch(self) -> SimConfig:
        """This config without trace recording (for the tuner's idle-fabric runs)."""
        import dataclasses

        return dataclasses.replace(self.config, record_trace=False, trace_flows=False)

    # ------------------------------------------------------------- specs
    def _spec(self, getter: str, dev: str) -> Any:
        fn = getattr(self.topo, getter, None)
        if fn is None:
            return None
        try:
            return fn(dev)
        except Exception:
            return None

    def supports_nvls(self, gpu: str) -> bool:
        """NVLink SHARP needs NVSwitch (checked by the caller) and Hopper or newer."""
        acc = self._spec("accelerator", gpu)
        if acc is None:
            return True
        name = f"{getattr(acc, 'name', '')}".lower()
        link = getattr(getattr(acc, "scale_up", None), "link", "") or ""
        return any(p in name for p in _NVLS_PARTS) or link in ("nvlink4", "nvlink5")

    # ------------------------------------------------------------- parts
    def gpu(self, name: str) -> Any:
        """The :class:`Gpu` model of GPU ``name`` (created on first use)."""
        g = self._gpus.get(name)
        if g is None:
            from cosim.engine.gpu import Gpu

            g = Gpu(self, name)
            self._gpus[name] = g
        return g

    def socket(self, cpu: str) -> Any:
        """The :class:`CpuSocket` model of CPU ``cpu`` (created on first use)."""
        s = self._sockets.get(cpu)
        if s is None:
            from cosim.engine.host import CpuSocket

            s = CpuSocket(self, cpu)
            self._sockets[cpu] = s
        return s

    def thread(self, name: str, *, gpu: str | None = None, cpu: str | None = None) -> Any:
        """The :class:`HostThread` ``name`` on ``cpu`` (default: the CPU of ``gpu``)."""
        t = self._threads.get(name)
        if t is None:
            from cosim.engine.host import HostThread

            if cpu is None:
                cpu = self.topo.cpu_of(gpu) if gpu is not None else None
            t = HostThread(self, name, self.socket(cpu) if cpu is not None else None)
            self._threads[name] = t
        return t

    # ------------------------------------------------------------- transfers
    def transfer(self, src: str, dst: str, nbytes: float, *, name: str = "transfer", max_rate: float = math.inf,
                 efficiency: float = 1.0, message_size: float | None = None, track: str | None = None,
                 key: int = 0) -> simpy.Event:
        """Move bytes between two devices, with NIC costs where the route crosses NICs.

        A route through a NIC adds the NIC's latency and ``per_message_overhead``
        per message and is capped by its message rate times the message size.
        Without GPUDirect RDMA the data bounces through host memory: GPU -> CPU
        over PCIe, CPU -> remote CPU over the network, CPU -> GPU, as three flows
        in sequence per message (modelled as a store-and-forward of the whole
        transfer in three flows).
        """
        from cosim.engine.nic import net_transfer

        return net_transfer(self, src, dst, nbytes, name=name, max_rate=max_rate, efficiency=efficiency,
                            message_size=message_size, track=track or "fabric", key=key)

    # ------------------------------------------------------------- collectives
    def collective(self, op: str, ranks: Sequence[str], nbytes: float = 0.0, **kw: Any) -> simpy.Event:
        """Start a collective now on ``ranks`` (GPU ids); see :meth:`Collectives.run`.

        ``deepep_dispatch`` / ``deepep_combine``: a DeepEP MoE dispatch/combine whose traffic follows from
        the keywords of :func:`cosim.engine.moe_comm.deepep` (num_tokens, hidden, num_topk, num_experts, ...),
        not from ``nbytes`` (which must be 0); the event's value is a ``MoeCommResult``."""
        if op in ("deepep_dispatch", "deepep_combine"):
            from cosim.engine.moe_comm import deepep

            if nbytes:
                raise ValueError(f"{op}: traffic follows from num_tokens x hidden x routing; pass nbytes=0")
            return deepep(self, op.removeprefix("deepep_"), ranks, **kw)
        return self.collectives.run(op, ranks, nbytes, **kw)

    def collective_call(self, key: Any, op: str, ranks: Sequence[str], nbytes: float = 0.0,
                        **kw: Any) -> CollectiveCall:
        """Rendezvous for a collective identified by ``key`` (e.g. (group, seq)).

        Every rank gets the same :class:`CollectiveCall` for the same key; the
        collective starts when all ranks have called :meth:`CollectiveCall.arrive`.
        """
        call = self._calls.get(key)
        if call is None:
            call = CollectiveCall(self, key, op, ranks, nbytes, **kw)
            self._calls[key] = call
        return call

    def forget_call(self, key: Any) -> None:
        self._calls.pop(key, None)

    # ------------------------------------------------------------- reports
    def link_report(self) -> list[dict[str, Any]]:
        """Per-link counters with average utilization over the run so far."""
        el = self.env.now
        out = []
        for st in self.fabric.link_stats():
            d = st.to_dict()
            d["utilization"] = st.utilization(el)
            out.append(d)
        return out
