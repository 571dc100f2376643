"""Schedules built directly with the IR for the MSCCL XML backend tests: rings for the
standard collectives, a direct AllToAll and a chain Broadcast. Each builder returns a
schedule the symbolic verifier accepts (`unit` checks)."""

from __future__ import annotations

from collc.ir import Buffer, Link, Loc, Node, NodeKind, Op, OpKind, Schedule, Topology
from collc.ir.collective import allgather, allreduce, alltoall, broadcast, gather, reduce, reducescatter, scatter
from collc.passes.base import CompileUnit
from collc.verify import verify

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def full_topology(n: int) -> Topology:
    """Every GPU linked to every other (a switch is not needed for these tests)."""
    nodes = tuple(Node(f"g{i}", NodeKind.GPU, i) for i in range(n))
    links = tuple(Link(f"g{a}", f"g{b}", 10e9, 1e-6) for a in range(n) for b in range(n) if a != b)
    return Topology(f"full{n}", nodes, links)


def unit(schedule: Schedule, size_bytes: int = 1 << 20) -> CompileUnit:
    topo = full_topology(schedule.collective.ranks)
    verify(schedule, topo)
    return CompileUnit(topo, schedule.collective, size_bytes, schedule)


class _Ops:
    def __init__(self) -> None:
        self.ops: list[Op] = []

    def add(self, kind: OpKind, src: Loc, dst: Loc, step: int, deps=(), count: int = 1) -> int:
        op = Op(len(self.ops), kind, src, dst, count=count, deps=tuple(d for d in deps if d is not None), step=step)
        self.ops.append(op)
        return op.id


def ring_allgather(n: int, chunks: int = 1, pipelined: bool = False) -> Schedule:
    """Out of place: each rank copies its chunks into its output slot and sends them from
    the input; a received chunk is forwarded from the output. With `pipelined`, chunk k
    of every source starts k steps later (one op per chunk)."""
    b = _Ops()
    for r in range(n):
        b.add(OpKind.COPY, Loc(r, I, 0), Loc(r, O, r * chunks), 0, count=chunks)
    pieces = [(k, 1) for k in range(chunks)] if pipelined else [(0, chunks)]
    for src in range(n):
        for k, count in pieces:
            prev = None
            for hop in range(1, n):
                a, dst = (src + hop - 1) % n, (src + hop) % n
                from_loc = Loc(a, I, k) if hop == 1 else Loc(a, O, src * chunks + k)
                prev = b.add(OpKind.COPY, from_loc, Loc(dst, O, src * chunks + k), hop - 1 + k, (prev,), count)
    return Schedule(f"ring-allgather-{n}", allgather(n, chunks), f"full{n}", tuple(b.ops))


def ring_reducescatter(n: int) -> Schedule:
    """Partial sums travel around the ring in scratch slots and end in the owner's output
    (each rank seeds its accumulator with a local copy of its own contribution)."""
    b = _Ops()
    seed: dict[tuple[int, int], int] = {}
    for d in range(n):
        for r in range(n):
            if r == (d + 1) % n:
                continue
            acc = Loc(r, O, 0) if r == d else Loc(r, S, d)
            seed[(r, d)] = b.add(OpKind.COPY, Loc(r, I, d), acc, 0)
    for d in range(n):
        prev = None
        for hop in range(1, n):
            a, c = (d + hop) % n, (d + hop + 1) % n
            src = Loc(a, I, d) if hop == 1 else Loc(a, S, d)
            dst = Loc(c, O, 0) if c == d else Loc(c, S, d)
            prev = b.add(OpKind.REDUCE, src, dst, hop, (prev, seed[(c, d)]))
    return Schedule(f"ring-reducescatter-{n}", reducescatter(n), f"full{n}", tuple(b.ops),
                    scratch=tuple(n for _ in range(n)))


def ring_allreduce(n: int) -> Schedule:
    """Reduce-scatter around the ring into the output, then all-gather the sums."""
    b = _Ops()
    seed: dict[tuple[int, int], int] = {}
    for r in range(n):
        for d in range(n):
            if r != (d + 1) % n:
                seed[(r, d)] = b.add(OpKind.COPY, Loc(r, I, d), Loc(r, O, d), 0)
    for d in range(n):
        prev = None
        for hop in range(1, n):
            a, c = (d + hop) % n, (d + hop + 1) % n
            src = Loc(a, I, d) if hop == 1 else Loc(a, O, d)
            prev = b.add(OpKind.REDUCE, src, Loc(c, O, d), hop, (prev, seed[(c, d)]))
        for hop in range(1, n):
            a, c = (d + hop - 1) % n, (d + hop) % n
            prev = b.add(OpKind.COPY, Loc(a, O, d), Loc(c, O, d), n - 1 + hop, (prev,))
    return Schedule(f"ring-allreduce-{n}", allreduce(n), f"full{n}", tuple(b.ops))


