"""Strict YAML loading with source locations, and pydantic validation errors
turned into one-line ``file:line:column: field.path: problem`` messages.

What this loader does that plain ``yaml.safe_load`` does not:

* rejects duplicate mapping keys (PyYAML silently keeps the last one);
* rejects the YAML 1.1 surprises: unquoted ``yes/no/on/off/y/n`` (booleans in
  1.1, strings in 1.2) and leading-zero integers like ``010`` (octal in 1.1);
* reads ``64e9`` as the float it looks like (PyYAML reads it as a string);
* remembers where every mapping, sequence and key came from, so that an error
  found later (by pydantic or by the topology builder) can still point at the
  exact line and column.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from cosim.errors import CosimInputError

__all__ = [
    "LocDict",
    "LocList",
    "describe_validation_error",
    "format_path",
    "input_error_at",
    "load_yaml",
    "loads_yaml",
    "locate",
    "plain",
    "validate",
    "whole_number",
]

Mark = tuple[int, int]  # 1-based (line, column)


class LocDict(dict):
    """A dict that remembers where it and each of its keys were in the file."""

    __slots__ = ("file", "key_marks", "mark")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.mark: Mark | None = None
        self.key_marks: dict[Any, Mark] = {}
        self.file: str | None = None


class LocList(list):
    """A list that remembers where it and each of its items were in the file."""

    __slots__ = ("file", "item_marks", "mark")

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.mark: Mark | None = None
        self.item_marks: list[Mark] = []
        self.file: str | None = None


def _mark(node: yaml.Node) -> Mark:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


_BOOL_11 = re.compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|on|On|ON|off|Off|OFF)$")
_BOOL_12 = re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$")
_OCTAL_11 = re.compile(r"^[-+]?0[0-9_]+$")
_INT = re.compile(r"^[-+]?(?:0|[1-9][0-9_]*)$|^0x[0-9a-fA-F_]+$|^0o[0-7_]+$")
_FLOAT = re.compile(r"^[-+]?(?:\.[0-9]+|[0-9][0-9_]*(?:\.[0-9_]*)?)(?:[eE][-+]?[0-9]+)?$|^[-+]?\.(?:inf|Inf|INF)$|^\.(?:nan|NaN|NAN)$")


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader with YAML-1.2-like scalars and location-carrying containers."""

    file: str | None = None
    path: list[str | int]  # where construction is in the document, for messages


def _err(loader: _StrictLoader, node: yaml.Node, message: str, key: str | None = None) -> CosimInputError:
    line, col = _mark(node)
    path = [*loader.path, key] if key is not None else loader.path
    return CosimInputError(message, file=loader.file, line=line, column=col, path=format_path(path))


