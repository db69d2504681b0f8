"""Convert XLA's default matmul performance table (``xla/service/gpu/model/matmul_interpolator_data.h``) into the
published-GEMM YAML format of this folder (``xla-h100.yaml``, ``xla-b200.yaml``).

The table is what XLA's ``matmul_perf_table_gen`` measured (median kernel time of 5 traced runs, operands
flip-flopped between two buffers so that L2 holds neither) for dot HLOs on one GPU per key (``sm_90`` = H100,
``sm_100_B200`` = B200): b x M x N x K in {1,2,4} x {256..4096}^3, BF16 (cuBLAS via XLA's GEMM rewriter) and
FP8 E4M3 x E4M3 -> BF16 (cuBLASLt FP8 with per-tensor scales). Only b = 1 rows are kept (125 shapes per dtype).

``python -m validation.kernels.published.xla_table HEADER.h`` rewrites the two YAML files.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
URL = ("https://github.com/openxla/xla/blob/main/xla/service/gpu/model/matmul_interpolator_data.h "
       "(read from the ROCm/xla fork @ ea2c45f2, 2026-07-31; the sm_90 / sm_100_B200 tables are upstream's)")
DTYPES = {"bf16xbf16->bf16": "bf16", "f8e4m3fnxf8e4m3fn->bf16": "fp8"}
KEYS = {"sm_90": ("h100-sxm5", "xla-h100.yaml", "H100 (sm_90; SKU not named, SXM assumed)"),
        "sm_100_B200": ("b200", "xla-b200.yaml", "B200 (sm_100)")}
DROP = {"sm_90": {"fp8": "its FP8 entries are left out: 6 of 125 exceed H100's dense FP8 peak (up to 2424 of 1979 "
                         "TFLOP/s at 4096^3), so the profiled kernels did not do the dot's work at the stated shape"}}
SHORT_US = 10.0
"""Rows faster than this are reported apart (``short_us``): the table's smallest shapes sit at a ~5 µs measured
floor (256^3 BF16 and FP8 alike, both GPUs), a property of the harness more than of the GEMM."""


def parse(text: str) -> dict[str, list[tuple[int, int, int, int, dict[str, float]]]]:
    out: dict[str, list[tuple[int, int, int, int, dict[str, float]]]] = {}
    for sec in re.split(r'\n    key: "', text)[1:]:
        name = sec.split('"')[0]
        rows = []
        for b, m, n, k, fl in re.findall(r"entries \{\s*b: (\d+)\s*m: (\d+)\s*n: (\d+)\s*k: (\d+)\s*((?:flops \{[^}]*\}\s*)+)\}",
                                         sec):
            vals = {key: float(v) for key, v in re.findall(r'key: "([^"]+)" value: (\d+)', fl)}
            rows.append((int(b), int(m), int(n), int(k), vals))
        out[name] = rows
    return out


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    tables = parse(Path(args[0]).read_text())
    for key, (gpu, fname, what) in KEYS.items():
        lines = [f"source: XLA default matmul perf table, key {key} ({what})", f"url: {URL}", f"gpu: {gpu}",
                 "clocks: not given", "scaling: tensor", f"short_us: {SHORT_US:g}",
                 "library: XLA GEMM rewriter -> cuBLAS (bf16) / cuBLASLt FP8 E4M3xE4M3->BF16 with per-tensor scales",
                 "notes: >-",
                 "  median CUPTI kernel time of 5 runs per shape (xla/tools/matmul_perf_table_gen.cc), operands",
                 "  flip-flopped between two buffer sets; b = 1 rows only; converted by xla_table.py. Not used to",
                 "  build any rule before round 5." + (f" {DROP[key]['fp8']}." if key in DROP else ""),
                 "rows:  # [dtype, m, n, k, TFLOP/s]"]
        for b, m, n, k, vals in sorted(tables[key]):
            if b != 1:
                continue
            for src, dt in DTYPES.items():
                if src in vals and dt not in DROP.get(key, {}):
                    lines.append(f"  - [{dt}, {m}, {n}, {k}, {vals[src] / 1e12:.2f}]")
        (HERE / fname).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
