"""The docs name only things that exist: files, modules and attributes, `cosim` flags, links, the module map.

README.md and docs/*.md are read as text; each check fails naming the doc, its line and the dangling reference,
so a rename in the code names the line of the doc to update:

- a repository path in backticks (`cosim/replay/links.py`, `tests/test_x.py`, `validation/e2e/RESULTS.md`; a
  path with a placeholder, `timeline/rank<N>.json.gz`-style, must match at least one file; `tests/x.py::name`:
  the file defines ``name``);
- a dotted `cosim.x.y` in backticks: the longest importable module, then attributes (a schema id such as
  `cosim.summary/2` is not a reference);
- a `--flag` of a `cosim SUBCOMMAND ...` command (in backticks or on a line of a code block): the subcommand's
  parser defines it;
- a relative Markdown link: its file exists and, when it has an `#anchor` into a Markdown file, a heading of that
  file has that anchor (GitHub's rule: lower case, punctuation dropped, spaces to hyphens);
- docs/ARCHITECTURE.md's module map: every module of the package is named there, and every `name.py` it names is
  a module of the package;
- `Class.attr` of a class of the package; a section of another doc cited by its title;
- the tables that list what the code has: CATALOG.md's catalog ids, TOPOLOGY.md's presets with their four
  bandwidth figures, README's Layout rows (every doc, every top-level part of the package).
"""

from __future__ import annotations

import argparse
import importlib
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REPO_DIRS = ("cosim", "tests", "validation", "benchmarks", "studies", "topologies", "workloads", "docs", ".ci")
PATH = re.compile(rf"(?<![\w./-])((?:{'|'.join(re.escape(d) for d in REPO_DIRS)})/[\w./*<>{{}}-]*)")
DOTTED = re.compile(r"(?<![\w./-])(cosim(?:\.[A-Za-z_]\w*)+)(/\d)?")
PLACEHOLDER = re.compile(r"<[^>]*>|\{[^}]*\}|\*")
NOT_IN_A_CHECKOUT = ("cosim/_bundled/",)
"""Paths that exist only in an installed wheel (pyproject.toml maps topologies/ and workloads/ there)."""


