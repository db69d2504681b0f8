"""Score cosim's serving synthesis against published MoE serving throughput (validation/e2e/serving.yaml).

For every case: run its bundled scenario with its ``--set`` overrides (``cosim.set``), take
``tokens_per_s_per_gpu`` (prefill: input tokens, decode: output tokens), and print the measured
figure, cosim's, and the signed error ``cosim / measured - 1``. The median absolute error is given
over all rows and over the steady-state rows (``steady: true``: a step at a stated configuration,
not a 24-hour service average).

    python -m validation.e2e.serving [--json] [--markdown] [--only ID]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
CASES = HERE / "serving.yaml"


def run_case(case: dict[str, Any]) -> dict[str, Any]:
    """cosim's figures for one case, and its error against the measured tokens/s/GPU."""
    from cosim.scenario import load_scenario, run_scenario

    c = case["cosim"]
    _, res = run_scenario(load_scenario(c["scenario"]), {k: str(v) for k, v in (c.get("set") or {}).items()})
    s = res.summary()
    got = s["tokens_per_s_per_gpu"]
    want = float(case["measured"]["tokens_per_s_per_gpu"])
    return {"id": case["id"], "mode": case["mode"], "measured": want, "cosim": got, "error": got / want - 1.0,
            "step_time_s": s["step_time_s"], "layer_time_s": s["layer_time_s"],
            "time_per_output_token_s": s.get("time_per_output_token_s"), "gpus": s["synthetic"]["gpus"],
            "ep": s["synthetic"]["ep"], "steady": bool(case.get("steady", True)), "assumed": c.get("assumed", "")}


def medians(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """Median absolute error over all rows and over the steady-state rows."""
    allr = [abs(r["error"]) for r in rows]
    steady = [abs(r["error"]) for r in rows if r["steady"]]
    return {"median_abs_error": statistics.median(allr) if allr else None,
            "median_abs_error_steady": statistics.median(steady) if steady else None}


def markdown(rows: list[dict[str, Any]]) -> str:
    out = ["| case | mode | GPUs (ep) | measured tok/s/GPU | cosim tok/s/GPU | error | step | MoE layer | steady |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['id']} | {r['mode']} | {r['gpus']} ({r['ep']}) | {r['measured']:.0f} | {r['cosim']:.0f} | "
                   f"{100 * r['error']:+.1f}% | {1e3 * r['step_time_s']:.1f} ms | {1e6 * r['layer_time_s']:.0f} us | "
                   f"{'yes' if r['steady'] else 'no'} |")
    m = medians(rows)
    out.append("")
    out.append(f"Median |error|: {100 * (m['median_abs_error'] or 0):.1f}% over all {len(rows)} rows, "
               f"{100 * (m['median_abs_error_steady'] or 0):.1f}% over the steady-state rows.")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print the rows as JSON")
    ap.add_argument("--markdown", action="store_true", help="print the SERVING.md table")
    ap.add_argument("--only", help="run one case id")
    args = ap.parse_args(argv)
    cases = yaml.safe_load(CASES.read_text())["cases"]
    if args.only:
        cases = [c for c in cases if c["id"] == args.only]
    rows = []
    for case in cases:
        rows.append(run_case(case))
        if not args.json and not args.markdown:
            r = rows[-1]
            print(f"{r['id']:40s} measured {r['measured']:7.0f}  cosim {r['cosim']:7.0f}  error {100 * r['error']:+6.1f}%",
                  flush=True)
    if args.json:
        print(json.dumps({"rows": rows, **medians(rows)}, indent=1))
    elif args.markdown:
        print(markdown(rows))
    else:
        m = medians(rows)
        print(f"median |error| {100 * (m['median_abs_error'] or 0):.1f}% (all), "
              f"{100 * (m['median_abs_error_steady'] or 0):.1f}% (steady-state rows)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
