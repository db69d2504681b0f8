"""Capture at full size without the memory: the reference model under fake tensors.

``capture_fake(opts, out)`` runs every rank's program (:class:`cosim.capture.program.RankProgram`:
forward, backward, gradient all-reduce and AdamW in training) under PyTorch's
``FakeTensorMode``: tensors carry shapes, dtypes and strides but no storage, so DeepSeek-V3 at
its real shapes (671 B parameters, 550 GiB per rank in a real capture) records on a CPU in
seconds with a few hundred MiB. A dispatch-level recorder (:class:`OpRecorder`, a
``TorchDispatchMode``) sees every ATen op after autograd and composite decomposition, with
every input's shape and dtype, and every ``record_function`` range.

What a fake tensor cannot give, and what stands in for it:

* **Routing.** A fake router has no values, so the per-expert token counts, and with them the
  all-to-all(v) split sizes and the grouped-GEMM group sizes, come from a routing plan
  (:class:`RoutingPlanner`) drawn with the capture's own routing-skew code: ``balanced``
  (uniform: round-robin) or ``zipf:S`` (the same seeded sampler as a real capture). ``natural``
  (the random router's own choice) has no fake equivalent and is refused. Each host read of
  split sizes (``.tolist()``) is recorded as ``aten::_local_scalar_dense``, the blocking
  device-to-host copy a GPU run makes there.
* **Collectives** are not run: :class:`FakeComm` records each call as a ``record_param_comms``
  event with ProcessGroupNCCL's metadata (split sizes, group, dtype), as a real capture does.
* **Attention** runs as one fused kernel (``aten::_scaled_dot_product_flash_attention`` and its
  backward, the ops a GPU run dispatches), not the CPU's math fallback, whatever the head dims
  (MLA's query/key head dim 192 differs from its value head dim 128).
* **Time.** Fake ops take no meaningful time: the trace's host ops are 1 ns apart, with no
  Python time between them. Replay projects them onto GPU kernels
  (:mod:`cosim.workload.project`) whose durations come from the kernel models, and charges
  each launch the projection's dispatch overhead.

The capture folder has the layout of a real capture (``capture.yaml`` with ``device.kind:
fake``, ``rank{r}.trace.json.gz``), without Execution Traces.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from cosim.capture.capture import _check_out, capture_doc, publish
from cosim.capture.comm import Comm, Group
from cosim.capture.config import CaptureOptions
from cosim.capture.model import EPContext, layer_popularity, routing_generator
from cosim.capture.postprocess import nccl_args
from cosim.capture.program import RankProgram
from cosim.capture.routing import balanced_choice, zipf_choice
from cosim.errors import CosimInputError

__all__ = ["FLASH_ATTENTION", "FakeComm", "OpRecorder", "RoutingPlanner", "capture_fake", "check_fake",
           "record_rank"]

FLASH_ATTENTION = "aten::_scaled_dot_product_flash_attention"
"""Name under which the fused attention kernel is recorded (its backward: ``..._backward``)."""

_KINETO_DTYPES = {
    torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16",
    torch.int64: "long int", torch.int32: "int", torch.int16: "short int", torch.int8: "signed char",
    torch.uint8: "unsigned char", torch.bool: "bool", torch.float8_e4m3fn: "c10::Float8_e4m3fn",
}


def check_fake(opts: CaptureOptions) -> None:
    """Fail with one line when ``opts`` asks for something a fake capture cannot record."""
    if opts.skew.kind == "natural":
        raise CosimInputError("--fake: fake tensors carry no router values, so the routing comes from a plan: "
                              "use --skew balanced (uniform) or zipf:S")
    if opts.model.capacity_factor is not None:
        raise CosimInputError(f"--fake: model {opts.model.name} drops tokens for capacity "
                              f"(capacity_factor {opts.model.capacity_factor}), which needs router values; "
                              "set capacity_factor: null")


# Fused attention --------------------------------------------------------------------------------

@torch.library.custom_op("cosim_fake::flash_attention", mutates_args=())
def _flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                     scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of ``[b, h, sq, d]`` queries over ``[b, h, sk, d]`` keys and ``[b, h, sk, dv]`` values:
    (output ``[b, h, sq, dv]``, log-sum-exp ``[b, h, sq]`` fp32), as a flash-attention kernel returns."""
    return _attention_math(q, k, v, is_causal, scale)


