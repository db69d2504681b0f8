"""Sweep specifications: a base scenario and parameters to vary, in one YAML file.

Example (``studies/nvlink-x-nic/sweep.yaml``)::

    name: nvlink-x-nic
    base: scenario.yaml            # bundled scenario name, or a scenario file (relative to this file)
    combine: grid                  # grid | zip | random
    set:                           # fixed overrides applied to every point (optional)
      collectives: simulated
    parameters:                    # dotted keys as accepted by `cosim run --set`
      links.nvlink4.bandwidth: ["12.5 GB/s", "25 GB/s", "50 GB/s"]
      nics.cx7-ndr400.bandwidth: ["200 Gb/s", "400 Gb/s", "800 Gb/s"]

``combine: grid`` takes every combination; ``zip`` pairs the i-th values of
equally long lists; ``random`` draws ``samples`` points (seeded by ``seed``),
each value uniformly from its list, or from a range ``{low: "10 GB/s", high:
"100 GB/s"}`` (optionally ``log: true``) written with one unit.

Every key is checked before anything runs: scenario keys (``topology``,
``workload``, ``projection.*``), replay knobs (``host.speed``,
``cuda_graphs``, ...), catalog paths (``links.nvlink4.bandwidth``, and
``nics.<id>.port_bandwidth``, which moves a NIC and its port link type
together) and topology fields (``topology.fabric.oversubscription``,
``topology.node.links.nic-pcie.type``: applied like a topology file's
``set:``, and built with the sweep's topology) with each of their values; ``workload.synthetic.*`` and ``nodes``
values are each applied to the base scenario. A bad key or value is one :class:`CosimInputError` naming the
file and line. So is a base scenario whose synthetic step fails its checks for every point alike
(:func:`run_error`, :func:`_check_base_runs`).
"""

from __future__ import annotations

import itertools
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosim.errors import CosimInputError
from cosim.yamlio import input_error_at, load_yaml

if TYPE_CHECKING:
    from cosim.scenario import Scenario

__all__ = ["COMBINE_MODES", "SweepSpec", "check_key", "expand_points", "load_sweep", "run_error"]

COMBINE_MODES = ("grid", "zip", "random")
_TOP_KEYS = ("name", "description", "base", "combine", "samples", "seed", "set", "parameters")
_SCENARIO_KEYS = ("topology", "workload")
MAX_POINTS = 2**16
"""Most points a sweep may have (``samples``, or the grid's product of list lengths): each point is a whole run of a
second or more (the bundled studies have up to a few dozen); the point list is built before the first runs."""


@dataclass
class SweepSpec:
    """A parsed sweep: base scenario, fixed sets and the parameter values."""

    name: str
    base: str
    """Bundled scenario name or scenario file path (resolved against the sweep file)."""
    parameters: dict[str, list[Any]]
    """Key -> list of values (or a range dict for ``combine: random``)."""
    combine: str = "grid"
    samples: int = 0
    seed: int = 0
    sets: dict[str, str] = field(default_factory=dict)
    description: str = ""
    source_file: str | None = None

    def points(self) -> list[dict[str, str]]:
        """The parameter assignments of every point (see :func:`expand_points`)."""
        return expand_points(self)


def _fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(v)
    return str(v)


_NUM_UNIT = re.compile(r"^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*(.*?)\s*$")


def _split_unit(v: Any) -> tuple[float, str] | None:
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return float(v), ""
    m = _NUM_UNIT.match(str(v))
    if not m:
        return None
    return float(m.group(1)), m.group(2)


def check_key(key: str, value: str) -> None:
    """Raise CosimInputError when ``key=value`` is not a valid ``--set`` of ``cosim run``."""
    from cosim.replay import ReplayConfig, apply_sets
    from cosim.scenario import ProjectionSpec

    if key in ("name", "description", "workload", "nodes") or key.startswith("workload.synthetic."):
        return  # checked against the base scenario when each point applies it (cosim.scenario.apply_scenario_sets)
    if key == "topology":
        from cosim.topology import find_topology

        if not Path(value).exists():
            find_topology(value)
        return
    if key.startswith("projection."):
        fld = key.split(".", 1)[1]
        if fld not in ProjectionSpec.model_fields:
            raise CosimInputError(f"unknown projection field {fld!r}; known: {', '.join(ProjectionSpec.model_fields)}")
        return
    if key.startswith("replay."):  # a scenario file's own spelling of the replay knob <field>
        from cosim.scenario import ReplaySpec

        fld = key.split(".", 1)[1]
        if fld not in ReplaySpec.model_fields:
            raise CosimInputError(f"--set {key}: unknown replay field; known: {', '.join(ReplaySpec.model_fields)}")
        if fld in ("durations", "collectives", "ranks_per_node", "profile", "accelerator", "launch_overhead",
                   "launch_latency", "kernel_gap", "host_speed", "cuda_graphs"):
            apply_sets(ReplayConfig(), {fld: value})
        return
    if key.startswith("topology."):
        # a field of the topology document; checked against the sweep's topologies by load_sweep
        if any(not seg for seg in key.split(".")[1:]):
            raise CosimInputError(f"--set {key}: empty path segment; write topology.<field>[.<entry>...], "
                                  "e.g. topology.fabric.oversubscription")
        return
    from cosim.scenario import expand_port_bandwidth

    for k, v in expand_port_bandwidth({key: value}).items():
        apply_sets(ReplayConfig(), {k: v})
        from cosim.replay.config import CATALOG_SECTIONS

        if k.split(".", 1)[0] in CATALOG_SECTIONS:
            from cosim.catalog import load_catalog

            load_catalog().with_overrides({k: v})


