"""NIC model: per-message overhead, message rate, GPUDirect RDMA or host bounce.

A transfer whose route crosses a NIC (node kind ``nic``) pays, on top of the
flow on the fabric (which already shares the NIC's port link and the PCIe
links with every other flow):

* the NIC's one-way ``latency`` once and its ``per_message_overhead`` once
  (the first message; later ones overlap with the wire);
* a rate cap: ``min(message_rate * message_size,
  message_size / (per_message_overhead + message_size / bandwidth))``.

With GPUDirect RDMA the route is GPU -> PCIe switch -> NIC, so the bytes share
the PCIe switch uplink with the GPU's own PCIe traffic. Without it the data is
staged in host memory: GPU -> CPU, CPU -> remote CPU (over the NICs), CPU ->
GPU, as three flows that run pipelined (coupled: one common rate), as NCCL's
chunked host staging does.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

if TYPE_CHECKING:
    from cosim.engine.simulator import Simulator

__all__ = ["message_cap", "net_transfer", "nic_params"]


def message_cap(message_rate: Any, per_message_overhead: Any, bandwidth: Any, message: Any) -> Any:
    """A NIC's cap on one flow's rate (bytes/s) at messages of ``message`` bytes:
    ``min(message_rate * message, message / (per_message_overhead + message / bandwidth))``, the second term
    only where the overhead is > 0. Scalars or numpy arrays (broadcast)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.minimum(np.multiply(message_rate, message),
                          np.where(np.greater(per_message_overhead, 0),
                                   np.divide(message, np.add(per_message_overhead, np.divide(message, bandwidth))),
                                   np.inf))


def nic_params(sim: Simulator, nic: str) -> dict[str, Any]:
    """Latency, message rate, per-message overhead, bandwidth and GPUDirect of ``nic``."""
    cfg = sim.config.nic
    spec = sim._spec("nic_spec", nic)
    if spec is None:
        return {"latency": cfg.default_latency, "message_rate": cfg.default_message_rate,
                "per_message_overhead": cfg.default_per_message_overhead, "bandwidth": math.inf,
                "gpudirect": cfg.default_gpudirect}
    return {"latency": float(spec.latency), "message_rate": float(spec.message_rate),
            "per_message_overhead": float(spec.per_message_overhead), "bandwidth": float(spec.bandwidth),
            "gpudirect": bool(spec.gpudirect_rdma)}


def net_transfer(sim: Simulator, src: str, dst: str, nbytes: float, *, name: str, max_rate: float,
                 efficiency: float, message_size: float | None, track: str, key: int = 0) -> simpy.Event:
    """See module docstring."""
    fab = sim.fabric
    if src == dst:
        return sim.env.timeout(0.0)
    path = fab.paths(src, dst)[0]
    nics = [n for n in path if sim.topo.kind_of(n) == "nic"]
    if not nics:
        return fab.transfer(src, dst, nbytes, efficiency=efficiency, max_rate=max_rate, name=name, track=track,
                            key=key)
    msg = message_size or sim.config.nic.message_size
    extra = 0.0
    cap = max_rate
    gpudirect = True
    for nic in dict.fromkeys(nics):
        p = nic_params(sim, nic)
        extra = max(extra, p["latency"])
        cap = min(cap, float(message_cap(p["message_rate"], p["per_message_overhead"], p["bandwidth"], msg)))
        extra += p["per_message_overhead"]
        gpudirect = gpudirect and p["gpudirect"]
    kinds = (sim.topo.kind_of(src), sim.topo.kind_of(dst))
    if gpudirect or "gpu" not in kinds:
        return fab.transfer(src, dst, nbytes, efficiency=efficiency, max_rate=cap, extra_latency=extra, name=name,
                            track=track, key=key)
    # host bounce: GPU -> CPU, CPU -> CPU (network), CPU -> GPU, pipelined
    a = sim.topo.cpu_of(src) if kinds[0] == "gpu" else src
    b = sim.topo.cpu_of(dst) if kinds[1] == "gpu" else dst
    grp = fab.new_group()
    legs = [(src, a), (a, b), (b, dst)]
    evs = [fab.transfer(x, y, nbytes, efficiency=efficiency, max_rate=cap, group=grp, name=f"{name}[{x}->{y}]",
                        track=track, extra_latency=extra if (x, y) == (a, b) else 0.0)
           for x, y in legs if x != y]
    return sim.env.all_of(evs)
