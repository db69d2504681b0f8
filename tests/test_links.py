"""Per-link traffic of a replay (``summary.json["links"]``, cosim/replay/links.py): memcpys on their PCIe
route in both collective modes, measured collectives decomposed by the engine, and no change to any
replayed time."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import cosim.replay.api as api
from cosim.replay import ReplayConfig, replay
from cosim.replay.links import EngineRoutes
from cosim.resources import shared_dir
from cosim.topology import load_topology
from cosim.workload import load_trace
from tests._link_rows import link_data, prev_ends

US = 1e-6
T0 = 1000.0
H2D_BYTES = 4 * 2**20
D2H_BYTES = 2**20
DLRM = "param-dlrm-v100x8/kineto"


def _ev(cat: str, name: str, ts: float, dur: float, pid: int = 1, tid: int = 1, **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": T0 + ts, "dur": dur, "args": args}


def _copy_trace(path: Path) -> Path:
    """One step: an H2D copy of 4 MiB (100 us), a kernel, a D2H copy of 1 MiB (50 us)."""
    gpu = {"device": 0, "stream": 7}
    ev = [
        _ev("user_annotation", "ProfilerStep#1", 0, 1000),
        _ev("cuda_runtime", "cudaMemcpyAsync", 10, 5, correlation=1),
        _ev("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 20, 100, 0, 7, correlation=1, bytes=H2D_BYTES, **gpu),
        _ev("cuda_runtime", "cudaLaunchKernel", 20, 5, correlation=2),
        _ev("kernel", "void k1_elementwise_kernel", 130, 40, 0, 7, correlation=2, grid=[1, 1, 1],
            block=[128, 1, 1], **gpu),
        _ev("cuda_runtime", "cudaMemcpyAsync", 30, 5, correlation=3),
        _ev("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 175, 50, 0, 7, correlation=3, bytes=D2H_BYTES, **gpu),
        _ev("cuda_runtime", "cudaStreamSynchronize", 40, 190, correlation=4),
    ]
    doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}], "traceEvents": ev}
    path.write_text(json.dumps(doc))
    return path


def _links(s: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(x["src"], x["dst"]): x for x in s["links"]}


def _no_attribution(monkeypatch: pytest.MonkeyPatch) -> None:
    """Replay with the link attribution switched off (no fabric recorder, no link usage)."""
    monkeypatch.setattr(api, "record_fabric", lambda fabric, usage: lambda: None)
    monkeypatch.setattr(api, "replay_link_usage", lambda *a, **k: (None, {}))


def _times(res: Any) -> list[tuple[np.ndarray, ...]]:
    return [(r.gpu_start, r.gpu_end, r.host_start, r.host_end) for r in res.runs]


def _assert_same_times(a: Any, b: Any) -> None:
    assert a.summary()["step_time_s"] == b.summary()["step_time_s"]
    assert [r["step_time_s"] for r in a.summary()["ranks"]] == [r["step_time_s"] for r in b.summary()["ranks"]]
    for x, y in zip(_times(a), _times(b)):
        for u, v in zip(x, y):
            assert np.array_equal(u, v, equal_nan=True)


@pytest.mark.parametrize("mode", ["measured", "simulated"])
def test_memcpy_bytes_on_the_pcie_route(tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """H2D: cpu0 -> pcie0 -> gpu0 carries the 4 MiB for exactly the copy's 100 us; D2H: gpu0 -> pcie0 -> cpu0
    the 1 MiB for 50 us (dgx-h100: gpu0 hangs off PCIe switch pcie0 under cpu0). The copies keep their times."""
    topo = load_topology("dgx-h100")
    assert topo.route("gpu0", topo.cpu_of("gpu0")) == ["gpu0", "pcie0", "cpu0"]
    g = load_trace(_copy_trace(tmp_path / "t.json"))
    cfg = ReplayConfig(collectives=mode, launch_latency=5 * US, kernel_gap=2 * US, sync_overhead=0.0)
    res = replay(g, topo, cfg)
    s = res.summary()
    G, run = res.graph.ranks[0].gpu_ops, res.runs[0]
    dur = run.gpu_end - run.gpu_start
    assert dur.tolist() == pytest.approx([100 * US, 40 * US, 50 * US], abs=1e-12)  # measured durations kept
    lk = _links(s)
    assert set(lk) == {("cpu0", "pcie0"), ("pcie0", "gpu0"), ("gpu0", "pcie0"), ("pcie0", "cpu0")}
    end = float(max(run.gpu_end.max(), run.host_end.max()))
    for key, nb, busy in ((("cpu0", "pcie0"), H2D_BYTES, 100 * US), (("pcie0", "gpu0"), H2D_BYTES, 100 * US),
                          (("gpu0", "pcie0"), D2H_BYTES, 50 * US), (("pcie0", "cpu0"), D2H_BYTES, 50 * US)):
        x = lk[key]
        assert x["bytes"] == nb and x["memcpy_bytes"] == nb, key
        assert x["busy_time_s"] == pytest.approx(busy, abs=1e-12), key
        assert x["peak_flows"] == 1
        assert x["capacity_Bps"] == pytest.approx(64e9 * 0.87)  # pcie5x16 x its efficiency
        assert x["utilization"] == pytest.approx(nb / (x["capacity_Bps"] * end), rel=1e-9)
    # the interval is the copy's replayed one
    usage = res.link_usage
    i = usage.link_id[("cpu0", "pcie0")]
    h2d = int(np.flatnonzero(G.copy_kind == 1)[0])
    a, b = float(run.gpu_start[h2d]), float(run.gpu_end[h2d])
    assert usage.busy(a, b)[i] == pytest.approx(b - a, abs=1e-15) and usage.busy(-1.0, a)[i] == 0.0
    assert usage.bytes_in(a, (a + b) / 2)[i] == pytest.approx(H2D_BYTES / 2)
    # attribution off: every replayed time is the same, bit for bit
    _no_attribution(monkeypatch)
    off = replay(g, topo, cfg)
    assert off.summary()["links"] == []
    _assert_same_times(res, off)


def test_engine_routes_equal_a_simulated_collective() -> None:
    """The measured-mode decomposition is the engine's: bytes per link of an 8-GPU all-reduce and a
    4-GPU all-to-allv equal the fabric counters of the same collective run for real."""
    from cosim.engine import SimConfig, Simulator

    topo = load_topology("dgx-h100")
    er = EngineRoutes(topo)
    m = [[0.0 if i == j else (i + 1) * 1e6 + j * 1e5 for j in range(4)] for i in range(4)]
    for op, gpus, nb, matrix in (("all_reduce", topo.gpus, 48e6, None), ("all_to_allv", topo.gpus[:4], 0.0, m)):
        idx, wire, flows = er.collective(op, gpus, nb, matrix)
        sim = Simulator(topo, SimConfig(record_trace=False))
        if matrix is None:
            sim.collective(op, gpus, nb)
        else:
            sim.collective(op, gpus, matrix=matrix)
        sim.run()
        want = {(x.src, x.dst): x for x in sim.fabric.link_stats() if x.bytes > 0}
        got = {er.fabric.links[i]: (w, f) for i, w, f in zip(idx.tolist(), wire.tolist(), flows.tolist())}
        assert set(got) == set(want)
        for k, (w, f) in got.items():
            assert w == pytest.approx(want[k].bytes, rel=1e-9)
            assert f == want[k].peak_flows


@pytest.mark.parametrize("op", ["all_to_all", "all_reduce", "all_gather"])
def test_analytic_attribution_equals_solved_probe_across_nodes(op: str) -> None:
    """dgx-h100-4node (32 GPUs, rail-optimized): the analytic attribution (no rate solve) puts the same
    wire bytes and peak flows on every link as running the collective on the scratch fabric."""
    topo = load_topology("dgx-h100-4node")
    a, b = EngineRoutes(topo), EngineRoutes(topo, solve=True)
    solves = b.fabric.n_solves
    for nb in (1e6, 256e6):
        ia, wa, fa = a.collective(op, topo.gpus, nb)
        ib, wb, fb = b.collective(op, topo.gpus, nb)
        assert ia.tolist() == ib.tolist()
        assert wa == pytest.approx(wb, rel=1e-9)
        assert fa.tolist() == fb.tolist()
    assert a.fabric.n_solves == 0 and b.fabric.n_solves > solves


@pytest.fixture(scope="module")
def dlrm() -> Any:
    root = shared_dir()
    if root is None or not (root / "traces" / DLRM).exists():
        pytest.skip("../shared not found: DLRM link test skipped (set COSIM_SHARED)")
    return load_trace(root / "traces" / DLRM)


def test_dlrm_measured_collectives_put_bytes_on_links(dlrm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """8 V100 ranks with measured collectives (the default of ``cosim replay``): NVLink (and the PCIe/UPI
    hops the topology routes some pairs over) carry the bytes of the engine's decomposition of every
    collective, i.e. the same bytes per link as the simulated-collectives replay puts on the fabric; the
    H2D/D2H copies are on PCIe in both modes; replayed times are unchanged."""
    meas = replay(dlrm, config=ReplayConfig(collectives="measured"))
    sim = replay(dlrm, config=ReplayConfig(collectives="simulated"))
    lm, ls = _links(meas.summary()), _links(sim.summary())
    assert meas.summary()["topology"] == "dgx1-v100"
    assert set(lm) == set(ls) and len(lm) == 58
    for k, x in ls.items():
        assert lm[k]["bytes"] == pytest.approx(x["bytes"], rel=1e-9), k
        assert lm[k]["memcpy_bytes"] == x["memcpy_bytes"], k
    topo = meas.topology
    nvl = [k for k in lm if topo.graph.edges[k]["link"].startswith("nvlink")]
    assert len(nvl) == 32  # every directed NVLink of the hybrid cube mesh
    nv_bytes = sum(lm[k]["bytes"] for k in nvl)
    assert nv_bytes == pytest.approx(sum(ls[k]["bytes"] for k in nvl), rel=1e-12)
    from cosim.engine import load_params

    # wire bytes: the collectives' payload (26.508 MB) / the fitted Simple efficiency
    assert nv_bytes == pytest.approx(26.5078e6 / load_params().fitted.efficiency["simple"], rel=1e-4)
    assert all(lm[k]["memcpy_bytes"] == 0 and lm[k]["busy_time_s"] > 0 for k in nvl)
    # the copies: per rank 31,112 B H2D + 216 B D2H over two hops each (the one D2D per rank stays on the GPU)
    assert lm[("pcie0", "gpu0")]["memcpy_bytes"] == 31112 and lm[("gpu0", "pcie0")]["memcpy_bytes"] == 216
    assert lm[("cpu0", "pcie0")]["memcpy_bytes"] == 2 * 31112  # gpu0 and gpu1 share PCIe switch pcie0
    assert sum(x["memcpy_bytes"] for x in lm.values()) == 8 * (31112 + 216) * 2
    # simulated mode: links without copies keep the fabric's own counters
    fab = {(x.src, x.dst): x for x in _fabric_stats(dlrm)}
    for k, x in ls.items():
        if x["memcpy_bytes"] == 0:
            assert x["bytes"] == fab[k].bytes and x["peak_flows"] == fab[k].peak_flows
            assert x["busy_time_s"] == pytest.approx(fab[k].busy_time, rel=1e-9)
    _no_attribution(monkeypatch)
    _assert_same_times(meas, replay(dlrm, config=ReplayConfig(collectives="measured")))
    _assert_same_times(sim, replay(dlrm, config=ReplayConfig(collectives="simulated")))


def _fabric_stats(g: Any) -> list[Any]:
    """The fabric's own link counters of a simulated-collectives replay of ``g``."""
    from cosim.engine import Simulator

    seen: list[Any] = []
    orig = Simulator.__init__

    def init(self: Any, *a: Any, **k: Any) -> None:
        orig(self, *a, **k)
        if k.get("env") is not None:
            seen.append(self)

    Simulator.__init__ = init  # type: ignore[method-assign]
    try:
        replay(g, config=ReplayConfig(collectives="simulated"))
    finally:
        Simulator.__init__ = orig  # type: ignore[method-assign]
    (sim,) = seen
    return sim.fabric.link_stats()


