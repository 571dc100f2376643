"""The cut bound with latency: what crosses a cut, and when each link can carry it.

The cut bound (collc.analysis.bounds) counts bytes alone: slot x f(S) bytes must leave
the node set S, over links of total capacity B_out(S), so T >= slot x f(S) / B_out(S).
In the alpha-beta model of the simulator a link is not usable for the whole of T:

- a transfer holds each link of its route from its start s for bytes / capacity, and
  its data is usable at the route's end at s + (the route's latency) + bytes /
  (its bottleneck), which is later than the hold ends plus the route's latency;
- it starts only once its data is at the route's first GPU, at least the least
  latency of a path from a holder of the data to that GPU after 0;
- what crosses the cut for a requirement must still reach a needer outside S, at
  least the least latency from the route's end to one of them before T.

So link i out of S carries required data only within a window of length T - P_i,
where P_i is the least latency of a path from a holder (of a requirement crossing S)
over link i to a needer outside S, and

    sum over links i leaving S of  capacity_i x max(0, T - P_i)  >=  slot x f(S).

The smallest such T is the bound (it is at least the cut bound plus the least P_i).
The holders and needers are those of every requirement crossing S, paired freely: a
weaker P_i, still a valid one.

A requirement with several needers outside S (a multicast) is tighter still: a byte
that leaves S once must reach every one of them from the link's head, through a GPU
(switches and NICs do not copy), so its window closes earlier; a byte that leaves
twice uses two windows, and each of its copies must then reach its own needer late,
through the few links that lead there quickly enough (`late_entry_capacity`).
`multicast_window_bound` takes all of this into account.

On the README's `fan_out` at 1 MiB (rank 0's 512 KiB chunk to GPUs 4 and 5 of the
other server) the cut bound is 10.49 us. The links out of rank 0's server are its four
NICs at 12.5 GB/s. Through rank 0's own NIC a byte reaches one of the two destinations
2.6 us after it is sent and both 4.0 us after; through another GPU's NIC 1.4 us later
(the hop to that GPU). With the windows alone no schedule finishes before 14.84 us;
bytes sent twice in the last 1.4 us reach GPUs 4 and 5 only through their own NICs,
and with that no schedule finishes before 15.19 us (1.45 x the cut bound; a fluid
schedule reaches it, docs/lower-bounds.md).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from collc.ir.topology import Topology


def window_bound(capacities: np.ndarray, delays: np.ndarray, volume: float) -> float:
    """The least T with sum capacity_i x max(0, T - delay_i) >= volume (0 for no volume)."""
    if volume <= 0 or not len(capacities):
        return 0.0
    order = np.argsort(delays, kind="stable")
    cap, delay = capacities[order], delays[order]
    rate, weighted = 0.0, 0.0  # capacity of the links open so far, and their sum of capacity x delay
    for i in range(len(cap)):
        rate += cap[i]
        weighted += cap[i] * delay[i]
        t = (volume + weighted) / rate
        if i + 1 == len(cap) or t <= delay[i + 1]:
            return float(t)
    return float("inf")  # not reached: the last link always closes the loop


def _multi_source(topology: Topology, seeds: dict[str, float], reverse: bool) -> dict[str, float]:
    """Least seed value plus latency from any seed to every node (to it, where
    `reverse`): Dijkstra from all seeds at once, each starting at its value."""
    adjacency: dict[str, list[tuple[str, float]]] = {}
    for link in topology.links:
        a, b = (link.dst, link.src) if reverse else (link.src, link.dst)
        adjacency.setdefault(a, []).append((b, link.latency))
    dist: dict[str, float] = {}
    fringe = sorted((d, name) for name, d in seeds.items())
    heapq.heapify(fringe)
    while fringe:
        d, v = heapq.heappop(fringe)
        if v in dist:
            continue
        dist[v] = d
        for w, lat in adjacency.get(v, ()):
            if w not in dist:
                heapq.heappush(fringe, (d + lat, w))
    return dist


@dataclass(frozen=True)
class Crossing:
    """A requirement that must leave the set: GPUs inside that hold it, GPUs outside
    that need it (node names)."""

    holders: tuple[str, ...]
    needers: tuple[str, ...]


# Above this many crossing requirements (or needers) only the one-needer windows are
# computed: the multicast windows take a Dijkstra per needer.
MULTICAST_LIMIT = 64


def latency_cut_bound(topology: Topology, inside: set[str], volume: float, crossings: list[Crossing]) -> float:
    """The bound above for the node set `inside` and `volume` bytes that must leave it
    for the requirements `crossings`."""
    if volume <= 0 or not crossings:
        return 0.0
    holders = sorted({h for c in crossings for h in c.holders})
    needers = sorted({d for c in crossings for d in c.needers})
    from_holders = _multi_source(topology, dict.fromkeys(holders, 0.0), reverse=False)
    to_needers = _multi_source(topology, dict.fromkeys(needers, 0.0), reverse=True)
    leaving = [link for link in topology.links if link.src in inside and link.dst not in inside]
    caps, first, last = [], [], []
    reaches = multicast_reach(topology, crossings)
    every = _every_needer_windows(topology, leaving, crossings, reaches) if reaches is not None else None
    late = late_entry_capacity(topology, inside, leaving, crossings, reaches) if reaches is not None else np.inf
    for k, link in enumerate(leaving):
        before = from_holders.get(link.src, np.inf)
        after = to_needers.get(link.dst, np.inf)
        if np.isfinite(before) and np.isfinite(after):
            caps.append(link.capacity)
            first.append(before + link.latency + after)
            last.append(every[k] if every is not None else before + link.latency + after)
    if not caps:
        return 0.0
    if every is None:
        return window_bound(np.array(caps), np.array(first), volume)
    return multicast_window_bound(np.array(caps), np.array(first), np.array(last), volume, late)


@dataclass(frozen=True)
class MulticastReach:
    """Latencies of multicast requirements: from every node to each needer, and per
    requirement (in order) the reach of every node: the least latency from it to
    *every* needer of the requirement through one GPU that copies."""

    to_needer: dict[str, dict[str, float]]
    reach: list[dict[str, float]]


def multicast_reach(topology: Topology, crossings: list[Crossing]) -> MulticastReach | None:
    """The latencies above, where each requirement has two needers or more outside
    (None otherwise, or above MULTICAST_LIMIT requirements or needers).

    Switches and NICs do not copy, so a byte first reaches one GPU w, and every needer
    d no earlier than dist(v, w) + dist(w, d): the reach of v is the least, over GPUs w,
    of dist(v, w) plus w's largest distance to a needer."""
    needers = sorted({d for c in crossings for d in c.needers})
    if (any(len(c.needers) < 2 for c in crossings) or len(crossings) > MULTICAST_LIMIT
            or len(needers) > MULTICAST_LIMIT):
        return None
    to_each = {d: _multi_source(topology, {d: 0.0}, reverse=True) for d in needers}
    gpus = [g.name for g in topology.gpus]
    reaches = []
    for c in crossings:
        farthest = {w: max(to_each[d].get(w, np.inf) for d in c.needers) for w in gpus}
        reaches.append(_multi_source(topology, {w: f for w, f in farthest.items() if np.isfinite(f)}, reverse=True))
    return MulticastReach(to_each, reaches)


