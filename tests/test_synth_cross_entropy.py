"""Round 11 (issue 15 point 7): Megatron-Core's unfused cross-entropy loss (``cross_entropy_fusion: false``), checked
by hand: its kernels over the logits, their backward, what they save, and that the spec field reaches the graph."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosim.capture.config import MoEModelConfig
from cosim.workload.synth.costs import Shard, backward_ops, head_ops, unfused_cross_entropy_ops
from tests._cards import TINY


def test_unfused_cross_entropy_bytes_by_hand() -> None:
    """4 tokens x 10 logits (n = 40): forward the fp32 cast (6 B per element: 240), max (4: 160), subtraction,
    exponential, division (8 each: 320) and sum (160) = 1520 B = 38 n; backward the in-place scaling of the softmax
    (8 n = 320) then the cast of the fp32 gradient to bf16 (6 n = 240) = 560 B = 14 n; the softmax saved (4 n = 160),
    as the fused op saves."""
    ops = unfused_cross_entropy_ops(4.0, 10.0)
    assert [o.name for o in ops] == ["head.cross_entropy.float", "head.cross_entropy.max",
                                     "head.cross_entropy.sub_max", "head.cross_entropy.exp",
                                     "head.cross_entropy.sum_exp", "head.cross_entropy.softmax"]
    assert [o.bytes for o in ops] == [240.0, 160.0, 320.0, 320.0, 160.0, 320.0]
    assert sum(o.bytes for o in ops) == 1520.0
    assert sum(o.saved for o in ops) == 160.0
    bwd = backward_ops(ops)
    assert [(o.name, o.bytes) for o in bwd] == [("head.cross_entropy.softmax.bwd", 320.0),
                                                ("head.cross_entropy.float.bwd", 240.0)]
    assert all(o.bwd for o in bwd)


def test_head_ops_fused_and_unfused() -> None:
    """TINY at TP2 with sequence parallelism, 64 tokens: the rank's 128 logits per token; everything but the loss is
    the same ops, and both save the fp32 softmax (64 x 128 x 4 = 32768 B)."""
    card = MoEModelConfig(**TINY)
    sh = Shard(tp=2, sequence_parallel=True)
    fused, unfused = head_ops(card, 64.0, sh), head_ops(card, 64.0, sh, cross_entropy_fusion=False)
    rest = ["head.norm", "head.sp_all_gather", "head.lm_head"]
    assert [o.name for o in fused] == [*rest, "head.cross_entropy", "head.tp_loss_all_reduce"]
    assert [o.name for o in unfused][:3] == rest and unfused[-1].name == "head.tp_loss_all_reduce"
    n = 64.0 * 128.0
    loss = [o for o in unfused if o.name.startswith("head.cross_entropy")]
    assert sum(o.bytes for o in loss) == 38 * n
    assert sum(o.bytes for o in backward_ops(loss)) == 14 * n
    assert sum(o.saved for o in fused) == sum(o.saved for o in unfused)
    assert [o.saved for o in fused if o.name == "head.cross_entropy"] == [4 * n]


def test_spec_cross_entropy_fusion_reaches_the_last_stage(tmp_path: Path, dgx: object) -> None:
    """``cross_entropy_fusion: false`` puts the six loss kernels on the last stage (TINY, PP2: 64 tokens x 256
    logits per micro-batch, 8 micro-batches) and nothing else changes: the fused step's other GPU ops are all there,
    as many times."""
    from tests._cards import synth_tiny

    def ops(**spec: object) -> dict[str, int]:
        res = synth_tiny(tmp_path, dgx, **spec)
        names: dict[str, int] = {}
        for rg in res.graph.ranks:
            G = rg.gpu_ops
            for i in range(len(G)):
                nm = rg.strings[int(G.name[i])]
                names[nm] = names.get(nm, 0) + 1
        return names

    fused, unfused = ops(), ops(cross_entropy_fusion=False)
    assert "head.cross_entropy" in fused and "head.cross_entropy" not in unfused
    for k in ("float", "max", "sub_max", "exp", "sum_exp", "softmax"):
        assert unfused.get(f"head.cross_entropy.{k}", 0) > 0, k
    assert unfused["head.cross_entropy.float"] == fused["head.cross_entropy"]  # once per micro-batch and last rank
    assert unfused["head.cross_entropy.float.bwd"] == fused["head.cross_entropy.bwd"]
    assert "head.cross_entropy.max.bwd" not in unfused
    same = {k: v for k, v in fused.items() if not k.startswith("head.cross_entropy")}
    assert {k: unfused[k] for k in same} == same


@pytest.mark.parametrize("fusion", [True, False])
def test_run_case_field_reaches_the_spec(fusion: bool) -> None:
    """training.yaml's ``cross_entropy_fusion`` becomes the synthetic spec's (the ModelZoo H100 rows: false)."""
    from validation.e2e import run as R

    _, cases = R.load_cases()
    mz = [c for c in cases if c.id.startswith("mz-qwen3-235b-h100-256-bf16")]
    assert len(mz) == 5 and all(not c.cross_entropy_fusion for c in mz)
    case = mz[0].model_copy(update={"cross_entropy_fusion": fusion})
    scn = R._scenario(case, 16, "dgx-h100", 32, "none")
    assert scn.workload.synthetic.cross_entropy_fusion is fusion


def test_set_key_reaches_the_step_and_serving_refuses_it() -> None:
    """``--set workload.synthetic.cross_entropy_fusion=false`` (a string, as the command line gives it) reaches the
    spec of a training scenario and puts the unfused kernels in its graph; a serving step (no loss) refuses it with
    a one-line error naming the field."""
    from cosim.errors import CosimInputError
    from cosim.scenario import apply_scenario_sets, load_scenario, run_scenario

    scn, _ = apply_scenario_sets(load_scenario("qwen3-30b-ep8-dgx-h100"),
                                 {"workload.synthetic.cross_entropy_fusion": "false"})
    assert scn.workload.synthetic.cross_entropy_fusion is False
    dec = load_scenario("dsv3-decode-ep128")
    with pytest.raises(CosimInputError, match=r"^workload\.synthetic\.cross_entropy_fusion: a training field"):
        run_scenario(dec, {"workload.synthetic.cross_entropy_fusion": "false"})  # as `cosim run ... --set` does
