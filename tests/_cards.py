"""The tiny model card the synthesis tests work by hand, and the helper that synthesizes a step of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TINY: dict[str, Any] = dict(name="tiny2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16,
                            vocab_size=256, num_experts=8, top_k=2, expert_ffn_size=32)
"""2 MoE layers, d 64, 4 heads of 16 (2 KV heads), 8 experts top-2 of width 32, vocab 256."""


def synth_tiny(tmp_path: Path, topo: Any, card: dict[str, Any] | None = None, **spec: Any) -> Any:
    """Synthesize a step of ``card`` (default :data:`TINY`, written to ``tmp_path/<name>.yaml``) on ``topo`` with the
    analytical kernel timer: PP2 EP4, 8 sequences of 64 tokens, one per micro-batch, bf16; ``spec`` overrides or
    adds :class:`cosim.workload.synth.SyntheticSpec` fields."""
    import yaml

    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.workload.synth import SyntheticSpec, synthesize

    card = TINY if card is None else card
    f = tmp_path / f"{card['name']}.yaml"
    f.write_text(yaml.safe_dump(card))
    base: dict[str, Any] = dict(model=str(f), layout=dict(pp=2, ep=4), batch={"global": 8, "micro": 1, "seq": 64},
                                precision="bf16")
    return synthesize(SyntheticSpec.model_validate({**base, **spec}), topo, kernel_timer=synthetic_kernel_timer)
