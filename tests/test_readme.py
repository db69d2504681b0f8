"""The README: its quick start is what .ci/run runs; its examples do what their comments say."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _commands(text: str) -> list[str]:
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def test_ci_runs_exactly_the_readme_quick_start() -> None:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```(?:bash|sh)?\n(.*?)```", readme, re.S)
    assert block, "README has no code block"
    quick = _commands(block.group(1))
    assert len(quick) == 2, quick
    ci = [c for c in _commands((ROOT / ".ci/run").read_text())
          if not c.startswith(("set ", "cd ", "export ", "command -v chromium "))]  # setup lines, not commands
    assert ci == quick
    # The quick start is the first thing in the README, right under the title.
    assert readme.index("```") < readme.index("\n## ", 1) if "\n## " in readme else True


# --- The README's examples do what their comments say -------------------------------------------------------------
#
# Each example's comment states its result, checked here against real runs (never against figures written in this
# file): "A ms -> B ms" is the step time of the same command without its --set flags (the baseline) and with them;
# "measured A ms -> simulated B ms" the trace's own step time and the replayed one; "X ms" the command's own step
# time; "(N tokens/s/GPU)" the run's throughput; "unchanged" that A and B print the same; "X-bound" the resource on
# the critical path. Figures compare as printed (the same number of decimals), so a change of the default scenario or
# the models names the README line to update and the figures to put there.

_NUM = r"(\d+(?:\.\d+)?) (ms|us|s)\b"
_ARROW = re.compile(rf"(measured )?{_NUM} -> (?:simulated )?{_NUM}")
_ONE = re.compile(rf": {_NUM}")
_BOUND = re.compile(r"\b(host|GPU|communication|memcpy)-bound\b")
_UNIT = {"ms": 1e-3, "us": 1e-6, "s": 1.0}
_RUNS: dict[tuple[str, ...], dict] = {}


def _examples() -> list[tuple[int, str, str]]:
    """(line number, command, comment) of each line of the README's examples block."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Examples ("))
    first = next(i for i in range(start, len(lines)) if lines[i].startswith("```bash")) + 1
    out = []
    for i in range(first, len(lines)):
        if lines[i].startswith("```"):
            break
        cmd, _, comment = lines[i].partition("  # ")
        out.append((i + 1, cmd.strip(), comment.strip()))
    return out


def _printed(value_s: float, text: str, unit: str) -> str:
    """``value_s`` printed in ``unit`` with as many decimals as ``text`` has."""
    decimals = len(text.split(".")[1]) if "." in text else 0
    return f"{value_s / _UNIT[unit]:.{decimals}f}"


def _argv(cmd: str, tmp: Path) -> list[str]:
    """The example's arguments, ``../shared`` made the data folder's path (skip when absent)."""
    import shlex

    from cosim.resources import shared_dir

    argv = shlex.split(cmd)
    assert argv[0] == "cosim", cmd
    if any(a.startswith("../shared/") for a in argv):
        shared = shared_dir()
        if shared is None:
            pytest.skip("../shared not found: the example replays a trace from it")
        argv = [str(shared / a[len("../shared/"):]) if a.startswith("../shared/") else a for a in argv]
    return argv[1:]


def _without_sets(argv: list[str]) -> list[str]:
    out, skip = [], False
    for a in argv:
        if skip or a == "--set":
            skip = a == "--set"
            continue
        out.append(a)
    return out


def _json(argv: list[str], tmp: Path) -> dict:
    """Run ``cosim <argv> --json`` in this process (workloads cached between runs), outputs under ``tmp``."""
    import contextlib
    import io
    import json

    from cosim.cli import main

    key = tuple(argv)
    if key not in _RUNS:
        extra = ["--no-timeline", "--out", str(tmp / f"run{len(_RUNS)}")] if argv[0] in ("run", "replay") else []
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            code = main([*argv, *extra, "--json"])
        assert code == 0, f"cosim {' '.join(argv)}: exit {code}"
        _RUNS[key] = json.loads(buf.getvalue())
    return _RUNS[key]


def _check_factor(where: str, argv: list[str], comment: str) -> None:
    """"Nx less/more <link>" next to --set links.<id>.bandwidth=V: V is the catalog's bandwidth / N (x N)."""
    from cosim.catalog import load_catalog
    from cosim.units import parse_bandwidth

    m = re.search(r"\b(\d+(?:\.\d+)?)x (less|more) ", comment)
    sets = [a.partition("=") for a, prev in zip(argv[1:], argv) if prev == "--set"]
    bws = [(k.split(".")[1], v) for k, _, v in sets if re.fullmatch(r"links\.[^.]+\.bandwidth", k)]
    if not m or not bws:
        return
    (link, value), = bws
    ratio = parse_bandwidth(value) / load_catalog().links[link].bandwidth
    want = float(m.group(1)) ** (-1 if m.group(2) == "less" else 1)
    assert ratio == pytest.approx(want), (f"{where}: '{m.group(0).strip()}', but {link} {value} is {ratio:g}x the "
                                          f"catalog's {load_catalog().links[link].bandwidth / 1e9:g} GB/s")


