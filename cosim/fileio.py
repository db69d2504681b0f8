"""File output that never leaves a half-written file behind, and input that
reads plain or gzipped files with one-line errors."""

from __future__ import annotations

import errno
import gzip
import io
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from cosim.errors import CosimInputError

__all__ = ["atomic_open", "open_maybe_gzip", "read_summary", "write_json", "write_text"]


@contextmanager
def atomic_open(path: str | Path, mode: str = "w", gz: bool | None = None) -> Iterator[IO[Any]]:
    """Open a temporary file beside ``path``; rename it into place only on success.

    ``gz`` compresses (default: when ``path`` ends in ``.gz``).
    """
    path = Path(path)
    if path.is_dir():
        raise CosimInputError("cannot write a file here: it is a directory", file=path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        blocker = next((a for a in path.parents if a.exists() and not a.is_dir()), None)
        why = f"{blocker} is a file, not a directory" if blocker is not None else (exc.strerror or str(exc))
        raise CosimInputError(f"cannot write: {why}", file=path) from None
    gz = path.suffix == ".gz" if gz is None else gz
    try:
        with os.fdopen(fd, "wb") as raw:
            if gz:
                with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as zf:
                    if "b" in mode:
                        yield zf  # type: ignore[misc]  # a binary file; typeshed does not derive GzipFile from IO[bytes]
                    else:
                        tz = _text(zf)
                        yield tz
                        tz.flush()
                        tz.detach()
            elif "b" in mode:
                yield raw
            else:
                t = _text(raw)
                yield t
                t.flush()
                t.detach()
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and exc.errno in _FULL:
            raise CosimInputError(f"cannot write: {exc.strerror}", file=path) from None
        raise


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)
"""Write errors of the place written to (a full disk or quota, a file too large, a read-only file system): the same
one-line error as a path that cannot be written, not a traceback."""


def _text(raw: IO[bytes] | gzip.GzipFile) -> io.TextIOWrapper:
    return io.TextIOWrapper(raw, encoding="utf-8", newline="\n")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically (gzipped if ``path`` ends in .gz)."""
    with atomic_open(path, "w") as fh:
        json.dump(obj, fh, indent=indent, sort_keys=True, allow_nan=False)
        fh.write("\n")


def write_text(path: str | Path, text: str) -> None:
    """Write ``text`` atomically."""
    with atomic_open(path, "w") as fh:
        fh.write(text)


def open_maybe_gzip(path: str | Path) -> IO[bytes]:
    """Open ``path`` for binary reading, transparently un-gzipping by magic bytes."""
    p = Path(path)
    try:
        fh = open(p, "rb")
    except FileNotFoundError:
        raise CosimInputError("file not found", file=p) from None
    except OSError as exc:
        raise CosimInputError(f"cannot read file: {exc.strerror}", file=p) from None
    head = fh.read(2)
    fh.seek(0)
    if head == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")  # type: ignore[return-value]
    return fh


_SUMMARY_FIELDS: dict[str, type] = {"breakdown": dict, "config": dict, "critical_path": dict, "busiest_links": dict,
                                    "ranks": list, "notes": list}
"""Fields of a ``summary.json`` that a comparison with it reads, and the JSON type cosim writes them as."""


def read_summary(path: str | Path) -> dict[str, Any]:
    """A ``summary.json`` written by an earlier ``cosim run``, read back to compare with (``--baseline``,
    ``cosim report``): a JSON object whose ``step_time_s`` is a number of seconds >= 0 (or null) and whose
    other fields read by the comparisons have the JSON types cosim writes; anything else is one input error
    naming the file and the field (an edited or foreign file used to fail in the middle of the comparison, after
    the new run's files were written)."""
    import math

    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except OSError as exc:
        raise CosimInputError(f"cannot read: {exc.strerror}", file=p) from None
    except ValueError as exc:
        raise CosimInputError(f"not JSON: {exc}", file=p) from None
    if not isinstance(doc, dict):
        raise CosimInputError(f"expected a JSON object (a summary.json of cosim run), got {type(doc).__name__}",
                              file=p)
    st = doc.get("step_time_s")
    if st is not None and (isinstance(st, bool) or not isinstance(st, (int, float)) or not math.isfinite(st)
                           or st < 0):
        raise CosimInputError(f"expected seconds >= 0 or null, got {st!r}", file=p, path="step_time_s")
    for key, kind in _SUMMARY_FIELDS.items():
        if doc.get(key) is not None and not isinstance(doc[key], kind):
            raise CosimInputError(f"expected a JSON {'object' if kind is dict else 'array'}, got "
                                  f"{type(doc[key]).__name__}", file=p, path=key)
    bd = doc.get("breakdown") or {}
    bad = next((k for k, v in bd.items() if isinstance(v, bool) or not isinstance(v, (int, float))), None)
    if bad is not None:
        raise CosimInputError(f"expected seconds, got {bd[bad]!r}", file=p, path=f"breakdown.{bad}")
    return doc
