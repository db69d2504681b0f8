"""Where bundled data lives: presets and workloads, installed or in a checkout.

A wheel carries ``topologies/`` and ``workloads/`` inside the package as
``cosim/_bundled/``; a source checkout (or an editable install) has them at
the repository root. Both are searched, in that order.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["bundled_dir", "shared_dir"]

_PKG = Path(__file__).resolve().parent


def bundled_dir(name: str) -> Path:
    """Directory of bundled data ``name`` ("topologies" or "workloads")."""
    for candidate in (_PKG / "_bundled" / name, _PKG.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled data folder {name!r} not found (looked in {_PKG / '_bundled'} and {_PKG.parent})")


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
