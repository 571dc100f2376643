"""Topologies built directly with the IR, and a definition-level cut bound by enumeration."""

from __future__ import annotations

import itertools

from collc.ir import Collective, Link, Node, NodeKind, Topology

GB = 1e9
US = 1e-6

# DGX-1 NVLink lane counts (reference.md, TE-CCL artifact).
DGX1_LANES = [
    [0, 2, 1, 1, 2, 0, 0, 0], [2, 0, 1, 2, 0, 1, 0, 0], [1, 1, 0, 2, 0, 0, 2, 0], [1, 2, 2, 0, 0, 0, 0, 1],
    [2, 0, 0, 0, 0, 2, 1, 1], [0, 1, 0, 0, 2, 0, 1, 2], [0, 0, 2, 0, 1, 1, 0, 2], [0, 0, 0, 1, 1, 2, 2, 0],
]


def build(name: str, gpus: list[str], others: list[str], edges, latency: float = 1 * US,
          directed: bool = False) -> Topology:
    """`edges`: (a, b, bytes/s[, lanes]); both directions unless `directed`."""
    nodes = [Node(g, NodeKind.GPU, i) for i, g in enumerate(gpus)] + [Node(s, NodeKind.SWITCH) for s in others]
    links = []
    for e in edges:
        a, b, bw = e[:3]
        lanes = e[3] if len(e) > 3 else 1
        links.append(Link(a, b, bw, latency, lanes))
        if not directed:
            links.append(Link(b, a, bw, latency, lanes))
    return Topology(name, tuple(nodes), tuple(links))


def ring(n: int, bw: float = 10 * GB) -> Topology:
    return build(f"ring{n}", [f"g{i}" for i in range(n)], [], [(f"g{i}", f"g{(i + 1) % n}", bw) for i in range(n)])


def chain(n: int, bw: float = 10 * GB) -> Topology:
    return build(f"chain{n}", [f"g{i}" for i in range(n)], [], [(f"g{i}", f"g{i + 1}", bw) for i in range(n - 1)])


def star(n: int, bw: float = 10 * GB) -> Topology:
    return build(f"star{n}", [f"g{i}" for i in range(n)], ["sw"], [(f"g{i}", "sw", bw) for i in range(n)])


def torus(rows: int, cols: int, bw: float = 25 * GB) -> Topology:
    edges = set()
    for i in range(rows):
        for j in range(cols):
            u = i * cols + j
            for v in (i * cols + (j + 1) % cols, ((i + 1) % rows) * cols + j):
                if u != v:
                    edges.add((min(u, v), max(u, v)))
    return build(f"torus{rows}x{cols}", [f"g{i}" for i in range(rows * cols)], [],
                 [(f"g{u}", f"g{v}", bw) for u, v in sorted(edges)])


def two_groups(fast: float = 100 * GB, slow: float = 1 * GB) -> Topology:
    """Two 2-GPU groups, each on its own switch, the switches joined by one slow link."""
    return build("two_groups", ["a0", "a1", "b0", "b1"], ["sa", "sb"],
                 [("a0", "sa", fast), ("a1", "sa", fast), ("b0", "sb", fast), ("b1", "sb", fast), ("sa", "sb", slow)])


def lopsided() -> Topology:
    """Directed, uneven links: directions differ, so time reversal is not a symmetry."""
    return build("lopsided", ["a0", "a1", "a2", "b0"], ["sa"],
                 [("a0", "sa", 100 * GB), ("sa", "a0", 40 * GB), ("a1", "sa", 50 * GB), ("sa", "a1", 100 * GB),
                  ("a2", "sa", 100 * GB), ("sa", "a2", 100 * GB), ("sa", "b0", 3 * GB), ("b0", "sa", 7 * GB),
                  ("a0", "b0", 2 * GB), ("b0", "a2", 1 * GB)], directed=True)


def reversed_topology(t: Topology) -> Topology:
    return Topology(t.name + "_rev", t.nodes,
                    tuple(Link(l.dst, l.src, l.bandwidth, l.latency, l.multiplicity) for l in t.links))


