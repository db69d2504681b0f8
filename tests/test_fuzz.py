"""Fuzzing the input boundary (issue 13, point 2): real traces, Execution Traces, topology,
scenario and sweep YAML, mutated by hypothesis (delete, rename, retype, truncate, duplicate,
extreme numbers, control characters). Every outcome must be a clean result or a one-line
:class:`CosimInputError`; any other exception is a bug.

Bounded for CI: ``COSIM_FUZZ_EXAMPLES`` examples per target (default 25, derandomized so CI
runs the same cases); ``benchmarks/bench_fuzz.py --fuzz-budget N`` runs N random ones.
"""

from __future__ import annotations

import copy
import gzip
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cosim.errors import CosimInputError
from cosim.resources import bundled_dir, shared_dir

SHARED = shared_dir()
ROOT = Path(__file__).resolve().parent.parent
DATA = Path(__file__).parent / "data" / "workload"
EXAMPLES = int(os.environ.get("COSIM_FUZZ_EXAMPLES", "25"))
RANDOM = bool(os.environ.get("COSIM_FUZZ_RANDOM"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=not RANDOM,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture],
)

#: Values a mutated field may take: wrong types, extremes, edge numbers.
ODD_VALUES: list[Any] = [
    None, True, False, "", "soon", "12", "\x00", [], [1, 2], {}, {"a": 1}, -1, 0, -0.0, 1, 1e-300, 1e300, -1e300,
    2**63, -(2**63), 2**64, 1e17, 1e20, 3.5, "ProfilerStep#1", "nccl:all_reduce",
]
CONTROL = ["\x00", "\x01", "\x07", "\x1b", "\x7f", "\ufffe", "\ud800"]


def _shared(rel: str) -> Path:
    if SHARED is None or not (SHARED / "traces" / rel).exists():
        pytest.skip(f"../shared/traces/{rel} not found")
    return SHARED / "traces" / rel


def _load_json(p: Path) -> Any:
    raw = p.read_bytes()
    return json.loads(gzip.decompress(raw) if p.name.endswith(".gz") else raw)


# -- mutations --------------------------------------------------------------------------------------


