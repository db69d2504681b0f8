"""The link report's per-class interval data (``LinkUsage._cdata``, what its figures are computed from) read out
per link, for the tests that compare it with a plain per-link computation."""

from __future__ import annotations

import numpy as np

from cosim.replay.links import LinkUsage


def _per_link(u: LinkUsage) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(link per interval, the intervals' positions in ``_cdata``, offsets per link): each link's class row
    (``u._fmap``) repeated for it, links in order."""
    off = u._cdata()[-1]
    fm = u._fmap
    cnt = np.diff(off)[fm]
    idx = np.concatenate([np.arange(off[f], off[f + 1]) for f in fm.tolist()]).astype(np.int64) if fm.size \
        else np.zeros(0, dtype=np.int64)
    loff = np.zeros(len(u.links) + 1, dtype=np.int64)
    np.cumsum(cnt, out=loff[1:])
    return np.repeat(np.arange(len(u.links), dtype=np.int64), cnt), idx, loff


def link_data(u: LinkUsage) -> tuple[np.ndarray, ...]:
    """(link, start, end, count, bytes, source, offsets) of every link's intervals, sorted by link then start
    (ties in the order added)."""
    cd = u._cdata()
    lk, idx, loff = _per_link(u)
    return (lk, *(c[idx] for c in cd[1:6]), loff)


def prev_ends(u: LinkUsage) -> np.ndarray:
    """Per interval of :func:`link_data`, the latest end before it on its link (-inf for a link's first):
    ``busy``'s running maximum (``u._prev_of``) read out per link."""
    return u._prev_of(u._cdata())[_per_link(u)[1]]
