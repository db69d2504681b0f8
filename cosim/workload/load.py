"""``load_trace``: one entry point for every trace input, with format autodetection."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError, warn_input
from cosim.workload.et import link_et, load_et_nodes, read_et
from cosim.workload.graph import ExecutionGraph, RankGraph, gc_paused
from cosim.workload.jsonstream import read_head
from cosim.workload.kineto import read_kineto
from cosim.workload.kineto_tables import shared_cost_memos

__all__ = ["detect_format", "load_trace"]

_TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")


def detect_format(path: str | Path) -> str:
    """'kineto' or 'et' from the first 64 KiB of the (decompressed) file."""
    head = read_head(path)
    if b'"traceEvents"' in head:
        return "kineto"
    if b'"nodes"' in head and (b'"schema"' in head or b'"pid"' in head):
        return "et"
    s = head.lstrip()
    if not s:
        raise CosimInputError("empty file", file=path)
    if s[:1] not in (b"{", b"["):
        raise CosimInputError("not a JSON trace (neither a Kineto trace nor an Execution Trace)", file=path)
    if s[:1] == b"[":
        return "kineto"
    # a big top-level member before traceEvents/nodes: decide by which key shows up
    raise CosimInputError("cannot tell the trace format: no 'traceEvents' or 'nodes' in the first 64 KiB", file=path)


def _trailing_int(p: Path) -> int | None:
    m = re.findall(r"(\d+)", p.name.split(".")[0])
    return int(m[-1]) if m else None


def trace_files_in(directory: Path) -> list[Path]:
    """The trace files :func:`load_trace` reads from a directory: its ``.json`` / ``.json.gz`` files,
    sorted by name (not recursive). The folder is listed with :func:`os.scandir`, whose entries answer
    ``is_file`` from the listing where the file system tells the type (no ``stat`` per file), and only files
    named like traces are asked."""
    with os.scandir(directory) as it:
        return sorted(directory / e.name for e in it if e.name.endswith(_TRACE_SUFFIXES) and e.is_file())


def attach_ets(ranks: Sequence[RankGraph], ets: Sequence[Path]) -> None:
    """Attach each Execution Trace file in ``ets`` to its Kineto rank: the rank with the ET's process id,
    else the rank numbered like the end of the ET's file name, else (as many ETs as ranks) by position in
    rank order. Raises :class:`CosimInputError` naming the ET when none fits or two ETs claim one rank."""
    by_pid: dict[Any, RankGraph] = {}  # keyed by the pid an ET header gives (untyped JSON)
    for r in ranks:
        for pid in set(r.threads.pid.tolist()):
            by_pid.setdefault(pid, r)
    unused = list(ranks)
    for k, f in enumerate(ets):
        header, nodes = load_et_nodes(f)
        rg = by_pid.get(header.get("pid"))
        if rg is None:
            num = _trailing_int(f)
            rg = next((r for r in ranks if r.rank == num), None) if num is not None else None
        if rg is None and len(ets) == len(ranks):
            rg = sorted(ranks, key=lambda r: r.rank)[k]
        if rg is None or rg not in unused:
            raise CosimInputError("cannot tell which Kineto rank this Execution Trace belongs to", file=f)
        unused.remove(rg)
        link_et(rg, f, nodes)


def load_trace(
    source: str | Path | Sequence[str | Path], *, time_unit: str | None = None, cache: bool = True
) -> ExecutionGraph:
    """Load a trace into an :class:`ExecutionGraph`.

    ``source`` is one of: a Kineto ``.json``/``.json.gz`` file (one rank); an
    Execution Trace file (ET only: host ops and shapes, NaN times); a directory of
    per-rank files; or a list of files, e.g. an ``(ET, Kineto)`` pair. In a
    directory or list, Kineto files become ranks (rank from ``distributedInfo``)
    and each ET is attached to the Kineto rank with the same process id (else by
    the number in its file name, else by position); ETs with no Kineto partner
    become ET-only ranks.

    With ``cache`` (default), a trace loaded before is read from the load cache
    (:mod:`cosim.workload.cache`: ``.npz`` keyed by the files' content, in
    ``$COSIM_CACHE_DIR`` or ``~/.cache/cosim``) instead of being parsed again. Warnings about a
    suspicious trace are logged on every load (``cosim: warning: ...``).

    The graph's arrays are read-only, whether parsed or cached: edit a column by assigning it
    (``rg.gpu_ops.dur = new``: the table replaces it by an edited copy) or build new tables.
    """
    if isinstance(source, (str, Path)):
        p = Path(source)
        if p.is_dir():
            files = trace_files_in(p)
            if not files:
                raise CosimInputError("directory holds no .json or .json.gz trace files", file=p)
        else:
            files = [p]
    else:
        files = [Path(s) for s in source]
        if not files:
            raise CosimInputError("no trace files given")
    key = None
    if cache:
        from cosim.workload import cache as _cache

        try:
            key = _cache.cache_key(files, time_unit)
        except OSError:
            key = None  # unreadable input: the importer below names the problem
        graph = _cache.load_cached(key) if key else None
        if graph is not None:
            for w in graph.warnings():
                warn_input(w)
            return graph
    with gc_paused():
        graph = _import(files, time_unit)
    graph.set_read_only()  # as a cached load's: a column is edited by assigning it (an edited copy)
    if key:
        graph.set_origin(key)  # the replay's program memo: the same key as the cached loads of these files
        _cache.store(key, graph)
    for w in graph.warnings():
        warn_input(w)
    return graph


def _import(files: list[Path], time_unit: str | None) -> ExecutionGraph:
    kinds = [(f, detect_format(f)) for f in files]
    kin = [f for f, k in kinds if k == "kineto"]
    ets = [f for f, k in kinds if k == "et"]
    with shared_cost_memos():  # the ranks' ops repeat: their FLOPs/bytes figures are worked out once
        ranks: list[RankGraph] = [read_kineto(f, time_unit=time_unit) for f in kin]
    seen: dict[int, Path] = {}
    for rg, f in zip(ranks, kin):
        if rg.rank in seen:
            raise CosimInputError(
                f"rank {rg.rank} appears twice (also in {seen[rg.rank]})", file=f, path="distributedInfo.rank"
            )
        seen[rg.rank] = f
    if ets and ranks:
        attach_ets(ranks, ets)
    elif ets:
        nums = [_trailing_int(f) for f in ets]
        if len(ets) > 1 and (None in nums or len(set(nums)) != len(nums)):
            nums = list(range(len(ets)))
        rank_of = [n if n is not None else 0 for n in nums]
        world = max(rank_of) + 1
        ranks = [read_et(f, rank=n, world_size=world) for f, n in zip(ets, rank_of)]
    ranks.sort(key=lambda r: r.rank)
    return ExecutionGraph(ranks)
