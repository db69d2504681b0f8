"""validation/e2e/heldout_qwen3_30b.yaml: the round-11 held-out Qwen3-30B-A3B rows load, stay out of the scored
table, and carry the layouts their sources print."""

from __future__ import annotations

from pathlib import Path

from validation.e2e.run import load_cases, microbatches

HELDOUT = Path(__file__).resolve().parents[1] / "validation" / "e2e" / "heldout_qwen3_30b.yaml"


def test_heldout_rows_load_and_are_not_scored_rows() -> None:
    sources, cases = load_cases(HELDOUT)
    _, scored = load_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)) == 14
    assert not set(ids) & {c.id for c in scored}
    assert {c.model for c in cases} == {"qwen3-30b-a3b"}
    assert all(c.source.ref in sources for c in cases)


def test_heldout_layouts_are_the_published_ones() -> None:
    """By hand from the sources: 26.04 H100 runs EP16 on two nodes at micro-batch 1, GBS 1024 (64 micro-batches
    per data-parallel rank: 1024 / 16); every H100 row from 26.02.01 on runs that preset
    (Megatron-Bridge PR 2477); the B200 rows of 26.02.01 onwards run micro-batch 4 (512 / (8 x 4) = 16);
    the Megatron-LM recipes publish TFLOP/s only."""
    _, cases = load_cases(HELDOUT)
    by_id = {c.id: c for c in cases}
    h = by_id["mb2604-qwen3-30b-h100-16-fp8"]
    assert (h.layout.ep, h.layout.pp, h.batch.micro, h.dispatch, h.fp8_recipe) == (16, 1, 1, "hybridep", "current")
    assert microbatches(h) == 64
    b = by_id["mb260201-qwen3-30b-b200-8-mxfp8"]
    assert (b.batch.micro, b.cuda_graph_scope, microbatches(b)) == (4, ["attn", "moe_router", "moe_preprocess"], 16)
    assert all(by_id[f"{r}-qwen3-30b-h100-16-fp8"].layout == h.layout for r in ("mb260201", "mb260401", "mb2606"))
    for c in cases:
        if c.id.startswith("mlmr-"):
            assert c.measured.tokens_per_s_per_gpu is None and c.measured.model_tflops_per_gpu


def test_launcher_flags_of_each_framework() -> None:
    """The Megatron-LM recipes run through Megatron-LM's launcher with ``bf16: true`` and no ``grad_reduce_in_bf16``
    (so ``arguments.py`` reduces gradients in fp32) and ``cross_entropy_loss_fusion: true``; the Megatron-Bridge rows
    reduce in bf16 (``grad_reduce_in_fp32 = False``) with the fused loss."""
    _, cases = load_cases(HELDOUT)
    for c in cases:
        assert c.grad_reduce_in_fp32 is c.id.startswith("mlmr-"), c.id
        assert c.cross_entropy_fusion, c.id
