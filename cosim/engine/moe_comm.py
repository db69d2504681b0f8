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

import weakref
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace
from math import comb
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

if TYPE_CHECKING:
    from cosim.engine.simulator import Simulator

__all__ = [
    "DEEPEP_RATES",
    "HYBRIDEP_RATES",
    "DeepEPLoad",
    "DeepEPRates",
    "HybridEPRates",
    "MoeCommResult",
    "MoeTraffic",
    "buffer_token_bytes",
    "deepep",
    "deepep_load",
    "expected_traffic",
    "hybridep",
    "hybridep_load",
    "hybridep_token_bytes",
    "nvlink_domains",
    "token_bytes",
]

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


@dataclass(frozen=True)
class DeepEPRates:
    """Fractions of a link's raw bandwidth (per direction) that DeepEP's normal kernels reach, each from
    a measurement independent of the published H800 tables scored in validation/moe_comm. They replace
    the catalog's link efficiency (measured with NCCL) for DeepEP's flows; a fabric link never runs
    above its catalog efficiency, so a fraction above it is capped there."""

    nvlink: float = 0.655
    """DeepEP's intranode kernel on H20 (18 NVLink 4 links, 450 GB/s per direction, 24 SMs, DeepEP's
    test_intranode.py defaults: 4096 tokens, hidden 7168, top-8 of 256 experts): best 337.35 GB/s of
    DeepEP's NVL metric (deepseek-ai/DeepEP issue #16), of which 7/8 cross NVLink: 295 / 450 = 0.655."""
    rdma: float = 0.94
    """NVSHMEM ``shmem_put_bw`` between two H100 nodes with one 400 Gb/s NIC per GPU: ~47 GB/s of 50
    (deepseek-ai/DeepEP issue #155); DeepEP's RDMA is NVSHMEM (IBGDA) puts."""
    forward_dispatch: float = 110.6e9
    """Bytes/s one GPU writes over NVLink in an internode (normal) dispatch at 24 SMs, whatever the
    NVLink: internode.cu forwards with one warp per destination GPU and channel, one token at a time
    (TMA load, wait, TMA store), so the kernel, not the link, sets it. Measured on 2 x 8 H200 (NVLink
    450 GB/s per direction, 2.25x H800's) with CX7 400 Gb/s (deepseek-ai/DeepEP issue #493, DeepEP
    a84a248, FP8 dispatch 38.19 GB/s RDMA): 174.7 MB of NVLink writes per GPU in 1.58 ms."""
    forward_combine: float = 127.5e9
    """The same for the internode combine (issue #493: combine 44.37 GB/s RDMA, 336 MB per GPU in
    2.64 ms)."""


DEEPEP_RATES = DeepEPRates()


def buffer_token_bytes(hidden: int, kind: str, num_topk: int, internode: bool) -> float:
    """Bytes one token occupies in DeepEP's (V1) channel buffers: what crosses NVLink or the NIC per
    token and destination in the normal kernels (deepseek-ai/DeepEP @dd758ca csrc/kernels/legacy).

    Internode (RDMA sends and NVLink forwarding, ``internode.cu: get_num_bytes_per_token``): the payload
    + ``SourceMeta`` (two ints, 8 B) + fp32 scales + int32 top-k indices + fp32 top-k weights, aligned
    to 16 B; dispatch carries all of them (FP8: one scale per 128 channels), combine (called with no
    scales and no indices) the BF16 payload, the source meta and the weights.
    Intranode (``intranode.cu`` channel buffers): dispatch = payload + fp32 scales + int32 ``src_idx``
    + int64 top-k indices (``topk_idx_t``, 64 bits by default) + fp32 weights; combine = BF16 payload
    + ``src_idx`` + weights.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if internode:
        raw = (hidden + 8 + 4 * (hidden // 128) + 8 * num_topk if kind == "dispatch"
               else 2 * hidden + 8 + 4 * num_topk)
        return float(-(-raw // 16) * 16)
    if kind == "dispatch":
        return float(hidden + 4 * (hidden // 128) + 4 + 12 * num_topk)
    return float(2 * hidden + 4 + 4 * num_topk)


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


@dataclass(frozen=True)
class DeepEPLoad:
    """Bytes one DeepEP normal dispatch (or combine, the same bytes reversed) puts on each per-GPU
    resource, mean over ranks, in DeepEP's buffer layout (:func:`buffer_token_bytes`)."""

    nvlink_out: float
    """Bytes a GPU writes to other GPUs of its node over NVLink (own tokens and forwarded ones)."""
    nvlink_in: float
    """Bytes a GPU receives over NVLink from the GPUs of its node."""
    nic_out: float
    """Bytes a GPU's NIC sends to other nodes (own-node tokens never cross it)."""
    nic_in: float
    """Bytes a GPU's NIC receives from other nodes."""
    logical: float
    """DeepEP's reported bytes: NVL (intranode) or RDMA (internode, incl. the own node) per rank."""


