"""Pydantic models of topology YAML files (what a file may say, not what it means).

A topology file describes either one host node (``devices`` + ``links``) or a
cluster (``node`` + ``nodes`` + ``fabric``, optionally with rack-level
``devices`` and ``links`` such as the NVSwitch trays of an NVL72 rack). Both
may ``extends`` another topology and ``set`` catalog or topology fields.
Bandwidths are never written here: they come from catalog link types
(``links[*].type``), so every number has one source.

See docs/TOPOLOGY.md for the reference with examples.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from cosim.catalog.models import Strict

__all__ = [
    "DEVICE_KINDS",
    "DeviceEntry",
    "FabricSpec",
    "LinkEntry",
    "TopologyFile",
    "expand_template",
    "iterations",
]

DeviceKind = Literal["gpu", "cpu", "pcie_switch", "nvswitch", "nic", "fabric_switch", "nvme"]
DEVICE_KINDS: tuple[str, ...] = ("gpu", "cpu", "pcie_switch", "nvswitch", "nic", "fabric_switch", "nvme")
SPEC_SECTION: dict[str, str] = {"gpu": "accelerators", "cpu": "cpus", "nic": "nics"}
"""Device kinds that must name a catalog entry, and the catalog section it is in."""

_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*(\{[^{}]+\}[A-Za-z0-9_\-]*)*$")
_TEMPLATE = re.compile(r"\{([^{}]+)\}")


MAX_REPEAT = 100_000
"""Most devices one entry's ``count`` and links one entry's ``repeat`` may generate (each is listed one by one)."""


class DeviceEntry(Strict):
    """One device, or ``count`` devices whose ``id`` contains ``{i}``."""

    id: str
    """Device id, unique on its node, e.g. "gpu0"; with ``count``, a template like "gpu{i}"."""
    kind: DeviceKind
    spec: str | None = None
    """Catalog id: required for gpu (accelerators), cpu (cpus) and nic (nics)."""
    count: int | None = Field(default=None, ge=1, le=MAX_REPEAT)
    """Generate this many devices, ``i`` = 0 .. count-1 in the ``id`` template."""
    chips: int | None = Field(default=None, ge=1)
    """For a logical switch node: how many physical switch chips it stands for."""
    label: str = ""
    """Display text, e.g. "PCIe Gen5 switch inside ConnectX-7"."""

    @field_validator("id")
    @classmethod
    def _id_ok(cls, v: str) -> str:
        if not _ID.match(v) or "." in v:
            raise ValueError(f"device id {v!r} must be letters, digits, '_' or '-', optionally with {{i}} templates (no dots)")
        return v

    @model_validator(mode="after")
    def _template_needs_count(self) -> DeviceEntry:
        if self.count is None and "{" in self.id:
            raise ValueError(f"id {self.id!r} is a template: add count: N")
        if self.count is not None and self.count > 1 and "{" not in self.id:
            raise ValueError(f"count: {self.count} needs a template id like \"{self.id}{{i}}\"")
        if self.kind in SPEC_SECTION and not self.spec:
            raise ValueError(f"a {self.kind} needs spec: a catalog id from {SPEC_SECTION[self.kind]}")
        return self


class LinkEntry(Strict):
    """A link (with multiplicity ``count``) between two devices; ``repeat`` generates many."""

    between: tuple[str, str]
    """The two endpoint ids, e.g. ["gpu{i}", "pcie{i//2}"]."""
    type: str
    """Catalog link type id, e.g. "nvlink4", "pcie5x16"."""
    count: int = Field(default=1, ge=1, le=10_000)
    """Physical links in parallel (e.g. 18 NVLink4 links GPU to NVSwitch)."""
    repeat: int | dict[str, int] | None = None
    """Generate: an int N loops ``i`` over 0..N-1; a mapping {var: N, ...} nests loops."""
    name: str | None = None
    """Optional handle so a proposal can address it: set: {topology.links.NAME.type: pcie6x16}."""
    label: str = ""

    @field_validator("repeat")
    @classmethod
    def _repeat_ok(cls, v: int | dict[str, int] | None) -> int | dict[str, int] | None:
        if isinstance(v, int) and v < 1:
            raise ValueError("repeat must be >= 1")
        if isinstance(v, dict):
            for k, n in v.items():
                if not re.fullmatch(r"[a-z]", k):
                    raise ValueError(f"repeat variable {k!r} must be one lowercase letter")
                if not isinstance(n, int) or n < 1:
                    raise ValueError(f"repeat count for {k!r} must be an integer >= 1")
        total = v if isinstance(v, int) else math.prod(v.values()) if v else 1
        if total > MAX_REPEAT:
            raise ValueError(f"repeat generates {total} links; at most {MAX_REPEAT} (as a device's count)")
        return v


class FabricSpec(Strict):
    """Scale-out network generated from parameters (see docs/TOPOLOGY.md, "Fabrics")."""

    topology: Literal["single-switch", "rail-optimized", "leaf-spine", "fat-tree", "dragonfly", "torus"]
    link: str | None = None
    """Catalog link type of fabric cables; default: the NICs' own ``link``."""
    switch_radix: int = Field(default=64, ge=2)
    """Ports per fabric switch (NDR Quantum-2 QM9700: 64 x 400G)."""
    oversubscription: float = Field(default=1.0, ge=1.0, allow_inf_nan=False)
    """Leaf downlinks : uplinks, e.g. 2 (or "2:1") means half as many uplinks."""
    leaf_down_ports: int | None = Field(default=None, ge=1)
    """Host-facing ports per leaf; default switch_radix // 2 (independent of oversubscription)."""
    nics: list[str] | None = Field(default=None, min_length=1)
    """Local NIC ids (on each node) that attach to the fabric; default: every NIC."""
    group_size: int | None = Field(default=None, ge=1)
    """dragonfly: switches per group (default 4)."""
    hosts_per_switch: int | None = Field(default=None, ge=1)
    """dragonfly: NIC ports per switch (default switch_radix // 4)."""
    dims: list[int] | None = None
    """torus: switch grid dimensions; the product must equal the node count (one switch per node)."""

    @field_validator("oversubscription", mode="before")
    @classmethod
    def _ratio(cls, v: Any) -> Any:
        if isinstance(v, str):
            m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*:\s*(\d+(?:\.\d+)?)\s*", v)
            if not m or float(m.group(2)) == 0:
                raise ValueError(f"oversubscription {v!r}: write a number like 2 or a ratio like \"2:1\"")
            return float(m.group(1)) / float(m.group(2))
        return v


