"""Validation of the collective model against measured NCCL times (see run.py)."""
