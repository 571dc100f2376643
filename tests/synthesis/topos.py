"""Topologies for the synthesis tests and benchmark, built directly with the IR.

Figures follow the public TE-CCL artifact (microsoft/TE-CCL, teccl/topologies): DGX-1
multiplicities, NDv2 chassis joined by one 12.5 GB/s InfiniBand link each way (GPU 0 ->
GPU 9 and GPU 8 -> GPU 1), DGX-2 chassis on an NVSwitch (125 GB/s) joined by IB links
from odd GPUs to even GPUs. DGX H100: NVSwitch at 450 GB/s per GPU, one 50 GB/s NIC per
GPU on a shared InfiniBand fabric.
"""

from __future__ import annotations

from collc.ir import Link, Node, NodeKind, Topology

GBPS = 1e9
US = 1e-6

# Link multiplicities of one DGX-1 chassis (hybrid cube mesh), rows = source GPU.
DGX1_LANES = (
    (0, 2, 1, 1, 2, 0, 0, 0),
    (2, 0, 1, 2, 0, 1, 0, 0),
    (1, 1, 0, 2, 0, 0, 2, 0),
    (1, 2, 2, 0, 0, 0, 0, 1),
    (2, 0, 0, 0, 0, 2, 1, 1),
    (0, 1, 0, 0, 2, 0, 1, 2),
    (0, 0, 2, 0, 1, 1, 0, 2),
    (0, 0, 0, 1, 1, 2, 2, 0),
)


def _gpus(n: int, prefix: str = "g") -> list[Node]:
    return [Node(f"{prefix}{i}", NodeKind.GPU, i) for i in range(n)]


def _both(a: str, b: str, bw: float, lat: float, mult: int = 1) -> list[Link]:
    return [Link(a, b, bw, lat, mult), Link(b, a, bw, lat, mult)]


def dgx1(lane: float = 25 * GBPS, latency: float = 0.7 * US) -> Topology:
    nodes = _gpus(8)
    links = [Link(f"g{i}", f"g{j}", lane, latency, m)
             for i, row in enumerate(DGX1_LANES) for j, m in enumerate(row) if m]
    return Topology("dgx1", tuple(nodes), tuple(links))


def ndv2(chassis: int = 2) -> Topology:
    """NDv2: DGX-1 chassis (NVLink 25 GB/s lanes, 0.7 us), 2 chassis joined by IB 12.5 GB/s, 1.3 us."""
    if chassis != 2:
        raise ValueError("this test topology models two chassis")
    nodes = _gpus(16)
    links = []
    for c in range(2):
        for i, row in enumerate(DGX1_LANES):
            for j, m in enumerate(row):
                if m:
                    links.append(Link(f"g{8 * c + i}", f"g{8 * c + j}", 25 * GBPS, 0.7 * US, m))
    links.append(Link("g0", "g9", 12.5 * GBPS, 1.3 * US))
    links.append(Link("g8", "g1", 12.5 * GBPS, 1.3 * US))
    return Topology("ndv2x2", tuple(nodes), tuple(links))


def dgx2(chassis: int = 2) -> Topology:
    nodes = _gpus(16 * chassis)
    links = []
    for c in range(chassis):
        sw = f"nvs{c}"
        nodes.append(Node(sw, NodeKind.SWITCH))
        for i in range(16):
            links += _both(f"g{16 * c + i}", sw, 125 * GBPS, 0.35 * US)
    for a in range(chassis):
        for b in range(chassis):
            if a != b:
                for odd in range(1, 16, 2):
                    links.append(Link(f"g{16 * a + odd}", f"g{16 * b + odd - 1}", 12.5 * GBPS, 2.6 * US))
    return Topology(f"dgx2x{chassis}", tuple(nodes), tuple(links))


def dgx_h100(nodes: int = 8) -> Topology:
    gpus = _gpus(8 * nodes)
    extra: list[Node] = [Node("ib", NodeKind.SWITCH)]
    links = []
    for n in range(nodes):
        sw = f"nvs{n}"
        extra.append(Node(sw, NodeKind.SWITCH))
        for i in range(8):
            g, nic = f"g{8 * n + i}", f"nic{8 * n + i}"
            extra.append(Node(nic, NodeKind.NIC))
            links += _both(g, sw, 450 * GBPS, 0.5 * US)
            links += _both(g, nic, 50 * GBPS, 0.5 * US)
            links += _both(nic, "ib", 50 * GBPS, 1.0 * US)
    return Topology(f"dgx_h100x{nodes}", tuple(gpus + extra), tuple(links))


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
