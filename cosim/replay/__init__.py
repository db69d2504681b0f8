"""Replay: bind an execution graph to a topology and run it on the engine.

>>> from cosim.replay import replay, ReplayConfig
>>> res = replay("trace.json.gz", "dgx-h100", ReplayConfig())   # doctest: +SKIP
>>> res.summary()["step_time_s"]                                 # doctest: +SKIP
"""

from cosim.replay.api import SUMMARY_SCHEMA, ReplayResult, replay
from cosim.replay.config import ReplayConfig, apply_sets, parse_sets

__all__ = ["SUMMARY_SCHEMA", "ReplayConfig", "ReplayResult", "apply_sets", "parse_sets", "replay"]
