"""validation/e2e/heldout_mcore_report.yaml: the round-13 held-out rows of the Megatron-Core MoE report
(arXiv:2603.07685, Table 11) load, stay out of the scored table (the report's rows whose figures training.yaml
already holds are left out), and carry the layouts the report prints."""

from __future__ import annotations

from pathlib import Path

from cosim.workload.synth.layout import parse_pipeline_layout
from validation.e2e.run import load_cases, microbatches

HELDOUT = Path(__file__).resolve().parents[1] / "validation" / "e2e" / "heldout_mcore_report.yaml"


def test_rows_load_and_repeat_no_scored_figure() -> None:
    """Six of Table 11's nine rows: the Qwen3-235B GB300 MXFP8 (6583 tok/s, 974 TF), GB200 MXFP8 (919 TF) and GB200
    BF16 (750 TF) figures are training.yaml rows already (same source numbers: the same run)."""
    sources, cases = load_cases(HELDOUT)
    _, scored = load_cases()
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)) == 6
    assert not set(ids) & {c.id for c in scored}
    assert all(c.source.ref == "MCMOE" and c.source.ref in sources for c in cases)
    figures = {(c.model, c.measured.tokens_per_s_per_gpu) for c in scored} | {
        (c.model, c.measured.model_tflops_per_gpu) for c in scored}
    for c in cases:
        assert (c.model, c.measured.tokens_per_s_per_gpu) not in figures, c.id
        assert (c.model, c.measured.model_tflops_per_gpu) not in figures, c.id
    assert {(c.model, c.measured.model_tflops_per_gpu) for c in scored} >= {
        ("qwen3-235b-a22b", 974), ("qwen3-235b-a22b", 919), ("qwen3-235b-a22b", 750)}


def test_layouts_are_the_reports() -> None:
    """By hand from Tables 17 and 20: DeepSeek-V3 on 1024 H100 at TP2 PP8 is 64 data-parallel ranks, so GBS 8192 at
    MBS 1 is 128 micro-batches per pipeline; its layout Et*3|(tt|)*29m|L is 32 chunks (PP8 x VPP4) of 3, 29 x 2, the
    MTP alone and the loss alone (3 + 58 = 61 decoders); the GB200 layout Et*4|(tttt|)*14tmL is 16 chunks of 4, 14 x 4
    and 1 + MTP. The 128k Qwen3-235B run is TP4 CP4 PP4 on 128 GB300: 2 data-parallel ranks, 1024 / 2 = 512
    micro-batches of one 131072-token sequence."""
    _, cases = load_cases(HELDOUT)
    by = {c.id: c for c in cases}
    h = by["mcr-dsv3-h100-1024-fp8"]
    assert (h.layout.tp, h.layout.pp, h.layout.vpp, h.layout.ep, microbatches(h)) == (2, 8, 4, 64, 128)
    assert h.pipeline_model_parallel_layout is not None
    per, mtp = parse_pipeline_layout(h.pipeline_model_parallel_layout, 32, 61, 1)
    assert per == [3] + [2] * 29 + [0, 0] and mtp == 30
    g = by["mcr-dsv3-gb200-256-mxfp8"]
    assert g.pipeline_model_parallel_layout is not None
    per, mtp = parse_pipeline_layout(g.pipeline_model_parallel_layout, 16, 61, 1)
    assert per == [4] * 15 + [1] and mtp == 15 and microbatches(g) == 128
    q = by["mcr-qwen3-235b-gb300-128-mxfp8-128k"]
    assert (q.layout.tp, q.layout.cp, q.layout.pp, q.batch.seq, microbatches(q)) == (4, 4, 4, 131072, 512)


def test_launch_settings_of_the_modelzoo_harness() -> None:
    """Megatron-LM launches (gradients reduced in fp32); H100 rows run DeepEP with the 1F1B all-to-all overlap,
    Blackwell rows HybridEP at the harness's 32 SMs; FP8 and MXFP8 rows keep bf16 Adam moments."""
    _, cases = load_cases(HELDOUT)
    for c in cases:
        assert c.grad_reduce_in_fp32, c.id
        if c.system == "dgx-h100":
            assert (c.dispatch, c.a2a_overlap) == ("deepep", True), c.id
        else:
            assert (c.dispatch, c.hybridep_sms) == ("hybridep", 32), c.id
        assert (c.optimizer_moments == "bf16") is (c.precision != "bf16"), c.id
