"""What one rank of a capture runs per step, shared by the real capture (``worker``) and the
fake-tensor capture (``fake``): the model, its parameter buckets, the optimizer and the step.

A training step is: forward on ``batch x seq`` tokens, next-token cross-entropy + the MoE
auxiliary loss, backward, gradient all-reduce of DDP-style buckets (non-expert parameters over
all ranks, expert parameters over the expert-DP group), AdamW (``foreach``). Prefill is one
forward over a new prompt into the KV cache; decode one token per sequence against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import record_function

from cosim.capture.comm import Comm, Group
from cosim.capture.config import CaptureOptions
from cosim.capture.model import EPContext, KVCache, MoETransformer

__all__ = ["RankProgram", "allreduce_grads", "buckets", "lm_loss"]


def buckets(params: list[torch.nn.Parameter], cap_bytes: float) -> list[list[torch.nn.Parameter]]:
    """Split ``params`` (already in reverse order, as DDP) into buckets of at most ``cap_bytes``."""
    out: list[list[torch.nn.Parameter]] = []
    cur: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if cur and size + nbytes > cap_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        out.append(cur)
    return out


def allreduce_grads(comm: Comm, bucket_list: list[list[torch.nn.Parameter]], group: Group, scale: float,
                    tag: str) -> None:
    """Flatten each bucket's gradients, sum them over ``group``, scale, copy back."""
    for i, bucket in enumerate(bucket_list):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        comm.all_reduce(flat, group, f"{tag}.bucket{i}")
        flat.mul_(scale)
        off = 0
        for p in bucket:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p)
            off += n


def lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions (fp32)."""
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


@dataclass
class RankProgram:
    """One rank's model, optimizer and step function (see module docs).

    ``tokens(shape)`` makes the step's input token ids (int64, on the model's device)."""

    opts: CaptureOptions
    """The capture."""
    comm: Comm
    """Issues (and annotates) the collectives."""
    world: Group
    """All ranks (non-expert gradients)."""
    dp_group: Group | None
    """This rank's expert-DP group (expert gradients), None when there is one EP group."""
    ctx: EPContext
    """Expert parallelism and routing of this rank."""
    device: torch.device
    """Where the model lives."""
    dtype: torch.dtype
    """Parameter and activation dtype."""
    tokens: Callable[[tuple[int, ...]], torch.Tensor]
    """Input token ids of a given shape."""

    def __post_init__(self) -> None:
        opts = self.opts
        self.train = opts.mode == "train"
        self.model = MoETransformer(opts.model, self.ctx, seed=opts.seed)
        params = list(self.model.parameters())
        if any(p.dtype != self.dtype or p.device != self.device for p in params):
            self.model.to(device=self.device, dtype=self.dtype)
            params = list(self.model.parameters())
        self.expert_params = [p for p in params if getattr(p, "is_expert", False)]
        dense_params = [p for p in params if not getattr(p, "is_expert", False)]
        cap = opts.bucket_mb * 2**20
        self.dense_buckets = buckets(list(reversed(dense_params)), cap)
        self.expert_buckets = buckets(list(reversed(self.expert_params)), cap)
        # foreach: one multi-tensor kernel per AdamW stage (the default on GPUs; on CPU torch
        # would loop per parameter).
        self.opt = torch.optim.AdamW(params, lr=opts.lr, foreach=True) if self.train else None
        if not self.train:
            self.model.eval()
        self.cache: list[KVCache] | None = None
        self.next_tok: torch.Tensor | None = None

    def prepare(self, total_steps: int) -> None:
        """KV cache (prefill/decode) and, for decode, the prompt (not part of any step)."""
        b, s = self.opts.batch, self.opts.seq
        if self.opts.mode == "decode":
            self.cache = self.model.new_cache(b, s + total_steps, self.device, self.dtype)
            with torch.inference_mode():
                self.next_tok = self.model(self.tokens((b, s)), self.cache, 0, last_only=True).argmax(-1)
        elif self.opts.mode == "prefill":
            self.cache = self.model.new_cache(b, s, self.device, self.dtype)

    def step(self, i: int) -> None:
        """Run step ``i`` (0-based, warm-up steps included)."""
        opts, model = self.opts, self.model
        b, s = opts.batch, opts.seq
        if self.train:
            assert self.opt is not None
            tokens = self.tokens((b, s + 1))
            with record_function("cosim::forward"):
                logits = model(tokens[:, :-1])
                loss = lm_loss(logits, tokens[:, 1:]) + model.aux_loss().to(logits.dtype)
            with record_function("cosim::backward"):
                loss.backward()
            with record_function("cosim::grad_sync"):
                allreduce_grads(self.comm, self.dense_buckets, self.world, 1.0 / opts.world_size, "grad.dense")
                if self.dp_group is not None:
                    allreduce_grads(self.comm, self.expert_buckets, self.dp_group, 1.0 / opts.world_size,
                                    "grad.experts")
                else:
                    for p in self.expert_params:
                        if p.grad is not None:
                            p.grad.mul_(1.0 / opts.world_size)
            with record_function("cosim::optimizer"):
                self.opt.step()
                self.opt.zero_grad(set_to_none=True)
        elif opts.mode == "prefill":
            tokens = self.tokens((b, s))
            with torch.inference_mode(), record_function("cosim::prefill"):
                model(tokens, self.cache, 0, last_only=True).argmax(-1)
        else:
            with torch.inference_mode(), record_function("cosim::decode"):
                self.next_tok = model(self.next_tok, self.cache, s + i).argmax(-1)
