"""``cosim run``'s phase bar: on stderr only (where it is a terminal), cleared before the results, off with
--no-progress; ``--json`` on stdout stays one JSON document."""
from __future__ import annotations

import io
import json
import time

import pytest

import cosim.cli.run as run_cli
from cosim.cli import main
from cosim.cli.run import phase_bar


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_phase_bar_writes_to_its_stream_and_clears(capsys: pytest.CaptureFixture[str]) -> None:
    err = _Tty()
    with phase_bar(True, err, delay=0.0) as bar:
        bar.phase("synthesizing")
        time.sleep(0.7)
    text = err.getvalue()
    assert "cosim run: synthesizing [00:00]" in text
    assert text.endswith("\r") and text.rsplit("\r", 2)[-2].strip() == ""  # the line is blanked on close
    assert capsys.readouterr().out == ""
    quiet = _Tty()
    with phase_bar(False, quiet, delay=0.0) as bar:
        bar.phase("x")
        time.sleep(0.6)
    assert quiet.getvalue() == ""


def test_phase_bar_shown_after_its_delay_is_cleared_on_close() -> None:
    """A bar that appears only after its delay (tqdm's ``delay``) is still blanked on close: tqdm clears only a bar
    it recorded as shown, and the ticker's redraws go through tqdm's public ``update``, which records them."""
    err = _Tty()
    with phase_bar(True, err, delay=0.3) as bar:
        bar.phase("simulating")
        time.sleep(1.2)
    text = err.getvalue()
    assert "cosim run: simulating [00:00]" in text or "cosim run: simulating [00:01]" in text
    assert text.endswith("\r") and text.rsplit("\r", 2)[-2].strip() == ""
    quick = _Tty()
    with phase_bar(True, quick, delay=5.0) as bar:  # closed before its delay: nothing written at all
        bar.phase("x")
    assert quick.getvalue() == ""


@pytest.mark.parametrize("no_progress", [False, True])
def test_json_stays_clean_with_the_bar(tmp_path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str], no_progress: bool) -> None:
    err = _Tty()
    monkeypatch.setattr("sys.stderr", err)
    monkeypatch.setattr(run_cli, "PROGRESS_DELAY_S", 0.0)
    args = ["run", "moe-ep4-dgx-h100", "--json", "--no-timeline", "--out", str(tmp_path / "r")]
    code = main([*args, "--no-progress"] if no_progress else args)
    out = capsys.readouterr().out
    assert code in (0, None)
    assert json.loads(out)["step_time_s"] > 0  # stdout is exactly one JSON document
    assert ("cosim run:" in err.getvalue()) is (not no_progress)
