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
    out = []
    for i, c in enumerate(f.cls):
        if c in ("collective", "memcpy_htod", "memcpy_dtoh", "other") or not np.isfinite(pred[i]) \
                or not f.dur[i] > 0 or SOURCES[named.source[i]] != "model":
            continue
        gemm = c in ("gemm", "grouped_gemm")
        small = bool(min(f.n[i], f.k[i]) <= SMALL) if gemm else hidden <= SMALL
        out.append({"set": label, "cls": c, "op": f.op_name[i], "m": float(f.m[i]), "n": float(f.n[i]),
                    "k": float(f.k[i]), "small": small, "measured": float(f.dur[i]), "modeled": float(pred[i])})
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
    """vidur's GEMMs (median of each op's times) as synthesized bf16 ``gemm`` ops."""
    timer = KernelTimer(load_catalog().accelerator("h100-sxm5"))
    ops, meas, names = [], [], []
    for model in ("llama2-7b", "llama2-70b"):
        with open(shared_dir() / "measured" / "vidur-h100-compute" / f"{model}-mlp.csv") as fh:
            for r in csv.DictReader(fh):
                t, tp = float(r["num_tokens"]), float(r["num_tensor_parallel_workers"])
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
    return out


def all_rows() -> list[dict]:
    if shared_dir() is None:
        raise FileNotFoundError("../shared is absent")
    return b300_rows() + h100_trace_rows() + vidur_rows()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = all_rows()
    tab = summarise([r for r in rows if r["set"] != "H100 vidur cuBLAS GEMMs"]) + summarise(
        [r for r in rows if r["set"] == "H100 vidur cuBLAS GEMMs"], key="op")
    if args.json:
        print(json.dumps(tab, indent=1))
        return 0
    print("| measured set (held out) | class / op | shapes | kernels | measured ms | total-time error | "
          "median error | MAPE |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for t in tab:
        print(f"| {t['set']} | {t.get('cls', t.get('op'))} | {t['shapes']} | {t['n']} | {t['measured_s'] * 1e3:.3f} | "
              f"{t['total_err']:+.1%} | {t['median_err']:+.1%} | {t['mape']:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
