"""Routing models: how many token rows each expert gets, where experts live, and the
all-to-all split matrix and per-rank grouped-GEMM sizes that follow.

Loads are *expected* counts (deterministic, no sampling): a routing model gives each
expert's share ``p_e`` of the ``tokens * top_k`` choices; every source rank sends
``tokens * top_k * p_e`` rows to expert ``e``. Models:

* ``uniform``: ``p_e = 1 / E``;
* ``zipf:S``: the ``r``-th most popular expert has weight ``1 / r**S``, in a random
  order of the experts drawn per layer from ``seed`` (numpy PCG64); shares are capped
  at ``1 / top_k`` (a token picks an expert once) with the excess spread over the rest;
* a file: a capture's ``capture.yaml`` (its measured ``routing.layers[].tokens_per_expert``,
  summed over steps; the capture's MoE layers repeat over the card's), or a YAML/JSON
  ``{experts: [w, ...]}`` (every layer) / ``{layers: [{layer: i, experts: [...]}, ...]}``.

Placement (``contiguous``: expert ``e`` on EP rank ``e // (E / ep)``; ``round-robin``:
``e % ep``; or an explicit ``map``) and ``redundant`` replicas of the hottest experts
(DeepSeek-V3's redundant experts: each replica goes to the EP rank with the least load
and takes an equal part of its expert's rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from cosim.capture.config import MoEModelConfig
from cosim.catalog.models import Strict
from cosim.errors import CosimInputError

__all__ = ["RouteResult", "RoutingSpec", "expert_shares", "parse_routing", "route"]


class RoutingSpec(Strict):
    """The routing model of a synthetic workload."""

    model: str = "uniform"
    """uniform, zipf:S (S > 0), or a file (capture.yaml, or YAML/JSON of per-expert weights)."""
    placement: Literal["contiguous", "round-robin", "map"] = "contiguous"
    """Which EP rank holds each expert."""
    map: list[int] | None = None
    """EP rank of each expert (placement: map)."""
    redundant: int = Field(default=0, ge=0)
    """Extra replicas of the hottest experts (per layer)."""
    seed: int = Field(default=0, ge=0)
    """Seed of the Zipf expert order (numpy's seeds are integers >= 0)."""
    base: str | None = None
    """Folder that relative file names are resolved against (the scenario's)."""

    @property
    def is_uniform(self) -> bool:
        """True when every EP rank gets the same rows (the symmetry folding relies on)."""
        return self.model == "uniform" and self.redundant == 0


def parse_routing(value: str | dict[str, Any] | RoutingSpec, base: str | None = None) -> RoutingSpec:
    """A ``routing:`` value (a string or a mapping) as a :class:`RoutingSpec`."""
    if isinstance(value, RoutingSpec):
        spec = value
    elif isinstance(value, str):
        spec = RoutingSpec(model=value)
    else:
        spec = RoutingSpec(**value)
    spec = spec.model_copy(update={"base": spec.base or base})
    _check_model(spec)
    return spec


def _check_model(spec: RoutingSpec) -> None:
    """Refuse a routing model that is neither ``uniform``, ``zipf[:s]`` (s > 0) nor an existing weights file, and
    ``placement: map`` without its map: one line naming the problem."""
    m = spec.model
    if m == "uniform":
        return
    if m.startswith("zipf"):
        if m != "zipf" and not m.startswith("zipf:"):
            raise CosimInputError(f"routing: {m!r}: write the Zipf exponent after a colon (e.g. zipf:1.2; "
                                  "a bare zipf is zipf:1.0)")
        try:
            s = float(m.split(":", 1)[1]) if ":" in m else 1.0
        except ValueError:
            raise CosimInputError(f"routing: {m!r}: the Zipf exponent must be a number (e.g. zipf:1.2)") from None
        if not (s > 0 and math.isfinite(s)):
            raise CosimInputError(f"routing: {m!r}: the Zipf exponent must be > 0")
        return
    if _file(spec) is None:
        raise CosimInputError(f"routing: {m!r}: expected uniform, zipf:S or an existing file")
    if spec.placement == "map" and spec.map is None:
        raise CosimInputError("routing.map: placement map needs map (the EP rank of each expert)")


def _file(spec: RoutingSpec) -> Path | None:
    """The routing weights file ``spec.model`` names (relative to ``spec.base`` first); None when it is none."""
    p = Path(spec.model)
    if spec.base and not p.is_absolute() and (Path(spec.base) / p).is_file():
        return Path(spec.base) / p
    return p if p.is_file() else None


def _cap(p: np.ndarray, cap: float) -> np.ndarray:
    """Water-fill: no share above ``cap``, the excess spread proportionally over the others."""
    p = p / p.sum()
    for _ in range(len(p)):
        over = p > cap + 1e-15
        if not over.any():
            break
        excess = float((p[over] - cap).sum())
        p[over] = cap
        free = ~over & (p < cap)
        p[free] += excess * p[free] / p[free].sum()
    return p


def _file_shares(spec: RoutingSpec, card: MoEModelConfig, layer: int) -> np.ndarray:
    """Layer ``layer``'s per-expert routing weights (finite, >= 0, not all 0; not normalized) from the weights
    file: a capture.yaml's ``routing.layers`` (its tokens per expert, summed over ranks), ``layers: [{layer,
    experts}]`` with a default ``experts``, or one ``experts`` list for every layer."""
    from cosim.yamlio import load_yaml, whole_number

    path = _file(spec)
    assert path is not None
    data = load_yaml(path) if path.suffix in (".yaml", ".yml") else _json(path)
    E = card.num_experts
    if isinstance(data, dict) and isinstance(data.get("routing"), dict):  # a capture.yaml
        layers = data["routing"].get("layers") or []
        if not isinstance(layers, list) or not layers:
            raise _bad(data, ("routing", "layers"), "expected a non-empty list of layers", path)
        i = (layer - card.dense_layers) % len(layers)
        entry = layers[i]
        at: tuple[str | int, ...] = ("routing", "layers", i, "tokens_per_expert")
        if not isinstance(entry, dict):
            raise _bad(data, at[:-1], "expected a mapping with tokens_per_expert", path)
        w = _numbers(data, at, entry.get("tokens_per_expert"), path, ndim=2).sum(axis=0)
    elif isinstance(data, dict) and "layers" in data:
        if not isinstance(data["layers"], list):
            raise _bad(data, ("layers",), "expected a list of {layer, experts}", path)
        by: dict[int, int] = {}  # layer -> its entry
        for j, x in enumerate(data["layers"]):
            n = whole_number(x.get("layer")) if isinstance(x, dict) else None  # 1.0 too, as int() read it
            if n is None or "experts" not in x:
                raise _bad(data, ("layers", j), "expected {layer: <whole number>, experts: [...]}", path)
            by[n] = j
        if layer in by:
            w = _numbers(data, ("layers", by[layer], "experts"), data["layers"][by[layer]]["experts"], path)
        elif "experts" in data:
            w = _numbers(data, ("experts",), data["experts"], path)
        else:
            raise CosimInputError(f"{path}: layers: no entry for layer {layer} and no default experts:")
    elif isinstance(data, dict) and "experts" in data:
        w = _numbers(data, ("experts",), data["experts"], path)
    else:
        raise CosimInputError(f"{path}: expected experts: [...], layers: [...] or a capture.yaml routing: block")
    if w.size != E:
        raise CosimInputError(f"{path}: {w.size} expert weights for layer {layer}, but {card.name} has {E} experts")
    if not (np.isfinite(w).all() and (w >= 0).all() and w.sum() > 0):
        raise CosimInputError(f"{path}: expert weights must be finite, >= 0 and not all 0")
    return w


def _bad(data: Any, at: tuple[str | int, ...], problem: str, path: Path) -> CosimInputError:
    """The one-line error of a routing weights file whose field ``at`` is not what ``problem`` says."""
    from cosim.yamlio import input_error_at

    return input_error_at(data, list(at), problem, file=path)


def _numbers(data: Any, at: tuple[str | int, ...], value: Any, path: Path, ndim: int = 1) -> np.ndarray:
    """``value`` (the field ``at`` of the weights file) as a float array of ``ndim`` dimensions: a list of numbers
    (``ndim`` 2: a list of such lists of one length, one per rank)."""
    want = "a list of numbers" if ndim == 1 else "a list of per-rank lists of numbers, all of one length"
    ok = isinstance(value, list) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) if ndim == 1 else isinstance(v, list) for v in value)
    if ok and ndim == 2:
        ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) for v in value for x in v) and \
            len({len(v) for v in value}) == 1
    if not ok or not value:
        raise _bad(data, at, f"expected {want}", path)
    return np.asarray(value, dtype=float).reshape(-1) if ndim == 1 else np.asarray(value, dtype=float)


