"""Score cosim's SM law (cosim.replay.interference) against published slowdowns of compute overlapped by a
communication kernel (cases.yaml): ``python -m validation.overlap.score``. Held out: nothing here is fitted.

The law's slowdown of a compute kernel asking for the whole GPU of ``S`` SMs beside communication kernels holding
``c`` SMs together is ``1 / sm_rate(S, 1, c) = S / (S - c)``; ``c`` is the CTAs the source reports, or the channels
cosim's NCCL model gives the call (:meth:`cosim.engine.nccl.NcclParams.kernel_channels`). Several accelerators:
the mean of their slowdowns (the source reports a mean over them). Where the source gives the compute kernel's CTAs
(``compute_ctas``), the wave-quantized slowdown :func:`cosim.replay.interference.wave_slowdown` is scored too
(its waves on the free SMs over its waves alone); else that column is empty (the many-wave limit is the fluid law)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from cosim.catalog import load_catalog
from cosim.engine.nccl import load_params
from cosim.replay.interference import sm_rate, wave_slowdown

HERE = Path(__file__).parent


def law(case: dict[str, Any]) -> tuple[float, str]:
    """(the law's slowdown, how its SMs were read) for one case."""
    c, accs, how = _comm(case)
    cat = load_catalog()
    slow = [1.0 / sm_rate(float(cat.accelerator(a).sm_count), 1, c) for a in accs]
    return sum(slow) / len(slow), how


def waves(case: dict[str, Any]) -> float | None:
    """The wave-quantized slowdown of the case's compute kernel (None: the source gives no CTA count)."""
    if "compute_ctas" not in case:
        return None
    c, accs, _ = _comm(case)
    cat = load_catalog()
    slow = [wave_slowdown(float(case["compute_ctas"]), float(cat.accelerator(a).sm_count), c) for a in accs]
    return sum(slow) / len(slow)


def _comm(case: dict[str, Any]) -> tuple[float, list[str], str]:
    """(SMs the communication kernel holds, the accelerators, how they were read)."""
    accs = case["accelerator"] if isinstance(case["accelerator"], list) else [case["accelerator"]]
    if "comm_ctas" in case:
        c = float(case["comm_ctas"])
        how = f"{c:g} CTAs (reported)"
    else:
        call = case["comm_call"]
        c = float(load_params().kernel_channels(call["op"], float(call["bytes"])))
        how = f"{c:g} channels (cosim NCCL, {call['op']} {call['bytes'] / 2**20:g} MiB)"
    return c, accs, how


def main() -> int:
    cases = yaml.safe_load((HERE / "cases.yaml").read_text())["cases"]
    print("| case | GPU | comm SMs | measured slowdown | law | law error | waves | waves error |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for c in cases:
        pred, how = law(c)
        meas = float(c["measured_slowdown"])
        acc = c["accelerator"] if isinstance(c["accelerator"], str) else " / ".join(c["accelerator"])
        w = waves(c)
        wv = f"{w:.3f} | {100 * (w - meas) / meas:+.1f}%" if w is not None else "- | -"
        print(f"| {c['id']} | {acc} | {how} | {meas:.3f} | {pred:.3f} | {100 * (pred - meas) / meas:+.1f}% | {wv} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
