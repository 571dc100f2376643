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
weaker P_i, still a valid one. On the README's `fan_out` at 1 MiB (a chunk from rank 0
to two GPUs of the other server) the cut bound is 10.49 us; the links out of rank 0's
server are its four NICs, rank 0's own 2.6 us from the destinations' server and the
other three 4.0 us (the hop to their GPU first), so no schedule finishes before 14.14 us.
"""

from __future__ import annotations

import heapq

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


def _multi_source(topology: Topology, sources: list[str], reverse: bool) -> dict[str, float]:
    """Least latency from any of `sources` to every node (to, where `reverse`)."""
    adjacency: dict[str, list[tuple[str, float]]] = {}
    for link in topology.links:
        a, b = (link.dst, link.src) if reverse else (link.src, link.dst)
        adjacency.setdefault(a, []).append((b, link.latency))
    dist: dict[str, float] = {}
    fringe = [(0.0, name) for name in sorted(sources)]
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


def latency_cut_bound(topology: Topology, inside: set[str], volume: float,
                      holders: list[str], needers: list[str]) -> float:
    """The bound above for the node set `inside`, `volume` bytes that must leave it,
    the GPUs (node names) inside that hold them and the GPUs outside that need them."""
    if volume <= 0 or not holders or not needers:
        return 0.0
    from_holders = _multi_source(topology, holders, reverse=False)
    to_needers = _multi_source(topology, needers, reverse=True)
    caps, delays = [], []
    for link in topology.links:
        if link.src in inside and link.dst not in inside:
            before = from_holders.get(link.src, np.inf)
            after = to_needers.get(link.dst, np.inf)
            if np.isfinite(before) and np.isfinite(after):
                caps.append(link.capacity)
                delays.append(before + link.latency + after)
    if not caps:
        return 0.0
    return window_bound(np.array(caps), np.array(delays), volume)
