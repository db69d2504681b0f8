"""Turn a resolved topology document into the networkx graph (see docs/TOPOLOGY.md).

Graph contract (the engine codes against it):

* node ids: "gpu0" on a single host node; "node3.gpu0" in a cluster; generated
  or rack-level parts "fabric.leaf0", "fabric.nvswitch0".
* node attributes: ``kind`` (gpu, cpu, pcie_switch, nvswitch, nic,
  fabric_switch, nvme), ``node`` (host-node index, -1 for fabric), ``spec``
  (catalog id or None), ``index`` (local index within kind on its node), plus
  ``local_id``, ``label``, ``chips`` (logical switches), ``role``/``rail``/``group``
  (fabric switches).
* both directions of every link are edges with ``link`` (catalog link id),
  ``kind`` (the link type's kind), ``count`` (parallel links), ``bandwidth``
  (count x per-link raw bytes/s per direction), ``efficiency`` and ``latency`` (s).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import networkx as nx

from cosim.catalog import Catalog, load_catalog
from cosim.errors import CosimInputError
from cosim.yamlio import LocDict, format_path, input_error_at, loads_yaml, locate, plain, validate

from .loader import (
    apply_topology_set,
    read_document,
    resolve_document,
    resolve_ref,
    set_origin,
    split_set,
)
from .schema import SPEC_SECTION, TopologyFile, expand_template, iterations

__all__ = ["BuildResult", "build_from_path"]


@dataclass
class _Dev:
    gid: str
    kind: str
    spec: str | None
    chips: int | None
    label: str
    loc: tuple[LocDict, list[str | int]]


@dataclass
class _Link:
    a: str
    b: str
    link: str
    count: int
    loc: tuple[LocDict, list[str | int]]


@dataclass
class _Local:
    """One host node's devices and links, expanded once, before prefixing."""

    devices: list[_Dev] = field(default_factory=list)
    links: list[_Link] = field(default_factory=list)


@dataclass
class BuildResult:
    """What the builder hands to :class:`~cosim.topology.Topology`."""

    name: str
    graph: nx.DiGraph
    catalog: Catalog
    description: str
    source: str | None
    notes: str
    node_name: str | None
    fabric: dict[str, Any] | None
    is_cluster: bool


def _err(where: tuple[LocDict, list[str | int]], msg: str) -> CosimInputError:
    data, loc = where
    origin = set_origin(data, loc)
    if origin is not None:  # the bad value came from a set: entry; point there
        return input_error_at(origin[0], origin[1], f"sets {format_path(loc)}: {msg}")
    return input_error_at(data, loc, msg)


def _catalog_section(cat: Catalog, section: str) -> dict[str, Any]:
    return getattr(cat, section)


def _known(cat: Catalog, section: str) -> str:
    names = sorted(_catalog_section(cat, section))
    return ", ".join(names[:40]) + (" ..." if len(names) > 40 else "")


def _expand_local(doc: TopologyFile, data: LocDict, cat: Catalog, env_extra: dict[str, int] | None = None,
                  scope: str = "node") -> _Local:
    """Expand the ``devices`` and ``links`` generators of one document; check references."""
    out = _Local()
    seen: dict[str, tuple[LocDict, list[str | int]]] = {}
    for k, d in enumerate(doc.devices):
        where: tuple[LocDict, list[str | int]] = (data, ["devices", k, "id"])
        if d.spec is not None:
            section = SPEC_SECTION.get(d.kind)
            if section is None:
                raise _err((data, ["devices", k, "spec"]), f"a {d.kind} has no catalog spec; remove spec")
            if d.spec not in _catalog_section(cat, section):
                raise _err((data, ["devices", k, "spec"]),
                           f"unknown {section[:-1] if section != 'accelerators' else 'accelerator'} {d.spec!r}; "
                           f"catalog has: {_known(cat, section)} (or define it under parts.{section})")
        if scope == "fabric" and d.kind in ("gpu", "cpu", "nic", "nvme"):
            raise _err((data, ["devices", k, "kind"]),
                       f"a {d.kind} belongs to a host node (node:), not to the cluster level")
        envs = [{}] if d.count is None else [{"i": j} for j in range(d.count)]
        for env in envs:
            try:
                gid = expand_template(d.id, {**(env_extra or {}), **env})
            except ValueError as exc:
                raise _err(where, str(exc)) from None
            if gid in seen:
                first = locate(*seen[gid])[1]
                at = f" (first defined at line {first[0]})" if first else ""
                raise _err(where, f"duplicate device id {gid!r}{at}")
            seen[gid] = where
            out.devices.append(_Dev(gid, d.kind, d.spec, d.chips, d.label, (data, ["devices", k])))
    return out


