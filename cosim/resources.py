"""Where bundled data lives: presets and workloads, installed or in a checkout.

A wheel carries ``topologies/`` and ``workloads/`` inside the package as
``cosim/_bundled/``; a source checkout (or an editable install) has them at
the repository root. Both are searched, in that order (:func:`bundled_dir`).

Data given by NAME (a topology preset, a scenario, a workload) is looked up in
the working directory's ``topologies/`` or ``workloads/`` first, when that
folder exists, then in the installed copy (:func:`data_dirs`,
:func:`find_data`): editing ``topologies/dgx-h100.yaml`` in a checkout takes
effect even after ``pip install .``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["bundled_dir", "data_dirs", "find_data", "shared_dir"]

_PKG = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """Directory of bundled data ``name`` ("topologies" or "workloads")."""
    for candidate in (_PKG / "_bundled" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} not found (looked in {_PKG / '_bundled'} and {_PKG.parent})")


def data_dirs(name: str) -> list[Path]:
    """Folders searched for data ``name`` ("topologies" or "workloads") given by name, in order: the working
    directory's ``./<name>`` when it exists, then the installed copy (:func:`bundled_dir`), each once."""
    out: list[Path] = []
    local = Path.cwd() / name
    if local.is_dir():
        out.append(local)
    try:
        installed = bundled_dir(name)
    except FileNotFoundError:
        installed = None
    if installed is not None and not any(d.resolve() == installed.resolve() for d in out):
        out.append(installed)
    return out


def find_data(name: str, relative: str | Path, exclude: frozenset[Path] = frozenset()) -> Path | None:
    """The first ``<dir>/<relative>`` that exists, over :func:`data_dirs` (``name``); None when there is none.

    Files in ``exclude`` (resolved paths) are passed over for a later one; when every match is excluded, the
    first is returned all the same (so that a file that names itself is reported as a cycle, not as missing).
    """
    found = [d / relative for d in data_dirs(name) if (d / relative).exists()]
    return next((p for p in found if p.resolve() not in exclude), found[0] if found else None)


def shared_dir() -> Path | None:
    """The project's ``../shared`` data folder (real traces, measurements), if present.

    ``COSIM_SHARED`` overrides the location.
    """
    import os

    env = os.environ.get("COSIM_SHARED")
    candidates = [Path(env)] if env else []
    candidates += [_PKG.parent.parent / "shared", Path.cwd().parent / "shared", Path.cwd() / "../shared"]
    for c in candidates:
        if (c / "traces").is_dir():
            return c.resolve()
    return None


def shared_traces(hint: str) -> Path | None:
    """``../shared/traces`` (:func:`shared_dir`), or None after one line on stderr saying it was not found and
    ``hint`` (what to pass instead): the default input of the benchmark and validation scripts."""
    import sys

    sd = shared_dir()
    if sd is None:
        print(f"../shared/traces not found; {hint}", file=sys.stderr)
        return None
    return sd / "traces"
