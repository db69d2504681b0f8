"""Workload synthesis: a training step of a model card on a parallel layout, as an execution graph.

Modules: :mod:`costs` (per-op FLOPs and bytes of one layer), :mod:`infer` (prefill and decode steps), :mod:`layout` (parallel layout
and rank map), :mod:`routing` (expert loads, placement, all-to-all splits), :mod:`schedule`
(1F1B and interleaved 1F1B order), :mod:`memory` (bytes per GPU), :mod:`build` (the execution graph), :mod:`spec`
(the scenario's ``workload: synthetic:`` block and the run's figures). Kernel durations come from a timer
the caller passes in (:mod:`cosim.models.synth_timing`). See docs/SYNTHESIS.md.
"""

from cosim.workload.synth.costs import layer_forward_flops
from cosim.workload.synth.layout import ParallelLayout, RankMap
from cosim.workload.synth.routing import RoutingSpec
from cosim.workload.synth.spec import SyntheticSpec, synthesize, synthetic_figures

__all__ = ["ParallelLayout", "RankMap", "RoutingSpec", "SyntheticSpec", "layer_forward_flops", "synthesize",
           "synthetic_figures"]
