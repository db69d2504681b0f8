"""Pydantic models of the hardware catalog.

Each model says what one kind of part *is* in SI units: bytes, bytes/s per
direction, seconds, FLOP/s, hertz, watts. YAML gives unit strings; validators
turn them into floats. Every entry names its ``source`` (a datasheet or a
public measured table); a single number from elsewhere is cited in
``sources: {field: "..."}``.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from cosim import units

__all__ = [
    "CPU",
    "DTYPES",
    "NIC",
    "Accelerator",
    "Bandwidth",
    "Flops",
    "Frequency",
    "LinkType",
    "PCIe",
    "Power",
    "Rate",
    "ScaleUp",
    "Size",
    "Sourced",
    "Strict",
    "Time",
]


def _unit(kind: units.Kind) -> BeforeValidator:
    def conv(v: Any, info: Any = None) -> float:
        field = getattr(info, "field_name", None) or kind
        return units.parse(v, kind, field)

    return BeforeValidator(conv)


Bandwidth = Annotated[float, _unit("bandwidth")]
"""bytes/s, from a string like "450 GB/s" or "400 Gb/s"."""
Time = Annotated[float, _unit("time")]
"""seconds, from "2 us"."""
Size = Annotated[float, _unit("size")]
"""bytes, from "80 GiB"."""
Flops = Annotated[float, _unit("flops")]
"""FLOP/s, from "989 TFLOP/s"."""
Frequency = Annotated[float, _unit("frequency")]
"""hertz, from "1.98 GHz"."""
Power = Annotated[float, _unit("power")]
"""watts, from "700 W"."""
Rate = Annotated[float, _unit("rate")]
"""events per second, from "215 Mmsg/s"."""

DTYPES = ("fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4", "mxfp8", "mxfp6", "mxfp4")
"""Datatypes for which an accelerator may list a dense peak (FLOP/s or OP/s)."""

DType = Literal["fp64", "fp32", "tf32", "bf16", "fp16", "fp8", "int8", "fp6", "fp4", "mxfp8", "mxfp6", "mxfp4"]


class Strict(BaseModel):
    """Base for every YAML-facing model: unknown keys are errors, and models
    are immutable once validated. Each model's validator is built when it first validates
    (``defer_build``), not when its class is defined: a run builds only those of the models it
    validates (benchmarks/README.md, "Round 10 start-up")."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


def _bidirectional_to_per_direction(data: Any) -> Any:
    """Accept ``bidirectional: "900 GB/s"`` in place of ``bandwidth`` and halve it.

    Sources often quote both directions together (NVLink's "900 GB/s"); cosim
    works per direction, so the YAML must say which one it gives. The input is
    never modified: a copy is returned (a location-carrying copy for YAML
    input, so that errors on ``bandwidth`` still point at the
    ``bidirectional`` line).
    """
    if isinstance(data, dict) and "bidirectional" in data:
        if "bandwidth" in data:
            raise ValueError("give either bandwidth (per direction) or bidirectional, not both")
        try:
            bidir = units.parse_bandwidth(data["bidirectional"], "bidirectional")
        except units.UnitError as exc:
            raise ValueError(str(exc)) from None
        out = type(data)((k, v) for k, v in data.items() if k != "bidirectional")
        key_marks = getattr(data, "key_marks", None)
        if key_marks is not None:
            out.mark = data.mark  # type: ignore[attr-defined]
            out.file = data.file  # type: ignore[attr-defined]
            out.key_marks = {k: m for k, m in key_marks.items() if k != "bidirectional"}  # type: ignore[attr-defined]
            if "bidirectional" in key_marks:
                out.key_marks["bandwidth"] = key_marks["bidirectional"]  # type: ignore[attr-defined]
        out["bandwidth"] = f"{bidir / 2.0!r} B/s"
        return out
    return data


def _require_positive(model: BaseModel, *names: str) -> None:
    """Raise if any named rate field is zero: a zero bandwidth, peak or
    message rate would make every transfer or kernel take forever."""
    for name in names:
        value = getattr(model, name)
        items = value.items() if isinstance(value, dict) else [(None, value)]
        for key, v in items:
            if v is not None and v <= 0:
                where = f"{name}.{key}" if key is not None else name
                raise ValueError(f"{where} must be greater than zero")


