"""Kernel features from an execution graph: what a kernel-time model needs to know.

For every GPU op of a :class:`~cosim.workload.graph.RankGraph` this module
derives, from the op's class, its kernel name and the shapes and dtypes of the
parent ATen op (Kineto ``Input Dims`` / ``Input type``, or the ET):

* GEMM-like ops: ``m, n, k`` (per batch / group), ``batch`` (bmm batch or number
  of groups of a grouped GEMM) and the math ``dtype`` (``bf16``, ``fp16``,
  ``fp32``, ``tf32`` when an fp32 GEMM ran on tensor cores, ``fp8``);
* attention: ``batch`` (B), ``heads`` (H), ``m`` (query length), ``n`` (key
  length), ``k`` (head dim) and ``bwd`` (backward kernel);
* every op: ``flops`` (FLOP) and ``bytes`` (minimum HBM traffic, bytes) split over
  the kernels its parent op launched in that class. The shape -> bytes rules of memory-bound
  ops (element counts, dtype sizes, ``mem_bytes``, gathers and scatters) live in
  :mod:`cosim.workload.cost`, shared with the execution graph's ``gpu_ops.bytes``.

Everything is SI: bytes, FLOPs, seconds. Unknown numbers are NaN / -1.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosim.workload.cost import (  # the shape -> bytes rules are shared with the execution graph
    CLASS_NAMES,
    DTYPE_OF_TYPE,
    elem_bytes,
)
from cosim.workload.cost import GATHERS as _GATHERS
from cosim.workload.cost import dtype_of as _dtype
from cosim.workload.cost import gather_bytes_from_launch as _gather_bytes_from_launch
from cosim.workload.cost import is_tensor_shape as _is_tensor_shape
from cosim.workload.cost import mem_bytes as _mem_bytes
from cosim.workload.cost import numel as _numel
from cosim.workload.graph import CopyKind, GpuKind, OpClass, RankGraph

__all__ = [
    "CLASS_NAMES",
    "DTYPE_OF_TYPE",
    "KernelFeatures",
    "elem_bytes",
    "extract_features",
    "feature_class",
    "reduced_axis",
]

@dataclass
class KernelFeatures:
    """Struct-of-arrays features of a rank's GPU ops (one entry per ``rg.gpu_ops`` row).

    Units: ``flops`` FLOP, ``bytes`` bytes, ``dur`` seconds.
    """

    cls: list[str] = field(default_factory=list)
    """Model class: gemm, grouped_gemm, attention, elementwise, reduction, norm, memcpy_dtod,
    memcpy_htod, memcpy_dtoh, memset, collective, moe_dispatch, moe_combine, other."""
    kernel: list[str] = field(default_factory=list)
    """Kernel name as recorded."""
    op_name: list[str] = field(default_factory=list)
    """Parent ATen op name ('' if none)."""
    dtype: list[str] = field(default_factory=list)
    """Math dtype ('' if unknown)."""
    m: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """GEMM M (rows of the output, per batch / mean per group); attention query length."""
    n: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """GEMM N; attention key length."""
    k: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """GEMM K (reduction); attention head dim."""
    batch: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """bmm batch, number of groups of a grouped GEMM, attention batch (1 if none)."""
    heads: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Attention query heads (1 otherwise)."""
    bwd: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))
    """Backward attention kernel."""
    flops: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """FLOPs of this kernel (its share of the parent op's), NaN if unknown."""
    bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Minimum HBM traffic of this kernel (bytes), NaN if unknown."""
    dur: np.ndarray = field(default_factory=lambda: np.zeros(0))
    """Measured duration (s)."""
    grid: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    """Grid dims (x, y, z), -1 if unknown (used to match shape-less ops to twins)."""
    block: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), dtype=np.int64))
    """Block dims (x, y, z), -1 if unknown."""
    elems: np.ndarray | None = None
    """Elements of the largest tensor a memory-bound op touches (its output for element-wise ops, split over
    the op's kernels like ``bytes``), NaN where unknown; None when no row has it (e.g. a database CSV)."""
    inferred: np.ndarray | None = None
    """Rows whose ``bytes`` were inferred from a neighbouring kernel's launch (:func:`infer_norm_bytes`),
    not read from shapes; None when no row was."""
    red_len: np.ndarray | None = None
    """Reductions, softmax and norms whose reduced axis is known (the parent op's ``dim`` / ``normalized_shape``
    from Kineto's ``Concrete Inputs``, :func:`reduced_axis`): elements reduced into each output, NaN elsewhere;
    None when no row has it."""
    red_stride: np.ndarray | None = None
    """Same rows: stride in elements of the innermost reduced axis (1: each output's elements come in
    contiguous runs; > 1: a strided reduction, the outputs being the contiguous axis), NaN elsewhere; None
    when no row has it."""

    def __len__(self) -> int:
        return len(self.cls)

    def row(self, i: int) -> dict[str, Any]:
        """Row ``i`` as a dict (CSV record)."""
        return {
            "cls": self.cls[i], "kernel": self.kernel[i], "op": self.op_name[i], "dtype": self.dtype[i],
            "m": float(self.m[i]), "n": float(self.n[i]), "k": float(self.k[i]), "batch": float(self.batch[i]),
            "heads": float(self.heads[i]), "bwd": int(self.bwd[i]), "flops": float(self.flops[i]),
            "bytes": float(self.bytes[i]), "dur_s": float(self.dur[i]),
        }


REDUCE_OPS = frozenset({
    "aten::sum", "aten::mean", "aten::amax", "aten::amin", "aten::prod", "aten::max", "aten::min",
    "aten::argmax", "aten::argmin", "aten::std", "aten::var", "aten::std_mean", "aten::var_mean",
    "aten::logsumexp", "aten::norm", "aten::linalg_vector_norm", "aten::any", "aten::all", "aten::nansum",
})
"""ATen reductions whose ``dim`` argument (second input; third for :data:`NORM_OPS`) names the reduced axes (all
axes when absent)."""
NORM_OPS = frozenset({"aten::norm", "aten::linalg_vector_norm"})
"""Reductions whose second input is the order ``p`` / ``ord``: ``norm(self, p, dim, keepdim)``,
``linalg_vector_norm(self, ord, dim, keepdim, dtype)``; their ``dim`` is the third input."""
SOFTMAX_OPS = frozenset({"aten::softmax", "aten::_softmax", "aten::log_softmax", "aten::_log_softmax"})
"""Softmax ops: ``dim`` (second input) is the reduced axis."""
SOFTMAX_BACKWARD_OPS = frozenset({"aten::_softmax_backward_data", "aten::_log_softmax_backward_data"})
"""Softmax backward ops: ``(grad, output, dim, dtype)``."""
LAYER_NORM_OPS = frozenset({"aten::layer_norm", "aten::native_layer_norm", "aten::rms_norm", "aten::_fused_rms_norm",
                            "aten::native_layer_norm_backward"})
"""Norms over the trailing ``normalized_shape`` (second input; the backward's is its third)."""


def _axes(text: str, ndim: int) -> list[int] | None:
    """Axes named by one ``Concrete Inputs`` entry ('-1', '[0, 2]'), made non-negative; [] when empty
    (every axis); None when unreadable or out of range."""
    t = text.strip()
    if t in ("", "[]", "None"):
        return []
    try:
        v = json.loads(t)
    except ValueError:
        return None
    vals = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) for x in vals):
        return None
    out = sorted({x + ndim if x < 0 else x for x in vals})
    return out if all(0 <= x < ndim for x in out) else None


