"""Each communication kernel holds its own SMs (cosim.replay.interference, round 8): the NCCL channel count of a
call (cosim.engine.nccl.NcclParams.kernel_channels), DeepEP's 20, HybridEP's label; the law takes the sum of the
active kernels' SMs; default-on for synthesized training steps (``gpu.comm_share=off`` turns it off). Worked by
hand on the engine's clock and on a synthesized 2-layer step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import simpy
import yaml

from cosim.engine.nccl import load_params
from cosim.replay import ReplayConfig, apply_sets, replay
from cosim.replay.interference import COMM, COMPUTE, DEEPEP_SMS, GpuShare, comm_kernel_sms, sm_rate, wave_slowdown
from cosim.workload.graph import OpClass
from tests._cards import synth_tiny

US = 1e-6


def test_wave_slowdown_worked_by_hand() -> None:
    """Waves on the free SMs over waves alone (validation/overlap's forum case): 132 CTAs on an H100 beside a
    24-CTA all-gather: 1 wave alone, ceil(132 / 108) = 2 beside it; 100 CTAs still fit in one wave (no slowdown,
    where the fluid law says 1.22x); a persistent kernel's 132 CTAs (one per SM, equal work) also 2x; many waves
    tend to the fluid S / (S - c); two CTAs per SM halve the waves; nothing held: 1."""
    assert wave_slowdown(132, 132, 24) == 2.0
    assert wave_slowdown(100, 132, 24) == 1.0
    assert wave_slowdown(1320, 132, 24) == pytest.approx(13 / 10)
    fluid = 1.0 / sm_rate(132, 1, 24)
    assert abs(wave_slowdown(132 * 1000, 132, 24) - fluid) < 1e-3 * fluid
    assert wave_slowdown(264, 132, 24, per_sm=2) == 2.0
    assert wave_slowdown(132, 132, 0) == 1.0
    assert wave_slowdown(132, 132, 500) == 132.0  # one SM stays free
    assert wave_slowdown(0, 132, 24) == 1.0


def test_overlap_cases_score_the_waves_held_out() -> None:
    """validation/overlap: the forum case's 132-CTA GEMM scores 2.0x with waves (fluid 1.22x); the arXiv mean, which
    gives no CTA count, has no waves figure."""
    from validation.overlap.score import HERE, law, waves

    cases = {c["id"]: c for c in yaml.safe_load((HERE / "cases.yaml").read_text())["cases"]}
    forum = cases["nvforum-h100-gemm-allgather-24cta"]
    assert waves(forum) == 2.0
    assert law(forum)[0] == pytest.approx(132 / 108)
    assert waves(cases["arxiv2507.03114-mean-overlap-slowdown"]) is None


def test_kernel_channels_follow_nccls_rules() -> None:
    """16 channels (cosim's H100 communicator); a ring/tree call keeps one per 32 KiB (Simple: 512 threads x
    threshold 64), at least 1; NVLS 16; p2p: pow2Up(16) = 16 per NVLink peer, 2 per network peer, one per 64 KiB,
    fewer per peer in a larger communicator."""
    p = load_params()
    assert p.channels == 16
    assert p.kernel_channels("all_gather", 64 * 2**20) == 16
    assert p.kernel_channels("reduce_scatter", 256 * 2**10) == 8  # 262144 / 32768
    assert p.kernel_channels("all_reduce", 100 * 2**10) == 3
    assert p.kernel_channels("all_reduce", 8) == 1
    assert p.kernel_channels("all_reduce", 64 * 2**20, channels=24) == 24
    assert p.kernel_channels("nvls", 1.0) == 16
    assert p.kernel_channels("send", 32 * 2**20) == 16
    assert p.kernel_channels("send", 32 * 2**20, cross_node=True) == 2
    assert p.kernel_channels("send", 100 * 2**10) == 2  # two 64 KiB parts
    # a pipeline send of 58 MB in a communicator of 4: 16 per peer halved to 4 (4 x 4 <= 16); parts of 14.5 MB
    # stay under the 16 MiB maximum: 4 channels; of 2 ranks: 8
    assert p.kernel_channels("send", 58e6, nranks=4) == 4
    assert p.kernel_channels("send", 58e6, nranks=2) == 8
    assert p.kernel_channels("send", 58e6, cross_node=True, nranks=4) == 2
    assert p.kernel_channels("all_to_allv", 32 * 2**20, cross_node=True) == 16
    assert p.kernel_channels("all_to_allv", 24, channels=20) == 1
    assert p.kernel_channels("all_to_allv", 64 * 2**20, channels=20) == 32  # pow2Up(20)


def _plan(op_sms: list[float], roles: list[int]) -> dict[str, object]:
    n = len(roles)
    return {"roles": np.array(roles), "h": np.zeros(n), "sms": np.ones(n, dtype=bool), "work": np.ones(n),
            "device": np.zeros(n, dtype=np.int64), "sm_count": 132.0, "comm_sms": 16.0, "h_comm": 0.0,
            "traced_comm_sms": 16.0, "op_sms": np.array(op_sms, dtype=float)}


def test_an_nccl_kernel_of_k_channels_stretches_a_gemm_exactly() -> None:
    """Two streams on an H100 (S = 132 SMs): a GEMM of 100 us standalone from t = 0; an all-gather of 64 MiB
    (k = 16 channels, 16 CTAs) over [20, 60] us. The GEMM runs 20 us alone, then 40 us at 116/132 (35.151515 us
    of work), then the remaining 44.848485 us alone: it ends at 104.848485 us. With a 256 KiB reduce-scatter
    (k = 8) instead: 40 x 124/132 = 37.575758 us of work, end 102.424242 us."""
    p = load_params()
    for nbytes, op, end in ((64 * 2**20, "all_gather", 60 + (100 - 20 - 40 * 116 / 132)),
                            (256 * 2**10, "reduce_scatter", 60 + (100 - 20 - 40 * 124 / 132))):
        k = p.kernel_channels(op, nbytes)
        env = simpy.Environment()
        share = GpuShare(env, {0: _plan([k, 0], [COMM, COMPUTE])})
        ends: dict[int, float] = {}
        share.start_comm(0, 0, 20 * US)
        share.end_comm(0, 0, 60 * US)
        share.start(0, 1, 0.0, 100 * US, lambda s, e, ends=ends: ends.__setitem__(1, e))
        env.run()
        assert ends[1] == pytest.approx(end * US, rel=1e-12)
    assert round(60 + (100 - 20 - 40 * 116 / 132), 6) == 104.848485


def test_the_law_takes_the_sum_of_the_active_kernels_sms() -> None:
    """A DeepEP dispatch (20 SMs) over [0, 50] and a 2-channel send (PP, across nodes) over [10, 30] beside a
    GEMM of 100 us from 0: 10 us at 112/132, 20 us at 110/132, 20 us at 112/132, then alone. Work done by 50 us:
    (30 x 112 + 20 x 110) / 132 = 42.121212 us; end = 50 + 57.878788 = 107.878788 us (not 2 x 20 SMs)."""
    env = simpy.Environment()
    share = GpuShare(env, {0: _plan([DEEPEP_SMS, 2, 0], [COMM, COMM, COMPUTE])})
    ends: dict[int, float] = {}
    share.start_comm(0, 0, 0.0)
    share.end_comm(0, 0, 50 * US)
    share.start_comm(0, 1, 10 * US)
    share.end_comm(0, 1, 30 * US)
    share.start(0, 2, 0.0, 100 * US, lambda s, e: ends.__setitem__(2, e))
    env.run()
    assert ends[2] == pytest.approx((50 + 100 - (30 * 112 + 20 * 110) / 132) * US, rel=1e-12)


def _tiny(tmp_path: Path, topo: object, **layout: object) -> object:
    return synth_tiny(tmp_path, topo, layout={"ep": 4, "grad_bucket_params": 20000, **layout})


def test_each_kernel_of_a_synthesized_step_reads_its_own_sms(tmp_path: Path, dgx: object) -> None:
    """The tiny step's NCCL calls are all below 64 KiB: one channel each (the gradient reduce-scatter of bucket A:
    29376 bf16 parameters = 58752 B -> 1); compute ops hold none; the dispatcher's local permutation kernels
    (dispatch/combine class, no collective) are no communication kernels (-1: run as memory-bound compute)."""
    syn = _tiny(tmp_path, dgx)
    rg = syn.graph.ranks[0]  # type: ignore[attr-defined]
    sms = comm_kernel_sms(rg, load_params(), None, 8)
    comm = np.isin(rg.gpu_ops.cls, (OpClass.COLLECTIVE, OpClass.MOE_DISPATCH, OpClass.MOE_COMBINE))
    assert comm.any() and (sms[~comm] == 0).all()
    names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    rs = [j for j, n in enumerate(names) if n == "grad.dp_reduce_scatter"]
    assert rs and all(sms[j] == 1 for j in rs)
    coll = comm & (rg.gpu_ops.collective >= 0)
    assert set(sms[coll].tolist()) == {1.0}
    local = [names[j] for j in np.flatnonzero(comm & ~coll)]
    assert local and all(sms[comm & ~coll] == -1) and "moe.permute" in local


def test_the_switch_slows_the_overlapped_backward(tmp_path: Path, dgx: object) -> None:
    """The same step replayed with the law on (the default) and off: the compute kernels that overlap the
    gradient reduce-scatters and the expert all-to-alls end later with it on, never earlier; off, the step is
    the one before round 8."""
    syn = _tiny(tmp_path, dgx)
    cfg = ReplayConfig(collectives="simulated")
    on = replay(syn.graph, dgx, cfg)  # type: ignore[attr-defined]
    off = replay(syn.graph, dgx, apply_sets(cfg, {"gpu.comm_share": "off"}))  # type: ignore[attr-defined]
    assert any("hold their own SMs" in n for n in on.notes) and not any("own SMs" in n for n in off.notes)
    a, b = on.runs[0], off.runs[0]
    rg = syn.graph.ranks[0]  # type: ignore[attr-defined]
    names = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    dur_on, dur_off = a.gpu_end - a.gpu_start, b.gpu_end - b.gpu_start
    compute = ~np.isin(rg.gpu_ops.cls, (OpClass.COLLECTIVE, OpClass.MOE_DISPATCH, OpClass.MOE_COMBINE,
                                         OpClass.MEMCPY))
    assert (dur_on[compute] >= dur_off[compute] - 1e-12).all()
    stretched = [names[j] for j in np.flatnonzero(compute & (dur_on > dur_off * (1 + 1e-9)))]
    assert stretched and any(".bwd" in n or "dgrad" in n or "wgrad" in n for n in stretched)
    assert a.gpu_end.max() >= b.gpu_end.max()  # the tiny step is host-bound: its end may not move
    with pytest.raises(Exception, match="on or off"):
        apply_sets(cfg, {"gpu.comm_share": "maybe"})
