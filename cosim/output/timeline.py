"""Simulated timelines in Kineto's own chrome-trace layout.

A replayed rank is written like a trace torch.profiler would have recorded on the
simulated machine, so ui.perfetto.dev and HolisticTraceAnalysis (HTA) open it like
a measured one (docs/REPLAY.md, "Timeline"):

* host ops: ``ph: X`` on ``pid`` = the traced process id, ``tid`` = the traced
  thread id, with Kineto's categories (``cpu_op``, ``user_annotation``,
  ``cuda_runtime``) and ``External id`` / ``correlation`` args;
* GPU ops: ``ph: X`` on ``pid`` = device index, ``tid`` = stream id, categories
  ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` with Kineto's args in Kineto's order
  (``External id``, ``queued``, ``device``, ``context``, ``stream``, ``correlation``,
  ``grid``, ``block``; copies and memsets ``bytes`` and ``memory bandwidth (GB/s)``);
* names as the libraries write them: a trace's own kernel names are kept; GPU ops
  that cosim made up (projected captures, communication without a recorded NCCL
  kernel) get NCCL's kernel names (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL(...)``,
  ``ncclDevKernel_SendRecv(...)``: NCCL >= 2.19, the kernel NCCL launches for the
  collective, reduction type and algorithm the simulation chose) and Kineto's copy
  names (``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``), so that HTA
  classes every op as cosim does (communication ``^nccl.*Kernel``, memory
  ``^Memcpy``/``^Memset``, the rest computation);
* flow arrows ``ac2g`` (``ph: s`` at the launch, ``ph: f`` with ``bp: e`` at the
  GPU op) sharing the correlation id;
* ``gpu_user_annotation`` (Perfetto file only): each user annotation (``ProfilerStep#N``,
  ``## forward ##`` ...) over the GPU ops launched inside it, per stream;
* process/thread metadata (``process_name``, ``process_labels``, ``process_sort_index``,
  ``thread_name``, ``thread_sort_index``), ``distributedInfo`` (rank, world size),
  ``deviceProperties``; ``ts``/``dur`` in microseconds with 3 decimals.

Correlation and External ids are the trace's plus ``(rank + 1) * stride`` (``stride``
a power of ten above every id of the run, at least 10^5), so that they are unique
across ranks and HTA's integer downcasts hold its row indices.

Files: ``timeline/rank{r}.json.gz``, one trace per rank, for HTA (which reads a folder
of per-rank files, the rank taken from ``distributedInfo``), and ``timeline.json.gz``
beside it for Perfetto: all ranks in one file (each rank's host on pid
``(r + 1) * 1000``, GPU ``d`` on pid ``(r + 1) * 1000 + 1 + d``, named ``rank{r}.host`` /
``rank{r}.gpu{d}``). Both are streamed rank by rank (one event per line, gzip level 1 by ISA-L): writing
costs O(events) time and one rank's events of memory; each event is serialized once for both files, straight
from the run's columns (:func:`_rank_blocks`: byte pieces per event kind joined in bulk, the numbers serialized
by orjson a column at a time; no dict per event), the same bytes as orjson writes :func:`rank_events`' dicts.
"""

from __future__ import annotations

import gzip
import json
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any, NamedTuple

import numpy as np
import orjson

try:  # ISA-L's gzip (a dependency; zlib's when it cannot be installed): the same format, written ~4x faster
    from isal.igzip import GzipFile as _GzipFile
except ImportError:  # pragma: no cover
    from gzip import GzipFile as _GzipFile  # type: ignore[assignment]

from cosim.fileio import atomic_open
from cosim.replay.periodic import round3_array
from cosim.workload.graph import CollType, CopyKind, GpuKind, HostKind, OpClass, gc_paused

__all__ = ["gpu_annotation_events", "nccl_kernel_name", "rank_events", "rank_trace", "write_timeline"]

_HOST_CAT = {
    HostKind.OP: "cpu_op",
    HostKind.ANNOTATION: "user_annotation",
    HostKind.RUNTIME: "cuda_runtime",
    HostKind.LAUNCH: "cuda_runtime",
    HostKind.SYNC: "cuda_runtime",
    HostKind.LAUNCH_SYNC: "cuda_runtime",
}
_GPU_CAT = {GpuKind.KERNEL: "kernel", GpuKind.MEMCPY: "gpu_memcpy", GpuKind.MEMSET: "gpu_memset"}

NCCL_KERNEL_RE = re.compile(r"^nccl.*Kernel")
"""HTA's test for a communication kernel (hta.utils.utils.is_comm_kernel)."""
_NCCL_ARGS = "(ncclDevKernelArgsStorage<4096ul>)"
# NCCL >= 2.19 compiles one kernel per (collective, reduction, type) family and runs every
# algorithm/protocol of it inside that kernel (src/device/generate.py, ncclDevKernelForFunc):
# all-reduce's tree algorithms run in ..._TREE_LL, everything else in ..._RING_LL; signed and
# unsigned integers share the unsigned kernel; all-to-all and point-to-point are SendRecv.
_NCCL_COLL = {
    CollType.ALL_REDUCE: ("AllReduce", True),
    CollType.ALL_GATHER: ("AllGather", False),
    CollType.REDUCE_SCATTER: ("ReduceScatter", True),
    CollType.BROADCAST: ("Broadcast", False),
    CollType.REDUCE: ("Reduce", True),
}
_NCCL_TYPE = {
    "float": "f32", "float32": "f32", "bfloat16": "bf16", "half": "f16", "float16": "f16", "double": "f64",
    "float64": "f64", "long": "u64", "long int": "u64", "int64": "u64", "uint64": "u64", "int": "u32", "int32": "u32",
    "uint32": "u32", "char": "u8", "int8": "u8", "byte": "u8", "uint8": "u8", "bool": "u8", "unsigned char": "u8",
    "float8_e4m3fn": "f8e4m3", "float8_e4m3fnuz": "f8e4m3", "float8_e5m2": "f8e5m2", "float8_e5m2fnuz": "f8e5m2",
    "fp32": "f32", "bf16": "bf16", "fp16": "f16", "fp8": "f8e4m3", "fp8_e4m3": "f8e4m3", "fp8_e5m2": "f8e5m2",
}
_NCCL_TYPE_BY_BYTES = {1: "u8", 2: "bf16", 4: "f32", 8: "f64"}
_MEMCPY_NAME = {
    CopyKind.HTOD: "Memcpy HtoD (Pageable -> Device)",
    CopyKind.DTOH: "Memcpy DtoH (Device -> Pageable)",
    CopyKind.DTOD: "Memcpy DtoD (Device -> Device)",
    CopyKind.HTOH: "Memcpy HtoH (Pageable -> Pageable)",
    CopyKind.PTOP: "Memcpy PtoP (Device -> Device)",
}
_MEMSET_NAME = "Memset (Device)"
_DRIVER_API = re.compile(r"^cu[A-Z]")  # CUDA driver calls (cuLaunchKernel ...): Kineto's cuda_driver
_GPU_SORT_BASE = 5_000_000  # Kineto's process_sort_index of GPU d: 5000000 + d


def _us(x: float) -> float:
    return round(float(x) * 1e6, 3)


def nccl_type(dtype: str | None, elem_bytes: int = -1) -> str:
    """NCCL's short type name (``bf16``, ``f32``, ``u64`` ...) of a recorded PyTorch dtype name."""
    if dtype:
        key = dtype.lower().replace("c10::", "").replace("torch.", "").replace("at::", "").strip()
        if key in _NCCL_TYPE:
            return _NCCL_TYPE[key]
    return _NCCL_TYPE_BY_BYTES.get(int(elem_bytes), "f32")


def nccl_kernel_name(ctype: CollType, dtype: str = "f32", algo: str | None = None) -> str:
    """The kernel NCCL (>= 2.19) launches for a collective, as Kineto names it.

    ``dtype`` is NCCL's short type name (:func:`nccl_type`); ``algo`` the algorithm
    (``ring``, ``tree``, ``nvls``, ...; only all-reduce's tree has its own kernel).
    """
    coll = _NCCL_COLL.get(CollType(ctype))
    if coll is None:
        return f"ncclDevKernel_SendRecv{_NCCL_ARGS}"
    name, typed = coll
    fam = "TREE_LL" if ctype == CollType.ALL_REDUCE and (algo or "").lower() == "tree" else "RING_LL"
    mid = f"_Sum_{dtype}" if typed else ""
    return f"ncclDevKernel_{name}{mid}_{fam}{_NCCL_ARGS}"


