"""Human-readable views of a topology: the ``cosim topo show`` text and the plotly drawing."""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from cosim.units import fmt_bandwidth

from .model import Topology, natural_key

__all__ = ["draw_html", "link_label", "pcie_tree", "pcie_tree_lines", "show_text", "summary_json"]

_BW = fmt_bandwidth


def _spec_text(a: dict[str, Any]) -> str:
    parts = [a["spec"]] if a["spec"] else []
    if a.get("label"):
        parts.append(a["label"])
    if a.get("chips"):
        parts.append(f"{a['chips']} chips")
    return "  ".join(parts)


def _link_text(count: int, link: str, bandwidth: float) -> str:
    return f"[{f'{count} x ' if count > 1 else ''}{link}, {_BW(bandwidth)}]"


def _edge_text(topo: Topology, a: str, b: str) -> str:
    e = topo.graph.edges[a, b]
    return _link_text(e["count"], e["link"], e["bandwidth"])


def _local(topo: Topology, dev: str) -> str:
    return topo.graph.nodes[dev]["local_id"] if topo.is_cluster and topo.node_of(dev) >= 0 else dev


def pcie_tree(topo: Topology, node: int = 0) -> dict[str, Any]:
    """The host tree of one node as data: each CPU socket with what hangs off its root ports
    (PCIe switches, GPUs, NICs; NVLink-C2C attachments too), nested, and the socket-to-socket
    links. Bandwidths in bytes/s per direction. ``cosim topo show --json`` puts it under ``host_tree``."""
    g = topo.graph
    cpus = topo.devices("cpu", node)
    seen = set(cpus)
    host_kinds = {"pcie", "c2c"}

    def entry(dev: str) -> dict[str, Any]:
        a = g.nodes[dev]
        out = {"id": _local(topo, dev), "kind": topo.kind_of(dev), "spec": a["spec"] or None}
        out.update({k: a[k] for k in ("label", "chips") if a.get(k)})
        return out

    def link(a: str, b: str) -> dict[str, Any]:
        e = g.edges[a, b]
        return {"link": e["link"], "count": e["count"], "bandwidth_Bps": e["bandwidth"]}

    def walk(dev: str) -> list[dict[str, Any]]:
        kids = sorted((v for v in g.successors(dev) if v not in seen and topo.node_of(v) == node
                       and g.edges[dev, v]["kind"] in host_kinds),
                      key=lambda v: (topo.kind_of(v) != "pcie_switch", natural_key(v)))
        seen.update(kids)
        out = []
        for v in kids:
            item = {**entry(v), **link(dev, v)}
            if topo.kind_of(v) == "pcie_switch":
                item["children"] = walk(v)
            out.append(item)
        return out

    sockets = [{**entry(cpu), "children": walk(cpu)} for cpu in cpus]
    between = [{"between": [_local(topo, a), _local(topo, b)], **link(a, b)}
               for i, a in enumerate(cpus) for b in cpus[i + 1:] if g.has_edge(a, b)]
    return {"node": node, "sockets": sockets, "socket_links": between}


def pcie_tree_lines(topo: Topology, node: int = 0) -> list[str]:
    """:func:`pcie_tree` as the indented lines of ``cosim topo show``."""
    tree = pcie_tree(topo, node)
    lines: list[str] = []

    spec = _spec_text

    def edge(item: dict[str, Any]) -> str:
        return _link_text(item["count"], item["link"], item["bandwidth_Bps"])

    def walk(kids: list[dict[str, Any]], prefix: str) -> None:
        for i, item in enumerate(kids):
            last = i == len(kids) - 1
            lines.append(f"{prefix}{'└── ' if last else '├── '}{item['id']}  {spec(item)}  {edge(item)}")
            if "children" in item:
                walk(item["children"], prefix + ("    " if last else "│   "))

    for sock in tree["sockets"]:
        lines.append(f"{sock['id']}  {spec(sock)}")
        walk(sock["children"], "")
    for sl in tree["socket_links"]:
        lines.append(f"{sl['between'][0]} <-> {sl['between'][1]}  {edge(sl)}")
    return lines


