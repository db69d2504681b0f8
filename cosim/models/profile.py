"""Calibration profiles: fitted kernel-model parameters with provenance, as YAML.

A profile holds, per model class (``gemm``, ``attention``, ``elementwise``, ...)
and per key (``default`` or a dtype such as ``bf16``), the parameters of
:mod:`cosim.models.calibrated`, plus where they came from (GPU, source traces or
microbenchmark, torch version, date, in-sample fit errors) and ``inputs_hash``, a
SHA-256 of the fit inputs that keys the cache (``cosim calibrate`` skips a fit
whose hash matches the existing output). Layout::

    schema: cosim.profile/1         # cosim.profile/2 when the optional launch section is present
    name: h100-sxm5
    accelerator: h100-sxm5          # catalog id the fit was made on
    provenance: {gpu: ..., sources: [...], torch_version: ..., date: ..., inputs_hash: ...}
    fit_errors: {gemm: {n: 169, mape: 0.07}, ...}
    models:
      gemm: {default: {efficiency: 0.8, tile_overhead_s: 1.0e-6, ...}, bf16: {...}}
      elementwise: {default: {efficiency: 0.6, floor_s: 2.0e-6}}
    kernel_scale:                   # optional: per kernel family, fitted residual factor (GEMM classes)
      "ampere_sgemm_128x64_nn": {scale: 1.21, n: 40}
    kernel_db:                      # optional: measured medians by exact key (Vidur-style lookup)
      key: [kernel, cls, dtype, gemm_m, gemm_n, gemm_k, batch, heads, bwd, bytes]
      rows: [[ampere_sgemm_128x64_nn, gemm, fp32, 1024.0, 512.0, 64.0, 1.0, 1.0, 0, 2400000.0, 2.0e-05, 33], ...]

    launch:                         # optional (schema cosim.profile/2): launch-configuration laws for
      laws:                         #   ops without shapes (cosim.models.launch)
        "gemm:tile": {floor_s: 1.0e-05, rate: 2.0e+10, n: 2645}
        "elementwise:threads": {floor_s: 2.5e-06, rate: 2.5e+10, n: 12100}
      family:
        "volta_sgemm_64x64_nt": {scale: 1.3, n: 40}
      sources: [...]                #   calibration traces the laws were fitted on

``kernel_scale``, ``kernel_db`` and the launch ``family`` factors apply only when predicting the GPU the
profile was fitted on. Files without ``launch`` are written as ``cosim.profile/1`` (both schemas load).
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cosim.catalog.models import Accelerator
from cosim.errors import CosimInputError
from cosim.models.calibrated import DEFAULTS, MemoryParams, ParamsT, params_from_dict, params_to_dict
from cosim.yamlio import input_error_at, load_yaml, whole_number

__all__ = ["DB_KEY", "DTOD_HBM_PASSES", "PROFILE_SCHEMA", "PROFILE_SCHEMA_V1", "CalibrationProfile", "bundled_profiles",
           "compute_bound_gemm_samples", "db_key", "dtod_from_elementwise", "inputs_hash", "kernel_family", "load_profile",
           "profile_for"]

PROFILE_SCHEMA = "cosim.profile/2"
"""Schema written by profiles with a ``launch`` section; others keep writing :data:`PROFILE_SCHEMA_V1`."""
PROFILE_SCHEMA_V1 = "cosim.profile/1"
SCHEMAS = (PROFILE_SCHEMA_V1, PROFILE_SCHEMA)
"""Schemas :meth:`CalibrationProfile.from_dict` reads (/2 = /1 plus the optional ``launch`` section)."""
_DATA = Path(__file__).resolve().parent / "data"
DB_KEY = ("kernel", "cls", "dtype", "gemm_m", "gemm_n", "gemm_k", "batch", "heads", "bwd", "bytes")
"""Fields of a :attr:`CalibrationProfile.kernel_db` key (kernel = :func:`kernel_family`)."""
_FAMILY_MAX = 200


DTOD_HBM_PASSES = 2.0
"""HBM bytes a device-to-device copy moves per byte it copies: it reads every byte and writes it (NVIDIA
cuda-samples ``Samples/1_Utilities/bandwidthTest/bandwidthTest.cu``, ``testDeviceToDeviceTransfer``, counts
``2 * memSize`` per ``cudaMemcpyDeviceToDevice`` for that reason). A trace records a copy's transfer size; an
elementwise kernel's bytes already count its input and its output."""