class Sourced(Strict):
    """A catalog entry: an id, a display name and where its numbers come from."""

    name: str
    """Display name, e.g. "NVIDIA H100 SXM5 80GB"."""
    source: str = Field(min_length=3)
    """Where the numbers come from: a datasheet URL or a public measured table."""
    sources: dict[str, str] = Field(default_factory=dict)
    """Per-field sources where a number comes from somewhere else than ``source``."""
    notes: str = ""
    """Free text: caveats, how a number was derived."""

    @model_validator(mode="after")
    def _sources_name_fields(self) -> Sourced:
        fields = type(self).model_fields
        for key in self.sources:
            if key.split(".")[0] not in fields:
                known = ", ".join(f for f in fields if f not in ("name", "source", "sources", "notes"))
                raise ValueError(f"sources: {key!r} is not a field of this entry; fields: {known}")
        return self


class _PerDirection(Strict):
    """A model with a ``bandwidth`` per direction, which YAML may give as ``bidirectional`` (halved,
    :func:`_bidirectional_to_per_direction`); zero is refused (:func:`_require_positive`)."""

    @model_validator(mode="before")
    @classmethod
    def _bidir(cls, data: Any) -> Any:
        return _bidirectional_to_per_direction(data)

    @model_validator(mode="after")
    def _positive_bandwidth(self) -> _PerDirection:  # not typing.Self: Python 3.11+
        _require_positive(self, "bandwidth")
        return self


class ScaleUp(_PerDirection):
    """An accelerator's scale-up ports (NVLink, Infinity Fabric, ...)."""

    link: str
    """Link type id from the catalog, e.g. "nvlink4"."""
    links: int = Field(gt=0)
    """Number of links per accelerator."""
    bandwidth: Bandwidth
    """Bandwidth per link, per direction (bytes/s)."""

    @property
    def total_bandwidth(self) -> float:
        """All links together, per direction (bytes/s)."""
        return self.links * self.bandwidth


class PCIe(Strict):
    """A PCIe attachment: generation and lane count."""

    generation: int = Field(ge=3, le=7)
    lanes: int = Field(default=16, gt=0)

    @property
    def link(self) -> str:
        """Catalog link id of this attachment, e.g. "pcie5x16" (x16 types only)."""
        return f"pcie{self.generation}x16"


class Accelerator(Sourced):
    """A GPU or other accelerator.

    ``peak_flops`` are dense (no sparsity) tensor-core peaks where the part has
    tensor cores for that dtype; fp64/fp32 are the vector or tensor peak as the
    datasheet lists (see ``notes``).
    """

    vendor: str
    peak_flops: dict[DType, Flops]
    """Dense peak per datatype (FLOP/s)."""
    hbm_capacity: Size
    """Device memory capacity (bytes)."""
    hbm_bandwidth: Bandwidth
    """Device memory bandwidth (bytes/s)."""
    sm_count: int = Field(gt=0)
    """Streaming multiprocessors (NVIDIA) or compute units (AMD)."""
    copy_engines: int | None = Field(default=None, ge=1)
    """Asynchronous copy engines (CUDA ``cudaDeviceProp.asyncEngineCount``): host <-> device copies that can run
    at once; None: unknown (replay assumes 2, one per direction)."""
    l2_size: Size
    """Last-level on-chip cache (bytes): L2, or AMD Infinity Cache where larger."""
    clock: Frequency
    """Boost clock (hertz)."""
    exp_rate: Rate | None = None
    """Hardware exponentials per second (special-function units, ``MUFU.EX2``): SMs x exponentials per clock per
    SM x the clock of the dense tensor peak; what bounds attention's softmax (one exponential per score element).
    None: unknown (attention is then timed by its tensor rate alone)."""
    scale_up: ScaleUp | None = None
    """Scale-up ports; None for PCIe-only parts."""
    pcie: PCIe
    tdp: Power
    """Thermal design power (watts)."""
    price_usd: float | None = Field(default=None, ge=0)
    """Indicative unit price for cost reports (US dollars); optional."""
    hypothetical: bool = False
    """True for what-if parts that do not exist (the parametric custom accelerator)."""
    host_link: str | None = None
    """Catalog link id joining the accelerator to its host CPU when that is not
    PCIe (e.g. "nvlink-c2c" on GB200); None means the host link is ``pcie``."""

    @field_validator("peak_flops", mode="before")
    @classmethod
    def _known_dtypes(cls, v: Any) -> Any:
        if isinstance(v, dict):
            for key in v:
                if key not in DTYPES:
                    close = difflib.get_close_matches(str(key), DTYPES, n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"unknown datatype {key!r}{hint}; known: {', '.join(DTYPES)}")
        return v

    @model_validator(mode="after")
    def _check_peaks(self) -> Accelerator:
        if "bf16" not in self.peak_flops and "fp16" not in self.peak_flops:
            raise ValueError("peak_flops: list at least bf16 or fp16 (the dense tensor peak)")
        _require_positive(self, "peak_flops", "hbm_bandwidth", "hbm_capacity", "clock", "exp_rate")
        return self

    def peak(self, dtype: str) -> float:
        """Dense peak for ``dtype`` in FLOP/s; falls back to the nearest wider type.

        A part without a unit for ``dtype`` runs it at the next wider type's
        rate (e.g. fp8 on V100 runs at the fp16 tensor rate).
        """
        fallbacks = {
            "fp4": ("fp4", "mxfp4", "fp6", "fp8", "bf16", "fp16"),
            "mxfp4": ("mxfp4", "fp4", "mxfp6", "fp8", "bf16", "fp16"),
            "fp6": ("fp6", "mxfp6", "fp8", "bf16", "fp16"),
            "mxfp6": ("mxfp6", "fp6", "mxfp8", "fp8", "bf16", "fp16"),
            "mxfp8": ("mxfp8", "fp8", "bf16", "fp16"),
            "fp8": ("fp8", "mxfp8", "bf16", "fp16"),
            "int8": ("int8", "fp8", "bf16", "fp16"),
            "fp16": ("fp16", "bf16"),
            "bf16": ("bf16", "fp16"),
            "tf32": ("tf32", "fp32"),
            "fp32": ("fp32",),
            "fp64": ("fp64", "fp32"),
        }.get(dtype, (dtype, "bf16", "fp16"))
        for d in fallbacks:
            if d in self.peak_flops:
                return self.peak_flops[d]  # type: ignore[index]
        raise KeyError(f"{self.name} lists no peak for {dtype}")


