"""Is the synthesized step's kernel timer too fast at small MoE shapes? Held out (issue 15 point 7, round 9).

Run from the repository root:  python validation/kernels/small_shapes.py [--json]

Scores :class:`cosim.models.synth_timing.KernelTimer` (what ``workload: synthetic:`` steps are timed with: model
only, no kernel database, no per-kernel factors, no launch grid, kernels named ``synthetic:<op>``) against measured
kernels it was not fitted on, split into small shapes (a GEMM with N or K <= 3072; every non-GEMM kernel of a
layer whose hidden size is <= 3072) and large ones:

* B300: ``tracelens-b300-moe`` moe_02 / moe_04 / moe_06 (the bundled ``b300`` profile is fitted on moe_01 / 03 / 05
  only), per-expert ``bmm`` / router ``mm`` GEMMs, top-k, softmax, sums, gathers (hidden 512, expert ffn 1024).
* H100 traces: ``tracelens-h100`` (bert-small, nsfw ViT, Qwen1.5-0.5B: hidden 512-1024), each trace timed with the
  leave-one-trace-out profile fitted on the other two (``validation/kernels/profiles/h100-fold-*.yaml``).
* H100 vidur: ``measured/vidur-h100-compute`` (Llama-2 7B / 70B cuBLAS GEMMs at 1-4096 tokens x TP 1-8, never
  fitted), each GEMM as a synthesized ``gemm`` op through the timer with the bundled ``h100-sxm5`` profile.

Error = modeled / measured - 1 (negative: cosim too fast). Columns: kernels, measured total, total-time error,
median signed error, MAPE.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # this checkout's cosim, not an installed copy

from cosim.catalog import load_catalog
from cosim.models.calibrated import access_patterns
from cosim.models.features import KernelFeatures
from cosim.models.fit import KernelDB
from cosim.models.predict import SOURCES, predict_features
from cosim.models.profile import load_profile
from cosim.models.synth_timing import KernelTimer
from cosim.resources import shared_dir
from cosim.workload.synth.costs import Op

HERE = Path(__file__).resolve().parent
SMALL = 3072.0
"""A GEMM is small when N or K is at most this; a non-GEMM kernel when its layer's hidden size is."""
MIN_ROWS = 256.0
"""vidur and published GEMMs with fewer rows (M) are left out: an expert GEMM of these layers has hundreds to
thousands (Qwen3-30B at EP8, 4096 tokens, top-8: 2048 rows per local expert; gpt-oss-120b top-4: 1024)."""
B300_HELD_OUT = ("moe_02", "moe_04", "moe_06")
"""tracelens-b300-moe traces the bundled b300 profile was not fitted on."""
H100_FOLDS = {"gaunernst": "h100-fold-gaunernst", "Falconsai": "h100-fold-falconsai", "Qwen": "h100-fold-qwen"}
"""tracelens-h100 trace (name prefix) -> the fold profile fitted without it."""
HIDDEN = {"gaunernst": 512.0, "Falconsai": 768.0, "Qwen": 1024.0, "moe": 512.0}
"""Hidden size of each trace's model (its non-GEMM kernels are small when <= :data:`SMALL`)."""


def as_synthesized(f: KernelFeatures) -> KernelFeatures:
    """``f`` as the kernel timer sees a synthesized op: no recorded kernel name and no launch grid."""
    n = len(f.cls)
    return replace(f, kernel=[f"synthetic:{o}" for o in f.op_name], grid=np.full((n, 3), -1, dtype=np.int64),
                   block=np.full((n, 3), -1, dtype=np.int64))


