"""AllReduce over identical nodes: reduce inside each node, all-reduce along the rails,
gather inside each node, pipelined in batches.

The flat composition (collc.synthesis.compose) reduces and gathers every rank's chunk
over the whole cluster: at least 2 x R x (R - 1) transfers of one chunk each, 2.1
million on 1,024 GPUs, and about 4,000 sends and receives per GPU, more than MSCCL's
executor takes (4,096 XML nodes per GPU). On a cluster of identical nodes joined by
rails (GPU l of every node on rail l), the buffer is cut into one piece per GPU of a
node instead, and piece l is handled by the GPUs of rail l:

1. inside each node, piece l of every GPU is reduced into GPU l (a ReduceScatter
   synthesized on one node's sub-topology, each of its chunks standing for a range of
   the piece);
2. along rail l, the node-level sums of piece l are all-reduced by a ring
   (collc.synthesis.rail_ring);
3. inside each node, GPU l gives piece l to the others (an AllGather synthesized on
   the node).

Steps 1 and 3 run in batches of consecutive slots: the rails start as soon as a node
has reduced the blocks its GPUs need first, and the nodes gather each batch as soon as
the rails have finished it. The list scheduler (collc.synthesis.timing) overlaps the
three on the whole cluster's links. Every transfer of steps 1 and 3 moves a whole
batch range (`count` slots): on 32 nodes a GPU has about 1,900 MSCCL XML steps on 57
threadblocks, 860 of them moving whole ranges. What crosses the rails (the
bottleneck: 50 GB/s against NVLink's 450) is what a node-level AllReduce must send, so
the schedule's time is the rails' AllReduce of 1/g of the data plus the pipeline's
fill.

Nodes are found from GPU names: a name `node[3].g[5]` belongs to node `node[3]` at
local name `g[5]`; every node must have the same local names in the same order.
Sub-topologies are induced on a node's (a rail's) GPUs and every switch and NIC, with
forwarding nodes that lead nowhere removed, so every route of a sub-schedule is a
route of the cluster.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import Callable

from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind, allgather, standard
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Node, NodeKind, Topology
from collc.synthesis.candidates import Result
from collc.synthesis.network import Network
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.plan import Status, combined_status
from collc.synthesis.rail_ring import METHOD as RING_METHOD, ring_allreduce
from collc.synthesis.signals import MethodDoesNotFit, NoRing, NotOverNodes
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import sequence


# Slots per piece the rails aim for. Finer slots shorten the pipeline's fill and let a
# link queue the next slot while one crosses (on 128 nodes, 2 slots per block already
# hide a hop's 2.6 us behind a 10.5 us slot); each slot costs 2 (N - 1) transfers per
# rail. With 256, a GPU's ring sends and receives about 500 slots each whatever N,
# and with its node's batches it has about 1,900 MSCCL XML steps on 32 nodes (the
# executor takes 4,096).
RAIL_SLOTS = 256


class OverNodes(str, Enum):
    """Whether an AllReduce is composed over nodes; the values are the pass option's tokens."""

    AUTO = "auto"  # where the flat composition cannot keep to the op budget
    ON = "on"
    OFF = "off"


@dataclass(frozen=True)
class NodeGroups:
    """GPU ranks by node: ranks[n][l] is the rank of node n's l-th GPU (rail l)."""

    prefixes: tuple[str, ...]
    ranks: tuple[tuple[int, ...], ...]

    @property
    def count(self) -> int:
        return len(self.ranks)

    @property
    def size(self) -> int:
        return len(self.ranks[0])

    def rail(self, l: int) -> list[int]:
        return [node[l] for node in self.ranks]


def node_groups(topology: Topology) -> NodeGroups | None:
    """Nodes found from GPU names (prefix before the last '.'); None unless there are at
    least two, all with the same two or more local names in the same order."""
    groups: dict[str, list[tuple[str, int]]] = {}
    for gpu in topology.gpus:
        if "." not in gpu.name:
            return None
        prefix, local = gpu.name.rsplit(".", 1)
        groups.setdefault(prefix, []).append((local, gpu.rank))  # type: ignore[arg-type]
    if len(groups) < 2:
        return None
    names = [tuple(local for local, _ in members) for members in groups.values()]
    if len(names[0]) < 2 or any(n != names[0] for n in names):
        return None
    prefixes = tuple(groups)
    return NodeGroups(prefixes, tuple(tuple(rank for _, rank in groups[p]) for p in prefixes))


