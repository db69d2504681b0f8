"""Configuration dataclasses of the engine (SI units; validated on creation)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cosim.engine.flows import FabricConfig

__all__ = ["FabricConfig", "GpuConfig", "NcclConfig", "NicConfig", "SimConfig"]

ALGOS = ("auto", "ring", "tree", "nvls", "nvls_tree", "hier")
PROTOS = ("auto", "ll", "ll128", "simple")


def _pos(name: str, v: float, allow_zero: bool = True) -> None:
    ok = (v >= 0 if allow_zero else v > 0) and math.isfinite(v)
    if not ok:
        raise ValueError(f"{name} must be {'>= 0' if allow_zero else '> 0'} and finite, got {v}")


@dataclass
class GpuConfig:
    """What replay's GPU models take when the catalog does not say (cosim.replay.copies, .interference)."""

    comm_hbm_fraction: float = 0.1
    """Fraction of HBM bandwidth a running communication kernel uses (the SM/HBM law of
    cosim.replay.interference; not calibrated)."""
    copy_engines: int = 2
    """Copy engines per GPU (host <-> device copies that run at once, both directions together) where the
    catalog has no count for the accelerator."""

    def __post_init__(self) -> None:
        if not 0 <= self.comm_hbm_fraction <= 1:
            raise ValueError("comm_hbm_fraction must be in [0, 1]")
        if self.copy_engines < 1:
            raise ValueError("copy_engines must be >= 1")


@dataclass
class NicConfig:
    """Network adapter model used for transfers that cross a NIC."""

    default_latency: float = 2e-6
    """NIC-to-NIC latency (s) when no NIC spec is known."""
    default_message_rate: float = 200e6
    """Messages per second when no NIC spec is known."""
    default_per_message_overhead: float = 0.0
    """Seconds per message on the adapter when no NIC spec is known."""
    default_gpudirect: bool = True
    """GPUDirect RDMA when no NIC spec is known."""
    message_size: float = 512 * 1024
    """Bytes per network message (NCCL's chunk size order), for message-rate limits."""

    def __post_init__(self) -> None:
        _pos("default_latency", self.default_latency)
        _pos("default_message_rate", self.default_message_rate, allow_zero=False)
        _pos("default_per_message_overhead", self.default_per_message_overhead)
        _pos("message_size", self.message_size, allow_zero=False)


@dataclass
class NcclConfig:
    """Collective library model (NCCL-like)."""

    algo: str = "auto"
    """Default algorithm: auto (tuner), ring, tree, nvls, nvls_tree, hier."""
    proto: str = "auto"
    """Default protocol: auto (tuner), ll, ll128, simple."""
    channels: int | None = None
    """Channels (rings / trees in parallel, one CTA each); None: from the params file."""
    params: str | None = None
    """Path of a NCCL parameter YAML; None: the bundled ``data/nccl_h100.yaml``."""
    use_calibration: bool = True
    """Use the globally fitted parameters (``fitted:`` in the params file); False: NCCL's constants only."""
    couple_ring: bool = True
    """A ring's edge flows move at one common rate (a pipelined ring runs at its
    slowest edge); False lets each edge run free."""

    def __post_init__(self) -> None:
        if self.algo not in ALGOS:
            raise ValueError(f"algo must be one of {ALGOS}, got {self.algo!r}")
        if self.proto not in PROTOS:
            raise ValueError(f"proto must be one of {PROTOS}, got {self.proto!r}")
        if self.channels is not None and self.channels < 1:
            raise ValueError("channels must be >= 1")


@dataclass
class SimConfig:
    """Everything the :class:`cosim.engine.Simulator` can be told."""

    fabric: FabricConfig = field(default_factory=FabricConfig)
    """Network model."""
    gpu: GpuConfig = field(default_factory=GpuConfig)
    """GPU defaults for replay's copy engines and SM/HBM law."""
    nic: NicConfig = field(default_factory=NicConfig)
    """NIC model."""
    nccl: NcclConfig = field(default_factory=NcclConfig)
    """Collective model."""
    record_trace: bool = True
    """Keep a (name, start, end, track) record of everything that ran."""
    trace_flows: bool = False
    """Also record every fabric flow (can be millions on big all-to-alls)."""

    def __post_init__(self) -> None:
        for name, typ in (("fabric", FabricConfig), ("gpu", GpuConfig), ("nic", NicConfig),
                          ("nccl", NcclConfig)):
            if not isinstance(getattr(self, name), typ):
                raise TypeError(f"SimConfig.{name} must be a {typ.__name__}")
