"""The files of a replayed run: ``summary.json`` and the timelines (Perfetto and per-rank HTA)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosim.fileio import write_text
from cosim.output.timeline import write_timeline

__all__ = ["SortedJson", "write_result"]


class SortedJson:
    """A dict as ``json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)`` writes it (``summary.json``, the
    ``--json`` print), kept as its serialized top-level entries, so that the same dict with a few keys added or
    replaced (the print's ``out``, ``sets``, ``vs_baseline``) is written without serializing the others again: a
    run's summary (2 MB of JSON at 1024 GPUs, ~0.06 CPU s by the json module) is serialized once for both. The
    same text as ``json.dumps``: each entry is ``json.dumps({key: value}, indent=2, ...)`` less its braces (the
    value at the same indentation), and the entries are joined in sorted key order as ``json.dumps`` joins them.
    An entry is serialized when first written, in sorted key order, unless ``more`` replaces it (``json.dumps`` of
    ``obj | more`` never sees it, nor its errors). Keys other than strings (sorted before ``json`` turns them into
    strings) go through ``json.dumps``."""

    def __init__(self, obj: dict[str, Any]) -> None:
        self.obj = obj
        self.plain = not all(type(k) is str for k in obj)
        self.entries: dict[str, str] = {}  # key -> its serialized entry, made on first use (:meth:`text`)

    @staticmethod
    def _entry(key: str, value: Any) -> str:
        return json.dumps({key: value}, indent=2, sort_keys=True, allow_nan=False)[1:-2]  # '\n  "key": value'

    def text(self, more: dict[str, Any] | None = None) -> str:
        """The JSON of ``obj | more`` (no trailing line break)."""
        more = more or {}
        if self.plain or not all(type(k) is str for k in more):
            return json.dumps(self.obj | more, indent=2, sort_keys=True, allow_nan=False)
        keys = sorted(self.obj.keys() | more.keys())
        if not keys:
            return "{}"
        obj, entries, out = self.obj, self.entries, []
        for k in keys:
            if k in more:
                out.append(self._entry(k, more[k]))
                continue
            e = entries.get(k)
            if e is None:
                e = entries[k] = self._entry(k, obj[k])
            out.append(e)
        return "{" + ",".join(out) + "\n}"


def write_result(result: Any, out: str | Path, timeline: bool = True,
                 summary: SortedJson | None = None) -> dict[str, Path]:
    """Write a :class:`~cosim.replay.ReplayResult`'s ``summary.json``, ``timeline.json.gz`` (Perfetto) and
    ``timeline/rank{r}.json.gz`` (HTA) into ``out``; returns their paths (``timeline_ranks``: the folder to
    give HTA's ``TraceAnalysis``). ``timeline=False`` writes the summary only; ``summary``: ``result.summary()``
    already serialized (:class:`SortedJson`, for a caller that prints it too)."""
    out = Path(out)
    paths = {"summary": out / "summary.json"}
    write_text(paths["summary"], (summary or SortedJson(result.summary())).text() + "\n")
    if timeline:
        paths["timeline"] = out / "timeline.json.gz"
        write_timeline(paths["timeline"], result)
        paths["timeline_ranks"] = out / "timeline"
    return paths
