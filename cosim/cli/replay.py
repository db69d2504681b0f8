"""``cosim replay``: replay captured PyTorch traces on a topology."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosim.cli import add_json_flag, emit_json

__all__ = ["register"]


def add_replay_knobs(p: argparse.ArgumentParser) -> None:
    """Flags shared by ``replay`` and ``run``."""
    p.add_argument("--topology", help="topology preset or YAML file (default: matches the traced GPU)")
    p.add_argument("--durations", choices=("measured", "modeled"), help="GPU op durations (default measured)")
    p.add_argument("--profile", help="kernel-model calibration profile for --durations modeled "
                                     "(bundled name or YAML; default: the accelerator's bundled profile)")
    p.add_argument("--collectives", choices=("measured", "simulated"),
                   help="communication kernels: measured times, or flows on the fabric (default measured)")
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
    add_replay_knobs(p)
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace, base=None):
    from cosim.replay import ReplayConfig, apply_sets, parse_sets

    cfg = base or ReplayConfig()
    sets = {}
    if args.topology:
        sets["topology"] = args.topology
    if args.durations:
        sets["durations"] = args.durations
    if args.collectives:
        sets["collectives"] = args.collectives
    if getattr(args, "profile", None):
        sets["profile"] = args.profile
    sets.update(parse_sets(args.sets))
    return apply_sets(cfg, sets)


def finish(result, args: argparse.Namespace, out: Path) -> int:
    """Write outputs and print the summary (table, or JSON with --json)."""
    from cosim.output.text import format_hardware, format_summary
    from cosim.report import write_run_report

    paths = result.write(out, timeline=not args.no_timeline)
    paths["report"] = write_run_report(result, out / "report.html")
    summary = result.summary()
    if args.json:
        emit_json(summary)
    else:
        if hasattr(result.topology, "figures"):
            print(format_hardware(result.topology))
        print(format_summary(summary))
        print("wrote " + ", ".join(str(p) for p in paths.values()))
    sys.stdout.flush()
    return 0


def run(args: argparse.Namespace) -> int:
    from cosim.replay import replay

    cfg = config_from_args(args)
    paths = [str(p) for p in args.paths]
    result = replay(paths if len(paths) > 1 else paths[0], None, cfg)
    stem = args.paths[0].name.split(".")[0] or "trace"
    out = args.out or Path("cosim-out") / f"replay-{stem}"
    return finish(result, args, out)
