"""Project a CPU capture onto a GPU: the kernels its ATen ops would launch.

A capture on CPU (``cosim capture --device cpu``) has the real host structure of
the step — ops, threads, gaps, the all-to-all(v) split sizes the router chose —
but no CUDA kernels. :func:`project_to_gpu` turns each rank's graph into the
graph a GPU run of the same program would have:

* **Kernel-launching ops.** An ATen op launches one kernel if it computes
  (it is not a view, allocation or metadata op, see :data:`NO_KERNEL`) and no op
  nested inside it computes (``aten::linear`` > ``aten::matmul`` > ``aten::mm``:
  only ``aten::mm`` launches). ``aten::_local_scalar_dense`` / ``aten::item``
  become a device-to-host copy that blocks the host (``.item()``, ``.tolist()``).
  Each collective (``record_param_comms``) launches one communication kernel.
* **Host time.** A launching op's CPU time on the capture host was mostly the
  CPU doing the math; on a GPU host it is dispatch only: its subtree costs
  ``aten_overhead`` plus the target CPU's launch overhead. Every other host
  interval (Python gaps, framework overhead, views) is kept and divided by
  ``host_speed``, the capture host's slowness relative to the target host.
* **GPU time.** Kernel durations come from a kernel model the caller passes in
  (:class:`KernelTimeModel`; the replay and scenario layers pass the catalog roofline,
  :class:`cosim.models.RooflineModel`, until calibrated models replace it) from
  the op's FLOPs and bytes at ``dtype``. Communication kernels are left to the
  engine: replay them with ``collectives="simulated"``.
* **Streams.** Compute and communication share one stream, in launch order: the
  capture's collectives are blocking, so their order is kept exactly.

Limits: one kernel per ATen op (fused or split kernels of real libraries differ);
no kernel fusion, CUDA-graph capture or torch.compile; FLOPs are known for GEMM,
attention and element-wise ops, other ops are charged their bytes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from cosim.catalog.models import CPU, Accelerator
from cosim.workload.graph import (
    CollType,
    CopyKind,
    EdgeKind,
    ExecutionGraph,
    GpuKind,
    HostKind,
    OpClass,
    RankGraph,
    StringTable,
    Table,
)

__all__ = ["NO_KERNEL", "KernelTimeModel", "ProjectionConfig", "attention_flops", "needs_projection", "op_class", "project_onto", "project_to_gpu"]



class KernelTimeModel(Protocol):
    """A kernel-time model of one accelerator, as projection uses it (e.g. :class:`cosim.models.RooflineModel`)."""

    @property
    def floor(self) -> float:
        """Duration (s) of a kernel that does no work."""
        ...

    def time(self, cls: str, flops: float, nbytes: float, dtype: str = "bf16") -> float:
        """Duration (s) of a kernel of model class ``cls`` doing ``flops`` FLOPs and moving ``nbytes`` bytes."""
        ...


NO_KERNEL = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::as_strided", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::_reshape_alias", "aten::resolve_conj", "aten::resolve_neg", "aten::t", "aten::transpose",
    "aten::permute", "aten::expand", "aten::expand_as", "aten::slice", "aten::select", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::squeeze", "aten::unsqueeze", "aten::flatten",
    "aten::unflatten", "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::result_type",
    "aten::size", "aten::stride", "aten::numel", "aten::is_nonzero", "aten::contiguous", "aten::to", "aten::_to_copy",
    "aten::resize_", "aten::set_", "aten::narrow", "aten::view_as", "aten::matmul", "aten::linear",
    "aten::scalar_tensor", "aten::zeros", "aten::ones", "aten::full", "aten::new_empty", "aten::new_empty_strided",
    "aten::type_as", "aten::_has_compatible_shallow_copy_type", "aten::is_same_size", "aten::dropout",
    "aten::lift", "aten::clone", "aten::split_with_sizes_copy",
})
"""ATen ops that launch no kernel themselves (views, allocation, dispatch wrappers
whose work happens in nested ops)."""

_SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::item"})

_CLASS_RULES: tuple[tuple[str, OpClass], ...] = (
    ("_grouped_mm", OpClass.GROUPED_GEMM),
    ("aten::mm", OpClass.GEMM), ("aten::addmm", OpClass.GEMM), ("aten::bmm", OpClass.GEMM),
    ("aten::baddbmm", OpClass.GEMM), ("aten::addbmm", OpClass.GEMM), ("aten::_scaled_mm", OpClass.GEMM),
    ("attention", OpClass.ATTENTION), ("flash", OpClass.ATTENTION),
    ("norm", OpClass.NORM),
    ("softmax", OpClass.REDUCTION), ("aten::sum", OpClass.REDUCTION), ("aten::mean", OpClass.REDUCTION),
    ("aten::topk", OpClass.REDUCTION), ("aten::sort", OpClass.REDUCTION), ("aten::cumsum", OpClass.REDUCTION),
    ("aten::max", OpClass.REDUCTION), ("aten::min", OpClass.REDUCTION), ("aten::argmax", OpClass.REDUCTION),
    ("nll_loss", OpClass.REDUCTION), ("aten::bincount", OpClass.REDUCTION), ("aten::histc", OpClass.REDUCTION),
    ("aten::fill_", OpClass.MEMSET), ("aten::zero_", OpClass.MEMSET),
)

_ELEM_BYTES = {"float": 4, "double": 8, "c10::half": 2, "c10::bfloat16": 2, "half": 2, "bfloat16": 2, "long int": 8,
               "int": 4, "bool": 1, "unsigned char": 1, "signed char": 1, "short int": 2, "c10::float8_e4m3fn": 1}
_DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "mxfp8": 1, "fp4": 0.5, "mxfp4": 0.5, "fp64": 8}
_FLOAT_TYPES = ("float", "double", "c10::half", "c10::bfloat16", "half", "bfloat16")


@dataclass(frozen=True)
class ProjectionConfig:
    """How a CPU capture becomes a GPU run (SI units)."""

    dtype: str = "bf16"
    """Datatype of floating-point tensors on the GPU ("bf16", "fp8", ...) or "captured" to keep the capture's."""
    host_speed: float = 1.0
    """How much faster the target host runs the Python/framework work than the capture host
    did (capture host time is divided by it); e.g. ranks / cores when ranks shared cores."""
    aten_overhead: float = 4e-6
    """Host dispatch time of a kernel-launching ATen op besides the launch call (s)."""
    stream: int = 7
    """Stream id of the projected kernels (PyTorch's default stream shows as 7 in Kineto)."""

    def __post_init__(self) -> None:
        if self.dtype != "captured" and self.dtype not in _DTYPE_BYTES:
            raise ValueError(f"dtype must be 'captured' or one of {', '.join(_DTYPE_BYTES)}, got {self.dtype!r}")
        if not (self.host_speed > 0 and math.isfinite(self.host_speed)):
            raise ValueError(f"host_speed must be > 0, got {self.host_speed}")
        if not (self.aten_overhead >= 0 and math.isfinite(self.aten_overhead)):
            raise ValueError(f"aten_overhead must be >= 0 seconds, got {self.aten_overhead}")


