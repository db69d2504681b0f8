"""Classification of GPU ops, collective names, dtypes, and FLOP/byte counts
from operator shapes.

The rules are plain tables so they can be read, tested and extended:

* :data:`KERNEL_RULES` — ordered ``(regex, class)`` pairs matched against the
  kernel name; the first match wins.
* :data:`OP_RULES` — ``(regex, class)`` pairs matched against the parent ATen
  op's name, used when no kernel rule matches.
* memcpy / memset GPU ops are classed by their trace category, never by name.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from typing import Any

from cosim.workload.graph import CollType, CopyKind, OpClass

__all__ = [
    "KERNEL_RULES",
    "OP_RULES",
    "classify_kernel",
    "collective_type",
    "copy_kind",
    "dtype_bytes",
    "op_flops_bytes",
    "parse_nccl_kernel",
]

C = OpClass

#: Kernel-name rules, first match wins. Case-insensitive.
KERNEL_RULES: tuple[tuple[str, OpClass], ...] = (
    # communication libraries (NCCL, RCCL, MSCCL, custom all-reduce)
    (r"nccl|rccl|msccl|cross_device_reduce|custom_?all_?reduce|all_?gather_kernel|reduce_scatter_kernel", C.COLLECTIVE),
    # MoE token routing (fused MoE libraries: vLLM/SGLang/Megatron/TransformerEngine/DeepEP)
    (
        r"moe_align|moe_permute|token_?dispatch|dispatch_?kernel|expand_?and_?permute|permute_?tokens|moe_dispatch",
        C.MOE_DISPATCH,
    ),
    (r"moe_unpermute|moe_sum|moe_combine|combine_?kernel|unpermute|finalize_?moe", C.MOE_COMBINE),
    # grouped GEMMs before plain GEMMs
    (
        r"grouped_?gemm|grouped_?mm|group_?gemm|gemm_?grouped|fused_moe|moe_gemm|moe_mlp|ptr_array|cutlass.*grouped",
        C.GROUPED_GEMM,
    ),
    # attention (flash / memory-efficient / cuDNN fMHA / CK / aiter)
    (r"flash|fmha|attention|attn|sdpa|mha_(fwd|bwd)|_fwd_kernel|paged_?attention|decode_?attention", C.ATTENTION),
    # norms (before reductions: they are reductions too)
    (r"layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|bn_fw|bn_bw|welford|GammaBeta|norm_kernel", C.NORM),
    # GEMM / convolution (cuBLAS, cuBLASLt, CUTLASS, cuDNN, Tensile, hipBLASLt, MIOpen, Triton templates)
    (
        r"gemm|gemv|cutlass|cublas|nvjet|xmma|Cijk_|igemm|s1688|s884|h884|h1688|wgmma|mma_|matmul|"
        r"scudnn|cudnn.*(conv|fprop|dgrad|wgrad|winograd|implicit)|winograd|implicit_convolve|conv2d|convolution|"
        r"dot_kernel|triton_tem|(volta|turing|ampere|hopper|sm\d+)_[a-z0-9]*_?(s|h|bf16|fp16|i8)?gemm",
        C.GEMM,
    ),
    # reductions, softmax, sort/scan/top-k, loss
    (
        r"reduce|reduction|softmax|cub::Device(Reduce|Scan|Segmented|Radix|Select)|scan|radix_?sort|bitonic|sort|topk|argmax|"
        r"argmin|nll_loss|cross_entropy|sum_kernel|mean_kernel|norm_two|triton_red|triton_per",
        C.REDUCTION,
    ),
    # element-wise (PyTorch TensorIterator kernels, copies, fills, cat, index, activations, optimizers)
    (
        r"elementwise|vectorized|unrolled|Functor|fill|copy|CatArray|cat_|index|gather|scatter|triton_poi|pointwise|"
        r"activation|gelu|relu|silu|sigmoid|tanh|dropout|masked|where|clamp|transpose|permute|nchwToNhwc|nhwcToNchw|"
        r"multi_tensor_apply|adam|sgd|adagrad|embedding|arange|compare|SubTensorOp|splitKreduce|epilogue|"
        r"scalePackedTensor|computeOffsets|OffsetsKernel|computeWgrad|pow_|rsqrt|sqrt|exp_|log_|neg_|abs_",
        C.ELEMENTWISE,
    ),
)

#: Parent-op rules (ATen op that launched the kernel), used when no kernel rule matched.
OP_RULES: tuple[tuple[str, OpClass], ...] = (
    (
        r"record_param_comms|^nccl:|^gloo:|^c10d::|all_reduce|all_gather|reduce_scatter|all_to_all|broadcast",
        C.COLLECTIVE,
    ),
    (r"_grouped_mm|grouped_mm|group_gemm", C.GROUPED_GEMM),
    (r"scaled_dot_product|flash_attention|efficient_attention|_cudnn_attention|multi_head_attention", C.ATTENTION),
    (
        r"aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|_scaled_mm|conv|convolution|cudnn_convolution|_convolution|einsum)",
        C.GEMM,
    ),
    (r"norm", C.NORM),
    (
        r"aten::(sum|mean|amax|amin|max|min|argmax|argmin|softmax|_softmax|log_softmax|_log_softmax|topk|sort|cumsum|prod|var|std|norm|nll_loss|cross_entropy)",
        C.REDUCTION,
    ),
    (r"aten::(index_add|scatter_add|index_put|scatter|index_select|gather|index)", C.ELEMENTWISE),
    (r"aten::", C.ELEMENTWISE),
)

_KERNEL_RE = [(re.compile(p, re.IGNORECASE), c) for p, c in KERNEL_RULES]
_OP_RE = [(re.compile(p, re.IGNORECASE), c) for p, c in OP_RULES]


@lru_cache(maxsize=65536)
def classify_kernel(kernel_name: str, parent_op: str = "") -> OpClass:
    """Class of a kernel from its name, else from the parent op's name, else OTHER."""
    for rx, cls in _KERNEL_RE:
        if rx.search(kernel_name):
            return cls
    if parent_op:
        for rx, cls in _OP_RE:
            if rx.search(parent_op):
                return cls
    return C.OTHER


