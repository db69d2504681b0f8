"""``replay()``: run an execution graph on a topology and summarize it."""

from __future__ import annotations

import math
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import simpy

from cosim import __version__
from cosim.errors import CosimInputError
from cosim.fileio import write_json
from cosim.replay.config import ReplayConfig
from cosim.replay.copies import CopyModel, copy_engines_of
from cosim.replay.executor import ENGINE_OPS, Executor, RankRun
from cosim.replay.hardware import cross_accelerator_factor, default_topology, guess_accelerator
from cosim.replay.links import COLLECTIVE, MEMCPY, EngineRoutes, LinkUsage, record_fabric
from cosim.replay.program import RankProgram, compile_rank
from cosim.replay.summary import BREAKDOWN_KEYS, breakdown, busiest_links, comm_split, critical_path, step_times
from cosim.workload import ExecutionGraph, load_trace
from cosim.workload.graph import CollType, CopyKind, GpuKind, RankGraph
from cosim.workload.project import needs_projection, project_onto

__all__ = ["SUMMARY_SCHEMA", "ReplayResult", "replay"]

SUMMARY_SCHEMA = "cosim.summary/1"


@dataclass
class ReplayResult:
    """A finished replay: the inputs, per-rank simulated times, and the summary."""

    graph: ExecutionGraph
    config: ReplayConfig
    topology: Any
    programs: list[RankProgram]
    runs: list[RankRun]
    sim_wall_s: float
    events: int
    sources: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    links: list[dict[str, Any]] = field(default_factory=list)
    """Per directed link that carried bytes (collectives and memcpys, docs/REPLAY.md): bytes, busy_time_s,
    peak_flows, utilization (``summary.json["links"]``)."""
    link_usage: LinkUsage | None = None
    """The traffic intervals behind ``links`` (for windowed figures: :mod:`cosim.replay.links`)."""
    kernel_errors: dict[str, Any] | None = None
    """Modeled replay: per-class error of the kernel models against the trace's measured durations; None
    when those are not measurements of the replayed GPU (a projected graph, another accelerator)."""
    precision: dict[str, Any] | None = None
    """Precision what-if: what it changed (summary field ``precision``)."""
    _summary: dict[str, Any] | None = None

    def summary(self) -> dict[str, Any]:
        """The documented ``summary.json`` (docs/REPLAY.md), JSON-ready."""
        if self._summary is None:
            self._summary = _summarize(self)
        return self._summary

    def write(self, out: str | Path, timeline: bool = True) -> dict[str, Path]:
        """Write ``summary.json``, ``timeline.json.gz`` (Perfetto) and ``timeline/rank{r}.json.gz`` (HTA) into
        ``out``; returns their paths (``timeline_ranks``: the folder to give HTA's ``TraceAnalysis``)."""
        from cosim.output.timeline import write_timeline

        out = Path(out)
        paths = {"summary": out / "summary.json"}
        write_json(paths["summary"], self.summary())
        if timeline:
            paths["timeline"] = out / "timeline.json.gz"
            write_timeline(paths["timeline"], self)
            paths["timeline_ranks"] = out / "timeline"
        return paths


