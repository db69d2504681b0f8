"""Score cosim against published NCCL sweeps (validation/collectives/published/sources.yaml).

Nothing here is fitted: each row is simulated with the shipped parameters on the named topology preset
and compared by bus bandwidth (nccl-tests definition). ``python -m validation.collectives.published``
prints the table; ``validation.collectives.run`` appends it to RESULTS.md.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml

SOURCES = Path(__file__).resolve().parent / "published" / "sources.yaml"
MIN_SIZE = 1 << 20
"""Targets count rows from 1 MiB up."""


def load(path: Path = SOURCES) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as fh:
        return list(yaml.safe_load(fh)["sweeps"])


def simulate(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per published point: size, measured and simulated busbw (GB/s), algo/proto, error."""
    from cosim.cli.collective import pick_ranks
    from cosim.engine import NcclConfig, SimConfig, Simulator
    from cosim.engine.collectives import CollectiveResult
    from cosim.topology import load_topology

    topo = load_topology(sweep["topology"])
    ppn = int(sweep["ranks_per_node"])
    ranks = pick_ranks(topo, ppn * int(sweep["nodes"]), ppn)
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(algo=sweep.get("algo", "auto")), record_trace=False))
    out = []
    for size, meas in sweep["rows"]:
        ev = sim.collective(sweep["op"], ranks, float(size))
        sim.run()
        r = ev.value
        assert isinstance(r, CollectiveResult)
        bus = r.busbw / 1e9
        out.append({"size": int(size), "measured": float(meas), "sim": bus, "pick": f"{r.algo}/{r.proto}",
                    "err": bus / float(meas) - 1.0})
    return out


def _size(b: int) -> str:
    from cosim import units

    return units.fmt_size(b)


VIDUR_VS_PUBLISHED = {
    "ring": (300.0, 370.0),
    "nvls": (223.0, 480.0 / (2 * 7 / 8)),
}
"""Large-size rates (GB/s) of vidur's DGX H100 harness vs NVIDIA's published peaks: 2-GPU ring
incremental busbw (vidur) vs the 8-GPU ring busbw peak; 4/8-GPU NVLS incremental algbw from 24 MiB
(vidur: 4.64-4.75 us/MiB) vs the 8-GPU NVLS busbw peak (480 GB/s) as algbw."""


