"""Simulated timelines read by HolisticTraceAnalysis (HTA) like measured ones.

HTA (a dev dependency) loads cosim's ``timeline/rank{r}.json.gz`` files; its temporal
breakdown and communication/computation overlap must match cosim's own breakdown of
the same simulated ops within 1%, for a replay of the 8-rank PARAM DLRM trace with
simulated NCCL collectives (all-reduce and all-to-all on the fabric) and for the
bundled ``cosim run`` scenario (a projected CPU capture). HTA reads ``ts``/``dur`` as
written (``HTA_DISABLE_NS_ROUNDING=1``; by default it rounds sub-microsecond times
inward to whole microseconds, pytorch/pytorch#122425).
"""

from __future__ import annotations

import gzip
import json
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cosim.output import write_result
from cosim.output.timeline import NCCL_KERNEL_RE, nccl_kernel_name, nccl_type
from cosim.replay.program import is_comm
from cosim.replay.summary import breakdown, merge_intervals
from cosim.resources import shared_dir
from cosim.workload.graph import CollType, GpuKind, OpClass

pytestmark = pytest.mark.filterwarnings("ignore::Warning:hta.*")  # pandas deprecations inside HTA

hta_ta = pytest.importorskip("hta.trace_analysis", reason="HolisticTraceAnalysis not installed (pip install '.[dev]')")

SHARED = shared_dir()
DLRM = SHARED / "traces/param-dlrm-v100x8/kineto" if SHARED else None


@pytest.fixture(scope="module", autouse=True)
def _hta_env() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HTA_DISABLE_NS_ROUNDING", "1")
        logging.disable(logging.WARNING)  # HTA logs every file it parses
        try:
            yield
        finally:
            logging.disable(logging.NOTSET)


def _analyse(folder: Path) -> tuple[Any, Any]:
    ta = hta_ta.TraceAnalysis(trace_dir=str(folder))
    return ta.get_temporal_breakdown(visualize=False), ta.get_comm_comp_overlap(visualize=False)


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    if DLRM is None or not DLRM.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not available")
    from cosim.replay import ReplayConfig, replay

    res = replay(str(DLRM), None, ReplayConfig(collectives="simulated"))
    out = tmp_path_factory.mktemp("dlrm")
    write_result(res, out)
    return res, out


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path]:
    from cosim.scenario import load_scenario, run_scenario

    _, res = run_scenario(load_scenario("moe-ep4-dgx-h100"))
    out = tmp_path_factory.mktemp("run")
    write_result(res, out)
    return res, out


def _hta_ops(rg: Any, run: Any) -> np.ndarray:
    """The GPU ops HTA analyses: with two or more ProfilerSteps, those launched before the last one
    starts (HTA leaves the last step out); otherwise all of them."""
    G, H = rg.gpu_ops, rg.host_ops
    ok = np.isfinite(run.gpu_start) & np.isfinite(run.gpu_end)
    names = [rg.strings[int(n)] for n in H.name]
    steps = [i for i, n in enumerate(names) if "ProfilerStep" in n and np.isfinite(run.host_start[i])]
    if len(steps) < 2:
        return ok
    last = max(run.host_start[i] for i in steps)
    host = np.where(G.launch >= 0, rg.launches.host_op[np.maximum(G.launch, 0)], -1)
    launched = (host >= 0) & (G.correlation >= 0)
    hs = np.where(launched, run.host_start[np.maximum(host, 0)], np.inf)
    return ok & launched & (hs < last)


def _cosim_figures(rg: Any, run: Any) -> dict[str, float]:
    """cosim's breakdown (µs) over HTA's window, and its comm/comp overlap (%)."""
    sel = _hta_ops(rg, run)
    s, e = run.gpu_start[sel], run.gpu_end[sel]
    window = (float(s.min()), float(e.max()))
    bd = breakdown(rg, run, window, 1)
    G = rg.gpu_ops
    comm = is_comm(G.cls[sel])
    copy = (G.kind[sel] != GpuKind.KERNEL) | (G.cls[sel] == OpClass.MEMCPY) | (G.cls[sel] == OpClass.MEMSET)
    comp = ~comm & ~copy
    cs, ce = merge_intervals(s[comm], e[comm])
    ps, pe = merge_intervals(s[comp], e[comp])
    us, ue = merge_intervals(np.concatenate([cs, ps]), np.concatenate([ce, pe]))
    comm_t = float((ce - cs).sum())
    overlap = comm_t + float((pe - ps).sum()) - float((ue - us).sum())
    return {
        "kernel": (window[1] - window[0]) * 1e6,
        "compute": bd["compute"] * 1e6,
        "non_compute": (bd["exposed_communication"] + bd["memcpy"]) * 1e6,
        "idle": (bd["host_bound_gpu_idle"] + bd["other_idle"]) * 1e6,
        "overlap_pct": 100 * overlap / comm_t if comm_t > 0 else math.nan,
        "comm": comm_t * 1e6,
    }


