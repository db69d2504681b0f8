"""Validation of trace replay against the measured step times of real traces (see run.py)."""
