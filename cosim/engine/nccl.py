"""NCCL-like cost parameters and tuner: latency per algorithm/protocol, protocol
efficiencies, and size-based choice of algorithm and protocol.

The structure follows NCCL's ``ncclTopoTuneModel`` (src/graph/tuning.cc):

* latency = ``baseLat[algo][proto]`` + per-step hardware latency ``hwLat[hw][algo][proto]``
  times the number of steps (ring: ``nsteps`` intra + ``nInterSteps`` on the
  network; tree: ``2 * ((ppn-1) * intra + log2(nNodes) * inter)``; NVLS: one
  switch latency);
* bandwidth: a protocol's payload fraction (LL 1/2: 8 data bytes per 16-byte
  line; LL128 ~0.92: 120 of 128 bytes; Simple 1) times the fraction of link
  bandwidth the communication kernels reach ("bus efficiency"), with NCCL's caps
  (LL bus bandwidth cap, LL128 per-channel cap).

* NVLS / NVLS-tree pipelining (fitted model only): NCCL's NVLS chunk by size
  (src/enqueue.cc), the pipeline's fill and drain (``stages - 1`` steps of
  ``min(S, concurrentOps x chunk)``) and a per-channel chunk-step limit
  (:meth:`NcclParams.nvls_chunk`, :meth:`NcclParams.pipeline_fill`,
  :meth:`NcclParams.nvls_step_cap`).

Unlike NCCL's closed-form model, cosim takes the *bandwidth* from flows on the
fabric (so contention is real); only the latency terms are fixed delays. The
tuner estimates each (algo, proto) on the idle fabric and picks the fastest,
as NCCL's tuner does with its own tables.

Numbers live in a YAML parameter file (default: ``data/nccl_h100.yaml``):
NCCL's published constants as ``defaults``, and ``fitted``: a few *global*
parameters fitted on measured data (base latency per protocol, NVLS and p2p
latency, efficiency per protocol, NVLS efficiency, a factor on the per-step
hwLat, the shortest NVLS chunk step) that apply to every communicator (see validation/collectives/ and
docs/ENGINE.md). With ``defaults.tuner: nccl`` the choice of (algo, proto)
uses the defaults, as the library decides with its own constants; the fitted
parameters then time the chosen pair.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import yaml

from cosim import units

__all__ = ["BUSBW_FACTOR", "DEFAULT_PARAMS", "OPS", "PROTOCOLS", "Fitted", "NcclParams", "Shape", "load_params"]

PROTOCOLS = ("ll", "ll128", "simple")
OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "all_to_allv", "send_recv")
DEFAULT_PARAMS = Path(__file__).resolve().parent / "data" / "nccl_h100.yaml"


def BUSBW_FACTOR(op: str, n: int) -> float:
    """nccl-tests bus-bandwidth factor: busbw = algbw * factor (PERFORMANCE.md); 0 for one rank of
    an all-reduce / all-gather / reduce-scatter / all-to-all, whose data never leaves the GPU."""
    if n < 1:
        raise ValueError(f"a collective needs at least one rank, got {n}")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all", "all_to_allv"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class Shape:
    """What the cost model needs to know about one collective call."""

    op: str
    nranks: int
    nnodes: int
    ppn: int
    """Most ranks on one node."""
    intra: str
    """Worst link class inside nodes along the algorithm's edges: nvswitch, nvlink, pci (or none)."""
    machine: str | None = None
    """Topology name, for machine-specific calibrations."""
    nvls: bool = False
    """NVLink SHARP available inside the node(s) (NVSwitch + Hopper or newer, every node alike)."""
    accel: str | None = None
    """Accelerator catalog name of the first rank, for accelerator-specific calibrations."""