def dtod_from_elementwise(p: ParamsT) -> ParamsT:
    """Parameters timing a device-to-device copy by its **transfer size** from an elementwise fit (bytes read +
    written): the same floor, the efficiency divided by :data:`DTOD_HBM_PASSES`, so that
    ``floor + size / (HBM · eff / 2) = floor + 2·size / (HBM · eff)``: the copy's HBM traffic at the
    elementwise kernels' efficiency."""
    if not isinstance(p, MemoryParams):
        return p
    return MemoryParams(efficiency=p.efficiency / DTOD_HBM_PASSES, floor_s=p.floor_s)


def kernel_family(name: str) -> str:
    """A kernel's family: its name without the argument list (``void k<...>(args)`` → ``void k<...>``),
    capped at 200 characters."""
    base = name.split("(", 1)[0] if "(" in name and not name.startswith("(") else name
    return base.strip()[:_FAMILY_MAX]


def _num(x: Any) -> float | None:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return None if v != v else round(v, 6)


def db_key(kernel: str, cls: str, dtype: str, m: Any, n: Any, k: Any, batch: Any, heads: Any, bwd: Any,
           nbytes: Any) -> tuple:
    """Exact-match key of the kernel database (NaN / unknown numbers become None)."""
    return (kernel_family(kernel), cls, dtype or "", _num(m), _num(n), _num(k), _num(batch), _num(heads),
            int(bool(bwd)), _num(nbytes))