def copy_kind(name: str, kind_arg: Any = None) -> CopyKind:
    """Direction of a memcpy from its event name ('Memcpy HtoD (...)') or ROCm 'kind' arg (a 'kind' that is
    not text, e.g. a number, is read as its text). Memoized: a trace's copies have a few distinct names."""
    return _copy_kind(name, kind_arg if kind_arg is None or isinstance(kind_arg, str) else str(kind_arg))


@lru_cache(maxsize=4096)
def _copy_kind(name: str, kind_arg: str | None) -> CopyKind:
    s = (kind_arg or "") + " " + name
    for tag, k in (
        ("HtoD", CopyKind.HTOD),
        ("DtoH", CopyKind.DTOH),
        ("DtoD", CopyKind.DTOD),
        ("HtoH", CopyKind.HTOH),
        ("PtoP", CopyKind.PTOP),
    ):
        if tag.lower() in s.lower():
            return k
    return CopyKind.OTHER


_COLL_NAMES: tuple[tuple[str, CollType], ...] = (
    ("reduce_scatter", CollType.REDUCE_SCATTER),
    ("reducescatter", CollType.REDUCE_SCATTER),
    ("_reduce_scatter_base", CollType.REDUCE_SCATTER),
    ("allreduce", CollType.ALL_REDUCE),
    ("all_reduce", CollType.ALL_REDUCE),
    ("allgather", CollType.ALL_GATHER),
    ("all_gather", CollType.ALL_GATHER),
    ("alltoall", CollType.ALL_TO_ALL),
    ("all_to_all", CollType.ALL_TO_ALL),
    ("broadcast", CollType.BROADCAST),
    ("sendrecv", CollType.SEND_RECV),
    ("send_recv", CollType.SEND_RECV),
    ("barrier", CollType.BARRIER),
    ("gather", CollType.GATHER),
    ("scatter", CollType.SCATTER),
    ("reduce", CollType.REDUCE),
    ("send", CollType.SEND),
    ("recv", CollType.RECV),
)


def collective_type(name: str) -> CollType:
    """Collective type from a recorded name: 'allreduce', 'all_to_allv', 'nccl:all_reduce',
    'c10d::allgather_', NCCL kernel names ('AllReduce', 'SendRecv'), ..."""
    s = name.lower().replace("nccl:", "").replace("gloo:", "").replace("c10d::", "")
    s = s.replace("-", "_")
    for key, t in _COLL_NAMES:
        if key in s:
            return t
    return CollType.OTHER


