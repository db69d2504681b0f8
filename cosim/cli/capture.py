"""``cosim capture``: run the reference MoE model on N local processes and
record per-rank PyTorch traces plus capture.yaml (see docs/CAPTURE.md)."""

from __future__ import annotations

import argparse
import shlex
import sys

from cosim.cli import add_json_flag, emit_json
from cosim.errors import CosimInputError

__all__ = ["register"]


def _positive(name: str):
    def conv(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if v <= 0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {v}")
        return v

    return conv


def _nonneg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--warmup must be an integer, got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"--warmup must be >= 0, got {v}")
    return v


def register(subparsers: argparse._SubParsersAction) -> None:
    from cosim.capture.config import list_presets

    p = subparsers.add_parser(
        "capture",
        help="capture an MoE workload from a real multi-process PyTorch run",
        description="Run the reference MoE model on --world-size local processes (expert parallel over "
        "torch.distributed: gloo on CPU, NCCL on CUDA), profile the steps after warm-up, and write "
        "rank{r}.trace.json.gz, rank{r}.et.json.gz and capture.yaml to --out.",
    )
    p.add_argument("--model", required=True, metavar="NAME|FILE",
                   help=f"model preset ({', '.join(list_presets())}) or a model .yaml file")
    p.add_argument("--world-size", type=_positive("--world-size"), required=True, metavar="N",
                   help="number of ranks (processes)")
    p.add_argument("--steps", type=_positive("--steps"), required=True, metavar="K", help="profiled steps")
    p.add_argument("--warmup", type=_nonneg, default=1, metavar="W", help="steps before the profiled ones (default 1)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (nccl); default cpu")
    p.add_argument("--out", required=True, metavar="DIR", help="capture folder to create (must not exist or be empty)")
    p.add_argument("--mode", choices=("train", "prefill", "decode"), default="train",
                   help="train step (fwd+bwd+AdamW), prefill, or decode with a KV cache; default train")
    p.add_argument("--ep", type=_positive("--ep"), default=None, metavar="N",
                   help="expert-parallel size (default: world size); world size / EP data-parallel replicas")
    p.add_argument("--skew", default=None, metavar="balanced|natural|zipf:S",
                   help="routing skew (default natural; balanced with --fake)")
    p.add_argument("--fake", action="store_true",
                   help="record under fake tensors (no memory, no processes, seconds): full-size models on a CPU; "
                   "routing from --skew balanced|zipf:S; traces are replayed with modeled kernel times")
    p.add_argument("--layers", type=_positive("--layers"), default=None, metavar="N",
                   help="keep only the model's first N layers (quick checks of a big model)")
    p.add_argument("--batch", type=_positive("--batch"), default=2, metavar="B", help="sequences per rank (default 2)")
    p.add_argument("--seq", type=_positive("--seq"), default=64, metavar="S",
                   help="tokens per sequence; the prompt length in decode mode (default 64)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights, data and routing (default 0)")
    p.add_argument("--profile-memory", action="store_true", help="also record allocator events")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    add_json_flag(p)
    p.set_defaults(func=_handler)


def _handler(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from cosim.capture.capture import CaptureFailed, capture
    from cosim.capture.config import CaptureOptions, load_model_config, parse_skew

    model = load_model_config(args.model)
    if args.layers is not None and args.layers < model.num_layers:
        data = model.model_dump()
        data.update(num_layers=args.layers, dense_layers=min(model.dense_layers, args.layers))
        try:
            model = type(model).model_validate(data)
        except ValidationError as exc:
            raise CosimInputError(f"--layers {args.layers}: {exc.errors(include_url=False)[0]['msg']}") from None
    skew = parse_skew(args.skew or ("balanced" if args.fake else "natural"))
    if args.fake and (args.device != "cpu" or args.profile_memory):
        raise CosimInputError("--fake records without a device: drop --device / --profile-memory")
    ep = args.ep or args.world_size
    try:
        opts = CaptureOptions(model=model, world_size=args.world_size, ep=ep, steps=args.steps, warmup=args.warmup,
                              mode=args.mode, skew=skew, batch=args.batch, seq=args.seq, device=args.device,
                              seed=args.seed, profile_memory=args.profile_memory)
    except ValidationError as exc:
        err = exc.errors(include_url=False)[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise CosimInputError(msg) from None
    command = "cosim capture " + " ".join(shlex.quote(a) for a in sys.argv[sys.argv.index("capture") + 1:]) \
        if "capture" in sys.argv else "cosim capture"
    try:
        if args.fake:
            try:
                from cosim.capture.fake import capture_fake
            except ImportError:
                raise CosimInputError("cosim capture --fake needs PyTorch: pip install torch (or cosim[capture])") \
                    from None

            summary = capture_fake(opts, args.out, command=command, progress=not args.no_progress)
        else:
            summary = capture(opts, args.out, command=command, progress=not args.no_progress)
    except CaptureFailed as exc:
        sys.stderr.write(f"cosim: error: {exc}\n")
        return 1
    if args.json:
        emit_json(summary)
    else:
        print(f"wrote {summary['out']}: {opts.world_size} ranks x {opts.steps} {opts.mode} steps of "
              f"{'(fake tensors) ' if args.fake else ''}"
              f"{opts.model.name} (EP {opts.ep}, DP {opts.dp}, skew {skew.label()}), "
              f"{summary['bytes'] / 1024:.0f} KiB")
    return 0
