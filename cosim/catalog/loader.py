"""Load, derive, override and look up hardware catalog entries.

A catalog is four sections of entries keyed by id: ``accelerators``, ``cpus``,
``nics`` and ``links`` (see :mod:`cosim.catalog.models` for what each entry
models and in what units). The bundled data lives in ``cosim/catalog/data``,
one file per section, each a mapping ``id -> entry``. User catalog files and
topology files give the same sections as top-level keys.

An entry may say ``extends: <id>`` to start from another entry of the same
section: mappings are merged key by key (``peak_flops``, ``scale_up``,
``pcie``, ``sources``), other values replace the base's, and ``null`` removes
an inherited key so that its default applies. A derived entry without its own
``source`` keeps the base's and records, per changed field, where the new value
was set.

Every problem is a one-line :class:`~cosim.errors.CosimInputError` naming the
file, line, column and field path.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel

from cosim.catalog.models import CPU, NIC, Accelerator, LinkType, Sourced
from cosim.errors import CosimInputError
from cosim.yamlio import LocDict, LocList, format_path, input_error_at, load_yaml, plain, validate

__all__ = ["DATA_DIR", "SECTIONS", "Catalog", "load_catalog"]

DATA_DIR = Path(__file__).resolve().parent / "data"
"""Folder of the bundled catalog: ``<section>.yaml`` for each section."""

SECTIONS: Mapping[str, tuple[type[Sourced], str]] = MappingProxyType(
    {
        "accelerators": (Accelerator, "accelerator"),
        "cpus": (CPU, "cpu"),
        "nics": (NIC, "nic"),
        "links": (LinkType, "link"),
    }
)
"""Section name -> (entry model, singular noun used in messages)."""

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_+-]*$")
# Keys that are alternatives to each other: giving one drops the inherited other.
_EXCLUSIVE = {"bandwidth": "bidirectional", "bidirectional": "bandwidth"}
# Fields that describe an entry rather than model hardware: no per-field source.
_PROVENANCE = frozenset({"name", "source", "sources", "notes", "extends", "hypothetical"})


@dataclass(frozen=True)
class _Raw:
    """One entry as written: its YAML mapping and the file it came from."""

    data: Any
    file: str | None


_RawSections = dict[str, dict[str, _Raw]]


# --------------------------------------------------------------------------- trees


def _copy(node: Any) -> Any:
    """Deep copy of a YAML tree that keeps LocDict / LocList locations."""
    if isinstance(node, LocDict):
        out = LocDict((k, _copy(v)) for k, v in node.items())
        out.mark, out.file, out.key_marks = node.mark, node.file, dict(node.key_marks)
        return out
    if isinstance(node, LocList):
        out_l = LocList(_copy(v) for v in node)
        out_l.mark, out_l.file, out_l.item_marks = node.mark, node.file, list(node.item_marks)
        return out_l
    if isinstance(node, dict):
        return {k: _copy(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_copy(v) for v in node]
    return node


def _as_locdict(node: dict, file: str | None) -> LocDict:
    if isinstance(node, LocDict):
        return node
    out = LocDict(node)
    out.file = file
    return out


def _merge(base: Any, child: Any, here: tuple[int, int] | None) -> Any:
    """``child`` laid over ``base``: mappings merge key by key, None deletes.

    Inherited scalar keys get the mark ``here`` (the child's ``extends``
    line), so that an error on them points into the child's file.
    """
    if not (isinstance(base, dict) and isinstance(child, dict)):
        return _copy(child)
    out = LocDict()
    frame = child if isinstance(child, LocDict) else base
    out.mark, out.file = getattr(frame, "mark", None), getattr(frame, "file", None)
    dropped = {_EXCLUSIVE[k] for k in child if k in _EXCLUSIVE}
    for k, v in base.items():
        if k in child or k in dropped:
            continue
        out[k] = _copy(v)
        mark = getattr(base, "key_marks", {}).get(k) if isinstance(v, dict | list) else here
        if mark is not None:
            out.key_marks[k] = mark
    for k, v in child.items():
        if v is None:
            out.pop(k, None)
            out.key_marks.pop(k, None)
            continue
        out[k] = _merge(base[k], v, here) if isinstance(base.get(k), dict) else _copy(v)
        mark = getattr(child, "key_marks", {}).get(k)
        if mark is not None:
            out.key_marks[k] = mark
    return out


def _with_path(err: CosimInputError, path: str) -> CosimInputError:
    """``err`` reported at field path ``path`` (same file and place)."""
    loc = err.location
    return CosimInputError(err.message, file=loc.file, line=loc.line, column=loc.column, path=path)


def _suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=3, cutoff=0.5)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


def _unknown(noun: str, key: str, choices: Iterable[str]) -> str:
    known = sorted(choices)
    return f"unknown {noun} {key!r}{_suggest(key, known)}; known: {', '.join(known)}"


# --------------------------------------------------------------------------- reading


def _read_section(section: str, entries: Any, doc: Any, loc: list[str | int], file: str | None) -> dict[str, _Raw]:
    """Check one section mapping (``id -> entry``) and wrap its entries."""
    if not isinstance(entries, dict):
        raise input_error_at(doc, loc, f"expected a mapping of {SECTIONS[section][1]} id -> entry, "
                             f"got {type(entries).__name__}", file)
    out: dict[str, _Raw] = {}
    for key, entry in entries.items():
        if not isinstance(key, str) or not _ID.match(key):
            raise input_error_at(doc, [*loc, key], f"id {key!r} must be letters, digits, '-', '_' or '+' "
                                 "(no dots or spaces)", file)
        if not isinstance(entry, dict):
            raise input_error_at(doc, [*loc, key], f"expected a mapping of fields, got {type(entry).__name__}", file)
        out[key] = _Raw(_as_locdict(entry, file), file)
    return out


def _read_document(doc: Any, file: str | None) -> _RawSections:
    """Sections of a user catalog document (top-level keys are section names)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise CosimInputError(f"a catalog file is a mapping with keys {', '.join(SECTIONS)}; "
                              f"got {type(doc).__name__}", file=file, line=1, column=1)
    out: _RawSections = {}
    for section, entries in doc.items():
        if section not in SECTIONS:
            raise input_error_at(doc, [section], _unknown("catalog section", str(section), SECTIONS), file)
        if entries is not None:
            out[section] = _read_section(section, entries, doc, [section], file)
    return out