def _shape_len(text: str) -> int | None:
    """Number of trailing axes a ``normalized_shape`` entry ('[512]', '[64, 64]') names; None when unreadable.
    (A shape, not a set of axes: repeated sizes each count.)"""
    try:
        v = json.loads(text.strip())
    except ValueError:
        return None
    vals = v if isinstance(v, list) else [v]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in vals):
        return None
    return len(vals)


def reduced_axis(op: str, shapes: list, concrete: list) -> tuple[float, float] | None:
    """``(elements reduced into each output, stride in elements of the reduced axis)`` of a reduction,
    softmax or layer norm ATen op, from its input shapes (contiguous layout assumed: Kineto records no
    strides) and its ``Concrete Inputs`` (``dim`` / ``normalized_shape``); None when the op is not one of
    these or the arguments do not say. The stride is that of the innermost reduced axis: 1 when an output's
    elements come in contiguous runs (read with vector loads, combined across a warp), > 1 when the outputs
    are the contiguous axis and each thread walks its output's elements with that stride. A batch norm
    (NCHW) reduces every axis but the channel (stride 1: runs of H x W)."""
    x = shapes[0] if shapes else None
    if x is None or not _is_tensor_shape(x) or (x and isinstance(x[0], list)):
        return None
    try:
        dims = [int(d) for d in x]
    except (TypeError, ValueError):
        return None
    nd = len(dims)
    if nd == 0:
        return None
    axes: list[int] | None
    if op in REDUCE_OPS:
        pos = 2 if op in NORM_OPS else 1
        if len(concrete) <= pos:
            return None
        axes = _axes(str(concrete[pos]), nd)
        if axes == []:
            axes = list(range(nd))
    elif op in SOFTMAX_OPS or op in SOFTMAX_BACKWARD_OPS:
        pos = 2 if op in SOFTMAX_BACKWARD_OPS else 1
        axes = _axes(str(concrete[pos]), nd) if len(concrete) > pos else None
        if axes is not None and len(axes) != 1:
            return None
    elif op in LAYER_NORM_OPS:
        pos = 2 if op == "aten::native_layer_norm_backward" else 1
        ns = _shape_len(str(concrete[pos])) if len(concrete) > pos else None
        if not ns or ns > nd:
            return None
        axes = list(range(nd - ns, nd))
    elif op in ("aten::batch_norm", "aten::native_batch_norm", "aten::cudnn_batch_norm",
                "aten::native_batch_norm_backward", "aten::cudnn_batch_norm_backward") and nd >= 2:
        axes = [0, *range(2, nd)]
    else:
        return None
    if not axes:
        return None
    red = float(np.prod([dims[a] for a in axes]))
    inner = max(axes)
    stride = float(np.prod(dims[inner + 1:])) if inner + 1 < nd else 1.0
    if red < 1:
        return None
    return red, max(stride, 1.0)