def deepep_load(nodes: int, per_node: int, kind: str, *, num_tokens: int, hidden: int, num_topk: int,
                num_experts: int, num_topk_groups: int | None = None,
                traffic: MoeTraffic | None = None) -> DeepEPLoad:
    """Per-GPU bytes of one DeepEP normal dispatch/combine on ``nodes`` x ``per_node`` GPUs with the
    rail-peer forwarding of :func:`_flows`. Cost: O((nodes x per_node)^2)."""
    tr = traffic or expected_traffic(nodes, per_node, num_tokens, num_topk, num_experts, num_topk_groups)
    grid = [[f"{k}:{i}" for i in range(per_node)] for k in range(nodes)]
    node = {r: k for k, loc in enumerate(grid) for r in loc}
    g = nodes * per_node
    b = buffer_token_bytes(hidden, kind, num_topk, nodes > 1)
    acc = dict.fromkeys(("no", "ni", "co", "ci"), 0.0)
    for a, c, v in _flows(grid, tr, b, "normal"):
        if kind == "combine":
            a, c = c, a
        same = node[a] == node[c]
        acc["no" if same else "co"] += v
        acc["ni" if same else "ci"] += v
    if nodes > 1:
        logical = float(tr.node_tokens.sum(axis=1).mean()) * token_bytes(hidden, kind)
    else:
        logical = float(tr.rank_tokens.sum(axis=1).mean()) * token_bytes(hidden, kind)
    return DeepEPLoad(acc["no"] / g, acc["ni"] / g, acc["co"] / g, acc["ci"] / g, logical)


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


_FLOW_CACHE: weakref.WeakKeyDictionary[Any, dict[Any, Any]] = weakref.WeakKeyDictionary()
"""Per simulator: the flows (and their link efficiencies) of a uniform-routing call, by group and
parameters: a training step repeats the same dispatch thousands of times."""


def _rate_efficiency(sim: Simulator, flows: list[tuple[str, str, float]], fraction: float) -> float:
    """Flow efficiency that makes ``flows`` run at ``fraction`` of raw bandwidth on their links: the
    fraction over the lowest catalog efficiency of the links leaving their sources (NVLink for node-local
    flows, the NIC's network link for cross-node ones), at most 1."""
    g = sim.fabric.graph
    net = any(sim.topo.node_of(a) != sim.topo.node_of(b) for a, b, _ in flows)
    effs = []
    for a in {a for a, _, _ in flows}:
        nic = sim.topo.nic_of(a) if net else None
        src = nic if nic is not None and nic in g else a
        kinds = ("infiniband", "ethernet") if net else ("nvlink", "xgmi")
        effs += [float(d.get("efficiency", 1.0)) for _, _, d in g.out_edges(src, data=True)
                 if d.get("kind") in kinds]
    return min(1.0, fraction / min(effs)) if effs else 1.0


def _p2p_latency(col: Any, latency: float | None) -> float:
    """The fixed latency of a DeepEP/HybridEP kernel (s): ``latency`` if given, else NCCL's fitted p2p latency
    (or its Simple-protocol base latency when nothing is fitted)."""
    if latency is not None:
        return latency
    params = col.params
    return float(params.fitted.p2p_latency if params.fitted else params.base_latency["p2p"]["simple"])


