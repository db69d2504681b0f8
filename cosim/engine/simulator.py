"""The simulator: one simpy environment, the fabric, NICs and collectives.

Replay (cosim.replay) runs a workload's host threads, kernels, copies and collectives on this environment
and fabric; the engine itself needs no GPU or thread objects::

    sim = Simulator(load_topology("dgx-h100"), SimConfig())
    ev = sim.collective("all_reduce", sim.topo.gpus, 64 << 20)        # starts now, on the fabric
    call = sim.collective_call(("tp", 0), "all_reduce", sim.topo.gpus, 64 << 20)
    done = call.arrive("gpu0")                                           # rendezvous: starts when all arrived
    sim.run()
    ev.value.time, ev.value.busbw
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
    """Discrete-event simulation of one machine or cluster: its fabric, NICs and collectives.

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
        self.topo: TopologyLike = topology
        self.config = config or SimConfig()
        self.env = env or simpy.Environment()
        self.trace: list[TraceEvent] = []
        """Everything recorded so far (when ``config.record_trace``)."""
        flow_trace = self.record if self.config.trace_flows else None
        router = topology.paths
        if self.config.fabric.router == "auto" and any(topology.kind_of(n) == "fabric_switch" for n in topology.graph):
            from cosim.engine.topoview import ClusterRouter

            router = ClusterRouter(topology)
        self.fabric = Fabric(self.env, topology.graph, self.config.fabric, router=router, trace=flow_trace)
        self.nccl_params = load_params(self.config.nccl.params)
        self.collectives = Collectives(self)
        self._calls: dict[Any, CollectiveCall] = {}

    # ------------------------------------------------------------- basics
    @property
    def now(self) -> float:
        return self.env.now

    def run(self, until: float | simpy.Event | None = None) -> None:
        """Run the event loop (until no events are left, a time, or an event)."""
        self.env.run(until=until)

    def drop_all(self, at: float | None = None) -> None:
        """Abandon everything in flight: a fresh environment at the same time (or at ``at``) and an idle fabric
        (a scratch simulator whose collective is no longer needed; see :meth:`cosim.engine.flows.Fabric.drop_all`)."""
        self.env = simpy.Environment(initial_time=self.env.now if at is None else at)
        self.fabric.drop_all(self.env)
        self._calls.clear()

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