@dataclass
class CalibrationProfile:
    """Fitted kernel-model parameters for one GPU model (SI units inside the parameters)."""

    name: str
    """Profile name (bundled profiles are named after their catalog accelerator)."""
    accelerator: str
    """Catalog id of the accelerator the fit was made on, e.g. "h100-sxm5"."""
    models: dict[str, dict[str, ParamsT]] = field(default_factory=dict)
    """class → key ("default" or a dtype) → parameters."""
    provenance: dict[str, Any] = field(default_factory=dict)
    """gpu, sources, torch_version, date, method, inputs_hash, split."""
    fit_errors: dict[str, dict[str, float]] = field(default_factory=dict)
    """class → {n: samples, mape: in-sample mean absolute percentage error (fraction)}."""
    kernel_scale: dict[str, dict[str, float]] = field(default_factory=dict)
    """Optional: kernel family → {scale: factor on the model's time, n: fitted samples}."""
    kernel_db: dict[tuple, tuple[float, int]] = field(default_factory=dict)
    """Optional: :func:`db_key` → (measured median duration s, samples): exact-key lookups."""
    launch: dict[str, Any] = field(default_factory=dict)
    """Optional: launch-configuration laws for ops without shapes (:mod:`cosim.models.launch`):
    ``{"laws": {"<class>:<tile|threads>": {floor_s, rate, n}}, "family": {family: {scale, n}},
    "sources": [...]}``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise ValueError("name must not be empty")
        if not self.accelerator:
            raise ValueError("accelerator must name a catalog accelerator")

    def params(self, cls: str, dtype: str = "") -> ParamsT:
        """Parameters of class ``cls`` for ``dtype``: the dtype's fit, else the class default, else
        (grouped GEMM) the GEMM fit, else (device-to-device copy, timed by its transfer size) the elementwise
        fit at twice the bytes (:func:`dtod_from_elementwise`), else the uncalibrated :data:`DEFAULTS`."""
        by = self.models.get(cls)
        if by:
            if dtype and dtype in by:
                return by[dtype]
            if "default" in by:
                return by["default"]
        if cls == "grouped_gemm":
            return self.params("gemm", dtype)
        if cls.startswith("memcpy_dtod") and "elementwise" in self.models:
            return dtod_from_elementwise(self.params("elementwise"))
        return DEFAULTS.get(cls, DEFAULTS["other"])

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (what :meth:`save` writes)."""
        out: dict[str, Any] = {
            "schema": PROFILE_SCHEMA if self.launch else PROFILE_SCHEMA_V1,
            "name": self.name,
            "accelerator": self.accelerator,
            "provenance": self.provenance,
            "fit_errors": self.fit_errors,
            "models": {c: {k: params_to_dict(p) for k, p in sorted(by.items())} for c, by in sorted(self.models.items())},
        }
        if self.kernel_scale:
            out["kernel_scale"] = {k: {"scale": round(float(v["scale"]), 5), "n": int(v["n"])}
                                   for k, v in sorted(self.kernel_scale.items())}
        if self.kernel_db:
            rows = [[*key, float(f"{t:.6g}"), int(n)] for key, (t, n) in
                    sorted(self.kernel_db.items(), key=lambda kv: tuple(str(x) for x in kv[0]))]
            out["kernel_db"] = {"key": list(DB_KEY), "rows": rows}
        if self.launch:
            la = self.launch
            out["launch"] = {
                "laws": {k: {"floor_s": float(f"{v['floor_s']:.6g}"), "rate": float(f"{v['rate']:.6g}"),
                             "n": int(v.get("n", 0))} for k, v in sorted(la.get("laws", {}).items())},
                "family": {k: {"scale": round(float(v["scale"]), 5), "n": int(v.get("n", 0))}
                           for k, v in sorted(la.get("family", {}).items())},
            }
            if la.get("sources"):
                out["launch"]["sources"] = [str(x) for x in la["sources"]]
        return out

    def save(self, path: str | Path) -> None:
        """Write the profile as YAML (atomically)."""
        from cosim.fileio import atomic_open

        data = _plain(self.to_dict())
        kdb = data.pop("kernel_db", None)
        launch = data.pop("launch", None)
        if launch:
            data["launch"] = launch  # before the (long) kernel database
        with atomic_open(path, "w") as fh:
            fh.write(f"# cosim calibration profile ({data['schema']}); see docs/MODELS.md\n")
            yaml.safe_dump(data, fh, sort_keys=False, default_flow_style=False, width=120)
            if kdb:  # one flow-style row per line (JSON is valid YAML)
                fh.write(f"kernel_db:\n  key: {json.dumps(kdb['key'])}\n  rows:\n")
                for r in kdb["rows"]:
                    fh.write(f"  - [{', '.join(_flow(v) for v in r)}]\n")

    @classmethod
    def from_dict(cls, data: Any, file: str | Path | None = None) -> CalibrationProfile:
        """Validate plain data; a problem raises a one-line :class:`CosimInputError` naming the field."""
        if not isinstance(data, dict):
            raise CosimInputError("a calibration profile must be a YAML mapping", file=file)
        if data.get("schema") not in SCHEMAS:
            raise input_error_at(data, ["schema"], f"expected schema {' or '.join(map(repr, SCHEMAS))}, got "
                                 f"{data.get('schema')!r}", file)
        allowed = {"schema", "name", "accelerator", "provenance", "fit_errors", "models", "kernel_scale", "kernel_db",
                   "launch"}
        for key in data:
            if key not in allowed:
                raise input_error_at(data, [key], f"unknown key; known: {', '.join(sorted(allowed))}", file)
        for key in ("name", "accelerator"):
            if not isinstance(data.get(key), str) or not data.get(key):
                raise input_error_at(data, [key], "required: a non-empty string", file)
        from cosim.catalog import load_catalog

        try:
            load_catalog().accelerator(data["accelerator"])
        except CosimInputError as exc:
            raise input_error_at(data, ["accelerator"], exc.message, file) from None
        models_raw = data.get("models") or {}
        if not isinstance(models_raw, dict):
            raise input_error_at(data, ["models"], "must be a mapping class -> key -> parameters", file)
        known = set(DEFAULTS)
        models: dict[str, dict[str, ParamsT]] = {}
        for c, by in models_raw.items():
            if c not in known:
                raise input_error_at(data, ["models", c], f"unknown model class; known: {', '.join(sorted(known))}",
                                     file)
            if not isinstance(by, dict):
                raise input_error_at(data, ["models", c], "must map 'default' or a dtype to parameters", file)
            models[c] = {}
            for key, p in by.items():
                if not isinstance(p, dict):
                    raise input_error_at(data, ["models", c, key], "parameters must be a mapping", file)
                try:
                    models[c][str(key)] = params_from_dict(c, p)
                except (ValueError, TypeError) as exc:
                    raise input_error_at(data, ["models", c, key], str(exc), file) from None
        prov = data.get("provenance") or {}
        errs = data.get("fit_errors") or {}
        if not isinstance(prov, dict) or not isinstance(errs, dict):
            raise input_error_at(data, ["provenance"], "provenance and fit_errors must be mappings", file)
        scale: dict[str, dict[str, float]] = {}
        ks = data.get("kernel_scale") or {}
        if not isinstance(ks, dict):
            raise input_error_at(data, ["kernel_scale"], "must map kernel family -> {scale, n}", file)
        for fam, v in ks.items():
            if not isinstance(v, dict) or not _positive(v.get("scale")):
                raise input_error_at(data, ["kernel_scale", fam], "needs scale: a number > 0 (and n)", file)
            scale[str(fam)] = {"scale": float(v["scale"]), "n": _count(data, ["kernel_scale", fam], v, file)}
        kdb: dict[tuple, tuple[float, int]] = {}
        raw = data.get("kernel_db") or {}
        if raw:
            if not isinstance(raw, dict) or not isinstance(raw.get("key"), list) or list(raw["key"]) != list(DB_KEY) \
                    or not isinstance(raw.get("rows"), list):
                raise input_error_at(data, ["kernel_db"], f"needs key: {list(DB_KEY)} and rows: [[...key, "
                                     "median_s, n], ...]", file)
            for i, r in enumerate(raw["rows"]):
                if not isinstance(r, list) or len(r) != len(DB_KEY) + 2 or not _positive(r[-2]) \
                        or whole_number(r[-1]) is None or r[-1] < 0 or not isinstance(r[0], str):  # r[0]: the family
                    raise input_error_at(data, ["kernel_db", "rows"], f"row {i}: expected {len(DB_KEY)} key "
                                         "fields, a median > 0 and a count", file)
                kdb[db_key(*[str(x) if x is not None and j < 3 else x for j, x in enumerate(r[:len(DB_KEY)])])] = \
                    (float(r[-2]), int(r[-1]))
        launch = _launch_from(data, file)
        return cls(name=data["name"], accelerator=data["accelerator"], models=models,
                   provenance=_plain(prov), fit_errors=_plain(errs), kernel_scale=scale, kernel_db=kdb,
                   launch=launch)


