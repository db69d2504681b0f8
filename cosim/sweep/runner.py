"""Run the points of a sweep on an executor, one folder per point.

Layout of a sweep's output folder ``DIR``::

    DIR/sweep.json              the spec as run (base, fixed sets, parameters, points)
    DIR/points/<key>/point.json the point's parameters and the sets it ran with
    DIR/points/<key>/scenario.yaml, summary.json   as written by `cosim run`
    DIR/points/<key>/result.json   the point's row of results.csv; written last: the point is finished
    DIR/points/<key>/error.json    instead of result.json when the point failed (retried on the next run),
                                   its worker process died included
    DIR/points/<key>/running.json  while the point runs (the worker's pid); left behind by a kill
    DIR/results.csv  (+ results.parquet when pyarrow is importable)
    DIR/report.html  metric vs parameters, Pareto front (cosim.report.sweep_report)

``<key>`` is a content hash of the resolved base scenario, the point's sets and
the files it reads (topology chain, catalog data, workload traces, profile), so a rerun (after a crash, a kill, or with more points added) skips every
finished point and computes only the rest.

A point that kills its worker process (SIGKILL, the OOM killer, a crash in
native code) breaks a process pool; the sweep finds the culprit, records it and
goes on in a fresh pool (see :func:`_execute`).

Ctrl-C (``KeyboardInterrupt``) stops the sweep at once: queued points are
cancelled, the workers running points are terminated (their points get no
``error.json``: they were not wrong, and a rerun computes them), finished points
keep their ``result.json``, and :class:`SweepInterrupted` says how many there are.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from concurrent.futures import BrokenExecutor, Executor, Future, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosim.fileio import write_json, write_text
from cosim.output import write_result

__all__ = ["POINT_SCHEMA", "SweepInterrupted", "SweepResult", "input_files_fingerprint", "point_key", "run_point", "run_points", "run_sweep", "summary_row"]

POINT_SCHEMA = "cosim.sweep-point/1"
METRIC_COLUMNS = ("step_time_s", "steps_per_s", "compute_s", "exposed_communication_s", "memcpy_s",
                  "host_bound_gpu_idle_s", "other_idle_s", "bound", "max_link_utilization", "power_W", "cost_usd",
                  "gpus", "wall_s")


@dataclass
class SweepResult:
    """What a sweep run did: one row per point (in point order) and counts."""

    out: Path
    rows: list[dict[str, Any]]
    parameters: list[str]
    computed: int = 0
    skipped: int = 0
    failed: int = 0
    files: dict[str, Path] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (for ``--json``)."""
        return {"schema": "cosim.sweep/1", "out": str(self.out), "points": len(self.rows),
                "computed": self.computed, "skipped": self.skipped, "failed": self.failed,
                "parameters": self.parameters, "files": {k: str(v) for k, v in self.files.items()},
                "rows": self.rows}


class SweepInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped a sweep: :attr:`finished` of :attr:`total` points have their result in ``out/points`` (a
    rerun skips them); the running points were cancelled."""

    def __init__(self, out: Path, keys: Sequence[str]) -> None:
        super().__init__()
        self.out, self.keys = out, list(dict.fromkeys(keys))

    @property
    def total(self) -> int:
        return len(self.keys)

    @property
    def finished(self) -> int:
        """Points with a result.json now (read from disk: a thread executor may finish a running point later)."""
        return sum(1 for k in self.keys if (self.out / "points" / k / "result.json").is_file())

    def __str__(self) -> str:
        return (f"interrupted: {self.finished} of {self.total} points finished (kept in {self.out / 'points'}); "
                "rerun the same sweep to compute the rest")


def _base_fingerprint(base: str) -> dict[str, Any]:
    from cosim.scenario import load_scenario

    scn = load_scenario(base)
    d = scn.model_dump(mode="json")
    d.pop("source_file", None)
    d["_base_dir"] = str(Path(scn.source_file).resolve().parent) if scn.source_file else None
    return d


def point_key(base_fingerprint: dict[str, Any], sets: dict[str, str], inputs: Any = None) -> str:
    """Content hash (16 hex digits) of a base scenario, a point's sets and its input files
    (``inputs``, see :func:`input_files_fingerprint`)."""
    blob = json.dumps({"schema": POINT_SCHEMA, "base": base_fingerprint, "sets": dict(sorted(sets.items())),
                       "inputs": inputs}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _topology_files(path: Path, seen: set[Path]) -> list[Path]:
    """``path`` and every topology file it reaches through ``extends`` and ``node``."""
    import yaml

    from cosim.topology.loader import resolve_ref

    path = path.resolve()
    if path in seen:
        return []
    seen.add(path)
    out = [path]
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return out
    if isinstance(doc, dict):
        for k in ("extends", "node"):
            ref = doc.get(k)
            if isinstance(ref, str):
                p = resolve_ref(ref, path.parent)
                if p is not None:
                    out += _topology_files(p, seen)
    return out


def input_files_fingerprint(base: str, sets: dict[str, str]) -> dict[str, Any]:
    """Identity of the files a point reads besides its scenario: the topology file and the files its
    ``extends`` / ``node`` chain reaches (content hashes), the bundled catalog data (content hashes), the
    workload's trace files (path, size, mtime: traces are large) and a calibration profile file.

    Editing any of them changes the point keys, so a rerun does not reuse points computed from the old
    files. A reference that cannot be resolved is keyed by its text (the point then fails and says why).
    """
    from cosim.scenario import WorkloadCache, apply_scenario_sets, find_workload, load_scenario, resolve_path
    from cosim.topology import find_topology

    out: dict[str, Any] = {}
    scn = load_scenario(base)
    bdir = Path(scn.source_file).parent if scn.source_file else None
    try:
        scn, rest = apply_scenario_sets(scn, dict(sets))
    except Exception as exc:  # bad sets: the point records the error
        return {"error": str(exc)}
    allsets = {**scn.set, **rest}
    tref = allsets.get("topology") or scn.topology
    try:
        tpath = find_topology(resolve_path(tref, bdir) or tref)
        out["topology"] = [[str(p), _sha(p)] for p in _topology_files(tpath, set())]
    except Exception:
        out["topology"] = str(tref)
    cat_dir = Path(__file__).resolve().parent.parent / "catalog" / "data"
    out["catalog"] = [[p.name, _sha(p)] for p in sorted(cat_dir.glob("*.yaml"))]
    if isinstance(scn.workload, str):
        wpath = resolve_path(scn.workload, bdir) or find_workload(scn.workload)
        out["workload"] = [list(k) for k in WorkloadCache.file_key(wpath)] if wpath is not None else scn.workload
    else:  # a synthetic workload: its spec (the model card is bundled or named)
        out["workload"] = scn.workload.model_dump(mode="json", by_alias=True)
    prof = allsets.get("profile") or allsets.get("models.profile") or allsets.get("replay.profile") or scn.replay.profile
    ppath = resolve_path(str(prof), bdir) if prof else None
    if ppath is not None and ppath.is_file():
        out["profile"] = [str(ppath.resolve()), _sha(ppath)]
    return out


def summary_row(summary: dict[str, Any], topo: Any = None) -> dict[str, Any]:
    """The metric columns of results.csv from a summary (and the topology, for power and cost)."""
    st = summary.get("step_time_s")
    bd = summary.get("breakdown") or {}
    links = summary.get("links") or []
    row: dict[str, Any] = {
        "step_time_s": st,
        "steps_per_s": (1.0 / st) if st else None,
        "compute_s": bd.get("compute"),
        "exposed_communication_s": bd.get("exposed_communication"),
        "memcpy_s": bd.get("memcpy"),
        "host_bound_gpu_idle_s": bd.get("host_bound_gpu_idle"),
        "other_idle_s": bd.get("other_idle"),
        "bound": (summary.get("critical_path") or {}).get("bound"),
        "max_link_utilization": max((lk.get("utilization") or 0.0 for lk in links), default=None),
    }
    if topo is not None:
        from cosim.report.hardware import hardware_totals

        hw = hardware_totals(topo)
        row.update(power_W=hw["power_W"], cost_usd=hw["cost_usd"], gpus=hw["gpus"])
    return row


def run_point(base: str, sets: dict[str, str], out_dir: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    """Run one point (base scenario + sets) and write its folder; returns its row.

    Any exception of the point (bad input, a failing replay, a bug: TypeError,
    IndexError, ...) is recorded in ``error.json`` (with its traceback) and
    returned as a row with ``status: error``; it does not raise. KeyboardInterrupt and SystemExit do raise (the
    sweep stops; the point's folder has no result.json, so a rerun computes it).
    """
    import yaml

    from cosim.errors import CosimError
    from cosim.scenario import load_scenario, resolved_settings, run_scenario
    from cosim.sweep.cache import process_cache

    out = Path(out_dir)
    row: dict[str, Any] = {"key": out.name, **(params or {})}
    write_json(out / "point.json", {"schema": POINT_SCHEMA, "base": base, "params": params or {}, "sets": sets})
    t0 = time.perf_counter()
    try:
        scn, result = run_scenario(load_scenario(base), dict(sets), cache=process_cache())
        write_text(out / "scenario.yaml", yaml.safe_dump(resolved_settings(scn, result), sort_keys=False))
        write_result(result, out, timeline=False)
        row.update(summary_row(result.summary(), result.topology))
        row.update(status="ok", error="", wall_s=time.perf_counter() - t0)
        (out / "error.json").unlink(missing_ok=True)
        write_json(out / "result.json", row)
    except Exception as exc:  # any failure of the point is recorded; the sweep goes on
        msg = str(exc) if isinstance(exc, CosimError) else f"{type(exc).__name__}: {exc}"
        row.update(status="error", error=msg.splitlines()[0] if msg else type(exc).__name__,
                   wall_s=time.perf_counter() - t0)
        write_json(out / "error.json", {**row, "traceback": traceback.format_exc()})
    return row


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


def _write_tables(out: Path, rows: list[dict[str, Any]], params: Sequence[str]) -> dict[str, Path]:
    cols = ["key", "status", *params, *METRIC_COLUMNS, "error"]
    for r in rows:
        for k in r:
            if k not in cols:
                cols.append(k)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if _clean(r.get(k)) is None else r.get(k)) for k in cols})
    files = {"csv": out / "results.csv"}
    write_text(files["csv"], buf.getvalue())
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        return files
    table = pa.table({c: [None if _clean(r.get(c)) is None else (str(r[c]) if c in params else r[c]) for r in rows]
                      for c in cols})
    files["parquet"] = out / "results.parquet"
    from cosim.fileio import atomic_open

    with atomic_open(files["parquet"], "wb") as fh:
        pq.write_table(table, fh)
    return files


def run_points(base: str, points: Sequence[dict[str, str]], out: str | Path, executor: Executor | None = None, *,
               fixed: dict[str, str] | None = None, progress: bool = True, label: str = "sweep",
               meta: dict[str, Any] | None = None, report: bool = True) -> SweepResult:
    """Run ``points`` (parameter dicts) on top of ``base`` + ``fixed`` sets; skip finished ones.

    Writes ``out/points/<key>/``, ``out/results.csv`` (+ Parquet) and, with
    ``report``, ``out/report.html``. ``executor`` defaults to running in this
    process, one point after another.
    """
    from tqdm import tqdm

    from cosim.sweep.executors import InlineExecutor

    out = Path(out)
    fixed = dict(fixed or {})
    fp = _base_fingerprint(base)
    params = list(dict.fromkeys(k for p in points for k in p))
    inputs: dict[str, Any] = {}
    keys = []
    for p in points:
        sets = {**fixed, **p}
        ik = json.dumps({k: sets.get(k) for k in ("topology", "workload", "profile", "models.profile",
                                                   "replay.profile")}, sort_keys=True)
        if ik not in inputs:
            inputs[ik] = input_files_fingerprint(base, sets)
        keys.append(point_key(fp, sets, inputs[ik]))
    write_json(out / "sweep.json", {"schema": "cosim.sweep/1", "label": label, "base": base, "fixed": fixed,
                                    "parameters": params, "points": [{"key": k, "params": p}
                                                                     for k, p in zip(keys, points)],
                                    **(meta or {})})
    rows: dict[str, dict[str, Any]] = {}
    todo: list[tuple[str, dict[str, str]]] = []
    for k, p in zip(keys, points):
        done = out / "points" / k / "result.json"
        if k in rows:
            continue
        if done.exists():
            try:
                rows[k] = {**json.loads(done.read_text()), **p}
                continue
            except (OSError, ValueError):
                pass
        rows[k] = {}
        todo.append((k, p))
    skipped = len(points) - len(todo)
    bar = tqdm(total=len(points), initial=skipped, desc=label, unit="pt", file=sys.stderr, disable=not progress,
               dynamic_ncols=True)
    counts = {"computed": 0, "failed": 0}

    def finish(k: str, row: dict[str, Any]) -> None:
        rows[k] = row
        counts["computed"] += 1
        counts["failed"] += row.get("status") != "ok"
        bar.update(1)
        bar.set_postfix(failed=counts["failed"])

    try:
        _execute(executor or InlineExecutor(), base, fixed, out, todo, finish)
    except KeyboardInterrupt:
        raise SweepInterrupted(out, keys) from None
    finally:
        bar.close()
    computed, failed = counts["computed"], counts["failed"]
    ordered = []
    for k, p in zip(keys, points):
        r = rows.get(k) or {"key": k, "status": "missing"}
        ordered.append({"key": k, **p, **{c: v for c, v in r.items() if c not in p and c != "key"}})
    res = SweepResult(out=out, rows=ordered, parameters=params, computed=computed, skipped=skipped, failed=failed)
    res.files = _write_tables(out, ordered, params)
    if report:
        from cosim.report.sweep_report import write_sweep_report

        res.files["report"] = out / "report.html"
        write_sweep_report(res.files["report"], ordered, params, title=f"{label}: {Path(base).stem}")
    return res


_MARKER = "running.json"


def _run_marked(fn: Any, token: str, base: str, sets: dict[str, str], out_dir: str,
                params: dict[str, str]) -> dict[str, Any]:
    """Run one point in a worker. ``running.json`` (this sweep run's token and the worker's pid) marks the point
    as started until ``fn`` returns, so that after a worker process died the sweep can tell the points that were
    running from those still queued."""
    marker = Path(out_dir) / _MARKER
    write_json(marker, {"token": token, "pid": os.getpid()})
    try:
        return fn(base, sets, out_dir, params)
    finally:
        marker.unlink(missing_ok=True)


def _started_pid(out_dir: Path, token: str) -> int | None:
    """The worker pid of a point that started in this run (``token``) and did not return; else None."""
    try:
        d = json.loads((out_dir / _MARKER).read_text())
    except (OSError, ValueError):
        return None
    return d.get("pid") if isinstance(d, dict) and d.get("token") == token else None


def _error_row(out_dir: Path, p: dict[str, str], msg: str, wall_s: float | None, **extra: Any) -> dict[str, Any]:
    """Record a point that failed outside :func:`run_point` (its worker died, the executor failed) in its
    ``error.json``, as run_point records its own failures."""
    row: dict[str, Any] = {"key": out_dir.name, **p, "status": "error", "error": msg, "wall_s": wall_s}
    write_json(out_dir / "error.json", {**row, "traceback": "", **extra})
    (out_dir / _MARKER).unlink(missing_ok=True)
    return row


def _execute(ex: Executor, base: str, fixed: dict[str, str], out: Path, todo: list[tuple[str, dict[str, str]]],
             finish: Any) -> None:
    """Run ``todo`` (key, params) on ``ex``; call ``finish(key, row)`` for every point.

    A worker process that dies (SIGKILL, OOM killer, a native crash) breaks a process pool: every point that had
    not returned fails with ``BrokenExecutor`` and the pool takes no more work. Then: points whose result.json
    was written keep it; points that had not started go on in a fresh pool (:func:`fresh_executor`); points that
    were running (one of them killed the worker; the others died with the pool) are run again one at a time, each
    alone in a fresh single-worker pool: one that kills its worker again is the culprit and gets an error.json
    saying that its worker process died (and the signal), the others complete. Any other exception raised by the
    executor for a point (a Dask ``KilledWorker``, a pickling error) is that point's error.json.
    """
    from cosim.sweep.executors import exit_text, fresh_executor, worker_exitcode

    token = uuid.uuid4().hex
    order = {k: i for i, (k, _) in enumerate(todo)}
    owned: list[Executor] = []

    def pdir(k: str) -> Path:
        return out / "points" / k

    def run_batch(e: Executor, items: list[tuple[str, dict[str, str]]]) -> list[tuple[str, dict[str, str]]]:
        """Run ``items`` on ``e``; return those lost to a broken executor, in point order."""
        futs: dict[Future, tuple[str, dict[str, str]]] = {}
        lost = []
        for k, p in items:
            try:
                futs[e.submit(_run_marked, run_point, token, base, {**fixed, **p}, str(pdir(k)), p)] = (k, p)
            except BrokenExecutor:
                lost.append((k, p))
        for f in as_completed(futs):
            k, p = futs[f]
            try:
                row = f.result()
            except BrokenExecutor:
                lost.append((k, p))
                continue
            except Exception as exc:  # the executor failed this point (a lost Dask worker, a pickling error)
                row = _error_row(pdir(k), p, f"{type(exc).__name__}: {exc}", None,
                                 traceback="".join(traceback.format_exception(exc)))
            finish(k, row)
        done = []
        for k, p in lost:  # finished in the worker, but the pool broke before it said so
            try:
                row = {**json.loads((pdir(k) / "result.json").read_text()), **p}
            except (OSError, ValueError):
                continue
            finish(k, row)
            done.append(k)
        return sorted((it for it in lost if it[0] not in done), key=lambda it: order[it[0]])

    def fresh(workers: int | None = None) -> Executor | None:
        e = fresh_executor(ex, workers)
        if e is not None:
            owned.append(e)
        return e

    def give_up(items: list[tuple[str, dict[str, str]]], why: str) -> None:
        for k, p in items:
            finish(k, _error_row(pdir(k), p, f"the executor broke ({why}) before this point finished; "
                                 "not retried (rerun the sweep)", None))

    try:
        queue, alone = list(todo), []
        cur: Executor | None = ex
        solo: Executor | None = None
        while queue or alone:
            if queue:
                if cur is None:
                    cur = fresh()
                    if cur is None:
                        give_up(queue + alone, "a worker process died")
                        return
                lost = run_batch(cur, queue)
                queue = []
                if lost:
                    cur = None  # broken: a fresh pool for what is left
                    started = [it for it in lost if _started_pid(pdir(it[0]), token) is not None]
                    if started:
                        alone += started
                        queue = [it for it in lost if it not in started]
                    else:  # no point says it was running: run every one alone
                        alone += lost
                continue
            k, p = alone.pop(0)
            if solo is None:
                solo = fresh(1)
                if solo is None:
                    give_up([(k, p), *alone], "a worker process died")
                    return
            t0 = time.perf_counter()
            if run_batch(solo, [(k, p)]):
                pid = _started_pid(pdir(k), token)
                code = worker_exitcode(solo, pid)
                how = exit_text(code)
                finish(k, _error_row(pdir(k), p, "worker process died" + (f" ({how})" if how else "")
                                     + " while running this point (alone in a fresh pool)",
                                     time.perf_counter() - t0, worker_pid=pid, exitcode=code))
                solo = None
    except KeyboardInterrupt:
        _interrupt([ex, *owned], out, todo, token)
        owned.clear()
        raise
    finally:
        for e in owned:
            e.shutdown(wait=True, cancel_futures=True)


def _interrupt(executors: list[Executor], out: Path, todo: list[tuple[str, dict[str, str]]], token: str) -> None:
    """Ctrl-C: stop ``executors`` now (:func:`cosim.sweep.executors.cancel_executor`), then clear the
    ``running.json`` markers this run (``token``) left on the points it was running. A second Ctrl-C meanwhile
    is ignored, so that no worker outlives the sweep."""
    import signal
    import threading

    from cosim.sweep.executors import cancel_executor

    main = threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.SIG_IGN) if main else None
    try:
        for e in executors:
            cancel_executor(e)
        for k, _ in todo:
            if _started_pid(out / "points" / k, token) is not None:
                (out / "points" / k / _MARKER).unlink(missing_ok=True)
    finally:
        if main:
            signal.signal(signal.SIGINT, old)


def run_sweep(spec: Any, out: str | Path, executor: Executor | None = None, progress: bool = True) -> SweepResult:
    """Run a :class:`cosim.sweep.SweepSpec` into ``out`` (see the module doc)."""
    return run_points(spec.base, spec.points(), out, executor, fixed=spec.sets, progress=progress, label=spec.name,
                      meta={"combine": spec.combine, "source_file": spec.source_file, "seed": spec.seed})
