"""Synthesis replays the recorded blocks of a rank (a layer's forward, backward, recomputation: build.py
``_RankBuilder.block``): the graph must be array-identical to emitting every op one by one, on variants that reach
the state a block reads (partial, per-layer and full-iteration CUDA graphs, skewed routing's per-peer splits, FSDP,
GPU and host stragglers, pipeline stages and virtual chunks, MTP depths on the last stage, DualPipe, the combined
1F1B's segments)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from cosim.workload.synth import build as B
from tests._scripts import synth_variants

_MORE = {  # variants of benchmarks/synth_variants.py's default scenario besides its own
    "stragglers_pp2": {"stragglers.gpu.1": 1.3, "stragglers.host.2": 1.2, "layout.pp": 2, "layout.ep": 4,
                       "batch.global": 16, "allow_oom": True},  # per-rank slowdowns, first and last pipeline chunks
    "mtp_pp2": {"mtp_layers": 2, "layout.pp": 2, "layout.ep": 4, "batch.global": 16, "allow_oom": True},
    "mtp_pp2_a2a": {"mtp_layers": 1, "layout.pp": 2, "layout.vpp": 2, "layout.ep": 4, "layout.recompute": "none",
                    "layout.a2a_overlap": True, "batch.global": 16, "allow_oom": True},
}


def _arrays(name: str) -> dict[str, np.ndarray]:
    tool = synth_variants()
    if name in _MORE:
        tool.VARIANTS[name] = (tool.Q, _MORE[name])
    syn, _ = tool.build(name)
    return dict(syn.graph.npz_arrays())


@pytest.mark.parametrize("name,share", [
    ("default", 0.3), ("graphs", 0.3), ("fulliter", 0.3), ("skew_ep4", 0.3), ("fsdp", 0.3), ("deepep_fp8_tpo", 0.3),
    ("stragglers_pp2", 0.3), ("pp2_a2a", 0.0), ("dualpipe", 0.0), ("layer_graphs", 0.3),
    ("no_overlap_grad", 0.3), ("mtp_pp2", 0.3), ("mtp_pp2_a2a", 0.0)])
def test_replayed_blocks_match_op_by_op(name: str, share: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """``share``: the least fraction of the GPU ops that come from replayed blocks (0: some; DualPipe's overlapped
    pairs and the combined 1F1B's segments replay less; launch jitter keeps its rank op by op: not run, 17 s)."""
    replays: list[int] = []
    real = B._RankBuilder._replay

    def counted(self: B._RankBuilder, r: Any, refs: list[int]) -> None:
        replays.append(len(r.g[0]))
        real(self, r, refs)

    monkeypatch.setattr(B._RankBuilder, "_replay", counted)
    fast = _arrays(name)
    n_ops = sum(len(v) for k, v in fast.items() if k.endswith("/gpu_ops/name"))
    assert sum(replays) > share * n_ops and replays  # most ops come from replayed blocks

    def op_by_op(self: B._RankBuilder, key: tuple[Any, ...], run: Callable[[], None]) -> None:
        run()

    monkeypatch.setattr(B._RankBuilder, "block", op_by_op)
    slow = _arrays(name)
    assert fast.keys() == slow.keys()
    for k in fast:
        a, b = fast[k], slow[k]
        assert a.dtype == b.dtype and a.shape == b.shape, k
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), k


def test_block_refuses_what_it_cannot_replay() -> None:
    base = B._Base(g=10, h=5, c=2, e=0, w=0, graph=3)
    slot = {4: 0, 7: 2}
    assert [B._enc(v, 10, slot) for v in (12, -1, 4, 7)] == [2, -1, -2, -4]
    with pytest.raises(B._Unrecordable):
        B._enc(5, 10, slot)  # an earlier op that is none of the entry's references
    assert [B._enc_host(v, base) for v in (6, -1, 3)] == [1, -1, -2]
    with pytest.raises(B._Unrecordable):
        B._enc_host(2, base)
    key = ((0, 1), 3)
    B._check_seq([key, key], [4, 5], {key: 6})  # drawn from the counter: 4, 5 then 6
    with pytest.raises(B._Unrecordable):
        B._check_seq([key, key], [4, 9], {key: 6})  # a number given explicitly
    assert B._ref_pattern([5, -1, 5, 8])[1] == (0, -1, 0, 3)


def _hand_built(replay: bool) -> dict[str, np.ndarray]:
    """A rank whose one block (compute, TP all-reduce, compute) is entered four times: nothing pending; a pending op
    that is also the compute stream's last op (no event wait then); one on the TP stream (its stream edge is the
    wait); and the first state again (replayed)."""
    rb = B._RankBuilder(0, 2, "GPU")
    comp = B.Op("x.fwd", "elementwise", 1e9, 1e6)
    coll = B.Op("x.tp_all_reduce", "collective", 0.0, 8e6, comm=B.Comm("tp", "all_reduce", 8e6), stream="tp")
    groups = {"tp": [0, 1]}

    def block() -> None:
        for o in (comp, coll, comp):
            rb.emit(o, 1e-6, groups, 5e-6)

    def go() -> None:
        if replay:
            rb.block(("x",), block)
        else:
            block()

    go()
    rb.pending.append((rb.last_on[B._STREAMS["compute"]], "manual"))
    go()
    other = rb.op(coll, 0.0, B._STREAMS["tp"], 5e-6, coll=rb.collective("all_reduce", [0, 1], 8e6))
    rb.pending.append((other, "manual"))
    go()
    go()
    return dict(B.ExecutionGraph([rb.finish()]).npz_arrays())


def test_hand_built_entries_by_their_pattern_of_references() -> None:
    fast, slow = _hand_built(True), _hand_built(False)
    assert fast.keys() == slow.keys()
    for k in fast:
        assert np.array_equal(fast[k], slow[k], equal_nan=fast[k].dtype.kind == "f"), k
    waits = slow["r0/edges/kind"] == int(B.EdgeKind.EVENT_WAIT)
    assert waits.sum() == 2 * 4 + 1  # the all-reduce waits for the compute before it, each second compute for it,
    # and the third block's first compute for the pending all-reduce (in the second, that op is the stream's last)