def _positive(x: Any) -> bool:
    """A finite number > 0 (a scale, a time, a rate of a profile)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and 0 < x < float("inf")


def _count(data: dict, at: list[Any], entry: dict, file: str | Path | None) -> int:
    """The sample count ``n`` of a profile entry (0 when absent): a whole number >= 0 (``3.0`` too)."""
    n = entry.get("n", 0)
    got = whole_number(n)
    if got is None or got < 0:
        raise input_error_at(data, [*at, "n"], f"expected a sample count (a whole number >= 0), got {n!r}", file)
    return got


def _launch_from(data: dict, file: str | Path | None) -> dict[str, Any]:
    """Validate a profile's optional ``launch`` section (see :mod:`cosim.models.launch`)."""
    from cosim.models.calibrated import DEFAULTS

    raw = data.get("launch") or {}
    if not raw:
        return {}
    if not isinstance(raw, dict) or not isinstance(raw.get("laws") or {}, dict) \
            or not isinstance(raw.get("family") or {}, dict):
        raise input_error_at(data, ["launch"], "needs laws: {<class>:<tile|threads>: {floor_s, rate}} and optional "
                             "family: {family: {scale, n}}", file)
    extra = set(raw) - {"laws", "family", "sources"}
    if extra:
        raise input_error_at(data, ["launch", sorted(extra)[0]], "unknown key; known: family, laws, sources", file)
    laws: dict[str, dict[str, float]] = {}
    for key, v in (raw.get("laws") or {}).items():
        c, _, kind = str(key).rpartition(":")
        ok = c in DEFAULTS and kind in ("tile", "threads") and isinstance(v, dict)
        ok = ok and all(_positive(v.get(x)) for x in ("floor_s", "rate"))
        if not ok:
            raise input_error_at(data, ["launch", "laws", key], "key must be <class>:tile or <class>:threads and "
                                 "the law needs floor_s > 0 and rate > 0", file)
        laws[str(key)] = {"floor_s": float(v["floor_s"]), "rate": float(v["rate"]),
                          "n": _count(data, ["launch", "laws", key], v, file)}
    family: dict[str, dict[str, float]] = {}
    for fam, v in (raw.get("family") or {}).items():
        if not isinstance(v, dict) or not _positive(v.get("scale")):
            raise input_error_at(data, ["launch", "family", fam], "needs scale: a number > 0 (and n)", file)
        family[str(fam)] = {"scale": float(v["scale"]), "n": _count(data, ["launch", "family", fam], v, file)}
    out: dict[str, Any] = {"laws": laws, "family": family}
    if raw.get("sources"):
        if not isinstance(raw["sources"], list):
            raise input_error_at(data, ["launch", "sources"], "must be a list of sources", file)
        out["sources"] = [str(x) for x in raw["sources"]]
    return out