def _paths(obj: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    """Every (container path, key) inside ``obj`` down to depth 2."""
    out: list[tuple] = []
    if depth > 2:
        return out
    items = obj.items() if isinstance(obj, dict) else enumerate(obj) if isinstance(obj, list) else []
    for k, v in items:
        out.append((*prefix, k))
        if isinstance(v, (dict, list)):
            out += _paths(v, (*prefix, k), depth + 1)
    return out


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def mutate_records(data: st.DataObject, doc: Any, key: str | None) -> bytes:
    """Mutate a JSON document whose records are ``doc[key]`` (or ``doc`` itself when key is None)."""
    doc = copy.deepcopy(doc)
    recs = doc[key] if key is not None else doc
    op = data.draw(st.sampled_from(["delete", "rename", "retype", "duplicate", "everywhere", "truncate", "control",
                                    "swap", "top"]))
    if op == "top" and isinstance(doc, dict):
        k = data.draw(st.sampled_from(sorted(doc)))
        doc[k] = data.draw(st.sampled_from(ODD_VALUES))
        return json.dumps(doc).encode()
    i = data.draw(st.integers(0, max(0, len(recs) - 1)))
    rec = recs[i] if recs else {}
    if op == "everywhere" and isinstance(rec, dict) and rec:
        field = data.draw(st.sampled_from(sorted(rec)))
        how = data.draw(st.sampled_from(["delete", "rename", "retype"]))
        val = data.draw(st.sampled_from(ODD_VALUES))
        for r in recs:
            if isinstance(r, dict) and field in r:
                if how == "delete":
                    del r[field]
                elif how == "rename":
                    r[field + "_renamed"] = r.pop(field)
                else:
                    r[field] = val
        return json.dumps(doc).encode()
    if op == "duplicate" and recs:
        recs.insert(data.draw(st.integers(0, len(recs))), copy.deepcopy(rec))
        return json.dumps(doc).encode()
    if op == "swap" and len(recs) > 1:
        j = data.draw(st.integers(0, len(recs) - 1))
        recs[i], recs[j] = recs[j], recs[i]
        return json.dumps(doc).encode()
    text = json.dumps(doc)
    if op == "truncate":
        return text[: data.draw(st.integers(0, len(text)))].encode()
    if op == "control":
        pos = data.draw(st.integers(0, len(text)))
        ch = data.draw(st.sampled_from(CONTROL))
        return (text[:pos] + ch + text[pos:]).encode("utf-8", "surrogatepass")
    paths = _paths(rec)
    if not paths:
        recs[i] = data.draw(st.sampled_from(ODD_VALUES))
        return json.dumps(doc).encode()
    path = data.draw(st.sampled_from(paths))
    parent = _get(rec, path[:-1])
    k = path[-1]
    if op == "delete":
        del parent[k]
    elif op == "rename" and isinstance(parent, dict):
        parent[f"{k}_x"] = parent.pop(k)
    else:
        parent[k] = data.draw(st.sampled_from(ODD_VALUES))
    return json.dumps(doc).encode()


def mutate_text(data: st.DataObject, text: str) -> str:
    """Mutate YAML text line-wise: delete, rename a key, retype a value, truncate, duplicate, extremes, controls."""
    lines = text.split("\n")
    op = data.draw(st.sampled_from(["delete", "rename", "retype", "truncate", "duplicate", "extreme", "control",
                                    "indent"]))
    i = data.draw(st.integers(0, max(0, len(lines) - 1)))
    line = lines[i] if lines else ""
    if op == "delete":
        del lines[i]
    elif op == "truncate":
        return text[: data.draw(st.integers(0, len(text)))]
    elif op == "duplicate":
        lines.insert(i, line)
    elif op == "control":
        pos = data.draw(st.integers(0, len(text)))
        return text[:pos] + data.draw(st.sampled_from([*CONTROL[:5], "\t", "\r", "\ufeff"])) + text[pos:]
    elif op == "indent":
        lines[i] = data.draw(st.sampled_from(["", " ", "   ", "\t"])) + line.lstrip()
    elif ":" in line:
        key, _, val = line.partition(":")
        if op == "rename":
            lines[i] = f"{key}_x:{val}"
        elif op == "retype":
            new = data.draw(st.sampled_from(["", "[]", "{}", "null", "yes", "0o17", "-1", "abc", "[1, 2]",
                                             "'450 GB/s'", "1e400", ".nan", "~", "!!binary aGk=", "&a x", "*a"]))
            lines[i] = f"{key}: {new}"
        else:  # extreme numbers, with and without units
            new = data.draw(st.sampled_from(["1e308", "-1e308", "0", "-0", "1e-320", "9" * 40, '"1e300 GB/s"',
                                             '"-5 us"', '"0 GB/s"', '"inf GB/s"', '"nan us"', "99999999999"]))
            lines[i] = f"{key}: {new}"
    return "\n".join(lines)


# -- the targets ------------------------------------------------------------------------------------

_TOPO: dict[str, Any] = {}


def _topology() -> Any:
    from cosim.topology import load_topology

    if "t" not in _TOPO:
        _TOPO["t"] = load_topology("dgx-h100")
    return _TOPO["t"]


def _check_trace_outcome(paths: list[Path]) -> None:
    """Load (and, when it loads, replay) a possibly corrupt trace: a result or CosimInputError only."""
    from cosim.replay import replay
    from cosim.workload import load_trace

    try:
        g = load_trace(paths if len(paths) > 1 else paths[0], cache=False)
        s = replay(g, _topology()).summary()
        json.dumps(s, allow_nan=False, default=str)
    except CosimInputError as exc:
        assert "\n" not in str(exc)


def _trace_target(src: Path, key: str | None):
    doc = _load_json(src)

    @FUZZ
    @given(data=st.data())
    def run(tmp_path_factory: pytest.TempPathFactory, data: st.DataObject) -> None:
        p = tmp_path_factory.mktemp("fz") / src.name.replace(".gz", "")
        p.write_bytes(mutate_records(data, doc, key))
        _check_trace_outcome([p])

    return run


def test_fuzz_kineto_small_synthetic(tmp_path_factory: pytest.TempPathFactory) -> None:
    _trace_target(DATA / "ns_epoch.json", "traceEvents")(tmp_path_factory)


def test_fuzz_kineto_real_h100(tmp_path_factory: pytest.TempPathFactory) -> None:
    _trace_target(_shared("kineto-h100/before_fix_trace.json.gz"), "traceEvents")(tmp_path_factory)


def test_fuzz_kineto_real_event_sync(tmp_path_factory: pytest.TempPathFactory) -> None:
    _trace_target(_shared("hta/event-sync.json.gz"), "traceEvents")(tmp_path_factory)


def test_fuzz_execution_trace_chakra(tmp_path_factory: pytest.TempPathFactory) -> None:
    _trace_target(_shared("chakra-et/1.0.2-chakra.0.0.4.json.gz"), "nodes")(tmp_path_factory)


def test_fuzz_execution_trace_with_kineto(tmp_path_factory: pytest.TempPathFactory) -> None:
    et = _shared("hta/simple-add-et.json.gz")
    kin = _shared("hta/simple-add-kineto-for-et.json.gz")
    doc = _load_json(et)

    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        d = tmp_path_factory.mktemp("fz")
        (d / "et.json").write_bytes(mutate_records(data, doc, "nodes"))
        _check_trace_outcome([d / "et.json", kin])

    run()


def _yaml_target(text: str, name: str, load: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    @FUZZ
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        p = tmp_path_factory.mktemp("fz") / name
        p.write_text(mutate_text(data, text), encoding="utf-8", errors="surrogatepass")
        try:
            load(p)
        except CosimInputError as exc:
            assert "\n" not in str(exc)

    run()


@pytest.mark.parametrize("name", ["dgx-h100.yaml", "dgx-h100-4node.yaml", "proposal-example.yaml"])
def test_fuzz_topology_yaml(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    from cosim.topology import load_topology

    text = (bundled_dir("topologies") / name).read_text()  # proposal-example extends a preset by name
    _yaml_target(text, name, load_topology, tmp_path_factory)


def test_fuzz_scenario_yaml(tmp_path_factory: pytest.TempPathFactory) -> None:
    from cosim.scenario import load_scenario

    src = bundled_dir("workloads") / "scenarios" / "moe-ep2-decode-dgx-h100.yaml"
    _yaml_target(src.read_text(), "scenario.yaml", load_scenario, tmp_path_factory)


def test_fuzz_sweep_yaml(tmp_path_factory: pytest.TempPathFactory) -> None:
    from cosim.sweep.spec import load_sweep

    text = (ROOT / "studies" / "host-launch" / "sweep.yaml").read_text()
    text = text.replace("base: scenario.yaml", "base: moe-ep2-decode-dgx-h100")
    _yaml_target(text, "sweep.yaml", load_sweep, tmp_path_factory)


def test_mutations_really_mutate(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The fuzzer is not vacuous: among its mutations of a trace some load and some are refused."""
    from cosim.workload import load_trace

    doc = _load_json(DATA / "ns_epoch.json")
    outcomes: list[str] = []

    @settings(max_examples=40, deadline=None, derandomize=True, database=None)
    @given(data=st.data())
    def run(data: st.DataObject) -> None:
        p = tmp_path_factory.mktemp("fz") / "t.json"
        p.write_bytes(mutate_records(data, doc, "traceEvents"))
        try:
            load_trace(p, cache=False)
            outcomes.append("loaded")
        except CosimInputError:
            outcomes.append("refused")

    run()
    assert outcomes.count("loaded") >= 3 and outcomes.count("refused") >= 3, outcomes
