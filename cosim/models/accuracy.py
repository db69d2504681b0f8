"""Per-op error of kernel-time predictions against measured durations, by class.

One implementation for ``cosim calibrate`` / validation (:func:`cosim.models.fit.class_errors`,
``validation/kernels/run.py``) and for ``cosim replay --durations modeled`` (the summary's
``kernel_error_by_class``).

For each model class (gemm, attention, elementwise, ...) over the ops with a measured
duration > 0:

* ``n``, ``mape``, ``median_ape``, ``time_err`` — ops predicted *from their shapes / bytes*
  (prediction source ``model``, or ``database`` when a kernel database answered), i.e.
  what the class's model is scored on: mean and median absolute percentage error (fractions)
  and the error of the class's total time (predicted sum / measured sum − 1);
* ``n_all``, ``mape_all``, ``time_err_all`` — every op of the class with a prediction,
  including those that had no shapes and took a twin's, a same-kernel-name op's or the
  class floor's prediction (what a modeled replay actually runs with).

Communication ops (NaN predictions) are not scored.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cosim.models.features import KernelFeatures

__all__ = ["class_error_table", "kernel_error_by_class"]


def _stats(pred: np.ndarray, meas: np.ndarray) -> tuple[float, float, float]:
    ape = np.abs(pred - meas) / meas
    return float(np.mean(ape)), float(np.median(ape)), float(pred.sum() / meas.sum() - 1)


def class_error_table(feats: Sequence[KernelFeatures], preds: Sequence, *,
                      shape_sources: Sequence[str] = ("model", "database"), all_ops: bool = True,
                      digits: int = 4) -> dict[str, dict]:
    """Per-class errors pooled over ``(features, Prediction)`` pairs (see the module docs).

    ``preds`` are :class:`cosim.models.predict.Prediction` objects (``dur``, ``source``), one per
    entry of ``feats``. Classes with no scored op are left out; ``all_ops=False`` leaves out the
    ``*_all`` keys."""
    from cosim.models.predict import SOURCES

    codes = [SOURCES.index(s) for s in shape_sources]
    cls_l: list[np.ndarray] = []
    pred_l: list[np.ndarray] = []
    meas_l: list[np.ndarray] = []
    shape_l: list[np.ndarray] = []
    for f, p in zip(feats, preds):
        cls_l.append(np.array(f.cls, dtype=object))
        pred_l.append(np.asarray(p.dur, dtype=float))
        meas_l.append(np.asarray(f.dur, dtype=float))
        shape_l.append(np.isin(p.source, codes))
    if not cls_l:
        return {}
    cls, pred, meas, shaped = (np.concatenate(x) for x in (cls_l, pred_l, meas_l, shape_l))
    timed = np.concatenate([np.asarray(p.source) == SOURCES.index("measured") for p in preds])
    ok = np.isfinite(meas) & (meas > 0) & np.isfinite(pred) & ~timed
    out: dict[str, dict] = {}
    for c in sorted(set(cls[ok].tolist())):
        s_all = ok & (cls == c)
        s = s_all & shaped
        row: dict[str, float | int | None] = {"n": int(s.sum())}
        if s.any():
            m, med, te = _stats(pred[s], meas[s])
            row.update(mape=round(m, digits), median_ape=round(med, digits), time_err=round(te, digits))
        elif not all_ops:
            continue
        else:
            row.update(mape=None, median_ape=None, time_err=None)
        if all_ops:
            m, _, te = _stats(pred[s_all], meas[s_all])
            row.update(n_all=int(s_all.sum()), mape_all=round(m, digits), time_err_all=round(te, digits))
        out[c] = row
    return out


def kernel_error_by_class(feats: Sequence[KernelFeatures], preds: Sequence) -> dict[str, dict] | None:
    """The ``kernel_error_by_class`` entry of a modeled replay's summary: :func:`class_error_table`
    over every rank, or None when the trace has no measured GPU durations (a projected CPU capture)."""
    table = class_error_table(feats, preds)
    return table or None
