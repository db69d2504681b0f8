"""Incremental reader for Chrome-trace JSON (Kineto / torch.profiler output).

The Kineto importer decodes a trace in one pass with msgspec (:mod:`cosim.workload.kineto`);
it uses this reader to locate a syntax error (line, column, ``traceEvents[i]``) when that
decode fails, and :func:`read_head` sniffs a file's format. It also streams events for
callers that want one event at a time in bounded memory.

A trace is one JSON object whose ``traceEvents`` member is a large array. This
reader decodes the file in 1 MiB pieces and hands out one event at a time, so
memory holds the current piece plus whatever the caller keeps — never the whole
document as Python objects. Each event (and each other top-level member) is
parsed by the C scanner of :mod:`json` via ``raw_decode``; only the structure
between events is walked in Python.

Errors (truncated or corrupt gzip, invalid JSON, wrong top-level shape) raise a
one-line :class:`~cosim.errors.CosimInputError` naming the file, the line and
column, and the JSON path (``traceEvents[123]``).
"""

from __future__ import annotations

import codecs
import json
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from cosim.errors import CosimInputError
from cosim.fileio import open_maybe_gzip

__all__ = ["ChromeTraceReader", "read_head"]

_CHUNK = 1 << 20
_WS = " \t\n\r"


def read_head(path: str | Path, nbytes: int = 65536) -> bytes:
    """The first ``nbytes`` decompressed bytes of ``path`` (for format sniffing)."""
    fh = open_maybe_gzip(path)
    try:
        return fh.read(nbytes)
    except (EOFError, OSError, zlib.error) as exc:
        raise CosimInputError(f"corrupt or truncated gzip data ({exc})", file=path) from None
    finally:
        fh.close()


class ChromeTraceReader:
    """Stream a Chrome-trace JSON document.

    Call :meth:`events` to iterate the ``traceEvents`` array; every other
    top-level member is collected into :attr:`meta` (members after the array are
    available once iteration finishes).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.meta: dict[str, Any] = {}
        self._fh: IO[bytes] | None = None
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="strict")
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._eof = False
        self._lines_before = 0  # newlines in text already dropped from the buffer

    # -- low level -------------------------------------------------------------------
    def _fail(self, message: str, pos: int | None = None, path: str | None = None) -> CosimInputError:
        line = col = None
        if pos is not None:
            line = self._lines_before + self._buf.count("\n", 0, pos) + 1
            col = pos - (self._buf.rfind("\n", 0, pos) + 1) + 1
        return CosimInputError(message, file=self.path, line=line, column=col, path=path)

    def _fill(self) -> bool:
        """Append the next piece of text to the buffer; False at end of file."""
        if self._eof:
            return False
        assert self._fh is not None
        try:
            raw = self._fh.read(_CHUNK)
        except EOFError:
            raise self._fail("truncated gzip file (compressed stream ended early)") from None
        except (OSError, zlib.error) as exc:
            raise self._fail(f"corrupt gzip data ({exc})") from None
        try:
            text = self._dec.decode(raw, final=not raw)
        except UnicodeDecodeError as exc:
            raise self._fail(f"invalid UTF-8 ({exc.reason})") from None
        if self._pos:
            self._lines_before += self._buf.count("\n", 0, self._pos)
        self._buf = self._buf[self._pos :] + text
        self._pos = 0
        if not raw:
            self._eof = True
        return bool(raw) or bool(text)

    def _peek(self) -> str:
        """Next non-whitespace character ('' at end of input); does not consume it."""
        while True:
            buf, pos, n = self._buf, self._pos, len(self._buf)
            while pos < n and buf[pos] in _WS:
                pos += 1
            self._pos = pos
            if pos < n:
                return buf[pos]
            if not self._fill():
                return ""

    def _expect(self, ch: str, path: str) -> None:
        got = self._peek()
        if got != ch:
            what = repr(got) if got else "end of file"
            raise self._fail(f"expected {ch!r}, found {what} (truncated or not a trace?)", self._pos, path)
        self._pos += 1

    def _value(self, path: str) -> Any:
        """Decode one JSON value at the cursor, reading more input as needed."""
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._fill():
                    continue
                if len(self._buf) - exc.pos <= 1 or exc.msg.startswith("Unterminated"):
                    raise self._fail(f"JSON ends early (truncated file?): {exc.msg}", exc.pos, path) from None
                raise self._fail(f"invalid JSON: {exc.msg}", exc.pos, path) from None
            # A number (or literal) that touches the end of the buffer may continue in the next piece.
            if end >= len(self._buf) and not self._eof and self._fill():
                continue
            self._pos = end
            return value

    # -- document walk -----------------------------------------------------------------
    def events(self, on_meta: Callable[[str, Any], None] | None = None) -> Iterator[dict[str, Any]]:
        """Yield each element of ``traceEvents`` in file order."""
        self._fh = open_maybe_gzip(self.path)
        try:
            yield from self._walk(on_meta)
        finally:
            self._fh.close()

    def _walk(self, on_meta: Callable[[str, Any], None] | None) -> Iterator[dict[str, Any]]:
        first = self._peek()
        if first == "":
            raise self._fail("empty file")
        if first == "[":
            # A bare JSON array of events is also a valid Chrome trace.
            yield from self._array("traceEvents", bare=True)
            return
        self._expect("{", "")
        if self._peek() == "}":
            self._pos += 1
            return
        seen_events = False
        while True:
            key = self._value("")
            if not isinstance(key, str):
                raise self._fail("expected an object key", self._pos, "")
            self._expect(":", key)
            if key == "traceEvents":
                seen_events = True
                yield from self._array(key)
            else:
                val = self._value(key)
                self.meta[key] = val
                if on_meta:
                    on_meta(key, val)
            sep = self._peek()
            if sep == ",":
                self._pos += 1
                continue
            if sep == "}":
                self._pos += 1
                break
            what = repr(sep) if sep else "end of file"
            raise self._fail(f"expected ',' or '}}' after member {key!r}, found {what}", self._pos, key)
        if not seen_events:
            raise self._fail("no 'traceEvents' array: not a Chrome/Kineto trace")
        if self._peek() != "":
            raise self._fail("unexpected data after the end of the JSON document", self._pos)

    def _array(self, key: str, bare: bool = False) -> Iterator[dict[str, Any]]:
        self._expect("[", key)
        i = 0
        if self._peek() == "]":
            self._pos += 1
            return
        while True:
            ev = self._value(f"{key}[{i}]")
            if isinstance(ev, dict):
                yield ev
            i += 1
            sep = self._peek()
            if sep == ",":
                self._pos += 1
                continue
            if sep == "]":
                self._pos += 1
                return
            what = repr(sep) if sep else "end of file (truncated?)"
            raise self._fail(f"expected ',' or ']' after event, found {what}", self._pos, f"{key}[{i}]")