def _check_topology_knobs(scn: Scenario, data: Any, params: dict[str, list[Any]], sets: dict[str, str],
                          f: str) -> None:
    """Build the sweep's topology (each value of a ``topology`` parameter) with every value of every
    ``topology.<path>`` knob, so that a bad path or value is an error at its line before anything runs."""
    from cosim.scenario import build_topology, split_topology_sets

    bdir = Path(scn.source_file).parent if scn.source_file else None
    fixed_all = {**scn.set, **sets}
    refs = [_fmt_value(v) for v in params["topology"]] if "topology" in params and isinstance(
        params["topology"], list) else [fixed_all.get("topology") or scn.topology]
    fixed, _ = split_topology_sets(fixed_all)
    pkeys = [k for k in params if k.startswith("topology.")]
    if not pkeys and not fixed:
        return
    ps = data.get("parameters") or {}
    sr = data.get("set") or {}
    for ref in refs:
        if fixed:
            try:
                build_topology(ref, bdir, None, fixed)
            except CosimInputError as exc:
                bad = [k for k in fixed if exc.message.startswith(f"--set {k}=")]
                where: list[str | int] = [bad[0]] if bad and bad[0] in sr else []
                raise _err(sr if where else data, where, f"with topology {ref}: {exc.message}", f) from None
        for k in pkeys:
            vals = params[k]
            items = list(enumerate(vals)) if isinstance(vals, list) else [(None, vals["low"]), (None, vals["high"])]
            for i, v in items:
                try:
                    build_topology(ref, bdir, None, {**fixed, k: _fmt_value(v)})
                except CosimInputError as exc:
                    loc: list[str | int] = [k, i] if i is not None and isinstance(ps.get(k), list) else [k]
                    raise _err(ps, loc, f"with topology {ref}: {exc.message}", f) from None


def _check_capture_knobs(scn: Scenario, data: Any, params: dict[str, list[Any]], sets: dict[str, str], f: str
                         ) -> None:
    """Refuse a capture-only knob (projection.*, cuda_graphs) on a synthetic base before anything runs: every
    point would refuse it (:func:`cosim.scenario.check_capture_knobs`)."""
    from cosim.scenario import check_capture_knobs

    try:
        check_capture_knobs(scn, [*sets, *params])
    except CosimInputError as exc:
        key = next((k for k in [*sets, *params] if exc.message.startswith(f"--set {k}: ")), "")
        where = "parameters" if key in params else "set"
        raise _err(data.get(where) or data, [key], exc.message, f) from None


def _check_scenario_knobs(scn: Scenario, data: Any, params: dict[str, list[Any]], sets: dict[str, str], f: str
                          ) -> None:
    """Apply each value of every ``workload.synthetic.*`` and ``nodes`` knob to the base scenario on its own, so
    that a misspelled field or a value of the wrong type is an error at its line before anything runs (every point
    would fail on it). Skipped when the sweep replaces the workload itself."""
    from cosim.scenario import apply_scenario_sets

    if "workload" in params or "workload" in sets:
        return
    ps = data.get("parameters") or {}
    sr = data.get("set") or {}
    items: list[tuple[Any, list[str | int], str, str]] = [
        (sr, [k], k, v) for k, v in sets.items() if k == "nodes" or k.startswith("workload.synthetic.")]
    for k, vals in params.items():
        if k == "nodes" or k.startswith("workload.synthetic."):
            if isinstance(vals, list):
                pos = isinstance(ps.get(k), list)
                items += [(ps, [k, i] if pos else [k], k, _fmt_value(v)) for i, v in enumerate(vals)]
            else:  # a {low, high} range
                items += [(ps, [k], k, _fmt_value(vals[end])) for end in ("low", "high")]  # type: ignore[call-overload]
    for where, loc, key, value in items:
        try:
            apply_scenario_sets(scn, {key: value})
        except CosimInputError as exc:
            raise _err(where, loc, re.sub(r"^--set [^:]*: ", "", exc.message), f) from None