def _expand_links(doc: TopologyFile, data: LocDict, cat: Catalog, resolve: Any) -> list[_Link]:
    """Expand ``links`` generators; ``resolve(id)`` maps a written endpoint to a graph id or None."""
    links: list[_Link] = []
    for k, ln in enumerate(doc.links):
        if ln.type not in cat.links:
            raise _err((data, ["links", k, "type"]),
                       f"unknown link type {ln.type!r}; catalog has: {_known(cat, 'links')} (or define it under parts.links)")
        for env in iterations(ln.repeat):
            ends: list[str] = []
            for side in (0, 1):
                where: tuple[LocDict, list[str | int]] = (data, ["links", k, "between", side])
                try:
                    written = expand_template(ln.between[side], env)
                except ValueError as exc:
                    raise _err(where, str(exc)) from None
                gid = resolve(written)
                if gid is None:
                    how = f" (from {ln.between[side]!r} with {', '.join(f'{a}={b}' for a, b in env.items())})" if env else ""
                    raise _err(where, f"link endpoint {written!r} is not a device{how}")
                ends.append(gid)
            if ends[0] == ends[1]:
                raise _err((data, ["links", k, "between"]), f"link from {ends[0]!r} to itself")
            links.append(_Link(ends[0], ends[1], ln.type, ln.count, (data, ["links", k])))
    return links


class _GraphBuilder:
    def __init__(self, cat: Catalog) -> None:
        self.cat = cat
        self.g = nx.DiGraph()
        self.origin: dict[str, tuple[LocDict, list[str | int]]] = {}
        self._index: dict[tuple[int, str], int] = {}
        self._edge_loc: dict[tuple[str, str], tuple[LocDict, list[str | int]]] = {}

    def add_device(self, gid: str, kind: str, node: int, spec: str | None, local_id: str, *,
                   label: str = "", chips: int | None = None,
                   origin: tuple[LocDict, list[str | int]] | None = None, **extra: Any) -> None:
        idx = self._index.get((node, kind), 0)
        self._index[(node, kind)] = idx + 1
        attrs: dict[str, Any] = {"kind": kind, "node": node, "spec": spec, "index": idx, "local_id": local_id, "label": label}
        if chips is not None:
            attrs["chips"] = chips
        attrs.update(extra)
        self.g.add_node(gid, **attrs)
        if origin is not None:
            self.origin[gid] = origin

    def add_link(self, a: str, b: str, link: str, count: int,
                 origin: tuple[LocDict, list[str | int]] | None = None) -> None:
        lt = self.cat.links[link]
        if self.g.has_edge(a, b):
            e = self.g.edges[a, b]
            if e["link"] != link:
                where = origin or self._edge_loc.get((a, b))
                msg = f"{a!r} and {b!r} are already linked by {e['link']}; one link type per device pair"
                if where is not None:
                    raise _err(where, msg)
                raise CosimInputError(msg)
            count += e["count"]
        per_link = lt.bandwidth
        if lt.kind in ("infiniband", "ethernet"):
            # A network port runs at the slower of its cable's link type and its adapter.
            for end in (a, b):
                nd = self.g.nodes[end] if end in self.g else {}
                if nd.get("kind") == "nic" and nd.get("spec") in self.cat.nics:
                    per_link = min(per_link, self.cat.nics[nd["spec"]].bandwidth)
        attrs = {
            "link": link,
            "kind": lt.kind,
            "count": count,
            "bandwidth": count * per_link,
            "efficiency": lt.efficiency,
            "latency": lt.latency,
        }
        self.g.add_edge(a, b, **attrs)
        self.g.add_edge(b, a, **attrs)
        if origin is not None:
            self._edge_loc.setdefault((a, b), origin)
            self._edge_loc.setdefault((b, a), origin)


def _host_node(doc: TopologyFile, data: LocDict, cat: Catalog, what: str) -> _Local:
    """The devices and links of a host node (``what``: "a topology", or "a host node" of a cluster), checked: its
    links resolved among its own devices, every device connected (:func:`_check_node_connectivity`), it has a GPU."""
    local = _expand_local(doc, data, cat)
    ids = {d.gid for d in local.devices}
    local.links = _expand_links(doc, data, cat, lambda x: x if x in ids else None)
    _check_node_connectivity(local)
    if not any(d.kind == "gpu" for d in local.devices):
        raise input_error_at(data, ["devices"], f"{what} needs at least one device of kind gpu")
    return local