def feature_class(cls: int, copy_kind: int) -> str:
    """Model class name of a GPU op from its ``OpClass`` and copy direction."""
    if cls == OpClass.MEMCPY:
        if copy_kind == CopyKind.HTOD:
            return "memcpy_htod"
        if copy_kind == CopyKind.DTOH:
            return "memcpy_dtoh"
        return "memcpy_dtod"
    return CLASS_NAMES.get(int(cls), "other")


_CONV = re.compile(r"conv|miopen_convolution|cudnn_convolution", re.I)
_GEMM_AUX = re.compile(r"splitKreduce|splitK_reduce|split_k_reduce|reduce_splitk|reduce_1Block_kernel", re.I)
"""Split-K reduction kernels a GEMM launches after its main kernel (cuBLAS, CUTLASS)."""
_GEMM_NAME = re.compile(r"gemm|gemv|cutlass|nvjet|xmma|cublas|cijk|matmul|_mm|mma|conv|cudnn|miopen|triton|dot|"
                        r"sm\d\d_|ampere|volta|turing|hopper|blackwell|igemm|wgrad|dgrad", re.I)
"""Kernel names that look like a GEMM / convolution (``fbgemm`` removed first: its embedding kernels are not)."""
_TF32_KERNEL = re.compile(r"tf32|s1688|s16816gemm(?!.*bf16)|tensorop_s|xmma_gemm_f32f32_tf32", re.I)