def dgx2_x2() -> Topology:
    """TE-CCL's DGX-2 pair: 16 GPUs per NVSwitch at 125 GB/s (0.35 us); IB links of 12.5 GB/s
    (2.6 us) from each odd GPU to an even GPU of the other chassis."""
    nodes, links = [], []
    for c in range(2):
        nodes += [Node(f"c{c}g{i}", NodeKind.GPU, c * 16 + i) for i in range(16)]
    for c in range(2):
        nodes.append(Node(f"c{c}sw", NodeKind.SWITCH))
        for i in range(16):
            links += [Link(f"c{c}g{i}", f"c{c}sw", 125 * GB, 0.35 * US),
                      Link(f"c{c}sw", f"c{c}g{i}", 125 * GB, 0.35 * US)]
    for k in range(8):
        links += [Link(f"c0g{2 * k + 1}", f"c1g{2 * k}", 12.5 * GB, 2.6 * US),
                  Link(f"c1g{2 * k + 1}", f"c0g{2 * k}", 12.5 * GB, 2.6 * US)]
    return Topology("dgx2_x2", tuple(nodes), tuple(links))


def ndv2_x2() -> Topology:
    """Two DGX-1-like chassis (NVLink 25 GB/s per lane, 0.7 us), each reaching the other
    through one NIC and one 12.5 GB/s InfiniBand link (1.3 us)."""
    nodes, links = [], []
    for c in range(2):
        nodes += [Node(f"c{c}g{i}", NodeKind.GPU, c * 8 + i) for i in range(8)]
    for c in range(2):
        nodes.append(Node(f"c{c}nic", NodeKind.NIC))
        for i in range(8):
            for j in range(8):
                if DGX1_LANES[i][j]:
                    links.append(Link(f"c{c}g{i}", f"c{c}g{j}", 25 * GB, 0.7 * US, DGX1_LANES[i][j]))
            links += [Link(f"c{c}g{i}", f"c{c}nic", 12.5 * GB, 1.3 * US),
                      Link(f"c{c}nic", f"c{c}g{i}", 12.5 * GB, 1.3 * US)]
    links += [Link("c0nic", "c1nic", 12.5 * GB, 1.3 * US), Link("c1nic", "c0nic", 12.5 * GB, 1.3 * US)]
    return Topology("ndv2_x2", tuple(nodes), tuple(links))


# --- the cut bound by its definition -----------------------------------------------

def naive_crossing(coll: Collective, topo: Topology, inside: set[str]) -> int:
    """Distinct required values (the standard collectives' are pairwise disjoint) that a
    GPU outside `inside` needs and lacks, with a chunk whose every holder is inside."""
    gpu_in = {g.rank for g in topo.gpus if g.name in inside}
    held = [set().union(*(v for v in buf if v)) if buf else set() for buf in coll.inputs]
    count = 0
    for value in {v for buf in coll.outputs for v in buf if v}:
        needed_outside = any(value in coll.outputs[r] and not value <= held[r]
                             for r in range(coll.ranks) if r not in gpu_in)
        holders = [{r for r in range(coll.ranks) if c in held[r]} for c in value]
        if needed_outside and any(hs and hs <= gpu_in for hs in holders):
            count += 1
    return count


def naive_out_capacity(topo: Topology, inside: set[str]) -> float:
    return sum(l.capacity for l in topo.links if l.src in inside and l.dst not in inside)


def brute_force_cut(coll: Collective, topo: Topology, size_bytes: int) -> float:
    slot = coll.slot_bytes(size_bytes)
    names = [n.name for n in topo.nodes]
    best = 0.0
    for k in range(1, len(names)):
        for s in itertools.combinations(names, k):
            inside = set(s)
            b = naive_out_capacity(topo, inside)
            if b > 0:
                best = max(best, slot * naive_crossing(coll, topo, inside) / b)
    return best