@dataclass
class Fitted:
    """Global parameters fitted on measured NCCL times (validation/collectives).

    They replace NCCL's base latencies and the protocol efficiencies for every
    communicator and scale the per-step hardware latencies (``hw_latency``); the
    protocol caps and (with ``tuner: nccl``) the tuner's choice stay NCCL's. Efficiencies are fractions (<= 1) of the
    fabric's effective link capacity (catalog bandwidth x link efficiency).
    """

    base_latency: dict[str, float]
    """Ring/tree launch latency per protocol (s), replacing ``baseLat``."""
    nvls_latency: float
    """NVLS latency (s), replacing ``baseLat[nvls] + hwLat[nvls]``."""
    p2p_latency: float
    """Send/recv (and all-to-all) launch latency (s), before the per-hop latency."""
    efficiency: dict[str, float]
    """Payload fraction of link capacity per protocol (ll, ll128, simple)."""
    nvls_efficiency: float
    """Extra factor on NVLS and NVLS-tree (times the Simple efficiency)."""
    fit: dict[str, Any] = field(default_factory=dict)
    """Provenance: data, split, date, errors."""
    hw_latency_scale: float = 1.0
    """Factor on NCCL's per-step hardware latencies (ring/tree/p2p hwLat; not NVLS)."""
    nvls_step: float = 0.0
    """Shortest time of one NVLS chunk step on a channel (s): a GPU's NVLS channel moves one chunk
    (NCCL's NVLS chunk, by size) per step, so NVLS runs at most ``channels x chunk / nvls_step`` per GPU
    each way (0: no such limit). See :meth:`NcclParams.nvls_step_cap`."""

    NAMES = ("base_ll", "base_ll128", "base_simple", "nvls_latency", "p2p_latency",
             "eff_ll", "eff_ll128", "eff_simple", "nvls_efficiency", "hw_latency_scale", "nvls_step")

    def vector(self) -> list[float]:
        """Parameters in :attr:`NAMES` order (latencies in s)."""
        b, e = self.base_latency, self.efficiency
        return [b["ll"], b["ll128"], b["simple"], self.nvls_latency, self.p2p_latency,
                e["ll"], e["ll128"], e["simple"], self.nvls_efficiency, self.hw_latency_scale, self.nvls_step]

    @classmethod
    def from_vector(cls, x: Any, fit: dict[str, Any] | None = None) -> Fitted:
        x = [float(v) for v in x]
        return cls({"ll": x[0], "ll128": x[1], "simple": x[2]}, x[3], x[4],
                   {"ll": x[5], "ll128": x[6], "simple": x[7]}, x[8], dict(fit or {}),
                   x[9] if len(x) > 9 else 1.0, x[10] if len(x) > 10 else 0.0)

    def to_yaml(self) -> dict[str, Any]:
        return {
            "base_latency": {k: units.fmt_time(v, 6) for k, v in self.base_latency.items()},
            "nvls_latency": units.fmt_time(self.nvls_latency, 6),
            "p2p_latency": units.fmt_time(self.p2p_latency, 6),
            "efficiency": {k: round(v, 6) for k, v in self.efficiency.items()},
            "nvls_efficiency": round(self.nvls_efficiency, 6),
            "hw_latency_scale": round(self.hw_latency_scale, 6),
            "nvls_step": units.fmt_time(self.nvls_step, 6),
            "fit": self.fit,
        }


def _time_table(d: dict[str, Any], where: str) -> dict[str, dict[str, float]]:
    return {a: {p: units.parse_time(v, f"{where}.{a}.{p}") for p, v in row.items()} for a, row in d.items()}


