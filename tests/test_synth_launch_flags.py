"""Round 11 (issue 15): two Megatron-LM launch flags the ModelZoo H100 runs lacked, checked by hand: the router
without ``moe_router_fusion`` (Megatron-Core's eager top-k kernels) and the weight gradient without gradient
accumulation fusion (the backward hook's ``main_grad.add_``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.capture.config import MoEModelConfig
from cosim.workload.synth.build import BuildOptions
from cosim.workload.synth.costs import Op, Shard, backward_ops, layer_ops, unfused_router_ops
from tests._cards import TINY


def test_unfused_router_bytes_by_hand() -> None:
    """TINY (8 experts, top-2), 4 tokens: nE = 32 logits, nk = 8 choices, fp32 logits, int64 indices. Forward: top-k
    (read 32 x 4, write 8 x 12: 224), softmax of the k (8 x 8: 64), probabilities zeros (128), clone (256), scatter
    (8 x 16: 128), map zeros (128), int cast (256), clone (256), scatter (8 x 12: 96), bool cast (32 x 5: 160), its
    sum (32 + 8 x 8: 96) = 1792 B. Backward: the scatter's gather (128), softmax (8 x 12: 96), top-k's zeros and
    scatter (128 + 128, two kernels)."""
    ops = unfused_router_ops(MoEModelConfig(**TINY), 4.0)
    assert [(o.name.removeprefix("moe.router_topk."), o.bytes) for o in ops] == [
        ("topk", 224.0), ("softmax", 64.0), ("probs_zeros", 128.0), ("probs_clone", 256.0), ("probs_scatter", 128.0),
        ("map_zeros", 128.0), ("map_int", 256.0), ("map_clone", 256.0), ("map_scatter", 96.0), ("map_bool", 160.0),
        ("tokens_per_expert", 96.0)]
    assert sum(o.bytes for o in ops) == 1792.0
    assert [o.launches for o in ops].count(0) == 2  # the clones, launched by their scatter's call
    bwd = backward_ops(ops)
    assert [(o.name, o.bytes, o.launches + o.loop_launches) for o in bwd] == [
        ("moe.router_topk.probs_scatter.bwd", 128.0, 1), ("moe.router_topk.softmax.bwd", 96.0, 1),
        ("moe.router_topk.topk.bwd", 256.0, 2)]


def test_router_fusion_field_swaps_only_the_router_ops() -> None:
    """In an MoE layer's training ops, ``moe_router_fusion=False`` replaces the fused ``moe.router_topk`` by the
    eager kernels and drops the aux loss's own top-k mask and counts (the loss takes the routing map's); every other
    op is the same."""
    card = MoEModelConfig(**TINY)
    fused = layer_ops(card, 0, 64.0, 64.0, Shard(ep=4), "bf16")
    unfused = layer_ops(card, 0, 64.0, 64.0, Shard(ep=4, moe_router_fusion=False), "bf16")
    gone = {"moe.router_topk", "moe.aux_topk_mask", "moe.aux_tokens_per_expert"}
    assert gone <= {o.name for o in fused} and not gone & {o.name for o in unfused}
    assert [o for o in fused if o.name not in gone] == [o for o in unfused if not o.name.startswith("moe.router_topk.")]
    assert len([o for o in unfused if o.name.startswith("moe.router_topk.")]) == 11


def test_main_grad_hook_bytes_by_hand() -> None:
    """Without gradient accumulation fusion each wgrad is followed by the hook's kernel over its weight: a [64, 64]
    bf16 weight (4096 elements) reads the bf16 gradient (2 B) and reads and writes main_grad: fp32 (2 + 4 + 4) x 4096
    = 40960 B, bf16 (2 + 2 + 2) x 4096 = 24576 B; Megatron-FSDP's copy_ writes it only: fp32 (2 + 4) x 4096 = 24576 B.
    A grouped GEMM of 4 experts: one kernel per expert weight. Fused: no hook kernel."""
    lin = Op("x.fc", "gemm", 2.0 * 8 * 64 * 64, 0.0, "bf16", 8.0, 64.0, 64.0)
    grp = Op("x.experts", "grouped_gemm", 0.0, 0.0, "bf16", 8.0, 64.0, 64.0, batch=4.0)
    fp32, bf16 = BuildOptions(grad_bytes=4.0, grad_accumulation_fusion=False), BuildOptions(grad_accumulation_fusion=False)
    assert (fp32.main_grad_hook_bytes(False), fp32.main_grad_hook_bytes(True), bf16.main_grad_hook_bytes(False)) == (
        8.0, 4.0, 4.0)
    assert BuildOptions(grad_bytes=4.0).main_grad_hook_bytes(False) == 0.0
    for hook, want in ((8.0, 40960.0), (4.0, 24576.0)):
        bwd = backward_ops([lin], 0.0, hook)
        assert [o.name for o in bwd] == ["x.fc.dgrad", "x.fc.wgrad", "x.fc.main_grad_add"]
        assert bwd[2].bytes == want and bwd[2].bwd and bwd[2].launches == 1
    g = backward_ops([grp], 0.0, 8.0)[-1]
    assert (g.name, g.bytes, g.launches) == ("x.experts.main_grad_add", 4 * 40960.0, 4)
    assert [o.name for o in backward_ops([lin], 4.0)] == ["x.fc.dgrad", "x.fc.wgrad"]


def test_main_grad_hook_reads_a_bf16_gradient_under_fp8() -> None:
    """FP8 and MXFP8 quantize the wgrad GEMM's inputs, not its output: TE writes ``param.grad`` in the activation
    dtype (bf16, MAIN_GRAD_HOOK_SOURCE), so the hook over a [64, 64] weight reads 2 B and reads / writes fp32
    main_grad: (2 + 4 + 4) x 4096 = 40960 B, as under BF16 (s11-read3: it read 1 B, the fp8 input's size)."""
    for dt in ("fp8", "mxfp8"):
        lin = Op("x.fc", "gemm", 2.0 * 8 * 64 * 64, 0.0, dt, 8.0, 64.0, 64.0)
        assert backward_ops([lin], 0.0, 8.0)[-1].bytes == 40960.0


def test_spec_fields_reach_the_graph(tmp_path: Path, dgx: object) -> None:
    """TINY on PP2 EP4: ``grad_accumulation_fusion: false`` adds one hook kernel per wgrad (as many as wgrads, the
    wgrads' bytes the forward's); ``moe_router_fusion: false`` puts the eager router kernels where the fused op was,
    as many times."""
    from tests._cards import synth_tiny

    def ops(**spec: object) -> dict[str, int]:
        names: dict[str, int] = {}
        for rg in synth_tiny(tmp_path, dgx, **spec).graph.ranks:
            for i in range(len(rg.gpu_ops)):
                nm = rg.strings[int(rg.gpu_ops.name[i])]
                names[nm] = names.get(nm, 0) + 1
        return names

    base, acc, rt = ops(), ops(grad_accumulation_fusion=False), ops(moe_router_fusion=False)
    assert not any(k.endswith(".main_grad_add") for k in base)
    assert {k.removesuffix(".main_grad_add"): v for k, v in acc.items() if k.endswith(".main_grad_add")} == {
        k.removesuffix(".wgrad"): v for k, v in base.items() if k.endswith(".wgrad")}
    assert rt["moe.router_topk.topk"] == base["moe.router_topk"] and "moe.router_topk" not in rt
    assert rt["moe.router_topk.topk.bwd"] == base["moe.router_topk.bwd"]


@pytest.mark.parametrize("field", ["moe_router_fusion", "grad_accumulation_fusion"])
def test_modelzoo_rows_carry_the_flags(field: str) -> None:
    """training.yaml: the five ModelZoo H100 rows route unfused (Megatron-LM 1e057005 predates the flag); only the FSDP
    row, whose command passes --no-gradient-accumulation-fusion, runs without gradient accumulation fusion; no other
    row sets either field; the field reaches the synthetic spec."""
    from validation.e2e import run as R

    _, cases = R.load_cases()
    off = {c.id for c in cases if not getattr(c, field)}
    mz = {c.id for c in cases if c.id.startswith("mz-qwen3-235b-h100-256-bf16")}
    assert off == (mz if field == "moe_router_fusion" else {"mz-qwen3-235b-h100-256-bf16-fsdp"})
    case = next(c for c in cases if c.id in off)
    scn = R._scenario(case, 16, "dgx-h100", 32, "none")
    assert getattr(scn.workload.synthetic, field) is False


def test_serving_refuses_unfused_router() -> None:
    """``moe_router_fusion: false`` on a decode step is a one-line error naming the field."""
    from cosim.errors import CosimInputError
    from cosim.scenario import load_scenario, run_scenario

    dec = load_scenario("dsv3-decode-ep128")
    with pytest.raises(CosimInputError, match=r"^workload\.synthetic\.moe_router_fusion: a training field"):
        run_scenario(dec, {"workload.synthetic.moe_router_fusion": "false"})  # as `cosim run ... --set` does