def _json(path: Path) -> Any:
    """The JSON document at ``path``; one-line input error when it cannot be read."""
    import json

    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CosimInputError(f"{path}: cannot read routing weights ({e})") from None


def expert_shares(spec: RoutingSpec, card: MoEModelConfig, layer: int) -> np.ndarray:
    """Share of the ``tokens * top_k`` routed rows that each expert of ``layer`` gets (sums to 1)."""
    E, k = card.num_experts, card.top_k
    m = spec.model
    if m == "uniform":
        return np.full(E, 1.0 / E)
    if m.startswith("zipf"):
        s = float(m.split(":", 1)[1]) if ":" in m else 1.0
        w = 1.0 / np.arange(1, E + 1, dtype=float) ** s
        order = np.random.Generator(np.random.PCG64([spec.seed, layer])).permutation(E)
        p = np.empty(E)
        p[order] = w
    else:
        p = _file_shares(spec, card, layer)
    return _cap(p.astype(float), 1.0 / k)


@dataclass
class RouteResult:
    """Routing of one MoE layer over one EP group."""

    rows: list[np.ndarray]
    """Per EP rank: rows of each local expert replica (grouped-GEMM group sizes)."""
    send_fraction: np.ndarray
    """[ep]: share of a source's routed rows that go to each EP rank (same for every source)."""

    def split_matrix(self, rows_per_source: float) -> np.ndarray:
        """[ep, ep] token rows rank i sends rank j (diagonal: kept local), for ``rows_per_source`` rows each."""
        ep = len(self.send_fraction)
        return np.tile(self.send_fraction * rows_per_source, (ep, 1))


