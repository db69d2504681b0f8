"""Sweeps: run a grid (or zip, or random sample) of scenario variants on any
``concurrent.futures.Executor`` (a local process pool, or Dask), one folder per
point keyed by a content hash, so reruns skip finished points.

>>> from cosim.sweep import load_sweep, run_sweep, make_executor
>>> spec = load_sweep("studies/nvlink-x-nic/sweep.yaml")
>>> with make_executor("local", workers=2) as ex:
...     res = run_sweep(spec, "cosim-out/nvlink-x-nic", ex)

See docs/STUDIES.md for the spec format, executors and SLURM.
"""

from __future__ import annotations

from .executors import EXECUTORS, InlineExecutor, make_executor
from .runner import SweepInterrupted, SweepResult, point_key, run_point, run_points, run_sweep
from .spec import COMBINE_MODES, SweepSpec, expand_points, load_sweep

__all__ = [
    "COMBINE_MODES",
    "EXECUTORS",
    "InlineExecutor",
    "SweepInterrupted",
    "SweepResult",
    "SweepSpec",
    "expand_points",
    "load_sweep",
    "make_executor",
    "point_key",
    "run_point",
    "run_points",
    "run_sweep",
]
