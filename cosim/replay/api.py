"""``replay()``: run an execution graph on a topology and summarize it.

The orchestrator: it binds the workload to a topology (:mod:`cosim.replay.binding`), runs the
duration pipeline (:mod:`cosim.replay.durations`), compiles each rank (:mod:`cosim.replay.program`),
runs them on the engine (:mod:`cosim.replay.executor`, collectives mapped by
:mod:`cosim.replay.collective_map`, copies by :mod:`cosim.replay.copies`), attributes link traffic
(:mod:`cosim.replay.links`) and leaves the summary to :mod:`cosim.replay.summary`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import simpy

from cosim.errors import CosimInputError
from cosim.models.roofline import RooflineModel
from cosim.replay.collective_map import collective_runner, fold_stage, gpu_of_rank
from cosim.replay.config import ReplayConfig
from cosim.replay.copies import CopyModel, copy_engines_of
from cosim.replay.durations import gpu_durations, hbm_parts
from cosim.replay.executor import Executor, RankRun
from cosim.replay.binding import default_topology, guess_accelerator
from cosim.replay.links import LinkUsage, record_fabric, replay_end, replay_link_usage
from cosim.replay.program import RankProgram, compile_rank
from cosim.replay.summary import SUMMARY_SCHEMA, summarize
from cosim.workload import ExecutionGraph, load_trace
from cosim.workload.graph import CopyKind, GpuKind, RankGraph
from cosim.workload.project import needs_projection, project_onto

__all__ = ["SUMMARY_SCHEMA", "ReplayResult", "replay"]


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
            self._summary = summarize(self)
        return self._summary


def replay(workload: ExecutionGraph | str | Path | Sequence[str | Path], topology: Any = None,
           config: ReplayConfig | None = None) -> ReplayResult:
    """Replay ``workload`` (an execution graph or trace path(s)) on ``topology``.

    ``topology`` is a :class:`cosim.topology.Topology`, a preset name or file, or
    None (``config.topology``, else the preset matching the traced GPU).
    """
    cfg = config or ReplayConfig()
    graph, sources = _as_graph(workload)
    if not graph.ranks:
        raise CosimInputError("the workload has no ranks to replay")
    notes: list[str] = list(graph.warnings()) if hasattr(graph, "warnings") else []
    traced = cfg.traced_accelerator or guess_accelerator(graph.ranks[0].device_name)
    topology = _bind_topology(topology, cfg, traced)
    if needs_projection(graph):
        graph = project_onto(graph, topology, cfg.accelerator, kernel_model=RooflineModel)
        notes.append("the workload has no GPU ops (a CPU capture or an Execution Trace alone): its ATen ops were "
                     "projected onto the topology's GPU (docs/CAPTURE.md); collectives need --collectives simulated")
    gpu0 = topology.gpus[0]
    if cfg.accelerator is not None and traced is None:
        raise CosimInputError(f"--set accelerator={cfg.accelerator}: cannot tell which accelerator the trace was "
                              f"captured on (device {graph.ranks[0].device_name!r}); give --set traced_accelerator=ID")
    offsets = _rank_offsets(graph, notes)
    durs = gpu_durations(graph, topology, cfg, traced, gpu0, notes)
    graph = durs.graph
    lat_default = _default_launch_latency(topology, gpu0)
    programs = [compile_rank(rg, cfg, lat_default, d, offset=o, sm_count=durs.sm_count)
                for rg, d, o in zip(graph.ranks, durs.per_rank, offsets)]
    env = simpy.Environment()
    sim = _simulator(topology, cfg, env)
    copies = _copy_model(sim, graph, programs, topology, cfg)
    runner = finish_fabric = fabric_usage = None
    if cfg.collectives == "simulated":
        runner = collective_runner(sim, topology, cfg, notes, fold_stage(graph, topology))
        fabric_usage = LinkUsage(sim.fabric.links, sim.fabric.capacity)
        finish_fabric = record_fabric(sim.fabric, fabric_usage)  # read-only: per-link flows between solves
    share = _gpu_share(env, graph, topology, cfg, cfg.accelerator or traced, durs.sm_count, notes)
    ex = Executor(env, list(zip(graph.ranks, programs)), runner, copies, share)
    runs, wall = ex.run()
    _check_scheduled(ex, graph, sources)
    fallback = sum(getattr(r, "comm_fallback", 0) for r in ex.ranks)
    if fallback:
        notes.append(f"{fallback} communication ops kept their measured duration (type or size unknown)")
    if cfg.accelerator and traced and cfg.accelerator != traced and cfg.durations != "modeled":
        notes.append(f"GPU op durations scaled from {traced} to {cfg.accelerator} by peak bf16 FLOP/s and HBM "
                     "bandwidth ratios")
    usage, skipped = replay_link_usage(ex, topology, cfg, fabric_usage, finish_fabric, copies)
    links = usage.report(replay_end(env.now, runs)) if usage is not None else []
    if skipped:
        notes.append("link traffic leaves out " + ", ".join(f"{n} {why}" for why, n in skipped.items()))
    res = ReplayResult(graph, cfg, topology, programs, runs, wall, ex.events, sources, notes, links)
    res.link_usage = usage
    res.kernel_errors = durs.kernel_errors
    res.precision = durs.precision
    return res


def _bind_topology(topology: Any, cfg: ReplayConfig, traced: str | None) -> Any:
    """The topology to replay on (a :class:`cosim.topology.Topology`, a preset name or file, or None:
    ``cfg.topology``, else the preset of the traced accelerator), with the config's catalog overrides."""
    from cosim.topology import Topology, load_topology

    if topology is None:
        topology = cfg.topology or default_topology(traced)
    if not isinstance(topology, Topology):
        return load_topology(topology, overrides=dict(cfg.catalog_overrides) or None)
    if cfg.catalog_overrides:
        return load_topology(topology.source_file or topology.name, overrides=dict(cfg.catalog_overrides))
    return topology


