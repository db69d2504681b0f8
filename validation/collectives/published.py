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

from cosim import units

SOURCES = Path(__file__).resolve().parent / "published" / "sources.yaml"
MIN_SIZE = 1 << 20
"""Targets count rows from 1 MiB up."""


def load(path: Path = SOURCES, kind: str = "sweeps") -> list[dict[str, Any]]:
    """The published sweeps of ``kind``: ``sweeps`` (all-reduce, all-gather, reduce-scatter, broadcast) or
    ``alltoall`` (nccl-tests alltoall_perf, scored in their own section)."""
    with open(path, encoding="utf-8") as fh:
        return list(yaml.safe_load(fh)[kind])


def _ranks(topo: Any, sweep: dict[str, Any]) -> list[str]:
    """The sweep's ranks: ``ranks_per_node`` GPUs of each of ``nodes`` nodes in preset order, or of the nodes
    ``node_ranges`` names ([first node, count] pairs) when the run used part of each rack."""
    from cosim.cli.collective import pick_ranks

    ppn = int(sweep["ranks_per_node"])
    if "node_ranges" not in sweep:
        return pick_ranks(topo, ppn * int(sweep["nodes"]), ppn)
    per: dict[int, list[str]] = {}
    for g in topo.gpus:
        per.setdefault(topo.node_of(g), []).append(g)
    order = sorted(per)
    picked = [order[i] for a, n in sweep["node_ranges"] for i in range(int(a), int(a) + int(n))]
    if len(picked) != int(sweep["nodes"]):
        raise ValueError(f"{sweep['id']}: node_ranges pick {len(picked)} nodes, nodes says {sweep['nodes']}")
    return [g for k in picked for g in per[k][:ppn]]