def scale_up_lines(topo: Topology, node: int = 0) -> list[str]:
    """The GPUs' scale-up links on one node: one line per NVSwitch group, or one per GPU pair."""
    g = topo.graph
    gpus = topo.gpus_on(node)
    groups: dict[tuple[str, str, int], list[str]] = defaultdict(list)
    pairs: list[str] = []
    for gpu in gpus:
        for v in sorted(g.successors(gpu), key=natural_key):
            e = g.edges[gpu, v]
            kv = topo.kind_of(v)
            if kv == "nvswitch":
                groups[(v, e["link"], e["count"])].append(gpu)
            elif kv == "gpu" and natural_key(gpu) < natural_key(v):
                pairs.append(f"{_local(topo, gpu)} <-> {_local(topo, v)}  {_edge_text(topo, gpu, v)}")
    out = []
    for (sw, link, count), members in groups.items():
        bw = g.edges[members[0], sw]["bandwidth"]
        names = [_local(topo, m) for m in members]
        span = f"{names[0]}..{names[-1]}" if len(names) > 2 else ", ".join(names)
        out.append(f"{span} <-> {sw}: {count} x {link} each ({_BW(bw)} per GPU)")
    return out + pairs


def summary_json(topo: Topology) -> dict[str, Any]:
    """The ``cosim topo show --json`` document: figures, counts and where it came from."""
    fig = topo.figures()
    fig.update({
        "description": topo.description,
        "source": topo.source,
        "file": str(topo.source_file) if topo.source_file else None,
        "node_topology": topo.node_name,
        "fabric": topo.fabric,
        "gpu_specs": dict(sorted(Counter(topo.graph.nodes[g]["spec"] for g in topo.gpus).items())),
        "host_tree": pcie_tree(topo, topo.node_of(topo.gpus[0])),
    })
    return fig


def show_text(topo: Topology) -> str:
    """The ``cosim topo show`` report."""
    fig = topo.figures()
    g = topo.graph
    out: list[str] = []
    out.append(f"{topo.name}: {topo.description}" if topo.description else topo.name)
    if topo.source:
        out.append(f"source: {topo.source}")
    out.append("")
    gpu0 = topo.gpus[0]
    specs = Counter(g.nodes[x]["spec"] for x in topo.gpus)
    spec_txt = ", ".join(f"{n} x {s} ({topo.catalog.accelerators[s].name})" for s, n in specs.items())
    out.append("Summary")
    hosts = f"{fig['nodes']}" + (f" x {topo.node_name}" if topo.node_name else "")
    out.append(f"  host nodes        {hosts}")
    out.append(f"  GPUs              {fig['gpus']} ({fig['gpus_per_node']} per node): {spec_txt}")
    out.append("  devices           " + ", ".join(f"{n} {k}" for k, n in fig["devices"].items()))
    out.append("  physical links    " + ", ".join(f"{n} {k}" for k, n in fig["links"].items()))
    if topo.fabric:
        roles = Counter(g.nodes[x].get("role", "switch") for x in topo.devices("fabric_switch"))
        fab = ", ".join(f"{n} {r}{'s' if n > 1 else ''}" for r, n in sorted(roles.items()))
        out.append(f"  fabric            {topo.fabric['topology']}: {fab}"
                   + (f", oversubscription {topo.fabric.get('oversubscription', 1):g}:1" if topo.fabric['topology'] in
                      ("leaf-spine", "fat-tree", "rail-optimized") else ""))
    out.append("")
    out.append("Figures (raw bandwidth, bytes/s per direction)")
    up_detail = ""
    su = [(v, e) for _, v, e in g.out_edges(gpu0, data=True) if topo.kind_of(v) in ("gpu", "nvswitch")]
    if su:
        links = Counter(e["link"] for _, e in su)
        up_detail = "  (" + ", ".join(f"{sum(e['count'] for _, e in su if e['link'] == k)} x {k}" for k in links) + " per GPU)"
    out.append(f"  scale-up per GPU    {_BW(fig['per_gpu_scale_up_bw_Bps']):>10}{up_detail or '  (no NVLink)'}")
    nic = topo.nic_of(gpu0)
    nic_txt = ""
    if nic:
        sharers = sum(1 for x in topo.gpus_on(topo.node_of(gpu0)) if topo.nic_of(x) == nic)
        nic_txt = f"  ({topo.graph.nodes[nic]['spec']}" + (f", shared by {sharers} GPUs" if sharers > 1 else ", one per GPU") + ")"
    out.append(f"  scale-out per GPU   {_BW(fig['per_gpu_scale_out_bw_Bps']):>10}{nic_txt or '  (no NIC)'}")
    host_path = topo.route(gpu0, topo.cpu_of(gpu0))
    out.append(f"  host per GPU        {_BW(fig['per_gpu_host_bw_Bps']):>10}  ({' -> '.join(_local(topo, x) for x in host_path)})")
    out.append(f"  bisection           {_BW(fig['bisection_bw_Bps']):>10}  "
               + ("(half of the nodes to the other half)" if fig["nodes"] > 1 else "(half of the GPUs to the other half)"))
    out.append(f"  NVLink domain       {fig['nvlink_domain_gpus']:>6} GPUs")
    out.append("")
    node = topo.node_of(gpu0)
    where = f"node {node}" + (f", same on all {fig['nodes']} nodes" if fig["nodes"] > 1 else "")
    out.append(f"Host tree ({where})")
    out.extend("  " + line for line in pcie_tree_lines(topo, node))
    su_lines = scale_up_lines(topo, node)
    if su_lines:
        out.append("")
        out.append("Scale-up links")
        out.extend("  " + line for line in su_lines)
    out.append("")
    out.append("GPU -> NIC (rail):  " + "  ".join(f"{_local(topo, x)}->{_local(topo, nic) if (nic := topo.nic_of(x)) else '-'}"
                                               for x in topo.gpus_on(node)))
    return "\n".join(out) + "\n"


