"""The duration pipeline: every GPU op's replayed duration, per rank, in one place.

Measured durations (the trace's), replaced by the kernel models' predictions (``durations=modeled``),
then by the precision what-if's rewritten GEMMs (``precision``), then scaled per class
(``gpu.scale.*``), and last multiplied by the hardware factors on measured durations: cross-accelerator
scaling (``accelerator=`` another part than the traced one) times the shared-resource what-ifs
(overridden HBM bandwidth / bf16 peak, ``comm_sms``: :mod:`cosim.replay.interference`). Seconds per op;
NaN never leaves (an op without a duration replays in 0 s). :func:`cosim.replay.program.compile_rank`
takes the result as is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cosim.errors import CosimInputError
from cosim.replay.binding import cross_accelerator_factor
from cosim.replay.config import OP_CLASSES, ReplayConfig
from cosim.workload import ExecutionGraph
from cosim.workload.graph import RankGraph

__all__ = ["GpuDurations", "class_scale", "gpu_durations", "rank_durations", "resource_factor", "sm_count"]


@dataclass
class GpuDurations:
    """What the duration pipeline produced for a replay."""

    graph: ExecutionGraph
    """The graph to replay (the precision what-if rewrites it; else the input)."""
    per_rank: list[np.ndarray]
    """Per rank (in ``graph.ranks`` order), every GPU op's replayed duration (s)."""
    sm_count: int | None
    """SMs of the accelerator the GPU ops run on (None: unknown)."""
    kernel_errors: dict[str, Any] | None = None
    """Modeled replay: per-class error of the kernel models against the measured durations."""
    precision: dict[str, Any] | None = None
    """Precision what-if: what it changed (summary field ``precision``)."""
    notes: list[str] = field(default_factory=list)


def gpu_durations(graph: ExecutionGraph, topology: Any, cfg: ReplayConfig, traced: str | None,
                  gpu0: str, notes: list[str]) -> GpuDurations:
    """Run the duration pipeline (module docstring) on every rank of ``graph`` replayed on ``topology``
    (``gpu0``: its first GPU; ``traced``: the accelerator the trace was captured on, None if unknown).
    What each stage did is appended to ``notes``."""
    target = cfg.accelerator
    modeled: list[np.ndarray] | None = None
    kernel_errors = None
    prof = None
    if cfg.durations == "modeled" or cfg.precision:
        from cosim.models import load_profile

        prof = load_profile(cfg.profile) if cfg.profile else None
    if cfg.durations == "modeled":
        modeled, kernel_errors = _modeled(graph, topology, cfg, traced, gpu0, prof, notes)
    elif cfg.profile and not cfg.precision:
        notes.append(f"profile {cfg.profile} unused: GPU op durations are the trace's measured ones "
                     "(a profile applies to --durations modeled and to precision what-ifs)")
    precision = None
    if cfg.precision:
        graph, modeled, precision = apply_precision_whatif(graph, cfg, topology, gpu0, traced, target, prof, modeled)
        notes.append(precision.pop("note"))
    sms = sm_count(topology, target or traced)
    scale = bool(target and traced and target != traced and cfg.durations != "modeled")
    per_rank = []
    parts = hbm_parts(topology, cfg, target or traced)  # the same for every rank: looked up once
    for k, rg in enumerate(graph.ranks):
        factor = cross_accelerator_factor(rg, traced, target) if scale and traced and target else None
        factor = times(factor, resource_factor(rg, topology, cfg, target or traced, sms, notes if k == 0 else None,
                                               parts))
        per_rank.append(rank_durations(rg, cfg, modeled[k] if modeled is not None else None, factor))
    return GpuDurations(graph, per_rank, sms, kernel_errors, precision)


def rank_durations(rg: RankGraph, cfg: ReplayConfig, modeled: np.ndarray | None,
                   factor: np.ndarray | None) -> np.ndarray:
    """One rank's GPU op durations (s): measured, replaced by ``modeled`` where finite, NaN -> 0, times
    the ``gpu.scale`` class factors, times ``factor`` (hardware factors on measured durations)."""
    G = rg.gpu_ops
    dur = G.dur.astype(float)
    if modeled is not None:
        dur = np.where(np.isfinite(modeled), modeled, dur)
    if not np.isfinite(dur).all():  # nan_to_num's Python wrapper only where it changes something (~8 us a rank)
        dur = np.nan_to_num(dur, nan=0.0)
    if cfg.gpu_scale:  # without it every factor is 1.0, and x * 1.0 is x
        dur = dur * class_scale(cfg, G.cls)
    if factor is not None:
        dur = dur * factor
    return dur


