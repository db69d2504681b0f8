"""Sweeps: spec checks, local and Dask executors, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.sweep import InlineExecutor, load_sweep, make_executor, run_sweep

SCN = "moe-ep2-decode-dgx-h100"


def _spec(tmp: Path, body: str, name: str = "sweep.yaml") -> Path:
    p = tmp / name
    p.write_text(body)
    return p


def test_spec_errors_are_one_line_with_file_and_line(tmp_path: Path) -> None:
    bad_key = _spec(tmp_path, f"base: {SCN}\nparameters:\n  links.nvlink4.bandwith: ['1 GB/s']\n", "a.yaml")
    with pytest.raises(CosimInputError) as ei:
        load_sweep(bad_key)
    msg = str(ei.value)
    assert "a.yaml:3" in msg and "bandwith" in msg and "\n" not in msg
    bad_knob = _spec(tmp_path, f"base: {SCN}\nparameters:\n  host.sped: [1, 2]\n", "b.yaml")
    with pytest.raises(CosimInputError, match=r"b\.yaml:3.*unknown knob"):
        load_sweep(bad_knob)
    bad_combine = _spec(tmp_path, f"base: {SCN}\ncombine: cartesian\nparameters:\n  host.speed: [1]\n", "c.yaml")
    with pytest.raises(CosimInputError, match=r"c\.yaml:2.*bad combine mode 'cartesian'"):
        load_sweep(bad_combine)
    empty = _spec(tmp_path, f"base: {SCN}\nparameters:\n  host.speed: []\n", "d.yaml")
    with pytest.raises(CosimInputError, match=r"d\.yaml:3.*empty"):
        load_sweep(empty)
    no_params = _spec(tmp_path, f"base: {SCN}\nparameters: {{}}\n", "e.yaml")
    with pytest.raises(CosimInputError, match="empty grid"):
        load_sweep(no_params)
    zip_len = _spec(tmp_path, f"base: {SCN}\ncombine: zip\nparameters:\n  host.speed: [1, 2]\n"
                              "  projection.dtype: [bf16]\n", "f.yaml")
    with pytest.raises(CosimInputError, match="one length"):
        load_sweep(zip_len)
    bad_value = _spec(tmp_path, f"base: {SCN}\nparameters:\n  links.nvlink4.bandwidth: ['25 GB/s', 25]\n", "g.yaml")
    with pytest.raises(CosimInputError, match=r"g\.yaml:3"):
        load_sweep(bad_value)


def test_combine_modes(tmp_path: Path) -> None:
    grid = load_sweep(_spec(tmp_path, f"base: {SCN}\nparameters:\n  host.speed: [1, 2]\n  projection.dtype: [bf16, fp8]\n"))
    assert len(grid.points()) == 4
    z = load_sweep(_spec(tmp_path, f"base: {SCN}\ncombine: zip\nparameters:\n  host.speed: [1, 2]\n"
                                   "  projection.dtype: [bf16, fp8]\n", "z.yaml"))
    assert z.points() == [{"host.speed": "1", "projection.dtype": "bf16"}, {"host.speed": "2", "projection.dtype": "fp8"}]
    body = (f"base: {SCN}\ncombine: random\nsamples: 5\nseed: 3\nparameters:\n"
            "  links.nvlink4.bandwidth: {low: 10 GB/s, high: 100 GB/s, log: true}\n  host.speed: [1, 2, 4]\n")
    r1, r2 = load_sweep(_spec(tmp_path, body, "r1.yaml")), load_sweep(_spec(tmp_path, body, "r2.yaml"))
    assert r1.points() == r2.points() and len(r1.points()) == 5
    assert all(p["links.nvlink4.bandwidth"].endswith("GB/s") for p in r1.points())


def _two_point_spec(tmp_path: Path) -> Path:
    return _spec(tmp_path, f"name: t\nbase: {SCN}\nparameters:\n  host.speed: [1, 4]\n  links.nvlink4.bandwidth: [25 GB/s]\n")


def test_make_executor_local_kinds() -> None:
    with make_executor("local", workers=1) as ex:  # one worker: in this process, no pool
        assert isinstance(ex, InlineExecutor)
    with make_executor("local", workers=2) as ex:
        assert isinstance(ex, ProcessPoolExecutor) and ex._max_workers == 2
    with pytest.raises(CosimInputError, match="--workers must be >= 1"), make_executor("local", workers=0):
        pass


def test_local_sweep_writes_points_csv_and_report(tmp_path: Path) -> None:
    spec = load_sweep(_two_point_spec(tmp_path))
    with make_executor("local", workers=2) as ex:  # the default local executor: a real process pool
        assert isinstance(ex, ProcessPoolExecutor)
        res = run_sweep(spec, tmp_path / "out", ex, progress=False)
    assert (res.computed, res.skipped, res.failed) == (2, 0, 0)
    rows = res.rows
    assert [r["host.speed"] for r in rows] == ["1", "4"]
    assert rows[1]["step_time_s"] < rows[0]["step_time_s"]  # a 4x faster host helps a host-bound decode step
    assert rows[0]["power_W"] > 0
    csv_text = (tmp_path / "out" / "results.csv").read_text().splitlines()
    assert csv_text[0].startswith("key,status,host.speed,links.nvlink4.bandwidth,step_time_s")
    assert len(csv_text) == 3
    for r in rows:
        d = tmp_path / "out" / "points" / r["key"]
        assert (d / "summary.json").is_file() and (d / "scenario.yaml").is_file() and (d / "result.json").is_file()
    from test_report import plotly_figures

    figs = plotly_figures(tmp_path / "out" / "report.html")
    titles = [f["title"] for f in figs]
    assert "Step time vs host.speed" in titles and "Step time vs power_W" in titles
    line = figs[titles.index("Step time vs host.speed")]["data"][0]
    assert line["x"] == ["1", "4"] and line["y"] == pytest.approx([r["step_time_s"] * 1e3 for r in rows])
    front = next(t for t in figs[titles.index("Step time vs power_W")]["data"] if t["name"] == "Pareto front")
    assert front["y"] == pytest.approx([rows[1]["step_time_s"] * 1e3])  # same power: the faster point alone
    # a rerun computes nothing
    res2 = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert (res2.computed, res2.skipped) == (0, 2)
    assert [r["step_time_s"] for r in res2.rows] == [r["step_time_s"] for r in rows]
    assert not list((tmp_path / "out").glob("points/*/running.json"))  # no point left marked as running


def test_point_that_kills_its_worker_is_isolated_and_the_sweep_goes_on(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """host.speed=3 SIGKILLs the pool worker running it (tests/sweep_killer.py): that breaks the process pool.
    The sweep records the culprit (error.json: the worker died, SIGKILL), completes every other point (those
    running beside it are retried alone; those not started go on in a fresh pool) and writes all rows."""
    import sweep_killer

    import cosim.sweep.runner

    monkeypatch.setattr(cosim.sweep.runner, "run_point", sweep_killer.run_point_or_die)
    spec = load_sweep(_spec(tmp_path, f"name: kill\nbase: {SCN}\nparameters:\n  host.speed: [1, 2, 3, 4, 5, 6]\n"))
    out = tmp_path / "out"
    with make_executor("local", workers=2) as ex:
        res = run_sweep(spec, out, ex, progress=False)
    assert (res.computed, res.skipped, res.failed) == (6, 0, 1)
    by = {r["host.speed"]: r for r in res.rows}
    bad = by.pop(sweep_killer.KILL_VALUE)
    assert bad["status"] == "error" and "worker process died" in bad["error"] and "SIGKILL" in bad["error"]
    err = json.loads((out / "points" / bad["key"] / "error.json").read_text())
    assert err["exitcode"] == -signal.SIGKILL and err["error"] == bad["error"]
    assert not (out / "points" / bad["key"] / "result.json").exists()
    for r in by.values():
        assert r["status"] == "ok" and r["step_time_s"] > 0
        assert (out / "points" / r["key"] / "result.json").is_file()
    import csv

    with open(out / "results.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [t["host.speed"] for t in table] == ["1", "2", "3", "4", "5", "6"]
    assert [t["status"] for t in table] == ["ok", "ok", "error", "ok", "ok", "ok"]
    assert "worker process died" in table[2]["error"]
    assert not list(out.glob("points/*/running.json"))
    # the failed point is retried on the next run (here it runs fine), the others are not recomputed
    monkeypatch.undo()
    res2 = run_sweep(spec, out, None, progress=False)
    assert (res2.computed, res2.skipped, res2.failed) == (1, 5, 0)
    assert not (out / "points" / bad["key"] / "error.json").exists()


def test_failing_point_is_recorded_and_sweep_goes_on(tmp_path: Path) -> None:
    # workload values are only checked when the point runs: a missing one fails that point alone
    spec = load_sweep(_spec(tmp_path, f"base: {SCN}\nparameters:\n  workload: [moe-ep2-decode-cpu, no-such-workload]\n"))
    res = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert res.failed == 1 and res.computed == 2
    bad = next(r for r in res.rows if r["status"] == "error")
    assert "no-such-workload" in bad["error"]
    assert (tmp_path / "out" / "points" / bad["key"] / "error.json").is_file()


def test_parquet_table_matches_csv(tmp_path: Path) -> None:
    pq = pytest.importorskip("pyarrow.parquet", reason="pyarrow not installed (extra 'parquet')")
    import csv

    spec = load_sweep(_spec(tmp_path, f"base: {SCN}\nparameters:\n  workload: [moe-ep2-decode-cpu, no-such-workload]\n"
                                      "  host.speed: [1, 2]\n"))
    run_sweep(spec, tmp_path / "out", None, progress=False)
    with open(tmp_path / "out" / "results.csv", newline="") as fh:
        csv_rows = list(csv.DictReader(fh))
    table = pq.read_table(tmp_path / "out" / "results.parquet")
    assert table.column_names == list(csv_rows[0])
    pq_rows = table.to_pylist()
    assert len(pq_rows) == len(csv_rows) == 4
    for c, p in zip(csv_rows, pq_rows):
        assert c["key"] == p["key"] and c["status"] == p["status"]
        assert c["host.speed"] == p["host.speed"]  # parameters stay strings, as in the spec
        if c["status"] == "ok":
            assert float(c["step_time_s"]) == p["step_time_s"] > 0
        else:  # a failed point has no metrics: empty in CSV, null in Parquet
            assert c["step_time_s"] == "" and p["step_time_s"] is None and "no-such-workload" in p["error"]


def test_dask_local_cluster_sweep(tmp_path: Path) -> None:
    pytest.importorskip("dask.distributed")
    spec = load_sweep(_two_point_spec(tmp_path))
    with make_executor("dask", workers=2) as ex:
        res = run_sweep(spec, tmp_path / "dask", ex, progress=False)
    assert (res.computed, res.failed) == (2, 0)
    local = run_sweep(spec, tmp_path / "local", None, progress=False)
    assert [r["step_time_s"] for r in res.rows] == [r["step_time_s"] for r in local.rows]


def test_cli_sweep_on_an_existing_scheduler(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--scheduler ADDRESS`: points run in another process's worker, reached over TCP (as on SLURM)."""
    distributed = pytest.importorskip("dask.distributed")
    from cosim.cli import main

    spec = _two_point_spec(tmp_path)
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None,
                                  host="127.0.0.1") as cluster:
        rc = main(["sweep", str(spec), "--executor", "dask", "--scheduler", cluster.scheduler_address,
                   "--out", str(tmp_path / "remote"), "--no-progress", "--json"])
    assert rc == 0
    remote = json.loads(capsys.readouterr().out)
    local = run_sweep(load_sweep(spec), tmp_path / "local", None, progress=False)
    assert [r["step_time_s"] for r in remote["rows"]] == [r["step_time_s"] for r in local.rows]