def _random_usage(rng: np.random.Generator, n_links: int, parts: int, n: int, used: int,
                  counts: Callable[[np.random.Generator, int], np.ndarray]) -> tuple[Any, list[tuple[int, float, float, float]]]:
    """A LinkUsage of ``n_links`` links fed ``parts`` parts of ``n`` random integer intervals on the first
    ``used`` links (zero-length ones too; flow counts from ``counts``), and the (link, start, end, count) rows."""
    from cosim.replay.links import COLLECTIVE, LinkUsage

    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(n_links)], np.ones(n_links))
    rows: list[tuple[int, float, float, float]] = []
    for _ in range(parts):
        lk = rng.integers(0, used, n)
        s = rng.integers(0, 20, n).astype(float)
        e = s + rng.integers(0, 5, n)
        c = counts(rng, n)
        u.add(lk, s, e, c, np.ones(n), COLLECTIVE)
        rows += list(zip(lk.tolist(), s.tolist(), e.tolist(), c.tolist()))
    return u, rows


def _swept_peak(mine: list[tuple[float, float, float]]) -> float:
    """The largest summed count over the integer instants 0..24 of intervals ``[s, e)`` (0 when none)."""
    return max((sum(c for s, e, c in mine if s <= t < e) for t in range(25)), default=0)


