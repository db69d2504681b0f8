"""cosim capture: a real 2-rank CPU capture of the tiny preset, and its checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from capture_checks import check_capture, comm_events, load_capture, parse_list  # noqa: E402

from cosim.capture import CaptureOptions, load_model_config, parse_skew  # noqa: E402
from cosim.capture.capture import capture  # noqa: E402
from cosim.errors import CosimInputError  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def tiny_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("capture") / "tiny-ep2"
    opts = CaptureOptions(model=load_model_config("tiny-moe"), world_size=2, ep=2, steps=2, warmup=1,
                          batch=2, seq=16, mode="train")
    summary = capture(opts, out, command="pytest", progress=False)
    assert summary["out"] == str(out)
    return out


@pytest.fixture(scope="module")
def tiny_loaded(tiny_capture: Path) -> tuple[dict, list[dict], list[dict]]:
    return load_capture(tiny_capture)


def test_capture_files_and_consistency(tiny_capture: Path, tiny_loaded: tuple) -> None:
    doc = check_capture(tiny_capture, tiny_loaded)
    assert doc["format"] == "cosim-capture/1"
    assert doc["profiled_steps"] == [1, 2]
    assert doc["device"]["backend"] == "gloo"
    assert doc["host"]["torch"] == str(torch.__version__)
    assert doc["command"] == "pytest"
    assert not [p for p in tiny_capture.parent.iterdir() if p.name.startswith(".")], "temporary folder left behind"


def test_trace_has_collective_metadata(tiny_loaded: tuple) -> None:
    _, traces, _ = tiny_loaded
    for trace in traces:
        evs = comm_events(trace)
        names = {e["args"]["Collective name"] for e in evs}
        assert {"all_to_all", "all_to_allv", "allreduce"} <= names
        tags = {e["args"]["cosim tag"] for e in evs}
        # 2 MoE layers: counts + dispatch + combine forward, dispatch + combine backward.
        for layer in (0, 1):
            for t in ("counts", "dispatch.fwd", "combine.fwd", "dispatch.bwd", "combine.bwd"):
                assert f"layer{layer}.moe.{t}" in tags
        a2a = [e for e in evs if e["args"]["Collective name"] == "all_to_allv"]
        assert all(len(parse_list(e["args"]["In split size"])) == 2 for e in a2a)
        # The annotations nest inside the profiler steps.
        assert any(e.get("name") == "ProfilerStep#1" for e in trace["traceEvents"])


def test_existing_output_is_refused(tiny_capture: Path) -> None:
    opts = CaptureOptions(model=load_model_config("tiny-moe"), world_size=2, ep=2, steps=1)
    with pytest.raises(CosimInputError, match="already exists"):
        capture(opts, tiny_capture, progress=False)


def test_loads_with_workload_importer(tiny_capture: Path, tiny_loaded: tuple) -> None:
    workload = pytest.importorskip("cosim.workload")
    graph = workload.load_trace(tiny_capture)
    _, traces, _ = tiny_loaded
    assert sorted(r.rank for r in graph.ranks) == [0, 1]
    for rg in graph.ranks:
        assert len(rg.steps) == 2
        assert len(rg.collectives) == len(comm_events(traces[rg.rank]))


def test_kv_cache_decode_matches_full_forward() -> None:
    """Single rank (no all-to-all): prefill + one decode step gives the same last
    logits as one forward over the whole sequence."""
    from cosim.capture.comm import Comm, Group
    from cosim.capture.model import EPContext, MoETransformer

    cfg = load_model_config("tiny-moe")
    ctx = EPContext(comm=Comm(rank=0, annotate=False), ep_group=Group(None, [0], "0", "default_pg"), ep_rank=0)
    model = MoETransformer(cfg, ctx, seed=3).eval()
    tokens = torch.randint(cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(tokens)[:, -1]
        cache = model.new_cache(2, 9, torch.device("cpu"), torch.float32)
        model(tokens[:, :8], cache, 0)
        step = model(tokens[:, 8:], cache, 8)[:, -1]
    torch.testing.assert_close(step, full, atol=1e-4, rtol=1e-4)


def _skew_cv(skew: str, n: int = 4096) -> float:
    from cosim.capture.routing import choose_experts, zipf_popularity

    s = parse_skew(skew)
    e, k = 16, 2
    scores = torch.rand(n, e, generator=torch.Generator().manual_seed(0)).softmax(-1)
    g = torch.Generator().manual_seed(1)
    pop = zipf_popularity(e, s.s, torch.Generator().manual_seed(2)) if s.kind == "zipf" else None
    idx = choose_experts(scores, k, s, popularity=pop, generator=g)
    assert idx.shape == (n, k)
    assert all(len(set(row)) == k for row in idx.tolist()), "a token got the same expert twice"
    counts = torch.bincount(idx.flatten(), minlength=e).double()
    assert int(counts.sum()) == n * k
    return float(counts.std() / counts.mean())


def test_zipf_is_more_skewed_than_balanced() -> None:
    balanced, natural, zipf = _skew_cv("balanced"), _skew_cv("natural"), _skew_cv("zipf:1.2")
    assert balanced == 0.0
    assert zipf > 0.5 > natural > balanced
    assert _skew_cv("zipf:2.0") > zipf


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "tiny-moe", "--world-size", "3"], "not divisible by the EP size 3"),
        (["--model", "tiny-moe", "--world-size", "4", "--ep", "3"], "world size 4 is not divisible by the EP size 3"),
        (["--model", "no-such-model", "--world-size", "2"], "unknown model preset 'no-such-model'"),
        (["--model", "tiny-moe", "--world-size", "2", "--skew", "zipf:0"], "Zipf exponent must be > 0"),
    ],
)
def test_impossible_config_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "never"
    proc = subprocess.run([sys.executable, "-m", "cosim", "capture", *args, "--steps", "1", "--out", str(out)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("cosim: error:") and message in lines[0], proc.stderr
    assert not out.exists()


def test_cuda_without_cuda_is_an_input_error(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from cosim.cli import main

    assert main(["capture", "--model", "tiny-moe", "--world-size", "2", "--steps", "1", "--device", "cuda",
                 "--out", str(tmp_path / "x")]) == 2
