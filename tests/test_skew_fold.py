"""Partial folding under skewed routing (issue 16 point 2): the expert-data-parallel replicas of an EP rank
are simulated once; the folded step matches the unfolded one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._cards import synth_tiny

CARD = dict(name="tiny", hidden_size=1024, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=128, vocab_size=4096,
            num_experts=32, top_k=2, expert_ffn_size=512)
"""4 MoE layers, d 1024, 8 heads of 128 (2 KV heads), 32 experts top-2 of width 512, vocab 4096."""


def _step(tmp_path: Path, fold: bool | None, routing: str = "zipf:1.2", nodes: int = 4, over: float = 0.0,
          **layout: int) -> tuple[float, int, list[str]]:
    from cosim.replay import ReplayConfig, replay
    from cosim.scenario import build_topology

    topo = build_topology("dgx-h100", None, nodes=nodes,
                          topology_sets={"topology.fabric.oversubscription": over} if over else None)
    syn = synth_tiny(tmp_path, topo, CARD, layout=dict(tp=2, pp=2, **layout), fold=fold, routing=routing,
                     batch={"global": 64, "micro": 1, "seq": 1024})
    res = replay(syn.graph, topo, ReplayConfig(collectives="simulated"))
    return float(res.summary()["step_time_s"]), len(syn.built.ranks), syn.built.notes


@pytest.mark.parametrize("ep", [4, 8])
def test_skewed_step_folds_into_classes_exactly(tmp_path: Path, ep: int) -> None:
    full, n_full, _ = _step(tmp_path, False, ep=ep)
    folded, n, notes = _step(tmp_path, None, ep=ep)
    assert n_full == 32 and n == 2 * ep  # one per (stage, EP rank): 32 ranks -> 8 / 16 classes
    assert any(f"folded 32 ranks into {n} classes" in x for x in notes)
    assert folded == pytest.approx(full, rel=5e-3)


def test_no_partial_fold_without_replicas(tmp_path: Path) -> None:
    _, n, notes = _step(tmp_path, None, ep=16)  # edp 1: every rank of a stage holds other experts
    assert n == 32 and not any("folded" in x for x in notes)


def test_skewed_fold_adds_the_other_ep_groups_on_a_blocking_fabric(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """8:1 oversubscribed fabric, 64 GPUs, ep 16 over two nodes, edp 2: the simulated EP group's all-to-alls
    contend with those of its replica group on the spine; the folded step runs them as replicas."""
    import cosim.replay.collective_map as cmap

    full, _, _ = _step(tmp_path, False, nodes=8, over=8, ep=16)
    folded, n, _ = _step(tmp_path, None, nodes=8, over=8, ep=16)
    assert n == 32
    assert folded == pytest.approx(full, rel=5e-3)
    monkeypatch.setattr(cmap, "class_replicas", lambda rg, c, arrived: [])
    alone, _, _ = _step(tmp_path, None, nodes=8, over=8, ep=16)
    assert alone < full