@dataclass
class NcclParams:
    """NCCL cost constants plus the globally fitted parameters (SI units)."""

    source: str
    channels: int
    base_latency: dict[str, dict[str, float]]
    """``[algo][proto]`` seconds (NCCL's ``baseLat``)."""
    hw_latency: dict[str, dict[str, dict[str, float]]]
    """``[hw class: nvlink|pci|net][algo][proto]`` seconds per step (NCCL's ``hwLat``)."""
    protocol_efficiency: dict[str, float]
    bus_efficiency: dict[str, float]
    """Fraction of link capacity the comm kernels reach, per hw class (defaults only)."""
    ll_max_busbw: float
    """LL's bus bandwidth cap on one node (NCCL's ``llMaxBws[arch][0]``; Hopper 141 GB/s)."""
    ll128_max_busbw_per_channel: float
    channel_max_busbw: dict[str, float]
    """Most a channel carries (bytes/s, per direction), ``intra`` inside a node and ``inter`` between nodes:
    NCCL's topology search never plans a channel faster than the first entry of its speed arrays (Hopper:
    60 / 48 GB/s), so a communicator of ``c`` channels moves at most ``c`` times that per rank."""
    nvls_efficiency: float
    """NCCL's ``nvlsEfficiency`` for the GPU generation (Hopper 0.85, Blackwell 0.74), a factor on NVLS's
    bandwidth; NCCL's tuner also takes ``(nvls_channels - 1) / nvls_channels`` of it (tuning.cc), and so does
    :meth:`nvls_factor`."""
    nvls_channels: int = 16
    """NVLS channels (NCCL_NVLS_NCHANNELS; Hopper 16, src/transport/nvls.cc)."""
    nvls_chunk_size: float = 131072.0
    """NCCL_NVLS_CHUNKSIZE (bytes; 128 KiB): the largest NVLS / NVLS-tree chunk (src/transport/nvls.cc)."""
    p2p_ll_threshold: float = 16384.0
    """Send/recv use LL up to this many bytes per peer, else Simple (NCCL_P2P_LL_THRESHOLD)."""
    tuner: str = "nccl"
    """Which estimate picks (algo, proto): ``nccl`` = NCCL's own constants (``defaults``, as the
    real library decides), ``fitted`` = the fitted parameters (the simulator's best estimate)."""
    fitted: Fitted | None = None
    path: str | None = None
    ll_max_busbw_nodes: tuple[float, float] | None = None
    """LL's bus bandwidth cap on 2 nodes and on more than 2 (NCCL's ``llMaxBws[arch][1:]``, index
    ``min(nNodes - 1, 2)``; Hopper 45 / 35 GB/s); None: ``ll_max_busbw`` on any number of nodes."""
    nvls_enable: bool = True
    """NCCL_NVLS_ENABLE: False removes NVLS and NVLS-tree from the candidates (a machine or a
    library build without NVLink SHARP, e.g. a VM without multicast support)."""
    net_channel_bw: float = math.inf
    """Most one NCCL channel moves over the network (bytes/s of its protocol on the wire, each way; x the
    protocol's efficiency of payload): a channel is one CTA feeding one proxy connection in chunks
    (src/transport/net.cc), whatever the port's rate. A flow that crosses nodes
    runs at most :meth:`net_channels` x this (inf: no such limit). See :meth:`net_flow_cap`."""
    p2p_net_channels: int = 2
    """Channels of one point-to-point peer pair across nodes (NCCL_NCHANNELS_PER_NET_PEER; default 2 in
    NCCL 2.18-2.28, src/graph/paths.cc; NCCL 2.29 uses max(nNICs, ceil(NIC bw / 14 GB/s)))."""
    max_channels: int = 32
    """MAXCHANNELS (NCCL's largest channel count of a communicator)."""
    p2p_nvlink_bw: dict[str, float] = field(default_factory=dict)
    """NCCL's bandwidth of one NVLink per generation (bytes/s each way; keys: the link types of
    cosim/catalog/data/links.yaml, ``nvlink2`` ... ``nvlink5``): the SMxx_NVLINK_BW constants of
    src/graph/topo.h (ncclTopoNVLinkBw: 20.0 / 20.0 / 20.6 / 40.1 GB/s for SM70 / SM80 / SM90 / SM100), with
    which NCCL rates a GPU's NVLink path (links x this) and gives a NVLink peer its p2p channels
    (ncclTopoGetNchannels). Its point-to-point traffic (send/recv, all-to-all: SM-driven copies, one CTA per
    channel) moves at most links x this through a GPU's NVLink port (:meth:`p2p_nvlink_factor`); empty: no
    such limit."""

    # ------------------------------------------------------------ latency
    def latency(self, shape: Shape, algo: str, proto: str, use_fit: bool = True) -> float:
        """NCCL-model latency of one collective (s): base + steps x per-step hw latency."""
        fit = self.fitted if use_fit else None
        intra_hw = "pci" if shape.intra == "pci" else "nvlink"
        n, nn = shape.nranks, shape.nnodes
        op = shape.op
        hw = self.hw_latency
        if fit and fit.hw_latency_scale != 1.0 and algo != "nvls":
            k = fit.hw_latency_scale
            hw = {c: {a: {p: v * k for p, v in row.items()} for a, row in t.items()} for c, t in hw.items()}
        if algo == "p2p":
            hwc = "net" if nn > 1 else intra_hw
            base = fit.p2p_latency if fit else self.base_latency["p2p"][proto]
            return base + hw[hwc]["p2p"][proto]
        if algo == "hier":
            # intra reduce-scatter + inter all-reduce + intra all-gather
            ppn = max(shape.ppn, 1)
            base = fit.base_latency[proto] if fit else self.base_latency["ring"][proto]
            return base + 2 * (ppn - 1) * hw[intra_hw]["ring"][proto] + 2 * (nn - 1) * hw["net"]["ring"][proto]
        nv = algo in ("nvls", "nvls_tree")
        base = fit.base_latency[proto] if fit and not nv else self.base_latency[algo][proto]
        intra_lat = hw[intra_hw if not nv else "nvlink"][algo][proto]
        inter_lat = hw["net"][algo][proto]
        if nn > 1 and proto == "ll":
            intra_lat *= 1.8
        if algo == "ring":
            if op == "all_reduce":
                nsteps, ninter = 2 * (n - 1), 2 * (nn - 1)
            else:  # all_gather / reduce_scatter / broadcast / reduce
                nsteps, ninter = n - 1, nn - 1
            return base + (nsteps - ninter) * intra_lat + ninter * (inter_lat if nn > 1 else intra_lat)
        if algo == "tree":
            ppn = max(shape.ppn, 1)
            return base + 2 * ((ppn - 1) * intra_lat + math.log2(nn) * inter_lat) if nn > 1 else \
                base + 2 * (ppn - 1) * intra_lat
        if algo == "nvls":
            if fit:
                return fit.nvls_latency + (inter_lat if nn > 1 else 0.0)
            return base + intra_lat + (inter_lat if nn > 1 else 0.0)
        if algo == "nvls_tree":
            # NVLS inside each node, a tree of nodes over the network (NCCL: intra + 2 log2(nNodes) inter)
            intra = fit.nvls_latency if fit else base + intra_lat
            return intra + 2 * math.log2(max(nn, 1)) * inter_lat
        raise ValueError(f"unknown algorithm {algo!r}")

    def nvls_factor(self) -> float:
        """NCCL's NVLS bandwidth factor: ``nvlsEfficiency x (nChannels - 1) / nChannels`` (tuning.cc)."""
        return self.nvls_efficiency * (self.nvls_channels - 1) / self.nvls_channels

    def efficiency(self, shape: Shape, algo: str, proto: str, use_fit: bool = True) -> float:
        """Payload fraction of the fabric's link capacity."""
        fit = self.fitted if use_fit else None
        nv = (fit.nvls_efficiency if fit else self.nvls_factor()) if algo in ("nvls", "nvls_tree") else 1.0
        if fit:
            e = fit.efficiency[proto] * nv
        else:
            cls = "net" if shape.nnodes > 1 else ("pci" if shape.intra == "pci" else "nvlink")
            e = self.protocol_efficiency[proto] * self.bus_efficiency[cls] * nv
        return min(e, 1.0)

    def nvls_chunk(self, shape: Shape, algo: str, nbytes: float) -> float:
        """NCCL's NVLS / NVLS-tree chunk for a call of ``nbytes`` (bytes; src/enqueue.cc, calcCollChunking).

        ``concurrentOps = nvls_channels x nHeads`` (nHeads: the node's GPUs for NVLS, its rails for
        NVLS-tree; one NIC per GPU, so ``ppn``). NVLS: the chunk (NCCL_NVLS_CHUNKSIZE, 128 KiB) halves to
        64 / 32 / 16 KiB below 64 / 8 / 2 x concurrentOps x chunk. NVLS-tree: at most the tree's largest
        chunk (64 KiB from 4 nodes, else NCCL_NVLS_CHUNKSIZE), then 64 KiB below 4 x concurrentOps x
        chunk and 32 KiB below 1 x concurrentOps x chunk."""
        ops = self.nvls_channels * max(shape.ppn, 1)
        c = self.nvls_chunk_size
        if algo == "nvls_tree":
            c = min(c, 65536.0 if shape.nnodes >= 4 else c)
            for k, lo in ((32, 262144.0), (16, 131072.0), (4, 65536.0), (1, 32768.0)):
                if nbytes < k * ops * c and c > lo:
                    c = lo
            return c
        c = min(c, 524288.0)  # the Simple step (4 MiB buffer / 8 steps)
        for k, lo in ((64, 65536.0), (8, 32768.0), (2, 16384.0)):
            if nbytes < k * ops * c and c > lo:
                c = lo
        return c

    def nvls_step_cap(self, shape: Shape, algo: str, nbytes: float | None, use_fit: bool = True) -> float:
        """Per-GPU NVLS rate limit by chunk steps (bytes/s each way): each of the ``nvls_channels`` channels
        moves one chunk per step and a step takes at least the fitted ``nvls_step``, so a GPU moves at most
        ``nvls_channels x chunk / nvls_step``. Small calls run small chunks (:meth:`nvls_chunk`), hence a
        lower rate; inf without a size, without the fit (NCCL's tuner does not model it) or with
        ``nvls_step`` 0."""
        fit = self.fitted if use_fit else None
        if nbytes is None or fit is None or fit.nvls_step <= 0 or algo not in ("nvls", "nvls_tree"):
            return math.inf
        return self.nvls_channels * self.nvls_chunk(shape, algo, nbytes) / fit.nvls_step

    def nvls_stages(self, shape: Shape, algo: str) -> int:
        """Pipeline stages a chunk passes through: NVLS in one node 3 (scatter into the heads' buffers,
        multimem reduce + multicast, gather out; src/device/all_reduce.h), NVLS-tree ``2 + 2 log2(nNodes)``
        (NVLS reduce, up the tree of nodes, down it, NVLS multicast)."""
        if algo == "nvls":
            return 3
        return 2 + 2 * math.ceil(math.log2(max(shape.nnodes, 1)))

    def pipeline_fill(self, shape: Shape, algo: str, nbytes: float | None, use_fit: bool = True) -> float:
        """Bytes of size that the pipeline's fill and drain cost (NVLS and NVLS-tree, fitted model): the
        call moves ``min(S, concurrentOps x chunk)`` per step (``nvls_channels x nHeads`` pipes, one chunk
        each; a call smaller than one step fills it partly) and its last chunk leaves ``stages - 1`` steps
        after its first enters, so it takes ``nsteps + stages - 1`` steps: the time of
        ``S + (stages - 1) x min(S, concurrentOps x chunk)`` bytes at the collective's rate. 0 for other
        algorithms, without a size, or for NCCL's own tuner (its model has no such term)."""
        if nbytes is None or not use_fit or self.fitted is None or algo not in ("nvls", "nvls_tree"):
            return 0.0
        ops = self.nvls_channels * max(shape.ppn, 1)
        return (self.nvls_stages(shape, algo) - 1) * min(nbytes, ops * self.nvls_chunk(shape, algo, nbytes))

    def rate_cap(self, shape: Shape, algo: str, proto: str, channels: int, nbytes: float | None = None,
                 use_fit: bool = True) -> float:
        """Cap on each rank's payload send rate (bytes/s): NCCL's protocol limits and, for collectives,
        ``channels`` x the most a channel carries (point-to-point transfers pick their own channels); NVLS
        with a size: also the chunk-step limit (:meth:`nvls_step_cap`)."""
        chan = math.inf if algo == "p2p" else channels * self.channel_max_busbw["inter" if shape.nnodes > 1
                                                                                 else "intra"]
        if proto == "ll":
            return min(self.ll_max(shape.nnodes), chan)
        if proto == "ll128":
            return min(self.ll128_max_busbw_per_channel * channels, chan)
        return min(chan, self.nvls_step_cap(shape, algo, nbytes, use_fit))

    def ll_max(self, nnodes: int) -> float:
        """LL's bus bandwidth cap for a communicator over ``nnodes`` nodes (NCCL's ``llMaxBws``)."""
        if nnodes <= 1 or self.ll_max_busbw_nodes is None:
            return self.ll_max_busbw
        return self.ll_max_busbw_nodes[0 if nnodes == 2 else 1]

    def cost(self, shape: Shape, algo: str, proto: str, channels: int | None = None,
             use_fit: bool = True, nbytes: float | None = None) -> tuple[float, float, float]:
        """(latency s, efficiency, per-rank payload rate cap bytes/s) for a call (of ``nbytes``: the
        size-dependent NVLS chunk limit)."""
        ch = channels or self.channels
        return self.latency(shape, algo, proto, use_fit), self.efficiency(shape, algo, proto, use_fit), \
            self.rate_cap(shape, algo, proto, ch, nbytes, use_fit)

    def kernel_channels(self, op: str, nbytes: float, channels: int | None = None, cross_node: bool = False,
                        nranks: int | None = None) -> int:
        """Channels, hence thread blocks (one CTA per channel, each resident on its own SM), of the kernel NCCL
        launches for one call of ``op`` moving ``nbytes`` (the call's whole buffer), on a communicator of
        ``channels`` channels (None: :attr:`channels`). NCCL 2.18-2.28 (src/enqueue.cc, src/graph/paths.cc):

        * collectives (ring / tree): ``nc = nChannels``, less one while ``nBytes < nc x nt x threadThreshold``
          (enqueue.cc ``topoGetAlgoInfo``, "Ring/Tree channel tuning"; Simple: ``nt`` 512 threads
          (NCCL_SIMPLE_MAX_NTHREADS), ``threadThreshold`` 64 (NCCL_SIMPLE_THREAD_THRESHOLD): 32 KiB per
          channel); NVLS runs ``nvlsChannels`` (16 on Hopper) whatever the size;
        * point-to-point (``send`` / ``recv`` / ``send_recv`` / ``all_to_all``): the p2p channels
          ``p2pnChannels = pow2Up(min(nChannels, MAXCHANNELS))`` (paths.cc ``ncclTopoComputeP2pChannels``); one
          peer across nodes runs on :attr:`p2p_net_channels` (NCCL_NCHANNELS_PER_NET_PEER), one on NVLink on
          ``2 x NVLinks`` capped at ``p2pnChannels`` (``ncclTopoGetNchannels``); a send/recv starts on
          ``nChannelsMin`` = the per-peer count halved while ``nChannelsMin x nranks > p2pnChannels`` (``nranks``:
          the communicator's ranks), at most one per ``minPartSize``, doubled (up to the per-peer count) while a part
          exceeds ``maxPartSize`` (enqueue.cc ``addP2pToPlan``: P2P chunk / 8 and x 32 on one node, / 2 and x 1
          across nodes, with the 512 KiB NVLink and 128 KiB network chunks); an all-to-all over many peers keeps all
          ``p2pnChannels`` busy (one per 64 KiB at most).
        """
        c = max(int(channels or self.channels), 1)
        p2p = 1 << (min(c, self.max_channels) - 1).bit_length()  # p2pnChannels
        if op in ("all_to_all", "all_to_allv"):
            return int(max(1, min(p2p, math.ceil(max(float(nbytes), 1.0) / 65536.0))))
        if op in ("send", "recv", "send_recv"):
            per_peer = min(self.p2p_net_channels, p2p) if cross_node else p2p
            n_min = per_peer
            while nranks and n_min * nranks > p2p and n_min > 1:
                n_min //= 2
            chunk = 131072.0 if cross_node else 524288.0
            min_part, max_part = (chunk / 2, chunk) if cross_node else (chunk / 8, chunk * 32)
            b = max(float(nbytes), 1.0)
            n = max(1, min(n_min, math.ceil(b / min_part)))
            while b / n > max_part and n <= per_peer // 2:
                n *= 2
            return int(n)
        if op == "nvls":
            return int(self.nvls_channels)
        per_channel = 512 * 64  # nt x threadThreshold of the Simple protocol
        return int(max(1, min(c, math.floor(max(float(nbytes), 0.0) / per_channel))))

    def net_channels(self, algo: str, nranks: int, nic_bw: float, nics: int = 8) -> int:
        """NCCL channels one flow crossing nodes runs on (one peer pair for ``p2p``, one ring / tree edge
        on one NIC of ``nic_bw`` bytes/s line rate otherwise; ``nics``: the NICs (rails) of a node).

        * ``p2p``: :attr:`p2p_net_channels` per peer, halved while ``channels x nranks > 4 x
          p2pnChannels`` (NCCL 2.20-2.28, src/graph/paths.cc ncclTopoGetNchannels: "avoid overloading
          channels with 8+ operations"); ``p2pnChannels`` = :attr:`channels` rounded up to a power of two.
        * collectives: NCCL's topology search plans ``k = floor(NIC bw / speed)`` channels per NIC at the
          first speed of its inter-node array (:attr:`channel_max_busbw` ``inter``, Hopper 48 GB/s;
          src/graph/search.cc), duplicates them unless the speed is below 50 GB/s and there are more than
          4 (ncclTopoDupChannels), and ncclTopoPostset doubles them again (src/graph/connect.cc,
          "Duplication should be complete now"), at most :attr:`max_channels`: 8 x NDR (50 GB/s) 16
          channels, 2 per NIC; 8 x XDR (100 GB/s) 32, 4 per NIC."""
        if algo == "p2p":
            ch = max(1, self.p2p_net_channels)
            total = 1 << max(0, math.ceil(math.log2(max(self.channels, 1))))
            while ch * nranks > total * 4 and ch > 1:
                ch //= 2
            return ch
        speed = self.channel_max_busbw["inter"]
        if not math.isfinite(speed) or not math.isfinite(nic_bw):
            return self.max_channels
        nics = max(1, nics)
        k = max(1, int(nic_bw // speed + 1e-9)) * nics
        if not (speed < 50e9 and k > 4):
            k *= 2
        k = min(2 * k, self.max_channels)
        return max(1, k // nics)

    def net_flow_cap(self, algo: str, nranks: int, nic_bw: float, nics: int = 8) -> float:
        """Most one flow crossing nodes carries (bytes/s): :meth:`net_channels` x :attr:`net_channel_bw`;
        inf for what is not one of NCCL's algorithms (DeepEP's kernels write RDMA from many SMs) or
        without a per-channel limit."""
        if algo not in ("p2p", "ring", "tree", "nvls_tree", "hier") or not math.isfinite(self.net_channel_bw):
            return math.inf
        return self.net_channels(algo, nranks, nic_bw, nics) * self.net_channel_bw

    def p2p_nvlink_factor(self, link: str, count: int, capacity: float, scale: float = 1.0) -> float:
        """Efficiency factor of NCCL point-to-point flows through a GPU's NVLink port of ``count`` links of
        type ``link`` whose usable capacity on the fabric is ``capacity`` bytes/s (links x line rate x the
        link's efficiency): ``min(1, count x p2p_nvlink_bw[link] / capacity)``, 1 for a link type NCCL has
        no constant for. Like :meth:`net_flow_cap`, a rate of the protocol's wire bytes: the flows'
        efficiency becomes the protocol's x this factor. NVLink 4 (H100): 18 x 20.6 = 371 GB/s, above the
        port's 0.77 x 450 (NCCL's own send/recv), factor 1; NVLink 5 (B200 / GB200): 18 x 40.1 = 722 GB/s
        of the port's 0.856 x 900 = 770 (a copy-engine copy), factor 0.937. ``scale``: the links' line rate over
        the catalog's for that type (a what-if that doubles NVLink doubles NCCL's per-link rate too)."""
        bw = self.p2p_nvlink_bw.get(link)
        if bw is None or count <= 0 or not capacity > 0 or not math.isfinite(capacity):
            return 1.0
        return min(1.0, count * bw * scale / capacity)

    def with_fitted(self, fitted: Fitted | None) -> NcclParams:
        """A copy with other fitted parameters (cross-validation folds)."""
        import dataclasses

        return dataclasses.replace(self, fitted=fitted)


def _parse(doc: dict[str, Any], path: str | None) -> NcclParams:
    d = doc["defaults"]
    hw = {c: _time_table(t, f"defaults.hw_latency.{c}") for c, t in d["hw_latency"].items()}
    fitted = None
    f = doc.get("fitted")
    if f:
        fitted = Fitted(
            base_latency={p: units.parse_time(v, f"fitted.base_latency.{p}") for p, v in f["base_latency"].items()},
            nvls_latency=units.parse_time(f["nvls_latency"], "fitted.nvls_latency"),
            p2p_latency=units.parse_time(f["p2p_latency"], "fitted.p2p_latency"),
            efficiency={p: float(v) for p, v in f["efficiency"].items()},
            nvls_efficiency=float(f["nvls_efficiency"]),
            fit=dict(f.get("fit") or {}),
            hw_latency_scale=float(f.get("hw_latency_scale", 1.0)),
            nvls_step=units.parse_time(f.get("nvls_step", "0 us"), "fitted.nvls_step"),
        )
    return NcclParams(
        source=str(doc.get("source", "")),
        channels=int(d["channels"]),
        base_latency=_time_table(d["base_latency"], "defaults.base_latency"),
        hw_latency=hw,
        protocol_efficiency={p: float(v) for p, v in d["protocol_efficiency"].items()},
        bus_efficiency={p: float(v) for p, v in d["bus_efficiency"].items()},
        ll_max_busbw=units.parse_bandwidth(d["ll_max_busbw"], "ll_max_busbw"),
        ll_max_busbw_nodes=None if d.get("ll_max_busbw_nodes") is None else cast(
            tuple[float, float], tuple(units.parse_bandwidth(v, f"defaults.ll_max_busbw_nodes.{k}")
                                       for k, v in zip(("2", "4"), d["ll_max_busbw_nodes"], strict=True))),
        ll128_max_busbw_per_channel=units.parse_bandwidth(d["ll128_max_busbw_per_channel"],
                                                          "ll128_max_busbw_per_channel"),
        channel_max_busbw={"intra": math.inf, "inter": math.inf,
                           **{k: units.parse_bandwidth(v, f"defaults.channel_max_busbw.{k}")
                              for k, v in (d.get("channel_max_busbw") or {}).items()}},
        nvls_efficiency=float(d["nvls_efficiency"]),
        nvls_channels=int(d.get("nvls_channels", 16)),
        nvls_chunk_size=units.parse_size(d.get("nvls_chunk_size", "128KiB"), "defaults.nvls_chunk_size"),
        p2p_ll_threshold=units.parse_size(d.get("p2p_ll_threshold", "16KiB"), "p2p_ll_threshold"),
        tuner=str(d.get("tuner", "nccl")),
        fitted=fitted,
        nvls_enable=bool(d.get("nvls_enable", True)),
        net_channel_bw=(units.parse_bandwidth(d["net_channel_bw"], "defaults.net_channel_bw")
                        if d.get("net_channel_bw") is not None else math.inf),
        p2p_net_channels=int(d.get("p2p_net_channels", 2)),
        max_channels=int(d.get("max_channels", 32)),
        p2p_nvlink_bw={str(k): units.parse_bandwidth(v, f"defaults.p2p_nvlink_bw.{k}")
                       for k, v in (d.get("p2p_nvlink_bw") or {}).items()},
        path=path,
    )


_CACHE: dict[str, NcclParams] = {}


def load_params(path: str | Path | None = None) -> NcclParams:
    """Load (and cache) a NCCL parameter file; default: the bundled H100 file."""
    p = str(Path(path) if path is not None else DEFAULT_PARAMS)
    if p not in _CACHE:
        with open(p, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
        _CACHE[p] = _parse(doc, p)
    return _CACHE[p]


def clear_cache() -> None:
    """Forget loaded parameter files (after a refit rewrote one)."""
    _CACHE.clear()
