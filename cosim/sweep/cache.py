"""The workload cache shared by the points a sweep runs in one process.

Most of a point's time is reading and projecting the same trace again (about
5 s of 6 for the bundled MoE capture; the replay itself is a fraction of a
second). Points run in the same worker process share :func:`process_cache`.
"""

from __future__ import annotations

from cosim.scenario import WorkloadCache

__all__ = ["process_cache"]

_CACHE = WorkloadCache(size=4)


def process_cache() -> WorkloadCache:
    """This process's workload cache."""
    return _CACHE
