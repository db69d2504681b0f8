#!/bin/sh
# Proposal report: the default scenario (Qwen3-30B-A3B training, EP8) on dgx-h100 (baseline) against
# proposal-example (2x NVLink, PCIe Gen6 GPU/NIC switches, 800G NICs), and the same
# proposal with a 4x faster host (host.speed=4). About 5 s.
set -e
OUT=${OUT:-cosim-out/studies/proposal}
cosim run --out "$OUT/baseline" --no-timeline > /dev/null
cosim run --set topology=proposal-example --set name=proposal-example --out "$OUT/proposal" --no-timeline > /dev/null
cosim run --set topology=proposal-example --set host.speed=4 --set name=proposal-fast-host \
  --out "$OUT/proposal-fast-host" --no-timeline > /dev/null
cosim report "$OUT/baseline" "$OUT/proposal" "$OUT/proposal-fast-host" --out "$OUT/report.html"
