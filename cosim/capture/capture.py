"""Run a multi-process capture and write the capture folder.

``capture(opts, out)`` starts ``world_size`` processes on this machine
(``torch.multiprocessing`` spawn; rendezvous over TCP on 127.0.0.1 at a free
port, gloo bound to the loopback interface), each running
:func:`cosim.capture.worker.run_rank`; shows progress on stderr; then
each rank post-processes its traces (:mod:`cosim.capture.postprocess`); writes
``capture.yaml`` and renames the finished folder into place. Everything is
written under a temporary sibling folder first, so a failure leaves nothing
half-written at ``out``.

Layout of the folder::

    capture.yaml            model, parallelism, run, host, routing statistics
    rank{r}.trace.json.gz   Kineto chrome trace of rank r (ProfilerStep#N per step)
    rank{r}.et.json.gz      Execution Trace of rank r
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from cosim.capture.config import CaptureOptions
from cosim.errors import CosimError, CosimInputError

__all__ = ["CAPTURE_FORMAT", "CaptureFailed", "capture", "capture_doc", "dump_capture_yaml"]

CAPTURE_FORMAT = "cosim-capture/1"
"""Value of ``format`` in capture.yaml."""


class CaptureFailed(CosimError):
    """A rank of the capture failed (a bug or an environment problem, not bad input)."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _loopback_ifname() -> str | None:
    try:
        for _, name in socket.if_nameindex():
            if name == "lo" or name.startswith("lo0"):
                return name
    except (OSError, AttributeError):
        pass
    return None


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _total_ram() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


def check_environment(opts: CaptureOptions) -> None:
    """Fail with one line when this machine cannot run ``opts``: no torch, no CUDA,
    too few GPUs, or a model that does not fit in memory."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        raise CosimInputError("cosim capture needs PyTorch: pip install torch (or cosim[capture])") from None
    if not dist.is_available():
        raise CosimInputError(f"this PyTorch build ({torch.__version__}) has no torch.distributed")
    need = opts.memory_per_rank()
    if opts.device == "cuda":
        if not torch.cuda.is_available():
            raise CosimInputError(f"--device cuda: CUDA is not available (torch {torch.__version__})")
        n = torch.cuda.device_count()
        if n < opts.world_size:
            raise CosimInputError(f"--device cuda: --world-size {opts.world_size} needs one GPU per rank; "
                                  f"this machine has {n}")
        have = torch.cuda.get_device_properties(0).total_memory
        if need > 0.8 * have:
            raise CosimInputError(f"model {opts.model.name} needs about {_gib(need)} per rank "
                                  f"(EP {opts.ep}, {opts.mode}); a GPU has {_gib(have)}")
    else:
        ram = _total_ram()
        if ram and need * opts.world_size > 0.6 * ram:
            raise CosimInputError(f"model {opts.model.name} needs about {_gib(need)} per rank x "
                                  f"{opts.world_size} ranks ({opts.mode}); this machine has {_gib(ram)} of RAM. "
                                  "Use a small preset (e.g. tiny-moe, mixtral-mini) on CPU")


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CosimInputError(f"{out}: already exists; remove it or choose another --out")


def _publishable(folder: Path) -> None:
    """Give the folder and its files the usual permissions (mkdtemp/mkstemp make them private)."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for p in folder.iterdir():
        p.chmod(0o666 & ~umask)