def _nan_to_none(x: float) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _summarize(res: ReplayResult) -> dict[str, Any]:
    ranks = []
    windows = []
    for rg, prog, run in zip(res.graph.ranks, res.programs, res.runs):
        G = rg.gpu_ops
        meas = step_times(G.step, G.start, G.start + G.dur, G.launch >= 0)
        sim = step_times(G.step, run.gpu_start, run.gpu_end, G.launch >= 0)
        st_rows = rg.steps
        cpu_meas, cpu_sim = [], []
        step_rows = sim["steps"] if sim["steps"].size else np.arange(len(st_rows))
        for s in step_rows:
            h = int(st_rows.host_op[s]) if 0 <= s < len(st_rows) else -1
            if h >= 0:
                cpu_meas.append(float(rg.host_ops.dur[h]))
                cpu_sim.append(float(run.host_end[h] - run.host_start[h]))
            elif 0 <= s < len(st_rows):  # no ProfilerStep annotation: the step is the span of its host ops
                cpu_meas.append(float(st_rows.cpu_dur[s]))
                mine = rg.host_ops.step == s
                cpu_sim.append(float(run.host_end[mine].max() - run.host_start[mine].min()) if mine.any() else math.nan)
        bd = breakdown(rg, run, sim["window"], sim["n_periods"])
        windows.append((*sim["window"], sim["n_periods"]))
        bd_meas = breakdown(rg, run, meas["window"], meas["n_periods"], start=G.start, end=G.start + G.dur)
        cp = critical_path(rg, prog, run, sim["window"], sim["n_periods"])
        numbers = [int(st_rows.number[s]) for s in step_rows if 0 <= s < len(st_rows)]
        per_step = []
        sp, mp = sim["periods"], meas["periods"]
        for k, num in enumerate(numbers):
            if sp.size:
                sv = sp[k] if k < sp.size else math.nan
                mv = mp[k] if k < mp.size else math.nan
            elif k < sim["span"].size:
                sv, mv = sim["span"][k], meas["span"][k] if k < meas["span"].size else math.nan
            else:
                sv = mv = math.nan
            per_step.append({"step": num, "step_time_s": _nan_to_none(sv), "measured_step_time_s": _nan_to_none(mv)})
        sim_t, meas_t = sim["step_time"], meas["step_time"]
        projected = bool(rg.source.get("projected"))
        if projected:
            cpu_meas = []
        if not math.isfinite(meas_t) and cpu_meas:  # CPU-only trace: the step is the host's
            meas_t = float(np.mean(cpu_meas))
            sim_t = float(np.nanmean(cpu_sim)) if np.isfinite(cpu_sim).any() else math.nan
            per_step = [{"step": n, "step_time_s": _nan_to_none(c), "measured_step_time_s": _nan_to_none(m)}
                        for n, c, m in zip(numbers or [-1] * len(cpu_sim), cpu_sim, cpu_meas)]
        err = (sim_t - meas_t) / meas_t if (math.isfinite(meas_t) and meas_t > 0) else math.nan
        ranks.append({
            "rank": rg.rank,
            "device": rg.device_name,
            "gpu": _rank_gpu(res.topology, rg.rank, res.config),
            "step_time_s": _nan_to_none(sim_t),
            "measured_step_time_s": _nan_to_none(meas_t),
            "error": _nan_to_none(err),
            "cpu_step_time_s": _nan_to_none(float(np.nanmean(cpu_sim)) if cpu_sim and np.isfinite(cpu_sim).any() else math.nan),
            "measured_cpu_step_time_s": _nan_to_none(float(np.mean(cpu_meas)) if cpu_meas else math.nan),
            "steps": per_step,
            "breakdown": bd,
            "exposed_communication_split": comm_split(rg, run, sim["window"], sim["n_periods"]),
            "measured_breakdown": {k: bd_meas[k] for k in ("compute", "exposed_communication", "memcpy")},
            "critical_path": cp,
            "launch_latency_s": run.launch_latency,
            "launch_latency_source": run.launch_latency_source,
            "gpu_ops": len(G),
            "host_ops": len(rg.host_ops),
        })
    valid = [r for r in ranks if r["step_time_s"] is not None]
    slow = max(valid, key=lambda r: r["step_time_s"]) if valid else (ranks[0] if ranks else None)
    meas_vals = [r["measured_step_time_s"] for r in ranks if r["measured_step_time_s"] is not None]
    step = slow["step_time_s"] if slow else None
    mstep = max(meas_vals) if meas_vals else None
    topo = res.topology
    return {
        "schema": SUMMARY_SCHEMA,
        "cosim_version": __version__,
        "sources": res.sources,
        "topology": getattr(topo, "name", None),
        "config": res.config.to_dict(),
        "step_time_s": step,
        "measured_step_time_s": mstep,
        "error": _nan_to_none((step - mstep) / mstep) if (step is not None and mstep) else None,
        "breakdown": slow["breakdown"] if slow else dict.fromkeys(BREAKDOWN_KEYS, 0.0),
        "exposed_communication_split": slow["exposed_communication_split"] if slow else
        {"transfer_s": 0.0, "wait_for_peers_s": 0.0},
        "critical_path": slow["critical_path"] if slow else {},
        "busiest_links": busiest_links(res.link_usage, topo, *_job_window(windows)),
        "ranks": ranks,
        "sim_wall_s": res.sim_wall_s,
        "events": res.events,
        "ops_per_wall_s": _nan_to_none(sum(r["gpu_ops"] + r["host_ops"] for r in ranks) / res.sim_wall_s)
        if res.sim_wall_s > 0 else None,
        "notes": res.notes,
        "links": res.links,
        "host": platform.node(),
        **({"kernel_error_by_class": res.kernel_errors} if res.kernel_errors else {}),
        **({"precision": res.precision} if res.precision else {}),
    }


def _job_window(windows: list[tuple[float, float, int]]) -> tuple[tuple[float, float], int]:
    """The hull of the ranks' simulated step windows, and the most step periods of any rank."""
    ok = [w for w in windows if math.isfinite(w[0]) and math.isfinite(w[1])]
    if not ok:
        return (math.nan, math.nan), 1
    return (min(w[0] for w in ok), max(w[1] for w in ok)), max(w[2] for w in ok)


def _rank_gpu(topo: Any, rank: int, cfg: ReplayConfig) -> str | None:
    """The topology GPU a rank ran on (``summary.json`` ranks[].gpu), None without a topology."""
    if topo is None or not hasattr(topo, "gpus"):
        return None
    try:
        return _gpu_of_rank(topo, rank, cfg)
    except CosimInputError:
        return None


def _gpu_of_rank(topo: Any, rank: int, cfg: ReplayConfig) -> str:
    gpus = topo.gpus
    if cfg.ranks_per_node:
        node, local = divmod(rank, cfg.ranks_per_node)
        on = topo.gpus_on(node) if node < topo.nodes else []
        if local < len(on):
            return on[local]
    if rank >= len(gpus):
        raise CosimInputError(f"rank {rank} does not fit topology {topo.name} ({len(gpus)} GPUs); "
                              "choose a larger topology with --topology or --set topology=...")
    return gpus[rank]


