"""Chakra execution-trace export (cosim.output.chakra, `cosim export --chakra`): docs/EXPORT.md."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("google.protobuf")

from cosim.errors import CosimInputError
from cosim.output import chakra_schema
from cosim.output.chakra import collective_traces, export_scenario, read_chakra, write_chakra
from cosim.output.chakra_schema import et_def_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
SCHEMA = Path(chakra_schema.__file__).parent

# tiny-moe (2 MoE layers, hidden 64, 8 experts top-2) on one DGX H100: tp 1, pp 2 (one layer per stage),
# dp 4, ep 2 (edp 2), one micro-batch of 128 tokens per pipeline, bf16.
TINY = """\
name: tiny-chakra
workload:
  synthetic:
    model: tiny-moe
    layout: {pp: 2, ep: 2}
    batch: {global: 4, micro: 1, seq: 128}
    precision: bf16
    routing: uniform
topology: dgx-h100
"""


def _graph_collectives(graph) -> tuple[Counter, Counter]:
    """Count and input bytes of the graph's collectives by Chakra collective type (all ranks)."""
    names = {0: "ALL_REDUCE", 1: "ALL_GATHER", 2: "REDUCE_SCATTER", 3: "ALL_TO_ALL"}
    n: Counter = Counter()
    b: Counter = Counter()
    for rg in graph.ranks:
        for c in range(len(rg.collectives)):
            t = names.get(int(rg.collectives.type[c]))
            if t:
                n[t] += 1
                b[t] += int(rg.collectives.in_bytes[c])
    return n, b


def _attrs(node) -> dict:
    return {a.name: getattr(a, a.WhichOneof("value")) for a in node.attr}


def _decode_like_chakra(path: Path) -> tuple[pb.GlobalMetadata, list[pb.Node]]:
    """Chakra's protolib.decodeMessage loop, with protobuf's own varint decoder (not cosim's reader)."""
    from google.protobuf.internal.decoder import _DecodeVarint32

    raw = path.read_bytes()
    pos, msgs = 0, []
    while pos < len(raw):
        size, pos = _DecodeVarint32(raw, pos)
        msg = pb.GlobalMetadata() if not msgs else pb.Node()
        msg.ParseFromString(raw[pos:pos + size])
        msgs.append(msg)
        pos += size
    return msgs[0], msgs[1:]


def test_vendored_schema_is_chakras_and_generated_code_matches_it() -> None:
    proto = (SCHEMA / "et_def.proto").read_text()
    # the unedited file of the commit named in the provenance
    assert hashlib.sha256(proto.encode()).hexdigest() in chakra_schema.__doc__.replace("\n", "")
    body = re.search(r"message Node \{(.*?)\n\}", proto, re.S).group(1)
    fields = {m.group(2): int(m.group(3)) for m in re.finditer(r"^\s+(?:repeated )?(\w+) (\w+) = (\d+);", body, re.M)}
    assert {f.name: f.number for f in pb.Node.DESCRIPTOR.fields} == fields
    for enum in ("NodeType", "CollectiveCommType"):
        text = re.search(rf"enum {enum} \{{(.*?)\}}", proto, re.S).group(1)
        want = {k: int(v) for k, v in re.findall(r"(\w+) = (\d+);", text)}
        got = {v.name: v.number for v in pb.DESCRIPTOR.enum_types_by_name[enum].values}
        assert got == want


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("chakra")
    scn = d / "tiny.yaml"
    scn.write_text(TINY)
    res = export_scenario(scn, d / "et")
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.scenario import build_topology, load_scenario
    from cosim.workload.synth import synthesize

    s = load_scenario(scn)
    syn = synthesize(s.workload.synthetic.model_copy(update={"fold": False}), build_topology("dgx-h100", None), None,
                     kernel_timer=synthetic_kernel_timer)
    return res, syn.graph