def trace_rows(db: KernelDB, timer: KernelTimer, hidden: float, label: str) -> list[dict]:
    """Measured vs modeled (s) for every timed kernel of ``db`` (communication and copies to/from host left out)."""
    f = as_synthesized(db.feats)
    pred = predict_features(f, timer.accelerator, timer._model_profile, kernel_scale=False, database=False).dur
    # kernels the trace records too little of to be modeled (no shapes: a replay times them as a twin of a
    # modeled kernel with the same name and grid) are not what a synthesized op is: left out
    named = predict_features(db.feats, timer.accelerator, timer._model_profile, kernel_scale=False, database=False)
    pattern = access_patterns(list(db.feats.kernel), db.feats)
    out = []
    for i, c in enumerate(f.cls):
        if c in ("collective", "memcpy_htod", "memcpy_dtoh", "other") or not np.isfinite(pred[i]) \
                or not f.dur[i] > 0 or SOURCES[named.source[i]] != "model":
            continue
        gemm = c in ("gemm", "grouped_gemm")
        small = bool(min(f.n[i], f.k[i]) <= SMALL) if gemm else hidden <= SMALL
        out.append({"set": label, "cls": c, "op": f.op_name[i], "m": float(f.m[i]), "n": float(f.n[i]),
                    "k": float(f.k[i]), "small": small, "measured": float(f.dur[i]), "modeled": float(pred[i]),
                    "named": float(named.dur[i]), "pattern": f"{c} {pattern[i] or '-'}"})
    return out


def b300_rows() -> list[dict]:
    base = shared_dir() / "traces" / "tracelens-b300-moe"
    paths = sorted(p for p in base.glob("*.json.gz") if p.name[:6] in B300_HELD_OUT)
    db = next(iter(KernelDB.from_traces(paths).values()))
    timer = KernelTimer(load_catalog().accelerator("b300"))
    return trace_rows(db, timer, HIDDEN["moe"], "B300 tracelens-b300-moe 02/04/06")


def h100_trace_rows() -> list[dict]:
    acc = load_catalog().accelerator("h100-sxm5")
    out = []
    for p in sorted((shared_dir() / "traces" / "tracelens-h100").glob("*.json.gz")):
        key = next(k for k in H100_FOLDS if p.name.startswith(k))
        timer = KernelTimer(acc, load_profile(HERE / "profiles" / f"{H100_FOLDS[key]}.yaml"))
        db = next(iter(KernelDB.from_traces([p]).values()))
        out += trace_rows(db, timer, HIDDEN[key], "H100 tracelens-h100 (LOTO)")
    return out


