"""Errors that cosim reports to users as one line, with exit status 2.

Every problem with user input (YAML, traces, CLI values) is raised as
:class:`CosimInputError`. Input that is usable but suspicious (a field dropped from
some events, GPU ops outside every profiler step) is reported with
:func:`warn_input`: one ``cosim: warning: ...`` line on stderr (through the
``cosim`` logger), and the run's summary ``notes`` repeat it. The CLI prints ``str(err)`` on one line and exits 2,
without a traceback. The message names the file, the place in it and the
problem, e.g. ``topologies/x.yaml:12:5: links[3].bandwidth: bare number 450
needs a unit, e.g. "450 GB/s"``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Location:
    """A place in an input file: 1-based line and column, and a field path."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    path: str | None = None

    def prefix(self) -> str:
        parts: list[str] = []
        if self.file:
            where = str(self.file)
            if self.line is not None:
                where += f":{self.line}"
                if self.column is not None:
                    where += f":{self.column}"
            parts.append(where)
        if self.path:
            parts.append(self.path)
        return ": ".join(parts)


class CosimError(Exception):
    """Base class of every error cosim raises on purpose."""


class CosimInputError(CosimError):
    """Bad user input: printed as one line, exit status 2.

    Args:
        message: what is wrong, in words.
        file: the input file, if any.
        line, column: 1-based position in ``file``.
        path: the field path inside the document, e.g. ``links[3].bandwidth``.
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | Path | None = None,
        line: int | None = None,
        column: int | None = None,
        path: str | None = None,
    ) -> None:
        self.message = message
        self.location = Location(
            str(file) if file is not None else None, line, column, path or None
        )
        super().__init__(str(self))

    def __str__(self) -> str:
        prefix = self.location.prefix()
        text = f"{prefix}: {self.message}" if prefix else self.message
        return " ".join(text.split("\n"))

    def with_file(self, file: str | Path) -> CosimInputError:
        """Return a copy that names ``file`` if this error names none."""
        if self.location.file:
            return self
        loc = self.location
        return CosimInputError(
            self.message, file=file, line=loc.line, column=loc.column, path=loc.path
        )


#: Logger of input warnings; with no logging configured, Python prints each message as one line on stderr.
LOG = logging.getLogger("cosim")


def warn_input(message: str) -> None:
    """Report usable but suspicious input as one line, ``cosim: warning: <message>`` (through :data:`LOG`)."""
    LOG.warning("cosim: warning: %s", " ".join(message.split("\n")))
