"""A sweep point function for tests/test_sweep.py that kills its own worker process for one parameter value.

It lives in a module of its own (not in a test file) so that process-pool workers import it by name whatever the
start method (fork, spawn, forkserver): the sweep submits the point function by reference.
"""

from __future__ import annotations

import os
import signal
from typing import Any

from cosim.sweep.runner import run_point

KILL_PARAM = "host.speed"
KILL_VALUE = "3"


def run_point_or_die(base: str, sets: dict[str, str], out_dir: str, params: dict[str, str] | None = None) -> Any:
    """:func:`cosim.sweep.run_point`, except that ``host.speed=3`` SIGKILLs the process running it."""
    if (params or {}).get(KILL_PARAM) == KILL_VALUE:
        os.kill(os.getpid(), signal.SIGKILL)
    return run_point(base, sets, out_dir, params)