class _ChecksPassed(Exception):
    """Raised by :func:`_untimed` when synthesis times its first kernel: every check of the step has passed."""


def _untimed(spec: Any, accelerator: Any, base: Path | None) -> Any:
    """A kernel timer factory for :func:`cosim.workload.synth.synthesize` whose timer stops the synthesis
    (:class:`_ChecksPassed`) at the first kernel it is asked to time, so that only the checks run."""
    def timer(ops: Any) -> list[float]:
        raise _ChecksPassed

    return timer


def run_error(scn: Scenario, sets: dict[str, str]) -> CosimInputError | None:
    """The input error scenario ``scn`` with ``sets`` stops at before its first kernel is timed (a topology knob,
    a synthetic layout that does not divide the GPUs, a step out of memory without ``allow_oom``: every check of
    :func:`cosim.scenario.scenario_hardware` and :func:`cosim.workload.synth.synthesize`), as raised (not yet
    pointed at the scenario file's line); None when there is none, or when they fail otherwise (a bug: each
    point records it as it runs)."""
    from cosim.scenario import SyntheticWorkload, scenario_hardware
    from cosim.workload.synth import synthesize

    try:
        scn, _, topo, base, _ = scenario_hardware(scn, sets)
        if isinstance(scn.workload, SyntheticWorkload):
            synthesize(scn.workload.synthetic, topo, base, kernel_timer=_untimed)
    except _ChecksPassed:
        return None
    except CosimInputError as exc:
        return exc
    except Exception:
        return None
    return None


def _check_base_runs(scn: Scenario, data: Any, points: list[dict[str, str]], sets: dict[str, str], f: str) -> None:
    """Refuse, before anything runs, a base scenario (with the fixed ``set:``) that stops at an input error before
    its first kernel is timed (:func:`run_error`) when every point stops at that same error: no parameter value
    changes it, so every point would fail on it. When a point passes the checks, or fails them otherwise, its
    parameters change what the base stops at: the sweep runs, and each failing point records its own error."""
    from cosim.scenario import at_scenario_line

    exc = run_error(scn, sets)
    if exc is None:
        return
    for p in points:
        e = run_error(scn, {**sets, **p})
        if e is None or str(e) != str(exc):
            return
    exc = at_scenario_line(exc, scn.source_file, [*scn._applied, *sets])
    if exc.location.file:
        raise CosimInputError(f"{exc.message} (for every point of the sweep {f})", file=exc.location.file,
                              line=exc.location.line, column=exc.location.column, path=exc.location.path)
    where: list[str | int] = ["set"] if sets else ["base"]
    raise _err(data, where, f"the base scenario{' with these sets' if sets else ''} fails for every point: "
               f"{exc.message}", f)


def _err(data: Any, loc: list[str | int], message: str, file: str | None) -> CosimInputError:
    return input_error_at(data, loc, message, file=file)


