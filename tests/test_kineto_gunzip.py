"""The Kineto importer's gunzip (`kineto._read_bytes`): one zlib-ng call for a one-member file, the streamed
reader for anything else; the same bytes as the standard library's, one-line errors for damaged files."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from cosim.errors import CosimInputError
from cosim.workload import kineto

_TEXT = b'{"traceEvents": [' + b",".join(b'{"ph": "X", "name": "op%d", "ts": %d, "dur": 1}' % (i, i)
                                      for i in range(5000)) + b"]}"


def _write(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_one_member_inflated_as_gzip_does(tmp_path: Path) -> None:
    p = _write(tmp_path, "t.json.gz", gzip.compress(_TEXT, 6))
    assert kineto._read_bytes(p) == _TEXT


def test_two_members_and_plain_text(tmp_path: Path) -> None:
    half = len(_TEXT) // 2
    p = _write(tmp_path, "t.json.gz", gzip.compress(_TEXT[:half]) + gzip.compress(_TEXT[half:]))
    assert kineto._read_bytes(p) == _TEXT
    assert kineto._read_bytes(_write(tmp_path, "t.json", _TEXT)) == _TEXT


@pytest.mark.parametrize("damage", ["truncated", "crc", "garbage"])
def test_damaged_file_is_one_line_error(tmp_path: Path, damage: str) -> None:
    z = bytearray(gzip.compress(_TEXT))
    if damage == "truncated":
        z = z[: len(z) // 2]
    elif damage == "crc":
        z[-8] ^= 0xFF
    else:
        z[20:40] = b"\xff" * 20
    p = _write(tmp_path, "t.json.gz", bytes(z))
    try:
        out = kineto._read_bytes(p)
    except CosimInputError as exc:
        assert "\n" not in str(exc) and "t.json.gz" in str(exc)
    else:  # a deflate stream can survive some garbage: then it must be what zlib reads too
        assert out == zlib.decompress(bytes(z), wbits=31)