def op_class(name: str) -> OpClass:
    """GPU op class of the kernel an ATen op launches."""
    for pat, cls in _CLASS_RULES:
        if pat in name:
            return cls
    return OpClass.ELEMENTWISE


def _numel(shape: object) -> int:
    if not isinstance(shape, list) or not all(isinstance(x, int) for x in shape):
        return 0
    n = 1
    for x in shape:
        n *= max(x, 0)
    return n


def _work(rg: RankGraph, i: int, cls: OpClass, dtype: str) -> tuple[float, float, str]:
    """(FLOPs, bytes, dtype) of host op ``i`` at the target dtype."""
    H = rg.host_ops
    shapes = rg.shapes(i) or []
    types = rg.types(i) or []
    tensors = [(s, t.lower() if isinstance(t, str) else t) for s, t in zip(shapes, types)
               if isinstance(s, list) and s and all(isinstance(x, int) for x in s)]
    cap_float = next((t for _, t in tensors if t in _FLOAT_TYPES), "float")
    op_dtype = dtype if dtype != "captured" else {"float": "fp32", "double": "fp64"}.get(cap_float, "bf16")

    def size(s: list[int], t: str) -> float:
        if t in _FLOAT_TYPES and dtype != "captured":
            return _numel(s) * _DTYPE_BYTES[dtype]
        return _numel(s) * _ELEM_BYTES.get(t, 4)

    flops = float(H.flops[i]) if np.isfinite(H.flops[i]) else math.nan
    nbytes_in = sum(size(s, t) for s, t in tensors)
    out = max((size(s, t) for s, t in tensors), default=0.0)
    if cls == OpClass.ATTENTION:
        flops = attention_flops([sh for sh, _ in tensors], "backward" in rg.name(int(H.name[i])), flops)
    if not math.isfinite(flops):
        flops = float(max((_numel(s) for s, _ in tensors), default=0)) if cls != OpClass.MEMSET else 0.0
    nbytes = nbytes_in + out
    return flops, float(nbytes), op_dtype