def test_executor_failures_of_one_point_are_recorded(tmp_path: Path) -> None:
    """An executor that fails a point itself (a Dask KilledWorker, a pickling error) gives that point an
    error.json; a broken executor the sweep cannot replace (no fresh pool) fails what is left, and says so."""
    from concurrent.futures import BrokenExecutor, Executor, Future

    class Flaky(Executor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[override]
            fut: Future = Future()
            speed = args[-1]["host.speed"]  # the point's params
            if speed == "2":
                fut.set_exception(RuntimeError("KilledWorker: the point's worker was lost 3 times"))
            elif speed == "3":
                fut.set_exception(BrokenExecutor("a worker process died"))
            else:
                fut.set_result(fn(*args, **kwargs))
            return fut

    spec = load_sweep(_spec(tmp_path, f"base: {SCN}\nparameters:\n  host.speed: [1, 2, 3]\n"))
    res = run_sweep(spec, tmp_path / "out", Flaky(), progress=False)
    assert (res.computed, res.failed) == (3, 2)
    r1, r2, r3 = res.rows
    assert r1["status"] == "ok"
    e2 = json.loads((tmp_path / "out" / "points" / r2["key"] / "error.json").read_text())
    assert e2["error"] == r2["error"] == "RuntimeError: KilledWorker: the point's worker was lost 3 times"
    assert "RuntimeError" in e2["traceback"]
    e3 = json.loads((tmp_path / "out" / "points" / r3["key"] / "error.json").read_text())
    assert e3["error"] == r3["error"] and "executor broke" in r3["error"] and "rerun" in r3["error"]


def _wait_group_gone(pgid: int, timeout: float = 30.0) -> None:
    """Wait until no live process of process group ``pgid`` is left (Linux /proc)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        alive = False
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                alive = True
                break
        if not alive:
            return
        time.sleep(0.02)
    raise AssertionError(f"process group {pgid} still alive after SIGKILL")


def test_kill_midway_then_rerun_loses_and_recomputes_nothing(tmp_path: Path) -> None:
    speeds = [1 + i / 4 for i in range(12)]
    spec_path = _spec(tmp_path, f"name: k\nbase: {SCN}\nparameters:\n  host.speed: {speeds}\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # two pool workers, in a session of their own: the kill takes the sweep and its workers, as a job kill does
    proc = subprocess.Popen([sys.executable, "-m", "cosim", "sweep", str(spec_path), "--out", str(out),
                             "--workers", "2", "--no-progress"], env=env, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 60
    done: list[Path] = []
    while time.time() < deadline and proc.poll() is None:
        done = list(out.glob("points/*/result.json"))
        if len(done) >= 2:
            break
        time.sleep(0.01)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    _wait_group_gone(proc.pid)  # no worker writes after this
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("points/*/result.json")}
    assert finished, "no point finished before the kill"
    assert not (out / "results.csv").exists() or len(finished) == 12
    res = run_sweep(load_sweep(spec_path), out, None, progress=False)
    assert res.skipped == len(finished)
    assert res.computed == 12 - len(finished)
    assert res.failed == 0
    for key, mtime in finished.items():  # finished points were not recomputed
        assert (out / "points" / key / "result.json").stat().st_mtime_ns == mtime
    assert len(list(out.glob("points/*/result.json"))) == 12
    keys = [json.loads(p.read_text())["key"] for p in out.glob("points/*/result.json")]
    assert sorted(keys) == sorted(r["key"] for r in res.rows)


def test_workload_reuse_gives_the_same_figures() -> None:
    from cosim.scenario import WorkloadCache, load_scenario, run_scenario

    _, fresh = run_scenario(load_scenario(SCN), {"host.speed": "2"})
    cache = WorkloadCache()
    _, a = run_scenario(load_scenario(SCN), {"host.speed": "2"}, cache=cache)
    _, b = run_scenario(load_scenario(SCN), {"host.speed": "2"}, cache=cache)
    assert len(cache._items) == 2  # the trace and its projection, loaded once
    for r in (a, b):
        assert r.summary()["step_time_s"] == fresh.summary()["step_time_s"]
        assert r.summary()["breakdown"] == fresh.summary()["breakdown"]


def test_cli_sweep_bad_spec_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cosim.cli import main

    p = _spec(tmp_path, f"base: {SCN}\ncombine: cartesian\nparameters:\n  host.speed: [1]\n")
    assert main(["sweep", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "sweep.yaml:2" in err[0]


def test_topology_knobs_in_a_sweep(tmp_path: Path) -> None:
    # topology.<path> knobs reach into the topology document like a topology file's set: block
    from test_report import plotly_figures

    spec = load_sweep(_spec(tmp_path, f"""name: topo
base: {SCN}
set:
  topology: dgx-h100-4node
  replay.ranks_per_node: 1             # every all-to-all byte crosses PCIe switch -> NIC -> fabric
  host.speed: 100
  nics.cx7-ndr400.port_bandwidth: 800 Gb/s
parameters:
  topology.nodes: [2, 4]
  topology.node.links.nic-pcie.type: [pcie3x16, pcie5x16]
"""))
    res = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert res.failed == 0
    by = {(r["topology.nodes"], r["topology.node.links.nic-pcie.type"]): r for r in res.rows}
    assert by["2", "pcie5x16"]["gpus"] == 16 and by["4", "pcie5x16"]["gpus"] == 32
    assert by["4", "pcie5x16"]["power_W"] == pytest.approx(2 * by["2", "pcie5x16"]["power_W"])
    for n in ("2", "4"):  # a Gen3 NIC switch link slows the NIC-crossing all-to-alls
        assert by[n, "pcie3x16"]["step_time_s"] > by[n, "pcie5x16"]["step_time_s"]
    sc = (tmp_path / "out" / "points" / by["2", "pcie3x16"]["key"] / "scenario.yaml").read_text()
    assert "topology.nodes: '2'" in sc and "topology.node.links.nic-pcie.type: pcie3x16" in sc
    figs = plotly_figures(tmp_path / "out" / "report.html")
    assert sum(f["data"][0]["type"] == "heatmap" for f in figs if f["data"]) == 1
    pw = next(f for f in figs if f["title"] == "Step time vs power_W")
    assert sorted(set(pw["data"][0]["x"])) == pytest.approx([12.6, 25.2])  # kW: 2 and 4 nodes


def test_topology_knob_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _spec(tmp_path, f"base: {SCN}\nset:\n  topology: dgx-h100-4node\nparameters:\n"
                          "  topology.fabric.oversubscriptio: [1, 2]\n", "t1.yaml")
    with pytest.raises(CosimInputError, match=r"t1\.yaml:5.*topology\.fabric\.oversubscriptio.*unknown key") as ei:
        load_sweep(bad)
    assert "\n" not in str(ei.value)
    bad = _spec(tmp_path, f"base: {SCN}\nparameters:\n  topology.links.gpu-pcie.type: [pcie5x16, pcie9x16]\n",
                "t2.yaml")
    with pytest.raises(CosimInputError, match=r"t2\.yaml:3:\d+: topology\.links\.gpu-pcie\.type\[1\].*pcie9x16"):
        load_sweep(bad)
    bad = _spec(tmp_path, f"base: {SCN}\nparameters:\n  topology.links.nope.type: [pcie5x16]\n", "t3.yaml")
    with pytest.raises(CosimInputError, match="no entry with name 'nope'"):
        load_sweep(bad)
    # the same knob family on cosim run --set
    from cosim.cli import main

    assert main(["run", SCN, "--set", "topology.fabric.x=1", "--out", str(tmp_path / "r"), "--no-timeline"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "topology.fabric.x" in err[0]
    assert main(["run", SCN, "--set", "topology.links.gpu-pcie.type=pcie3x16", "--out", str(tmp_path / "r"),
                 "--no-timeline", "--json"]) == 0
    assert "pcie3x16" in (tmp_path / "r" / "scenario.yaml").read_text()


def test_unexpected_exception_leaves_error_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import cosim.scenario

    real = cosim.scenario.run_scenario

    def flaky(scn, sets=None, cache=None):
        if (sets or {}).get("host.speed") == "2":
            raise TypeError("boom: not a CosimError")
        return real(scn, sets, cache)

    monkeypatch.setattr(cosim.scenario, "run_scenario", flaky)
    spec = load_sweep(_spec(tmp_path, f"base: {SCN}\nparameters:\n  host.speed: [1, 2]\n"))
    res = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert (res.computed, res.failed) == (2, 1)
    bad = next(r for r in res.rows if r["status"] == "error")
    err = json.loads((tmp_path / "out" / "points" / bad["key"] / "error.json").read_text())
    assert err["error"] == "TypeError: boom: not a CosimError" and "Traceback" in err["traceback"]
    assert next(r for r in res.rows if r["status"] == "ok")["step_time_s"] > 0


def test_point_key_covers_topology_file_contents(tmp_path: Path) -> None:
    topo = tmp_path / "mytopo.yaml"
    topo.write_text("name: mytopo\nextends: dgx-h100\nset:\n  links.nvlink4.bandwidth: 25 GB/s\n")
    (tmp_path / "scn.yaml").write_text("name: s\nworkload: moe-ep2-decode-cpu\ntopology: mytopo.yaml\n"
                                       "replay: {collectives: simulated}\n")
    spec = load_sweep(_spec(tmp_path, "base: scn.yaml\nparameters:\n  host.speed: [1]\n"))
    r1 = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert r1.computed == 1
    assert run_sweep(spec, tmp_path / "out", None, progress=False).skipped == 1  # unchanged: reused
    topo.write_text("name: mytopo\nextends: dgx-h100\nset:\n  links.nvlink4.bandwidth: 2 GB/s\n")
    r2 = run_sweep(spec, tmp_path / "out", None, progress=False)
    assert (r2.computed, r2.skipped) == (1, 0)  # the edited file is not answered from the old point
    assert r2.rows[0]["key"] != r1.rows[0]["key"]
    assert r2.rows[0]["step_time_s"] > r1.rows[0]["step_time_s"]  # 12x less NVLink bandwidth


def test_ctrl_c_stops_a_sweep_keeps_finished_points_and_exits_130(tmp_path: Path) -> None:
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) at a few of 24 points: the sweep stops
    at once with exit 130 and one line on stderr, the running points are cancelled (their workers gone, no
    error.json, no marker left), the finished points are kept and a rerun computes only the rest."""
    speeds = [1 + i / 8 for i in range(24)]
    spec_path = _spec(tmp_path, f"name: c\nbase: {SCN}\nparameters:\n  host.speed: {speeds}\n")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    # The sweep starts as a terminal's foreground command does, with SIGINT at its default: a process started
    # with SIGINT ignored (a background job of a shell without job control, `pytest ... &` in a script) passes
    # that on to its children, and Python then installs no KeyboardInterrupt handler: the sweep would (rightly,
    # as a background job) ignore the Ctrl-C and run to the end with exit 0.
    proc = subprocess.Popen([sys.executable, "-m", "cosim", "sweep", str(spec_path), "--out", str(out),
                             "--workers", "2", "--no-progress"], env=env, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None and len(list(out.glob("points/*/result.json"))) < 2:
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep ended before Ctrl-C"
    at_sigint = len(list(out.glob("points/*/result.json")))
    os.killpg(proc.pid, signal.SIGINT)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"the sweep was still running 60 s after Ctrl-C ({at_sigint} of 24 points done)") from None
    stopped_s = time.monotonic() - t0
    _wait_group_gone(proc.pid, timeout=5)  # no worker outlives the sweep
    finished = {p.parent.name: p.stat().st_mtime_ns for p in out.glob("points/*/result.json")}
    print(f"Ctrl-C at {at_sigint}/24 points: stopped in {stopped_s:.2f} s with {len(finished)} finished")
    assert proc.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0] == (f"cosim: interrupted: {len(finished)} of 24 points finished (kept in "
                                            f"{out / 'points'}); rerun the same sweep to compute the rest"), err
    # the running points were cancelled, not run to the end: at most the two running ones finished meanwhile
    assert at_sigint <= len(finished) <= at_sigint + 2
    assert not list(out.glob("points/*/error.json")) and not list(out.glob("points/*/running.json"))
    assert not (out / "results.csv").exists()
    res = run_sweep(load_sweep(spec_path), out, None, progress=False)
    assert (res.skipped, res.computed, res.failed) == (len(finished), 24 - len(finished), 0)
    for key, mtime in finished.items():
        assert (out / "points" / key / "result.json").stat().st_mtime_ns == mtime