def simulate(sweep: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per published point: size, measured and simulated busbw (GB/s), algo/proto, error."""
    from cosim.engine import NcclConfig, SimConfig, Simulator
    from cosim.engine.collectives import CollectiveResult
    from cosim.topology import load_topology

    topo = load_topology(sweep["topology"])
    ranks = _ranks(topo, sweep)
    sim = Simulator(topo, SimConfig(nccl=NcclConfig(algo=sweep.get("algo", "auto")), record_trace=False))
    out = []
    for size, meas, *rest in sweep["rows"]:
        ev = sim.collective(sweep["op"], ranks, float(size))
        sim.run()
        r = ev.value
        assert isinstance(r, CollectiveResult)
        bus = r.busbw / 1e9
        out.append({"size": int(size), "measured": float(meas), "sim": bus, "pick": f"{r.algo}/{r.proto}",
                    "err": bus / float(meas) - 1.0, "time_us": float(rest[0]) if rest else math.nan,
                    "sim_time_us": r.time * 1e6, "ranks": len(ranks)})
    return out


def _size(b: int) -> str:
    return units.fmt_size(b)


VIDUR_VS_PUBLISHED = {
    "ring": (300.0, 370.0),
    "nvls": (223.0, 480.0 / (2 * 7 / 8)),
}
"""Large-size rates (GB/s) of vidur's DGX H100 harness vs NVIDIA's published peaks: 2-GPU ring
incremental busbw (vidur) vs the 8-GPU ring busbw peak; 4/8-GPU NVLS incremental algbw from 24 MiB
(vidur: 4.64-4.75 us/MiB) vs the 8-GPU NVLS busbw peak (480 GB/s) as algbw."""


def conflict(last_err: dict[str, float], two_node: list[dict[str, Any]]) -> list[str]:
    """Paragraphs: what the model does at large sizes, why vidur's harness reads less, and the 2-node ramp."""
    (vr, pr), (vn, pn) = VIDUR_VS_PUBLISHED["ring"], VIDUR_VS_PUBLISHED["nvls"]
    ring = last_err["h100-8gpu-ring-allreduce-peak"]
    nvls = float(np.median([e for k, e in last_err.items() if "nvls-allreduce" in k and "2node" not in k]))
    rest = [r for r in two_node if r["size"] >= MIN_SIZE and r["size"] != 16 * 2**20]
    worst = max(rest, key=lambda r: abs(r["err"]))
    r16 = next(r for r in two_node if r["size"] == 16 * 2**20)
    big = [r for r in two_node if r["size"] >= 2**30]
    return [
        "**NVLS.** All-reduce reduces in the switch: each GPU sends its whole buffer S up (multimem "
        "ld_reduce) and receives the whole result S down (multimem st), at the Simple efficiency x NCCL's "
        "Hopper NVLS factor (nvlsEfficiency 0.85 x (16 - 1) / 16 channels, src/graph/tuning.cc; not fitted). "
        "It is pipelined in NCCL's NVLS chunks (src/enqueue.cc: 128 KiB, halved to 64 / 32 / 16 KiB for calls "
        "below 64 / 8 / 2 x concurrentOps x chunk, concurrentOps = 16 channels x nHeads): each step moves "
        "min(S, concurrentOps x chunk), a chunk passes `stages` pipeline stages (one node 3: scatter, switch "
        "reduce + multicast, gather; NVLS-tree 2 + 2 log2(nNodes): NVLS reduce, up and down the tree of nodes, "
        "NVLS multicast), so a call takes nsteps + stages - 1 steps (the fill and drain; not fitted), and a "
        "channel's step takes at least the fitted `nvls_step`. "
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
        "environment.yml, so the NCCL version is not recorded). Its 4- and 8-GPU all-reduces run NVLS: from "
        "16 MiB the 4- and 8-GPU slopes are equal (4.72 / 4.76 us/MiB) as in-switch reduction predicts (S each "
        "way whatever n), and the 8-GPU intercept is 29 us above the 4-GPU one, as the pipeline fill predicts "
        "(128 pipes of 32 KiB vs 64; the model's held-out 8-GPU intercept is 45.5 us, measured 45.8). Its "
        f"large-size rates are ~81% of NVIDIA's: NVLS {vn:.0f} GB/s algbw vs {pn:.0f} ({vn / pn:.0%}), 2-GPU ring "
        f"{vr:.0f} GB/s busbw vs {pr:.0f} ({vr / pr:.0%}), while its send/recv reaches 348 GB/s (94% of 370); the "
        "model keeps NCCL's NVLS factor, so it runs 5-18% below vidur's 8-GPU NVLS points from 8 MiB (validation "
        "table above). Checked and rejected as the cause of the slower rate: a per-chunk cost (vidur's 4-GPU slope "
        "does not change at 32 MiB, where its chunk doubles; the fitted per-step minimum binds only on 16 KiB "
        "chunks). Not determined from the data in hand: fp16 (vidur) vs fp32 (nccl-tests) and the NCCL version. "
        "What would close it: vidur's harness and nccl-tests on one machine, fp16 and fp32, 16 MiB to 8 GiB, NCCL "
        "version and NCCL_ALGO recorded.", "",
        "**2-node NVLS-tree sweep.** At 1-2 MiB the tuner picks among NCCL's own algorithms with NCCL's "
        "constants (src/graph/tuning.cc: ring, tree, NVLS-tree; ring LL at 1 MiB, NVLS-tree from 2 MiB). From "
        "2 MiB the sweep's time is, within its noise, latency + (S + 3 x concurrentOps x chunk) / rate: "
        "measured incremental costs of ~10 us/MiB below 8 MiB, ~5.5 us/MiB to 64 MiB and 4.0-4.4 us/MiB from "
        "128 MiB are the fill (3 steps of 128 pipes x 32 / 64 / 128 KiB, NCCL's NVLS-tree chunk rule: 32 KiB "
        "below 8 MiB, 64 KiB below 64 MiB) over a constant rate, not a window-limited rate. With that fill (no "
        f"parameter fitted on this sweep) every size from 1 MiB is within {abs(worst['err']) * 100:.0f}% "
        f"({units.fmt_size(worst['size'])} {worst['err'] * 100:+.1f}%) except 16 MiB "
        f"({r16['err'] * 100:+.1f}%), which is bimodal in the source (out-of-place 304 us, slower than 32 MiB's "
        "277 us; in-place 208 us, within 5% of the model); from 1 GiB the model is "
        f"{min(r['err'] for r in big) * 100:+.1f}% to {max(r['err'] for r in big) * 100:+.1f}% (asymptotic rate). "
        "Held-out status: this sweep was in hand (in this file) when the fill and the chunk rule were added, and "
        "its ramp motivated them; nothing is fitted to it, the stage count and chunk sizes are NCCL's, and the "
        "vidur fit sets the NVLS latency. A second multi-node sweep (NCCL version, NCCL_ALGO, nodes, NICs) would "
        "be a clean check; see *Sources looked at* in sources.yaml for the ones found without full tables.", ""]


def _a2a_rows() -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    return [(sw, simulate(sw)) for sw in load(kind="alltoall")]


def nvlink_domain(sw: dict[str, Any]) -> bool:
    """Whether every peer of the sweep is reached over NVLink (one NVLink domain: one rack of GB200 NVL72)."""
    return len({int(a) // 18 for a, _ in sw.get("node_ranges") or [[0, 1]]}) == 1 and sw["topology"] == "gb200-nvl72"


def render_alltoall() -> str:
    """Markdown section: the published nccl-tests alltoall_perf rows, held out, and what they show."""
    lines = ["## Published all-to-all (not fitted)", "",
             "nccl-tests `alltoall_perf` (out-of-place; busbw = algbw x (n-1)/n, nccl-tests' definition), sources, "
             "hardware and settings in `validation/collectives/published/sources.yaml` (`alltoall`). Nothing is "
             "fitted on them: cosim runs NCCL's all-to-all as its p2p flows (S/n from every rank to every other, "
             "Simple protocol from 16 KiB per peer, NCCL_NCHANNELS_PER_NET_PEER channels per network peer, NCCL's "
             "NVLink rate through each GPU's NVLink port) on the named preset. Generated by `python -m validation.collectives.published`.", "",
             "| sweep | GPUs | size | published time | cosim time | published busbw | cosim busbw | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    nvl: list[float] = []
    net: list[float] = []
    nvl_bus: list[float] = []
    for sw, rows in _a2a_rows():
        for r in rows:
            lines.append(f"| {sw['id']} | {r['ranks']} | {_size(r['size'])} | {r['time_us']:.0f} us | "
                         f"{r['sim_time_us']:.0f} us | {r['measured']:.1f} GB/s | {r['sim']:.1f} GB/s | "
                         f"{r['err'] * 100:+.1f}% |")
            (nvl if nvlink_domain(sw) else net).append(r["err"])
            if nvlink_domain(sw):
                nvl_bus.append(r["measured"])
    a = np.abs(np.array(nvl + net))
    lines += ["", "| rows | n | median abs error | max abs error | mean signed error |", "|---|---:|---:|---:|---:|"]
    for name, e in (("one NVLink domain (4-64 GPUs, GB200 and GB300)", nvl), ("across racks, NIC-bound (128-192 GPUs)", net),
                    ("all", nvl + net)):
        x = np.array(e)
        lines.append(f"| {name} | {x.size} | {np.median(np.abs(x)) * 100:.1f}% | {np.abs(x).max() * 100:.1f}% | "
                     f"{x.mean() * 100:+.1f}% |")
    lines += ["", f"Against the collective targets (median <= 8%, max <= 20%): median {np.median(a) * 100:.1f}%, "
              f"max {a.max() * 100:.1f}%.", "",
              "**Across racks (NIC-bound).** Each GPU sends (n - n_rack)/n of its buffer through its own 400G "
              "NIC; cosim's p2p channels per network peer (2, NCCL_NCHANNELS_PER_NET_PEER, halved while "
              "channels x ranks > 4 x p2pnChannels) x the per-channel network rate bound each flow, and the NIC's "
              "port bounds their sum: the 2-rack rows land within "
              f"{max(abs(e) for e in net[:2]) * 100:.0f}% and the 3-rack rows "
              f"{min(net[2:]) * 100:+.0f}% to {max(net[2:]) * 100:+.0f}% (cosim faster).", "",
              "**Inside one NVLink domain.** NCCL's all-to-all is grouped send/recv: SM-driven copies, one CTA "
              "per p2p channel, a NVLink peer getting 2 x (path bandwidth / one NVLink's) channels (src/graph/"
              "paths.cc ncclTopoGetNchannels), where NCCL rates one NVLink at its SMxx_NVLINK_BW constant "
              "(src/graph/topo.h: 20.6 GB/s on Hopper, 40.1 on Blackwell). cosim's NVLink 5 port runs at 0.856 x "
              "900 GB/s (nvbandwidth's copy-engine copy, cosim/catalog/data/links.yaml), which before this round "
              "put every all-to-all from 4 to 64 GPUs at ~754 GB/s busbw, +10% to +33% above these rows (median "
              "18.3%). NCCL's point-to-point traffic now moves at most links x NCCL's per-link rate through a GPU's "
              "NVLink port (`p2p_nvlink_bw` in cosim/engine/data/nccl_h100.yaml, NcclParams.p2p_nvlink_factor): "
              "18 x 40.1 = 722 GB/s of wire bytes on NVLink 5 (factor 0.937 of the port, ~707 GB/s busbw), "
              "nothing on NVLink 4 (18 x 20.6 = 371 GB/s is above the port's 0.77 x 450, itself NCCL's own "
              "send/recv), so H100 / H200 figures do not move; collectives (ring, NVLS) keep the port's rate "
              "(NVLS all-reduce on NVL72 is held out at 835 GB/s busbw, which 0.80 x 900 for all traffic would "
              "miss by 12%). Held-out status: NCCL's constant is not fitted, but the rule was chosen after these "
              f"rows were in hand. Now {min(nvl) * 100:+.1f}% to {max(nvl) * 100:+.1f}%; what remains is "
              "largest on 4 GPUs (+13% to +16%, GB200 and GB300 alike) and on the 64-GPU 4 GiB row that reads 9% "
              "below its in-place twin, smallest on 8 GPUs (+3% to +7%). The published runs read "
              f"{min(nvl_bus):.0f}-{max(nvl_bus):.0f} GB/s ({min(nvl_bus) / 900:.2f}-{max(nvl_bus) / 900:.2f} of "
              "900; two OCI clusters, NCCL 2.28.7 where printed). What would settle the rest: nccl-tests "
              "sendrecv_perf between 2 GPUs of one tray and alltoall_perf at 4 GPUs with "
              "NCCL_MAX_P2P_NCHANNELS=8/16/32, NCCL_DEBUG=INFO (channels per peer). No published H100 / H200 "
              "all-to-all table was found (`alltoall_looked_at` in sources.yaml)."]
    return "\n".join(lines)


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
    ar_errs: list[float] = []
    per: list[tuple[str, int, float, float]] = []
    per_err: dict[str, float] = {}
    per_sim: dict[str, float] = {}
    two_node: list[dict[str, Any]] = []
    clean: list[float] = []
    flagged: list[str] = []
    for sw in load():
        rows = simulate(sw)
        bad = {int(k) for k in (sw.get("conflict_rows") or [])} if "conflict_rows" in sw else \
            ({int(r[0]) for r in sw["rows"]} if sw.get("conflict") else set())
        clean += [abs(r["err"]) for r in rows if r["size"] >= MIN_SIZE and r["size"] not in bad]
        flagged += [f"{sw['id']} {_size(r['size'])} ({r['err'] * 100:+.1f}%)" for r in rows
                    if r["size"] >= MIN_SIZE and r["size"] in bad]
        per_err[sw["id"]] = rows[-1]["err"]
        per_sim[sw["id"]] = rows[-1]["sim"]
        if sw["id"] == "h200-2node-nvls-tree-allreduce":
            two_node = rows
        for r in rows:
            lines.append(f"| {sw['id']} | {_size(r['size'])} | {r['measured']:.1f} GB/s | {r['sim']:.1f} GB/s | "
                         f"{r['pick']} | {r['err'] * 100:+.1f}% |")
        e = np.abs([r["err"] for r in rows if r["size"] >= MIN_SIZE])
        errs += e.tolist()
        if sw["op"] == "all_reduce":
            ar_errs += e.tolist()
        per.append((sw["id"], len(e), float(np.median(e)) if e.size else math.nan,
                    float(e.max()) if e.size else math.nan))
    a = np.array(errs)
    lines += ["", "| sweep | points >= 1 MiB | median abs error | max abs error |", "|---|---:|---:|---:|"]
    lines += [f"| {i} | {n} | {m * 100:.1f}% | {x * 100:.1f}% |" for i, n, m, x in per]
    ok_m, ok_x = float(np.median(a)) <= 0.08, float(a.max()) <= 0.20
    ar = np.array(ar_errs)
    lines += [f"| all-reduce sweeps | {ar.size} | {np.median(ar) * 100:.1f}% | {ar.max() * 100:.1f}% |",
              f"| **all** | {a.size} | **{np.median(a) * 100:.1f}%** | **{a.max() * 100:.1f}%** |",
              f"| all without the contradicted rows | {len(clean)} | {np.median(clean) * 100:.1f}% | "
              f"{max(clean) * 100:.1f}% |", "",
              f"Targets (issue 17: busbw median <= 8%, max <= 20% from 1 MiB; nothing here is fitted): median "
              f"{np.median(a) * 100:.1f}% {'met' if ok_m else 'MISSED'}, max {a.max() * 100:.1f}% "
              f"{'met' if ok_x else 'MISSED'} (all {a.size} rows); without the rows a second measurement of the "
              f"same setup contradicts ({', '.join(flagged)}; `conflict` in sources.yaml, evidence below): median "
              f"{np.median(clean) * 100:.1f}% {'met' if float(np.median(clean)) <= 0.08 else 'MISSED'}, max "
              f"{max(clean) * 100:.1f}% {'met' if max(clean) <= 0.20 else 'MISSED'}. Data that would close the max "
              "on all rows: the contradicted runs' nccl-tests command lines and NCCL_DEBUG=INFO TUNING logs "
              "(below).", "",
              "**Contradicted rows.** *Voltage Park single node* (all-gather 183 GB/s, broadcast 213): the source "
              "gives no nccl-tests flags, environment (NCCL_ALGO / NCCL_PROTO / NCCL_NVLS_ENABLE / channels), "
              "-g/-t layout or in-place/out-of-place column (aigatech/vpbenchmarking README: NCCL 2.24.3+cuda12.6, "
              "OpenMPI 4.1.2, Docker + nvidia-container-toolkit; peaks 'at 256 MiB' and 'at 128 MiB', so the "
              "sweeps fall at larger sizes, which no bandwidth-bound algorithm does). Its own 4-node runs on the "
              "same nodes and NCCL contradict it: a 4-node ring all-gather (323.5 GB/s) moves the busbw through "
              "each GPU's NVLink out-port (8 rings, one per rail, each through all 8 GPUs of a node, the last "
              "handing over to the rail GPU by PXN), and a 4-node broadcast (286.3) 7/8 of it (250), so NVLink "
              "carried 250-324 GB/s per GPU there, not 183-213. Mechanisms "
              "checked: NCCL 2.24 may run all-gather as NVLS on one node (src/graph/tuning.cc lets NVLS do "
              "AllGather and disables it on more than one node without CollNet), but NVLS all-gather on 8 x H100 "
              "reaches ~300 GB/s at 1 GB (NVIDIA/nccl issue #1506, ring 350) and broadcast has only ring; a "
              "PCIe / host-bounce path would give < 55 GB/s (the same README's H2D 54.8 GB/s). None explains "
              "~half of NVLink's rate; NVIDIA's maintainer gives ~370 GB/s on the same hardware "
              "(h100-8gpu-allgather-peak). *2 x H200 at 16 MiB*: bimodal in the source (out-of-place 304 us, "
              "slower than its own 32 MiB, 277 us; in-place 208 us, within 5% of the model), only the "
              "out-of-place busbw is scored. What would settle both: the runs' nccl-tests command lines and "
              "NCCL_DEBUG=INFO TUNING logs (algorithm / protocol / channels per size).", "",
              "**All-gather and broadcast (Voltage Park, found after the NVLS model was written).** Single node, "
              "the source's all-gather (183 GB/s at 256 MiB) and broadcast (213 GB/s at 128 MiB) peaks are half of "
              "the ~370 GB/s NVIDIA's maintainer gives for non-allreduce ops on the same 8 x H100 (the "
              "h100-8gpu-allgather-peak row, -9%): the two published figures disagree, and cosim sits near "
              "NVIDIA's. On 4 nodes, multi-node rings follow NCCL's graph search (src/graph/search.cc, rings.cc): "
              "one ring per NIC (channel c on NIC c), each entering a node at its rail's GPU, running through the "
              "node's GPUs and leaving through the same NIC (PXN: the last GPU hands its data over NVLink to the "
              "rail's GPU, whose NIC sends it along the rail to the next node's rail GPU), each ring carrying "
              "1/nNICs of the data; broadcast and reduce are one pipelined chain per ring from the root. Every "
              "rail then carries one ring, so busbw approaches the node's aggregate NCCL NIC rate: 8 x a NIC's "
              "2 NCCL channels (NCCL's search plans 1 channel per NDR NIC at 48 GB/s, doubled by "
              "ncclTopoPostset, src/graph/search.cc, connect.cc) x `net_channel_bw` (18.30 GB/s of wire bytes, "
              "from vidur's two-node send/recv, 35.9 GB/s of payload on its 2 channels per peer) x the Simple efficiency: all-gather "
              f"{per_sim['h100-4node-allgather-vp']:.0f} vs 324 GB/s "
              f"({per_err['h100-4node-allgather-vp'] * 100:+.1f}%), broadcast {per_sim['h100-4node-broadcast-vp']:.0f}"
              f" vs 286 ({per_err['h100-4node-broadcast-vp'] * 100:+.1f}%); before this plan (one ring whose "
              "node boundaries crossed rails through the spine, merged into rows of unequal bytes, and one chain "
              "through all 32 GPUs for broadcast) they were 173 and 35 GB/s. The wire itself is faster (the "
              "ib-ndr link: 0.94 of 400 Gb/s, RDMA writes; DeepEP reaches it, validation/moe_comm), so these "
              "rows are bound by NCCL's channels, not the port: the broadcast's 286 GB/s is 35.8 GB/s per "
              "port, NCCL's 2 channels; the all-gather's 324 (40.4 per port, 81%) is 13% above them, not "
              "explained here (one channel's network rate may differ between NCCL versions: VP ran 2.24.3, "
              "vidur's is not recorded, NCCL 2.29 plans 14 GB/s per p2p channel). "
              "network figure). The sizes of the 4-node figures are not given in the source (scored at 8 GiB).",
              "",
              *conflict(per_err, two_node)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render())
    print()
    print(render_alltoall())
