"""Timing of schedules under the alpha-beta model, and step assignment from a timeline.

The model is the simulator's (collc.analysis.simulate, sharing "fifo"): a transfer
costs its route's summed latencies plus bytes over the route's bottleneck capacity, and
holds each link of the route for bytes over that link's capacity; an op starts when its
dependencies have finished; every link serves its transfers one at a time, in (step,
list position) order. Two uses here:

- `replay` times a finished schedule exactly that way (to compare candidates inside the
  pass without importing the analysis package);
- `sequence` list-schedules ops whose order is not yet fixed: whenever a link falls free
  it takes the ready transfer with the best priority, and the resulting timeline is
  written back as steps, so that the simulator's strict per-link order reproduces it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections import deque
from dataclasses import dataclass
from functools import cached_property
from itertools import chain, compress
from operator import add, attrgetter, le, not_
from typing import Sequence

import numpy as np

from collc.ir.schedule import Op, OpFields, make_ops
from collc.synthesis import ahead
from collc.synthesis.network import Network


@dataclass(frozen=True)
class TimingModel:
    # Bytes/s of a copy inside one GPU; 0 makes local copies free (the simulator's default).
    local_bandwidth: float = 0.0


DEFAULT_MODEL = TimingModel()


@dataclass(frozen=True)
class OpCost:
    links: tuple[int, ...]
    duration: float  # from start to the data being usable at the destination
    holds: tuple[float, ...]  # how long each link of the route stays busy: bytes / its capacity


def op_costs(ops: Sequence[Op], network: Network, slot_bytes: float,
             model: TimingModel = DEFAULT_MODEL) -> list[OpCost]:
    """Each op's cost. Ops of one (route, count, source rank, destination rank) share
    one: those keys are made and looked up by C-level maps, and a cost is worked out
    once per distinct key (a few hundred on the README's main job's 32,768 ops)."""
    return _costs(list(zip(map(_ROUTE, ops), map(_COUNT, ops), map(_SRC_RANK, ops), map(_DST_RANK, ops))),
                  network, slot_bytes, model)[0]


def _field_costs(fields: OpFields, network: Network, slot_bytes: float,
                 model: TimingModel) -> tuple[list[OpCost], list[OpCost]]:
    """`_costs` of ops given as fields."""
    return _costs(list(zip(fields.route, fields.count, map(_RANK, fields.src), map(_RANK, fields.dst))),
                  network, slot_bytes, model)


def _costs(keys: list[tuple[tuple[str, ...], int, int, int]], network: Network, slot_bytes: float,
           model: TimingModel) -> tuple[list[OpCost], list[OpCost]]:
    """The cost of each (route, count, source rank, destination rank) key, worked out
    once per distinct key; and the distinct costs."""
    best = {pair: rs[0] for pair, rs in network.pair_routes.items()}
    table: dict[tuple[tuple[str, ...], int, int, int], OpCost] = {}
    for key in dict.fromkeys(keys):
        table[key] = _cost(key, network, best, slot_bytes, model)
    return list(map(table.__getitem__, keys)), list(table.values())


def _cost(key: tuple[tuple[str, ...], int, int, int], network: Network, best: dict[tuple[int, int], int],
          slot_bytes: float, model: TimingModel) -> OpCost:
    """The cost of an op with `key`'s route (empty: the best route between its ranks),
    count and ranks."""
    route, count, src, dst = key
    nbytes = slot_bytes * count
    if src == dst:  # a local copy
        t = nbytes / model.local_bandwidth if model.local_bandwidth > 0 else 0.0
        return OpCost((), t, ())
    if route:
        links = tuple(network.link_index[(a, b)] for a, b in zip(route, route[1:]))
        lat = sum(network.links[l].latency for l in links)
        bw = min(network.links[l].capacity for l in links)
    else:
        r = network.routes[best[(src, dst)]]
        links, lat, bw = r.links, r.latency, r.bandwidth
    holds = tuple(nbytes / network.links[l].capacity for l in links)
    return OpCost(links, lat + nbytes / bw, holds)


def replay(ops: Sequence[Op], network: Network, slot_bytes: float,
           model: TimingModel = DEFAULT_MODEL) -> float:
    """Completion time of a schedule whose steps are final (strict per-link order)."""
    _, finish = replay_times(ops, network, slot_bytes, model)
    return max(finish, default=0.0)


def replay_times(ops: Sequence[Op], network: Network, slot_bytes: float,
                 model: TimingModel = DEFAULT_MODEL) -> tuple[list[float], list[float]]:
    """When each op (by list position) starts and finishes in the strict per-link replay
    of `replay`."""
    costs = op_costs(ops, network, slot_bytes, model)
    order = sorted(range(len(ops)), key=lambda i: (ops[i].step, i))
    pos = {op.id: i for i, op in enumerate(ops)}
    start = [0.0] * len(ops)
    finish = [0.0] * len(ops)
    link_free = [0.0] * len(network.links)
    for i in order:
        op, c = ops[i], costs[i]
        t = 0.0
        for d in op.deps:
            f = finish[pos[d]]
            if f > t:
                t = f
        for l in c.links:
            if link_free[l] > t:
                t = link_free[l]
        for l, hold in zip(c.links, c.holds):
            link_free[l] = t + hold
        start[i] = t
        finish[i] = t + c.duration
    return start, finish


class Timeline:
    """A list-scheduled run: its completion time under the model, and the ops in start
    order, renumbered 0..n-1, with final steps. The ops are made on first use: a search
    times many candidates and keeps one, and giving every op its step and a fresh copy
    costs about half as much again as scheduling them."""

    def __init__(self, ops: OpFields, order: list[int], start: list[float], costs: list[OpCost]):
        self._source = (ops, order, start, costs)
        # Every op is in `order` (else `sequence` raised): the latest finish of all.
        self.seconds = max(map(add, start, map(_DURATION, costs)), default=0.0)

    @cached_property
    def ops(self) -> tuple[Op, ...]:
        ops, order, start, costs = self._source
        out, _ = _assign_steps(ops, order, start, costs)
        self._source = None
        return out


# How deep a freed link looks into its queue for a transfer whose other links are free.
SCAN_DEPTH = 64
# ... and how many startable ones it offers the matching.
CANDIDATES_PER_LINK = 16
# Instants (of links falling free, ops becoming ready) between two yields of
# `sequence_steps`: about 15 ms of work on the README's main job, so that work begun on
# an incumbent that a newer one replaces stops soon (collc.synthesis.ahead).
INSTANTS_PER_STEP = 256


def sequence(ops: Sequence[Op], network: Network, slot_bytes: float,
             model: TimingModel = DEFAULT_MODEL) -> Timeline:
    """List-schedule `ops` (priority: their current step, then list position) and return
    them in start order, renumbered, with steps that make the strict per-link replay
    reproduce this timeline. Dependencies must point backwards in the list.

    Event-driven: at every instant a link falls free or an op becomes ready, the free
    links take queued transfers whose links are all free (see `_dispatch`)."""
    return ahead.finish(sequence_steps(ops, network, slot_bytes, model))


def sequence_steps(ops: Sequence[Op], network: Network, slot_bytes: float,
                   model: TimingModel = DEFAULT_MODEL) -> ahead.Steps[Timeline]:
    """`sequence` in steps of INSTANTS_PER_STEP instants, for work begun ahead of a
    solve's end."""
    return sequence_fields_steps(OpFields.of(ops), network, slot_bytes, model)