def _conv_stride(x: list, w: list) -> int:
    """Guessed convolution stride (Kineto does not record it): a kernel of 8 or more that tiles
    the input exactly is a patchify convolution (stride = kernel, ViT); 7x7 stems use 2; else 1."""
    r = int(w[-1])
    if r >= 8 and all(int(d) % r == 0 for d in x[2:]):
        return r
    if r == 7:
        return 2
    return 1


def _gemm_dims(op: str, shapes: list, types: list) -> tuple[float, float, float, float] | None:
    """(m, n, k, batch) of a GEMM-like ATen op from its input shapes, or None."""
    t = [s for s in shapes if _is_tensor_shape(s) and not isinstance(s[0], list)]
    try:
        if op in ("aten::mm", "aten::_scaled_mm") and len(t) >= 2:
            (m, k), (_, n) = t[0][-2:], t[1][-2:]
            return m, n, k, 1
        if op == "aten::addmm" and len(t) >= 3:
            (m, k), (_, n) = t[-2][-2:], t[-1][-2:]
            return m, n, k, 1
        if op in ("aten::bmm",) and len(t) >= 2:
            b, m, k = t[0][-3:]
            n = t[1][-1]
            return m, n, k, b
        if op in ("aten::baddbmm", "aten::addbmm") and len(t) >= 3:
            b, m, k = t[1][-3:]
            n = t[2][-1]
            return m, n, k, b
        if op == "aten::linear" and len(t) >= 2:
            k = t[0][-1]
            m = float(np.prod(t[0][:-1]))
            return m, t[1][0], k, 1
        if op == "aten::matmul" and len(t) >= 2:
            a, b = t[0], t[1]
            k = a[-1]
            n = b[-1] if len(b) >= 2 else 1
            if len(b) <= 2:
                return float(np.prod(a[:-1])), n, k, 1
            return a[-2] if len(a) >= 2 else 1, n, k, float(np.prod(b[:-2]))
        if "_grouped_mm" in op and len(t) >= 2:
            a, b = t[0], t[1]
            if len(a) == 2 and len(b) == 3:  # 2d x 3d: tokens stacked, one weight per group
                g = b[0]
                return a[0] / g, b[-1], a[-1], g
            if len(a) == 3 and len(b) == 3:
                return a[1], b[-1], a[-1], a[0]
            if len(a) == 2 and len(b) == 2:  # 2d x 2d: groups split K
                return a[0], b[-1], a[-1], 1
        if _CONV.search(op) and len(t) >= 2 and len(t[0]) >= 3 and len(t[1]) == len(t[0]):
            x, w = t[0], t[1]  # NCHW / OIHW; strides are not recorded: see _conv_stride
            stride = _conv_stride(x, w)
            spatial = float(np.prod([math.ceil(d / stride) for d in x[2:]]))
            return x[0] * spatial, w[0], float(np.prod(w[1:])), 1
    except (TypeError, ValueError, IndexError):
        return None
    return None


def _attn_dims(op: str, shapes: list) -> tuple[float, float, float, float, float, bool] | None:
    """(batch, heads, sq, sk, head_dim, bwd) of an attention op, or None."""
    t = [s for s in shapes if _is_tensor_shape(s) and not isinstance(s[0], list) and len(s) == 4]
    if len(t) < 2:
        return None
    bwd = "backward" in op
    q = t[1] if bwd and len(t) >= 3 else t[0]
    kk = t[2] if bwd and len(t) >= 3 else t[1]
    # flash / efficient kernels: [B, S, H, D]; SDPA wrappers: [B, H, S, D]
    bshd = op in ("aten::_flash_attention_forward", "aten::_flash_attention_backward",
                  "aten::_efficient_attention_forward", "aten::_efficient_attention_backward") or "flash_attn" in op
    try:
        if bshd:
            return q[0], q[2], q[1], kk[1], q[3], bwd
        return q[0], q[1], q[2], kk[2], q[3], bwd
    except (TypeError, IndexError):
        return None


