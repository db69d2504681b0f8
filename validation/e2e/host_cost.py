"""Host time per launched kernel of eager PyTorch, measured from the shared H100 traces.

``python -m validation.e2e.host_cost [--json]`` reads the TraceLens H100 traces in
``../shared/traces/tracelens-h100`` (Hugging Face models run eagerly on an H100 host, Kineto on)
and prints, per trace, the median host time between consecutive kernel launch calls
(``cudaLaunchKernel`` / ``cudaLaunchKernelExC`` / memcpy / memset runtime calls) outside host
synchronizations, and the median launch call itself. The decoder-only LLM among them
(Qwen1.5-0.5B) is what the synthetic step's default ``dispatch_overhead`` is taken from: its
median interval minus the H100 host's launch call (``cosim/catalog/data/cpus.yaml``, 4.6 us). It also prints
the host time of a ``torch.distributed`` all-to-all call (``c10d::alltoall_base_``) in the 8-rank PARAM DLRM
traces (``../shared/traces/param-dlrm-v100x8``), which the synthetic default ``collective_host`` comes from,
and, held out, the host time of the eager MoE layer forwards of the TraceLens B300 microbenchmarks
(``../shared/traces/tracelens-b300-moe``: one ``MoE[...]`` annotation per layer call, the first a warm-up) with
the GPU's idle time inside each layer (:func:`moe_layer_host`).

``python -m validation.e2e.host_cost --layer ID`` (repeatable; ``--cases FILE`` for another cases file) prints, for
an e2e row, cosim's own synthesized figures per layer and micro-batch on rank 0 (:func:`synthetic_layer_host`): the
step's increment, the host's busy time split by the op each launch call enqueues, the compute kernels, the exposed
communication and the GPU's host-bound idle time.
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from itertools import pairwise
from pathlib import Path
from typing import Any

from cosim.errors import CosimInputError

LLM_TRACE = "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
"""The decoder-only transformer trace the synthetic default comes from."""

C10D_FOLDER = "param-dlrm-v100x8/kineto"
"""The 8-rank NCCL job (PARAM's DLRM: embedding all-to-alls and all-reduces, PyTorch Kineto with CPU ops) whose
``c10d::alltoall_base_`` calls the synthetic default ``collective_host`` comes from."""


def _trace_events(path: Path) -> list[dict[str, Any]]:
    """The complete (``ph: X``) events of the gzipped Kineto trace ``path``, each with a numeric ``ts`` and ``dur``;
    an unreadable trace is a one-line error."""
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise CosimInputError(f"{path}: not a readable gzipped Kineto trace ({e})") from None
    ev = doc.get("traceEvents", []) if isinstance(doc, dict) else doc
    if not isinstance(ev, list):
        raise CosimInputError(f"{path}: traceEvents is not a list")
    xs = [e for e in ev if isinstance(e, dict) and e.get("ph") == "X"]
    for x in xs:
        if not all(isinstance(x.get(k), (int, float)) and not isinstance(x.get(k), bool) for k in ("ts", "dur")):
            raise CosimInputError(f"{path}: event {str(x.get('name', ''))[:60]!r} has no numeric ts and dur")
    return xs


def _is_launch(e: dict[str, Any]) -> bool:
    n = str(e.get("name", ""))
    return e.get("cat") == "cuda_runtime" and ("Launch" in n or "Memcpy" in n or "Memset" in n)


def launch_intervals(path: Path) -> dict[str, float]:
    """Median and mean host time between consecutive launch calls of ``path`` (intervals containing a
    host synchronization left out), the median launch call, and the launch count (seconds, count)."""
    xs = _trace_events(path)
    launches = sorted((e for e in xs if _is_launch(e)), key=lambda e: float(e["ts"]))
    syncs = sorted(float(e["ts"]) for e in xs
                   if e.get("cat") == "cuda_runtime" and "Synchronize" in str(e.get("name", "")))
    if len(launches) < 3:
        raise CosimInputError(f"{path}: fewer than 3 kernel launches")
    gaps = [float(b["ts"]) - float(a["ts"]) for a, b in pairwise(launches)
            if not any(float(a["ts"]) <= s <= float(b["ts"]) for s in syncs)]
    return {"median_interval_s": statistics.median(gaps) * 1e-6, "mean_interval_s": statistics.mean(gaps) * 1e-6,
            "median_launch_call_s": statistics.median(float(e["dur"]) for e in launches) * 1e-6,
            "launches": float(len(launches))}


MOE_FOLDER = "tracelens-b300-moe"
"""Eager single-GPU MoE layer forwards on a B300 host (TraceLens evals/unit_tests_nv/moe). Held out for the host
cost per kernel except its launch call: the eager ``dispatch_overhead`` (12 us) comes from the Qwen1.5 H100 trace,
but the hgx-b200 host's ``launch_overhead`` (xeon-8570, 4 us) sits between the TraceLens H100 and these traces'
``cudaLaunchKernel`` medians (cosim/catalog/data/cpus.yaml); the b300 kernel profile (GPU times, not host) is fitted
on three of them (cosim/models/data/b300.yaml)."""


def moe_layer_host(path: Path, prefix: str = "MoE[") -> list[dict[str, float]]:
    """Per steady-state call of an eager MoE layer in ``path`` (every ``user_annotation`` whose name starts with
    ``prefix`` but the first, a warm-up): its host time (the annotation, s), the kernel launch calls inside it
    (runtime ``cudaLaunchKernel`` and driver ``cuLaunchKernelEx``, which cuBLAS's GEMMs use), the median host time
    between consecutive launch calls, the host time per launch call (host time / launches), the GPU time of the
    kernels those calls launched (s) and the GPU's idle time between the first of them starting and the last ending
    (s). Kernels are matched to their launch call by ``correlation``."""
    xs = _trace_events(path)
    layers = sorted((e for e in xs if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith(prefix)),
                    key=lambda e: float(e["ts"]))
    if len(layers) < 2:
        raise CosimInputError(f"{path}: fewer than two {prefix!r} annotations (one warm-up, one steady call)")
    launches = sorted((e for e in xs if e.get("cat") in ("cuda_runtime", "cuda_driver")
                       and "Launch" in str(e.get("name", ""))), key=lambda e: float(e["ts"]))
    def corr(e: dict[str, Any]) -> Any:
        args = e.get("args")
        return args.get("correlation") if isinstance(args, dict) else None

    kernels = {corr(e): e for e in xs if e.get("cat") == "kernel" and corr(e) is not None}
    out: list[dict[str, float]] = []
    for a in layers[1:]:
        t0, t1 = float(a["ts"]), float(a["ts"]) + float(a["dur"])
        ls = [e for e in launches if t0 <= float(e["ts"]) <= t1]
        ks = sorted((kernels[c] for c in (corr(e) for e in ls) if c in kernels),
                    key=lambda k: float(k["ts"]))
        if len(ls) < 2 or not ks:
            raise CosimInputError(f"{path}: {a['name']!r} at ts {t0}: fewer than two kernel launches inside it")
        busy = sum(float(k["dur"]) for k in ks)
        span = max(float(k["ts"]) + float(k["dur"]) for k in ks) - float(ks[0]["ts"])
        out.append({"host_s": float(a["dur"]) * 1e-6, "launches": float(len(ls)),
                    "median_interval_s": statistics.median(float(b["ts"]) - float(x["ts"])
                                                           for x, b in pairwise(ls)) * 1e-6,
                    "host_per_launch_s": float(a["dur"]) / len(ls) * 1e-6, "gpu_busy_s": busy * 1e-6,
                    "gpu_idle_s": max(0.0, span - busy) * 1e-6})
    return out


def c10d_calls(path: Path) -> dict[str, tuple[int, float]]:
    """Host time of each kind of ``torch.distributed`` collective call in a Kineto trace: the ``c10d::*`` CPU ops
    (Python binding, ProcessGroupNCCL work, the NCCL group call that launches the kernel), as (count, median s)."""
    durs: dict[str, list[float]] = {}
    for e in _trace_events(path):
        if str(e.get("name", "")).startswith("c10d::"):
            durs.setdefault(str(e["name"]), []).append(float(e["dur"]) * 1e-6)
    return {k: (len(v), statistics.median(v)) for k, v in sorted(durs.items())}


def alltoall_call_s(folder: Path) -> tuple[int, float]:
    """(calls, median host time s) of ``c10d::alltoall_base_`` over every rank trace in ``folder``."""
    times: list[float] = []
    for p in sorted(folder.glob("*.json.gz")):
        times += [float(e["dur"]) * 1e-6 for e in _trace_events(p) if e.get("name") == "c10d::alltoall_base_"]
    if not times:
        raise CosimInputError(f"{folder}: no c10d::alltoall_base_ calls")
    return len(times), statistics.median(times)


LAYER_PROBES = (4, 8)
"""Micro-batches per pipeline of the two full (not extended) simulations :func:`synthetic_layer_host` differences."""


def synthetic_layer_host(case_id: str, cases: Path | None = None) -> dict[str, Any]:
    """cosim's synthesized step of e2e row ``case_id`` (``validation/e2e/training.yaml`` or ``cases``), per layer and
    micro-batch on rank 0 (seconds): the difference between full simulations (``coalesce`` off) at
    :data:`LAYER_PROBES` micro-batches per pipeline, divided by the micro-batches added and the layers of a pipeline
    stage (the decoder layers rank 0 holds: its chunks 0, pp, 2 pp, ... as run.py lays them out). ``step_s``: the step's increment; ``host_busy_s``: the launch thread's busy time
    (its ops and the gaps before them), ``host_by_op`` the same by the name of the first GPU op each call enqueues
    (digits folded to ``#``); ``sync_stall_s``: the host waiting in synchronizations; ``compute_s``,
    ``exposed_comm_s``, ``host_bound_idle_s``: the step breakdown's parts per GPU; ``launches``: host ops. A row
    whose micro-batches per pipeline do not allow both probes (interleaved layouts need multiples of pp) is a
    one-line error."""
    import re
    import tempfile
    from collections import defaultdict

    import numpy as np

    from cosim.capture.config import load_model_config
    from cosim.scenario import run_scenario
    from validation.e2e import run as e2e

    _, rows = e2e.load_cases(cases) if cases is not None else e2e.load_cases()
    case = next((c for c in rows if c.id == case_id), None)
    if case is None:
        raise CosimInputError(f"{cases or e2e.CASES}: no row {case_id!r}")
    lay = case.layout
    if lay.vpp > 1 and any(m % lay.pp for m in LAYER_PROBES):
        raise CosimInputError(f"{case_id}: interleaved pp {lay.pp} does not divide {LAYER_PROBES} micro-batches")
    layers = _rank0_layers(case, load_model_config(case.model))
    got = []
    with tempfile.TemporaryDirectory(prefix="cosim-layer-") as tmp:
        try:
            topology, nodes = e2e._topology(case, Path(tmp))
        except e2e._NotRun as exc:
            raise CosimInputError(f"{cases or e2e.CASES}: row {case_id!r} is not run: {exc}") from None
        for m in LAYER_PROBES:
            _, res = run_scenario(e2e._scenario(case, m, topology, nodes, "none", {"coalesce": False}))
            g, prog = res.graph.ranks[0], res.programs[0]
            ops = np.nonzero(np.asarray(g.host_ops.depth) == 1)[0]
            busy = np.nan_to_num(np.asarray(g.host_ops.dur)) + np.nan_to_num(np.asarray(g.host_ops.pre_gap))
            by_op: defaultdict[str, float] = defaultdict(float)
            for i in ops:
                gpu = prog.launch_gpu.get(int(i))
                name = g.name(int(g.gpu_ops.name[gpu[0]])) if gpu else g.name(int(g.host_ops.name[i]))
                by_op[re.sub(r"[0-9]+", "#", name)] += float(busy[i])
            bd = res.summary()["breakdown"]
            got.append({"step_s": res.summary()["step_time_s"], "host_busy_s": float(busy[ops].sum()),
                        "sync_stall_s": sum(float(np.sum(v)) for v in res.runs[0].sync_stall.values()),
                        "compute_s": bd["compute"], "exposed_comm_s": bd["exposed_communication"],
                        "host_bound_idle_s": bd["host_bound_gpu_idle"], "launches": float(len(ops)), "by_op": by_op})
    a, b = got
    k = (LAYER_PROBES[1] - LAYER_PROBES[0]) * layers
    out: dict[str, Any] = {key: (b[key] - a[key]) / k for key in a if key != "by_op"}
    out["host_by_op"] = {n: (b["by_op"][n] - a["by_op"].get(n, 0.0)) / k
                         for n in sorted(b["by_op"], key=lambda n: -b["by_op"][n])}
    out["layers_per_stage"] = layers
    return out


def _rank0_layers(case: Any, card: Any) -> int:  # case: run.Case, card: the model card
    """Decoder layers rank 0 holds (its chunks 0, pp, 2 pp, ...), as run.py's :func:`_scenario` lays them out."""
    from cosim.workload.synth.layout import parse_pipeline_layout
    from validation.e2e.run import pipeline_layers

    lay = case.layout
    chunks = lay.pp * lay.vpp
    mtp = card.mtp_layers if case.mtp_layers is None else case.mtp_layers
    if case.pipeline_model_parallel_layout is not None:
        per = parse_pipeline_layout(case.pipeline_model_parallel_layout, chunks, card.num_layers, mtp)[0]
    else:
        per = case.pipeline_layers or pipeline_layers(card.num_layers, chunks, mtp) or [card.num_layers // chunks] * chunks
    return sum(per[v * lay.pp] for v in range(lay.vpp))


def _print_layer(case_id: str, r: dict[str, Any], top: int = 12) -> None:
    print(f"{case_id}: per layer and micro-batch (rank 0, {r['layers_per_stage']:g} layers per stage): step "
          f"{r['step_s'] * 1e3:.2f} ms, host busy {r['host_busy_s'] * 1e3:.2f} ms in {r['launches']:.1f} launch calls "
          f"(sync stall {r['sync_stall_s'] * 1e3:.2f} ms), compute {r['compute_s'] * 1e3:.2f} ms, exposed "
          f"communication {r['exposed_comm_s'] * 1e3:.2f} ms, host-bound idle {r['host_bound_idle_s'] * 1e3:.2f} ms")
    for name, t in list(r["host_by_op"].items())[:top]:
        print(f"  {t * 1e6:8.1f} us  {name}")


def main(argv: list[str] | None = None) -> int:
    from cosim.resources import shared_dir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--layer", action="append", default=[], metavar="ID",
                    help="an e2e row: cosim's synthesized figures per layer and micro-batch (repeatable)")
    ap.add_argument("--cases", type=Path, default=None, help="the rows file for --layer (default: training.yaml)")
    args = ap.parse_args(argv)
    if args.layer:
        try:
            layer_rows = {cid: synthetic_layer_host(cid, args.cases) for cid in args.layer}
        except CosimInputError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        if args.json:
            print(json.dumps(layer_rows, indent=2))
        else:
            for cid, r in layer_rows.items():
                _print_layer(cid, r)
        return 0
    try:
        root = shared_dir()
        folder = None if root is None else Path(root) / "traces" / "tracelens-h100"
        if root is None or folder is None or not folder.is_dir():
            raise CosimInputError("../shared/traces/tracelens-h100: not found (the shared traces are needed)")
        rows = {p.name: launch_intervals(p) for p in sorted(folder.glob("*.json.gz"))}
        c10d = Path(root) / "traces" / C10D_FOLDER
        a2a = alltoall_call_s(c10d) if c10d.is_dir() else None
        moe_dir = folder.parent / MOE_FOLDER
        moe = {p.name: moe_layer_host(p) for p in sorted(moe_dir.glob("*.json.gz"))} if moe_dir.is_dir() else {}
    except CosimInputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**rows, **({"c10d_alltoall_base": {"calls": a2a[0], "median_s": a2a[1]}} if a2a else {}),
                          **({"moe_layer_host": moe} if moe else {})}, indent=2))
        return 0
    print(f"{'trace':44s} {'launches':>8s} {'median interval us':>19s} {'mean us':>8s} {'launch call us':>15s}")
    for name, r in rows.items():
        print(f"{name:44s} {r['launches']:8.0f} {r['median_interval_s'] * 1e6:19.1f} {r['mean_interval_s'] * 1e6:8.1f}"
              f" {r['median_launch_call_s'] * 1e6:15.1f}")
    if a2a:
        print(f"c10d::alltoall_base_ host time ({C10D_FOLDER}, every rank): median {a2a[1] * 1e6:.1f} us over "
              f"{a2a[0]} calls")
    if moe:
        print(f"\n{MOE_FOLDER} (held out), per steady MoE layer forward:")
        print(f"{'trace':40s} {'launches':>8s} {'host us':>8s} {'median interval us':>19s} {'host/launch us':>15s}"
              f" {'GPU busy us':>12s} {'GPU idle us':>12s}")
        for name, calls in moe.items():
            for r in calls:
                print(f"{name:40s} {r['launches']:8.0f} {r['host_s'] * 1e6:8.1f} {r['median_interval_s'] * 1e6:19.1f}"
                      f" {r['host_per_launch_s'] * 1e6:15.1f} {r['gpu_busy_s'] * 1e6:12.1f} {r['gpu_idle_s'] * 1e6:12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
