"""``cosim calibrate``: fit kernel-time models from traces or microbenchmarks into a profile YAML."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cosim.cli import add_json_flag, emit_json
from cosim.errors import CosimInputError

__all__ = ["register"]


def _run(args: argparse.Namespace) -> int:
    from cosim.models.fit import KernelDB, fit_profile
    from cosim.models.profile import CalibrationProfile, inputs_hash, load_profile

    if bool(args.from_traces) == bool(args.microbench):
        raise CosimInputError("give either --from-traces PATH... or --microbench")
    if not args.out and not args.db_out:
        raise CosimInputError("give --out PROFILE.yaml (and/or --db-out DIR)")
    if args.kernel_db < 0:
        raise CosimInputError(f"--kernel-db must be >= 0, got {args.kernel_db}")
    results = []
    if args.from_traces:
        paths = [Path(p) for p in args.from_traces]
        for p in paths:
            if not p.exists():
                raise CosimInputError("trace not found", file=p)
        name = args.name or (Path(args.out).stem if args.out else None)
        key = _traces_key(args, paths, name)
        cached: CalibrationProfile | None = None
        if args.out and Path(args.out).exists() and not args.force:
            try:
                old = load_profile(args.out)
                if old.provenance.get("inputs_hash") == key:
                    cached = old
            except CosimInputError:
                pass
        if cached is not None and not args.db_out:  # nothing else to write: skip loading the traces
            results.append({"profile": str(args.out), "cached": True, "inputs_hash": key,
                            "fit_errors": cached.fit_errors})
            return _report(args, results)
        dbs = KernelDB.from_traces(paths, args.accelerator)
        if args.db_out:
            Path(args.db_out).mkdir(parents=True, exist_ok=True)
            for acc, db in dbs.items():
                db.write_csv(Path(args.db_out) / f"{acc}.csv")
        if args.out:
            if cached is not None:
                res = {"profile": str(args.out), "cached": True, "inputs_hash": key,
                       "fit_errors": cached.fit_errors}
            else:
                if len(dbs) > 1:
                    raise CosimInputError(f"the traces come from several GPU models ({', '.join(sorted(dbs))}); "
                                          "calibrate one GPU model per profile")
                db = next(iter(dbs.values()))
                prof = fit_profile(db, name=name, provenance={"inputs_hash": key, "sources": [str(p) for p in paths]},
                                   kernel_scale=not args.no_kernel_scale, kernel_db=args.kernel_db)
                prof.save(args.out)
                res = {"profile": str(args.out), "cached": False, "inputs_hash": key,
                       "accelerator": prof.accelerator, "fit_errors": prof.fit_errors}
            if args.db_out:
                res.update({"db_out": str(args.db_out), "gpus": sorted(dbs)})
            results.append(res)
        else:
            results.append({"db_out": str(args.db_out), "gpus": sorted(dbs)})
        return _report(args, results)
    # microbench
    try:
        import torch

        from cosim.models.microbench import MicrobenchConfig, run_microbench
    except ImportError:
        raise CosimInputError("--microbench needs torch (pip install torch)") from None
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CosimInputError("--device cuda: no CUDA device is available (use --device cpu)")
    cfg = MicrobenchConfig(device=args.device, quick=args.quick)
    db, prov = run_microbench(cfg)
    from cosim.catalog.scaling import guess_accelerator

    acc = args.accelerator or (guess_accelerator(prov["gpu"]) if args.device == "cuda" else "custom")
    if acc is None:
        raise CosimInputError(f"cannot tell the catalog accelerator of {prov['gpu']!r}; give --accelerator")
    db.accelerator = acc
    if args.db_out:
        Path(args.db_out).mkdir(parents=True, exist_ok=True)
        db.write_csv(Path(args.db_out) / f"{acc}.csv")
    import datetime as _dt

    prov["date"] = _dt.date.today().isoformat()
    prov["inputs_hash"] = inputs_hash([prov, "quick" if args.quick else "full"])
    prof = fit_profile(db, name=args.name or (Path(args.out).stem if args.out else acc), provenance=prov,
                       kernel_scale=not args.no_kernel_scale, kernel_db=args.kernel_db)
    if args.out:
        prof.save(args.out)
    results.append({"profile": str(args.out), "accelerator": acc, "device": prov["gpu"],
                    "fit_errors": prof.fit_errors})
    return _report(args, results)


def _traces_key(args: argparse.Namespace, paths: list[Path], name: str | None) -> str:
    """Cache key of ``--from-traces``: everything the profile depends on (see docs/MODELS.md).

    The content of every trace file that will be read (directories expanded into their trace files, sorted by
    path), the arguments as given (they become ``provenance.sources``), the profile name, the fit options, the
    accelerator override and the cosim version.
    """
    from cosim import __version__
    from cosim.models.fit import KernelDB
    from cosim.models.profile import inputs_hash

    files = sorted(set(KernelDB.trace_files(paths)), key=str)
    opts = {"what": "cosim calibrate --from-traces", "cosim": __version__, "sources": [str(p) for p in paths],
            "name": name, "accelerator": args.accelerator or "", "kernel_db": args.kernel_db,
            "kernel_scale": not args.no_kernel_scale}
    return inputs_hash([opts, *files])


def _report(args: argparse.Namespace, results: list[dict]) -> int:
    if args.json:
        emit_json(results if len(results) != 1 else results[0])
        return 0
    for r in results:
        if "profile" in r:
            tag = " (cached: inputs unchanged)" if r.get("cached") else ""
            sys.stdout.write(f"profile {r['profile']}{tag}\n")
        if "db_out" in r:
            sys.stdout.write(f"kernel databases in {r['db_out']}: {', '.join(r['gpus'])}\n")
        errs = r.get("fit_errors") or {}
        if errs:
            sys.stdout.write(f"{'class':<14} {'n':>6} {'MAPE':>8} {'median':>8} {'sum err':>8}  (in-sample fit)\n")
            for c, e in sorted(errs.items()):
                sys.stdout.write(f"{c:<14} {e['n']:>6} {e['mape']*100:>7.1f}% {e['median_ape']*100:>7.1f}% "
                                 f"{e['time_err']*100:>+7.1f}%\n")
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("calibrate", help="fit kernel-time models (traces or microbenchmarks) into a profile",
                       description="Fit cosim's calibrated kernel models and write a profile YAML "
                                   "(usable as `cosim replay --profile`). See docs/MODELS.md.")
    p.add_argument("--from-traces", nargs="+", metavar="PATH", help="Kineto trace files or directories")
    p.add_argument("--microbench", action="store_true", help="run torch GEMM/attention/elementwise sweeps")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="microbenchmark device")
    p.add_argument("--quick", action="store_true", help="microbenchmark: a few small cases only")
    p.add_argument("--accelerator", help="catalog id of the GPU (default: from the trace's device name)")
    p.add_argument("--out", help="profile YAML to write")
    p.add_argument("--db-out", help="directory for the kernel database CSV (one file per GPU model)")
    p.add_argument("--name", help="profile name (default: the output file's stem)")
    p.add_argument("--force", action="store_true", help="refit even when the inputs hash matches --out")
    p.add_argument("--kernel-db", type=int, default=0, metavar="N",
                   help="store up to N measured medians keyed by (kernel, shapes, dtype) in the profile; an exact "
                        "hit on the same GPU model replaces the model's prediction (default 0: none)")
    p.add_argument("--no-kernel-scale", action="store_true",
                   help="do not fit per-kernel-family factors on the GEMM model")
    add_json_flag(p)
    p.set_defaults(func=_run)