def deepep(sim: Simulator, kind: str, ranks: Sequence[str], *, num_tokens: int, hidden: int, num_topk: int,
           num_experts: int, num_topk_groups: int | None = None, mode: str = "normal",
           traffic: MoeTraffic | None = None, latency: float | None = None, name: str | None = None,
           rates: DeepEPRates = DEEPEP_RATES) -> simpy.Event:
    """Start a DeepEP dispatch or combine on ``ranks`` now; the event succeeds with a :class:`MoeCommResult`.

    ``num_tokens`` per rank; ``traffic`` overrides the uniform-routing expectation (e.g. skewed routing);
    ``latency`` overrides the launch latency (default: the NCCL p2p launch latency of the parameters);
    ``rates``: the fractions of raw NVLink / NIC bandwidth DeepEP reaches and its internode forwarding
    rate (:class:`DeepEPRates`). The node-local flows (NVLink; internode: each capped at the forwarding
    rate / (GPUs per node - 1), one warp per destination) and the cross-node flows (RDMA) run side by
    side on the fabric, each at its rate; the call ends when both have.
    """
    from cosim.engine.collectives import CollectiveResult

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
    lat = _p2p_latency(col, latency)
    env = sim.env
    label = name or f"deepep_{kind}"
    b = token_bytes(hidden, kind)
    key = (tuple(tuple(x) for x in per_node), num_tokens, num_topk, num_experts, num_topk_groups, kind, mode,
           hidden, rates)
    cache = _FLOW_CACHE.setdefault(sim, {})
    hit = cache.get(key) if traffic is None else None
    if hit is None:
        tr = traffic or expected_traffic(len(per_node), sizes.pop(), num_tokens, num_topk, num_experts,
                                         num_topk_groups)
        wire = buffer_token_bytes(hidden, kind, num_topk, len(per_node) > 1) if mode == "normal" else b
        flows = _flows(per_node, tr, wire, mode)
        if kind == "combine":
            flows = [(c, a, v) for a, c, v in flows]
        node = {r: k for k, loc in enumerate(per_node) for r in loc}
        intra = [f for f in flows if node[f[0]] == node[f[1]]]
        inter = [f for f in flows if node[f[0]] != node[f[1]]]
        # internode: NVLink forwarding at the kernel's rate per GPU, split over its per-destination warps
        fwd = rates.forward_dispatch if kind == "dispatch" else rates.forward_combine
        fwd_cap = fwd / max(1, len(per_node[0]) - 1) if len(per_node) > 1 and mode == "normal" else float("inf")
        parts = [(p, _rate_efficiency(sim, p, frac), cap)
                 for p, frac, cap in ((intra, rates.nvlink, fwd_cap), (inter, rates.rdma, float("inf"))) if p]
        hit = (tr, float(sum(v for _, _, v in flows)), parts)
        if traffic is None:
            cache[key] = hit
    tr, total, parts = hit
    res = CollectiveResult(f"deepep_{kind}", total, ranks, mode, "", env.now, env.now, lat)
    nvl = float(tr.rank_tokens.sum(axis=1).mean()) * b
    rdma = float(tr.node_tokens.sum(axis=1).mean()) * b if len(per_node) > 1 else 0.0
    if mode == "low_latency":
        nvl = rdma = tr.selections * (hidden + hidden / 128 * 4 + 16 if kind == "dispatch" else 2.0 * hidden)
    return _launch(col, res, parts, label, MoeCommResult(kind, mode, ranks, 0.0, 0.0, nvl, rdma))


def _launch(col: Any, res: Any, parts: list[tuple[Any, Any, float]], label: str, out_proto: MoeCommResult
            ) -> simpy.Event:
    """Run a DeepEP/HybridEP call's flow parts (each ``(plan part, rows, rate cap)``) concurrently on the fabric,
    finish ``res`` when the last ends, and return the event that succeeds with ``out_proto`` timed by it."""
    from cosim.engine.collectives import CollectiveResult, _Plan

    env = col.sim.env
    inner = env.event()

    def run() -> Generator[simpy.Event, object, None]:
        subs = [CollectiveResult(res.op, 0.0, res.ranks, res.algo, "", env.now, env.now, res.latency)
                for _ in parts]
        yield env.all_of([env.process(col._execute(_Plan.of([p], coupled=False), 1.0, res.latency, e, cap, label,
                                                   sub, None))
                          for (p, e, cap), sub in zip(parts, subs)])
        res.bytes_on_fabric = sum(sub.bytes_on_fabric for sub in subs)
        col._finish(res, label, inner)

    env.process(run())
    out = env.event()

    def finish(_e: simpy.Event) -> None:
        out.succeed(replace(out_proto, start=res.start, end=res.end))

    inner.callbacks.append(finish)
    return out


# ----------------------------------------------------------------------------------------------------------------
# HybridEP (NVIDIA's backend of DeepEP's ``hybrid-ep`` branch; Megatron-Core's flex dispatcher,
# ``moe_flex_dispatcher_backend: hybridep``)

