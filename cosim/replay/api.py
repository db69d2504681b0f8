"""``replay()``: run an execution graph on a topology and summarize it.

The orchestrator: it binds the workload to a topology (:mod:`cosim.replay.binding`), runs the
duration pipeline (:mod:`cosim.replay.durations`), compiles each rank (:mod:`cosim.replay.program`),
runs them on the engine (:mod:`cosim.replay.executor`, collectives mapped by
:mod:`cosim.replay.collective_map`, copies by :mod:`cosim.replay.copies`), attributes link traffic
(:mod:`cosim.replay.links`) and leaves the summary to :mod:`cosim.replay.summary`.
"""

from __future__ import annotations

import dataclasses
import gc
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import simpy

from cosim.errors import CosimInputError
from cosim.models.roofline import RooflineModel
from cosim.replay.binding import default_topology, guess_accelerator
from cosim.replay.collective_map import collective_runner, fold_stage, gpu_of_rank
from cosim.replay.config import ReplayConfig
from cosim.replay.copies import CopyModel, copy_engines_of, copy_static
from cosim.replay.durations import gpu_durations, hbm_parts
from cosim.replay.executor import Executor, RankRun
from cosim.replay.links import LinkUsage, rank_static, record_fabric, replay_end, replay_link_usage
from cosim.replay.program import RankProgram, compile_rank
from cosim.replay.summary import SUMMARY_SCHEMA, summarize
from cosim.workload import ExecutionGraph, load_trace
from cosim.workload.graph import CopyKind, RankGraph
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
    with _gc_frozen():
        return _replay(graph, sources, topology, cfg)


