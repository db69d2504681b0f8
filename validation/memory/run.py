"""Score cosim's per-GPU training memory against measured peaks of real runs (``measured.yaml``).

For each row: the card, the layout resolved on the row's GPUs, :func:`cosim.workload.synth.memory.memory_per_stage`
with the row's :class:`~cosim.workload.synth.memory.MemoryOptions`, the last pipeline stage (the logging rank),
and the errors of its static part (weights + gradients + optimizer state) against ``mem-allocated-bytes`` and of
its peak without the flat reserve against ``mem-max-allocated-bytes``. Nothing is fitted.

``python -m validation.memory.run`` prints the table (``--json`` the rows); it also prints cosim's estimate for every
published end-to-end layout of ``validation/e2e/training.yaml`` against its GPU's memory. ``--rows FILE`` scores another
file of the same schema (:class:`RowsFile`); a malformed one is a one-line error (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from cosim.capture.config import load_model_config
from cosim.catalog.models import Strict
from cosim.errors import CosimInputError
from cosim.workload.synth.costs import PRECISIONS
from cosim.workload.synth.layout import ParallelLayout
from cosim.workload.synth.memory import MemoryEstimate, MemoryOptions, memory_per_stage

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
ROWS = HERE / "measured.yaml"
GIB = 2.0**30

_AUTOMODEL_FSDP2 = (
    "NVIDIA-NeMo/Automodel examples/llm_benchmark/gpt_oss/gptoss_{20b,120b}_te_deepep.yaml (FSDP2, "
    "optimizer torch.optim.Adam), nemo_automodel/components/models/gpt_oss/model.py (parameters created in the "
    "config's torch_dtype, bfloat16 by default), components/moe/parallelizer.py (fully_shard with "
    "MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32): the sharded parameters stay bf16, no fp32 "
    "master) and torch.optim.Adam (exp_avg, exp_avg_sq = zeros_like(param): bf16 moments)")
"""Why NeMo AutoModel's FSDP2 runs hold no fp32 master copy and bf16 Adam moments."""

E2E_MEMORY_SETTINGS: dict[str, tuple[dict[str, Any], dict[str, Any], str]] = {
    "dsv3-h800-2048-fp8-run-average": (
        {"recompute": "selective", "recompute_modules": ["layernorm", "mla_up_proj", "moe_act"]},
        {"grad_bytes": 4, "moment_bytes": 4, "moe_act_input_fp8": True},
        "DeepSeek-V3 report (arXiv:2412.19437) section 3.2.3: RMSNorm and MLA up-projections recomputed; section "
        "3.3.3: the SwiGLU input cached in FP8 and its output recomputed, AdamW moments in bf16, master weights and "
        "gradients in fp32"),
    **{rid: ({}, {"master_bytes": 0, "moment_bytes": 4}, _AUTOMODEL_FSDP2) for rid in
       ("automodel-gpt-oss-20b-h100-8-bf16", "automodel-gpt-oss-120b-h100-64-bf16")},
}
"""Memory settings a published end-to-end run reports beyond its training.yaml row (layout fields, MemoryOptions,
source); the Megatron-Bridge rows need none (their configs' recompute_modules are in training.yaml)."""


class RowBatch(Strict):
    """The run's batch: global (sequences; null where the peak does not depend on it), micro, seq (tokens)."""

    micro: int = Field(gt=0)
    seq: int = Field(gt=0)
    global_: int | None = Field(default=None, gt=0, alias="global")


class RowOptions(Strict):
    """The run's framework settings (:class:`cosim.workload.synth.memory.MemoryOptions` fields; absent: its default)."""

    weight_bytes: float | None = Field(default=None, ge=0)
    grad_bytes: float | None = Field(default=None, ge=0)
    master_bytes: float | None = Field(default=None, ge=0)
    moment_bytes: float | None = Field(default=None, ge=0)
    fp8_weight_cache: bool | None = None
    hidden_dropout: bool | None = None
    moe_act_input_fp8: bool | None = None


