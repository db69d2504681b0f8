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
    "format_path",
    "input_error_at",
    "load_yaml",
    "loads_yaml",
    "locate",
    "validate",
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


def _describe(err: Mapping[str, Any]) -> tuple[list[str | int], str]:
    loc = [p for p in err.get("loc", ())
           if not (isinstance(p, str) and ("function-" in p or p.startswith("tagged-union") or p == "[key]"))]
    etype = err.get("type", "")
    msg = err.get("msg", "invalid value")
    if etype == "extra_forbidden":
        return loc, f"unknown key {loc[-1]!r}" if loc else "unknown key"
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


M = TypeVar("M", bound=BaseModel)


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
            loc, msg = _describe(e)
            f, mark = locate(data, loc)
            if e.get("type") == "missing":
                f, mark = locate(data, loc[:-1])
            located.append((mark or (10**9, 0), loc, msg, f))
        located.sort(key=lambda t: t[0])
        mark, loc, msg, f = located[0]
        line, col = (mark if mark[0] != 10**9 else (None, None))
        raise CosimInputError(msg, file=f or file, line=line, column=col,
                              path=format_path([*prefix, *loc])) from None
