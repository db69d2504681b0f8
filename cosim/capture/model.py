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

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import record_function

from cosim.capture.comm import AllToAll, Comm, Group
from cosim.capture.config import MoEModelConfig, Skew
from cosim.capture.routing import choose_experts, zipf_popularity

__all__ = ["EPContext", "KVCache", "MoETransformer", "RoutingPlan", "grouped_mm_works", "layer_popularity",
           "routing_generator"]

RoutingPlan = Callable[[int, int], list[list[int]]]
"""``plan(layer, call) -> rows``: assignments per expert (``rows[j][e]``, length ``num_experts``) of
every member ``j`` of this rank's EP group in the ``call``-th forward pass of MoE layer ``layer``.
A fake capture (no tensor values) takes the routing from it instead of the router's choice."""

Sdpa = Callable[..., torch.Tensor]
"""``sdpa(q, k, v, is_causal=..., scale=...)``: attention of ``[batch, heads, len, dim]`` tensors."""


def routing_generator(seed: int, global_rank: int, layer: int) -> torch.Generator:
    """The generator of rank ``global_rank``'s forced routing choices in MoE layer ``layer``."""
    return torch.Generator().manual_seed(seed * 104_729 + global_rank * 613 + layer)


def layer_popularity(num_experts: int, s: float, seed: int, layer: int) -> torch.Tensor:
    """Zipf popularity of the experts of MoE layer ``layer`` (the same on every rank)."""
    return zipf_popularity(num_experts, s, torch.Generator().manual_seed(seed * 7919 + layer))


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
    plan: RoutingPlan | None = None
    """Routing from a plan instead of the router's values (fake tensors have none); see :data:`RoutingPlan`."""
    on_host_read: Callable[[torch.Tensor], None] | None = None
    """With a plan: called for each device tensor the program reads back to the host (split sizes), whose
    values then come from the plan."""
    sdpa: Sdpa = F.scaled_dot_product_attention
    """The attention kernel (a fake capture substitutes the fused GPU kernel's signature)."""
    init_weights: bool = True
    """Draw random weights (off for fake tensors: they have no values to draw)."""

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

    def __init__(self, cfg: MoEModelConfig, sdpa: Sdpa = F.scaled_dot_product_attention) -> None:
        super().__init__()
        d = cfg.attn_head_dim
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, d
        self.sdpa = sdpa
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * d, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, cfg.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(cfg.num_heads * d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.hkv, self.d).transpose(1, 2)
        k, v = _cached(cache, k, v, pos)
        if self.hkv != self.h:
            k = k.repeat_interleave(self.h // self.hkv, dim=1)
            v = v.repeat_interleave(self.h // self.hkv, dim=1)
        # Prefill (and training) starts at position 0: plain causal mask. Decode
        # (one new token) attends to the whole cache: no mask.
        o = self.sdpa(q, k, v, is_causal=s > 1)
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.h * self.d))


def _cached(cache: KVCache | None, k: torch.Tensor, v: torch.Tensor, pos: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Write this step's keys/values at ``pos`` into ``cache`` and return all keys/values so far."""
    if cache is None:
        return k, v
    s = k.shape[2]
    cache.k[:, :, pos:pos + s] = k
    cache.v[:, :, pos:pos + s] = v
    return cache.k[:, :, :pos + s], cache.v[:, :, :pos + s]


class MLAttention(nn.Module):
    """Multi-head latent attention (DeepSeek-V2/V3), with the projections of Hugging Face's
    ``modeling_deepseek.py``: queries through a low-rank ``q_a_proj`` (hidden -> ``q_lora_rank``),
    RMSNorm and ``q_b_proj`` (-> heads x (``qk_nope_head_dim`` + ``qk_rope_head_dim``)), or one
    ``q_proj`` when ``q_lora_rank`` is unset; keys and values from one joint compression
    ``kv_a_proj_with_mqa`` (hidden -> ``kv_lora_rank`` + ``qk_rope_head_dim``), RMSNorm of the latent,
    ``kv_b_proj`` (latent -> heads x (``qk_nope_head_dim`` + ``v_head_dim``)); the rope part of the key
    is one head shared by all heads. Attention over query/key head dim ``nope + rope`` and value head
    dim ``v_head_dim``, scale ``1/sqrt(nope + rope)``; ``o_proj`` (heads x ``v_head_dim`` -> hidden).
    The KV cache holds the expanded keys and values (as the Hugging Face model does). No rotary
    embedding (it changes no shape or FLOP count that matters to a replay)."""

    def __init__(self, cfg: MoEModelConfig, sdpa: Sdpa = F.scaled_dot_product_attention) -> None:
        super().__init__()
        h = cfg.hidden_size
        self.h = cfg.num_heads
        self.nope, self.rope, self.dv, self.kv_rank = _mla_dims(cfg)
        self.q_rank = cfg.q_lora_rank
        self.sdpa = sdpa
        dq = self.nope + self.rope
        if self.q_rank:
            self.q_a_proj = nn.Linear(h, self.q_rank, bias=False)
            self.q_a_layernorm = RMSNorm(self.q_rank, cfg.rms_norm_eps)
            self.q_b_proj = nn.Linear(self.q_rank, self.h * dq, bias=False)
        else:
            self.q_proj = nn.Linear(h, self.h * dq, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(h, self.kv_rank + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_rank, cfg.rms_norm_eps)
        self.kv_b_proj = nn.Linear(self.kv_rank, self.h * (self.nope + self.dv), bias=False)
        self.o_proj = nn.Linear(self.h * self.dv, h, bias=False)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None, pos: int = 0) -> torch.Tensor:
        b, s, _ = x.shape
        dq = self.nope + self.rope
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))) if self.q_rank else self.q_proj(x)
        q = q.view(b, s, self.h, dq).transpose(1, 2)
        latent, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_rank, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(latent)).view(b, s, self.h, self.nope + self.dv).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.dv], dim=-1)
        k_pe = k_pe.view(b, 1, s, self.rope).expand(b, self.h, s, self.rope)
        k = torch.cat([k_nope, k_pe], dim=-1)
        k, v = _cached(cache, k, v, pos)
        o = self.sdpa(q, k, v, is_causal=s > 1, scale=1.0 / math.sqrt(dq))
        return self.o_proj(o.transpose(1, 2).reshape(b, s, self.h * self.dv))