def _check_node_connectivity(local: _Local) -> None:
    """Every device has a link; every accelerator reaches a CPU; the node has a CPU."""
    g = nx.Graph()
    for d in local.devices:
        g.add_node(d.gid)
    for ln in local.links:
        g.add_edge(ln.a, ln.b)
    cpus = {d.gid for d in local.devices if d.kind == "cpu"}
    if local.devices and not cpus:
        data, loc = local.devices[0].loc
        raise input_error_at(data, loc[:-1], "a host node needs at least one device of kind cpu (its host memory)")
    for d in local.devices:
        if d.kind == "gpu" and not (nx.node_connected_component(g, d.gid) & cpus):
            what = "has no links" if g.degree(d.gid) == 0 else "is not connected to any CPU"
            raise _err((d.loc[0], [*d.loc[1], "id"]), f"disconnected accelerator: {d.gid!r} {what}")
        if g.degree(d.gid) == 0:
            raise _err((d.loc[0], [*d.loc[1], "id"]), f"device {d.gid!r} has no links")


def _make_catalog(parts_docs: list[LocDict], cat_sets: list[tuple[str, Any, LocDict, list[str | int]]],
                  overrides: dict[str, Any] | None) -> Catalog:
    cat = load_catalog()
    for data in parts_docs:
        parts = data.get("parts")
        if parts:
            entries = {sec: {k: plain(v) for k, v in items.items()} for sec, items in parts.items()}
            try:
                cat = cat.with_entries(entries)
            except CosimInputError as exc:
                inner = [p for p in (exc.location.path or "").split(".") if p]
                raise input_error_at(data, ["parts", *inner], exc.message) from None
            except (KeyError, ValueError) as exc:
                raise input_error_at(data, ["parts"], f"bad part: {exc}") from None
    by_doc: dict[int, set[str]] = {}
    for key, _, data, _ in cat_sets:
        by_doc.setdefault(id(data), set()).add(key)
    for key, _, data, loc in cat_sets:
        head, _, last = key.rpartition(".")
        if last == "bidirectional" and f"{head}.bandwidth" in by_doc[id(data)]:
            raise input_error_at(data, loc, f"give either {head}.bandwidth (per direction) or "
                                            f"{head}.bidirectional, not both")
    for key, value, data, loc in cat_sets:
        try:
            cat = cat.with_overrides({key: plain(value)})
        except CosimInputError as exc:
            raise input_error_at(data, loc, exc.message) from None
        except (KeyError, ValueError) as exc:
            raise input_error_at(data, loc, f"cannot override {key!r}: {exc}") from None
    if overrides:
        try:
            cat = cat.with_overrides(dict(overrides))
        except (KeyError, ValueError) as exc:
            raise CosimInputError(f"bad catalog override: {exc}") from None
    return cat


def _apply_sets(doc: LocDict, sets: dict[str, tuple[Any, list[str | int]]], data: LocDict,
                path: Path | None) -> tuple[LocDict, TopologyFile]:
    """Apply topology-field sets one by one; a set that makes the file invalid is reported at the set.

    Returns the new document and its validated model."""
    for key, (value, loc) in sets.items():
        doc = apply_topology_set(doc, key, value, data, loc)
        try:
            validate(TopologyFile, doc, path)
        except CosimInputError as exc:
            raise input_error_at(data, loc, f"makes {exc.location.path or 'the topology'} invalid: {exc.message}") from None
    return doc, validate(TopologyFile, doc, path)


def build_from_path(path: Path, overrides: dict[str, Any] | None = None) -> BuildResult:
    """Load the topology file at ``path`` and build its graph."""
    data = read_document(path)
    return build_from_document(data, path, overrides)


