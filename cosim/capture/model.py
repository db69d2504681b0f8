"""The reference MoE transformer, in plain torch, with expert parallelism.

What it models: a decoder-only MoE language model (see
:class:`cosim.capture.config.MoEModelConfig`) as Megatron-style
expert-parallel training and serving run it, eagerly:

* attention: RMSNorm, Q/K/V projections, ``scaled_dot_product_attention``
  (causal; grouped-query heads are repeated), output projection; a KV cache
  for prefill/decode. No rotary embedding (it changes no shapes).
* MoE FFN: a linear router (softmax or sigmoid scores), top-k choice (or a
  forced choice, see :mod:`cosim.capture.routing`), optional capacity drop,
  then **dispatch**: an all-to-all of per-expert token counts (int64, ``E``
  entries) followed by an all-to-all(v) of the token rows with the per-peer
  split sizes those counts give; local SwiGLU experts as grouped GEMMs; and
  **combine**: the reverse all-to-all(v). The gate-weighted sum and the
  shared experts finish the layer. The backward pass runs the same
  all-to-all(v)s with split sizes swapped.
* expert GEMMs: ``torch._grouped_mm`` over the token groups where the device
  supports it (checked once with a small forward and backward), else a
  Python loop of per-expert matmuls that skips empty experts.

Tensors are ``[tokens, hidden]`` inside the MoE layer; sizes are elements.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from cosim.capture.comm import AllToAll, Comm, Group
from cosim.capture.config import MoEModelConfig, Skew
from cosim.capture.routing import choose_experts, zipf_popularity

__all__ = ["EPContext", "KVCache", "MoETransformer", "grouped_mm_works"]


@dataclass
class EPContext:
    """Where this rank sits in expert parallelism, and how it routes."""

    comm: Comm
    """Collective issuer (annotated for the trace)."""
    ep_group: Group
    """This rank's expert-parallel group."""
    ep_rank: int
    """Index of this rank in ``ep_group``: it owns experts ``[ep_rank*E_l, (ep_rank+1)*E_l)``."""
    skew: Skew = field(default_factory=Skew)
    """Routing skew."""
    seed: int = 0
    """Seed of forced routing choices."""
    global_rank: int = 0
    """Global rank (seeds this rank's routing samples)."""
    world_size: int = 1
    """Number of ranks (balanced routing numbers tokens globally)."""
    use_grouped_mm: bool = False
    """Run expert GEMMs with ``torch._grouped_mm``."""

    @property
    def ep(self) -> int:
        return self.ep_group.size


