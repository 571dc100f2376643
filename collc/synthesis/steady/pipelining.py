"""From rates to a pipelined plan: every class's data cut into chunks, dealt to its
trees (or paths) in proportion to their shares, and ordered so that the list scheduler
(collc.synthesis.timing) keeps the pipeline full."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from dataclasses import dataclass
from itertools import repeat
from typing import Callable, TypeVar

import numpy as np

from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, Transfer
from collc.synthesis.problem import Problem
from collc.synthesis.ahead import Steps, finish, solve_ahead
from collc.synthesis.solver import INF, Deadline, Model, Outcome, Result, SolverOptions, solve
from collc.synthesis.steady.solution import NotApplicable, RateSolution

# Branch-and-bound nodes for rounding shares to whole chunks (a work limit, not a time
# limit, keeps the answer independent of the machine).
ROUNDING_NODES = 500
# Rounded counts that load the busiest link within this fraction of T need no MILP.
ROUNDED_AT_T = 1e-9
# A transfer whose receiver forwards the data (an inner edge of its tree) is ordered this
# share of T ahead of its pace. A forwarding rank's outgoing links can only send what
# has arrived: on dgx2(chassis=2) the ranks that relay are those whose incoming link is
# loaded to exactly T and whose outgoing link to 97% of it, so data to be relayed that
# arrives on pace leaves the outgoing link idle in the middle and behind at the end
# (1.042 x the bound at 64 chunks; with the lead, 1.0001). Leaves feed nothing and keep
# their pace. Measured 0.05-0.5 on dgx2(chassis=2): 0.2 and up reach the bound at 32 and 64
# chunks; on dgx_h100(nodes=2 or 4) 0.2 is as good as none or better, 1.0 worse.
RELAY_LEAD = 0.2

# Chunks per structure (tree or path), for each class of commodities.
Counts = dict[tuple, list[int]]
T = TypeVar("T")


def apportion(total: int, weights: list[float]) -> list[int]:
    """Whole numbers proportional to `weights` that add up to `total` (largest remainder)."""
    s = sum(weights)
    if total <= 0 or s <= 0:
        return [0] * len(weights)
    exact = [total * w / s for w in weights]
    out = [int(math.floor(e)) for e in exact]
    rest = total - sum(out)
    order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - out[i]), i))
    for i in order[:rest]:
        out[i] += 1
    return out


def whole_counts(problem: Problem, rates: RateSolution, sizes: dict[tuple, int], options: SolverOptions,
                 deadline: Deadline) -> dict[tuple, list[int]]:
    """Chunks per tree (or path), whole numbers adding up to each class's chunks, that
    load the busiest link least: a small MILP, warm-started from rounding each share."""
    rounding = _Rounding(problem.network, problem.slot_bytes, rates, sizes)
    if rounding.needless():
        return rounding.start
    return rounding.counts(rounding.solve(options, deadline))


def whole_counts_ahead(problem: Problem, rates: RateSolution, sizes: dict[tuple, int], options: SolverOptions,
                       deadline: Deadline, work: Callable[[Counts], Steps[T]]) -> tuple[Counts, T]:
    """`whole_counts` and `work` on them, the work begun on the MILP's incumbents while
    HiGHS proves the answer optimal (collc.synthesis.ahead): the same counts, and the
    same product as `finish(work(counts))`."""
    return _counts_ahead(problem.network, problem.slot_bytes, rates, sizes, options, deadline, work)


def _counts_ahead(network: Network, slot_bytes: float, rates: RateSolution, sizes: dict[tuple, int],
                  options: SolverOptions, deadline: Deadline, work: Callable[[Counts], Steps[T]]) -> tuple[Counts, T]:
    """`whole_counts_ahead` of a problem on `network` with slots of `slot_bytes` and
    classes of `sizes` chunks: all the rounding MILP asks of the problem."""
    rounding = _Rounding(network, slot_bytes, rates, sizes)
    if rounding.needless():
        return rounding.start, finish(work(rounding.start))
    _, counts, product = solve_ahead(lambda on_incumbent: rounding.solve(options, deadline, on_incumbent),
                                     rounding.incumbent_counts, rounding.counts, work)
    return counts, product


class _Rounding:
    """The MILP of `whole_counts`: a column per (class, structure), a row per class (its
    chunks) and per link (its load at most z), z minimized; started from rounding each
    share (`start`)."""

    def __init__(self, net: Network, slot_bytes: float, rates: RateSolution, sizes: dict[tuple, int]):
        self.keys = keys = sorted(sizes)
        self.start = {key: apportion(sizes[key], [w for _, w in rates.shares[key]]) for key in keys}
        m = self.model = Model()
        self.z = z = m.add_var(0.0, INF, 1.0)
        self.cols: dict[tuple, list[int]] = {}
        per_link: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for key in keys:
            self.cols[key] = []
            for routes, _ in rates.shares[key]:
                j = m.add_var(0.0, float(sizes[key]), 0.0, integer=True)
                self.cols[key].append(j)
                for ri in routes:
                    for l in net.routes[ri].links:
                        per_link[l].append((j, slot_bytes / net.links[l].capacity / rates.seconds))
            m.add_row(self.cols[key], [1.0] * len(self.cols[key]), float(sizes[key]), float(sizes[key]))
        for l, terms in sorted(per_link.items()):
            merged: dict[int, float] = defaultdict(float)
            for j, v in terms:
                merged[j] += v
            m.add_row(list(merged) + [z], list(merged.values()) + [-1.0], -INF, 0.0)
        warm = self.warm = np.zeros(m.num_cols)
        for key in keys:
            warm[self.cols[key]] = self.start[key]
        warm[z] = 0.0
        loads: dict[int, float] = defaultdict(float)
        for l, terms in per_link.items():
            loads[l] = sum(v * warm[j] for j, v in terms)
        warm[z] = max(loads.values(), default=0.0)

    def needless(self) -> bool:
        """Rounding already loads no link above T: no whole counts can do better (the
        LP's T is the least over every mix of these trees), so the MILP is skipped."""
        return bool(self.warm[self.z] <= 1 + ROUNDED_AT_T)

    def solve(self, options: SolverOptions, deadline: Deadline,
              on_incumbent: Callable[[np.ndarray], None] | None = None) -> Result:
        # The node limit bounds this search; the deadline is only the pass's safety net.
        res = solve(self.model, time_limit=max(0.05, deadline.remaining()), options=options, start=self.warm,
                    node_limit=ROUNDING_NODES, work=deadline.work, on_incumbent=on_incumbent)
        if res.outcome is not Outcome.OPTIMAL and deadline.expired:
            deadline.work.time_limit_fired = True
        return res

    def counts(self, res: Result) -> Counts:
        """The counts a finished solve gives: the start unless it found a lower load."""
        if not res.has_solution or res.objective >= self.warm[self.z]:
            return self.start
        return self._rounded(res.values)

    def incumbent_counts(self, values: np.ndarray) -> Counts:
        """The counts an incumbent would give if it were the answer."""
        return self.start if values[self.z] >= self.warm[self.z] else self._rounded(values)

    def _rounded(self, values: np.ndarray) -> Counts:
        return {key: [int(round(values[j])) for j in self.cols[key]] for key in self.keys}


def structure_fill(net: Network, routes: tuple[int, ...], slot_bytes: float) -> float:
    """Seconds until one chunk sent alone down a tree or path (routes parents first) has
    reached every rank: each route starts once its sender holds the chunk and the links
    it shares with the structure's earlier routes are free again (a rank sending to two
    children waits for the first send's hold, not for its arrival)."""
    arrival = {net.routes[routes[0]].src: 0.0}
    link_free: dict[int, float] = {}
    last = 0.0
    for ri in routes:
        r = net.routes[ri]
        start = max([arrival.get(r.src, 0.0)] + [link_free.get(l, 0.0) for l in r.links])
        for l in r.links:
            link_free[l] = start + slot_bytes / net.links[l].capacity
        arrival[r.dst] = start + r.seconds(slot_bytes)
        last = max(last, arrival[r.dst])
    return last


def structure_beat(net: Network, routes: tuple[int, ...], slot_bytes: float) -> float:
    """Seconds a tree or path's busiest link is held per chunk: the interval at which it
    takes chunk after chunk once full."""
    held: dict[int, float] = defaultdict(float)
    for ri in routes:
        for l in net.routes[ri].links:
            held[l] += slot_bytes / net.links[l].capacity
    return max(held.values(), default=0.0)


def latency_counts(problem: Problem, rates: RateSolution, sizes: dict[tuple, int]) -> dict[tuple, list[int]]:
    """Chunks per structure that let every structure of a class finish together when
    latency counts: structure s with n chunks is done after about fill_s + (n - 1) x
    beat_s (`structure_fill`, `structure_beat`), and each chunk goes in turn to the
    structure that would finish it first. The rate LP's shares ignore latency: on the
    README's fan_out at 1 MiB the chunk for the other server leaves through rank 0's NIC
    1.4 us sooner than through the other three (a hop through NVSwitch first), so equal
    shares leave rank 0's NIC idle for the last 1.4 us. Links that several structures
    share are not counted: the caller times both dealings and keeps the faster."""
    net = problem.network
    out: dict[tuple, list[int]] = {}
    for key in sorted(sizes):
        structures = [routes for routes, _ in rates.shares[key]]
        fills = [structure_fill(net, routes, problem.slot_bytes) for routes in structures]
        beats = [structure_beat(net, routes, problem.slot_bytes) for routes in structures]
        counts = [0] * len(structures)
        # (finish with one more chunk, index): the index breaks ties, so the dealing is
        # the same on every machine.
        heap = [(fills[i], i) for i in range(len(structures))]
        heapq.heapify(heap)
        for _ in range(sizes[key]):
            _, i = heapq.heappop(heap)
            counts[i] += 1
            heapq.heappush(heap, (fills[i] + counts[i] * beats[i], i))
        out[key] = counts
    return out


def pipelined_plan(problem: Problem, rates: RateSolution, options: SolverOptions | None = None,
                   deadline: Deadline | None = None, latency_aware: bool = False) -> Plan:
    """Chunks of every class dealt to its trees (or paths) in proportion to their shares
    (`latency_aware`: by `latency_counts` instead).

    Each tree's chunks are spread evenly over the fluid time T: chunk j of n should be
    everywhere by (j + 1) / n x T. A transfer's order key is that target minus the
    longest chain of transfers still to follow it (its tail), so deep trees start early
    and every tree drains at the same moment; a transfer to a rank that forwards the data
    goes RELAY_LEAD x T earlier still, so that forwarding links never wait for data. The
    list scheduler then follows the keys."""
    return _plan(problem, rates, paced_transfers(problem, rates, options, deadline, latency_aware=latency_aware))


@dataclass(frozen=True)
class Refinement:
    """A problem refined from `base` to `chunks` per rank at `size_bytes`, made by
    `build` when first needed. The rounding MILP asks of it only its class sizes and
    its slot bytes, known from the base: a refined chunk keeps its chunk's holders and
    demand, so each class has chunks / base chunks times its chunks, in slots that many
    times smaller (`predicted`). On the README's main job the problem (4,096
    commodities, 30-50 ms with its classes) is then built by the first step of the
    work begun on the MILP's incumbents, while HiGHS runs; the prediction is checked
    against the problem built, and the MILP solved again from it where they differ."""

    base: Problem
    chunks: int
    size_bytes: int
    build: Callable[[], Problem]

    def predicted(self, rates: RateSolution) -> tuple[dict[tuple, int], float]:
        """(class sizes, slot bytes) of the refined problem."""
        coll = self.base.collective
        factor = self.chunks // coll.chunks
        sizes = {key: n * factor for key, n in class_sizes(self.base, rates).items()}
        return sizes, self.size_bytes / (factor * max(coll.in_chunks, coll.out_chunks, 1))


def pipelined_ahead(problem: Problem | Refinement, rates: RateSolution, options: SolverOptions, deadline: Deadline,
                    follow: Callable[[Plan], Steps[T]]) -> T:
    """`finish(follow(pipelined_plan(problem, rates, options, deadline)))`: the same
    product, with the plan and what follows it begun on the rounding MILP's incumbents
    while HiGHS proves its answer optimal (`whole_counts_ahead`); a `Refinement` is
    built by that work (or after the solve, where none was begun)."""
    made: list[Problem] = [problem] if isinstance(problem, Problem) else []

    def the_problem() -> Problem:
        if not made:
            assert isinstance(problem, Refinement)
            made.append(problem.build())
        return made[0]

    def from_counts(counts: Counts) -> Steps[T]:
        if not made:
            the_problem()
            yield
        paced = paced_transfers(the_problem(), rates, counts=counts)
        yield
        plan = _plan(the_problem(), rates, paced)
        yield
        return (yield from follow(plan))

    if rates.replicated or deadline.fired() or isinstance(problem, Problem):
        sizes = class_sizes(the_problem(), rates)
        if rates.replicated or deadline.fired():
            return finish(from_counts(_dealt(the_problem(), rates, sizes, options, deadline, False)))
        return whole_counts_ahead(the_problem(), rates, sizes, options, deadline, from_counts)[1]
    sizes, slot_bytes = problem.predicted(rates)
    _, product = _counts_ahead(problem.base.network, slot_bytes, rates, sizes, options, deadline, from_counts)
    built = the_problem()
    if class_sizes(built, rates) == sizes and built.slot_bytes == slot_bytes:
        return product
    return finish(from_counts(whole_counts(built, rates, class_sizes(built, rates), options, deadline)))


def _plan(problem: Problem, rates: RateSolution, paced: PacedTransfers) -> Plan:
    # Transfer(...) without its Python-level __new__: tuple.__new__ from C, per transfer.
    transfers = tuple(map(tuple.__new__, repeat(Transfer),
                          zip(paced.commodity.tolist(), paced.route.tolist(), range(len(paced.key)))))
    return Plan(problem, transfers, "steady", rates.status, 0, rates.stats,
                {"fluid_s": rates.seconds, "structures": sum(len(v) for v in rates.shares.values()),
                 "rate_model": rates.kind, "replicated": rates.replicated,
                 **({"most_peers_without_limit": rates.peers_without_limit, "max_peers_applied": rates.peers_limited}
                    if rates.peers_without_limit else {})})


@dataclass(frozen=True)
class PacedTransfers:
    """A pipelined plan's transfers in order, with the order key (seconds of fluid time)
    each was sorted by: columns of equal length."""

    key: np.ndarray
    commodity: np.ndarray
    route: np.ndarray


def paced_transfers(problem: Problem, rates: RateSolution, options: SolverOptions | None = None,
                    deadline: Deadline | None = None, lead: float | None = None,
                    latency_aware: bool = False, counts: Counts | None = None) -> PacedTransfers:
    """The transfers of `pipelined_plan`, sorted, with their order keys; a transfer to a
    rank that forwards goes `lead` x T ahead of its pace (None: RELAY_LEAD). `counts`:
    the chunks per structure already dealt (`whole_counts`), else dealt here."""
    lead = RELAY_LEAD if lead is None else lead
    net = problem.network
    slot = problem.slot_bytes
    seconds = [r.seconds(slot) for r in net.routes]
    by_class = _classes(problem)
    # Per structure: its routes, depths, positions and the part of the order key that
    # does not depend on the chunk (its tail and lead), as arrays.
    arrays: list[tuple[np.ndarray, ...]] = []
    placed: dict[tuple[int, ...], int] = {}  # a structure's routes -> its place in `arrays`
    ordered = rates.replicated > 0
    # Every commodity's structure (its place in `arrays`) and its target time: the
    # columns are gathered from those at the end.
    structure_of: list[int] = []
    due: list[float] = []
    commodity: list[int] = []
    sizes = class_sizes(problem, rates, by_class)
    whole = counts if counts is not None else _dealt(problem, rates, sizes, options, deadline, latency_aware)
    for key, coms in sorted(by_class.items()):
        structures = rates.shares[key]
        counts = whole[key]
        phase = _unicast_phase(key, problem.ranks) if rates.kind == "paths" else 1.0
        targets = sorted(((j + phase) / n, s_idx) for s_idx, n in enumerate(counts) for j in range(n))
        places: dict[int, int] = {}  # s_idx -> its place in `arrays`
        for k, (finish, s_idx) in zip(coms, targets):
            place = places.get(s_idx)
            if place is None:
                routes = structures[s_idx][0]
                place = placed.get(routes)
                if place is None:
                    place = placed[routes] = len(arrays)
                    arrays.append(_structure_arrays(net, routes, rates.depth[routes], seconds, rates.seconds,
                                                    ordered, lead))
                places[s_idx] = place
            structure_of.append(place)
            due.append(finish * rates.seconds)
            commodity.append(k)
    if not structure_of:
        empty = np.zeros(0, dtype=np.int64)
        return PacedTransfers(np.zeros(0), empty, empty)
    key_col, depth_col, pos_col, com_col, route_col = _gathered(arrays, structure_of, due, commodity)
    # Columns of (order key, depth, position in its structure, commodity, route), sorted
    # in that order. Among equal keys a structure's own order decides before the
    # commodity: replicated trees list a rank's children rotated by the rank's place, so
    # that the sources of a switch do not all send to the same destination first.
    order = np.lexsort((route_col, com_col, pos_col, depth_col, key_col))
    return PacedTransfers(key_col[order], com_col[order], route_col[order])


def _gathered(arrays: list[tuple[np.ndarray, ...]], structure_of: list[int], due: list[float],
              commodity: list[int]) -> tuple[np.ndarray, ...]:
    """Columns (order key, depth, position, commodity, route) of every commodity's
    transfers, commodity after commodity: a commodity of structure s due at T seconds
    has s's routes, depths and positions, and order keys T - tail - lead, route by route.
    Gathered from the structures' arrays laid end to end, not an array per commodity
    (4,096 commodities on the README's main job)."""
    lengths = np.array([len(a[0]) for a in arrays], dtype=np.int64)
    offsets = np.cumsum(lengths) - lengths
    route_flat, depth_flat, pos_flat, tail_flat, lead_flat = (np.concatenate([a[f] for a in arrays]) for f in range(5))
    s = np.asarray(structure_of, dtype=np.int64)
    per = lengths[s]  # transfers of each commodity
    first = np.cumsum(per) - per  # where each commodity's transfers begin in the columns
    at = np.repeat(offsets[s] - first, per) + np.arange(int(per.sum()), dtype=np.int64)
    key_col = np.repeat(np.asarray(due, dtype=float), per) - tail_flat[at] - lead_flat[at]
    return (key_col, depth_flat[at], pos_flat[at], np.repeat(np.asarray(commodity, dtype=np.int64), per),
            route_flat[at])


def _classes(problem: Problem) -> dict[tuple, list[int]]:
    """The commodities with demand, by class (computed once per problem: read only)."""
    return problem.classes


def class_sizes(problem: Problem, rates: RateSolution,
                 by_class: dict[tuple, list[int]] | None = None) -> dict[tuple, int]:
    """Chunks per class; every class must have structures in the rates."""
    by_class = _classes(problem) if by_class is None else by_class
    missing = [key for key in by_class if not rates.shares.get(key)]
    if missing:
        raise NotApplicable(f"the rate LP gave no route to class {missing[0]}")
    return {key: len(coms) for key, coms in by_class.items()}


def _dealt(problem: Problem, rates: RateSolution, sizes: dict[tuple, int], options: SolverOptions | None,
           deadline: Deadline | None, latency_aware: bool) -> Counts:
    """Each class's chunks dealt to its structures."""
    if latency_aware:
        return latency_counts(problem, rates, sizes)
    if rates.replicated:
        # Rounded alike for every source of an orbit, so that the replicated loads stay even.
        return {key: apportion(n, [w for _, w in rates.shares[key]]) for key, n in sizes.items()}
    if options is not None and deadline is not None and not deadline.fired():
        return whole_counts(problem, rates, sizes, options, deadline)
    return {key: apportion(n, [w for _, w in rates.shares[key]]) for key, n in sizes.items()}


def _unicast_phase(key: tuple, ranks: int) -> float:
    """Where in each of its rounds a unicast pair's chunks are due, in (0, 1].

    Every pair's data flows at a steady rate, so with the same target for all of them the
    list scheduler would serve them in commodity order: every source sending to rank 0
    first, then rank 1, and so on, each destination's incoming links taking all the
    senders at once (AllToAll on dgx_h100(nodes=32) at 1 chunk per pair: 1.20 x the
    bound). Staggering the pairs by the distance from source to destination makes each
    round a permutation, the classic shifted AllToAll: source s sends to s + 1 first,
    then s + 2, so no destination is sent to by two sources at once."""
    (source, (dest,)) = key[0], key[1]
    return ((dest - source - 1) % ranks + 1) / max(ranks - 1, 1)


def _structure_arrays(net: Network, routes: tuple[int, ...], depths: tuple[int, ...], seconds: list[float],
                      fluid_s: float, ordered: bool, lead: float) -> tuple[np.ndarray, ...]:
    """A structure's routes, depths, positions (all 0 unless `ordered`), tails and leads
    as arrays: a transfer to a rank that forwards (its tail longer than its own route)
    goes `lead` x T ahead of its pace."""
    route_arr = np.asarray(routes, dtype=np.int64)
    own_list = [seconds[r] for r in routes]
    if depths == tuple(range(1, len(routes) + 1)) and _is_chain(net, routes):
        # A path: each route's tail is its own time plus the rest of the path's, summed
        # from the end, in the order _tails would add them.
        tail_arr = np.cumsum(own_list[::-1])[::-1]
    else:
        tail_arr = np.asarray(_tails(net, routes, seconds), dtype=float)
    own = np.array(own_list, dtype=float)
    lead_arr = np.where(tail_arr > own * (1 + 1e-9), lead * fluid_s, 0.0)
    pos_arr = np.arange(len(routes), dtype=np.int64) if ordered else np.zeros(len(routes), dtype=np.int64)
    return route_arr, np.asarray(depths, dtype=np.int64), pos_arr, tail_arr, lead_arr


def _is_chain(net: Network, routes: tuple[int, ...]) -> bool:
    """Whether routes form one path that visits no rank twice."""
    ends = [net.routes[r] for r in routes]
    return (all(a.dst == b.src for a, b in zip(ends, ends[1:]))
            and len({e.dst for e in ends} | {ends[0].src}) == len(ends) + 1)


def pipeline_fill(net: Network, rates: RateSolution, slot_bytes: float) -> float:
    """Seconds from a structure's first send until its first chunk has reached every
    rank, the longest over the structures: about what the pipeline's fill and drain add
    to the fluid time T at this chunk size."""
    seconds = [r.seconds(slot_bytes) for r in net.routes]
    worst = 0.0
    every = rates.representative_structures or [routes for structures in rates.shares.values()
                                                  for routes, _ in structures]
    for routes in every:
        tails = _tails(net, routes, seconds)
        root = net.routes[routes[0]].src
        # The root sends to its children one after another, like every other rank.
        below, busy = 0.0, 0.0
        firsts = [i for i, r in enumerate(routes) if net.routes[r].src == root]
        for i in sorted(firsts, key=lambda i: -tails[i]):
            below = max(below, busy + tails[i])
            busy += seconds[routes[i]]
        worst = max(worst, below)
    return worst


def _tails(net: Network, routes: tuple[int, ...], seconds: list[float]) -> list[float]:
    """For each route of a tree or path (parents first), the time from its start until
    the chunk has reached every rank below it. A rank sends to its children one after
    another, so the sends ahead of a child in that order count too."""
    children: dict[int, list[int]] = defaultdict(list)  # position of a route -> its children's positions
    parent_pos = {net.routes[r].dst: i for i, r in enumerate(routes)}
    for i, r in enumerate(routes):
        p = parent_pos.get(net.routes[r].src)
        if p is not None:
            children[p].append(i)
    tail = [0.0] * len(routes)
    for i in range(len(routes) - 1, -1, -1):
        below, busy = 0.0, 0.0
        # Serve the deepest subtrees first: that order gives the shortest finish.
        for c in sorted(children[i], key=lambda c: -tail[c]):
            below = max(below, busy + tail[c])
            busy += seconds[routes[c]]
        tail[i] = seconds[routes[i]] + below
    return tail
