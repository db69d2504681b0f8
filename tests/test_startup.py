"""Start-up costs (benchmarks/README.md "Round 10 start-up"): the numpy link matrix of small fabrics, the cached
bundled catalog and the CLI's fast exit change no result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cosim.engine.flows as flows

ROOT = Path(__file__).resolve().parent.parent


def test_small_link_matrix_same_floats_as_scipy() -> None:
    from scipy.sparse import csr_array

    rng = np.random.default_rng(7)
    for n, nl, ns in ((1, 1, 1), (37, 9, 11), (3000, 400, 900)):
        rows = np.sort(rng.integers(0, nl, n))
        cols = rng.integers(0, ns, n).astype(np.int64)
        w = rng.random(n) * 3
        indptr = np.zeros(nl + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=nl), out=indptr[1:])
        v = rng.random(ns) * 1e9
        v[rng.random(ns) < 0.3] = 0.0
        for data in (w, None):
            ref = csr_array((np.ones(n) if data is None else data, cols, indptr), shape=(nl, ns)) @ v
            got = flows._SmallLinkMatrix(rows, cols, data, nl) @ v
            assert np.array_equal(np.asarray(ref), got)


def _collective(op: str) -> float:
    from cosim.cli.collective import sweep
    from cosim.topology import load_topology

    topo = load_topology("dgx-h100-4node")
    return float(sweep(topo, op, list(topo.gpus), [2**30], algo="ring" if op == "all_reduce" else "auto")[0]["time_s"])


@pytest.mark.parametrize("op", ["all_reduce", "all_to_all"])
def test_link_matrix_paths_agree(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    small = _collective(op)
    monkeypatch.setattr(flows, "_SMALL_LINK_MATRIX", 0)  # scipy's CSR from the first product on
    assert _collective(op) == small
    monkeypatch.setattr(flows, "_SMALL_LINK_MATRIX", 1 << 30)
    monkeypatch.setattr(flows, "_SMALL_LINK_WORK", 50)  # switches to scipy's within the run
    assert _collective(op) == small


def test_small_collective_imports_no_scipy(tmp_path: Path) -> None:
    code = ("import sys; from cosim.cli import main; "
            "rc = main(['collective', '-t', 'dgx-h100-4node', '--op', 'all_to_all', '--sizes', '1GiB', '--json']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'plotly', 'pandas', 'torch', 'tqdm')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COSIM_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_cli_fast_exit_output(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COSIM_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "cosim", "collective", "-t", "dgx-h100", "--sizes", "1MiB,1GiB",
                        "--json"], capture_output=True, text=True, env=env)
    assert r.returncode == 0
    assert [x["size_bytes"] for x in json.loads(r.stdout)["results"]] == [2**20, 2**30]
    r = subprocess.run([sys.executable, "-m", "cosim", "collective", "-t", "no-such-topology"], capture_output=True,
                       text=True, env=env)
    assert r.returncode == 2 and "unknown topology" in r.stderr


def test_cosim_run_imports_no_sweep_or_proposal_pages(tmp_path: Path) -> None:
    """`cosim run` imports neither the sweep package (its workload cache is made by the command) nor the report
    pages it does not write (proposal, sweep): start-up cost of every run."""
    code = ("import sys; from cosim.cli import main; "
            f"rc = main(['run', '--no-progress', '--no-timeline', '--out', {str(tmp_path / 'out')!r}]); "
            "print(sorted(m for m in sys.modules if m.startswith(('cosim.sweep', 'cosim.report.proposal', "
            "'cosim.report.sweep_report'))))")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COSIM_CACHE_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "out" / "report.html").is_file()
