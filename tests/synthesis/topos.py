"""Topologies for the synthesis tests: small ones built directly with the IR (GPUs named
g0, g1, ...), and the standard library's machines through the front end."""

from __future__ import annotations

from collc.ir import Link, Node, NodeKind, Topology

GBPS = 1e9
US = 1e-6

def stdlib(spec: str) -> Topology:
    """A topology of the standard library, e.g. "dgx1" or "dgx_h100(nodes=2)"."""
    from collc.frontend import resolve_topology

    return resolve_topology(spec)


def dgx1() -> Topology:
    return stdlib("dgx1")


def ndv2(chassis: int = 2) -> Topology:
    return stdlib(f"ndv2(chassis={chassis})")


def dgx_h100(nodes: int = 1) -> Topology:
    return stdlib(f"dgx_h100(nodes={nodes})")


def _gpus(n: int, prefix: str = "g") -> list[Node]:
    return [Node(f"{prefix}{i}", NodeKind.GPU, i) for i in range(n)]


def _both(a: str, b: str, bw: float, lat: float, mult: int = 1) -> list[Link]:
    return [Link(a, b, bw, lat, mult), Link(b, a, bw, lat, mult)]


def ring(n: int, bandwidth: float = 10 * GBPS, latency: float = 1 * US, bidirectional: bool = True) -> Topology:
    nodes = _gpus(n)
    links = []
    for i in range(n):
        links.append(Link(f"g{i}", f"g{(i + 1) % n}", bandwidth, latency))
        if bidirectional:
            links.append(Link(f"g{(i + 1) % n}", f"g{i}", bandwidth, latency))
    return Topology(f"ring{n}", tuple(nodes), tuple(links))


def switch(n: int, bandwidth: float = 20 * GBPS, latency: float = 0.5 * US) -> Topology:
    nodes = _gpus(n) + [Node("sw", NodeKind.SWITCH)]
    links = []
    for i in range(n):
        links += _both(f"g{i}", "sw", bandwidth, latency)
    return Topology(f"switch{n}", tuple(nodes), tuple(links))


def two_chassis(per_chassis: int = 2, fast: float = 40 * GBPS, slow: float = 10 * GBPS) -> Topology:
    """Two fully connected chassis of `per_chassis` GPUs; GPU 0 of each chassis links to the other's."""
    n = 2 * per_chassis
    nodes = _gpus(n)
    links = []
    for c in range(2):
        base = c * per_chassis
        for i in range(per_chassis):
            for j in range(i + 1, per_chassis):
                links += _both(f"g{base + i}", f"g{base + j}", fast, 0.5 * US)
    links += _both("g0", f"g{per_chassis}", slow, 1.5 * US)
    return Topology(f"twochassis{per_chassis}", tuple(nodes), tuple(links))


def disconnected(n: int = 4) -> Topology:
    """Two islands: GPUs 0,1 and GPUs 2,3 with no link between them."""
    nodes = _gpus(n)
    half = n // 2
    links = []
    for i in range(half - 1):
        links += _both(f"g{i}", f"g{i + 1}", 10 * GBPS, 1 * US)
    for i in range(half, n - 1):
        links += _both(f"g{i}", f"g{i + 1}", 10 * GBPS, 1 * US)
    return Topology(f"islands{n}", tuple(nodes), tuple(links))


def realized_schedule(cand, topo: Topology):
    """A realized synthesis candidate as a Schedule on `topo`, for the verifier."""
    from collc.ir.schedule import Schedule

    return Schedule("replicated", cand.plan.problem.collective, topo.name, cand.ops.ops, cand.ops.scratch, {})
