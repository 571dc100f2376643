"""`msccl-coalesce`: transfers that one connection carries close together in time, and
that hold consecutive slots at both ends, become one op; only where a GPU would
otherwise pass the executor's 4,096 XML nodes.

The executor reads at most 4,096 XML nodes per rank: `<algo>`, every `<gpu>` and the
rank's own `<tb>`s and `<step>`s. At one chunk per pair, a synthesized AllToAll on 1,024
GPUs gives a GPU about 1,900 sends and 1,900 receives, besides the 1,024 `<gpu>`
entries. Yet most of those sends travel in bursts: in the synthesized schedule GPU (A, r)
gathers from its node the blocks bound for rail r of node B, then sends them across the
rail to (B, r) within a few steps, and they land side by side in (B, r)'s output
(sources A x 8 + 0..7). Sent as one step they cost one send and one receive.

`msccl-merge` joins only ops of one schedule step. This pass joins ops of one
connection across steps, when

- they go between the same two ranks, by the same route, with the same kind (copy or
  reduce), from one buffer to one buffer, and their steps lie within `span` of the
  schedule's length (so that waiting for the last of them delays the first little);
- their source slots and their destination slots are consecutive in the same order.
  Scratch slots are the schedule's own: before joining, each rank's scratch slots are
  renumbered (a permutation, which changes nothing that the schedule computes) so that
  a run read from scratch into another buffer, or written to scratch from another
  buffer, is consecutive in the order of the other end.

The joined op waits for what any of its ops waited for, and whatever waited for one of
them waits for it; steps are then raised where a dependency no longer points to an
earlier step. A join that would close a cycle is not made (the pass then leaves the
schedule as it was). The result is a schedule, which the pass manager re-verifies.

The pass changes nothing where every GPU could fit `nodes` (`node_estimate`: its steps
with every receive-and-forward fused); with `force` it always joins. Joining delays
the first transfers of a run, so it is kept for schedules that cannot fit otherwise:
a ring on 1,024 ranks passes 4,096 nodes unfused, but not once its forwards fuse.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml.limits import MAX_XML_NODES
from collc.backends.msccl_xml.merge import MAX_COUNT
from collc.backends.msccl_xml.program import collections_paused
from collc.diagnostics import CollcError
from collc.ir.schedule import Buffer, Loc, Op, Schedule
from collc.passes.base import CompileUnit, Pass, register_pass


def node_estimate(schedule: Schedule) -> tuple[int, int]:
    """(XML nodes, rank) of the rank with the most, at the fewest its steps could be: one
    per send, receive and local op, less one for each receive that a send forwarding
    exactly what it stored could fuse with (`rcs`, `rrs`), every such pair counted as
    fused; no nop steps, no `<tb>`s. A schedule over `nodes` by this count cannot fit
    however it is placed; one under it may (a ring AllReduce on 1,024 ranks: 6,140
    nodes unfused, 4,095 fused, and it fits)."""
    ranks = schedule.collective.ranks
    ops = schedule.ops
    steps = [0] * ranks
    forwarded = bytearray(len(ops))  # receives already counted as fused
    for op in ops:
        r = op.src.rank
        steps[r] += 1
        if op.dst.rank == r:
            continue
        steps[op.dst.rank] += 1
        for d in op.deps:
            a = ops[d]
            if (not forwarded[d] and a.dst == op.src and a.src.rank != r and a.count == op.count):
                forwarded[d] = 1
                steps[r] -= 1
                break
    most = max(range(ranks), key=lambda r: (steps[r], -r)) if ranks else 0
    return 1 + ranks + (steps[most] if ranks else 0), most


def coalesce_ops(schedule: Schedule, span: float = 0.01, max_count: int = MAX_COUNT) -> Schedule:
    """The schedule with each connection's nearby consecutive transfers joined (see the
    module's text); the same object when nothing is joined."""
    ops = schedule.ops
    if not ops:
        return schedule
    window = int(span * schedule.num_steps)
    renamed = _renumber_scratch(schedule)
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, op in enumerate(renamed):
        if op.src.rank != op.dst.rank:
            groups[(op.src.rank, op.dst.rank, op.kind, op.src.buffer, op.dst.buffer, op.route)].append(i)
    owner = list(range(len(ops)))  # op -> the first op of its run
    joined = False
    for members in groups.values():
        if len(members) < 2:
            continue
        members.sort(key=lambda i: renamed[i].src.index)
        run = [members[0]]
        for i in members[1:]:
            last, first = renamed[run[-1]], renamed[run[0]]
            op = renamed[i]
            steps = [renamed[j].step for j in run] + [op.step]
            if (op.src.index == last.src.index + last.count and op.dst.index == last.dst.index + last.count
                    and sum(renamed[j].count for j in run) + op.count <= max_count
                    and max(steps) - min(steps) <= window and first.count == 1 and op.count == 1):
                run.append(i)
                continue
            joined |= _close(run, owner)
            run = [i]
        joined |= _close(run, owner)
    if not joined:
        return schedule
    rebuilt = _rebuild(renamed, owner)
    if rebuilt is None:
        return schedule
    return replace(schedule, ops=rebuilt)


