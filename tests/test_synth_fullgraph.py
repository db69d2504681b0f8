"""Full-iteration CUDA graphs (``cuda_graph_scope: full_iteration``, Megatron-Core ``cuda_graph_impl:
full_iteration``) on the 2-layer EP4 PP2 model of tests/test_synth.py: one graph launch for the whole
forward-backward, no host sync inside, the optimizer eager after it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cosim.errors import CosimInputError
from cosim.workload.synth import SyntheticSpec
from tests._cards import synth_tiny


def _synth(tmp_path: Path, topo: object, **kw: Any) -> Any:
    return synth_tiny(tmp_path, topo, **{"fold": False, **kw})


def _launched(rg: Any) -> dict[str, list[str]]:
    """GPU op names by the name of the host call that launched them."""
    out: dict[str, list[str]] = {}
    gnames = [rg.strings[int(x)] for x in rg.gpu_ops.name]
    hnames = [rg.strings[int(x)] for x in rg.host_ops.name]
    for h, g in zip(rg.launches.host_op, rg.launches.first_gpu_op):
        if g >= 0:
            out.setdefault(hnames[int(h)], []).append(gnames[int(g)])
    return out


def test_full_iteration_graph_launches_the_step_once(tmp_path: Path, dgx: object) -> None:
    from cosim.replay import ReplayConfig, replay

    eager = _synth(tmp_path, dgx)
    full = _synth(tmp_path, dgx, cuda_graph_scope="full_iteration")  # a bare string, as --set gives it
    assert full.spec.cuda_graph_scope == ["full_iteration"]
    for re_, rf in zip(eager.graph.ranks, full.graph.ranks):
        assert len(rf.gpu_ops) == len(re_.gpu_ops)  # the same kernels
        hosts = Counter(rf.strings[int(x)] for x in rf.host_ops.name)
        assert hosts["cudaGraphLaunch"] == 1 and hosts["cudaStreamSynchronize"] == 0
        assert Counter(re_.strings[int(x)] for x in re_.host_ops.name)["cudaStreamSynchronize"] == 2  # dropless
        launched = _launched(rf)
        # eager: the parameter all-gather issued before the step (overlap_param_gather), the gradient-norm
        # all-reduce and Adam after it; every forward and backward kernel rides the one graph launch
        assert sorted(launched["cudaLaunchKernel"]) == ["optim.adam", "optim.dp_param_all_gather",
                                                        "optim.grad_norm_all_reduce"]
        assert len(launched["cudaGraphLaunch"]) == len(rf.gpu_ops) - 3
    cfg = ReplayConfig(collectives="simulated")
    se, sf = (replay(s.graph, dgx, cfg).summary() for s in (eager, full))
    # the tiny step is host-bound eager; in one graph its GPU waits for nothing but its own work
    assert se["breakdown"]["host_bound_gpu_idle"] > 10 * sf["breakdown"]["host_bound_gpu_idle"]
    assert sf["step_time_s"] < se["step_time_s"]


def test_full_iteration_errors(tmp_path: Path, dgx: object) -> None:
    with pytest.raises(CosimInputError, match="full_iteration stands alone"):
        _synth(tmp_path, dgx, cuda_graph_scope=["full_iteration", "attn"])
    with pytest.raises(CosimInputError, match=r"exclude layout\.cuda_graphs"):
        _synth(tmp_path, dgx, cuda_graph_scope="full_iteration", layout=dict(pp=2, ep=4, cuda_graphs=True))
    with pytest.raises(Exception, match="cuda_graph_scope"):
        SyntheticSpec.model_validate(dict(model="x", batch={"global": 8, "micro": 1, "seq": 64},
                                          cuda_graph_scope="mlp"))
