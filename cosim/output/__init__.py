"""Outputs of a run: its files (:func:`write_result`: summary.json and timelines) and the Kineto-layout timeline."""

from cosim.output.files import write_result
from cosim.output.timeline import rank_trace, write_timeline

__all__ = ["rank_trace", "write_result", "write_timeline"]