def _add(into: _RawSections, new: _RawSections) -> None:
    """Add ``new`` entries; redefining an id with different content is an error."""
    for section, entries in new.items():
        have = into.setdefault(section, {})
        for key, raw in entries.items():
            old = have.get(key)
            if old is not None and plain(old.data) != plain(raw.data):
                where = old.file or "an earlier mapping"
                mark = getattr(old.data, "mark", None)
                if mark and old.file:
                    where += f":{mark[0]}"
                err = input_error_at(raw.data, [], f"{SECTIONS[section][1]} {key!r} is already defined "
                                     f"(in {where}); pick a new id and write `extends: {key}`, or change "
                                     "fields with overrides", raw.file)
                raise _with_path(err, f"{section}.{key}")
            have[key] = raw


# --------------------------------------------------------------------------- building


def _resolve_section(section: str, raws: Mapping[str, _Raw]) -> dict[str, Any]:
    """Apply ``extends`` chains; return the merged mapping of every entry."""
    noun = SECTIONS[section][1]
    done: dict[str, Any] = {}

    def resolve(key: str, chain: list[str]) -> Any:
        if key in done:
            return done[key]
        raw = raws[key]
        data = raw.data
        if "extends" not in data:
            done[key] = data
            return data
        target = data["extends"]
        loc: list[str | int] = [section, key, "extends"]
        if not isinstance(target, str):
            raise _at(data, ["extends"], loc, f"extends must name another {noun}'s id, got {target!r}", raw.file)
        if target == key or target in chain:
            loop = chain[chain.index(target):] if target in chain else []
            cycle = " -> ".join([*loop, key, target])
            raise _at(data, ["extends"], loc, f"extends cycle: {cycle}", raw.file)
        if target not in raws:
            raise _at(data, ["extends"], loc, _unknown(noun, target, raws), raw.file)
        base = resolve(target, [*chain, key])
        here = data.key_marks.get("extends")
        child = _copy(data)
        del child["extends"]
        child.key_marks.pop("extends", None)
        merged = _merge(base, child, here)
        if "name" not in child:
            merged["name"] = key
        merged["sources"] = _derived_sources(base, child, data, raw.file)
        done[key] = merged
        return merged

    for key in raws:
        resolve(key, [])
    return done


