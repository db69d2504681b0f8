"""Host time of ``torch.distributed`` collective calls in every shared trace that records them.

``python -m validation.e2e.c10d_host [--json]`` reads every Kineto trace under ``../shared/traces`` with CPU ops
and, per trace and kind of collective, measures the host time of each **collective call**: the outermost CPU op
of the call, i.e. the ``c10d::<op>`` op (Python binding -> ProcessGroupNCCL work -> NCCL group call), or, where
the caller reaches ProcessGroupNCCL without a ``c10d::`` op (TorchRec's all-to-alls), the
``record_param_comms`` op that encloses the ``nccl:<collective>`` op. A ``record_param_comms`` without an
``nccl:*`` op inside is a wait (``All2All_Pooled_Wait``), not a call, and is left out. For each call it also
takes the launch-API call inside it (``cudaLaunchKernel`` / ``hipExtLaunchKernel`` ...), because the synthetic
``collective_host`` (:data:`cosim.workload.synth.spec.C10D_CALL_HOST`) is the host time of a call *beyond*
its launch call. Rows: trace, GPU, call op, collective, calls, median, p10, p90 of the call, median launch
call inside, median call less its own launch call (us).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosim.errors import CosimInputError

_CPU_CATS = ("cpu_op", "user_annotation", "cuda_runtime")
_LAUNCH = ("LaunchKernel", "LaunchCooperativeKernel")
_RANK_FILE = re.compile(r"(worker)\d+(_step_\d+)\.")


@dataclass(frozen=True)
class CallRow:
    """Host time of one kind of collective call in one trace (seconds; ``p10``/``p90`` by linear interpolation)."""

    trace: str
    """Trace path relative to ``../shared/traces``."""
    gpu: str
    """GPU name recorded in the trace's ``deviceProperties`` ("not recorded" when absent)."""
    ranks: int
    """World size recorded in the trace's ``distributedInfo`` (0 when absent)."""
    op: str
    """The call's outermost CPU op: ``c10d::allreduce_``, ..., or ``record_param_comms``."""
    collective: str
    """The NCCL/RCCL op inside it (``nccl:all_reduce``, ``nccl:all_to_all``, ...)."""
    calls: int
    median_s: float
    p10_s: float
    p90_s: float
    launch_median_s: float
    """Median launch-API call inside the collective call (0 when none is recorded)."""
    net_median_s: float
    """Median over calls of (call - its own launch-API calls): what ``collective_host`` stands for."""


def _events(path: Path) -> tuple[list[dict[str, Any]], str, int]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise CosimInputError(f"{path}: not a readable gzipped Kineto trace ({e})") from None
    ev = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    gpus = sorted({str(d.get("name")) for d in (doc.get("deviceProperties") or []) if isinstance(d, dict)}) \
        if isinstance(doc, dict) else []
    xs = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X" and e.get("cat") in _CPU_CATS
          and isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur"), (int, float))]
    info = doc.get("distributedInfo") if isinstance(doc, dict) else None
    world = info.get("world_size") if isinstance(info, dict) else None
    return xs, ", ".join(gpus) or "not recorded", world if isinstance(world, int) else 0