def test_peak_and_busy_equal_a_brute_force_sweep() -> None:
    """LinkUsage.peak (per-link sorted ends) and busy against a direct evaluation at every instant: ties of
    starts and ends (ends first), empty and zero-length intervals, several parts out of order."""
    n_links = 6
    u, rows = _random_usage(np.random.default_rng(7), n_links, parts=4, n=60, used=n_links - 1,
                            counts=lambda r, n: r.integers(1, 4, n).astype(float))  # the last link stays empty
    peak, busy = u.peak(), u.busy()
    for k in range(n_links):
        mine = [(s, e, c) for lk, s, e, c in rows if lk == k and e > s]
        assert peak[k] == _swept_peak(mine)
        covered = sum(1 for t in range(25) if any(s <= t < e for s, e, _c in mine))
        assert busy[k] == covered


@pytest.mark.parametrize("chunk, step", [(16, 1.0), (1 << 21, 0.25)])
def test_peak_over_classes_and_chunks_equals_a_brute_force_sweep(chunk: int, step: float,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """LinkUsage.peak of integer counts (every class at once, here in chunks of a few classes) and of fractional
    counts (class by class) against a direct evaluation at every instant."""
    from cosim.replay.links import LinkUsage

    monkeypatch.setattr(LinkUsage, "_CHUNK", chunk)
    n_links = 9
    u, rows = _random_usage(np.random.default_rng(11), n_links, parts=5, n=40, used=n_links,
                            counts=lambda r, n: r.integers(1, 8, n) * step)
    peak = u.peak()
    for k in range(n_links):
        mine = [(s, e, c) for lk, s, e, c in rows if lk == k and e > s]
        assert peak[k] == round(_swept_peak(mine))


def test_windowed_bytes_equal_the_per_interval_fractions() -> None:
    """bytes_in computes the fraction only for intervals crossing a window end; bit for bit the sum of every
    interval's bytes times its clipped fraction (empty intervals: all or nothing; NaN ends: nothing)."""
    import math

    from cosim.replay.links import COLLECTIVE, LinkUsage

    rng = np.random.default_rng(7)
    n = 400
    lk = rng.integers(0, 6, n)
    s = rng.integers(0, 40, n).astype(float) + rng.choice([0.0, 0.5], n)
    e = s + rng.integers(0, 5, n)
    e[::37] = math.nan
    nb = rng.integers(1, 1000, n).astype(float) * 1.37
    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(6)], np.ones(6))
    u.add(lk, s, e, np.ones(n), nb, COLLECTIVE)
    lks, ss, es, _c, nbs, *_ = link_data(u)
    for a, b in ((3.0, 17.5), (0.5, 0.5), (10.25, 60.0), (-5.0, 12.0)):
        d = es - ss
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(d > 0, (np.minimum(es, b) - np.maximum(ss, a)) / d, ((ss >= a) & (ss <= b)).astype(float))
        want = np.bincount(lks, weights=nbs * np.clip(np.nan_to_num(frac), 0.0, 1.0), minlength=6)
        assert np.array_equal(u.bytes_in(a, b), want)


