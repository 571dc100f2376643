"""AllToAll over the rails of identical nodes, for runtimes that take few peers per GPU.

A flow that sends each block straight to its destination's rail (NCCL's PXN: over
NVLink to the local GPU on the destination's rail, then over that GPU's NIC) gives every
GPU N - 1 network peers and g - 1 NVLink peers: 134 on 128 DGX H100 nodes, and the
MSCCL executor keeps 130 threadblocks resident, one per peer at least. The flow
restricted to four fifths of that (collc.synthesis.steady.replicated_flow) relays the
farthest 30 nodes' blocks through a node in between: 1.24 of the bound. Relaying just
enough of them (k >= 4 of the 127 rail peers) would cost only k / 127 more on the
rails, but the executor's other limits forbid it: a GPU's NVLink sends to one peer are
strided in its input (one block per destination node, about 128 steps per peer), which
with 64 steps per threadblock puts at least 14 threadblocks on NVLink beside 127 - k on
the rails, so k >= 11 (1.09) before counting receives.

Here a node pair's blocks travel together instead. Unit k of the node pair at offset d
(source node n, destination node m = n + d) is the g x |H| blocks from the g GPUs of n
to the GPUs H of m; it goes over one rail rho(d, k):

Row by row (a row: the g blocks, one from each GPU of n, for one GPU h of m):

1. gather: every GPU (n, l) sends its block for (m, h) to the relay (n, rho) over
   NVLink, into the row's place in the relay's scratch (the relay copies its own);
2. rail: the relay sends the row to (m, rho) over its NIC, one op;
3. scatter: (m, rho) sends the row to (m, h) over NVLink, one op: it lands in
   consecutive output slots (blocks from the GPUs of n). The row for (m, rho) itself
   lands in its output straight from the rail, and comes last.

The rail sends row i while the relay gathers row i + 1 and the far relay scatters row
i - 1. (Gathering a source's blocks for node m in one op, consecutive in its input,
would need the scatter to take one op per block, and a unit to cross the rail whole
before any of it is scattered: 1.13 of the bound on 9 nodes, against 1.02.)

Units are dealt to the rails in turn, rho(d, k) = ((d - 1) u + k) mod g, so in each
round every rail carries one unit from every node to the node at one offset (a
permutation: no NIC receives two units at once) and a GPU's network peers are the
nodes at the offsets of its rail's units: about 2 (N - 1) u / g. The rails' loads
differ by at most one unit: the busiest carries ceil((N - 1) u / g) units where the
mean is (N - 1) u / g, which on 128 nodes of 8 GPUs at u = 1 is 16 against 15.875
(0.8 % over the bound). u is the fewest units per node pair (a divisor of g) whose
busiest rail is within BALANCE_SLACK of the best that keeps the peers within the
runtime's limit; at u = g and rho = h this is PXN itself.

NVLink carries each block twice (gather and scatter) at 9 times a NIC's bandwidth on
dgx_h100, so the rails stay the bottleneck; the pipeline's fill and drain is one
row's gather and scatter. Used where the runtime's peer limit is below the direct
flow's peers (the driver passes it as `peer_limit`); elsewhere the flow is as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from math import ceil

from collc.ir.collective import Collective, CollectiveKind, alltoall
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Topology
from collc.synthesis.candidates import Result
from collc.synthesis.network import Network
from collc.synthesis.nodes import NodeGroups, node_groups
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.plan import Status
from collc.synthesis.progress import Progress
from collc.synthesis.signals import NoRails
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import sequence

METHOD = "rails"
# A plan with more units per node pair is taken only if its busiest rail is more than
# this much less loaded: every unit more adds network peers and rail ops.
BALANCE_SLACK = 0.01


@dataclass(frozen=True)
class RailPlan:
    """Which rail carries each unit of each node pair (see the module docstring)."""

    nodes: int  # N
    size: int  # g, GPUs per node (rails)
    units: int  # u, units per node pair: a divisor of g

    def rail(self, offset: int, unit: int) -> int:
        return ((offset - 1) * self.units + unit) % self.size

    def round(self, offset: int, unit: int) -> int:
        """Which of its rail's units this is, in the order each relay sends them."""
        return ((offset - 1) * self.units + unit) // self.size

    def rows(self, unit: int) -> range:
        """The destination node's GPUs (local indices) whose blocks the unit carries."""
        width = self.size // self.units
        return range(unit * width, (unit + 1) * width)

    @property
    def rounds(self) -> int:
        return ceil((self.nodes - 1) * self.units / self.size)

    @property
    def rail_load_over_mean(self) -> float:
        """The busiest NIC's units over the mean (each NIC sends and receives as many)."""
        mean = (self.nodes - 1) * self.units / self.size
        return self.rounds / mean

    def offsets(self, rail: int) -> set[int]:
        return {d for d in range(1, self.nodes) for k in range(self.units) if self.rail(d, k) == rail}

    @property
    def network_peers(self) -> int:
        """Most nodes a GPU sends to or receives from over its rail."""
        n = self.nodes
        return max(len(ds | {(n - d) % n for d in ds}) for ds in map(self.offsets, range(self.size)))

    @property
    def peers(self) -> int:
        """Most GPUs a GPU exchanges data with: its node's and its rail's."""
        return self.size - 1 + self.network_peers


