"""summary.json and the --json print written from one serialization (cosim.output.files.SortedJson)."""

from __future__ import annotations

import json
import math

import pytest

from cosim.output.files import SortedJson


def _ref(obj: dict) -> str:
    return json.dumps(obj, indent=2, sort_keys=True, allow_nan=False)


CASES = [
    {},
    {"b": 1, "a": [1, 2.5, {"z": None, "y": "é"}], "c": {}, "d": [], "e": {"k": [[]]}},
    {"step_time_s": 4.602438275288603, "ranks": [{"rank": 0, "breakdown": {"x": 1e-7, "y": 1e16}}]},
]


@pytest.mark.parametrize("obj", CASES)
def test_same_text_as_json_dumps(obj: dict) -> None:
    doc = SortedJson(obj)
    assert doc.text() == _ref(obj)
    more = {"out": "cosim-out/x", "a": "replaced", "sets": {"nodes": "64"}, "baseline_dir": None}
    assert doc.text(more) == _ref(obj | more)  # added keys in their sorted places, a replaced one replaced


def test_other_keys_and_nan_as_json_does() -> None:
    obj = {1: "one", "2": "two"}  # json sorts before it turns keys into strings: a mixed dict cannot be sorted
    with pytest.raises(TypeError):
        SortedJson(obj).text()
    assert SortedJson({3: "c", 1: "a"}).text() == _ref({3: "c", 1: "a"})
    with pytest.raises(ValueError):
        SortedJson({"x": math.nan}).text()


def test_entries_replaced_before_serialized() -> None:
    """An entry that ``more`` replaces is never serialized: ``json.dumps(obj | more)`` never sees it (a NaN, or a
    dict whose keys cannot be sorted, there is no error), and errors come from the entries in sorted key order."""
    bad = {"a": {1: 2, "1": 3}, "x": math.nan, "z": 1}
    more = {"a": 5, "x": None}
    assert SortedJson(bad).text(more) == _ref(bad | more)
    with pytest.raises(TypeError):  # "a" sorts first: json.dumps fails on it before reaching "x"'s NaN
        SortedJson(bad).text({"x": None})
    with pytest.raises(TypeError):  # a non-string key in ``more``: json.dumps sorts the top level first
        SortedJson({"x": math.nan}).text({2: 3})
