"""ReduceScatter over identical nodes: reduce inside each node, then reduce-scatter along
the rails by rings.

At one chunk per rank, the flat composition (collc.synthesis.compose) chains the
partial sums into each rank's accumulator over the whole cluster: each transfer into
an accumulating rank waits for the one before, and the landings or lanes that would
let them overlap do not fit the op budget on 1,024 GPUs (1.044 of the bound there).
On a cluster of identical nodes joined by rails (GPU l of every node on rail l; see
collc.synthesis.nodes), rank (m, l)'s output, GPU l of node m, is reduced in two
steps instead:

1. inside each node n, for every node m (a "row": the outputs of node m's GPUs), the
   node's contributions to output (m, l) are summed into GPU l of node n (a
   ReduceScatter synthesized on one node's sub-topology, run once per row, each of its
   chunks standing for one output's slots);
2. along rail l, the node-level sums of the outputs on that rail are reduce-scattered
   by a ring: in ring step s, node p adds the partial sum of row p - s - 1 it received
   (none in step 0) to its own and sends it on to node p + 1; row m is complete at
   node m after N - 1 steps, in its output.

Node p's rail needs its rows in the order p - 1, p - 2, ..., p + 1, and its own row
last, so each node reduces its rows in that order (their ops' priorities) and the rail
starts after one row. What crosses the rails (the bottleneck: 50 GB/s against
NVLink's 450) is what a node-level ReduceScatter must send, (N - 1) / N of the node's
data. Each output is cut into `rail_chunks` slots, each its own op on the rail, so a
link sends one slot while the next arrives and never waits a hop's latency (one slot
per output left a rail idle 2.6 us of every 23 us); inside a node a row's transfers
move whole outputs (their slots are consecutive). The pipeline's fill is shortened as
SPLIT_ROWS, LANDED_ROWS and LANDED_STEPS say.

Ops: a row's node-level ReduceScatter is about g^2 ops (one output's slots are not
next to the same rank's other rows', so rows cannot be moved together), N^2 of them:
on 128 nodes of 8 GPUs about the flat composition's count, and a GPU's MSCCL XML has
about 15 steps per row inside its node and 4 per ring step.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind, standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind
from collc.ir.topology import Topology
from collc.synthesis.candidates import Result
from collc.synthesis.nodes import (NodeGroups, OpsBuilder, OverNodes, Part, composed_result, node_schedules,
                                   sub_topology)
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.rail_ring import ring_routes
from collc.synthesis.signals import MethodDoesNotFit, NoRing, NotOverNodes
from collc.synthesis.solver import Deadline

METHOD = "ring-reducescatter"

# Slots per output the rails aim for, as the AllReduce's (collc.synthesis.nodes,
# RAIL_SLOTS): about this many slots cross a rail link in all. Two at least: with one,
# a ring step's send waits for the whole slot to arrive first, and the link idles for
# the hop's latency every step.
RAIL_SLOTS = 32
MIN_RAIL_CHUNKS = 2
# The pipeline's fill (docs/synthesis-search.md, "ReduceScatter over identical nodes",
# figures on dgx_h100(nodes=16)): the first SPLIT_ROWS rows of a node are summed slot by
# slot, so its ring starts on a row's first slot (at 8.9 us instead of 262); the first
# LANDED_ROWS rows land their partial sums in scratch, so that each is summed before
# the next one starts (chained, two rows progressed at once and the rings waited 75 us
# more); the rings' first LANDED_STEPS steps land what they receive and add it once the
# receiver's own sum of the row is there, so a ring needs one row of its node to
# start, not two. 1.135 of the bound -> 1.038 there; a few thousand ops on 128 nodes.
SPLIT_ROWS = 1
LANDED_ROWS = 8
LANDED_STEPS = 8


def rail_chunks_for(n_nodes: int, chunks: int = 0) -> int:
    """Slots per output: the user's chunks where set, else about RAIL_SLOTS per rail
    link, two at least."""
    return chunks or max(MIN_RAIL_CHUNKS, -(-RAIL_SLOTS // n_nodes))


def row_order(node: int, n_nodes: int) -> list[int]:
    """The rows node `node` reduces, in the order its rail ring needs them: node - 1,
    node - 2, ..., node + 1, then its own."""
    return [(node - 1 - s) % n_nodes for s in range(n_nodes - 1)] + [node]


def reducescatter_over_nodes(topology: Topology, collective: Collective, size_bytes: int, groups: NodeGroups,
                             options: SynthesisOptions, deadline: Deadline, progress: Progress,
                             synthesize_part: Callable[[Topology, Collective, int, SynthesisOptions], Result]
                             ) -> Result:
    """The ReduceScatter described in the module docstring. `synthesize_part`
    synthesizes a node's ReduceScatter (topology, collective, bytes, options) with the
    caller's machinery."""
    n_nodes, g = groups.count, groups.size
    ranks = collective.ranks
    chunks = rail_chunks_for(n_nodes, options.chunks)
    hops = _rail_hops(topology, groups, progress)
    progress.stage(f"reducescatter over nodes: inside a node ({g} GPUs)")
    intra_opts = replace(options, nodes=OverNodes.OFF, chunks=1, max_peers=0, peer_limit=0)
    try:
        parts, node_results = node_schedules(topology, groups, size_bytes, intra_opts, synthesize_part,
                                             (standard(CollectiveKind.REDUCESCATTER, g, 1),))
    except (CollcError, MethodDoesNotFit) as exc:
        raise NotOverNodes(f"inside a node: {exc}") from None
    if any(r.schedule.collective.chunks != 1 for r in node_results):
        raise CollcError(f"cannot compose '{collective.name}' over nodes: a node's schedule split its chunks")
    fine = replace(standard(CollectiveKind.REDUCESCATTER, ranks, chunks), name=collective.name)
    builder = _Builder(groups, chunks)
    variants: dict[int, list[tuple[Op, ...]]] = {}  # per node schedule (nodes alike share one)
    for n, (part,) in enumerate(parts):
        if id(part.ops) not in variants:
            first = received_first(part.ops)
            variants[id(part.ops)] = [own_add_after(first, k) for k in range(max(1, g - 2))]
        builder.rows(n, [replace(part, ops=ops) for ops in variants[id(part.ops)]])
    for l in range(g):
        builder.ring(l, hops[l])
    builder.check_complete()
    over_nodes = {"nodes": n_nodes, "gpus_per_node": g, "rail": METHOD, "rail_chunks": chunks,
                  "rail_ops": builder.rail_ops, "node_ops": len(builder.ops) - builder.rail_ops}
    return composed_result("reducescatter", builder, topology, collective, fine, size_bytes, options, node_results,
                           METHOD, over_nodes, deadline, progress)


