"""Turn a rank's raw profiler output into the bundled, replayable form.

The capture wraps every collective in a ``cosim::comm`` annotation whose
string input (kept by the Execution Trace) is a JSON record of the call (see
:mod:`cosim.capture.comm`). Here, per rank:

* On **gloo** (CPU), which records no collective metadata: each
  ``cosim::comm`` event becomes a ``record_param_comms`` event (chrome trace,
  ``cat: cpu_op``) / node (ET) with the metadata in ProcessGroupNCCL's field
  names ("Collective name", "dtype", "In msg nelems", "Out msg nelems",
  "In split size", "Out split size", "Group size", "Process Group Name",
  "Process Group Description", "Process Group Ranks", "Global rank start",
  "Global rank stride"; ET attrs ``collective_name``, ``in_split_size`` ...).
  Its time span is the real one of the call (issue to completion, as the
  calls are blocking); gloo's own ``gloo:all_to_all`` / ``gloo:all_reduce``
  events (the transfer, on gloo's worker thread) are left as they are, so
  that each collective is described once.
* On **NCCL**, torch's own ``record_param_comms`` carries the metadata; the
  ``cosim::comm`` annotation is kept and only gains the tag.

Every comm event gets ``"cosim tag"`` (what the call is for, e.g.
``layer1.moe.dispatch.fwd``) and ``"cosim seq"`` (call order on this rank).
Split sizes are rows of the first dimension, as passed to
``all_to_all_single``; ``In msg nelems`` is the element count.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cosim.fileio import atomic_open

__all__ = ["COMM_ANNOTATION", "fix_rank", "fmt_list", "nccl_args"]

COMM_ANNOTATION = "cosim::comm"


def fmt_list(xs: list[int]) -> str:
    """Lists as torch writes them in trace args: ``"[1, 2, 3]"``."""
    return "[" + ", ".join(str(int(x)) for x in xs) + "]"


def nccl_args(meta: dict[str, Any]) -> dict[str, Any]:
    """Chrome-trace args of a ``record_param_comms`` event, in ProcessGroupNCCL's spelling."""
    return {
        "Collective name": meta["collective"],
        "dtype": meta["dtype"],
        "In msg nelems": meta["in_nelems"],
        "Out msg nelems": meta["out_nelems"],
        "Group size": meta["group_size"],
        "In split size": fmt_list(meta["in_split"]),
        "Out split size": fmt_list(meta["out_split"]),
        "Process Group Name": meta["pg_name"],
        "Process Group Description": meta["pg_desc"],
        "Process Group Ranks": fmt_list(meta["pg_ranks"]),
        "Global rank start": meta["rank_start"],
        "Global rank stride": meta["rank_stride"],
        "cosim tag": meta["tag"],
        "cosim seq": meta["seq"],
    }


def _et_attrs(meta: dict[str, Any]) -> list[dict[str, Any]]:
    def a(name: str, typ: str, value: Any) -> dict[str, Any]:
        return {"name": name, "type": typ, "value": value}

    return [
        a("collective_name", "string", meta["collective"]),
        a("dtype", "string", meta["dtype"]),
        a("in_msg_nelems", "uint64", meta["in_nelems"]),
        a("out_msg_nelems", "uint64", meta["out_nelems"]),
        a("in_split_size", "string", fmt_list(meta["in_split"])),
        a("out_split_size", "string", fmt_list(meta["out_split"])),
        a("global_rank_start", "uint64", meta["rank_start"]),
        a("global_rank_stride", "uint64", meta["rank_stride"]),
        a("pg_name", "string", meta["pg_name"]),
        a("pg_desc", "string", meta["pg_desc"]),
        a("pg_size", "uint64", meta["group_size"]),
        a("cosim_tag", "string", meta["tag"]),
        a("cosim_seq", "uint64", meta["seq"]),
    ]


def _attr(node: dict[str, Any], name: str) -> Any:
    for a in node.get("attrs", []):
        if a.get("name") == name:
            return a.get("value")
    return None


def _node_meta(node: dict[str, Any]) -> dict[str, Any] | None:
    inputs = node.get("inputs")
    values = inputs.get("values") if isinstance(inputs, dict) else inputs
    if not values or not isinstance(values[0], str):
        return None
    try:
        return json.loads(values[0])
    except ValueError:
        return None


def fix_rank(raw_trace: Path, raw_et: Path, out_trace: Path, out_et: Path, backend: str) -> dict[str, int]:
    """Rewrite one rank's chrome trace and ET (see the module docstring) and write them
    gzipped to ``out_trace`` / ``out_et``. Returns counts of what was done."""
    with open(raw_et, encoding="utf-8") as fh:
        et = json.load(fh)
    gloo = backend == "gloo"
    by_rf: dict[int, dict[str, Any]] = {}
    for node in et.get("nodes", []):
        if node.get("name") != COMM_ANNOTATION:
            continue
        meta = _node_meta(node)
        rf = _attr(node, "rf_id")
        if meta is None or rf is None:
            continue
        by_rf[int(rf)] = meta
        if gloo:
            node["name"] = "record_param_comms"
            node["attrs"] = [*node.get("attrs", []), *_et_attrs(meta)]
        else:
            node["attrs"] = [*node.get("attrs", []), *_et_attrs(meta)[-2:]]

    with open(raw_trace, encoding="utf-8") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    comm_events = 0
    for ev in events:
        if ev.get("name") != COMM_ANNOTATION:
            continue
        args = ev.setdefault("args", {})
        meta = by_rf.get(int(args.get("Record function id", -1)))
        if meta is None:
            raise ValueError(f"{raw_trace}: {COMM_ANNOTATION} event at ts={ev.get('ts')} has no ET record")
        comm_events += 1
        if gloo:
            ev["name"] = "record_param_comms"
            ev["cat"] = "cpu_op"
            for key in ("Concrete Inputs", "Input type", "Input Strides", "Input Dims"):
                args.pop(key, None)
            args.update(nccl_args(meta))
        else:
            args["cosim tag"] = meta["tag"]
            args["cosim seq"] = meta["seq"]

    # One write of the whole text: json.dump's many small writes through gzip are slow.
    for path, doc in ((out_trace, trace), (out_et, et)):
        with atomic_open(path, "wb") as fh:
            fh.write(json.dumps(doc, separators=(",", ":")).encode("utf-8"))
    return {"comm_events": comm_events}

