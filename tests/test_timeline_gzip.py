"""The timeline's gzip writer (cosim.output.timeline._GzipOut): its file depends on the content written, not on how
the writes cut it, and holds exactly that content."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from cosim.output.timeline import _GzipOut


def _write(path: Path, parts: list[bytes]) -> bytes:
    with _GzipOut(path) as fh:
        for p in parts:
            fh.write(p)
    return path.read_bytes()


def test_same_content_same_file_whatever_the_cuts(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    words = [b'{"ph":"X","ts":%d,"dur":%d},\n' % (int(a), int(b)) for a, b in rng.integers(0, 10**6, (40_000, 2))]
    data = b"".join(words)
    block = _GzipOut.BLOCK
    assert len(data) > 3 * block  # several full blocks and a short last one
    cuts = {
        "one write": [data],
        "per line": words,
        "exact blocks": [data[i:i + block] for i in range(0, len(data), block)],
        "odd pieces": [data[i:i + 77_777] for i in range(0, len(data), 77_777)],
        "empty writes between": [x for i in range(0, len(data), 5_000) for x in (b"", data[i:i + 5_000])],
    }
    files = {name: _write(tmp_path / f"{k}.gz", parts) for k, (name, parts) in enumerate(cuts.items())}
    first = files["one write"]
    assert gzip.decompress(first) == data
    for name, b in files.items():
        assert b == first, name


def test_empty_file(tmp_path: Path) -> None:
    assert gzip.decompress(_write(tmp_path / "e.gz", [])) == b""
    assert gzip.decompress(_write(tmp_path / "f.gz", [b"", b"x"])) == b"x"
