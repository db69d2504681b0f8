"""Megatron-Core's ``overlap_grad_reduce`` / ``overlap_param_gather`` (layout fields), checked by hand on the
2-layer tiny card: the exact size, position and dependencies of every DP gradient reduce-scatter and parameter
all-gather of one step with each flag on and off.

The case: 8 GPUs, pp 1, ep 4 (dp 8 for the dense parameters, edp 2 for the experts), one micro-batch of 64 tokens,
buckets of 20000 parameters. Parameters per rank (tp 1): embedding 256 x 64 = 16384; a layer's dense ones
64 x 16 x (4 x 2 + 2 x 2) (q, k, v, o) + 2 x 64 (norms) + 64 x 8 (router) = 12928, its experts 8 x 3 x 64 x 32 / ep 4
= 12288; the LM head and final norm 16384 + 64 = 16448. The backward completes head, layer 1, layer 0, embedding:
dense buckets A = {head, layer 1} (16448 + 12928 = 29376 >= 20000, closed at layer 1) and B = {layer 0, embedding}
(29312, closed at the embedding); the expert bucket C = {layer 1, layer 0} (24576, closed at layer 0)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from cosim.errors import CosimInputError
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType, EdgeKind
from cosim.workload.synth import SyntheticSpec, synthesize
from tests._cards import TINY

A, B, C = 16448 + 12928, 12928 + 16384, 2 * 12288  # bucket parameters (module docstring)


def _step(tmp_path: Path, topo: object, global_batch: int = 8, **layout: object) -> tuple[list[str], list[dict[str, Any]], Any]:
    """One rank's GPU ops of the case: names, and per op its stream, collective (type, group size, input bytes)
    and the GPU ops it waits for (cross-stream edges), by index."""
    f = tmp_path / "tiny2.yaml"
    f.write_text(yaml.safe_dump(TINY))
    spec = SyntheticSpec.model_validate(dict(model=str(f), layout={"ep": 4, "grad_bucket_params": 20000, **layout},
                                             batch={"global": global_batch, "micro": 1, "seq": 64}, precision="bf16"))
    syn = synthesize(spec, topo, kernel_timer=synthetic_kernel_timer)
    rg = syn.graph.ranks[0]
    names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    nh = len(rg.host_ops)
    ops: list[dict[str, Any]] = [{"stream": int(s), "waits": set(), "after": set()} for s in rg.gpu_ops.stream]
    for s, d, k in zip(rg.edges.src, rg.edges.dst, rg.edges.kind):
        if s >= nh and d >= nh:
            ops[int(d) - nh]["waits" if int(k) == EdgeKind.EVENT_WAIT else "after"].add(int(s) - nh)
    Cl = rg.collectives
    for c in range(len(Cl)):
        ops[int(Cl.gpu_op[c])]["coll"] = (CollType(int(Cl.type[c])).name, int(Cl.group_size[c]), float(Cl.in_bytes[c]))
    return names, ops, syn


def _dp_ops(names: list[str]) -> list[int]:
    return [j for j, n in enumerate(names) if n.startswith(("grad.", "optim."))]


def _first(names: list[str], name: str, k: int = 0) -> int:
    return [j for j, n in enumerate(names) if n == name][k]


def test_both_on_buckets_reduce_under_the_backward_and_gather_under_the_forward(tmp_path: Path, dgx: object) -> None:
    names, ops, syn = _step(tmp_path, dgx)  # the defaults: both on
    assert syn.graph.ranks[0].rank == 0 and syn.built.microbatches == 1
    dp = _dp_ops(names)
    got = [(names[j], ops[j]["coll"]) if "coll" in ops[j] else (names[j], None) for j in dp]
    assert got == [
        # ahead of the forward, in the order it uses them: B (embedding, layer 0), C (experts 0, 1), A (layer 1, head)
        ("optim.dp_param_all_gather", ("ALL_GATHER", 8, B * 2 / 8)),   # bf16 parameters, input: one of 8 shards
        ("optim.edp_param_all_gather", ("ALL_GATHER", 2, C * 2 / 2)),
        ("optim.dp_param_all_gather", ("ALL_GATHER", 8, A * 2 / 8)),
        # the backward's buckets in the order it closes them, bf16 gradients
        ("grad.dp_reduce_scatter", ("REDUCE_SCATTER", 8, A * 2.0)),
        ("grad.edp_reduce_scatter", ("REDUCE_SCATTER", 2, C * 2.0)),
        ("grad.dp_reduce_scatter", ("REDUCE_SCATTER", 8, B * 2.0)),
        ("optim.grad_norm_all_reduce", ("ALL_REDUCE", 8, 8.0)),
        ("optim.adam", None),
    ]
    ag_b, ag_c, ag_a, rs_a, rs_c, rs_b, norm, adam = dp
    assert dp[:3] == [0, 1, 2] and all(ops[j]["stream"] == ops[0]["stream"] != ops[adam]["stream"] for j in dp[:7])  # the dp stream
    assert not any(ops[j]["waits"] for j in dp[:3])  # issued at the step's start
    # each layer's first forward op waits for the gathers of its buckets; nothing else waits for a gather
    emb, norm0, norm1 = _first(names, "embed.lookup"), _first(names, "attn.norm"), _first(names, "attn.norm", 1)
    head = min(j for j, n in enumerate(names) if n.startswith("head."))
    waiting = {g: sorted(j for j, o in enumerate(ops) if g in o["waits"]) for g in (ag_b, ag_c, ag_a)}
    assert waiting == {ag_b: [emb, norm0], ag_c: [norm0, norm1], ag_a: [norm1, head]}
    assert emb < norm0 < norm1 < head < rs_a
    # a bucket's reduce-scatter follows the backward op that completes it (layer 1's, layer 0's last: its input
    # norm's backward; the embedding's); no compute op waits for it but Adam (the norm all-reduce follows it)
    assert [names[r - 1] for r in (rs_a, rs_c, rs_b)] == ["attn.norm.bwd", "attn.norm.bwd", "embed.lookup.bwd"]
    assert rs_a - 1 == _first(names, "attn.norm.bwd") and rs_c - 1 == _first(names, "attn.norm.bwd", 1)
    for r, nxt in ((rs_a, rs_c), (rs_c, rs_b), (rs_b, norm)):  # nxt: the next op on the dp stream
        assert ops[r]["waits"] == {r - 1}
        assert {j for j, o in enumerate(ops) if r in o["waits"] | o["after"]} == {nxt, norm, adam}
    assert {rs_a, rs_c, rs_b, norm} <= ops[adam]["waits"]
    assert adam == len(names) - 1  # nothing after Adam: the gathers ran ahead


def test_param_gather_off_runs_after_adam(tmp_path: Path, dgx: object) -> None:
    names, ops, _ = _step(tmp_path, dgx, overlap_param_gather=False)
    dp = _dp_ops(names)
    assert [(names[j], ops[j].get("coll")) for j in dp] == [
        ("grad.dp_reduce_scatter", ("REDUCE_SCATTER", 8, A * 2.0)),
        ("grad.edp_reduce_scatter", ("REDUCE_SCATTER", 2, C * 2.0)),
        ("grad.dp_reduce_scatter", ("REDUCE_SCATTER", 8, B * 2.0)),
        ("optim.grad_norm_all_reduce", ("ALL_REDUCE", 8, 8.0)),
        ("optim.adam", None),
        # every bucket gathered after Adam, in the backward's bucket order, exposed at the step's end
        ("optim.dp_param_all_gather", ("ALL_GATHER", 8, A * 2 / 8)),
        ("optim.edp_param_all_gather", ("ALL_GATHER", 2, C * 2 / 2)),
        ("optim.dp_param_all_gather", ("ALL_GATHER", 8, B * 2 / 8)),
    ]
    adam = dp[4]
    assert all(adam in ops[j]["waits"] for j in dp[5:]) and dp[5:] == [adam + 1, adam + 2, adam + 3]
    assert not any(j in o["waits"] for o in ops for j in dp[5:])  # no forward waits for them


def test_grad_reduce_off_one_bucket_per_buffer_after_the_backward(tmp_path: Path, dgx: object) -> None:
    # Megatron: bucket_size None without overlap_grad_reduce (one bucket per chunk and buffer); finalize_model_grads
    # reduces them after the last backward, and Adam waits for them
    dense = 16384 + 2 * 12928 + 16448
    for gather_ahead in (True, False):
        names, ops, _ = _step(tmp_path, dgx, overlap_grad_reduce=False, overlap_param_gather=gather_ahead)
        dp = _dp_ops(names)
        gathers = [("optim.dp_param_all_gather", ("ALL_GATHER", 8, dense * 2 / 8)),
                   ("optim.edp_param_all_gather", ("ALL_GATHER", 2, C * 2 / 2))]
        assert [(names[j], ops[j].get("coll")) for j in dp] == [*(gathers if gather_ahead else []),
            ("grad.dp_reduce_scatter", ("REDUCE_SCATTER", 8, dense * 2.0)),
            ("grad.edp_reduce_scatter", ("REDUCE_SCATTER", 2, C * 2.0)),
            ("optim.grad_norm_all_reduce", ("ALL_REDUCE", 8, 8.0)),
            ("optim.adam", None), *([] if gather_ahead else gathers)]
        rs = dp[2] if gather_ahead else dp[0]
        last_bwd = _first(names, "embed.lookup.bwd")
        assert rs == last_bwd + 1 and ops[rs]["waits"] == {last_bwd}  # after every backward op
        assert {rs, rs + 1} <= ops[rs + 3]["waits"]  # Adam waits for both
        if gather_ahead:  # one bucket per buffer: every layer's first forward op waits for it
            emb, norm0, norm1 = _first(names, "embed.lookup"), _first(names, "attn.norm"), _first(names, "attn.norm", 1)
            head = min(j for j, n in enumerate(names) if n.startswith("head."))
            assert sorted(j for j, o in enumerate(ops) if dp[0] in o["waits"]) == [emb, norm0, norm1, head]
            assert sorted(j for j, o in enumerate(ops) if dp[1] in o["waits"]) == [norm0, norm1]


def test_zero0_all_reduces_and_fsdp_keeps_its_own_gathers(tmp_path: Path, dgx: object) -> None:
    names, ops, _ = _step(tmp_path, dgx, zero=0)
    assert [(names[j], ops[j].get("coll")) for j in _dp_ops(names)][:3] == [
        ("grad.dp_all_reduce", ("ALL_REDUCE", 8, A * 2.0)), ("grad.edp_all_reduce", ("ALL_REDUCE", 2, C * 2.0)),
        ("grad.dp_all_reduce", ("ALL_REDUCE", 8, B * 2.0))]
    assert not any("param_all_gather" in n for n in names)
    names, _, _ = _step(tmp_path, dgx, zero="fsdp")
    assert not any(n.startswith("optim.") and "gather" in n for n in names)
    assert sum(n.startswith("fsdp.") for n in names) > 0


def test_flags_are_validated_and_settable(tmp_path: Path, dgx: object) -> None:
    from cosim.scenario import apply_scenario_sets, load_scenario

    with pytest.raises(CosimInputError, match=r"layout\.overlap_param_gather: needs zero 1"):
        _step(tmp_path, dgx, zero=0, overlap_param_gather=True)
    root = Path(__file__).resolve().parent.parent
    scn = load_scenario(root / "workloads/scenarios/dsv3-1024.yaml")
    scn2, rest = apply_scenario_sets(scn, {"workload.synthetic.layout.overlap_param_gather": "false",
                                           "workload.synthetic.layout.overlap_grad_reduce": "false"})
    lay = scn2.workload.synthetic.layout  # type: ignore[union-attr]
    assert (lay.overlap_param_gather, lay.overlap_grad_reduce, rest) == (False, False, {})
    scn3, _ = apply_scenario_sets(scn, {"workload.synthetic.layout.overlap_param_gather": "true"})
    assert scn3.workload.synthetic.layout.overlap_param_gather is True  # type: ignore[union-attr]


def test_every_e2e_row_states_its_flags_and_the_runner_passes_them() -> None:
    # each Megatron row's flags come from its config (training.yaml's header); FSDP rows: not applicable
    from validation.e2e.run import _scenario, load_cases

    _, cases = load_cases()
    for c in cases:
        assert (c.overlap_grad_reduce is None and c.overlap_param_gather is None) == c.fsdp, c.id
    dsv3 = next(c for c in cases if c.id == "dsv3-h100-1024-fp8")  # the 25.09 run script: overlap_grad_reduce False
    lay = _scenario(dsv3, 16, "dgx-h100", 128, "none").workload.synthetic.layout  # type: ignore[union-attr]
    assert (lay.overlap_grad_reduce, lay.overlap_param_gather) == (False, True)
    fsdp = next(c for c in cases if c.fsdp)
    lay = _scenario(fsdp, 16, "dgx-h100", fsdp.gpus // 8, "none").workload.synthetic.layout  # type: ignore[union-attr]
    assert lay.overlap_param_gather is None and lay.zero == "fsdp"


def test_dualpipe_zero_bubble_reduces_a_layer_after_its_weight_gradients(tmp_path: Path, dgx: object) -> None:
    """DualPipe splits the last backward of a direction into B and W (zero-bubble): a gradient bucket can be
    reduced only once the W pass has produced its weight gradients, so every reduce-scatter comes after the last
    weight-gradient GEMM of the layers it closes (by hand: one layer per chunk here, so after that chunk's W)."""
    names, ops, _ = _step(tmp_path, dgx, global_batch=16, pp=2, schedule="dualpipe")
    wgrad = [j for j, n in enumerate(names) if n.endswith(".wgrad")]
    grads = [j for j, n in enumerate(names) if n.startswith("grad.")]
    assert wgrad and grads
    assert max(grads) > max(wgrad)  # the final W pass's buckets follow it
    for j in grads:  # each reduction waits (through the stream order) for a compute op issued after every W before it
        assert max(ops[j]["after"] | ops[j]["waits"]) >= max(w for w in wgrad if w < j)


def test_megatron_buckets_only_the_first_stage(tmp_path: Path, dgx: object) -> None:
    """Megatron-Core sets the bucket size to None on every pipeline stage but the first (and every model chunk but
    the first): pp 2 (dp 4, edp 1), buckets of 10000 parameters. Stage 0 (rank 0) backward: layer 0's 12928 dense
    parameters close a bucket, the embedding's 16384 another; stage 1 (rank 4): head 16448 + layer 1 12928 in one
    bucket, not two, in bf16."""
    _, _, syn = _step(tmp_path, dgx, global_batch=16, pp=2, grad_bucket_params=10000)
    got = {}
    for rg in syn.graph.ranks:
        nm = [rg.strings[int(x)] for x in rg.gpu_ops.name]
        Cl = rg.collectives
        got[rg.rank] = [(nm[int(Cl.gpu_op[c])], float(Cl.in_bytes[c])) for c in range(len(Cl))
                        if nm[int(Cl.gpu_op[c])].startswith("grad.")]
    assert got[0] == [("grad.dp_reduce_scatter", 12928 * 2.0), ("grad.dp_reduce_scatter", 16384 * 2.0)]
    assert got[4] == [("grad.dp_reduce_scatter", (16448 + 12928) * 2.0)]