def _check_against_cosim(res: Any, folder: Path) -> list[dict[str, float]]:
    tb, ov = _analyse(folder / "timeline")
    assert sorted(tb["rank"].tolist()) == [rg.rank for rg in res.graph.ranks]
    tb, ov = tb.set_index("rank"), ov.set_index("rank")
    figures = []
    for rg, run in zip(res.graph.ranks, res.runs):
        want = _cosim_figures(rg, run)
        row = tb.loc[rg.rank]
        got = {"kernel": row["kernel_time(us)"], "compute": row["compute_time(us)"],
               "non_compute": row["non_compute_time(us)"], "idle": row["idle_time(us)"]}
        for k, v in got.items():
            assert v == pytest.approx(want[k], rel=0.01, abs=0.01 * want["kernel"] / 100), (rg.rank, k, v, want)
        hta_ov = float(ov.loc[rg.rank, "comp_comm_overlap_pctg"])
        assert want["comm"] > 0 and math.isfinite(hta_ov), (rg.rank, hta_ov)  # NaN when HTA sees no communication
        assert hta_ov == pytest.approx(want["overlap_pct"], abs=1.0), (rg.rank, hta_ov, want)
        figures.append(want)
    return figures


def test_hta_reads_replay_like_cosim(dlrm: tuple[Any, Path]) -> None:
    res, out = dlrm
    figures = _check_against_cosim(res, out)
    # simulated NCCL kernels overlap compute on other streams on some ranks: the check is not vacuous
    assert max(f["overlap_pct"] for f in figures) > 1.0


def test_hta_reads_cosim_run_like_cosim(scenario: tuple[Any, Path]) -> None:
    res, out = scenario
    figures = _check_against_cosim(res, out)
    s = res.summary()
    # HTA's window is the first step (it leaves the last out) and cosim's summary is per step: same compute
    for f, r in zip(figures, s["ranks"]):
        assert f["compute"] == pytest.approx(r["breakdown"]["compute"] * 1e6, rel=0.01)