def test_tiny_step_round_trips_with_hand_worked_collectives(tiny) -> None:
    res, graph = tiny
    assert res.ranks == 8 and [p.name for p in res.files()] == [f"tiny-chakra.{r}.et" for r in range(8)]
    T, h, k, act = 128, 64, 2, 2  # tokens per micro-batch, hidden, top-k, bf16 bytes
    per_type: Counter = Counter()
    bytes_by: Counter = Counter()
    sends, recvs = [], []
    n_nodes = 0
    for r, f in enumerate(res.files()):
        meta, nodes = _decode_like_chakra(f)
        meta2, nodes2 = read_chakra(f)
        assert meta == meta2 and nodes == nodes2
        assert meta.version == "0.0.4" and _attrs(meta)["rank"] == r and _attrs(meta)["world_size"] == 8
        rg = graph.ranks[r]
        assert len(nodes) == len(rg.gpu_ops)  # one node per GPU op, host ops left out
        n_nodes += len(nodes)
        for i, n in enumerate(nodes):
            assert n.id == i and all(d < i for d in n.data_deps)  # dependencies come earlier: a DAG
            a = _attrs(n)
            assert a["is_cpu_op"] is False
            if n.type == pb.COMM_COLL_NODE:
                name = pb.CollectiveCommType.Name(a["comm_type"])
                per_type[name] += 1
                bytes_by[name] += a["comm_size"]
            elif n.type == pb.COMM_SEND_NODE:
                sends.append((a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]))
                assert a["comm_src"] == r
            elif n.type == pb.COMM_RECV_NODE:
                recvs.append((a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"]))
                assert a["comm_dst"] == r
            else:
                assert n.type == pb.COMP_NODE
                d = float(rg.gpu_ops.dur[i])
                assert n.duration_micros == (max(round(d * 1e6), 1) if d > 0 else 0)
    assert n_nodes == res.nodes
    # by hand: one MoE layer per rank, one micro-batch: dispatch + combine forward, their transposes backward,
    # each T x top-k token rows of h bf16 values, and Megatron's routing-probabilities all-to-all (T x top-k fp32)
    # forward and backward; one activation send forward (stage 0 -> 1) and one gradient send backward (1 -> 0) of
    # T x h bf16 values per pipeline, 4 pipelines
    a2a_bytes = 4 * T * k * h * act + 2 * T * k * 4
    assert per_type["ALL_TO_ALL"] == 8 * 6 and bytes_by["ALL_TO_ALL"] == 8 * a2a_bytes
    assert len(sends) == len(recvs) == 8 and Counter(sends) == Counter(recvs)
    assert {s[3] for s in sends} == {T * h * act}
    assert {(s[0], s[1]) for s in sends} == {(p, p + 4) for p in range(4)} | {(p + 4, p) for p in range(4)}
    # every collective of the synthesized graph, by count and bytes
    want, want_b = _graph_collectives(graph)
    assert per_type == want and bytes_by == want_b
    assert res.collectives["ALL_TO_ALL"] == {"count": 48, "bytes": float(8 * a2a_bytes)}
    # process groups: EP pairs, DP quads and EDP pairs of each stage
    import json

    groups = sorted(map(tuple, json.loads(res.comm_groups.read_text()).values()))
    assert groups == sorted([(0, 1), (2, 3), (4, 5), (6, 7), (0, 1, 2, 3), (4, 5, 6, 7),
                             (0, 2), (1, 3), (4, 6), (5, 7)])


def test_host_sync_becomes_a_dependency(tiny) -> None:
    """The host blocks on the token-count copies to the host (moe.splits_d2h: dropless MoE reads the all-to-all
    splits there): the ops it launches next on other streams (the dispatch all-to-all, the pipeline send) wait
    for the last of those copies, and the dispatch also for the permute (its data) and the counts' all-gather."""
    res, _ = tiny
    _, nodes = read_chakra(res.files()[0])
    by_name = {n.name: n for n in nodes}  # a repeated name keeps its last node
    copies = [n.id for n in nodes if n.name == "moe.splits_d2h"]
    assert len(copies) == 4
    last_copy = by_name["moe.splits_d2h"].id
    assert last_copy == max(copies)
    assert last_copy in by_name["pp.send_activation"].data_deps
    assert sorted(by_name["moe.dispatch"].data_deps) == sorted(
        [by_name["moe.counts_all_gather"].id, last_copy, by_name["moe.permute"].id])


def test_folded_graph_and_corrupt_files_are_refused(tmp_path: Path) -> None:
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.scenario import build_topology, load_scenario
    from cosim.workload.synth import synthesize

    scn = tmp_path / "tiny.yaml"
    scn.write_text(TINY)
    folded = synthesize(load_scenario(scn).workload.synthetic, build_topology("dgx-h100", None), None,
                     kernel_timer=synthetic_kernel_timer)
    assert folded.built.folded
    with pytest.raises(CosimInputError, match="every rank"):
        write_chakra(folded.graph, tmp_path / "out")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    res = collective_traces("all_reduce", 2**20, 4, tmp_path / "ar")
    f = res.files()[2]
    _meta, nodes = read_chakra(f)
    assert len(nodes) == 1 and _attrs(nodes[0])["comm_size"] == 2**20
    f.write_bytes(f.read_bytes()[:-3])
    with pytest.raises(CosimInputError, match="truncated") as e:
        read_chakra(f)
    assert "\n" not in str(e.value) and str(f) in str(e.value)


@pytest.mark.parametrize("args, msg", [
    (["no-such-scenario"], "no-such-scenario"),
    (["{scn}", "--set", "workload.synthetic.layout.ep=3"], "ep"),
    (["{scn}", "--set", "workload.synthetic.bogus=1"], "bogus"),
])
def test_cli_bad_input_is_one_line_exit_2_nothing_written(tmp_path: Path, args: list[str], msg: str) -> None:
    scn = tmp_path / "tiny.yaml"
    scn.write_text(TINY)
    out = tmp_path / "et"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cosim", "export", "--chakra", str(out),
                        *[a.format(scn=scn) for a in args]], capture_output=True, text=True, env=env)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and msg in p.stderr and "Traceback" not in p.stderr
    assert not out.exists()