HYBRIDEP_SOURCE = (
    "deepseek-ai/DeepEP branch hybrid-ep at eb9cee7 (the commit Megatron-LM core_v0.16.0 docker/Dockerfile.ci.dev "
    "installs): deep_ep/hybrid_ep_buffer.py (dispatch_with_permute, combine_with_unpermute), "
    "csrc/hybrid_ep/executor/executor.cu (allgather_routing_map: torch.distributed.all_gather_into_tensor of the "
    "bool routing map unless the experimental custom allgather is enabled, default off; metadata_preprocess_core; "
    "dispatch_preprocess: permute_preprocessing then cudaStreamSynchronize unless non_blocking; dispatch_core; "
    "dispatch_postprocess: permute_launcher; combine_preprocess: unpermute_launcher; combine_core), "
    "csrc/hybrid_ep/backend/hybrid_ep_backend.cuh (S2G warp group: one cp_async_bulk of the token and, in the "
    "forward dispatch, of its fp32 probabilities for every expert of the destination's NVLink domain, per "
    "destination rank that holds one of its experts), docs/README_Hybrid-EP.md (GB200 and B200 bandwidth tables), "
    "docs/Hybrid-EP_Implementation.md")
"""Where :func:`hybridep` and the synthesis' ``dispatch: hybridep`` come from."""

NVLINK5_GPU_BANDWIDTH = 900e9
"""Bytes/s per direction of one Blackwell GPU's NVLink 5 ports (18 links x 50 GB/s), the link under the
HybridEP GB200 table (:data:`HYBRIDEP_GB200_16SM`)."""

HYBRIDEP_GB200: dict[int, tuple[tuple[int, float, float], ...]] = {
    16: ((8, 750.15e9, 684.27e9), (16, 661.93e9, 600.75e9), (24, 637.80e9, 565.53e9), (32, 629.79e9, 547.25e9),
         (36, 612.85e9, 543.27e9)),
    32: ((8, 764.03e9, 737.13e9), (16, 706.95e9, 666.26e9), (24, 665.97e9, 639.80e9), (32, 642.23e9, 605.15e9),
         (36, 632.31e9, 596.99e9))}
"""HybridEP's published kernel-only NVL bandwidth on GB200 by SMs per kernel (16: Megatron-Core's default
``moe_hybridep_num_sms``; 32: what Megatron-Bridge's performance harness sets, scripts/performance/utils/
overrides.py v0.3.0), BF16 dispatch and combine, per NVLink-domain size (ranks): deepseek-ai/DeepEP hybrid-ep
docs/README_Hybrid-EP.md, "GB200 Platform" (4096 tokens per rank, hidden 7168, top-8, 8 local experts, uniform
random routing). The metric is tests/test_hybrid_ep.py's: received BF16 token bytes (a rank's own included) /
kernel time."""
HYBRIDEP_GB200_16SM = HYBRIDEP_GB200[16]


def _hybridep_fraction(parts: int, metric: float, prob_row: int, bandwidth: float = NVLINK5_GPU_BANDWIDTH,
                       hidden: int = 7168) -> float:
    """Fraction of ``bandwidth`` a GPU's writes reach in a HybridEP benchmark row whose metric counts each token
    once per one of ``parts`` equal destinations (NVLink: the domain's ranks; RDMA: the group's nodes), the sender's
    own included, so (parts-1)/parts of it crosses the link, and without the ``prob_row`` fp32 probabilities a
    forward dispatch carries with each token. Defaults: the NVL metric over :data:`NVLINK5_GPU_BANDWIDTH`."""
    return metric * (parts - 1) / parts * (1.0 + 4.0 * prob_row / (2.0 * hidden)) / bandwidth


HYBRIDEP_H100_IB: dict[int, tuple[tuple[int, float, float], ...]] = {
    4: ((16, 44.40e9, 52.00e9), (32, 52.60e9, 51.00e9), (64, 48.00e9, 46.00e9)),
    8: ((16, 76.80e9, 68.00e9), (32, 54.50e9, 56.40e9), (64, 50.55e9, 51.03e9)),
    16: ((16, 71.71e9, 62.95e9), (32, 57.69e9, 57.46e9), (64, 49.97e9, 49.77e9))}