def sequence_fields_steps(ops: OpFields, network: Network, slot_bytes: float,
                           model: TimingModel = DEFAULT_MODEL) -> ahead.Steps[Timeline]:
    """`sequence_steps` of ops given as fields (collc.synthesis.extract.copy_fields_steps
    makes them so: the scheduler needs a few of them, and makes the final ops)."""
    n = len(ops)
    costs, distinct_costs = _field_costs(ops, network, slot_bytes, model)
    pos = dict(zip(ops.id, range(n)))
    deps_of = ops.deps
    pending = list(map(len, deps_of))
    # Each op's successors, in list order: succ_at[succ_from[i]:succ_from[i + 1]] (one
    # sort of the dependencies, not an append per one).
    dep_at = np.fromiter(map(pos.__getitem__, chain.from_iterable(deps_of)), dtype=np.int64)
    owners = np.repeat(np.arange(n, dtype=np.int64), pending)
    succ_at = owners[np.argsort(dep_at, kind="stable")].tolist()
    succ_from = np.concatenate(([0], np.cumsum(np.bincount(dep_at, minlength=n)))).tolist()
    # Priorities as ints: op i's rank in (step, list position) order, so that the queues
    # compare ints, not tuples (the list is usually in that order already: the ranks are
    # then the positions). `op_at[p]` is the op of priority p.
    steps = ops.step
    if all(map(le, steps, steps[1:])):
        key = op_at = list(range(n))
    else:
        op_at = sorted(range(n), key=lambda i: (steps[i], i))
        key = [0] * n
        for p, i in enumerate(op_at):
            key[i] = p
    ready_at = [0.0] * n
    start = [0.0] * n
    link_free = [0.0] * len(network.links)
    queue: list[list[int]] = [[] for _ in network.links]  # priorities, sorted
    events: list[tuple[float, int, int]] = []  # (time, kind, payload): 0 op ready, 1 link free
    events.extend((0.0, 0, i) for i in compress(range(n), map(not_, pending)))
    heapq.heapify(events)
    order: list[int] = []
    eps = 1e-15
    # A link that only single-link transfers use: its best queued transfer is the only
    # one the dispatch could start on it, so it need not scan the queue.
    single = [True] * len(network.links)
    for c in distinct_costs:
        if len(c.links) >= 2:
            for l in c.links:
                single[l] = False
    # No transfer uses two links or more (no switch, as on dgx1): at each instant every
    # free link takes its best queued transfer (what `_dispatch` then comes to).
    every_single = all(single)
    # Work each link still has to do: the links with most left are fed first (by the
    # matching of `_dispatch`: not needed where every link is single).
    remaining = [0.0] * len(network.links)
    if not every_single:
        for c in costs:
            for l, hold in zip(c.links, c.holds):
                remaining[l] += hold
    links_of = list(map(_LINKS, costs))
    push, pop = heapq.heappush, heapq.heappop  # bound once: called for every op and link

    def begin(i: int, t: float) -> None:
        start[i] = t
        order.append(i)
        c = costs[i]
        p = key[i]
        for l, hold in zip(c.links, c.holds):
            remaining[l] -= hold
            free = t + hold
            link_free[l] = free
            push(events, (free, 1, l))
            q = queue[l]
            k = bisect_left(q, p)
            if k < len(q) and q[k] == p:
                del q[k]
        f = t + c.duration
        for j in succ_at[succ_from[i]:succ_from[i + 1]]:
            if f > ready_at[j]:
                ready_at[j] = f
            pending[j] -= 1
            if pending[j] == 0:
                push(events, (ready_at[j], 0, j))

    instants = 0
    while events:
        instants += 1
        if instants == INSTANTS_PER_STEP:
            instants = 0
            yield
        t = events[0][0]
        limit = t + eps
        touched: set[int] = set()
        local: list[int] = []
        while events and events[0][0] <= limit:
            _, kind, x = pop(events)
            if kind == 0:
                links = links_of[x]
                if not links:
                    local.append(x)
                    continue
                p = key[x]
                for l in links:
                    insort(queue[l], p)
                    touched.add(l)
            else:
                touched.add(x)
        for i in sorted(local):
            begin(i, t)
        if every_single:
            for p in sorted([queue[l][0] for l in touched if queue[l] and link_free[l] <= limit]):
                begin(op_at[p], t)
            continue
        for i in _dispatch(t, touched, queue, op_at, links_of, link_free, remaining, single):
            begin(i, t)
    if len(order) != n:
        raise RuntimeError("ops form a dependency cycle")
    return Timeline(ops, order, start, costs)