class RowMeasured(Strict):
    """The run's logged counters, bytes: ``mem-allocated-bytes`` and ``mem-max-allocated-bytes``."""

    allocated: float = Field(gt=0)
    max_allocated: float = Field(gt=0)


class RowSource(Strict):
    """Megatron-LM functional-test case and golden-values file of the row."""

    case: str
    file: str


class Row(Strict):
    """One measured run (``measured.yaml`` header: the fields)."""

    id: str
    model: str
    gpus: int | None = Field(default=None, gt=0)
    gpus_candidates: list[int] | None = Field(default=None, min_length=1)
    layout: ParallelLayout
    batch: RowBatch
    precision: str
    options: RowOptions = Field(default_factory=RowOptions)
    measured: RowMeasured
    source: RowSource

    @field_validator("precision")
    @classmethod
    def _known_precision(cls, v: str) -> str:
        if v not in PRECISIONS:
            raise ValueError(f"{v!r} is not one of {', '.join(PRECISIONS)}")
        return v

    @model_validator(mode="after")
    def _one_gpu_count(self) -> Row:
        if (self.gpus is None) == (self.gpus_candidates is None):
            raise ValueError("give exactly one of gpus and gpus_candidates")
        if self.gpus_candidates is not None and min(self.gpus_candidates) <= 0:
            raise ValueError("gpus_candidates: every count must be > 0")
        return self


class NotScored(Strict):
    """A run looked at and left out, and why."""

    case: str
    why: str


class RowsFile(Strict):
    """``measured.yaml``."""

    base_url: str
    rows: list[Row] = Field(min_length=1)
    not_scored: list[NotScored] = Field(default_factory=list)


def load_rows(path: Path = ROWS) -> list[dict[str, Any]]:
    """The rows of ``path``, validated (unknown keys, wrong types, missing fields: one located error), as plain
    dicts (``batch.global`` under its YAML name, options without the absent ones)."""
    from cosim.yamlio import load_yaml, validate

    doc = validate(RowsFile, load_yaml(path), file=path)
    out = []
    for r in doc.rows:
        d = r.model_dump(by_alias=True, exclude_none=True)
        d["batch"].setdefault("global", None)
        d["layout"] = r.layout
        out.append(d)
    return out


def _model(name: str) -> Any:
    p = ROOT / name
    return load_model_config(p if p.suffix in (".yaml", ".yml", ".json") else name)


def estimate(row: dict[str, Any], gpus: int) -> MemoryEstimate:
    """cosim's memory of the last pipeline stage of ``row`` on ``gpus`` GPUs."""
    card = _model(row["model"])
    lay = row["layout"] if isinstance(row["layout"], ParallelLayout) else ParallelLayout(**row["layout"])
    rm = lay.resolve(card, gpus, where=f"{row['id']}.layout")
    b = row["batch"]
    m = b["global"] // (b["micro"] * rm.dp) if b.get("global") else rm.pp
    if b.get("global") and (m == 0 or b["global"] % (b["micro"] * rm.dp)):
        raise CosimInputError(f"{row['id']}.batch.global: {b['global']} sequences are not a multiple of micro "
                              f"{b['micro']} x dp {rm.dp}")
    mem = memory_per_stage(card, rm, b["micro"], b["seq"], m, row["precision"], MemoryOptions(**row.get("options", {})))
    return mem[-1]


def static(m: MemoryEstimate) -> float:
    return m.weights + m.gradients + m.optimizer


def score(row: dict[str, Any]) -> dict[str, Any]:
    """One row's figures (bytes) and errors."""
    meas = row["measured"]
    if "gpus" in row:
        gpus, inferred = int(row["gpus"]), False
    else:  # the candidate whose static memory is closest to the measured one
        gpus = min((int(g) for g in row["gpus_candidates"]),
                   key=lambda g: abs(static(estimate(row, g)) - meas["allocated"]))
        inferred = True
    m = estimate(row, gpus)
    peak = m.total - m.overhead
    return {"id": row["id"], "gpus": gpus, "gpus_inferred": inferred, "static": static(m),
            "activations": m.activations, "peak": peak, "measured_static": float(meas["allocated"]),
            "measured_peak": float(meas["max_allocated"]),
            "static_error": static(m) / meas["allocated"] - 1.0, "peak_error": peak / meas["max_allocated"] - 1.0,
            "source": f"{row['source']['case']} ({row['source']['file']})"}


