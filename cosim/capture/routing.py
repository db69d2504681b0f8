"""Expert choice under a routing-skew knob (see :class:`cosim.capture.config.Skew`).

Functions return expert indices ``[tokens, top_k]`` (int64); the caller takes
the gate weights from the router's own scores at those indices.
"""

from __future__ import annotations

import torch

from cosim.capture.config import Skew

__all__ = ["balanced_choice", "choose_experts", "zipf_choice", "zipf_popularity"]


def balanced_choice(n: int, k: int, num_experts: int, offset: int = 0) -> torch.Tensor:
    """Round-robin assignment: token ``i``'s ``j``-th expert is ``((i+offset)*k + j) mod E``.

    Every expert gets ``n*k/E`` assignments (within one when that is not an
    integer), and a token's ``k`` experts are distinct because ``k <= E``.
    """
    i = torch.arange(n, dtype=torch.int64).unsqueeze(1) + offset
    j = torch.arange(k, dtype=torch.int64).unsqueeze(0)
    return (i * k + j) % num_experts


def zipf_popularity(num_experts: int, s: float, generator: torch.Generator) -> torch.Tensor:
    """Probability of each expert under a Zipf law: the ``r``-th most popular
    expert (1-based) has weight ``1/r**s``; which expert has which rank is a
    random permutation drawn from ``generator`` (same on every rank)."""
    weights = 1.0 / torch.arange(1, num_experts + 1, dtype=torch.float64) ** s
    order = torch.randperm(num_experts, generator=generator)
    p = torch.empty(num_experts, dtype=torch.float64)
    p[order] = weights / weights.sum()
    return p


def zipf_choice(n: int, k: int, popularity: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sample ``k`` distinct experts per token with probabilities ``popularity``."""
    if n == 0:
        return torch.empty((0, k), dtype=torch.int64)
    return torch.multinomial(popularity.float().expand(n, -1), k, replacement=False, generator=generator)


def choose_experts(scores: torch.Tensor, k: int, skew: Skew, *, popularity: torch.Tensor | None = None,
                   generator: torch.Generator | None = None, offset: int = 0) -> torch.Tensor:
    """Expert indices ``[n, k]`` for router ``scores`` ``[n, E]`` under ``skew``.

    ``natural`` is the router's top-k; ``balanced`` and ``zipf`` replace the
    choice (not the scores) and need ``offset`` / ``popularity`` and ``generator``.
    """
    n, num_experts = scores.shape
    if skew.kind == "natural":
        return torch.topk(scores, k, dim=-1).indices
    if skew.kind == "balanced":
        idx = balanced_choice(n, k, num_experts, offset)
    else:
        if popularity is None or generator is None:
            raise ValueError("zipf routing needs popularity and generator")
        idx = zipf_choice(n, k, popularity, generator)
    return idx.to(scores.device)