def _dispatch(t: float, touched: set[int], queue: list[list[int]], op_at: list[int], links_of: list[tuple[int, ...]],
              link_free: list[float], remaining: list[float], single: list[bool]) -> list[int]:
    """Ops to start at t: a set using every free link at most once. Transfers over one
    link are taken greedily by priority; those through switches (a first link into the
    fabric, a last link out of it: a crossbar) by a maximum bipartite matching, so that
    a switch port never idles for want of a better pairing. Queues hold priorities;
    `op_at` gives the op of each."""
    limit = t + 1e-15
    cands: dict[int, int] = {}  # op -> its priority
    for l in touched:
        if link_free[l] > limit:
            continue
        q = queue[l]
        if not q:
            continue
        if single[l]:
            # Only transfers over this link alone queue here: the first is startable
            # and the greedy pass below would take it and reject the rest.
            cands[op_at[q[0]]] = q[0]
            continue
        found = 0
        for key in (q if len(q) <= SCAN_DEPTH else q[:SCAN_DEPTH]):
            i = op_at[key]
            if i in cands:
                found += 1
            else:
                for m in links_of[i]:
                    if link_free[m] > limit:
                        break
                else:
                    cands[i] = key
                    found += 1
            if found >= CANDIDATES_PER_LINK:
                break
    if not cands:
        return []
    # Transfers over one link are taken greedily in priority order; of those through
    # switches only the best of each (first link, last link) pair can be matched.
    singles: list[tuple[int, int]] = []
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    for i, key in cands.items():
        links = links_of[i]
        if len(links) >= 2:
            # Through a switch (or a chain of switches and NICs): pair the first link
            # (into the fabric) with the last (out of it).
            ab = (links[0], links[-1])
            have = pairs.get(ab)
            if have is None or key < have[0]:
                pairs[ab] = (key, i)
        else:
            singles.append((key, i))
    chosen: list[int] = []
    used: set[int] = set()
    if singles:
        singles.sort()
        for _, i in singles:
            (l,) = links_of[i]
            if l not in used:
                chosen.append(i)
                used.add(l)
    if not pairs:
        return chosen
    adj: dict[int, list[tuple[int, int, int]]] = {}
    for (a, b), (key, i) in pairs.items():
        if a in used or b in used:
            continue
        adj.setdefault(a, []).append((key, b, i))
    for a in adj:
        adj[a].sort()
    owner: dict[int, tuple[int, int]] = {}  # down-link -> (up-link, op)

    def augment(a: int, seen: set[int]) -> bool:
        for _, b, i in adj[a]:
            if b in seen:
                continue
            seen.add(b)
            if b not in owner or augment(owner[b][0], seen):
                owner[b] = (a, i)
                return True
        return False

    # The links with the most work left choose first.
    for a in sorted(adj, key=lambda a: (-remaining[a], a)):
        augment(a, set())
    # Links inside the fabric may be shared by pairs the matching treated as apart.
    for i in sorted((i for _, i in owner.values()), key=cands.__getitem__):
        links = links_of[i]
        if not used.intersection(links):
            chosen.append(i)
            used.update(links)
    return sorted(chosen, key=cands.__getitem__)