def _attention_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                    scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    s = (q.float() @ k.float().transpose(-2, -1)) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    lse = s.logsumexp(-1)
    return ((s - lse.unsqueeze(-1)).exp() @ v.float()).to(q.dtype), lse


@_flash_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
      scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty((*q.shape[:-1], v.shape[-1])), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cosim_fake::flash_attention_backward", mutates_args=())
def _flash_attention_backward(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                              out: torch.Tensor, lse: torch.Tensor, is_causal: bool,
                              scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq, dk, dv) of :func:`_flash_attention`, recomputing the probabilities from the
    log-sum-exp as FlashAttention's backward does."""
    qf, kf, vf, gf = q.float(), k.float(), v.float(), grad.float()
    sc = (qf @ kf.transpose(-2, -1)) * scale
    if is_causal:
        sc = sc.masked_fill(torch.ones(sc.shape[-2:], dtype=torch.bool, device=sc.device).triu(1), -math.inf)
    p = (sc - lse.unsqueeze(-1)).exp()
    dv = p.transpose(-2, -1) @ gf
    dp = gf @ vf.transpose(-2, -1)
    ds = p * (dp - (gf * out.float()).sum(-1, keepdim=True))
    return (ds @ kf * scale).to(q.dtype), (ds.transpose(-2, -1) @ qf * scale).to(k.dtype), dv.to(v.dtype)


@_flash_attention_backward.register_fake
def _(grad: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
      lse: torch.Tensor, is_causal: bool, scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v, is_causal, scale = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.is_causal, ctx.scale = is_causal, scale


def _backward(ctx: Any, grad: torch.Tensor, _grad_lse: torch.Tensor) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _flash_attention_backward(grad.contiguous(), q, k, v, out, lse, ctx.is_causal, ctx.scale)
    return dq, dk, dv, None, None


_flash_attention.register_autograd(_backward, setup_context=_setup)


def fused_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
               scale: float | None = None) -> torch.Tensor:
    """``scaled_dot_product_attention`` as one fused kernel (forward) and one backward kernel."""
    s = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    return _flash_attention(q, k, v, is_causal, s)[0]


# Recording --------------------------------------------------------------------------------------

def _describe(value: Any) -> tuple[Any, str, str]:
    """(Input Dims, Input type, Concrete Inputs) of one argument, as Kineto records them."""
    if isinstance(value, torch.Tensor):
        return list(value.shape), _KINETO_DTYPES.get(value.dtype, str(value.dtype).replace("torch.", "")), ""
    if isinstance(value, (list, tuple)) and value and all(isinstance(t, torch.Tensor) for t in value):
        return [list(t.shape) for t in value], "TensorList", ""
    if isinstance(value, bool):
        return [], "Scalar", str(value)
    if isinstance(value, (int, float)):
        return [], "Scalar", repr(value) if isinstance(value, float) else str(value)
    if isinstance(value, (list, tuple)) and all(isinstance(x, (int, float)) for x in value):
        return [], "", "[" + ", ".join(str(x) for x in value) + "]"
    return [], "", ""


@dataclass
class Event:
    """One recorded host event: an ATen op or collective (``ph`` X) or an annotation's begin/end."""

    ph: str
    """``X`` (op), ``B`` (annotation begins), ``E`` (annotation ends)."""
    name: str = ""
    """Op or annotation name."""
    args: dict[str, Any] = field(default_factory=dict)
    """Kineto args (Input Dims, Input type, Concrete Inputs; collective metadata)."""
    cat: str = "cpu_op"
    """Kineto category."""


_RENAME = {
    "cosim_fake::flash_attention": FLASH_ATTENTION,
    "cosim_fake::flash_attention_backward": FLASH_ATTENTION + "_backward",
}
_ENTER = {"profiler::_record_function_enter_new", "profiler::_record_function_enter"}
_EXIT = {"profiler::_record_function_exit"}