def attention_flops(shapes: list[list[int]], backward: bool, default: float = math.nan) -> float:
    """FLOPs of a fused attention op from its tensor inputs' shapes: ``QK^T`` and ``PV``,
    ``2 b h sq sk (d + dv)`` for queries ``[b, h, sq, d]``, keys ``[b, h, sk, d]`` and values
    ``[b, h, sk, dv]`` (a backward op's first input is the output gradient: q, k, v follow it);
    halved when causal, x2.5 for a backward op (FlashAttention-2: the recomputed ``QK^T`` and four
    GEMMs). Traces do not record whether a mask was applied: self-attention over the whole
    sequence (``sq == sk > 1``) is taken as causal, as in decoder-only language models, whose
    flash kernels skip the masked half. ``default`` when the shapes are not 4-d."""
    four = [sh for sh in shapes if len(sh) == 4]
    qkv = four[1:4] if backward else four[:3]
    if len(qkv) < 3:
        return default
    (b, h, sq, d), (_, _, sk, _), (_, _, _, dv) = qkv
    fwd = 2.0 * b * h * sq * sk * (d + dv) * (0.5 if sq == sk > 1 else 1.0)
    return fwd * (2.5 if backward else 1.0)


def _ancestors_flag(parent: np.ndarray, flag: np.ndarray) -> np.ndarray:
    """Ops inside (or equal to) a flagged op; parents come before children in row order."""
    out = flag.copy()
    for i in range(len(parent)):
        p = parent[i]
        if p >= 0 and out[p]:
            out[i] = True
    return out


