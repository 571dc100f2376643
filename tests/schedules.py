"""Small schedules built directly with the IR, for tests that need one without the front end."""

from __future__ import annotations

from collc.ir import Buffer, Link, Loc, Node, NodeKind, Op, OpKind, Schedule, Topology
from collc.ir.collective import allgather

GBPS = 1e9
US = 1e-6


def ring_topology(n: int, bandwidth: float = 10 * GBPS, latency: float = 1 * US) -> Topology:
    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(n))
    links = []
    for i in range(n):
        j = (i + 1) % n
        links.append(Link(f"g{i}", f"g{j}", bandwidth, latency))
        links.append(Link(f"g{j}", f"g{i}", bandwidth, latency))
    return Topology(f"ring{n}", nodes, tuple(links))


def ring_allgather(n: int) -> Schedule:
    """Rank r copies its chunk to output slot r, then passes chunks along the ring."""
    coll = allgather(n)
    ops: list[Op] = []
    writer: dict[tuple[int, int], int] = {}
    for r in range(n):
        ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.INPUT, 0), Loc(r, Buffer.OUTPUT, r), step=0))
        writer[(r, r)] = ops[-1].id
    for s in range(n - 1):
        for r in range(n):
            c, nxt = (r - s) % n, (r + 1) % n
            ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.OUTPUT, c), Loc(nxt, Buffer.OUTPUT, c),
                          deps=(writer[(r, c)],), step=s + 1))
            writer[(nxt, c)] = ops[-1].id
    return Schedule("ring", coll, f"ring{n}", tuple(ops))


def pipelined_ring_allgather(n: int, chunks: int) -> Schedule:
    """Ring AllGather with each rank's block cut into `chunks` slots that follow one
    another around the ring (chunk k of a block leaves one step after chunk k - 1)."""
    ops: list[Op] = []
    last: dict[int, int] = {}
    for r in range(n):
        for k in range(chunks):
            ops.append(Op(len(ops), OpKind.COPY, Loc(r, Buffer.INPUT, k), Loc(r, Buffer.OUTPUT, r * chunks + k)))
            last[r * chunks + k] = ops[-1].id
    for s in range(1, n):
        for k in range(chunks):
            for r in range(n):
                slot = r * chunks + k
                ops.append(Op(len(ops), OpKind.COPY, Loc((r + s - 1) % n, Buffer.OUTPUT, slot),
                              Loc((r + s) % n, Buffer.OUTPUT, slot), deps=(last[slot],), step=s + k))
                last[slot] = ops[-1].id
    return Schedule("pipelined_ring", allgather(n, chunks), f"ring{n}", tuple(ops))