def _split_matrix(arr: list, ranks: list[int]) -> list[list[float]] | None:
    """all_to_allv bytes matrix [i][j] from every participant's input split sizes."""
    index = {r: k for k, r in enumerate(ranks)}
    m = [[0.0] * len(ranks) for _ in ranks]
    for r, j, _ in arr:
        rg = r.rg
        c = int(rg.gpu_ops.collective[j])
        C = rg.collectives
        splits = C.ragged("in_splits", c)
        if len(splits) != len(ranks):
            return None
        total_el = float(splits.sum())
        per_el = float(C.in_bytes[c]) / total_el if total_el > 0 and math.isfinite(C.in_bytes[c]) else math.nan
        if not math.isfinite(per_el):
            return None
        i = index[rg.rank]
        for k, n_el in enumerate(splits.tolist()):
            m[i][k] = 0.0 if k == i else n_el * per_el
    return m


def _nbytes_of(rg: RankGraph, c: int, ctype: int) -> float:
    C = rg.collectives
    b = float(C.out_bytes[c] if ctype == CollType.ALL_GATHER else C.in_bytes[c])
    if not math.isfinite(b) or b <= 0:
        eb = int(C.elem_bytes[c])
        n = int(C.out_nelems[c] if ctype == CollType.ALL_GATHER else C.in_nelems[c])
        b = float(eb * n) if eb > 0 and n > 0 else math.nan
    return b


def _collective_spec(arr: list, topo: Any, cfg: ReplayConfig,
                     gpu_of: dict[int, str] | None = None) -> tuple[str, list[str], float, Any] | None:
    """What the engine runs for matched participants ``arr`` [(rank, gpu op, start)]:
    (op, GPUs, nbytes, all-to-allv matrix or None), or None when it cannot (type or size unknown)."""
    r0, j0, _ = arr[0]
    rg = r0.rg
    c = int(rg.gpu_ops.collective[j0])
    ctype = int(rg.collectives.type[c])
    op = ENGINE_OPS.get(CollType(ctype))
    nb = _nbytes_of(rg, c, ctype)
    if op is None or not math.isfinite(nb):
        return None
    if len(arr) > 1:
        ranks = sorted({r.rg.rank for r, _, _ in arr})
    else:
        gsize = int(rg.collectives.group_size[c])
        g = int(rg.collectives.group[c])
        members = [int(x) for x in rg.groups.ragged("ranks", g)] if g >= 0 else []
        if len(members) < 2:
            members = list(range(max(gsize, 1)))
        ranks = members  # symmetric peers: the other members behave like this rank
    if len(ranks) < 2:
        return None
    if gpu_of is None:
        gpus = [_gpu_of_rank(topo, r, cfg) for r in ranks]
    else:  # the runner's cache: topology.gpus builds its list on every call
        gpus = [gpu_of[r] if r in gpu_of else gpu_of.setdefault(r, _gpu_of_rank(topo, r, cfg)) for r in ranks]
    if op == "send_recv":
        gpus = gpus[:2]
    if ctype == CollType.ALL_TO_ALL and len(arr) == len(ranks) > 1:
        matrix = _split_matrix(arr, ranks)
        if matrix is not None:
            return "all_to_allv", gpus, nb, matrix
    return op, gpus, nb, None


