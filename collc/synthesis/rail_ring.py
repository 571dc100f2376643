"""A ring AllReduce along one rail: the rail step of an AllReduce over nodes.

The rail's GPUs (one per node, all on one switch) pass partial sums around a ring:
in step s of the reduction, GPU p adds its share of block p - s to the partial sum it
received and sends it on to p + 1; block b is complete on GPU b - 1 after N - 1 steps,
and goes around once more as a copy. Each block is `chunks` slots, each its own op,
so a link is never idle for a hop's latency: while slot j crosses, slot j + 1 is
queued behind it (two slots per block already cover the 2.6 us hop against 21 us for
a 1 MiB block at 50 GB/s).

Why a ring, for collc.synthesis.nodes: GPU m needs the node-level sums of its blocks in
the order m, m - 1, m - 2, ... Its node reduces the piece in batches of consecutive
blocks, starting from the batch that holds block m and going down, so every batch the
rail waits for is one it needs next. The flat composition's replicated trees need
every block at once on some GPU of the rail, and its rails waited for most of the
nodes' reductions.
"""

from __future__ import annotations

from collc.synthesis.signals import NoRing
from collc.ir.collective import CollectiveKind, standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Topology
from collc.synthesis.network import Network

METHOD = "ring"


def ring_routes(topology: Topology) -> list[tuple[str, ...]]:
    """The route from each rank to the next in rank order (the last to the first): the
    ring's hops. Raises NoRing where one cannot be made through switches and NICs alone."""
    n = topology.num_ranks
    network = Network(topology)
    routes = []
    for a in range(n):
        b = (a + 1) % n
        if n > 1 and (a, b) not in network.pair_routes:
            raise NoRing(f"{topology.gpu(a).name} cannot reach {topology.gpu(b).name} through switches and NICs "
                         f"alone, so the GPUs of '{topology.name}' form no ring")
        routes.append(network.routes[network.pair_routes[(a, b)][0]].nodes if n > 1 else ())
    return routes


def ring_allreduce(topology: Topology, chunks: int) -> Schedule:
    """The ring AllReduce of the topology's ranks in rank order, `chunks` slots per
    block (and per rank). Accumulators are the output slots. Ops are listed step by
    step and their `step` is that order: the list scheduler's priorities."""
    n = topology.num_ranks
    hops = ring_routes(topology)

    def route(a: int, b: int) -> tuple[str, ...]:
        return hops[a]

    ops: list[Op] = []

    def add(kind: OpKind, src: Loc, dst: Loc, deps: tuple[int, ...], step: int, path: tuple[str, ...]) -> int:
        ops.append(Op(len(ops), kind, src, dst, 1, deps, step, path))
        return len(ops) - 1

    # last[v][j]: the op after which GPU v's output slot j holds what the next op needs.
    last = [[add(OpKind.COPY, Loc(v, Buffer.INPUT, j), Loc(v, Buffer.OUTPUT, j), (), 0, ())
             for j in range(n * chunks)] for v in range(n)]
    for s in range(n - 1):  # reduction: GPU p sends block p - s on to p + 1
        for p in range(n):
            q, b = (p + 1) % n, (p - s) % n
            for j in range(b * chunks, (b + 1) * chunks):
                last[q][j] = add(OpKind.REDUCE, Loc(p, Buffer.OUTPUT, j), Loc(q, Buffer.OUTPUT, j),
                                 tuple(sorted({last[p][j], last[q][j]})), 1 + s, route(p, q))
    for s in range(n - 1):  # copies: GPU p sends the finished block p + 1 - s on to p + 1
        for p in range(n):
            q, b = (p + 1) % n, (p + 1 - s) % n
            for j in range(b * chunks, (b + 1) * chunks):
                last[q][j] = add(OpKind.COPY, Loc(p, Buffer.OUTPUT, j), Loc(q, Buffer.OUTPUT, j),
                                 tuple(sorted({last[p][j], last[q][j]})), n + s, route(p, q))
    return Schedule(name="allreduce-rail-ring", collective=standard(CollectiveKind.ALLREDUCE, n, chunks),
                    topology=topology.name, ops=tuple(ops), meta={"method": METHOD, "chunks": chunks})