_LAYER = {"fabric_switch": 5.0, "nic": 4.0, "pcie_switch": 3.0, "cpu": 2.0, "gpu": 1.0, "nvme": 1.5, "nvswitch": 0.0}
_COLOR = {"gpu": "#76b900", "cpu": "#1f77b4", "pcie_switch": "#ff7f0e", "nvswitch": "#9467bd", "nic": "#d62728",
          "fabric_switch": "#7f7f7f", "nvme": "#8c564b"}


def _positions(topo: Topology) -> dict[str, tuple[float, float]]:
    g = topo.graph
    pos: dict[str, tuple[float, float]] = {}
    per_node: dict[int, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for n in g:
        per_node[topo.node_of(n)][topo.kind_of(n)].append(n)
    width = max((len(v) for kinds in per_node.values() for v in kinds.values()), default=1) + 1
    hosts = sorted(k for k in per_node if k >= 0)
    for col, h in enumerate(hosts):
        for kind, devs in per_node[h].items():
            devs.sort(key=natural_key)
            for i, d in enumerate(devs):
                x = col * width + (i + 0.5) * (width - 1) / len(devs)
                y = _LAYER.get(kind, 0.5) + (0.25 if kind == "cpu" and i % 2 else 0.0)
                pos[d] = (x, y)
    total = max(1, len(hosts)) * width
    fab = per_node.get(-1, {})
    for kind, devs in fab.items():
        devs.sort(key=natural_key)
        tiers: dict[float, list[str]] = defaultdict(list)
        for d in devs:
            tier = float(g.nodes[d].get("tier", 1)) if kind == "fabric_switch" else 0.0
            tiers[tier].append(d)
        for tier, ds in tiers.items():
            y = (_LAYER[kind] + tier) if kind == "fabric_switch" else -1.0
            for i, d in enumerate(ds):
                pos[d] = ((i + 0.5) * total / len(ds), y)
    return pos


def link_label(count: int, link: str, bandwidth: float) -> str:
    """An always-on label of a link: "18 x nvlink4, 450 GB/s" (count x type, total bandwidth per direction)."""
    return f"{count} x {link}, {_BW(bandwidth)}"


def _link_annotations(topo: Topology, pos: dict[str, tuple[float, float]]) -> list[dict[str, Any]]:
    """One always-visible label per group of identical links of one node (the first host node, or the
    fabric) where they meet: "18 x nvlink4, 450 GB/s" at the middle of the first such edge, so the picture
    reads without hovering. Identical edges elsewhere (other GPUs, other nodes) share the label."""
    g = topo.graph
    first_node = min((topo.node_of(n) for n in g if topo.node_of(n) >= 0), default=-1)
    seen: dict[tuple[str, str, str, int, float], tuple[str, str]] = {}
    for a, b, e in g.edges(data=True):
        if natural_key(a) >= natural_key(b):
            continue
        na, nb = topo.node_of(a), topo.node_of(b)
        if not ({na, nb} <= {first_node, -1}):
            continue
        key = (topo.kind_of(a), topo.kind_of(b), e["link"], int(e["count"]), float(e["bandwidth"]))
        seen.setdefault(key, (a, b))
    out = []
    for (_ka, _kb, link, count, bw), (a, b) in sorted(seen.items(), key=lambda kv: natural_key(kv[1][0])):
        (x0, y0), (x1, y1) = pos[a], pos[b]
        out.append({"x": (x0 + x1) / 2, "y": (y0 + y1) / 2, "text": link_label(count, link, bw), "showarrow": False,
                    "font": {"size": 10, "color": "#333"}, "bgcolor": "rgba(255,255,255,0.85)"})
    return out


def draw_html(topo: Topology) -> str:
    """A self-contained HTML page (plotly.js inline) drawing the topology graph."""
    import plotly.graph_objects as go

    g = topo.graph
    pos = _positions(topo)
    traces = []
    by_link: dict[str, tuple[list[float | None], list[float | None]]] = defaultdict(lambda: ([], []))
    mids: dict[str, tuple[list[float], list[float], list[str]]] = defaultdict(lambda: ([], [], []))
    for a, b, e in g.edges(data=True):
        if natural_key(a) >= natural_key(b):
            continue
        xs, ys = by_link[e["kind"]]
        (x0, y0), (x1, y1) = pos[a], pos[b]
        xs += [x0, x1, None]
        ys += [y0, y1, None]
        mx, my, mt = mids[e["kind"]]
        mx.append((x0 + x1) / 2)
        my.append((y0 + y1) / 2)
        mt.append(f"{a} — {b}<br>{e['count']} x {e['link']}<br>{_BW(e['bandwidth'])} per direction<br>latency {e['latency'] * 1e9:.0f} ns")
    for kind, (xs, ys) in sorted(by_link.items()):
        traces.append(go.Scatter(x=xs, y=ys, mode="lines", name=f"{kind} links", line={"width": 1}, hoverinfo="skip"))
        mx, my, mt = mids[kind]
        traces.append(go.Scatter(x=mx, y=my, mode="markers", marker={"size": 3, "opacity": 0.3}, text=mt,
                                 hoverinfo="text", showlegend=False))
    annotations = _link_annotations(topo, pos)
    by_kind: dict[str, list[str]] = defaultdict(list)
    for n in g:
        by_kind[topo.kind_of(n)].append(n)
    for kind, devs in sorted(by_kind.items()):
        texts = []
        for d in devs:
            a = g.nodes[d]
            texts.append(f"{d}<br>{kind}" + (f" {a['spec']}" if a["spec"] else "") + (f"<br>{a['label']}" if a.get("label") else ""))
        traces.append(go.Scatter(
            x=[pos[d][0] for d in devs], y=[pos[d][1] for d in devs], mode="markers", name=kind,
            marker={"size": 10, "color": _COLOR.get(kind, "#333")}, text=texts, hoverinfo="text"))
    fig = go.Figure(traces)
    f = topo.figures()
    title = (f"{topo.name}: {f['gpus']} GPUs, scale-up {_BW(f['per_gpu_scale_up_bw_Bps'])}/GPU, "
             f"scale-out {_BW(f['per_gpu_scale_out_bw_Bps'])}/GPU, bisection {_BW(f['bisection_bw_Bps'])} (per direction)")
    fig.update_layout(title=title, template="plotly_white", hovermode="closest", annotations=annotations,
                      xaxis={"visible": False}, yaxis={"visible": False}, height=700)
    return fig.to_html(include_plotlyjs=True, full_html=True)