def _flow(v: Any) -> str:
    """One YAML flow scalar: strings JSON-quoted, floats always with a '.' (PyYAML reads 1e-05 as a string)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        t = repr(v)
        if "e" in t and "." not in t.split("e")[0]:
            a, b = t.split("e")
            t = f"{a}.0e{b}"
        return t
    return json.dumps(str(v))


def _plain(obj: Any) -> Any:
    """LocDict/LocList/numpy → plain Python for YAML."""
    if isinstance(obj, dict):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, str):
        return str(obj)
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        return obj.item()
    return obj


def bundled_profiles() -> list[str]:
    """Names of the profiles shipped in ``cosim/models/data`` (usable as ``load_profile(name)``)."""
    return sorted(p.stem for p in _DATA.glob("*.yaml"))


def load_profile(name_or_path: str | Path) -> CalibrationProfile:
    """A bundled profile by name (e.g. "h100-sxm5") or a profile YAML file.

    Raises :class:`CosimInputError` (one line) on an unknown name or a bad file.
    """
    p = Path(name_or_path)
    if not p.suffix and not p.exists():
        cand = _DATA / f"{name_or_path}.yaml"
        if not cand.exists():
            raise CosimInputError(f"unknown calibration profile {str(name_or_path)!r}; bundled: "
                                  f"{', '.join(bundled_profiles()) or 'none'} (or give a .yaml file)")
        p = cand
    try:
        st = p.stat()
        ck = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except OSError:
        ck = None
    if ck is not None and ck in _CACHE:
        return copy.deepcopy(_CACHE[ck])
    prof = CalibrationProfile.from_dict(load_yaml(p), file=p)
    if ck is not None:
        _CACHE[ck] = copy.deepcopy(prof)
    return prof


_CACHE: dict[tuple, CalibrationProfile] = {}
"""Parsed profiles by (path, mtime, size): bundled profiles with a kernel database take ~0.2 s to parse."""


def profile_for(accelerator_name: str) -> CalibrationProfile | None:
    """The bundled profile fitted on the accelerator with display name ``accelerator_name``, if any; else,
    for a catalog entry that ``extends`` another (gb300 -> b300 -> b200), the nearest ancestor's profile."""
    from cosim.catalog import load_catalog

    cat = load_catalog()
    by_name: dict[str, CalibrationProfile] = {}
    for name in bundled_profiles():
        prof = load_profile(name)
        try:
            fitted_on = cat.accelerator(prof.accelerator).name
        except CosimInputError:
            continue
        if fitted_on == accelerator_name:  # its own: the other profiles are not loaded (each a deep copy)
            return prof
        by_name.setdefault(fitted_on, prof)
    for key, acc in cat.accelerators.items():
        if acc.name == accelerator_name:
            for parent in cat.lineage("accelerators", key)[1:]:
                if (inherited := by_name.get(cat.accelerator(parent).name)) is not None:
                    return inherited
    return None


