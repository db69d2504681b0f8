"""Hardware facts for reports: parts, power and cost of a topology, and what changed between two.

Power is the sum of catalog TDPs over the topology's GPUs, CPU sockets and
NICs (NICs without a TDP in the catalog count 0 W and are named in
``missing_power``). Cost is the sum of ``price_usd`` over the same parts, or
None when any of them has no price (named in ``missing_price``); set prices
with catalog overrides, e.g. ``--set accelerators.h100-sxm5.price_usd=25000``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["fmt_hw_value", "hardware_diff", "hardware_totals", "link_kinds"]

_KINDS = (("gpu", "accelerators"), ("cpu", "cpus"), ("nic", "nics"))


def hardware_totals(topo: Any) -> dict[str, Any]:
    """Parts (kind, spec, count, TDP, price), total power (W) and cost (USD or None) of ``topo``."""
    parts: list[dict[str, Any]] = []
    power = 0.0
    cost = 0.0
    missing_power: list[str] = []
    missing_price: list[str] = []
    for kind, section in _KINDS:
        specs = Counter(topo.graph.nodes[d].get("spec") for d in topo.devices(kind))
        for spec, n in sorted(specs.items(), key=lambda kv: str(kv[0])):
            try:
                entry = topo.catalog.lookup(section, spec)
            except Exception:
                entry = None
            tdp = getattr(entry, "tdp", None)
            price = getattr(entry, "price_usd", None)
            parts.append({"kind": kind, "spec": spec, "name": getattr(entry, "name", spec), "count": n,
                          "tdp_W": tdp, "price_usd": price})
            if tdp is None:
                missing_power.append(str(spec))
            else:
                power += n * float(tdp)
            if price is None:
                missing_price.append(str(spec))
            else:
                cost += n * float(price)
    return {"gpus": len(topo.gpus), "parts": parts, "power_W": power,
            "cost_usd": None if missing_price else cost,
            "missing_power": missing_power, "missing_price": missing_price}


def link_kinds(topo: Any) -> dict[str, str]:
    """Catalog link type id -> its kind (pcie, nvlink, infiniband, ethernet, upi, ...)."""
    out: dict[str, str] = {}
    for _, _, e in topo.graph.edges(data=True):
        lt = e.get("link")
        if lt and lt not in out:
            try:
                out[lt] = str(topo.catalog.link(lt).kind)
            except Exception:
                out[lt] = "?"
    return out


def _spec_counts(topo: Any) -> dict[str, int]:
    c: Counter[str] = Counter()
    for kind, _ in (*_KINDS, ("pcie_switch", ""), ("nvswitch", ""), ("fabric_switch", "")):
        for d in topo.devices(kind):
            c[f"{kind}:{topo.graph.nodes[d].get('spec') or kind}"] += 1
    return dict(sorted(c.items()))


def _entry_fields(topo: Any, section: str, key: str) -> dict[str, Any]:
    try:
        e = topo.catalog.lookup(section, key)
    except Exception:
        return {}
    d = e.model_dump(mode="json") if hasattr(e, "model_dump") else {}
    for k in ("source", "sources", "notes", "name", "vendor"):
        d.pop(k, None)
    return d


def flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    else:
        out[prefix] = d
    return out


def hardware_diff(base: Any, other: Any) -> list[dict[str, Any]]:
    """What differs between two topologies: figures, parts per spec, links per type, catalog fields.

    Returns rows ``{what, baseline, proposal}`` (values JSON-ready), figures first.
    """
    rows: list[dict[str, Any]] = []
    fa, fb = base.figures(), other.figures()
    for k in fa.keys() | fb.keys():
        if k in ("devices", "links"):
            continue
        if fa.get(k) != fb.get(k):
            rows.append({"what": f"figure {k}", "baseline": fa.get(k), "proposal": fb.get(k)})
    sa, sb = _spec_counts(base), _spec_counts(other)
    for k in sorted(sa.keys() | sb.keys()):
        if sa.get(k, 0) != sb.get(k, 0):
            rows.append({"what": f"parts {k}", "baseline": sa.get(k, 0), "proposal": sb.get(k, 0)})
    la, lb = fa.get("links", {}), fb.get("links", {})
    for k in sorted(la.keys() | lb.keys()):
        if la.get(k, 0) != lb.get(k, 0):
            rows.append({"what": f"links {k}", "baseline": la.get(k, 0), "proposal": lb.get(k, 0)})
    # catalog fields of the parts and link types both use
    used: set[tuple[str, str]] = set()
    for t in (base, other):
        for kind, section in _KINDS:
            used.update((section, str(t.graph.nodes[d].get("spec"))) for d in t.devices(kind))
        used.update(("links", str(e.get("link"))) for _, _, e in t.graph.edges(data=True) if e.get("link"))
    for section, key in sorted(used):
        a, b = flatten(_entry_fields(base, section, key)), flatten(_entry_fields(other, section, key))
        if not a or not b:
            continue
        for f in sorted(a.keys() | b.keys()):
            if a.get(f) != b.get(f):
                rows.append({"what": f"catalog {section}.{key}.{f}", "baseline": a.get(f), "proposal": b.get(f)})
    sorted_rows = sorted(rows, key=lambda r: (not r["what"].startswith("figure"), r["what"]))
    return sorted_rows


_FIELD_KINDS = {
    "bandwidth": "bandwidth", "hbm_bandwidth": "bandwidth", "memory_bandwidth": "bandwidth",
    "latency": "time", "launch_overhead": "time", "launch_latency": "time", "per_message_overhead": "time",
    "hbm_capacity": "size", "l2_size": "size",
    "clock": "frequency", "frequency": "frequency", "boost_frequency": "frequency",
    "tdp": "power", "message_rate": "rate",
}


def fmt_hw_value(what: str, value: Any) -> str:
    """A hardware-diff value with its unit, from the row's name: ``figure per_gpu_scale_up_bw_Bps`` 1.8e12
    -> "1.8 TB/s", ``catalog links.nvlink4.bandwidth`` -> bandwidth, ``...peak_flops.bf16`` -> FLOP/s,
    latencies and overheads -> time, TDP -> W, ``price_usd`` -> $. Counts and names print as they are."""
    from cosim import units

    if value is None:
        return "n/a"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    name = what.split(" ", 1)[-1]
    last = name.rsplit(".", 1)[-1]
    if name.endswith("_Bps"):
        return units.fmt_bandwidth(float(value))
    if name.endswith("_s"):
        return units.fmt_time(float(value))
    if ".peak_flops." in f".{name}." or last == "peak_flops":
        return units.fmt_flops(float(value))
    if last == "price_usd":
        return f"${value:,.0f}"
    kind = _FIELD_KINDS.get(last)
    if kind and what.startswith("catalog "):
        return units.fmt(float(value), kind)  # type: ignore[arg-type]
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)