_NCCL_RE = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)(?:_([A-Za-z0-9_]+))?")
_ALGOS = ("RING", "TREE", "COLLNET_DIRECT", "COLLNET_CHAIN", "COLLNET", "NVLS_TREE", "NVLS", "PAT")
_PROTOS = ("LL128", "LL", "SIMPLE")


def parse_nccl_kernel(name: str) -> dict[str, Any] | None:
    """Parse an NCCL/RCCL kernel name.

    ``ncclDevKernel_AllReduce_Sum_f32_RING_LL`` -> ``{type: ALL_REDUCE, op: 'Sum',
    dtype: 'f32', algo: 'RING', protocol: 'LL'}``; ``ncclKernel_SendRecv_...`` ->
    SEND_RECV; ``ncclDevKernel_Generic`` -> type OTHER. None if not an NCCL kernel.
    """
    m = _NCCL_RE.search(name)
    if not m:
        return None
    coll = m.group(1)
    rest = (m.group(2) or "").split("(")[0]
    parts = [p for p in rest.split("_") if p]
    algo = next((a for a in _ALGOS if a in rest.upper().split("_") or f"_{a}_" in f"_{rest.upper()}_"), None)
    proto = next((p for p in _PROTOS if p in [x.upper() for x in parts]), None)
    redop = next((p for p in parts if p in ("Sum", "Prod", "Max", "Min", "Avg", "PreMulSum", "SumPostDiv")), None)
    dtypes = {
        "i8",
        "u8",
        "i32",
        "u32",
        "i64",
        "u64",
        "f16",
        "f32",
        "f64",
        "bf16",
        "int8_t",
        "uint8_t",
        "int32_t",
        "uint32_t",
        "int64_t",
        "uint64_t",
        "half",
        "float",
        "double",
        "__nv_bfloat16",
        "f8e4m3",
        "f8e5m2",
        "e4m3",
        "e5m2",
    }
    dt = next((p for p in parts if p in dtypes), None)
    t = CollType.OTHER if coll == "Generic" else collective_type(coll)
    return {"type": t, "op": redop, "dtype": dt, "algo": algo, "protocol": proto}


_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "int": 4,
    "int32": 4,
    "unsigned int": 4,
    "c10::complex<float>": 8,
    "double": 8,
    "float64": 8,
    "long": 8,
    "long int": 8,
    "int64": 8,
    "long long": 8,
    "unsigned long": 8,
    "c10::half": 2,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "c10::bfloat16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "short": 2,
    "short int": 2,
    "int16": 2,
    "signed char": 1,
    "unsigned char": 1,
    "char": 1,
    "bool": 1,
    "int8": 1,
    "uint8": 1,
    "byte": 1,
    "c10::float8_e4m3fn": 1,
    "c10::float8_e5m2": 1,
    "c10::float8_e4m3fnuz": 1,
    "c10::float8_e5m2fnuz": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


def dtype_bytes(t: str | None) -> int:
    """Bytes per element of a dtype name as written by Kineto/ET/c10d ('float',
    'c10::BFloat16', 'Tensor(float)', 'Float', 'BFloat16'); -1 if unknown."""
    if not t:
        return -1
    s = t.strip()
    if s.startswith("Tensor(") and s.endswith(")"):
        s = s[7:-1]
    s = s.lower()
    return _DTYPE_BYTES.get(s, _DTYPE_BYTES.get("c10::" + s, -1))


def _prod(xs: list[int]) -> int:
    return math.prod(int(x) for x in xs)


def _is_shape(x: Any) -> bool:
    return isinstance(x, list) and all(isinstance(v, int) for v in x)


def _matmul_dims(a: list[int], b: list[int]) -> tuple[int, int, int, int] | None:
    """(batch, M, K, N) of torch.matmul(a, b) with broadcasting."""
    if not a or not b:
        return None
    if len(a) == 1:
        a = [1, *a]
    if len(b) == 1:
        b = [*b, 1]
    m, k = a[-2], a[-1]
    k2, n = b[-2], b[-1]
    if k != k2:
        return None
    ba, bb = a[:-2], b[:-2]
    nb = max(len(ba), len(bb))
    ba = [1] * (nb - len(ba)) + ba
    bb = [1] * (nb - len(bb)) + bb
    batch = _prod([max(x, y) for x, y in zip(ba, bb)]) if nb else 1
    return batch, m, k, n