class _Ids:
    """Run-wide correlation/External id offsets: rank r's ids are the trace's + (r + 1) * stride."""

    def __init__(self, ranks: Iterable[Any]) -> None:
        top = 0
        for rg in ranks:
            for col in (rg.host_ops.ext_id, rg.host_ops.correlation, rg.gpu_ops.correlation, rg.gpu_ops.ext_id):
                if len(col):
                    top = max(top, int(col.max()))
        self.stride = max(10 ** len(str(top + 1)), 100_000)

    def base(self, rank: int) -> int:
        return (rank + 1) * self.stride


def _process_name(rg: Any) -> str:
    for k in range(len(rg.threads)):
        n = int(rg.threads.name[k])
        m = re.search(r"\(([^()]+)\)\s*$", rg.strings[n]) if n >= 0 else None
        if m:
            return m.group(1)
    return "python3"


def _pick(values: list[Any], idx: np.ndarray) -> list[Any]:
    """``values`` at ``idx`` (the whole list when ``idx`` is every index in order)."""
    if len(idx) == len(values):
        return values
    return [values[i] for i in idx.tolist()]


_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
_CAT_CODE = {c: i for i, c in enumerate(_CATS)}


class _Names:
    """A rank's strings (not copied), then the names cosim adds, by code: ``S[c]`` below ``len(S)``."""

    def __init__(self, strings: Sequence[str]) -> None:
        self.S, self.n = strings, len(strings)
        self.extra: list[str] = []
        self.codes: dict[str, int] = {}

    def code(self, name: str) -> int:
        """The code of an added name (each distinct name added once)."""
        c = self.codes.get(name)
        if c is None:
            c = self.codes[name] = self.n + len(self.extra)
            self.extra.append(name)
        return c

    def __getitem__(self, c: int) -> str:
        return self.S[c] if c < self.n else self.extra[c - self.n]


def _gpu_name_codes(rg: Any, run: Any) -> tuple[np.ndarray, _Names, np.ndarray]:
    """Name and category of every GPU op, as the libraries and Kineto write them, as codes: its name as an index
    into a table (the rank's strings, then
    ``?`` and the names cosim makes up) and its category as an index into :data:`_CATS`. Python work only for the
    ops whose names are made up or checked (collectives, copies, memsets), O(ops) numpy for the rest."""
    G, C, S = rg.gpu_ops, rg.collectives, rg.strings
    projected = bool(rg.source.get("projected"))
    proj_dtype = None
    if projected:
        try:
            proj_dtype = json.loads(rg.source.get("projection", "{}")).get("dtype")
        except (TypeError, ValueError):
            proj_dtype = None
    table = _Names(S)
    code = table.code

    codes = np.asarray(G.name, dtype=np.int64).copy()
    if len(codes) and int(codes.min()) < 0:
        codes[codes < 0] = code("?")
    kind_arr = np.asarray(G.kind, dtype=np.int64)
    cats = np.zeros(len(codes), dtype=np.int64)
    for k in np.unique(kind_arr).tolist():  # one enum lookup per distinct kind
        cats[kind_arr == k] = _CAT_CODE[_GPU_CAT.get(GpuKind(k), "kernel")]
    kinds = kind_arr.tolist()
    cls, coll, ck = G.cls.tolist(), G.collective.tolist(), G.copy_kind.tolist()
    coll_algo = getattr(run, "coll_algo", {}) or {}
    coll_name: dict[tuple[int, int, int, str | None], int] = {}  # (collective type, dtype, algorithm) -> name code
    ctypes, cdtypes, celem, calgo = C.type.tolist(), C.dtype.tolist(), C.elem_bytes.tolist(), C.algo.tolist()
    memcpy, memset = _CAT_CODE["gpu_memcpy"], _CAT_CODE["gpu_memset"]
    cl, catl = codes.tolist(), cats.tolist()  # (element access and assignment on lists, not numpy scalars)
    for j in np.flatnonzero((G.collective >= 0) | (G.kind != GpuKind.KERNEL) |
                            (projected & ((G.cls == OpClass.MEMCPY) | (G.cls == OpClass.MEMSET)))).tolist():
        nm, kind = table[cl[j]], kinds[j]
        if coll[j] >= 0 and kind == GpuKind.KERNEL:
            if NCCL_KERNEL_RE.match(nm):
                continue  # the trace's own NCCL kernel
            c = coll[j]
            algo = coll_algo[j][0] if j in coll_algo else (S[calgo[c]] if calgo[c] >= 0 else "ring")
            key = (ctypes[c], cdtypes[c], celem[c], algo)
            kc = coll_name.get(key)
            if kc is None:
                dt = S[cdtypes[c]] if cdtypes[c] >= 0 else None
                t = nccl_type(dt, celem[c])
                if proj_dtype and proj_dtype != "captured" and t in ("f32", "f16", "bf16"):
                    t = nccl_type(proj_dtype)
                kc = coll_name[key] = code(nccl_kernel_name(CollType(ctypes[c]), t, algo))
            cl[j] = kc
        elif kind == GpuKind.MEMCPY or (kind == GpuKind.KERNEL and cls[j] == OpClass.MEMCPY):
            if not nm.startswith("Memcpy"):
                cl[j] = code(_MEMCPY_NAME.get(CopyKind(ck[j]), _MEMCPY_NAME[CopyKind.DTOD]))
            catl[j] = memcpy
        elif kind == GpuKind.MEMSET or (kind == GpuKind.KERNEL and cls[j] == OpClass.MEMSET):
            if not nm.startswith("Memset"):
                cl[j] = code(_MEMSET_NAME)
            catl[j] = memset
    return np.asarray(cl, dtype=np.int64), table, np.asarray(catl, dtype=np.int64)


class _CollArgs:
    """Kineto's NCCL metadata args of a communication kernel (record_param_comms), per collective of one rank
    (its columns read once; each group's rank list formatted once)."""

    def __init__(self, rg: Any) -> None:
        C, grp = rg.collectives, rg.groups
        self.S = rg.strings
        self.name, self.inn, self.outn = C.name.tolist(), C.in_nelems.tolist(), C.out_nelems.tolist()
        self.size, self.dtype, self.group = C.group_size.tolist(), C.dtype.tolist(), C.group.tolist()
        self.grp = grp
        self.gname, self.gdesc = grp.name.tolist(), grp.desc.tolist()
        self.granks: dict[int, str] = {}

    def __call__(self, c: int) -> dict[str, Any]:
        S = self.S
        a: dict[str, Any] = {}
        if self.name[c] >= 0:
            a["Collective name"] = S[self.name[c]]
        if self.inn[c] >= 0:
            a["In msg nelems"] = int(self.inn[c])
        if self.outn[c] >= 0:
            a["Out msg nelems"] = int(self.outn[c])
        if self.size[c] >= 0:
            a["Group size"] = int(self.size[c])
        if self.dtype[c] >= 0:
            a["dtype"] = S[self.dtype[c]]
        g = self.group[c]
        if g >= 0:
            if self.gname[g] >= 0:
                a["Process Group Name"] = S[self.gname[g]]
            if self.gdesc[g] >= 0:
                a["Process Group Description"] = S[self.gdesc[g]]
            ranks = self.granks.get(g)
            if ranks is None:
                ranks = self.granks[g] = str([int(x) for x in self.grp.ragged("ranks", g)])
            a["Process Group Ranks"] = ranks
        return a