def collective_calls(path: Path) -> list[tuple[str, str, float, float]]:
    """Every collective call of a Kineto trace as (call op, collective, call s, launch calls inside s).

    Calls are found per host thread by nesting (a parent encloses its children's intervals); the call is the
    outermost ``c10d::*`` or ``record_param_comms`` op above an ``nccl:*`` op. Cost: O(E log E) in the trace's
    CPU events."""
    xs, _, _ = _events(path)
    by: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for e in xs:
        by.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    out: list[tuple[str, str, float, float]] = []
    for es in by.values():
        es.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        stack: list[dict[str, Any]] = []
        call: dict[str, Any] | None = None  # the open collective call: {op, end, dur, coll, launch}
        for e in es:
            ts, dur, name = float(e["ts"]), float(e["dur"]), str(e.get("name", ""))
            while stack and float(stack[-1]["ts"]) + float(stack[-1]["dur"]) <= ts:
                stack.pop()
            if call is not None and ts >= call["end"]:
                if call["coll"]:
                    out.append((call["op"], call["coll"], call["dur"] * 1e-6, call["launch"] * 1e-6))
                call = None
            if call is None and (name.startswith("c10d::") or name == "record_param_comms"):
                call = {"op": name, "end": ts + dur, "dur": dur, "coll": "", "launch": 0.0}
            elif call is not None:
                if name.startswith("nccl:") and not call["coll"]:
                    call["coll"] = name
                elif e.get("cat") == "cuda_runtime" and any(x in name for x in _LAUNCH):
                    call["launch"] += dur
            stack.append(e)
        if call is not None and call["coll"]:
            out.append((call["op"], call["coll"], call["dur"] * 1e-6, call["launch"] * 1e-6))
    return out


def call_rows(paths: list[Path], name: str) -> list[CallRow]:
    """Per (call op, collective) of the traces ``paths`` (one job: its ranks pooled), named ``name``: count,
    median, p10, p90, median launch call, median net call."""
    meta = [_events(p)[1:] for p in paths]
    gpu = ", ".join(sorted({g for g, _ in meta}))
    world = max(w for _, w in meta)
    groups: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for p in paths:
        for op, coll, d, launch in collective_calls(p):
            groups.setdefault((op, coll), []).append((d, launch))
    rows = []
    for (op, coll), v in sorted(groups.items()):
        dd = np.array([x[0] for x in v])
        la = np.array([x[1] for x in v])
        rows.append(CallRow(trace=name, gpu=gpu, ranks=world, op=op, collective=coll, calls=len(v),
                            median_s=float(statistics.median(dd)), p10_s=float(np.percentile(dd, 10)),
                            p90_s=float(np.percentile(dd, 90)), launch_median_s=float(statistics.median(la)),
                            net_median_s=float(statistics.median(dd - la))))
    return rows


def all_rows(root: Path) -> list[CallRow]:
    """:func:`call_rows` of every Kineto trace under ``root`` (``../shared/traces``) that has collective calls
    (Execution Traces, which have no durations, are skipped)."""
    jobs: dict[str, list[Path]] = {}
    for p in sorted(root.rglob("*.json.gz")):
        rel = p.relative_to(root).as_posix()
        if p.name.endswith("_et.json.gz") or "/et" in rel or rel.startswith("chakra"):
            continue
        rank = _RANK_FILE.match(p.name)  # the ranks of one job (PARAM's worker<r>_step_<n>...) are pooled
        key = f"{p.parent.relative_to(root).as_posix()}/{rank.group(1)}*{rank.group(2)}" if rank else rel
        jobs.setdefault(key, []).append(p)
    rows: list[CallRow] = []
    for key, paths in jobs.items():
        rows += call_rows(paths, key)
    return rows


def default_net_s(rows: list[CallRow], ranks: tuple[int, int] = (2, 8)) -> float:
    """The figure ``collective_host`` takes (s): the median of the rows' net call times (:attr:`CallRow.net_median_s`)
    over every row whose job ran on ``ranks`` (inclusive; the group sizes of the e2e rows' collectives are 2-64)."""
    net = [r.net_median_s for r in rows if ranks[0] <= r.ranks <= ranks[1]]
    if not net:
        raise ValueError("no collective calls on 2-8 ranks")
    return float(statistics.median(net))


A2A_PEER_SOURCE = ("pytorch/pytorch 2.x torch/csrc/cuda/nccl.cpp (all2all_single_unequal_split, which "
                   "ProcessGroupNCCL::alltoall_base calls for all_to_all_single with split sizes: ncclGroupStart, "
                   "then for every rank r of the group an ncclSend and an ncclRecv of its count, then ncclGroupEnd, "
                   "which schedules each peer's send and receive on the channels); NVIDIA/nccl src/group.cc "
                   "(groupLaunch: the p2p tasks are planned per peer)")