def extract_features(rg: RankGraph) -> KernelFeatures:
    """Features of every GPU op of ``rg`` (see :class:`KernelFeatures`)."""
    G = rg.gpu_ops
    H = rg.host_ops
    n = len(G)
    S = rg.strings
    f = KernelFeatures(
        cls=[""] * n, kernel=[""] * n, op_name=[""] * n, dtype=[""] * n,
        m=np.full(n, np.nan), n=np.full(n, np.nan), k=np.full(n, np.nan), batch=np.ones(n), heads=np.ones(n),
        bwd=np.zeros(n, dtype=bool), flops=np.full(n, np.nan), bytes=np.full(n, np.nan),
        dur=np.asarray(G.dur, dtype=float).copy(),
        grid=np.asarray(G.grid, dtype=np.int64).reshape(n, 3) if n else np.zeros((0, 3), np.int64),
        block=np.asarray(G.block, dtype=np.int64).reshape(n, 3) if n else np.zeros((0, 3), np.int64),
    )
    # kernels per (parent op, class): the parent's work is split among them
    share: dict[tuple[int, str], int] = {}
    classes = [feature_class(int(G.cls[j]), int(G.copy_kind[j])) for j in range(n)]
    aux = np.zeros(n, dtype=bool)
    for j in range(n):
        if classes[j] in ("gemm", "grouped_gemm") and G.name[j] >= 0 and _GEMM_AUX.search(S[int(G.name[j])]):
            aux[j] = True  # split-K reduction of a GEMM: memory-bound, not a second GEMM
            classes[j] = "elementwise"
        elif (classes[j] in ("gemm", "grouped_gemm") and G.op[j] < 0 and G.name[j] >= 0
              and not _GEMM_NAME.search(S[int(G.name[j])].replace("fbgemm", ""))):
            classes[j] = "other"  # no parent op and not a GEMM-looking kernel (embedding, permute)
    for j in range(n):
        o = int(G.op[j])
        if o >= 0:
            share[(o, classes[j])] = share.get((o, classes[j]), 0) + 1
    elems = np.full(n, np.nan)
    red_len, red_stride = np.full(n, np.nan), np.full(n, np.nan)
    parsed: dict[int, tuple[str, list, list]] = {}
    axis_of: dict[int, tuple[float, float] | None] = {}
    for j in range(n):
        c = classes[j]
        f.cls[j] = c
        f.kernel[j] = S[int(G.name[j])] if G.name[j] >= 0 else ""
        o = int(G.op[j])
        if G.kind[j] in (GpuKind.MEMCPY, GpuKind.MEMSET) and np.isfinite(G.bytes[j]):
            f.bytes[j] = float(G.bytes[j])
        if o < 0:
            continue
        if o not in parsed:
            sh = H.input_shapes[o]
            ty = H.input_types[o]
            shapes = json.loads(S[int(sh)]) if sh >= 0 else []
            types = json.loads(S[int(ty)]) if ty >= 0 else []
            parsed[o] = (S[int(H.name[o])] if H.name[o] >= 0 else "", shapes or [], types or [])
        op, shapes, types = parsed[o]
        f.op_name[j] = op
        cnt = share.get((o, c), 1)
        tdt = next((_dtype(t) for t in types if isinstance(t, str) and _dtype(t)), "")
        if c in ("gemm", "grouped_gemm"):
            d = _gemm_dims(op, shapes, types)
            if d is not None:
                m, nn, kk, b = (float(x) for x in d)
                f.m[j], f.n[j], f.k[j], f.batch[j] = m, nn, kk, max(b, 1.0)
                dt = tdt or "fp32"
                if dt == "fp32" and _TF32_KERNEL.search(f.kernel[j]) and "sgemm" not in f.kernel[j]:
                    dt = "tf32"
                f.dtype[j] = dt
                eb = elem_bytes(dt if dt != "tf32" else "fp32")
                f.flops[j] = 2.0 * m * nn * kk * max(b, 1.0) / cnt
                bw = kk * nn * (b if "_grouped_mm" in op or op in ("aten::bmm", "aten::baddbmm") else 1)
                f.bytes[j] = (m * kk * b + bw + m * nn * b) * eb / cnt
            elif f.kernel[j] and not _GEMM_NAME.search(f.kernel[j].replace("fbgemm", "")):
                f.cls[j] = "other"  # a non-GEMM kernel (embedding, permute) under a GEMM-class op
        elif c == "attention":
            ad = _attn_dims(op, shapes)
            if ad is not None:
                b, h, sq, sk, hd, bwd = ad
                f.batch[j], f.heads[j], f.m[j], f.n[j], f.k[j], f.bwd[j] = b, h, sq, sk, hd, bwd
                f.dtype[j] = tdt or "bf16"
                fl = 4.0 * b * h * sq * sk * hd * (2.5 if bwd else 1.0)
                f.flops[j] = fl / cnt
                eb = elem_bytes(f.dtype[j])
                f.bytes[j] = (2 * b * h * sq * hd + 2 * b * h * sk * hd) * eb * (2 if bwd else 1) / cnt
        elif aux[j]:
            d = _gemm_dims(op, shapes, types)
            if d is not None:
                m, nn, _, b = (float(x) for x in d)
                f.dtype[j] = tdt
                # reads >= 2 fp32 partial-sum slices, writes the output
                f.bytes[j] = m * nn * max(b, 1.0) * (2 * 4.0 + elem_bytes(tdt or "fp32")) / cnt
        elif c in ("elementwise", "reduction", "norm", "other", "moe_dispatch", "moe_combine", "memset"):
            if not np.isfinite(f.bytes[j]):
                gb = _gather_bytes_from_launch(f.kernel[j], f.grid[j], shapes, types) if op in _GATHERS else math.nan
                f.bytes[j] = gb if np.isfinite(gb) else _mem_bytes(op, shapes, types, c) / cnt
                sizes = [_numel(sh) for sh in shapes if _is_tensor_shape(sh)]
                if sizes and max(sizes) > 0:
                    elems[j] = max(sizes) / cnt
            if c in ("reduction", "norm", "elementwise") and o not in axis_of:
                axis_of[o] = reduced_axis(op, shapes, _concrete(rg, o))
            if c in ("reduction", "norm", "elementwise") and axis_of[o] is not None:
                red_len[j], red_stride[j] = axis_of[o]  # type: ignore[misc]
            f.dtype[j] = tdt
        if not np.isfinite(f.flops[j]) and np.isfinite(G.flops[j]) and c in ("gemm", "grouped_gemm", "attention"):
            f.flops[j] = float(G.flops[j])
    if np.isfinite(elems).any():
        f.elems = elems
    if np.isfinite(red_len).any():
        f.red_len, f.red_stride = red_len, red_stride
    infer_norm_bytes(rg, f)
    return f