def _every_needer_windows(topology: Topology, leaving: list, crossings: list[Crossing],
                          reaches: MulticastReach) -> list[float]:
    """Per leaving link, the least latency from a holder over the link to *every*
    needer outside of one requirement: a byte that leaves the set once reaches all of
    its needers outside from the link's head."""
    out = [np.inf] * len(leaving)
    for c, reach in zip(crossings, reaches.reach):
        from_holders = _multi_source(topology, dict.fromkeys(c.holders, 0.0), reverse=False)
        for k, link in enumerate(leaving):
            p = from_holders.get(link.src, np.inf) + link.latency + reach.get(link.dst, np.inf)
            out[k] = min(out[k], p)
    return out


def multicast_window_bound(capacities: np.ndarray, first: np.ndarray, last: np.ndarray, volume: float,
                           late_capacity: float = np.inf) -> float:
    """The least T at which the links can carry `volume` bytes of multicast data out of
    the set: a byte that leaves once uses link i within its every-needer window (T -
    last_i); a byte that leaves twice or more (to reach its needers separately) uses
    two link windows of at most T - first_i, and such bytes are at most `late_capacity`
    in all (`late_entry_capacity`). So T must allow sum_i x_i + L >= volume with
    x_i <= c_i (T - last_i), x_i + y_i <= c_i (T - first_i), L <= sum_i y_i / 2 and
    L <= late_capacity."""
    def carried(t: float) -> float:
        once = capacities * np.clip(t - last, 0.0, None)
        any_ = capacities * np.clip(t - first, 0.0, None)
        once = np.minimum(once, any_)
        return float(once.sum() + min((any_ - once).sum() / 2, late_capacity))

    lo, hi = 0.0, float(max(last.max(), first.max()) + 2 * volume / capacities.sum() + 1.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        if carried(mid) >= volume:
            hi = mid
        else:
            lo = mid
    return hi


# Sets around a needer tried by late_entry_capacity: the needer with the nodes at most
# this many distinct latencies away from it.
LATE_ENTRY_SETS = 8


def late_entry_capacity(topology: Topology, inside: set[str], leaving: list, crossings: list[Crossing],
                        reaches: MulticastReach | None = None) -> float:
    """The most bytes of multicast requirements that can leave the set only *late*:
    no copy of them leaves early enough to reach every needer outside, so each needer
    gets a copy of its own (np.inf where not bounded).

    Take such a byte and a needer d. Its copy to d last leaves the set over some link i
    at t (link times as in the windows above: a byte on a link at t is at the link's head
    at t + the link's latency), and being late, t > T - lat_i - reach(i's head), where
    reach(v) is the least latency from v to every needer through one GPU that copies.
    From there the copy stays outside and reaches d by T. For a node set U around d
    that the set does not meet, the copy enters U over a link e (i itself where i's head
    is in U), at a time te > T - phi(e's tail), phi(x) = the most over leaving links i of
    reach(i's head) - dist(i's head, x), and te <= T - lat_e - dist(e's head, d). So e
    carries such copies within a window of length phi(e's tail) - lat_e - dist(e's head, d)
    (for a leaving link, reach(e's head) - dist(e's head, d)), and the late bytes of a
    requirement are at most, for each of its needers and each U, the sum of c_e times
    that window over the links into U. On the README's fan_out the copies that leave in
    the last 1.4 us reach GPUs 4 and 5 only through their own NICs: 1.4 us of one
    12.5 GB/s link, where counting each such byte twice on the leaving links allowed
    four (docs/lower-bounds.md).

    Summed over the requirements, each bounded alone (those sharing a needer share its
    links: the sum is valid, if loose). Above MULTICAST_LIMIT needers or requirements,
    or where a requirement has fewer than two needers outside, not bounded."""
    reaches = reaches or multicast_reach(topology, crossings)
    if reaches is None or not leaving:
        return np.inf
    heads = sorted({link.dst for link in leaving})
    total = 0.0
    for c, reach in zip(crossings, reaches.reach):
        seeds = {h: -reach[h] for h in heads if h in reach}
        if not seeds:
            return np.inf
        # phi(x) = max_i reach(head_i) - dist(head_i, x) = -(least of -reach(head_i) + dist(head_i, x)).
        potential = _multi_source(topology, seeds, reverse=False)
        total += min(_entry_capacity(topology, inside, reach, potential, reaches.to_needer[d])
                     for d in c.needers)
        if not np.isfinite(total):
            return np.inf
    return total


def _entry_capacity(topology: Topology, inside: set[str], reach: dict[str, float], potential: dict[str, float],
                    to_d: dict[str, float]) -> float:
    """The least, over node sets U of a needer and the nodes nearest it (U_r: the nodes
    outside the set within latency r of it, for its LATE_ENTRY_SETS smallest r), of the
    capacity times window of the links into U for late copies (late_entry_capacity)."""
    links = topology.links
    tail_in = np.array([link.src in inside for link in links])
    head_in = np.array([link.dst in inside for link in links])
    to_head = np.array([to_d.get(link.dst, np.inf) for link in links])
    to_tail = np.where(tail_in, np.inf, [to_d.get(link.src, np.inf) for link in links])
    window = np.where(tail_in, [reach.get(link.dst, -np.inf) for link in links],
                      [-potential.get(link.src, np.inf) - link.latency for link in links]) - to_head
    carried = np.array([link.capacity for link in links]) * np.clip(window, 0.0, None)
    radii = sorted({v for n, v in to_d.items() if n not in inside})[:LATE_ENTRY_SETS]
    best = np.inf
    for r in radii:
        into = (to_head <= r) & ~head_in & (to_tail > r)
        best = min(best, float(carried[into].sum()))
    return best