def direct_alltoall(n: int) -> Schedule:
    b = _Ops()
    for r in range(n):
        for s in range(n):
            kind_src, dst = Loc(r, I, s), Loc(s, O, r)
            b.add(OpKind.COPY, kind_src, dst, 0)
    return Schedule(f"direct-alltoall-{n}", alltoall(n), f"full{n}", tuple(b.ops))


def chain_broadcast(n: int, chunks: int = 1, root: int = 0, split: bool = False) -> Schedule:
    """The root's chunks travel along root -> root+1 -> ...; with `split`, every chunk is a
    separate op of the same step (msccl-merge joins them again)."""
    b = _Ops()
    pieces = [(k, 1) for k in range(chunks)] if split else [(0, chunks)]
    for k, count in pieces:
        b.add(OpKind.COPY, Loc(root, I, k), Loc(root, O, k), 0, count=count)
        prev = None
        for hop in range(1, n):
            a, c = (root + hop - 1) % n, (root + hop) % n
            src = Loc(a, I, k) if hop == 1 else Loc(a, O, k)
            prev = b.add(OpKind.COPY, src, Loc(c, O, k), hop - 1, (prev,), count)
    return Schedule(f"chain-broadcast-{n}", broadcast(n, chunks, root), f"full{n}", tuple(b.ops))


def random_allgather(n: int, chunks: int, seed: int, in_place_safe: bool = True) -> Schedule:
    """Each chunk spreads from its owner along a random tree with random delays; a holder
    sends from its output slot (or, for the owner, from its input). Several chunks may
    share a step and a link, which exercises ordering, fusion and channels."""
    import random

    rng = random.Random(seed)
    b = _Ops()
    for r in range(n):
        b.add(OpKind.COPY, Loc(r, I, 0), Loc(r, O, r * chunks), rng.randrange(2), count=chunks)
    for src in range(n):
        for k in range(chunks):
            slot = src * chunks + k
            arrival = {src: (None, 0)}  # rank -> (op that delivered the chunk, its step)
            while len(arrival) < n:
                holder = rng.choice(sorted(arrival))
                target = rng.choice([r for r in range(n) if r not in arrival])
                op, at = arrival[holder]
                step = at + 1 + rng.randrange(2) if op is not None else rng.randrange(3)
                from_loc = Loc(holder, I, k) if holder == src else Loc(holder, O, slot)
                arrival[target] = (b.add(OpKind.COPY, from_loc, Loc(target, O, slot), step, (op,)), step)
    return Schedule(f"random-allgather-{n}-{seed}", allgather(n, chunks), f"full{n}", tuple(b.ops))


def chain_reduce(n: int, root: int = 0) -> Schedule:
    """A partial sum travels from the rank after the root around to the root, each rank
    adding its own chunk; it accumulates in scratch (a non-root rank's output buffer is
    not the application's to write)."""
    b = _Ops()
    order = [(root + 1 + k) % n for k in range(n)]  # the root last
    acc = {r: Loc(r, O, 0) if r == root else Loc(r, S, 0) for r in order}
    seeds = {r: b.add(OpKind.COPY, Loc(r, I, 0), acc[r], 0) for r in order[1:]}
    prev = None
    for hop, (a, c) in enumerate(zip(order, order[1:])):
        src = Loc(a, I, 0) if hop == 0 else acc[a]
        prev = b.add(OpKind.REDUCE, src, acc[c], hop + 1, (prev, seeds[c]))
    return Schedule(f"chain-reduce-{n}", reduce(n, 1, root), f"full{n}", tuple(b.ops),
                    scratch=tuple(0 if r == root else 1 for r in range(n)))


def direct_gather(n: int, root: int = 0) -> Schedule:
    b = _Ops()
    for r in range(n):
        b.add(OpKind.COPY, Loc(r, I, 0), Loc(root, O, r), 0)
    return Schedule(f"direct-gather-{n}", gather(n, 1, root), f"full{n}", tuple(b.ops))


def direct_scatter(n: int, root: int = 0) -> Schedule:
    b = _Ops()
    for r in range(n):
        b.add(OpKind.COPY, Loc(root, I, r), Loc(r, O, 0), 0)
    return Schedule(f"direct-scatter-{n}", scatter(n, 1, root), f"full{n}", tuple(b.ops))