def test_windowed_figures_from_the_crossing_intervals_are_bit_for_bit() -> None:
    """busy(a, b) and bytes_in(a, b) look only at the intervals crossing the window (plus empty ones and
    non-finite bytes) when every time is finite: bit for bit the sums over every interval in (link, start)
    order; parts added as scalars or arrays, and more parts after a first report, sort like one lexsort."""
    import math

    from cosim.replay.links import COLLECTIVE, MEMCPY, LinkUsage

    rng = np.random.default_rng(11)
    nl = 7
    u = LinkUsage([(f"a{i}", f"b{i}") for i in range(nl)], np.ones(nl))
    rows: list[np.ndarray] = []

    def add(n: int, scalar_end: bool, src: int) -> None:
        lk = rng.integers(0, nl - 1, n)
        s = rng.random(n) * 30.0
        e: Any = float(rng.random() * 40.0) if scalar_end else s + rng.random(n) * 3.0 - 0.2  # some reversed
        nb = rng.random(n) * 1e6
        nb[rng.random(n) < 0.05] = math.inf
        u.add(lk, s, e, 1.0, nb, src, count_bytes=src == MEMCPY)
        rows.append(np.stack([lk, s, np.broadcast_to(e, (n,)), nb]))

    for k in range(6):
        add(80, k % 3 == 0, COLLECTIVE)
    u.busy()  # a first report, then more parts
    add(50, False, MEMCPY)
    add(30, True, COLLECTIVE)
    allr = np.concatenate(rows, axis=1)
    o = np.lexsort((allr[1], allr[0]))
    lk, s, e, _c, nb, _src, _off = link_data(u)
    assert np.array_equal(lk, allr[0][o].astype(np.int64)) and np.array_equal(s, allr[1][o])
    assert np.array_equal(e, allr[2][o]) and np.array_equal(nb, allr[3][o])
    prev = prev_ends(u)
    for a, b in ((3.0, 17.5), (0.5, 0.5), (10.25, 60.0), (-5.0, 12.0), (29.0, 29.5)):
        want_busy = np.bincount(lk, weights=np.maximum(np.clip(e, a, b) - np.maximum(np.clip(s, a, b),
                                                                                     np.clip(prev, a, b)), 0.0),
                                minlength=nl)
        assert np.array_equal(u.busy(a, b), want_busy)
        d = e - s
        with np.errstate(divide="ignore", invalid="ignore"):
            frac = np.where(d > 0, (np.minimum(e, b) - np.maximum(s, a)) / d, ((s >= a) & (s <= b)).astype(float))
            w = np.where((d > 0) & (s >= a) & (e <= b), nb, nb * np.clip(np.nan_to_num(frac), 0.0, 1.0))
        want = np.bincount(lk, weights=w, minlength=nl)
        got = u.bytes_in(a, b)
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.array_equal(got[~np.isnan(got)], want[~np.isnan(want)])


def test_rank_static_is_kept_on_its_program() -> None:
    """links.rank_static's answer lives on the compiled program (RankProgram.link_static): worked out once, the
    same object at the next call, and freed with the program (no process-wide memo)."""
    from cosim.replay import links
    from cosim.replay.program import compile_program

    rg = load_trace(Path(__file__).parent / "data" / "workload" / "ns_epoch.json", cache=False).ranks[0]
    prog = compile_program(rg, ReplayConfig(), 4e-6, rg.gpu_ops.dur)
    assert prog.link_static is None
    got = links.rank_static(prog, rg)
    assert prog.link_static is got and links.rank_static(prog, rg) is got
    assert got[0] == np.flatnonzero(rg.gpu_ops.collective >= 0).tolist()
    assert not hasattr(links, "_STATIC")