def _assign_steps(ops: OpFields, order: list[int], start: list[float],
                  costs: list[OpCost]) -> tuple[tuple[Op, ...], float]:
    """The ops in start order, renumbered 0..n-1, each with the least step that is at
    least its start over the quantum (the shortest positive duration), one more than
    each dependency's and no less than that of the op before it on each of its links;
    and the timeline's end.

    Those rules are a longest path through the ops in start order (a dependency and a
    link's previous op both start earlier), solved on arrays: every step starts at its
    start over the quantum and is raised to what its predecessors ask, pass after pass,
    until none asks more. A list-scheduled timeline mostly satisfies them already: on
    the README's main job (32,768 ops) the first pass finds nothing to raise. Where the
    passes would not settle soon (a long chain of raised steps), the rest is done op by
    op in start order (`_raised_in_order`): the same least steps either way."""
    n = len(ops)
    if n == 0:
        return (), 0.0
    durations = np.fromiter(map(_DURATION, costs), dtype=float, count=len(costs))
    positive = durations[durations > 0]
    quantum = float(positive.min()) if len(positive) else 1.0
    at = np.asarray(order, dtype=np.int64)  # start order -> list position
    start_arr = np.asarray(start, dtype=float)
    end = float((start_arr + durations).max())
    # The same float operations as int(start / quantum + 1e-9), op by op (starts are >= 0).
    base = (start_arr[at] / quantum + 1e-9).astype(np.int64)
    placed = ops.placed(order)
    dep_lists = placed.deps
    dep_counts = np.fromiter(map(len, dep_lists), dtype=np.int64, count=n)
    dep_ids = np.fromiter(chain.from_iterable(dep_lists), dtype=np.int64, count=int(dep_counts.sum()))
    # A dependency's place in start order, from its op id (ids need not be 0..n-1).
    ids = np.fromiter(placed.id, dtype=np.int64, count=n)
    by_id = np.argsort(ids, kind="stable")
    found = np.searchsorted(ids, dep_ids, sorter=by_id)
    dep_at = by_id[np.minimum(found, n - 1)]
    if len(dep_ids) and (found.max() >= n or not np.array_equal(ids[dep_at], dep_ids)):
        raise KeyError("an op depends on an op that is not in the list")
    dep_of = np.repeat(np.arange(n, dtype=np.int64), dep_counts)
    if np.any(dep_at >= dep_of):
        raise KeyError("an op depends on one that starts after it")
    link_lists = [costs[i].links for i in order]
    link_counts = np.fromiter(map(len, link_lists), dtype=np.int64, count=n)
    links = np.fromiter(chain.from_iterable(link_lists), dtype=np.int64, count=int(link_counts.sum()))
    link_of = np.repeat(np.arange(n, dtype=np.int64), link_counts)
    # For each (op, link) pair, the op before it on that link in start order.
    by_link = np.lexsort((link_of, links))
    same = links[by_link][1:] == links[by_link][:-1]
    after, before = link_of[by_link][1:][same], link_of[by_link][:-1][same]
    # New dependency ids: places in start order; one dependency as a 1-tuple made in C.
    new_deps: list[tuple[int, ...]] = [()] * n
    single = dep_counts == 1
    if single.all():
        new_deps = list(zip(dep_at.tolist()))
    else:
        first = np.cumsum(dep_counts) - dep_counts
        deque(map(new_deps.__setitem__, np.flatnonzero(single).tolist(),
                  zip(dep_at[first[single]].tolist())), maxlen=0)
        for k in np.flatnonzero(dep_counts > 1).tolist():
            new_deps[k] = tuple(sorted(dep_at[first[k]:first[k] + dep_counts[k]].tolist()))
    settled = _least_steps(base, dep_of, dep_at, after, before)
    steps = settled.tolist() if settled is not None else _raised_in_order(base, new_deps, link_lists)
    # The ops made field by field in C (make_ops), not one Op.make call each.
    out = make_ops(n, range(n), placed.kind, placed.src, placed.dst, placed.count, new_deps, steps,
                   placed.route, placed.origin)
    return tuple(out), end


