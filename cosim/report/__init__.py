"""Reports: offline HTML pages (plotly embedded) over cosim results.

* :func:`write_run_report` -- report.html of one run (``cosim run`` / ``cosim replay``);
* :func:`proposal_report` / :func:`write_proposal_report` -- a baseline against
  proposals (``cosim report``);
* :func:`write_sweep_report` -- metric vs parameters and the Pareto front of a sweep;
* :func:`write_tornado_report` -- the tornado chart of ``cosim sensitivity``.
"""

from __future__ import annotations

from .proposal import proposal_report, write_proposal_report
from .run import headline, run_report_data, run_report_html, write_run_report
from .sweep_report import write_sweep_report, write_tornado_report

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