def choose_plan(nodes: int, size: int, peer_limit: int) -> RailPlan | None:
    """The fewest units per node pair whose busiest rail is within BALANCE_SLACK of the
    least loaded plan that keeps a GPU's peers within `peer_limit`; None if none does."""
    fitting = [p for p in (RailPlan(nodes, size, u) for u in range(1, size + 1) if size % u == 0)
               if p.peers <= peer_limit]
    if not fitting:
        return None
    best = min(p.rail_load_over_mean for p in fitting)
    return next(p for p in fitting if p.rail_load_over_mean <= best * (1 + BALANCE_SLACK))


def wanted(topology: Topology, collective: Collective, options: SynthesisOptions) -> tuple[NodeGroups, RailPlan] | None:
    """The nodes and plan for an AllToAll over the rails, or None where the direct flow
    is used: not an AllToAll of one slot per block at the collective's own chunks, no
    runtime peer limit, a limit the direct flow keeps to ((N - 1) + (g - 1) peers), no
    identical nodes, or no rail joining GPU l of every two nodes."""
    if (collective.kind is not CollectiveKind.ALLTOALL or options.peer_limit <= 0
            or options.chunks not in (0, collective.chunks)):
        return None
    groups = node_groups(topology)
    if groups is None:
        return None
    if groups.count - 1 + groups.size - 1 <= options.peer_limit:
        return None
    plan = choose_plan(groups.count, groups.size, options.peer_limit)
    if plan is None:
        return None
    reference = alltoall(collective.ranks, collective.chunks)
    if collective.inputs != reference.inputs or collective.outputs != reference.outputs:
        return None
    return groups, plan


class _Routes:
    """The route an op between two GPUs takes: fewest links, then the widest."""

    def __init__(self, network: Network):
        self.network = network
        self.chosen: dict[tuple[int, int], tuple[str, ...]] = {}

    def __call__(self, a: int, b: int) -> tuple[str, ...] | None:
        found = self.chosen.get((a, b))
        if found is None:
            indices = self.network.pair_routes.get((a, b))
            if not indices:
                return None
            routes = [self.network.routes[i] for i in indices]
            found = min(routes, key=lambda r: (r.hops, -r.bandwidth, r.index)).nodes
            self.chosen[(a, b)] = found
        return found


Slot = tuple[int, Buffer, int]  # rank, buffer, index
Pair = tuple[Slot, Slot]


def _loc(slot: Slot) -> Loc:
    return tuple.__new__(Loc, slot)