@contextmanager
def _gc_frozen() -> Iterator[None]:
    """Keep the cyclic garbage collector off the objects that live before a replay (the loaded graph,
    the topology, imported modules): compiling and running allocate many small objects, and the full
    collections their allocation triggers would walk every live object of the process (10-30% of a
    replay's CPU time on the largest shared traces). Those objects are frozen (:func:`gc.freeze`) for
    the replay, so cycles made during it are still collected; a caller that froze objects itself is
    left alone. On the way out the young generation (what the replay allocated since the last collection,
    ~700 objects at most while the collector runs) is collected before the objects are unfrozen: freezing
    restarts the young generation's count, and a cached job allocates too little to reach it, so without
    this the cycles a replay leaves (simpy's environment, the engine's simulator: ~180 objects a DLRM job)
    would be unfrozen into the oldest generation at the next replay and never collected."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        if gc.isenabled():
            gc.collect(0)
        gc.unfreeze()


def _replay(graph: ExecutionGraph, sources: list[str], topology: Any, cfg: ReplayConfig) -> ReplayResult:
    """:func:`replay` of a loaded graph (the garbage collector paused)."""
    if not graph.ranks:
        raise CosimInputError("the workload has no ranks to replay")
    notes: list[str] = list(graph.warnings()) if hasattr(graph, "warnings") else []
    traced = cfg.traced_accelerator or guess_accelerator(graph.ranks[0].device_name)
    as_written = topology is None or isinstance(topology, (str, Path))
    as_written = as_written and not cfg.catalog_overrides
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
    copies = _copy_model(sim, graph, programs, topology, cfg, as_written)
    runner = finish_fabric = fabric_usage = None
    if cfg.collectives == "simulated":
        runner = collective_runner(sim, topology, cfg, notes, fold_stage(graph, topology))
        fabric_usage = LinkUsage(sim.fabric.links, sim.fabric.capacity)
        finish_fabric = record_fabric(sim.fabric, fabric_usage)  # read-only: per-link flows between solves
    share = _gpu_share(env, graph, topology, cfg, cfg.accelerator or traced, durs.sm_count, notes, sim)
    ex = Executor(env, list(zip(graph.ranks, programs)), runner, copies, share)
    runs, wall = ex.run()
    if copies is not None:
        copies.close()
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
    from cosim.topology import Topology

    if topology is None:
        topology = cfg.topology or default_topology(traced)
    if not isinstance(topology, Topology):
        return _load_topology(topology, dict(cfg.catalog_overrides))
    if cfg.catalog_overrides:
        return _load_topology(topology.source_file or topology.name, dict(cfg.catalog_overrides))
    return topology


_TOPOLOGIES: dict[tuple[str, int, int, str], Any] = {}
"""Topologies loaded by replays in this process (few: :data:`_TOPOLOGIES_KEPT`), by file, its
modification time and size, and the catalog overrides."""
_TOPOLOGIES_KEPT = 8


def _load_topology(name_or_path: Any, overrides: dict[str, Any]) -> Any:
    """:func:`cosim.topology.load_topology`, remembered for the process: replays of one topology (a
    sweep, repeated runs through the Python API) read and build it once, and share its route cache. A
    topology is not changed by a replay (routes are cached on it, nothing else); a file changed on disk
    since is read again."""
    from cosim.topology import find_topology, load_topology

    path = find_topology(name_or_path)
    st = path.stat()
    key = (str(path.resolve()), st.st_mtime_ns, st.st_size, repr(sorted(overrides.items())))
    topo = _TOPOLOGIES.get(key)
    if topo is None:
        topo = load_topology(path, overrides=overrides or None)
        if len(_TOPOLOGIES) >= _TOPOLOGIES_KEPT:
            del _TOPOLOGIES[next(iter(_TOPOLOGIES))]
        _TOPOLOGIES[key] = topo
    return topo


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
               acc_id: str | None, sms: int | None, notes: list[str], sim: Any) -> Any:
    """SM / HBM sharing between communication and compute kernels in the simulation
    (cosim.replay.interference), or None when no what-if changes the law."""
    from cosim.engine import GpuConfig
    from cosim.replay.interference import COMM, build_share

    if sms is None:
        return None
    base, changed = hbm_parts(topology, cfg, acc_id)
    ratio = float(base.hbm_bandwidth) / float(changed.hbm_bandwidth) if base is not None else 1.0
    # graphs whose source says so (synthesized training steps: standalone durations): each communication kernel
    # holds its own SMs (cosim.replay.interference)
    per_kernel = cfg.comm_share and cfg.comm_sms is None and bool(graph.ranks) and all(
        rg.source.get("comm_share") for rg in graph.ranks)
    if cfg.comm_sms is None and ratio == 1.0 and not per_kernel:
        return None
    gpn = topology.gpus_per_node if per_kernel and topology.gpus else None
    share = build_share(env, list(graph.ranks), sms, cfg.comm_sms, GpuConfig().comm_hbm_fraction, ratio,
                        cfg.durations != "modeled" and not per_kernel, nccl=sim.nccl_params if per_kernel else None,
                        channels=sim.config.nccl.channels, gpus_per_node=gpn)
    if share is not None and per_kernel:
        held = np.concatenate([p["op_sms"][p["roles"] == COMM] for p in share.plans.values()])
        notes.append(f"communication kernels hold their own SMs (NCCL channels, DeepEP 20, HybridEP hybridep_sms; "
                     f"median {np.median(held):g}, max {held.max():g} of {sms}; gpu.comm_share=off: none): compute "
                     "kernels that overlap them in the simulation run on the SMs left (docs/ENGINE.md)")
    elif share is not None:
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


_AS_WRITTEN: dict[tuple[str, int], Any] = {}
"""(topology file, its mtime) -> idle route capacity of the file as written (the copies' ``C0``)."""


def _as_written_capacity(topology: Any, idle: Callable[[str, str], float]) -> Callable[[str, str], float]:
    """Idle route capacity on the topology file as written, without catalog overrides or ``topology.<path>``
    knobs (the traced hardware); the topology's own when it has no file (a generated or in-memory one)."""
    from cosim.engine import SimConfig, Simulator
    from cosim.topology import load_topology

    source = getattr(topology, "source_file", None) or getattr(topology, "name", None)
    if not source:
        return idle
    try:
        key = (str(source), os.stat(source).st_mtime_ns if os.path.exists(source) else 0)
        cap = _AS_WRITTEN.get(key)
        if cap is None:
            if len(_AS_WRITTEN) >= 4:
                _AS_WRITTEN.clear()
            cap = _AS_WRITTEN[key] = Simulator(load_topology(source), SimConfig(record_trace=False)).fabric.path_capacity
        return cast(Callable[[str, str], float], cap)
    except (CosimInputError, OSError):  # a generated topology (scaled to N nodes): its own links are C0
        return idle


_IDLE: dict[int, tuple[Any, list[tuple[Any, Callable[[str, str], float]]]]] = {}
"""id(topology) -> (the topology, [(fabric configuration, ``path_capacity`` of a scratch simulator's fabric built
with both)]): a few topologies (:data:`_IDLE_KEPT`), held here (the scratch fabric refers to its topology, so a
weak key would never be freed), the oldest dropped first."""
_IDLE_KEPT = 8


def _idle_capacity(topology: Any, sim: Any) -> Callable[[str, str], float]:
    """``sim.fabric.path_capacity`` (the idle capacity of a route, bytes/s: a function of the topology's links
    and routes and of the fabric's configuration alone) answered by a scratch simulator of the same topology
    and fabric configuration, kept for the last :data:`_IDLE_KEPT` topologies of the process: the replay's own
    fabric then builds a copy route's segment only when a copy runs on it as a flow."""
    from cosim.engine import SimConfig, Simulator

    fab_cfg = sim.config.fabric
    entry = _IDLE.get(id(topology))
    if entry is None or entry[0] is not topology:  # (the entry holds the topology: its id stays unique)
        if len(_IDLE) >= _IDLE_KEPT:
            del _IDLE[next(iter(_IDLE))]
        entry = _IDLE[id(topology)] = (topology, [])
    kept = entry[1]
    for cfg, cap in kept:
        if cfg == fab_cfg:
            return cap
    if len(kept) >= 4:
        kept.clear()
    cap = Simulator(topology, SimConfig(record_trace=False, fabric=dataclasses.replace(fab_cfg))).fabric.path_capacity
    kept.append((dataclasses.replace(fab_cfg), cap))
    return cast(Callable[[str, str], float], cap)


def _copy_model(sim: Any, graph: ExecutionGraph, programs: list[RankProgram], topology: Any,
                cfg: ReplayConfig, as_written: bool = False) -> CopyModel | None:
    """Host <-> device copies of every rank as fabric flows (cosim.replay.copies); None when there are none.
    ``as_written``: the topology is its file as written (loaded here with no what-if), so it is its own ``C0``."""
    from cosim.engine import GpuConfig

    if not any(k in (CopyKind.HTOD, CopyKind.DTOH) for rg, prog in zip(graph.ranks, programs)
               for k, _, _ in rank_static(prog, rg)[2]):  # the ranks' memcpy kinds, kept per program
        return None
    idle = _idle_capacity(topology, sim)
    base_capacity = idle if as_written else _as_written_capacity(topology, idle)
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
    return CopyModel(sim.env, sim.fabric, base_capacity, ranks, capacity=idle,
                     static=[copy_static(prog, rg) for rg, prog in zip(graph.ranks, programs)])


def _as_graph(src: ExecutionGraph | str | Path | Sequence[str | Path]) -> tuple[ExecutionGraph, list[str]]:
    if isinstance(src, ExecutionGraph):
        return src, []
    if isinstance(src, (str, Path)):
        return load_trace(src), [str(src)]
    paths = [str(p) for p in src]
    if len(paths) == 1:
        return load_trace(paths[0]), paths
    return load_trace(paths), paths