def capture(opts: CaptureOptions, out: str | Path, *, command: str | None = None,
            progress: bool = True) -> dict[str, Any]:
    """Run the capture described by ``opts``; write the capture folder ``out``.

    Returns a summary (what capture.yaml says, less the routing tables).
    Raises :class:`CosimInputError` for impossible requests (before starting
    anything) and :class:`CaptureFailed` when a rank fails.
    """
    out = Path(out)
    _check_out(out)
    check_environment(opts)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        raw = tmp / "raw"
        raw.mkdir()
        _run_ranks(opts, raw, progress)
        routing = [json.loads((raw / f"rank{r}.routing.json").read_text()) for r in range(opts.world_size)]
        if opts.ep > 1 and any(rt["comm_events"] == 0 for rt in routing):
            raise CaptureFailed("a rank's trace has no collective events; the profiler missed them")
        doc = capture_doc(opts, routing, command)
        shutil.rmtree(raw)
        return publish(tmp, out, doc)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def publish(tmp: Path, out: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """Write ``capture.yaml`` into the finished capture folder ``tmp``, move it to ``out`` in one rename (nothing
    half-written is ever at ``out``) and return the summary: the capture document without its routing tables, the
    folder and its size in bytes."""
    (tmp / "capture.yaml").write_text(dump_capture_yaml(doc), encoding="utf-8")
    _publishable(tmp)
    _check_out(out)
    if out.exists():
        out.rmdir()
    os.replace(tmp, out)
    summary = {k: v for k, v in doc.items() if k != "routing"}
    summary["out"] = str(out)
    summary["bytes"] = sum(p.stat().st_size for p in out.iterdir())
    return summary


def _run_ranks(opts: CaptureOptions, raw: Path, progress: bool) -> None:
    import torch.multiprocessing as mp
    from tqdm import tqdm

    from cosim.capture.worker import run_rank

    env = {"TORCH_CPP_LOG_LEVEL": "ERROR", "KINETO_LOG_LEVEL": "5", "OMP_NUM_THREADS": "1"}
    lo = _loopback_ifname()
    if lo and opts.device == "cpu":
        env["GLOO_SOCKET_IFNAME"] = lo
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():
        if k == "GLOO_SOCKET_IFNAME" and os.environ.get(k):
            continue
        os.environ[k] = v
    total = opts.warmup + opts.steps
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    done_steps = [0] * opts.world_size
    try:
        pc = mp.start_processes(run_rank, args=(opts.model_dump_json(), str(raw), _free_port(), queue),
                                nprocs=opts.world_size, join=False, start_method="spawn")
        desc = f"capture {opts.model.name} {opts.mode} x{opts.world_size}"
        with tqdm(total=total, desc=desc, unit="step", file=sys.stderr, disable=None if progress else True,
                  leave=False) as bar:
            finished = False
            while not finished:
                try:
                    finished = pc.join(timeout=0.2)
                except mp.ProcessRaisedException as exc:
                    msg = str(exc).strip()
                    sys.stderr.write(msg + "\n")
                    last = msg.splitlines()[-1] if msg else "unknown error"
                    raise CaptureFailed(f"capture failed on rank {exc.error_index}: {last}") from None
                except mp.ProcessExitedException as exc:
                    raise CaptureFailed(f"capture failed: rank {exc.error_index} exited with code "
                                        f"{exc.exit_code}") from None
                while not queue.empty():
                    rank, i = queue.get()
                    done_steps[rank] = max(done_steps[rank], i + 1)
                bar.update(min(done_steps) - bar.n)
    finally:
        for k, old in saved.items():
            if old is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = old


def capture_doc(opts: CaptureOptions, routing: list[dict[str, Any]], command: str | None,
                et: bool = True) -> dict[str, Any]:
    """capture.yaml's content from every rank's routing record (``et``: the ranks wrote Execution Traces)."""
    import torch

    r0 = routing[0]
    steps = list(range(opts.warmup, opts.warmup + opts.steps))
    ws = opts.world_size
    layers = []
    for li, layer in enumerate(r0["moe_layers"]):
        by_rank = [rt["routed"][li] for rt in routing]  # [rank][step][expert]
        summed = [[sum(by_rank[r][s][e] for r in range(ws)) for e in range(opts.model.num_experts)]
                  for s in range(len(steps))]
        entry: dict[str, Any] = {"layer": layer, "tokens_per_expert": summed, "tokens_per_expert_by_rank": by_rank}
        if opts.model.capacity_factor is not None:
            dropped = [rt["dropped"][li] for rt in routing]
            entry["dropped_per_expert"] = [[sum(dropped[r][s][e] for r in range(ws))
                                            for e in range(opts.model.num_experts)] for s in range(len(steps))]
        layers.append(entry)
    tokens = opts.tokens_per_step
    return {
        "format": CAPTURE_FORMAT,
        "created": _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat(),
        "command": command or "",
        "host": {
            "hostname": socket.gethostname(),
            "cpu": _cpu_model(),
            "os": f"{platform.system()} {platform.release()}",
            "python": platform.python_version(),
            "torch": str(torch.__version__),
        },
        "device": {
            "kind": opts.device,
            "name": r0["device_name"],
            "backend": r0["backend"],
            "dtype": r0["dtype"],
            "grouped_mm": r0["grouped_mm"],
            "threads_per_rank": r0["num_threads"],
        },
        "model": opts.model.model_dump(mode="json"),
        "parallelism": {
            "world_size": ws,
            "ep": opts.ep,
            "dp": opts.dp,
            "ep_groups": [list(range(g * opts.ep, (g + 1) * opts.ep)) for g in range(opts.dp)],
            "expert_dp_groups": [list(range(i, ws, opts.ep)) for i in range(opts.ep)],
        },
        "run": {
            "mode": opts.mode,
            "warmup": opts.warmup,
            "steps": opts.steps,
            "batch": opts.batch,
            "seq": opts.seq,
            "tokens_per_rank_per_step": tokens,
            "skew": opts.skew.label(),
            "seed": opts.seed,
            "lr": opts.lr,
            "bucket_mb": opts.bucket_mb,
            "profile_memory": opts.profile_memory,
        },
        "profiled_steps": steps,
        "files": [{"rank": r, "trace": f"rank{r}.trace.json.gz", **({"et": f"rank{r}.et.json.gz"} if et else {})}
                  for r in range(ws)],
        "wall_ms_per_step": {f"rank{rt['rank']}": rt["step_ms"] for rt in routing},
        "routing": {
            "moe_layers": r0["moe_layers"],
            "assignments_per_step": tokens * opts.model.top_k * ws,
            "layers": layers,
        },
    }


class _Dumper(yaml.SafeDumper):
    pass


def _repr_list(dumper: yaml.SafeDumper, data: list) -> yaml.Node:
    flow = bool(data) and all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _repr_list)


_HEADER = """\
# Written by `cosim capture` (see docs/CAPTURE.md for every field).
# routing.layers[].tokens_per_expert[s][e]: assignments of tokens to expert e in
# profiled step profiled_steps[s], summed over all ranks (router choices, before
# any capacity drop); tokens_per_expert_by_rank[r][s][e]: the same on rank r.
"""


def dump_capture_yaml(doc: dict[str, Any]) -> str:
    """capture.yaml text: block style, with lists of numbers on one line."""
    return _HEADER + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=1 << 16, allow_unicode=True)
