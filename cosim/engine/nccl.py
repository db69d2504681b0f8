"""NCCL-like cost parameters and tuner: latency per algorithm/protocol, protocol
efficiencies, and size-based choice of algorithm and protocol.

The structure follows NCCL's ``ncclTopoTuneModel`` (src/graph/tuning.cc):

* latency = ``baseLat[algo][proto]`` + per-step hardware latency ``hwLat[hw][algo][proto]``
  times the number of steps (ring: ``nsteps`` intra + ``nInterSteps`` on the
  network; tree: ``2 * ((ppn-1) * intra + log2(nNodes) * inter)``; NVLS: one
  switch latency);
* bandwidth: a protocol's payload fraction (LL 1/2: 8 data bytes per 16-byte
  line; LL128 ~0.92: 120 of 128 bytes; Simple 1) times the fraction of link
  bandwidth the communication kernels reach ("bus efficiency"), with NCCL's caps
  (LL bus bandwidth cap, LL128 per-channel cap).

Unlike NCCL's closed-form model, cosim takes the *bandwidth* from flows on the
fabric (so contention is real); only the latency terms are fixed delays. The
tuner estimates each (algo, proto) on the idle fabric and picks the fastest,
as NCCL's tuner does with its own tables.

Numbers live in a YAML parameter file (default: ``data/nccl_h100.yaml``):
NCCL's published constants as ``defaults``, and ``calibrations`` fitted on
measured data that replace latency and efficiency per protocol for one
communicator shape (see validation/collectives/).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosim import units

__all__ = ["BUSBW_FACTOR", "DEFAULT_PARAMS", "OPS", "PROTOCOLS", "Calibration", "NcclParams", "Shape", "load_params"]

PROTOCOLS = ("ll", "ll128", "simple")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "all_to_allv", "send_recv")
DEFAULT_PARAMS = Path(__file__).resolve().parent / "data" / "nccl_h100.yaml"


def BUSBW_FACTOR(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor (PERFORMANCE.md)."""
    if n <= 1:
        return 1.0
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Shape:
    """What the cost model needs to know about one collective call."""

    op: str
    nranks: int
    nnodes: int
    ppn: int
    """Most ranks on one node."""
    intra: str
    """Worst link class inside nodes along the algorithm's edges: nvswitch, nvlink, pci (or none)."""
    machine: str | None = None
    """Topology name, for machine-specific calibrations."""
    nvls: bool = False
    """NVLink SHARP available (NVSwitch + Hopper or newer, single node)."""
    accel: str | None = None
    """Accelerator catalog name of the first rank, for accelerator-specific calibrations."""


@dataclass
class Calibration:
    """Fitted latency and efficiency per algorithm/protocol for one communicator shape."""

    name: str
    match: dict[str, Any]
    """Keys of :class:`Shape` that must be equal (op, nranks, nnodes, intra, machine, accel)."""
    latency: dict[str, float]
    """Fixed latency per ``"algo/proto"`` (s)."""
    efficiency: dict[str, float]
    """Payload fraction of the flows' path capacity per ``"algo/proto"`` (0..1]."""
    up_to: dict[str, float] = field(default_factory=dict)
    """Largest size (bytes) at which the library picks each ``"algo/proto"``, in
    ascending order (the measured protocol switch points); empty: the tuner picks
    the fastest calibrated pair."""
    fit: dict[str, Any] = field(default_factory=dict)
    """Provenance of the fit (data, split, errors)."""

    def matches(self, shape: Shape) -> bool:
        return all(getattr(shape, k, None) == v for k, v in self.match.items())

    @property
    def combos(self) -> list[tuple[str, str]]:
        return [tuple(k.split("/", 1)) for k in self.latency]  # type: ignore[misc]

    def pick(self, nbytes: float) -> tuple[str, str] | None:
        """The calibrated (algo, proto) for a size, from ``up_to``; None without switch points."""
        if not self.up_to:
            return None
        for k, lim in self.up_to.items():
            if nbytes <= lim:
                return tuple(k.split("/", 1))  # type: ignore[return-value]
        return tuple(list(self.up_to)[-1].split("/", 1))  # type: ignore[return-value]

    def to_yaml(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "name": self.name,
            "match": dict(self.match),
            "latency": {k: units.fmt_time(v, 6) for k, v in self.latency.items()},
            "efficiency": {k: round(v, 6) for k, v in self.efficiency.items()},
        }
        if self.up_to:
            d["up_to"] = {k: (f"{int(v)} B" if math.isfinite(v) else "inf") for k, v in self.up_to.items()}
        d["fit"] = self.fit
        return d


def _time_table(d: dict[str, Any], where: str) -> dict[str, dict[str, float]]:
    return {a: {p: units.parse_time(v, f"{where}.{a}.{p}") for p, v in row.items()} for a, row in d.items()}


