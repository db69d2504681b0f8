"""Bar chart of the serving-decode-ep sweep: decode tokens/s/GPU and exposed communication per point.

    python studies/serving-decode-ep/plot.py cosim-out/studies/serving-decode-ep [OUT.svg]

Reads the sweep's results.csv (step_time_s, exposed_communication_s per point) and writes a plain SVG
(no plotting dependency): one bar per point, tokens/s/GPU = 128 requests / step time, the exposed
communication share of the step printed on each bar.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

REQUESTS_PER_GPU = 128
"""The scenario's batch.requests_per_gpu (one output token per request per step)."""


def rows(folder: Path) -> list[dict[str, str]]:
    with (folder / "results.csv").open() as f:
        return [r for r in csv.DictReader(f) if r["status"] == "ok"]


def svg(data: list[dict[str, str]]) -> str:
    w, h, left, bottom, top = 760, 380, 60, 90, 40
    bw = (w - left - 20) / len(data)
    vals = [REQUESTS_PER_GPU / float(r["step_time_s"]) for r in data]
    vmax = max(vals) * 1.15
    colors = {"hgx-h200": "#4c78a8", "hgx-b200": "#f58518"}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="13">DeepSeek-V3 decode, 128 requests x 4K per '
           'GPU: output tokens/s/GPU (exposed communication share on the bar)</text>',
           f'<line x1="{left}" y1="{h - bottom}" x2="{w - 10}" y2="{h - bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>']
    for t in range(0, int(vmax) + 1, 500):
        y = h - bottom - (h - bottom - top) * t / vmax
        out.append(f'<text x="{left - 5}" y="{y + 4:.1f}" text-anchor="end">{t}</text>')
        out.append(f'<line x1="{left}" y1="{y:.1f}" x2="{w - 10}" y2="{y:.1f}" stroke="#ddd"/>')
    for i, (r, v) in enumerate(zip(data, vals)):
        x = left + i * bw + 6
        bh = (h - bottom - top) * v / vmax
        share = float(r["exposed_communication_s"]) / float(r["step_time_s"])
        out.append(f'<rect x="{x:.1f}" y="{h - bottom - bh:.1f}" width="{bw - 12:.1f}" height="{bh:.1f}" '
                   f'fill="{colors.get(r["topology"], "#888")}"/>')
        out.append(f'<text x="{x + (bw - 12) / 2:.1f}" y="{h - bottom - bh - 4:.1f}" text-anchor="middle">{v:.0f}</text>')
        out.append(f'<text x="{x + (bw - 12) / 2:.1f}" y="{h - bottom - bh + 14:.1f}" text-anchor="middle" '
                   f'fill="white">{100 * share:.0f}%</text>')
        label = [r["topology"].removeprefix("hgx-").upper(), f'EP{r["workload.synthetic.layout.ep"]}',
                 f'{r["workload.synthetic.dispatch_precision"]} dispatch']
        for k, s in enumerate(label):
            out.append(f'<text x="{x + (bw - 12) / 2:.1f}" y="{h - bottom + 16 + 13 * k}" text-anchor="middle">{s}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    folder = Path(argv[1]) if len(argv) > 1 else Path("cosim-out/studies/serving-decode-ep")
    dest = Path(argv[2]) if len(argv) > 2 else Path(__file__).with_name("decode.svg")
    dest.write_text(svg(rows(folder)))
    print(f"wrote {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