def _check_step(lineno: int, argv: list[str], comment: str, tmp: Path) -> None:
    where = f"README.md:{lineno}"
    _check_factor(where, argv, comment)
    s = _json(argv, tmp)
    arrow, one = _ARROW.search(comment), _ONE.search(comment)
    assert arrow or one, f"{where}: the comment states no result ('A ms -> B ms' or ': X ms'): {comment!r}"
    if arrow:
        measured, a, ua, b, ub = arrow.groups()
        if measured:
            before = s["measured_step_time_s"]
        else:
            base = _without_sets(argv)
            assert base != argv, f"{where}: 'A -> B' needs --set flags (A is the run without them)"
            before = _json(base, tmp)["step_time_s"]
        got = f"{_printed(before, a, ua)} {ua} -> {_printed(s['step_time_s'], b, ub)} {ub}"
        assert got == f"{a} {ua} -> {b} {ub}", f"{where}: the comment says {a} {ua} -> {b} {ub}; the runs give {got}"
        if "unchanged" in comment:
            assert _printed(before, b, ub) == b, f"{where}: 'unchanged', but {got}"
    else:
        b, ub = one.groups()
        assert _printed(s["step_time_s"], b, ub) == b, (
            f"{where}: the comment says {b} {ub}; the run gives {_printed(s['step_time_s'], b, ub)} {ub}")
    tps = re.search(r"\((\d+(?:\.\d+)?) tokens/s/GPU\)", comment)
    if tps:
        got_tps = _printed(s["tokens_per_s_per_gpu"], tps.group(1), "s")
        assert got_tps == tps.group(1), f"{where}: the comment says {tps.group(1)} tokens/s/GPU; the run gives {got_tps}"
    bound = _BOUND.search(comment)
    if bound:
        got_bound = s["critical_path"]["bound"]
        assert got_bound == bound.group(1).lower(), f"{where}: the comment says {bound.group(0)}; it is {got_bound}-bound"


def _check_collective(lineno: int, argv: list[str], comment: str, tmp: Path) -> None:
    m = re.search(r"busbw ((?:\d+(?:\.\d+)? / )*\d+(?:\.\d+)?) GB/s", comment)
    assert m, f"README.md:{lineno}: the comment states no busbw"
    said = m.group(1).split(" / ")
    rows = _json(argv, tmp)["results"]
    got = [_printed(r["busbw_Bps"] * 1e-9, t, "s") for r, t in zip(rows, said)]
    assert len(rows) == len(said) and got == said, f"README.md:{lineno}: busbw {said} GB/s in the comment, {got} run"


def _check_topo_show(lineno: int, argv: list[str], comment: str, tmp: Path) -> None:
    import contextlib
    import io

    from cosim.cli import main

    m = re.search(r"(\d+) GPUs on (\d+) nodes", comment)
    assert m, f"README.md:{lineno}: the comment states no GPU and node counts"
    s = _json(argv, tmp)
    assert (s["gpus"], s["nodes"]) == (int(m.group(1)), int(m.group(2))), f"README.md:{lineno}: {s['gpus']} GPUs"
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    if "file it read" in comment:
        assert f"file: {Path(s['file']).resolve()}" in buf.getvalue().splitlines(), buf.getvalue()[:500]


def _check_export(lineno: int, argv: list[str], comment: str, tmp: Path) -> None:
    """"N Chakra ETs, M nodes (K all-to-all)": what ``cosim export --chakra`` wrote (into a temporary folder)."""
    m = re.search(r"(\d+) Chakra ETs, (\d+) nodes \((\d+) all-to-all\)", comment)
    assert m, f"README.md:{lineno}: the comment states no 'N Chakra ETs, M nodes (K all-to-all)'"
    i = argv.index("--chakra")
    s = _json([*argv[:i + 1], str(tmp / f"chakra{lineno}"), *argv[i + 2:]], tmp)
    got = (s["ranks"], s["nodes"], int(s["collectives"].get("ALL_TO_ALL", {}).get("count", 0)))
    assert got == tuple(map(int, m.groups())), f"README.md:{lineno}: the comment says {m.groups()}, the export {got}"


@pytest.mark.parametrize("lineno, cmd, comment", [pytest.param(*e, id=f"README.md:{e[0]}") for e in _examples()])
def test_readme_example_does_what_its_comment_says(lineno: int, cmd: str, comment: str, tmp_path_factory,
                                                   monkeypatch) -> None:
    monkeypatch.chdir(ROOT)  # "runnable from a checkout"; outputs go to a temporary folder
    tmp = tmp_path_factory.getbasetemp() / "readme-examples"
    assert comment, f"README.md:{lineno}: an example without a comment saying what it does"
    argv = _argv(cmd, tmp)
    if argv[0] in ("run", "replay"):
        _check_step(lineno, argv, comment, tmp)
    elif argv[0] == "collective":
        _check_collective(lineno, argv, comment, tmp)
    elif argv[0] == "export":
        _check_export(lineno, argv, comment, tmp)
    elif argv[:2] == ["topo", "show"]:
        _check_topo_show(lineno, argv, comment, tmp)
    else:
        pytest.fail(f"README.md:{lineno}: no check for `{cmd}`; add one to tests/test_readme.py")
