"""cosim: a hardware/software co-design simulator for AI systems.

The public Python API; the ``cosim`` command line is a thin layer over it.
"""

from __future__ import annotations

__version__ = "0.1.0"

from cosim.errors import CosimError, CosimInputError

__all__ = ["CosimError", "CosimInputError", "__version__"]
