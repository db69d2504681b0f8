"""Device-to-device memcpy rows (``Memcpy DtoD``, class ``memcpy_dtod``): measured vs modeled, held out.

Run from the repository root:  python -m validation.kernels.d2d [--json]

A profile without a ``memcpy_dtod`` fit of its own times these copies with its ``elementwise`` fit
(:meth:`cosim.models.profile.CalibrationProfile.params`). A copy's recorded bytes are the transfer size, but the
copy reads and writes every byte, so it moves twice that through HBM (as an elementwise kernel's bytes count its
input and its output). "before" is the fallback with the transfer size as its HBM bytes (the elementwise fit as
is), "after" the fallback at twice the bytes (what the profile does now), "own fit" the profile's own
``memcpy_dtod`` fit where it has one. Every (profile, trace) pair is held out: the profile was fitted on other
traces (the H100 profile is the cross-GPU default of every GPU without a bundled profile). Reads ../shared/traces.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

from cosim.catalog import load_catalog
from cosim.models.fit import KernelDB
from cosim.models.predict import predict_features
from cosim.models.profile import CalibrationProfile, load_profile
from cosim.resources import shared_dir

PAIRS: tuple[tuple[str, str], ...] = (
    ("a100-sxm-80gb", "hta/a100-rank0of2-nccl.json.gz"),
    ("v100-sxm2-32gb", "hta/v100-rank1of2-df.json.gz"),
    ("v100-sxm2-32gb", "hta/v100-single-ns.json.gz"),
    ("h100-sxm5", "hta/a100-rank0of2-nccl.json.gz"),
    ("h100-sxm5", "hta/a100-rank3of8-control.json.gz"),
    ("h100-sxm5", "hta/v100-rank1of2-df.json.gz"),
    ("h100-sxm5", "hta/v100-single-ns.json.gz"),
    ("h100-sxm5", "tracelens-mi300/resnet_act_checkpoint.json.gz"),
)
"""(bundled profile, trace) pairs: the a100 profile is fitted on hta/a100-rank3of8-control, the v100 one on the
PARAM DLRM ranks, the h100 one on the TraceLens H100 traces (none with a DtoD copy)."""
BIG = 1 << 20
"""Copies of at least this many bytes (1 MiB) are bandwidth-bound: the rows where the bytes matter."""


def variants(prof: CalibrationProfile) -> dict[str, CalibrationProfile]:
    """The profile's D2D timing before the fix, after it, and with its own fit (where it has one)."""
    models = {c: by for c, by in prof.models.items() if c != "memcpy_dtod"}
    out = {"before": replace(prof, models={**models, "memcpy_dtod": {"default": prof.params("elementwise")}}),
           "after": replace(prof, models=models)}
    if "memcpy_dtod" in prof.models:
        out["own fit"] = prof
    return {k: replace(v, kernel_db={}, kernel_scale={}) for k, v in out.items()}


def _errors(pred: np.ndarray, meas: np.ndarray) -> dict[str, float]:
    ape = np.abs(pred / meas - 1)
    return {"n": len(meas), "mape": round(float(ape.mean()), 4), "median_ape": round(float(np.median(ape)), 4),
            "time_err": round(float(pred.sum() / meas.sum() - 1), 4)}


def d2d_rows(db: KernelDB) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Indices, bytes and measured durations (s) of a trace's DtoD copies with a size and a duration."""
    f = db.feats
    sel = np.flatnonzero(np.array([c == "memcpy_dtod" for c in f.cls]) & np.isfinite(f.bytes)
                         & np.isfinite(f.dur) & (f.dur > 0))
    return sel, f.bytes[sel], f.dur[sel]


def pair(profile: str, trace: Path) -> dict:
    """Errors of one (profile, trace) pair per variant, over all DtoD rows and over those >= :data:`BIG`."""
    dbs = KernelDB.from_traces([trace])
    (_acc, db), = dbs.items()
    acc = load_catalog().accelerator(db.accelerator)
    sel, nbytes, meas = d2d_rows(db)
    big = nbytes >= BIG
    out: dict = {"gpu": db.accelerator, "n": len(sel), "n_big": int(big.sum()),
                 "measured_copy_rate_big_GBps": round(float(np.median(nbytes[big] / meas[big])) / 1e9, 1)
                 if big.any() else None}
    for tag, pr in variants(load_profile(profile)).items():
        pred = predict_features(db.feats, acc, pr, kernel_scale=False, database=False).dur[sel]
        out[tag] = {"all": _errors(pred, meas), "big": _errors(pred[big], meas[big]) if big.any() else None}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    root = shared_dir()
    if root is None:
        print("error: ../shared not found (the shared traces are needed)", file=sys.stderr)
        return 2
    res = {f"{p} -> {t}": pair(p, Path(root) / "traces" / t) for p, t in PAIRS}
    if args.json:
        print(json.dumps(res, indent=2))
        return 0
    print("| profile -> trace | GPU | DtoD rows (>= 1 MiB) | measured copy rate >= 1 MiB | MAPE before / after / own fit "
          "| time err before / after / own fit | >= 1 MiB: MAPE before / after / own | >= 1 MiB: time err before / "
          "after / own |")
    print("|---|---|---:|---:|---|---|---|---|")

    def cell(r: dict, scope: str, key: str) -> str:
        vals = [r[t][scope][key] if t in r and r[t][scope] else None for t in ("before", "after", "own fit")]
        return " / ".join("-" if v is None else f"{v * 100:+.1f}%" if key == "time_err" else f"{v * 100:.1f}%"
                          for v in vals)

    for k, r in res.items():
        rate = "-" if r["measured_copy_rate_big_GBps"] is None else f"{r['measured_copy_rate_big_GBps']:.0f} GB/s"
        print(f"| {k} | {r['gpu']} | {r['n']} ({r['n_big']}) | {rate} | {cell(r, 'all', 'mape')} | "
              f"{cell(r, 'all', 'time_err')} | {cell(r, 'big', 'mape') if r['n_big'] else '-'} | "
              f"{cell(r, 'big', 'time_err') if r['n_big'] else '-'} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
