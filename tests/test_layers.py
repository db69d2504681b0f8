"""Import layering of the cosim package: every import points down (or sideways), never up.

Layers, lowest first (docs/ARCHITECTURE.md):

0. ``cosim`` (the lazy public facade), units, catalog, errors, yamlio, fileio, resources
1. topology
2. engine
3. workload (IR, importers, synthesis) and capture
4. models (kernel times)
5. replay, scenario
6. output, report
7. sweep, sensitivity
8. cli, ``__main__``

Every ``import`` / ``from ... import`` in every module is checked, at any depth (function-level
and ``TYPE_CHECKING`` imports included: a type-only dependency is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "cosim"

LAYERS: dict[str, int] = {
    "cosim": 0, "units": 0, "catalog": 0, "errors": 0, "yamlio": 0, "fileio": 0, "resources": 0,
    "topology": 1,
    "engine": 2,
    "workload": 3, "capture": 3,
    "models": 4,
    "replay": 5, "scenario": 5,
    "output": 6, "report": 6,
    "sweep": 7, "sensitivity": 7,
    "cli": 8, "__main__": 8,
}
"""Layer of each top-level part of the package (its first dotted name after ``cosim``)."""


def module_name(path: Path) -> str:
    """Dotted module name of a file under ``cosim/`` (a package's ``__init__`` is the package)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def layer_of(module: str) -> tuple[str, int]:
    """(part, layer) of a dotted ``cosim...`` module name."""
    parts = module.split(".")
    part = parts[1] if len(parts) > 1 else "cosim"
    if part not in LAYERS:
        raise AssertionError(f"{module}: part {part!r} has no layer in tests/test_layers.py: give it one")
    return part, LAYERS[part]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every cosim import in a file, relative imports resolved.

    ``from cosim import units`` counts as an import of ``cosim.units`` (a submodule named in a
    from-import of a package is what gets loaded).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    this = module_name(path)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "cosim"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "cosim":
                continue
            if target == "cosim":
                found += [(node.lineno, f"cosim.{a.name}" if a.name in LAYERS else "cosim") for a in node.names]
            else:
                found.append((node.lineno, target))
    return sorted(found)


def upward_imports(root: Path = PKG) -> list[str]:
    """``file:line: importer (part, layer L) imports module (part, layer M > L)`` for every upward import."""
    bad: list[str] = []
    for path in sorted(root.rglob("*.py")):
        me, mine = layer_of(module_name(path))
        for line, target in imported_modules(path):
            part, theirs = layer_of(target)
            if theirs > mine:
                rel = path.relative_to(ROOT)
                bad.append(f"{rel}:{line}: {me} (layer {mine}) imports {target} ({part}, layer {theirs})")
    return bad


def test_every_part_has_a_layer() -> None:
    parts = {p.stem if p.is_file() else p.name for p in PKG.iterdir()
             if (p.is_file() and p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    assert parts <= set(LAYERS), f"parts without a layer: {sorted(parts - set(LAYERS))}"


def test_imports_point_down_only() -> None:
    bad = upward_imports()
    assert not bad, "imports pointing up the layers:\n" + "\n".join(bad)


def test_checker_sees_upward_imports(tmp_path: Path) -> None:
    """The checker finds upward imports of every form (absolute, relative, from-package, in a function)."""
    pkg = tmp_path / "cosim"
    (pkg / "engine").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "engine" / "__init__.py").write_text("from . import x\n")
    (pkg / "engine" / "x.py").write_text(
        "import cosim.units\n"               # down: fine
        "from cosim import replay\n"          # up (line 2)
        "from ..models import roofline\n"     # up (line 3)
        "def f():\n"
        "    import cosim.cli.run\n"          # up, in a function (line 5)
        "from .y import z\n")                 # sideways: fine
    global ROOT
    old = ROOT
    ROOT = tmp_path
    try:
        bad = upward_imports(pkg)
    finally:
        ROOT = old
    assert [b.split(": ")[0] for b in bad] == ["cosim/engine/x.py:2", "cosim/engine/x.py:3", "cosim/engine/x.py:5"]
    assert "(replay, layer 5)" in bad[0] and "engine (layer 2)" in bad[0]


if __name__ == "__main__":
    pytest.main([__file__, "-q"])