class CPU(Sourced):
    """A host CPU socket, and the cost of dispatching GPU work from it."""

    vendor: str
    sockets: int = Field(gt=0)
    """Sockets of this part per server in the system its source describes (DGX H100: 2 x 8480C).
    A topology places its own count; this is the reference configuration."""
    cores: int = Field(gt=0)
    """Cores per socket."""
    threads_per_core: int = Field(default=2, gt=0)
    frequency: Frequency
    """Base clock (hertz)."""
    boost_frequency: Frequency | None = None
    memory_bandwidth: Bandwidth
    """Peak DRAM bandwidth per socket (bytes/s)."""
    pcie: PCIe
    """PCIe generation of the socket's root ports; ``lanes`` is the total per socket."""
    launch_overhead: Time
    """CPU time the launching thread spends in one kernel-launch API call (seconds)."""
    launch_latency: Time
    """Minimum time from the start of a launch call to the kernel's start on the GPU (seconds)."""
    host_time_factor: float = Field(default=1.0, gt=0)
    """Eager framework host time (Python, the PyTorch dispatcher, the launch call) relative to the x86 hosts the
    synthetic step's dispatch cost was measured on (1: same; > 1: a slower single thread)."""
    tdp: Power
    price_usd: float | None = Field(default=None, ge=0)


class NIC(Sourced):
    """A network adapter for the scale-out fabric."""

    vendor: str
    bandwidth: Bandwidth
    """Line rate per port, per direction (bytes/s)."""
    ports: int = Field(default=1, gt=0)
    latency: Time
    """One-way adapter latency, NIC to NIC over one switch hop (seconds)."""
    message_rate: Rate
    """Messages per second the adapter sustains."""
    per_message_overhead: Time
    """Fixed cost per message on the adapter (seconds), on top of the wire time."""
    gpudirect_rdma: bool
    """True if the NIC reads and writes GPU memory directly over PCIe."""
    pcie: PCIe
    link: str
    """Catalog link type of its network port, e.g. "ib-ndr"."""
    tdp: Power | None = None
    price_usd: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _positive(self) -> NIC:
        _require_positive(self, "bandwidth", "message_rate")
        return self


class LinkType(Sourced, _PerDirection):
    """A kind of point-to-point link.

    ``bandwidth`` is the raw rate per direction; ``efficiency`` the fraction a
    bulk transfer achieves after protocol overheads (e.g. PCIe Gen5 x16: 64 GB/s
    raw, about 55 GB/s measured, efficiency ~0.86).
    """

    kind: Literal["pcie", "nvlink", "c2c", "upi", "xgmi", "infinity_fabric", "infiniband", "ethernet", "internal"]
    bandwidth: Bandwidth
    """Raw bandwidth per direction (bytes/s)."""
    latency: Time
    """One-hop latency (seconds)."""
    efficiency: float = Field(gt=0.0, le=1.0)
    """Achievable fraction of ``bandwidth`` for large transfers."""

    @property
    def effective_bandwidth(self) -> float:
        """Bandwidth a bulk transfer achieves, per direction (bytes/s)."""
        return self.bandwidth * self.efficiency