def test_simulated_collectives_are_nccl_kernels(scenario: tuple[Any, Path]) -> None:
    res, out = scenario
    for rg in res.graph.ranks:
        doc = json.loads(gzip.decompress((out / f"timeline/rank{rg.rank}.json.gz").read_bytes()))
        comm = [e for e in doc["traceEvents"] if e["ph"] == "X" and "Collective name" in e.get("args", {})]
        assert len(comm) == int((rg.gpu_ops.collective >= 0).sum()) > 0
        for e in comm:
            assert e["cat"] == "kernel" and NCCL_KERNEL_RE.match(e["name"]), e["name"]
            assert e["args"]["algorithm"] in ("p2p", "ring", "tree", "nvls", "hier")
        cats = {e["cat"] for e in doc["traceEvents"] if e["ph"] == "X"}
        assert cats <= {"cpu_op", "user_annotation", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset"}
        copies = [e for e in doc["traceEvents"] if e.get("cat") in ("gpu_memcpy", "gpu_memset")]
        assert copies and all(e["name"].startswith(("Memcpy ", "Memset (")) for e in copies)


def test_gpu_user_annotations_span_their_steps(scenario: tuple[Any, Path]) -> None:
    """Kineto's gpu_user_annotation ProfilerStep#N runs from the first to the last GPU op launched in the step;
    only the Perfetto file has them (HTA 0.5 would count them as kernels)."""
    res, out = scenario
    rg, run = res.graph.ranks[1], res.runs[1]
    doc = json.loads(gzip.decompress((out / "timeline.json.gz").read_bytes()))
    gpu_pid = 2000 + 1 + int(rg.gpu_ops.device[0])
    got = {e["name"]: (e["ts"], e["dur"], e["pid"], e["tid"]) for e in doc["traceEvents"]
           if e.get("cat") == "gpu_user_annotation" and e["name"].startswith("ProfilerStep#") and e["pid"] == gpu_pid}
    G = rg.gpu_ops
    assert len(got) == len(rg.steps) >= 2
    for s in range(len(rg.steps)):
        mine = (G.step == s) & (G.launch >= 0)
        t0, t1 = run.gpu_start[mine].min(), run.gpu_end[mine].max()
        name = rg.strings[int(rg.host_ops.name[int(rg.steps.host_op[s])])]
        assert got[name] == (round(t0 * 1e6, 3), round((t1 - t0) * 1e6, 3), gpu_pid, int(G.stream[mine][0]))
    rank_file = (out / "timeline/rank1.json.gz").read_bytes()
    assert b"gpu_user_annotation" not in gzip.decompress(rank_file)


def test_combined_timeline_opens_in_hta(scenario: tuple[Any, Path], tmp_path: Path) -> None:
    """The all-ranks file for Perfetto crashed HTA (correlation ids repeated per rank, int16 overflow)."""
    res, out = scenario
    (tmp_path / "all").mkdir()
    (tmp_path / "all/timeline.json.gz").write_bytes((out / "timeline.json.gz").read_bytes())
    tb, ov = _analyse(tmp_path / "all")
    assert len(tb) == 1 and tb["compute_time(us)"].iloc[0] > 0
    assert math.isfinite(ov["comp_comm_overlap_pctg"].iloc[0])
    doc = json.loads(gzip.decompress((out / "timeline.json.gz").read_bytes()))
    gpu = [e for e in doc["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    corr = [e["args"]["correlation"] for e in gpu]
    assert len(gpu) == sum(int(np.isfinite(r.gpu_start).sum()) for r in res.runs)
    assert len(corr) == len(set(corr)) == len(gpu)  # one launch per GPU op here, ids unique across ranks


def test_stale_rank_files_removed(scenario: tuple[Any, Path], tmp_path: Path) -> None:
    from cosim.output.timeline import write_timeline

    res, _ = scenario
    (tmp_path / "timeline").mkdir()
    (tmp_path / "timeline/rank7.json.gz").write_bytes(b"old")
    (tmp_path / "timeline/notes.txt").write_text("kept")
    written = write_timeline(tmp_path / "timeline.json.gz", res)
    assert sorted(p.name for p in (tmp_path / "timeline").iterdir()) == \
        ["notes.txt", *sorted(f"rank{r}.json.gz" for r in range(4))]
    assert len(written) == 5


@pytest.mark.parametrize(("ctype", "dtype", "algo", "name"), [
    (CollType.ALL_REDUCE, "BFloat16", "ring", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"),
    (CollType.ALL_REDUCE, "Float", "tree", "ncclDevKernel_AllReduce_Sum_f32_TREE_LL"),
    (CollType.ALL_REDUCE, "c10::Half", "nvls", "ncclDevKernel_AllReduce_Sum_f16_RING_LL"),  # NVLS runs in RING_LL
    (CollType.ALL_REDUCE, "Long", "ring", "ncclDevKernel_AllReduce_Sum_u64_RING_LL"),  # i64 shares u64's kernel
    (CollType.REDUCE_SCATTER, "Float8_e4m3fn", "ring", "ncclDevKernel_ReduceScatter_Sum_f8e4m3_RING_LL"),
    (CollType.ALL_GATHER, "BFloat16", "nvls", "ncclDevKernel_AllGather_RING_LL"),
    (CollType.BROADCAST, "Int", None, "ncclDevKernel_Broadcast_RING_LL"),
    (CollType.REDUCE, "Double", None, "ncclDevKernel_Reduce_Sum_f64_RING_LL"),
    (CollType.ALL_TO_ALL, "Float", "p2p", "ncclDevKernel_SendRecv"),
    (CollType.SEND, "Float", "p2p", "ncclDevKernel_SendRecv"),
])
def test_nccl_kernel_names(ctype: CollType, dtype: str, algo: str | None, name: str) -> None:
    """NCCL >= 2.19's kernel per (collective, type, algorithm), as Kineto writes it (NCCL's generated
    host_table.cc: ncclDevKernelForFunc)."""
    assert nccl_kernel_name(ctype, nccl_type(dtype), algo) == name + "(ncclDevKernelArgsStorage<4096ul>)"


def test_nccl_type_falls_back_on_element_size() -> None:
    assert nccl_type(None, 2) == "bf16" and nccl_type("weird", 8) == "f64" and nccl_type(None) == "f32"