def _concrete(rg: RankGraph, o: int) -> list:
    """Decoded ``Concrete Inputs`` of host op ``o`` ([] when not recorded)."""
    k = int(rg.host_ops.concrete_inputs[o])
    if k < 0:
        return []
    v = json.loads(rg.strings[k])
    return v if isinstance(v, list) else []


_ELEMENTWISE_LAUNCH = re.compile(r"\b(?:vectorized_elementwise_kernel|unrolled_elementwise_kernel|elementwise_kernel)<")
_ELEMENTWISE_WORK = re.compile(r"\belementwise_kernel<(\d+), (\d+)")
_ITEM_BYTES = (("double", 8.0), ("c10::Half", 2.0), ("__half", 2.0), ("c10::BFloat16", 2.0), ("float", 4.0))
NORM_PASSES = {False: 2.0, True: 3.0}
"""Tensor-sized transfers a norm kernel is charged, the convention of ops with shapes (:func:`_mem_bytes`:
inputs + an output), so that efficiencies fitted on those apply: forward x in, y out (2); backward x and dy
in, dx out (3)."""
NEIGHBOURS = 3
"""How far (ops on the same stream, same step) :func:`infer_norm_bytes` looks for an element-wise launch."""


def _elementwise_numel(kernel: str, grid: np.ndarray, block: np.ndarray) -> float:
    """Elements a PyTorch element-wise kernel covers, from its launch: ``prod(grid) * prod(block) *
    work per thread`` (``elementwise_kernel<threads, work>`` spells it; the vectorized/unrolled kernels use
    PyTorch's ``thread_work_size`` of 4). Exact up to one block's work (the grid is rounded up); NaN for a
    single-block launch."""
    if not _ELEMENTWISE_LAUNCH.search(kernel) or (grid < 1).any() or (block < 1).any() or np.prod(grid) < 2:
        return math.nan  # a one-block launch is scalar bookkeeping (e.g. num_batches_tracked += 1)
    m = _ELEMENTWISE_WORK.search(kernel)
    per_thread = float(m.group(2)) if m else 4.0
    return float(np.prod(grid) * np.prod(block)) * per_thread


