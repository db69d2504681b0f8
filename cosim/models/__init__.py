"""Kernel-time models: predict a GPU op's duration from its shapes and the hardware.

* :class:`RooflineModel` — the catalog roofline (fallback; used by projection).
* :func:`predict_durations` — calibrated per-class models (GEMM tile/wave, flash
  attention, saturating-bandwidth memory ops) driven by a :class:`CalibrationProfile`.
* :func:`load_profile` / :func:`bundled_profiles` — profiles shipped in ``cosim/models/data``.
* :func:`quantize_times` / :func:`fp8_gemm_times` — precision what-ifs (BF16 → FP8).

See docs/MODELS.md.
"""

from cosim.models.profile import CalibrationProfile, bundled_profiles, load_profile
from cosim.models.roofline import RooflineModel

__all__ = ["CalibrationProfile", "RooflineModel", "bundled_profiles", "load_profile", "predict_durations"]


def predict_durations(rg, accelerator, profile=None):  # type: ignore[no-untyped-def]
    """Predicted seconds per GPU op of ``rg`` on ``accelerator`` (NaN for communication);
    see :func:`cosim.models.predict.predict_durations`."""
    from cosim.models.predict import predict_durations as _p

    return _p(rg, accelerator, profile)
