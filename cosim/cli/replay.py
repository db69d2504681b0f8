"""``cosim replay``: replay captured PyTorch traces on a topology."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cosim.cli import add_json_flag

__all__ = ["register"]


def add_replay_knobs(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``replay`` and ``run``."""
    p.add_argument("--topology", help="topology preset or YAML file (default: matches the traced GPU)")
    p.add_argument("--durations", choices=("measured", "modeled"), help="GPU op durations (default measured)")
    p.add_argument("--profile", help="kernel-model calibration profile for --durations modeled "
                                     "(bundled name or YAML; default: the accelerator's bundled profile)")
    p.add_argument("--collectives", choices=("measured", "simulated"),
                   help="communication kernels: measured times, or flows on the fabric (default measured)")
    p.add_argument("--comm-sms", type=int, metavar="N",
                   help="SMs a communication kernel holds (= --set gpu.comm_sms=N; default: as traced)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="what-if knob, e.g. gpu.scale.gemm=0.5, host.launch_overhead='2 us', host.speed=2, "
                        "cuda_graphs='## forward ##', accelerator=b200, links.nvlink4.bandwidth='50 GB/s' "
                        "(repeatable)")
    add_output_flags(p)


def add_output_flags(p: argparse.ArgumentParser) -> None:
    """--out, --no-timeline and --json, shared by ``replay`` and ``run``."""
    p.add_argument("--out", type=Path, help="output folder (default cosim-out/<name>)")
    p.add_argument("--no-timeline", action="store_true", help="skip timeline.json.gz")
    add_json_flag(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("replay", help="replay Kineto / Execution traces on a topology",
                       description="Replay captured PyTorch traces (Kineto .json/.json.gz, a folder of per-rank "
                                   "files, or Execution Traces) on a topology, and compare with the measured step.")
    p.add_argument("paths", nargs="+", type=Path, metavar="PATH", help="trace file(s) or a folder of rank traces")
    p.add_argument("--knobs", type=Path, metavar="FILE.yaml",
                   help="what-if knobs from a YAML mapping of --set keys (nested or dotted, e.g. "
                        "'gpu: {scale: {gemm: 0.5}}'); --topology/--durations/--collectives/--set win over it")
    add_replay_knobs(p)
    p.set_defaults(func=run)


_SET_PREFIX = re.compile(r"^--set(?: [^:]*)?: ")


def load_knobs(path: str | Path) -> dict[str, str]:
    """Read a knobs file: a YAML mapping of the ``--set`` keys to values, as ``--set`` pairs.

    Keys may be dotted (``gpu.scale.gemm: 0.5``) or nested (``gpu: {scale: {gemm: 0.5}}``);
    a list value (``cuda_graphs: [a, b]``) is joined with commas. Every value is checked
    as ``--set`` would check it; a bad key or value is a :class:`CosimInputError` that
    names the file, line, column and key.
    """
    from cosim.errors import CosimInputError
    from cosim.replay import ReplayConfig, apply_sets
    from cosim.yamlio import input_error_at, load_yaml

    data = load_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise input_error_at(data, [], "expected a mapping of knob names to values, e.g. 'gpu.scale.gemm: 0.5'",
                             file=path)
    out: dict[str, str] = {}

    def walk(node: dict, loc: list[str]) -> None:
        for k, v in node.items():
            here = [*loc, str(k)]
            key = ".".join(here)
            if isinstance(v, dict):
                if not v:
                    raise input_error_at(data, here, "empty mapping: expected a value", file=path)
                walk(v, here)
                continue
            if isinstance(v, list):
                if not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in v):
                    raise input_error_at(data, here, "expected a list of names", file=path)
                value = ",".join(str(x) for x in v)
            elif v is None or isinstance(v, bool):
                raise input_error_at(data, here, f"expected a value, got {str(v).lower()}", file=path)
            else:
                value = str(v)
            try:
                apply_sets(ReplayConfig(), {key: value})
            except CosimInputError as exc:
                raise input_error_at(data, here, _SET_PREFIX.sub("", exc.message), file=path) from None
            out[key] = value

    walk(data, [])
    return out


def config_from_args(args: argparse.Namespace, base=None):
    """The ReplayConfig of the flags. ``topology.<path>`` knobs are left in ``args.topology_sets``
    (they change the topology document, see :func:`cosim.scenario.build_topology`)."""
    from cosim.replay import ReplayConfig, apply_sets, parse_sets
    from cosim.scenario import expand_port_bandwidth, split_topology_sets

    cfg = base or ReplayConfig()
    sets = {}
    if getattr(args, "knobs", None):
        sets.update(load_knobs(args.knobs))
    if args.topology:
        sets["topology"] = args.topology
    if args.durations:
        sets["durations"] = args.durations
    if args.collectives:
        sets["collectives"] = args.collectives
    if getattr(args, "comm_sms", None) is not None:
        sets["gpu.comm_sms"] = str(args.comm_sms)
    if getattr(args, "profile", None):
        sets["profile"] = args.profile
    sets.update(parse_sets(args.sets))
    args.topology_sets, sets = split_topology_sets(sets)
    return apply_sets(cfg, expand_port_bandwidth(sets))


def finish(result, args: argparse.Namespace, out: Path, baseline: dict | None = None,
           extra: dict | None = None, before_print: Callable[[], None] | None = None) -> int:
    """Write outputs and print the summary (table, or JSON with --json, with the keys of ``extra`` added); with
    ``baseline`` (an earlier run's summary) also how the step changed against it (``vs_baseline`` in the JSON).
    ``before_print`` runs once the files are written, before anything is printed (it clears a progress bar)."""
    from cosim.output import write_result
    from cosim.output.files import SortedJson
    from cosim.output.text import format_hardware, format_summary
    from cosim.report import write_run_report

    summary = result.summary()
    doc = SortedJson(summary)  # serialized once: summary.json and the --json print
    paths = write_result(result, out, timeline=not args.no_timeline, summary=doc)
    paths["report"] = write_run_report(result, out / "report.html")
    paths["report_data"] = paths["report"].with_suffix(".json")  # every row of the page's tables
    if before_print is not None:
        before_print()
    if args.json:
        more: dict[str, Any] = {}
        if baseline is not None:
            from cosim.replay.summary import explain_change

            more["vs_baseline"] = explain_change(baseline, summary)
        sys.stdout.write(doc.text(more | (extra or {})) + "\n")  # emit_json(summary | more | extra)
    else:
        if hasattr(result.topology, "figures"):
            print(format_hardware(result.topology))
        print(format_summary(summary, baseline=baseline))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    from cosim.replay import replay

    cfg = config_from_args(args)
    paths = [str(p) for p in args.paths]
    topo = None
    if args.topology_sets:
        from dataclasses import replace

        from cosim.errors import CosimInputError
        from cosim.scenario import build_topology

        if not cfg.topology:
            raise CosimInputError(f"--set {next(iter(args.topology_sets))}: topology.<path> knobs need --topology")
        topo = build_topology(cfg.topology, None, dict(cfg.catalog_overrides), args.topology_sets)
        overrides = dict(cfg.catalog_overrides)
        cfg = replace(cfg, catalog_overrides={})  # already in ``topo``; replay would rebuild it without the knobs
    result = replay(paths if len(paths) > 1 else paths[0], topo, cfg)
    if topo is not None:
        result.config = replace(result.config, catalog_overrides=overrides)
    stem = args.paths[0].name.split(".")[0] or "trace"
    out = args.out or Path("cosim-out") / f"replay-{stem}"
    return finish(result, args, out)
