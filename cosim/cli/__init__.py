"""The ``cosim`` command line: a thin layer over the Python API.

Each subcommand lives in its own module with ``register(subparsers)``; the
handler returns an exit status. Bad input (:class:`CosimInputError`) prints
one line on stderr and exits 2, with no traceback.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from cosim.errors import CosimInputError

__all__ = ["add_json_flag", "emit_json", "main"]

# Modules under cosim.cli that define register(subparsers). A module that is
# not there yet is skipped, so layers can land one by one.
_COMMANDS = ("topo", "collective", "replay", "run", "capture", "calibrate", "report", "sensitivity", "sweep", "export")


def emit_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (sorted keys, so output is deterministic)."""
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, allow_nan=False)
    sys.stdout.write("\n")


def add_json_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, exit 2, like every input error
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def _wanted(argv: Sequence[str] | None) -> tuple[str, ...]:
    """The subcommand modules to import: only the one named on the command line when it is known
    (the others' imports would only slow start-up), else all of them (``cosim --help``, a typo)."""
    args = sys.argv[1:] if argv is None else list(argv)
    first = next((a for a in args if not a.startswith("-")), None)
    return (first,) if first in _COMMANDS else _COMMANDS


def build_parser(argv: Sequence[str] | None = None, *, everything: bool = True) -> argparse.ArgumentParser:
    """The ``cosim`` parser; with ``everything=False`` only the subcommand ``argv`` names is registered."""
    from cosim import __version__

    parser = _Parser(prog="cosim", description="Hardware/software co-design simulator for AI systems.")
    parser.add_argument("--version", action="version", version=f"cosim {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in _COMMANDS if everything else _wanted(argv):
        try:
            mod = importlib.import_module(f"cosim.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"cosim.cli.{name}":
                continue
            raise
        mod.register(sub)
    return parser


GC_THRESHOLDS = (100_000, 50, 100)
"""The cyclic garbage collector's thresholds for a command (Python's default 700, 10, 10): a run holds millions of
long-lived objects (graph rows, topology, fabric state, results) that every full collection walks again; collecting
young objects every 100k allocations and old ones ~100x less often keeps the collector's share small (the 1024-GPU
``cosim run``: benchmarks/README.md, "Round 6 pipeline"). Reference counting frees everything acyclic either way."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser(argv, everything=False)
    args = parser.parse_args(argv)
    before = gc.get_threshold()
    gc.set_threshold(*GC_THRESHOLDS)
    try:
        return int(args.func(args) or 0)
    except CosimInputError as exc:
        sys.stderr.write(f"cosim: error: {exc}\n")
        return 2
    except KeyboardInterrupt:
        sys.stderr.write("cosim: interrupted\n")
        return 130
    except BrokenPipeError:
        return 0
    finally:
        gc.set_threshold(*before)  # a caller of main() in its own process keeps its settings


def run() -> NoReturn:
    """The ``cosim`` command (``python -m cosim`` and the ``cosim`` script): :func:`main`, then a fast exit.

    Once the command has returned, its files are closed and its output written; what is left for the
    interpreter's normal exit is tearing down every module and object of the process (numpy, networkx,
    pydantic, and a large run's graph, fabric and results): about 0.05 CPU s for a small collective, more
    for a large run. So stdout and stderr are flushed, the exit handlers run (``atexit``: logging,
    ``weakref.finalize``, multiprocessing, temporary folders), and the process ends with ``os._exit``. If
    another thread or a worker process is still alive (joining them is part of the normal exit; a process
    pool not shut down still has its manager thread and workers) or flushing fails (a closed pipe), the
    normal exit takes over."""
    import atexit
    import os
    import threading

    rc = main()
    mp = sys.modules.get("multiprocessing")
    if threading.active_count() > 1 or (mp is not None and mp.active_children()):
        raise SystemExit(rc)  # threads to join or worker processes to wait for: the normal exit
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(rc) from None
    atexit._run_exitfuncs()
    os._exit(rc)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
