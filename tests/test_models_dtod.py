"""Device-to-device copies (``Memcpy DtoD``, class memcpy_dtod) timed from an elementwise fit: a copy's recorded
bytes are its transfer size, and it reads and writes each of them, so it moves twice that through HBM
(cosim.models.profile.dtod_from_elementwise; held-out table: python -m validation.kernels.d2d)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from cosim.catalog import load_catalog
from cosim.models.calibrated import HardwareFigures, MemoryParams
from cosim.models.features import KernelFeatures
from cosim.models.predict import predict_features
from cosim.models.profile import CalibrationProfile, load_profile
from cosim.resources import shared_dir

COPY = "Memcpy DtoD (Device -> Device)"


def _copy_rows(nbytes: list[float]) -> KernelFeatures:
    n = len(nbytes)
    nan = np.full(n, np.nan)
    return KernelFeatures(cls=["memcpy_dtod"] * n, kernel=[COPY] * n, op_name=["aten::copy_"] * n, dtype=[""] * n,
                          m=nan, n=nan, k=nan, batch=np.ones(n), heads=np.ones(n), bwd=np.zeros(n, dtype=bool),
                          flops=nan, bytes=np.array(nbytes, dtype=float), dur=nan,
                          grid=np.full((n, 3), -1, dtype=np.int64), block=np.full((n, 3), -1, dtype=np.int64))


def test_copy_without_its_own_fit_moves_twice_its_bytes_by_hand() -> None:
    acc = load_catalog().accelerator("h100-sxm5")
    hbm = HardwareFigures.of(acc).hbm_bandwidth
    prof = CalibrationProfile(name="toy", accelerator="h100-sxm5",
                              models={"elementwise": {"default": MemoryParams(efficiency=0.8, floor_s=3e-6)}})
    # 1 GB copied: 2 GB through HBM at 0.8 of its bandwidth, plus the elementwise floor
    t = predict_features(_copy_rows([1e9]), acc, prof).dur[0]
    assert t == pytest.approx(3e-6 + 2e9 / (0.8 * hbm), rel=1e-12)
    p = prof.params("memcpy_dtod")
    assert isinstance(p, MemoryParams) and p.efficiency == pytest.approx(0.4) and p.floor_s == 3e-6
    # an elementwise copy kernel of the same 1 GB (bytes = read + write = 2 GB) takes the same time
    ew = replace(_copy_rows([2e9]), cls=["elementwise"], kernel=["copy_kernel"])
    assert predict_features(ew, acc, prof).dur[0] == pytest.approx(t, rel=1e-12)
    # a profile's own memcpy_dtod fit (fitted on transfer sizes) is used as it is
    own = replace(prof, models={**prof.models, "memcpy_dtod": {"default": MemoryParams(efficiency=0.3,
                                                                                     floor_s=5e-6)}})
    assert predict_features(_copy_rows([1e9]), acc, own).dur[0] == pytest.approx(5e-6 + 1e9 / (0.3 * hbm))


def test_real_9mib_copies_of_the_v100_trace_held_out() -> None:
    root = shared_dir()
    path = None if root is None else Path(root) / "traces" / "hta" / "v100-single-ns.json.gz"
    if path is None or not path.is_file():
        pytest.skip("../shared/traces/hta/v100-single-ns.json.gz not present")
    from cosim.models.fit import KernelDB
    from validation.kernels.d2d import d2d_rows

    db, = KernelDB.from_traces([path]).values()
    sel, nbytes, meas = d2d_rows(db)
    big = nbytes == 9437184.0  # the trace's 9 MiB DtoD copies, ~27 us each (~350 GB/s copied on a 900 GB/s HBM)
    assert big.sum() == 15 and 25e-6 < np.median(meas[big]) < 29e-6
    bundled = load_profile("v100-sxm2-32gb")  # fitted on the PARAM DLRM ranks, not on this trace
    prof = replace(bundled, models={c: v for c, v in bundled.models.items() if c != "memcpy_dtod"}, kernel_db={},
                   kernel_scale={})
    acc = load_catalog().accelerator("v100-sxm2-32gb")
    pred = predict_features(db.feats, acc, prof, database=False).dur[sel][big]
    ew = prof.params("elementwise")
    assert isinstance(ew, MemoryParams)
    assert np.allclose(pred, ew.floor_s + 2 * 9437184.0 / (900e9 * ew.efficiency))  # ~23.9 us
    err = float(np.median(pred) / np.median(meas[big]) - 1)
    assert -0.2 < err < 0  # the transfer size as its HBM bytes gave ~13.4 us (-50%)