def vidur_rows() -> list[dict]:
    """vidur's GEMMs at M >= :data:`MIN_ROWS` (median of each op's times) as synthesized bf16 ``gemm`` ops."""
    timer = KernelTimer(load_catalog().accelerator("h100-sxm5"))
    ops, meas, names = [], [], []
    for model in ("llama2-7b", "llama2-70b"):
        with open(shared_dir() / "measured" / "vidur-h100-compute" / f"{model}-mlp.csv") as fh:
            for r in csv.DictReader(fh):
                t, tp = float(r["num_tokens"]), float(r["num_tensor_parallel_workers"])
                if t < MIN_ROWS:
                    continue
                h, hkv, e, ff = (float(r[x]) for x in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd"))
                hd = e / h
                shapes = {"attn_pre_proj": ((h + 2 * hkv) * hd / tp, e), "attn_post_proj": (e, h * hd / tp),
                          "mlp_up_proj": ((2 if r["use_gated_mlp"] == "True" else 1) * ff / tp, e),
                          "mlp_down_proj": (e, ff / tp)}
                for op, (n, k) in shapes.items():
                    ops.append(Op(op, "gemm", 2 * t * n * k, 2 * (t * k + k * n + t * n), "bf16", t, n, k))
                    meas.append(float(r[f"time_stats.{op}.median"]) * 1e-3)
                    names.append(f"{model}.{op}")
    pred = timer(ops)
    return [{"set": "H100 vidur cuBLAS GEMMs", "cls": "gemm", "op": nm, "m": o.m, "n": o.n, "k": o.k,
             "small": min(o.n, o.k) <= SMALL, "measured": t, "modeled": p}
            for o, t, p, nm in zip(ops, meas, pred, names) if t > 0]


PUBLISHED_HELD_OUT = ("xla-h100", "cutlass36-h800-fp8", "fbgemm-h100-fp8", "vllm49363-h100-fp8", "cublas-blackwell",
                      "vllm-b200-fp8", "vllm18778-b200-fp8")
"""validation/kernels/published sources no rule was fitted on (deepgemm-h800-fp8 fits the narrow-GEMM rule,
xla-b200 and torchao-b200-bf16 the Blackwell one; primus-turbo is an average over shapes)."""


def published_rows() -> list[dict]:
    """Held-out published GEMM throughputs (M >= :data:`MIN_ROWS`) as time measured vs modeled by the kernel timer
    (the same ops as ``python -m validation.kernels.published.score``)."""
    from validation.kernels.published.score import HERE as PUB
    from validation.kernels.published.score import load, rows_of

    cat = load_catalog()
    timers: dict[str, KernelTimer] = {}
    out = []
    for name in PUBLISHED_HELD_OUT:
        for r in rows_of(load(PUB / f"{name}.yaml")):
            o = r["ops"][0]
            if o.m < MIN_ROWS:
                continue
            t = timers.get(r["gpu"]) or timers.setdefault(r["gpu"], KernelTimer(cat.accelerator(r["gpu"])))
            gemm = "grouped_gemm" if o.cls == "grouped_gemm" else "gemm"
            out.append({"set": f"published {name} ({r['gpu']})", "cls": f"{gemm} {o.dtype}", "op": r["label"],
                        "m": o.m, "n": o.n, "k": o.k, "small": min(o.n, o.k) <= SMALL,
                        "measured": r["flops"] / (r["tflops"] * 1e12), "modeled": float(sum(t(r["ops"])))})
    return out


def summarise(rows: list[dict], key: str = "cls") -> list[dict]:
    """Per (set, key, small/large): kernels, measured total (s), total-time error, median signed error, MAPE."""
    groups: dict[tuple[str, str, bool], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["set"], r[key], r["small"]), []).append(r)
    out = []
    for (s, c, small), g in sorted(groups.items()):
        meas = np.array([r["measured"] for r in g])
        mod = np.array([r["modeled"] for r in g])
        err = mod / meas - 1
        out.append({"set": s, key: c, "shapes": "small" if small else "large", "n": len(g),
                    "measured_s": float(meas.sum()), "total_err": float(mod.sum() / meas.sum() - 1),
                    "median_err": float(np.median(err)), "mape": float(np.abs(err).mean())})
        if all("named" in r for r in g):  # the same kernels timed with their recorded names (access pattern known)
            out[-1]["named_total_err"] = float(sum(r["named"] for r in g) / meas.sum() - 1)
    return out


MEMORY_BOUND = ("elementwise", "reduction", "norm")
"""Kernel classes of the access-pattern table (:func:`pattern_table`)."""


def layer_kernels(model: str, layers: tuple[int, ...], precision: str = "bf16",
                  dispatcher: str = "alltoall") -> list[list[Op]]:
    """The synthesized kernels of each of ``layers`` of model card ``model`` (forward + backward, collectives left
    out; EP8, 4096 tokens, ``dispatcher``): what :func:`pattern_effect` and :func:`layer_bound` time. The backward
    is synthesis's own: its weight-gradient GEMMs read and write ``main_grad`` as a build with the default
    :class:`cosim.workload.synth.build.BuildOptions` does (gradient accumulation fusion, bf16 gradients: the
    synthetic spec's defaults, which the :data:`LAYERS` rows keep)."""
    from cosim.capture.config import load_model_config
    from cosim.workload.synth.build import BuildOptions
    from cosim.workload.synth.costs import Shard, backward_ops, layer_ops

    card = load_model_config(model)
    main_grad = BuildOptions(precision=precision).main_grad_bytes
    out = []
    for layer in layers:
        fwd = layer_ops(card, layer, 4096.0, 4096.0, Shard(ep=8, dispatcher=dispatcher), precision)
        out.append([o for o in fwd + backward_ops(fwd, main_grad) if o.cls != "collective"])
    return out