class OpRecorder(TorchDispatchMode):
    """Records every op dispatched under it (and every ``record_function`` range) while ``active``.

    Ops whose output shape depends on tensor values get it from the arguments instead:
    ``aten::bincount`` returns ``minlength`` counts (the expert ids are below it)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []
        self.active = True
        self._open: list[bool] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _ENTER:
            self._open.append(self.active)
            if self.active:
                self.events.append(Event("B", str(args[0]), cat="user_annotation"))
            return func(*args, **kwargs)
        if name in _EXIT:
            if self._open.pop() if self._open else False:
                self.events.append(Event("E"))
            return func(*args, **kwargs)
        if name.startswith("prim::"):
            return func(*args, **kwargs)
        if name == "aten::_local_scalar_dense":
            # A host-resident scalar (AdamW's step counts live on the CPU): no device sync. The
            # program's device-to-host reads of split sizes are recorded by host_read.
            return func(*args, **kwargs)
        if name == "aten::bincount":
            out = torch.empty(int(kwargs.get("minlength", args[2] if len(args) > 2 else 0)), dtype=torch.int64)
        else:
            out = func(*args, **kwargs)
        if self.active:
            self.op(_RENAME.get(name, name), func._schema, args, kwargs)
        return out

    def op(self, name: str, schema: Any, args: tuple, kwargs: dict) -> None:
        """Record op ``name`` with its inputs in schema order."""
        dims, typ, conc = [], [], []
        for i, a in enumerate(schema.arguments):
            v = args[i] if i < len(args) else kwargs.get(a.name, a.default_value if a.has_default_value() else None)
            d, t, c = _describe(v)
            dims.append(d)
            typ.append(t)
            conc.append(c)
        if name == FLASH_ATTENTION:  # the CUDA op's signature: (q, k, v, dropout_p, is_causal, debug_mask, scale)
            dims, typ, conc = [*dims[:3], [], [], [], []], typ[:3] + ["Scalar"] * 3 + [""], \
                [*conc[:3], "0.", conc[3], "False", conc[4]]
        self.events.append(Event("X", name, {"Concrete Inputs": conc, "Input type": typ, "Input Dims": dims}))

    def host_read(self, t: torch.Tensor) -> None:
        """A device-to-host read of ``t`` (split sizes): a blocking copy on a GPU."""
        if self.active:
            self.events.append(Event("X", "aten::_local_scalar_dense", {
                "Concrete Inputs": [""], "Input type": [_KINETO_DTYPES.get(t.dtype, "long int")],
                "Input Dims": [list(t.shape)]}))

    def collective(self, meta: dict[str, Any]) -> None:
        """A collective call, with ProcessGroupNCCL's ``record_param_comms`` metadata."""
        if self.active:
            self.events.append(Event("X", "record_param_comms", nccl_args(meta)))


@dataclass
class FakeComm(Comm):
    """Records collectives instead of running them (there is no process group)."""

    recorder: OpRecorder | None = None
    """Where calls are recorded."""

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, group: Group, tag: str,
                          out_split: list[int] | None = None, in_split: list[int] | None = None) -> None:
        coll = "all_to_allv" if in_split is not None else "all_to_all"
        meta = self._meta(coll, group, inp, inp.numel(), out.numel(), list(in_split or []), list(out_split or []), tag)
        assert self.recorder is not None
        self.recorder.collective(meta)

    def all_reduce(self, t: torch.Tensor, group: Group, tag: str) -> None:
        assert self.recorder is not None
        self.recorder.collective(self._meta("allreduce", group, t, t.numel(), t.numel(), [], [], tag))


# Routing plan -----------------------------------------------------------------------------------