def flat_minimum_ops(ranks: int) -> int:
    """Fewest transfers of the flat composition: every chunk (one per rank at least)
    reaches every other rank once in the ReduceScatter and once in the AllGather."""
    return 2 * ranks * (ranks - 1)


def wanted(topology: Topology, collective: Collective, options: SynthesisOptions) -> NodeGroups | None:
    """The nodes to compose an AllReduce over, or None for the flat composition."""
    choice = OverNodes(options.nodes)
    if choice == OverNodes.OFF or collective.kind is not CollectiveKind.ALLREDUCE:
        return None
    groups = node_groups(topology)
    if choice == OverNodes.ON:
        if groups is None:
            raise CollcError(f"cannot compose '{collective.name}' over nodes on '{topology.name}': its GPU names "
                             "do not form two or more nodes with the same local names (as node[k].g[i] do)")
        return groups
    if groups is None or flat_minimum_ops(collective.ranks) <= options.max_ops:
        return None
    return groups


# --- sub-topologies -----------------------------------------------------------------

def sub_topology(topology: Topology, ranks: Sequence[int], name: str) -> Topology:
    """The topology induced on the GPUs `ranks` (renumbered in that order) and every
    switch and NIC, less forwarding nodes that lead nowhere (one neighbour or none, until
    none is left) and parts with no GPU."""
    keep = {topology.gpu(r).name: i for i, r in enumerate(ranks)}
    alive = {n.name for n in topology.nodes if n.kind is not NodeKind.GPU} | set(keep)
    links = [l for l in topology.links if l.src in alive and l.dst in alive]
    nbrs: dict[str, set[str]] = defaultdict(set)
    for l in links:
        nbrs[l.src].add(l.dst)
        nbrs[l.dst].add(l.src)
    dead = [v for v in alive if v not in keep and len(nbrs[v]) <= 1]
    while dead:
        v = dead.pop()
        if v not in alive:
            continue
        alive.discard(v)
        for u in nbrs.pop(v, ()):
            nbrs[u].discard(v)
            if u not in keep and u in alive and len(nbrs[u]) <= 1:
                dead.append(u)
    reach, todo = set(keep), list(keep)
    while todo:
        for u in nbrs[todo.pop()]:
            if u in alive and u not in reach:
                reach.add(u)
                todo.append(u)
    nodes = tuple(Node(n.name, n.kind, keep.get(n.name), n.sms) for n in topology.nodes if n.name in reach)
    return Topology(name, nodes, tuple(l for l in links if l.src in reach and l.dst in reach),
                    f"{topology.name}: {name}")


def _link_set(topology: Topology) -> set[tuple]:
    return {(l.src, l.dst, l.bandwidth, l.latency, l.multiplicity) for l in topology.links}


def _prefix_rename(old: str, new: str) -> Callable[[str], str]:
    def rename(name: str) -> str:
        if name.startswith(old + "."):
            return new + name[len(old):]
        return name
    return rename


# --- the composition ----------------------------------------------------------------

@dataclass
class _Part:
    """One synthesized sub-schedule and how its routes map onto a node."""

    ops: tuple[Op, ...]
    scratch: tuple[int, ...]
    rename: Callable[[str], str]


