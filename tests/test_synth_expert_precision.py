"""``workload.synthetic.expert_precision``: the routed experts in their own GEMM recipe (FP8 experts, BF16 rest).

Worked by hand on a small card (hidden 64, 8 experts top-2, expert FFN 32, one shared expert, one dense layer),
EP2 training, 16 tokens: each rank routes 16 x 2 rows to 8 experts, so each of its 4 local experts gets
16 x 2 x 2 / 8 = 8 rows (32 in all)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cosim.capture.config import MoEModelConfig
from cosim.errors import CosimInputError
from cosim.workload.synth.costs import PRECISIONS, QUANT_COPIES, Op, Shard, backward_ops, layer_ops
from cosim.workload.synth.layout import ParallelLayout
from cosim.workload.synth.memory import MemoryOptions, layer_activation_bytes, memory_per_stage

CARD = MoEModelConfig(name="small", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                      vocab_size=128, num_experts=8, top_k=2, expert_ffn_size=32, num_shared_experts=1,
                      dense_layers=1, dense_ffn_size=96)
SH = Shard(ep=2)
BF16, FP8 = PRECISIONS["bf16"], PRECISIONS["fp8"]
FP8_EXPERTS = replace(BF16, experts=FP8)
CAST = 1.0 + 4.0 / 128  # one FP8 byte + one fp32 scale per 128 elements
ROUTED = ("moe.experts_fc1", "moe.experts_fc2", "moe.experts_input.quantize", "moe.experts_act.quantize",
          "moe.experts_pad", "moe.experts_probs_pad", "moe.experts_unpad")


def _ops(p: object, layer: int = 1) -> dict[str, Op]:
    ops = layer_ops(CARD, layer, 16.0, 16, SH, p)  # type: ignore[arg-type]
    return {o.name: o for o in [*ops, *backward_ops(ops)]}


def test_only_the_routed_experts_change_bytes_and_counts_by_hand() -> None:
    base, fx, all8 = _ops(BF16), _ops(FP8_EXPERTS), _ops(FP8)
    new = sorted(set(fx) - set(base))
    assert not set(base) - set(fx)
    # the casts of the experts' inputs (forward and their gradients) and Megatron-Core's FP8 row padding
    assert new == sorted(["moe.experts_input.quantize", "moe.experts_input.quantize.bwd",
                          "moe.experts_act.quantize", "moe.experts_act.quantize.bwd",
                          "moe.experts_pad", "moe.experts_pad.bwd", "moe.experts_probs_pad",
                          "moe.experts_probs_pad.bwd", "moe.experts_unpad", "moe.experts_unpad.bwd"])
    for name, o in base.items():
        if name.startswith(ROUTED):
            continue
        assert fx[name] == o, name  # attention, router, shared expert, dispatch, combine: as in BF16
    assert not any(n.startswith("attn.") and n.endswith(".quantize") for n in fx)
    assert base["moe.dispatch"].comm.nbytes == fx["moe.dispatch"].comm.nbytes == 16 * 2 * 64 * 2.0  # type: ignore[union-attr]
    # fc1: 4 experts x [8 x 64] x [64 x 64]: FP8 inputs and weights (1 byte), BF16 output; its saved input FP8 + scales
    fc1 = fx["moe.experts_fc1"]
    assert (fc1.dtype, base["moe.experts_fc1"].dtype) == ("fp8", "bf16")
    assert fc1.flops == base["moe.experts_fc1"].flops == 2 * 8 * 64 * 64 * 4
    assert fc1.bytes == (8 * 64 + 64 * 64) * 4 * 1.0 + 8 * 64 * 4 * 2.0 == 22528
    assert base["moe.experts_fc1"].bytes == (8 * 64 + 64 * 64) * 4 * 2.0 + 8 * 64 * 4 * 2.0 == 40960
    assert fc1.saved == pytest.approx(8 * 64 * 4 * CAST)
    assert fx["moe.experts_fc2"].bytes == (8 * 32 + 32 * 64) * 4 * 1.0 + 8 * 64 * 4 * 2.0 == 13312
    # input cast: 32 rows x 64 read in BF16, written as two FP8 copies (row- and column-wise) with scales;
    # one kernel per local expert (4: three more launched from C++)
    q = fx["moe.experts_input.quantize"]
    assert q.bytes == pytest.approx(32 * 64 * (2.0 + QUANT_COPIES * CAST)) and q.loop_launches == 3
    assert fx["moe.experts_act.quantize"].bytes == pytest.approx(32 * 32 * (2.0 + QUANT_COPIES * CAST))
    # padding to 16 rows per expert: 32 rows + 4 x 7.5 mean padding rows = 62, read 32 and written 62
    assert fx["moe.experts_pad"].bytes == (32 + 62) * 64 * 2.0
    assert fx["moe.experts_probs_pad"].bytes == (32 + 62) * 4.0
    # the routed experts' ops are exactly those of an all-FP8 step; everything else is the BF16 step's
    for name, o in fx.items():
        assert o == (all8[name] if name.startswith(ROUTED) else base[name]), name
    # fp8_recipe current (the spec's "fp8-cs" recipe): four kernels per local expert's cast, one tensor allocated each
    cs = _ops(replace(BF16, experts=PRECISIONS["fp8-cs"]))["moe.experts_input.quantize"]
    assert (cs.loop_launches, cs.outputs) == (4 * 4 - 1, 3)
    from cosim.workload.synth.spec import _recipe
    assert (_recipe("fp8", "current"), _recipe("fp8", "blockwise"), _recipe("mxfp8", "current")) == (
        "fp8-cs", "fp8", "mxfp8")
    # a dense layer has no routed experts: unchanged
    assert _ops(FP8_EXPERTS, 0) == _ops(BF16, 0)


def test_bf16_experts_in_an_fp8_step_and_the_timer() -> None:
    from cosim.catalog import load_catalog
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.workload.synth.spec import SyntheticSpec

    # the inverse: FP8 attention and shared expert, BF16 routed experts (no casts, no padding around them)
    inv = _ops(replace(FP8, experts=BF16))
    base, all8 = _ops(BF16), _ops(FP8)
    for name, o in inv.items():
        assert o == (base[name] if name.startswith(ROUTED) else all8[name]), name
    # timed on an H100: the routed experts' GEMMs change, attention's and the shared expert's do not
    spec = SyntheticSpec.model_validate({"model": "qwen3-30b-a3b", "batch": {"global": 8, "micro": 1, "seq": 16}})
    timer = synthetic_kernel_timer(spec, load_catalog().accelerators["h100-sxm5"], None)
    b_ops = layer_ops(CARD, 1, 16.0, 16, SH, BF16)
    f_ops = layer_ops(CARD, 1, 16.0, 16, SH, FP8_EXPERTS)
    tb = dict(zip([o.name for o in b_ops], timer(b_ops)))
    tf = dict(zip([o.name for o in f_ops], timer(f_ops)))
    for name in ("attn.qkv", "attn.o_proj", "moe.shared.fc1", "moe.shared.fc2", "moe.router"):
        assert tf[name] == tb[name], name
    assert tf["moe.experts_fc1"] != tb["moe.experts_fc1"] and tf["moe.experts_input.quantize"] > 0


def test_memory_fp8_copies_of_the_experts_only() -> None:
    rm = ParallelLayout(ep=2).resolve(CARD, 2, where="layout")
    base = memory_per_stage(CARD, rm, 1, 16, 2, "bf16")
    fx = memory_per_stage(CARD, rm, 1, 16, 2, "bf16", MemoryOptions(expert_precision="fp8"))
    all8 = memory_per_stage(CARD, rm, 1, 16, 2, "fp8")
    same = memory_per_stage(CARD, rm, 1, 16, 2, "fp8", MemoryOptions(expert_precision="fp8"))
    assert same == all8
    # routed experts per rank: 8 experts x 3 x 64 x 32 / ep 2 = 24576 parameters, two FP8 copies with scales
    expert = 8 * 3 * 64 * 32 / 2
    (b,), (f,), (a,) = base, fx, all8
    assert f.weights - b.weights == pytest.approx(QUANT_COPIES * CAST * expert)
    assert (f.gradients, f.optimizer) == (b.gradients, b.optimizer)
    assert b.weights < f.weights < a.weights
    # activations (one micro-batch in flight at pp 1): fc1's input (32 rows x 64) and fc2's (32 x 32) are saved as
    # one FP8 copy with scales instead of BF16
    assert f.activations - b.activations == pytest.approx((32 * 64 + 32 * 32) * (CAST - 2.0))
    # DeepSeek's FP8-cached SwiGLU input follows the experts' recipe: with moe_act recomputed, the checkpointed fc1
    # output (32 rows x 2 x 32, BF16) is kept as FP8 + scales in a BF16 step with FP8 experts
    ops = layer_ops(CARD, 1, 16.0, 16, SH, FP8_EXPERTS)
    kept = [layer_activation_bytes(ops, "selective", ["moe_act"], CARD, FP8_EXPERTS, 0.0,
                                   MemoryOptions(moe_act_input_fp8=on)) for on in (False, True)]
    assert kept[0] - kept[1] == pytest.approx(32 * 2 * 32 * 2.0 * (1 - CAST / 2.0))


def test_spec_field_and_errors() -> None:
    from pydantic import ValidationError

    from cosim.workload.synth.spec import SyntheticSpec, memory_options

    s = SyntheticSpec.model_validate({"model": "qwen3-30b-a3b", "batch": {"global": 8, "micro": 1, "seq": 16},
                                      "expert_precision": "fp8"})
    assert memory_options(s).expert_precision == "fp8"
    with pytest.raises(ValidationError):
        SyntheticSpec.model_validate({"model": "qwen3-30b-a3b", "batch": {"global": 8, "micro": 1, "seq": 16},
                                      "expert_precision": "fp4"})


def test_set_key_end_to_end_and_serving_refused() -> None:
    from cosim.scenario import apply_scenario_sets, load_scenario, run_scenario

    scn = load_scenario("dsv3-decode-ep128")
    scn2, _ = apply_scenario_sets(scn, {"workload.synthetic.expert_precision": "fp8"})
    with pytest.raises(CosimInputError, match="expert_precision: a training field"):
        run_scenario(scn2)


def test_expert_precision_equal_to_precision_is_the_default_step() -> None:
    from cosim.scenario import load_scenario, run_scenario

    _, result = run_scenario(load_scenario("qwen3-30b-ep8-dgx-h100"), {"workload.synthetic.expert_precision": "bf16"})
    assert result.summary()["step_time_s"] == 4.602438275288603  # the default scenario, bit for bit