def pattern_effect() -> list[dict]:
    """gpt-oss-120b's kernel time per layer (forward + backward, EP8, 4096 tokens, layers 0 and 1 averaged) with
    every synthesized element-wise op timed as a contiguous kernel (before this round) and with the access
    patterns synthesis gives its eager ops on views and its cats (:attr:`cosim.workload.synth.costs.Op.pattern`)."""
    per_layer = layer_kernels("gpt-oss-120b", (0, 1))
    out = []
    for gpu in ("h100-sxm5", "b200", "gb200"):
        timer = KernelTimer(load_catalog().accelerator(gpu))
        before = after = 0.0
        for ops in per_layer:
            before += sum(timer([replace(o, pattern="") for o in ops])) / len(per_layer)
            after += sum(timer(ops)) / len(per_layer)
        out.append({"gpu": gpu, "ops": sum(1 for o in per_layer[-1] if o.pattern), "now_ms": before * 1e3,
                    "patterned_ms": after * 1e3})
    return out


LAYERS = (("qwen3-30b-h100-16-fp8", "qwen3-30b-a3b", "fp8", "deepep", (3,), 8.2),
          ("gpt-oss-120b-h100-64-bf16", "gpt-oss-120b", "bf16", "alltoall", (0, 1), 3.2))
"""e2e rows checked by :func:`layer_bound`: (row, model card, precision, dispatcher, layers averaged, published minus
cosim ms per layer and micro-batch: validation/e2e/RESULTS.md, "Round 9: micro-batch 1 on x86 hosts" table)."""


def held_out_error(tab: list[dict], pat: list[dict], cls: str, dtype: str, pattern: str) -> tuple[float, str]:
    """The held-out total-time error (small shapes) that stands for a synthesized op of ``cls`` / ``dtype`` /
    access ``pattern`` on Hopper, and where it comes from; ``pat``: :func:`pattern_table`."""
    def pick(rows: list[dict], s: str, c: str, key: str = "cls", col: str = "total_err") -> float:
        return next(t[col] for t in rows if t["set"].startswith(s) and t.get(key) == c and t["shapes"] == "small")

    if cls in ("gemm", "grouped_gemm") and dtype != "bf16":
        return pick(tab, "published cutlass36", f"{cls} fp8"), "CUTLASS 3.6 FP8 (H800)"
    if cls in ("gemm", "grouped_gemm"):
        return pick(tab, "H100 vidur", "gemm"), "vidur cuBLAS BF16 (H100)"
    if cls in ("elementwise", "moe_dispatch", "moe_combine"):
        if pattern:  # timed with its pattern: the error of the trace kernels timed with their recorded names
            return pick(pat, "H100", f"elementwise {pattern}", "pattern", "named_total_err"), \
                f"tracelens-h100 {pattern} (LOTO)"
        return pick(pat, "H100", "elementwise contiguous", "pattern"), "tracelens-h100 contiguous (LOTO)"
    return pick(tab, "H100 tracelens-h100", cls), f"tracelens-h100 {cls} (LOTO)"


def pattern_table(rows: list[dict]) -> list[dict]:
    """:func:`summarise` of the traces' memory-bound kernels by access pattern."""
    return summarise([r for r in rows if "pattern" in r and r["cls"] in MEMORY_BOUND], key="pattern")


