"""DeepEP-style MoE dispatch (FP8) and combine (BF16) as flows on the fabric.

DeepEP's *normal* kernels (deepseek-ai/DeepEP, docs/legacy.md "Normal kernels with NVLink and RDMA
forwarding"): a token goes to each GPU that holds one of its top-k experts. Inside a node it moves over
NVLink. Across nodes it crosses the network once per destination node, to the GPU of the same local
index (its rail peer), which forwards it over NVLink to the node's destination GPUs. Combine is the reverse
(BF16). The *low-latency* kernels send every (token, expert) selection straight to the expert's GPU over
RDMA (pure RDMA, no NVLink forwarding, no per-node dedup).

Traffic is the *expected* traffic of uniform routing (DeepEP's benchmark: random scores; internode tokens
restricted to ``num_topk_groups`` node groups), or a user matrix. All flows of one call run together,
uncoupled, through the fabric (so they share links with anything else running and follow topology
what-ifs) with the NIC model of :mod:`cosim.engine.collectives`; a fixed launch latency is added.

Per-rank logical bandwidths are reported as DeepEP's tests define them: NVL = bytes a rank receives
(including its own tokens) / time; RDMA = tokens x distinct destination nodes (including its own) x
bytes / time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import comb
from typing import TYPE_CHECKING

import numpy as np
import simpy

if TYPE_CHECKING:
    from cosim.engine.simulator import Simulator

__all__ = ["MoeCommResult", "MoeTraffic", "deepep", "expected_traffic", "token_bytes"]

KINDS = ("dispatch", "combine")
MODES = ("normal", "low_latency")


def token_bytes(hidden: int, kind: str) -> float:
    """Bytes one token carries: dispatch FP8 = hidden + one fp32 scale per 128 channels
    (DeepEP: ``hidden * (1 + 4/128)``); combine BF16 = ``2 * hidden``."""
    if kind == "dispatch":
        return hidden * (1.0 + 4.0 / 128.0)
    if kind == "combine":
        return 2.0 * hidden
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


def _p_any(pool: int, held: int, k: int) -> float:
    """P(at least one of k distinct experts drawn uniformly from ``pool`` falls in a set of ``held``)."""
    k = min(k, pool)
    return 1.0 - comb(pool - held, k) / comb(pool, k) if held < pool else 1.0


@dataclass
class MoeTraffic:
    """Expected traffic of one dispatch per rank (tokens; multiply by :func:`token_bytes`)."""

    rank_tokens: np.ndarray
    """[i, j]: tokens rank i delivers to rank j (distinct (token, GPU) pairs; diagonal: kept local)."""
    node_tokens: np.ndarray
    """[i, b]: tokens rank i sends to node b (once per node; column of i's own node: local)."""
    selections: float
    """(token, expert) selections per rank (low-latency kernels send one message per selection)."""


def expected_traffic(nodes: int, per_node: int, num_tokens: int, num_topk: int, num_experts: int,
                     num_topk_groups: int | None = None) -> MoeTraffic:
    """Uniform routing as in DeepEP's tests: each token picks ``min(num_topk_groups, nodes)`` node
    groups (default ``min(nodes, 4)``), then ``num_topk`` distinct experts among those groups' experts."""
    g = nodes * per_node
    if num_experts % g:
        raise ValueError(f"num_experts {num_experts} must be a multiple of the {g} ranks")
    m = min(num_topk_groups or min(nodes, 4), nodes)
    pool = m * num_experts // nodes
    p_node = (m / nodes) * _p_any(pool, num_experts // nodes, num_topk)
    p_rank = (m / nodes) * _p_any(pool, num_experts // g, num_topk)
    rt = np.full((g, g), num_tokens * p_rank)
    nt = np.full((g, nodes), num_tokens * p_node)
    return MoeTraffic(rt, nt, float(num_tokens * num_topk))


@dataclass
class MoeCommResult:
    """One dispatch or combine."""

    kind: str
    mode: str
    ranks: list[str]
    start: float
    end: float
    nvl_bytes: float
    """Per rank (mean): bytes received (dispatch) / sent (combine) incl. its own tokens (DeepEP's NVL)."""
    rdma_bytes: float
    """Per rank (mean): DeepEP's logical RDMA bytes (distinct destination nodes incl. its own)."""

    @property
    def time(self) -> float:
        return self.end - self.start

    @property
    def nvl_bw(self) -> float:
        return self.nvl_bytes / self.time

    @property
    def rdma_bw(self) -> float:
        return self.rdma_bytes / self.time


def _flows(per_node: list[list[str]], tr: MoeTraffic, b: float, mode: str) -> list[tuple[str, str, float]]:
    """Dispatch direction flows (src, dst, bytes)."""
    ranks = [r for loc in per_node for r in loc]
    idx = {r: i for i, r in enumerate(ranks)}
    node = {r: k for k, loc in enumerate(per_node) for r in loc}
    acc: dict[tuple[str, str], float] = {}

    def add(a: str, c: str, v: float) -> None:
        if a != c and v > 0:
            acc[(a, c)] = acc.get((a, c), 0.0) + v

    for s in ranks:
        a = node[s]
        for d in ranks:
            if mode == "low_latency" or node[d] == a:
                add(s, d, tr.rank_tokens[idx[s], idx[d]] * b)
        if mode == "low_latency":
            continue
        lane = per_node[a].index(s)
        for k, loc in enumerate(per_node):
            if k == a:
                continue
            peer = loc[lane % len(loc)]
            add(s, peer, tr.node_tokens[idx[s], k] * b)  # RDMA, once per node
            for d in loc:
                add(peer, d, tr.rank_tokens[idx[s], idx[d]] * b)  # NVLink forward
    return [(a, c, v) for (a, c), v in acc.items()]


def deepep(sim: Simulator, kind: str, ranks: Sequence[str], *, num_tokens: int, hidden: int, num_topk: int,
           num_experts: int, num_topk_groups: int | None = None, mode: str = "normal",
           traffic: MoeTraffic | None = None, latency: float | None = None, name: str | None = None
           ) -> simpy.Event:
    """Start a DeepEP dispatch or combine on ``ranks`` now; the event succeeds with a :class:`MoeCommResult`.

    ``num_tokens`` per rank; ``traffic`` overrides the uniform-routing expectation (e.g. skewed routing);
    ``latency`` overrides the launch latency (default: the NCCL p2p launch latency of the parameters).
    """
    from cosim.engine.collectives import CollectiveResult, _Plan

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    ranks = list(ranks)
    col = sim.collectives
    per_node = col._by_node(ranks)
    sizes = {len(x) for x in per_node}
    if len(sizes) != 1:
        raise ValueError("DeepEP needs the same number of ranks on every node")
    tr = traffic or expected_traffic(len(per_node), sizes.pop(), num_tokens, num_topk, num_experts,
                                     num_topk_groups)
    b = token_bytes(hidden, kind)
    flows = _flows(per_node, tr, b, mode)
    if kind == "combine":
        flows = [(c, a, v) for a, c, v in flows]
    plan = _Plan.of([flows], coupled=False)
    params = col.params
    lat = latency if latency is not None else (params.fitted.p2p_latency if params.fitted else
                                               params.base_latency["p2p"]["simple"])
    eff = params.efficiency(col.shape("all_to_all", ranks), "p2p", "simple", sim.config.nccl.use_calibration)
    env = sim.env
    res = CollectiveResult(f"deepep_{kind}", float(sum(v for _, _, v in flows)), ranks, mode, "", env.now, env.now,
                           lat)
    inner = env.event()
    env.process(col._execute(plan, 1.0, lat, eff, float("inf"), name or f"deepep_{kind}", res, inner))
    out = env.event()
    nvl = float(tr.rank_tokens.sum(axis=1).mean()) * b
    rdma = float(tr.node_tokens.sum(axis=1).mean()) * b if len(per_node) > 1 else 0.0
    if mode == "low_latency":
        nvl = rdma = tr.selections * (hidden + hidden / 128 * 4 + 16 if kind == "dispatch" else 2.0 * hidden)
    def finish(_e: simpy.Event) -> None:
        out.succeed(MoeCommResult(kind, mode, ranks, res.start, res.end, nvl, rdma))

    inner.callbacks.append(finish)
    return out
