"""Which topology preset replays a trace by default (cosim.replay.binding.DEFAULT_TOPOLOGY)."""

from __future__ import annotations

import pytest

from cosim.resources import shared_dir


def test_every_presets_gpu_replays_on_a_preset_of_that_gpu() -> None:
    """A trace of an accelerator that has a preset of its own replays on one (B300: hgx-b300, not hgx-b200);
    only the PCIe H100, which has none, borrows dgx-h100's SXM5 GPUs."""
    from cosim.replay.binding import DEFAULT_TOPOLOGY, default_topology
    from cosim.topology import list_presets, load_topology

    def gpu(preset: str) -> str:
        topo = load_topology(preset)
        return str(topo.graph.nodes[topo.gpus[0]]["spec"])

    for preset in list_presets():
        acc = gpu(preset)
        assert gpu(DEFAULT_TOPOLOGY[acc]) == acc, (preset, acc)
    assert {a for a, p in DEFAULT_TOPOLOGY.items() if gpu(p) != a} == {"h100-pcie"}
    assert default_topology("b300") == "hgx-b300" and default_topology("gb300") == "gb300-nvl72"
    assert default_topology(None) == default_topology("mi300x") == "dgx-h100"


def test_b300_trace_binds_to_hgx_b300_with_its_figures_unchanged() -> None:
    """The shared B300 MoE trace (one GPU) replays on hgx-b300 by default; one GPU without collectives takes
    nothing from the node, so its figures are those it had on hgx-b200 (10.5428 ms measured)."""
    root = shared_dir()
    if root is None:
        pytest.skip("../shared is absent")
    from cosim.replay import ReplayConfig, replay
    from cosim.workload import load_trace

    g = load_trace(root / "traces/tracelens-b300-moe/moe_05_large_capacity.json.gz")
    res = replay(g, config=ReplayConfig())
    assert res.topology.name == "hgx-b300"
    assert res.summary()["step_time_s"] == replay(g, "hgx-b200", ReplayConfig()).summary()["step_time_s"]
    assert res.summary()["step_time_s"] == pytest.approx(10.542840e-3, rel=1e-6)