class RoutingPlanner:
    """Per-expert assignments of every rank in every MoE forward pass, drawn (with real tensors)
    by the capture's routing-skew code with the seeds a real capture uses:

    * ``balanced``: token ``t`` of rank ``r`` in call ``c`` is numbered ``(c * world + r) * n + t``
      and its ``j``-th expert is ``(number * k + j) mod E`` (uniform within one assignment);
    * ``zipf:S``: ``k`` distinct experts per token from the layer's Zipf popularity, drawn from
      rank ``r``'s routing generator of that layer, call after call.

    ``tokens(call)``: tokens per rank in forward pass ``call`` (the decode prompt is call 0)."""

    def __init__(self, opts: CaptureOptions) -> None:
        self.opts = opts
        self._rows: dict[tuple[int, int], list[list[int]]] = {}  # (rank, layer) -> counts of calls 0..
        self._gens: dict[tuple[int, int], torch.Generator] = {}
        self._pop: dict[int, torch.Tensor] = {}

    def tokens(self, call: int) -> int:
        o = self.opts
        if o.mode == "decode" and call > 0:
            return o.batch
        return o.batch * o.seq

    def counts(self, rank: int, layer: int, call: int) -> list[int]:
        """Assignments per expert of ``rank`` in forward pass ``call`` of MoE layer ``layer``."""
        rows = self._rows.setdefault((rank, layer), [])
        if len(rows) <= call:
            with _disable_current_modes():  # real tensors, outside the fake and recording modes
                while len(rows) <= call:
                    rows.append(self._draw(rank, layer, len(rows)))
        return rows[call]

    def _draw(self, rank: int, layer: int, call: int) -> list[int]:
        o, m = self.opts, self.opts.model
        n, k, num_e = self.tokens(call), m.top_k, m.num_experts
        if o.skew.kind == "balanced":
            idx = balanced_choice(n, k, num_e, (call * o.world_size + rank) * n)
        else:
            pop = self._pop.get(layer)
            if pop is None:
                pop = self._pop[layer] = layer_popularity(num_e, o.skew.s, o.seed, layer)
            gen = self._gens.get((rank, layer))
            if gen is None:
                gen = self._gens[(rank, layer)] = routing_generator(o.seed, rank, layer)
            idx = zipf_choice(n, k, pop, gen)
        return torch.bincount(idx.reshape(-1), minlength=num_e).tolist()


# One rank ---------------------------------------------------------------------------------------

def _groups(opts: CaptureOptions, rank: int) -> tuple[Group, Group, Group | None]:
    """(world, this rank's EP group, its expert-DP group or None), named in the order a real
    capture creates them (world "0", then the EP groups, then the expert-DP groups)."""
    ws, ep, dp = opts.world_size, opts.ep, opts.dp
    world = Group(None, list(range(ws)), "0", "default_pg")
    next_name = 1
    my_ep: Group = world
    if ep < ws:
        for g in range(dp):
            ranks = list(range(g * ep, (g + 1) * ep))
            if rank in ranks:
                my_ep = Group(None, ranks, str(next_name), "ep")
            next_name += 1
    my_dp = None
    if dp > 1:
        for i in range(ep):
            ranks = list(range(i, ws, ep))
            if rank in ranks:
                my_dp = Group(None, ranks, str(next_name), "dp_experts")
            next_name += 1
    return world, my_ep, my_dp


@dataclass
class RankRecording:
    """What one rank's fake run recorded."""

    rank: int
    events: list[Event]
    """Host events of the profiled steps, in order (each step inside its ``ProfilerStep#N``)."""
    moe_layers: list[int]
    routed: list[list[list[int]]]
    """Per MoE layer, per profiled step: assignments per expert (this rank)."""
    ep_group: list[int]
    dp_group: list[int]


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Create parameters in ``dtype`` (fake tensors cannot be converted in place)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def record_rank(opts: CaptureOptions, rank: int, planner: RoutingPlanner,
                dtype: torch.dtype = torch.bfloat16) -> RankRecording:
    """Run rank ``rank``'s warm-up and profiled steps under fake tensors; record the profiled ones."""
    recorder = OpRecorder()
    world, ep_group, dp_group = _groups(opts, rank)
    comm = FakeComm(rank=rank, annotate=False, recorder=recorder)

    def plan(layer: int, call: int) -> list[list[int]]:
        return [planner.counts(r, layer, call) for r in ep_group.ranks]

    ctx = EPContext(comm=comm, ep_group=ep_group, ep_rank=ep_group.ranks.index(rank), skew=opts.skew,
                    seed=opts.seed, global_rank=rank, world_size=opts.world_size, use_grouped_mm=True,
                    plan=plan, on_host_read=recorder.host_read, sdpa=fused_sdpa, init_weights=False)
    vocab = opts.model.vocab_size
    total = opts.warmup + opts.steps
    with FakeTensorMode(allow_non_fake_inputs=False), recorder, _default_dtype(dtype):
        recorder.active = False
        prog = RankProgram(opts, comm, world, dp_group, ctx, torch.device("cpu"), dtype,
                           tokens=lambda shape: torch.randint(vocab, shape))
        prog.prepare(total)
        for i in range(total):
            recorder.active = i >= opts.warmup
            prog.model.set_recording(recorder.active)
            with torch.profiler.record_function(f"ProfilerStep#{i}"):
                prog.step(i)
    moe = prog.model.moe_layers()
    return RankRecording(rank, recorder.events, [m.layer for m in moe], [m.routed for m in moe],
                         ep_group.ranks, dp_group.ranks if dp_group else [rank])