@dataclass
class NcclParams:
    """NCCL cost constants plus fitted calibrations (SI units)."""

    source: str
    channels: int
    base_latency: dict[str, dict[str, float]]
    """``[algo][proto]`` seconds."""
    hw_latency: dict[str, dict[str, dict[str, float]]]
    """``[hw class: nvlink|pci|net][algo][proto]`` seconds per step."""
    protocol_efficiency: dict[str, float]
    bus_efficiency: dict[str, float]
    """Fraction of link capacity the comm kernels reach, per hw class."""
    ll_max_busbw: float
    ll128_max_busbw_per_channel: float
    nvls_efficiency: float
    calibrations: list[Calibration] = field(default_factory=list)
    path: str | None = None

    def calibration_for(self, shape: Shape) -> Calibration | None:
        """The first calibration whose ``match`` fits ``shape``."""
        for c in self.calibrations:
            if c.matches(shape):
                return c
        return None

    # ------------------------------------------------------------ latency
    def latency(self, shape: Shape, algo: str, proto: str) -> float:
        """NCCL-model latency of one collective (s), before any calibration."""
        intra_hw = "pci" if shape.intra == "pci" else "nvlink"
        n, nn = shape.nranks, shape.nnodes
        op = shape.op
        hw = self.hw_latency
        if algo == "p2p":
            hwc = "net" if nn > 1 else intra_hw
            return self.base_latency["p2p"][proto] + hw[hwc]["p2p"][proto]
        if algo == "hier":
            # intra reduce-scatter + inter all-reduce + intra all-gather
            ppn = max(shape.ppn, 1)
            lat = self.base_latency["ring"][proto]
            lat += 2 * (ppn - 1) * hw[intra_hw]["ring"][proto]
            lat += 2 * (nn - 1) * hw["net"]["ring"][proto]
            return lat
        base = self.base_latency[algo][proto]
        intra_lat = hw[intra_hw][algo][proto]
        inter_lat = hw["net"][algo][proto]
        if nn > 1 and proto == "ll":
            intra_lat *= 1.8
        if algo == "ring":
            if op == "all_reduce":
                nsteps, ninter = 2 * (n - 1), 2 * (nn - 1)
            elif op in ("all_gather", "reduce_scatter"):
                nsteps, ninter = n - 1, nn - 1
            else:  # broadcast / reduce: pipelined chain
                nsteps, ninter = n - 1, nn - 1
            return base + (nsteps - ninter) * intra_lat + ninter * (inter_lat if nn > 1 else intra_lat)
        if algo == "tree":
            ppn = max(shape.ppn, 1)
            return base + 2 * ((ppn - 1) * intra_lat + math.log2(nn) * inter_lat) if nn > 1 else \
                base + 2 * (ppn - 1) * intra_lat
        if algo == "nvls":
            return base + intra_lat + (inter_lat if nn > 1 else 0.0)
        raise ValueError(f"unknown algorithm {algo!r}")

    def efficiency(self, shape: Shape, algo: str, proto: str) -> float:
        """Payload fraction of link capacity for an uncalibrated shape."""
        cls = "net" if shape.nnodes > 1 else ("pci" if shape.intra == "pci" else "nvlink")
        e = self.protocol_efficiency[proto] * self.bus_efficiency[cls]
        if algo == "nvls":
            e *= self.nvls_efficiency
        return min(e, 1.0)

    def rate_cap(self, shape: Shape, algo: str, proto: str, channels: int) -> float:
        """Cap on each rank's payload send rate (bytes/s) from NCCL's protocol limits."""
        if proto == "ll":
            return self.ll_max_busbw
        if proto == "ll128":
            return self.ll128_max_busbw_per_channel * channels
        return math.inf

    def cost(self, shape: Shape, algo: str, proto: str, channels: int | None = None,
             use_calibration: bool = True) -> tuple[float, float, float]:
        """(latency s, efficiency, per-rank payload rate cap bytes/s) for a call."""
        ch = channels or self.channels
        if use_calibration:
            cal = self.calibration_for(shape)
            k = f"{algo}/{proto}"
            if cal is not None and k in cal.latency:
                return cal.latency[k], cal.efficiency[k], math.inf
        return self.latency(shape, algo, proto), self.efficiency(shape, algo, proto), \
            self.rate_cap(shape, algo, proto, ch)

    def calibrated_combos(self, shape: Shape) -> list[tuple[str, str]] | None:
        """(algo, proto) pairs of the matching calibration, or None."""
        cal = self.calibration_for(shape)
        return cal.combos if cal is not None else None


def _parse(doc: dict[str, Any], path: str | None) -> NcclParams:
    d = doc["defaults"]
    hw = {c: _time_table(t, f"defaults.hw_latency.{c}") for c, t in d["hw_latency"].items()}
    cals = []
    for i, c in enumerate(doc.get("calibrations") or []):
        cals.append(Calibration(
            name=c["name"], match=dict(c["match"]),
            latency={p: units.parse_time(v, f"calibrations[{i}].latency.{p}") for p, v in c["latency"].items()},
            efficiency={p: float(v) for p, v in c["efficiency"].items()},
            up_to={p: (math.inf if v == "inf" else units.parse_size(v, f"calibrations[{i}].up_to.{p}"))
                   for p, v in (c.get("up_to") or {}).items()},
            fit=dict(c.get("fit") or {}),
        ))
    return NcclParams(
        source=str(doc.get("source", "")),
        channels=int(d["channels"]),
        base_latency=_time_table(d["base_latency"], "defaults.base_latency"),
        hw_latency=hw,
        protocol_efficiency={p: float(v) for p, v in d["protocol_efficiency"].items()},
        bus_efficiency={p: float(v) for p, v in d["bus_efficiency"].items()},
        ll_max_busbw=units.parse_bandwidth(d["ll_max_busbw"], "ll_max_busbw"),
        ll128_max_busbw_per_channel=units.parse_bandwidth(d["ll128_max_busbw_per_channel"],
                                                          "ll128_max_busbw_per_channel"),
        nvls_efficiency=float(d["nvls_efficiency"]),
        calibrations=cals,
        path=path,
    )


_CACHE: dict[str, NcclParams] = {}


def load_params(path: str | Path | None = None) -> NcclParams:
    """Load (and cache) a NCCL parameter file; default: the bundled H100 file."""
    p = str(Path(path) if path is not None else DEFAULT_PARAMS)
    if p not in _CACHE:
        with open(p, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        _CACHE[p] = _parse(doc, p)
    return _CACHE[p]


def clear_cache() -> None:
    """Forget loaded parameter files (after a refit rewrote one)."""
    _CACHE.clear()