"""HybridEP's published kernel-only IB bandwidth on H100 (bytes/s; the README's GB/s x 1e9) by SMs per kernel,
BF16 dispatch and combine, per rank count (16, 32, 64: 2, 4, 8 nodes of 8): deepseek-ai/DeepEP
docs/README_Hybrid-EP.md at 41cad94, "H100 Platform" (4096 tokens per rank, hidden 7168, top-8, 8 local experts,
uniform random routing). The metric is tests/test_hybrid_ep.py's ``rdma_send_bytes / t``:
``count_rdma_send_from_routing_map`` (every (token, node) pair the token routes to, its own node included, "to
align with DeepEP") x hidden x 2 bytes, over the kernel time."""

H100_NIC_BANDWIDTH = 50e9
"""Bytes/s per direction of one H100's compute NIC on a DGX H100 (ConnectX-7, 400 Gb/s; the ``cx7-ndr400`` of the
dgx-h100 preset), the link under the HybridEP H100 table (:data:`HYBRIDEP_H100_IB`)."""


def _rdma_rows(sms: int, per_node: int = 8) -> tuple[tuple[int, float, float], ...]:
    """(NVLink domains, dispatch fraction, combine fraction) of the H100 IB table of the most SMs not above ``sms``
    (its 16 / 32 / 64 ranks are 2 / 4 / 8 DGX H100 nodes of ``per_node`` GPUs)."""
    key = max([k for k in HYBRIDEP_H100_IB if k <= sms] or [min(HYBRIDEP_H100_IB)])
    # the IB metric counts a token once per node it routes to, own node included (uniform routing hits all alike)
    return tuple((r // per_node, _hybridep_fraction(r // per_node, d, 64, H100_NIC_BANDWIDTH),
                  _hybridep_fraction(r // per_node, c, 0, H100_NIC_BANDWIDTH)) for r, d, c in HYBRIDEP_H100_IB[key])


def _row(rows: tuple[tuple[int, float, float], ...], kind: str, ranks: int) -> float:
    """The dispatch or combine fraction of the row of the largest size not above ``ranks`` (the smallest below)."""
    row = rows[0]
    for r in rows:
        if r[0] <= ranks:
            row = r
    return row[1] if kind == "dispatch" else row[2]


@dataclass(frozen=True)
class HybridEPRates:
    """Fractions of raw link bandwidth (per direction) that HybridEP's kernels reach, from HybridEP's own
    measurements (independent of the training tables scored in validation/e2e)."""

    nvlink: tuple[tuple[int, float, float], ...] = tuple(
        (r, _hybridep_fraction(r, d, 8 * r), _hybridep_fraction(r, c, 0)) for r, d, c in HYBRIDEP_GB200[16])
    """(ranks per NVLink domain, dispatch fraction, combine fraction) of the GB200 16-SM table
    (:data:`HYBRIDEP_GB200`; 8 ranks: 0.74 / 0.67, 36 ranks: 0.72 / 0.59). A domain takes the row of the
    largest size not above its own (the smallest row below 8; 36 beyond)."""
    rdma: tuple[tuple[int, float, float], ...] = _rdma_rows(16)
    """Across NVLink domains (HybridEP sends once per destination domain to the rail peer, which forwards over
    NVLink): (NVLink domains the group spans, dispatch fraction, combine fraction) of the NIC's raw rate, from the
    H100 16-SM IB table (:data:`HYBRIDEP_H100_IB`, whose 16 / 32 / 64 ranks are 2 / 4 / 8 nodes: 2 domains 0.73 /
    0.63, 4: 0.88 / 0.86, 8: 0.89 / 0.87), the only published HybridEP RDMA measurement. A group takes the row of
    the largest domain count not above its own: keyed by domains, not ranks, since a rank's RDMA sends go one per
    remote domain (an EP128 group over two NVL72 racks is the table's two-node case, not its 64-rank one)."""

    def nvlink_fraction(self, kind: str, ranks: int) -> float:
        """The NVLink fraction of a ``kind`` call in an NVLink domain of ``ranks`` ranks of the group
        (:attr:`nvlink`)."""
        return _row(self.nvlink, kind, ranks)

    def rdma_fraction(self, kind: str, domains: int) -> float:
        """The NIC fraction of a ``kind`` call over a group spanning ``domains`` NVLink domains (:attr:`rdma`)."""
        return _row(self.rdma, kind, domains)


HYBRIDEP_RATES = HybridEPRates()


def hybridep_rates(sms: int) -> HybridEPRates:
    """The rates of HybridEP's kernels at ``sms`` SMs: each published table's row of the most SMs not above
    ``sms`` (its fewest below)."""
    key = max([k for k in HYBRIDEP_GB200 if k <= sms] or [min(HYBRIDEP_GB200)])
    return HybridEPRates(nvlink=tuple((r, _hybridep_fraction(r, d, 8 * r), _hybridep_fraction(r, c, 0))
                                      for r, d, c in HYBRIDEP_GB200[key]), rdma=_rdma_rows(sms))


def hybridep_token_bytes(hidden: int, prob_row: int = 0) -> float:
    """Bytes HybridEP moves per token and destination rank: the BF16 token (HybridEP's dispatch in Megatron-Core
    runs BF16: ``fp8_dispatch = False``) plus, when probabilities travel (the forward dispatch and the backward of
    the dispatch, the combine of their gradients), the fp32 row of ``prob_row`` entries (the destination domain's
    experts: ``num_of_experts_per_rank x num_of_ranks_per_node``)."""
    return 2.0 * hidden + 4.0 * prob_row


_DOMAINS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def nvlink_domain_map(topo: Any) -> dict[str, int]:
    """Index of the NVLink domain of each GPU of ``topo`` (GPUs joined by scale-up links, NVSwitch trays of a rack
    included; a GPU with no scale-up link is a domain of its own). O(links)."""
    import networkx as nx

    g = topo.graph
    up = {x for x in g.nodes if topo.kind_of(x) in ("gpu", "nvswitch")}
    view = nx.Graph((a, b) for a, b, d in g.edges(data=True)
                    if a in up and b in up and d.get("kind") in ("nvlink", "xgmi", "nvlink_c2c"))
    view.add_nodes_from(x for x in up if topo.kind_of(x) == "gpu")
    return {x: i for i, cc in enumerate(nx.connected_components(view)) for x in cc}


def nvlink_domains(sim: Simulator, ranks: Sequence[str]) -> list[list[str]]:
    """``ranks`` grouped by NVLink domain (:func:`nvlink_domain_map`), in order of first appearance; HybridEP's
    ``num_of_nodes`` is the number of these groups."""
    comp = _DOMAINS.get(sim)
    if comp is None:
        comp = nvlink_domain_map(sim.topo)
        _DOMAINS[sim] = comp
    out: dict[int, list[str]] = {}
    for r in ranks:
        out.setdefault(comp.get(r, -1 - len(out)), []).append(r)
    return list(out.values())


def hybridep_load(domains: int, per_domain: int, kind: str, *, num_tokens: int, hidden: int, num_topk: int,
                  num_experts: int, prob_row: int = 0) -> DeepEPLoad:
    """Per-GPU bytes of one HybridEP dispatch (or combine: the same bytes reversed) on ``domains`` NVLink domains
    of ``per_domain`` GPUs under uniform routing without domain limit: a token goes once to every rank holding one
    of its experts (inside a domain over NVLink; across domains once per domain to the rail peer, which forwards).
    ``logical``: HybridEP's NVL metric (received token bytes incl. the rank's own, without probabilities)."""
    tr = expected_traffic(domains, per_domain, num_tokens, num_topk, num_experts, domains)
    grid = [[f"{k}:{i}" for i in range(per_domain)] for k in range(domains)]
    node = {r: k for k, loc in enumerate(grid) for r in loc}
    acc = dict.fromkeys(("no", "ni", "co", "ci"), 0.0)
    for a, c, v in _flows(grid, tr, hybridep_token_bytes(hidden, prob_row), "normal"):
        if kind == "combine":
            a, c = c, a
        same = node[a] == node[c]
        acc["no" if same else "co"] += v
        acc["ni" if same else "ci"] += v
    g = domains * per_domain
    logical = float(tr.rank_tokens.sum(axis=1).mean()) * 2.0 * hidden
    return DeepEPLoad(acc["no"] / g, acc["ni"] / g, acc["co"] / g, acc["ci"] / g, logical)


def _link_efficiency(sim: Simulator, sources: set[str], network: bool, fraction: float) -> float:
    """Flow efficiency that runs flows leaving ``sources`` at ``fraction`` of raw bandwidth: the fraction over the
    lowest catalog efficiency of their NVLink (or, ``network``, their NIC's network) links, at most 1."""
    g = sim.fabric.graph
    effs = []
    for a in sources:
        nic = sim.topo.nic_of(a) if network else None
        src = nic if nic is not None and nic in g else a
        kinds = ("infiniband", "ethernet") if network else ("nvlink", "xgmi")
        effs += [float(d.get("efficiency", 1.0)) for _, _, d in g.out_edges(src, data=True) if d.get("kind") in kinds]
    return min(1.0, fraction / min(effs)) if effs else 1.0


def hybridep(sim: Simulator, kind: str, ranks: Sequence[str], *, num_tokens: float, hidden: int, num_topk: int,
             num_experts: int, probs: bool = False, latency: float | None = None, name: str | None = None,
             rates: HybridEPRates = HYBRIDEP_RATES) -> simpy.Event:
    """Start a HybridEP dispatch or combine kernel on ``ranks`` now (:data:`HYBRIDEP_SOURCE`); the event succeeds
    with a :class:`MoeCommResult`.

    ``num_tokens`` per rank of width ``hidden`` (BF16); ``probs``: the fp32 probabilities travel with each token
    (the forward dispatch, and the combine of their gradients in the backward), a row of the destination domain's
    experts (:func:`hybridep_token_bytes`).
    Uniform routing, no domain limit: rank ``s`` sends each destination rank ``d`` of its NVLink domain the
    tokens with an expert on ``d`` (once per rank, however many of its experts are there); across domains once
    per domain to the rail peer, which forwards over NVLink (:func:`_flows`). NVLink flows run at the measured
    fraction of the domain's size (:class:`HybridEPRates`), RDMA ones at the measured H100 fraction of the
    number of domains the group spans (``rates.rdma_fraction``). Flows are kept per
    simulator, as :func:`deepep`'s. Cost: O(ranks^2) on the first call of a shape, O(1) after."""
    from cosim.engine.collectives import CollectiveResult

    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    ranks = list(ranks)
    col = sim.collectives
    doms = nvlink_domains(sim, ranks)
    sizes = {len(x) for x in doms}
    if len(sizes) != 1:
        raise ValueError("HybridEP needs the same number of ranks in every NVLink domain")
    lat = _p2p_latency(col, latency)
    env = sim.env
    label = name or f"hybridep_{kind}"
    key = ("hybridep", tuple(tuple(x) for x in doms), num_tokens, hidden, probs, num_topk, num_experts, kind, rates)
    cache = _FLOW_CACHE.setdefault(sim, {})
    hit = cache.get(key)
    per = sizes.pop()
    tb = hybridep_token_bytes(hidden, num_experts // len(ranks) * per if probs else 0)
    if hit is None:
        tr = expected_traffic(len(doms), per, round(num_tokens), num_topk, num_experts, len(doms))
        tr = MoeTraffic(tr.rank_tokens * (num_tokens / max(round(num_tokens), 1)),
                        tr.node_tokens * (num_tokens / max(round(num_tokens), 1)), tr.selections)
        flows = _flows(doms, tr, tb, "normal")
        if kind == "combine":
            flows = [(c, a, v) for a, c, v in flows]
        dom = {r: k for k, loc in enumerate(doms) for r in loc}
        intra = [f for f in flows if dom[f[0]] == dom[f[1]]]
        inter = [f for f in flows if dom[f[0]] != dom[f[1]]]
        parts = []
        if intra:
            parts.append((intra, _link_efficiency(sim, {a for a, _, _ in intra}, False,
                                                  rates.nvlink_fraction(kind, per))))
        if inter:
            parts.append((inter, _link_efficiency(sim, {a for a, _, _ in inter}, True,
                                                  rates.rdma_fraction(kind, len(doms)))))
        hit = (tr, float(sum(v for _, _, v in flows)), parts)
        cache[key] = hit
    tr, total, parts = hit
    res = CollectiveResult(f"hybridep_{kind}", total, ranks, "hybridep", "", env.now, env.now, lat)
    nvl = float(tr.rank_tokens.sum(axis=1).mean()) * tb
    rdma = float(tr.node_tokens.sum(axis=1).mean()) * tb if len(doms) > 1 else 0.0
    return _launch(col, res, [(p, e, float("inf")) for p, e in parts], label,
                   MoeCommResult(kind, "hybridep", ranks, 0.0, 0.0, nvl, rdma))
