"""Full activation recomputation in a synthesized step, worked by hand on a 2-layer EP4 model.

Megatron-Core's reentrant checkpoint (``tensor_parallel.checkpoint``) re-runs each layer's whole forward before
its backward; PyTorch's non-reentrant ``torch.utils.checkpoint`` (FSDP2 ``checkpoint_wrapper``, NeMo AutoModel)
stops once the last tensor the layer saved is rebuilt, so the trailing DeepEP combine and residual add are not
re-run (``costs.EARLY_STOP_SOURCE``). Neither re-runs the embedding, the LM head or the loss, and model FLOPs
never count the recomputation.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cosim.capture.config import MoEModelConfig
from cosim.errors import CosimInputError
from cosim.workload.graph import CollType
from cosim.workload.synth.costs import Shard, early_stop_end, layer_ops
from tests._cards import TINY, synth_tiny


def _synth(tmp_path: Path, topo: Any, dispatch: str, **layout: Any) -> Any:
    """8 GPUs, pp 1, ep 4 (dp 8): both layers on every rank, 2 micro-batches of 64 tokens per rank."""
    return synth_tiny(tmp_path, topo, layout=dict(ep=4, **layout), batch={"global": 16, "micro": 1, "seq": 64},
                      dispatch=dispatch, fold=False)


def _ops(syn: Any, rank: int = 0) -> list[tuple[str, float]]:
    """(name, bytes) of every GPU op of ``rank`` in emission order."""
    rg = syn.graph.ranks[rank]
    return [(rg.strings[int(n)], float(b)) for n, b in zip(rg.gpu_ops.name, rg.gpu_ops.bytes)]


def _colls(syn: Any, rank: int = 0) -> Counter[tuple[str, int, float]]:
    C = syn.graph.ranks[rank].collectives
    return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c])) for c in range(len(C)))


def _with_recompute(plain: list[tuple[str, float]], rerun: int | None = None) -> list[tuple[str, float]]:
    """The plain step with each layer's forward (its first ``rerun`` ops; all when None) re-emitted as
    ``<name>.recompute``, same bytes, just before that layer's first backward op (``moe.residual.bwd``)."""
    start = next(i for i, (n, _) in enumerate(plain) if n == "attn.norm")
    end = next(i for i, (n, _) in enumerate(plain) if n == "moe.residual") + 1
    fwd = plain[start:end][:rerun]
    out: list[tuple[str, float]] = []
    for n, b in plain:
        if n == "moe.residual.bwd":
            out += [(f"{fn}.recompute", fb) for fn, fb in fwd]
        out.append((n, b))
    return out


def test_full_recompute_reruns_one_forward_per_layer_by_hand(tmp_path: Path, dgx: Any) -> None:
    plain = _synth(tmp_path, dgx, "nccl")
    full = _synth(tmp_path, dgx, "nccl", recompute="full")
    p, f = _ops(plain), _ops(full)
    # exact order and bytes: 2 micro-batches x 2 layers, each re-running its whole forward (Megatron's reentrant
    # CheckpointFunction.backward) and nothing else: no embedding, LM head or loss op is re-run
    assert f == _with_recompute(p)
    rec = [n for n, _ in f if n.endswith(".recompute")]
    layer = [o.name for o in layer_ops(MoEModelConfig(**TINY), 0, 64.0, 64.0, Shard(ep=4))]
    assert Counter(rec) == Counter(f"{n}.recompute" for n in layer for _ in range(2 * 2))
    assert not [n for n in rec if n.startswith(("embed", "head", "final_norm"))]
    # the collectives re-run with the forward's bytes: per layer and micro-batch the token all-to-alls
    # (dispatch, combine: 64 tokens x top-2 x d 64 x bf16 = 16384 B), the probabilities' all-to-all
    # (64 x 2 x fp32 = 512 B) and the counts' all-gather over EP (8 experts x int64 = 64 B)
    extra = _colls(full) - _colls(plain)
    assert extra == Counter({("ALL_TO_ALL", 4, 16384.0): 2 * 2 * 2, ("ALL_TO_ALL", 4, 512.0): 2 * 2,
                             ("ALL_GATHER", 4, 64.0): 2 * 2})
    assert not _colls(plain) - _colls(full)
    # one forward more per layer: longer step, same model FLOPs (recomputation is not useful work)
    assert full.built.model_flops == plain.built.model_flops > 0


def test_early_stop_skips_the_trailing_combine_and_residual_by_hand(tmp_path: Path, dgx: Any) -> None:
    card = MoEModelConfig(**TINY)
    deepep = layer_ops(card, 0, 64.0, 64.0, Shard(ep=4, dispatcher="deepep"))
    names = [o.name for o in deepep]
    # the flex dispatcher restores the expert order before its combine; the combine and the residual add
    # save no tensor, so the recomputation stops after the unpermute (its row map is the last saved tensor)
    assert names[-3:] == ["moe.unpermute", "moe.combine", "moe.residual"]
    assert early_stop_end(deepep) == len(deepep) - 2
    # the alltoall dispatcher unpermutes after its combine: early stop would re-run that combine
    nccl = layer_ops(card, 0, 64.0, 64.0, Shard(ep=4))
    assert [o.name for o in nccl][-3:] == ["moe.combine", "moe.unpermute", "moe.residual"]
    assert early_stop_end(nccl) == len(nccl) - 1

    plain = _synth(tmp_path, dgx, "deepep")
    full = _synth(tmp_path, dgx, "deepep", recompute="full")
    early = _synth(tmp_path, dgx, "deepep", recompute="full", recompute_early_stop=True)
    p = _ops(plain)
    assert _ops(full) == _with_recompute(p)
    assert _ops(early) == _with_recompute(p, rerun=-2)
    # DeepEP: per layer and micro-batch the full recompute re-runs the dispatch and the combine, early stop only
    # the dispatch (2 micro-batches x 2 layers)
    a2a = ("ALL_TO_ALL", 4, 16384.0)
    assert (_colls(full) - _colls(plain)) == Counter({a2a: 2 * 2 * 2})
    assert (_colls(early) - _colls(plain)) == Counter({a2a: 2 * 2})
    assert early.built.model_flops == full.built.model_flops == plain.built.model_flops


def test_early_stop_needs_full_recompute(tmp_path: Path, dgx: Any) -> None:
    with pytest.raises(CosimInputError, match=r"layout\.recompute_early_stop: needs recompute: full"):
        _synth(tmp_path, dgx, "deepep", recompute="selective", recompute_early_stop=True)