def _derived_sources(base: Any, child: Any, data: LocDict, file: str | None) -> Any:
    """Per-field sources of a derived entry.

    The base's notes for fields the child changes no longer apply and are
    dropped. If the child gives no ``source`` of its own, each changed field
    is recorded as "set in file:line"; the child's own ``sources`` win.
    """
    changed: list[tuple[str, str]] = []  # (field path, top-level key)
    for k, v in child.items():
        if k in _PROVENANCE:
            continue
        name = "bandwidth" if k == "bidirectional" else k  # the field it sets (halved, per direction)
        subs = [f"{name}.{sub}" for sub in v] if isinstance(v, dict) and isinstance(base.get(k), dict) else [name]
        changed += [(path, k) for path in subs]
    paths = {p for p, _ in changed}
    replaced = {p for p, k in changed if p in (k, "bandwidth")}
    base_sources = base.get("sources") or {}
    child_sources = child.get("sources") or {}
    if not isinstance(base_sources, dict) or not isinstance(child_sources, dict):
        return child_sources  # malformed: let validation report it
    out = {
        name: text
        for name, text in base_sources.items()
        if name not in paths and name.split(".")[0] not in replaced
    }
    if "source" not in child:
        for path, k in changed:
            line = data.key_marks.get(k)
            out[path] = f"set in {file}:{line[0]}" if line and file else f"set by {file or 'a user mapping'}"
    out.update(child_sources)
    return out


def _at(data: Any, loc: list[str | int], path: list[str | int], message: str, file: str | None) -> CosimInputError:
    """An error at ``loc`` inside ``data``, reported with the full ``path``."""
    return _with_path(input_error_at(data, loc, message, file), format_path(path))


def _build(raw: _RawSections) -> dict[str, dict[str, Any]]:
    """Resolve, validate and cross-check every section; return models by id."""
    models: dict[str, dict[str, Any]] = {}
    merged_all: dict[str, dict[str, Any]] = {}
    for section, (model, _noun) in SECTIONS.items():
        raws = raw.get(section, {})
        merged = _resolve_section(section, raws)
        merged_all[section] = merged
        out: dict[str, BaseModel] = {}
        for key, data in merged.items():
            out[key] = validate(model, _copy(data), raws[key].file, prefix=(section, key))
        models[section] = out
    _check_references(models, merged_all, raw)
    return models


def _check_references(models: dict[str, dict[str, Any]], merged: dict[str, dict[str, Any]], raw: _RawSections) -> None:
    """Every link id named by an entry exists, and so does its PCIe link type."""
    links = models["links"]

    def need(section: str, key: str, loc: list[str | int], link: str) -> None:
        if link not in links:
            raise _at(merged[section][key], loc, [section, key, *loc], _unknown("link", link, links),
                      raw[section][key].file)

    for section in ("accelerators", "cpus", "nics"):
        for key, entry in models[section].items():
            if section == "accelerators":
                if entry.scale_up is not None:
                    need(section, key, ["scale_up", "link"], entry.scale_up.link)
                if entry.host_link is not None:
                    need(section, key, ["host_link"], entry.host_link)
            if section == "nics":
                need(section, key, ["link"], entry.link)
            need(section, key, ["pcie", "generation"], entry.pcie.link)


# --------------------------------------------------------------------------- catalog


def _set_path(data: LocDict, fields: list[str], value: Any) -> None:
    """Set (or, for None, delete) ``fields`` inside ``data``, creating mappings.

    In an entry that extends another, None is kept: the merge then drops the
    inherited value too, so the field's default applies.
    """
    keep_none = "extends" in data
    node: Any = data
    for i, f in enumerate(fields[:-1]):
        nxt = node.get(f)
        if nxt is None:
            nxt = LocDict()
            nxt.file = getattr(node, "file", None)
            node[f] = nxt
        elif not isinstance(nxt, dict):
            raise ValueError(f"{'.'.join(fields[: i + 1])} is {nxt!r}, not a mapping with subkeys")
        node = nxt
    last = fields[-1]
    if value is None and not keep_none:
        node.pop(last, None)
        return
    other = _EXCLUSIVE.get(last)
    if other is not None:
        node.pop(other, None)
    node[last] = _copy(value)
    if hasattr(node, "key_marks"):
        node.key_marks.pop(last, None)


