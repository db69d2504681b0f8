"""Collectives used by the reference model, with the metadata a replay needs.

Every collective is wrapped in a ``cosim::comm`` profiler annotation whose
(string) input is a JSON record of what was called: collective name in
ProcessGroupNCCL's spelling (``all_to_all``, ``all_to_allv``, ``allreduce``),
dtype, element counts, per-peer split sizes (elements), the process group and
a ``tag`` saying what the call is for (``layer1.moe.dispatch.fwd``). The ET
observer keeps that string, and :mod:`cosim.capture.postprocess` turns it into
the ``record_param_comms`` metadata of PyTorch's NCCL backend.

Why: ProcessGroupNCCL records ``record_param_comms`` (with "In split size" /
"Out split size") itself, but ProcessGroupGloo records nothing of the kind, so
a CPU capture would lose the per-peer sizes of every all-to-all(v). (Naming a
Python annotation ``record_param_comms`` directly crashes the profiler, which
then looks for C++ debug info that Python cannot set.)
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.profiler import record_function

from cosim.capture.postprocess import COMM_ANNOTATION

__all__ = ["COMM_ANNOTATION", "AllToAll", "Comm", "Group"]


_DTYPE_NAMES = {
    torch.float32: "Float", torch.float16: "Half", torch.bfloat16: "BFloat16", torch.float64: "Double",
    torch.int64: "Long", torch.int32: "Int", torch.int8: "Char", torch.uint8: "Byte",
}


@dataclass
class Group:
    """A process group and how to describe it (as ProcessGroupNCCL does)."""

    pg: dist.ProcessGroup | None
    """The torch process group (``None``: the default, world group)."""
    ranks: list[int]
    """Global ranks in the group, in group-rank order."""
    name: str
    """Process group name (torch's, e.g. "0")."""
    desc: str
    """What the group is for: ``default_pg``, ``ep``, ``dp_experts``."""

    @property
    def size(self) -> int:
        return len(self.ranks)

    @property
    def stride(self) -> int:
        """Global rank stride, when the ranks are an arithmetic progression (else 0)."""
        if len(self.ranks) < 2:
            return 1
        d = self.ranks[1] - self.ranks[0]
        ok = all(b - a == d for a, b in zip(self.ranks, self.ranks[1:]))
        return d if ok else 0


@dataclass
class Comm:
    """Issues collectives; counts them so that each carries a sequence number."""

    rank: int
    """This process's global rank."""
    annotate: bool = True
    """Wrap each collective in a ``cosim::comm`` annotation."""
    seq: int = 0
    """Collectives issued so far by this process."""

    def _meta(self, coll: str, group: Group, tensor: torch.Tensor, in_nelems: int, out_nelems: int,
              in_split: list[int], out_split: list[int], tag: str) -> dict:
        self.seq += 1
        meta = {
            "seq": self.seq,
            "tag": tag,
            "collective": coll,
            "dtype": _DTYPE_NAMES.get(tensor.dtype, str(tensor.dtype).replace("torch.", "")),
            "in_nelems": in_nelems,
            "out_nelems": out_nelems,
            "in_split": in_split,
            "out_split": out_split,
            "pg_name": group.name,
            "pg_desc": group.desc,
            "pg_ranks": group.ranks,
            "group_size": group.size,
            "rank_start": group.ranks[0],
            "rank_stride": group.stride,
            "rank": self.rank,
        }
        return meta

    def _annot(self, meta: dict) -> record_function:
        return record_function(COMM_ANNOTATION, json.dumps(meta, separators=(",", ":")))

    def all_to_all_single(self, out: torch.Tensor, inp: torch.Tensor, group: Group, tag: str,
                          out_split: list[int] | None = None, in_split: list[int] | None = None) -> None:
        """``dist.all_to_all_single``; split sizes are rows (first-dim slices) per peer."""
        row = math.prod(inp.shape[1:])
        coll = "all_to_allv" if in_split is not None else "all_to_all"
        # ProcessGroupNCCL reports split sizes in rows of the first dimension, as passed.
        meta = self._meta(coll, group, inp, inp.numel(), out.numel(),
                          list(in_split or []), list(out_split or []), tag)
        meta["row_nelems"] = row
        if self.annotate:
            with self._annot(meta):
                dist.all_to_all_single(out, inp, output_split_sizes=out_split, input_split_sizes=in_split,
                                       group=group.pg)
        else:
            dist.all_to_all_single(out, inp, output_split_sizes=out_split, input_split_sizes=in_split,
                                   group=group.pg)

    def all_reduce(self, t: torch.Tensor, group: Group, tag: str) -> None:
        """Sum ``t`` in place over ``group``."""
        meta = self._meta("allreduce", group, t, t.numel(), t.numel(), [], [], tag)
        if self.annotate:
            with self._annot(meta):
                dist.all_reduce(t, group=group.pg)
        else:
            dist.all_reduce(t, group=group.pg)


class AllToAll(torch.autograd.Function):
    """Differentiable all-to-all(v): the backward pass sends gradients back along
    the same routes (split sizes swapped), as Megatron/DeepSpeed MoE layers do."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Comm, group: Group, in_split: list[int],  # type: ignore[override]
                out_split: list[int], tag: str) -> torch.Tensor:
        ctx.comm, ctx.group, ctx.in_split, ctx.out_split, ctx.tag = comm, group, in_split, out_split, tag
        out = x.new_empty((sum(out_split), *x.shape[1:]))
        comm.all_to_all_single(out, x.contiguous(), group, tag + ".fwd", out_split=out_split, in_split=in_split)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        out = grad.new_empty((sum(ctx.in_split), *grad.shape[1:]))
        ctx.comm.all_to_all_single(out, grad.contiguous(), ctx.group, ctx.tag + ".bwd",
                                   out_split=ctx.in_split, in_split=ctx.out_split)
        return out, None, None, None, None, None
