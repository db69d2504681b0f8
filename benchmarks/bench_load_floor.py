"""First-load floor benchmark (not a test; issue 16 point 5): what a Python importer cannot get under.

Issue 16 point 5 asks for end-to-end replay (load + run) of at least 0.5 M graph ops per second on a first load of
the largest shared traces. For each trace (default: hta/v100-rank1of2-df, hta/a100-rank3of8-control,
param-rtx2080ti/resnet_kineto and the 8-rank param-dlrm-v100x8 job, :data:`bench_replay.TRACES`; a folder only when
every file in it is a Kineto trace), each in a fresh subprocess, it reports (CPU seconds, user + sys of the process
from :func:`resource.getrusage`, best of ``--repeat``; figures, never asserted):

* graph ops (host ops + GPU ops of the replay's summary, counted as ``bench_replay.py`` counts them) and the
  **load budget** the target leaves: ops / 0.5e6 s less the replay's own time (compile + run + summary, after a
  first load: :func:`bench_replay._replay_once`, whose ``process_time`` is the same user + sys clock);
* the end-to-end first load as ``bench_replay.py`` measures it (an empty load cache: the load hashes the files
  and writes the cache entry) and the importer's own first load, ``load_trace(path, cache=False)`` (memos cleared
  by :func:`bench_replay.forget_memos`; the classifier's ``lru_cache`` stays warm there as in ``bench_replay``);
* that load's **stages as the importer runs them**: its own functions wrapped in place for one load (each call's
  CPU time, less the time of wrapped calls inside it; the stage sum against an unwrapped load shows the wrappers'
  cost). ``inflate``: ``kineto._read_bytes`` (file read + zlib-ng, every call: ``read_flows``' second reads
  too); ``raw split``: the rest of ``kineto.decode_trace_chunks`` (msgspec's decode of the document into raw
  event texts); ``typed decode``: each step of ``kineto._chunks`` (join 2048 raw events, msgspec's typed decode
  into ``_EventLite`` records); ``checks``: ``kineto.check_events``; ``tables``: ``kineto.build_rank`` less
  ``flows`` (``kineto.read_flows``, the flow ends' second pass); ``warnings``: ``kineto._suspicious``;
  ``per-event loop``: the rest of ``read_kineto`` (the loop over the records, the chunks' records freed, rows to
  columns); ``format``: ``load.detect_format``; ``graph``: the rest of ``load_trace`` (``ExecutionGraph``, the
  arrays made read-only);
* **floors** no Python importer can beat, every file of the trace, one at a time (each result dropped before the
  next file, as the importer holds one file's bytes and records at a time), the cyclic GC paused as ``load_trace``
  pauses it: the file read; its inflate alone, by zlib-ng as the importer calls it and by ISA-L (``isal.isal_zlib``) when
  installed; msgspec's typed decode of only the five fields every event has (``ph``, ``cat``, ``name``, ``ts``,
  ``dur``; no ``args``) and the freeing of those records; msgspec's typed decode of the whole document in one pass
  into the importer's own records (``kineto._EventLite``: every field it reads, ``args`` included, but a
  collective's members); and, for reference, msgspec's and orjson's untyped decodes (dicts and lists);
* the **verdict**: floor = read + zlib-ng inflate + five-field decode (records not freed), as a share of the load
  budget; above 100% no importer that inflates with zlib-ng and decodes with msgspec into Python objects meets
  the target on that trace, whatever it does with the records. The same with the importer's records instead of the
  five fields (what an importer that reads the fields this one reads decodes at the least). Also against the larger
  budget left were compiling the rank programs free: the replay with its programs from the memo
  (``bench_replay``'s cached runs).

    python benchmarks/bench_load_floor.py [--traces T ...] [--repeat 3] [--json]

``--traces``: files or folders, absolute, relative to the current folder, or relative to ``../shared/traces``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_replay import TRACES, _replay_once, forget_memos, trace_sizes

TARGET_OPS_PER_S = 0.5e6
"""Issue 16 point 5: end-to-end replay on a first load, graph ops per CPU second."""


def cpu() -> float:
    """CPU seconds this process has used: user + sys (``getrusage``)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def best(fn: Callable[[], Any], repeat: int) -> float:
    """The least CPU seconds of ``repeat`` calls of ``fn``."""
    out = float("inf")
    for _ in range(repeat):
        t = cpu()
        fn()
        out = min(out, cpu() - t)
    return out