def _fold_replicas(members: list[int], stage: int) -> list[list[int]]:
    """The other groups of a folded synthetic rank's stage that ``members`` stands for: the stage's
    ranks ``[base, base + stage)`` cut into translates of the group's pattern (Megatron's TP, DP, EP
    groups are); [] when the group spans stages or the stage is not such a partition."""
    base = (members[0] // stage) * stage
    pat = sorted(m - base for m in members)
    if pat[0] < 0 or pat[-1] >= stage:
        return []
    covered = np.zeros(stage, dtype=bool)
    covered[pat] = True
    out = []
    for x in np.flatnonzero(~covered).tolist():
        if covered[x]:
            continue
        q = [v - pat[0] + x for v in pat]
        if q[-1] >= stage or covered[q].any():
            return []
        covered[q] = True
        out.append([base + v for v in q])
    return out


def _fabric_blocks(graph: Any) -> bool:
    """True when some fabric switch has less capacity toward other fabric switches than toward its
    hosts (an oversubscribed fat tree). On a non-blocking one, the links equivalent groups of a stage
    share are switch-to-switch links, and with traffic spread over every spine by capacity these
    carry at most what the hosts' own links carry: they never bind, so the groups cannot slow each
    other and folding needs no replicas, provided every GPU has a NIC of its own (checked by the
    caller; docs/SYNTHESIS.md)."""
    kind = graph.nodes

    def cap(d: dict) -> float:
        return float(d.get("bandwidth", 0.0)) * float(d.get("efficiency", 1.0))

    for n, d in graph.nodes(data=True):
        if d.get("kind") != "fabric_switch":
            continue
        up = sum(cap(e) for _, v, e in graph.out_edges(n, data=True) if kind[v].get("kind") == "fabric_switch")
        down = sum(cap(e) for _, v, e in graph.out_edges(n, data=True) if kind[v].get("kind") != "fabric_switch")
        if up > 0 and down > 0 and up < down * (1 - 1e-9):
            return True
    return False


def _collective_runner(sim: Any, topo: Any, cfg: ReplayConfig, notes: list[str], stage: int = 0):
    """Start a collective on the engine's fabric for matched participants. ``stage``: ranks per pipeline
    stage of a folded synthetic graph (0: not folded); a folded rank's collective then also runs the
    equivalent groups of its stage (:func:`_fold_replicas`) so their traffic loads the links."""

    gpu_of: dict[int, str] = {}

    def run(arr: list) -> simpy.Event | None:
        spec = _collective_spec(arr, topo, cfg, gpu_of)
        if spec is None:
            return None
        op, gpus, nb, matrix = spec
        if matrix is not None:
            return sim.collective("all_to_allv", gpus, matrix=matrix, name="all_to_allv")
        r0, j0, _ = arr[0]
        c = int(r0.rg.gpu_ops.collective[j0])
        label = r0.rg.strings[int(r0.rg.collectives.name[c])]
        if label.startswith("deepep_"):  # a synthesized DeepEP dispatch/combine (cosim.workload.synth.infer)
            return _deepep(sim, label, gpus)
        reps: list[list[str]] = []
        if stage and len(arr) == 1 and op != "send_recv":
            g = int(r0.rg.collectives.group[c])
            members = [int(x) for x in r0.rg.groups.ragged("ranks", g)] if g >= 0 else []
            if len(members) == len(gpus):
                reps = [[_gpu_of_rank(topo, r, cfg) for r in rep] for rep in _fold_replicas(sorted(members), stage)]
        return sim.collective(op, gpus, nb, name=f"{op}", replicas=reps)

    return run


def _times(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return b if a is None else (a if b is None else a * b)


def _resource_factor(rg: RankGraph, topology: Any, cfg: ReplayConfig, acc_id: str | None, sms: int | None,
                     notes: list[str] | None) -> np.ndarray | None:
    """Standalone-duration factors of HBM bandwidth / bf16 peak overrides of the replayed accelerator on
    measured durations (cosim.replay.interference); None: none applies. Checks ``comm_sms`` (the SM law runs
    in the simulation: :func:`_gpu_share`)."""
    from cosim.replay.interference import hardware_factor

    out = None
    base, changed = _hbm_parts(topology, cfg, acc_id)
    if base is not None:
        out = hardware_factor(rg, base, changed)
        if out is not None and notes is not None:
            notes.append(f"{acc_id}: kernel durations scaled by the overridden HBM bandwidth "
                         f"({base.hbm_bandwidth / 1e12:.4g} -> {changed.hbm_bandwidth / 1e12:.4g} TB/s) and "
                         f"bf16 peak ({base.peak('bf16') / 1e12:.4g} -> {changed.peak('bf16') / 1e12:.4g} TFLOP/s)")
    if cfg.comm_sms is not None:
        if sms is None:
            raise CosimInputError(f"--set gpu.comm_sms={cfg.comm_sms}: the accelerator's SM count is unknown "
                                  "(give --set traced_accelerator=ID)")
        if cfg.comm_sms >= sms:
            raise CosimInputError(f"--set gpu.comm_sms={cfg.comm_sms}: the GPU has only {sms} SMs")
    return out


def _hbm_parts(topology: Any, cfg: ReplayConfig, acc_id: str | None) -> tuple[Any, Any]:
    """(catalog accelerator, its overridden copy) when catalog overrides apply to measured durations."""
    if acc_id is None or not cfg.catalog_overrides or cfg.durations == "modeled":
        return None, None
    from cosim.catalog import load_catalog

    try:
        return load_catalog().accelerator(acc_id), topology.catalog.accelerator(acc_id)
    except (CosimInputError, AttributeError):
        return None, None


def _gpu_share(env: simpy.Environment, graph: ExecutionGraph, topology: Any, cfg: ReplayConfig,
               acc_id: str | None, sms: int | None, notes: list[str]) -> Any:
    """SM / HBM sharing between communication and compute kernels in the simulation
    (cosim.replay.interference), or None when no what-if changes the law."""
    from cosim.engine import GpuConfig
    from cosim.replay.interference import build_share

    if sms is None:
        return None
    base, changed = _hbm_parts(topology, cfg, acc_id)
    ratio = float(base.hbm_bandwidth) / float(changed.hbm_bandwidth) if base is not None else 1.0
    measured = cfg.durations != "modeled"
    if cfg.comm_sms is None and ratio == 1.0:
        return None
    share = build_share(env, list(graph.ranks), sms, cfg.comm_sms, GpuConfig().comm_hbm_fraction, ratio, measured)
    if share is not None:
        p = next(iter(share.plans.values()))
        notes.append(f"communication kernels hold {p['comm_sms']:g} of {sms} SMs (traced: "
                     f"{p['traced_comm_sms']:g}) and {p['h_comm']:.3g} of HBM bandwidth: compute kernels that "
                     "overlap them in the simulation slow down (docs/ENGINE.md)")
    return share


def _sm_count(topology: Any, accelerator: str | None) -> int | None:
    """SMs of the accelerator the GPU ops run on (the block dispatcher's GPU size); None when unknown."""
    if accelerator is None:
        return None
    try:
        return int(topology.catalog.accelerator(accelerator).sm_count)
    except Exception:  # not in the catalog
        return None


def _simulator(topology: Any, cfg: ReplayConfig, env: simpy.Environment) -> Any:
    """The engine for this replay: the topology's fabric (collectives, copies) on the replay's clock."""
    from cosim.engine import NcclConfig, SimConfig, Simulator

    # a communication kernel of comm_sms SMs runs one channel (thread block) per SM
    nccl = NcclConfig() if cfg.comm_sms is None else NcclConfig(channels=max(cfg.comm_sms, 1))
    return Simulator(topology, SimConfig(record_trace=False, nccl=nccl), env=env)


def _copy_model(sim: Any, graph: ExecutionGraph, programs: list[RankProgram], topology: Any,
                cfg: ReplayConfig) -> CopyModel | None:
    """Host <-> device copies of every rank as fabric flows (cosim.replay.copies); None when there are none."""
    from cosim.engine import GpuConfig

    if not any(((rg.gpu_ops.kind == GpuKind.MEMCPY) & ((rg.gpu_ops.copy_kind == CopyKind.HTOD)
                                                      | (rg.gpu_ops.copy_kind == CopyKind.DTOH))).any()
               for rg in graph.ranks):
        return None
    base_fabric = sim.fabric
    if cfg.catalog_overrides and (topology.source_file or topology.name):
        from cosim.engine import SimConfig, Simulator
        from cosim.topology import load_topology

        base = load_topology(topology.source_file or topology.name)  # the traced hardware: no what-if overrides
        base_fabric = Simulator(base, SimConfig(record_trace=False)).fabric
    ranks = []
    for rg, prog in zip(graph.ranks, programs):
        try:
            gpu = _gpu_of_rank(topology, rg.rank, cfg)
            cpu = topology.cpu_of(gpu)
        except Exception:  # a rank beyond the topology, or a GPU without a CPU: copies keep their durations
            gpu = cpu = None
        ranks.append((rg, prog.gpu_dur, gpu, cpu,
                      copy_engines_of(topology, gpu, cfg.copy_engines, GpuConfig().copy_engines) if gpu else 1))
    return CopyModel(sim.env, sim.fabric, base_fabric.path_capacity, ranks)




def _deepep(sim: Any, label: str, gpus: list[str]) -> simpy.Event:
    """Run ``deepep_<kind>:<mode>:<tokens>:<bytes per token>:<topk>:<experts>`` with
    :func:`cosim.engine.moe_comm.deepep`; the event carries the algorithm/protocol the executor records."""
    from types import SimpleNamespace

    from cosim.engine.moe_comm import token_bytes

    op, mode, tokens, bpt, topk, experts = label.split(":")
    kind = op.removeprefix("deepep_")
    hidden = float(bpt) / (token_bytes(1, kind))  # the width whose DeepEP token carries bpt bytes
    ev = sim.collective(op, gpus, num_tokens=float(tokens), hidden=hidden, num_topk=int(topk),
                        num_experts=int(experts), mode=mode, name=op)
    out = sim.env.event()
    ev.callbacks.append(lambda e: out.succeed(SimpleNamespace(algo="deepep", proto=mode)))
    return out


def _replay_end(now: float, runs: list[RankRun]) -> float:
    """End of the replay (s from the trace origin): the last host or GPU op end, or the engine's clock."""
    end = now
    for run in runs:
        for arr in (run.gpu_end, run.host_end):
            v = arr[np.isfinite(arr)]
            if v.size:
                end = max(end, float(v.max()))
    return end


def _link_usage(ex: Executor, topology: Any, cfg: ReplayConfig, fabric_usage: LinkUsage | None,
                finish_fabric: Any, copies: CopyModel | None = None) -> tuple[LinkUsage | None, dict[str, int]]:
    """Per-link traffic of the finished replay and the ops left off the links (reason -> count).

    Attribution only, no replayed time changes. Simulated collectives: the fabric's recorded
    flows. Measured collectives: the engine's decomposition over the kernel's replayed interval.
    Memcpys (both modes): bytes on the copy's route over its replayed interval (docs/REPLAY.md); with simulated
    collectives the fabric's counters hold the copies' flows too, so their wire bytes are not counted twice."""
    skipped: dict[str, int] = {}
    state: dict[str, Any] = {"usage": fabric_usage, "routes": None}
    if fabric_usage is not None:
        finish_fabric()

    def skip(reason: str, n: int = 1) -> None:
        if n:
            skipped[reason] = skipped.get(reason, 0) + n

    def routes() -> tuple[LinkUsage, EngineRoutes]:
        if state["routes"] is None:
            state["routes"] = EngineRoutes(topology)
            if state["usage"] is None:
                fab = state["routes"].fabric
                state["usage"] = LinkUsage(fab.links, fab.capacity)
        return state["usage"], state["routes"]

    if fabric_usage is None:  # measured collectives: the instances the simulated mode would run, over their kernels
        instances: dict[Any, list] = {}
        singles: list[list] = []
        for r in ex.ranks:
            for j in np.flatnonzero(r.rg.gpu_ops.collective >= 0).tolist():
                key = r.coll_key.get(j)
                if key is None:
                    singles.append([(r, j, r.start[j])])
                else:
                    instances.setdefault(key, []).append((r, j, r.start[j]))
        for arr in [*instances.values(), *singles]:
            t0 = max(float(r.start[j]) for r, j, _ in arr)  # the last participant's start
            t1 = max(float(r.end[j]) for r, j, _ in arr)
            try:
                spec = _collective_spec(arr, topology, cfg) if math.isfinite(t0 + t1) else None
            except CosimInputError:  # its group does not fit the topology
                spec = None
            if spec is None:
                skip("collectives (type, size or GPUs unknown)")
                continue
            usage, rt = routes()
            idx, wire, flows = rt.collective(*spec)
            usage.add(idx, t0, t1, flows, wire, COLLECTIVE)
    for r in ex.ranks:
        G = r.rg.gpu_ops
        mem = G.kind == GpuKind.MEMCPY
        if not mem.any():
            continue
        start, end = np.asarray(r.start, dtype=float), np.asarray(r.end, dtype=float)
        try:
            gpu = _gpu_of_rank(topology, r.rg.rank, cfg)
            cpu = topology.cpu_of(gpu)
        except Exception:  # a rank beyond the topology, or a GPU without a CPU
            gpu = cpu = None
        for kind, pair in ((CopyKind.HTOD, (cpu, gpu)), (CopyKind.DTOH, (gpu, cpu)), (CopyKind.PTOP, None)):
            sel = np.flatnonzero(mem & (G.copy_kind == kind))
            if not sel.size:
                continue
            if pair is None or gpu is None or cpu is None:
                skip("peer copies (the trace names no peer GPU)" if pair is None
                     else "memcpys of ranks with no GPU and CPU on the topology", int(sel.size))
                continue
            nb = G.bytes[sel]
            ok = np.isfinite(nb) & (nb > 0) & np.isfinite(start[sel]) & np.isfinite(end[sel])
            skip("memcpys of unknown size", int((~ok).sum()))
            sel, nb = sel[ok], nb[ok]
            if not sel.size:
                continue
            usage, rt = routes()
            idx, w = rt.transfer(*pair)
            k = idx.size
            usage.add(np.tile(idx, sel.size), np.repeat(start[sel], k), np.repeat(end[sel], k), 1.0,
                      np.outer(nb, w).reshape(-1), MEMCPY)
            if fabric_usage is not None and copies is not None:  # already in the fabric's byte counters
                on_fab = copies.bytes_on_fabric.get(r.rg.rank)
                if on_fab is not None:
                    np.add.at(usage.total_bytes, np.tile(idx, sel.size), -np.outer(on_fab[sel], w).reshape(-1))
    return state["usage"], skipped


def _as_graph(src: ExecutionGraph | str | Path | Sequence[str | Path]) -> tuple[ExecutionGraph, list[str]]:
    if isinstance(src, ExecutionGraph):
        return src, []
    if isinstance(src, (str, Path)):
        return load_trace(src), [str(src)]
    paths = [str(p) for p in src]
    if len(paths) == 1:
        return load_trace(paths[0]), paths
    return load_trace(paths), paths


def replay(workload: ExecutionGraph | str | Path | Sequence[str | Path], topology: Any = None,
           config: ReplayConfig | None = None) -> ReplayResult:
    """Replay ``workload`` (an execution graph or trace path(s)) on ``topology``.

    ``topology`` is a :class:`cosim.topology.Topology`, a preset name or file, or
    None (``config.topology``, else the preset matching the traced GPU).
    """
    from cosim.topology import Topology, load_topology

    cfg = config or ReplayConfig()
    graph, sources = _as_graph(workload)
    if not graph.ranks:
        raise CosimInputError("the workload has no ranks to replay")
    notes: list[str] = list(graph.warnings()) if hasattr(graph, "warnings") else []
    traced = cfg.traced_accelerator or guess_accelerator(graph.ranks[0].device_name)
    if topology is None:
        topology = cfg.topology or default_topology(traced)
    if not isinstance(topology, Topology):
        topology = load_topology(topology, overrides=dict(cfg.catalog_overrides) or None)
    elif cfg.catalog_overrides:
        topology = load_topology(topology.source_file or topology.name, overrides=dict(cfg.catalog_overrides))
    if needs_projection(graph):
        graph = project_onto(graph, topology, cfg.accelerator)
        notes.append("the workload has no GPU ops (a CPU capture or an Execution Trace alone): its ATen ops were "
                     "projected onto the topology's GPU (docs/CAPTURE.md); collectives need --collectives simulated")
    env = simpy.Environment()
    gpu0 = topology.gpus[0]
    try:
        lat_default = float(topology.cpu_spec(topology.cpu_of(gpu0)).launch_latency)
    except Exception:  # a topology without a CPU spec
        lat_default = 5e-6
    target = cfg.accelerator
    if target is not None and traced is None:
        raise CosimInputError(f"--set accelerator={target}: cannot tell which accelerator the trace was captured "
                              f"on (device {graph.ranks[0].device_name!r}); give --set traced_accelerator=ID")
    programs = []
    origins = [float(rg.time_origin) for rg in graph.ranks]
    common = min(origins)
    aligned = len(graph.ranks) > 1 and (max(origins) - common) < 3600.0
    if len(graph.ranks) > 1 and not aligned:
        notes.append("rank clocks differ by more than an hour: ranks start together instead of on the trace clock")
    modeled = None
    kernel_errors = None
    if cfg.durations == "modeled" or cfg.precision:
        from cosim.models import load_profile

        prof = load_profile(cfg.profile) if cfg.profile else None
    if cfg.durations == "modeled":
        from cosim.models.errors import kernel_error_by_class
        from cosim.models.features import extract_features
        from cosim.models.predict import _default_profile, _same_gpu, predict_features

        acc_id = target or traced or topology.graph.nodes[gpu0].get("spec")
        acc = topology.catalog.accelerator(acc_id) if acc_id else topology.accelerator(gpu0)
        used = prof if prof is not None else _default_profile(acc)
        feats = [extract_features(rg) for rg in graph.ranks]
        preds = [predict_features(f, acc, used) for f in feats]
        modeled = [p.dur for p in preds]
        unscored = _unscored_reason(graph, topology, traced, acc)
        kernel_errors = None if unscored else kernel_error_by_class(feats, preds)
        notes.append(f"GPU op durations predicted by the kernel models for {acc.name} "
                     f"({_profile_label(cfg.profile, used, not _same_gpu(used, acc))}); communication kept "
                     "measured or simulated" + (f"; no kernel model error by class: {unscored}" if unscored else ""))
    elif cfg.profile and not cfg.precision:
        notes.append(f"profile {cfg.profile} unused: GPU op durations are the trace's measured ones "
                     "(a profile applies to --durations modeled and to precision what-ifs)")
    precision = None
    if cfg.precision:
        graph, modeled, precision = _apply_precision(graph, cfg, topology, gpu0, traced, target, prof, modeled)
        notes.append(precision.pop("note"))
    sms = _sm_count(topology, target or traced)
    for k, (rg, origin) in enumerate(zip(graph.ranks, origins)):
        scale = target and traced and target != traced and cfg.durations != "modeled"
        factor = cross_accelerator_factor(rg, traced, target) if scale else None
        factor = _times(factor, _resource_factor(rg, topology, cfg, target or traced, sms, notes if k == 0 else None))
        programs.append(compile_rank(rg, cfg, lat_default, factor, offset=(origin - common) if aligned else 0.0,
                                     durations=modeled[k] if modeled is not None else None, sm_count=sms))
    runner = None
    finish_fabric = fabric_usage = None
    sim = _simulator(topology, cfg, env)
    copies = _copy_model(sim, graph, programs, topology, cfg)
    if cfg.collectives == "simulated":
        world = max((rg.world_size for rg in graph.ranks), default=0)
        folded = (graph.ranks and all(rg.source.get("format") == "cosim-synthetic" for rg in graph.ranks)
                  and len(graph.ranks) < world and world % len(graph.ranks) == 0)
        nics = [topology.nic_of(g) for g in topology.gpus] if hasattr(topology, "nic_of") else []
        own_nic = not nics or None in nics or len(set(nics)) == len(nics)
        if folded and own_nic and not _fabric_blocks(topology.graph):
            folded = False  # non-blocking: the equivalent groups cannot slow each other (_fabric_blocks)
        runner = _collective_runner(sim, topology, cfg, notes, world // len(graph.ranks) if folded else 0)
        fabric_usage = LinkUsage(sim.fabric.links, sim.fabric.capacity)
        finish_fabric = record_fabric(sim.fabric, fabric_usage)  # read-only: per-link flows between solves
    share = _gpu_share(env, graph, topology, cfg, target or traced, sms, notes)
    ex = Executor(env, list(zip(graph.ranks, programs)), runner, copies, share)
    runs, wall = ex.run()
    stuck = ex.unresolved()
    if stuck:
        r, j = stuck[0]
        rg = graph.rank(r) if hasattr(graph, "rank") else graph.ranks[0]
        nm = rg.strings[int(rg.gpu_ops.name[j])] if rg.gpu_ops.name[j] >= 0 else "?"
        raise CosimInputError(f"replay could not schedule {len(stuck)} GPU op(s) (first: rank {r}, op {j} {nm!r}): "
                              "cyclic dependencies or collectives whose peers never arrive", file=sources[0] if sources else None)
    fallback = sum(getattr(r, "comm_fallback", 0) for r in ex.ranks)
    if fallback:
        notes.append(f"{fallback} communication ops kept their measured duration (type or size unknown)")
    if target and traced and target != traced and cfg.durations != "modeled":
        notes.append(f"GPU op durations scaled from {traced} to {target} by peak bf16 FLOP/s and HBM bandwidth ratios")
    usage, skipped = _link_usage(ex, topology, cfg, fabric_usage, finish_fabric, copies)
    links = usage.report(_replay_end(env.now, runs)) if usage is not None else []
    if skipped:
        notes.append("link traffic leaves out " + ", ".join(f"{n} {why}" for why, n in skipped.items()))
    res = ReplayResult(graph, cfg, topology, programs, runs, wall, ex.events, sources, notes, links)
    res.link_usage = usage
    res.kernel_errors = kernel_errors
    res.precision = precision
    return res


def _profile_label(named: str | None, used: Any, cross: bool) -> str:
    """How the modeled-durations note names the calibration profile ``used`` (``named``: the config's)."""
    if not cross:
        return f"profile {named}" if named else f"profile {used.name}, bundled for the accelerator"
    if named:
        return f"profile {named}, fitted on {used.accelerator}: predicted cross-GPU"
    return (f"profile {used.name} (none is bundled for this accelerator), fitted on {used.accelerator}: "
            "predicted cross-GPU")


def _unscored_reason(graph: ExecutionGraph, topology: Any, traced: str | None, acc: Any) -> str | None:
    """Why a modeled replay has no ``kernel_error_by_class`` (the trace's GPU durations are not
    measurements of the GPU the models predict), or None when the models can be scored."""
    if any(rg.source.get("projected") for rg in graph.ranks):
        return "the projected GPU op durations are not measurements"
    if traced is None:
        return None
    try:
        traced_acc = topology.catalog.accelerator(traced)
    except CosimInputError:
        return None
    if traced_acc.name != acc.name:
        return f"the trace's kernels were measured on {traced_acc.name}, not on {acc.name}"
    return None


def _apply_precision(graph: ExecutionGraph, cfg: ReplayConfig, topology: Any, gpu0: str, traced: str | None,
                     target: str | None, prof: Any, modeled: list[np.ndarray] | None
                     ) -> tuple[ExecutionGraph, list[np.ndarray], dict[str, Any]]:
    """The precision what-if (``cfg.precision``) on every rank: the rewritten graph, the per-op
    durations that replace the recorded ones (NaN: keep) and the summary's ``precision`` entry.

    Modeled replay: the target accelerator's models. Measured replay: the accelerator the durations
    were measured on (the traced one; a projected graph's own), so that ``accelerator=`` scaling
    afterwards is not applied twice."""
    from cosim.models.precision import apply_precision

    if cfg.durations == "modeled" or not (target and traced and target != traced):
        acc_id = target or traced or topology.graph.nodes[gpu0].get("spec")
    else:
        acc_id = traced
    acc = topology.catalog.accelerator(acc_id) if acc_id else topology.accelerator(gpu0)
    ranks, durs, per_rank = [], [], []
    for k, rg in enumerate(graph.ranks):
        r = apply_precision(rg, acc, prof, experts=cfg.precision.get("experts"), gemm=cfg.precision.get("gemm"),
                            durations=modeled[k] if modeled is not None else None)
        ranks.append(r.graph)
        durs.append(r.durations)
        per_rank.append({"rank": rg.rank, **r.summary()})
    tot = {key: sum(x[key] for x in per_rank) for key in per_rank[0] if key != "rank"} if per_rank else {}
    what = ", ".join(f"{k}={v}" for k, v in sorted(cfg.precision.items()))
    note = (f"precision what-if {what} on {acc.name}: {tot.get('gemm_ops', 0)} GEMM ops "
            f"{tot.get('gemm_time_before_s', 0) * 1e3:.4g} -> {tot.get('gemm_time_after_s', 0) * 1e3:.4g} ms, "
            f"{tot.get('quantize_ops', 0)} quantize kernels added ({tot.get('quantize_time_s', 0) * 1e3:.4g} ms), "
            f"{tot.get('dispatch_collectives', 0)} dispatch all-to-alls at "
            f"{tot.get('dispatch_bytes_after', 0) / max(tot.get('dispatch_bytes_before', 0), 1e-300):.3f}x bytes "
            "(all ranks; docs/MODELS.md)")
    if any(rg.source.get("projected") and '"dtype": "fp8"' in str(rg.source.get("projection")) for rg in graph.ranks):
        note += "; the graph was projected at fp8 already, so GEMMs at one byte per element were left alone"
    return ExecutionGraph(ranks), durs, {**cfg.precision, "ranks": per_rank, **tot, "note": note}
