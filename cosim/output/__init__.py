"""Outputs of a run: the Kineto-layout timeline (and, later, reports)."""

from cosim.output.timeline import rank_trace, write_timeline

__all__ = ["rank_trace", "write_timeline"]
