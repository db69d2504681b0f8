"""Scenarios: a workload, a topology and what-if overrides, in one YAML file.

A scenario binds a captured workload (a bundled workload name, or a trace file or
folder) to a topology (a preset or file) with replay knobs. CPU captures are
projected onto the topology's GPUs first (:mod:`cosim.workload.project`).

Example (``workloads/scenarios/moe-ep4-dgx-h100.yaml``)::

    name: moe-ep4-dgx-h100
    workload: moe-ep4-cpu
    topology: dgx-h100
    projection: {dtype: bf16, host_speed: 2.0, aten_overhead: 4 us}
    replay: {collectives: simulated}
    set: {gpu.scale.gemm: 0.5}       # optional what-if knobs, as with --set

A scenario's workload can also be synthesized from a model card and a parallel layout
(:mod:`cosim.workload.synth`, docs/SYNTHESIS.md), on a cluster preset scaled to ``nodes``::

    name: dsv3-1024
    workload:
      synthetic: {model: deepseek-v3, layout: {tp: 2, pp: 8, vpp: 4, ep: 64}, batch: {global: 8192, micro: 1, seq: 4096},
                  precision: fp8, routing: uniform}
    topology: dgx-h100
    nodes: 128
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, PrivateAttr, Tag, ValidationError, field_validator

from cosim.catalog.models import Strict, Time
from cosim.errors import CosimInputError
from cosim.resources import data_dirs, find_data
from cosim.workload.synth.spec import SyntheticSpec
from cosim.yamlio import describe_validation_error, input_error_at, load_yaml, loads_yaml, plain, validate

__all__ = ["DEFAULT_SCENARIO", "ProjectionSpec", "Scenario", "WorkloadCache", "apply_scenario_sets", "build_topology",
           "check_capture_knobs", "expand_port_bandwidth", "find_workload", "link_latest", "list_scenarios",
           "load_scenario", "resolve_path", "resolved_settings", "run_dir", "run_folder", "run_scenario", "settings_hash", "split_topology_sets"]

DEFAULT_SCENARIO = "qwen3-30b-ep8-dgx-h100"
MAX_NODES = 1024
"""Most host nodes ``nodes:`` scales a topology to."""


class ProjectionSpec(Strict):
    """How a CPU capture is projected onto GPUs (see cosim.workload.project)."""

    dtype: str = "bf16"
    """GPU datatype of floating-point tensors, or "captured"."""
    host_speed: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    """Capture-host time is divided by this (e.g. ranks / cores when ranks shared cores)."""
    aten_overhead: Time = 4e-6
    """Host dispatch time per kernel-launching ATen op besides the launch call (s)."""

    @field_validator("dtype")
    @classmethod
    def _known_dtype(cls, v: str) -> str:
        from cosim.workload.project import _DTYPE_BYTES

        if v != "captured" and v not in _DTYPE_BYTES:
            raise ValueError(f"expected 'captured' or one of {', '.join(_DTYPE_BYTES)}, got {v!r}")
        return v


class ReplaySpec(Strict):
    """Replay knobs of a scenario (the same names as ``--set``)."""

    durations: Literal["measured", "modeled"] = "measured"
    collectives: Literal["measured", "simulated"] = "measured"
    launch_overhead: Time | None = None
    launch_latency: Time | None = None
    kernel_gap: Time | None = None
    host_speed: float = Field(default=1.0, gt=0, allow_inf_nan=False)
    cuda_graphs: list[str] = Field(default_factory=list)
    accelerator: str | None = None
    ranks_per_node: int | None = Field(default=None, ge=1)
    profile: str | None = None
    """Kernel-model calibration profile for ``durations: modeled`` (a bundled name or a YAML file)."""
    precision: dict[Literal["experts", "gemm"], Literal["bf16", "fp8", "mxfp8"]] = Field(default_factory=dict)
    """Precision what-if, e.g. ``{experts: fp8}``: keys ``experts`` / ``gemm``, values ``bf16``, ``fp8``, ``mxfp8``."""


class SyntheticWorkload(Strict):
    """``workload: {synthetic: ...}``: a training step synthesized from a model card (docs/SYNTHESIS.md)."""

    synthetic: SyntheticSpec
    """Model card, parallel layout, batch, precision and routing."""


def _workload_kind(v: Any) -> str | None:
    """Which form a ``workload:`` value takes: a name / path (a string) or ``{synthetic: ...}`` (a mapping)."""
    if isinstance(v, str):
        return "tagged-union:name"
    if isinstance(v, (dict, SyntheticWorkload)):
        return "tagged-union:synthetic"
    return None


# The tags start with "tagged-union" so that an error's path leaves them out (yamlio._describe): a mistake inside
# ``workload: {synthetic: ...}`` is reported at its own key, not as "workload.str: Input should be a valid string".
WorkloadField = Annotated[
    Annotated[str, Tag("tagged-union:name")] | Annotated[SyntheticWorkload, Tag("tagged-union:synthetic")],
    Discriminator(_workload_kind, custom_error_type="workload_type",
                  custom_error_message="workload must be a workload name or path, or {synthetic: {...}}"),
]


class Scenario(Strict):
    """A workload on a topology, with what-if overrides."""

    name: str
    """Scenario name; ``cosim run`` writes to cosim-out/<name>/<short hash of the settings>/ (see :func:`run_dir`)."""
    description: str = ""
    workload: WorkloadField
    """Bundled workload name (workloads/<name>), a trace file / folder (relative to this file), or
    ``{synthetic: {...}}``."""
    topology: str = "dgx-h100"
    """Topology preset name or YAML file (relative to this file)."""
    nodes: int | None = Field(default=None, gt=0, le=MAX_NODES)
    """Scale the topology to this many host nodes: a host-node preset (dgx-h100, hgx-h200, ...) becomes
    a rail-optimized non-blocking cluster of them; a cluster preset with a generated fabric gets this
    node count; an NVL72 rack preset (gb200-nvl72, gb300-nvl72) this many 4-GPU compute trays, 18 per
    NVLink rack (:func:`scaled_document`). None: the topology as it is."""
    projection: ProjectionSpec = Field(default_factory=ProjectionSpec)
    replay: ReplaySpec = Field(default_factory=ReplaySpec)
    set: dict[str, Any] = Field(default_factory=dict)
    """What-if knobs as with --set (e.g. gpu.scale.gemm: 0.5, links.nvlink4.bandwidth: 900 GB/s)."""
    source_file: str | None = None
    _applied: frozenset[str] = PrivateAttr(default=frozenset())
    """The ``--set`` keys :func:`apply_scenario_sets` applied since the scenario was read from ``source_file``: the
    file no longer says what these fields hold (:func:`at_scenario_line` does not blame its lines for them)."""

    @field_validator("set", mode="before")
    @classmethod
    def _stringify(cls, v: Any) -> Any:
        return {str(k): str(x) for k, x in v.items()} if isinstance(v, dict) else v


def list_scenarios() -> list[str]:
    """Names of the scenarios found by name: ``./workloads/scenarios`` (when it exists) and the installed ones."""
    return sorted({p.stem for d in data_dirs("workloads") for p in (d / "scenarios").glob("*.yaml")})


def find_workload(name: str) -> Path | None:
    """A workload given by name: ``./workloads/<name>`` when it exists, else the installed one; None if neither."""
    return find_data("workloads", name)


def resolve_path(name: str, base: Path | None) -> Path | None:
    """``name`` relative to ``base`` (a scenario's folder) if it exists there, else as given, else None."""
    p = Path(name)
    if base is not None and not p.is_absolute() and (base / p).exists():
        return base / p
    return p if p.exists() else None


def load_scenario(name_or_path: str | Path | None = None) -> Scenario:
    """Load a scenario YAML file, or a scenario by name: ``./workloads/scenarios/<name>.yaml`` when it exists,
    else the installed one."""
    name_or_path = name_or_path or DEFAULT_SCENARIO
    p = Path(name_or_path)
    if not p.is_file():
        cand = find_data("workloads", f"scenarios/{name_or_path}.yaml")
        if cand is None:
            import difflib

            known = list_scenarios()
            close = difflib.get_close_matches(str(name_or_path), known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise CosimInputError(f"unknown scenario {str(name_or_path)!r}{hint} (bundled: {', '.join(known)})")
        p = cand
    data = load_yaml(p)
    if not isinstance(data, dict):
        raise CosimInputError("a scenario file must be a mapping", file=p)
    scn = validate(Scenario, data, file=p)
    scn = scn.model_copy(update={"source_file": str(p)})
    key = (str(p.resolve()), p.stat().st_mtime_ns, p.stat().st_size)
    if key not in _CHECKED:  # a sweep loads its base scenario once per point: check the file once
        _check_scenario(scn, data, p)
        _CHECKED.add(key)
    return scn


_CHECKED: set[tuple[str, int, int]] = set()


def _check_scenario(scn: Scenario, data: Any, path: Path) -> None:
    """Check a scenario file's ``topology:`` and each ``set:`` knob on their own, so that a bad one is
    reported at its line in the file (not later, as if it had been a ``--set`` flag)."""
    from cosim.replay import ReplayConfig, apply_sets
    from cosim.topology import find_topology

    base = path.parent
    try:
        find_topology(resolve_path(scn.topology, base) or scn.topology)
    except CosimInputError as exc:
        raise input_error_at(data, ["topology"], exc.message, file=path) from None
    if isinstance(scn.workload, SyntheticWorkload):
        from cosim.workload.synth.spec import _card

        try:
            _card(scn.workload.synthetic.model, base)
        except CosimInputError as exc:
            if exc.location.file:  # a card file of its own, with its own line
                raise
            raise input_error_at(data, ["workload", "synthetic", "model"], exc.message, file=path) from None
        _check_own_capture_knobs(scn, data, path)
    sets = data.get("set") or {}
    for key in scn.set:
        value = scn.set[key]
        try:
            if key.startswith(TOPOLOGY_KNOB):
                build_topology(scn.topology, base, None, {key: value})
            else:
                cfg = apply_sets(ReplayConfig(), expand_port_bandwidth({key: value}))
                if cfg.catalog_overrides:
                    from cosim.catalog import load_catalog

                    load_catalog().with_overrides(dict(cfg.catalog_overrides))
        except CosimInputError as exc:
            message = re.sub(r"^--set [^:]*: ", "", exc.message)
            loc = ["set", key] if key in sets else ["set"]
            raise input_error_at(data, loc, message, file=path) from None


def _check_own_capture_knobs(scn: Scenario, data: Any, path: Path) -> None:
    """:func:`check_capture_knobs` of a synthetic scenario file's own knobs, at their line: its ``set:`` keys and the
    ``replay:`` fields ``durations`` (other than measured), ``profile`` and ``cuda_graphs`` that it gives (the
    same knobs as ``--set``, which the run would ignore as it ignores the flags)."""
    r = scn.replay
    given = {"durations": r.durations != "measured", "profile": r.profile is not None,
             "cuda_graphs": bool(r.cuda_graphs)}
    for loc in [["set", k] for k in scn.set] + [["replay", k] for k, v in given.items() if v]:
        try:
            check_capture_knobs(scn, [".".join(loc) if loc[0] == "replay" else loc[1]])
        except CosimInputError as exc:
            message = re.sub(r"^--set [^:]*: ", "", exc.message)
            raise input_error_at(data, loc if loc[1] in (data.get(loc[0]) or {}) else [loc[0]], message,
                                 file=path) from None


def check_capture_knobs(scn: Scenario, keys: Iterable[str]) -> None:
    """Refuse ``projection.*``, ``cuda_graphs``, ``durations`` and ``profile`` knobs on a synthetic workload: they
    set how a CPU capture is projected onto a GPU, which of its regions replay as CUDA graphs and whether its
    measured kernel times are re-predicted (with which profile), none of which a synthesized step has (its kernel
    times come from the models already, with ``workload.synthetic.profile``), so the run would silently be the
    baseline. A ``workload`` among ``keys`` replaces the workload, and then they apply."""
    keys = list(keys)
    if "workload" in keys or not isinstance(scn.workload, SyntheticWorkload):
        return
    for key in keys:
        if key in ("cuda_graphs", "host.cuda_graphs", "replay.cuda_graphs"):
            raise CosimInputError(f"--set {key}: names regions of a captured trace to replay as CUDA graphs; this "
                                  "scenario's workload is synthetic: set workload.synthetic.layout.cuda_graphs=true "
                                  "(docs/SYNTHESIS.md)", file=scn.source_file)
        if key in ("durations", "profile", "models.profile", "replay.durations", "replay.profile"):
            raise CosimInputError(f"--set {key}: re-predicts a captured trace's measured kernel times; this "
                                  "scenario's workload is synthetic, its kernel times come from the kernel models: "
                                  "set workload.synthetic.profile to calibrate them (docs/SYNTHESIS.md)",
                                  file=scn.source_file)
        if key.startswith("projection."):
            raise CosimInputError(f"--set {key}: projection.* knobs project a captured CPU trace; this scenario's "
                                  "workload is synthetic: set workload.synthetic.precision (bf16, fp8, mxfp8) "
                                  "or another workload.synthetic.* field (docs/SYNTHESIS.md)",
                                  file=scn.source_file)


def apply_scenario_sets(scn: Scenario, sets: dict[str, str]) -> tuple[Scenario, dict[str, str]]:
    """Apply scenario-level keys (workload, topology, projection.*); return the rest for the replay.

    ``replay.<field>`` is the scenario file's own spelling of the replay knob ``<field>``. Knobs that only act on a
    captured trace are refused on a synthetic workload (:func:`check_capture_knobs`)."""
    check_capture_knobs(scn, sets)
    rest: dict[str, str] = {}
    upd: dict[str, Any] = {}
    proj = scn.projection.model_dump()
    synth: dict[str, Any] | None = None
    for k, v in sets.items():
        if k.startswith("workload.synthetic."):
            if not isinstance(scn.workload, SyntheticWorkload):
                raise CosimInputError(f"--set {k}: the scenario's workload is not synthetic")
            if synth is None:
                synth = scn.workload.synthetic.model_dump(by_alias=True, exclude_unset=True)
            _set_path(synth, k.split(".")[2:], v, k)
        elif k == "nodes":
            try:
                upd["nodes"] = None if v in ("", "none", "null") else int(v)
            except ValueError:
                raise CosimInputError(f"--set nodes={v}: expected a node count") from None
            if upd["nodes"] is not None and not 0 < upd["nodes"] <= MAX_NODES:
                raise CosimInputError(f"--set nodes={v}: expected 1..{MAX_NODES}")
        elif k.startswith("replay."):
            field = k.split(".", 1)[1]
            if field not in ReplaySpec.model_fields:
                raise CosimInputError(f"--set {k}: unknown replay field; known: {', '.join(ReplaySpec.model_fields)}")
            rest[field] = v
        elif k in ("workload", "name", "description"):
            upd[k] = v
        elif k == "topology":
            upd["topology"] = v
        elif k.startswith("projection."):
            field = k.split(".", 1)[1]
            if field not in proj:
                raise CosimInputError(f"--set {k}: unknown projection field; known: {', '.join(proj)}")
            proj[field] = v
        else:
            rest[k] = v
    if synth is not None:
        try:
            upd["workload"] = SyntheticWorkload(synthetic=SyntheticSpec.model_validate(synth))
        except ValidationError as exc:  # pydantic: name the first bad field (and the valid keys)
            where, msg = describe_validation_error(SyntheticSpec, exc)
            raise CosimInputError(f"--set workload.synthetic.{where}: {msg}") from None
    if upd.get("topology"):
        rest["topology"] = upd["topology"]
    try:
        proj_model = validate(ProjectionSpec, {k: (f"{v} s" if k == "aten_overhead" and isinstance(v, float) else v)
                                                for k, v in proj.items()})
    except CosimInputError as exc:  # the file's projection passed at load: the value came from --set
        key = f"projection.{exc.location.path}" if exc.location.path else "projection"
        raise CosimInputError(f"--set {key}={sets[key]}: {exc.message}" if key in sets
                              else f"--set {key}: {exc.message}") from None
    out = scn.model_copy(update={**upd, "projection": proj_model})
    out._applied = scn._applied | frozenset(sets)
    return out, rest


def _set_path(doc: dict[str, Any], path: list[str], value: str, key: str) -> None:
    """Set ``doc[path[0]][path[1]]... = value`` (a ``--set`` string read as a YAML scalar or flow value)."""
    try:
        parsed = loads_yaml(value) if value.strip() else value
    except CosimInputError as exc:
        if value.lstrip()[:1] in ("{", "["):  # meant as a YAML mapping or list, not a string
            raise CosimInputError(f"--set {key}: {exc.message}") from None
        parsed = value
    if isinstance(parsed, dict):
        parsed = dict(parsed)
    cur = doc
    for seg in path[:-1]:
        nxt = cur.get(seg)
        if nxt is None:
            nxt = cur[seg] = {}
        elif not isinstance(nxt, dict):
            raise CosimInputError(f"--set {key}: {seg} is not a mapping")
        cur = nxt
    if not path:
        raise CosimInputError(f"--set {key}: name a field of workload.synthetic")
    cur[path[-1]] = parsed


TOPOLOGY_KNOB = "topology."
"""Prefix of the knob family that sets a field of the topology document (as a topology file's ``set:`` does)."""
_PORT_BW = re.compile(r"^nics\.([^.]+)\.port_bandwidth$")


def split_topology_sets(sets: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split ``sets`` into (``topology.<path>`` knobs, the rest), order kept."""
    topo = {k: v for k, v in sets.items() if k.startswith(TOPOLOGY_KNOB)}
    return topo, {k: v for k, v in sets.items() if not k.startswith(TOPOLOGY_KNOB)}


def _scalar(value: Any) -> Any:
    """A ``--set`` string as the YAML scalar a topology file would hold: int, float, bool or string."""
    if not isinstance(value, str):
        return value
    v = value.strip()
    if v in ("true", "false"):
        return v == "true"
    for conv in (int, float):
        try:
            return conv(v)
        except ValueError:
            pass
    return v


def expand_port_bandwidth(sets: dict[str, str], catalog: Any = None) -> dict[str, str]:
    """Expand the knob ``nics.<id>.port_bandwidth=V`` into ``nics.<id>.bandwidth=V`` and
    ``links.<port link type>.bandwidth=V``.

    A NIC port runs at the slower of the adapter and its cable's link type
    (``cosim.topology.build``), so raising either alone does nothing once it
    is above the other; this knob moves both. The link type is the NIC's
    ``link`` (or a ``nics.<id>.link`` set in the same ``sets``), so every link
    of that type (fabric switch links too) moves with it. ``catalog`` (default:
    the bundled catalog) resolves the NIC id.
    """
    if not any(_PORT_BW.match(k) for k in sets):
        return dict(sets)
    if catalog is None:
        from cosim.catalog import load_catalog

        catalog = load_catalog()
    out: dict[str, str] = {}
    for k, v in sets.items():
        m = _PORT_BW.match(k)
        if not m:
            out[k] = v
            continue
        nid = m.group(1)
        if nid not in catalog.nics:
            raise CosimInputError(f"--set {k}: unknown NIC {nid!r}; known: {', '.join(sorted(catalog.nics))}")
        link = sets.get(f"nics.{nid}.link") or catalog.nics[nid].link
        for kk in (f"nics.{nid}.bandwidth", f"links.{link}.bandwidth"):
            out.pop(kk, None)
            out[kk] = v
    return out


RAIL_FABRIC: dict[str, Any] = {"topology": "rail-optimized", "switch_radix": 64, "oversubscription": 1}
"""The scale-out fabric ``nodes:`` gives a scaled host node or NVL72 rack that has none: the DGX SuperPOD
compute fabric (rail-optimized, non-blocking, 64-port switches)."""


def scaled_racks(data: dict[str, Any], nodes: int, trays_per_rack: int | None = None,
                 where: str = "topology") -> dict[str, Any]:
    """An NVLink-rack cluster document (``data``, plain dicts: gb200-nvl72, gb300-nvl72 and their -4rack
    presets) scaled to ``nodes`` host nodes (compute trays).

    The rack size R is the file's trays per NVLink switch (``nodes`` / the nvswitch device's ``count``:
    18 for NVL72). Up to R trays stay one rack (one NVLink domain); beyond, trays fill racks of
    ``trays_per_rack`` (default R; tray n in rack n // trays_per_rack), each rack its own NVLink switch, and
    the racks are joined by the file's ``fabric:`` (or, when it has none, :data:`RAIL_FABRIC`). Every
    cluster link must be a per-tray ``repeat: {n: ..}`` from ``node{n}.*`` to the switch; anything else
    is a hand-written cluster and raises :class:`CosimInputError`. The e2e runner
    (validation/e2e/run.py ``_gb200``) cuts its GB200/GB300 rows with this function."""
    pre = f"nodes: {nodes}: {where}"
    if not 0 < nodes <= MAX_NODES:
        raise CosimInputError(f"{pre}: expected 1..{MAX_NODES} nodes (compute trays)")
    sws = [d for d in data.get("devices") or [] if isinstance(d, dict) and d.get("kind") == "nvswitch"]
    links = data.get("links") or []
    m = re.fullmatch(r"(.*?)(\{i\}|0)", str(sws[0].get("id", ""))) if len(sws) == 1 else None
    if m is None or not links or not all(
            isinstance(li, dict) and isinstance(li.get("repeat"), dict) and "n" in li["repeat"]
            and any(str(b).startswith(m.group(1)) for b in li.get("between", [])) for li in links):
        raise CosimInputError(f"{pre} has hand-written cluster links and cannot be scaled; use a host-node preset "
                              "(dgx-h100, hgx-h200, ...), an NVL72 rack preset, or a cluster with a fabric:")
    prefix = m.group(1)
    rack = int(data.get("nodes") or 1) // int(sws[0].get("count", 1))
    per = trays_per_rack or rack
    if not 0 < per <= rack:
        raise CosimInputError(f"{pre}: trays per rack must be 1..{rack}, got {per}")
    out = dict(data)
    racks = 1 if nodes <= rack else -(-nodes // per)
    per = rack if racks == 1 else per
    sw = dict(sws[0])
    if "count" in sw or racks > 1:
        sw.update(id=f"{prefix}{{i}}", count=racks)
        target = f"{prefix}{{n//{per}}}"
    else:
        target = f"{prefix}0"
    out["devices"] = [sw if d is sws[0] else d for d in data["devices"]]
    out["links"] = [{**li, "repeat": {**li["repeat"], "n": nodes},
                     "between": [target if str(b).startswith(prefix) else b for b in li["between"]]} for li in links]
    out["nodes"] = nodes
    if racks > 1 and not out.get("fabric"):
        out["fabric"] = dict(RAIL_FABRIC)
    return out


def scaled_document(fpath: Path, nodes: int) -> Any:
    """The topology document of ``fpath`` scaled to ``nodes`` host nodes.

    A host-node file (``devices:``/``links:``, e.g. dgx-h100) becomes a cluster of ``nodes`` of
    it on a rail-optimized, non-blocking fat tree of 64-port switches (the DGX SuperPOD compute
    fabric; the NIC of each GPU on its own rail); a cluster file with a generated ``fabric:`` gets
    ``nodes`` as its node count; an NVLink-rack cluster (gb200-nvl72, gb300-nvl72 and their -4rack
    presets: a node is one 4-GPU compute tray) is cut or grown to ``nodes`` trays, 18 per NVLink rack,
    racks joined by the preset's scale-out fabric (:func:`scaled_racks`). Other clusters with
    hand-written links cannot be scaled."""
    import yaml

    from cosim.topology.loader import read_document

    if not 0 < nodes <= MAX_NODES:
        raise CosimInputError(f"nodes: {nodes}: expected 1..{MAX_NODES}")
    data = read_document(fpath)
    name = data.get("name") or fpath.stem
    if data.get("node") is None:
        return loads_yaml(f"name: {name}-x{nodes}\ndescription: \"{nodes} x {name} on a rail-optimized non-blocking "
                          f"fabric (scaled by nodes:)\"\nnode: \"{fpath.resolve()}\"\nnodes: {nodes}\n"
                          f"fabric: {json.dumps(RAIL_FABRIC)}\n", file=fpath)
    if data.get("links") or data.get("fabric") is None:  # an NVLink-rack cluster, or one scaled_racks refuses
        out = scaled_racks(plain(data), nodes, where=f"topology {fpath.name}")
        out["name"] = f"{name}-x{nodes}"
        return loads_yaml(yaml.safe_dump(out, sort_keys=False), file=fpath)
    out = dict(data)
    out["nodes"] = nodes
    out["name"] = f"{name}-x{nodes}"
    doc = type(data)(out)
    for attr in ("mark", "key_marks", "file"):
        setattr(doc, attr, getattr(data, attr, None) if attr != "key_marks" else dict(data.key_marks))
    return doc


def build_topology(ref: str, base: Path | None, overrides: dict[str, Any] | None = None,
                   topology_sets: dict[str, Any] | None = None, nodes: int | None = None) -> Any:
    """Load topology ``ref`` (a preset, or a file relative to ``base``) with catalog ``overrides``,
    ``topology.<path>`` knobs, and scaled to ``nodes`` host nodes (:func:`scaled_document`).

    The knobs are appended to the topology document's own ``set:`` block and applied by the topology
    loader's set machinery (:func:`cosim.topology.loader.with_sets`), exactly as if the file had them.
    """
    from cosim.topology import Topology, find_topology, load_topology

    path = resolve_path(ref, base) or ref
    if not topology_sets and not nodes:
        return load_topology(path, overrides=overrides or None)
    from cosim.topology.build import build_from_document
    from cosim.topology.loader import read_document, with_sets

    fpath = find_topology(path)
    doc = scaled_document(fpath, nodes) if nodes else read_document(fpath)
    data = with_sets(doc, {k: _scalar(v) for k, v in (topology_sets or {}).items()})
    if nodes and doc.get("node") is not None and read_document(fpath).get("node") is None:
        fpath = fpath.with_name(f"{fpath.stem}-x{nodes}.yaml")  # generated: a cluster of the file's node
    try:
        return Topology(build_from_document(data, fpath, overrides or None), source_file=fpath)
    except CosimInputError as exc:
        where = exc.location.path or ""
        for k, v in (topology_sets or {}).items():
            if where == f"set.{k}" or where.startswith(f"set.{k}.") or where.startswith(f"set[{k}]"):
                raise CosimInputError(f"--set {k}={v}: {exc.message}") from None
        raise


class WorkloadCache:
    """Loaded and projected workloads of one process, for runs that share them (sweeps).

    Keys are the workload files' identity (path, size, mtime) and, for projected
    graphs, the accelerator, CPU and projection settings. Replay only reads an
    execution graph, so sharing one gives the same figures as loading it again.
    """

    def __init__(self, size: int = 4) -> None:
        from collections import OrderedDict

        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()

    @staticmethod
    def file_key(path: Path) -> tuple[Any, ...]:
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        return tuple((str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files)

    def get(self, key: Any, make: Any) -> Any:
        """The value cached under ``key``, else ``make()`` (remembered, least recently used dropped)."""
        if key in self._items:
            self._items.move_to_end(key)
            return self._items[key]
        value = make()
        self._items[key] = value
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return value


_SYNTH_FIELD = re.compile(r"(workload\.synthetic(?:\.[A-Za-z_]\w*)+): (.+)", re.S)


def _synthesis_set(key: str) -> bool:
    """Whether ``--set key`` changes an input of the synthetic step's checks: a workload field, the nodes or the
    topology (the GPUs). Checks cross fields (``batch.global`` against dp, ``layout.tp`` against the GPUs, ep against
    the experts and nodes), so after such a set a field's check can fail where the file's value is fine."""
    return key in ("nodes", "topology", "workload") or key.startswith(("workload.", "topology."))


def at_scenario_line(exc: CosimInputError, source: str | None, set_keys: Iterable[str]) -> CosimInputError:
    """``exc``, a synthesis error that names a ``workload.synthetic.<field>`` but no file (a layout that does not
    divide the GPUs, experts that ep does not divide), pointed at that field's line in the scenario file ``source``;
    unchanged when it names a file already, has no field, or when one of ``set_keys`` (the ``--set`` keys applied)
    changed an input of the checks
    (:func:`_synthesis_set`: ``--set workload.synthetic.layout.pp=7`` makes ``tp*cp*pp`` fail on ``layout.tp``,
    ``--set nodes=129`` makes the file's ``tp: 2`` fail on 1032 GPUs, ``--set workload.synthetic.layout.tp=1``
    the file's ``batch.global`` on twice the dp: the file's line is not the problem)."""
    m = _SYNTH_FIELD.fullmatch(exc.message)
    if m is None or exc.location.file or not source or any(_synthesis_set(k) for k in set_keys):
        return exc
    key = m.group(1)
    try:
        data = load_yaml(source)
    except CosimInputError:
        return exc
    return input_error_at(data, key.split("."), m.group(2), file=source)


def scenario_hardware(scn: Scenario, sets: dict[str, str] | None = None) -> tuple[Scenario, Any, Any, Path | None,
                                                                                dict[str, str]]:
    """What scenario ``scn`` runs on with ``--set`` overrides ``sets``: (the scenario with them applied and its
    topology knobs recorded in its ``set``, its replay config, its topology with the catalog overrides and topology
    knobs applied, its folder, the topology knobs)."""
    from cosim.replay import ReplayConfig, apply_sets

    scn, rest = apply_scenario_sets(scn, dict(sets or {}))
    base = Path(scn.source_file).parent if scn.source_file else None
    r = scn.replay

    def near(v: str | None) -> str | None:  # a profile file named by the scenario lies beside it
        return str(resolve_path(v, base) or v) if v else v

    try:
        cfg = ReplayConfig(durations=r.durations, collectives=r.collectives, launch_overhead=r.launch_overhead,
                           launch_latency=r.launch_latency, kernel_gap=r.kernel_gap, host_speed=r.host_speed,
                           cuda_graphs=tuple(r.cuda_graphs), accelerator=r.accelerator,
                           ranks_per_node=r.ranks_per_node, profile=near(r.profile),
                           precision={str(k): str(v) for k, v in r.precision.items()},
                           topology=scn.topology)
    except ValueError as exc:  # a check of ReplayConfig's own that the scenario schema does not repeat
        raise CosimInputError(str(exc), file=scn.source_file, path="replay") from None
    own = {k: ((near(v) or v) if k.rsplit(".", 1)[-1] == "profile" else v) for k, v in scn.set.items()}
    tsets, other = split_topology_sets({**own, **rest})
    cfg = apply_sets(cfg, expand_port_bandwidth(other))
    topo = build_topology(cfg.topology or scn.topology, base, dict(cfg.catalog_overrides), tsets, scn.nodes)
    if tsets:  # recorded in the resolved scenario (scenario.yaml), so that the run's hardware can be rebuilt
        scn = scn.model_copy(update={"set": {**scn.set, **tsets}})
    return scn, cfg, topo, base, tsets


def run_scenario(scn: Scenario, sets: dict[str, str] | None = None, cache: WorkloadCache | None = None):
    """Replay scenario ``scn`` (with ``--set`` overrides); returns (resolved scenario, ReplayResult).

    ``cache`` reuses workloads loaded (and projected) by earlier runs in this process.
    """
    from cosim.models.roofline import RooflineModel
    from cosim.replay import replay
    from cosim.workload import load_trace
    from cosim.workload.project import ProjectionConfig, needs_projection, project_onto

    scn, cfg, topo, base, tsets = scenario_hardware(scn, sets)
    if isinstance(scn.workload, SyntheticWorkload):
        try:
            return scn, _run_synthetic(scn, topo, cfg, base)
        except CosimInputError as exc:
            raise at_scenario_line(exc, scn.source_file, scn._applied) from None
    wpath = resolve_path(scn.workload, base)
    if wpath is None:
        wpath = find_workload(scn.workload)
        if wpath is None:
            raise CosimInputError(f"workload {scn.workload!r} not found (not a bundled workload or a path)",
                                  file=scn.source_file)
    cache = cache or WorkloadCache(size=1)
    wkey = WorkloadCache.file_key(wpath)
    graph = cache.get(("trace", wkey), lambda: load_trace(wpath))
    projected = needs_projection(graph)
    if projected:
        p = scn.projection
        try:
            pcfg = ProjectionConfig(dtype=p.dtype, host_speed=p.host_speed, aten_overhead=p.aten_overhead)
        except ValueError as exc:  # a check of ProjectionConfig's own that the scenario schema does not repeat
            raise CosimInputError(str(exc), file=scn.source_file, path="projection") from None
        src = graph
        graph = cache.get(("projected", wkey, topo.name, repr(sorted(cfg.catalog_overrides.items())),
                           repr(sorted(tsets.items())), cfg.accelerator, repr(pcfg)),
                          lambda: project_onto(src, topo, cfg.accelerator, pcfg, kernel_model=RooflineModel))
        from dataclasses import replace

        cfg = replace(cfg, accelerator=None)
    from dataclasses import replace as _replace

    try:
        # ``topo`` already has the catalog overrides (and topology knobs); given them again, replay would
        # rebuild the topology from its file without the knobs. The result records them all the same.
        result = replay(graph, topo, _replace(cfg, catalog_overrides={}))
    except ValueError as exc:
        raise CosimInputError(str(exc), file=scn.source_file) from None
    result.config = _replace(result.config, catalog_overrides=dict(cfg.catalog_overrides))
    result.sources = [str(wpath)]
    if projected:
        result.notes.insert(0, f"CPU capture: its ATen ops were projected onto {topo.accelerator(topo.gpus[0]).name} "
                               f"kernels with {scn.projection.dtype} roofline durations (docs/CAPTURE.md); "
                               "'measured' durations are those projected ones")
    return scn, result


OUT_ROOT = Path("cosim-out")
"""Where ``cosim run`` writes when not given ``--out``."""
LATEST = "latest"
"""Name of the link (or, where links cannot be made, the text file) to a scenario's last run folder."""
BASELINE = "baseline"
"""Name of the link to a scenario's last run without ``--set`` what-ifs: later what-ifs are compared with it."""
_HASH_LEN = 10
_NOT_SETTINGS = ("record_timeline",)  # output options of the replay config, not settings of the simulated run


def resolved_settings(scn: Scenario, result: Any) -> dict[str, Any]:
    """What ``scenario.yaml`` holds: the resolved scenario (what-ifs applied) and the replay config it ran with."""
    resolved = scn.model_dump(mode="json")
    resolved["replay_config"] = result.config.to_dict()
    return resolved


def settings_hash(resolved: dict[str, Any]) -> str:
    """Short content hash (10 hex digits) of resolved settings (:func:`resolved_settings`): equal settings, equal
    hash, whatever order or spelling the ``--set`` flags had; the scenario file is keyed by its absolute path."""
    import hashlib
    import json

    d = dict(resolved)
    if d.get("source_file"):
        d["source_file"] = str(Path(d["source_file"]).resolve())
    d["replay_config"] = {k: v for k, v in (d.get("replay_config") or {}).items() if k not in _NOT_SETTINGS}
    blob = json.dumps(d, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:_HASH_LEN]


def run_dir(resolved: dict[str, Any], root: str | Path = OUT_ROOT) -> Path:
    """The output folder of a run: ``<root>/<scenario name>/<settings_hash>``, so that runs with other settings
    (a what-if after its baseline) never overwrite each other, and a rerun of the same settings reuses its folder."""
    return Path(root) / str(resolved["name"]) / settings_hash(resolved)


def link_latest(folder: Path, name: str = LATEST) -> Path:
    """Point ``<folder's parent>/<name>`` (default ``latest``) at ``folder``: a relative symlink, replaced
    atomically; where symlinks cannot be made, a text file holding the folder's name. Returns the link's path."""
    import os

    from cosim.fileio import write_text

    latest = folder.parent / name
    tmp = folder.parent / f".{name}.{os.getpid()}.tmp"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(folder.name, tmp, target_is_directory=True)
        os.replace(tmp, latest)
    except OSError:
        tmp.unlink(missing_ok=True)
        if latest.is_symlink():
            latest.unlink()
        write_text(latest, folder.name + "\n")
    return latest


def run_folder(path: str | Path) -> Path:
    """A folder written by ``cosim run`` from ``path``: the run that ``path/latest`` (a link, or a text file holding
    a folder name) points at when there is one, so ``cosim-out/<scenario>`` means its last run (also where an older
    cosim left a run's files in that folder itself); else ``path`` itself."""
    p = Path(path)
    latest = p / LATEST
    if latest.is_file() and not latest.is_symlink():
        try:
            return p / latest.read_text().strip()
        except OSError:
            return p
    return latest if latest.is_dir() else p


def _run_synthetic(scn: Scenario, topo: Any, cfg: Any, base: Path | None) -> Any:
    """Synthesize the scenario's training step on ``topo`` and replay it (collectives on the fabric);
    the summary gains the figures of :func:`cosim.workload.synth.synthetic_figures`."""
    from dataclasses import replace as _replace

    from cosim.replay.periodic import PeriodicResult
    from cosim.replay.periodic import bubble_fraction as periodic_bubble
    from cosim.workload.synth import synthetic_figures

    assert isinstance(scn.workload, SyntheticWorkload)
    if cfg.precision:
        raise CosimInputError("precision.* what-ifs rewrite captured graphs; for a synthetic workload set "
                              "workload.synthetic.precision (bf16, fp8, mxfp8)", file=scn.source_file)
    run_cfg = _replace(cfg, collectives="simulated", durations="measured", catalog_overrides={})
    coalesced = _run_coalesced(scn, topo, run_cfg, base)
    co_notes: list[str] = coalesced[2] if coalesced is not None else []
    if coalesced is not None and coalesced[1] is not None:
        syn, result = coalesced[0], coalesced[1]
    else:
        syn, result = _synthesize_replay(scn.workload.synthetic, topo, base, run_cfg, scn.source_file)
    notes = list(syn.built.notes) + co_notes
    if cfg.collectives != "simulated":
        notes.append("synthetic workloads have no measured collectives: collectives simulated on the fabric")
    result.config = _replace(result.config, catalog_overrides=dict(cfg.catalog_overrides))
    result.sources = [scn.source_file or scn.name]
    figs = synthetic_figures(syn, result)
    if isinstance(result, PeriodicResult) and result.periodic is not None:
        figs["bubble_fraction"] = periodic_bubble(syn.built.unit_spans, result.runs, result.periodic)
    s = syn.spec
    if syn.infer is not None:
        st, mem = syn.infer
        unit = "requests" if st.mode == "decode" else "tokens"
        result.notes[:0] = [f"synthetic {syn.card.name} {st.mode} step ({s.precision}, overlap {st.overlap}, dispatch "
                            f"{st.dispatch}) on {syn.rm.world} GPUs: tp {syn.rm.tp} ep {syn.rm.ep} dp {syn.rm.dp}; "
                            "kernel durations from the kernel models (docs/SYNTHESIS.md)", *notes,
                            f"{figs['tokens_per_s_per_gpu'] or 0:.0f} tokens/s/GPU, step {1e3 * (figs['step_time_s'] or 0):.2f}"
                            f" ms, MoE layer {1e6 * (figs['layer_time_s'] or 0):.0f} us, KV cache "
                            f"{mem.kv_cache / 2**30:.1f} GiB per GPU, memory {mem.total / 2**30:.1f} GiB, at most "
                            f"{mem.max_batch} {unit} per GPU fit" + (" - OUT OF MEMORY (allow_oom)" if syn.oom else "")]
    else:
        _training_notes(result, syn, figs, notes)
    summary = result.summary()
    summary.update(figs)
    result._summary = summary
    return result


def _probe_spec(spec: Any, topo: Any, base: Path | None) -> tuple[Any, int, int, int] | None:
    """The probe of a coalescible training step: (spec with the probe's global batch, micro-batches per pipeline
    of the step, of the probe, period in micro-batches); None when the step is not coalesced (docs/SYNTHESIS.md)."""
    from cosim.replay.periodic import probe_microbatches
    from cosim.workload.synth.spec import BatchSpec, _card, check_microbatches, spec_card

    if spec.mode != "train" or not spec.coalesce or spec.stragglers.launch_jitter:
        return None
    b = spec.batch
    if not isinstance(b, BatchSpec) or b.gradient_accumulation_steps > 1:  # repeated schedules: simulated whole
        return None
    rm = spec.layout.resolve(spec_card(spec, _card(spec.model, base)), len(topo.gpus), where="workload.synthetic.layout")
    if rm.schedule == "dualpipe" or b.global_ % (b.micro * rm.dp):
        return None
    m_full = check_microbatches(b, rm)
    if rm.vpp > 1 and m_full % rm.pp:
        return None
    m = probe_microbatches(rm.pp, rm.vpp, m_full, int(rm.layout.a2a_overlap), bool(rm.layout.a2a_overlap))
    if m is None:
        return None
    probe = spec.model_copy(update={"batch": b.model_copy(update={"global_": m * b.micro * rm.dp})})
    return probe, m_full, m, rm.pp


def _synthesize_replay(spec: Any, topo: Any, base: Path | None, run_cfg: Any, source: str | None) -> tuple[Any, Any]:
    """(synthesized step of ``spec`` on ``topo``, its replay); a replay's ValueError is one input error naming
    ``source``, the scenario file."""
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.replay import replay
    from cosim.workload.synth import synthesize

    syn = synthesize(spec, topo, base, kernel_timer=synthetic_kernel_timer)
    try:
        return syn, replay(syn.graph, topo, run_cfg)
    except ValueError as exc:
        raise CosimInputError(str(exc), file=source) from None


def _run_coalesced(scn: Scenario, topo: Any, run_cfg: Any, base: Path | None) -> tuple[Any, Any, list[str]] | None:
    """Coalesce the repeated micro-batches of a synthetic training step (:mod:`cosim.replay.periodic`): replay
    the probe, find its period, and extend it to the full step; probes one period longer, then of doubling
    length while shorter than the step, when the period is not found. Returns (synthesized full step, result, notes); (None, None, notes) when neither probe shows the
    period and None when the step is not coalescible (the caller runs the plain step)."""
    from dataclasses import replace as _replace

    from cosim.replay.periodic import Periodic, PeriodicResult, detect_period
    from cosim.workload.synth.memory import memory_per_stage
    from cosim.workload.synth.spec import BatchSpec, Synthesized, memory_options

    assert isinstance(scn.workload, SyntheticWorkload)
    spec = scn.workload.synthetic
    first = _probe_spec(spec, topo, base)
    if first is None:
        return None
    probe, m_full, m, q = first
    tried = []
    while True:
        syn, result = _synthesize_replay(probe, topo, base, run_cfg, scn.source_file)
        found = detect_period(syn.built.unit_keys, syn.built.unit_spans, result.runs, q,
                              names={rg.rank: rg.gpu_ops.name for rg in result.graph.ranks})
        tried.append(m)
        if found is not None:
            break
        # longer probes (one period longer, then doubling): the pipeline's fill may settle slowly (a lag between
        # host and GPU that drains a little every period); all probes together cost at most ~2x the last one
        m2 = m + q if len(tried) == 1 else -(-2 * m // q) * q
        if m2 + q > m_full or (m_full - m2) % q:  # the plain step
            return None, None, [f"not coalesced: no steady-state period of {q} micro-batches found in probes of "
                                f"{tried} micro-batches per pipeline; every micro-batch simulated"]
        m = m2
        b = probe.batch
        probe = probe.model_copy(update={"batch": b.model_copy(update={"global_": m * b.micro * syn.rm.dp})})
    period, dev, pairs, cut = found
    per = Periodic(m, m_full, q, period, (m_full - m) // q, dev, pairs, cut)
    rm, b = syn.rm, spec.batch
    assert isinstance(b, BatchSpec)
    full_mem = memory_per_stage(syn.card, rm, b.micro, b.seq, m_full, spec.precision, memory_options(spec))
    worst = max(full_mem, key=lambda x: x.total)
    if worst.total > syn.hbm and not spec.allow_oom:
        raise CosimInputError(f"workload.synthetic.layout: out of memory: stage {worst.stage} needs "
                              f"{worst.total / 2**30:.1f} GiB per GPU > {syn.hbm / 2**30:.0f} GiB; shard more, "
                              "recompute, or set allow_oom: true (--set workload.synthetic.allow_oom=true)", file=scn.source_file)
    built = _replace(syn.built, microbatches=m_full, tokens_per_step=syn.built.tokens_per_step * m_full // m,
                     model_flops=syn.built.model_flops * m_full / m)
    syn = Synthesized(spec, syn.card, rm, built, full_mem, syn.hbm, syn.peak_flops)
    note = (f"coalesced {m_full} micro-batches per pipeline: simulated {m}{' (after ' + str(tried[:-1]) + ')' if len(tried) > 1 else ''}, "
            f"steady-state period of {q} micro-batches = {1e3 * period:.3f} ms (checked on {pairs} unit pairs, "
            f"largest deviation {dev:.2e} s), repeated {per.repeats} more times")
    return syn, PeriodicResult.of(result, per), [note]


def _training_notes(result: Any, syn: Any, figs: dict[str, Any], notes: list[str]) -> None:
    s = syn.spec
    result.notes[:0] = [f"synthetic {syn.card.name} training step ({s.precision}, routing {s.routing if isinstance(s.routing, str) else s.routing.model}) on "
                        f"{syn.rm.world} GPUs: tp {syn.rm.tp} pp {syn.rm.pp} vpp {syn.rm.vpp} ep {syn.rm.ep} "
                        f"etp {syn.rm.etp} cp {syn.rm.cp} dp {syn.rm.dp}, {syn.built.microbatches} micro-batches per "
                        f"pipeline; kernel durations from the kernel models (docs/SYNTHESIS.md)", *notes,
                        f"{figs['tokens_per_s_per_gpu'] or 0:.0f} tokens/s/GPU, MFU {100 * (figs['mfu'] or 0):.1f}% "
                        f"(of the bf16 dense peak), pipeline bubble {100 * figs['bubble_fraction']:.1f}%, "
                        f"memory {figs['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU"
                        + (" - OUT OF MEMORY (allow_oom)" if syn.oom else "")]
