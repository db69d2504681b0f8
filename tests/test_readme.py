"""The README's quick start and .ci/run must run the same two commands."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_ci_runs_exactly_the_readme_quick_start() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert block, "README has no code block"
    quick = _commands(block.group(1))
    assert len(quick) == 2, quick
    ci = [c for c in _commands((ROOT / ".ci/run").read_text())
          if not c.startswith(("set ", "cd ", "export ", "command -v chromium "))]  # setup lines, not commands
    assert ci == quick
    # The quick start is the first thing in the README, right under the title.
    assert readme.index("```") < readme.index("\n## ", 1) if "\n## " in readme else True