def route(spec: RoutingSpec, card: MoEModelConfig, layer: int, ep: int, tokens_per_rank: float) -> RouteResult:
    """Rows per local expert on every EP rank and the dispatch shares, for ``tokens_per_rank``
    tokens routed by each of the ``ep`` ranks."""
    E = card.num_experts
    p = expert_shares(spec, card, layer)
    if spec.placement == "map":
        mp = spec.map or []
        if len(mp) != E or any(not 0 <= x < ep for x in mp):
            raise CosimInputError(f"routing.map: needs {E} entries, each an EP rank in [0, {ep})")
        owner = np.asarray(mp)
    elif spec.placement == "round-robin":
        owner = np.arange(E) % ep
    else:
        owner = np.arange(E) // (E // ep)
    if spec.redundant > E:  # the hottest ``redundant`` experts get one replica each
        raise CosimInputError(f"workload.synthetic.routing.redundant: {spec.redundant} replicas of the hottest experts, but {card.name} "
                              f"has {E} experts")
    replicas: list[list[tuple[int, float]]] = [[(int(owner[e]), 1.0)] for e in range(E)]
    load = np.bincount(owner, weights=p, minlength=ep).astype(float)
    for e in np.argsort(-p, kind="stable")[: spec.redundant]:
        e = int(e)
        target = int(np.argmin(load))
        n = len(replicas[e]) + 1
        for i, (r, _) in enumerate(replicas[e]):
            load[r] -= p[e] / (n - 1) - p[e] / n
            replicas[e][i] = (r, 1.0 / n)
        replicas[e].append((target, 1.0 / n))
        load[target] += p[e] / n
    total_rows = tokens_per_rank * card.top_k * ep  # rows of the whole EP group
    rows: list[list[float]] = [[] for _ in range(ep)]
    for e in range(E):
        for r, share in replicas[e]:
            rows[r].append(total_rows * p[e] * share)
    return RouteResult([np.asarray(x) for x in rows], load / load.sum())
