"""Exactness and speed check of a synthesis refactor (not a test): the execution graphs ``cosim run`` builds for
the bundled training and serving scenarios and for variants of the default one that reach every phase of
``build.py`` (skewed routing, stragglers, FSDP, offloading, partial / per-layer / full-iteration CUDA graphs,
pp2/vpp2 with the EP all-to-all overlap, DualPipe, DeepEP FP8 with TP comm overlap, HybridEP, ModelZoo's
unfused kernels) must stay array-identical.

    PYTHONPATH=/path/to/old python benchmarks/synth_variants.py dump /tmp/before [NAME ...]
    PYTHONPATH=/path/to/new python benchmarks/synth_variants.py dump /tmp/after [NAME ...]
    python benchmarks/synth_variants.py compare /tmp/before /tmp/after      # exit 1 unless all identical
    python benchmarks/synth_variants.py time [REPEAT]                      # dsv3-1024's synthesis, CPU s

``dump`` builds each variant (the coalescing probe when ``cosim run`` uses one, as ``bench_synth.py graph``) and
writes every array of its execution graph (``ExecutionGraph.npz_arrays``: all ranks) plus the build's fields
(ranks, folding, micro-batches, tokens, FLOPs, unit spans and keys, notes).
"""

from __future__ import annotations

import pickle
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
Q = "qwen3-30b-ep8-dgx-h100"
_PP2_A2A = {"layout.pp": 2, "layout.vpp": 2, "layout.ep": 4, "layout.recompute": "none", "layout.a2a_overlap": True,
            "batch.global": 16, "allow_oom": True}
_DUALPIPE = {"layout.pp": 2, "layout.ep": 4, "layout.schedule": "dualpipe", "allow_oom": True, "batch.global": 16}
_UNFUSED = {"cross_entropy_fusion": False, "moe_router_fusion": False, "grad_accumulation_fusion": False}
VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "default": (Q, {}),
    "dsv3-1024": ("dsv3-1024", {}),
    "dsv3-prefill-ep32": ("dsv3-prefill-ep32", {}),
    "dsv3-decode-ep128": ("dsv3-decode-ep128", {}),
    "skew_jitter": (Q, {"routing": "zipf:1.2", "stragglers.launch_jitter.3": "3 us", "stragglers.host.1": 1.5,
                        "batch.global": 16}),
    "fsdp": (Q, {"layout.zero": "fsdp", "batch.global": 16}),
    "offload": (Q, {"layout.recompute": "none", "offload_modules": "[attn_norm, core_attn]", "batch.global": 16,
                    "allow_oom": True}),
    "graphs": (Q, {"cuda_graph_scope": "[attn, moe_router, moe_preprocess]", "batch.global": 16}),
    "fulliter": (Q, {"cuda_graph_scope": "full_iteration", "batch.global": 16}),
    "pp2_a2a": (Q, _PP2_A2A),
    "dualpipe": (Q, _DUALPIPE),
    "deepep_fp8_tpo": (Q, {"dispatch": "deepep", "precision": "fp8", "layout.tp": 2, "layout.ep": 4,
                           "tp_comm_overlap": True, "allow_oom": True, "batch.global": 16}),
    "mz_flags": (Q, _UNFUSED),
    "mz_flags_pp2_a2a": (Q, {**_UNFUSED, **_PP2_A2A}),
    "mz_flags_dualpipe": (Q, {**_UNFUSED, **_DUALPIPE}),
    "skew": (Q, {"routing": "zipf:1.2", "batch.global": 16}),
    "no_overlap_grad": (Q, {"layout.overlap_grad_reduce": False, "batch.global": 16}),
    "hybridep": (Q, {"dispatch": "hybridep", "batch.global": 16}),
    "layer_graphs": (Q, {"layout.cuda_graphs": True, "batch.global": 16}),
    "a2a_fsdp": (Q, {**_PP2_A2A, "layout.zero": "fsdp"}),
    "a2a_offload": (Q, {**_PP2_A2A, "offload_modules": "[attn_norm, core_attn]", "layout.delay_wgrad": False,
                        "coalesce": False}),
    "skew_ep4": (Q, {"routing": "zipf:1.2", "layout.ep": 4, "allow_oom": True, "batch.global": 16}),
    "dsv3_a2a": ("dsv3-1024", {"layout.recompute": "none", "layout.a2a_overlap": True, "allow_oom": True}),
}