def _lines() -> list[tuple[str, str, bool]]:
    """(where, line, inside a code block) of every line of the docs."""
    out = []
    for doc in DOCS:
        fenced = False
        for n, line in enumerate(doc.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
                continue
            out.append((f"{doc.relative_to(ROOT)}:{n}", line, fenced))
    return out


def _spans(line: str) -> list[str]:
    """The backticked spans of one line (a span broken over two lines is not read)."""
    return re.findall(r"`([^`\n]+)`", line)


def test_repository_paths_exist() -> None:
    """Backticked repository paths exist (placeholders glob), and `tests/x.py::name` names a test of that file."""
    bad = []
    for where, line, _ in _lines():
        for span in _spans(line):
            for p in PATH.findall(span):
                p = p.rstrip(".,:;")
                if p.startswith(NOT_IN_A_CHECKOUT):
                    continue
                if PLACEHOLDER.search(p):
                    if not any(ROOT.glob(PLACEHOLDER.sub("*", p).rstrip("/"))):
                        bad.append(f"{where}: no file matches `{p}`")
                elif not (ROOT / p).exists():
                    bad.append(f"{where}: `{p}` does not exist")
            for p, name in re.findall(r"(tests/\w+\.py)::(\w+)", span):
                if (ROOT / p).exists() and not re.search(rf"^\s*(?:def|class) {name}\b", (ROOT / p).read_text(), re.M):
                    bad.append(f"{where}: `{p}` has no {name}")
    assert not bad, "\n".join(bad)


def _resolve(dotted: str) -> str | None:
    """Why ``dotted`` does not resolve (None when it does): the longest importable module, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        name = ".".join(parts[:i])
        try:
            obj = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and not exc.name.startswith("cosim"):
                return None  # an optional dependency (torch, dask) is missing here: nothing to check
            continue
        for a in parts[i:]:
            if not hasattr(obj, a):
                return f"{name} has no attribute {a!r}"
            obj = getattr(obj, a)
            name = f"{name}.{a}"
        return None
    return "no such module"


def test_dotted_cosim_names_resolve() -> None:
    """Backticked `cosim.x.y` names resolve: a module, then its attributes."""
    bad = []
    for where, line, _ in _lines():
        for span in _spans(line):
            for dotted, schema in DOTTED.findall(span):
                why = None if schema else _resolve(dotted)
                if why:
                    bad.append(f"{where}: `{dotted}`: {why}")
    assert not bad, "\n".join(bad)


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    acts = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(acts[0].choices) if acts else {}


def _command_flags(text: str) -> list[tuple[list[str], str]]:
    """(subcommand path, flag) of each ``--flag`` of a ``cosim ...`` command in ``text``."""
    out = []
    for m in re.finditer(r"(?:^|(?<=[\s`(]))cosim ([^`|#\n]*)", text):
        try:
            argv = shlex.split(m.group(1))
        except ValueError:
            argv = m.group(1).split()
        words = [a for a in argv if re.fullmatch(r"[a-z]+", a)][:2]
        out.extend((words, a.split("=", 1)[0]) for a in argv if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", a))
    return out


def test_cosim_command_flags_exist() -> None:
    """Each `--flag` of a `cosim SUBCOMMAND ...` in the docs is an option of that subcommand's parser."""
    from cosim.cli import build_parser

    top = build_parser()
    commands = _subparsers(top)
    bad = []
    for where, line, fenced in _lines():
        texts = [line] if fenced else _spans(line)
        for text in texts:
            for words, flag in _command_flags(text):
                if not words or words[0] not in commands:
                    continue
                parser = commands[words[0]]
                sub = _subparsers(parser)
                if sub and len(words) > 1 and words[1] in sub:
                    parser = sub[words[1]]
                known = set(parser._option_string_actions) | set(top._option_string_actions)
                if flag not in known:
                    bad.append(f"{where}: `cosim {' '.join(words)}` has no {flag}")
    assert not bad, "\n".join(bad)


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*]", "", heading.strip().lstrip("#").strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def test_relative_links_resolve() -> None:
    """Relative Markdown links reach a file, and an `#anchor` into a Markdown file one of its headings."""
    bad = []
    for where, line, fenced in _lines():
        if fenced:
            continue
        doc = ROOT / where.rsplit(":", 1)[0]
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", line):
            if target.startswith(("http:", "https:", "mailto:")):
                continue
            path = (doc.parent / target) if target else doc
            if not path.exists():
                bad.append(f"{where}: link to {target}, which does not exist")
            elif anchor and path.suffix == ".md":
                heads = {_anchor(h) for h in re.findall(r"^#+ .*$", path.read_text(), re.M)}
                if anchor not in heads:
                    bad.append(f"{where}: link to {target}#{anchor}: no such heading")
    assert not bad, "\n".join(bad)