def _meta_events(rg: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One rank's metadata events (``ph: M``): the host side's, the GPU side's."""
    G, T, S = rg.gpu_ops, rg.threads, rg.strings
    thread_pid, thread_tid = T.pid.tolist(), T.tid.tolist()
    proc = _process_name(rg)
    host: list[dict[str, Any]] = []
    gpu: list[dict[str, Any]] = []
    for p in sorted(set(thread_pid)):
        host.append({"name": "process_name", "ph": "M", "pid": p, "tid": 0, "args": {"name": proc}})
        host.append({"name": "process_labels", "ph": "M", "pid": p, "tid": 0, "args": {"labels": "CPU"}})
        host.append({"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0, "args": {"sort_index": p}})
    for k in range(len(T)):
        n = int(T.name[k])
        nm = S[n] if n >= 0 else f"thread {thread_tid[k]} ({proc})"
        host.append({"name": "thread_name", "ph": "M", "pid": thread_pid[k], "tid": thread_tid[k],
                     "args": {"name": nm}})
        host.append({"name": "thread_sort_index", "ph": "M", "pid": thread_pid[k], "tid": thread_tid[k],
                     "args": {"sort_index": thread_tid[k]}})
    gdev, gstream = G.device.tolist(), G.stream.tolist()
    for d in sorted(set(gdev)):
        gpu.append({"name": "process_name", "ph": "M", "pid": d, "tid": 0, "args": {"name": proc}})
        gpu.append({"name": "process_labels", "ph": "M", "pid": d, "tid": 0, "args": {"labels": f"GPU {d}"}})
        gpu.append({"name": "process_sort_index", "ph": "M", "pid": d, "tid": 0,
                    "args": {"sort_index": _GPU_SORT_BASE + d}})
    for d, s in sorted(set(zip(gdev, gstream))):
        gpu.append({"name": "thread_name", "ph": "M", "pid": d, "tid": s, "args": {"name": f"stream {s} "}})
        gpu.append({"name": "thread_sort_index", "ph": "M", "pid": d, "tid": s, "args": {"sort_index": s}})
    return host, gpu


def _gpu_prep(rg: Any, run: Any, hok: np.ndarray) -> tuple[Any, ...]:
    """The GPU ops' columns both timeline paths write: start and duration in us (3 decimals; 0 where the op did not
    run), names and categories, the host op that launched each (-1: none), each op's External id (the op's, else its launch's, else its host op's), whether it draws
    a flow arrow from its launch and that launch's thread, the collectives' algorithms and args, the ran ops."""
    H, G = rg.host_ops, rg.gpu_ops
    gs, ge = run.gpu_start, run.gpu_end
    gok = np.isfinite(gs) & np.isfinite(ge)
    gts = np.round(np.where(gok, gs, 0.0) * 1e6, 3)
    gdur = np.round(np.where(gok, np.maximum(ge - gs, 0.0), 0.0) * 1e6, 3)
    gcodes, gtable, gcats = _gpu_name_codes(rg, run)
    n_g = len(G)
    h_of = np.full(n_g, -1, dtype=np.int64)  # the host op that launched each GPU op
    has = G.launch >= 0
    h_of[has] = rg.launches.host_op[G.launch[has]]
    x_of = np.asarray(G.ext_id, dtype=np.int64).copy()
    m = (x_of < 0) & (h_of >= 0)
    x_of[m] = H.ext_id[h_of[m]]
    m = (x_of < 0) & (G.op >= 0)
    x_of[m] = H.ext_id[G.op[m]]
    flow = (h_of >= 0) & (G.correlation >= 0) & hok[np.maximum(h_of, 0)] if n_g and len(H) else np.zeros(n_g, bool)
    fthr = H.thread[np.maximum(h_of, 0)] if len(H) else np.zeros(n_g, np.int64)
    coll_algo = getattr(run, "coll_algo", {}) or {}
    return gts, gdur, (gcodes, gtable), gcats, h_of, x_of, flow, fthr, coll_algo, _CollArgs(rg), np.flatnonzero(gok)


def rank_events(rg: Any, run: Any, ids: _Ids | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Kineto-layout events of one simulated rank: (host-side events, GPU-side events).

    Host-side events sit on the traced pids/tids, GPU-side ones on pid = device,
    tid = stream; :func:`write_timeline` renumbers the two groups for the combined file.
    """
    H, G, T, S = rg.host_ops, rg.gpu_ops, rg.threads, rg.strings
    base = (ids or _Ids([rg])).base(rg.rank)
    host, gpu = _meta_events(rg)

    hs, he = run.host_start, run.host_end
    hok = np.isfinite(hs) & np.isfinite(he)
    hts = np.round(np.where(hok, hs, 0.0) * 1e6, 3).tolist()
    hdur = np.round(np.where(hok, np.maximum(he - hs, 0.0), 0.0) * 1e6, 3).tolist()
    names, kinds = H.name.tolist(), H.kind.tolist()
    hcat = {k: _HOST_CAT.get(HostKind(k), "cpu_op") for k in set(kinds)}
    cats = {(n, k): "cuda_driver" if hcat[k] == "cuda_runtime" and n >= 0 and _DRIVER_API.match(S[n]) else hcat[k]
            for n, k in set(zip(names, kinds))}
    hsel = np.flatnonzero(hok)
    tpid, ttid = np.asarray(T.pid), np.asarray(T.tid)
    hthr = H.thread[hsel]
    args: dict[str, Any]
    for n, k, p, t, ts, d, x, c in zip(H.name[hsel].tolist(), H.kind[hsel].tolist(), tpid[hthr].tolist(),
                                       ttid[hthr].tolist(), _pick(hts, hsel), _pick(hdur, hsel),
                                       H.ext_id[hsel].tolist(), H.correlation[hsel].tolist()):
        if x >= 0:
            args = {"External id": base + x, "correlation": base + c} if c >= 0 else {"External id": base + x}
        else:
            args = {"correlation": base + c} if c >= 0 else {}
        host.append({"ph": "X", "cat": cats[n, k], "name": S[n] if n >= 0 else "?", "pid": p, "tid": t, "ts": ts,
                     "dur": d, "args": args})

    gts_a, gdur_a, (gcodes, gtable), gcat_codes, h_of, x_of, flow, fthr, coll_algo, coll_args, gsel = \
        _gpu_prep(rg, run, hok)
    gts, gdur = gts_a.tolist(), gdur_a.tolist()
    grid, block = G.grid.tolist(), G.block.tolist()
    cols = zip(gsel.tolist(), [_CATS[c] for c in gcat_codes[gsel].tolist()],
               [gtable[c] for c in gcodes[gsel].tolist()], G.device[gsel].tolist(),
               G.stream[gsel].tolist(), _pick(gts, gsel), _pick(gdur, gsel), x_of[gsel].tolist(),
               G.correlation[gsel].tolist(), G.collective[gsel].tolist(), G.bytes[gsel].tolist(), flow[gsel].tolist(),
               h_of[gsel].tolist(), *((tpid[fthr[gsel]].tolist(), ttid[fthr[gsel]].tolist()) if len(T) else
                                      ([-1] * len(gsel), [-1] * len(gsel))))
    for j, cat, name, pid, tid, ts, dur, x, corr, c, nb, fl, h, hp, ht in cols:
        args = {"External id": base + x} if x >= 0 else {}
        if cat == "kernel":
            args["queued"] = 0
        args["device"] = pid
        args["context"] = 1
        args["stream"] = tid
        if corr >= 0:
            args["correlation"] = base + corr
        if cat == "kernel":
            if grid[j][0] >= 0:
                args["grid"] = grid[j]
                args["block"] = block[j]
            if c >= 0:
                args.update(coll_args(c))
                if j in coll_algo:  # the simulated choice (not a Kineto field)
                    args["algorithm"], args["protocol"] = coll_algo[j]
        elif math.isfinite(nb) and nb >= 0:
            args["bytes"] = int(nb)
            if dur > 0:
                args["memory bandwidth (GB/s)"] = nb / (dur * 1e3)
        gpu.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args})
        if fl:
            fid = base + corr
            host.append({"ph": "s", "id": fid, "pid": hp, "tid": ht, "ts": hts[h], "cat": "ac2g", "name": "ac2g"})
            gpu.append({"ph": "f", "id": fid, "pid": pid, "tid": tid, "ts": ts, "cat": "ac2g", "name": "ac2g",
                        "bp": "e"})
    return host, gpu


def gpu_annotation_events(rg: Any, run: Any, ids: _Ids | None = None) -> list[dict[str, Any]]:
    """Kineto's ``gpu_user_annotation`` events: per user annotation and stream, the span of the GPU
    ops launched inside it (O(GPU ops x nesting depth)).

    Only the Perfetto file gets them: HTA 0.5 counts them as GPU kernels in its temporal breakdown.
    """
    H, G = rg.host_ops, rg.gpu_ops
    base = (ids or _Ids([rg])).base(rg.rank)
    gok = np.isfinite(run.gpu_start) & np.isfinite(run.gpu_end)
    j = np.flatnonzero(gok & (G.launch >= 0))
    if j.size == 0:
        return []
    parent, kind = H.parent, H.kind
    cur = parent[rg.launches.host_op[G.launch[j]]]
    anns, ops = [], []
    while j.size:
        alive = cur >= 0
        j, cur = j[alive], cur[alive]
        is_ann = kind[cur] == HostKind.ANNOTATION
        anns.append(cur[is_ann])
        ops.append(j[is_ann])
        cur = parent[cur]
    a, o = np.concatenate(anns), np.concatenate(ops)
    if a.size == 0:
        return []
    dv, sv = G.device[o].astype(np.int64), G.stream[o].astype(np.int64)
    md, ms = int(dv.max()) + 1, int(sv.max()) + 1
    if int(dv.min()) >= 0 and int(sv.min()) >= 0 and (int(a.max()) + 1) * md * ms < 1 << 62:
        # one int64 key per (annotation, device, stream), ordered as the triples are: np.unique's order, ~10x
        # faster than its axis=1 form (a sort of structured rows)
        flat, inv = np.unique((a * md + dv) * ms + sv, return_inverse=True)
        keys = np.stack([flat // (md * ms), (flat // ms) % md, flat % ms])
    else:
        keys, inv = np.unique(np.stack([a, dv, sv]), axis=1, return_inverse=True)
    inv = inv.reshape(-1)
    lo = np.full(keys.shape[1], np.inf)
    hi = np.full(keys.shape[1], -np.inf)
    np.minimum.at(lo, inv, run.gpu_start[o])
    np.maximum.at(hi, inv, run.gpu_end[o])
    S, names, ext = rg.strings, H.name.tolist(), H.ext_id.tolist()
    out = []
    for (h, d, s), t0, t1 in zip(keys.T.tolist(), lo.tolist(), hi.tolist()):
        out.append({"ph": "X", "cat": "gpu_user_annotation", "name": S[names[h]] if names[h] >= 0 else "?",
                    "pid": d, "tid": s, "ts": _us(t0), "dur": _us(max(t1 - t0, 0.0)),
                    "args": {"External id": base + ext[h]} if ext[h] >= 0 else {}})
    return out


def _header(rg: Any, devices: list[int]) -> dict[str, Any]:
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": d, "name": rg.device_name} for d in devices],
        "distributedInfo": {"backend": "nccl", "rank": rg.rank, "world_size": rg.world_size},
        "traceName": f"cosim replay rank {rg.rank}",
        "displayTimeUnit": "ms",
    }


def rank_trace(rg: Any, run: Any) -> dict[str, Any]:
    """The Kineto-layout trace dict of one simulated rank (what ``timeline/rank{r}.json.gz`` holds)."""
    host, gpu = rank_events(rg, run)
    doc = _header(rg, sorted(set(rg.gpu_ops.device.tolist())))
    doc["traceEvents"] = host + gpu
    return doc


class _TraceWriter:
    """Streams one chrome-trace JSON document: a header, then events one per line."""

    def __init__(self, fh: IO[bytes] | gzip.GzipFile | _GzipOut, header: dict[str, Any]) -> None:
        self.fh = fh
        self.first = True
        # ", " / ": " as Kineto writes them: HTA finds a file's rank with the regex '"rank":\s+(\d+)'
        head = json.dumps(header, separators=(", ", ": "))
        fh.write(head[:-1].encode() + b', "traceEvents": [\n')

    def events(self, evs: list[dict[str, Any]]) -> None:
        self.lines(_lines(evs))

    def lines(self, *bodies: bytes) -> None:
        """Events already serialized by :func:`_lines` (empty bodies skipped)."""
        for body in bodies:
            if not body:
                continue
            if not self.first:
                self.fh.write(b",\n")  # (not prepended: that would copy the body)
            self.fh.write(body)
            self.first = False

    def close(self) -> None:
        self.fh.write(b"\n]}\n")


def _lines(evs: list[dict[str, Any]]) -> bytes:
    """Events as compact JSON objects, one per line (the trace files' layout): the list serialized in one call
    (about twice as fast as one call per event) and a line break put between its objects. ``},{"`` occurs in
    compact JSON only between two objects of a list (a string escapes its quotes); when an event holds a list of
    objects (more of them than events: the replacement then grew the body by more than one byte an event), one call
    per event instead."""
    if not evs:
        return b""
    body = orjson.dumps(evs)[1:-1]
    out = body.replace(b'},{"', b'},\n{"')
    if len(out) - len(body) == len(evs) - 1:  # as many replaced as there are gaps between events
        return out
    del out
    dumps = orjson.dumps
    return b",\n".join([dumps(e) for e in evs])


_MARK = "\ue000"
"""Prefix of the placeholders :func:`_window_lines` puts in a template (a private-use character; a template holding
it elsewhere is not used)."""
_MARKS = re.compile(rb'"\xee\x80\x80([TIXC])"')
_KINDS = b"TIXC"


class _Copies:
    """Serialized copies of a repeated period: ``pieces`` (a template's bytes between its placeholders) joined with
    each copy's ``values``, then ``tail`` (events already serialized); or ``plain`` bytes."""

    def __init__(self, pieces: list[bytes] | None = None, values: list[Sequence[bytes]] | None = None,
                 tail: bytes = b"", plain: bytes = b"") -> None:
        self.pieces, self.values, self.tail, self.plain = pieces, values or [], tail, plain

    def lines(self, move: Callable[[bytes], bytes] | None = None) -> bytes:
        """The copies as :func:`_lines` writes them; ``move``: a bytes -> bytes edit of whole events (a
        :func:`_repid`), applied to the template once (the placeholder character, absent from the pieces,
        keeps them apart) instead of to every copy."""
        return b",\n".join(self.chunks(move))

    def chunks(self, move: Callable[[bytes], bytes] | None = None) -> list[bytes]:
        """:meth:`lines` as its parts (one per copy, then the tail; empty parts dropped): what
        ``b",\\n".join`` makes :meth:`lines` of, for a writer that writes them one by one (no copy of the whole)."""
        if self.pieces is None:
            out = move(self.plain) if move is not None and self.plain else self.plain
            return [out] if out else []
        pieces = self.pieces
        if move is not None:
            mark = _MARK.encode()
            pieces = move(mark.join(pieces)).split(mark)
        slots: list[bytes] = [b""] * (2 * len(pieces) - 1)
        slots[0::2] = pieces
        chunks = []
        for vals in self.values:
            slots[1::2] = vals
            chunks.append(b"".join(slots))
        if self.tail:
            chunks.append(move(self.tail) if move is not None else self.tail)
        return [c for c in chunks if c]


def _window_lines(rw: Any) -> _Copies:
    """The drawn copies of a repeated period (a :class:`cosim.replay.periodic.RepeatedWindow`) as :func:`_lines`
    writes their event dicts (``rw.expanded()``), without building them: the window's events are serialized once
    with a placeholder for every number a copy moves (``ts``, ``id``, ``args``' ``External id`` and
    ``correlation``), and each copy is the template's pieces joined with that copy's numbers (serialized by orjson
    as one list). The events are in order, each with at most one placeholder of a kind, so the i-th placeholder of
    a kind in the template is that kind's i-th value. O(window events) Python work once, then C-speed work per
    copy. Falls back to the dicts when a template cannot be trusted (the placeholder character elsewhere in the
    events, a non-integer id)."""
    evs = rw.events
    if not evs or rw.copies <= 0:
        return _Copies(plain=_lines(rw.tail))
    mt, mi, mx, mc = (_MARK + k for k in "TIXC")
    tmpl: list[dict[str, Any]] = []
    vi: list[Any] = []
    vx: list[Any] = []
    vc: list[Any] = []
    add, ai, ax, ac = tmpl.append, vi.append, vx.append, vc.append
    for ev in evs:
        t = ev.copy()
        t["ts"] = mt
        if "id" in ev:
            t["id"] = mi
            ai(ev["id"])
        args = ev.get("args")
        if args and ("External id" in args or "correlation" in args):
            a = args.copy()
            if "External id" in args:
                a["External id"] = mx
                ax(args["External id"])
            if "correlation" in args:
                a["correlation"] = mc
                ac(args["correlation"])
            t["args"] = a
        add(t)
    body = _lines(tmpl)
    del tmpl
    parts = _MARKS.split(body)
    pieces, kinds = parts[0::2], np.frombuffer(b"".join(parts[1::2]), dtype=np.uint8)
    base = vi + vx + vc
    counts = [len(evs), len(vi), len(vx), len(vc)]
    if body.count(_MARK.encode()) != kinds.size or \
            [int(np.count_nonzero(kinds == c)) for c in _KINDS] != counts or \
            any(type(v) is not int for v in base):
        return _Copies(plain=_lines(rw.expanded()))
    ids = np.asarray(base, dtype=np.int64)
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) + rw.copies * rw.id_step >= 1 << 62):
        return _Copies(plain=_lines(rw.expanded()))
    order = np.empty(kinds.size, dtype=np.int64)  # template position -> index in [times..., ids...]
    first = np.cumsum([0, *counts[:-1]])
    for c, f in zip(_KINDS, first.tolist()):
        m = kinds == c
        order[m] = f + np.arange(np.count_nonzero(m))
    ts = rw.ts()
    values: list[Sequence[bytes]] = []
    at = order.tolist()
    pick: Callable[[list[bytes]], Sequence[bytes]] = \
        operator.itemgetter(*at) if len(at) > 1 else (lambda v: (v[at[0]],))  # type: ignore[assignment]
    for j in range(1, rw.copies + 1):
        vals = rw.copy_times(ts, j) + (ids + j * rw.id_step).tolist()
        values.append(pick(orjson.dumps(vals)[1:-1].split(b",")))
    return _Copies(pieces, values, _lines(rw.tail))


_PID = re.compile(rb'"pid":(-?\d+),')
"""An event's ``pid`` key in :func:`_lines`' output: a key is the only unescaped ``"pid":`` in compact JSON (a
string holding it escapes the quotes), and no event has a nested ``pid``."""


class _GzipOut:
    """An atomically replaced gzip file (deterministic: no name, mtime 0), fast compression: Intel ISA-L's
    deflate (``isal``, about 4x zlib's level 1 and smaller) when installed, else zlib's level 1. The compressor is
    fed blocks of exactly :attr:`BLOCK` bytes (the last one shorter) whatever the sizes of the writes, so the file's
    bytes depend on its content only (ISA-L's output depends on how its input is cut), and a block is compressed
    while it is still in the cache."""

    LEVEL = 1
    BLOCK = 1 << 17

    def __init__(self, path: Path) -> None:
        self._cm = atomic_open(path, "wb", gz=False)
        raw = self._cm.__enter__()
        self.gz = _GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=self.LEVEL, mtime=0)
        self._buf = bytearray()

    def write(self, b: bytes) -> None:
        """Append ``b`` to the file (compressed a :attr:`BLOCK` at a time)."""
        buf, block, gz = self._buf, self.BLOCK, self.gz
        with memoryview(b) as view:
            k = 0
            if buf:
                k = min(block - len(buf), len(view))
                buf += view[:k]
                if len(buf) < block:
                    return
                gz.write(buf)
                buf.clear()
            n = len(view)
            while n - k >= block:
                gz.write(view[k:k + block])
                k += block
            buf += view[k:]

    def __enter__(self) -> _GzipOut:
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                if self._buf:
                    self.gz.write(bytes(self._buf))
                self.gz.close()
        finally:
            self._cm.__exit__(*exc)


# the columnar writer: a rank's events straight from its columns (no event dicts) ----

_SEP = b",\n"


def _nums(values: np.ndarray | list[Any]) -> np.ndarray:
    """Numbers serialized as orjson writes them in an event (one call for the whole column), as an object column.
    A float64 or int64 array is serialized as it is (``OPT_SERIALIZE_NUMPY``: the same digits as its ``tolist()``'s,
    without a Python number per value)."""
    out = np.empty(len(values), dtype=object)
    if len(values):
        if isinstance(values, np.ndarray):
            raw = orjson.dumps(np.ascontiguousarray(values), option=orjson.OPT_SERIALIZE_NUMPY)
        else:
            raw = orjson.dumps(values)
        out[:] = raw[1:-1].split(b",")
    return out


def _codes(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``keys`` (an (n, k) int matrix) numbered by distinct row, and the first row of each number: the
    columns' offsets from their minima combined into one mixed-radix int64 key and sorted once (when the product of
    their spans fits), else each column factorized and the codes combined (1-D ``np.unique``s, not a sort of
    rows)."""
    n = len(keys)
    if n and keys.shape[1]:
        lo = keys.min(axis=0)
        span = [h - m + 1 for h, m in zip(keys.max(axis=0).tolist(), lo.tolist())]  # Python ints: no overflow
        if math.prod(span) < 1 << 62:  # the columns' offsets as one mixed-radix int64 key: a single sort
            code = np.zeros(n, dtype=np.int64)
            for k, sp in enumerate(span):
                code = code * sp + (keys[:, k] - lo[k])
            _, first, inv = np.unique(code, return_index=True, return_inverse=True)
            return inv.reshape(-1), first
    code = np.zeros(n, dtype=np.int64)
    for k in range(keys.shape[1]):
        u, inv = np.unique(keys[:, k], return_inverse=True)
        code = code * len(u) + inv.reshape(-1)
        if k + 1 < keys.shape[1]:
            code = np.unique(code, return_inverse=True)[1].reshape(-1).astype(np.int64)
    _, first, inv = np.unique(code, return_index=True, return_inverse=True)
    return inv.reshape(-1), first


def _table(keys: np.ndarray, make: Callable[[tuple[int, ...]], bytes]) -> np.ndarray:
    """One byte piece per row, ``make(key)`` built once per distinct key (``keys``: an (n, k) int matrix)."""
    return _tables(keys, make)[0]


def _tables(keys: np.ndarray, *makes: Callable[[tuple[int, ...]], bytes]) -> list[np.ndarray]:
    """:func:`_table` for each of ``makes`` (the rows numbered by distinct key once)."""
    if len(keys) == 0:
        return [np.empty(0, dtype=object) for _ in makes]
    inv, first = _codes(keys)
    uniq = [tuple(u) for u in keys[first].tolist()]
    out = []
    for make in makes:
        pieces = np.empty(len(first), dtype=object)
        pieces[:] = [make(u) for u in uniq]
        out.append(pieces[inv])
    return out


def _pids(keys: np.ndarray, make: Callable[[tuple[int, ...], int | None], bytes], off: int | None
          ) -> tuple[np.ndarray, np.ndarray | None]:
    """The pieces of a slot holding a ``pid``: ``make(key, None)`` for the rank file and, when ``off`` (the combined
    file's host pid of the rank, :class:`_Moves`) is given, ``make(key, off)`` for the combined file."""
    if off is None:
        return _table(keys, lambda k: make(k, None)), None
    own, comb = _tables(keys, lambda k: make(k, None), lambda k: make(k, off))
    return own, comb


def _alt(*slots: tuple[int, np.ndarray | None]) -> _Alt | None:
    """A block's ``alt`` from its pid slots' combined pieces (:func:`_pids`; None: a single rank)."""
    out = [(k, p) for k, p in slots if p is not None]
    return out or None


_Chunk = tuple[bytes, bytes, int]
"""Serialized events as the rank file has them, as the combined file has them (its pids), and how many."""

_Alt = list[tuple[int, np.ndarray]]
"""The pieces a block's rows have in the combined file where they differ from the rank file's (those holding a
``pid``): (slot, a piece per row)."""


class _Block:
    """Events of one kind as a matrix of byte pieces (a row per event, each row's pieces joined are the event as
    :func:`_lines` writes it, followed by ``,\\n``): the numbers that a period's shift or copies move are slots
    filled from columns (``ts_slots``: the event's ``ts``, ``dur_slot``: its ``dur``, ``id_slots``: ids). ``alt``:
    the pieces of the combined file's rows where they differ (their pids), None when both files hold the same
    events (a single rank)."""

    def __init__(self, m: np.ndarray, ts: np.ndarray, ts_slots: list[tuple[int, np.ndarray | None]],
                 dur: np.ndarray | None = None, dur_slot: int = -1,
                 id_slots: list[tuple[int, np.ndarray, np.ndarray | None]] | None = None,
                 pid: np.ndarray | None = None, tid: np.ndarray | None = None, two: np.ndarray | None = None,
                 alt: _Alt | None = None) -> None:
        self.m, self.ts, self.ts_slots = m, ts, ts_slots
        self.dur, self.dur_slot = dur, dur_slot  # dur: the ``X`` events' (every row)
        self.id_slots = id_slots or []
        self.pid, self.tid = pid, tid
        self.two = two  # the rows holding two events (a GPU op and its flow arrow's end)
        assert alt is None or all(k < m.shape[1] - 1 for k, _ in alt)  # (the last slot ends the row: _chunks)
        self.alt = alt

    def __len__(self) -> int:
        return len(self.ts)

    @staticmethod
    def _fill(m: np.ndarray, ts: np.ndarray, ts_slots: list[tuple[int, np.ndarray | None]],
              id_slots: list[tuple[int, np.ndarray, np.ndarray | None]], off: int) -> None:
        """Put the numbers into their slots of ``m`` (rows outside a slot's mask keep their ``b""``): ``ts``, and
        each id slot's ids (those of its masked rows) plus ``off``. Slots drawing on one id column (the same array:
        a GPU op's correlation and its flow arrow's id) share one serialization of the whole column."""
        tsb = _nums(ts)
        for k, mask in ts_slots:
            if mask is None:
                m[:, k] = tsb
            else:
                m[mask, k] = tsb[mask]
        users: dict[int, int] = {}
        for _, ids, _ in id_slots:
            users[id(ids)] = users.get(id(ids), 0) + 1
        done: dict[int, np.ndarray] = {}
        for k, ids, mask in id_slots:
            if mask is not None and users[id(ids)] == 1:
                m[mask, k] = _nums(ids[mask] + off)  # a column of its own: its masked rows only
                continue
            col = done.get(id(ids))
            if col is None:
                col = done[id(ids)] = _nums(ids + off)
            if mask is None:
                m[:, k] = col
            else:
                m[mask, k] = col[mask]

    def _ids(self, rows: np.ndarray | None) -> list[tuple[int, np.ndarray, np.ndarray | None]]:
        """The id slots of ``rows`` (every row when None): (slot, the rows' ids, the rows' mask)."""
        if rows is None:
            return self.id_slots
        out = []
        cut: dict[int, np.ndarray] = {}
        for k, ids, mask in self.id_slots:
            sub = cut.get(id(ids))
            if sub is None:
                sub = cut[id(ids)] = ids[rows]  # (one array per source column: slots sharing it still share)
            out.append((k, sub, None if mask is None else mask[rows]))
        return out

    @staticmethod
    def _join(pieces: list[bytes]) -> bytes:
        """The pieces as one (a phase of its own for benchmarks/bench_timeline.py)."""
        return b"".join(pieces)

    @classmethod
    def _chunks(cls, m: np.ndarray, two: np.ndarray | None, alt: _Alt | None) -> Iterator[_Chunk]:
        """``m``'s rows joined :data:`_ROWS` at a time into one piece of bytes (without the separator after the
        last event) for the rank file and, with ``alt``'s pieces put in their slots of the same list, for the
        combined file (the same bytes when ``alt`` is None), with the events each holds (``two``: the rows holding
        two); lazily, so that each chunk is written before the next is made. Two joins of the rows' pieces
        (memcpy), no pass over the joined bytes."""
        ncol = m.shape[1]
        for a in range(0, len(m), _ROWS):
            b = min(a + _ROWS, len(m))
            flat = m[a:b].ravel().tolist()
            flat[-1] = flat[-1][:-2]
            own = comb = cls._join(flat)
            if alt is not None:
                for k, pieces in alt:
                    flat[k::ncol] = pieces[a:b].tolist()
                comb = cls._join(flat)
            yield own, comb, b - a + (int(np.count_nonzero(two[a:b])) if two is not None else 0)

    def thread_of(self, i: int) -> tuple[int, int]:
        """Row ``i``'s pid and tid."""
        assert self.pid is not None and self.tid is not None
        return int(self.pid[i]), int(self.tid[i])

    def body(self, sh: Any | None) -> tuple[Iterator[_Chunk], np.ndarray]:
        """Every event (moved by ``sh``, a :class:`cosim.replay.periodic.EventShift`, when given) serialized, in
        chunks with their event counts (:meth:`_chunks`), and the rows of the repeated window."""
        m = self.m
        ts = self.ts
        win = np.zeros(len(ts), dtype=bool)
        if sh is None or not len(ts):
            self._fill(m, ts, self.ts_slots, self._ids(None), 0)
            if self.dur is not None:
                m[:, self.dur_slot] = _nums(self.dur)
            return self._chunks(m, self.two, self.alt), win
        after = ts >= sh.cut_us
        win = (ts >= sh.lo) & ~after
        moved = ts.copy()
        if after.any():
            moved[after] = round3_array(ts[after] + sh.extra)
        self._fill(m, moved, self.ts_slots, self._ids(None), 0)
        if self.dur is not None:
            dur = self.dur.copy()
            for i in np.flatnonzero(~after & ~win & (ts + self.dur > sh.cut_us)).tolist():
                dur[i] = round(float(dur[i]) + sh.extra, 3)
            m[:, self.dur_slot] = _nums(dur)
        return self._chunks(m, self.two, self.alt), win

    def window(self, rows: np.ndarray) -> _Window | None:
        """The repeated window's rows (``rows``; None when there are none), taken once for all its copies."""
        if not len(rows):
            return None
        return _Window(self.m[rows], self.ts[rows], [(k, None if mask is None else mask[rows])
                                                     for k, mask in self.ts_slots],
                       self._ids(rows), None if self.two is None else self.two[rows],
                       None if self.alt is None else [(k, pieces[rows]) for k, pieces in self.alt])

    def copy(self, w: _Window, j: int, sh: Any) -> Iterator[_Chunk]:
        """Copy ``j`` (1, 2, ...) of the window ``w`` serialized in chunks (:meth:`_chunks`): its numbers filled into
        the window's rows now, the chunks joined as they are taken (before the next copy is filled). The
        durations of the window's events are not stretched."""
        self._fill(w.m, round3_array(w.ts + j * sh.period_us), w.ts_slots, w.id_slots, j * sh.id_step)
        return self._chunks(w.m, w.two, w.alt)


class _Window(NamedTuple):
    """The rows of a block's repeated window (:meth:`_Block.window`): pieces, times, slots, two-event rows."""

    m: np.ndarray
    ts: np.ndarray
    ts_slots: list[tuple[int, np.ndarray | None]]
    id_slots: list[tuple[int, np.ndarray, np.ndarray | None]]
    two: np.ndarray | None
    alt: _Alt | None


_ROWS = 1024
"""Rows of a block joined into one chunk (~150 kB of events): the two compressors and the combined file's pid moves
read it while it is in the cache (over a whole side's body at once, each such pass is bound by memory bandwidth)."""


def _matrix(cols: list[np.ndarray | bytes], n: int) -> np.ndarray:
    m = np.empty((n, len(cols)), dtype=object)
    for k, c in enumerate(cols):
        m[:, k] = c
    return m


def _js(s: str) -> bytes:
    return orjson.dumps(s)



def _rank_blocks(rg: Any, run: Any, ids: _Ids, off: int | None = None) -> tuple[list[_Block], list[_Block]]:
    """The events :func:`rank_events` makes of one rank past its metadata, as blocks: the host side's (host ops'
    ``X`` events, then the launches' flow starts ``ph: s``), the GPU side's (each GPU op's ``X`` event with its
    flow end ``ph: f`` in the same row). ``off``: the rank's host pid in the combined file (:class:`_Moves`; host
    events move there, GPU ``d`` to ``off + 1 + d``), which gives the blocks their ``alt`` pieces; None: one rank,
    the combined file holds the rank file's events."""
    H, G, T, S = rg.host_ops, rg.gpu_ops, rg.threads, rg.strings
    base = ids.base(rg.rank)
    hs, he = run.host_start, run.host_end
    hok = np.isfinite(hs) & np.isfinite(he)
    hts = np.round(np.where(hok, hs, 0.0) * 1e6, 3)
    hdur = np.round(np.where(hok, np.maximum(he - hs, 0.0), 0.0) * 1e6, 3)
    hsel = np.flatnonzero(hok)
    n = len(hsel)
    tpid, ttid = np.asarray(T.pid).tolist(), np.asarray(T.tid).tolist()
    hcat = {k: _HOST_CAT.get(HostKind(k), "cpu_op") for k in set(H.kind[hsel].tolist())}

    def host_prefix(key: tuple[int, ...], to: int | None) -> bytes:
        nm, k, t = key
        cat = hcat[k]
        if cat == "cuda_runtime" and nm >= 0 and _DRIVER_API.match(S[nm]):
            cat = "cuda_driver"
        return (b'{"ph":"X","cat":' + _js(cat) + b',"name":' + _js(S[nm] if nm >= 0 else "?") +
                b',"pid":%d,"tid":%d,"ts":' % (tpid[t] if to is None else to, ttid[t]))

    keys = np.stack([H.name[hsel].astype(np.int64), H.kind[hsel].astype(np.int64),
                     H.thread[hsel].astype(np.int64)], axis=1)
    x = H.ext_id[hsel].astype(np.int64)
    c = H.correlation[hsel].astype(np.int64)
    hx, hc = x >= 0, c >= 0
    both = hx & hc
    a_pieces = np.array([b',"args":{', b',"args":{"correlation":', b',"args":{"External id":',
                         b',"args":{"External id":'], dtype=object)
    b_pieces = np.array([b"", b',"correlation":'], dtype=object)
    hp_own, hp_comb = _pids(keys, host_prefix, off)
    host_x = _Block(
        _matrix([hp_own, b"", b',"dur":', b"", a_pieces[hx * 2 + hc], b"",
                 b_pieces[both.astype(np.int64)], b"", b"}},\n"], n),
        hts[hsel], [(1, None)], hdur[hsel], 3,
        [(5, base + np.where(hx, x, c), hx | hc), (7, base + c, both)],
        np.asarray(T.pid)[H.thread[hsel]], np.asarray(T.tid)[H.thread[hsel]], alt=_alt((0, hp_comb)))

    gts, gdur, (gcodes, gtable), gcats, h_of, x_of, flow, fthr, coll_algo, coll_args, gsel = _gpu_prep(rg, run, hok)
    ng = len(gsel)

    # the launches' flow starts (host side, after the host ops): one per GPU op with a flow arrow
    fsel = gsel[flow[gsel]]
    fh = h_of[fsel]
    fcorr = base + G.correlation[fsel].astype(np.int64)
    if len(T):
        ftk = fthr[fsel].astype(np.int64)
    else:
        ftk = np.full(len(fsel), -1, dtype=np.int64)

    def s_pieces(key: tuple[int, ...], to: int | None) -> bytes:
        t = key[0]
        p, tid = (tpid[t], ttid[t]) if t >= 0 else (-1, -1)
        return b',"pid":%d,"tid":%d,"ts":' % (p if to is None else to, tid)

    nf = len(fsel)
    sp_own, sp_comb = _pids(ftk.reshape(-1, 1), s_pieces, off)
    host_s = _Block(
        _matrix([b'{"ph":"s","id":', b"", sp_own, b"", b',"cat":"ac2g","name":"ac2g"},\n'], nf),
        hts[fh], [(3, None)], id_slots=[(1, fcorr, None)],
        pid=np.asarray(T.pid)[ftk] if len(T) else ftk, tid=np.asarray(T.tid)[ftk] if len(T) else ftk,
        alt=_alt((2, sp_comb)))

    # GPU ops
    nid = gcodes[gsel]  # names and categories as codes (_gpu_name_codes): no string per op
    name_of = gtable
    cat_of = _CATS
    cid = gcats[gsel]
    dev = G.device[gsel].astype(np.int64)
    stm = G.stream[gsel].astype(np.int64)
    kern = cid == 0

    def g_prefix(key: tuple[int, ...], to: int | None) -> bytes:
        nm, ct, d, s = key
        return (b'{"ph":"X","cat":' + _js(cat_of[ct]) + b',"name":' + _js(name_of[nm]) +
                b',"pid":%d,"tid":%d,"ts":' % (d if to is None else to + 1 + d, s))

    gx = x_of[gsel]
    gcorr = G.correlation[gsel].astype(np.int64)
    ghx, ghc = gx >= 0, gcorr >= 0
    gfl = flow[gsel]

    def g_mid(key: tuple[int, ...]) -> bytes:
        hx_, k_, d, s, hc_ = key
        return ((b"," if hx_ else b"") + (b'"queued":0,' if k_ else b"") +
                b'"device":%d,"context":1,"stream":%d' % (d, s) + (b',"correlation":' if hc_ else b""))

    # what follows the stream / correlation in args: grid and block, the collective's args, the simulated algorithm
    # (kernels); bytes and bandwidth (copies, memsets); then the end of the event and the flow end's start
    rest = np.full(ng, b"", dtype=object)
    grid, block = np.asarray(G.grid)[gsel], np.asarray(G.block)[gsel]
    coll = G.collective[gsel].astype(np.int64)
    C = rg.collectives
    if len(C):  # collectives with the same args share one class (their args formatted once)
        cinv, cfirst = _codes(np.stack([np.asarray(C.name), np.asarray(C.in_nelems), np.asarray(C.out_nelems),
                                        np.asarray(C.group_size), np.asarray(C.dtype), np.asarray(C.group)],
                                       axis=1).astype(np.int64))
        coll = np.where(coll >= 0, cinv[np.maximum(coll, 0)], -1)
    else:
        cfirst = np.zeros(0, dtype=np.int64)
    cfirst_l = cfirst.tolist()
    algo_id = np.full(ng, -1, dtype=np.int64)
    algos: dict[tuple[str, str], int] = {}
    if coll_algo and ng:  # each op's position in gsel (ascending) by one searchsorted, not a dict of every op
        ops = np.fromiter(coll_algo, dtype=np.int64, count=len(coll_algo))
        at = np.minimum(np.searchsorted(gsel, ops), ng - 1)
        found = gsel[at] == ops
        for i, ap in zip(at[found].tolist(), [coll_algo[j] for j in ops[found].tolist()]):
            algo_id[i] = algos.setdefault(tuple(ap), len(algos))  # type: ignore[arg-type]
    algo_of = list(algos)
    kr = np.flatnonzero(kern & ((grid[:, 0] >= 0) | (coll >= 0) | (algo_id >= 0)))

    def k_rest(key: tuple[int, ...]) -> bytes:
        g, b, cc, a = key[0:3], key[3:6], key[6], key[7]
        out = b""
        if g[0] >= 0:
            out += b',"grid":' + orjson.dumps(list(g)) + b',"block":' + orjson.dumps(list(b))
        if cc >= 0:
            body = orjson.dumps(coll_args(cfirst_l[cc]))[1:-1]
            if body:
                out += b"," + body
            if a >= 0:
                out += b',"algorithm":' + _js(algo_of[a][0]) + b',"protocol":' + _js(algo_of[a][1])
        return out

    if len(kr):
        rest[kr] = _table(np.concatenate([grid[kr].astype(np.int64), block[kr].astype(np.int64),
                                          coll[kr].reshape(-1, 1), algo_id[kr].reshape(-1, 1)], axis=1), k_rest)
    nbytes = G.bytes[gsel]
    gd = gdur[gsel]
    for i in np.flatnonzero(~kern & np.isfinite(nbytes) & (nbytes >= 0)).tolist():
        nb, d = float(nbytes[i]), float(gd[i])
        r = {"bytes": int(nb)}
        if d > 0:
            r["memory bandwidth (GB/s)"] = nb / (d * 1e3)  # type: ignore[assignment]
        rest[i] = b"," + orjson.dumps(r)[1:-1]
    ends = np.array([b"}}", b'}},\n{"ph":"f","id":'], dtype=object)
    tail = np.array([b",\n", b',"cat":"ac2g","name":"ac2g","bp":"e"},\n'], dtype=object)
    fli = gfl.astype(np.int64)

    def f_mid(key: tuple[int, ...], to: int | None) -> bytes:
        f, d, s = key
        return b',"pid":%d,"tid":%d,"ts":' % (d if to is None else to + 1 + d, s) if f else b""

    gid = base + gcorr  # one array for the correlation and the flow id: serialized once (_Block._fill)
    gp_own, gp_comb = _pids(np.stack([nid, cid, dev, stm], axis=1), g_prefix, off)
    fm_own, fm_comb = _pids(np.stack([fli, dev, stm], axis=1), f_mid, off)
    gpu = _Block(
        _matrix([gp_own, b"", b',"dur":', b"",
                 np.array([b',"args":{', b',"args":{"External id":'], dtype=object)[ghx.astype(np.int64)], b"",
                 _table(np.stack([ghx.astype(np.int64), kern.astype(np.int64), dev, stm, ghc.astype(np.int64)],
                                 axis=1), g_mid), b"",
                 rest + ends[fli], b"", fm_own, b"", tail[fli]], ng),
        gts[gsel], [(1, None), (11, gfl)], gd, 3,
        [(5, base + gx, ghx), (7, gid, ghc), (9, gid, gfl)], dev, stm, gfl, alt=_alt((0, gp_comb), (10, fm_comb)))
    return [host_x, host_s], [gpu]


def _side(blocks: list[_Block], sh: Any | None, move: Callable[[bytes, int], bytes] | None) -> _Pairs:
    """One side's events past its metadata, as :func:`_write_timeline` writes them, in chunks (rank file, combined
    file): the body (moved by ``sh``), then the repeated period's copies (each block's part of a copy in turn), then
    the ``coalesced`` tail (moved onto the combined file's pids by ``move``, when given). Lazy: a chunk is made when
    it is taken."""
    bodies, wins = [], []
    for b in blocks:
        body, win = b.body(sh)
        bodies.append(body)
        wins.append(np.flatnonzero(win))
    for body in bodies:
        for own, comb, _ in body:
            yield own, comb
    if sh is None:
        return
    views = [b.window(w) for b, w in zip(blocks, wins)]
    for j in range(1, sh.copies + 1):
        for b, v in zip(blocks, views):
            if v is not None:
                for own, comb, _ in b.copy(v, j, sh):
                    yield own, comb
    if sh.copies < sh.repeats and any(len(w) for w in wins):
        first = next((b for b in blocks if b.dur is not None and len(b)), None)
        if first is not None:
            pid, tid = first.thread_of(0)
        else:
            pid, tid = next(b.thread_of(int(w[0])) for b, w in zip(blocks, wins) if len(w))
        tail = _lines([sh.tail_event(pid, tid)])
        yield tail, (tail if move is None else move(tail, 1))


def write_timeline(path: str | Path, result: Any) -> list[Path]:
    """Write the simulated timeline of ``result`` (a ReplayResult); returns the files written.

    ``path`` (``timeline.json.gz``) gets every rank for Perfetto; ``path.parent/timeline/rank{r}.json.gz``
    one Kineto trace per rank for HTA. Stale ``rank*.json.gz`` files of an earlier run there are removed.
    A result with an ``event_shift(rank)`` method (a coalesced step, :class:`cosim.replay.periodic.PeriodicResult`)
    has each rank's events moved as it says (:class:`cosim.replay.periodic.EventShift`): the events after its
    repeated window moved, the window's copies drawn from its rows. One with only ``split_events(rank, events)``
    has each rank's event dicts passed through it, the window's copies written from one serialized template
    (:class:`cosim.replay.periodic.RepeatedWindow`).
    """
    with gc_paused():  # millions of acyclic event dicts
        return _write_timeline(Path(path), result)


_Pairs = Iterable[tuple[bytes, bytes]]
"""Serialized events as the rank file has them and as the combined file has them (its pids)."""


class _Moves:
    """How a rank's serialized events move onto its pids of the combined file (:func:`_repid`): host pid ``p`` to
    ``(rank + 1) * 1000``, GPU ``d`` to ``(rank + 1) * 1000 + 1 + d`` (:func:`_renumber` for the dicts)."""

    def __init__(self, rg: Any, devices: list[int]) -> None:
        self.off = (rg.rank + 1) * 1000
        self.hpids = sorted(set(rg.threads.pid.tolist()))
        self.devices = devices

    def host(self, b: bytes, events: int | None = None) -> bytes:
        """Host events ``b`` (``events`` of them, when known) on the combined file's host pid."""
        return _repid(b, self.hpids, lambda _p: self.off, events)

    def gpu(self, b: bytes, events: int | None = None) -> bytes:
        """GPU events ``b`` (``events`` of them, when known) on the combined file's GPU pids."""
        return _repid(b, self.devices, lambda p: self.off + 1 + p, events)


def _write_timeline(path: Path, result: Any) -> list[Path]:
    split = getattr(result, "split_events", None)
    shift = getattr(result, "event_shift", None)
    columns = split is None or shift is not None  # a split_events hook without its columnar twin: event dicts
    ranks = list(zip(result.graph.ranks, result.runs))
    ids = _Ids(rg for rg, _ in ranks)
    folder = path.parent / "timeline"
    written: list[Path] = []
    single = len(ranks) == 1
    combined = {"schemaVersion": 1, "traceName": "cosim replay", "displayTimeUnit": "ms"}
    if single:
        rg0 = ranks[0][0]
        combined = _header(rg0, sorted(set(rg0.gpu_ops.device.tolist())))
    with _GzipOut(path) as cfh:
        cw = _TraceWriter(cfh, combined)
        for rg, run in ranks:
            devices = sorted(set(rg.gpu_ops.device.tolist()))
            mv = None if single else _Moves(rg, devices)
            if columns:
                meta_h, meta_g = _meta_events(rg)
                hb, gb = _rank_blocks(rg, run, ids, None if mv is None else mv.off)
                sh = shift(rg.rank) if shift is not None else None
                host = _side(hb, sh, None if mv is None else mv.host)
                gpu = _side(gb, sh, None if mv is None else mv.gpu)
            else:
                meta_h, meta_g, host, gpu = _dict_parts(rg, run, ids, split, mv)
            cmeta_h, cmeta_g = meta_h, meta_g
            if not single:
                cmeta_h, cmeta_g = [dict(e) for e in meta_h], [dict(e) for e in meta_g]
                _renumber(rg.rank, cmeta_h, cmeta_g)
            p = folder / f"rank{rg.rank}.json.gz"
            with _GzipOut(p) as fh:
                w = _TraceWriter(fh, _header(rg, devices))
                for meta, cmeta, pairs in ((meta_h, cmeta_h, host), (meta_g, cmeta_g, gpu)):
                    w.events(meta)
                    cw.events(cmeta)
                    for a, b in pairs:  # each chunk into both files while it is in the cache
                        w.lines(a)
                        cw.lines(b)
                w.close()
            written.append(p)
            del host, gpu
            cw.lines(*_annotations(rg, run, ids, split, mv))
        cw.close()
    keep = {p.name for p in written}
    for old in folder.glob("rank*.json.gz"):
        if re.fullmatch(r"rank\d+\.json\.gz", old.name) and old.name not in keep:
            old.unlink()
    return [path, *written]


def _extend(split: Callable[..., Any] | None, rank: int, evs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]],
                                                                                            _Copies]:
    """A rank's events for the full step (``split``: the result's ``split_events``, when any), and the serialized
    copies of its repeated period (when any)."""
    if split is None:
        return evs, _Copies()
    out, rw = split(rank, evs)
    return out, (_window_lines(rw) if rw is not None else _Copies())


def _dict_parts(rg: Any, run: Any, ids: _Ids, split: Callable[..., Any] | None, mv: _Moves | None
                ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], _Pairs, _Pairs]:
    """A rank's events through event dicts (a result with ``split_events`` but no ``event_shift``): the host and
    GPU metadata events, and each side's serialized events (each event serialized once, for both files; a repeated
    period's template moved once, :meth:`_Copies.chunks`)."""
    host, gpu = rank_events(rg, run, ids)
    (host, host_rep), (gpu, gpu_rep) = _extend(split, rg.rank, host), _extend(split, rg.rank, gpu)
    nh, ng = _meta_count(host), _meta_count(gpu)
    sides: list[list[tuple[bytes, bytes]]] = []
    for evs, n, rep, move in ((host, nh, host_rep, None if mv is None else mv.host),
                                    (gpu, ng, gpu_rep, None if mv is None else mv.gpu)):
        body = _lines(evs[n:])
        pairs = [(body, body if move is None else move(body, len(evs) - n))]
        chunks = rep.chunks()
        pairs += zip(chunks, chunks if move is None else rep.chunks(move))
        sides.append(pairs)
    return host[:nh], gpu[:ng], sides[0], sides[1]


def _annotations(rg: Any, run: Any, ids: _Ids, split: Callable[..., Any] | None, mv: _Moves | None) -> list[bytes]:
    """The rank's ``gpu_user_annotation`` events serialized for the combined file (its pids unless ``mv`` is None)."""
    evs, rep = _extend(split, rg.rank, gpu_annotation_events(rg, run, ids))
    if mv is None:
        return [_lines(evs), *rep.chunks()]
    return [mv.gpu(_lines(evs), len(evs)), *rep.chunks(mv.gpu)]


def _meta_count(evs: list[dict[str, Any]]) -> int:
    """How many leading metadata (``ph: M``) events ``evs`` has: those :func:`_renumber` renames."""
    n = 0
    for e in evs:
        if e["ph"] != "M":
            break
        n += 1
    return n


def _repid(body: bytes, old: list[int], to: Callable[[int], int], events: int | None = None) -> bytes:
    """:func:`_lines`' output moved onto a rank's pids of the combined file, as :func:`_renumber` moves the dicts:
    every event's ``pid`` p becomes ``to(p)``. ``old``: the pids expected in ``body``; when they are all of them
    (checked by counting) and none is a new one, plain byte replacements (memchr speed), else one
    regular-expression pass: O(bytes). A replacement that changes the length is counted by the change (no count
    pass); ``events``: how many events ``body`` holds when the caller knows (each has one ``pid`` key), which
    spares the pass counting them."""
    if not body:
        return body
    new = [to(p) for p in old]
    if not set(old) & set(new):
        out, done = body, 0
        for p, q in zip(old, new):
            x, y = b'"pid":%d,' % p, b'"pid":%d,' % q
            grow = len(y) - len(x)
            n0 = len(out)
            if not grow:
                done += out.count(x)
            out = out.replace(x, y)
            if grow:
                done += (len(out) - n0) // grow
        if done == (body.count(b'"pid":') if events is None else events):
            return out
        del out
    return _PID.sub(lambda m: b'"pid":%d,' % to(int(m.group(1))), body)


def _renumber(rank: int, host: list[dict[str, Any]], gpu: list[dict[str, Any]]) -> None:
    """Move one rank's events onto its own pids of the combined file (in place)."""
    off = (rank + 1) * 1000
    for e in host:
        e["pid"] = off
    for e in gpu:
        e["pid"] = off + 1 + e["pid"]
    for e in host:
        if e["ph"] != "M":
            break
        if e["name"] == "process_name":
            e["args"] = {"name": f"rank{rank}.host"}
        elif e["name"] == "process_sort_index":
            e["args"] = {"sort_index": off}
    for e in gpu:
        if e["ph"] != "M":
            break
        if e["name"] == "process_name":
            e["args"] = {"name": f"rank{rank}.gpu{e['pid'] - off - 1}"}
        elif e["name"] == "process_sort_index":
            e["args"] = {"sort_index": e["pid"]}