"""Why an all-to-all call's host time grows with its group and an all-reduce's does not (one ``ncclAllReduce``
enqueued per call whatever the group size)."""


@dataclass(frozen=True)
class PeerRow:
    """One trace with both an all-to-all and an all-reduce call: the all-to-all's extra host time (s)."""

    trace: str
    ranks: int
    a2a_net_s: float
    allreduce_net_s: float

    @property
    def extra_s(self) -> float:
        """All-to-all less all-reduce, both net of their launch calls: the host (CPU, Python, c10d) cancels."""
        return self.a2a_net_s - self.allreduce_net_s


def peer_rows(rows: list[CallRow]) -> list[PeerRow]:
    """Per trace (job) with both kinds: the net all-to-all and all-reduce call times (the metadata trace, which has
    no all-to-all, drops out by itself)."""
    by: dict[str, dict[str, CallRow]] = {}
    for r in rows:
        if r.collective in ("nccl:all_to_all", "nccl:all_reduce"):
            by.setdefault(r.trace, {})[r.collective] = r
    return [PeerRow(t, d["nccl:all_to_all"].ranks, d["nccl:all_to_all"].net_median_s, d["nccl:all_reduce"].net_median_s)
            for t, d in sorted(by.items()) if len(d) == 2 and d["nccl:all_to_all"].ranks >= 2]


def per_peer_s(rows: list[PeerRow]) -> float:
    """Host time per peer of an all-to-all call (s): the least-squares slope of :attr:`PeerRow.extra_s` over the
    group size. Taking the all-to-all *less the all-reduce of the same trace* cancels the host's speed (the 128-rank
    job's all-reduce is itself 1.7x the 8-rank figure there: its host, not its group, since an all-reduce call enqueues
    one NCCL collective); what is left is the per-peer ``ncclSend`` / ``ncclRecv`` of :data:`A2A_PEER_SOURCE`."""
    x = np.array([float(r.ranks) for r in rows])
    y = np.array([r.extra_s for r in rows])
    if len(set(x.tolist())) < 2:
        raise ValueError("need all-to-all calls at two group sizes")
    return float(np.polyfit(x, y, 1)[0])


def main(argv: list[str] | None = None) -> int:
    from cosim.resources import shared_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = shared_dir()
    if root is None or not (Path(root) / "traces").is_dir():
        print("error: ../shared/traces: not found (the shared traces are needed)", file=sys.stderr)
        return 2
    tr = Path(root) / "traces"
    try:
        rows = all_rows(tr)
    except CosimInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    prs = peer_rows(rows)
    if args.json:
        print(json.dumps({"calls": [asdict(r) for r in rows], "peers": [asdict(r) for r in prs],
                          "per_peer_s": per_peer_s(prs), "default_net_s": default_net_s(rows)}, indent=2))
        return 0
    print("| trace | GPU | ranks | call op | collective | calls | median us | p10 us | p90 us | launch call us | "
          "call - launch us |")
    print("|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r.trace} | {r.gpu} | {r.ranks or '-'} | `{r.op}` | `{r.collective}` | {r.calls} | {r.median_s * 1e6:.1f} | "
              f"{r.p10_s * 1e6:.1f} | {r.p90_s * 1e6:.1f} | {r.launch_median_s * 1e6:.1f} | "
              f"{r.net_median_s * 1e6:.1f} |")
    print()
    print("| trace | ranks | all-to-all net us | all-reduce net us | all-to-all extra us |")
    print("|---|---:|---:|---:|---:|")
    for p in prs:
        print(f"| {p.trace} | {p.ranks} | {p.a2a_net_s * 1e6:.1f} | {p.allreduce_net_s * 1e6:.1f} | {p.extra_s * 1e6:.1f} |")
    print(f"\nper peer (slope): {per_peer_s(prs) * 1e6:.3f} us; 2-8-rank call: {default_net_s(rows) * 1e6:.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
