"""Scale-out fabrics generated from a few parameters.

Every generated switch is a ``fabric_switch`` node ``fabric.<role><k>`` with
``node = -1``. NIC-to-switch cables carry ``count = nic.ports`` links of the
fabric link type; switch-to-switch cables carry as many parallel links as the
generator computes. All bandwidths come from the catalog link type.

* ``single-switch``: one ideal switch, every NIC port on it (non-blocking).
* ``leaf-spine`` / ``fat-tree`` (two-level folded Clos): NIC ports fill leaves
  in node-major order, ``leaf_down_ports`` per leaf (default radix/2), never
  splitting a node across leaves when a node fits; each leaf gets
  ceil(down / oversubscription) uplinks spread evenly over the spines;
  spines = ceil(total uplinks / radix).
* ``rail-optimized``: as leaf-spine, but NIC k of every node goes to the leaves
  of rail k (DGX SuperPOD style); spines join the rails.
* ``dragonfly``: switches of ``hosts_per_switch`` ports in groups of
  ``group_size``, all-to-all inside a group, one global link per group pair.
* ``torus``: one switch per node on a ``dims`` grid with wrap-around links.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from cosim.yamlio import LocDict, input_error_at

from .schema import FabricSpec

if TYPE_CHECKING:
    from .build import _GraphBuilder, _Local

__all__ = ["generate_fabric"]


def _fabric_nics(spec: FabricSpec, local: _Local, data: LocDict) -> list[str]:
    nics = [d.gid for d in local.devices if d.kind == "nic"]
    if spec.nics is None:
        if not nics:
            raise input_error_at(data, ["fabric"], "the host node has no NIC to attach to the fabric")
        return nics
    for k, n in enumerate(spec.nics):
        if n not in nics:
            raise input_error_at(data, ["fabric", "nics", k], f"{n!r} is not a NIC of the host node (NICs: {', '.join(nics) or 'none'})")
    return list(spec.nics)


def generate_fabric(b: _GraphBuilder, spec: FabricSpec, nodes: int, local: _Local, data: LocDict) -> None:
    """Add the switches and cables of ``spec`` to builder ``b`` for ``nodes`` host nodes."""
    nic_ids = _fabric_nics(spec, local, data)
    cat = b.cat
    spec_of = {d.gid: d.spec for d in local.devices}
    link = spec.link
    if link is None:
        link = cat.nics[spec_of[nic_ids[0]]].link  # type: ignore[index]
    if link not in cat.links:
        raise input_error_at(data, ["fabric", "link" if spec.link else "topology"], f"unknown fabric link type {link!r}")
    ports = {n: cat.nics[spec_of[n]].ports for n in nic_ids}  # type: ignore[index]
    origin = (data, ["fabric"])

    def switch(name: str, **extra: Any) -> str:
        gid = f"fabric.{name}"
        b.add_device(gid, "fabric_switch", -1, None, name, origin=origin, **extra)
        return gid

    topo = spec.topology
    if topo == "single-switch":
        sw = switch("switch0", role="switch")
        for n in range(nodes):
            for nic in nic_ids:
                b.add_link(f"node{n}.{nic}", sw, link, ports[nic], origin)
        return
    if topo in ("leaf-spine", "fat-tree", "rail-optimized"):
        _clos(b, spec, nodes, nic_ids, ports, link, switch, data)
        return
    if topo == "dragonfly":
        _dragonfly(b, spec, nodes, nic_ids, ports, link, switch, data)
        return
    if topo == "torus":
        _torus(b, spec, nodes, nic_ids, ports, link, switch, data)
        return
    raise AssertionError(topo)


def _clos(b: _GraphBuilder, spec: FabricSpec, nodes: int, nic_ids: list[str], ports: dict[str, int], link: str,
          switch: Any, data: LocDict) -> None:
    radix = spec.switch_radix
    down = spec.leaf_down_ports or radix // 2
    origin = (data, ["fabric"])
    rail = spec.topology == "rail-optimized"
    groups: list[list[tuple[str, int]]]  # one list of (nic graph id, ports) per rail (or one for all)
    if rail:
        groups = [[(f"node{n}.{nic}", ports[nic]) for n in range(nodes)] for nic in nic_ids]
        unit = max(ports.values())
    else:
        groups = [[(f"node{n}.{nic}", ports[nic]) for n in range(nodes) for nic in nic_ids]]
        unit = sum(ports[n] for n in nic_ids)  # keep a node's NICs on one leaf when they fit
    if max(ports.values()) > down:
        raise input_error_at(data, ["fabric", "leaf_down_ports"], f"a NIC has more ports than a leaf's {down} host ports")
    if unit <= down:
        down = (down // unit) * unit
    leaves: list[tuple[int, list[tuple[str, int]]]] = []  # (rail, members)
    for r, members in enumerate(groups):
        cur: list[tuple[str, int]] = []
        used = 0
        step = len(nic_ids) if not rail else 1
        chunk: list[tuple[str, int]] = []
        for idx, m in enumerate(members):
            chunk.append(m)
            if (idx + 1) % step:
                continue
            size = sum(p for _, p in chunk)
            if used + size > down and cur:
                leaves.append((r, cur))
                cur, used = [], 0
            if size > down:  # a node bigger than a leaf: split it port by port
                for mm in chunk:
                    if used + mm[1] > down and cur:
                        leaves.append((r, cur))
                        cur, used = [], 0
                    cur.append(mm)
                    used += mm[1]
            else:
                cur.extend(chunk)
                used += size
            chunk = []
        if cur:
            leaves.append((r, cur))
    up = [math.ceil(sum(p for _, p in mem) / spec.oversubscription) for _, mem in leaves]
    for (_, mem), u in zip(leaves, up):
        if sum(p for _, p in mem) + u > radix:
            raise input_error_at(data, ["fabric", "switch_radix"],
                                 f"a leaf needs {sum(p for _, p in mem)} host ports + {u} uplinks > radix {radix}")
    leaf_ids = []
    for k, (r, mem) in enumerate(leaves):
        extra = {"role": "leaf", "tier": 1}
        if rail:
            extra["rail"] = r
        lid = switch(f"leaf{k}", **extra)
        leaf_ids.append(lid)
        for nic, p in mem:
            b.add_link(nic, lid, link, p, origin)
    if len(leaves) == 1:
        return  # one leaf holds every port: no spine needed
    total_up = sum(up)
    n_spines = max(1, math.ceil(total_up / radix))
    spine_ids = [switch(f"spine{s}", role="spine", tier=2) for s in range(n_spines)]
    for lid, u in zip(leaf_ids, up):
        per = math.ceil(u / n_spines)
        for sid in spine_ids:
            b.add_link(lid, sid, link, per, origin)


def _dragonfly(b: _GraphBuilder, spec: FabricSpec, nodes: int, nic_ids: list[str], ports: dict[str, int], link: str,
               switch: Any, data: LocDict) -> None:
    origin = (data, ["fabric"])
    h = spec.hosts_per_switch or max(1, spec.switch_radix // 4)
    a = spec.group_size or 4
    members = [(f"node{n}.{nic}", ports[nic]) for n in range(nodes) for nic in nic_ids]
    switches: list[list[tuple[str, int]]] = [[]]
    used = 0
    for m in members:
        if used + m[1] > h and switches[-1]:
            switches.append([])
            used = 0
        switches[-1].append(m)
        used += m[1]
    n_groups = math.ceil(len(switches) / a)
    ids = []
    for k, mem in enumerate(switches):
        sid = switch(f"sw{k}", role="switch", group=k // a)
        ids.append(sid)
        for nic, p in mem:
            b.add_link(nic, sid, link, p, origin)
    groups = [ids[g * a:(g + 1) * a] for g in range(n_groups)]
    for grp in groups:
        for x in range(len(grp)):
            for y in range(x + 1, len(grp)):
                b.add_link(grp[x], grp[y], link, 1, origin)
    for g1 in range(n_groups):
        for g2 in range(g1 + 1, n_groups):
            s1 = groups[g1][(g2 - g1 - 1) % len(groups[g1])]
            s2 = groups[g2][(g1 - g2 - 1) % len(groups[g2])]
            b.add_link(s1, s2, link, 1, origin)


def _torus(b: _GraphBuilder, spec: FabricSpec, nodes: int, nic_ids: list[str], ports: dict[str, int], link: str,
           switch: Any, data: LocDict) -> None:
    origin = (data, ["fabric"])
    dims = spec.dims or [nodes]
    if math.prod(dims) != nodes or any(d < 1 for d in dims):
        raise input_error_at(data, ["fabric", "dims"], f"dims {dims} hold {math.prod(dims)} switches; need one per node ({nodes})")
    ids = []
    for n in range(nodes):
        sid = switch(f"sw{n}", role="switch")
        ids.append(sid)
        for nic in nic_ids:
            b.add_link(f"node{n}.{nic}", sid, link, ports[nic], origin)

    def coord(n: int) -> list[int]:
        out = []
        for d in dims:
            out.append(n % d)
            n //= d
        return out

    def index(c: list[int]) -> int:
        n, mul = 0, 1
        for x, d in zip(c, dims):
            n += x * mul
            mul *= d
        return n

    for n in range(nodes):
        c = coord(n)
        for axis, d in enumerate(dims):
            if d == 1:
                continue
            nb = list(c)
            nb[axis] = (c[axis] + 1) % d
            m = index(nb)
            if d == 2 and c[axis] == 1:
                continue  # the pair (0,1) already got its two links
            b.add_link(ids[n], ids[m], link, 2 if d == 2 else 1, origin)
