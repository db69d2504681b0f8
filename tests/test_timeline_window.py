"""The repeated period of a coalesced step's timeline written from a serialized template
(``cosim.output.timeline._window_lines``) is byte for byte what serializing its copies as event dicts gives
(``RepeatedWindow.expanded``), also where the template must not be used."""

from __future__ import annotations

from typing import Any

import pytest

from cosim.output.timeline import _lines, _window_lines
from cosim.replay.periodic import RepeatedWindow


def _events() -> list[dict[str, Any]]:
    """A window of Kineto-like events: kernels with ids in args, launches and flow arrows, an event without ids,
    times that round to a half at 3 decimals."""
    evs: list[dict[str, Any]] = []
    for k in range(40):
        t = 1000.0 + 0.1 * k + (0.0005 if k % 5 == 0 else 0.0)
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": t,
                    "dur": 1.5, "args": {"External id": 100_000 + k, "correlation": 200_000 + k}})
        evs.append({"ph": "s", "id": 200_000 + k, "pid": 7, "tid": 7, "ts": t, "cat": "ac2g", "name": "ac2g"})
        evs.append({"ph": "X", "cat": "kernel", "name": f"gemm_{k % 3}", "pid": 0, "tid": 7, "ts": t + 3.25,
                    "dur": 2.0, "args": {"External id": 100_000 + k, "queued": 0, "device": 0,
                                         "correlation": 200_000 + k, "grid": [1, 2, 3]}})
        evs.append({"ph": "X", "cat": "user_annotation", "name": "## forward ##", "pid": 7, "tid": 7,
                    "ts": t + 0.3, "dur": 9.0, "args": {}})
    return evs


@pytest.mark.parametrize("copies", [0, 1, 5])
def test_template_copies_equal_the_event_dicts(copies: int) -> None:
    tail = [{"ph": "X", "cat": "coalesced", "pid": 7, "tid": 7, "name": "3 more periods", "ts": 5000.0, "dur": 1.0,
             "args": {"periods": 3}}]
    for t in ([], tail):
        rw = RepeatedWindow(_events(), copies, 123.4567, 1 << 40, list(t))
        want = _lines(rw.expanded())
        assert _window_lines(rw).lines() == want
        if copies:
            assert want.count(b'"id":') == copies * 40  # the copies are there, ids moved
            assert b'"id":%d' % (200_000 + (1 << 40)) in want


def test_untrusted_templates_fall_back_to_the_dicts() -> None:
    evs = _events()
    evs[2]["name"] = "gemm \ue000T3 with the placeholder character"
    rw = RepeatedWindow(evs, 3, 50.0, 1 << 40)
    assert _window_lines(rw).lines() == _lines(rw.expanded())
    evs = _events()
    evs[1]["id"] = 2.5  # not an integer id
    rw = RepeatedWindow(evs, 3, 50.0, 1 << 40)
    assert _window_lines(rw).lines() == _lines(rw.expanded())


def test_pid_moves_on_the_template_equal_moves_of_the_copies() -> None:
    """The combined file's copies: the pid move applied to the template once equals it applied to every copy."""
    from cosim.output.timeline import _repid

    rw = RepeatedWindow(_events(), 4, 77.125, 1 << 40)

    def move(b: bytes) -> bytes:
        return _repid(b, [0, 7], lambda p: 3001 + p)

    got = _window_lines(rw).lines(move)
    assert got == move(_lines(rw.expanded()))
    assert b'"pid":3008,' in got and b'"pid":7,' not in got
