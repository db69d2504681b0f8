"""The files of a replayed run: ``summary.json`` and the timelines (Perfetto and per-rank HTA)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosim.fileio import write_json
from cosim.output.timeline import write_timeline

__all__ = ["write_result"]


def write_result(result: Any, out: str | Path, timeline: bool = True) -> dict[str, Path]:
    """Write a :class:`~cosim.replay.ReplayResult`'s ``summary.json``, ``timeline.json.gz`` (Perfetto) and
    ``timeline/rank{r}.json.gz`` (HTA) into ``out``; returns their paths (``timeline_ranks``: the folder to
    give HTA's ``TraceAnalysis``). ``timeline=False`` writes the summary only."""
    out = Path(out)
    paths = {"summary": out / "summary.json"}
    write_json(paths["summary"], result.summary())
    if timeline:
        paths["timeline"] = out / "timeline.json.gz"
        write_timeline(paths["timeline"], result)
        paths["timeline_ranks"] = out / "timeline"
    return paths
