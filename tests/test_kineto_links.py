"""Pieces of the Kineto importer's fast path (round 13): launch links by correlation id, a collective's
args, and the raw-text memos the ranks of one load share."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cosim.resources import shared_dir
from cosim.workload import load_trace
from cosim.workload.kineto import decode_trace_chunks, read_kineto
from cosim.workload.kineto_tables import _launch_links, shared_cost_memos, text_memos

SHARED = shared_dir()


def test_launch_links_worked_by_hand() -> None:
    """Runtime calls at rows 2, 5, 7, 9 with correlation ids 10, none, 10, 3: id 10 is row 2's (the first),
    id 3 row 9's. GPU ops with ids 3, 10, 4 (no call), none: launched by rows 9, 2, -, -."""
    corr2host, g_launch = _launch_links(
        np.array([2, 5, 7, 9]), np.array([10, -1, 10, 3], np.int64), np.array([3, 10, 4, -1], np.int64)
    )
    assert corr2host == {3: 9, 10: 2}
    assert g_launch.tolist() == [9, 2, -1, -1]
    assert g_launch.dtype == np.int64
    empty, none = _launch_links(np.zeros(0, np.int64), np.zeros(0, np.int64), np.array([1, 2], np.int64))
    assert empty == {} and none.tolist() == [-1, -1]


def test_collective_args_are_the_members_present(tmp_path: Path) -> None:
    """A record_param_comms event's args: the collective's members that are present and not null, under
    their Kineto keys, in the importer's fixed order; other args left out; an event without args: {}."""
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 1, "pid": 1, "tid": 1,
         "args": {"Process Group Ranks": "[0, 1]", "External id": 7, "Collective name": "allreduce",
                  "dtype": None, "In msg nelems": 4, "Group size": 2}},
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 2, "dur": 1, "pid": 1, "tid": 1},
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    _, chunks, _, comm_args = decode_trace_chunks(f)
    list(chunks)
    got = comm_args(0)
    assert got == {"Collective name": "allreduce", "In msg nelems": 4, "Group size": 2,
                   "Process Group Ranks": "[0, 1]"}
    assert list(got) == ["Collective name", "In msg nelems", "Group size", "Process Group Ranks"]
    assert comm_args(1) == {}


def test_text_memos_are_scoped_to_one_load() -> None:
    """Inside one load the ranks share one set of memos; outside, each rank gets new ones; the load's
    memos are gone after it."""
    assert text_memos() is not text_memos()
    with shared_cost_memos():
        inside = text_memos()
        assert text_memos() is inside
    assert text_memos() is not inside


def _rank_file(tmp_path: Path, name: str, dims: str) -> Path:
    ev = {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5, "pid": 1, "tid": 1,
          "args": {"Input Dims": json.loads(dims), "Input type": ["float", "float"]}}
    f = tmp_path / name
    with gzip.open(f, "wt") as fh:
        json.dump({"traceEvents": [ev], "distributedInfo": {"rank": int(name[4]), "world_size": 2}}, fh)
    return f


def test_shared_memos_give_each_rank_its_own_string_ids(tmp_path: Path) -> None:
    """Two ranks with the same shapes text, loaded together: the second rank takes the decoded text from
    the memo but interns it in its own string table, so both ranks read the same shapes string."""
    a = _rank_file(tmp_path, "rank0.json.gz", "[[2, 3], [3, 4]]")
    b = _rank_file(tmp_path, "rank1.json.gz", "[[2, 3], [3, 4]]")
    g = load_trace(tmp_path, cache=False)
    for rg in g.ranks:
        assert rg.strings[int(rg.host_ops.input_shapes[0])] == "[[2, 3], [3, 4]]"
        assert rg.strings[int(rg.host_ops.input_types[0])] == '["float","float"]'
    for f, rg in zip((a, b), g.ranks):
        alone = read_kineto(f)
        assert alone.strings == rg.strings
        assert np.array_equal(alone.host_ops.input_shapes, rg.host_ops.input_shapes)


@pytest.mark.skipif(SHARED is None, reason="../shared not found")
def test_dlrm_ranks_loaded_together_equal_each_alone() -> None:
    """The 8-rank DLRM job (its ranks share ~360 distinct shapes texts): every rank's arrays and strings
    loaded as one job are those of the rank read on its own (no memo shared)."""
    assert SHARED is not None
    folder = SHARED / "traces" / "param-dlrm-v100x8" / "kineto"
    job = load_trace(folder, cache=False)
    for f in sorted(folder.iterdir()):
        alone = read_kineto(f)
        rg = next(r for r in job.ranks if r.rank == alone.rank)
        assert rg.strings == alone.strings
        for name in ("host_ops", "gpu_ops"):
            x, y = getattr(rg, name), getattr(alone, name)
            for c in x.columns():
                assert np.array_equal(getattr(x, c), getattr(y, c), equal_nan=True), (f.name, name, c)