def _close(run: list[int], owner: list[int]) -> bool:
    if len(run) < 2:
        return False
    head = run[0]  # the lowest slots: the joined op starts where it does
    for j in run:
        owner[j] = head
    return True


def _renumber_scratch(schedule: Schedule) -> list[Op]:
    """The ops with each rank's scratch slots renumbered so that transfers between scratch
    and another buffer, grouped by connection, read or write scratch in the order of
    the other buffer's slots, and transfers from scratch to scratch in the order one of
    their ends already has. Ranks where an op moves several scratch slots at once keep
    their numbering (a permutation of single slots could split such an op)."""
    ops = schedule.ops
    wide = {op.src.rank for op in ops if op.count > 1 and op.src.buffer is Buffer.SCRATCH}
    wide |= {op.dst.rank for op in ops if op.count > 1 and op.dst.buffer is Buffer.SCRATCH}
    groups: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)  # -> (other index, step, scratch slot)
    both: dict[tuple, list[tuple[int, int, int]]] = defaultdict(list)  # scratch to scratch: (step, src, dst slot)
    for op in ops:
        if op.src.rank == op.dst.rank:
            continue
        if op.src.buffer is Buffer.SCRATCH and op.dst.buffer is Buffer.SCRATCH:
            if op.src.rank not in wide and op.dst.rank not in wide:
                both[(op.src.rank, op.dst.rank, op.route)].append((op.step, op.src.index, op.dst.index))
        elif op.src.buffer is Buffer.SCRATCH and op.dst.buffer is not Buffer.SCRATCH and op.src.rank not in wide:
            groups[(op.src.rank, "src", op.dst.rank, op.dst.buffer, op.route)].append(
                (op.dst.index, op.step, op.src.index))
        elif op.dst.buffer is Buffer.SCRATCH and op.src.buffer is not Buffer.SCRATCH and op.dst.rank not in wide:
            groups[(op.dst.rank, "dst", op.src.rank, op.src.buffer, op.route)].append(
                (op.src.index, op.step, op.dst.index))
    new: dict[int, dict[int, int]] = defaultdict(dict)  # rank -> old slot -> new slot

    def claim(rank: int, slots) -> None:
        mapping = new[rank]
        for slot in slots:
            if slot not in mapping:
                mapping[slot] = len(mapping)

    # 1. Where the other end has consecutive slots (the transfers can join), scratch
    # follows its order; a slot both received into and sent from goes to the group with
    # the most consecutive slots at its other end (ties: first use).
    scored = sorted(groups.items(), key=lambda kv: -_consecutive(kv[1]))
    for (rank, *_), entries in scored:
        if _consecutive(entries):
            claim(rank, (slot for _, _, slot in sorted(entries)))
    # 2. Scratch to scratch (a relay's relay): both ends follow whichever is numbered
    # already, else the connection's time order.
    far = 1 << 62
    for (src_rank, dst_rank, _), entries in both.items():
        at_src, at_dst = new[src_rank], new[dst_rank]
        for _, a, b in sorted(entries, key=lambda e: (at_dst.get(e[2], far), at_src.get(e[1], far), e)):
            claim(src_rank, (a,))
            claim(dst_rank, (b,))
    # 3. The rest, where joining cannot help, in time order.
    for (rank, *_), entries in scored:
        claim(rank, (slot for _, _, slot in sorted(entries, key=lambda e: (e[1], e[2]))))
    if not new:
        return list(ops)
    for rank, mapping in new.items():
        # Slots no group ordered keep their order, after the others.
        for slot in range(schedule.scratch_slots(rank)):
            if slot not in mapping:
                mapping[slot] = len(mapping)

    def loc(at: Loc) -> Loc:
        if at.buffer is not Buffer.SCRATCH:
            return at
        mapping = new.get(at.rank)
        return at if mapping is None else Loc(at.rank, at.buffer, mapping[at.index])

    return [op if op.src.buffer is not Buffer.SCRATCH and op.dst.buffer is not Buffer.SCRATCH
            else replace(op, src=loc(op.src), dst=loc(op.dst)) for op in ops]