def class_scale(cfg: ReplayConfig, cls: np.ndarray) -> np.ndarray:
    """Per-op duration factor from ``cfg.gpu_scale``."""
    f = np.ones(cls.shape[0])
    if not cfg.gpu_scale:
        return f
    allf = cfg.gpu_scale.get("all", 1.0)
    for k, name in enumerate(OP_CLASSES):
        f[cls == k] = cfg.gpu_scale.get(name, 1.0) * allf
    return f


def _modeled(graph: ExecutionGraph, topology: Any, cfg: ReplayConfig, traced: str | None, gpu0: str, prof: Any,
             notes: list[str]) -> tuple[list[np.ndarray], dict[str, Any] | None]:
    """Kernel-model durations of every rank (``durations=modeled``) and their error by class against
    the measured ones (None when those are not measurements of the predicted GPU)."""
    from cosim.models.accuracy import kernel_error_by_class
    from cosim.models.features import extract_features
    from cosim.models.predict import _default_profile, _same_gpu, predict_features

    acc_id = cfg.accelerator or traced or topology.graph.nodes[gpu0].get("spec")
    acc = topology.catalog.accelerator(acc_id) if acc_id else topology.accelerator(gpu0)
    used = prof if prof is not None else _default_profile(acc)
    feats = [extract_features(rg) for rg in graph.ranks]
    preds = [predict_features(f, acc, used) for f in feats]
    unscored = _unscored_reason(graph, topology, traced, acc)
    kernel_errors = None if unscored else kernel_error_by_class(feats, preds)
    notes.append(f"GPU op durations predicted by the kernel models for {acc.name} "
                 f"({_profile_label(cfg.profile, used, not _same_gpu(used, acc))}); communication kept "
                 "measured or simulated" + (f"; no kernel model error by class: {unscored}" if unscored else ""))
    return [p.dur for p in preds], kernel_errors


def times(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    return b if a is None else (a if b is None else a * b)


def resource_factor(rg: RankGraph, topology: Any, cfg: ReplayConfig, acc_id: str | None, sms: int | None,
                    notes: list[str] | None, parts: tuple[Any, Any] | None = None) -> np.ndarray | None:
    """Standalone-duration factors of HBM bandwidth / bf16 peak overrides of the replayed accelerator on
    measured durations (cosim.replay.interference); None: none applies. Checks ``comm_sms`` (the SM law runs
    in the simulation: :func:`cosim.replay.api` builds the GPU share). ``parts``: :func:`hbm_parts` of
    ``topology``, ``cfg`` and ``acc_id`` when the caller has them."""
    from cosim.replay.interference import hardware_factor

    out = None
    base, changed = hbm_parts(topology, cfg, acc_id) if parts is None else parts
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


def hbm_parts(topology: Any, cfg: ReplayConfig, acc_id: str | None) -> tuple[Any, Any]:
    """(catalog accelerator, the topology's copy of it) for measured durations: they differ where a what-if
    overrides the accelerator (``cfg.catalog_overrides``, or overrides already built into ``topology`` as
    scenarios and ``topology.<path>`` knobs do)."""
    if acc_id is None or cfg.durations == "modeled":
        return None, None
    from cosim.catalog import load_catalog

    try:
        return load_catalog().accelerator(acc_id), topology.catalog.accelerator(acc_id)
    except (CosimInputError, AttributeError):
        return None, None


def sm_count(topology: Any, accelerator: str | None) -> int | None:
    """SMs of the accelerator the GPU ops run on (the block dispatcher's GPU size); None when unknown."""
    if accelerator is None:
        return None
    try:
        return int(topology.catalog.accelerator(accelerator).sm_count)
    except Exception:  # not in the catalog
        return None


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


def apply_precision_whatif(graph: ExecutionGraph, cfg: ReplayConfig, topology: Any, gpu0: str, traced: str | None,
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
