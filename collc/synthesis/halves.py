"""The ops of a collective with reductions, in its two halves: reductions that run a
copy plan backwards (ReduceScatter, Reduce, an AllReduce's first half), and the
gathering that follows them in an AllReduce, each chunk's starting where its reduction
ended.

Shared by the composition (collc.synthesis.compose) and the direct AllReduce
(collc.synthesis.direct), which differ in the plans they give these.
"""

from __future__ import annotations

from collections import Counter

from collc.ir.collective import CollectiveKind
from collc.ir.schedule import Buffer, Loc, Op, OpKind
from collc.synthesis.extract import Edge, OpList, arrival_trees
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan


def partial_sums(trees: list[list[Edge]]) -> list[int]:
    """Per accumulator of the reductions that run these arrival trees backwards (a rank
    that passes a chunk on, in the chunk's tree), how many partial sums reach it: its
    children there; 0 for the root of a tree with no edges (it only copies its own part)."""
    sums = list(Counter((k, e.src) for k, tree in enumerate(trees) for e in tree).values())
    return sums + [0] * sum(not tree for tree in trees)


def reduction_op_count(sums: list[int], land: bool = False, lanes: int = 1) -> int:
    """How many ops `reduction_ops` makes from arrival trees whose accumulators take
    `sums` partial sums each (`partial_sums`), with the same `land` and `lanes`, known
    before they are built: one first copy per accumulator, one transfer per partial sum,
    and the local adds (one per landed sum; one per extra lane used)."""
    adds = sum(n - 1 for n in sums) if land else sum(min(n, lanes) - 1 for n in sums)
    return len(sums) + sum(sums) + adds


def reduction_ops(plan: Plan, kind: CollectiveKind, network: Network,
                   order: dict[tuple[int, int, int], int] | None = None, land: bool = False, lanes: int = 1,
                   trees: list[list[Edge]] | None = None) -> tuple[list[Op], tuple[int, ...], dict[int, int]]:
    """Reductions that run the copy plan backwards: in the reverse of `order` (the
    list-scheduled start order, collc.synthesis.compose) where given, else of the
    plan's steps. Returns the ops, scratch slots per rank, and per result index the op
    that completes it at its root. `trees`: the plan's `arrival_trees`, where the caller
    has them.

    Partial sums for one accumulator are added one after another. With `land`, every
    one but the first lands in a scratch slot of its own and is added there by a local
    op, so the transfers need not wait for each other; without it, each transfer waits
    for the one before to finish (fewer ops and MSCCL XML steps). Between the two,
    `lanes` > 1 deals the partial sums into an accumulator out in turn to that many
    chains: the accumulator's own, and chains that each start by landing their first
    sum in a scratch slot and add the rest there; a local op adds each lane's slot in
    once its last sum is in. Successive transfers into one rank then overlap (a link
    no longer idles for each one's latency) at one local op per extra lane, not one
    per partial sum."""
    problem = plan.problem
    coll = problem.collective
    chunks = coll.chunks
    ranks = problem.ranks
    trees = arrival_trees(plan) if trees is None else trees
    when = [[e.step for e in tree] for tree in trees]
    if order is not None:
        try:
            when = [[order[(*com.chunk, e.dst)] for e in tree] for com, tree in zip(problem.commodities, trees)]
        except KeyError:
            pass  # the schedule does not follow the plan's trees: keep the plan's steps
    horizon = 1 + max((w for ws in when for w in ws), default=0)
    scratch = [0] * ranks
    ops: list[Op] = []
    chain: dict[tuple[int, int], int] = {}  # (rank, index) -> last op that wrote its accumulator
    acc: dict[tuple[int, int], Loc] = {}
    edges: list[tuple[int, int, int, int, tuple[str, ...]]] = []  # (reversed step, index, child, parent, route)
    root_of: dict[int, int] = {}
    for k, com in enumerate(problem.commodities):
        owner, i = com.chunk
        index = i if kind is CollectiveKind.REDUCE else owner * chunks + i
        root_of[index] = owner
        parents = {e.src for e in trees[k]}
        for v in sorted(parents):
            if v == owner:
                out = i if kind is CollectiveKind.REDUCESCATTER else index
                acc[(v, index)] = Loc(v, Buffer.OUTPUT, out)
            elif kind is CollectiveKind.ALLREDUCE:
                acc[(v, index)] = Loc(v, Buffer.OUTPUT, index)
            else:
                acc[(v, index)] = Loc(v, Buffer.SCRATCH, scratch[v])
                scratch[v] += 1
        if owner not in parents:  # the root has no children: nothing to gather but its own part
            out = i if kind is CollectiveKind.REDUCESCATTER else index
            acc[(owner, index)] = Loc(owner, Buffer.OUTPUT, out)
        for e, w in zip(trees[k], when[k]):
            nodes = tuple(reversed(plan.problem.network.routes[e.route].nodes))
            edges.append((horizon - w, index, e.dst, e.src, nodes))
    for (v, index), loc in sorted(acc.items()):
        ops.append(Op(len(ops), OpKind.COPY, Loc(v, Buffer.INPUT, index), loc, step=0))
        chain[(v, index)] = ops[-1].id
    reached: set[tuple[int, int]] = set()  # (rank, index) that a partial sum has reached
    dealer = _Lanes(lanes, edges, scratch) if lanes > 1 and not land else None
    for step, index, child, parent, route in sorted(edges):
        src = acc.get((child, index), Loc(child, Buffer.INPUT, index))
        child_done = (chain[(child, index)],) if (child, index) in chain else ()
        if dealer is not None:
            dealer.add(ops, chain, acc, src, child_done, parent, index, step, route)
            continue
        if land and (parent, index) in reached:
            # A second partial sum for the same accumulator: it lands in a scratch slot
            # of its own and is added there locally, so that its transfer need not wait
            # for the one before it to finish (chained transfers left a link idle for
            # each one's latency: 1.045 of the bound on dgx_h100(nodes=4), against 1.004
            # for the AllGather it reverses).
            landing = Loc(parent, Buffer.SCRATCH, scratch[parent])
            scratch[parent] += 1
            ops.append(Op(len(ops), OpKind.COPY, src, landing, deps=child_done, step=step, route=route))
            deps = {chain[(parent, index)], ops[-1].id}
            ops.append(Op(len(ops), OpKind.REDUCE, landing, acc[(parent, index)], deps=tuple(sorted(deps)),
                          step=step))
        else:
            reached.add((parent, index))
            deps = {chain[(parent, index)], *child_done}
            ops.append(Op(len(ops), OpKind.REDUCE, src, acc[(parent, index)], deps=tuple(sorted(deps)), step=step,
                          route=route))
        chain[(parent, index)] = ops[-1].id
    done = {index: chain[(owner, index)] for index, owner in root_of.items()}
    return ops, tuple(scratch), done