def _consecutive(entries: list[tuple[int, int, int]]) -> int:
    """Pairs of neighbouring slots at the other end of a group's transfers."""
    others = sorted({e[0] for e in entries})
    return sum(1 for a, b in zip(others, others[1:]) if b == a + 1)


def _rebuild(ops: list[Op], owner: list[int]) -> tuple[Op, ...] | None:
    """Joined ops, renumbered in a topological order with steps raised where needed;
    None if the joins close a cycle."""
    n = len(ops)
    own = np.asarray(owner, dtype=np.int64)
    heads = np.flatnonzero(own == np.arange(n))
    index = np.full(n, -1, dtype=np.int64)
    index[heads] = np.arange(len(heads))
    group = index[own]  # op -> its joined op
    # Edges (dependency, user) between joined ops, each once, none to itself.
    counts = np.fromiter((len(op.deps) for op in ops), np.int64, n)
    flat = np.fromiter((d for op in ops for d in op.deps), np.int64, int(counts.sum()))
    user = np.repeat(group, counts)
    dep = group[flat]
    keep = dep != user
    pairs = np.unique(np.stack([dep[keep], user[keep]], axis=1), axis=0) if keep.any() else np.zeros((0, 2), np.int64)
    m = len(heads)
    waiting = np.bincount(pairs[:, 1], minlength=m).tolist()
    starts = np.searchsorted(pairs[:, 0], np.arange(m + 1)).tolist()
    users = pairs[:, 1].tolist()
    steps = np.zeros(m, dtype=np.int64)
    np.maximum.at(steps, group, np.fromiter((op.step for op in ops), np.int64, n))
    step = steps.tolist()
    # Kahn's algorithm, ready ops by (step, first op) so that the order stays close to
    # the schedule's; each op's step at least one past its dependencies'.
    ready = [(step[k], k) for k in range(m) if waiting[k] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        s, k = heapq.heappop(ready)
        order.append(k)
        for u in users[starts[k]:starts[k + 1]]:
            if step[u] <= s:
                step[u] = s + 1
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (step[u], u))
    if len(order) != m:
        return None
    number = [0] * m
    for new, k in enumerate(order):
        number[k] = new
    size = np.bincount(group, weights=np.fromiter((op.count for op in ops), np.int64, n), minlength=m)
    size = size.astype(np.int64).tolist()
    deps_of: list[list[int]] = [[] for _ in range(m)]
    for d, u in zip(pairs[:, 0].tolist(), pairs[:, 1].tolist()):
        deps_of[u].append(number[d])
    out = []
    for new, k in enumerate(order):
        first = ops[int(heads[k])]
        out.append(Op.make(new, first.kind, first.src, first.dst, size[k], tuple(sorted(deps_of[k])), step[k],
                           first.route, first.origin))
    return tuple(out)


@register_pass
@dataclass(frozen=True)
class CoalesceTransfers(Pass):
    name = "msccl-coalesce"
    summary = ("join a connection's nearby transfers of consecutive slots into one op, where a GPU would pass "
               "the executor's XML nodes")
    span: float = 0.01  # fraction of the schedule's steps that a joined run may spread over
    nodes: int = MAX_XML_NODES  # join only where some GPU's fewest possible nodes pass this
    force: bool = False

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule is None:
            raise CollcError("msccl-coalesce: there is no schedule to lower (run a pass that makes one first)")
        if not 0 <= self.span <= 1:
            raise CollcError(f"msccl-coalesce: span={self.span}; a fraction of the schedule's steps (0 to 1)")
        before, rank = node_estimate(unit.schedule)
        if not self.force and before <= self.nodes:
            return unit
        schedule = coalesce_ops(unit.schedule, self.span)
        after, _ = node_estimate(schedule)
        return replace(unit, schedule=schedule).with_note(
            self.name, estimated_nodes_before=before, estimated_nodes_after=after, ops=len(schedule.ops))