def compute_bound_gemm_samples(profile: CalibrationProfile, accelerator: Accelerator,
                               dtypes: Collection[str] | None = None) -> int | None:
    """How many GEMM rows of ``profile``'s kernel database (of ``dtypes`` only, when given; a row without a dtype
    counts as ``bf16``) ran compute-bound on ``accelerator`` (the GPU they were
    measured on): ``2·M·N·K·batch / peak(dtype) > bytes / HBM``. A fit
    whose GEMM samples are all memory-bound does not identify its main-loop ``efficiency`` (any value above what
    those samples need fits them), so it says nothing about large GEMMs. ``None`` when the profile carries no
    kernel database (nothing to tell: the fit is taken as it is)."""
    if not profile.kernel_db:
        return None
    hbm = float(accelerator.hbm_bandwidth)
    n = 0
    for key in profile.kernel_db:
        row = dict(zip(DB_KEY, key))
        if row["cls"] not in ("gemm", "grouped_gemm") or (dtypes is not None and (row["dtype"] or "bf16") not in dtypes):
            continue
        m, nn, k, b, nbytes = (row[f] for f in ("gemm_m", "gemm_n", "gemm_k", "batch", "bytes"))
        if None in (m, nn, k, nbytes):
            continue
        try:
            peak = float(accelerator.peak(row["dtype"] or "bf16"))
        except KeyError:
            peak = float(accelerator.peak("bf16"))
        if 2.0 * m * nn * k * (b or 1.0) / peak > nbytes / hbm:
            n += 1
    return n


def inputs_hash(parts: list[Any]) -> str:
    """SHA-256 (hex, first 16 chars) of the fit inputs, the key of the ``cosim calibrate`` cache.

    A :class:`pathlib.Path` part that names a file contributes its path as given and the SHA-256 of its bytes,
    so a changed, replaced or added trace changes the key whatever its size and mtime; a directory must be
    expanded by the caller into the files it will read. Every other part (``str`` included, so that an option
    value is never mistaken for a file name) contributes its JSON form: options, output name, code version.
    Raises :class:`CosimInputError` when a file cannot be read.
    """
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, Path) and part.is_file():
            fh_sum = hashlib.sha256()
            try:
                with open(part, "rb") as fh:
                    while chunk := fh.read(1 << 20):
                        fh_sum.update(chunk)
            except OSError as exc:
                raise CosimInputError(f"cannot read input file: {exc.strerror or exc}", file=part) from None
            h.update(f"file|{part}|{fh_sum.hexdigest()}".encode())
        else:
            h.update(json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]
