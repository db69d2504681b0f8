"""Whole numbers written as floats (``3.0``) in the files the s15-fuzz checks guard: bad7230 read them (``int(3.0)``)
and a JSON or YAML writer that keeps every number a float (pandas, a spreadsheet export) writes them so; the
checks that replaced ``int()`` must still take them, and still refuse a fraction (s15-rev)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from cosim.capture.config import load_model_config
from cosim.errors import CosimInputError
from cosim.models.profile import load_profile
from cosim.workload.synth.routing import RoutingSpec, _file_shares

_B300 = Path(__file__).resolve().parents[1] / "cosim" / "models" / "data" / "b300.yaml"


def _profile(tmp_path: Path, edit: object) -> Path:
    doc = yaml.safe_load(_B300.read_text())
    edit(doc)  # type: ignore[operator]
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc, sort_keys=False))
    return f


def _first(d: dict) -> dict:
    return next(iter(d.values()))


def test_profile_sample_counts_written_as_floats_load_as_ints(tmp_path: Path) -> None:
    """``n: 3.0`` of a kernel family, a launch law and a launch family, and a kernel-database row's count ``3.0``:
    the same profile as with ``3``."""
    def as_floats(d: dict) -> None:
        _first(d["kernel_scale"])["n"] = 3.0
        _first(d["launch"]["laws"])["n"] = 3.0
        _first(d["launch"]["family"])["n"] = 3.0
        d["kernel_db"]["rows"][0][-1] = 3.0

    def as_ints(d: dict) -> None:
        _first(d["kernel_scale"])["n"] = 3
        _first(d["launch"]["laws"])["n"] = 3
        _first(d["launch"]["family"])["n"] = 3
        d["kernel_db"]["rows"][0][-1] = 3

    (tmp_path / "f").mkdir()
    (tmp_path / "i").mkdir()
    got, want = load_profile(_profile(tmp_path / "f", as_floats)), load_profile(_profile(tmp_path / "i", as_ints))
    assert got.kernel_scale == want.kernel_scale and got.kernel_db == want.kernel_db and got.launch == want.launch
    assert type(_first(got.kernel_scale)["n"]) is int and all(type(n) is int for _, n in got.kernel_db.values())


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda d: _first(d["kernel_scale"]).update(n=2.5), "expected a sample count (a whole number >= 0), got 2.5"),
    (lambda d: _first(d["launch"]["family"]).update(n=float("inf")), "got inf"),
    (lambda d: d["kernel_db"]["rows"][0].__setitem__(-1, 2.5), "row 0: expected 10 key fields, a median > 0 and a "
                                                               "count"),
])
def test_profile_sample_counts_that_are_not_whole_are_refused(edit: object, problem: str, tmp_path: Path) -> None:
    with pytest.raises(CosimInputError, match=r"p\.yaml") as e:
        load_profile(_profile(tmp_path, edit))
    assert problem in str(e.value)


def _shares(tmp_path: Path, layers: list[dict]) -> list[np.ndarray]:
    w = tmp_path / "w.yaml"
    w.write_text(yaml.safe_dump({"layers": layers, "experts": [1] * 8}))
    card = load_model_config("tiny-moe")
    return [_file_shares(RoutingSpec(model=str(w)), card, layer) for layer in (0, 1)]


def test_routing_file_layer_written_as_a_float(tmp_path: Path) -> None:
    """``layer: 1.0`` is layer 1 (its weights, not the default ``experts``), as ``layer: 1``."""
    hot = [8, 1, 1, 1, 1, 1, 1, 1]
    got = _shares(tmp_path, [{"layer": 1.0, "experts": hot}])
    assert got[0].tolist() == [1] * 8 and got[1].tolist() == hot


@pytest.mark.parametrize("layer", [1.5, float("nan"), True, "1"])
def test_routing_file_layer_that_is_not_whole_is_refused(layer: object, tmp_path: Path) -> None:
    with pytest.raises(CosimInputError, match=r"w.yaml:\d+:\d+: layers\[0\]: expected \{layer: <whole number>"):
        _shares(tmp_path, [{"layer": layer, "experts": [1] * 8}])