def infer_norm_bytes(rg: RankGraph, f: KernelFeatures) -> None:
    """Bytes of norm kernels without shapes, from the tensor their neighbours touch.

    A trace without ``Input Dims`` says nothing of a batch-norm's tensor, and its launch neither (cuDNN's
    ``bn_*_1C11`` kernels launch one block per channel and loop). The element-wise kernel next to it on the
    same stream (the ReLU or residual add after a forward norm, the ReLU backward before a backward one)
    covers the same tensor, and PyTorch's element-wise launch gives its element count exactly (up to one
    block). So: bytes = elements x item size (from the kernel's template, fp32 by default) x
    :data:`NORM_PASSES`, taking the nearest such neighbour within :data:`NEIGHBOURS` ops on the same stream
    and step (the following one first for a forward kernel, the preceding one first for a backward one).
    Sets ``f.inferred`` on the rows it fills; rows with bytes already known are left alone."""
    G = rg.gpu_ops
    todo = [j for j in range(len(f)) if f.cls[j] == "norm" and not np.isfinite(f.bytes[j]) and f.kernel[j]]
    if not todo:
        return
    order: dict[tuple[int, int, int], list[int]] = {}
    for j in np.argsort(G.start, kind="stable"):
        order.setdefault((int(G.device[j]), int(G.stream[j]), int(G.step[j])), []).append(int(j))
    pos = {j: (key, i) for key, js in order.items() for i, j in enumerate(js)}
    inferred = np.zeros(len(f), dtype=bool)
    for j in todo:
        key, i = pos[j]
        js = order[key]
        bwd = bool(re.search(r"bw|backward|bwd|grad", f.kernel[j], re.I))
        steps = [(-d, d) if bwd else (d, -d) for d in range(1, NEIGHBOURS + 1)]
        numel = math.nan
        for offs in steps:
            for o in offs:
                if 0 <= i + o < len(js):
                    q = js[i + o]
                    numel = _elementwise_numel(f.kernel[q], f.grid[q], f.block[q])
                    if np.isfinite(numel):
                        break
            if np.isfinite(numel):
                break
        if not np.isfinite(numel):
            continue
        item = next((b for t, b in _ITEM_BYTES if f"<{t}" in f.kernel[j].replace(" ", "")), 4.0)
        f.bytes[j] = numel * item * NORM_PASSES[bwd]
        inferred[j] = True
    if inferred.any():
        f.inferred = inferred
