"""Reports: offline HTML pages (plotly embedded) over cosim results.

* :func:`write_run_report` -- report.html of one run (``cosim run`` / ``cosim replay``);
* :func:`proposal_report` / :func:`write_proposal_report` -- a baseline against
  proposals (``cosim report``);
* :func:`write_sweep_report` -- metric vs parameters and the Pareto front of a sweep;
* :func:`write_tornado_report` -- the tornado chart of ``cosim sensitivity``.

Each name is imported from its module when first asked for (PEP 562), so that a run, which writes only its own
page, does not import the proposal and sweep pages.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .proposal import proposal_report, write_proposal_report
    from .run import headline, run_report_data, run_report_html, write_run_report
    from .sweep_report import write_sweep_report, write_tornado_report

_MODULE = {
    "headline": "run",
    "proposal_report": "proposal",
    "run_report_data": "run",
    "run_report_html": "run",
    "write_proposal_report": "proposal",
    "write_run_report": "run",
    "write_sweep_report": "sweep_report",
    "write_tornado_report": "sweep_report",
}

__all__ = [
    "headline",
    "proposal_report",
    "run_report_data",
    "run_report_html",
    "write_proposal_report",
    "write_run_report",
    "write_sweep_report",
    "write_tornado_report",
]


def __getattr__(name: str) -> Any:
    mod = _MODULE.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{mod}"), name)