def load_sweep(path: str | Path) -> SweepSpec:
    """Read and check a sweep YAML file."""
    p = Path(path)
    data = load_yaml(p)
    f = str(p)
    if not isinstance(data, dict):
        raise CosimInputError("a sweep file must be a mapping with base: and parameters:", file=p)
    for k in data:
        if k not in _TOP_KEYS:
            raise _err(data, [k], f"unknown key {k!r}; known: {', '.join(_TOP_KEYS)}", f)
    if "base" not in data:
        raise CosimInputError("missing required key 'base' (a scenario name or file)", file=p)
    from cosim.scenario import load_scenario

    base = str(data["base"])
    cand = p.parent / base
    scn: Scenario | None = None
    if cand.exists():
        base = str(cand.resolve())
    else:
        try:
            scn = load_scenario(base)
        except CosimInputError as exc:
            raise _err(data, ["base"], exc.message, f) from None
    combine = str(data.get("combine", "grid"))
    if combine not in COMBINE_MODES:
        raise _err(data, ["combine"], f"bad combine mode {combine!r}; known: {', '.join(COMBINE_MODES)}", f)
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        raise _err(data, ["parameters"] if "parameters" in data else [],
                   "parameters: must map at least one key to a list of values (empty grid)", f)
    out: dict[str, list[Any]] = {}
    for key, vals in params.items():
        if isinstance(vals, dict):
            if combine != "random":
                raise _err(params, [key], "a {low, high} range needs combine: random; give a list of values", f)
            extra = set(vals) - {"low", "high", "log"}
            if extra or "low" not in vals or "high" not in vals:
                raise _err(params, [key], "a range is {low: V, high: V, log: true|false}", f)
            lo, hi = _split_unit(vals["low"]), _split_unit(vals["high"])
            if lo is None or hi is None or lo[1] != hi[1] or hi[0] < lo[0]:
                raise _err(params, [key], "range low/high must be numbers with the same unit, low <= high", f)
            if vals.get("log") and lo[0] <= 0:
                raise _err(params, [key], "a log range needs low > 0", f)
            for v in (vals["low"], vals["high"]):
                try:
                    check_key(str(key), _fmt_value(v))
                except CosimInputError as exc:
                    raise _err(params, [key], exc.message, f) from None
            out[str(key)] = vals  # type: ignore[assignment]
            continue
        if not isinstance(vals, list):
            vals = [vals]
        if not vals:
            raise _err(params, [key], "empty list of values (empty grid)", f)
        for i, v in enumerate(vals):
            try:
                check_key(str(key), _fmt_value(v))
            except CosimInputError as exc:
                raise _err(params, [key, i] if isinstance(params[key], list) else [key], exc.message, f) from None
        out[str(key)] = list(vals)
    if combine == "zip":
        lens = {k: len(v) for k, v in out.items()}
        if len(set(lens.values())) > 1:
            raise _err(data, ["parameters"], f"combine: zip needs lists of one length; got {lens}", f)
    samples = data.get("samples", 0)
    if combine == "random" and (not isinstance(samples, int) or samples < 1):
        raise _err(data, ["samples"] if "samples" in data else [], "combine: random needs samples: N >= 1", f)
    count = samples if combine == "random" else math.prod(len(v) for v in out.values()) if combine == "grid" else 0
    if count > MAX_POINTS:
        raise _err(data, ["samples"] if combine == "random" else ["parameters"],
                   f"{count} points; a sweep runs at most {MAX_POINTS}", f)
    seed = data.get("seed", 0)
    if not isinstance(seed, int):
        raise _err(data, ["seed"], "seed must be an integer", f)
    sets_raw = data.get("set") or {}
    if not isinstance(sets_raw, dict):
        raise _err(data, ["set"], "set: must be a mapping of key: value", f)
    sets: dict[str, str] = {}
    for k, v in sets_raw.items():
        try:
            check_key(str(k), _fmt_value(v))
        except CosimInputError as exc:
            raise _err(sets_raw, [k], exc.message, f) from None
        sets[str(k)] = _fmt_value(v)
    scn = scn or load_scenario(base)  # the base scenario, read once for the checks below
    _check_topology_knobs(scn, data, out, sets, f)
    _check_capture_knobs(scn, data, out, sets, f)
    _check_scenario_knobs(scn, data, out, sets, f)
    name = str(data.get("name") or p.stem)
    spec = SweepSpec(name=name, base=base, parameters=out, combine=combine, samples=int(samples or 0),
                     seed=seed, sets=sets, description=str(data.get("description", "")), source_file=f)
    _check_base_runs(scn, data, spec.points(), sets, f)
    return spec


def _draw(rng: random.Random, vals: Any) -> str:
    if isinstance(vals, dict):
        lo, unit = _split_unit(vals["low"])  # type: ignore[misc]
        hi, _ = _split_unit(vals["high"])  # type: ignore[misc]
        if vals.get("log"):
            x = math.exp(rng.uniform(math.log(lo), math.log(hi)))
        else:
            x = rng.uniform(lo, hi)
        x = float(f"{x:.4g}")
        return f"{x:g} {unit}".strip()
    return _fmt_value(rng.choice(vals))


def expand_points(spec: SweepSpec) -> list[dict[str, str]]:
    """Parameter assignments (string values) of every point, in a stable order; duplicates dropped."""
    keys = list(spec.parameters)
    pts: list[dict[str, str]] = []
    if spec.combine == "grid":
        for combo in itertools.product(*(spec.parameters[k] for k in keys)):
            pts.append({k: _fmt_value(v) for k, v in zip(keys, combo)})
    elif spec.combine == "zip":
        for combo in zip(*(spec.parameters[k] for k in keys)):
            pts.append({k: _fmt_value(v) for k, v in zip(keys, combo)})
    else:
        rng = random.Random(spec.seed)
        for _ in range(spec.samples):
            pts.append({k: _draw(rng, spec.parameters[k]) for k in keys})
    seen: set[tuple[tuple[str, str], ...]] = set()
    out = []
    for pt in pts:
        t = tuple(sorted(pt.items()))
        if t not in seen:
            seen.add(t)
            out.append(pt)
    if not out:
        raise CosimInputError("the sweep has no points (empty grid)", file=spec.source_file)
    return out
