"""Strict YAML: duplicate keys, YAML 1.1 surprises, and located validation errors."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict

from cosim.catalog.models import Bandwidth
from cosim.errors import CosimInputError
from cosim.yamlio import LocDict, input_error_at, load_yaml, loads_yaml, validate


def err(text: str) -> str:
    with pytest.raises(CosimInputError) as exc:
        loads_yaml(text, "f.yaml")
    return str(exc.value)


def test_duplicate_key_is_rejected_with_both_lines() -> None:
    assert err("a: 1\nb: 2\na: 3\n") == "f.yaml:3:1: a: duplicate key 'a' (first defined at line 1)"


def test_parser_errors_name_the_field_path() -> None:
    text = "devices:\n  - {id: a}\n  - id: b\n    opts: {x: 1, x: 2}\n"
    assert err(text) == "f.yaml:4:18: devices[1].opts.x: duplicate key 'x' (first defined at line 4)"
    assert err("a:\n  b: [1, off]\n").startswith("f.yaml:2:10: a.b[1]: 'off' is a boolean")


@pytest.mark.parametrize("word", ["on", "off", "yes", "no", "On", "NO", "y", "n"])
def test_yaml11_booleans_are_rejected(word: str) -> None:
    assert err(f"flag: {word}\n").startswith("f.yaml:1:7: ")
    assert "YAML 1.1" in err(f"flag: {word}\n")


def test_yaml11_octal_is_rejected() -> None:
    assert err("n: 010\n").startswith("f.yaml:1:4: n: '010' is octal in YAML 1.1")


def test_yaml11_merge_key_is_rejected_at_its_line() -> None:
    """The loader resolves no YAML 1.1 tags, so ``<<`` was a plain key: a scenario's ``layout: {<<: *base}`` failed
    later as ``unknown key '<<'`` located at the anchor's line, not the ``<<`` (s11-read3). An alias still works."""
    text = "base: &b {tp: 2}\nlayout:\n  <<: *b\n  pp: 2\n"
    assert err(text).startswith("f.yaml:3:3: layout.<<: '<<' is a merge key in YAML 1.1")
    assert loads_yaml("a: &x {t: 1}\nb: *x\nc: {'<<': 1}\n") == {"a": {"t": 1}, "b": {"t": 1}, "c": {"<<": 1}}


def test_yaml12_scalars() -> None:
    data = loads_yaml("a: 64e9\nb: 1_000\nc: '010'\nd: [true, False, null, 0x10, 0o10, 2.5, -3]\ne: on-call\n")
    assert data == {"a": 64e9, "b": 1000, "c": "010", "d": [True, False, None, 16, 8, 2.5, -3], "e": "on-call"}
    assert isinstance(data["a"], float)


def test_keys_stay_strings() -> None:
    assert loads_yaml("on: 1\n1: 2\n") == {"on": 1, "1": 2}


def test_malformed_yaml_names_line() -> None:
    assert err("a: [1, 2\n").startswith("f.yaml:2:1: malformed YAML")


def test_missing_file(tmp_path) -> None:
    with pytest.raises(CosimInputError, match=r"nope\.yaml: file not found"):
        load_yaml(tmp_path / "nope.yaml")


class Link(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    bandwidth: Bandwidth


class Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")
    links: list[Link]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("links:\n  - name: a\n    bandwidth: 450\n",
         "d.yaml:3:16: links[0].bandwidth: bare number 450 needs a unit, e.g. '450 GB/s'"),
        ("links:\n  - name: a\n    bandwidth: 450 GHz\n",
         "d.yaml:3:16: links[0].bandwidth: 'GHz' is not a bandwidth unit; write it like '450 GB/s'"),
        ("links:\n  - {name: a, bandwidth: 1 GB/s, colour: red}\n",
         "d.yaml:2:42: links[0].colour: unknown key 'colour'; valid: name, bandwidth"),
        ("links:\n  - name: a\n", "d.yaml:2:5: links[0].bandwidth: missing required field 'bandwidth'"),
    ],
)
def test_validation_errors_are_located(text: str, message: str) -> None:
    with pytest.raises(CosimInputError) as exc:
        validate(Doc, loads_yaml(text, "d.yaml"))
    assert str(exc.value) == message


def test_input_error_at_points_into_document() -> None:
    data = loads_yaml("devices:\n  - id: gpu0\n  - id: gpu0\n", "t.yaml")
    assert isinstance(data, LocDict)
    e = input_error_at(data, ["devices", 1, "id"], "duplicate device id 'gpu0'")
    assert str(e) == "t.yaml:3:9: devices[1].id: duplicate device id 'gpu0'"
