"""Microbenchmark sweeps with torch: GEMM, grouped GEMM, elementwise and attention (forward, and backward
timed as forward + backward minus forward).

On CUDA each case is timed with CUDA events after warm-up, median of repeats; on
CPU with ``time.perf_counter``. The result is a :class:`~cosim.models.fit.KernelDB`
of the same form as one built from traces, so the same fit turns it into a
profile. ``quick`` runs a handful of small cases (seconds on a CPU).
"""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import dataclass

import numpy as np

from cosim.models.features import KernelFeatures
from cosim.models.fit import KernelDB

__all__ = ["MicrobenchConfig", "run_microbench"]


@dataclass(frozen=True)
class MicrobenchConfig:
    """What to sweep and how to time it."""

    device: str = "cuda"
    """"cuda" or "cpu"."""
    quick: bool = False
    """A few small cases only (seconds)."""
    repeats: int = 10
    """Timed repetitions per case (the median is kept)."""
    warmup: int = 3
    """Untimed repetitions before timing."""
    dtype: str = "bf16"
    """GEMM / attention dtype ("bf16", "fp16", "fp32")."""
    progress: bool = True
    """A progress bar on stderr (only when it is a terminal)."""

    def __post_init__(self) -> None:
        if self.device not in ("cuda", "cpu"):
            raise ValueError(f"device must be 'cuda' or 'cpu', got {self.device!r}")
        if self.repeats < 1 or self.warmup < 0:
            raise ValueError("repeats must be >= 1 and warmup >= 0")
        if self.dtype not in ("bf16", "fp16", "fp32"):
            raise ValueError(f"dtype must be bf16, fp16 or fp32, got {self.dtype!r}")


def _timer(torch, device: str, fn, warmup: int, repeats: int) -> float:  # type: ignore[no-untyped-def]
    for _ in range(warmup):
        fn()
    times = []
    if device == "cuda":
        torch.cuda.synchronize()
        for _ in range(repeats):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) * 1e-3)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return float(statistics.median(times))


