"""``cosim run``: run a scenario (default: the bundled MoE capture on DGX H100)."""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from cosim.cli.replay import add_output_flags

if TYPE_CHECKING:
    from cosim.scenario import WorkloadCache

__all__ = ["PhaseBar", "phase_bar", "register", "what_if_line"]

PROGRESS_DELAY_S = 2.0
"""Seconds after which a run shows its phase bar on stderr (a short run shows none)."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run a scenario: workload + topology + what-if overrides",
                       description="Run a scenario YAML (or a scenario by name, from ./workloads/scenarios "
                                   "first, then the installed ones; default qwen3-30b-ep8-dgx-h100) and write "
                                   "summary.json, timeline.json.gz, report.html and the resolved settings "
                                   "(scenario.yaml) to --out, by default cosim-out/<scenario>/<short hash of the "
                                   "settings>/, with cosim-out/<scenario>/latest pointing at it: a what-if never "
                                   "overwrites its baseline.")
    p.add_argument("scenario", nargs="?", help="scenario name or scenario YAML file")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field or what-if knob (repeatable): topology=hgx-b200, nodes=64, "
                        "links.nvlink4.bandwidth='50 GB/s', host.speed=2, gpu.scale.gemm=0.5, "
                        "topology.links.gpu-pcie.type=pcie6x16; synthetic workloads: "
                        "workload.synthetic.precision=fp8, workload.synthetic.layout.ep=32, "
                        "workload.synthetic.routing=zipf:1.2, workload.synthetic.layout.schedule=dualpipe "
                        "(docs/SYNTHESIS.md); captures: projection.dtype=fp8, precision.experts=fp8 "
                        "(docs/CAPTURE.md, docs/MODELS.md). Recipes: docs/WHATIF.md")
    p.add_argument("--list", action="store_true", help="list the bundled scenarios and exit")
    p.add_argument("--baseline", type=Path, metavar="RUN_DIR",
                   help="an earlier run's folder (its summary.json): say how this run's step differs from it, "
                        "or what bounds the step when it does not (default for a run with --set: the scenario's "
                        "last run without --set, cosim-out/<scenario>/baseline, when there is one)")
    add_output_flags(p)
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar on stderr (it shows only where stderr is a terminal, for runs of more "
                        f"than {PROGRESS_DELAY_S:g} s)")
    p.set_defaults(func=run)


class PhaseBar:
    """A one-line tqdm bar on ``stream`` (stderr) naming the run's phase and its elapsed time, refreshed twice a
    second from ``delay`` seconds on (a long synthesis shows no other sign of life; the engine adds its own op
    bar for runs of more than ``PROGRESS_MIN_OPS`` GPU ops). Nothing is written when not ``enabled``
    (``--no-progress``, or stderr is not a terminal), and never to stdout: ``--json`` stays clean."""

    def __init__(self, enabled: bool, stream: TextIO | None = None, delay: float | None = None) -> None:
        self._bar: Any = None
        if not enabled:
            return
        from tqdm import tqdm

        self._bar = tqdm(total=None, desc="cosim run", bar_format="{desc} [{elapsed}]",
                         file=stream if stream is not None else sys.stderr, leave=False, disable=False,
                         delay=PROGRESS_DELAY_S if delay is None else delay,
                         mininterval=0)  # the ticker paces the redraws; tqdm's update() holds them until the delay
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker = threading.Thread(target=self._tick, name="cosim-run-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                self._bar.update(0)  # a redraw that tqdm records as shown, so that close() clears the line

    def phase(self, text: str) -> None:
        """Name the phase the run is in now."""
        if self._bar is not None:
            with self._lock:
                self._bar.set_description_str(f"cosim run: {text}", refresh=False)
                self._bar.update(0)  # redrawn now, unless still within the delay

    def close(self) -> None:
        """Stop and clear the bar (before the results are printed); again is a no-op."""
        if self._bar is None:
            return
        self._stop.set()
        self._ticker.join()
        with self._lock:
            self._bar.close()
        self._bar = None


@contextmanager
def phase_bar(enabled: bool, stream: TextIO | None = None, delay: float | None = None) -> Iterator[PhaseBar]:
    """:class:`PhaseBar`, closed on the way out."""
    bar = PhaseBar(enabled, stream, delay)
    try:
        yield bar
    finally:
        bar.close()


def run(args: argparse.Namespace) -> int:
    import yaml

    from cosim.cli import emit_json
    from cosim.cli.replay import finish
    from cosim.fileio import write_text
    from cosim.replay import parse_sets
    from cosim.scenario import (
        BASELINE,
        link_latest,
        list_scenarios,
        load_scenario,
        resolved_settings,
        run_dir,
        run_scenario,
    )

    if args.list:
        names = list_scenarios()
        if args.json:
            emit_json({"scenarios": names})
        else:
            print("\n".join(names))
        return 0
    baseline = _baseline(args.baseline) if args.baseline else None
    scn = load_scenario(args.scenario)
    plain = scn.model_dump(mode="json")  # the scenario without this run's --set: what its baseline ran
    sets = parse_sets(args.sets)
    show = not getattr(args, "no_progress", False) and sys.stderr.isatty()
    with phase_bar(show) as bar:
        from cosim.scenario import SyntheticWorkload

        bar.phase("synthesizing and simulating the step" if isinstance(scn.workload, SyntheticWorkload)
                  else "loading and simulating the workload")
        scn, result = run_scenario(scn, sets, cache=_workload_cache())
        bar.phase("writing summary, timeline and report")
        resolved = resolved_settings(scn, result)
        out: Path = args.out or run_dir(resolved)
        write_text(out / "scenario.yaml", yaml.safe_dump(resolved, sort_keys=False))
        sets_given = bool(args.sets)
        base_dir: Path | None = args.baseline
        other: Path | None = None
        if baseline is None and sets_given and args.out is None:
            base_dir = out.parent / BASELINE
            baseline = _baseline(base_dir, missing_ok=True)
            if baseline is not None and not same_scenario(base_dir, plain):
                baseline, other = None, base_dir
        if baseline is None:
            base_dir = None
        code = finish(result, args, out, baseline,
                      extra={"out": str(out), "sets": sets, "baseline_dir": None if base_dir is None else str(base_dir)},
                      before_print=bar.close)
    if args.out is None:
        latest = link_latest(out)
        if not sets_given:
            link_latest(out, BASELINE)
        if not args.json:
            print(f"run folder: {out} (also {latest})")
    if not args.json and (line := what_if_line(sets, base_dir, args.scenario, other)):
        print(line)
    return code


_CACHE: list[WorkloadCache] = []


def _workload_cache() -> WorkloadCache:
    """The workload cache of the runs of this process (:class:`cosim.scenario.WorkloadCache`, as a sweep's
    ``cosim.sweep.cache.process_cache``, whose package a run does not otherwise import)."""
    if not _CACHE:
        from cosim.scenario import WorkloadCache

        _CACHE.append(WorkloadCache(size=4))
    return _CACHE[0]


def what_if_line(sets: dict[str, str], base_dir: Path | None, scenario: str | None,
                 other: Path | None = None) -> str | None:
    """The line that says what this run changed and what it was compared with: ``what-if: k=v, ... vs DIR``;
    with --set but no baseline, how to get one (``other``: a baseline folder that was passed over because it ran
    other settings); None for a plain run."""
    changed = ", ".join(f"{k}={v}" for k, v in sets.items())
    if base_dir is not None:
        return f"what-if: {changed or '(no --set)'} vs {base_dir}"
    if changed:
        name = f" {scenario}" if scenario else ""
        why = (f" ({other} ran other settings: another scenario file of the same name, or this one before an edit)"
               if other is not None else "")
        return (f"what-if: {changed}; no baseline to compare with{why}: run `cosim run{name}` without --set first, "
                "or pass --baseline RUN_DIR")
    return None


def same_scenario(run: Path, plain: dict) -> bool:
    """Whether the run folder ``run`` ran the scenario ``plain`` (a :class:`~cosim.scenario.Scenario` dumped as
    JSON, no --set applied): its ``scenario.yaml`` less the replay config, the scenario file compared by resolved
    path. A folder without a readable ``scenario.yaml`` counts as the same (nothing to tell it by)."""
    import yaml

    try:
        ran = yaml.safe_load((run / "scenario.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return True
    if not isinstance(ran, dict):
        return True
    ran = {k: v for k, v in ran.items() if k != "replay_config"}

    def norm(d: dict) -> dict:
        src = d.get("source_file")
        return {**d, "source_file": str(Path(src).resolve()) if src else src}

    return norm(ran) == norm(plain)


def _baseline(d: Path, missing_ok: bool = False) -> dict | None:
    """The summary of the run folder ``d`` (:func:`cosim.fileio.read_summary`; None when ``missing_ok`` and it has
    none, or none that can be compared with)."""
    from cosim.errors import CosimInputError
    from cosim.fileio import read_summary

    p = d / "summary.json"
    if not p.is_file():
        if missing_ok:
            return None
        raise CosimInputError("no summary.json here: not a folder written by `cosim run`", file=d)
    try:
        return read_summary(p)
    except CosimInputError:
        if missing_ok:
            return None
        raise
