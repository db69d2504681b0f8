"""Held-out EP communication times: the Megatron-Core MoE report's Table 7 (arXiv:2603.07685v1, section 4.2.2:
"EP Scaling Performance for HybridEP and all-to-all (in us)", hidden 7168, sequence 4096, 256 experts; DeepSeek-V3's
top-8), against cosim's NCCL all-to-all and HybridEP models. Nothing here is fitted; validation/e2e/RESULTS.md
("Round 13: held out, Megatron-Core MoE report") has every row of the table.

The all-to-all column is Megatron-Core's alltoall dispatcher: the permutation copies each token once per selected
expert, so each rank sends 4096 x 8 rows of 7168 BF16 values (448 MiB, its own share included) in one all-to-all."""

from __future__ import annotations

import pytest

from cosim.cli.collective import pick_ranks
from cosim.engine import SimConfig, Simulator
from cosim.engine.moe_comm import MoeCommResult, hybridep, hybridep_rates
from cosim.topology import load_topology

TOKENS, HIDDEN, TOPK, EXPERTS = 4096, 7168, 8, 256
A2A_BYTES = TOKENS * TOPK * HIDDEN * 2  # 469762048 = 448 MiB per rank


def _nccl_all_to_all(topology: str, ranks: int, per_node: int) -> float:
    from cosim.engine.collectives import CollectiveResult

    topo = load_topology(topology)
    sim = Simulator(topo, SimConfig(record_trace=False))
    ev = sim.collective("all_to_all", pick_ranks(topo, ranks, per_node), A2A_BYTES)
    sim.run()
    assert isinstance(ev.value, CollectiveResult)
    return float(ev.value.time)


def _hybridep_dispatch(topology: str, ranks: int, per_node: int, sms: int) -> float:
    topo = load_topology(topology)
    sim = Simulator(topo, SimConfig(record_trace=False))
    ev = hybridep(sim, "dispatch", pick_ranks(topo, ranks, per_node), num_tokens=TOKENS, hidden=HIDDEN,
                  num_topk=TOPK, num_experts=EXPERTS, rates=hybridep_rates(sms))
    sim.run()
    assert isinstance(ev.value, MoeCommResult)
    return float(ev.value.time)


def test_h100_intranode_all_to_all_against_table7() -> None:
    """EP8 on one DGX H100: Table 7 prints 1265 us (dispatch) and 1277 us (combine); cosim's NCCL all-to-all of
    the same bytes is within 6% of both (1216 us when this test was written: 386 GB/s of algorithm bandwidth)."""
    t = _nccl_all_to_all("dgx-h100", 8, 8)
    for published in (1265e-6, 1277e-6):
        assert abs(t / published - 1.0) <= 0.06


@pytest.mark.parametrize("ep,published", [(8, 391e-6), (64, 675e-6)])
def test_gb200_hybridep_dispatch_against_table7(ep: int, published: float) -> None:
    """HybridEP dispatch inside one GB200 NVL72 rack (the harness's 32 SMs; Table 7 does not state its SMs):
    within 5% of Table 7 at EP8 and EP64 (403 / 671 us when written). Not asserted, in RESULTS.md: the combine
    is 3-20% slower than Table 7 and the H100 rows 8-42% slower."""
    t = _hybridep_dispatch("gb200-nvl72", ep, 4, 32)
    assert abs(t / published - 1.0) <= 0.05