class _Lanes:
    """Partial sums into each accumulator dealt out in turn to `count` chains
    (`reduction_ops`, lanes): lane 0 is the accumulator itself; lane j > 0 lands its
    first sum in a scratch slot of its own and adds the rest there; after the
    accumulator's last sum, a local op adds each such slot in."""

    def __init__(self, count: int, edges: list[tuple[int, int, int, int, tuple[str, ...]]], scratch: list[int]):
        self.count = count
        self.arrivals = Counter((parent, index) for _, index, _, parent, _ in edges)
        self.dealt: Counter[tuple[int, int]] = Counter()
        self.slot: dict[tuple[int, int, int], Loc] = {}  # (rank, index, lane) -> the lane's scratch slot
        self.last: dict[tuple[int, int, int], int] = {}  # (rank, index, lane) -> the lane's last op
        self.scratch = scratch  # per rank, shared with the caller

    def add(self, ops: list[Op], chain: dict[tuple[int, int], int], acc: dict[tuple[int, int], Loc], src: Loc,
            child_done: tuple[int, ...], parent: int, index: int, step: int, route: tuple[str, ...]) -> None:
        """The partial sum from `src` into (parent, index); `chain` holds each
        accumulator's last op, updated here."""
        key = (parent, index)
        lane = self.dealt[key] % self.count
        self.dealt[key] += 1
        if lane == 0:
            ops.append(Op(len(ops), OpKind.REDUCE, src, acc[key], deps=tuple(sorted({chain[key], *child_done})),
                          step=step, route=route))
            chain[key] = ops[-1].id
        else:
            lane_key = (parent, index, lane)
            if lane_key not in self.slot:  # the lane's first sum: nothing there to add to yet
                self.slot[lane_key] = Loc(parent, Buffer.SCRATCH, self.scratch[parent])
                self.scratch[parent] += 1
                ops.append(Op(len(ops), OpKind.COPY, src, self.slot[lane_key], deps=child_done, step=step,
                              route=route))
            else:
                ops.append(Op(len(ops), OpKind.REDUCE, src, self.slot[lane_key],
                              deps=tuple(sorted({self.last[lane_key], *child_done})), step=step, route=route))
            self.last[lane_key] = ops[-1].id
        if self.dealt[key] < self.arrivals[key]:
            return
        for other in range(1, self.count):
            lane_key = (parent, index, other)
            if lane_key in self.slot:
                ops.append(Op(len(ops), OpKind.REDUCE, self.slot[lane_key], acc[key],
                              deps=tuple(sorted({chain[key], self.last[lane_key]})), step=step))
                chain[key] = ops[-1].id


def gather_ops(base: OpList, chunks: int, ready: dict[int, int], first_id: int, after: int | dict[int, int]
                ) -> tuple[list[Op], tuple[int, ...]]:
    """The AllGather half of an AllReduce, from the AllGather's list-scheduled ops: chunk
    j leaves its root's output slot j (where its reduction ended) once that reduction
    is complete. Its order keys come after `after`, the reductions' last; or, where
    `after` maps each chunk to an offset, each chunk's keys are moved by its own."""
    out: list[Op] = []
    renumber: dict[int, int] = {}
    index_of: dict[int, int] = {}  # op id in `base` -> the chunk it carries
    for op in base.ops:
        src, deps = op.src, tuple(renumber[d] for d in op.deps)
        if src.buffer is Buffer.INPUT:
            index = src.rank * chunks + src.index
            index_of[op.id] = index
            if op.dst == Loc(src.rank, Buffer.OUTPUT, index):
                continue  # the root's own slot already holds the reduced chunk
            src = Loc(src.rank, Buffer.OUTPUT, index)
            deps = deps + (ready[index],)
        else:
            index = index_of[op.id] = index_of[op.deps[0]]  # a relay: the op that filled its source
        shift = after if isinstance(after, int) else after[index]
        # Built field by field: dataclasses.replace costs several times as much, and
        # there is one op per transfer.
        new = Op(first_id + len(out), op.kind, src, op.dst, op.count, tuple(sorted(set(deps))), op.step + shift,
                 op.route, op.origin)
        renumber[op.id] = new.id
        out.append(new)
    return out, base.scratch