def received_first(ops: tuple[Op, ...]) -> tuple[Op, ...]:
    """A node's ReduceScatter with each accumulator started by a transfer: where a GPU
    copies its own input into an accumulator (a local op waiting for nothing) and the
    next op into it is a transfer adding a peer's contribution that waits for that copy,
    the transfer copies instead and a local op then adds the GPU's own input. The sums
    are the same. In MSCCL XML a local op that waits for nothing has no threadblock with
    peers to join, so each row's copy went to one threadblock without peers: on 64 nodes
    71 steps there against the 64 a threadblock runs, on any number of channels
    (backends/msccl_xml/channels.py places such ops); the local add waits for the
    transfer and joins its receiving threadblock, which is spread over the channels."""
    dependents: dict[int, list[int]] = {}
    for op in ops:
        for d in op.deps:
            dependents.setdefault(d, []).append(op.id)
    swap: dict[int, int] = {}  # the transfer's id -> the copy's id
    for op in ops:
        if op.kind is OpKind.COPY and not op.is_transfer and not op.deps and op.src.buffer is Buffer.INPUT:
            after = dependents.get(op.id, [])
            if len(after) == 1:
                nxt = ops[after[0]]
                if nxt.is_transfer and nxt.kind is OpKind.REDUCE and nxt.dst == op.dst:
                    swap[nxt.id] = op.id
    if not swap:
        return ops
    copies = set(swap.values())
    out: list[Op] = []
    new: dict[int, int] = {}  # old id -> the id of the op after which its value is there
    for op in ops:
        if op.id in copies:
            continue
        deps = tuple(sorted({new[d] for d in op.deps if d not in copies}))
        if op.id in swap:
            own = ops[swap[op.id]]
            first = len(out)
            out.append(Op.make(first, OpKind.COPY, op.src, op.dst, op.count, deps, op.step, op.route, op.origin))
            out.append(Op.make(first + 1, OpKind.REDUCE, own.src, own.dst, own.count, (first,), op.step, own.route,
                               own.origin))
            new[op.id] = new[own.id] = first + 1
        else:
            new[op.id] = len(out)
            out.append(Op.make(len(out), op.kind, op.src, op.dst, op.count, deps, op.step, op.route, op.origin))
    return tuple(out)


