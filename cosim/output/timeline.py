"""Simulated timelines in Kineto's own chrome-trace layout.

A replayed rank is written like the trace it came from, so ui.perfetto.dev and
HolisticTraceAnalysis open it like a measured one:

* host ops: ``ph: X`` on ``pid`` = the traced process id, ``tid`` = the traced
  thread id, with Kineto's categories (``cpu_op``, ``user_annotation``,
  ``cuda_runtime``) and ``External id`` / ``correlation`` args;
* GPU ops: ``ph: X`` on ``pid`` = device index, ``tid`` = stream id, categories
  ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` with ``device``, ``stream``,
  ``correlation``, ``grid``, ``block`` args;
* flow arrows ``ac2g`` (``ph: s`` at the launch, ``ph: f`` with ``bp: e`` at the
  kernel) sharing the correlation id;
* ``distributedInfo`` with rank and world size; ``ts``/``dur`` in microseconds.

One rank: ``timeline.json.gz`` is that rank's trace. Several ranks: it holds all
of them for Perfetto (each rank's pids offset, and named ``rank{r}.host`` /
``rank{r}.gpu{d}``), and ``timeline/rank{r}.json.gz`` holds one trace per rank
for HTA, which reads a folder of per-rank files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from cosim.fileio import atomic_open
from cosim.workload.graph import GpuKind, HostKind

__all__ = ["rank_trace", "write_timeline"]

_HOST_CAT = {
    HostKind.OP: "cpu_op",
    HostKind.ANNOTATION: "user_annotation",
    HostKind.RUNTIME: "cuda_runtime",
    HostKind.LAUNCH: "cuda_runtime",
    HostKind.SYNC: "cuda_runtime",
    HostKind.LAUNCH_SYNC: "cuda_runtime",
}
_GPU_CAT = {GpuKind.KERNEL: "kernel", GpuKind.MEMCPY: "gpu_memcpy", GpuKind.MEMSET: "gpu_memset"}


def _us(x: float) -> float:
    return round(float(x) * 1e6, 3)


def rank_trace(rg: Any, run: Any, pid_offset: int | None = None) -> dict[str, Any]:
    """The Kineto-layout trace dict of one simulated rank.

    ``pid_offset`` None keeps Kineto's pids (host: traced pid; GPU: device);
    an int renumbers them for a multi-rank file: host ``offset``, GPU ``offset + 1 + device``.
    """
    H, G, T = rg.host_ops, rg.gpu_ops, rg.threads
    S = rg.strings
    ev: list[dict[str, Any]] = []
    thread_pid = T.pid.tolist()
    thread_tid = T.tid.tolist()
    host_pids = sorted(set(thread_pid)) or [0]

    def hpid(p: int) -> int:
        return p if pid_offset is None else pid_offset

    def gpid(d: int) -> int:
        return d if pid_offset is None else pid_offset + 1 + d

    r = rg.rank
    for p in host_pids:
        ev.append({"ph": "M", "name": "process_name", "pid": hpid(p), "tid": 0,
                   "args": {"name": f"rank{r}.host" if pid_offset is not None else f"python {p}"}})
    for k in range(len(T)):
        nm = S[int(T.name[k])] if T.name[k] >= 0 else f"thread {thread_tid[k]}"
        ev.append({"ph": "M", "name": "thread_name", "pid": hpid(thread_pid[k]), "tid": thread_tid[k],
                   "args": {"name": f"rank{r}.{nm}"}})
    devices = sorted(set(G.device.tolist())) if len(G) else []
    for d in devices:
        ev.append({"ph": "M", "name": "process_name", "pid": gpid(d), "tid": 0, "args": {"name": f"rank{r}.gpu{d}"}})
        ev.append({"ph": "M", "name": "process_labels", "pid": gpid(d), "tid": 0, "args": {"labels": f"GPU {d}"}})

    hs, he = run.host_start, run.host_end
    names, kinds, thr = H.name.tolist(), H.kind.tolist(), H.thread.tolist()
    ext, corr = H.ext_id.tolist(), H.correlation.tolist()
    for i in range(len(H)):
        if not (np.isfinite(hs[i]) and np.isfinite(he[i])):
            continue
        t = thr[i]
        args: dict[str, Any] = {}
        if ext[i] >= 0:
            args["External id"] = ext[i]
        if corr[i] >= 0:
            args["correlation"] = corr[i]
        ev.append({"ph": "X", "cat": _HOST_CAT.get(HostKind(kinds[i]), "cpu_op"),
                   "name": S[names[i]] if names[i] >= 0 else "?", "pid": hpid(thread_pid[t]), "tid": thread_tid[t],
                   "ts": _us(hs[i]), "dur": _us(max(he[i] - hs[i], 0.0)), "args": args})

    gs, ge = run.gpu_start, run.gpu_end
    launch_host = rg.launches.host_op
    gname, gkind, gdev, gstream = G.name.tolist(), G.kind.tolist(), G.device.tolist(), G.stream.tolist()
    gcorr, grid, block, glaunch = G.correlation.tolist(), G.grid.tolist(), G.block.tolist(), G.launch.tolist()
    for j in range(len(G)):
        if not (np.isfinite(gs[j]) and np.isfinite(ge[j])):
            continue
        args = {"device": gdev[j], "stream": gstream[j]}
        if gcorr[j] >= 0:
            args["correlation"] = gcorr[j]
            args["External id"] = gcorr[j]
        if grid[j][0] >= 0:
            args["grid"] = grid[j]
            args["block"] = block[j]
        pid, tid, ts = gpid(gdev[j]), gstream[j], _us(gs[j])
        ev.append({"ph": "X", "cat": _GPU_CAT.get(GpuKind(gkind[j]), "kernel"),
                   "name": S[gname[j]] if gname[j] >= 0 else "?", "pid": pid, "tid": tid, "ts": ts,
                   "dur": _us(max(ge[j] - gs[j], 0.0)), "args": args})
        li = glaunch[j]
        if li >= 0 and gcorr[j] >= 0:
            h = int(launch_host[li])
            if np.isfinite(hs[h]):
                t = thr[h]
                fid = gcorr[j] if pid_offset is None else pid_offset * 10_000_000 + gcorr[j]
                ev.append({"ph": "s", "id": fid, "pid": hpid(thread_pid[t]), "tid": thread_tid[t],
                           "ts": _us(hs[h]), "cat": "ac2g", "name": "ac2g"})
                ev.append({"ph": "f", "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g",
                           "name": "ac2g", "bp": "e"})
    return {
        "schemaVersion": 1,
        "distributedInfo": {"backend": "nccl", "rank": r, "world_size": rg.world_size},
        "deviceProperties": [{"id": d, "name": rg.device_name} for d in devices],
        "traceName": f"cosim replay rank {r}",
        "displayTimeUnit": "ms",
        "traceEvents": ev,
    }


def _dump(path: Path, obj: dict[str, Any]) -> None:
    with atomic_open(path, "w") as fh:
        # ", " / ": " as Kineto writes them: HTA finds a file's rank with the regex '"rank":\s+(\d+)'
        json.dump(obj, fh, separators=(", ", ": "))


def write_timeline(path: str | Path, result: Any) -> list[Path]:
    """Write the simulated timeline of ``result`` (a ReplayResult); returns the files written."""
    path = Path(path)
    ranks = list(zip(result.graph.ranks, result.runs))
    if len(ranks) == 1:
        _dump(path, rank_trace(*ranks[0]))
        return [path]
    written = []
    merged: list[dict[str, Any]] = []
    for rg, run in ranks:
        tr = rank_trace(rg, run, pid_offset=(rg.rank + 1) * 1000)
        merged.extend(tr["traceEvents"])
        p = path.parent / "timeline" / f"rank{rg.rank}.json.gz"
        _dump(p, rank_trace(rg, run))
        written.append(p)
    _dump(path, {"schemaVersion": 1, "traceName": "cosim replay", "displayTimeUnit": "ms", "traceEvents": merged})
    return [path, *written]