@lru_cache(maxsize=65536)
def op_flops_bytes(op: str, shapes_json: str, types_json: str | None) -> tuple[float, float]:
    """(FLOPs, bytes) of one ATen op from its input shapes and dtypes; NaN when the op
    is not a GEMM-like op or the shapes do not allow it.

    Covered: aten::mm, addmm, bmm, baddbmm, addbmm, matmul, linear, _grouped_mm,
    _scaled_mm and scaled-dot-product/flash attention forward. Bytes count each
    input operand and the output once (no re-reads).
    """
    nan = (math.nan, math.nan)
    try:
        shapes = json.loads(shapes_json)
        types = json.loads(types_json) if types_json else []
    except ValueError:
        return nan
    name = op.split("::")[-1]
    esz: float = next((dtype_bytes(t) for t in types if isinstance(t, str) and dtype_bytes(t) > 0), -1)
    esz = esz if esz > 0 else math.nan
    sh = [s for s in shapes if _is_shape(s)]
    try:
        if name in ("mm", "_scaled_mm"):
            (m, k), (_, n) = sh[0], sh[1]
            return 2.0 * m * k * n, esz * (m * k + k * n + m * n)
        if name == "addmm":
            (m, k), (_, n) = sh[1], sh[2]
            return 2.0 * m * k * n + m * n, esz * (m * k + k * n + 2 * m * n)
        if name == "bmm":
            (b, m, k), (_, _, n) = sh[0], sh[1]
            return 2.0 * b * m * k * n, esz * b * (m * k + k * n + m * n)
        if name == "baddbmm":
            (b, m, k), (_, _, n) = sh[1], sh[2]
            return 2.0 * b * m * k * n + b * m * n, esz * b * (m * k + k * n + 2 * m * n)
        if name == "addbmm":
            (b, m, k), (_, _, n) = sh[1], sh[2]
            return 2.0 * b * m * k * n, esz * (b * m * k + b * k * n + 2 * m * n)
        if name == "matmul":
            d = _matmul_dims(sh[0], sh[1])
            if d is None:
                return nan
            b, m, k, n = d
            return 2.0 * b * m * k * n, esz * (_prod(sh[0]) + _prod(sh[1]) + b * m * n)
        if name == "linear":
            x, w = sh[0], sh[1]
            k, n = x[-1], w[0]
            rows = _prod(x[:-1])
            return 2.0 * rows * k * n, esz * (rows * k + k * n + rows * n)
        if name == "_grouped_mm":
            a, b = sh[0], sh[1]
            if len(a) == 2 and len(b) == 3:  # (sum M, K) x (G, K, N)
                g, k, n = b
                return 2.0 * a[0] * k * n, esz * (a[0] * k + g * k * n + a[0] * n)
            if len(a) == 3 and len(b) == 3:  # (G, M, K) x (G, K, N)
                g, m, k = a
                n = b[2]
                return 2.0 * g * m * k * n, esz * g * (m * k + k * n + m * n)
            if len(a) == 2 and len(b) == 2:  # (M, sum K) x (sum K, N): per-group weight grads
                m, k = a
                n = b[1]
                return 2.0 * m * k * n, esz * (m * k + k * n + m * n)
            if len(a) == 3 and len(b) == 2:  # (G, M, K) x (K, sum N)
                g, m, k = a
                return 2.0 * m * k * b[1], esz * (g * m * k + k * b[1] + m * b[1])
            return nan
        if "scaled_dot_product" in name or name in ("_flash_attention_forward", "_efficient_attention_forward"):
            q, kk = sh[0], sh[1]
            if len(q) == 4 and len(kk) == 4:
                b, h, lq, d = q
                lk = kk[2]
                if name.startswith("_flash_attention_forward") or name == "_efficient_attention_forward":
                    b, lq, h, d = q  # (B, L, H, D) layout
                    lk = kk[1]
                dv = sh[2][-1] if len(sh) > 2 else d
                return 2.0 * b * h * lq * lk * (d + dv), esz * (b * h * (lq * d + lk * d + lk * dv + lq * dv))
            return nan
    except (IndexError, ValueError, TypeError):
        return nan
    return nan