class _Builder:
    """The ops of the AllToAll, in an order whose dependencies point backwards."""

    def __init__(self, groups: NodeGroups, plan: RailPlan, chunks: int, routes: _Routes):
        self.groups, self.plan, self.chunks, self.routes = groups, plan, chunks, routes
        ranks = groups.count * groups.size
        self.ops: list[Op] = []
        self.scratch = [0] * ranks
        self.sent: dict[int, list[int]] = {}  # rail ops by sending relay, in the order sent

    def add(self, src: Loc, dst: Loc, count: int, deps: tuple[int, ...], step: int) -> int:
        route: tuple[str, ...] = ()
        if src.rank != dst.rank:
            found = self.routes(src.rank, dst.rank)
            if found is None:
                raise NoRails(f"no route from rank {src.rank} to rank {dst.rank} without another GPU")
            route = found
        op_id = len(self.ops)
        self.ops.append(Op.make(op_id, OpKind.COPY, src, dst, count, deps, step, route, None))
        return op_id

    def add_runs(self, pairs: Sequence[Pair], deps: tuple[int, ...], step: int) -> list[int]:
        """One op per run of slot pairs whose source and destination both advance by one
        slot within one buffer. Slots are plain tuples here (a million ops at 1,024 GPUs,
        several slots each): a `Loc` is made only for an op's two ends."""
        ids: list[int] = []
        run: list | None = None  # [source, destination, count]
        for src, dst in pairs:
            if run is not None:
                (sr, sb, si), (dr, db, di), count = run
                if (src[0] == sr and src[1] is sb and src[2] == si + count
                        and dst[0] == dr and dst[1] is db and dst[2] == di + count):
                    run[2] = count + 1
                    continue
                ids.append(self.add(_loc(run[0]), _loc(run[1]), count, deps, step))
            run = [src, dst, 1]
        if run is not None:
            ids.append(self.add(_loc(run[0]), _loc(run[1]), run[2], deps, step))
        return ids

    def blocks(self, rank: int) -> list[int]:
        """The slots of the block for (or from) `rank`."""
        return list(range(rank * self.chunks, (rank + 1) * self.chunks))

    def take(self, rank: int, slots: int) -> int:
        base = self.scratch[rank]
        self.scratch[rank] += slots
        return base

    def own_and_local(self, last_step: int) -> None:
        """Each GPU's own block (a local copy) and its node's blocks straight over NVLink,
        after every rail unit in priority: the NVLink links have time to spare."""
        c = self.chunks
        for node in self.groups.ranks:
            for a in node:
                self.add(Loc(a, Buffer.INPUT, a * c), Loc(a, Buffer.OUTPUT, a * c), c, (), 0)
                for b in node:
                    if b != a:
                        self.add(Loc(a, Buffer.INPUT, b * c), Loc(b, Buffer.OUTPUT, a * c), c, (), last_step)

    def unit(self, n: int, offset: int, k: int) -> None:
        """Unit k of the node pair (n, n + offset), row by row: a row is the g blocks for
        one destination GPU, so the rail sends the first row while the relay still
        gathers the next, and the far relay scatters each row as it arrives."""
        groups, plan, c = self.groups, self.plan, self.chunks
        g = groups.size
        m = (n + offset) % groups.count
        rho, first_row = plan.rail(offset, k), plan.round(offset, k) * (g // plan.units)
        out, inn = groups.ranks[n][rho], groups.ranks[m][rho]
        senders = sorted(range(g), key=lambda l: groups.ranks[n][l])  # a row's blocks in output order
        rows = sorted(plan.rows(k), key=lambda h: (h - rho - 1) % g)
        # The relay's scratch: row by row, every GPU's block in output order, its own
        # copied there from its input, so that a row crosses the rail as one op.
        base_out = self.take(out, len(rows) * g * c)
        far_rows = [h for h in rows if h != rho]
        base_in = self.take(inn, len(far_rows) * g * c)
        row_slots = [(l, x) for l in senders for x in range(c)]

        def gathered(row: int) -> list[Slot]:
            return [(out, Buffer.SCRATCH, base_out + row * g * c + i) for i in range(g * c)]

        gathers: list[list[int]] = []
        for row, h in enumerate(rows):
            target = groups.ranks[m][h]
            pairs = [((groups.ranks[n][l], Buffer.INPUT, target * c + x), slot)
                     for (l, x), slot in zip(row_slots, gathered(row))]
            gathers.append(self.add_runs(pairs, (), 3 * (first_row + row)))
        for row, h in enumerate(rows):
            target = groups.ranks[m][h]
            if target == inn:
                landing: list[Slot] = [(inn, Buffer.OUTPUT, groups.ranks[n][l] * c + x) for l, x in row_slots]
            else:
                first = base_in + far_rows.index(h) * g * c
                landing = [(inn, Buffer.SCRATCH, first + i) for i in range(g * c)]
            step = 3 * (first_row + row)
            sent = self.sent.setdefault(out, [])
            # Each rail op waits for the relay's rail op two before it: the NIC then sends
            # in this order (it is busy with the one before), and cannot send a later
            # round's row to a GPU whose own sender is a little late.
            deps = tuple(gathers[row]) + ((sent[-2],) if len(sent) >= 2 else ())
            rail = self.add_runs(list(zip(gathered(row), landing)), deps, step + 1)
            sent.extend(rail)
            if target != inn:
                self.add_runs([(src, (target, Buffer.OUTPUT, groups.ranks[n][l] * c + x))
                               for (l, x), src in zip(row_slots, landing)], tuple(rail), step + 2)


def synthesize_rails(topology: Topology, collective: Collective, size_bytes: int, groups: NodeGroups,
                     plan: RailPlan, options: SynthesisOptions, deadline: Deadline, progress: Progress) -> Result:
    """The AllToAll of the module docstring, list-scheduled on the whole cluster."""
    network = Network(topology)
    chunks = collective.chunks
    progress.stage(f"alltoall over rails: {groups.count} nodes of {groups.size}, {plan.units} unit(s) per node pair")
    builder = _Builder(groups, plan, chunks, _Routes(network))
    for n in range(groups.count):
        for offset in range(1, groups.count):
            for k in range(plan.units):
                builder.unit(n, offset, k)
    builder.own_and_local(3 * plan.rounds * (groups.size // plan.units))
    progress.stage(f"alltoall over rails: list-scheduling {len(builder.ops):,} ops")
    timeline = sequence(builder.ops, network, collective.slot_bytes(size_bytes), options.timing)
    scratch = tuple(builder.scratch)
    facts = {"rails": {"nodes": groups.count, "gpus_per_node": groups.size, "units_per_node_pair": plan.units,
                       "rounds": plan.rounds, "peers_per_gpu": plan.peers,
                       "rail_load_over_mean": round(plan.rail_load_over_mean, 6)}}
    sched = Schedule(name=f"{collective.name}-{METHOD}", collective=collective, topology=topology.name,
                     ops=timeline.ops, scratch=scratch if any(scratch) else (),
                     meta={"synthesized_by": "collc.synthesize", "method": METHOD, "status": Status.FEASIBLE.value,
                           "chunks": chunks, "estimate_s": timeline.seconds})
    # A structure, not a model: feasible, with no optimality claim.
    return Result(sched, METHOD, Status.FEASIBLE, deadline.elapsed(), timeline.seconds, sched.num_steps, 0, 0,
                  chunks, facts)