def conflict(last_err: dict[str, float]) -> list[str]:
    """Paragraphs: what the model does at large sizes, and why vidur's harness reads less."""
    (vr, pr), (vn, pn) = VIDUR_VS_PUBLISHED["ring"], VIDUR_VS_PUBLISHED["nvls"]
    ring = last_err["h100-8gpu-ring-allreduce-peak"]
    nvls = float(np.median([e for k, e in last_err.items() if "nvls-allreduce" in k and "2node" not in k]))
    return [
        "**NVLS.** All-reduce reduces in the switch: each GPU sends its whole buffer S up (multimem "
        "ld_reduce) and receives the whole result S down (multimem st), at the Simple efficiency x NCCL's "
        "Hopper NVLS factor (nvlsEfficiency 0.85 x (16 - 1) / 16 channels, src/graph/tuning.cc; not fitted). "
        f"Single-node NVLS peaks: {nvls * 100:+.1f}% (median), ring / all-gather / reduce-scatter peaks "
        f"{ring * 100:+.1f}%. NCCL runs NVLS only with more than 2 GPUs (src/transport/nvls.cc: gpuCount <= 2), "
        "so 2-GPU all-reduces are rings.", "",
        "**vidur's harness vs NVIDIA's peaks.** The latency and protocol parameters are fitted on vidur's DGX "
        "H100 sweeps (microsoft/vidur @7d47513 vidur/profiling/collectives: one Ray actor per GPU with "
        "CUDA_VISIBLE_DEVICES set to it, torch.distributed with the NCCL torch bundles, fp16 buffers, eager "
        "calls (collectives_wrapper.py: DISABLE_GRAPH = True), 11 back-to-back launches per run under a Kineto "
        "CUDA-activity profiler, the median `cuda_time_total` of the kernels named nccl*, 3 runs, up to "
        "4096 x 8192 elements = 64 MiB; benchmark_runner.py sets NCCL_GRAPH_MIXING_SUPPORT=0 and "
        "NCCL_IGNORE_DISABLED_P2P=1 and nothing that selects an algorithm, protocol or channel count "
        "(no NCCL_ALGO, NCCL_NVLS_ENABLE, NCCL_MIN_NCHANNELS); no torch pin in requirements.txt / "
        "environment.yml, so the NCCL version is not recorded). So the harness neither disables NVLS nor "
        "adds host time to the kernel durations it reports; what differs from nccl-tests is the data type "
        "(fp16 vs fp32), the sizes (<= 64 MiB, where NCCL runs smaller NVLS chunks) and the NCCL version. Its 4- and 8-GPU all-reduces run "
        "NVLS: from 24 MiB the 8-GPU rate (4.75 us/MiB, a busbw of 390 GB/s) is above what a ring reaches "
        "(370), and the 4- and 8-GPU slopes are equal (4.64 / 4.75 us/MiB) as in-switch reduction predicts "
        "(S each way whatever n; a ring or (n-1)/n S each way would put them 14% apart). Its large-size rates "
        f"are ~81% of NVIDIA's: NVLS {vn:.0f} GB/s algbw vs {pn:.0f} ({vn / pn:.0%}), 2-GPU ring {vr:.0f} GB/s "
        f"busbw vs {pr:.0f} ({vr / pr:.0%}), while its send/recv reaches 348 GB/s (94% of 370). With NCCL's NVLS "
        "factor the model runs 12-28% below vidur's 8-GPU NVLS points from 16 MiB up (validation table "
        "above), and within 10% (median) on its 4-GPU ones. Checked and rejected as the cause: NCCL's NVLS "
        "chunk rule (src/enqueue.cc: the 128 KiB chunk halves below 64 / 8 / 2 x channels x heads x chunk, "
        "down to 16 KiB, so vidur's 8-64 MiB run 32 KiB chunks) with a per-chunk synchronisation cost: "
        "vidur's 4-GPU slope does not change at 32 MiB where its chunk doubles, and the 2-node sweep above "
        "keeps one slope (4.0-4.2 us/MiB) from 128 MiB to 16 GiB across two chunk changes. Not determined "
        "from the data in hand: fp16 (vidur) vs fp32 (nccl-tests) and the NCCL version. What would close it: "
        "vidur's harness and nccl-tests on one machine, fp16 and fp32, 16 MiB to 8 GiB, NCCL version and "
        "NCCL_ALGO recorded.", "",
        "**2-node NVLS-tree sweep.** At 1-2 MiB the tuner picks among NCCL's own algorithms with NCCL's "
        "constants (src/graph/tuning.cc: ring, tree, NVLS-tree; ring LL at 1 MiB, NVLS-tree from 2 MiB), within "
        "5%; before, it could pick a hierarchical all-reduce NCCL does not have (+58% / +28%). From 4 MiB "
        "its incremental cost falls with size: 10.4 us/MiB from 1 to 8 MiB "
        "(~100 GB/s algbw), ~5.5 us/MiB from 8 to 64 MiB (~190 GB/s), 4.0-4.2 us/MiB from 128 MiB (~255 "
        "GB/s, where cosim is within 4-8% from 1 GiB). The steps fall where NCCL's NVLS-tree chunk grows "
        "(32 KiB below 8 MiB, 64 KiB below 64 MiB, 128 KiB above, at 16 channels x 8 heads), i.e. a "
        "window-limited network pipeline (rate ~ chunks in flight x chunk / round trip); cosim runs the "
        "asymptotic rate from 4 MiB, hence +16% to +121% from 4 to 256 MiB. The 16 MiB row is bimodal in "
        "the source (out-of-place 304 us, in-place 208 us). What would close it: the chunks in flight per "
        "channel and the network round trip of NCCL's NVLS-tree (an NCCL_DEBUG=INFO/profiler trace of one "
        "call), or a second 2-node sweep to check a window model against.", ""]


def render() -> str:
    """Markdown section: per row and per sweep, with the targets (median <= 8%, max <= 20% from 1 MiB)."""
    lines = ["## Published sweeps (not fitted)", "",
             "Published nccl-tests bus bandwidths (sources, hardware, NCCL version and configuration in "
             "`validation/collectives/published/sources.yaml`), simulated with the shipped parameters on the "
             "named preset; error = simulated / published busbw - 1. Generated by "
             "`python -m validation.collectives.published`.", "",
             "| sweep | size | published busbw | cosim busbw | cosim algo/proto | error |",
             "|---|---:|---:|---:|---|---:|"]
    errs: list[float] = []
    per: list[tuple[str, int, float, float]] = []
    per_err: dict[str, float] = {}
    for sw in load():
        rows = simulate(sw)
        per_err[sw["id"]] = rows[-1]["err"]
        for r in rows:
            lines.append(f"| {sw['id']} | {_size(r['size'])} | {r['measured']:.1f} GB/s | {r['sim']:.1f} GB/s | "
                         f"{r['pick']} | {r['err'] * 100:+.1f}% |")
        e = np.abs([r["err"] for r in rows if r["size"] >= MIN_SIZE])
        errs += e.tolist()
        per.append((sw["id"], len(e), float(np.median(e)) if e.size else math.nan,
                    float(e.max()) if e.size else math.nan))
    a = np.array(errs)
    lines += ["", "| sweep | points >= 1 MiB | median abs error | max abs error |", "|---|---:|---:|---:|"]
    lines += [f"| {i} | {n} | {m * 100:.1f}% | {x * 100:.1f}% |" for i, n, m, x in per]
    ok_m, ok_x = float(np.median(a)) <= 0.08, float(a.max()) <= 0.20
    lines += [f"| **all** | {a.size} | **{np.median(a) * 100:.1f}%** | **{a.max() * 100:.1f}%** |", "",
              f"Targets (median <= 8%, max <= 20% from 1 MiB): median {'met' if ok_m else 'MISSED'}, "
              f"max {'met' if ok_x else 'MISSED'}.", "",
              *conflict(per_err)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
