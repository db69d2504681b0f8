"""Fixtures shared by the test modules (shared constants and helpers: tests/_cards.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="module")
def dgx() -> Any:
    """The bundled DGX H100 node (8 H100 SXM, NVSwitch, 8 NICs): one per test module, as each module used to load."""
    from cosim.topology import load_topology

    return load_topology("dgx-h100")
