"""Exactness check of an importer / replay change (not a test): every shared trace imported and replayed
by two versions of cosim gives array-identical graphs and bit-identical summaries.

    PYTHONPATH=/path/to/old python benchmarks/check_identical.py dump /tmp/before
    PYTHONPATH=/path/to/new python benchmarks/check_identical.py dump /tmp/after
    python benchmarks/check_identical.py compare /tmp/before /tmp/after

``dump`` loads every shared trace (each file of ``../shared/traces`` but the per-rank files of the DLRM
job, which is loaded as its Kineto folder, its ET folder and both together) with the load cache off,
writes the graph's arrays (``ExecutionGraph.npz_arrays``) and the replay summaries (identity, and
simulated collectives) less their wall-clock fields; a trace the importer refuses records its error
line instead. It then loads each trace a second time through a fresh load cache (first load, then the
cached load) and checks that both give the same arrays as the uncached import, and that replaying the cached
graph again (its programs taken from compile's memo, the link attribution's from its own) gives the same
summaries. ``compare`` reports
every difference and exits 1 when there is one.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np


def _sources(traces: Path) -> list[tuple[str, Any]]:
    dlrm = traces / "param-dlrm-v100x8"
    out: list[tuple[str, Any]] = []
    for f in sorted(traces.rglob("*.json*")):
        if dlrm in f.parents:
            continue
        out.append((str(f.relative_to(traces)), f))
    if dlrm.is_dir():
        out.append(("param-dlrm-v100x8/kineto", dlrm / "kineto"))
        out.append(("param-dlrm-v100x8/et", dlrm / "et"))
        out.append(("param-dlrm-v100x8/kineto+et", sorted((dlrm / "kineto").iterdir()) + sorted((dlrm / "et").iterdir())))
    return out


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> list[str]:
    diffs = [f"only in one: {k}" for k in sorted(set(a) ^ set(b))]
    for k in sorted(set(a) & set(b)):
        x, y = np.asarray(a[k]), np.asarray(b[k])
        if x.dtype != y.dtype or x.shape != y.shape:
            diffs.append(f"{k}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}")
        elif x.dtype.kind == "f":
            if not np.array_equal(x, y, equal_nan=True):
                diffs.append(f"{k}: values differ")
        elif not np.array_equal(x, y):
            diffs.append(f"{k}: values differ")
    return diffs


def dump(out: Path) -> int:
    from cosim.errors import CosimError
    from cosim.replay import ReplayConfig, replay
    from cosim.replay.summary import without_wall_clock
    from cosim.resources import shared_dir
    from cosim.workload import load_trace

    sd = shared_dir()
    if sd is None:
        print("../shared not found", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    bad = 0
    for name, src in _sources(sd / "traces"):
        key = name.replace("/", "__")
        os.environ["COSIM_CACHE_DIR"] = "off"
        try:
            g = load_trace(src)
        except CosimError as exc:
            results[name] = {"error": str(exc)}
            continue
        arrays = g.npz_arrays()
        np.savez(out / f"{key}.npz", **arrays)
        summaries = {}
        for mode in ("measured", "simulated"):
            try:
                summaries[mode] = without_wall_clock(replay(g, config=ReplayConfig(collectives=mode)).summary())
            except CosimError as exc:
                summaries[mode] = {"error": str(exc)}
        results[name] = {"summaries": summaries}
        with tempfile.TemporaryDirectory() as tmp:  # first and cached load give the same graph
            os.environ["COSIM_CACHE_DIR"] = tmp
            for which in ("first", "cached"):
                g2 = load_trace(src)
                d = _same(arrays, g2.npz_arrays())
                if d:
                    bad += 1
                    print(f"{name}: {which} load through the cache differs: {d[:5]}")
            for mode in ("measured", "simulated"):  # the cached graph's programs come from compile's memo
                if "error" not in summaries[mode]:
                    again = without_wall_clock(replay(g2, config=ReplayConfig(collectives=mode)).summary())
                    if again != summaries[mode]:
                        bad += 1
                        print(f"{name}: {mode} replay of the cached graph (compiled programs reused) differs")
    (out / "summaries.json").write_text(json.dumps(results, indent=1, sort_keys=True, default=str))
    print(f"{len(results)} traces dumped to {out}")
    return 1 if bad else 0


def compare(a: Path, b: Path) -> int:
    ra = json.loads((a / "summaries.json").read_text())
    rb = json.loads((b / "summaries.json").read_text())
    diffs: list[str] = [f"{n}: only in one" for n in sorted(set(ra) ^ set(rb))]
    graphs = replays = 0
    for name in sorted(set(ra) & set(rb)):
        x, y = ra[name], rb[name]
        if "error" in x or "error" in y:
            if x != y:
                diffs.append(f"{name}: {x.get('error')!r} vs {y.get('error')!r}")
            continue
        key = name.replace("/", "__")
        with np.load(a / f"{key}.npz") as za, np.load(b / f"{key}.npz") as zb:
            d = _same(dict(za), dict(zb))
        graphs += 1
        diffs += [f"{name}: {m}" for m in d]
        for mode in sorted(set(x["summaries"]) | set(y["summaries"])):
            replays += 1
            if x["summaries"].get(mode) != y["summaries"].get(mode):
                diffs.append(f"{name}: {mode} replay summary differs")
    for m in diffs:
        print(m)
    errors = sum("error" in r for r in ra.values())
    print(f"{len(ra)} traces ({errors} refused alike), {graphs} graphs compared array by array, "
          f"{replays} replay summaries compared: {len(diffs)} differences")
    return 1 if diffs else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "dump":
        raise SystemExit(dump(Path(sys.argv[2])))
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    print(__doc__, file=sys.stderr)
    raise SystemExit(2)
