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
from torch.profiler import ExecutionTraceObserver, ProfilerActivity, profile, record_function, schedule

from cosim.capture.capture import _cpu_model
from cosim.capture.comm import Comm, Group
from cosim.capture.config import CaptureOptions
from cosim.capture.model import EPContext, MoETransformer, grouped_mm_works
from cosim.capture.postprocess import fix_rank

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


def _buckets(params: list[torch.nn.Parameter], cap_bytes: float) -> list[list[torch.nn.Parameter]]:
    """Split ``params`` (already in reverse order, as DDP) into buckets of at most ``cap_bytes``."""
    out: list[list[torch.nn.Parameter]] = []
    cur: list[torch.nn.Parameter] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if cur and size + nbytes > cap_bytes:
            out.append(cur)
            cur, size = [], 0
        cur.append(p)
        size += nbytes
    if cur:
        out.append(cur)
    return out


def _allreduce_grads(comm: Comm, buckets: list[list[torch.nn.Parameter]], group: Group, scale: float,
                     tag: str) -> None:
    """Flatten each bucket's gradients, sum them over ``group``, scale, copy back."""
    for i, bucket in enumerate(buckets):
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bucket]
        flat = torch.cat([g.reshape(-1) for g in grads])
        comm.all_reduce(flat, group, f"{tag}.bucket{i}")
        flat.mul_(scale)
        off = 0
        for p in bucket:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p)
            off += n


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
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=opts.world_size, **({"device_id": device} if cuda else {}))
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
    model = MoETransformer(cfg, ctx, seed=opts.seed).to(device=device, dtype=dtype)
    expert_params = [p for p in model.parameters() if getattr(p, "is_expert", False)]
    dense_params = [p for p in model.parameters() if not getattr(p, "is_expert", False)]
    cap = opts.bucket_mb * 2**20
    dense_buckets = _buckets(list(reversed(dense_params)), cap)
    expert_buckets = _buckets(list(reversed(expert_params)), cap)
    # foreach: one multi-tensor kernel per AdamW stage (the default on GPUs; on CPU torch
    # would loop per parameter).
    opt = torch.optim.AdamW(model.parameters(), lr=opts.lr, foreach=True) if train else None
    if not train:
        model.eval()

    gen = torch.Generator().manual_seed(opts.seed * 31 + rank)
    b, s, total = opts.batch, opts.seq, opts.warmup + opts.steps
    cache = None
    next_tok = None
    if opts.mode == "decode":
        cache = model.new_cache(b, s + total, device, dtype)
        prompt = torch.randint(cfg.vocab_size, (b, s), generator=gen).to(device)
        with torch.inference_mode():
            next_tok = model(prompt, cache, 0, last_only=True).argmax(-1)
    elif opts.mode == "prefill":
        cache = model.new_cache(b, s, device, dtype)

    def step(i: int) -> None:
        nonlocal next_tok
        if train:
            assert opt is not None
            tokens = torch.randint(cfg.vocab_size, (b, s + 1), generator=gen).to(device)
            with record_function("cosim::forward"):
                logits = model(tokens[:, :-1])
                loss = _lm_loss(logits, tokens[:, 1:]) + model.aux_loss().to(logits.dtype)
            with record_function("cosim::backward"):
                loss.backward()
            with record_function("cosim::grad_sync"):
                _allreduce_grads(comm, dense_buckets, world, 1.0 / opts.world_size, "grad.dense")
                if dp_group is not None:
                    _allreduce_grads(comm, expert_buckets, dp_group, 1.0 / opts.world_size, "grad.experts")
                else:
                    for p in expert_params:
                        if p.grad is not None:
                            p.grad.mul_(1.0 / opts.world_size)
            with record_function("cosim::optimizer"):
                opt.step()
                opt.zero_grad(set_to_none=True)
        elif opts.mode == "prefill":
            tokens = torch.randint(cfg.vocab_size, (b, s), generator=gen).to(device)
            with torch.inference_mode(), record_function("cosim::prefill"):
                model(tokens, cache, 0, last_only=True).argmax(-1)
        else:
            with torch.inference_mode(), record_function("cosim::decode"):
                next_tok = model(next_tok, cache, s + i).argmax(-1)

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


def _lm_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over all positions (fp32)."""
    return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))

