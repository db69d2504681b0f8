"""``cosim calibrate --from-traces``: the inputs-hash cache and ET + Kineto pairs given as separate files.

Tests that need real traces copy small HTA ones from ``../shared/traces`` into ``tmp_path`` (never into the repo)
and skip when the shared folder is absent. The CLI runs in-process (``cosim.cli.main``) to keep them fast.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosim.cli import main
from cosim.models.profile import inputs_hash, load_profile
from cosim.resources import shared_dir

SHARED = shared_dir()
needs_shared = pytest.mark.skipif(SHARED is None, reason="real traces need ../shared/traces (set COSIM_SHARED)")


def _hta(name: str) -> Path:
    """One small A100 trace file of the shared HTA set."""
    assert SHARED is not None
    return SHARED / "traces" / "hta" / name


KINETO, ET = "simple-add-kineto-for-et.json.gz", "simple-add-et.json.gz"
"""A Kineto trace (4 GPU kernels, no shapes) and the Execution Trace of the same run (shapes, dtypes)."""


def _calibrate(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict:
    """Run ``cosim calibrate ARGS --json`` in-process; the JSON result (asserting exit status 0)."""
    capsys.readouterr()
    rc = main(["calibrate", *map(str, args), "--json"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return json.loads(out)


@needs_shared
def test_cache_invalidated_when_directory_gains_a_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copy(_hta(KINETO), d)
    out, db = tmp_path / "p.yaml", tmp_path / "db"
    first = _calibrate(capsys, "--from-traces", d, "--out", out)
    assert first["cached"] is False
    assert _calibrate(capsys, "--from-traces", d, "--out", out)["cached"] is True  # unchanged inputs: reused

    shutil.copy(_hta(ET), d)  # same directory argument, one more trace file in it
    second = _calibrate(capsys, "--from-traces", d, "--out", out, "--db-out", db)
    assert second["cached"] is False and second["inputs_hash"] != first["inputs_hash"]
    from cosim.models.fit import load_db

    assert np.isfinite(load_db(db / "a100-sxm-80gb.csv").feats.bytes).all()  # the ET's shapes were used


@needs_shared
def test_cache_invalidated_when_trace_content_changes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = tmp_path / "t.json.gz"
    shutil.copy(_hta("event-sync.json.gz"), t)
    out = tmp_path / "p.yaml"
    first = _calibrate(capsys, "--from-traces", t, "--out", out)
    shutil.copy(_hta(KINETO), t)  # same name, other content
    second = _calibrate(capsys, "--from-traces", t, "--out", out)
    assert second["cached"] is False and second["inputs_hash"] != first["inputs_hash"]


@needs_shared
def test_cache_hit_still_writes_db_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _hta(KINETO)
    out, db = tmp_path / "p.yaml", tmp_path / "db"
    _calibrate(capsys, "--from-traces", t, "--out", out)
    res = _calibrate(capsys, "--from-traces", t, "--out", out, "--db-out", db)
    from cosim.models.fit import load_db

    assert (db / "a100-sxm-80gb.csv").is_file(), "a cache hit skipped --db-out"
    assert len(load_db(db / "a100-sxm-80gb.csv").feats) == 4
    assert res["cached"] is True and res["gpus"] == ["a100-sxm-80gb"]


@needs_shared
def test_options_name_and_version_are_in_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    t = _hta("event-sync.json.gz")
    out = tmp_path / "p.yaml"
    _calibrate(capsys, "--from-traces", t, "--out", out, "--name", "alpha")
    res = _calibrate(capsys, "--from-traces", t, "--out", out, "--name", "beta")
    assert res["cached"] is False and load_profile(out).name == "beta"
    beta_h100 = ("--from-traces", t, "--out", out, "--name", "beta", "--accelerator", "h100-sxm5")
    res = _calibrate(capsys, *beta_h100)
    assert res["cached"] is False and load_profile(out).accelerator == "h100-sxm5"
    assert _calibrate(capsys, *beta_h100)["cached"] is True
    import cosim

    monkeypatch.setattr(cosim, "__version__", cosim.__version__ + ".post1")
    assert _calibrate(capsys, *beta_h100)["cached"] is False


def test_inputs_hash_reads_files_by_content_and_strings_as_values(tmp_path: Path) -> None:
    f = tmp_path / "a.json"
    f.write_text("{}")
    k1 = inputs_hash(["x", f])
    f.write_text("[]")  # same size: an mtime-and-size key could miss this
    assert inputs_hash(["x", f]) != k1
    assert inputs_hash([str(f)]) == inputs_hash([str(f)])  # a str is a value, hashed without reading the file
    f.write_text("{}")
    assert inputs_hash(["x", f]) == k1


@needs_shared
def test_et_and_kineto_as_two_arguments_give_shapes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cosim.models.fit import KernelDB

    kin, et = _hta(KINETO), _hta(ET)
    d = tmp_path / "pair"
    d.mkdir()
    shutil.copy(kin, d)
    shutil.copy(et, d)
    ref = KernelDB.from_traces([d])["a100-sxm-80gb"]
    for args in ([kin, et], [et, kin]):
        dbs = KernelDB.from_traces(args)
        assert list(dbs) == ["a100-sxm-80gb"]
        db = dbs["a100-sxm-80gb"]
        assert len(db.feats) == len(ref.feats) == 4
        rows = [db.feats.row(i) for i in range(4)]
        assert all(r["dtype"] == "fp32" and np.isfinite(r["bytes"]) and r["bytes"] > 0 for r in rows)
        assert repr(rows) == repr([ref.feats.row(i) for i in range(4)])  # repr: NaN m, n, k compare equal
        assert set(db.source) == {str(kin)}
    out = tmp_path / "x.yaml"
    res = _calibrate(capsys, "--from-traces", kin, et, "--out", out)
    assert res["accelerator"] == "a100-sxm-80gb" and res["fit_errors"]["elementwise"]["n"] == 4


@needs_shared
def test_kineto_alone_still_loads_without_shapes() -> None:
    from cosim.models.fit import KernelDB

    db = KernelDB.from_traces([_hta(KINETO)])["a100-sxm-80gb"]
    assert len(db.feats) == 4 and not np.isfinite(db.feats.bytes).any()