def run_microbench(cfg: MicrobenchConfig) -> tuple[KernelDB, dict[str, str]]:
    """Run the sweeps; returns the measurements and provenance (device name, torch version)."""
    import torch

    dev = torch.device(cfg.device)
    tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[cfg.dtype]
    if cfg.device == "cpu":
        tdt = torch.float32  # CPU bf16 GEMMs are emulated on most hosts
    dname = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32"}[cfg.dtype] if cfg.device == "cuda" else "fp32"
    eb = 2 if dname in ("bf16", "fp16") else 4
    rows: list[dict] = []
    if cfg.quick:
        gemms = [(64, 64, 64), (128, 256, 128), (256, 256, 256), (512, 256, 128)]
        groups = [(2, 64, 128, 128)]
        elems = [2**12, 2**16, 2**18]
        attn = [(1, 2, 128, 64)]
    else:
        dims = [64, 256, 1024, 4096, 8192]
        gemms = [(m, n, k) for m in dims for n in dims[1:] for k in dims[1:]]
        groups = [(g, m, 4096, 2048) for g in (4, 8, 32) for m in (64, 512, 2048)]
        elems = [2**p for p in range(12, 29, 2)]
        attn = [(b, h, s, 128) for b in (1, 8) for h in (16, 32) for s in (512, 2048, 8192)]
    rep, wu = (3, 1) if cfg.quick else (cfg.repeats, cfg.warmup)
    from tqdm import tqdm

    bar = tqdm(total=len(gemms) + len(groups) + len(elems) + len(attn), desc=f"microbench {cfg.device}",
               unit="case", file=sys.stderr, disable=not (cfg.progress and sys.stderr.isatty()), leave=False)
    for m, n, k in gemms:
        a = torch.randn(m, k, device=dev, dtype=tdt)
        bt = torch.randn(k, n, device=dev, dtype=tdt)
        t = _timer(torch, cfg.device, lambda a=a, b=bt: torch.mm(a, b), wu, rep)
        rows.append(dict(cls="gemm", kernel="torch.mm", op="aten::mm", dtype=dname, m=m, n=n, k=k, batch=1,
                         flops=2.0 * m * n * k, bytes=float(eb * (m * k + k * n + m * n)), dur=t))
        bar.update()
    for g, m, n, k in groups:  # a loop of per-expert GEMMs: the grouped GEMM eager MoE runs
        xs = [torch.randn(m, k, device=dev, dtype=tdt) for _ in range(g)]
        w = torch.randn(g, k, n, device=dev, dtype=tdt)
        x3 = torch.stack(xs)
        t = _timer(torch, cfg.device, lambda x3=x3, w=w: torch.bmm(x3, w), wu, rep)
        rows.append(dict(cls="grouped_gemm", kernel="torch.bmm", op="aten::bmm", dtype=dname, m=m, n=n, k=k,
                         batch=g, flops=2.0 * g * m * n * k, bytes=float(eb * g * (m * k + k * n + m * n)), dur=t))
        bar.update()
    for ne in elems:
        x = torch.randn(ne, device=dev, dtype=tdt)
        y = torch.randn(ne, device=dev, dtype=tdt)
        t = _timer(torch, cfg.device, lambda x=x, y=y: torch.add(x, y), wu, rep)
        rows.append(dict(cls="elementwise", kernel="torch.add", op="aten::add", dtype=dname, bytes=3.0 * eb * ne,
                         dur=t))
        t = _timer(torch, cfg.device, lambda x=x: torch.sum(x), wu, rep)
        rows.append(dict(cls="reduction", kernel="torch.sum", op="aten::sum", dtype=dname, bytes=1.0 * eb * ne,
                         dur=t))
        bar.update()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for b, h, s, d in attn:
        q = torch.randn(b, h, s, d, device=dev, dtype=tdt)
        qg = q.detach().clone().requires_grad_(True)

        def fwd(q=q):
            return sdpa(q, q, q)

        def fwd_bwd(qg=qg):
            sdpa(qg, qg, qg).sum().backward()
            qg.grad = None

        t = _timer(torch, cfg.device, fwd, wu, rep)
        common = dict(cls="attention", kernel="sdpa", dtype=dname, m=s, n=s, k=d, batch=b, heads=h)
        rows.append(dict(common, op="aten::scaled_dot_product_attention", flops=4.0 * b * h * s * s * d,
                         bytes=4.0 * eb * b * h * s * d, dur=t))
        # backward alone: forward + backward (+ the tiny sum) minus the forward
        tb = _timer(torch, cfg.device, fwd_bwd, wu, rep) - t
        if tb > 0:
            rows.append(dict(common, op="aten::_scaled_dot_product_attention_backward", bwd=1.0,
                             flops=10.0 * b * h * s * s * d, bytes=8.0 * eb * b * h * s * d, dur=tb))
        bar.update()
    bar.close()
    n = len(rows)

    def col(key: str, default: float = np.nan) -> np.ndarray:
        return np.array([float(r.get(key, default)) for r in rows])

    f = KernelFeatures(cls=[r["cls"] for r in rows], kernel=[r["kernel"] for r in rows],
                       op_name=[r["op"] for r in rows], dtype=[r["dtype"] for r in rows], m=col("m"), n=col("n"),
                       k=col("k"), batch=col("batch", 1.0), heads=col("heads", 1.0), bwd=col("bwd", 0.0) > 0,
                       flops=col("flops"), bytes=col("bytes"), dur=col("dur"),
                       grid=-np.ones((n, 3), np.int64), block=-np.ones((n, 3), np.int64))
    name = torch.cuda.get_device_name(0) if cfg.device == "cuda" else "cpu"
    prov = {"gpu": name, "torch_version": torch.__version__, "method": f"microbench {cfg.device}"
            + (" quick" if cfg.quick else "")}
    return KernelDB("", name, f, ["microbench"] * n, -np.ones(n, np.int64)), prov