# Passes of `_least_steps` before the steps are raised op by op (`_raised_in_order`).
# Each pass costs a few array operations over every op and rule: where a long chain of
# raised steps would need many (19 on dgx2's AllReduce at 1 MiB), the single pass op
# by op is cheaper at scale than waiting for the passes to settle.
STEP_PASSES = 3


def _least_steps(base: np.ndarray, dep_of: np.ndarray, dep_at: np.ndarray, after: np.ndarray,
                 before: np.ndarray) -> np.ndarray | None:
    """The least steps >= `base` with steps[dep_of] >= steps[dep_at] + 1 and steps[after]
    >= steps[before], by passes over every rule at once; None if STEP_PASSES do not
    settle them."""
    steps = base
    for _ in range(STEP_PASSES):
        raised = steps.copy()
        np.maximum.at(raised, dep_of, steps[dep_at] + 1)
        np.maximum.at(raised, after, steps[before])
        if np.array_equal(raised, steps):
            return steps
        steps = raised
    return None


def _raised_in_order(base: np.ndarray, deps: list[tuple[int, ...]], link_lists: list[tuple[int, ...]]) -> list[int]:
    """`_least_steps` op by op in start order (`deps`: each op's dependencies' places in
    that order; `link_lists`: its links): every rule points back in that order, so one
    pass settles them all."""
    steps = base.tolist()
    link_last: dict[int, int] = {}
    for k, (before, links) in enumerate(zip(deps, link_lists)):
        step = steps[k]
        for d in before:
            if steps[d] >= step:
                step = steps[d] + 1
        for l in links:
            last = link_last.get(l, 0)
            if last > step:
                step = last
        for l in links:
            link_last[l] = step
        steps[k] = step
    return steps


_COUNT, _ROUTE, _DURATION, _RANK, _SRC_RANK, _DST_RANK, _LINKS = map(
    attrgetter, ("count", "route", "duration", "rank", "src.rank", "dst.rank", "links"))
