"""Replay configuration: how a captured workload is bound to hardware, and the
what-if knobs.

Every knob can be set from the CLI or a scenario with ``--set key=value``;
:func:`apply_sets` parses those strings (unit strings for times, plain numbers
for factors). Catalog fields (``links.nvlink4.bandwidth=900 GB/s``) pass through
to the topology as catalog overrides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from cosim import units
from cosim.errors import CosimInputError

__all__ = ["CATALOG_SECTIONS", "OP_CLASSES", "PRECISION_DTYPES", "PRECISION_SCOPES", "ReplayConfig", "apply_sets",
           "parse_sets"]

OP_CLASSES = (
    "gemm", "grouped_gemm", "attention", "elementwise", "reduction", "norm",
    "memcpy", "memset", "collective", "moe_dispatch", "moe_combine", "other",
)
"""GPU op classes of the execution graph (``OpClass`` names, lower case)."""

CATALOG_SECTIONS = ("accelerators", "cpus", "nics", "links")
PRECISION_SCOPES = ("experts", "gemm")
"""Keys of the precision what-if: the MoE expert GEMMs, or every GEMM (cosim.models.precision)."""
PRECISION_DTYPES = ("bf16", "fp8", "mxfp8")
"""Values of the precision what-if; ``bf16`` leaves the GEMMs as traced."""


@dataclass(frozen=True)
class ReplayConfig:
    """How to replay an execution graph. SI units (seconds) throughout."""

    durations: Literal["measured", "modeled"] = "measured"
    """GPU op durations: as measured in the trace, or predicted by kernel models."""
    collectives: Literal["measured", "simulated"] = "measured"
    """Communication kernels: measured durations (matched across ranks when every
    rank of the group is replayed), or flows on the topology's fabric."""
    launch_overhead: float | None = None
    """CPU seconds per kernel launch call; None keeps each call's measured duration."""
    launch_latency: float | None = None
    """Seconds from a launch call's start to the earliest start of its GPU op. None:
    estimated from the trace (1st percentile of launch-to-start, if at most
    ``max_trace_launch_latency``), else the topology CPU's ``launch_latency``."""
    max_trace_launch_latency: float = 50e-6
    """Trace-derived launch latencies above this are taken as CPU/GPU clock skew and ignored (s)."""
    kernel_gap: float | None = None
    """Device-side gap between the end of a GPU op and the start of the next one
    already queued on the same stream (s). None: the trace's median (if at most
    ``max_trace_kernel_gap``), else ``default_kernel_gap``."""
    max_trace_kernel_gap: float = 5e-6
    """Trace-derived kernel gaps above this are taken as something else (waits) and ignored (s)."""
    default_kernel_gap: float = 1e-6
    """Kernel gap when neither the config nor the trace gives one (s); ~1-2 us on V100-H100 traces."""
    sync_overhead: float | None = None
    """CPU seconds a synchronize call takes to return after both its start and its GPU
    work. None: from the trace, per call (its whole duration if its GPU work had ended
    before the call, else the time from that work's end to the call's return)."""
    default_sync_overhead: float = 3e-6
    """Sync cost where the trace cannot tell (no GPU work found for the call) (s)."""
    host_speed: float = 1.0
    """Host CPU speed factor: every host duration and gap is divided by it (2.0 = a 2x faster host)."""
    gpu_scale: Mapping[str, float] = field(default_factory=dict)
    """Per-class factors on GPU op durations, e.g. ``{"gemm": 0.5}`` (keys: :data:`OP_CLASSES` or "all")."""
    cuda_graphs: tuple[str, ...] = ()
    """Host annotations or op names (e.g. "## forward ##", "ProfilerStep*") whose
    contents are replayed as one CUDA-graph launch: their host work disappears
    and their kernels become ready one graph launch after the region starts."""
    graph_launch_overhead: float = 10e-6
    """CPU seconds of one cudaGraphLaunch (used by ``cuda_graphs``)."""
    profile: str | None = None
    """Kernel-model calibration profile for ``durations="modeled"``: a bundled name
    (``cosim.models.bundled_profiles()``) or a YAML file; None: the bundled profile of
    the target accelerator, else cross-GPU prediction from the H100 profile."""
    accelerator: str | None = None
    """Catalog id of the accelerator to replay on (what-if); None: as traced. Measured
    durations are scaled class by class by peak-FLOP/s and HBM-bandwidth ratios."""
    traced_accelerator: str | None = None
    """Catalog id of the accelerator the trace was captured on; None: guessed from the device name."""
    topology: str | None = None
    """Topology preset name or file; None: chosen from the traced GPU."""
    catalog_overrides: Mapping[str, str] = field(default_factory=dict)
    """Catalog overrides ``section.id.field -> value`` applied to the topology."""
    ranks_per_node: int | None = None
    """Ranks per host node when mapping trace ranks onto topology GPUs; None: topology GPU order."""
    record_timeline: bool = True
    """Keep per-op simulated times for the timeline and critical path."""
    copy_engines: int | None = None
    """Copy engines per GPU, shared by H2D and D2H copies: more concurrent host <-> device copies queue. None: the
    accelerator's ``copy_engines`` in the catalog (CUDA's asyncEngineCount) when it has one, else 2
    (cosim.engine.config.GpuConfig)."""
    comm_sms: int | None = None
    """SMs a communication kernel occupies while it runs (NCCL: one CTA per channel). None: as traced (the
    measured compute kernels already include the share they lost); a number: compute kernels run at
    ``(SMs - comm_sms) / SMs`` of their standalone speed while they overlap a communication kernel in the
    simulation (cosim.replay.interference; docs/ENGINE.md, "GPU: SM and HBM sharing")."""
    comm_share: bool = True
    """Synthesized training steps (standalone kernel durations; the graph's ``source["comm_share"]``, false in a
    serving step, whose synthesis charges the SMs itself): each communication kernel holds its own SMs (NCCL: one
    CTA per channel of the call, DeepEP 20, HybridEP its ``hybridep_sms``) and the compute kernels it overlaps in
    the simulation run on the SMs left (cosim.replay.interference; docs/MODELS.md). False (``--set
    gpu.comm_share=off``): no sharing unless ``comm_sms`` is set. Captured traces: no effect (their measured
    durations hold the sharing they had)."""
    precision: Mapping[str, str] = field(default_factory=dict)
    """Precision what-ifs (docs/MODELS.md): ``{"experts": "fp8"}`` runs the MoE expert GEMMs in FP8
    (``"mxfp8"``: MX block scales), ``{"gemm": "fp8"}`` every GEMM; quantize kernels are added and
    the dispatch payload shrinks. ``"bf16"`` (or absent): as traced."""

    def __post_init__(self) -> None:
        if self.durations not in ("measured", "modeled"):
            raise ValueError(f"durations must be 'measured' or 'modeled', got {self.durations!r}")
        if self.collectives not in ("measured", "simulated"):
            raise ValueError(f"collectives must be 'measured' or 'simulated', got {self.collectives!r}")
        for name in ("launch_overhead", "launch_latency", "kernel_gap", "sync_overhead"):
            v = getattr(self, name)
            if v is not None and (not math.isfinite(v) or v < 0):
                raise ValueError(f"{name} must be a finite time >= 0, got {v}")
        for name in ("default_sync_overhead", "graph_launch_overhead", "max_trace_launch_latency", "max_trace_kernel_gap",
                     "default_kernel_gap"):
            v = getattr(self, name)
            if not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite time >= 0, got {v}")
        if not (math.isfinite(self.host_speed) and self.host_speed > 0):
            raise ValueError(f"host_speed must be > 0, got {self.host_speed}")
        for k, v in self.gpu_scale.items():
            if k not in OP_CLASSES and k != "all":
                raise ValueError(f"gpu_scale: unknown class {k!r}; known: all, {', '.join(OP_CLASSES)}")
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"gpu_scale.{k} must be a factor >= 0, got {v}")
        if self.copy_engines is not None and self.copy_engines < 1:
            raise ValueError("copy_engines must be >= 1")
        if self.comm_sms is not None and self.comm_sms < 0:
            raise ValueError("comm_sms must be >= 0")
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ValueError("ranks_per_node must be >= 1")
        for k, v in self.precision.items():
            if k not in PRECISION_SCOPES:
                raise ValueError(f"precision: unknown key {k!r}; known: {', '.join(PRECISION_SCOPES)}")
            if v not in PRECISION_DTYPES:
                raise ValueError(f"precision.{k} must be one of {', '.join(PRECISION_DTYPES)}, got {v!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (for summary.json and sweep keys)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, Mapping):
                v = dict(sorted(v.items()))
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out


_TIME_KEYS = {
    "host.launch_overhead": "launch_overhead",
    "launch_overhead": "launch_overhead",
    "host.launch_latency": "launch_latency",
    "launch_latency": "launch_latency",
    "host.sync_overhead": "sync_overhead",
    "sync_overhead": "sync_overhead",
    "host.graph_launch_overhead": "graph_launch_overhead",
    "gpu.kernel_gap": "kernel_gap",
    "kernel_gap": "kernel_gap",
    "graph_launch_overhead": "graph_launch_overhead",
}
_FLOAT_KEYS = {"host.speed": "host_speed", "host_speed": "host_speed"}
_STR_KEYS = {
    "durations": "durations",
    "collectives": "collectives",
    "accelerator": "accelerator",
    "gpu.accelerator": "accelerator",
    "traced_accelerator": "traced_accelerator",
    "topology": "topology",
    "profile": "profile",
    "models.profile": "profile",
}


_INT_KEYS = {"gpu.copy_engines": "copy_engines", "copy_engines": "copy_engines", "gpu.comm_sms": "comm_sms",
             "comm_sms": "comm_sms"}


def _integer(key: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise CosimInputError(f"--set {key}={value}: expected a whole number") from None


def parse_sets(items: Sequence[str]) -> dict[str, str]:
    """``["a=1", "b.c=2 us"]`` -> ``{"a": "1", "b.c": "2 us"}`` (order kept; later wins)."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CosimInputError(f"--set {item!r}: expected KEY=VALUE, e.g. gpu.scale.gemm=0.5")
        out[key.strip()] = value.strip()
    return out


def _factor(key: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise CosimInputError(f"--set {key}={value}: expected a number") from None
    return v


def _scope_pair(part: str) -> tuple[str, str]:
    """``scope:dtype`` (or ``scope=dtype``) of a ``precision=`` list; a bare dtype has scope ``?``."""
    if re.search(r"[:=]", part):
        scope, dt = re.split(r"[:=]", part, maxsplit=1)
        return scope.strip(), dt.strip()
    return "?", part.strip()


# The replay knobs as the unknown-knob message names them, in that order, each with the concrete keys it stands for
# (the "did you mean" candidates): the one table both are built from. Aliases (``launch_overhead`` for
# ``host.launch_overhead``, ...) are the other keys of the parse tables above.
_KNOBS: tuple[tuple[str, tuple[str, ...]], ...] = (
    *((k, (k,)) for k in ("durations", "collectives", "topology", "accelerator", "profile", "host.launch_overhead",
                          "host.launch_latency", "host.sync_overhead", "host.speed")),
    ("gpu.scale.<class>", tuple(f"gpu.scale.{c}" for c in OP_CLASSES)),
    *((k, (k,)) for k in ("gpu.copy_engines", "gpu.comm_sms", "gpu.comm_share", "cuda_graphs", "ranks_per_node")),
    *((f"precision.{s}", (f"precision.{s}",)) for s in PRECISION_SCOPES),
)
_KNOWN_KNOBS = (", ".join(name for name, _ in _KNOBS)
                + ", or a catalog path <accelerators|cpus|nics|links>.<id>.<field> (e.g. links.nvlink4.bandwidth)")
# The keys `cosim run` (and sweeps) take besides the replay knobs above: cosim.scenario handles them before the rest
# reaches apply_sets, so a key that ends up here matched none of them either.
_RUN_FAMILIES = ("workload.synthetic.<field> (synthetic scenarios, e.g. workload.synthetic.layout.ep), nodes, "
                 "topology.<path> (e.g. topology.node.links.gpu-pcie.type), nics.<id>.port_bandwidth, "
                 "projection.<field> and replay.<field> (captured traces)")


def _knob_candidates() -> list[str]:
    """Every concrete key a ``--set`` may name (for the "did you mean" of an unknown one)."""
    keys = [*(k for _, ks in _KNOBS for k in ks), *_TIME_KEYS, *_FLOAT_KEYS, *_STR_KEYS, *_INT_KEYS, "nodes"]
    from cosim.workload.synth.layout import ParallelLayout
    from cosim.workload.synth.spec import BatchSpec, SyntheticSpec

    for prefix, model in (("workload.synthetic.", SyntheticSpec), ("workload.synthetic.layout.", ParallelLayout),
                          ("workload.synthetic.batch.", BatchSpec)):
        keys += [prefix + (f.alias or n) for n, f in model.model_fields.items()]
    try:
        from cosim.catalog import load_catalog

        cat = load_catalog()
        for section in CATALOG_SECTIONS:
            for ident, entry in (getattr(cat, section, None) or {}).items():
                fields_ = getattr(type(entry), "model_fields", None) or getattr(entry, "__dataclass_fields__", {})
                keys += [f"{section}.{ident}.{f}" for f in fields_]
    except Exception:  # a suggestion only: a catalog that does not load suggests nothing
        pass
    return keys


def unknown_knob_message(key: str) -> str:
    """The one-line error for a ``--set`` key nothing knows: the nearest known key, the replay knobs and the other
    key families a run takes."""
    import difflib

    close = difflib.get_close_matches(key, _knob_candidates(), n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"--set {key}: unknown knob{hint}; known: {_KNOWN_KNOBS}; cosim run also takes {_RUN_FAMILIES}"


def apply_sets(cfg: ReplayConfig, sets: Mapping[str, Any]) -> ReplayConfig:
    """Return ``cfg`` with ``--set`` style overrides applied.

    Keys: ``durations``, ``collectives``, ``topology``, ``accelerator``,
    ``host.launch_overhead`` / ``host.launch_latency`` / ``host.sync_overhead``
    (times with units), ``host.speed`` (factor), ``gpu.scale.<class>`` (factor),
    ``cuda_graphs`` (comma-separated region names, or ``off``),
    ``ranks_per_node``, ``gpu.comm_sms`` (SMs of every communication kernel), ``gpu.comm_share`` (on/off: the
    per-kernel SM law of synthesized steps), ``precision.experts`` / ``precision.gemm`` (``bf16``, ``fp8``, ``mxfp8``;
    ``precision=experts:fp8,gemm:bf16`` sets both), and catalog paths
    ``accelerators|cpus|nics|links.<id>.<field>``.
    """
    changes: dict[str, Any] = {}
    gpu_scale = dict(cfg.gpu_scale)
    precision = dict(cfg.precision)
    cat = dict(cfg.catalog_overrides)
    for key, raw in sets.items():
        value = str(raw).strip()
        try:
            if key in _TIME_KEYS:
                changes[_TIME_KEYS[key]] = None if value in ("auto", "trace", "measured") else units.parse_time(value, key)
            elif key in _FLOAT_KEYS:
                changes[_FLOAT_KEYS[key]] = _factor(key, value)
            elif key in _STR_KEYS:
                changes[_STR_KEYS[key]] = None if value in ("", "none", "traced") and key != "durations" else value
            elif key.startswith("gpu.scale."):
                gpu_scale[key[len("gpu.scale."):]] = _factor(key, value)
            elif key in ("cuda_graphs", "host.cuda_graphs"):
                changes["cuda_graphs"] = () if value in ("", "off", "none", "false") else tuple(
                    v.strip() for v in value.split(",") if v.strip())
            elif key in ("gpu.comm_share", "comm_share"):
                if value.lower() not in ("on", "off", "true", "false", "1", "0", "yes", "no"):
                    raise CosimInputError(f"--set {key}={value}: expected on or off")
                changes["comm_share"] = value.lower() in ("on", "true", "1", "yes")
            elif key == "ranks_per_node":
                changes["ranks_per_node"] = _integer(key, value)
            elif key in _INT_KEYS:
                changes[_INT_KEYS[key]] = None if value in ("auto", "traced", "catalog") else _integer(key, value)
            elif key.startswith("precision.") or key == "precision":
                if key != "precision":
                    items = [(key[len("precision."):], value)]
                elif value in ("", "off", "none", "bf16"):
                    precision.clear()
                    items = []
                else:
                    items = [_scope_pair(part) for part in value.split(",") if part.strip()]
                for scope, dt in items:
                    if scope not in PRECISION_SCOPES:
                        raise CosimInputError(f"--set {key}={value}: unknown precision scope {scope!r}; known: "
                                              f"{', '.join(PRECISION_SCOPES)} (e.g. precision.experts=fp8)")
                    if dt not in PRECISION_DTYPES:
                        raise CosimInputError(f"--set {key}={value}: expected one of {', '.join(PRECISION_DTYPES)}")
                    if dt == "bf16":
                        precision.pop(scope, None)
                    else:
                        precision[scope] = dt
            elif key.split(".", 1)[0] in CATALOG_SECTIONS:
                cat[key] = value
            else:
                raise CosimInputError(unknown_knob_message(key))
        except units.UnitError as exc:
            raise CosimInputError(f"--set {key}={value}: {exc}") from None
    try:
        return replace(cfg, gpu_scale=gpu_scale, catalog_overrides=cat, precision=precision, **changes)
    except ValueError as exc:
        raise CosimInputError(_checked_field_message(str(exc), sets)) from None


def _checked_field_message(message: str, sets: Mapping[str, Any]) -> str:
    """A :class:`ReplayConfig` check's ``message`` (``host_speed must be > 0, got -2.0``) as the ``--set`` that
    gave the field: ``--set host.speed=-2: must be > 0, got -2.0``."""
    fields = {**_TIME_KEYS, **_FLOAT_KEYS, **_STR_KEYS, **_INT_KEYS}
    for key, raw in sets.items():
        fld = fields.get(key) or (key.replace("gpu.scale.", "gpu_scale.", 1) if key.startswith("gpu.scale.") else key)
        if message.startswith(fld + " "):
            return f"--set {key}={raw}: {message[len(fld) + 1:]}"
    return f"--set: {message}"

