"""Fine-grained activation offloading (Megatron-Core ``--offload-modules``) in a synthesized step, by hand on a
2-layer EP4 PP2 model: the bytes of every D2H and H2D copy, their streams and waits, the memory before and after,
and the one-line errors."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosim.capture.config import MoEModelConfig
from cosim.errors import CosimInputError
from cosim.workload.graph import CopyKind, EdgeKind, GpuKind, OpClass
from cosim.workload.synth.layout import ParallelLayout
from cosim.workload.synth.memory import MemoryOptions, memory_per_stage
from tests._cards import TINY, synth_tiny

# TINY (tests/_cards.py): 2 MoE layers, d 64, 8 experts top-2 of width 32
FC1 = 64 * 2 * 64 * 2          # expert_fc1: fc1's bf16 input, 64 tokens x top-2 rows of d 64 (EP4, uniform)
ACT = 64 * 2 * 64 * 2 + 64 * 2 * 32 * 2  # moe_act: the SwiGLU's input (fc1's output, 2 x 32) and fc2's input


def _synth(tmp_path: Path, topo: object, **kw: Any) -> Any:
    return synth_tiny(tmp_path, topo, **{"offload_modules": ["expert_fc1", "moe_act"], "coalesce": False, **kw})


def _copies(rg: Any) -> list[tuple[int, str]]:
    names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    return [(j, n) for j, n in enumerate(names) if n.startswith("offload.")]


def test_every_offload_copy_of_a_2_layer_ep4_pp2_step_by_hand(tmp_path: Path, dgx: object) -> None:
    """One layer per stage, 2 micro-batches: per micro-batch a D2H copy of each group in the forward (fc1's input
    16384 bytes; the SwiGLU's and fc2's inputs 24576) and an H2D copy of each in the backward, host copies on
    their own streams; each reload waits for its offload, the first backward op of a group for its reload, and a
    copy alone takes its bytes over the host link (PCIe Gen5 x16 at 87 %, 2 x 0.5 us)."""
    syn = _synth(tmp_path, dgx)
    assert syn.built.microbatches == 2 and len(syn.graph.ranks) == 2
    for rg in syn.graph.ranks:
        G = rg.gpu_ops
        names = [rg.strings[int(x)] for x in G.name]
        cp = _copies(rg)
        got = Counter((n, float(G.bytes[j]), int(G.copy_kind[j]), int(G.stream[j])) for j, n in cp)
        assert got == Counter({("offload.expert_fc1.d2h", FC1, CopyKind.DTOH, 26): 2,
                               ("offload.moe_act.d2h", ACT, CopyKind.DTOH, 26): 2,
                               ("offload.expert_fc1.h2d", FC1, CopyKind.HTOD, 27): 2,
                               ("offload.moe_act.h2d", ACT, CopyKind.HTOD, 27): 2}), got
        for j, _ in cp:
            assert G.kind[j] == GpuKind.MEMCPY and G.cls[j] == OpClass.MEMCPY
            assert G.dur[j] == pytest.approx(1e-6 + float(G.bytes[j]) / (64e9 * 0.87))
        nh = len(rg.host_ops)
        waits = [(int(s) - nh, int(d) - nh) for s, d, k in zip(rg.edges.src, rg.edges.dst, rg.edges.kind)
                 if k == EdgeKind.EVENT_WAIT and s >= nh and d >= nh]
        # every reload waits for the offload of its group; the offload for the group's last forward op
        for j, n in cp:
            src = [names[s] for s, d in waits if d == j]
            if n.endswith(".h2d"):
                assert n.replace(".h2d", ".d2h") in src
            else:
                assert src == ["moe.experts_fc1" if "fc1" in n else "moe.experts_fc2"]
        # the backward waits: fc1's data gradient for fc1's reload, fc2's for moe_act's
        waited = Counter((names[s], names[d]) for s, d in waits if names[s].endswith(".h2d"))
        assert waited == Counter({("offload.expert_fc1.h2d", "moe.experts_fc1.dgrad"): 2,
                                  ("offload.moe_act.h2d", "moe.experts_fc2.dgrad"): 2}), waited
        # and the forward does not wait for an offload
        assert not [d for s, d in waits if names[s].endswith(".d2h") and not names[d].endswith(".h2d")]


def test_offloaded_copies_share_the_host_link_and_cost_time(tmp_path: Path, dgx: object) -> None:
    """Replayed, the copies move on each GPU's PCIe route to its CPU (bytes on the links) and the step is no
    faster than without them."""
    from cosim.replay import ReplayConfig, replay

    on = _synth(tmp_path, dgx)
    off = _synth(tmp_path, dgx, offload_modules=[])
    r_on, r_off = (replay(s.graph, dgx, ReplayConfig(collectives="simulated")) for s in (on, off))
    # 2 ranks x 2 micro-batches x (16384 + 24576) bytes each way, on the GPU's PCIe link and its switch's uplink
    assert r_on.link_usage.memcpy_bytes.sum() == pytest.approx(2 * 2 * 2 * (FC1 + ACT) * 2)
    assert r_off.link_usage is None or r_off.link_usage.memcpy_bytes.sum() == 0
    end_on = max(float(r.gpu_end.max()) for r in r_on.runs)
    end_off = max(float(r.gpu_end.max()) for r in r_off.runs)
    assert end_on >= end_off


def test_offloading_memory_before_and_after_by_hand() -> None:
    """Each offloaded group leaves the GPU; one layer's groups stay on top of the peak (being copied, reloaded
    ahead of the backward, or kept by the margin). Stage 0 of 1F1B (pp 2, 2 micro-batches) holds 2 micro-batches
    of its one layer: 2 x 40960 bytes less, 40960 more; the last stage holds one: no change. Under ``moe_act``
    recomputation the moe_act group is the checkpoint's input only (fc2's input is freed and recomputed)."""
    card = MoEModelConfig(**TINY)  # type: ignore[arg-type]
    rm = ParallelLayout(pp=2, ep=4).resolve(card, 8)
    before = memory_per_stage(card, rm, 1, 64, 2, "bf16")
    after = memory_per_stage(card, rm, 1, 64, 2, "bf16", MemoryOptions(offload_modules=("expert_fc1", "moe_act")))
    assert before[0].activations - after[0].activations == pytest.approx(2 * (FC1 + ACT) - (FC1 + ACT))
    assert before[1].activations - after[1].activations == pytest.approx(0.0)
    assert [(b.weights, b.gradients, b.optimizer) for b in before] == [(a.weights, a.gradients, a.optimizer)
                                                                       for a in after]
    rm_r = ParallelLayout(pp=2, ep=4, recompute="selective", recompute_modules=["moe_act"]).resolve(card, 8)
    b_r = memory_per_stage(card, rm_r, 1, 64, 2, "bf16")[0]
    a_r = memory_per_stage(card, rm_r, 1, 64, 2, "bf16", MemoryOptions(offload_modules=("expert_fc1", "moe_act")))[0]
    assert b_r.activations - a_r.activations == pytest.approx(FC1 + 64 * 2 * 64 * 2)


@pytest.mark.parametrize(("kw", "msg"), [
    (dict(offload_modules=["attn_proj"]), "attn_proj needs core_attn"),
    (dict(layout=dict(pp=2, ep=4, recompute="full")), "nothing to offload"),
    (dict(layout=dict(pp=2, ep=4, recompute="selective", recompute_modules=["moe"])),
     "cannot offload expert_fc1, moe_act while recomputing the whole MoE"),
    (dict(offload_modules=["moe_act", "moe_act"]), "names a module twice"),
])
def test_bad_offload_settings_are_one_line(tmp_path: Path, dgx: object, kw: dict[str, Any], msg: str) -> None:
    with pytest.raises(CosimInputError, match=msg) as e:
        _synth(tmp_path, dgx, **kw)
    assert "workload.synthetic.offload_modules" in str(e.value) and "\n" not in str(e.value)


def test_unknown_offload_module_is_one_line_from_the_command_line(tmp_path: Path) -> None:
    """``--set workload.synthetic.offload_modules=[...]`` with a module Megatron-Core does not offload: a one-line
    error naming the field."""
    import subprocess
    import sys

    f = tmp_path / "tiny2.yaml"
    f.write_text(yaml.safe_dump(TINY))
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump({"name": "t", "topology": "dgx-h100", "workload": {"synthetic": {
        "model": str(f), "layout": {"pp": 2, "ep": 4}, "batch": {"global": 8, "micro": 1, "seq": 64}}}}))
    out = subprocess.run([sys.executable, "-m", "cosim", "run", str(scn), "--set",
                          "workload.synthetic.offload_modules=[expert_fc2]"], capture_output=True, text=True)
    assert out.returncode != 0
    err = out.stderr.strip().splitlines()
    assert len(err) == 1 and "offload_modules" in err[0], out.stderr


def test_the_modelzoo_mxfp8_rows_groups_by_hand() -> None:
    """Qwen3-235B-A22B, MXFP8, EP64, micro-batch 3 x 4096 tokens, recompute moe_act and layernorm (the ModelZoo GB200
    row): per layer and micro-batch ``expert_fc1`` offloads fc1's MXFP8 input (98304 rows x 4096, 1 byte + one scale
    byte per 32) and ``moe_act`` the checkpoint's bf16 input (fc1's output, 98304 x 2 x 1536)."""
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.costs import PRECISIONS, Shard, layer_ops
    from cosim.workload.synth.memory import offload_group_bytes

    card = load_model_config("qwen3-235b-a22b")
    p = PRECISIONS["mxfp8"]
    ops = layer_ops(card, 5, 3 * 4096.0, 4096, Shard(ep=64), p)
    rows = 3 * 4096 * 8
    got = offload_group_bytes(ops, "selective", ["moe_act", "layernorm"], card, p, 0.0, ["expert_fc1", "moe_act"])
    assert got == pytest.approx({"expert_fc1": rows * 4096 * (1 + 1 / 32), "moe_act": rows * 2 * 1536 * 2})