def test_memcpy_kind_that_is_a_number(tmp_path: Path) -> None:
    """A gpu_memcpy event whose ROCm 'kind' arg is a number, not text: the direction comes from the name
    (it raised TypeError before: text + number)."""
    from cosim.workload.classify import copy_kind
    from cosim.workload.graph import CopyKind

    assert copy_kind("Memcpy DtoH (Device -> Pinned)", 1) == CopyKind.DTOH
    assert copy_kind("Memcpy", "hipMemcpyHtoD") == CopyKind.HTOD
    assert copy_kind("Memcpy", None) == CopyKind.OTHER
    events = [
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": 1, "dur": 2, "pid": 1, "tid": 1,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pageable -> Device)", "ts": 2, "dur": 3,
         "pid": 0, "tid": 7, "args": {"correlation": 5, "device": 0, "stream": 7, "kind": 1, "bytes": 64}},
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    rg = read_kineto(f)
    assert rg.gpu_ops.copy_kind.tolist() == [int(CopyKind.HTOD)]


def test_thread_ids_worked_by_hand() -> None:
    """Rows on threads (1, 7), (1, 7), (2, 3), (1, 7), (2, 3): numbered 0, 0, 1, 0, 1 in order of first
    appearance, by numpy (integer ids) and by the any-type walk alike; a string pid takes the walk."""
    from cosim.workload.kineto_tables import _thread_ids, _thread_ids_any

    pids, tids = (1, 1, 2, 1, 2), (7, 7, 3, 7, 3)
    for f in (_thread_ids, _thread_ids_any):
        ids, pairs = f(pids, tids)
        assert ids.tolist() == [0, 0, 1, 0, 1] and ids.dtype == np.int32
        assert pairs == [(1, 7), (2, 3)]
    ids, pairs = _thread_ids(("a", "a", 2), (1, 1, 1))
    assert ids.tolist() == [0, 0, 1] and pairs == [("a", 1), (2, 1)]
    ids, pairs = _thread_ids((), ())
    assert ids.tolist() == [] and pairs == []


def test_thread_ids_keep_text_ids_apart_from_numbers(tmp_path: Path) -> None:
    """A text pid that reads as a number ("7") is another thread than pid 7, and keeps its own name (the
    numpy path parsed it into 7 before: the two threads merged, the text thread's name lost)."""
    from cosim.workload.kineto_tables import _thread_ids

    ids, pairs = _thread_ids(("7", "7", 7), (1, 1, 1))
    assert ids.tolist() == [0, 0, 1] and pairs == [("7", 1), (7, 1)]
    events = [
        {"ph": "M", "name": "thread_name", "pid": "7", "tid": 1, "args": {"name": "python"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "ts": 1, "dur": 2, "pid": "7", "tid": 1},
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    rg = read_kineto(f)
    assert rg.strings[int(rg.threads.name[0])] == "python"


def test_gpu_only_trace_is_one_line_exit_2(tmp_path: Path) -> None:
    """A trace with GPU events and no host events is refused in one line naming the file (an IndexError's
    traceback from the launch table before)."""
    from cosim.errors import CosimInputError

    f = tmp_path / "gpu.json"
    f.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 2, "pid": 0, "tid": 7,
         "args": {"device": 0, "stream": 7}}]}))
    with pytest.raises(CosimInputError, match="1 GPU events and no host events") as e:
        read_kineto(f)
    assert str(f) in str(e.value) and "\n" not in str(e.value)


def test_process_group_description_that_is_not_text(tmp_path: Path) -> None:
    """A record_param_comms whose Process Group Description is a list or a number is read as its text, as the
    group's name is (a list raised TypeError, unhashable, from the string table before: a traceback, exit 1)."""
    args = {"Collective name": "allreduce", "dtype": "Float", "Process Group Name": 5,
            "Process Group Description": [1], "Process Group Ranks": "[0]", "Group size": 1, "In msg nelems": 4}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "ts": 1, "dur": 5, "pid": 1, "tid": 1,
         "args": args},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 2, "dur": 1, "pid": 1, "tid": 1,
         "args": {"correlation": 3}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "ts": 3, "dur": 4,
         "pid": 0, "tid": 7, "args": {"correlation": 3, "device": 0, "stream": 7}},
    ]
    f = tmp_path / "t.json"
    f.write_text(json.dumps({"traceEvents": events}))
    rg = read_kineto(f)
    pg = rg.groups
    assert [rg.strings[int(i)] for i in pg.name] == ["5"] and [rg.strings[int(i)] for i in pg.desc] == ["[1]"]
