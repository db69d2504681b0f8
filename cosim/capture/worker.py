"""One rank of a capture: join the process group, build the model, run and
profile the steps, and write raw traces and routing statistics.

Runs in a child process started by :func:`cosim.capture.capture.capture`.
Writes, into ``raw_dir``: ``rank{r}.trace.json`` (Kineto chrome trace),
``rank{r}.et.json`` (Execution Trace), ``rank{r}.routing.json`` and
``rank{r}.log`` (the rank's stdout/stderr); and the post-processed, gzipped
``rank{r}.trace.json.gz`` / ``rank{r}.et.json.gz`` into its parent folder.
"""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, schedule

from cosim.capture.capture import _cpu_model
from cosim.capture.comm import Comm, Group
from cosim.capture.config import CaptureOptions
from cosim.capture.model import EPContext, grouped_mm_works
from cosim.capture.postprocess import fix_rank
from cosim.capture.program import RankProgram

__all__ = ["run_rank"]


def _pg_name(pg: Any) -> str:
    try:
        return str(dist.distributed_c10d._get_process_group_name(pg))
    except Exception:
        return str(getattr(pg, "group_name", "?"))


def _groups(opts: CaptureOptions, rank: int) -> tuple[Group, Group, Group | None]:
    """(world, this rank's EP group, this rank's expert-DP group or None).

    EP groups are blocks of consecutive ranks ``[g*ep, (g+1)*ep)``; expert-DP
    groups are the ranks with the same position in every EP group.
    Every rank creates every group, in the same order (torch requires it).
    """
    ws, ep, dp = opts.world_size, opts.ep, opts.dp
    world = Group(None, list(range(ws)), _pg_name(dist.group.WORLD), "default_pg")
    my_ep = world
    if ep < ws:
        for g in range(dp):
            ranks = list(range(g * ep, (g + 1) * ep))
            pg = dist.new_group(ranks)
            if rank in ranks:
                my_ep = Group(pg, ranks, _pg_name(pg), "ep")
    my_dp = None
    if dp > 1:
        for i in range(ep):
            ranks = list(range(i, ws, ep))
            pg = dist.new_group(ranks)
            if rank in ranks:
                my_dp = Group(pg, ranks, _pg_name(pg), "dp_experts")
    return world, my_ep, my_dp


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return _cpu_model() or platform.processor() or platform.machine()


def run_rank(rank: int, opts_json: str, raw_dir: str, port: int, queue: Any) -> None:
    """Entry point of rank ``rank`` (``torch.multiprocessing`` passes the index first)."""
    opts = CaptureOptions.model_validate_json(opts_json)
    raw = Path(raw_dir)
    # torch's C++ warnings and kineto's messages go to this rank's log, not the terminal.
    log = os.open(raw / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    cuda = opts.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // opts.world_size))
    backend = "nccl" if cuda else "gloo"
    init = f"tcp://127.0.0.1:{port}"
    if cuda:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=opts.world_size, device_id=device)
    else:
        dist.init_process_group(backend, init_method=init, rank=rank, world_size=opts.world_size)
    try:
        _run(opts, rank, raw, device, backend, queue)
    finally:
        dist.destroy_process_group()


def _run(opts: CaptureOptions, rank: int, raw: Path, device: torch.device, backend: str, queue: Any) -> None:
    cfg = opts.model
    world, ep_group, dp_group = _groups(opts, rank)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    train = opts.mode == "train"
    # gloo records no collective metadata, so we annotate; NCCL records its own
    # record_param_comms, and our annotation then only adds the tag.
    comm = Comm(rank=rank)
    ctx = EPContext(comm=comm, ep_group=ep_group, ep_rank=ep_group.ranks.index(rank), skew=opts.skew,
                    seed=opts.seed, global_rank=rank, world_size=opts.world_size,
                    use_grouped_mm=grouped_mm_works(device, dtype, backward=train))
    gen = torch.Generator().manual_seed(opts.seed * 31 + rank)
    prog = RankProgram(opts, comm, world, dp_group, ctx, device, dtype,
                       tokens=lambda shape: torch.randint(cfg.vocab_size, shape, generator=gen).to(device))
    model = prog.model
    total = opts.warmup + opts.steps
    prog.prepare(total)
    step = prog.step

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    trace_path = raw / f"rank{rank}.trace.json"
    et = ExecutionTraceObserver().register_callback(str(raw / f"rank{rank}.et.json"))
    sched = schedule(wait=0, warmup=opts.warmup, active=opts.steps, repeat=1)
    step_ms: list[float] = []

    with profile(activities=activities, schedule=sched, record_shapes=True, with_stack=False,
                 profile_memory=opts.profile_memory, execution_trace_observer=et,
                 on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path))) as prof:
        for i in range(total):
            model.set_recording(i >= opts.warmup)
            t0 = time.perf_counter()
            step(i)
            if device.type == "cuda":
                torch.cuda.synchronize()
            step_ms.append((time.perf_counter() - t0) * 1e3)
            prof.step()
            if queue is not None:
                queue.put((rank, i))
    et.unregister_callback()

    routing = {
        "rank": rank,
        "moe_layers": [m.layer for m in model.moe_layers()],
        "routed": [m.routed for m in model.moe_layers()],
        "dropped": [m.dropped for m in model.moe_layers()],
        "device_name": _device_name(device),
        "backend": backend,
        "dtype": str(dtype).replace("torch.", ""),
        "grouped_mm": ctx.use_grouped_mm,
        "ep_group": ep_group.ranks,
        "dp_group": dp_group.ranks if dp_group else [rank],
        "step_ms": [round(x, 3) for x in step_ms],
        "num_threads": torch.get_num_threads(),
    }
    # Post-process this rank's traces here, in parallel with the other ranks.
    counts = fix_rank(trace_path, raw / f"rank{rank}.et.json", raw.parent / f"rank{rank}.trace.json.gz",
                      raw.parent / f"rank{rank}.et.json.gz", backend)
    routing["comm_events"] = counts["comm_events"]
    (raw / f"rank{rank}.routing.json").write_text(json.dumps(routing))
    dist.barrier()

