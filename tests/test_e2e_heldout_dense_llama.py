"""validation/e2e/heldout_dense_llama.yaml: the round-14 held-out dense Llama-3 rows load, stay out of the scored
table, and carry the layouts their sources print."""

from __future__ import annotations

from pathlib import Path

from validation.e2e.run import data_parallel, load_cases, microbatches

HELDOUT = Path(__file__).resolve().parents[1] / "validation" / "e2e" / "heldout_dense_llama.yaml"


def test_heldout_rows_load_and_are_not_scored_rows() -> None:
    sources, cases = load_cases(HELDOUT)
    _, scored = load_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)) == 8
    assert not set(ids) & {c.id for c in scored}
    assert {c.model for c in cases} == {"llama-3-8b", "llama-3-70b"}
    assert all(c.source.ref in sources for c in cases)


def test_heldout_layouts_are_the_published_ones() -> None:
    """By hand from the sources: the 25.11 Llama-3 8B rows run 8 GPUs, TP1 PP1 CP1, GBS 128 at micro-batch 2
    (8 micro-batches per rank: 128 / (8 x 2)) on B200 and GB200, micro-batch 4 on GB300 (the release preset; 4
    micro-batches); the 26.04 70B MXFP8 rows run GBS 256 on 64 GPUs, GB300 PP4 VP5 (DP 16: 16 micro-batches),
    GB200 TP2 PP4 VP5 (DP 8: 32) with TP communication overlap."""
    _, cases = load_cases(HELDOUT)
    by_id = {c.id: c for c in cases}
    for gpu, micro, m in (("b200", 2, 8), ("gb200", 2, 8), ("gb300", 4, 4)):
        for prec in ("fp8cs", "mxfp8"):
            c = by_id[f"mb2511-llama3-8b-{gpu}-8-{prec}"]
            assert (c.layout.tp, c.layout.pp, c.layout.cp, c.batch.micro, microbatches(c)) == (1, 1, 1, micro, m)
            assert (c.precision, c.fp8_recipe) == (("fp8", "current") if prec == "fp8cs" else ("mxfp8", None))
    g3, g2 = by_id["mb2604-llama3-70b-gb300-64-mxfp8"], by_id["mb2604-llama3-70b-gb200-64-mxfp8"]
    assert (data_parallel(g3), microbatches(g3), g3.tp_comm_overlap) == (16, 16, False)
    assert (data_parallel(g2), microbatches(g2), g2.tp_comm_overlap) == (8, 32, True)
    assert all(not c.grad_reduce_in_fp32 for c in cases)