def _modules() -> list[Path]:
    """The package's modules a reader looks for: not ``__init__``, not generated protobuf code."""
    return sorted(p for p in (ROOT / "cosim").rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py") and not p.name.endswith("_pb2.py"))


def test_architecture_module_map_is_complete_and_true() -> None:
    """docs/ARCHITECTURE.md names every module of the package (commands in its Layer 8 paragraph), and no other."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    cli = re.search(r"\*\*Layer 8: cli\*\*(.*?)\n\n", text, re.S)
    assert cli, "docs/ARCHITECTURE.md: no '**Layer 8: cli**' paragraph"
    cli_named = set(re.findall(r"`(\w+)`", cli.group(1)))
    missing = []
    for p in _modules():
        rel = p.relative_to(ROOT / "cosim")
        if rel.parts[0] == "cli":
            if p.stem not in cli_named:
                missing.append(f"cosim/{rel} (a command: name `{p.stem}` in the Layer 8 paragraph)")
        elif not re.search(rf"`(?:[\w/]*/)?{re.escape(p.name)}`|[(,] ?`?{re.escape(p.name)}`", text) \
                and f"{rel.parent.name}/{p.name}" not in text:
            missing.append(f"cosim/{rel}")
    assert not missing, "docs/ARCHITECTURE.md's module map does not name:\n" + "\n".join(missing)
    names = {p.name for p in _modules()} | {"__init__.py", "__main__.py"}
    named = {f for d, f in re.findall(r"`([\w/]*/)?(\w+\.py)`", text) if not d.startswith(REPO_DIRS[1:])}
    dangling = sorted(named - names)
    assert not dangling, f"docs/ARCHITECTURE.md names modules that do not exist: {dangling}"


@pytest.mark.parametrize("text, want", [
    ("`cosim run dsv3-1024 --set a=b --no-timeline`", [(["run"], "--set"), (["run"], "--no-timeline")]),
    ("`cosim topo show dgx-h100 --json`", [(["topo", "show"], "--json")]),
    ("run `cosim export --chakra OUT` then", [(["export"], "--chakra")]),
])
def test_command_flags_are_read_as_a_reader_would(text: str, want: list[tuple[list[str], str]]) -> None:
    """The flag reader on worked cases: subcommand words, then each flag without its value."""
    assert _command_flags(text) == want


def test_anchor_rule() -> None:
    """GitHub's heading anchors, worked by hand."""
    assert _anchor("## The `--set` keys (what-if knobs)") == "the---set-keys-what-if-knobs"
    assert _anchor("### Round 14: s14-job") == "round-14-s14-job"
    assert _anchor("## Trace replay (`bench_replay.py`)") == "trace-replay-bench_replaypy"


def test_catalog_doc_lists_every_catalog_entry() -> None:
    """docs/CATALOG.md's "What is in it" table names every bundled id of each section (`a` … `b`: a run of ids in
    catalog order) and no id the catalog lacks."""
    from cosim.catalog import load_catalog

    cat = load_catalog()
    text = (ROOT / "docs" / "CATALOG.md").read_text()
    bad = []
    for section in ("accelerators", "cpus", "nics", "links"):
        row = re.search(rf"^\| `{section}` \|(.*)\|$", text, re.M)
        assert row, f"docs/CATALOG.md: no '| `{section}` |' row in 'What is in it'"
        ids = list(getattr(cat, section))
        named = set(re.findall(r"`([\w.-]+)`", row.group(1)))
        for a, b in re.findall(r"`([\w.-]+)` … `([\w.-]+)`", row.group(1)):
            if a in ids and b in ids:
                named |= set(ids[ids.index(a):ids.index(b) + 1])
        bad += [f"{section}: `{i}` is in the catalog, not in the table" for i in ids if i not in named]
        bad += [f"{section}: `{i}` is in the table, not in the catalog" for i in sorted(named - set(ids))]
    assert not bad, "docs/CATALOG.md:\n" + "\n".join(bad)


def test_topology_presets_table_matches_the_presets() -> None:
    """docs/TOPOLOGY.md's "Presets" table has a row per bundled preset, and its scale-up, scale-out, host and
    bisection columns are what ``Topology.figures()`` gives (the first figure of a cell, as printed there)."""
    from cosim.topology import load_topology
    from cosim.units import parse_bandwidth

    text = (ROOT / "docs" / "TOPOLOGY.md").read_text()
    table = text.split("## Presets", 1)[1].split("\n\n", 2)[1]
    rows = {r[0]: r[1:] for r in (ln.strip("|").split("|") for ln in table.splitlines()[2:])}
    rows = {k.strip(): [c.strip() for c in v] for k, v in rows.items()}
    presets = sorted(p.stem for p in (ROOT / "topologies").glob("*.yaml"))
    assert sorted(rows) == presets, f"docs/TOPOLOGY.md's Presets table: rows {sorted(rows)}, presets {presets}"
    keys = ("per_gpu_scale_up_bw_Bps", "per_gpu_scale_out_bw_Bps", "per_gpu_host_bw_Bps", "bisection_bw_Bps")
    bad = []
    for name, cells in rows.items():
        figs = load_topology(name).figures()
        for key, cell in zip(keys, cells[1:5]):
            m = re.match(r"(\d+(?:\.\d+)?)(?: ([kMGT]?B/s))?", cell)
            assert m, f"docs/TOPOLOGY.md, preset {name}: no figure in {cell!r}"
            said = parse_bandwidth(f"{m.group(1)} {m.group(2)}") if m.group(2) else float(m.group(1))
            if said != pytest.approx(figs[key], rel=5e-3):
                bad.append(f"{name}: {key} is {figs[key] / 1e9:g} GB/s, the table says {cell!r}")
    assert not bad, "docs/TOPOLOGY.md's Presets table:\n" + "\n".join(bad)


def test_readme_layout_names_every_doc_and_package_part() -> None:
    """README's Layout table links every docs/*.md and names every top-level module and package of ``cosim``."""
    readme = (ROOT / "README.md").read_text()
    docs_row = re.search(r"^\| `docs/` \|(.*)$", readme, re.M)
    pkg_row = re.search(r"^\| `cosim/` \|(.*)$", readme, re.M)
    assert docs_row and pkg_row, "README.md: no `docs/` or `cosim/` row in the Layout table"
    linked = set(re.findall(r"\]\(docs/([\w.]+\.md)\)", docs_row.group(1)))
    missing = sorted({p.name for p in (ROOT / "docs").glob("*.md")} - linked)
    named = set(re.findall(r"`(\w+)`", pkg_row.group(1)))
    parts = {p.stem for p in (ROOT / "cosim").iterdir()
             if (p.suffix == ".py" or (p / "__init__.py").exists()) and not p.name.startswith("_")}
    missing += sorted(f"cosim.{m}" for m in parts - named)
    assert not missing, f"README.md's Layout table does not name: {missing}"


def test_class_attributes_exist() -> None:
    """`Class.attr` in backticks, where ``Class`` is a class of the package: the class (or its instances: an
    assignment ``self.attr`` or an annotation ``attr:`` in the source) has ``attr``."""
    import inspect
    import pkgutil

    import cosim

    classes: dict[str, list[type]] = {}
    for m in pkgutil.walk_packages(cosim.__path__, "cosim."):
        if m.name.endswith("__main__"):
            continue  # running it would run the CLI
        try:
            mod = importlib.import_module(m.name)
        except ModuleNotFoundError as exc:  # an optional dependency (torch) is missing here
            if exc.name and exc.name.startswith("cosim"):
                raise
            continue
        for name, obj in vars(mod).items():
            if inspect.isclass(obj) and obj.__module__.startswith("cosim"):
                classes.setdefault(name, []).append(obj)
    source = "\n".join(p.read_text() for p in (ROOT / "cosim").rglob("*.py"))
    bad = []
    for where, line, _ in _lines():
        for span in _spans(line):
            for cls, attr in re.findall(r"(?<![\w.])([A-Z]\w*)\.([a-z_]\w*)", span):
                if cls not in classes or any(hasattr(c, attr) for c in classes[cls]):
                    continue
                if not re.search(rf"self\.{attr}\b|^\s+{attr}:", source, re.M):
                    bad.append(f"{where}: `{cls}.{attr}`: no such attribute")
    assert not bad, "\n".join(bad)


def test_cited_sections_exist() -> None:
    """A section cited by its title (`benchmarks/README.md, "Round 14 merged"`, `docs/SYNTHESIS.md, *Scale*`): the
    file has a heading containing that title."""
    cite = re.compile(r"((?:[\w./]+/)?\w+\.md)\)?,? (?:section |\(|§)?[\"“*]([^\"”*]{3,80})[\"”*]")
    bad, n = [], 0
    for where, line, _ in _lines():
        doc = ROOT / where.rsplit(":", 1)[0]
        for name, title in cite.findall(line):
            target = next((p for p in (ROOT / name, doc.parent / name, ROOT / "docs" / name) if p.exists()), None)
            if target is None:
                continue  # a bare RESULTS.md or another project's file: not resolvable here
            n += 1
            heads = [h.lower() for h in re.findall(r"^#+ (.*)$", target.read_text(), re.M)]
            if not any(title.strip().rstrip(".,").lower() in h for h in heads):
                bad.append(f"{where}: {name} has no section {title!r}")
    assert n > 10, f"only {n} cited sections found: has the citation style changed?"
    assert not bad, "\n".join(bad)
