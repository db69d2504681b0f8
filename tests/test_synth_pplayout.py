"""Megatron-Core's pipeline_model_parallel_layout string: the parser by hand, and the MTP placed where its ``m`` is."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from cosim.capture.config import MoEModelConfig
from cosim.errors import CosimInputError
from cosim.models.synth_timing import synthetic_kernel_timer
from cosim.workload.graph import CollType
from cosim.workload.synth import ParallelLayout, SyntheticSpec, synthesize
from cosim.workload.synth.layout import parse_pipeline_layout
from tests._cards import TINY as _TINY

# 2 MoE layers, d 64, 4 heads of 16 (2 KV heads), 8 experts top-2 of width 32, vocabulary 256, one MTP depth
TINY = {**_TINY, "mtp_layers": 1}  # tests/_cards.py's card
H, T = 64, 64


def test_parse_layout_strings_by_hand() -> None:
    # DeepSeek-V3 on 32 virtual stages (Megatron-Core's docstring example): E + 3 layers, 29 x 2 layers, m, L
    counts, mtp = parse_pipeline_layout("Et*3|(tt|)*29m|L", 32, 61, 1)
    assert counts == [3] + [2] * 29 + [0, 0] and mtp == 30
    # the 25.09 H100 row's pp_layout: the MTP with the loss on the last chunk; commas and spaces are dropped
    counts, mtp = parse_pipeline_layout("Et|(tt|)*30mL", 32, 61, 1)
    assert counts == [1] + [2] * 30 + [0] and mtp == 31
    assert parse_pipeline_layout("E, t*2 | t t L", 2, 4, 0) == ([2, 2], None)
    assert parse_pipeline_layout("E(t|)*3tL", 4, 4, 0) == ([1, 1, 1, 1], None)
    for text, chunks, layers, mtp_n, msg in [
            ("Et|tx|L", 3, 2, 0, "unexpected 'x'"),
            ("Et|t|L", 4, 2, 0, "has 3 stages, needs pp\\*vpp = 4"),
            ("tE|t|L", 3, 2, 0, "E \\(embedding\\) must appear once, first"),
            ("Et|t|", 3, 2, 0, "L \\(loss\\) must appear once, last"),
            ("Et|tt|L", 3, 2, 0, "has 3 decoder layers \\(t\\), the model 2"),
            ("Et|t|L", 3, 2, 1, "has 0 MTP layers \\(m\\), the run 1"),
            ("Em|tt|L", 3, 2, 1, "MTP layer \\(m\\) before a decoder layer"),
            ("Et|tm|mL", 3, 2, 2, "must sit in one stage"),
            # a repeat far past the run's layers is refused before it is unrolled (no MemoryError)
            ("Et*99999999999|t|L", 3, 2, 0, "repeat 't\\*99999999999' unrolls past"),
            ("E(t|)*99999999999L", 3, 2, 0, "repeat '\\(t\\|\\)\\*99999999999' unrolls past"),
            ("E((t|)*9)*9L", 3, 2, 0, "unrolls past")]:
        with pytest.raises(CosimInputError, match=msg):
            parse_pipeline_layout(text, chunks, layers, mtp_n)


def test_layout_field_resolves_and_errors_name_it() -> None:
    card = MoEModelConfig(**TINY)  # type: ignore[arg-type]
    rm = ParallelLayout(pp=2, vpp=2, pipeline_model_parallel_layout="E|tt||mL").resolve(card, 8)
    assert rm.chunk_layers == [[], [0, 1], [], []] and rm.mtp_chunk == 3
    with pytest.raises(CosimInputError, match=r"^layout.pipeline_model_parallel_layout: 'Et\|t\|mL' has 3 stages"):
        ParallelLayout(pp=2, vpp=2, pipeline_model_parallel_layout="Et|t|mL").resolve(card, 8)
    # Megatron-Core (validate_layer_layout) keeps the MTP layers in a rank's last virtual stage
    with pytest.raises(CosimInputError, match=r"layout.pipeline_model_parallel_layout: the MTP layers \(m\) on chunk 1, "
                                              "virtual stage 0 of 2"):
        ParallelLayout(pp=2, vpp=2, pipeline_model_parallel_layout="Et|tm||L").resolve(card, 8)
    with pytest.raises(CosimInputError, match="pipeline_model_parallel_layout: excludes pipeline_layers"):
        ParallelLayout(pp=2, pipeline_layers=[1, 1], pipeline_model_parallel_layout="Et|tmL").resolve(card, 8)


def _synth(tmp_path: Path, topo: object, **layout: Any) -> Any:
    f = tmp_path / "tiny2.yaml"
    f.write_text(yaml.safe_dump(TINY))
    # 8 GPUs: pp 4 x dp 2, ep 2; global 4 -> 2 micro-batches per pipeline
    spec = SyntheticSpec.model_validate(dict(model=str(f), layout={"pp": 4, "ep": 2, **layout}, precision="bf16",
                                             batch={"global": 4, "micro": 1, "seq": T}, fold=False))
    return synthesize(spec, topo, kernel_timer=synthetic_kernel_timer)


def _names(rg: Any) -> Counter:
    return Counter(rg.strings[int(x)] for x in rg.gpu_ops.name)


def _colls(rg: Any) -> Counter:
    C = rg.collectives
    return Counter((CollType(int(C.type[c])).name, int(C.group_size[c]), float(C.in_bytes[c])) for c in range(len(C)))


def test_mtp_runs_where_the_layout_puts_its_m(tmp_path: Path, dgx: object) -> None:
    # "Et|t|m|L" on pp 4: stage 0 embedding + layer 0, stage 1 layer 1, stage 2 the MTP layer, stage 3 the loss
    syn = _synth(tmp_path, dgx, pipeline_model_parallel_layout="Et|t|m|L")
    by_stage = {rg.rank // 2: rg for rg in syn.graph.ranks if rg.rank % 2 == 0}  # rank = dp_i + 2 x stage
    n = {s: _names(rg) for s, rg in by_stage.items()}
    assert n[2]["mtp.enorm"] == 2 and n[2]["mtp.eh_proj"] == 2 and n[2]["mtp.head.norm"] == 2  # 2 micro-batches
    assert n[2]["mtp.head.lm_head"] == 0 and n[2]["head.lm_head"] == 0 and n[2]["attn.core"] == 2  # the MTP's layer
    # the MTP's logits and loss run with the main ones on the L stage, which holds no layer
    assert n[3]["mtp.head.lm_head"] == 2 and n[3]["head.lm_head"] == 2 and n[3]["mtp.enorm"] == 0
    assert n[3]["attn.core"] == 0
    for s in (0, 1):
        assert n[s]["mtp.enorm"] == 0 and n[s]["mtp.head.lm_head"] == 0
    # pipeline transfers: the main hidden states (T x h bf16 = 8192 bytes) up to the MTP stage; from it to the L
    # stage the main and the MTP hidden states (2 x 8192), both ways, 2 micro-batches
    msg = T * H * 2.0
    assert _colls(by_stage[1])[("SEND_RECV", 2, msg)] == 8  # 4 to stage 0, 4 to stage 2
    assert _colls(by_stage[2])[("SEND_RECV", 2, msg)] == 4 and _colls(by_stage[2])[("SEND_RECV", 2, 2 * msg)] == 4
    assert _colls(by_stage[3])[("SEND_RECV", 2, 2 * msg)] == 4 and _colls(by_stage[3])[("SEND_RECV", 2, msg)] == 0
    # the embedding copies' gradient all-reduce ties stage 0 and the MTP stage (vocab x h bf16), not the L stage
    emb = ("ALL_REDUCE", 2, 256.0 * H * 2)
    assert _colls(by_stage[0])[emb] == 1 and _colls(by_stage[2])[emb] == 1 and _colls(by_stage[3])[emb] == 0
    # "m" next to "L" is the default placement: the same graph as without a layout string
    a = _synth(tmp_path, dgx, pipeline_model_parallel_layout="Et||t|mL")
    b = _synth(tmp_path, dgx, pipeline_layers=[1, 0, 1, 0])
    for ra, rb in zip(a.graph.ranks, b.graph.ranks):
        assert _names(ra) == _names(rb) and _colls(ra) == _colls(rb)