def test_cli_json(tmp_path: Path) -> None:
    import json

    scn = tmp_path / "tiny.yaml"
    scn.write_text(TINY)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-m", "cosim", "export", "--chakra", str(tmp_path / "et"), str(scn),
                        "--prefix", "step", "--json"], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["ranks"] == 8 and d["collectives"]["SEND"]["count"] == 8
    assert sorted(x.name for x in (tmp_path / "et").iterdir()) == sorted(
        [f"step.{r}.et" for r in range(8)] + ["step.comm_groups.json"])


@pytest.mark.skipif(not os.environ.get("ASTRA_SIM_BIN"), reason="ASTRA_SIM_BIN (ASTRA-sim's analytical binary) not set")
def test_astra_sim_runs_the_export(tiny) -> None:
    """ASTRA-sim itself reads the export and every rank finishes (benchmarks/README.md, ASTRA-sim)."""
    res, _ = tiny
    astra = ROOT / "benchmarks" / "astra"
    p = subprocess.run([os.environ["ASTRA_SIM_BIN"], f"--workload-configuration={res.prefix}",
                        f"--system-configuration={astra / 'system-1d.json'}",
                        f"--network-configuration={astra / 'network-8.yml'}",
                        f"--remote-memory-configuration={astra / 'remote_memory.json'}",
                        f"--comm-group-configuration={res.comm_groups}"], capture_output=True, text=True, timeout=120,
                       cwd=res.prefix.parent)  # ASTRA-sim writes log/ into its working folder
    done = re.findall(r"sys\[(\d+)\] finished, (\d+) cycles", p.stdout + p.stderr)
    assert sorted(int(r) for r, _ in done) == list(range(8))


def test_captured_trace_exports_every_rank_and_collective(tmp_path: Path) -> None:
    """A captured (replayed) workload: the bundled 4-rank CPU capture, projected onto an H100, one file per
    rank, every collective written once per rank with its group's agreed size."""
    from cosim.scenario import find_workload
    from cosim.workload import load_trace

    res = export_scenario("moe-ep4-dgx-h100", tmp_path / "et")
    graph = load_trace(find_workload("moe-ep4-cpu"))
    assert res.ranks == 4 and all(f.exists() for f in res.files())
    want, _ = _graph_collectives(graph)
    assert {k: int(v["count"]) for k, v in res.collectives.items()} == dict(want)
    got: Counter = Counter()
    for f in res.files():
        _meta, nodes = _decode_like_chakra(f)
        got.update(pb.CollectiveCommType.Name(_attrs(n)["comm_type"]) for n in nodes if n.type == pb.COMM_COLL_NODE)
    assert got == want
    assert any("projected" in n for n in res.notes)
