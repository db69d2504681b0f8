"""Work of an ATen op from its input shapes: element counts, item sizes, minimum bytes and FLOPs.

One implementation shared by two layers:

* the execution graph (:func:`fill_gpu_costs`, called by the Kineto importer and after an ET link)
  fills ``gpu_ops.bytes`` / ``gpu_ops.flops`` of the non-GEMM kernels (element-wise, reduction,
  norm, other, MoE routing) whose parent ATen op has ``Input Dims``;
* the kernel models (:mod:`cosim.models.features`) import the same helpers for their features.

Conventions (docs/EXECUTION_GRAPH.md, "Bytes and FLOPs of GPU ops"):

* **bytes** (:func:`mem_bytes`): the minimum HBM traffic of the op — every tensor input once plus
  an output the size of the largest input (reductions: inputs only; fills: the tensor once;
  copies: read + write; gathers/scatters: the rows they touch, not the whole table). The item size
  comes from the recorded dtype (``Input type``), fp32 when unknown.
* **FLOPs** (:func:`op_flops`): element-wise ops and activations 1 per output element (the largest
  input); reductions 1 per input element; softmax and norms :data:`SOFTMAX_FLOPS` /
  :data:`NORM_FLOPS` per element; pure data movement (copies, cat, fills, gathers, non-accumulating
  scatters) 0; accumulating scatters 1 per source element.
* An op's bytes and FLOPs are split evenly over the kernels it launched **in the same class**
  (each class's kernels get the op's full figure between them, as the kernel models do).

Everything is SI: bytes, FLOPs. Unknown numbers are NaN.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np

from cosim.workload.graph import GpuKind, OpClass, RankGraph

__all__ = [
    "CLASS_NAMES",
    "DTYPE_OF_TYPE",
    "GATHERS",
    "ITEM_BYTES",
    "NORM_FLOPS",
    "SCATTERS",
    "SOFTMAX_FLOPS",
    "dtype_of",
    "elem_bytes",
    "fill_gpu_costs",
    "gather_bytes_from_launch",
    "is_tensor_shape",
    "mem_bytes",
    "numel",
    "op_flops",
]

DTYPE_OF_TYPE: dict[str, str] = {
    "float": "fp32",
    "double": "fp64",
    "c10::half": "fp16",
    "half": "fp16",
    "c10::bfloat16": "bf16",
    "bfloat16": "bf16",
    "c10::float8_e4m3fn": "fp8",
    "c10::float8_e5m2": "fp8",
    "c10::float8_e4m3fnuz": "fp8",
    "c10::float8_e5m2fnuz": "fp8",
    "c10::float8_e8m0fnu": "fp8",
    "long int": "int64",
    "long": "int64",
    "int": "int32",
    "short int": "int16",
    "bool": "bool",
    "unsigned char": "uint8",
    "signed char": "int8",
    "c10::complex<float>": "c64",
}
"""Kineto/ET element-type names → cosim dtype names."""

ITEM_BYTES: dict[str, float] = {
    "fp64": 8,
    "fp32": 4,
    "tf32": 4,
    "fp16": 2,
    "bf16": 2,
    "fp8": 1,
    "mxfp8": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "c64": 8,
    "fp4": 0.5,
    "mxfp4": 0.5,
}
"""Bytes per element of a cosim dtype name."""

CLASS_NAMES: dict[int, str] = {
    OpClass.GEMM: "gemm",
    OpClass.GROUPED_GEMM: "grouped_gemm",
    OpClass.ATTENTION: "attention",
    OpClass.ELEMENTWISE: "elementwise",
    OpClass.REDUCTION: "reduction",
    OpClass.NORM: "norm",
    OpClass.MEMCPY: "memcpy",
    OpClass.MEMSET: "memset",
    OpClass.COLLECTIVE: "collective",
    OpClass.MOE_DISPATCH: "moe_dispatch",
    OpClass.MOE_COMBINE: "moe_combine",
    OpClass.OTHER: "other",
}
"""``OpClass`` → the class name used in profiles, reports and :func:`mem_bytes`."""


def elem_bytes(dtype: str) -> float:
    """Bytes per element of a cosim dtype name (4 when unknown)."""
    return ITEM_BYTES.get(dtype, 4.0)


def dtype_of(type_name: str) -> str:
    """cosim dtype name of a Kineto/ET element-type name ('c10::BFloat16' → 'bf16'), '' if unknown."""
    return DTYPE_OF_TYPE.get(type_name.strip().lower(), "")


def numel(shape: object) -> float:
    """Elements of a recorded shape (a TensorList: the sum over its tensors); 0 for a non-shape,
    1 for ``[]`` (a scalar)."""
    if not isinstance(shape, list) or not shape:
        return 0.0 if not isinstance(shape, list) else 1.0
    if isinstance(shape[0], list):  # TensorList
        return sum(numel(s) for s in shape)
    try:
        return float(math.prod([max(int(d), 0) for d in shape]))
    except (TypeError, ValueError):
        return 0.0


def is_tensor_shape(s: object) -> bool:
    """A recorded input that is a tensor (or TensorList) shape, not a scalar (``[]``) or a non-list."""
    return isinstance(s, list) and len(s) > 0


GATHERS = ("aten::index", "aten::index_select", "aten::gather", "aten::embedding", "aten::take")
"""Ops that read rows of a table selected by an index (traffic: the rows they gather)."""
_OVERWRITES = (
    "aten::scatter_",
    "aten::scatter",
    "aten::index_put_",
    "aten::index_put",
    "aten::_index_put_impl_",
    "aten::index_copy_",
    "aten::index_fill_",
    "aten::masked_scatter_",
)
"""Indexed updates that overwrite the rows they select (no arithmetic: data movement)."""
_ACCUMULATES = (
    "aten::index_add_",
    "aten::index_add",
    "aten::scatter_add_",
    "aten::scatter_add",
    "aten::scatter_reduce_",
    "aten::scatter_reduce",
)
"""Indexed updates that add (or reduce) into the rows they select: one FLOP per source element."""
SCATTERS = (*_ACCUMULATES, *_OVERWRITES)
"""Ops that update rows of a target selected by an index (traffic: the rows they update)."""
_COPIES = ("aten::copy_", "aten::_to_copy", "aten::to", "aten::cat", "aten::clone", "aten::contiguous")
FUSED_OPTIMIZERS: dict[str, tuple[int, ...]] = {
    "aten::_fused_adam_": (0, 2, 3, 4),
    "aten::_fused_adamw_": (0, 2, 3, 4),
    "aten::_fused_sgd_": (0, 2),
    "aten::_fused_adagrad_": (0, 2),
}
"""Fused optimizer steps: the positions of the tensor lists they update in place (params, then optimizer
state: Adam's exp_avg, exp_avg_sq and, with amsgrad, max_exp_avg_sq; SGD's momentum buffers; Adagrad's
state sums). Traffic = every list read + those lists written (Adam: 4 read + 3 written), not the generic
inputs + one output."""


def mem_bytes(op: str, shapes: list, types: list, fcls: str) -> float:
    """Minimum bytes an ATen op moves, from its input shapes (inputs + an output the size of the largest).

    ``fcls`` is the class name of the kernel (:data:`CLASS_NAMES`): reductions write a small output
    (inputs only), memsets write the tensor once."""
    sizes = []
    for s, ty in zip(shapes, types + [""] * (len(shapes) - len(types))):
        if not is_tensor_shape(s):
            continue
        if isinstance(s[0], list):  # TensorList: assume the list's dtype
            sizes.append(numel(s) * elem_bytes(dtype_of(ty) or "fp32"))
        else:
            sizes.append(numel(s) * elem_bytes(dtype_of(ty) or "fp32"))
    if not sizes:
        return math.nan
    if op.endswith(("fill_", "zero_")) or fcls == "memset":
        return sizes[0]
    if op in FUSED_OPTIMIZERS:
        listed = [numel(s) * elem_bytes(dtype_of(ty) or "fp32") if is_tensor_shape(s) else 0.0
                  for s, ty in zip(shapes, types + [""] * (len(shapes) - len(types)))]
        return sum(sizes) + sum(listed[i] for i in FUSED_OPTIMIZERS[op] if i < len(listed))
    if op in _COPIES:
        return 2 * max(sizes) if op != "aten::copy_" else sum(sizes[:2])
    tens = [
        (s, numel(s) * elem_bytes(dtype_of(ty) or "fp32"))
        for s, ty in zip(shapes, types + [""] * (len(shapes) - len(types)))
        if is_tensor_shape(s) and not isinstance(s[0], list)
    ]
    if op in GATHERS and len(tens) >= 2:
        # gathers read as many rows as they write (index size x row width), not the whole table
        table, tbytes = tens[0]
        idx, ibytes = tens[1]
        if op == "aten::gather":  # output has the index's shape
            out = numel(idx) * tbytes / max(numel(table), 1.0)
        else:  # index_select / embedding / index: rows of the table along dim 0
            row = tbytes / max(float(table[0]), 1.0)
            out = numel(idx) * row
        return 2.0 * out + ibytes
    if op in SCATTERS and len(tens) >= 2:
        # scatters touch the updated rows only: read the source, read-modify-write the target rows
        rest = [b for _, b in tens[1:]]
        return sum(rest) + 2.0 * max(rest)
    if fcls == "reduction":
        return sum(sizes)
    return sum(sizes) + max(sizes)


_VEC_GATHER = re.compile(r"vectorized_gather_kernel")
_INDEX_ELEMWISE = re.compile(r"index_elementwise_kernel<(\d+),\s*(\d+)")


def gather_bytes_from_launch(kernel: str, grid: np.ndarray, shapes: list, types: list) -> float:
    """Bytes of an ``aten::index``-style gather from its kernel launch, NaN if unknown.

    Kineto records ``aten::index``'s indices as a TensorList it does not size (``[]``), so the
    number of gathered rows is read from the launch configuration of PyTorch's gather kernels:
    ``vectorized_gather_kernel`` launches one block column per index (``grid.x = #indices``) and
    copies one row (``table[0]``'s trailing dims) each; ``index_elementwise_kernel<nt, vt>`` launches
    ``ceil(out_numel / (nt*vt))`` blocks. Traffic = read + write of the gathered rows (+ indices).
    """
    if not shapes or not is_tensor_shape(shapes[0]) or isinstance(shapes[0][0], list) or grid[0] <= 0:
        return math.nan
    eb = elem_bytes(dtype_of(types[0]) if types else "") if types and dtype_of(types[0]) else 4.0
    if _VEC_GATHER.search(kernel):
        row = numel(shapes[0][1:]) if len(shapes[0]) >= 2 else 1.0
        nidx = float(grid[0])
        return nidx * (2.0 * row * eb + 8.0)
    mt = _INDEX_ELEMWISE.search(kernel)
    if mt:
        out = float(grid[0]) * max(int(grid[1]), 1) * int(mt.group(1)) * int(mt.group(2))
        out = min(out, numel(shapes[0]) * 64)  # last block is partial; cap absurd grids
        return out * (2.0 * eb + 8.0)
    return math.nan


# -- FLOPs --------------------------------------------------------------------------------------------

SOFTMAX_FLOPS = 5.0
"""FLOPs per element of softmax / log-softmax (forward or backward): max, subtract, exp, sum, divide."""
NORM_FLOPS = 5.0
"""FLOPs per element of a norm (layer, RMS, batch, group, instance; forward or backward): mean and variance,
normalize, scale and shift — the count of fvcore's and DeepSpeed's FLOP counters for an affine norm."""
_SOFTMAX = re.compile(r"softmax", re.I)
_NORM = re.compile(r"norm", re.I)
_MOVES = (
    *_COPIES,
    *_OVERWRITES,
    "aten::stack",
    "aten::flip",
    "aten::roll",
    "aten::repeat",
    "aten::constant_pad_nd",
    "aten::fill_",
    "aten::zero_",
)
"""Pure data movement: no arithmetic (0 FLOPs)."""


def op_flops(op: str, shapes: list, fcls: str) -> float:
    """FLOPs of a non-GEMM ATen op from its input shapes, NaN if they do not tell.

    Softmax :data:`SOFTMAX_FLOPS` and norms :data:`NORM_FLOPS` per element of the largest input;
    copies, fills, gathers and non-accumulating scatters 0; accumulating scatters 1 per source
    element; otherwise by the kernel's class ``fcls``: ``reduction`` 1 per input element (of the
    largest input), ``elementwise`` 1 per output element (the largest input: inputs broadcast to
    the output). Other classes (``other``, MoE routing) are NaN."""
    el = [numel(s) for s in shapes if is_tensor_shape(s)]
    if not el:
        return math.nan
    big = max(el)
    if op in _MOVES or op in GATHERS or op.endswith(("fill_", "zero_")):
        return 0.0
    if op in _ACCUMULATES:
        rest = [numel(s) for s in shapes[1:] if is_tensor_shape(s)]
        return max(rest) if rest else math.nan
    if _SOFTMAX.search(op):
        return SOFTMAX_FLOPS * big
    if _NORM.search(op) or fcls == "norm":
        return NORM_FLOPS * big
    if fcls in ("reduction", "elementwise"):
        return big
    return math.nan


# -- the execution graph --------------------------------------------------------------------------------

_MEMORY_CLASSES = (
    OpClass.ELEMENTWISE,
    OpClass.REDUCTION,
    OpClass.NORM,
    OpClass.OTHER,
    OpClass.MOE_DISPATCH,
    OpClass.MOE_COMBINE,
)
"""Kernel classes whose bytes and FLOPs come from :func:`mem_bytes` / :func:`op_flops` (GEMM and attention
get theirs from ``classify.op_flops_bytes``; collectives from the collectives table)."""


def fill_gpu_costs(rg: RankGraph, memo: dict[tuple[str, str, str | None, int], tuple[float, float]] | None = None,
                   parsed_text: dict[tuple[str, str | None], tuple[list, list]] | None = None) -> int:
    """Fill ``gpu_ops.bytes`` / ``gpu_ops.flops`` of the rank's non-GEMM kernels from their parent op's shapes.

    In place; only NaN entries are filled (trace sizes and GEMM figures are kept), so calling it
    again (after an ET link gave ops their shapes) is safe. Kernels of :data:`_MEMORY_CLASSES` whose
    parent op has input shapes get :func:`mem_bytes` (or, for gathers, :func:`gather_bytes_from_launch`)
    and :func:`op_flops`, divided by the number of kernels of the same class the op launched; memcpy
    and memset ops get 0 FLOPs. Returns the number of kernels given bytes. ``memo``: the figures by (op
    name, shapes, dtypes, class) text, and ``parsed_text`` the parsed (shapes, dtypes) by text, shared by the
    ranks of one load (their ops repeat across ranks; both only read)."""
    G, H, S = rg.gpu_ops, rg.host_ops, rg.strings
    n = len(G)
    if not n:
        return 0
    kind = np.asarray(G.kind)
    G.flops[(kind == GpuKind.MEMCPY) | (kind == GpuKind.MEMSET)] = 0.0
    op = np.asarray(G.op)
    sel = (kind == GpuKind.KERNEL) & (op >= 0) & np.isin(G.cls, np.array(_MEMORY_CLASSES, np.int8))
    if not sel.any():
        return 0
    has_shapes = np.zeros(len(H), bool)
    has_shapes[H.input_shapes >= 0] = True
    sel &= has_shapes[np.maximum(op, 0)]
    idx = np.nonzero(sel)[0].tolist()
    op_l, cls_l, gname_l = op.tolist(), G.cls.tolist(), G.name.tolist()
    hname_l, hshape_l, htype_l = H.name.tolist(), H.input_shapes.tolist(), H.input_types.tolist()
    share: dict[tuple[int, int], int] = {}
    for j in idx:
        key = (op_l[j], cls_l[j])
        share[key] = share.get(key, 0) + 1
    # (shapes, dtypes) strings -> parsed lists, once per distinct pair of interned strings
    parsed: dict[tuple[int, int], tuple[list, list]] = {}
    # ops with the same name, shapes and dtypes have the same figures per class
    if memo is None:
        memo = {}
    filled = 0
    gbytes, gflops = G.bytes, G.flops
    bytes_l, flops_l = gbytes.tolist(), gflops.tolist()
    for j in idx:
        o, c = op_l[j], cls_l[j]
        sk = (hshape_l[o], htype_l[o])
        got = parsed.get(sk)
        if got is None:
            tk = (S[sk[0]], S[sk[1]] if sk[1] >= 0 else None)
            got = parsed_text.get(tk) if parsed_text is not None else None
            if got is None:
                try:
                    shapes = json.loads(tk[0]) or []
                    types = json.loads(tk[1]) if tk[1] is not None else []
                except ValueError:
                    shapes, types = [], []
                if not isinstance(shapes, list):
                    shapes = []
                types = [t if isinstance(t, str) else "" for t in types] if isinstance(types, list) else []
                got = (shapes, types)
                if parsed_text is not None:
                    parsed_text[tk] = got
            parsed[sk] = got
        shapes, types = got
        name = S[hname_l[o]] if hname_l[o] >= 0 else ""
        fcls = CLASS_NAMES[c]
        cnt = share[(o, c)]
        okey = (name, S[sk[0]], S[sk[1]] if sk[1] >= 0 else None, c)
        if not math.isfinite(bytes_l[j]):
            b = math.nan
            if name in GATHERS and gname_l[j] >= 0:
                b = gather_bytes_from_launch(S[gname_l[j]], G.grid[j], shapes, types)
            if not math.isfinite(b):
                b = _op_costs(memo, okey, name, shapes, types, fcls)[0] / cnt
            if math.isfinite(b):
                gbytes[j] = b
                filled += 1
        if not math.isfinite(flops_l[j]):
            gflops[j] = _op_costs(memo, okey, name, shapes, types, fcls)[1] / cnt
    return filled


def _op_costs(
    memo: dict[tuple[str, str, str | None, int], tuple[float, float]],
    key: tuple[str, str, str | None, int],
    name: str,
    shapes: list,
    types: list,
    fcls: str,
) -> tuple[float, float]:
    """(:func:`mem_bytes`, :func:`op_flops`) of a host op for a kernel class, once per distinct
    ``key`` = (name, shapes, dtypes, class) (their texts and the class)."""
    got = memo.get(key)
    if got is None:
        got = memo[key] = (mem_bytes(name, shapes, types, fcls), op_flops(name, shapes, fcls))
    return got