def trace_files(path: Path) -> list[Path]:
    """The files ``load_trace`` reads for ``path``."""
    from cosim.workload.load import trace_files_in

    return trace_files_in(path) if path.is_dir() else [path]


def not_kineto(path: Path) -> list[str]:
    """Names of the files of ``path`` that are not Kineto traces (the benchmark measures the Kineto importer)."""
    from cosim.workload.load import detect_format

    return [f.name for f in trace_files(path) if detect_format(f) != "kineto"]


# --------------------------------------------------------------------------------------------------------
# The importer's stages, timed in place
# --------------------------------------------------------------------------------------------------------

class Stages:
    """Exclusive CPU seconds per stage: each wrapped call's time less that of the wrapped calls inside it."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = {}
        self._inner = [0.0]

    def _add(self, name: str, t0: float) -> None:
        dt = cpu() - t0
        self.cpu[name] = self.cpu.get(name, 0.0) + dt - self._inner.pop()
        self._inner[-1] += dt

    def call(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            self._inner.append(0.0)
            t0 = cpu()
            try:
                return fn(*a, **k)
            finally:
                self._add(name, t0)
        return timed

    def steps(self, name: str, gen: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
        """A generator function whose every step (not the consumer's time between steps) counts to ``name``."""
        def timed(*a: Any, **k: Any) -> Iterator[Any]:
            it = gen(*a, **k)
            while True:
                self._inner.append(0.0)
                t0 = cpu()
                try:
                    x = next(it)
                except StopIteration:
                    return
                finally:
                    self._add(name, t0)
                yield x
        return timed


STAGES = ("format", "inflate", "raw split", "typed decode", "per-event loop", "checks", "tables", "flows",
          "warnings", "graph")


def staged_load(path: Path) -> dict[str, float]:
    """One ``load_trace(path, cache=False)`` (memos cleared) with the importer's functions wrapped in place: CPU
    seconds per stage (:data:`STAGES`) and ``total``."""
    from cosim.workload import kineto, load

    st = Stages()
    wraps: list[tuple[Any, str, Callable[..., Any]]] = [
        (load, "load_trace", st.call("graph", load.load_trace)),
        (load, "detect_format", st.call("format", load.detect_format)),
        (load, "read_kineto", st.call("per-event loop", load.read_kineto)),
        (kineto, "_read_bytes", st.call("inflate", kineto._read_bytes)),
        (kineto, "decode_trace_chunks", st.call("raw split", kineto.decode_trace_chunks)),
        (kineto, "_chunks", st.steps("typed decode", kineto._chunks)),
        (kineto, "check_events", st.call("checks", kineto.check_events)),
        (kineto, "build_rank", st.call("tables", kineto.build_rank)),
        (kineto, "read_flows", st.call("flows", kineto.read_flows)),
        (kineto, "_suspicious", st.call("warnings", kineto._suspicious)),
    ]
    saved = [(mod, name, getattr(mod, name)) for mod, name, _ in wraps]
    for mod, name, fn in wraps:
        setattr(mod, name, fn)
    forget_memos()
    try:
        t0 = cpu()
        load.load_trace(path, cache=False)
        total = cpu() - t0
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    return {**{s: st.cpu.get(s, 0.0) for s in STAGES}, "total": total}


# --------------------------------------------------------------------------------------------------------
# Floors
# --------------------------------------------------------------------------------------------------------

class Event5(msgspec.Struct, gc=False):
    """The five fields every Chrome-trace event has, typed as the importer types them; nothing else kept."""

    ph: str | None = None
    cat: str | None = None
    name: str | None = None
    ts: float | None = None
    dur: float | None = None


class Doc5(msgspec.Struct, gc=False):
    traceEvents: list[Event5]


DECODE5 = msgspec.json.Decoder(Doc5 | list[Event5])


def importer_records_decoder() -> msgspec.json.Decoder[Any]:
    """A one-pass decoder of the whole document into the importer's own event records (``kineto._EventLite``: the
    fields it reads of every event, its ``args`` without a collective's members)."""
    from cosim.workload.kineto import _EventLite

    doc = msgspec.defstruct("DocLite", [("traceEvents", list[_EventLite])], gc=False)
    return msgspec.json.Decoder(doc | list[_EventLite])


def _read(f: Path) -> bytes:
    with open(f, "rb") as fh:
        return fh.read()


def _inflater(name: str) -> Callable[[bytes], bytes] | None:
    """``raw`` -> its inflated bytes: gzip data by one ``decompressobj(wbits=31)`` call as ``kineto._read_bytes``
    makes it (``zlib-ng``, or ISA-L's ``isal`` when installed, else None); bytes that are not gzip as they are."""
    if name == "zlib-ng":
        from zlib_ng import zlib_ng as z
    else:
        try:
            from isal import isal_zlib as z  # type: ignore[no-redef]
        except ImportError:
            return None

    def inflate(raw: bytes) -> bytes:
        return z.decompressobj(wbits=31).decompress(raw) if raw[:2] == b"\x1f\x8b" else raw
    return inflate


def _each(fn: Callable[[Any], Any], items: list[Any]) -> None:
    """``fn`` of each item, each result dropped before the next call (as the importer holds one file at a time)."""
    for x in items:
        fn(x)


def _decode5_freed(data: list[bytes]) -> tuple[float, float, int]:
    """(CPU seconds of the five-field decodes, of freeing their records, events decoded), a file at a time."""
    dec = free = 0.0
    n = 0
    for d in data:
        t0 = cpu()
        doc = DECODE5.decode(d)
        t1 = cpu()
        n += len(doc if isinstance(doc, list) else doc.traceEvents)
        t2 = cpu()
        del doc
        t3 = cpu()
        dec, free = dec + t1 - t0, free + t3 - t2
    return dec, free, n


def floors(path: Path, repeat: int) -> dict[str, Any]:
    """The floors of :mod:`this benchmark <bench_load_floor>` for every file of ``path``, CPU seconds, best of
    ``repeat``, the cyclic GC paused."""
    import orjson

    from cosim.workload.graph import gc_paused

    files = trace_files(path)
    raws = [_read(f) for f in files]
    zng, isal = _inflater("zlib-ng"), _inflater("isal")
    assert zng is not None
    data = [zng(r) for r in raws]
    out: dict[str, Any] = {}
    with gc_paused():
        out["read_s"] = best(lambda: _each(_read, files), repeat)
        out["inflate_zlib_ng_s"] = best(lambda: _each(zng, raws), repeat)
        out["inflate_isal_s"] = best(lambda: _each(isal, raws), repeat) if isal else None
        runs = [_decode5_freed(data) for _ in range(repeat)]
        out["decode5_s"] = min(r[0] for r in runs)
        out["decode5_free_s"] = min(r[1] for r in runs)
        out["events"] = runs[0][2]
        lite = importer_records_decoder()
        out["decode_records_s"] = best(lambda: _each(lite.decode, data), repeat)
        out["msgspec_untyped_s"] = best(lambda: _each(msgspec.json.decode, data), repeat)
        out["orjson_s"] = best(lambda: _each(orjson.loads, data), repeat)
    out["floor_s"] = out["read_s"] + out["inflate_zlib_ng_s"] + out["decode5_s"]
    out["floor_records_s"] = out["read_s"] + out["inflate_zlib_ng_s"] + out["decode_records_s"]
    return out


# --------------------------------------------------------------------------------------------------------
# One trace
# --------------------------------------------------------------------------------------------------------

def bench_one(path: Path, repeat: int) -> dict[str, Any]:
    """Every figure of one trace (see the module docstring), in this process."""
    import cosim.replay  # noqa: F401
    from cosim.workload import load_trace

    with tempfile.TemporaryDirectory() as tmp:
        _replay_once(path, f"{tmp}/warm", forget=True)  # untimed: the process's first-call costs (catalog, topology)
        runs = [_replay_once(path, f"{tmp}/cold{k}", forget=True) for k in range(repeat)]
        compiled = min(_replay_once(path, f"{tmp}/cold0")["replay_s"] for _ in range(repeat))  # programs from the memo
    e2e = min(runs, key=lambda r: r["end_to_end_s"])
    replay_s = min(r["replay_s"] for r in runs)

    loads, staged = [], []
    for _ in range(repeat):  # plain and wrapped loads alternating: the same machine state for both
        forget_memos()
        t = cpu()
        load_trace(path, cache=False)
        loads.append(cpu() - t)
        staged.append(staged_load(path))
    load_s = min(loads)
    stages = min(staged, key=lambda s: s["total"])
    fl = floors(path, repeat)
    ops = e2e["ops"]
    budget = ops / TARGET_OPS_PER_S
    load_budget = budget - replay_s
    generous = budget - compiled
    disk, raw = trace_sizes(path)
    return {"ranks": e2e["ranks"], "files": len(trace_files(path)), "file_bytes": disk, "json_bytes": raw,
            "events": fl["events"], "ops": ops, "budget_s": budget, "replay_s": replay_s, "load_budget_s": load_budget,
            "first_load_s": e2e["load_s"], "end_to_end_s": e2e["end_to_end_s"],
            "end_to_end_ops_per_s": ops / e2e["end_to_end_s"], "importer_load_s": load_s, "stages": stages,
            "floors": fl, "floor_share": fl["floor_s"] / load_budget if load_budget > 0 else None,
            "importer_share": load_s / load_budget if load_budget > 0 else None,
            "replay_compiled_s": compiled, "load_budget_compiled_s": generous,
            "floor_share_compiled": fl["floor_s"] / generous if generous > 0 else None,
            "floor_records_share": fl["floor_records_s"] / load_budget if load_budget > 0 else None,
            "floor_records_share_compiled": fl["floor_records_s"] / generous if generous > 0 else None}


# --------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------

def _resolve(names: list[str] | None) -> list[tuple[str, Path]] | None:
    """(label, path) of each trace: ``names`` as given (or :data:`TRACES`), found as a path or under the shared
    traces; None after a line on stderr when a name is found nowhere or the shared folder is needed and absent."""
    from cosim.resources import shared_traces

    shared: Path | None = None
    out = []
    for n in names or TRACES:
        p = Path(n)
        if not p.exists():
            if shared is None:
                shared = shared_traces("pass --traces with paths")
                if shared is None:
                    return None
            p = shared / n
            if not p.exists():
                print(f"{n}: no such trace (here or in {shared})", file=sys.stderr)
                return None
        out.append((n, p))
    return out


def _share(x: float | None) -> str:
    return "- (no budget)" if x is None else f"{x:.0%}"


def _table(rows: list[dict[str, Any]]) -> None:
    ms = 1e3
    print("| trace | events | graph ops | ops / 0.5 M | replay | load budget | first load (bench_replay) | "
          "importer load | floor (read + inflate + 5-field decode) | floor / load budget | importer / load budget | "
          "replay, programs compiled | floor / load budget then | floor with the importer's records | "
          "its share of the load budget (then) | e2e ops/s, first load |")
    print("|---|" + "---:|" * 15)
    for r in rows:
        f = r["floors"]
        print(f"| {r['trace']} | {r['events']:,} | {r['ops']:,} | {r['budget_s'] * ms:.1f} ms | {r['replay_s'] * ms:.1f} ms "
              f"| {r['load_budget_s'] * ms:.1f} ms | {r['first_load_s'] * ms:.1f} ms | {r['importer_load_s'] * ms:.1f} ms "
              f"| {f['floor_s'] * ms:.1f} ms | {_share(r['floor_share'])} | {_share(r['importer_share'])} | "
              f"{r['replay_compiled_s'] * ms:.1f} ms | {_share(r['floor_share_compiled'])} | "
              f"{f['floor_records_s'] * ms:.1f} ms | {_share(r['floor_records_share'])} "
              f"({_share(r['floor_records_share_compiled'])}) | {r['end_to_end_ops_per_s'] / 1e6:.3f} M |")
    print("\nThe importer's stages (one wrapped `load_trace(cache=False)`, the best of --repeat by total), CPU ms:\n")
    print("| trace | " + " | ".join(STAGES) + " | sum | wrapped total | unwrapped load |")
    print("|---|" + "---:|" * (len(STAGES) + 3))
    for r in rows:
        s = r["stages"]
        print(f"| {r['trace']} | " + " | ".join(f"{s[k] * ms:.1f}" for k in STAGES)
              + f" | {sum(s[k] for k in STAGES) * ms:.1f} | {s['total'] * ms:.1f} | {r['importer_load_s'] * ms:.1f} |")
    print("\nFloors (every file of the trace, one at a time, GC paused), CPU ms:\n")
    print("| trace | files | MB gz / json | read | inflate zlib-ng | inflate ISA-L | 5-field decode | its records freed "
          "| the importer's records, one pass | msgspec untyped | orjson |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        f = r["floors"]
        isal = "-" if f["inflate_isal_s"] is None else f"{f['inflate_isal_s'] * ms:.1f}"
        print(f"| {r['trace']} | {r['files']} | {r['file_bytes'] / 1e6:.1f} / {r['json_bytes'] / 1e6:.1f} | "
              f"{f['read_s'] * ms:.1f} | {f['inflate_zlib_ng_s'] * ms:.1f} | {isal} | {f['decode5_s'] * ms:.1f} | "
              f"{f['decode5_free_s'] * ms:.1f} | {f['decode_records_s'] * ms:.1f} | {f['msgspec_untyped_s'] * ms:.1f} | "
              f"{f['orjson_s'] * ms:.1f} |")
    print("\nload budget = graph ops / 0.5e6 less the replay after a first load (compile + run + summary); first load "
          "(bench_replay): empty load cache, hashing and the cache write included; importer load: load_trace(cache="
          "False); floor / load budget above 100%: the target is out of reach of any importer that inflates with "
          "zlib-ng and decodes with msgspec into Python objects; 'then': the load budget were the rank programs "
          "compiled for free (the replay with them from the memo, as after a cached load); floor with the importer's "
          "records: read + inflate + one msgspec pass into kineto._EventLite records (every field the importer reads "
          "but a collective's members)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--traces", nargs="+", metavar="T", help="traces (files or folders; default: the largest shared "
                    "Kineto traces); a relative name not found here is looked up under ../shared/traces")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each measure (the best is reported; default 3)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of tables")
    ap.add_argument("--only", help=argparse.SUPPRESS)  # child mode: one trace, JSON on stdout
    args = ap.parse_args(argv)
    if args.only:
        json.dump(bench_one(Path(args.only), args.repeat), sys.stdout)
        return 0
    traces = _resolve(args.traces)
    if traces is None:
        return 2
    rows = []
    for label, p in traces:
        bad = not_kineto(p)
        if bad:
            print(f"{label}: skipped, not a Kineto trace: {', '.join(bad)}", file=sys.stderr)
            continue
        proc = subprocess.run([sys.executable, __file__, "--only", str(p), "--repeat", str(args.repeat)],
                              stdout=subprocess.PIPE, text=True, check=True)  # its stderr: this one's
        rows.append({"trace": label, **json.loads(proc.stdout)})
    if args.json:
        json.dump(rows, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        _table(rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
