"""Checks that a capture folder is internally consistent, read from the files
themselves (no torch needed). Shared by the capture tests and the bundled-
workload tests."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import yaml


def read_gz_json(path: Path) -> Any:
    raw = path.read_bytes()
    assert raw[:2] == b"\x1f\x8b", f"{path} is not gzipped"
    return json.loads(gzip.decompress(raw))


def parse_list(text: str) -> list[int]:
    text = text.strip()
    assert text.startswith("[") and text.endswith("]"), text
    inner = text[1:-1].strip()
    return [int(x) for x in inner.split(",")] if inner else []


def comm_events(trace: dict) -> list[dict]:
    """record_param_comms events in issue order."""
    evs = [e for e in trace["traceEvents"] if e.get("name") == "record_param_comms" and e.get("ph") == "X"]
    return sorted(evs, key=lambda e: float(e["ts"]))


def step_windows(trace: dict) -> dict[int, tuple[float, float]]:
    out = {}
    for e in trace["traceEvents"]:
        name = e.get("name", "")
        if name.startswith("ProfilerStep#") and e.get("ph") == "X":
            out[int(name.split("#")[1])] = (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
    return out


def load_capture(folder: Path) -> tuple[dict, list[dict], list[dict]]:
    doc = yaml.safe_load((folder / "capture.yaml").read_text())
    traces = [read_gz_json(folder / f["trace"]) for f in doc["files"]]
    ets = [read_gz_json(folder / f["et"]) for f in doc["files"]]
    return doc, traces, ets


def check_capture(folder: Path, loaded: tuple[dict, list[dict], list[dict]] | None = None) -> dict:
    """Assert everything the capture promises; return the parsed capture.yaml.

    ``loaded``: what :func:`load_capture` returned for ``folder``, if at hand."""
    doc, traces, ets = loaded or load_capture(folder)
    ws = doc["parallelism"]["world_size"]
    ep = doc["parallelism"]["ep"]
    model = doc["model"]
    k, num_e = model["top_k"], model["num_experts"]
    steps = doc["profiled_steps"]
    assert len(traces) == len(ets) == ws
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        ["capture.yaml"] + [f"rank{r}.trace.json.gz" for r in range(ws)] + [f"rank{r}.et.json.gz" for r in range(ws)])

    # Profiler steps: exactly the profiled ones, in every trace and ET.
    for r in range(ws):
        assert sorted(step_windows(traces[r])) == steps, f"rank {r}"
        et_steps = sorted(int(n["name"].split("#")[1]) for n in ets[r]["nodes"] if n["name"].startswith("ProfilerStep#"))
        assert et_steps == steps
        assert traces[r].get("distributedInfo", {}).get("rank", r) == r

    # Routing statistics: every token picks top_k experts.
    tokens = doc["run"]["tokens_per_rank_per_step"]
    assert doc["routing"]["assignments_per_step"] == tokens * k * ws
    for layer in doc["routing"]["layers"]:
        assert len(layer["tokens_per_expert"]) == len(steps)
        for s in range(len(steps)):
            assert sum(layer["tokens_per_expert"][s]) == tokens * k * ws
            for r in range(ws):
                assert sum(layer["tokens_per_expert_by_rank"][r][s]) == tokens * k
            assert [sum(layer["tokens_per_expert_by_rank"][r][s][e] for r in range(ws)) for e in range(num_e)] \
                == layer["tokens_per_expert"][s]

    if ep == 1:
        return doc
    per_rank = [comm_events(t) for t in traces]
    for r, evs in enumerate(per_rank):
        a2av = [e for e in evs if e["args"]["Collective name"] == "all_to_allv"]
        assert a2av, f"rank {r}: no all_to_allv"
        for e in a2av:
            assert "In split size" in e["args"] and "Out split size" in e["args"]
        # ET carries the same metadata.
        et_comms = [n for n in ets[r]["nodes"] if n["name"] == "record_param_comms"]
        assert len(et_comms) == len(evs)
        assert all(any(a["name"] == "in_split_size" for a in n["attrs"]) for n in et_comms)

    # What rank i sends to j (In split size on i, j-th entry) is what j receives
    # from i (Out split size on j, i-th entry), collective by collective.
    ep_groups = doc["parallelism"]["ep_groups"]
    for group in ep_groups:
        seqs = {r: [e for e in per_rank[r] if e["args"]["Collective name"].startswith("all_to_all")] for r in group}
        n = {len(v) for v in seqs.values()}
        assert len(n) == 1, "ranks of an EP group issued different numbers of all-to-alls"
        for c in range(n.pop()):
            evs = {r: seqs[r][c]["args"] for r in group}
            assert len({a["cosim tag"] for a in evs.values()}) == 1
            for a in evs.values():
                assert parse_list(a["Process Group Ranks"]) == group
            if evs[group[0]]["Collective name"] != "all_to_allv":
                continue
            for i, ri in enumerate(group):
                ins = parse_list(evs[ri]["In split size"])
                assert sum(ins) * (evs[ri]["In msg nelems"] // max(sum(ins), 1)) == evs[ri]["In msg nelems"]
                for j, rj in enumerate(group):
                    assert ins[j] == parse_list(evs[rj]["Out split size"])[i], (evs[ri]["cosim tag"], ri, rj)

    # Dispatch split sizes are what the routing statistics say (dropless models):
    # rank r sends to EP peer j the tokens it routed to j's experts.
    if model["capacity_factor"] is None:
        e_local = num_e // ep
        for r in range(ws):
            windows = step_windows(traces[r])
            group = next(g for g in ep_groups if r in g)
            for layer in doc["routing"]["layers"]:
                tag = f"layer{layer['layer']}.moe.dispatch.fwd"
                for s, step in enumerate(steps):
                    t0, t1 = windows[step]
                    evs = [e for e in per_rank[r] if e["args"]["cosim tag"] == tag and t0 <= float(e["ts"]) <= t1]
                    assert len(evs) == 1, (r, tag, step)
                    sent = parse_list(evs[0]["args"]["In split size"])
                    counts = layer["tokens_per_expert_by_rank"][r][s]
                    expect = [sum(counts[j * e_local:(j + 1) * e_local]) for j in range(len(group))]
                    assert sent == expect, (r, tag, step)
    return doc