# Output -----------------------------------------------------------------------------------------

TICK_US = 0.001
"""Host time between consecutive recorded events (1 ns): fake ops have no duration of their own."""


def kineto_trace(rec: RankRecording, opts: CaptureOptions) -> dict[str, Any]:
    """A Kineto chrome trace of the recorded events: one host thread, ops ``TICK_US`` apart,
    each annotation spanning its ops."""
    pid = tid = 1000 + rec.rank
    out: list[dict[str, Any]] = []
    stack: list[dict[str, Any]] = []
    t = 0.0
    rf = 0
    for ev in rec.events:
        t = round(t + TICK_US, 3)
        if ev.ph == "E":
            e = stack.pop()
            e["dur"] = round(t - e["ts"], 3)
            continue
        rf += 1
        e = {"ph": "X", "cat": ev.cat, "name": ev.name, "pid": pid, "tid": tid, "ts": t, "dur": TICK_US,
             "args": {"External id": rf, "Record function id": rf, **ev.args}}
        out.append(e)
        if ev.ph == "B":
            stack.append(e)
        else:
            t = round(t + TICK_US, 3)
    pg = [{"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": opts.world_size,
           "ranks": list(range(opts.world_size))}]
    return {"schemaVersion": 1, "deviceProperties": [], "record_shapes": 1,
            "distributedInfo": {"backend": "nccl", "rank": rec.rank, "world_size": opts.world_size,
                                "pg_count": 1, "pg_config": pg},
            "displayTimeUnit": "ns", "traceName": f"cosim fake capture rank {rec.rank}", "traceEvents": out}


def capture_fake(opts: CaptureOptions, out: str | Path, *, command: str | None = None,
                 progress: bool = True, dtype: torch.dtype = torch.bfloat16) -> dict[str, Any]:
    """Record every rank of ``opts`` under fake tensors and write the capture folder ``out``
    (``capture.yaml`` + ``rank{r}.trace.json.gz``). Returns the summary :func:`capture` returns."""
    from tqdm import tqdm

    out = Path(out)
    check_fake(opts)
    _check_out(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    planner = RoutingPlanner(opts)
    routing: list[dict[str, Any]] = []
    try:
        desc = f"fake capture {opts.model.name} {opts.mode} x{opts.world_size}"
        for r in tqdm(range(opts.world_size), desc=desc, unit="rank", file=sys.stderr,
                      disable=None if progress else True, leave=False):
            rec = record_rank(opts, r, planner, dtype)
            with gzip.open(tmp / f"rank{r}.trace.json.gz", "wt", encoding="utf-8", compresslevel=6) as fh:
                json.dump(kineto_trace(rec, opts), fh, separators=(",", ":"))
            routing.append({"rank": r, "moe_layers": rec.moe_layers, "routed": rec.routed, "dropped": [],
                            "device_name": "none (FakeTensorMode)", "backend": "none",
                            "dtype": str(dtype).replace("torch.", ""), "grouped_mm": True,
                            "num_threads": 1, "step_ms": []})
        doc = capture_doc(opts, routing, command, et=False)
        doc["device"]["kind"] = "fake"
        return publish(tmp, out, doc)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

