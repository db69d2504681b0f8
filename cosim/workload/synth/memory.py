"""Memory per GPU of a training layout (bytes).

* weights: bf16 (2 bytes per parameter) of this rank's share: dense parameters / tp,
  routed experts / (ep * etp), the embedding on the first stage and the LM head on the
  last (vocabulary split over tp); FSDP shards them over data parallelism too;
* gradients: fp32 main gradients (4 bytes), sharded over data parallelism with FSDP;
* optimizer: fp32 master weights, Adam m and v (12 bytes per parameter), sharded over
  the data-parallel group with ZeRO-1 / FSDP (dense over dp x cp, experts over edp);
* activations: the bytes each op keeps for its backward (:attr:`Op.saved`) for one
  micro-batch through the stage's layers, times the most micro-batches the schedule
  holds at once (:func:`cosim.workload.synth.schedule.peak_in_flight`, per model chunk);
  with full recomputation only each layer's input is kept, plus one layer's working set.

Not modelled: allocator fragmentation, NCCL and CUDA-context buffers, temporaries of one
kernel (the ``overhead`` term below is a flat reserve for them).
"""

from __future__ import annotations

from dataclasses import dataclass

from cosim.capture.config import MoEModelConfig
from cosim.workload.synth.costs import (
    PRECISIONS,
    Shard,
    embedding_ops,
    head_ops,
    layer_ops,
    layer_params,
    selective_saved,
)
from cosim.workload.synth.layout import RankMap
from cosim.workload.synth.schedule import dualpipe_order, stage_order

__all__ = ["OVERHEAD_BYTES", "MemoryEstimate", "memory_per_stage"]

OVERHEAD_BYTES = 3 * 2**30
"""CUDA context, NCCL buffers and allocator slack reserved per GPU (3 GiB)."""


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes on one GPU of a pipeline stage."""

    stage: int
    weights: float
    gradients: float
    optimizer: float
    activations: float
    overhead: float = OVERHEAD_BYTES

    @property
    def total(self) -> float:
        """Everything, bytes."""
        return self.weights + self.gradients + self.optimizer + self.activations + self.overhead

    def as_dict(self) -> dict[str, float]:
        return {"stage": self.stage, "weights": self.weights, "gradients": self.gradients,
                "optimizer": self.optimizer, "activations": self.activations, "overhead": self.overhead,
                "total": self.total}


def memory_per_stage(card: MoEModelConfig, rm: RankMap, micro: int, seq: int, microbatches: int,
                     precision: str = "bf16") -> list[MemoryEstimate]:
    """Memory of one GPU of every pipeline stage."""
    p = PRECISIONS[precision]
    T = float(micro * seq // rm.cp)
    sh = Shard(tp=rm.tp, cp=rm.cp, ep=rm.ep, etp=rm.etp, sequence_parallel=rm.sequence_parallel)
    zero = rm.layout.zero
    n_dp = rm.dp * rm.cp
    out = []
    for stage in range(rm.pp):
        dense = expert = 0.0
        act_chunk: list[float] = []
        for c in rm.stage_chunks(stage):
            a = 0.0
            for ly in rm.chunk_layers[c]:
                d, e = layer_params(card, ly)
                dense += d / rm.tp
                expert += e / (rm.ep * rm.etp)
                ops = layer_ops(card, ly, T, seq, sh, p)
                if rm.layout.recompute == "full":
                    a += T / (rm.tp if rm.sequence_parallel else 1) * card.hidden_size * p.act_bytes
                elif rm.layout.recompute == "selective":
                    a += selective_saved(ops, rm.layout.recompute_modules)
                else:
                    a += sum(o.saved for o in ops)
            if c == 0:
                dense += card.vocab_size * card.hidden_size / rm.tp
                a += sum(o.saved for o in embedding_ops(card, T, sh, p))
            if c == rm.pp * rm.vpp - 1:
                dense += card.vocab_size * card.hidden_size / rm.tp
                a += sum(o.saved for o in head_ops(card, T, sh, p))
            act_chunk.append(a)
        if rm.schedule == "dualpipe":  # (kind, chunk) per action; an overlapped pair is a forward then a backward
            steps: list[tuple[str, int]] = []
            for act in dualpipe_order(stage, rm.pp, microbatches):
                if act[0] == "FB":
                    steps += [("F", int(act[1])), ("B", int(act[2]))]
                elif act[0] in ("F", "B"):
                    steps.append((str(act[0]), int(act[1])))
        else:
            steps = [(kind, v) for kind, _, v in stage_order(stage, rm.pp, rm.vpp, microbatches)]
        live = [0] * len(act_chunk)
        peak = cur = 0.0
        for kind, v in steps:
            live[v] += 1 if kind == "F" else -1
            cur = sum(n * act_chunk[i] for i, n in enumerate(live))
            peak = max(peak, cur)
        if rm.layout.recompute == "full":  # the layer being recomputed holds its full working set
            last = rm.chunk_layers[rm.stage_chunks(stage)[0]]
            if last:
                peak += sum(o.saved for o in layer_ops(card, last[-1], T, seq, sh, p))
        n_edp = rm.edp
        params = dense + expert
        if zero == "fsdp":
            weights, grads = 2.0 * (dense / n_dp + expert / n_edp), 4.0 * (dense / n_dp + expert / n_edp)
        else:
            weights, grads = 2.0 * params, 4.0 * params
        opt = 12.0 * (params if zero == 0 else dense / n_dp + expert / n_edp)
        out.append(MemoryEstimate(stage, weights, grads, opt, peak))
    return out
