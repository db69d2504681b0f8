"""Capture configuration: presets, validation, skew parsing; and that cosim
works without torch. Needs no torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cosim.capture.config import CaptureOptions, MoEModelConfig, list_presets, load_model_config, parse_skew
from cosim.errors import CosimInputError

ROOT = Path(__file__).resolve().parent.parent


def test_presets_load_and_full_size_match_published_totals() -> None:
    names = list_presets()
    for n in ("tiny-moe", "mixtral-mini", "deepseek-mini", "qwen3-moe-mini",
              "mixtral-8x7b", "deepseek-v3", "deepseek-v2-lite", "qwen3-30b-a3b"):
        assert n in names
    for n in names:
        cfg = load_model_config(n)
        assert cfg.name == n
    # Published total parameter counts (billions); MLA models are approximated, see docs.
    published = {"mixtral-8x7b": 46.7, "qwen3-30b-a3b": 30.5, "deepseek-v2-lite": 15.7}
    for n, billions in published.items():
        total = sum(load_model_config(n).param_counts().values()) / 1e9
        assert abs(total - billions) / billions < 0.02, (n, total)
    for n in names:
        cfg = load_model_config(n)
        if cfg.hidden_size >= 2048:
            assert cfg.sources and all(cfg.sources), n


def test_model_validation() -> None:
    base = load_model_config("tiny-moe").model_dump()
    with pytest.raises(ValueError, match="top_k"):
        MoEModelConfig(**{**base, "top_k": 9})
    with pytest.raises(ValueError, match="num_kv_heads"):
        MoEModelConfig(**{**base, "num_kv_heads": 3})
    with pytest.raises(ValueError, match="dense_ffn_size"):
        MoEModelConfig(**{**base, "dense_layers": 1})
    with pytest.raises(ValueError, match="extra"):
        MoEModelConfig(**{**base, "experts": 4})


def test_parallelism_validation() -> None:
    m = load_model_config("tiny-moe")
    assert CaptureOptions(model=m, world_size=4, ep=2, steps=1).dp == 2
    with pytest.raises(ValueError, match="not divisible by the EP size 3"):
        CaptureOptions(model=m, world_size=3, ep=3, steps=1)
    with pytest.raises(ValueError, match="world size 4 is not divisible"):
        CaptureOptions(model=m, world_size=4, ep=3, steps=1)


def test_model_file_errors_are_located(tmp_path: Path) -> None:
    f = tmp_path / "m.yaml"
    f.write_text("name: x\nhidden_size: 64\nnum_layers: 1\nnum_heads: 4\nnum_kv_heads: 2\nvocab_size: 10\n"
                 "num_experts: 4\ntop_k: 2\nexpert_ffn_size: 8\nrouter: relu\n")
    with pytest.raises(CosimInputError, match=r"m\.yaml:10:9: router"):
        load_model_config(f)
    with pytest.raises(CosimInputError, match="unknown model preset"):
        load_model_config("nope")


def test_parse_skew() -> None:
    assert parse_skew("balanced").kind == "balanced"
    assert parse_skew("zipf").s == 1.0
    assert parse_skew("zipf:1.2").label() == "zipf:1.2"
    for bad in ("zipf:0", "zipf:x", "natural:2", "uniform"):
        with pytest.raises(CosimInputError):
            parse_skew(bad)


def test_works_without_torch(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import cosim, cosim.capture, cosim.cli.capture\n"
        "from cosim.cli import main\n"
        f"rc = main(['capture', '--model', 'tiny-moe', '--world-size', '2', '--steps', '1', '--out', {str(tmp_path / 'x')!r}])\n"
        "assert not [m for m, v in sys.modules.items() if m.startswith('torch') and v is not None]\n"
        "sys.exit(rc)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == "cosim: error: cosim capture needs PyTorch: pip install torch (or cosim[capture])"
