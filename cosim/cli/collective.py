"""``cosim collective``: a simulated nccl-tests.

Runs one collective per size on an otherwise idle topology and prints time,
algorithm bandwidth (size / time) and bus bandwidth (algbw times the
nccl-tests factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all
(n-1)/n; broadcast, reduce, send/recv 1). ``--op deepep_dispatch|deepep_combine``
runs a DeepEP MoE dispatch/combine (cosim.engine.moe_comm) once per --tokens value and
prints time and DeepEP's logical NVL / RDMA bandwidths.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cosim import units
from cosim.cli import add_json_flag, emit_json
from cosim.errors import CosimInputError

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "send_recv",
       "deepep_dispatch", "deepep_combine")
DEEPEP = ("deepep_dispatch", "deepep_combine")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "collective",
        help="simulate a collective over sizes (like nccl-tests)",
        description="Simulate one collective per size on a topology and print time, algbw and busbw "
        "(nccl-tests definitions).",
    )
    p.add_argument("--topology", "-t", required=True, help="preset name or topology YAML file")
    p.add_argument("--op", default="all_reduce", type=lambda s: s.replace("-", "_"),
                   help=f"collective: {', '.join(OPS)} (default all_reduce)")
    p.add_argument("--ranks", "-n", type=int, default=None, help="number of ranks (default: every GPU)")
    p.add_argument("--ranks-per-node", type=int, default=None,
                   help="ranks on each node (default: fill nodes in GPU order)")
    p.add_argument("--sizes", "-s", default="1KiB:1GiB",
                   help='sizes: list "1MiB,64MiB" or doubling range "1KiB:16GiB" (default 1KiB:1GiB)')
    p.add_argument("--algo", default="auto", choices=("auto", "ring", "tree", "nvls", "nvls_tree", "hier"))
    p.add_argument("--proto", default="auto", choices=("auto", "ll", "ll128", "simple"))
    p.add_argument("--channels", type=int, default=None, help="NCCL channels (default from parameters): each carries at most NCCL's fastest planned channel "
                        "speed (Hopper 60 GB/s in a node), so few channels cap the bandwidth")
    p.add_argument("--comm-sms", type=int, default=None,
                   help="SMs the communication kernel may use: NCCL runs one thread block (one SM) per channel, "
                        "so N SMs run at most N channels, each carrying at most NCCL's fastest planned channel "
                        "(default: the parameters' channel count)")
    p.add_argument("--no-calibration", action="store_true", help="use NCCL's default constants only")
    g = p.add_argument_group("DeepEP (--op deepep_dispatch / deepep_combine)")
    g.add_argument("--tokens", default="4096", help="tokens per rank, comma list (default 4096)")
    g.add_argument("--hidden", type=int, default=7168, help="hidden size (default 7168)")
    g.add_argument("--topk", type=int, default=8, help="experts per token (default 8)")
    g.add_argument("--experts", type=int, default=256, help="routed experts in all (default 256)")
    g.add_argument("--topk-groups", type=int, default=None, help="node groups a token may use (default min(nodes, 4))")
    g.add_argument("--mode", default="normal", choices=("normal", "low_latency"), help="DeepEP kernels (default normal)")
    add_json_flag(p)
    p.set_defaults(func=handler)


def _load(name: str) -> Any:
    try:
        from cosim.topology import load_topology  # type: ignore[attr-defined]
    except ImportError:
        raise CosimInputError("the topology loader (cosim.topology) is not available") from None
    return load_topology(name)


def pick_ranks(topo: Any, n: int | None, per_node: int | None) -> list[str]:
    """Ranks in topology GPU order; ``per_node`` takes that many GPUs from each node."""
    gpus = list(topo.gpus)
    if per_node is not None:
        if per_node < 1:
            raise CosimInputError(f"--ranks-per-node must be >= 1, got {per_node}")
        nodes: dict[int, list[str]] = {}
        for g in gpus:
            nodes.setdefault(topo.node_of(g), []).append(g)
        short = [k for k, v in nodes.items() if len(v) < per_node]
        if short:
            raise CosimInputError(f"--ranks-per-node {per_node}: node {short[0]} has only "
                                  f"{len(nodes[short[0]])} GPUs")
        gpus = [g for k in sorted(nodes) for g in nodes[k][:per_node]]
    if n is None:
        n = len(gpus)
    if n < 1:
        raise CosimInputError(f"--ranks must be >= 1, got {n}")
    if n > len(gpus):
        raise CosimInputError(f"--ranks {n}: the topology offers only {len(gpus)} GPUs"
                              + (f" with --ranks-per-node {per_node}" if per_node else ""))
    return gpus[:n]


def channels_for(channels: int | None, comm_sms: int | None) -> int | None:
    """Channels of a collective whose kernel may use ``comm_sms`` SMs: NCCL launches one thread block per
    channel, each on its own SM, so at most ``comm_sms`` channels (None: ``channels``, or the parameters')."""
    if comm_sms is None:
        return channels
    if channels is not None and channels > comm_sms:
        raise CosimInputError(f"--channels {channels} needs {channels} SMs (one thread block per channel), "
                              f"more than --comm-sms {comm_sms}")
    return channels if channels is not None else comm_sms


def sweep(topo: Any, op: str, ranks: list[str], sizes: list[float], *, algo: str = "auto", proto: str = "auto",
          channels: int | None = None, comm_sms: int | None = None, calibration: bool = True,
          progress: bool = False) -> list[dict[str, Any]]:
    """Simulate ``op`` once per size; return nccl-tests-like rows. ``comm_sms``: SMs the communication kernel
    may use; one channel per SM, so it caps the channels (:func:`channels_for`)."""
    from cosim.engine import NcclConfig, SimConfig, Simulator

    channels = channels_for(channels, comm_sms)
    cfg = SimConfig(nccl=NcclConfig(algo=algo, proto=proto, channels=channels, use_calibration=calibration),
                    record_trace=False)
    sim = Simulator(topo, cfg)
    rows = []
    it: Any = sizes
    if progress:
        from tqdm import tqdm

        it = tqdm(sizes, desc=f"{op} x{len(ranks)}", unit="size", file=sys.stderr, leave=False)
    for s in it:
        try:
            ev = sim.collective(op, ranks, s, channels=channels)
        except ValueError as exc:
            raise CosimInputError(str(exc)) from None
        sim.run()
        r = ev.value
        rows.append({"size_bytes": int(s) if float(s).is_integer() else s, "time_s": r.time, "algbw_Bps": r.algbw, "busbw_Bps": r.busbw,
                     "algo": r.algo, "proto": r.proto})
    return rows


def deepep_rows(topo: Any, op: str, ranks: list[str], tokens: list[int], *, hidden: int, topk: int, experts: int,
                topk_groups: int | None = None, mode: str = "normal") -> list[dict[str, Any]]:
    """One DeepEP dispatch/combine per token count on an idle topology."""
    from cosim.engine import SimConfig, Simulator

    rows = []
    for t in tokens:
        sim = Simulator(topo, SimConfig(record_trace=False))
        try:
            ev = sim.collective(op, ranks, num_tokens=t, hidden=hidden, num_topk=topk, num_experts=experts,
                                num_topk_groups=topk_groups, mode=mode)
        except ValueError as exc:
            raise CosimInputError(f"--op {op}: {exc}") from None
        sim.run()
        r = ev.value
        rows.append({"tokens": t, "time_s": r.time, "nvl_bytes": r.nvl_bytes, "rdma_bytes": r.rdma_bytes,
                     "nvl_bw_Bps": r.nvl_bw, "rdma_bw_Bps": r.rdma_bw, "mode": mode})
    return rows


def _deepep(args: argparse.Namespace) -> int:
    try:
        tokens = [int(x) for x in str(args.tokens).split(",") if x.strip()]
    except ValueError:
        raise CosimInputError(f"--tokens {args.tokens!r}: expected a comma list of integers") from None
    for name, v in (("--tokens", min(tokens, default=0)), ("--hidden", args.hidden), ("--topk", args.topk),
                    ("--experts", args.experts)):
        if v < 1:
            raise CosimInputError(f"{name} must be >= 1, got {v}")
    if args.topk > args.experts:
        raise CosimInputError(f"--topk {args.topk} exceeds --experts {args.experts}")
    if args.topk_groups is not None and args.topk_groups < 1:
        raise CosimInputError(f"--topk-groups must be >= 1, got {args.topk_groups}")
    topo = _load(args.topology)
    ranks = pick_ranks(topo, args.ranks, args.ranks_per_node)
    rows = deepep_rows(topo, args.op, ranks, tokens, hidden=args.hidden, topk=args.topk, experts=args.experts,
                       topk_groups=args.topk_groups, mode=args.mode)
    if args.json:
        emit_json({"topology": args.topology, "op": args.op, "ranks": len(ranks), "hidden": args.hidden,
                   "topk": args.topk, "experts": args.experts, "results": rows})
        return 0
    print(f"# {args.op} ({args.mode}) on {getattr(topo, 'name', args.topology)}, {len(ranks)} ranks, hidden "
          f"{args.hidden}, top-{args.topk} of {args.experts} experts")
    print(f"{'tokens':>8}  {'time':>10}  {'NVL bw':>11}  {'RDMA bw':>11}")
    for r in rows:
        print(f"{r['tokens']:>8}  {units.fmt_time(r['time_s']):>10}  {units.fmt_bandwidth(r['nvl_bw_Bps']):>11}  "
              f"{units.fmt_bandwidth(r['rdma_bw_Bps']):>11}")
    return 0


def handler(args: argparse.Namespace) -> int:
    if args.op not in OPS:
        raise CosimInputError(f"--op {args.op!r}: choose from {', '.join(OPS)}")
    if args.op in DEEPEP:
        return _deepep(args)
    try:
        sizes = units.parse_size_list(args.sizes, "--sizes")
    except units.UnitError as exc:
        raise CosimInputError(str(exc)) from None
    if not sizes:
        raise CosimInputError("--sizes: no sizes given")
    if args.op in ("all_to_all", "all_to_allv", "send_recv") and args.algo not in ("auto", None):
        raise CosimInputError(f"--algo {args.algo}: {args.op} runs as point-to-point transfers (NCCL has no "
                              "algorithm choice for it); leave --algo auto")
    if args.channels is not None and args.channels < 1:
        raise CosimInputError("--channels must be >= 1")
    if args.comm_sms is not None and args.comm_sms < 1:
        raise CosimInputError("--comm-sms must be >= 1 (NCCL runs each channel on one SM)")
    topo = _load(args.topology)
    ranks = pick_ranks(topo, args.ranks, args.ranks_per_node)
    sms = getattr(topo.accelerator(ranks[0]), "sm_count", None) if hasattr(topo, "accelerator") else None
    if args.comm_sms is not None and sms is not None and args.comm_sms > sms:
        raise CosimInputError(f"--comm-sms {args.comm_sms}: the GPU has only {sms} SMs")
    if args.op == "send_recv" and len(ranks) < 2:
        raise CosimInputError("send_recv needs at least 2 ranks")
    progress = (not args.json) and sys.stderr.isatty() and len(sizes) > 4
    rows = sweep(topo, args.op, ranks, sizes, algo=args.algo, proto=args.proto, channels=args.channels,
                 comm_sms=args.comm_sms, calibration=not args.no_calibration, progress=progress)
    if args.json:
        emit_json({"topology": args.topology, "op": args.op, "ranks": len(ranks), "results": rows})
        return 0
    name = getattr(topo, "name", args.topology)
    print(f"# {args.op} on {name}, {len(ranks)} ranks ({', '.join(ranks[:4])}{', ...' if len(ranks) > 4 else ''})")
    print(f"{'size':>10}  {'time':>10}  {'algbw':>11}  {'busbw':>11}  algo/proto")
    for r in rows:
        print(f"{units.fmt_size(r['size_bytes']):>10}  {units.fmt_time(r['time_s']):>10}  "
              f"{units.fmt_bandwidth(r['algbw_Bps']):>11}  {units.fmt_bandwidth(r['busbw_Bps']):>11}  "
              f"{r['algo']}/{r['proto']}")
    return 0