def build_from_document(data: LocDict, path: Path | None, overrides: dict[str, Any] | None = None) -> BuildResult:
    """Build from a resolved document (``extends`` already merged)."""
    cat_sets, topo_sets = split_set(data)
    own_sets = {k: v for k, v in topo_sets.items() if not k.startswith("node.")}
    node_sets = {k[len("node."):]: v for k, v in topo_sets.items() if k.startswith("node.")}
    orig = data
    data, doc = _apply_sets(orig, own_sets, orig, path)
    name = doc.name or (path.stem if path is not None else "topology")

    cset = [(k, v, data, loc) for k, (v, loc) in cat_sets.items()]
    if doc.node is None:
        if node_sets:
            k = next(iter(node_sets))
            raise input_error_at(data, ["set", f"topology.node.{k}"], "topology.node.* needs a cluster (node: and nodes:)")
        cat = _make_catalog([data], cset, overrides)
        local = _host_node(doc, data, cat, "a topology")
        b = _GraphBuilder(cat)
        for d in local.devices:
            b.add_device(d.gid, d.kind, 0, d.spec, d.gid, label=d.label, chips=d.chips, origin=d.loc)
        for ln in local.links:
            b.add_link(ln.a, ln.b, ln.link, ln.count, ln.loc)
        return BuildResult(name, b.g, cat, doc.description, doc.source, doc.notes, None, None, False)

    # --- cluster ---
    node_data, node_path = _resolve_node(data, path)
    node_cat_sets, node_topo_sets = split_set(node_data)
    if any(k.startswith("node.") for k in node_topo_sets):
        raise input_error_at(node_data, ["set"], "a host-node topology cannot itself be a cluster")
    node_doc_data, node_doc = _apply_sets(node_data, node_topo_sets, node_data, node_path)
    if node_sets:
        for key, (value, loc) in node_sets.items():
            node_doc_data = apply_topology_set(node_doc_data, key, value, data, loc)
            try:
                node_doc = validate(TopologyFile, node_doc_data, node_path)
            except CosimInputError as exc:
                raise input_error_at(data, loc, f"makes node {exc.location.path or ''} invalid: {exc.message}") from None
    if node_doc.node is not None:
        raise input_error_at(data, ["node"], "node: must be a host-node topology, not a cluster")
    ncset = [(k, v, node_data, loc) for k, (v, loc) in node_cat_sets.items()]
    cat = _make_catalog([node_doc_data, data], ncset + cset, overrides)

    local = _host_node(node_doc, node_doc_data, cat, "a host node")

    b = _GraphBuilder(cat)
    assert doc.nodes is not None
    for n in range(doc.nodes):
        for d in local.devices:
            b.add_device(f"node{n}.{d.gid}", d.kind, n, d.spec, d.gid, label=d.label, chips=d.chips, origin=d.loc)
        for ln in local.links:
            b.add_link(f"node{n}.{ln.a}", f"node{n}.{ln.b}", ln.link, ln.count, ln.loc)

    # rack/cluster-level devices and links (e.g. NVSwitch trays)
    rack = _expand_local(doc, data, cat, scope="fabric")
    for d in rack.devices:
        b.add_device(f"fabric.{d.gid}", d.kind, -1, d.spec, d.gid, label=d.label, chips=d.chips, origin=d.loc)

    def resolve(x: str) -> str | None:
        if x.startswith("node") and "." in x:
            return x if x in b.g and b.g.nodes[x]["node"] >= 0 else None
        gid = x if x.startswith("fabric.") else f"fabric.{x}"
        return gid if gid in b.g else None

    for ln in _expand_links(doc, data, cat, resolve):
        b.add_link(ln.a, ln.b, ln.link, ln.count, ln.loc)

    fabric_dump = None
    if doc.fabric is not None:
        from .scaleout import generate_fabric

        generate_fabric(b, doc.fabric, doc.nodes, local, data)
        fabric_dump = doc.fabric.model_dump(exclude_none=True)
    node_name = node_doc.name or (node_path.stem if node_path is not None else None)
    return BuildResult(name, b.g, cat, doc.description, doc.source, doc.notes, node_name, fabric_dump, True)


def _resolve_node(data: LocDict, path: Path | None) -> tuple[LocDict, Path | None]:
    ref = data["node"]
    base_dir = path.parent if path is not None else None
    if isinstance(ref, dict):
        node = ref if isinstance(ref, LocDict) else loads_yaml("{}")
        if not isinstance(ref, LocDict):
            node.update(ref)
        try:
            validate(TopologyFile, node, path, prefix=["node"])
        except CosimInputError:
            raise
        return resolve_document(node, path), path
    p = resolve_ref(str(ref), base_dir)
    if p is None:
        raise input_error_at(data, ["node"], f"node {ref!r}: no such preset or file")
    if path is not None and p.resolve() == path.resolve():
        raise input_error_at(data, ["node"], "node: refers to this file itself")
    return read_document(p), p