def _mla_dims(cfg: MoEModelConfig) -> tuple[int, int, int, int]:
    """(qk_nope_head_dim, qk_rope_head_dim, v_head_dim, kv_lora_rank) of an MLA config (all set: validated)."""
    nope, rope, dv, kv_rank = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    if nope is None or rope is None or dv is None or kv_rank is None:
        raise ValueError("MLA needs kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim")
    return nope, rope, dv, kv_rank


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
        if f is None:
            raise ValueError("num_experts > 0 needs expert_ffn_size")
        self.router = nn.Linear(h, cfg.num_experts, bias=False)
        self.w13 = nn.Parameter(torch.empty(e_local, h, 2 * f))
        self.w2 = nn.Parameter(torch.empty(e_local, f, h))
        for i in range(e_local if ep.init_weights else 0):  # each expert's weights: (seed, layer, expert id)
            g = torch.Generator().manual_seed(seed * 1_000_003 + layer * 4099 + self.first_expert + i)
            self.w13.data[i].normal_(0.0, 0.02, generator=g)
            self.w2.data[i].normal_(0.0, 0.02, generator=g)
        for p in (self.w13, self.w2):
            p.is_expert = True  # type: ignore[attr-defined]
        self.shared = (SwiGLU(h, (cfg.shared_expert_ffn_size or f) * cfg.num_shared_experts)
                       if cfg.num_shared_experts else None)
        self.popularity: torch.Tensor | None = None
        if ep.skew.kind == "zipf" and ep.plan is None:
            self.popularity = layer_popularity(cfg.num_experts, ep.skew.s, ep.seed, layer)
        self._gen = routing_generator(ep.seed, ep.global_rank, layer)
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

    def _read(self, t: torch.Tensor, planned: list[int] | None) -> list[int]:
        """``t.tolist()``: a device-to-host read of split sizes; with a routing plan, the planned values."""
        if planned is None:
            return t.tolist()
        if self.ep.on_host_read is not None:
            self.ep.on_host_read(t)
        return [int(v) for v in planned]

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
            plan = ep.plan(self.layer, self._calls) if ep.plan is not None else None
            self._calls += 1
            if plan is None:
                idx = choose_experts(scores.detach(), k, ep.skew, popularity=self.popularity,
                                     generator=self._gen, offset=offset)
            else:  # the router's own top-k; the counts that follow from it come from the plan
                idx = torch.topk(scores.detach(), k, dim=-1).indices
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
                if plan is not None:
                    raise ValueError("a routing plan (fake capture) cannot drop tokens for capacity")
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
                self.routed.append(routed.tolist() if plan is None else list(plan[ep.ep_rank]))
                self.dropped.append(dropped.tolist() if plan is None else [0] * num_e)

        xs = x[flat_t]
        if ep.ep > 1:
            with record_function(f"cosim::layer{self.layer}.moe.dispatch"):
                recv_counts = torch.empty_like(send_counts)
                ep.comm.all_to_all_single(recv_counts, send_counts, ep.ep_group, f"layer{self.layer}.moe.counts")
                sc = send_counts.view(ep.ep, self.e_local)
                rc = recv_counts.view(ep.ep, self.e_local)
                mine = slice(self.first_expert, self.first_expert + self.e_local)
                in_split = self._read(sc.sum(1), None if plan is None else [sum(plan[ep.ep_rank][j * self.e_local:(j + 1) * self.e_local])
                                                           for j in range(ep.ep)])
                out_split = self._read(rc.sum(1), None if plan is None else [sum(row[mine]) for row in plan])
                recv = AllToAll.apply(xs, ep.comm, ep.ep_group, in_split, out_split, f"layer{self.layer}.moe.dispatch")
                # Received rows are grouped by (source peer, local expert); regroup them by
                # local expert with a stable sort of each row's expert id (as Megatron does).
                row_expert = torch.repeat_interleave(
                    torch.arange(self.e_local, device=x.device).repeat(ep.ep), rc.reshape(-1),
                    output_size=sum(out_split))
                perm_t = torch.argsort(row_expert, stable=True)
                local_in = recv[perm_t]
                local_counts = self._read(rc.sum(0), None if plan is None else [sum(row[mine][i] for row in plan)
                                                               for i in range(self.e_local)])
        else:
            in_split = out_split = []
            local_in = xs
            local_counts = self._read(send_counts, None if plan is None else list(plan[0]))
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
        self.attn = (MLAttention(cfg, ep.sdpa) if cfg.attention_kind == "mla"
                     else Attention(cfg, ep.sdpa))
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
            for name, p in self.named_parameters() if ep.init_weights else ():
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
        if cfg.attention_kind == "mla":  # expanded keys and values, as Hugging Face caches them
            nope, rope, dv, _ = _mla_dims(cfg)
            k_shape = (batch, cfg.num_heads, max_len, nope + rope)
            v_shape = (batch, cfg.num_heads, max_len, dv)
        else:
            k_shape = v_shape = (batch, cfg.num_kv_heads, max_len, cfg.attn_head_dim)
        return [KVCache(torch.zeros(k_shape, device=device, dtype=dtype), torch.zeros(v_shape, device=device, dtype=dtype))
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
