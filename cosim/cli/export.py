"""``cosim export --chakra OUT_DIR SCENARIO``: a scenario's workload as Chakra execution traces (ASTRA-sim's input)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosim.cli import add_json_flag

__all__ = ["register"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a scenario's workload in another simulator's format (Chakra ET)",
                       description="Write the workload of a scenario (a synthesized step, every rank unfolded, or a "
                                   "captured trace) as Chakra execution traces OUT_DIR/<prefix>.<rank>.et plus "
                                   "<prefix>.comm_groups.json, the inputs of ASTRA-sim's --workload-configuration "
                                   "and --comm-group-configuration (docs/EXPORT.md).")
    p.add_argument("scenario", nargs="?", help="scenario name or scenario YAML file (default: cosim run's)")
    p.add_argument("--chakra", type=Path, required=True, metavar="OUT_DIR", help="folder for the Chakra traces")
    p.add_argument("--prefix", help="file prefix (default: the scenario's name)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario field, as in cosim run (repeatable)")
    add_json_flag(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cosim.cli import emit_json
    from cosim.output.chakra import export_scenario
    from cosim.replay import parse_sets

    res = export_scenario(args.scenario, args.chakra, parse_sets(args.sets), prefix=args.prefix,
                          progress=not args.json and sys.stderr.isatty())
    if args.json:
        emit_json(res.to_json())
        return 0
    print(f"wrote {res.ranks} Chakra ETs {res.prefix}.{{0..{res.ranks - 1}}}.et ({res.nodes:,} nodes, "
          f"{res.compute_nodes:,} compute) and {res.comm_groups.name}")
    for k, v in sorted(res.collectives.items()):
        print(f"  {k:<15} {int(v['count']):>9,} nodes  {v['bytes'] / 2**30:12.3f} GiB")
    for n in res.notes:
        print(f"note: {n}")
    return 0
