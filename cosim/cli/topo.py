"""``cosim topo``: list, check, show and draw hardware topologies."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from cosim.cli import add_json_flag, emit_json

__all__ = ["register"]


def _list(args: argparse.Namespace) -> int:
    from cosim.topology import list_presets
    from cosim.topology.loader import preset_path
    from cosim.yamlio import load_yaml

    rows: list[dict[str, Any]] = []
    for name in list_presets():
        path = preset_path(name)
        data = load_yaml(path) if path else {}
        rows.append({
            "name": name,
            "description": str(data.get("description", "")) if isinstance(data, dict) else "",
            "file": str(path),
        })
    if args.json:
        emit_json(rows)
        return 0
    width = max((len(r["name"]) for r in rows), default=4)
    for r in rows:
        sys.stdout.write(f"{r['name']:<{width}}  {r['description']}\n")
    return 0


def _check(args: argparse.Namespace) -> int:
    from cosim.topology import check_topology

    topo = check_topology(args.topology)
    fig = topo.figures()
    if args.json:
        emit_json({"ok": True, "name": topo.name, "file": str(topo.source_file), "nodes": fig["nodes"],
                   "gpus": fig["gpus"], "devices": fig["devices"], "links": fig["links"]})
        return 0
    ndev = sum(fig["devices"].values())
    nlinks = sum(fig["links"].values())
    sys.stdout.write(f"ok: {topo.name}: {fig['nodes']} host node(s), {fig['gpus']} GPUs, "
                     f"{ndev} devices, {nlinks} physical links ({topo.source_file})\n")
    return 0


def _show(args: argparse.Namespace) -> int:
    from cosim.topology import load_topology
    from cosim.topology.render import show_text, summary_json

    topo = load_topology(args.topology, overrides=_overrides(args))
    if args.json:
        emit_json(summary_json(topo) | {"file": _file_text(topo.source_file)})
    else:
        head, _, rest = show_text(topo).partition("\n")
        sys.stdout.write(f"{head}\nfile: {_file_text(topo.source_file, shadow=True)}\n{rest}")
    return 0


def _file_text(path: Any, shadow: bool = False) -> str | None:
    """The absolute path of the topology file a command used; with ``shadow``, saying which installed preset
    of the same name it hides (a name is looked up in ./topologies before the installed presets)."""
    from pathlib import Path

    from cosim.resources import bundled_dir

    if path is None:
        return None
    p = Path(path).resolve()
    if not shadow:
        return str(p)
    try:
        installed = bundled_dir("topologies") / p.name
    except FileNotFoundError:
        return str(p)
    if installed.is_file() and installed.resolve() != p and p.parent == (Path.cwd() / "topologies").resolve():
        return f"{p} (./topologies first; it hides the installed {installed.resolve()})"
    return str(p)


def _draw(args: argparse.Namespace) -> int:
    from cosim.fileio import write_text
    from cosim.topology import load_topology
    from cosim.topology.render import draw_html

    topo = load_topology(args.topology, overrides=_overrides(args))
    write_text(args.out, draw_html(topo))
    if args.json:
        emit_json({"out": str(args.out), "name": topo.name, "devices": topo.graph.number_of_nodes(),
                   "directed_links": topo.graph.number_of_edges()})
    else:
        sys.stdout.write(f"wrote {args.out}\n")
    return 0


def _overrides(args: argparse.Namespace) -> dict[str, str] | None:
    from cosim.errors import CosimInputError

    out: dict[str, str] = {}
    for item in getattr(args, "set", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CosimInputError(f"--set {item!r}: write section.id.field=value, e.g. links.nvlink4.bandwidth='50 GB/s'")
        out[key.strip()] = value.strip()
    return out or None


def register(subparsers: Any) -> None:
    """Add ``cosim topo`` and its subcommands."""
    p = subparsers.add_parser("topo", help="hardware topologies: list, check, show, draw",
                              description="Hardware topologies (presets or YAML files). See docs/TOPOLOGY.md.")
    sub = p.add_subparsers(dest="topo_command", metavar="SUBCOMMAND")
    sub.required = True

    q = sub.add_parser("list", help="list the bundled presets")
    add_json_flag(q)
    q.set_defaults(func=_list)

    q = sub.add_parser("check", help="load and check a topology file or preset (exit 2 on the first problem)")
    q.add_argument("topology", metavar="FILE|NAME")
    add_json_flag(q)
    q.set_defaults(func=_check)

    q = sub.add_parser("show", help="device and link counts, host PCIe tree, headline figures")
    q.add_argument("topology", metavar="NAME|FILE")
    q.add_argument("--set", action="append", metavar="PATH=VALUE",
                   help="catalog override, e.g. --set links.nvlink4.bandwidth='50 GB/s' (repeatable)")
    add_json_flag(q)
    q.set_defaults(func=_show)

    q = sub.add_parser("draw", help="write an interactive HTML drawing (plotly, works offline)")
    q.add_argument("topology", metavar="NAME|FILE")
    q.add_argument("--out", required=True, metavar="FILE.html")
    q.add_argument("--set", action="append", metavar="PATH=VALUE", help="catalog override (repeatable)")
    add_json_flag(q)
    q.set_defaults(func=_draw)