def layer_bound(tab: list[dict], pat: list[dict]) -> list[dict]:
    """Per e2e row of :data:`LAYERS`: each kernel class's time in one layer (forward + backward, H100 kernel timer),
    the held-out small-shape error of that class and the time with that error taken out (``t / (1 + err)``):
    how much of the row's missing time per layer and micro-batch the kernel models' held-out errors can explain."""
    timer = KernelTimer(load_catalog().accelerator("h100-sxm5"))
    out = []
    for row, model, prec, disp, layers, missing in LAYERS:
        by: dict[tuple[str, str, str], float] = {}
        for ops in layer_kernels(model, layers, prec, disp):
            for o, t in zip(ops, timer(ops)):
                key = (o.cls, o.dtype if o.cls in ("gemm", "grouped_gemm") else "", o.pattern)
                by[key] = by.get(key, 0.0) + t / len(layers)
        for (c, dt, pt), t in sorted(by.items(), key=lambda kv: -kv[1]):
            err, src = held_out_error(tab, pat, c, dt or "bf16", pt)
            out.append({"row": row, "cls": f"{c} {dt} {pt}".replace("  ", " ").strip(), "cosim_ms": t * 1e3,
                        "error": err, "from": src, "corrected_ms": t / (1 + err) * 1e3, "missing_ms": missing})
    return out


def all_rows() -> list[dict]:
    if shared_dir() is None:
        raise FileNotFoundError("../shared is absent")
    return b300_rows() + h100_trace_rows() + vidur_rows() + published_rows()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = all_rows()
    vidur = [r for r in rows if r["set"] == "H100 vidur cuBLAS GEMMs"]
    tab = summarise([r for r in rows if r["set"] != "H100 vidur cuBLAS GEMMs"]) + summarise(vidur, key="op")
    tab += summarise(vidur)
    pat = pattern_table(rows)
    bound = layer_bound(tab, pat)
    if args.json:
        print(json.dumps({"scores": tab, "patterns": pat, "gpt_oss_patterns": pattern_effect(), "layer_bound": bound},
                         indent=1))
        return 0
    print("| measured set (held out) | class / op | shapes | kernels | measured ms | total-time error | "
          "median error | MAPE |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for t in tab:
        print(f"| {t['set']} | {t.get('cls', t.get('op'))} | {t['shapes']} | {t['n']} | {t['measured_s'] * 1e3:.3f} | "
              f"{t['total_err']:+.1%} | {t['median_err']:+.1%} | {t['mape']:.1%} |")
    print()
    print("Memory-bound kernels of the traces by the access pattern their kernel name records (small hidden):")
    print()
    print("| measured set (held out) | class, pattern | kernels | measured ms | kernel timer (synthesized: no name) | "
          "with the recorded name |")
    print("|---|---|---:|---:|---:|---:|")
    for t in pat:
        print(f"| {t['set']} | {t['pattern']} | {t['n']} | {t['measured_s'] * 1e3:.3f} | {t['total_err']:+.1%} | "
              f"{t['named_total_err']:+.1%} |")
    print()
    print("| gpt-oss-120b, one layer fwd + bwd | ops with a pattern | all contiguous ms | with the patterns ms |")
    print("|---|---:|---:|---:|")
    for w in pattern_effect():
        print(f"| {w['gpu']} | {w['ops']} | {w['now_ms']:.3f} | {w['patterned_ms']:.3f} "
              f"({w['patterned_ms'] - w['now_ms']:+.3f}) |")
    print()
    print("| e2e row | kernel class | cosim ms / layer (fwd + bwd) | held-out error (small shapes) | from | "
          "with the error taken out |")
    print("|---|---|---:|---:|---|---:|")
    for row in dict.fromkeys(b["row"] for b in bound):
        sel = [b for b in bound if b["row"] == row]
        for b in sel:
            print(f"| {row} | {b['cls']} | {b['cosim_ms']:.3f} | {b['error']:+.1%} | {b['from']} | "
                  f"{b['corrected_ms']:.3f} |")
        now, fixed = sum(b["cosim_ms"] for b in sel), sum(b["corrected_ms"] for b in sel)
        print(f"| {row} | **all kernels** | {now:.3f} | {fixed / now - 1:+.1%} (as a whole) | | {fixed:.3f} "
              f"({fixed - now:+.3f}; missing {sel[0]['missing_ms']:.1f} ms per layer and micro-batch) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
