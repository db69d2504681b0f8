"""Read topology files: find presets, resolve ``extends`` chains, merge, apply ``set``.

The result of this module is still YAML data (:class:`LocDict`), so that the
graph builder (:mod:`cosim.topology.build`) can point errors at the line that
caused them, in whichever file of the ``extends`` chain that line is.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError
from cosim.resources import bundled_dir, data_dirs, find_data
from cosim.yamlio import LocDict, LocList, input_error_at, load_yaml, validate

from .schema import TopologyFile

__all__ = [
    "CATALOG_SECTIONS",
    "apply_topology_set",
    "list_presets",
    "preset_dirs",
    "preset_path",
    "resolve_document",
    "resolve_ref",
    "split_set",
    "with_sets",
]

CATALOG_SECTIONS = ("accelerators", "cpus", "nics", "links")


def presets_dir() -> Path:
    """The folder of the installed topology presets (see :func:`preset_dirs` for the search order)."""
    return bundled_dir("topologies")


def preset_dirs() -> list[Path]:
    """Folders searched for a preset name, in order: ``./topologies`` (when it exists), then the installed one."""
    return data_dirs("topologies")


def list_presets() -> list[str]:
    """Names of the topology presets (working directory's ``topologies/`` and the installed ones), sorted."""
    return sorted({p.stem for d in preset_dirs() for p in d.glob("*.yaml")})


def preset_path(name: str, exclude: frozenset[Path] = frozenset()) -> Path | None:
    """Path of preset ``name``: ``./topologies/<name>.yaml`` if there is one, else the installed preset; None if
    there is none. Files in ``exclude`` (resolved paths) are skipped, so that ``topologies/dgx-h100.yaml`` in the
    working directory may ``extends: dgx-h100`` (the installed one)."""
    p = find_data("topologies", f"{name}.yaml", exclude)
    return p if p is not None and p.is_file() else None


def _looks_like_path(ref: str) -> bool:
    return ref.endswith((".yaml", ".yml")) or "/" in ref or "\\" in ref


def resolve_ref(ref: str, base_dir: Path | None, exclude: frozenset[Path] = frozenset()) -> Path | None:
    """A topology reference to a file: a path (relative to ``base_dir``) or a preset name (:func:`preset_path`;
    files in ``exclude`` skipped)."""
    if _looks_like_path(ref):
        p = Path(ref).expanduser()
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return p if p.is_file() else None
    found = preset_path(ref, exclude)
    if found is None and base_dir is not None:
        cand = base_dir / f"{ref}.yaml"
        if cand.is_file() and cand.resolve() not in exclude:
            return cand
    return found


def _read(path: Path) -> LocDict:
    raw = load_yaml(path)
    if not isinstance(raw, LocDict):
        mark = getattr(raw, "mark", None) or (1, 1)
        raise CosimInputError("a topology file must be a YAML mapping (name:, devices:, links:, ...)", file=path,
                              line=mark[0], column=mark[1])
    validate(TopologyFile, raw, path)
    return raw


def _copy_locdict(d: LocDict) -> LocDict:
    out = LocDict(d)
    out.mark, out.key_marks, out.file = d.mark, dict(d.key_marks), d.file
    return out


def _merge_list(parent: Any, child: Any, key: str) -> LocList:
    """Child entries replace parent entries with the same ``key`` value; others are appended."""
    out = LocList()
    out.mark = getattr(child, "mark", None)
    out.file = getattr(child, "file", None)
    pmarks = list(getattr(parent, "item_marks", [])) or [None] * len(parent)
    cmarks = list(getattr(child, "item_marks", [])) or [None] * len(child)
    by_key = {}
    for item, m in zip(parent, pmarks):
        out.append(item)
        out.item_marks.append(m)
        k = item.get(key) if isinstance(item, dict) else None
        if k is not None:
            by_key[k] = len(out) - 1
    for item, m in zip(child, cmarks):
        k = item.get(key) if isinstance(item, dict) else None
        if k is not None and k in by_key:
            out[by_key[k]] = item
            out.item_marks[by_key[k]] = m
        else:
            out.append(item)
            out.item_marks.append(m)
    return out


def _merge_dict(parent: Any, child: Any, depth: int) -> LocDict:
    out = _copy_locdict(parent) if isinstance(parent, LocDict) else LocDict(parent)
    if isinstance(child, LocDict):
        out.file, out.mark = child.file, child.mark
    for k, v in child.items():
        if depth > 1 and k in out and isinstance(out[k], dict) and isinstance(v, dict):
            out[k] = _merge_dict(out[k], v, depth - 1)
        else:
            out[k] = v
        if isinstance(child, LocDict) and k in child.key_marks:
            out.key_marks[k] = child.key_marks[k]
    return out


def merge_documents(parent: LocDict, child: LocDict) -> LocDict:
    """``child`` over ``parent``: scalars replace, ``devices`` (by id) and ``links`` (by name)
    merge, ``set``/``fabric`` merge key by key, ``parts`` merge entry by entry."""
    out = _copy_locdict(parent)
    out.file, out.mark = child.file, child.mark
    for k, v in child.items():
        if k == "extends":
            continue
        if k == "devices" and k in out:
            out[k] = _merge_list(out[k], v, "id")
        elif k == "links" and k in out:
            out[k] = _merge_list(out[k], v, "name")
        elif k in ("set", "fabric") and isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = _merge_dict(out[k], v, 1)
        elif k == "parts" and isinstance(out.get(k), dict) and isinstance(v, dict):
            out[k] = _merge_dict(out[k], v, 2)
        else:
            out[k] = v
        mark = child.key_marks.get(k, out.key_marks.get(k))
        if mark is not None:
            out.key_marks[k] = mark
    out.pop("extends", None)
    return out


def resolve_document(data: LocDict, path: Path | None, stack: tuple[Path, ...] = ()) -> LocDict:
    """Resolve the ``extends`` chain of ``data`` (read from ``path``); return the merged document.

    Raises:
        CosimInputError: at ``extends`` when the parent does not exist or forms a cycle.
    """
    ref = data.get("extends")
    if ref is None:
        out = _copy_locdict(data)
        out.pop("extends", None)
        return out
    here = path.resolve() if path is not None else None
    chain = (*stack, here) if here is not None else stack
    base_dir = path.parent if path is not None else None
    parent_path = resolve_ref(str(ref), base_dir, frozenset(chain))
    if parent_path is None:
        hint = "a preset name (see `cosim topo list`) or a .yaml path relative to this file"
        raise input_error_at(data, ["extends"], f"extends {ref!r}: no such preset or file; give {hint}", file=path)
    if parent_path.resolve() in chain:
        names = " -> ".join(p.name for p in (*chain, parent_path.resolve()))
        raise input_error_at(data, ["extends"], f"extends cycle: {names}", file=path)
    parent = resolve_document(_read(parent_path), parent_path, chain)
    return merge_documents(parent, data)


def read_document(path: Path) -> LocDict:
    """Read, check and fully resolve the topology file at ``path``."""
    return resolve_document(_read(path), path)


def split_set(data: LocDict) -> tuple[dict[str, tuple[Any, list[str | int]]], dict[str, tuple[Any, list[str | int]]]]:
    """Split ``set`` into (catalog overrides, topology-field overrides), each key -> (value, loc)."""
    cat: dict[str, tuple[Any, list[str | int]]] = {}
    topo: dict[str, tuple[Any, list[str | int]]] = {}
    for key, value in (data.get("set") or {}).items():
        loc: list[str | int] = ["set", key]
        head = key.split(".", 1)[0]
        if head == "topology":
            topo[key[len("topology."):]] = (value, loc)
        elif head in CATALOG_SECTIONS:
            if key.count(".") < 2:
                raise input_error_at(data, loc, f"set key {key!r}: write section.id.field, e.g. links.nvlink4.bandwidth")
            cat[key] = (value, loc)
        else:
            raise input_error_at(
                data, loc,
                f"set key {key!r}: start with a catalog section ({', '.join(CATALOG_SECTIONS)}) "
                "or with 'topology.' for a field of this file",
            )
    return cat, topo


def with_sets(data: LocDict, sets: dict[str, Any]) -> LocDict:
    """``data`` with ``sets`` added at the end of its ``set:`` block (after the file's own entries).

    Keys are written as in a ``set:`` block (``topology.fabric.oversubscription``,
    ``links.nvlink4.bandwidth``); :func:`split_set` and :func:`apply_topology_set`
    then apply them exactly as if the file had them. A key the file already sets
    moves to the end with the new value.
    """
    out = _copy_locdict(data)
    own = out.get("set")
    block = _copy_locdict(own) if isinstance(own, LocDict) else LocDict(own or {})
    for key, value in sets.items():
        block.pop(key, None)
        block.key_marks.pop(key, None)
        block[key] = value
    out["set"] = block
    return out


def _select(container: Any, seg: str, data: LocDict, loc: list[str | int], key: str) -> tuple[Any, Any]:
    """Step one path segment into ``container``; lists are indexed by entry id / link name."""
    if isinstance(container, list):
        field = "id" if key.startswith("devices") or ".devices" in key else "name"
        for k, item in enumerate(container):
            if isinstance(item, dict) and str(item.get(field)) == seg:
                return container, k
        have = ", ".join(str(i.get(field)) for i in container if isinstance(i, dict) and i.get(field) is not None)
        raise input_error_at(data, loc, f"set key {key!r}: no entry with {field} {seg!r} (have: {have or 'none'})")
    if isinstance(container, dict):
        return container, seg
    raise input_error_at(data, loc, f"set key {key!r}: cannot set inside a {type(container).__name__}")


def apply_topology_set(doc: LocDict, key: str, value: Any, data: LocDict, loc: list[str | int]) -> LocDict:
    """Apply one ``set: {topology.<path>: value}`` to ``doc``; return the new document.

    ``<path>`` walks mappings by key and the ``devices`` / ``links`` lists by
    entry ``id`` / link ``name``, e.g. ``links.gpu-pcie.type``.
    """
    doc = copy.deepcopy(doc)
    segs = key.split(".")
    if not key or any(not s for s in segs):
        raise input_error_at(data, loc, f"set key 'topology.{key}': empty path segment")
    node: Any = doc
    for depth, seg in enumerate(segs):
        holder, idx = _select(node, seg, data, loc, ".".join(segs[: depth + 1]))
        if depth == len(segs) - 1:
            mark = _mark_of(data, loc)
            if isinstance(holder, LocDict) and mark is not None:
                holder.key_marks[idx] = mark
            holder[idx] = _tag(value, data, loc)
        else:
            if isinstance(holder, dict) and idx not in holder:
                holder[idx] = LocDict()
            node = holder[idx]
    return doc


class SetStr(str):
    """A string put into a document by ``set:``; ``origin`` is (document, field path) of the set entry."""

    origin: tuple[LocDict, list[str | int]]


class SetInt(int):
    """An integer put into a document by ``set:`` (see :class:`SetStr`)."""

    origin: tuple[LocDict, list[str | int]]


def _tag(value: Any, data: LocDict, loc: list[str | int]) -> Any:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        return value
    out: Any = SetStr(value) if isinstance(value, str) else SetInt(value)
    out.origin = (data, loc)
    return out


def set_origin(data: Any, loc: list[str | int]) -> tuple[LocDict, list[str | int]] | None:
    """If the field at ``loc`` in ``data`` was written by a ``set:`` entry, where that entry is."""
    node = data
    for part in loc:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return None
        origin = getattr(node, "origin", None)
        if origin is not None:
            return origin
    return None


def _mark_of(data: LocDict, loc: list[str | int]) -> tuple[int, int] | None:
    from cosim.yamlio import locate

    return locate(data, loc)[1]