def compose_over_nodes(topology: Topology, collective: Collective, size_bytes: int, groups: NodeGroups,
                       options: SynthesisOptions, deadline: Deadline, progress: Progress,
                       synthesize_part: Callable[[Topology, Collective, int, SynthesisOptions], Result]) -> Result:
    """The AllReduce described in the module docstring. `synthesize_part` synthesizes a
    node's ReduceScatter and AllGather (topology, collective, bytes, options) with the
    caller's machinery."""
    n_nodes, g = groups.count, groups.size
    ranks = collective.ranks
    # About RAIL_SLOTS slots per piece, within half the op budget for the rails'
    # transfers (2 (N - 1) per slot).
    budget = options.max_ops // (2 * g * 2 * n_nodes * max(1, n_nodes - 1))
    rail_chunks = options.chunks or max(1, min(budget, -(-RAIL_SLOTS // n_nodes)))
    rails = _rail_rings(topology, groups, rail_chunks, progress)
    slots = n_nodes * rail_chunks  # a piece's slots; piece l is slots [l * slots, (l + 1) * slots)
    rail_ops = sum(op.is_transfer for r in rails for op in r.ops)

    progress.stage(f"allreduce over nodes: inside a node ({g} GPUs)")
    intra_opts = replace(options, nodes=OverNodes.OFF, chunks=1, max_peers=0, peer_limit=0)
    try:
        parts, node_results = _node_parts(topology, groups, size_bytes, intra_opts, synthesize_part)
    except (CollcError, MethodDoesNotFit) as exc:
        raise NotOverNodes(f"inside a node: {exc}") from None
    if any(r.schedule.collective.chunks != 1 for r in node_results):
        raise CollcError(f"cannot compose '{collective.name}' over nodes: a node's schedule split its chunks")
    per_batch = max(len(p.rs.ops) + len(p.ag.ops) for p in parts)
    cuts = batch_cuts(slots, rail_ops // (n_nodes * g), per_batch // g,
                      (options.max_ops - rail_ops) // max(1, n_nodes * per_batch))
    fine = replace(standard(CollectiveKind.ALLREDUCE, ranks, rail_chunks), name=collective.name)
    builder = _Builder(ranks)
    rail_places = [places(r.ops, slots) for r in rails]
    order = batch_order(groups, rails, rail_places, cuts)
    done = builder.reductions(groups, parts, cuts, slots, order)
    final = builder.rails(groups, rails, cuts, slots, done, rail_places)
    builder.gathers(groups, parts, cuts, slots, final)
    progress.stage(f"allreduce over nodes: list-scheduling {len(builder.ops):,} ops")
    timeline = sequence(builder.ops, Network(topology), fine.slot_bytes(size_bytes), options.timing)
    # The rings are a heuristic: the whole is at best feasible, never proven optimal.
    status = combined_status([Status.FEASIBLE, *(r.status for r in node_results)])
    method = f"{node_results[0].method}+{RING_METHOD}"
    facts = {"composed_from": "allgather",
             "over_nodes": {"nodes": n_nodes, "gpus_per_node": g, "rail": RING_METHOD, "rail_chunks": rail_chunks,
                            "batches": len(cuts) - 1, "rail_ops": builder.rail_ops,
                            "node_ops": len(builder.ops) - builder.rail_ops}}
    scratch = builder.scratch
    sched = Schedule(name=f"{collective.name}-over-nodes", collective=fine, topology=topology.name,
                     ops=timeline.ops, scratch=scratch if any(scratch) else (),
                     meta={"synthesized_by": "collc.synthesize", "method": method, "status": status.value,
                           "chunks": rail_chunks, "estimate_s": timeline.seconds, "over_nodes": True})
    return Result(sched, method, status, deadline.elapsed(), timeline.seconds, sched.num_steps,
                  sum(r.variables for r in node_results), sum(r.constraints for r in node_results), rail_chunks,
                  facts)


def _rail_rings(topology: Topology, groups: NodeGroups, chunks: int, progress: Progress) -> list[Schedule]:
    """A ring AllReduce on each rail's sub-topology, `chunks` slots per block."""
    rails: list[Schedule] = []
    for l in range(groups.size):
        progress.stage(f"allreduce over nodes: rail {l + 1} of {groups.size} ({groups.count} GPUs)")
        try:
            rails.append(ring_allreduce(sub_topology(topology, groups.rail(l), f"rail {l}"), chunks))
        except NoRing as exc:
            raise NotOverNodes(str(exc)) from None
    return rails


def batch_cuts(slots: int, rail_ops_per_gpu: int, node_ops_per_gpu_batch: int, budget_batches: int) -> list[int]:
    """Place boundaries of the batches a piece is reduced and gathered in. More batches
    shorten the pipeline's fill (the first batch's reduction, the last one's gathering)
    but add node-level ops to every GPU: about as many batches as keep a GPU's node ops
    within its rail ops (and the op budget), of equal widths (give or take a place).
    Batches that grow from one place at the start and shrink to one at the end were no
    better on dgx_h100(nodes=16), with flat compositions on the rails (1.078 and 1.085
    of the bound against 1.064): the rails finished their last places together."""
    k = max(1, min(slots, budget_batches, rail_ops_per_gpu // max(1, node_ops_per_gpu_batch)))
    base, extra = divmod(slots, k)
    cuts = [0]
    for b in range(k):
        cuts.append(cuts[-1] + base + (1 if b < extra else 0))
    return cuts


@dataclass
class _NodePart:
    rs: _Part
    ag: _Part


def _node_parts(topology: Topology, groups: NodeGroups, size_bytes: int, options: SynthesisOptions,
                synthesize_part: Callable[[Topology, Collective, int, SynthesisOptions], Result]
                ) -> tuple[list[_NodePart], list[Result]]:
    """Each node's ReduceScatter and AllGather: synthesized on the first node and reused
    with its names renamed wherever a node's sub-topology is the first one's renamed,
    else synthesized for that node."""
    g = groups.size
    made: list[tuple[set[tuple], str, Result, Result]] = []
    out: list[_NodePart] = []
    for n, prefix in enumerate(groups.prefixes):
        sub = sub_topology(topology, groups.ranks[n], f"node {prefix}")
        found = None
        for links, base, rs, ag in made:
            rename = _prefix_rename(base, prefix)
            if _link_set(sub) == {(rename(a), rename(b), *rest) for a, b, *rest in links}:
                found = (rs, ag, rename)
                break
        if found is None:
            rs = synthesize_part(sub, standard(CollectiveKind.REDUCESCATTER, g, 1), size_bytes, options)
            ag = synthesize_part(sub, allgather(g, 1), size_bytes, options)
            made.append((_link_set(sub), prefix, rs, ag))
            found = (rs, ag, lambda x: x)
        rs, ag, rename = found
        out.append(_NodePart(_Part(rs.schedule.ops, rs.schedule.scratch, rename),
                             _Part(ag.schedule.ops, ag.schedule.scratch, rename)))
    return out, [r for _, _, rs, ag in made for r in (rs, ag)]


def needs(ops: Sequence[Op]) -> Iterator[tuple[int, int, int]]:
    """(position in the list, rank, slot) wherever a rail schedule's transfer needs a
    rank's own value of a slot: it sends from the slot (its input, or the output it
    accumulates in) or reduces into it. The first of these for a rank and slot is when
    the rank needs its node's sum there."""
    for i, op in enumerate(ops):
        if not op.is_transfer:
            continue
        if op.src.buffer is not Buffer.SCRATCH:
            yield i, op.src.rank, op.src.index
        if op.kind is OpKind.REDUCE and op.dst.buffer is Buffer.OUTPUT:
            yield i, op.dst.rank, op.dst.index


def places(ops: Sequence[Op], slots: int) -> list[int]:
    """Where each of a rail schedule's slots goes in its piece: in the order the schedule
    (its ops listed in the order they should start) first needs them on any rank. The
    nodes reduce the piece in batches of consecutive places. (For a ring this is the
    slot order; a rail schedule that needs its slots in another order keeps its
    batches together this way.)"""
    first = [len(ops)] * slots
    for i, _, slot in needs(ops):
        first[slot] = min(first[slot], i)
    order = sorted(range(slots), key=lambda s: (first[s], s))
    place = [0] * slots
    for p, s in enumerate(order):
        place[s] = p
    return place


def batch_order(groups: NodeGroups, rails: list[Schedule], rail_places: list[list[int]], cuts: list[int]
                ) -> list[list[int]]:
    """For each node, its batches in the order its GPUs' rails first need them. A GPU's
    own first transfers can be of slots in different batches (a ring's GPU m starts
    with block m; the flat composition's GPUs each start on a slot of their own), and a
    node that reduced its batches in place order would leave its rail links idle."""
    n_batches = len(cuts) - 1
    batch_of = [0] * cuts[-1]
    for b in range(n_batches):
        for p in range(cuts[b], cuts[b + 1]):
            batch_of[p] = b
    first = [[len(rails[0].ops)] * n_batches for _ in range(groups.count)]
    for rail, place in zip(rails, rail_places):
        for i, rank, slot in needs(rail.ops):
            row, b = first[rank], batch_of[place[slot]]
            row[b] = min(row[b], i)
    return [sorted(range(n_batches), key=lambda b: (row[b], b)) for row in first]


class _Builder:
    """The cluster's ops, phase by phase, in an order their dependencies respect."""

    def __init__(self, ranks: int):
        self.ops: list[Op] = []
        self._scratch = [0] * ranks
        self._reductions_end = 0  # a step past every node-level reduction's
        self.rail_ops = 0

    @property
    def scratch(self) -> tuple[int, ...]:
        return tuple(self._scratch)

    def _add(self, kind: OpKind, src: Loc, dst: Loc, count: int, deps: set[int], step: int,
             route: tuple[str, ...]) -> int:
        i = len(self.ops)
        self.ops.append(Op.make(i, kind, src, dst, count, tuple(sorted(deps)), step, route, None))
        return i

    def _scratch_base(self, sub_scratch: tuple[int, ...], rank_of: Sequence[int], width: int) -> list[int]:
        """Fresh scratch for one embedded sub-schedule: each sub-slot a range of `width`."""
        base = []
        for r, full in enumerate(rank_of):
            base.append(self._scratch[full])
            if r < len(sub_scratch):
                self._scratch[full] += sub_scratch[r] * width
        return base

    def reductions(self, groups: NodeGroups, parts: list[_NodePart], cuts: list[int], slots: int,
                   order: list[list[int]]) -> list[list[list[int]]]:
        """Step 1, node n's batches in priority `order[n]`. Returns done[n][l][b]: the op
        that completes batch b of piece l at node n's GPU l."""
        done: list[list[list[int]]] = []
        for n, part in enumerate(parts):
            rs, rank_of = part.rs, groups.ranks[n]
            horizon = 1 + max((op.step for op in rs.ops), default=0)
            node_done = [[-1] * (len(cuts) - 1) for _ in rank_of]
            rank = {b: k for k, b in enumerate(order[n])}
            for b in range(len(cuts) - 1):
                lo, width = cuts[b], cuts[b + 1] - cuts[b]
                base = self._scratch_base(rs.scratch, rank_of, width)

                def loc(x: Loc) -> Loc:
                    full = rank_of[x.rank]
                    if x.buffer is Buffer.INPUT:
                        return Loc(full, Buffer.INPUT, x.index * slots + lo)
                    if x.buffer is Buffer.OUTPUT:  # a ReduceScatter's output: the rank's own piece
                        return Loc(full, Buffer.OUTPUT, x.rank * slots + lo)
                    return Loc(full, Buffer.SCRATCH, base[x.rank] + x.index * width)

                new: dict[int, int] = {}
                for op in rs.ops:
                    i = self._add(op.kind, loc(op.src), loc(op.dst), op.count * width, {new[d] for d in op.deps},
                                  rank[b] * horizon + op.step, tuple(map(rs.rename, op.route)))
                    new[op.id] = i
                    self._reductions_end = max(self._reductions_end, rank[b] * horizon + op.step + 1)
                    if op.dst.buffer is Buffer.OUTPUT:
                        node_done[op.dst.rank][b] = i
            done.append(node_done)
        return done

    def rails(self, groups: NodeGroups, rails: list[Schedule], cuts: list[int], slots: int,
              done: list[list[list[int]]], rail_places: list[list[int]]) -> list[list[list[int]]]:
        """Step 2, each rail's ops with their own priorities. Returns final[l][n][p]: the
        op after which node n's GPU l holds place p of piece l reduced over the cluster."""
        batch_of = [0] * slots
        for b in range(len(cuts) - 1):
            for p in range(cuts[b], cuts[b + 1]):
                batch_of[p] = b
        final: list[list[list[int]]] = []
        for l, rail in enumerate(rails):
            rank_of = groups.rail(l)
            place = rail_places[l]
            base = self._scratch_base(rail.scratch, rank_of, 1)
            offset = l * slots

            def ready(x: Loc) -> int:
                return done[x.rank][l][batch_of[place[x.index]]]

            def loc(x: Loc) -> Loc:
                full = rank_of[x.rank]
                if x.buffer is Buffer.SCRATCH:
                    return Loc(full, Buffer.SCRATCH, base[x.rank] + x.index)
                # The rail's input is the node-level sum, already in the GPU's output.
                return Loc(full, Buffer.OUTPUT, offset + place[x.index])

            new: dict[int, int] = {}
            last = [[-1] * slots for _ in rank_of]
            for op in rail.ops:
                if op.count != 1:
                    raise CollcError("a rail's op moves several slots: its slots cannot be placed one by one")
                if op.src.buffer is Buffer.INPUT and op.dst == Loc(op.src.rank, Buffer.OUTPUT, op.src.index):
                    new[op.id] = ready(op.src)  # the sum is in place already
                    continue
                deps = {new[d] for d in op.deps}
                if op.src.buffer is Buffer.INPUT:
                    deps.add(ready(op.src))
                i = self._add(op.kind, loc(op.src), loc(op.dst), 1, deps, op.step, op.route)
                self.rail_ops += 1
                new[op.id] = i
                if op.dst.buffer is not Buffer.SCRATCH:
                    last[op.dst.rank][place[op.dst.index]] = i
            for m in range(len(rank_of)):
                for p in range(slots):
                    if last[m][p] < 0:
                        last[m][p] = done[m][l][batch_of[p]]
            final.append(last)
        return final

    def gathers(self, groups: NodeGroups, parts: list[_NodePart], cuts: list[int], slots: int,
                final: list[list[list[int]]]) -> None:
        """Step 3. Its ops come after every reduction in priority: where a node's links
        have both to do, the reductions feed the rails (on dgx_h100(nodes=32), gathering
        first delayed them until the rails idled: 1.154 of the bound against ...)."""
        after = self._reductions_end
        for n, part in enumerate(parts):
            ag, rank_of = part.ag, groups.ranks[n]
            horizon = 1 + max((op.step for op in ag.ops), default=0)
            for b in range(len(cuts) - 1):
                lo, hi = cuts[b], cuts[b + 1]
                width = hi - lo
                base = self._scratch_base(ag.scratch, rank_of, width)

                def loc(x: Loc) -> Loc:
                    full = rank_of[x.rank]
                    if x.buffer is Buffer.INPUT:  # the owner's piece, reduced by the rails
                        return Loc(full, Buffer.OUTPUT, x.rank * slots + lo)
                    if x.buffer is Buffer.OUTPUT:
                        return Loc(full, Buffer.OUTPUT, x.index * slots + lo)
                    return Loc(full, Buffer.SCRATCH, base[x.rank] + x.index * width)

                new: dict[int, set[int]] = {}
                for op in ag.ops:
                    deps = set().union(*(new[d] for d in op.deps)) if op.deps else set()
                    if op.src.buffer is Buffer.INPUT:
                        owner = op.src.rank
                        deps.update(final[owner][n][s] for s in range(lo, hi))
                        if op.dst == Loc(owner, Buffer.OUTPUT, owner) and op.count == 1:
                            new[op.id] = deps  # the piece is in place already
                            continue
                    i = self._add(op.kind, loc(op.src), loc(op.dst), op.count * width, deps,
                                  after + b * horizon + op.step, tuple(map(ag.rename, op.route)))
                    new[op.id] = {i}