def own_add_after(ops: tuple[Op, ...], k: int) -> tuple[Op, ...]:
    """`received_first`'s ops with each GPU's local add of its own input moved behind the
    k-th op after the first transfer into the accumulator (where the chain has that many
    and more after it). The add joins the MSCCL threadblock of what it waits for, so the
    rows, given different k, spread their adds over the receiving threadblocks of
    several peers instead of the first one's (on 128 nodes it carried 128 adds besides
    its 129 receives, and the placement needed 6 channels rather than 5)."""
    if k == 0:
        return ops
    writers: dict[Loc, list[int]] = {}
    for op in ops:
        writers.setdefault(op.dst, []).append(op.id)
    moved: dict[int, int] = {}  # the own add -> the writer it now follows
    for chain in writers.values():
        if (len(chain) > k + 2 and not ops[chain[1]].is_transfer and ops[chain[1]].src.buffer is Buffer.INPUT
                and ops[chain[1]].deps == (chain[0],)):
            moved[chain[1]] = chain[k + 1]
    if not moved:
        return ops
    follows = {w: a for a, w in moved.items()}
    # Rewiring: the op after the add now waits for the first transfer; the one after the
    # k-th writer waits for the add instead.
    after_add = {ops[writers[ops[a].dst][2]].id: a for a in moved}
    after_kth = {ops[writers[ops[a].dst][writers[ops[a].dst].index(w) + 1]].id: a for a, w in moved.items()}
    out: list[Op] = []
    new: dict[int, int] = {}

    def emit(op: Op, deps: tuple[int, ...]) -> None:
        new[op.id] = len(out)
        out.append(Op.make(len(out), op.kind, op.src, op.dst, op.count, tuple(sorted({new[d] for d in deps})),
                           op.step, op.route, op.origin))

    for op in ops:
        if op.id in moved:
            continue
        deps = op.deps
        if op.id in after_add:
            add = after_add[op.id]
            deps = tuple(ops[add].deps[0] if d == add else d for d in deps)
        if op.id in after_kth:
            add = after_kth[op.id]
            deps = tuple(add if d == moved[add] else d for d in deps)
            if add not in new:
                emit(ops[add], (moved[add],))
        emit(op, deps)
        if op.id in follows and follows[op.id] not in new:
            emit(ops[follows[op.id]], (op.id,))
    return tuple(out)


def _rail_hops(topology: Topology, groups: NodeGroups, progress: Progress) -> list[list[tuple[str, ...]]]:
    """Per rail, the route from each node's GPU on it to the next node's."""
    hops = []
    for l in range(groups.size):
        progress.stage(f"reducescatter over nodes: rail {l + 1} of {groups.size} ({groups.count} GPUs)")
        try:
            hops.append(ring_routes(sub_topology(topology, groups.rail(l), f"rail {l}")))
        except NoRing as exc:
            raise NotOverNodes(str(exc)) from None
    return hops