def build(name: str) -> tuple[Any, float]:
    """Variant ``name``'s synthesized step (the probe's when ``cosim run`` coalesces it) and the CPU seconds of
    :func:`cosim.workload.synth.synthesize`, with the cosim of ``PYTHONPATH`` (this checkout's without it)."""
    import os

    if not os.environ.get("PYTHONPATH"):
        sys.path.insert(0, str(ROOT))
    from cosim.models.synth_timing import synthetic_kernel_timer
    from cosim.scenario import _probe_spec, apply_scenario_sets, build_topology, load_scenario, split_topology_sets
    from cosim.workload.synth import synthesize

    scenario, sets = VARIANTS[name]
    texts = {f"workload.synthetic.{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in sets.items()}
    scn, rest = apply_scenario_sets(load_scenario(scenario), texts)
    tsets, _ = split_topology_sets({**scn.set, **rest})
    base = Path(scn.source_file).parent if scn.source_file else None
    topo = build_topology(scn.topology, base, {}, tsets, scn.nodes)
    spec = scn.workload.synthetic  # type: ignore[union-attr]
    probe = _probe_spec(spec, topo, base)
    c0 = time.process_time()
    syn = synthesize(probe[0] if probe else spec, topo, base, kernel_timer=synthetic_kernel_timer)
    return syn, time.process_time() - c0


def dump(out: Path, names: list[str]) -> int:
    """Write each variant's arrays to ``out/NAME.npz``."""
    out.mkdir(parents=True, exist_ok=True)
    for name in names or list(VARIANTS):
        syn, cpu = build(name)
        arrays = syn.graph.npz_arrays()
        b = syn.built
        fields = () if b is None else (b.ranks, b.folded, b.microbatches, b.tokens_per_step, b.model_flops,
                                       b.unit_spans, b.notes, b.unit_keys)
        arrays["built"] = np.frombuffer(pickle.dumps(fields), np.uint8)
        np.savez(out / f"{name}.npz", **arrays)
        print(f"{name}: synthesis {cpu:.2f} CPU s, {sum(len(rg.gpu_ops) for rg in syn.graph.ranks)} GPU ops, "
              f"{len(arrays)} arrays", flush=True)
    return 0


def compare(a: Path, b: Path) -> int:
    """Compare every array of the variants dumped in both folders; 1 when any differs, when a variant is in one
    folder only, or when there is none (a mistyped folder must not read as "identical")."""
    names = sorted({f.name for f in a.glob("*.npz")} | {f.name for f in b.glob("*.npz")})
    if not names:
        print(f"no variants dumped in {a} or {b}", file=sys.stderr)
        return 1
    bad = 0
    for name in names:
        missing = [str(d) for d in (a, b) if not (d / name).is_file()]
        if missing:
            bad += 1
            print(Path(name).stem, f"MISSING in {', '.join(missing)}")
            continue
        x, y = np.load(a / name), np.load(b / name)
        diff = sorted(set(x.files) ^ set(y.files))
        for k in sorted(set(x.files) & set(y.files)):
            p, q = x[k], y[k]
            if p.dtype != q.dtype or p.shape != q.shape or not np.array_equal(p, q, equal_nan=p.dtype.kind == "f"):
                diff.append(k)
        bad += bool(diff)
        print(Path(name).stem, "identical" if not diff else f"DIFFER {diff[:10]}", f"({len(x.files)} arrays)")
    return 1 if bad else 0

if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "dump":
        raise SystemExit(dump(Path(sys.argv[2]), sys.argv[3:]))
    if len(sys.argv) == 4 and sys.argv[1] == "compare":
        raise SystemExit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    if len(sys.argv) in (2, 3) and sys.argv[1] == "time":
        for _ in range(int(sys.argv[2]) if len(sys.argv) == 3 else 3):
            print(f"dsv3-1024 synthesis {build('dsv3-1024')[1]:.3f} CPU s", flush=True)
        raise SystemExit(0)
    print(__doc__, file=sys.stderr)
    raise SystemExit(2)