def grouped_mm_works(device: torch.device, dtype: torch.dtype, backward: bool) -> bool:
    """Whether ``torch._grouped_mm`` runs here (forward, and backward if asked),
    including an empty group, on a small problem of this dtype."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        x = torch.randn(24, 32, device=device, dtype=dtype, requires_grad=backward)
        w = torch.randn(3, 32, 48, device=device, dtype=dtype, requires_grad=backward)
        offs = torch.tensor([8, 8, 24], device=device, dtype=torch.int32)
        y = torch._grouped_mm(x, w, offs=offs)
        ref = x[8:].float() @ w[2].float()
        if not torch.allclose(y[8:].float(), ref, atol=0.5, rtol=0.05):
            return False
        if backward:
            (y * torch.randn_like(y)).sum().backward()
        return True
    except Exception:
        return False


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dimension."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


@dataclass
class KVCache:
    """Keys and values of one layer: ``[batch, kv_heads, max_len, head_dim]`` each."""

    k: torch.Tensor
    v: torch.Tensor


class Attention(nn.Module):
    """Causal self-attention with grouped-query heads, via SDPA."""

    def __init__(self, cfg: MoEModelConfig) -> None:
        super().__init__()
        d = cfg.attn_head_dim
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, d
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        if cache is not None:
            cache.k[:, :, pos:pos + s] = k
            cache.v[:, :, pos:pos + s] = v
            k, v = cache.k[:, :, :pos + s], cache.v[:, :, :pos + s]
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        # Prefill (and training) starts at position 0: plain causal mask. Decode
        # (one new token) attends to the whole cache: no mask.
        o = F.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.h * self.d))


class SwiGLU(nn.Module):
    """Dense SwiGLU FFN: ``W2 (silu(x W1) * x W3)``; W1 and W3 fused."""

    def __init__(self, hidden: int, ffn: int) -> None:
        super().__init__()
        self.w13 = nn.Linear(hidden, 2 * ffn, bias=False)
        self.w2 = nn.Linear(ffn, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.w13(x).chunk(2, dim=-1)
        return self.w2(F.silu(a) * b)


class MoE(nn.Module):
    """Routed SwiGLU experts (this rank's share) + shared experts + router."""

    def __init__(self, cfg: MoEModelConfig, layer: int, ep: EPContext, seed: int) -> None:
        super().__init__()
        self.cfg, self.layer, self.ep = cfg, layer, ep
        e_local = cfg.num_experts // ep.ep
        self.e_local = e_local
        self.first_expert = ep.ep_rank * e_local
        h, f = cfg.hidden_size, cfg.expert_ffn_size
        self.router = nn.Linear(h, cfg.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(e_local, h, 2 * f))
        self.w2 = nn.Parameter(torch.empty(e_local, f, h))
        for i in range(e_local):  # each expert's weights depend only on (seed, layer, global expert id)
            g = torch.Generator().manual_seed(seed * 1_000_003 + layer * 4099 + self.first_expert + i)
            self.w13.data[i].normal_(0.0, 0.02, generator=g)
            self.w2.data[i].normal_(0.0, 0.02, generator=g)
        for p in (self.w13, self.w2):
            p.is_expert = True  # type: ignore[attr-defined]
        self.shared = (SwiGLU(h, (cfg.shared_expert_ffn_size or f) * cfg.num_shared_experts)
                       if cfg.num_shared_experts else None)
        self.popularity: torch.Tensor | None = None
        if ep.skew.kind == "zipf":
            g = torch.Generator().manual_seed(ep.seed * 7919 + layer)
            self.popularity = zipf_popularity(cfg.num_experts, ep.skew.s, g)
        self._gen = torch.Generator().manual_seed(ep.seed * 104_729 + ep.global_rank * 613 + layer)
        self._calls = 0
        self.recording = False
        self.routed: list[list[int]] = []
        """Router assignments per expert (before capacity drop), one list per recorded call."""
        self.dropped: list[list[int]] = []
        """Assignments dropped for capacity, per expert, one list per recorded call."""
        self.aux_loss: torch.Tensor | None = None

    def _experts(self, x: torch.Tensor, counts: list[int]) -> torch.Tensor:
        """SwiGLU over groups of rows: rows of expert ``i`` are the ``i``-th block of ``counts[i]`` rows."""
        if self.ep.use_grouped_mm:
            offs = torch.tensor(counts, device=x.device, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            a, b = torch._grouped_mm(x, self.w13, offs=offs).chunk(2, dim=-1)
            return torch._grouped_mm(F.silu(a) * b, self.w2, offs=offs)
        outs, start = [], 0
        for i, c in enumerate(counts):
            if c:
                a, b = (x[start:start + c] @ self.w13[i]).chunk(2, dim=-1)
                outs.append((F.silu(a) * b) @ self.w2[i])
                start += c
        return torch.cat(outs) if outs else x.new_zeros((0, x.shape[1]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, ep = self.cfg, self.ep
        n, h = x.shape
        k, num_e = cfg.top_k, cfg.num_experts
        with record_function(f"cosim::layer{self.layer}.moe.router"):
            logits = self.router(x)
            scores = logits.softmax(-1) if cfg.router == "softmax" else logits.sigmoid()
            # Balanced: number tokens globally (call, rank, token) so that the
            # assignments of all ranks together are round-robin too.
            offset = (self._calls * ep.world_size + ep.global_rank) * n
            self._calls += 1
            idx = choose_experts(scores.detach(), k, ep.skew, popularity=self.popularity,
                                 generator=self._gen, offset=offset)
            weights = scores.gather(1, idx)
            if cfg.normalize_top_k:
                weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-20)
            routed = torch.bincount(idx.flatten(), minlength=num_e)
            # Switch-style load-balancing loss: E * sum_e f_e * P_e.
            probs = scores if cfg.router == "softmax" else scores / scores.sum(-1, keepdim=True)
            frac = routed.to(probs.dtype) / max(n * k, 1)
            self.aux_loss = cfg.aux_loss_coef * num_e * (frac * probs.mean(0)).sum()

            # Assignments in choice-major order (every token's 1st choice first), as GShard
            # drops: later choices lose first when an expert is over capacity.
            flat_e = idx.t().reshape(-1)
            flat_t = torch.arange(n, device=x.device).repeat(k)
            flat_w = weights.t().reshape(-1)
            dropped = torch.zeros_like(routed)
            if cfg.capacity_factor is not None:
                cap = int(-(-cfg.capacity_factor * n * k // num_e))
                one_hot = F.one_hot(flat_e, num_e)
                pos_in_expert = (one_hot.cumsum(0) * one_hot).sum(1) - 1
                keep = pos_in_expert < cap
                dropped = torch.bincount(flat_e[~keep], minlength=num_e)
                flat_e, flat_t, flat_w = flat_e[keep], flat_t[keep], flat_w[keep]
            order = torch.argsort(flat_e, stable=True)
            flat_e, flat_t, flat_w = flat_e[order], flat_t[order], flat_w[order]
            send_counts = torch.bincount(flat_e, minlength=num_e)
            if self.recording:
                self.routed.append(routed.tolist())
                self.dropped.append(dropped.tolist())

        xs = x[flat_t]
        if ep.ep > 1:
            with record_function(f"cosim::layer{self.layer}.moe.dispatch"):
                recv_counts = torch.empty_like(send_counts)
                ep.comm.all_to_all_single(recv_counts, send_counts, ep.ep_group, f"layer{self.layer}.moe.counts")
                sc = send_counts.view(ep.ep, self.e_local)
                rc = recv_counts.view(ep.ep, self.e_local)
                in_split = sc.sum(1).tolist()
                out_split = rc.sum(1).tolist()
                recv = AllToAll.apply(xs, ep.comm, ep.ep_group, in_split, out_split, f"layer{self.layer}.moe.dispatch")
                # Received rows are grouped by (source peer, local expert); regroup them by
                # local expert with a stable sort of each row's expert id (as Megatron does).
                row_expert = torch.repeat_interleave(
                    torch.arange(self.e_local, device=x.device).repeat(ep.ep), rc.reshape(-1))
                perm_t = torch.argsort(row_expert, stable=True)
                local_in = recv[perm_t]
                local_counts = rc.sum(0).tolist()
        else:
            in_split = out_split = []
            local_in = xs
            local_counts = send_counts.tolist()
        with record_function(f"cosim::layer{self.layer}.moe.experts"):
            local_out = self._experts(local_in, local_counts)
        if ep.ep > 1:
            with record_function(f"cosim::layer{self.layer}.moe.combine"):
                back = torch.empty_like(local_out)
                back = back.index_copy(0, perm_t, local_out)
                ys = AllToAll.apply(back, ep.comm, ep.ep_group, out_split, in_split, f"layer{self.layer}.moe.combine")
        else:
            ys = local_out
        out = x.new_zeros((n, h)).index_add(0, flat_t, ys * flat_w.unsqueeze(1).to(ys.dtype))
        if self.shared is not None:
            with record_function(f"cosim::layer{self.layer}.moe.shared"):
                out = out + self.shared(x)
        return out


class Block(nn.Module):
    """One transformer layer: attention and an FFN (dense or MoE), pre-norm residuals."""

    def __init__(self, cfg: MoEModelConfig, layer: int, ep: EPContext, seed: int) -> None:
        super().__init__()
        self.layer = layer
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.ffn: nn.Module
        if layer < cfg.dense_layers:
            self.ffn = SwiGLU(cfg.hidden_size, cfg.dense_ffn_size or 0)
        else:
            self.ffn = MoE(cfg, layer, ep, seed)

    def forward(self, x: torch.Tensor, cache: KVCache | None, pos: int) -> torch.Tensor:
        with record_function(f"cosim::layer{self.layer}.attn"):
            x = x + self.attn(self.attn_norm(x), cache, pos)
        b, s, h = x.shape
        with record_function(f"cosim::layer{self.layer}.ffn"):
            y = self.ffn(self.ffn_norm(x).reshape(b * s, h)).view(b, s, h)
        return x + y


class MoETransformer(nn.Module):
    """Embedding, ``num_layers`` blocks, final RMSNorm, LM head (untied)."""

    def __init__(self, cfg: MoEModelConfig, ep: EPContext, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        torch.manual_seed(seed)  # dense weights: identical on every rank
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.blocks = nn.ModuleList(Block(cfg, i, ep, seed) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() == 2 and not getattr(p, "is_expert", False) and "norm" not in name:
                    p.normal_(0.0, 0.02)

    def moe_layers(self) -> list[MoE]:
        return [b.ffn for b in self.blocks if isinstance(b.ffn, MoE)]

    def set_recording(self, on: bool) -> None:
        """Record routing statistics of the following forward passes."""
        for m in self.moe_layers():
            m.recording = on

    def aux_loss(self) -> torch.Tensor:
        losses = [m.aux_loss for m in self.moe_layers() if m.aux_loss is not None]
        return torch.stack(losses).sum() if losses else torch.zeros(())

    def new_cache(self, batch: int, max_len: int, device: torch.device, dtype: torch.dtype) -> list[KVCache]:
        cfg = self.cfg
        shape = (batch, cfg.num_kv_heads, max_len, cfg.attn_head_dim)
        return [KVCache(torch.zeros(shape, device=device, dtype=dtype), torch.zeros(shape, device=device, dtype=dtype))
                for _ in range(cfg.num_layers)]

    def forward(self, tokens: torch.Tensor, cache: list[KVCache] | None = None, pos: int = 0,
                last_only: bool = False) -> torch.Tensor:
        """Logits ``[batch, seq, vocab]`` (or ``[batch, 1, vocab]`` with ``last_only``)."""
        x = self.embed(tokens)
        for i, blk in enumerate(self.blocks):
            x = blk(x, cache[i] if cache is not None else None, pos)
        if last_only:
            x = x[:, -1:]
        with record_function("cosim::lm_head"):
            return self.lm_head(self.norm(x))