class _Builder(OpsBuilder):
    """The cluster's ops, the nodes' rows first, then the rails' rings (dependencies
    point backwards in the list)."""

    def __init__(self, groups: NodeGroups, chunks: int):
        self.groups = groups
        self.chunks = chunks
        super().__init__(groups.count * groups.size)
        # acc[n][l][m]: where GPU l of node n sums its node's contributions to output
        # (m, l); done[n][l][m][j], the op that completes slot j of that sum there.
        self.acc: list[list[list[Loc | None]]] = [[[None] * groups.count for _ in range(groups.size)]
                                                  for _ in range(groups.count)]
        self.done: list[list[list[list[int]]]] = [[[[-1] * chunks for _ in range(groups.count)]
                                                   for _ in range(groups.size)] for _ in range(groups.count)]
        self._horizon = 1

    def _fresh(self, rank: int, slots: int) -> int:
        base = self._scratch[rank]
        self._scratch[rank] += slots
        return base

    def rows(self, n: int, variants: list[Part]) -> None:
        """Step 1 at node n: the node's ReduceScatter once per row, in the order its rails
        need the rows (`row_order`), each op's priority its row's place in that order;
        row place p made by `variants[p % len(variants)]` (the same sums)."""
        k, rank_of = self.chunks, self.groups.ranks[n]
        horizon = 1 + max((op.step for part in variants for op in part.ops), default=0)
        self._horizon = max(self._horizon, horizon)
        for place, m in enumerate(row_order(n, self.groups.count)):
            part = variants[place % len(variants)]
            outputs = self.groups.ranks[m]  # local GPU x's output on this row: rank outputs[x]
            acc = [Loc(full, Buffer.OUTPUT, 0) if m == n else Loc(full, Buffer.SCRATCH, self._fresh(full, k))
                   for full in rank_of]
            base = [self._fresh(full, part.scratch[x] * k) if x < len(part.scratch) else 0
                    for x, full in enumerate(rank_of)]

            def loc(x: Loc) -> Loc:
                if x.buffer is Buffer.INPUT:
                    return Loc(rank_of[x.rank], Buffer.INPUT, outputs[x.index] * k)
                if x.buffer is Buffer.OUTPUT:
                    return acc[x.rank]
                return Loc(rank_of[x.rank], Buffer.SCRATCH, base[x.rank] + x.index * k)

            # The first rows slot by slot: the rails start on a row's first slot rather
            # than once the whole row is summed (the pipeline's fill).
            pieces = [(j, 1) for j in range(k)] if place < SPLIT_ROWS else [(0, k)]
            for offset, width in pieces:
                self._piece(n, m, part, loc, offset, width, (place * k + offset) * horizon, place < LANDED_ROWS)
            for x in range(len(rank_of)):
                self.acc[n][x][m] = acc[x]

    def _piece(self, n: int, m: int, part: Part, loc: Callable[[Loc], Loc], offset: int, width: int,
               priority: int, land: bool) -> None:
        """Slots [offset, offset + width) of each output of row m at node n: the node's
        ReduceScatter `part`, its locations mapped by `loc`. With `land`, each partial
        sum lands in a scratch slot of its own and is added there by a local op, so that
        the transfers into one GPU need not wait for each other: the list scheduler then
        sends the row's transfers before any later row's, where with chained sums a
        link takes the next row's transfer while the chain waits for a hop (on
        dgx_h100(nodes=16), two rows then progressed at once and the rails waited 260
        us for their first row, 75 us for their second)."""
        def at(x: Loc) -> Loc:
            full = loc(x)
            return Loc(full.rank, full.buffer, full.index + offset)

        writes = {op.id: op.dst for op in part.ops}
        new: dict[int, int] = {}
        for op in part.ops:
            src, dst = at(op.src), at(op.dst)
            count, step, route = op.count * width, priority + op.step, tuple(map(part.rename, op.route))
            if land and op.is_transfer and op.kind is OpKind.REDUCE:
                chain = [new[d] for d in op.deps if writes[d] == op.dst]  # the sums into the same accumulator
                feed = [new[d] for d in op.deps if writes[d] != op.dst]  # what filled the source
                landing = Loc(dst.rank, Buffer.SCRATCH, self._fresh(dst.rank, count))
                copied = self._add(OpKind.COPY, src, landing, count, feed, step, route)
                i = self._add(OpKind.REDUCE, landing, dst, count, [*chain, copied], step, ())
            else:
                i = self._add(op.kind, src, dst, count, [new[d] for d in op.deps], step, route)
            new[op.id] = i
            if op.dst.buffer is Buffer.OUTPUT:
                self.done[n][op.dst.rank][m][offset:offset + width] = [i] * width

    def ring(self, l: int, hops: list[tuple[str, ...]]) -> None:
        """Step 2 on rail l: in ring step s, node p sends its partial sum of row p - s - 1
        to node p + 1, which adds it to its own, slot by slot."""
        n_nodes, k = self.groups.count, self.chunks
        last = [[list(self.done[p][l][m]) for m in range(n_nodes)] for p in range(n_nodes)]
        for s in range(n_nodes - 1):
            for p in range(n_nodes):
                q, m = (p + 1) % n_nodes, (p - s - 1) % n_nodes
                src, dst = self.acc[p][l][m], self.acc[q][l][m]
                assert src is not None and dst is not None
                for j in range(k):
                    step = s * self._horizon * k + j
                    here, there = Loc(src.rank, src.buffer, src.index + j), Loc(dst.rank, dst.buffer, dst.index + j)
                    if s < LANDED_STEPS:
                        # The receiver's own sum of this row is the next row it makes: the
                        # first partial sums land and are added once it is there, so the
                        # ring starts after one row of each node, not two.
                        landing = Loc(dst.rank, Buffer.SCRATCH, self._fresh(dst.rank, 1))
                        copied = self._add(OpKind.COPY, here, landing, 1, (last[p][m][j],), step, hops[p])
                        last[q][m][j] = self._add(OpKind.REDUCE, landing, there, 1, (copied, last[q][m][j]), step, ())
                    else:
                        last[q][m][j] = self._add(OpKind.REDUCE, here, there, 1, (last[p][m][j], last[q][m][j]),
                                                  step, hops[p])
                    self.rail_ops += 1

    def check_complete(self) -> None:
        """Every node-level sum was made (a node's schedule that never wrote some GPU's
        output would leave a rail without its input)."""
        if any(d < 0 for node in self.done for gpu in node for row in gpu for d in row):
            raise CollcError("cannot compose a ReduceScatter over nodes: a node's schedule left an output unwritten")
