"""First-use friction: the one-line errors of a mistyped ``--set`` name the key, the valid ones and the nearest."""
from __future__ import annotations

import pytest

from cosim.errors import CosimInputError
from cosim.replay import ReplayConfig, apply_sets
from cosim.scenario import apply_scenario_sets, load_scenario


def _err(sets: dict[str, str]) -> str:
    with pytest.raises(CosimInputError) as info:
        scn, rest = apply_scenario_sets(load_scenario(), sets)
        apply_sets(ReplayConfig(), rest)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_unknown_knob_names_run_families_and_nearest() -> None:
    msg = _err({"host.speedd": "2"})
    assert "did you mean host.speed?" in msg
    for family in ("workload.synthetic.", "nodes", "topology.<path>", "links.nvlink4.bandwidth", "host.speed",
                   "projection."):
        assert family in msg, family
    assert "did you mean links.nvlink4.bandwidth?" in _err({"link.nvlink4.bandwidth": "1 GB/s"})
    assert "did you mean" not in _err({"zzz": "1"})