class TopologyFile(Strict):
    """One topology YAML document: a host node, or a cluster of them."""

    name: str | None = None
    """Topology name; default: the file name without .yaml."""
    description: str = ""
    source: str | None = None
    """Where the structure comes from (block diagram, user guide); required for presets."""
    notes: str = ""
    extends: str | None = None
    """Parent topology (preset name, or a path relative to this file) to start from."""
    set: dict[str, Any] = Field(default_factory=dict)
    """Overrides: "links.nvlink4.bandwidth" (catalog) or "topology.fabric.oversubscription" (this file)."""
    parts: dict[Literal["accelerators", "cpus", "nics", "links"], dict[str, dict[str, Any]]] = Field(default_factory=dict)
    """Custom catalog entries defined inline (may ``extends`` a catalog id)."""
    devices: list[DeviceEntry] = Field(default_factory=list)
    links: list[LinkEntry] = Field(default_factory=list)
    node: str | dict[str, Any] | None = None
    """Cluster: the host-node topology (preset name, path, or an inline node mapping)."""
    nodes: int | None = Field(default=None, ge=1, le=100_000)
    """Cluster: number of host nodes."""
    fabric: FabricSpec | None = None

    @model_validator(mode="after")
    def _cluster_fields(self) -> TopologyFile:
        if (self.node is None) != (self.nodes is None):
            raise ValueError("a cluster needs both node: (the host-node topology) and nodes: (how many)")
        if self.fabric is not None and self.node is None:
            raise ValueError("fabric: is only for clusters (give node: and nodes:)")
        return self


# --- templates ---------------------------------------------------------------------------------

_ALLOWED_NODES = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Constant, ast.Name, ast.Load,
                  ast.Add, ast.Sub, ast.Mult, ast.FloorDiv, ast.Mod, ast.USub)


def _eval(expr: str, env: dict[str, int]) -> int:
    tree = ast.parse(expr.strip(), mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED_NODES):
            raise ValueError(f"template {{{expr}}}: only integers, variables and + - * // % are allowed")
        if isinstance(node, ast.Name) and node.id not in env:
            raise ValueError(f"template {{{expr}}}: unknown variable {node.id!r} (have {', '.join(sorted(env)) or 'none'})")
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            raise ValueError(f"template {{{expr}}}: only integer constants")

    def ev(n: ast.AST) -> int:
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Constant) and isinstance(n.value, int):  # (only int constants pass the check above)
            return int(n.value)
        if isinstance(n, ast.Name):
            return env[n.id]
        if isinstance(n, ast.UnaryOp):
            return -ev(n.operand)
        assert isinstance(n, ast.BinOp)
        a, b = ev(n.left), ev(n.right)
        if isinstance(n.op, ast.Add):
            return a + b
        if isinstance(n.op, ast.Sub):
            return a - b
        if isinstance(n.op, ast.Mult):
            return a * b
        if b == 0:
            raise ValueError(f"template {{{expr}}}: division by zero")
        return a // b if isinstance(n.op, ast.FloorDiv) else a % b

    return ev(tree)


def expand_template(text: str, env: dict[str, int]) -> str:
    """Replace each ``{expr}`` in ``text`` (e.g. "pcie{i//2}") using integer variables ``env``.

    Raises:
        ValueError: a bad expression or an unknown variable.
    """
    return _TEMPLATE.sub(lambda m: str(_eval(m.group(1), env)), text)


def iterations(repeat: int | dict[str, int] | None, default_var: str = "i") -> list[dict[str, int]]:
    """The variable bindings a ``repeat`` / ``count`` generates, in order (last variable fastest)."""
    if repeat is None:
        return [{}]
    if isinstance(repeat, int):
        return [{default_var: k} for k in range(repeat)]
    out: list[dict[str, int]] = [{}]
    for var, n in repeat.items():
        out = [{**env, var: k} for env in out for k in range(n)]
    return out