def _rank_offsets(graph: ExecutionGraph, notes: list[str]) -> list[float]:
    """Each rank's time origin on the replay's common clock (s): its recorded origin minus the earliest,
    or 0 for every rank when the clocks differ by more than an hour (noted)."""
    origins = [float(rg.time_origin) for rg in graph.ranks]
    common = min(origins)
    aligned = len(graph.ranks) > 1 and (max(origins) - common) < 3600.0
    if len(graph.ranks) > 1 and not aligned:
        notes.append("rank clocks differ by more than an hour: ranks start together instead of on the trace clock")
    return [(o - common) if aligned else 0.0 for o in origins]


def _default_launch_latency(topology: Any, gpu0: str) -> float:
    """Launch-to-start latency of the topology's host CPU (s; 5 us without a CPU spec)."""
    try:
        return float(topology.cpu_spec(topology.cpu_of(gpu0)).launch_latency)
    except Exception:  # a topology without a CPU spec
        return 5e-6


def _check_scheduled(ex: Executor, graph: ExecutionGraph, sources: list[str]) -> None:
    """Raise when the run left GPU ops unscheduled (cyclic dependencies, peers that never arrive)."""
    stuck = ex.unresolved()
    if not stuck:
        return
    r, j = stuck[0]
    rg = graph.rank(r) if hasattr(graph, "rank") else graph.ranks[0]
    nm = rg.strings[int(rg.gpu_ops.name[j])] if rg.gpu_ops.name[j] >= 0 else "?"
    raise CosimInputError(f"replay could not schedule {len(stuck)} GPU op(s) (first: rank {r}, op {j} {nm!r}): "
                          "cyclic dependencies or collectives whose peers never arrive",
                          file=sources[0] if sources else None)


def _gpu_share(env: simpy.Environment, graph: ExecutionGraph, topology: Any, cfg: ReplayConfig,
               acc_id: str | None, sms: int | None, notes: list[str]) -> Any:
    """SM / HBM sharing between communication and compute kernels in the simulation
    (cosim.replay.interference), or None when no what-if changes the law."""
    from cosim.engine import GpuConfig
    from cosim.replay.interference import build_share

    if sms is None:
        return None
    base, changed = hbm_parts(topology, cfg, acc_id)
    ratio = float(base.hbm_bandwidth) / float(changed.hbm_bandwidth) if base is not None else 1.0
    if cfg.comm_sms is None and ratio == 1.0:
        return None
    share = build_share(env, list(graph.ranks), sms, cfg.comm_sms, GpuConfig().comm_hbm_fraction, ratio,
                        cfg.durations != "modeled")
    if share is not None:
        p = next(iter(share.plans.values()))
        notes.append(f"communication kernels hold {p['comm_sms']:g} of {sms} SMs (traced: "
                     f"{p['traced_comm_sms']:g}) and {p['h_comm']:.3g} of HBM bandwidth: compute kernels that "
                     "overlap them in the simulation slow down (docs/ENGINE.md)")
    return share


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
    ranks: list[tuple[RankGraph, list[float], str | None, str | None, int]] = []
    for rg, prog in zip(graph.ranks, programs):
        gpu: str | None
        cpu: str | None
        try:
            gpu = gpu_of_rank(topology, rg.rank, cfg)
            cpu = topology.cpu_of(gpu)
        except Exception:  # a rank beyond the topology, or a GPU without a CPU: copies keep their durations
            gpu = cpu = None
        ranks.append((rg, prog.gpu_dur, gpu, cpu,
                      copy_engines_of(topology, gpu, cfg.copy_engines, GpuConfig().copy_engines) if gpu else 1))
    return CopyModel(sim.env, sim.fabric, base_fabric.path_capacity, ranks)


def _as_graph(src: ExecutionGraph | str | Path | Sequence[str | Path]) -> tuple[ExecutionGraph, list[str]]:
    if isinstance(src, ExecutionGraph):
        return src, []
    if isinstance(src, (str, Path)):
        return load_trace(src), [str(src)]
    paths = [str(p) for p in src]
    if len(paths) == 1:
        return load_trace(paths[0]), paths
    return load_trace(paths), paths
