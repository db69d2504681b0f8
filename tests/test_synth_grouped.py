"""Grouped GEMMs timed from their per-group sizes (synthesis -> kernel model).

A rank's expert GEMMs carry each local expert's rows (``Op.group_rows``); the kernel timer tiles each group
on its own and schedules the tiles of all groups in waves over the SMs
(:func:`cosim.models.synth_timing.grouped_gemm_time`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from cosim.capture.config import load_model_config
from cosim.catalog import load_catalog
from cosim.models.calibrated import GemmParams, HardwareFigures, gemm_time
from cosim.models.synth_timing import KernelTimer, grouped_gemm_time
from cosim.workload.synth.costs import PRECISIONS, Op, Shard, _gemm, backward_ops, layer_ops
from cosim.workload.synth.routing import RoutingSpec, route

# a toy GPU and GEMM parameters simple enough to work out by hand: 4 SMs of 1 TFLOP/s each, no small-tile
# penalty, 1 us per wave of tiles, 2 us floor
HW = HardwareFigures(sm_count=4, hbm_bandwidth=1e12, pcie_bandwidth=1e10, peaks={"bf16": 4e12})
P = GemmParams(efficiency=0.5, tile_overhead_s=1e-6, memory_efficiency=0.8, floor_s=2e-6, small_tile_alpha=0.0)


def _grouped(rows: list[float], m: float, n: float, k: float, group_k: bool = False, nbytes: float = 0.0,
             hw: HardwareFigures = HW, p: GemmParams = P) -> float:
    return float(grouped_gemm_time(np.array([rows], dtype=float), np.array([m]), np.array([n]), np.array([k]),
                                   np.array([group_k]), np.array([nbytes]), hw.peak("bf16"), hw, p)[0])


def _expert_ops(ops: list[Op]) -> list[Op]:
    return [o for o in ops if o.name.startswith(("moe.experts_fc1", "moe.experts_fc2"))]


def test_two_experts_are_the_sum_of_their_two_gemms_on_one_sm() -> None:
    # one SM: every tile is a wave of its own, so the grouped GEMM is the two GEMMs back to back (one floor).
    # rows 256 and 512, N = 256, K = 128 (no split-K: K/s >= 128 only for s = 1). The fewest tiles win
    # (the FLOPs are the same for every tile that divides the shape): 256x128 gives 1 + 2 = 3 row tiles
    # x 2 column tiles = 6 tiles, each 1 us + 2*256*128*128 / (1e12 * 0.5) s = 1 us + 16.777216 us.
    one = HardwareFigures(sm_count=1, hbm_bandwidth=1e12, pcie_bandwidth=1e10, peaks={"bf16": 1e12})
    per_tile = 1e-6 + 2 * 256 * 128 * 128 / (1e12 * 0.5)
    want = 2e-6 + 6 * per_tile
    assert _grouped([256, 512], 384, 256, 128, hw=one) == pytest.approx(want, rel=1e-12)
    # = the GEMM model's two shapes timed alone, less the second floor
    alone = gemm_time(np.array([256.0, 512.0]), np.array([256.0] * 2), np.array([128.0] * 2), np.ones(2),
                      np.zeros(2), 1e12, one, P)
    assert float(alone.sum()) - P.floor_s == pytest.approx(want, rel=1e-12)
    # the wgrad of groups of 256 and 512 rows (K per group), M = N = 256: 2 tiles of 256x128 per group, the
    # tiles' mean K (2*256 + 2*512) / 4 = 384; split-K would only add waves on one SM
    want_w = 2e-6 + 4 * (1e-6 + 2 * 256 * 128 * 384 / (1e12 * 0.5))
    assert _grouped([256, 512], 256, 256, 384, group_k=True, hw=one) == pytest.approx(want_w, rel=1e-12)
    alone_w = gemm_time(np.array([256.0] * 2), np.array([256.0] * 2), np.array([256.0, 512.0]), np.ones(2),
                        np.zeros(2), 1e12, one, P)
    assert float(alone_w.sum()) - P.floor_s == pytest.approx(want_w, rel=1e-12)


def test_single_launch_wave_rule_one_row_groups() -> None:
    # groups of one row each, N = 32, K = 128: every group is one tile (32x64 or 64x32), the tiles of all
    # groups fill waves of 4 SMs: 1..4 groups one wave, 5..8 two, 9 three; a wave is
    # 1 us + 2*64*32*128 / (1e12 * 0.5) s
    wave = 1e-6 + 2 * 64 * 32 * 128 / (1e12 * 0.5)
    for g, waves in ((1, 1), (3, 1), (4, 1), (5, 2), (8, 2), (9, 3)):
        rows = [1.0] * g + [0.0] * (9 - g)  # experts that got no row launch no tile
        assert _grouped(rows, g / 9, 32, 128) == pytest.approx(2e-6 + waves * wave, rel=1e-12), g
    # 8 experts of one row are 8 tiles (2 waves), not one 8-row tile (1 wave)
    eight = gemm_time(np.array([8.0]), np.array([32.0]), np.array([128.0]), np.ones(1), np.zeros(1), 4e12, HW, P)
    assert _grouped([1.0] * 8, 1.0, 32, 128) == pytest.approx(float(eight[0]) + wave, rel=1e-12)


@pytest.mark.parametrize("rows,n,k", [(4096.0, 1536.0, 2048.0), (300.5, 4096.0, 7168.0), (1.0, 4096.0, 7168.0)])
def test_equal_groups_are_the_batched_gemm_model(rows: float, n: float, k: float) -> None:
    acc = load_catalog().accelerator("h100-sxm5")
    kt = KernelTimer(acc)
    hw = HardwareFigures.of(acc)
    p = kt._model_profile.params("grouped_gemm", "bf16")
    assert isinstance(p, GemmParams)
    fwd = replace(_gemm("x", rows, n, k, PRECISIONS["bf16"], batch=8, cls="grouped_gemm"), group_rows=(rows,) * 8)
    for o in [fwd, *backward_ops([fwd])]:
        batched = gemm_time(np.array([o.m]), np.array([o.n]), np.array([o.k]), np.array([8.0]), np.array([o.bytes]),
                            hw.peak("bf16"), hw, p)
        assert _grouped(list(o.group_rows), o.m, o.n, o.k, o.group_k, o.bytes, hw, p) == float(batched[0])


def test_uniform_routing_times_as_before_and_backward_keeps_the_groups() -> None:
    card = load_model_config("deepseek-v3")
    ops = layer_ops(card, 5, 4096.0, 4096.0, Shard(ep=8, etp=1), "fp8")
    ops = ops + backward_ops(ops)
    experts = _expert_ops(ops)
    assert len(experts) == 6
    kt = KernelTimer(load_catalog().accelerator("h100-sxm5"))
    for o in experts:
        assert len(o.group_rows) == card.num_experts // 8 and len(set(o.group_rows)) == 1
        assert o.group_k == o.name.endswith(".wgrad")
    # equal groups: the same durations as the op without its groups (the batched shape at the mean)
    assert kt(ops) == kt([replace(o, group_rows=()) for o in ops])


def test_zipf_hot_rank_is_slower_than_at_its_mean() -> None:
    card = load_model_config("deepseek-v3")
    ep, tokens = 8, 512.0  # 32 local experts, 17.6 to 3481 rows on the hot rank
    r = route(RoutingSpec(model="zipf:1.1"), card, 5, ep, tokens)
    hot = int(np.argmax([x.sum() for x in r.rows]))
    rows = [float(x) for x in r.rows[hot]]
    assert len(set(rows)) > 1
    ops = layer_ops(card, 5, tokens, 4096.0, Shard(ep=ep, expert_tokens=rows), "fp8")
    ops = _expert_ops(ops + backward_ops(ops))
    fc1 = next(o for o in ops if o.name == "moe.experts_fc1")
    # FLOPs stay the exact sum over the groups
    assert fc1.flops == pytest.approx(sum(2 * x * fc1.n * fc1.k for x in rows), rel=1e-12)
    kt = KernelTimer(load_catalog().accelerator("h100-sxm5"))
    grouped = kt(ops)
    at_mean = kt([replace(o, group_rows=()) for o in ops])
    assert sum(grouped) > 1.03 * sum(at_mean)  # +4.4%: the small experts' partly filled tiles
    assert all(g >= a for g, a in zip(grouped, at_mean))
    # one timer call over ops of equal groups times them alike (deduplicated)
    assert kt(ops + ops) == grouped + grouped


def test_uneven_groups_keep_the_blackwell_ceiling() -> None:
    """On a B200 (H100 profile through the Blackwell rule: ``max_throughput`` 0.64 of the BF16 peak) a large
    grouped GEMM runs on the sustained-clock ceiling whether its groups are equal (the batched GEMM model) or
    differ by a row: 4 experts x 32768 rows, N = 5760, K = 2880 (gpt-oss-like), 2 sum_g M_g N K / (0.64 x
    2.25 PFLOP/s) + the floor. Before, uneven groups skipped the ceiling and ran at 0.69 of the peak."""
    acc = load_catalog().accelerator("b200")
    kt = KernelTimer(acc)
    p = kt._model_profile.params("grouped_gemm", "bf16")
    assert isinstance(p, GemmParams) and p.max_throughput == pytest.approx(0.64)
    M, N, K = 32768.0, 5760.0, 2880.0
    flops = 2 * 4 * M * N * K
    base = replace(_gemm("x", M, N, K, PRECISIONS["bf16"], batch=4, cls="grouped_gemm"), group_rows=(M,) * 4)
    uneven = replace(base, group_rows=(M + 1, M - 1, M, M))
    want = p.floor_s + flops / (0.64 * 2.25e15)
    for got in kt([base, uneven]):
        assert got == pytest.approx(want, rel=1e-9)


def test_one_candidate_function_counts_groups_as_columns_or_counts() -> None:
    """gemm_tile_waves, shared by gemm_time and grouped_gemm_time: a group counted 3 times (a batched GEMM) is
    three columns of it (a grouped GEMM), and an empty column launches nothing: both forms give the same time,
    worked by hand on the toy GPU (3 groups of 128 x 64, K 128, on 4 SMs)."""
    from cosim.models.calibrated import gemm_tile_waves

    n, k = np.array([64.0]), 128.0
    peak_sm = np.array([HW.peak("bf16") / HW.sm_count])
    counted = gemm_tile_waves(np.array([[128.0]]), np.array([[k]]), np.array([[3.0]]), n, 8.0 * 3 * 128 * n,
                              peak_sm, HW, P)
    columns = gemm_tile_waves(np.array([[128.0] * 3 + [0.0]]), np.array([[k] * 4]), np.array([[1.0] * 3 + [0.0]]),
                              n, 8.0 * 3 * 128 * n, peak_sm, HW, P)
    assert counted[0] == columns[0]
    # by hand: one 128 x 64 tile per group, 3 tiles on 4 SMs = 1 wave of 1 us + 2*128*64*128 FLOP / (1e12 * 0.5)
    # = 5.194 us; 64 x 64 tiles: 6 tiles, 2 waves of 1 + 2.097 us = 6.19 us; 64 x 32: 3 waves, 6.15 us; 256 x 128:
    # 1 wave of 17.8 us; no split-K (K / 2 < 128)
    assert counted[0] == pytest.approx(1e-6 + 2 * 128 * 64 * 128 / (1e12 * 0.5), rel=1e-12)