@dataclass(frozen=True, eq=False)
class Catalog:
    """The hardware parts cosim knows, by section and id. Immutable.

    ``accelerators``, ``cpus``, ``nics`` and ``links`` are read-only mappings
    ``id -> model`` (:class:`Accelerator`, :class:`CPU`, :class:`NIC`,
    :class:`LinkType`); every number in them is an SI float. Changing the
    catalog (:meth:`with_overrides`, :meth:`with_entries`, :meth:`with_files`)
    returns a new one and leaves this one as it was.
    """

    accelerators: Mapping[str, Accelerator]
    cpus: Mapping[str, CPU]
    nics: Mapping[str, NIC]
    links: Mapping[str, LinkType]
    _raw: Mapping[str, Mapping[str, _Raw]] = field(repr=False)

    @classmethod
    def _from_raw(cls, raw: _RawSections) -> Catalog:
        models = _build(raw)
        frozen_raw = MappingProxyType({s: MappingProxyType(dict(raw.get(s, {}))) for s in SECTIONS})
        return cls(**{s: MappingProxyType(models[s]) for s in SECTIONS}, _raw=frozen_raw)

    def _raw_copy(self) -> _RawSections:
        return {s: dict(entries) for s, entries in self._raw.items()}

    # ---------------------------------------------------------------- lookup

    def section(self, name: str) -> Mapping[str, Any]:
        """The mapping ``id -> model`` of section ``name`` (e.g. "links")."""
        if name not in SECTIONS:
            raise CosimInputError(_unknown("catalog section", name, SECTIONS))
        return getattr(self, name)

    def lookup(self, section: str, key: str) -> Any:
        """Entry ``key`` of ``section``; unknown ids raise a CosimInputError
        that lists the known ids and suggests close matches."""
        entries = self.section(section)
        try:
            return entries[key]
        except (KeyError, TypeError):
            raise CosimInputError(_unknown(SECTIONS[section][1], str(key), entries)) from None

    def accelerator(self, key: str) -> Accelerator:
        """Accelerator ``key``, e.g. "h100-sxm5"."""
        return self.lookup("accelerators", key)

    def lineage(self, section: str, key: str) -> list[str]:
        """``key`` and the entries it ``extends``, nearest first (``["gb300", "b300", "b200"]``)."""
        raws = self._raw.get(section, {})
        out = [key]
        while (parent := getattr(raws.get(out[-1]), "data", {}).get("extends")) and parent not in out:
            out.append(str(parent))
        return out

    def cpu(self, key: str) -> CPU:
        """Host CPU ``key``, e.g. "xeon-8480c"."""
        return self.lookup("cpus", key)

    def nic(self, key: str) -> NIC:
        """Network adapter ``key``, e.g. "cx7-ndr400"."""
        return self.lookup("nics", key)

    def link(self, key: str) -> LinkType:
        """Link type ``key``, e.g. "nvlink4" or "pcie5x16"."""
        return self.lookup("links", key)

    def origin(self, section: str, key: str) -> str:
        """Where entry ``key`` was defined, as ``file:line`` (for messages)."""
        self.lookup(section, key)
        raw = self._raw[section][key]
        mark = getattr(raw.data, "mark", None)
        return f"{raw.file}:{mark[0]}" if raw.file and mark else (raw.file or "<mapping>")

    # ---------------------------------------------------------------- changes

    def with_overrides(self, overrides: Mapping[str, Any]) -> Catalog:
        """A new catalog with single fields changed.

        Keys are dotted paths ``section.id.field[.subkey...]``, e.g.
        ``"links.nvlink4.bandwidth"`` or ``"accelerators.h100-sxm5.peak_flops.bf16"``;
        values are written as in YAML (unit strings such as "50 GB/s"; None
        removes the field, inherited value included, so its default applies).
        An override changes the entry as written, so entries that ``extends``
        it see the change too.
        Each result is validated again; a bad path or value raises a
        CosimInputError naming the path (located in ``overrides`` when it is a
        mapping loaded with :func:`cosim.yamlio.load_yaml`).
        """
        if not isinstance(overrides, Mapping):
            raise CosimInputError(f"overrides must be a mapping of path -> value, got {type(overrides).__name__}")
        raw = self._raw_copy()
        given = {str(p) for p in overrides}
        for path in sorted(given):
            head, _, last = path.rpartition(".")
            if last == "bidirectional" and f"{head}.bandwidth" in given:
                raise self._override_error(overrides, path, CosimInputError(
                    f"give either {head}.bandwidth (per direction) or {head}.bidirectional, not both"))
        for path, value in overrides.items():
            try:
                raw = self._apply_override(raw, str(path), value)
            except CosimInputError as exc:
                raise self._override_error(overrides, str(path), exc) from None
        return Catalog._from_raw(raw)

    def _apply_override(self, raw: _RawSections, path: str, value: Any) -> _RawSections:
        parts = path.split(".")
        if len(parts) < 3 or not all(parts):
            raise CosimInputError("override path must be section.id.field[.subkey], "
                                  "e.g. links.nvlink4.bandwidth")
        section, key, *fields = parts
        if section not in SECTIONS:
            raise CosimInputError(_unknown("catalog section", section, SECTIONS))
        model, noun = SECTIONS[section]
        if key not in raw[section]:
            raise CosimInputError(_unknown(noun, key, raw[section]))
        allowed = set(model.model_fields) | {"extends"} | ({"bidirectional"} if model is LinkType else set())
        if fields[0] not in allowed:
            raise CosimInputError(_unknown(f"{noun} field", fields[0], sorted(allowed)))
        old = raw[section][key]
        data = _copy(old.data)
        try:
            _set_path(data, fields, value)
        except ValueError as exc:
            raise CosimInputError(str(exc)) from None
        if fields[0] not in _PROVENANCE and isinstance(data.get("sources", {}), dict):
            srcs = _as_locdict(data.get("sources") or {}, old.file)
            field_path = ".".join("bandwidth" if f == "bidirectional" and i == 0 else f for i, f in enumerate(fields))
            srcs[field_path] = "override (Catalog.with_overrides)"
            data["sources"] = srcs
        new = {s: dict(e) for s, e in raw.items()}
        new[section][key] = _Raw(data, old.file)
        _build(new)
        return new

    @staticmethod
    def _override_error(overrides: Mapping[str, Any], path: str, exc: CosimInputError) -> CosimInputError:
        message = exc.message
        inner = exc.location.path
        if inner and inner != path:
            message = f"{message} (at {inner})"
        if isinstance(overrides, LocDict):
            return _with_path(input_error_at(overrides, [path], message), path)
        return CosimInputError(message, path=path)

    def with_entries(self, entries: Mapping[str, Any], file: str | Path | None = None) -> Catalog:
        """A new catalog with entries added from a mapping laid out like a
        catalog file: ``{"accelerators": {"my-chip": {"extends": "h100-sxm5", ...}}}``.

        ``file`` names where the mapping came from, for messages (a mapping
        from :func:`cosim.yamlio.load_yaml` already knows). Redefining an
        existing id with different content is an error.
        """
        fname = str(file) if file is not None else getattr(entries, "file", None)
        raw = self._raw_copy()
        _add(raw, _read_document(entries, fname))
        return Catalog._from_raw(raw)

    def with_files(self, paths: Iterable[str | Path]) -> Catalog:
        """A new catalog with the entries of user catalog files added, in order."""
        raw = self._raw_copy()
        for p in paths:
            _add(raw, _read_document(load_yaml(p), str(p)))
        return Catalog._from_raw(raw)


# --------------------------------------------------------------------------- loading


@functools.lru_cache(maxsize=1)
def _bundled() -> Catalog:
    raw: _RawSections = {}
    for section in SECTIONS:
        path = DATA_DIR / f"{section}.yaml"
        doc = load_yaml(path)
        raw[section] = _read_section(section, doc if doc is not None else {}, doc, [], str(path))
    return Catalog._from_raw(raw)


def load_catalog(extra: Iterable[str | Path] | None = None) -> Catalog:
    """The bundled catalog, plus the entries of ``extra`` user catalog files.

    The bundled catalog is read once per process and shared (it is
    immutable); ``extra`` files are read on every call.
    """
    cat = _bundled()
    extra = list(extra or [])
    return cat.with_files(extra) if extra else cat
