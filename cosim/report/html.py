"""A small offline HTML page builder for cosim reports.

Plotly figures are embedded as ``<div>``s; the first one carries plotly.js
inline (``include_plotlyjs=True``), the rest reuse it, so a page opens with no
network access. All text is HTML-escaped.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosim.fileio import write_text

__all__ = ["Page", "fmt_num", "fmt_pct", "fmt_time"]

_CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px auto;max-width:1300px;color:#222;
padding:0 16px}
h1{font-size:24px;margin-bottom:4px} h2{font-size:19px;margin-top:34px;border-bottom:1px solid #ddd;padding-bottom:4px}
.headline{font-size:21px;background:#fff6e0;border-left:6px solid #e8a317;padding:12px 16px;margin:14px 0}
.sub{color:#555;font-size:14px}
table{border-collapse:collapse;font-size:13px;margin:8px 0}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:right;vertical-align:top}
th{background:#f3f3f3} td.l,th.l{text-align:left}
.note{color:#666;font-size:13px}
.grid{display:flex;flex-wrap:wrap;gap:12px}
details{margin:8px 0} summary{cursor:pointer;font-weight:600;font-size:14px}
.scroll{max-height:560px;overflow:auto;display:inline-block}
table.sortable th{cursor:pointer} table.sortable th:hover{background:#e6e6e6}
"""

# Click a header of a sortable table to sort by that column (again: the other way). Cells with data-v sort by
# that number; others by their text. Plain JS, no network.
_SORT_JS = """
document.querySelectorAll('table.sortable').forEach(function(t){
  t.querySelectorAll('th').forEach(function(th, i){
    th.addEventListener('click', function(){
      var rows = Array.prototype.slice.call(t.querySelectorAll('tr')).slice(1);
      var asc = th.getAttribute('data-dir') !== 'asc';
      t.querySelectorAll('th').forEach(function(x){ x.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', asc ? 'asc' : 'desc');
      function key(r){ var c = r.children[i]; var v = c.getAttribute('data-v');
        return v !== null ? parseFloat(v) : c.textContent; }
      rows.sort(function(a, b){ var x = key(a), y = key(b);
        var d = (typeof x === 'number' && typeof y === 'number') ? x - y : String(x).localeCompare(String(y));
        return asc ? d : -d; });
      rows.forEach(function(r){ t.appendChild(r); });
    });
  });
});
"""


def fmt_time(s: float | None) -> str:
    """Seconds as a readable time with its unit ("90.6 ms")."""
    if s is None:
        return "n/a"
    a = abs(s)
    if a >= 1:
        return f"{s:.3g} s"
    if a >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if a >= 1e-6:
        return f"{s * 1e6:.3g} us"
    if a == 0:
        return "0 s"
    return f"{s * 1e9:.3g} ns"


def fmt_pct(x: float | None, digits: int = 0) -> str:
    """A fraction as a percentage ("69%")."""
    if x is None:
        return "n/a"
    return f"{x * 100:.{digits}f}%"


def fmt_num(x: Any, digits: int = 4) -> str:
    """A number with ``digits`` significant digits; other values as text."""
    if isinstance(x, bool) or x is None:
        return "n/a" if x is None else str(x)
    if isinstance(x, (int, float)):
        return f"{x:.{digits}g}"
    return str(x)


class Page:
    """An HTML report page: headings, paragraphs, tables and plotly figures."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.parts: list[str] = []
        self.figures = 0
        self.scripts = False

    def h1(self, text: str, sub: str = "") -> None:
        self.parts.append(f"<h1>{html.escape(text)}</h1>")
        if sub:
            self.parts.append(f'<div class="sub">{html.escape(sub)}</div>')

    def h2(self, text: str) -> None:
        self.parts.append(f"<h2>{html.escape(text)}</h2>")

    def headline(self, text: str) -> None:
        self.parts.append(f'<div class="headline" id="headline">{html.escape(text)}</div>')

    def p(self, text: str, cls: str = "") -> None:
        c = f' class="{cls}"' if cls else ""
        self.parts.append(f"<p{c}>{html.escape(text)}</p>")

    def link(self, href: str, text: str) -> None:
        """A paragraph with one link (opens in a new tab)."""
        self.parts.append(f'<p><a href="{html.escape(href)}" target="_blank" rel="noopener">{html.escape(text)}</a>'
                          "</p>")

    def table(self, headers: Sequence[str], rows: Sequence[Sequence[Any]], left: int = 1, *,
              sortable: bool = False, table_id: str | None = None) -> None:
        """A table; the first ``left`` columns are left-aligned (names), the rest right-aligned (numbers).

        A cell given as ``(text, number)`` shows ``text`` and sorts by ``number``; ``sortable`` tables sort
        by a column when its header is clicked."""
        attrs = (f' id="{html.escape(table_id)}"' if table_id else "") + (' class="sortable"' if sortable else "")
        out = [f"<table{attrs}><tr>"]
        out += [f'<th class="{"l" if i < left else ""}">{html.escape(str(h))}</th>' for i, h in enumerate(headers)]
        out.append("</tr>")
        for r in rows:
            cells = []
            for i, v in enumerate(r):
                cls = "l" if i < left else ""
                if isinstance(v, tuple):
                    text, key = v
                    dv = f' data-v="{float(key):.9g}"' if isinstance(key, (int, float)) and key == key else ""
                    cells.append(f'<td class="{cls}"{dv}>{html.escape(str(text))}</td>')
                else:
                    cells.append(f'<td class="{cls}">{html.escape(str(v))}</td>')
            out.append("<tr>" + "".join(cells) + "</tr>")
        out.append("</table>")
        if sortable:
            self.scripts = True
        self.parts.append("".join(out))

    def details_start(self, summary: str, open_: bool = False) -> None:
        """Start a collapsible section (``details_end`` closes it); its content scrolls when long."""
        self.parts.append(f'<details{" open" if open_ else ""}><summary>{html.escape(summary)}</summary>'
                          '<div class="scroll">')

    def details_end(self) -> None:
        self.parts.append("</div></details>")

    def fig(self, fig: Any) -> None:
        """Embed a plotly figure (plotly.js inline with the first figure of the page)."""
        self.parts.append(fig.to_html(full_html=False, include_plotlyjs=self.figures == 0,
                                      config={"displaylogo": False, "responsive": True}))
        self.figures += 1

    def render(self) -> str:
        body = "\n".join(self.parts)
        if self.scripts:
            body += f"\n<script>{_SORT_JS}</script>"
        return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}'
                f"</title><style>{_CSS}</style></head><body>\n{body}\n</body></html>\n")

    def write(self, path: str | Path) -> Path:
        """Write the page atomically; returns the path."""
        p = Path(path)
        write_text(p, self.render())
        return p