def _construct_scalar(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    value = node.value
    if node.style is not None and node.style in ("'", '"', "|", ">"):
        return value
    if node.tag not in ("tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
                        "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null", "tag:yaml.org,2002:timestamp"):
        return value
    if value in ("", "~", "null", "Null", "NULL"):
        return None
    if _BOOL_12.match(value):
        return value.lower() == "true"
    if _BOOL_11.match(value):
        raise _err(loader, node, f"{value!r} is a boolean in YAML 1.1 and a string in YAML 1.2; "
                   f"write true/false, or quote it (\"{value}\")")
    if _OCTAL_11.match(value) and value.strip("+-") != "0":
        raise _err(loader, node, f"{value!r} is octal in YAML 1.1 and decimal in YAML 1.2; "
                   f"write it without the leading zero, as 0o{value.lstrip('+-0') or '0'}, or quote it")
    if _INT.match(value):
        v = value.replace("_", "")
        if v.startswith("0x"):
            return int(v, 16)
        if v.startswith("0o"):
            return int(v[2:], 8)
        return int(v)
    if _FLOAT.match(value):
        v = value.replace("_", "")
        return float(v.replace(".inf", "inf").replace(".Inf", "inf").replace(".INF", "inf")
                     .replace(".nan", "nan").replace(".NaN", "nan").replace(".NAN", "nan"))
    return value


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> LocDict:
    out = LocDict()
    out.mark = _mark(node)
    out.file = loader.file
    loader.flatten_mapping(node)
    for key_node, value_node in node.value:
        if not isinstance(key_node, yaml.ScalarNode):
            raise _err(loader, key_node, "mapping keys must be scalars")
        key = key_node.value  # keys are names: always strings, never 1.1 booleans
        if key == "<<" and not key_node.style:  # plain (the C parser gives "", the Python one None)
            raise _err(loader, key_node, "'<<' is a merge key in YAML 1.1 and a plain key in YAML 1.2; write the "
                       "merged fields out (an alias, *name, repeats a whole value)", key)
        if key in out:
            first = out.key_marks[key]
            raise _err(loader, key_node, f"duplicate key {key!r} (first defined at line {first[0]})", key)
        loader.path.append(key)
        out[key] = loader.construct_object(value_node, deep=True)
        loader.path.pop()
        out.key_marks[key] = _mark(value_node)
    return out


def _construct_sequence(loader: _StrictLoader, node: yaml.SequenceNode) -> LocList:
    items = []
    for i, child in enumerate(node.value):
        loader.path.append(i)
        items.append(loader.construct_object(child, deep=True))
        loader.path.pop()
    out = LocList(items)
    out.mark = _mark(node)
    out.item_marks = [_mark(child) for child in node.value]
    out.file = loader.file
    return out


# Resolve every plain scalar as a string; _construct_scalar decides its type.
_StrictLoader.yaml_implicit_resolvers = {}
_StrictLoader.add_constructor("tag:yaml.org,2002:map", _construct_mapping)
_StrictLoader.add_constructor("tag:yaml.org,2002:seq", _construct_sequence)
_StrictLoader.add_constructor("tag:yaml.org,2002:str", _construct_scalar)
for _tag in ("int", "float", "bool", "null", "timestamp"):
    _StrictLoader.add_constructor(f"tag:yaml.org,2002:{_tag}", _construct_scalar)


def loads_yaml(text: str, file: str | Path | None = None) -> Any:
    """Parse YAML text strictly; containers are :class:`LocDict` / :class:`LocList`."""
    fname = str(file) if file is not None else None
    loader = None
    try:
        loader = _StrictLoader(text)
        loader.file = fname
        loader.path = []
        return loader.get_single_data()
    except CosimInputError:
        raise
    except yaml.reader.ReaderError as exc:  # a control character (NUL, ...) anywhere in the text
        pos = max(0, min(int(exc.position), len(text)))
        line = text.count("\n", 0, pos) + 1
        column = pos - (text.rfind("\n", 0, pos) + 1) + 1
        raise CosimInputError(
            f"malformed YAML: unacceptable character #x{exc.character:04x} (control characters are not allowed)"
            if isinstance(exc.character, int)
            else f"malformed YAML: {exc.reason}",
            file=fname,
            line=line,
            column=column,
        ) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or "malformed YAML"
        raise CosimInputError(
            f"malformed YAML: {problem}",
            file=fname,
            line=mark.line + 1 if mark else None,
            column=mark.column + 1 if mark else None,
        ) from None
    except yaml.YAMLError as exc:
        raise CosimInputError(f"malformed YAML: {exc}", file=fname) from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """Read and strictly parse a YAML file (see :func:`loads_yaml`)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CosimInputError("file not found", file=p) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CosimInputError(f"cannot read file: {exc}", file=p) from None
    return loads_yaml(text, p)


def format_path(loc: Sequence[str | int]) -> str:
    """``("links", 3, "bandwidth")`` -> ``"links[3].bandwidth"``."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def locate(data: Any, loc: Iterable[str | int]) -> tuple[str | None, Mark | None]:
    """Find the file and deepest known (line, column) of the field at ``loc``."""
    file = getattr(data, "file", None)
    mark: Mark | None = getattr(data, "mark", None)
    node = data
    for part in loc:
        if isinstance(node, LocDict) and part in node:
            mark = node.key_marks.get(part, mark)
            node = node[part]
        elif isinstance(node, LocList) and isinstance(part, int) and 0 <= part < len(node):
            mark = node.item_marks[part]
            node = node[part]
        else:
            break
        file = getattr(node, "file", None) or file
    return file, mark


def input_error_at(data: Any, loc: Sequence[str | int], message: str,
                   file: str | Path | None = None) -> CosimInputError:
    """Build a :class:`CosimInputError` pointing at field ``loc`` inside ``data``."""
    f, mark = locate(data, loc)
    return CosimInputError(
        message,
        file=f or file,
        line=mark[0] if mark else None,
        column=mark[1] if mark else None,
        path=format_path(loc),
    )


def _models_in(tp: Any) -> list[tuple[str | None, type[BaseModel]]]:
    """The pydantic models an annotation can hold (through Optional, unions, Annotated, lists and dicts), each with
    its discriminator tag (``Tag``) when it has one."""
    import typing

    tag: str | None = None
    if typing.get_origin(tp) is typing.Annotated:
        args = typing.get_args(tp)
        tag = next((getattr(m, "tag", None) for m in args[1:] if isinstance(getattr(m, "tag", None), str)), None)
        return [(tag or t, m) for t, m in _models_in(args[0])]
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [(None, tp)]
    out: list[tuple[str | None, type[BaseModel]]] = []
    for arg in typing.get_args(tp):
        out += _models_in(arg)
    return out


def _walk(model: type[BaseModel], loc: Sequence[str | int]) -> tuple[list[str | int], list[str] | None]:
    """Follow a pydantic error location from ``model``: (the location without the union noise, the keys the model
    at its end accepts by their YAML spelling, alias first, or None when it does not lead to one model)."""
    cands: list[tuple[str | None, type[BaseModel]]] = [(None, model)]
    clean: list[str | int] = []
    lost = False
    for part in loc:
        if isinstance(part, int) or part == "[key]" or "function-" in part:
            if isinstance(part, int):
                clean.append(part)
            continue
        if part.startswith("tagged-union"):
            cands = [c for c in cands if c[0] == part] or cands
            continue
        if clean and not lost and part in {m.__name__ for _, m in cands} | {"str", "int", "float", "bool", "list"}:
            cands = [c for c in cands if c[1].__name__ == part]  # a union's member, not a key
            lost = not cands
            continue
        clean.append(part)
        nxt: list[tuple[str | None, type[BaseModel]]] = []
        for _, m in cands:
            for name, f in m.model_fields.items():
                if part in (name, f.alias):
                    nxt += _models_in(f.annotation)
        lost = lost or not nxt
        cands = nxt
    models = {m for _, m in cands}
    if lost or len(models) != 1:
        return clean, None
    (m,) = models
    return clean, [f.alias or name for name, f in m.model_fields.items()]


def _unknown_key(key: str, valid: Sequence[str] | None) -> str:
    """``unknown key 'epp' (did you mean 'ep'?); valid: ...``: one line."""
    if not valid:
        return f"unknown key {key!r}"
    import difflib

    close = difflib.get_close_matches(key, list(valid), n=3, cutoff=0.6)
    close = [c for c in close if c[:1] == key[:1]] or close  # of equally close ones, the one that starts alike
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key {key!r}{hint}; valid: {', '.join(valid)}"


def _describe(err: Mapping[str, Any], model: type[BaseModel] | None = None) -> tuple[list[str | int], str]:
    raw_loc = list(err.get("loc", ()))
    loc = [p for p in raw_loc
           if not (isinstance(p, str) and ("function-" in p or p.startswith("tagged-union") or p == "[key]"))]
    valid = None
    etype = err.get("type", "")
    if model is not None and etype == "extra_forbidden" and raw_loc:
        loc, valid = _walk(model, raw_loc[:-1])
        loc = [*loc, raw_loc[-1]]
    elif model is not None:
        loc = _walk(model, raw_loc)[0]
    msg = err.get("msg", "invalid value")
    if etype == "extra_forbidden":
        if not loc:
            return loc, "unknown key"
        return loc, _unknown_key(str(loc[-1]), valid)
    if etype == "missing":
        return loc, f"missing required field {loc[-1]!r}" if loc else "missing field"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
    if msg.startswith("Assertion failed, "):
        msg = msg[len("Assertion failed, "):]
    # Unit errors already name their field; keep only the problem.
    field = format_path(loc)
    if field and msg.startswith(field + ": "):
        msg = msg[len(field) + 2:]
    elif loc and isinstance(loc[-1], str) and msg.startswith(f"{loc[-1]}: "):
        msg = msg[len(str(loc[-1])) + 2:]
    if etype not in ("value_error", "assertion_error") and "input_value" not in msg and "input" in err:
        inp = err["input"]
        if not isinstance(inp, (dict, list)):
            msg = f"{msg} (got {inp!r})"
    return loc, msg


def describe_validation_error(model: type[BaseModel], exc: ValidationError) -> tuple[str, str]:
    """``(field.path, problem)`` of a validation error's first error (the tagged-union noise left out; an unknown
    key named with the valid ones), for a message of one line about data that has no file."""
    errs = exc.errors(include_url=False)
    if not errs:
        return "", str(exc)
    loc, msg = _describe(min(errs, key=_type_last), model)
    return format_path(loc), msg


def _type_last(err: Mapping[str, Any]) -> int:
    """Sort key: of a union's errors, "expected a string" is the least telling (the value was meant for another
    member)."""
    return 1 if str(err.get("type", "")).endswith("_type") else 0


def plain(x: Any) -> Any:
    """``x`` (a loaded YAML tree: :class:`LocDict` / :class:`LocList`, or plain) as plain dicts and lists, without
    the location marks (for equality, or a document to rewrite)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items()}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


def whole_number(x: Any) -> int | None:
    """``x`` (a number read from a YAML or JSON file) as an int when it is a whole number: an int, or a finite float
    with no fraction (``3.0``, as a writer that keeps every number a float writes it); None for anything else (a
    fraction, inf, NaN, a bool, a string)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    return int(x) if isinstance(x, int) or (math.isfinite(x) and x.is_integer()) else None


M = TypeVar("M", bound=BaseModel)


def _leading_field(data: Any, message: str) -> list[str | int]:
    """``[key]`` when ``message`` (a model-level check's, e.g. ``top_k (200) must be <= num_experts (128)``)
    starts with a key of the mapping ``data``; else ``[]`` (the document itself)."""
    m = re.match(r"[A-Za-z_]\w*", message)
    return [m.group(0)] if m and isinstance(data, dict) and m.group(0) in data else []


def validate(model: type[M], data: Any, file: str | Path | None = None,
             prefix: Sequence[str | int] = ()) -> M:
    """Validate ``data`` against ``model``; on failure raise one located error.

    ``prefix`` is the path of ``data`` inside its document, for messages.
    """
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        # Report the first error in document order: deterministic and the
        # one a person would fix first.
        located = []
        for e in errors:
            loc, msg = _describe(e, model)
            f, mark = locate(data, loc)
            if e.get("type") == "missing":
                f, mark = locate(data, loc[:-1])
            elif not loc:  # a check of the whole model: at the field its message starts with, when it has one
                f, mark = locate(data, _leading_field(data, msg))
            located.append(((mark or (10**9, 0)), _type_last(e), loc, msg, f))
        located.sort(key=lambda t: (t[0], t[1]))
        mark, _, loc, msg, f = located[0]
        line, col = (mark if mark[0] != 10**9 else (None, None))
        raise CosimInputError(msg, file=f or file, line=line, column=col,
                              path=format_path([*prefix, *loc])) from None
