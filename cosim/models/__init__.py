"""Kernel-time models: predict a GPU op's duration from its shapes and the hardware."""

from cosim.models.roofline import RooflineModel

__all__ = ["RooflineModel"]
