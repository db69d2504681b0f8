"""The text report says which rank its breakdown is, names the busiest rank when another one, and what the host
step column is."""
from __future__ import annotations

from typing import Any

from cosim.output.text import format_summary


def _rank(i: int, step: float, compute: float) -> dict[str, Any]:
    return {"rank": i, "measured_step_time_s": None, "step_time_s": step, "error": None, "cpu_step_time_s": 1.0,
            "breakdown": {"compute": compute, "exposed_communication": step - compute},
            "exposed_communication_split": {"transfer_s": 0.5, "wait_for_peers_s": step - compute - 0.5}}


def _summary(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    slow = max(ranks, key=lambda r: r["step_time_s"])
    ties = sum(r["step_time_s"] == slow["step_time_s"] for r in ranks)
    return {"slowest_rank": slow["rank"], "slowest_rank_ties": ties,"topology": "t", "config": {"durations": "measured", "collectives": "simulated"}, "ranks": ranks,
            "step_time_s": slow["step_time_s"], "measured_step_time_s": None, "error": None,
            "breakdown": slow["breakdown"], "exposed_communication_split": slow["exposed_communication_split"],
            "events": 1, "sim_wall_s": 0.1}


def test_tied_ranks_label_and_busiest_rank() -> None:
    text = format_summary(_summary([_rank(0, 6.0, 2.5), _rank(1, 6.0, 2.6), _rank(2, 6.0, 2.9)]))
    assert "breakdown per step of rank 0 (the first of 3 ranks tied for the slowest step):" in text
    assert "busiest rank 2 (most compute): compute 2.9 s" in text
    assert "host step (sim)" in text and "host step: the simulated host CPU thread's time per step" in text
    assert "CPU step (sim)" not in text


def test_single_slowest_rank_no_busiest_line() -> None:
    text = format_summary(_summary([_rank(0, 5.0, 2.5), _rank(1, 6.0, 2.5)]))
    assert "breakdown per step of rank 1 (the slowest):" in text
    assert "busiest rank" not in text