def test_cancel_executor_waits_for_the_pool_manager_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C of a sweep: the pool's manager thread must be gone when cancel_executor returns. Left running (it is
    slow to notice its killed workers on a loaded machine: made slow here), it closes its wake-up pipe while the
    interpreter's exit hook writes to it, and the user sees 'Exception ignored ... OSError: [Errno 9] Bad file
    descriptor' after 'cosim: interrupted' (seen in test_ctrl_c_stops_a_sweep_keeps_finished_points_and_exits_130
    under load)."""
    import concurrent.futures.process as cfp
    import time
    from concurrent.futures import ProcessPoolExecutor
    from typing import Any

    from cosim.sweep.executors import cancel_executor

    slow = cfp._ExecutorManagerThread.join_executor_internals

    def late(self: object) -> None:
        time.sleep(0.5)
        slow(self)  # type: ignore[arg-type]

    monkeypatch.setattr(cfp._ExecutorManagerThread, "join_executor_internals", late)
    ex = ProcessPoolExecutor(2)
    for _ in range(4):
        ex.submit(time.sleep, 30)
    time.sleep(0.3)  # the workers have started
    manager: Any = ex._executor_manager_thread
    assert manager is not None and manager.is_alive()
    cancel_executor(ex)
    assert not manager.is_alive()


_OOM_DECODE = """name: dec
workload:
  synthetic:
    model: qwen3-30b-a3b
    mode: decode
    layout: {ep: 8}
    batch: {requests_per_gpu: 100000, context: 4096}   # 37.5 TB of KV cache per GPU
    precision: bf16
