"""Scripts of benchmarks/ and validation/ loaded as modules, for the tests that call their functions."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent


def load_script(rel: str, name: str) -> ModuleType:
    """The script at ``rel`` (relative to the repository root) as module ``name``."""
    spec = importlib.util.spec_from_file_location(name, ROOT / rel)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def synth_variants() -> ModuleType:
    """benchmarks/synth_variants.py."""
    return load_script("benchmarks/synth_variants.py", "synth_variants")
