"""Hardware facts for reports: parts, power and cost of a topology, and what changed between two.

Power is the sum of catalog TDPs over the GPUs the run used (all of the
topology's when not known), the CPU sockets and NICs those GPUs attach to, and
NICs (NICs without a TDP in the catalog count 0 W and are named in
``missing_power``). Cost is the sum of ``price_usd`` over the same parts, or
None when any of them has no price (named in ``missing_price``); set prices
with catalog overrides, e.g. ``--set accelerators.h100-sxm5.price_usd=25000``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

__all__ = ["FIGURE_LABELS", "fmt_hw_value", "hardware_diff", "hardware_totals", "hw_label", "link_kinds",
           "used_devices"]

FIGURE_LABELS = {
    "name": "topology",
    "nodes": "host nodes",
    "gpus": "GPUs",
    "gpus_per_node": "GPUs per node",
    "per_gpu_scale_up_bw_Bps": "scale-up bandwidth per GPU (per direction)",
    "per_gpu_scale_out_bw_Bps": "scale-out bandwidth per GPU (per direction)",
    "per_gpu_host_bw_Bps": "host (PCIe) bandwidth per GPU (per direction)",
    "bisection_bw_Bps": "bisection bandwidth (per direction)",
    "nvlink_domain_gpus": "NVLink domain (GPUs)",
}
"""Topology figures (``Topology.figures()`` keys) in words, for tables."""
_PART_KINDS = {"gpu": "GPUs", "cpu": "CPU sockets", "nic": "NICs", "pcie_switch": "PCIe switches",
               "nvswitch": "NVSwitches", "fabric_switch": "fabric switches", "nvme": "NVMe drives"}

_KINDS = (("gpu", "accelerators"), ("cpu", "cpus"), ("nic", "nics"))


def used_devices(topo: Any, gpus: list[str] | None) -> dict[str, list[str]]:
    """The GPUs a run used and the CPU sockets and NICs they attach to (every one of the topology's when
    ``gpus`` is None or names none of its GPUs)."""
    known = [g for g in (gpus or []) if g in topo.graph]
    if not known:
        return {kind: list(topo.devices(kind)) for kind, _ in _KINDS}
    used = sorted(set(known), key=known.index)
    cpus = {topo.cpu_of(g) for g in used} - {None}
    nics = {topo.nic_of(g) for g in used} - {None}
    return {"gpu": used, "cpu": [d for d in topo.devices("cpu") if d in cpus],
            "nic": [d for d in topo.devices("nic") if d in nics]}


def hardware_totals(topo: Any, gpus: list[str] | None = None) -> dict[str, Any]:
    """Parts (kind, spec, count, TDP, price), total power (W) and cost (USD or None) of what a run used:
    the GPUs ``gpus`` (default: all of ``topo``'s) with their CPU sockets and NICs (:func:`used_devices`).
    ``topology_gpus`` is the topology's GPU count, ``gpus`` the used ones."""
    parts: list[dict[str, Any]] = []
    power = 0.0
    cost = 0.0
    missing_power: list[str] = []
    missing_price: list[str] = []
    used = used_devices(topo, gpus)
    for kind, section in _KINDS:
        specs = Counter(topo.graph.nodes[d].get("spec") for d in used[kind])
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
    return {"gpus": len(used["gpu"]), "topology_gpus": len(topo.gpus), "parts": parts, "power_W": power,
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


def hw_label(what: str) -> str:
    """A hardware-diff row name in words: ``figure per_gpu_scale_up_bw_Bps`` -> "scale-up bandwidth per GPU
    (per direction)", ``parts gpu:b200`` -> "GPUs: b200 (count)", ``links nvlink5`` -> "nvlink5 links
    (count)", ``catalog links.nvlink4.bandwidth`` -> "links.nvlink4.bandwidth (catalog)"."""
    head, _, rest = what.partition(" ")
    if head == "figure":
        return FIGURE_LABELS.get(rest, rest.replace("_", " "))
    if head == "parts":
        kind, _, spec = rest.partition(":")
        return f"{_PART_KINDS.get(kind, kind)}: {spec} (count)"
    if head == "links":
        return f"{rest} links (count)"
    if head == "catalog":
        return f"{rest} (catalog)"
    return what


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