topology: dgx-h100
"""


def test_base_every_point_cannot_synthesize_is_one_error_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # no parameter changes what the synthesis checks read: every point would fail on the base's own error
    from cosim.cli import main

    _spec(tmp_path, _OOM_DECODE, "dec.yaml")
    p = _spec(tmp_path, "base: dec.yaml\nparameters:\n  links.nvlink4.bandwidth: ['25 GB/s', '50 GB/s']\n")
    assert main(["sweep", str(p), "--out", str(tmp_path / "o"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dec.yaml:7:" in err[0] and "out of memory" in err[0], err
    assert not (tmp_path / "o").exists()
    # a layout that does not divide the GPUs, the same way
    _spec(tmp_path, _OOM_DECODE.replace("{ep: 8}", "{ep: 8, tp: 3}"), "dec.yaml")
    with pytest.raises(CosimInputError, match=r"dec\.yaml:6:\d+: .*tp") as ei:
        load_sweep(p)
    assert "\n" not in str(ei.value)
    # the sweep's own set: is the problem: its line in the sweep file
    _spec(tmp_path, _OOM_DECODE.replace("100000", "64"), "dec.yaml")
    q = _spec(tmp_path, "base: dec.yaml\nset:\n  workload.synthetic.batch.requests_per_gpu: 100000\n"
                        "parameters:\n  host.speed: [1, 2]\n", "s.yaml")
    with pytest.raises(CosimInputError, match=r"s\.yaml:3:\d+: set: .*every point: .*out of memory"):
        load_sweep(q)


def test_base_that_a_point_can_synthesize_runs_every_point(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    # a parameter changes the checked step: each point is checked as it runs, a failing one records its error
    from cosim.cli import main

    _spec(tmp_path, _OOM_DECODE, "dec.yaml")
    p = _spec(tmp_path, "base: dec.yaml\nparameters:\n  workload.synthetic.batch.requests_per_gpu: [100000, 64]\n")
    res = run_sweep(load_sweep(p), tmp_path / "o", None, progress=False)
    assert [r["status"] for r in res.rows] == ["error", "ok"]
    assert "out of memory" in res.rows[0]["error"]
    # every point fails, each on an error of its own (memory differs): per-point errors, exit status 1
    q = _spec(tmp_path, "base: dec.yaml\nparameters:\n  workload.synthetic.batch.requests_per_gpu: [100000, 50000]\n",
              "q.yaml")
    assert main(["sweep", str(q), "--out", str(tmp_path / "q"), "--no-progress", "--workers", "1"]) == 1
    out = capsys.readouterr().out
    assert out.count("out of memory") == 2 and "2 failed" in out


def test_base_check_leaves_a_bug_to_the_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # only input errors refuse the sweep up front; any other exception of the checks is each point's error.json
    import cosim.workload.synth
    from cosim.scenario import load_scenario
    from cosim.sweep.spec import run_error

    _spec(tmp_path, _OOM_DECODE, "dec.yaml")
    scn = load_scenario(str(tmp_path / "dec.yaml"))
    assert run_error(scn, {}) is not None and run_error(scn, {"workload.synthetic.batch.requests_per_gpu": "64"}) is None

    def broken(*a: object, **k: object) -> None:
        raise TypeError("a bug")

    monkeypatch.setattr(cosim.workload.synth, "synthesize", broken)
    assert run_error(scn, {}) is None