def e2e_rows() -> list[dict[str, Any]]:
    """cosim's memory of every published end-to-end layout (validation/e2e/training.yaml) and its GPU's HBM, as the
    row's scenario holds it and, where :data:`E2E_MEMORY_SETTINGS` has the run's published memory settings, with
    them."""
    from cosim.scenario import build_topology
    from cosim.workload.synth.spec import memory_options, spec_card
    from validation.e2e.run import _scenario, load_cases, microbatches

    out = []
    _, cases = load_cases()
    for c in cases:
        m = microbatches(c)
        spec = _scenario(c, m, c.system, None, "none").workload.synthetic
        card = spec_card(spec, load_model_config(c.model))  # with the row's multi-token prediction
        topo = build_topology(c.system, None, None, None, None)
        hbm = float(topo.accelerator(topo.gpus[0]).hbm_capacity)
        variants = [(c.id, spec.layout, memory_options(spec))]
        if c.id in E2E_MEMORY_SETTINGS:
            lay, opts, _ = E2E_MEMORY_SETTINGS[c.id]
            variants.append((f"{c.id} (published memory settings)", spec.layout.model_copy(update=lay),
                             MemoryOptions(**opts)))
        for name, layout, opt in variants:
            rm = layout.resolve(card, c.gpus)
            mem = memory_per_stage(card, rm, spec.batch.micro, spec.batch.seq, m, spec.precision, opt)
            worst = max(mem, key=lambda x: x.total)
            out.append({"id": name, "stage": worst.stage, "total": worst.total, "hbm": hbm,
                        "weights": worst.weights, "gradients": worst.gradients, "optimizer": worst.optimizer,
                        "activations": worst.activations})
    return out


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| id | GPUs | cosim static GiB | measured static GiB | error | cosim activations GiB | cosim peak GiB | "
             "measured peak GiB | error | source |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        g = f"{r['gpus']}{' (inferred)' if r['gpus_inferred'] else ''}"
        lines.append(f"| {r['id']} | {g} | {r['static'] / GIB:.2f} | {r['measured_static'] / GIB:.2f} | "
                     f"{100 * r['static_error']:+.1f}% | {r['activations'] / GIB:.2f} | {r['peak'] / GIB:.2f} | "
                     f"{r['measured_peak'] / GIB:.2f} | {100 * r['peak_error']:+.1f}% | {r['source']} |")
    errs = [abs(r["peak_error"]) for r in rows]
    lines.append(f"\n{len(rows)} rows: peak |error| median {100 * statistics.median(errs):.1f}%, "
                 f"max {100 * max(errs):.1f}%")
    return "\n".join(lines)


def e2e_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| id | stage | weights | gradients | optimizer | activations | total GiB | HBM GiB | fits |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r['id']} | {r['stage']} | {r['weights'] / GIB:.1f} | {r['gradients'] / GIB:.1f} | "
                     f"{r['optimizer'] / GIB:.1f} | {r['activations'] / GIB:.1f} | {r['total'] / GIB:.1f} | "
                     f"{r['hbm'] / GIB:.0f} | {'yes' if r['total'] <= r['hbm'] else 'NO'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--rows", default=str(ROWS), help="the measured rows (default: measured.yaml)")
    args = ap.parse_args(argv)
    path = Path(args.rows)
    try:
        loaded = load_rows(path)
        try:
            rows = [score(r) for r in loaded]
        except CosimInputError as exc:  # a row that does not resolve (layout, batch): name the file too
            raise CosimInputError(f"{path}: rows.{exc}") from None
        e2e = e2e_rows()
    except CosimInputError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"measured": rows, "e2e": e2e}, indent=1))
    else:
        print(table(rows))
        print()
        print(e2e_table(e2e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