def project_rank(rg: RankGraph, accelerator: Accelerator, cpu: CPU, cfg: ProjectionConfig,
                 model: KernelTimeModel) -> RankGraph:
    """The GPU-run graph of one CPU-captured rank (see module docs), kernel times from ``model``."""
    H = rg.host_ops
    n = len(H)
    names = [rg.name(int(x)) for x in H.name]
    kind = H.kind.copy()
    parent = H.parent
    C = rg.collectives

    comm_root = np.zeros(n, dtype=bool)
    comm_of: dict[int, int] = {}
    for c in range(len(C)):
        h = int(C.host_op[c])
        if 0 <= h < n:
            comm_root[h] = True
            comm_of[h] = c
    in_comm = _ancestors_flag(parent, comm_root)

    cand = np.array([(kind[i] == HostKind.OP and nm.startswith("aten::") and nm not in NO_KERNEL
                      and not in_comm[i]) for i, nm in enumerate(names)], dtype=bool)
    desc_cand = np.zeros(n, dtype=bool)
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0 and (cand[i] or desc_cand[i]):
            desc_cand[p] = True
    launching = cand & ~desc_cand
    roots = launching | comm_root
    inside = _ancestors_flag(parent, roots) & ~roots
    # The CPU backend's own work (gloo:* ops on its worker threads) does not exist on a GPU run.
    backend = _ancestors_flag(parent, np.array([nm.startswith("gloo:") for nm in names], dtype=bool))
    inside |= backend

    launch_cost = cpu.launch_overhead
    pre_gap = np.nan_to_num(H.pre_gap.astype(float)) / cfg.host_speed
    tail = np.nan_to_num(H.tail.astype(float)) / cfg.host_speed
    pre_gap[inside] = 0.0
    tail[inside] = 0.0
    pre_gap[backend & (H.depth == 0)] = 0.0

    order = np.nonzero(roots)[0]
    order = order[np.argsort(H.start[order], kind="stable")]
    g_cols: dict[str, list] = {k: [] for k in ("cls", "kind", "copy_kind", "dur", "name", "launch", "op", "step",
                                                "bytes", "flops", "collective", "correlation")}
    intern = StringTable(rg.strings)
    strings = intern.strings

    l_host: list[int] = []
    sync_hosts: list[int] = []
    coll_gpu = C.gpu_op.copy()
    in_bytes, out_bytes = C.in_bytes.copy(), C.out_bytes.copy()
    for g, i in enumerate(order.tolist()):
        nm = names[i]
        l_host.append(i)
        if comm_root[i]:
            c = comm_of[i]
            kind[i] = HostKind.LAUNCH
            tail[i] = launch_cost + cfg.aten_overhead
            ctype = CollType(int(C.type[c]))
            dt = rg.name(int(C.dtype[c])).lower() if C.dtype[c] >= 0 else ""
            if cfg.dtype != "captured" and ("float" in dt or "half" in dt) and C.elem_bytes[c] > 0:
                f = _DTYPE_BYTES[cfg.dtype] / float(C.elem_bytes[c])
                in_bytes[c] *= f
                out_bytes[c] *= f
            coll_gpu[c] = g
            g_cols["cls"].append(OpClass.COLLECTIVE)
            g_cols["kind"].append(GpuKind.KERNEL)
            g_cols["copy_kind"].append(CopyKind.NONE)
            g_cols["dur"].append(0.0)
            g_cols["name"].append(intern(f"nccl:{rg.name(int(C.name[c])) or ctype.name.lower()}"))
            g_cols["collective"].append(c)
            g_cols["bytes"].append(float(in_bytes[c]))
            g_cols["flops"].append(math.nan)
        elif nm in _SYNC_OPS:
            kind[i] = HostKind.LAUNCH_SYNC
            tail[i] = launch_cost + cfg.aten_overhead
            sync_hosts.append(i)
            g_cols["cls"].append(OpClass.MEMCPY)
            g_cols["kind"].append(GpuKind.MEMCPY)
            g_cols["copy_kind"].append(CopyKind.DTOH)
            g_cols["dur"].append(model.floor)
            g_cols["name"].append(intern("Memcpy DtoH (Device -> Pinned)"))
            g_cols["collective"].append(-1)
            g_cols["bytes"].append(8.0)
            g_cols["flops"].append(math.nan)
        else:
            cls = op_class(nm)
            kind[i] = HostKind.LAUNCH
            tail[i] = launch_cost + cfg.aten_overhead
            flops, nbytes, dt = _work(rg, i, cls, cfg.dtype)
            g_cols["cls"].append(cls)
            g_cols["kind"].append(GpuKind.KERNEL)
            g_cols["copy_kind"].append(CopyKind.NONE)
            g_cols["dur"].append(model.time(cls.name.lower(), flops, nbytes, dt))
            g_cols["name"].append(intern(f"{cls.name.lower()}[{nm}]"))
            g_cols["collective"].append(-1)
            g_cols["bytes"].append(nbytes)
            g_cols["flops"].append(flops)
        g_cols["launch"].append(g)
        g_cols["op"].append(i)
        g_cols["step"].append(int(H.step[i]))
        g_cols["correlation"].append(g + 1)

    # durations follow from the new structure: dur = sum(children pre_gap + dur) + tail
    dur = tail.copy()
    for i in range(n - 1, -1, -1):
        p = parent[i]
        if p >= 0:
            dur[p] += pre_gap[i] + dur[i]
    start = H.start.copy()

    ng = len(order)
    gpu_ops = Table(
        "gpu_ops", ng,
        device=np.zeros(ng), stream=np.full(ng, cfg.stream), start=np.full(ng, np.nan),
        dur=np.array(g_cols["dur"], dtype=float), name=np.array(g_cols["name"]), kind=np.array(g_cols["kind"]),
        cls=np.array(g_cols["cls"]), copy_kind=np.array(g_cols["copy_kind"]),
        launch=np.array(g_cols["launch"]), op=np.array(g_cols["op"]), correlation=np.array(g_cols["correlation"]),
        step=np.array(g_cols["step"]), bytes=np.array(g_cols["bytes"], dtype=float),
        flops=np.array(g_cols["flops"], dtype=float), collective=np.array(g_cols["collective"]),
    )
    launches = Table("launches", ng, host_op=np.array(l_host), correlation=np.arange(1, ng + 1),
                     first_gpu_op=np.arange(ng), n_gpu_ops=np.ones(ng), device=np.zeros(ng),
                     stream=np.full(ng, cfg.stream))
    corr = np.full(n, -1)
    corr[order] = np.arange(1, ng + 1)
    host_ops = Table("host_ops", n, **{c: v for c, v in H.columns().items() if c not in
                                         ("kind", "pre_gap", "tail", "dur", "self_time", "start", "correlation")},
                     kind=kind, pre_gap=pre_gap, tail=tail, dur=dur, self_time=tail, start=start, correlation=corr)
    src = [np.array(l_host), np.arange(ng - 1) + n]
    dst = [np.arange(ng) + n, np.arange(1, ng) + n]
    knd = [np.full(ng, EdgeKind.LAUNCH), np.full(max(ng - 1, 0), EdgeKind.STREAM)]
    pos = {h: g for g, h in enumerate(l_host)}
    if sync_hosts:
        src.append(np.array([pos[h] + n for h in sync_hosts]))
        dst.append(np.array(sync_hosts))
        knd.append(np.full(len(sync_hosts), EdgeKind.SYNC))
    same = np.nonzero(H.thread[1:] == H.thread[:-1])[0]
    src.append(same)
    dst.append(same + 1)
    knd.append(np.full(len(same), EdgeKind.HOST))
    s_ = np.concatenate(src)
    edges = Table("edges", len(s_), src=s_, dst=np.concatenate(dst), kind=np.concatenate(knd),
                  inferred=np.zeros(len(s_)))
    colls = Table("collectives", len(C), **{c: v for c, v in C.columns().items()
                                             if c not in ("gpu_op", "in_bytes", "out_bytes")},
                  gpu_op=coll_gpu, in_bytes=in_bytes, out_bytes=out_bytes)
    steps = Table("steps", len(rg.steps), **{c: v for c, v in rg.steps.columns().items()
                                              if c not in ("gpu_start", "gpu_end", "n_gpu_ops")})
    source = dict(rg.source)
    source.update({"projected": True, "projected_onto": accelerator.name, "projection": json.dumps(cfg.__dict__)})
    return RankGraph(rank=rg.rank, world_size=rg.world_size, device_name=accelerator.name, strings=strings,
                     threads=rg.threads, host_ops=host_ops, gpu_ops=gpu_ops, launches=launches, collectives=colls,
                     groups=rg.groups, steps=steps, edges=edges, time_origin=rg.time_origin, source=source)


