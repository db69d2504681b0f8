"""The load cache: execution graphs of traces already imported, as ``.npz`` files keyed by content.

:func:`cosim.workload.load_trace` looks here before parsing a trace. The key is a SHA-256 of
the bytes of every input file (with its resolved path, so ``source["file"]`` stays true),
the ``time_unit`` override, the execution-graph schema version and the source code of the
importer modules (a changed importer never reads an older importer's graph). An entry is an
uncompressed ``.npz`` written atomically by :meth:`ExecutionGraph.to_npz`; one that cannot be
read (corrupt, truncated, another schema) is ignored, removed and rebuilt. The newest
:data:`MAX_ENTRIES` entries are kept.

Where: ``$COSIM_CACHE_DIR`` if set, else ``$XDG_CACHE_HOME/cosim``, else ``~/.cache/cosim``;
``COSIM_CACHE_DIR=off`` (or ``none``, ``0``, empty) turns the cache off. A folder that cannot be
written is skipped silently: caching only ever saves time.
"""

from __future__ import annotations

import hashlib
import os
from functools import cache
from pathlib import Path

from cosim.workload.graph import SCHEMA_VERSION, ExecutionGraph

__all__ = ["cache_dir", "cache_key", "load_cached", "store"]

#: Entries kept in the cache folder; older ones are removed when a new one is written.
MAX_ENTRIES = 256
_OFF = {"", "0", "off", "none", "false", "no"}
_IMPORTER_MODULES = (
    "cache.py",
    "classify.py",
    "cost.py",
    "deps.py",
    "et.py",
    "graph.py",
    "jsonstream.py",
    "kineto.py",
    "kineto_collectives.py",
    "kineto_common.py",
    "kineto_tables.py",
    "load.py",
)


def cache_dir() -> Path | None:
    """The cache folder (see the module docstring), or None when the cache is off."""
    env = os.environ.get("COSIM_CACHE_DIR")
    if env is not None:
        return None if env.strip().lower() in _OFF else Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "cosim"


@cache
def _code_digest() -> bytes:
    h = hashlib.sha256(SCHEMA_VERSION.encode())
    here = Path(__file__).parent
    for name in _IMPORTER_MODULES:
        p = here / name
        h.update(name.encode())
        h.update(p.read_bytes() if p.exists() else b"-")
    return h.digest()


def cache_key(files: list[Path], time_unit: str | None) -> str:
    """Hex digest naming the cache entry of ``files`` loaded with ``time_unit`` (reads every file once)."""
    h = hashlib.sha256(_code_digest())
    h.update(repr(time_unit).encode())
    for f in files:
        h.update(str(f.resolve()).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(
                hashlib.file_digest(fh, "sha256").digest()
                if hasattr(hashlib, "file_digest")
                else hashlib.sha256(fh.read()).digest()
            )
    return h.hexdigest()[:40]


def _entry(key: str) -> Path | None:
    d = cache_dir()
    return None if d is None else d / f"graph-{key}.npz"


def load_cached(key: str) -> ExecutionGraph | None:
    """The cached graph for ``key``, or None (no entry, cache off, or an unreadable entry, which is removed)."""
    p = _entry(key)
    if p is None or not p.is_file():
        return None
    try:
        return ExecutionGraph.from_npz(p)
    except Exception:  # a corrupt or foreign entry: forget it, the caller rebuilds
        try:
            p.unlink()
        except OSError:
            pass
        return None


def store(key: str, graph: ExecutionGraph) -> None:
    """Write ``graph`` as the entry for ``key`` (atomically); any failure to write is ignored."""
    p = _entry(key)
    if p is None:
        return
    try:
        graph.to_npz(p, compress=False)
        _prune(p.parent)
    except Exception:  # a read-only or full disk: caching is only an optimisation
        pass


def _prune(d: Path) -> None:
    """Keep the newest :data:`MAX_ENTRIES` entries (least recently written go first)."""
    entries = list(d.glob("graph-*.npz"))
    if len(entries) <= MAX_ENTRIES:
        return
    entries.sort(key=lambda f: f.stat().st_mtime)
    for f in entries[: len(entries) - MAX_ENTRIES]:
        f.unlink(missing_ok=True)
