"""Muon as the synthetic step's optimizer (``workload.synthetic.optimizer: muon``): its Newton-Schulz GEMMs by hand,
its collectives, its memory and its errors on the 2-layer EP4 PP2 model of tests/test_synth.py."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cosim.capture.config import MoEModelConfig, load_model_config
from cosim.errors import CosimInputError
from cosim.workload.graph import CollType
from cosim.workload.synth import SyntheticSpec
from cosim.workload.synth.costs import layer_params, muon_matrices, muon_ops, newton_schulz_flops
from tests._cards import TINY, synth_tiny


def _synth(tmp_path: Path, topo: object, **kw: Any) -> Any:
    return synth_tiny(tmp_path, topo, **{"fold": False, **kw})


def names_of(rg: Any) -> list[str]:
    return [rg.strings[int(n)] for n in rg.gpu_ops.name]


def _ops(rg: Any) -> list[tuple[str, float]]:
    return [(rg.strings[int(n)], float(f)) for n, f in zip(rg.gpu_ops.name, rg.gpu_ops.flops)]


def test_newton_schulz_flops_by_hand() -> None:
    # X of 64 x 128: A = X X^T 2*64*64*128, A A 2*64^3, B X 2*64*64*128; 5 iterations; the transpose is the same
    one = 2 * 64 * 64 * 128 + 2 * 64 ** 3 + 2 * 64 * 64 * 128
    assert newton_schulz_flops(128, 64) == newton_schulz_flops(64, 128) == 5 * one
    ops = muon_ops([(128.0, 64.0, 3.0)])
    assert [o.name for o in ops] == ["optim.muon.ns_gram", "optim.muon.ns_poly", "optim.muon.ns_update"]
    assert sum(o.flops for o in ops) == 3 * 5 * one
    assert [(o.m, o.n, o.k, o.batch) for o in ops] == [(64, 64, 128, 15), (64, 64, 64, 15), (64, 128, 64, 15)]


def test_muon_takes_every_2d_weight_but_embedding_and_head() -> None:
    # the matrices' elements are the layer's parameters less its 1-D norms (2 x d; MLA: and its 2 latent norms)
    for name in ("deepseek-v3", "kimi-k2", "qwen3-30b-a3b", "mixtral-8x7b"):
        c = load_model_config(name)
        norms = 2 * c.hidden_size + (c.q_lora_rank or 0) + (c.kv_lora_rank or 0)
        for ly in (0, c.num_layers - 1):
            d, e = layer_params(c, ly)
            mats = muon_matrices(c, ly)
            assert sum(r * k * n for r, k, n, x in mats if not x) == d - norms, (name, ly)
            assert sum(r * k * n for r, k, n, x in mats if x) == e, (name, ly)
    tiny = MoEModelConfig(**TINY)  # type: ignore[arg-type]
    # q, k and v apart (muon_split_qkv), o, the router, each expert's fc1 and fc2
    assert muon_matrices(tiny, 0) == [(64.0, 64.0, 1.0, False), (32.0, 64.0, 2.0, False), (64.0, 64.0, 1.0, False),
                                      (8.0, 64.0, 1.0, False), (64.0, 64.0, 8.0, True), (64.0, 32.0, 8.0, True)]
    # TP 2 (blockwise): column-parallel weights halve their rows, row-parallel their columns; the router stays whole
    assert muon_matrices(tiny, 0, tp=2, etp=2) == [(32.0, 64.0, 1.0, False), (16.0, 64.0, 2.0, False),
                                                   (64.0, 32.0, 1.0, False), (8.0, 64.0, 1.0, False),
                                                   (32.0, 64.0, 8.0, True), (64.0, 16.0, 8.0, True)]


def test_one_muon_step_by_hand(tmp_path: Path, dgx: object) -> None:
    # 8 GPUs: pp 2 x dp 4, ep 4 inside each stage (edp 1). Each rank's stage holds one MoE layer.
    adam = _synth(tmp_path, dgx)
    muon = _synth(tmp_path, dgx, optimizer="muon")
    ns = (newton_schulz_flops(64, 64) + 2 * newton_schulz_flops(32, 64) + newton_schulz_flops(64, 64)
          + newton_schulz_flops(8, 64))  # q, k, v, o, router
    experts = 2 * (newton_schulz_flops(64, 64) + newton_schulz_flops(64, 32))  # 8 experts / ep 4, each fc1 and fc2
    layer = 64 * 16 * (4 * 2 + 2 * 2) + 2 * 64 + 64 * 8  # dense parameters: attention, 2 norms, router
    mats = 64 * 16 * (4 * 2 + 2 * 2) + 64 * 8
    local_exp = 2 * 3 * 64 * 32
    for ra, rm in zip(adam.graph.ranks, muon.graph.ranks):
        stage = rm.rank // 4
        dense = layer + 256 * 64 + (64 if stage == 1 else 0)  # + embedding (stage 0) or LM head + final norm
        ops = _ops(rm)
        # dist_muon: the dense matrices are dealt over the 4 DP ranks, the experts' over edp 1
        assert sum(f for n, f in ops if n.startswith("optim.muon.ns_")) == pytest.approx(ns / 4 + experts)
        mom = [f for n, f in ops if n == "optim.muon.momentum"]
        assert mom == [pytest.approx(4.0 * (mats / 4 + local_exp))]
        # its bytes: per owned parameter 26 (momentum, Newton-Schulz input and output, master, bf16 parameter) and
        # 10 for the bf16 gradient (copied to fp32 and read), and the zeroing of the rank's whole bf16 gradient buffer
        nbytes = [float(b) for n, b in zip(names_of(rm), rm.gpu_ops.bytes) if n == "optim.muon.momentum"]
        assert nbytes == [pytest.approx((mats / 4 + local_exp) * (26 + 10) + (dense + local_exp) * 2)]
        # Adam on the rest of this rank's share: embedding / head and norms, 12 FLOPs per parameter
        rest = (dense - mats) / 4
        assert [f for n, f in ops if n == "optim.adam"] == [pytest.approx(12.0 * rest)]

        def colls(rg: Any) -> Counter:
            C = rg.collectives
            return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c]))
                           for c in range(len(C)) if CollType(int(C.type[c])).name != "ALL_TO_ALL")

        want = colls(ra)
        # the gradient reduce-scatter becomes an all-reduce of the same bf16 bytes; the parameter gather stays
        want[("ALL_REDUCE", 4, float(dense * 2))] += want.pop(("REDUCE_SCATTER", 4, float(dense * 2)))
        assert colls(rm) == want
        # the parameters are gathered after the step (not under the next forward): the last op of the rank
        names = [n for n, _ in ops]
        assert names[-1] == "optim.dp_param_all_gather"
    # memory: one fp32 momentum in place of Adam's two moments: optimizer state 8 bytes per parameter, not 12
    for a, m in zip(adam.memory, muon.memory):
        assert m.optimizer == pytest.approx(a.optimizer * 8 / 12)


def test_plain_muon_without_distribution(tmp_path: Path, dgx: object) -> None:
    syn = _synth(tmp_path, dgx, optimizer="muon", layout=dict(pp=2, ep=4, zero=0))
    ns = (2 * newton_schulz_flops(64, 64) + 2 * newton_schulz_flops(32, 64) + newton_schulz_flops(8, 64)
          + 2 * (newton_schulz_flops(64, 64) + newton_schulz_flops(64, 32)))
    for rg in syn.graph.ranks:  # every rank orthogonalizes all of its stage's matrices, gathers nothing
        ops = _ops(rg)
        assert sum(f for n, f in ops if n.startswith("optim.muon.ns_")) == pytest.approx(ns)
        assert not any(n.endswith("param_all_gather") for n, _ in ops)


def test_muon_errors(tmp_path: Path, dgx: object) -> None:
    with pytest.raises(CosimInputError, match=r"optimizer: muon needs layout\.zero 0"):
        _synth(tmp_path, dgx, optimizer="muon", layout=dict(pp=2, ep=4, zero="fsdp"))
    with pytest.raises(CosimInputError, match="overlap_param_gather must be false"):
        _synth(tmp_path, dgx, optimizer="muon", layout=dict(pp=2, ep=4, overlap_param_gather=True))
    with pytest.raises(Exception, match="optimizer"):
        SyntheticSpec.model_validate(dict(model="x", batch={"global": 8, "micro": 1, "seq": 64}, optimizer="sgd"))


def test_optimizer_is_a_set_key() -> None:
    from cosim.scenario import Scenario, apply_scenario_sets

    scn = Scenario.model_validate({"name": "t", "topology": "dgx-h100", "workload": {"synthetic": {
        "model": "qwen3-moe-mini", "layout": {"ep": 8}, "batch": {"global": 16, "micro": 2, "seq": 256}}}})
    out, rest = apply_scenario_sets(scn, {"workload.synthetic.optimizer": "muon"})
    assert out.workload.synthetic.optimizer == "muon" and not rest  # type: ignore[union-attr]
