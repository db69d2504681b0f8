"""Score cosim's synthesized training steps against published end-to-end training throughput.

``python -m validation.e2e.run [--only ID] [--json] [--write]`` builds, for each row of
``training.yaml``, the synthetic scenario of that run (model card, the system preset scaled to the
run's GPU count, parallel layout, batch, precision, uniform routing), runs it through
:func:`cosim.scenario.run_scenario` and prints cosim's tokens/s/GPU and model TFLOP/s/GPU beside the
published figure. ``--write`` regenerates RESULTS.md. Nothing is fitted to these rows.

Long steps (hundreds of micro-batches per pipeline) are simulated at two smaller micro-batch counts
``m_a < m_b`` (both in the steady-state regime of the schedule, ``m >= pp``) and the step time is
extrapolated linearly to the run's count: a 1F1B / interleaved step is warm-up + ``m`` steady
micro-batches + cool-down + the optimizer, so ``T(m) = T(m_b) + (m - m_b) (T(m_b) - T(m_a)) / (m_b - m_a)``
(``--full`` simulates the real count instead; the test checks the extrapolation against a full run).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from cosim.capture.config import MAX_LAYERS
from cosim.catalog.models import Strict
from cosim.errors import CosimInputError
from cosim.yamlio import describe_validation_error

HERE = Path(__file__).resolve().parent
CASES = HERE / "training.yaml"
TARGET_MEDIAN, TARGET_MAX = 0.10, 0.20
MAX_SIMULATED_GPUS = 512
"""Rows on more GPUs are not run today (see ``NOT_RUN_REASON``)."""
PROBE_MAX_GPUS = 1024
"""``--probe-big`` probes rows up to this many GPUs (not DualPipe, which needs 2 pp micro-batches)."""
NOT_RUN_REASON = ("more than 512 GPUs: even coalesced, the full step takes minutes of CPU on 2 cores (1024 GPUs at "
                  "global batch 8192: ~200 CPU s, benchmarks/README.md); run it with --max-gpus 1024 --full")


class Layout(Strict):
    """Parallel layout as Megatron-Core names it; dp follows from the GPU count."""

    tp: int = Field(gt=0)
    pp: int = Field(gt=0)
    vpp: int = Field(default=1, gt=0, le=MAX_LAYERS)  # a model chunk holds at least one layer
    cp: int = Field(default=1, gt=0)
    ep: int = Field(default=1, gt=0)


class Batch(Strict):
    """Global batch and micro-batch (sequences), sequence length (tokens)."""

    global_: int = Field(alias="global", gt=0)
    micro: int = Field(gt=0)
    seq: int = Field(gt=0)


class Measured(Strict):
    """The published figures of the run: tokens/s/GPU, model TFLOP/s/GPU, or both. A row is scored on its
    tokens/s/GPU; on its model TFLOP/s/GPU (against cosim's own model FLOP count) when the source gives only that."""

    tokens_per_s_per_gpu: float | None = Field(default=None, gt=0)
    model_tflops_per_gpu: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_figure(self) -> Measured:
        if self.tokens_per_s_per_gpu is None and self.model_tflops_per_gpu is None:
            raise ValueError("give tokens_per_s_per_gpu or model_tflops_per_gpu")
        return self


class Source(Strict):
    """Where the published figure is: a key of ``sources``, the table and the row."""

    ref: str
    table: str
    row: str | None = None
    note: str | None = None


class Case(Strict):
    """One published training run (see the field meanings at the top of training.yaml)."""

    id: str
    model: str
    system: str
    gpus: int = Field(gt=0)
    layout: Layout
    schedule: Literal["1f1b", "interleaved", "dualpipe"] | None = None
    fsdp: bool = False
    batch: Batch
    precision: Literal["bf16", "fp8", "mxfp8"]
    measured: Measured
    source: Source
    pipeline_layers: list[int] | None = None
    """Layers per model chunk as the run's config gives them (Megatron-Bridge ``pp_layout``); absent: the rule of
    :func:`pipeline_layers`."""
    pipeline_model_parallel_layout: str | None = None
    """The run's Megatron-Core ``pipeline_model_parallel_layout`` (Megatron-Bridge ``pp_layout``, or the recipe's
    ``layout_map`` list written as its string): the layout field of that name (layers per chunk and the MTP's chunk);
    excludes ``pipeline_layers``."""
    tp_comm_overlap: bool = False
    """The run overlaps TP collectives with GEMMs (Megatron-Bridge ``tp_comm_overlap``, TE userbuffers)."""
    a2a_overlap: bool = False
    """The run overlaps EP all-to-alls with another micro-batch's compute (Megatron-Bridge ``moe_a2a_overlap``)."""
    dispatch: Literal["nccl", "deepep", "hybridep"] = "nccl"
    """The run's MoE token dispatcher: ``nccl`` (Megatron-Core's alltoall dispatcher), ``deepep`` (its flex
    dispatcher with the DeepEP backend, ``moe_enable_deepep``) or ``hybridep`` (the flex dispatcher with HybridEP,
    ``moe_flex_dispatcher_backend: hybridep``): the synthetic spec's ``dispatch``."""
    hybridep_sms: int | None = Field(default=None, gt=0)
    """SMs of the run's HybridEP kernels (Megatron-Core ``moe_hybridep_num_sms``; Megatron-Bridge's performance
    harness sets 32): the synthetic spec's ``hybridep_sms`` (which measured rate table times them); None: 16."""
    cuda_graph_scope: list[str] | None = None
    """CUDA graphs of the run's config: Transformer Engine partial graphs (``cuda_graph_impl: transformer_engine``,
    ``cuda_graph_scope``) or ``[full_iteration]`` (``cuda_graph_impl: full_iteration``): the synthetic spec's
    ``cuda_graph_scope``, whose names it takes (:data:`cosim.workload.synth.spec.CUDA_GRAPH_SCOPES`); absent: eager."""
    mtp_layers: int | None = Field(default=None, ge=0)
    """Multi-token-prediction depths the run trains (the synthetic spec's ``mtp_layers``); None: the card's."""
    optimizer: Literal["adam", "muon"] = "adam"
    """The run's optimizer (the synthetic spec's ``optimizer``; Megatron-Bridge's ``dist_muon``: ``muon`` with the
    distributed optimizer's ``zero: 1`` layout and ``overlap_param_gather: false``)."""
    optimizer_moments: Literal["fp32", "bf16"] = "fp32"
    """Memory only: the run's Adam moment dtype (the synthetic spec's ``optimizer_moments``)."""
    moe_act_input_fp8: bool = False
    """Memory only: the run keeps the experts' SwiGLU input in FP8 (the synthetic spec's ``moe_act_input_fp8``)."""
    dispatch_precision: Literal["bf16", "fp8"] | None = None
    """Element type of the run's dispatched tokens (the synthetic spec's ``dispatch_precision``); None: bf16, as
    Megatron-Core dispatches."""
    comm_sms: int | None = None
    """SMs the run's communication kernels hold while compute overlaps them (the replay's ``gpu.comm_sms``: compute
    kernels then run at (SMs - comm_sms) / SMs of their speed), from the run's config (Megatron-Core
    ``moe_deepep_num_sms``); None: the replay's default (no sharing)."""
    recompute_modules: list[str] | None = None
    """Megatron-Core selective recomputation of the run's config (``recompute_modules``); absent: none."""
    offload_modules: list[str] | None = None
    """Megatron-Core fine-grained activation offloading of the run's config (``--fine-grained-activation-offloading
    --offload-modules``): the synthetic spec's ``offload_modules``; absent: none."""
    recompute: Literal["full"] | None = None
    """The run recomputes every layer's forward before its backward (Megatron-Core ``recompute_granularity: full``,
    PyTorch per-layer activation checkpointing); absent: the runner's ``--recompute`` (default none)."""
    recompute_early_stop: bool = False
    """With ``recompute: full``: the run checkpoints with PyTorch's non-reentrant ``torch.utils.checkpoint``
    (FSDP2 ``checkpoint_wrapper``), whose early stop skips each layer's trailing combine and residual add."""
    fp8_recipe: Literal["blockwise", "current"] | None = None
    """FP8 scaling of the run (``workload.synthetic.fp8_recipe``; Megatron-Bridge ``fp8_cs``: current); absent: the default."""
    expert_padding: bool = True
    """The run's grouped MLP pads expert rows by copies (the synthetic spec's ``expert_padding``); false for a
    HybridEP dispatcher, which delivers the rows aligned (Megatron-Core ``hybrid_ep_dispatch(pad_multiple)``)."""
    grad_reduce_in_fp32: bool = False
    """The run reduces gradients in fp32 (the synthetic spec's ``grad_reduce_in_fp32``): Megatron-LM's own
    launcher (``pretrain_gpt.py``) in bf16 training without ``--grad-reduce-in-bf16``; false for the Megatron-Bridge
    and NeMo configs (``grad_reduce_in_fp32 = False``)."""
    cross_entropy_fusion: bool = True
    """The run fuses its cross-entropy loss (Megatron-Core ``cross_entropy_loss_fusion``, the Megatron-Bridge configs'
    setting): the synthetic spec's ``cross_entropy_fusion``; false for a Megatron-LM launch without
    ``--cross-entropy-loss-fusion`` (Megatron-Core's unfused loss)."""
    moe_router_fusion: bool = True
    """The run fuses its router's score function and top-k (Megatron-Core ``moe_router_fusion``): the synthetic
    spec's ``moe_router_fusion``; false for a Megatron-LM launch without ``--moe-router-fusion`` (or of a commit
    before the flag, c08d89be: Megatron-Core's unfused routing kernels)."""
    grad_accumulation_fusion: bool = True
    """The run fuses the weight-gradient accumulation into the wgrad GEMM (Megatron-Core
    ``gradient_accumulation_fusion``, on by default): the synthetic spec's ``grad_accumulation_fusion``; false for a
    launch with ``--no-gradient-accumulation-fusion``."""
    overlap_grad_reduce: bool | None = None
    """The run's Megatron-Core ``overlap_grad_reduce`` (the layout field): gradient buckets reduced under the
    backward; false: after it, one bucket per chunk and buffer. None: the layout's default (training.yaml: the FSDP
    rows, where it does not apply; every other row sets it, tests/test_synth_overlap.py checks)."""
    overlap_param_gather: bool | None = None
    """The run's Megatron-Core ``overlap_param_gather`` (the layout field): the distributed optimizer's parameter
    all-gathers under the next step's forward; false: after Adam. None: the layout's default (FSDP rows)."""
    fsdp_reshard_after_forward: bool | None = None
    """FSDP rows: the run's FSDP2 ``reshard_after_forward`` (the layout field); None: the layout's default (true: the
    backward gathers again)."""
    fsdp_reshard_after_backward: bool | None = None
    """FSDP rows: false when the run keeps the gathered parameters across its micro-batches (AutoModel's
    ``enable_fsdp_optimizations``); None: the layout's default (true)."""
    bucket_size: float | None = None
    """Parameters per gradient bucket of the run (Megatron-Core ``DistributedDataParallelConfig.bucket_size``, the
    layout's ``grad_bucket_params``); None: :func:`ddp_bucket_size` by the row's framework."""
    gradient_accumulation_steps: int = Field(default=1, gt=0)
    """Pipeline schedules per optimizer step of the run (NeMo AutoModel's GA: ``global / (dp x local_batch_size)``;
    the synthetic batch's ``gradient_accumulation_steps``); 1: one schedule of all the step's micro-batches."""
    config: str | None = None
    """Where the run's parallel settings beyond the table (pp_layout, moe_a2a_overlap) come from."""
    bound: bool = False
    """The published figure is a lower bound (a run average), not a steady-state step: not scored."""
    unscored: str | None = None
    """Why the row is run but not scored: the run used a feature cosim does not model (the reason names it)."""

    @field_validator("cuda_graph_scope")
    @classmethod
    def _known_scopes(cls, v: list[str] | None) -> list[str] | None:
        """Refuse a scope the synthetic spec does not model (:data:`cosim.workload.synth.spec.CUDA_GRAPH_SCOPES`)."""
        from cosim.workload.synth.spec import CUDA_GRAPH_SCOPES as known  # lazy: --help without loading synthesis

        bad = [x for x in v or () if x not in known]
        if bad:
            raise ValueError(f"unknown scope {bad[0]!r} (the synthetic spec's: {', '.join(known)})")
        return v

    @model_validator(mode="after")
    def _one_recompute(self) -> Case:
        if self.recompute == "full" and self.recompute_modules:
            raise ValueError("recompute: full and recompute_modules exclude each other (full recomputes every module)")
        if self.recompute_early_stop and self.recompute != "full":
            raise ValueError("recompute_early_stop needs recompute: full (it was silently ignored)")
        if self.pipeline_layers is not None and self.pipeline_model_parallel_layout is not None:
            raise ValueError("pipeline_layers and pipeline_model_parallel_layout exclude each other")
        return self

    @model_validator(mode="after")
    def _layout_fits(self) -> Case:
        """The data-parallel size the runner derives is whole (it divided by zero when tp x pp x cp > gpus)."""
        width = self.layout.tp * self.layout.pp * self.layout.cp
        if self.gpus % width:
            raise ValueError(f"layout: tp x pp x cp = {width} does not divide gpus {self.gpus}")
        return self


class CaseFile(Strict):
    """training.yaml: sources by key, and the cases."""

    sources: dict[str, str]
    cases: list[Case]


def load_cases(path: Path = CASES) -> tuple[dict[str, str], list[Case]]:
    """The sources and cases of ``path``; a case citing an unknown source is a one-line error."""
    from cosim.yamlio import input_error_at, load_yaml, validate

    data = load_yaml(path)
    doc = validate(CaseFile, data, file=path)
    for i, c in enumerate(doc.cases):
        at = ("cases", i, "source", "ref")  # the error names the file's line of that ref
        if c.source.ref not in doc.sources:
            raise input_error_at(data, at, f"{c.source.ref!r} is not a key of sources", file=path)
        if c.source.ref not in BRIDGE_REFS + OTHER_REFS:
            raise input_error_at(data, at, f"{c.source.ref!r} names no framework (add it to run.py's BRIDGE_REFS "
                                 "or OTHER_REFS: it decides the gradient bucket size)", file=path)
    return dict(doc.sources), list(doc.cases)


def pipeline_layers(layers: int, chunks: int, mtp: int = 0) -> list[int] | None:
    """Layers per model chunk when ``layers`` do not divide evenly: every chunk gets ceil(layers/chunks) and
    the chunks that also carry the loss (last) and the embedding (first), then the next ones inward, give
    one layer back each (Megatron's account-for-embedding/loss rule, generalized). None when even. ``mtp``
    multi-token-prediction depths count as layers of the last chunk (they run there: Megatron-Bridge's DeepSeek-V3
    layouts give that chunk fewer decoder layers, e.g. ``t + mtp + loss`` for pp 16)."""
    if layers % chunks == 0:
        return None
    if mtp:
        counts = pipeline_layers(layers + mtp, chunks) or [(layers + mtp) // chunks] * chunks
        if counts[-1] >= mtp:
            counts[-1] -= mtp
            return counts
    base = -(-layers // chunks)
    counts = [base] * chunks
    order = [i for k in range(chunks) for i in ((chunks - 1 - k), k)]
    seen: list[int] = []
    for i in order:
        if i not in seen:
            seen.append(i)
    for i in seen[:base * chunks - layers]:
        counts[i] -= 1
    return counts


GB200_TRAYS_PER_RACK_IN_JOB = 16
"""Compute trays of an NVL72 rack a multi-rack job uses: 16 of its 18 (64 GPUs), the other two spare, as NVIDIA's
multi-rack GB200 runs are laid out (MLPerf Training v5.0: 2,496 GPUs = 39 racks x 64)."""


def _gb200(gpus: int, folder: Path, family: str = "gb200") -> str:
    """GB200 (or, ``family="gb300"``, GB300) NVL72 racks cut to ``gpus`` GPUs (gpus / 4 compute trays), as a file:
    up to 72 GPUs the ``<family>-nvl72`` rack (one NVLink domain); beyond it ``<family>-nvl72-4rack``'s racks, each
    contributing :data:`GB200_TRAYS_PER_RACK_IN_JOB` trays (tray n in rack n // 16), joined by its rail-optimized
    compute fabric: :func:`cosim.scenario.scaled_racks`, the rule ``nodes:`` scales the NVL72 presets by (18 trays
    per rack there)."""
    import yaml

    from cosim.scenario import scaled_racks
    from cosim.topology import find_topology

    if gpus % 4:
        raise _NotRun(f"{gpus} GPUs is not a whole number of 4-GPU {family.upper()} compute trays")
    preset = f"{family}-nvl72" if gpus <= 72 else f"{family}-nvl72-4rack"
    doc = scaled_racks(yaml.safe_load(find_topology(preset).read_text(encoding="utf-8")), gpus // 4,
                       GB200_TRAYS_PER_RACK_IN_JOB, where=preset)
    doc["name"] = f"{family}-nvl72-{gpus}gpu"
    out = folder / f"{family}-nvl72-{gpus}gpu.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    return str(out)


class _NotRun(Exception):
    """A row cosim cannot run today (the reason is the message)."""


@functools.cache
def gpus_per_node(system: str) -> int:
    """GPUs of one host node of topology preset ``system`` (its first GPU's node), the unit ``nodes:`` scales the
    preset by (:func:`cosim.scenario.scaled_document`): the preset's own
    (:attr:`cosim.topology.Topology.gpus_per_node`), so a new one needs no table here.

    Raises:
        CosimInputError: ``system`` is no preset, or has no GPU.
    """
    from cosim.topology import load_topology

    per = load_topology(system).gpus_per_node
    if not per:
        raise CosimInputError(f"topology preset {system!r} has no GPU")
    return per


def _topology(case: Case, folder: Path) -> tuple[str, int | None]:
    if case.system in ("gb200-nvl72", "gb300-nvl72"):
        return _gb200(case.gpus, folder, case.system.split("-")[0]), None
    per = gpus_per_node(case.system)
    if case.gpus % per:
        raise _NotRun(f"{case.gpus} GPUs is not a whole number of {per}-GPU {case.system} nodes")
    return case.system, case.gpus // per


def data_parallel(case: Case) -> int:
    """The run's data-parallel size: its GPUs over tp x pp x cp."""
    lay = case.layout
    return case.gpus // (lay.tp * lay.pp * lay.cp)


def microbatches(case: Case) -> int:
    """Micro-batches per pipeline of the published run."""
    return case.batch.global_ // (case.batch.micro * data_parallel(case))


def probe_counts(case: Case, cap: int) -> list[int]:
    """Micro-batch counts to simulate: the run's own when at most ``cap``, else two steady-state counts."""
    m = microbatches(case)
    if m <= cap:
        return [m]
    pp = case.layout.pp
    step = pp if case.layout.vpp > 1 else (2 if case.schedule == "dualpipe" else 1)
    if case.gradient_accumulation_steps > 1:  # whole schedules: a probe of k schedules is k x the run's schedule
        step = math.lcm(step, m // case.gradient_accumulation_steps)
    lo = max(pp, 4, 2 * pp if case.schedule == "dualpipe" or case.layout.vpp > 1 else 0)
    lo = -(-lo // step) * step
    return [lo, 2 * lo] if 2 * lo < m else [m]


BRIDGE_BUCKET = 128 * 1024 * 1024
"""Megatron-Bridge's ``CommOverlapConfig`` (and NeMo 2.0's ``MegatronCommOverlapCallback``) bucket size when dp > 1
(``cosim.workload.synth.build.DDP_BUCKET_SOURCE``)."""
BRIDGE_REFS = ("MB2509", "MB2511", "MB2602", "MB260201", "MB2604", "MB2606", "MB260401", "NEMO2502", "NEMO2504")
"""Source families run by Megatron-Bridge or NeMo 2.0 (their bucket size is :data:`BRIDGE_BUCKET`)."""
OTHER_REFS = ("AUTOMODEL", "DSV3", "MCMOE", "MLMGB200", "MLMQ30", "MZQWEN3", "MZQWEN3B", "NEMO2407")
"""Source families that take Megatron-Core's default bucket rule (Megatron-LM's launcher ``--ddp-bucket-size``
unset, NeMo 1.0's ``ddp_bucket_size`` unset, DeepSeek's and AutoModel's own frameworks). A case citing a source in
neither tuple is an error: its framework decides its bucket size, so it must be said."""


def ddp_bucket_size(case: Case) -> float | None:
    """The run's gradient bucket size (parameters): the row's ``bucket_size``, else :data:`BRIDGE_BUCKET` for the
    Megatron-Bridge / NeMo 2.0 rows with dp > 1, else None (Megatron-Core's ``max(40M, 1M x dp)``)."""
    if case.bucket_size is not None:
        return case.bucket_size
    dp = data_parallel(case)
    return float(BRIDGE_BUCKET) if case.source.ref in BRIDGE_REFS and dp > 1 and not case.fsdp else None


def _scenario(case: Case, m: int, topology: str, nodes: int | None, recompute: str,
              spec_over: dict[str, Any] | None = None, set_over: dict[str, str] | None = None) -> Any:
    """The scenario of ``case`` with ``m`` micro-batches per pipeline on ``topology`` (``nodes``: its scale, None:
    as named) and activation recomputation ``recompute``; ``spec_over`` / ``set_over``: :func:`run_case`'s what-ifs."""
    from cosim.scenario import Scenario, SyntheticWorkload
    from cosim.workload.synth import SyntheticSpec

    lay = case.layout
    dp = data_parallel(case)
    layout: dict[str, Any] = {"tp": lay.tp, "pp": lay.pp, "vpp": lay.vpp, "cp": lay.cp, "ep": lay.ep,
                              "recompute": recompute, "zero": "fsdp" if case.fsdp else 1}
    if case.schedule:
        layout["schedule"] = case.schedule
    from cosim.capture.config import load_model_config

    if case.a2a_overlap:
        layout["a2a_overlap"] = True
    if case.overlap_grad_reduce is not None:
        layout["overlap_grad_reduce"] = case.overlap_grad_reduce
    if case.overlap_param_gather is not None and not case.fsdp:
        layout["overlap_param_gather"] = case.overlap_param_gather
    if case.fsdp and case.fsdp_reshard_after_forward is not None:
        layout["fsdp_reshard_after_forward"] = case.fsdp_reshard_after_forward
    if case.fsdp and case.fsdp_reshard_after_backward is not None:
        layout["fsdp_reshard_after_backward"] = case.fsdp_reshard_after_backward
    if (bucket := ddp_bucket_size(case)) is not None:
        layout["grad_bucket_params"] = bucket
    if case.recompute and recompute == "none":
        layout["recompute"] = case.recompute
        layout["recompute_early_stop"] = case.recompute_early_stop
    elif case.recompute_modules and recompute == "none":
        layout["recompute"] = "selective"
        layout["recompute_modules"] = list(case.recompute_modules)
    card = load_model_config(case.model)
    if case.pipeline_model_parallel_layout is not None:
        layout["pipeline_model_parallel_layout"] = case.pipeline_model_parallel_layout
    pl = None if case.pipeline_model_parallel_layout is not None else case.pipeline_layers or pipeline_layers(card.num_layers, lay.pp * lay.vpp,
                                                 card.mtp_layers if case.mtp_layers is None else case.mtp_layers)
    if pl is not None:
        layout["pipeline_layers"] = pl
    try:
        spec = SyntheticSpec.model_validate({
            "model": case.model, "layout": layout, "precision": case.precision, "routing": "uniform", "allow_oom": True,
            **({"fp8_recipe": case.fp8_recipe} if case.fp8_recipe else {}),
            "batch": {"global": m * case.batch.micro * dp, "micro": case.batch.micro, "seq": case.batch.seq,
                      **({"gradient_accumulation_steps": max(1, m * case.gradient_accumulation_steps // microbatches(case))}
                         if case.gradient_accumulation_steps > 1 else {})},
            **({"dispatch": case.dispatch} if case.dispatch != "nccl" else {}),
            **({"tp_comm_overlap": True} if case.tp_comm_overlap else {}),
            **({"grad_reduce_in_fp32": True} if case.grad_reduce_in_fp32 else {}),
            **({} if case.cross_entropy_fusion else {"cross_entropy_fusion": False}),
            **({} if case.moe_router_fusion else {"moe_router_fusion": False}),
            **({} if case.grad_accumulation_fusion else {"grad_accumulation_fusion": False}),
            **({} if case.expert_padding else {"expert_padding": False}),
            **({"cuda_graph_scope": list(case.cuda_graph_scope)} if case.cuda_graph_scope else {}),
            **({"offload_modules": list(case.offload_modules)}
               if case.offload_modules and layout.get("recompute") != "full" else {}),
            **({"hybridep_sms": case.hybridep_sms} if case.hybridep_sms else {}),
            **({"mtp_layers": case.mtp_layers} if case.mtp_layers is not None else {}),
            **({"optimizer_moments": "bf16"} if case.optimizer_moments == "bf16" else {}),
            **({"optimizer": case.optimizer} if case.optimizer != "adam" else {}),
            **({"moe_act_input_fp8": True} if case.moe_act_input_fp8 else {}),
            **({"dispatch_precision": case.dispatch_precision} if case.dispatch_precision else {}), **(spec_over or {})})
    except ValidationError as exc:  # a case's (or a --spec) value the synthetic spec refuses: the row is not run
        where, msg = describe_validation_error(SyntheticSpec, exc)
        raise CosimInputError(f"workload.synthetic.{where}: {msg}") from None
    sets: dict[str, Any] = {"gpu.comm_sms": case.comm_sms} if case.comm_sms is not None else {}
    if os.environ.get("COSIM_E2E_COMM_SHARE"):  # what-if: the per-kernel SM law on/off (docs/ENGINE.md)
        sets["gpu.comm_share"] = os.environ["COSIM_E2E_COMM_SHARE"]
    sets.update(set_over or {})
    return Scenario(name=f"e2e-{case.id}", workload=SyntheticWorkload(synthetic=spec), topology=topology, nodes=nodes,
                    set=sets)


def run_case(case: Case, cap: int = 16, recompute: str = "none", probe_big: bool = False,
             max_gpus: int = MAX_SIMULATED_GPUS, spec_over: dict[str, Any] | None = None,
             set_over: dict[str, str] | None = None) -> dict[str, Any]:
    """Simulate ``case`` (see the module docstring) and return its row: cosim's figures, the published
    ones, the error, the step breakdown and the wall time. A row on more than ``MAX_SIMULATED_GPUS`` is
    not run; with ``probe_big`` (up to ``PROBE_MAX_GPUS``, not DualPipe) a step of pp micro-batches is simulated
    alone and reported with its wall time (its throughput is a lower bound on cosim's full-step figure: fewer micro-batches amortize
    less of the pipeline fill and the optimizer). What-ifs on the row: ``spec_over`` sets ``workload.synthetic``
    fields, ``set_over`` `cosim run --set` keys of its scenario (``--spec`` / ``--set``)."""
    from cosim.capture.config import load_model_config
    from cosim.scenario import run_scenario

    row: dict[str, Any] = {"id": case.id, "model": case.model, "system": case.system, "gpus": case.gpus,
                           "precision": case.precision, "published": case.measured.model_dump(),
                           "source": case.source.model_dump(exclude_none=True), "bound": case.bound,
                           "unscored": case.unscored,
                           "microbatches": microbatches(case)}
    t0 = time.perf_counter()
    try:
        load_model_config(case.model)
    except CosimInputError as exc:
        return {**row, "status": "not run", "reason": f"model card missing: {exc}"}
    try:
        with tempfile.TemporaryDirectory(prefix="cosim-e2e-") as tmp:
            topology, nodes = _topology(case, Path(tmp))
            b, dp = case.batch, data_parallel(case)
            if b.global_ % (b.micro * dp):  # its micro-batches per pipeline are not whole (maybe none)
                raise CosimInputError(f"batch: global {b.global_} is not divisible by micro {b.micro} x dp {dp}")
            if case.gpus > max_gpus:
                if not probe_big or case.gpus > PROBE_MAX_GPUS or case.schedule == "dualpipe":
                    raise _NotRun(NOT_RUN_REASON)
                m = case.layout.pp  # the fewest micro-batches a pipelined step takes
                t1 = time.perf_counter()
                _, result = run_scenario(_scenario(case, m, topology, nodes, recompute, spec_over, set_over))
                s = result.summary()
                return {**row, "status": "not run", "reason": NOT_RUN_REASON,
                        "probe": {"microbatches": m, "wall_s": time.perf_counter() - t1,
                                  "tokens_per_s_per_gpu": s["tokens_per_s_per_gpu"], "mfu": s["mfu"],
                                  "step_time_s": s["step_time_s"], "bubble_fraction": s["bubble_fraction"],
                                  "breakdown": s["breakdown"], "memory_per_gpu_gib": s["memory_per_gpu_bytes"] / 2**30}}
            probes = []
            for m in probe_counts(case, cap):
                t1 = time.perf_counter()
                _, result = run_scenario(_scenario(case, m, topology, nodes, recompute, spec_over, set_over))
                probes.append((m, result.summary(), time.perf_counter() - t1))
    except _NotRun as exc:
        return {**row, "status": "not run", "reason": str(exc)}
    except CosimInputError as exc:  # a row the simulation refuses: reported, the other rows still run
        return {**row, "status": "not run", "reason": f"error: {exc}"}
    return {**row, **_figures(case, probes), "status": "run", "wall_s": time.perf_counter() - t0}


def _figures(case: Case, probes: list[tuple[int, dict[str, Any], float]]) -> dict[str, Any]:
    m_full = microbatches(case)
    m_b, sb, _ = probes[-1]
    t_b = float(sb["step_time_s"])

    def parts(s: dict[str, Any]) -> dict[str, float]:
        """Step time, its breakdown, critical-path classes and bubble idle time of one probe (s)."""
        out = {"step": float(s["step_time_s"]), "bubble": float(s.get("bubble_fraction") or 0.0) * float(s["step_time_s"])}
        out.update({f"bd.{k}": float(v) for k, v in (s.get("breakdown") or {}).items()})
        out.update({f"cp.{k}": float(v) for k, v in ((s.get("critical_path") or {}).get("by_class") or {}).items()})
        return out

    pb = parts(sb)
    if len(probes) == 2:  # every part is linear in m in the steady state: extrapolate each to the full step
        m_a, sa, _ = probes[0]
        pa = parts(sa)
        full = {k: v + (m_full - m_b) * (v - pa.get(k, 0.0)) / (m_b - m_a) for k, v in pb.items()}
        per_mb = (pb["step"] - pa["step"]) / (m_b - m_a)
    else:
        full, per_mb = pb, math.nan
    step = full["step"]
    syn = sb["synthetic"]
    tokens = syn["tokens_per_step"] * m_full / m_b
    flops = syn["model_flops_per_step"] * m_full / m_b
    tps = tokens / step / case.gpus
    tflops = flops / step / case.gpus / 1e12
    pub = case.measured
    return {
        "simulated_microbatches": [p[0] for p in probes], "probe_wall_s": [round(p[2], 1) for p in probes],
        "step_time_s": step, "per_microbatch_s": per_mb, "tokens_per_s_per_gpu": tps, "model_tflops_per_gpu": tflops,
        "mfu": float(sb["mfu"]) * (flops / step) / (syn["model_flops_per_step"] / t_b),
        "error": (tps / pub.tokens_per_s_per_gpu if pub.tokens_per_s_per_gpu else
                  tflops / (pub.model_tflops_per_gpu or math.nan)) - 1.0,
        "scored_on": "tokens" if pub.tokens_per_s_per_gpu else "tflops",
        "tflops_error": (tflops / pub.model_tflops_per_gpu - 1.0) if pub.model_tflops_per_gpu else None,
        "parts": {"microbatches": m_b, "step_time_s": t_b,
                  "breakdown": {k[3:]: v for k, v in full.items() if k.startswith("bd.")},
                  "bubble_fraction": max(0.0, full["bubble"] / step),
                  "by_class": {k[3:]: v for k, v in full.items() if k.startswith("cp.")},
                  "memory_per_gpu_gib": sb["memory_per_gpu_bytes"] / 2**30, "oom": sb.get("oom"),
                  "folded_ranks": syn.get("simulated_ranks")},
    }


def stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Median and max |error| over the rows that ran and are neither bounds nor unscored."""
    errs = [abs(r["error"]) for r in rows if r["status"] == "run" and not r["bound"] and not r.get("unscored")]
    return {"scored": len(errs), "median_abs_error": statistics.median(errs) if errs else None,
            "max_abs_error": max(errs) if errs else None,
            "within_20": sum(e <= TARGET_MAX for e in errs),
            "meets_target": bool(errs) and statistics.median(errs) <= TARGET_MEDIAN and max(errs) <= TARGET_MAX}


def table(rows: list[dict[str, Any]], sources: dict[str, str]) -> str:
    """The markdown table of the rows."""
    lines = ["| id | GPUs | precision | published tok/s/GPU | cosim tok/s/GPU | error | published TFLOP/s/GPU | "
             "cosim TFLOP/s/GPU | MFU (bf16 peak) | source |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        src = r["source"]
        ref = f"{src['ref']}: {src['table']}" + (f", {src['row']}" if src.get("row") else "")
        pub = r["published"]
        ptf = f"{pub['model_tflops_per_gpu']:.0f}" if pub.get("model_tflops_per_gpu") else "-"
        ptok = f"{pub['tokens_per_s_per_gpu']:.0f}" if pub.get("tokens_per_s_per_gpu") else "-"
        if r["status"] != "run":
            pr = r.get("probe")
            got = (f"not run (probe m={pr['microbatches']}: {pr['tokens_per_s_per_gpu']:.0f}, a lower bound)"
                   if pr else "not run")
            lines.append(f"| {r['id']} | {r['gpus']} | {r['precision']} | {ptok} | "
                         f"{got} | - | {ptf} | - | - | {ref} |")
            continue
        tag = " (bound)" if r["bound"] else (" (not scored)" if r.get("unscored") else "")
        on = " (TFLOP/s)" if r.get("scored_on") == "tflops" else ""
        lines.append(f"| {r['id']} | {r['gpus']} | {r['precision']} | {ptok}{tag} | "
                     f"{r['tokens_per_s_per_gpu']:.0f} | {100 * r['error']:+.1f}%{on} | {ptf} | "
                     f"{r['model_tflops_per_gpu']:.0f} | {100 * r['mfu']:.1f}% | {ref} |")
    return "\n".join(lines)


def breakdown_table(rows: list[dict[str, Any]]) -> str:
    """Where cosim's step goes, per row that ran, each part extrapolated to the full step like the step time."""
    lines = ["| id | simulated m (of m) | step (s) | per micro-batch (s) | compute | exposed comm | host-bound idle | "
             "bubble | top critical-path classes | memory GiB/GPU | wall (s) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        if r["status"] != "run":
            continue
        p = r["parts"]
        b = p["breakdown"] or {}
        tot = r["step_time_s"]
        cls = sorted((p["by_class"] or {}).items(), key=lambda kv: -kv[1])[:4]
        top = ", ".join(f"{k} {100 * v / tot:.0f}%" for k, v in cls)
        pm = "-" if math.isnan(r["per_microbatch_s"]) else f"{r['per_microbatch_s']:.3f}"
        lines.append(f"| {r['id']} | {'+'.join(map(str, r['simulated_microbatches']))} ({r['microbatches']}) | "
                     f"{r['step_time_s']:.2f} | {pm} | {100 * b.get('compute', 0) / tot:.0f}% | "
                     f"{100 * b.get('exposed_communication', 0) / tot:.0f}% | "
                     f"{100 * b.get('host_bound_gpu_idle', 0) / tot:.0f}% | {100 * max(0.0, p['bubble_fraction'] or 0):.0f}% | "
                     f"{top} | {p['memory_per_gpu_gib']:.0f}{' OOM' if p['oom'] else ''} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def _saved_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of an earlier ``--json`` output; a missing, truncated or foreign file is a one-line error."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["rows"]
    except OSError as exc:
        raise CosimInputError(f"{path}: cannot read: {exc.strerror}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CosimInputError(f"{path}: not an e2e --json output ({type(exc).__name__}: {exc})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "id" in r for r in rows):
        raise CosimInputError(f"{path}: rows: expected a list of rows with an 'id'")
    return rows


def main(argv: list[str] | None = None) -> int:
    """The e2e runner's command line: run (or, ``--from-json``, print) the rows and their tables; 2 on bad input."""
    from tqdm import tqdm

    ap = argparse.ArgumentParser(prog="python -m validation.e2e.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", help="run only this case id (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON on stdout")
    ap.add_argument("--cases", default=str(CASES), help="the cases file (default: training.yaml)")
    ap.add_argument("--max-microbatches", type=int, default=16,
                    help="simulate up to this many micro-batches per pipeline; beyond, extrapolate from two probes")
    ap.add_argument("--full", action="store_true", help="simulate every row's real micro-batch count")
    ap.add_argument("--recompute", choices=("none", "full"), default="none")
    ap.add_argument("--max-gpus", type=int, default=MAX_SIMULATED_GPUS,
                    help="rows on more GPUs are not run (or only probed, with --probe-big)")
    ap.add_argument("--probe-big", action="store_true",
                    help=f"for rows on more than {MAX_SIMULATED_GPUS} GPUs, simulate their smallest probe alone")
    ap.add_argument("--spec", action="append", default=[], metavar="KEY=VALUE",
                    help="what-if: set a workload.synthetic field on every row (e.g. expert_gemm_host='0 us')")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="sets",
                    help="what-if: a `cosim run --set` key on every row's scenario (hardware, replay knobs; e.g. "
                         "nics.cx8-xdr800.port_bandwidth='400 Gb/s')")
    ap.add_argument("--from-json", nargs="+", metavar="FILE",
                    help="print the tables of earlier --json outputs (rows in cases-file order) instead of running")
    args = ap.parse_args(argv)
    if args.from_json:
        try:
            got = {r["id"]: r for f in args.from_json for r in _saved_rows(Path(f))}
            sources, cases = load_cases(Path(args.cases))
        except CosimInputError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return _print([got[c.id] for c in cases if c.id in got], sources, args.json)
    try:
        sources, cases = load_cases(Path(args.cases))
        if args.only:
            unknown = set(args.only) - {c.id for c in cases}
            if unknown:
                raise CosimInputError(f"--only: unknown case id(s) {', '.join(sorted(unknown))}")
            cases = [c for c in cases if c.id in args.only]
        spec_over = _key_values("--spec", args.spec)
        set_over = _key_values("--set", args.sets)
        rows = []
        for c in tqdm(cases, desc="e2e rows", unit="row", file=sys.stderr):
            rows.append(run_case(c, cap=10**9 if args.full else args.max_microbatches, recompute=args.recompute,
                                 probe_big=args.probe_big, max_gpus=args.max_gpus, spec_over=spec_over,
                                 set_over=set_over))
    except CosimInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _print(rows, sources, args.json)


def _key_values(flag: str, items: list[str]) -> dict[str, Any]:
    """``KEY=VALUE`` arguments of ``flag`` as a dict (stripped); one that has no ``=`` is an input error."""
    out: dict[str, Any] = {}
    for kv in items:
        key, sep, val = kv.partition("=")
        if not sep:
            raise CosimInputError(f"{flag}: {kv!r} is not KEY=VALUE")
        out[key.strip()] = val.strip()
    return out


def _print(rows: list[dict[str, Any]], sources: dict[str, str], as_json: bool) -> int:
    st = stats(rows)
    if as_json:
        print(json.dumps({"rows": rows, "stats": st, "sources": sources}, indent=1, default=str))
        return 0
    print(table(rows, sources))
    print()
    print(breakdown_table(rows))
    for r in rows:
        if r["status"] != "run":
            pr = r.get("probe")
            extra = (f" (probe: {pr['microbatches']} micro-batches per pipeline simulated in {pr['wall_s']:.0f} s: "
                     f"{pr['tokens_per_s_per_gpu']:.0f} tokens/s/GPU, MFU {100 * pr['mfu']:.1f}%, bubble "
                     f"{100 * pr['bubble_fraction']:.0f}%)" if pr else "")
            print(f"not run: {r['id']}: {r['reason']}{extra}")
        elif r.get("unscored"):
            print(f"not scored: {r['id']}: {r['unscored']}")
    if st["scored"]:
        print(f"\n{st['scored']} rows scored: median |error| {100 * st['median_abs_error']:.1f}%, "
              f"max {100 * st['max_abs_error']:.1f}% (target median <= 10%, every row <= 20%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
