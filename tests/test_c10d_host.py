"""Host time of torch.distributed collective calls (validation/e2e/c10d_host.py): the evidence behind the
synthetic ``collective_host`` default (cosim.workload.synth.spec.C10D_CALL_HOST)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from cosim.resources import shared_dir
from validation.e2e.c10d_host import all_rows, call_rows, collective_calls


def _x(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}


def test_calls_are_the_outermost_comm_op_above_an_nccl_op(tmp_path: Path) -> None:
    # worked by hand: a c10d all-reduce of 100 us (launch call 7 us inside), a TorchRec all-to-all reached
    # through record_param_comms only (60 us, launch 5 us) and a wait's record_param_comms (no nccl op: no call)
    ev = [_x("c10d::allreduce_", 0, 100), _x("record_param_comms", 2, 90), _x("nccl:all_reduce", 10, 50,
                                                                               "user_annotation"),
          _x("cudaLaunchKernel", 20, 7, "cuda_runtime"),
          _x("## all2all ##", 200, 80, "user_annotation"), _x("record_param_comms", 205, 60),
          _x("nccl:all_to_all", 210, 40, "user_annotation"), _x("cudaLaunchKernel", 220, 5, "cuda_runtime"),
          _x("record_param_comms", 400, 30),
          _x("cudaLaunchKernel", 500, 4, "cuda_runtime")]  # a plain kernel launch outside any call
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump({"traceEvents": ev, "deviceProperties": [{"name": "Toy GPU"}]}, f)
    calls = sorted(collective_calls(p))
    assert calls == [("c10d::allreduce_", "nccl:all_reduce", pytest.approx(100e-6), pytest.approx(7e-6)),
                     ("record_param_comms", "nccl:all_to_all", pytest.approx(60e-6), pytest.approx(5e-6))]
    rows = {r.op: r for r in call_rows([p], "t")}
    assert rows["c10d::allreduce_"].gpu == "Toy GPU"
    assert rows["c10d::allreduce_"].net_median_s == pytest.approx(93e-6)


def test_dlrm_alltoall_median_is_the_default_s_source() -> None:
    root = shared_dir()
    folder = None if root is None else Path(root) / "traces" / "param-dlrm-v100x8" / "kineto"
    if folder is None or not folder.is_dir():
        pytest.skip("../shared/traces/param-dlrm-v100x8 not present")
    from cosim.workload.synth.spec import C10D_CALL_HOST

    rows = {(r.op, r.collective): r for r in call_rows(sorted(folder.glob("*.json.gz")), "dlrm")}
    a2a = rows[("c10d::alltoall_base_", "nccl:all_to_all")]
    assert a2a.calls == 40 and a2a.median_s == pytest.approx(83.0e-6)  # RESULTS.md "c10d host cost: evidence"
    assert a2a.p10_s < a2a.median_s < a2a.p90_s
    # the calls' own launch calls: 9 us; net of them 73.0 us, within 0.5 us of the default (all traces' median)
    assert a2a.launch_median_s == pytest.approx(9.0e-6)
    assert a2a.net_median_s == pytest.approx(C10D_CALL_HOST, abs=0.6e-6)
    assert rows[("c10d::allreduce_", "nccl:all_reduce")].calls == 24


def test_the_default_is_the_median_of_every_2_to_8_rank_row() -> None:
    root = shared_dir()
    if root is None or not (Path(root) / "traces" / "param-dlrm-v100x8").is_dir():
        pytest.skip("../shared/traces not present")
    from cosim.workload.synth.spec import C10D_CALL_HOST
    from validation.e2e.c10d_host import default_net_s

    rows = all_rows(Path(root) / "traces")
    assert len([r for r in rows if 2 <= r.ranks <= 8]) == 9  # RESULTS.md "c10d host cost: evidence"
    assert default_net_s(rows) == pytest.approx(C10D_CALL_HOST, abs=1e-9)


def test_every_shared_trace_with_collectives_has_rows() -> None:
    root = shared_dir()
    if root is None or not (Path(root) / "traces" / "tracelens-mi300").is_dir():
        pytest.skip("../shared/traces not present")
    traces = Path(root) / "traces"
    rows = all_rows(traces / "tracelens-mi300")
    assert {(r.op, r.calls) for r in rows} == {("c10d::allreduce_", 6), ("c10d::broadcast_", 6)}
    assert all("MI300X" in r.gpu for r in rows)
