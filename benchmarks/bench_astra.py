"""ASTRA-sim side by side (not a test): the same collectives and the same synthesized step in both simulators.

Needs ASTRA-sim's analytical binary (built from source, benchmarks/README.md "ASTRA-sim"):
``ASTRA_SIM_BIN=/path/AstraSim_Analytical_Congestion_Aware``; without it the script says so and exits 0.
The contention-free ``AstraSim_Analytical_Congestion_Unaware`` beside it runs too when present.

Cases:

* ``collectives``: a 1 GiB all-reduce and all-to-all on N GPUs (``--sizes``, default 64,256,1024) of N/8
  DGX H100 nodes. cosim: ``cosim collective`` on a topology file of N/8 ``dgx-h100`` nodes on a
  rail-optimized non-blocking fabric (as benchmarks/bench_engine.py), all-reduce with ``--algo ring``
  (ASTRA-sim's ring) and NCCL's own choice. ASTRA-sim: one ``COMM_COLL_NODE`` per rank
  (:func:`cosim.output.chakra.collective_traces`), ``benchmarks/astra/system.json`` (ring all-reduce,
  direct all-to-all per dimension) and ``benchmarks/astra/network-N.yml`` (two switch levels: 8 GPUs on
  NVSwitch at 450 GB/s, N/8 nodes at 50 GB/s per GPU).
* ``step``: the synthetic DeepSeek-V3 step of benchmarks/bench_synth.py on ``--step-gpus`` GPUs (16
  micro-batches per pipeline): ``cosim export --chakra`` (every rank unfolded), ASTRA-sim on the export,
  and ``cosim run`` of the same scenario.

Each program runs in its own process; printed per run: wall and CPU seconds (user + system, from
``os.wait4``: the machine is shared, CPU is the figure to compare), peak RSS and the predicted time
(ASTRA-sim: the largest ``sys[i] finished, T cycles``, 1 cycle = 1 ns).

    ASTRA_SIM_BIN=... python benchmarks/bench_astra.py [--sizes 64,256,1024] [--step-gpus 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
ASTRA_DIR = Path(__file__).resolve().parent / "astra"
GIB = 2**30


def measured(cmd: list[str], timeout: float, env: dict[str, str] | None = None,
             cwd: str | None = None) -> dict[str, Any]:
    """Run ``cmd``; wall, CPU (user + sys of the child) and peak RSS from ``os.wait4``."""
    out = tempfile.TemporaryFile()
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    status: int | str | None = None
    while True:
        pid, st, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            status = os.waitstatus_to_exitcode(st)
            break
        if time.perf_counter() - t0 > timeout:
            p.kill()
            pid, st, ru = os.wait4(p.pid, 0)
            status = "timeout"
            break
        time.sleep(0.02)
    p.returncode = status if isinstance(status, int) else -9
    wall = time.perf_counter() - t0
    out.seek(0)
    text = out.read().decode(errors="replace")
    return {"status": status, "wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "rss_mib": ru.ru_maxrss / 1024,
            "output": text}


def topology_file(gpus: int, folder: Path) -> Path:
    """N/8 DGX H100 nodes on a rail-optimized non-blocking fabric (bench_engine.py's variant)."""
    nodes = gpus // 8
    p = folder / f"dgx-h100-{nodes}node.yaml"
    p.write_text(f"name: dgx-h100-{nodes}node\n"
                 f"description: \"{nodes}x DGX H100, rail-optimized NDR400 (benchmark topology)\"\n"
                 "source: \"cosim benchmark: dgx-h100 nodes on a rail-optimized non-blocking fabric\"\n"
                 f"node: dgx-h100\nnodes: {nodes}\n"
                 "fabric:\n  topology: rail-optimized\n  switch_radix: 64\n  oversubscription: 1\n")
    return p


def astra(binary: str, prefix: Path, gpus: int, comm_groups: Path | None, timeout: float) -> dict[str, Any]:
    """Run ASTRA-sim on the traces ``prefix.<rank>.et``. The congestion-aware backend (2a2979a) takes one
    network dimension only: it gets ``network-flat-N.yml`` (the GPUs on one switch at their NIC's rate);
    the congestion-unaware one the two-level ``network-N.yml``."""
    flat = "Unaware" not in Path(binary).name and gpus > 8
    net = ASTRA_DIR / (f"network-flat-{gpus}.yml" if flat else f"network-{gpus}.yml")
    if not net.exists():
        return {"status": f"no {net.name}"}
    system = ASTRA_DIR / ("system.json" if gpus > 8 and not flat else "system-1d.json")
    cmd = [binary, f"--workload-configuration={prefix}", f"--system-configuration={system}",
           f"--network-configuration={net}", f"--remote-memory-configuration={ASTRA_DIR / 'remote_memory.json'}"]
    if comm_groups is not None:
        cmd.append(f"--comm-group-configuration={comm_groups}")
    r = measured(cmd, timeout, cwd=str(prefix.parent))
    done = [int(c) for c in re.findall(r"sys\[\d+\] finished, (\d+) cycles", r.pop("output"))]
    r["predicted_s"] = max(done) * 1e-9 if len(done) == gpus else None
    if len(done) != gpus and r["status"] == 0:
        r["status"] = f"{len(done)}/{gpus} ranks finished"
    return r


def cosim_env() -> dict[str, str]:
    """cosim's environment: this checkout, with bytecode caching on (``PYTHONDONTWRITEBYTECODE`` dropped, the
    ``.pyc`` files in a folder of their own), as an installed cosim has them; :func:`main` runs a warm-up first."""
    env = {**os.environ, "PYTHONPATH": str(ROOT),
           "PYTHONPYCACHEPREFIX": str(Path(tempfile.gettempdir()) / "cosim-bench-pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def cosim_cmd(args: list[str], timeout: float) -> dict[str, Any]:
    env = cosim_env()
    r = measured([sys.executable, "-m", "cosim", *args, "--json"], timeout, env=env)
    out = r.pop("output")
    try:
        r["json"] = json.loads(out[out.index("{"):])
    except ValueError:
        r["json"] = None
        r["status"] = r["status"] if r["status"] != 0 else "no JSON"
    return r


def collectives(binaries: dict[str, str], sizes: list[int], timeout: float, work: Path) -> list[dict[str, Any]]:
    from cosim.output.chakra import collective_traces

    rows = []
    for n in sizes:
        topo = topology_file(n, work)
        for op, algos in (("all_reduce", ["ring", "auto"]), ("all_to_all", ["auto"])):
            for algo in algos:
                r = cosim_cmd(["collective", "-t", str(topo), "--op", op, "--sizes", "1GiB", "--algo", algo], timeout)
                t = r.pop("json")
                r["predicted_s"] = t["results"][0]["time_s"] if t else None
                if t and algo == "auto":
                    algo = f"auto ({t['results'][0].get('algo')})"
                rows.append({"gpus": n, "op": op, "simulator": f"cosim --algo {algo}", **r})
            res = collective_traces(op, GIB, n, work / f"{op}-{n}")
            for label, b in binaries.items():
                rows.append({"gpus": n, "op": op, "simulator": label, **astra(b, res.prefix, n, None, timeout)})
            print_rows(rows[-len(algos) - len(binaries):], header=len(rows) == len(algos) + len(binaries))
    return rows


def step(binaries: dict[str, str], gpus: int, timeout: float, work: Path) -> list[dict[str, Any]]:
    dp = gpus // 16
    sets = [f"nodes={gpus // 8}", f"workload.synthetic.layout.ep={min(64, dp * 2)}",
            f"workload.synthetic.batch.global={16 * dp}", "workload.synthetic.allow_oom=true"]
    flags = [x for s in sets for x in ("--set", s)]
    rows = []
    r = cosim_cmd(["run", "dsv3-1024", *flags, "--out", str(work / "run")], timeout)
    j = r.pop("json")
    r["predicted_s"] = j.get("step_time_s") if j else None
    rows.append({"gpus": gpus, "op": "dsv3 step (16 mb)", "simulator": "cosim run (folded)", **r})
    r = cosim_cmd(["export", "--chakra", str(work / "et"), "dsv3-1024", "--prefix", "step", *flags], timeout)
    j = r.pop("json")
    r["predicted_s"] = None
    r["nodes"] = j.get("nodes") if j else None
    rows.append({"gpus": gpus, "op": "dsv3 step (16 mb)", "simulator": "cosim export --chakra", **r})
    print(f"(export: {r['nodes']} Chakra nodes over {gpus} ranks)", flush=True)
    if j:
        for label, b in binaries.items():
            rows.append({"gpus": gpus, "op": "dsv3 step (16 mb)", "simulator": label,
                         **astra(b, work / "et" / "step", gpus, work / "et" / "step.comm_groups.json", timeout)})
    print_rows(rows, header=True)
    return rows


def print_rows(rows: list[dict[str, Any]], header: bool) -> None:
    if header:
        print(f"{'GPUs':>5} {'case':<18} {'simulator':<34} {'status':<8} {'wall s':>8} {'CPU s':>8} {'RSS MiB':>8} "
              f"{'predicted':>12}")
    for r in rows:
        pred = r.get("predicted_s")
        p = f"{pred * 1e3:10.3f} ms" if isinstance(pred, float) else "-"
        print(f"{r['gpus']:>5} {r['op']:<18} {r['simulator']:<34} {r['status']!s:<8} {r.get('wall_s', 0):8.2f} "
              f"{r.get('cpu_s', 0):8.2f} {r.get('rss_mib', 0):8.0f} {p:>12}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="64,256,1024", help="GPUs for the 1 GiB collectives (multiples of 8)")
    ap.add_argument("--step-gpus", default="64", help="GPUs for the synthesized step (comma list; '' skips it)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    binary = os.environ.get("ASTRA_SIM_BIN")
    if not binary or not Path(binary).is_file():
        print("ASTRA_SIM_BIN is not set to ASTRA-sim's analytical binary: skipped (benchmarks/README.md, ASTRA-sim)")
        return 0
    binaries = {}
    for name, label in (("AstraSim_Analytical_Congestion_Aware", "ASTRA-sim aware (flat)"),
                        ("AstraSim_Analytical_Congestion_Unaware", "ASTRA-sim unaware (2-level)")):
        b = Path(binary).with_name(name)
        if b.is_file():
            binaries[label] = str(b)
    if not binaries:
        binaries["ASTRA-sim"] = binary
    # warm-up (not measured): compiles cosim's and its imports' bytecode and stores the validated catalog
    # (cosim's cache folder), as any earlier cosim command of the user's would have
    subprocess.run([sys.executable, "-m", "cosim", "collective", "-t", "dgx-h100", "--sizes", "1GiB", "--json"],
                   env=cosim_env(), stdout=subprocess.DEVNULL, check=False)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="cosim-astra-") as tmp:
        work = Path(tmp)
        if a.sizes:
            rows += collectives(binaries, [int(x) for x in a.sizes.split(",")], a.timeout, work)
        for g in [int(x) for x in a.step_gpus.split(",") if x]:
            rows += step(binaries, g, a.timeout, work / f"step{g}")
    if a.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
