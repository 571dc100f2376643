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
the rails have finished it. Each node cuts its own batches from when its rails, run
alone, first need each place and finish it (`rail_times`): narrow where the rails
need places at once (the pipeline's fill) or finish them last (its drain), wide in
between, where the node is ahead of the rails. The list scheduler (collc.synthesis.timing) overlaps the
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
from collections.abc import Iterable, Iterator, Sequence
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
from collc.synthesis.timing import replay_times, sequence


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


# A ReduceScatter over nodes (collc.synthesis.nodes_reducescatter) loses to the bound
# only its pipeline's fill, about this many of its rings' N - 1 steps: measured on
# dgx_h100 at one chunk per rank, 0.57 on 8 nodes (1.081 of the bound), 0.57 on 16
# (1.038), 0.60 on 32 (1.019), 0.64 on 64 (1.010).
REDUCESCATTER_FILL_STEPS = 0.6
# The flat composition's time over the bound at its best where measured: 1.029 on
# dgx_h100(nodes=8) at 4 chunks per rank, 1.027 on 16 nodes at 2 and on 32 at one (its
# partial sums in lanes), 1.044 on 128.
FLAT_REDUCESCATTER_EXCESS = 0.027


def reducescatter_wins(n_nodes: int) -> bool:
    """Whether a ReduceScatter over `n_nodes` nodes is expected nearer its bound than the
    flat composition: its fill's share below the flat one's excess (from 24 nodes on)."""
    return n_nodes > 1 and REDUCESCATTER_FILL_STEPS / (n_nodes - 1) < FLAT_REDUCESCATTER_EXCESS


def wanted(topology: Topology, collective: Collective, options: SynthesisOptions) -> NodeGroups | None:
    """The nodes to compose an AllReduce or a ReduceScatter over, or None for the flat
    composition: an AllReduce over nodes where the flat one at its best would not fit
    the op budget; a ReduceScatter (collc.synthesis.nodes_reducescatter) where it is
    expected to win (`reducescatter_wins`)."""
    choice = OverNodes(options.nodes)
    if choice == OverNodes.OFF or collective.kind not in (CollectiveKind.ALLREDUCE, CollectiveKind.REDUCESCATTER):
        return None
    groups = node_groups(topology)
    if choice == OverNodes.ON:
        if groups is None:
            raise CollcError(f"cannot compose '{collective.name}' over nodes on '{topology.name}': its GPU names "
                             "do not form two or more nodes with the same local names (as node[k].g[i] do)")
        return groups
    if groups is None:
        return None
    if collective.kind is CollectiveKind.REDUCESCATTER:
        return groups if reducescatter_wins(groups.count) else None
    return None if flat_minimum_ops(collective.ranks) <= options.max_ops else groups


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
class Part:
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
    rails, rail_topologies = _rail_rings(topology, groups, rail_chunks, progress)
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
    count = batch_count(slots, rail_ops // (n_nodes * g), per_batch // g,
                        (options.max_ops - rail_ops) // max(1, n_nodes * per_batch))
    fine = replace(standard(CollectiveKind.ALLREDUCE, ranks, rail_chunks), name=collective.name)
    rail_places = [places(r.ops, slots) for r in rails]
    times = [rail_times(r, Network(sub), fine.slot_bytes(size_bytes), slots)
             for r, sub in zip(rails, rail_topologies)]
    # What a node takes to reduce (gather) one place of every piece.
    reduce_place_s = max(r.estimate_s for r in node_results[0::2]) / slots
    gather_place_s = max(r.estimate_s for r in node_results[1::2]) / slots
    reduce_batches, gather_batches = [], []
    for n in range(n_nodes):
        need, final = node_times(n, times, rail_places)
        reduce_batches.append(batches_by_need(need, reduce_place_s, count))
        gather_batches.append(batches_by_finish(final, gather_place_s, count))
    builder = _Builder(ranks)
    done = builder.reductions(groups, parts, reduce_batches, slots)
    final_ops = builder.rails(groups, rails, reduce_batches, slots, done, rail_places)
    builder.gathers(groups, parts, gather_batches, slots, final_ops)
    over_nodes = {"nodes": n_nodes, "gpus_per_node": g, "rail": RING_METHOD, "rail_chunks": rail_chunks,
                  "batches": max(map(len, reduce_batches)), "gather_batches": max(map(len, gather_batches)),
                  "rail_ops": builder.rail_ops, "node_ops": len(builder.ops) - builder.rail_ops}
    return composed_result("allreduce", builder, topology, collective, fine, size_bytes, options, node_results,
                           RING_METHOD, over_nodes, deadline, progress)


def composed_result(kind: str, builder: OpsBuilder, topology: Topology, collective: Collective,
                    fine: Collective, size_bytes: int, options: SynthesisOptions, node_results: Sequence[Result],
                    rail_method: str, over_nodes: dict, deadline: Deadline, progress: Progress) -> Result:
    """A composition over nodes as the pass's result: the builder's ops list-scheduled on
    the whole cluster, `fine` (the collective at the rails' chunks) as its collective,
    `over_nodes` (the composition's shape) among the facts."""
    progress.stage(f"{kind} over nodes: list-scheduling {len(builder.ops):,} ops")
    timeline = sequence(builder.ops, Network(topology), fine.slot_bytes(size_bytes), options.timing)
    # The rings are a heuristic: the whole is at best feasible, never proven optimal.
    status = combined_status([Status.FEASIBLE, *(r.status for r in node_results)])
    method = f"{node_results[0].method}+{rail_method}"
    facts = {"composed_from": "allgather", "over_nodes": over_nodes}
    scratch = builder.scratch
    sched = Schedule(name=f"{collective.name}-over-nodes", collective=fine, topology=topology.name,
                     ops=timeline.ops, scratch=scratch if any(scratch) else (),
                     meta={"synthesized_by": "collc.synthesize", "method": method, "status": status.value,
                           "chunks": fine.chunks, "estimate_s": timeline.seconds, "over_nodes": True})
    return Result(sched, method, status, deadline.elapsed(), timeline.seconds, sched.num_steps,
                  sum(r.variables for r in node_results), sum(r.constraints for r in node_results), fine.chunks,
                  facts)


def _rail_rings(topology: Topology, groups: NodeGroups, chunks: int, progress: Progress
                ) -> tuple[list[Schedule], list[Topology]]:
    """A ring AllReduce on each rail's sub-topology, `chunks` slots per block, and the
    sub-topologies."""
    rails: list[Schedule] = []
    subs: list[Topology] = []
    for l in range(groups.size):
        progress.stage(f"allreduce over nodes: rail {l + 1} of {groups.size} ({groups.count} GPUs)")
        subs.append(sub_topology(topology, groups.rail(l), f"rail {l}"))
        try:
            rails.append(ring_allreduce(subs[-1], chunks))
        except NoRing as exc:
            raise NotOverNodes(str(exc)) from None
    return rails, subs


def batch_count(slots: int, rail_ops_per_gpu: int, node_ops_per_gpu_batch: int, budget_batches: int) -> int:
    """How many batches a node reduces (and gathers) a piece in: about as many as keep a
    GPU's node-level ops within its rail ops, and within the op budget; one at least."""
    return max(1, min(slots, budget_batches, rail_ops_per_gpu // max(1, node_ops_per_gpu_batch)))


@dataclass(frozen=True)
class RailTimes:
    """A rail schedule run alone (collc.synthesis.timing.replay_times), every node-level
    sum ready from the start: need[rank][slot], when the rank first needs its own value
    of the slot (see `needs`); final[rank][slot], when the slot's result is complete
    there; slot_s, the time a rank's transfers take each on average (the pace at which
    the rail uses slots)."""

    need: list[list[float]]
    final: list[list[float]]
    slot_s: float


def rail_times(rail: Schedule, network: Network, slot_bytes: float, slots: int) -> RailTimes:
    start, finish = replay_times(rail.ops, network, slot_bytes)
    ranks = rail.collective.ranks
    end = max(finish, default=0.0)
    need = [[end] * slots for _ in range(ranks)]  # a slot the rail never uses: needed last
    for i, rank, slot in needs(rail.ops):
        need[rank][slot] = min(need[rank][slot], start[i])
    final = [[0.0] * slots for _ in range(ranks)]
    transfers = 0
    for i, op in enumerate(rail.ops):
        transfers += op.is_transfer
        if op.dst.buffer is Buffer.OUTPUT:
            final[op.dst.rank][op.dst.index] = max(final[op.dst.rank][op.dst.index], finish[i])
    return RailTimes(need, final, end * ranks / max(1, transfers))


def node_times(node: int, times: list[RailTimes], rail_places: list[list[int]]
               ) -> tuple[list[float], list[float]]:
    """By place of a piece: when node `node` first needs its sum on any of its rails,
    and when the last of its rails has finished it (the node is rank `node` of every
    rail)."""
    slots = len(rail_places[0])
    need, final = [float("inf")] * slots, [0.0] * slots
    for t, place in zip(times, rail_places):
        for slot, p in enumerate(place):
            need[p] = min(need[p], t.need[node][slot])
            final[p] = max(final[p], t.final[node][slot])
    return need, final


def cut_by_key(key: Sequence[float], per_place: float, lag: float, widest: int,
               order: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Ranges [lo, hi) of places, in the order the node makes them: each starts from the
    most urgent place left (least key) and grows, one neighbour at a time (the more
    urgent one), to at most `widest` places, while the node, making them one after
    another at `per_place` seconds a place, still finishes the range within `lag` of
    its first place's key. A place needed at once comes alone, so the rails start
    after a node has made one place, not a whole batch; once the node is ahead of the
    rails the ranges widen. `order`: the places by key, where the caller has them."""
    size = len(key)
    origin = min(key, default=0.0)
    taken = [False] * size
    out: list[tuple[int, int]] = []
    made = 0.0  # when the node has made the ranges so far, from the origin
    for s in order if order is not None else sorted(range(size), key=lambda p: (key[p], p)):
        if taken[s]:
            continue
        room = key[s] - origin + lag - made
        width = min(widest, max(1, int(room / per_place))) if per_place > 0 else widest
        taken[s] = True
        lo, hi = s, s + 1
        while hi - lo < width:
            below = lo - 1 if lo > 0 and not taken[lo - 1] else -1
            above = hi if hi < size and not taken[hi] else -1
            if below < 0 and above < 0:
                break
            p = above if below < 0 or (above >= 0 and (key[above], above) < (key[below], below)) else below
            taken[p] = True
            lo, hi = min(lo, p), max(hi, p + 1)
        out.append((lo, hi))
        made += (hi - lo) * per_place
    return out


def batches_for(key: Sequence[float], per_place: float, count: int) -> list[tuple[int, int]]:
    """`cut_by_key` within `count` ranges, its lag and widest range chosen for the least
    lag + widest x per_place: the lag delays the rails, and a wide range's transfer
    holds a node's links that long (a gathering one, started, keeps the next batch's
    reductions waiting). Widths from the even split's to twice it are tried, each with
    the least lag (to a hundredth of a place's time) that keeps within `count`."""
    size = len(key)
    order = sorted(range(size), key=lambda p: (key[p], p))
    even = -(-size // max(1, count))
    span = max(key, default=0.0) - min(key, default=0.0) + per_place * size
    best: tuple[float, float, int] | None = None
    for widest in range(even, min(size, 2 * even) + 1):
        lo, hi = 0.0, max(span, per_place)
        if len(cut_by_key(key, per_place, hi, widest, order)) > count:
            continue
        while hi - lo > per_place / 100:
            mid = (lo + hi) / 2
            if len(cut_by_key(key, per_place, mid, widest, order)) <= count:
                hi = mid
            else:
                lo = mid
        cost = hi + widest * per_place
        if best is None or cost < best[0]:
            best = (cost, hi, widest)
    if best is None:  # no range wider than twice the even split fits: the even split
        return cut_by_key(key, per_place, span, even, order)
    return cut_by_key(key, per_place, best[1], best[2], order)


def batches_by_need(need: Sequence[float], per_place: float, count: int) -> list[tuple[int, int]]:
    """A node's reduction batches, in the order the rails first need them."""
    return batches_for(need, per_place, count)


def batches_by_finish(final: Sequence[float], per_place: float, count: int) -> list[tuple[int, int]]:
    """A node's gathering batches, in the order the rails finish them: cut backwards in
    time from the end, so the batch the rails finish last is narrow and the pipeline's
    drain short."""
    return batches_for([-t for t in final], per_place, count)[::-1]


@dataclass
class _NodePart:
    rs: Part
    ag: Part


def _node_parts(topology: Topology, groups: NodeGroups, size_bytes: int, options: SynthesisOptions,
                synthesize_part: Callable[[Topology, Collective, int, SynthesisOptions], Result]
                ) -> tuple[list[_NodePart], list[Result]]:
    """Each node's ReduceScatter and AllGather (`node_schedules`)."""
    g = groups.size
    parts, results = node_schedules(topology, groups, size_bytes, options, synthesize_part,
                                    (standard(CollectiveKind.REDUCESCATTER, g, 1), allgather(g, 1)))
    return [_NodePart(rs, ag) for rs, ag in parts], results


def node_schedules(topology: Topology, groups: NodeGroups, size_bytes: int, options: SynthesisOptions,
                   synthesize_part: Callable[[Topology, Collective, int, SynthesisOptions], Result],
                   collectives: Sequence[Collective]) -> tuple[list[list[Part]], list[Result]]:
    """Each node's schedules of `collectives` (on its GPUs, in node order): synthesized on
    the first node and reused with its names renamed wherever a node's sub-topology is
    the first one's renamed, else synthesized for that node. Returns per node one part
    per collective, and the synthesis results, the collectives' in turn for each node
    synthesized."""
    made: list[tuple[set[tuple], str, list[Result]]] = []
    out: list[list[Part]] = []
    for n, prefix in enumerate(groups.prefixes):
        sub = sub_topology(topology, groups.ranks[n], f"node {prefix}")
        found = None
        for links, base, results in made:
            rename = _prefix_rename(base, prefix)
            if _link_set(sub) == {(rename(a), rename(b), *rest) for a, b, *rest in links}:
                found = (results, rename)
                break
        if found is None:
            results = [synthesize_part(sub, coll, size_bytes, options) for coll in collectives]
            made.append((_link_set(sub), prefix, results))
            found = (results, lambda x: x)
        results, rename = found
        out.append([Part(r.schedule.ops, r.schedule.scratch, rename) for r in results])
    return out, [r for _, _, results in made for r in results]


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


class OpsBuilder:
    """A cluster's ops as a composition over nodes builds them: the list (dependencies
    point backwards in it), the scratch slots each rank has handed out, and how many of
    the ops run along the rails."""

    def __init__(self, ranks: int):
        self.ops: list[Op] = []
        self._scratch = [0] * ranks
        self.rail_ops = 0

    @property
    def scratch(self) -> tuple[int, ...]:
        return tuple(self._scratch)

    def _add(self, kind: OpKind, src: Loc, dst: Loc, count: int, deps: Iterable[int], step: int,
             route: tuple[str, ...]) -> int:
        i = len(self.ops)
        self.ops.append(Op.make(i, kind, src, dst, count, tuple(sorted(set(deps))), step, route, None))
        return i


class _Builder(OpsBuilder):
    """The cluster's ops, phase by phase, in an order their dependencies respect."""

    def __init__(self, ranks: int):
        super().__init__(ranks)
        self._reductions_end = 0  # a step past every node-level reduction's

    def _scratch_base(self, sub_scratch: tuple[int, ...], rank_of: Sequence[int], width: int) -> list[int]:
        """Fresh scratch for one embedded sub-schedule: each sub-slot a range of `width`."""
        base = []
        for r, full in enumerate(rank_of):
            base.append(self._scratch[full])
            if r < len(sub_scratch):
                self._scratch[full] += sub_scratch[r] * width
        return base

    def reductions(self, groups: NodeGroups, parts: list[_NodePart], batches: list[list[tuple[int, int]]],
                   slots: int) -> list[list[list[int]]]:
        """Step 1, node n's batches (ranges of places) in the priority order of
        `batches[n]`. Returns done[n][l][b]: the op that completes batch b of piece l at
        node n's GPU l."""
        done: list[list[list[int]]] = []
        for n, part in enumerate(parts):
            rs, rank_of = part.rs, groups.ranks[n]
            horizon = 1 + max((op.step for op in rs.ops), default=0)
            node_done = [[-1] * len(batches[n]) for _ in rank_of]
            for b, (lo, hi) in enumerate(batches[n]):
                width = hi - lo
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
                                  b * horizon + op.step, tuple(map(rs.rename, op.route)))
                    new[op.id] = i
                    self._reductions_end = max(self._reductions_end, b * horizon + op.step + 1)
                    if op.dst.buffer is Buffer.OUTPUT:
                        node_done[op.dst.rank][b] = i
            done.append(node_done)
        return done

    def rails(self, groups: NodeGroups, rails: list[Schedule], batches: list[list[tuple[int, int]]], slots: int,
              done: list[list[list[int]]], rail_places: list[list[int]]) -> list[list[list[int]]]:
        """Step 2, each rail's ops with their own priorities. Returns final[l][n][p]: the
        op after which node n's GPU l holds place p of piece l reduced over the cluster."""
        batch_of = [[0] * slots for _ in batches]  # [node][place]
        for n, node_batches in enumerate(batches):
            for b, (lo, hi) in enumerate(node_batches):
                for p in range(lo, hi):
                    batch_of[n][p] = b
        final: list[list[list[int]]] = []
        for l, rail in enumerate(rails):
            rank_of = groups.rail(l)
            place = rail_places[l]
            base = self._scratch_base(rail.scratch, rank_of, 1)
            offset = l * slots

            def ready(x: Loc) -> int:
                return done[x.rank][l][batch_of[x.rank][place[x.index]]]

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
                        last[m][p] = done[m][l][batch_of[m][p]]
            final.append(last)
        return final

    def gathers(self, groups: NodeGroups, parts: list[_NodePart], batches: list[list[tuple[int, int]]],
                slots: int, final: list[list[list[int]]]) -> None:
        """Step 3. Its ops come after every reduction in priority: where a node's links
        have both to do, the reductions feed the rails (on dgx_h100(nodes=32), gathering
        first delayed them until the rails idled: 1.154 of the bound against ...)."""
        after = self._reductions_end
        for n, part in enumerate(parts):
            ag, rank_of = part.ag, groups.ranks[n]
            horizon = 1 + max((op.step for op in ag.ops), default=0)
            for b, (lo, hi) in enumerate(batches[n]):
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
