"""Ring, direct and tree schedules of the standard collectives, built with the IR.

They feed the executor tests (tests/backends/cupy) and the GPU benchmark (run.sh)
without the front end. Each builder returns a schedule that `collc.verify.verify`
accepts; deps name every op that last wrote or read what an op touches.
"""

from __future__ import annotations

from collc.ir import Buffer, Link, Loc, Node, NodeKind, Op, OpKind, Schedule, Topology
from collc.ir.collective import allgather, allreduce, alltoall, broadcast, reducescatter

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


def full_mesh(n: int, name: str | None = None, bandwidth: float = 100e9, latency: float = 1e-6) -> Topology:
    """n GPUs, a link each way between every pair (what NVSwitch offers a schedule)."""
    nodes = tuple(Node(f"gpu{r}", NodeKind.GPU, r) for r in range(n))
    links = tuple(Link(f"gpu{a}", f"gpu{b}", bandwidth, latency) for a in range(n) for b in range(n) if a != b)
    return Topology(name or f"mesh{n}", nodes, links)


class _Builder:
    """Appends ops and derives deps from the last writer and the readers of each slot."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.writer: dict[Loc, int] = {}
        self.readers: dict[Loc, list[int]] = {}

    def add(self, kind: OpKind, src: Loc, dst: Loc, step: int, count: int = 1) -> int:
        deps: set[int] = set()
        for k in range(count):
            s, d = src.shifted(k), dst.shifted(k)
            if s in self.writer:
                deps.add(self.writer[s])
            if d in self.writer:
                deps.add(self.writer[d])
            deps.update(self.readers.get(d, ()))
        op_id = len(self.ops)
        self.ops.append(Op(op_id, kind, src, dst, count, tuple(sorted(deps)), step))
        for k in range(count):
            s, d = src.shifted(k), dst.shifted(k)
            self.readers.setdefault(s, []).append(op_id)
            self.writer[d] = op_id
            self.readers[d] = [op_id] if kind is OpKind.REDUCE else []
        return op_id

    def copy(self, src: Loc, dst: Loc, step: int, count: int = 1) -> int:
        return self.add(OpKind.COPY, src, dst, step, count)

    def reduce(self, src: Loc, dst: Loc, step: int, count: int = 1) -> int:
        return self.add(OpKind.REDUCE, src, dst, step, count)


def ring_allgather(n: int, chunks: int = 1, topology: str = "") -> Schedule:
    """Step 0: each rank copies its input into its block of the output; steps 1..n-1:
    every rank forwards the block it got last to the next rank."""
    b = _Builder()
    for r in range(n):
        b.copy(Loc(r, I, 0), Loc(r, O, r * chunks), 0, chunks)
    for t in range(1, n):
        for r in range(n):
            block = (r - t + 1) % n
            b.copy(Loc(r, O, block * chunks), Loc((r + 1) % n, O, block * chunks), t, chunks)
    return Schedule("ring", allgather(n, chunks), topology or f"mesh{n}", tuple(b.ops))


def ring_reducescatter(n: int, chunks: int = 1, topology: str = "") -> Schedule:
    """Block j starts at rank j+1 and travels the ring once, every rank adding its own
    part; partial sums wait in scratch, the last addition lands in rank j's output."""
    b = _Builder()
    for r in range(n):
        b.copy(Loc(r, I, r * chunks), Loc(r, O, 0), 0, chunks)
        for j in range(n):
            if r not in (j, (j + 1) % n):
                b.copy(Loc(r, I, j * chunks), Loc(r, S, j * chunks), 0, chunks)
    for t in range(1, n):
        for j in range(n):
            src_rank, dst_rank = (j + t) % n, (j + t + 1) % n
            src = Loc(src_rank, I, j * chunks) if t == 1 else Loc(src_rank, S, j * chunks)
            dst = Loc(dst_rank, O, 0) if dst_rank == j else Loc(dst_rank, S, j * chunks)
            b.reduce(src, dst, t, chunks)
    return Schedule("ring", reducescatter(n, chunks), topology or f"mesh{n}", tuple(b.ops),
                    scratch=tuple(n * chunks for _ in range(n)))


def ring_allreduce(n: int, chunks: int = 1, topology: str = "") -> Schedule:
    """Reduce-scatter then all-gather around the ring, in the output buffer."""
    b = _Builder()
    for r in range(n):
        b.copy(Loc(r, I, 0), Loc(r, O, 0), 0, n * chunks)
    for t in range(1, n):
        for j in range(n):
            src_rank, dst_rank = (j + t) % n, (j + t + 1) % n
            b.reduce(Loc(src_rank, O, j * chunks), Loc(dst_rank, O, j * chunks), t, chunks)
    for u in range(1, n):
        for j in range(n):
            src_rank, dst_rank = (j + u - 1) % n, (j + u) % n
            b.copy(Loc(src_rank, O, j * chunks), Loc(dst_rank, O, j * chunks), n - 1 + u, chunks)
    return Schedule("ring", allreduce(n, chunks), topology or f"mesh{n}", tuple(b.ops))


def direct_alltoall(n: int, chunks: int = 1, topology: str = "") -> Schedule:
    """Step t: every rank r sends its block for rank r+t straight there."""
    b = _Builder()
    for t in range(n):
        for r in range(n):
            dst = (r + t) % n
            b.copy(Loc(r, I, dst * chunks), Loc(dst, O, r * chunks), t, chunks)
    return Schedule("direct", alltoall(n, chunks), topology or f"mesh{n}", tuple(b.ops))


def tree_broadcast(n: int, chunks: int = 1, root: int = 0, topology: str = "") -> Schedule:
    """A binary tree from the root, chunks pipelined: a rank at depth d receives chunk i
    at step d + i from its parent."""
    b = _Builder()
    for i in range(chunks):
        b.copy(Loc(root, I, i), Loc(root, O, i), 0)

    def rank_of(v: int) -> int:  # tree position -> rank (the root at position 0)
        return (root + v) % n

    def depth(v: int) -> int:
        return (v + 1).bit_length() - 1

    for v in sorted(range(1, n), key=depth):
        for i in range(chunks):
            parent = (v - 1) // 2
            b.copy(Loc(rank_of(parent), O, i), Loc(rank_of(v), O, i), depth(v) + i)
    ops = sorted(b.ops, key=lambda op: (op.step, op.id))  # a dependency order
    return Schedule("tree", broadcast(n, chunks, root), topology or f"mesh{n}", tuple(ops))


BUILDERS = {
    "allgather": ring_allgather,
    "reducescatter": ring_reducescatter,
    "allreduce": ring_allreduce,
    "alltoall": direct_alltoall,
    "broadcast": tree_broadcast,
}