def project_to_gpu(graph: ExecutionGraph, accelerator: Accelerator, cpu: CPU,
                   cfg: ProjectionConfig | None = None, *,
                   kernel_model: Callable[[Accelerator], KernelTimeModel]) -> ExecutionGraph:
    """Project every rank of a CPU-captured ``graph`` onto ``accelerator`` hosted by ``cpu``; kernel times
    from ``kernel_model(accelerator)`` (e.g. ``kernel_model=cosim.models.RooflineModel``)."""
    cfg = cfg or ProjectionConfig()
    model = kernel_model(accelerator)
    ranks = [project_rank(rg, accelerator, cpu, cfg, model) for rg in graph.ranks]
    return ExecutionGraph(ranks)


def _has_kernel_work(rg: RankGraph) -> bool:
    """Whether projecting ``rg`` would launch anything: a collective, or an ATen op
    that is not a view / allocation / metadata op (:data:`NO_KERNEL`)."""
    if len(rg.collectives):
        return True
    H = rg.host_ops
    names = rg.strings
    ops = np.unique(H.name[(H.kind == HostKind.OP) & (H.name >= 0)])
    return any(names[int(k)].startswith("aten::") and names[int(k)] not in NO_KERNEL for k in ops)


def needs_projection(graph: ExecutionGraph) -> bool:
    """True for graphs without GPU ops (a CPU capture, an Execution Trace alone) that
    hold work a GPU would run. A CPU-only trace with nothing to launch (only
    allocations, views, or the CPU backend's own ``gloo:*`` work) is replayed as it
    is: its step time is then its mean ProfilerStep duration (docs/REPLAY.md)."""
    return (bool(graph.ranks) and all(len(rg.gpu_ops) == 0 for rg in graph.ranks)
            and any(_has_kernel_work(rg) for rg in graph.ranks))


def project_onto(graph: ExecutionGraph, topology: object, accelerator: str | None = None,
                 cfg: ProjectionConfig | None = None, *,
                 kernel_model: Callable[[Accelerator], KernelTimeModel]) -> ExecutionGraph:
    """Project ``graph`` onto the first GPU of ``topology`` (or catalog part ``accelerator``) and its host CPU,
    kernel times from ``kernel_model`` (see :func:`project_to_gpu`)."""
    topo = topology
    gpu0 = topo.gpus[0]  # type: ignore[attr-defined]
    acc_id = accelerator or topo.graph.nodes[gpu0].get("spec")  # type: ignore[attr-defined]
    acc = topo.catalog.accelerator(acc_id) if acc_id else topo.accelerator(gpu0)  # type: ignore[attr-defined]
    cpu = topo.cpu_spec(topo.cpu_of(gpu0))  # type: ignore[attr-defined]
    return project_to_gpu(graph, acc, cpu, cfg, kernel_model=kernel_model)
