"""The ring order behind the builtin `ring[k]`, found the way NCCL searches rings.

Two GPUs are neighbours when a link joins them directly or a path through switches and
NICs only (no other GPU) does; the pair's speed is that path's bottleneck capacity.
The ring is a Hamiltonian cycle over the GPUs in this neighbour graph that keeps its
slowest hop as fast as possible: speeds are tried from the fastest down, and at each
one a bounded backtracking search (starting at rank 0, faster and lower-ranked
neighbours first, pruned when some GPU could no longer be entered or left) looks for a
cycle using hops at least that fast. If none is found the ring is rank order.
Deterministic: the same topology always gives the same ring.
"""

from __future__ import annotations

import heapq
from functools import lru_cache

from collc.ir.graphs import mask_members, mask_of, strongly_connected
from collc.ir.topology import NodeKind, Topology

# Extensions of a partial cycle the search may try per speed level before giving up.
SEARCH_BUDGET = 20_000


def gpu_neighbours(topology: Topology) -> dict[int, dict[int, float]]:
    """rank -> {rank: bytes/s}: the widest path from one GPU to another that passes only
    through switches and NICs (a direct link counts)."""
    gpus = topology.gpus
    out: dict[int, dict[int, float]] = {}
    for g in gpus:
        best: dict[str, float] = {g.name: float("inf")}
        reached: dict[int, float] = {}
        heap: list[tuple[float, str]] = [(-float("inf"), g.name)]
        while heap:
            neg, name = heapq.heappop(heap)
            width = -neg
            if width < best.get(name, 0.0):
                continue
            node = topology.node(name)
            if node.kind is NodeKind.GPU and name != g.name:
                reached[node.rank] = width
                continue  # a path may not pass through another GPU
            for link in topology.out_links[name]:
                w = min(width, link.capacity)
                if w > best.get(link.dst, 0.0):
                    best[link.dst] = w
                    heapq.heappush(heap, (-w, link.dst))
        out[g.rank] = reached
    return out


@lru_cache(maxsize=64)
def find_ring(topology: Topology) -> tuple[int, ...]:
    """Ranks in ring order (see the module docstring)."""
    n = topology.num_ranks
    if n <= 2:
        return tuple(range(n))
    neighbours = gpu_neighbours(topology)
    speeds = sorted({w for row in neighbours.values() for w in row.values()}, reverse=True)
    for speed in speeds:
        out_adj = {a: [b for b, w in sorted(row.items(), key=lambda kv: (-kv[1], kv[0])) if w >= speed]
                   for a, row in neighbours.items()}
        hops = [(a, b) for a, bs in out_adj.items() for b in bs]
        if len({a for a, _ in hops} | {b for _, b in hops}) < n or not strongly_connected(n, hops):
            continue  # some GPU has no hop this fast, or cannot reach every other
        cycle = _hamiltonian_cycle(out_adj, n)
        if cycle is not None:
            return tuple(cycle)
    return tuple(range(n))


def ring_speed(topology: Topology, ring: tuple[int, ...]) -> float:
    """The slowest hop of a ring (bytes/s), 0 if some hop has no path."""
    neighbours = gpu_neighbours(topology)
    hops = zip(ring, ring[1:] + ring[:1])
    return min((neighbours[a].get(b, 0.0) for a, b in hops), default=0.0)


def _hamiltonian_cycle(out_adj: dict[int, list[int]], n: int) -> list[int] | None:
    greedy = _greedy_cycle(out_adj)
    if greedy is not None:
        return greedy
    # Sets of GPUs as bit masks (bit v: GPU v), so that the viability check of each step
    # is a few big-integer operations per GPU, not set intersections: on 1,024 GPUs
    # (dgx_h100(nodes=128), about 134 hops a GPU) 8 ms a step as sets, most of a 9 s search.
    out_mask = {a: mask_of(bs) for a, bs in out_adj.items()}
    in_mask = dict.fromkeys(out_adj, 0)
    for a, bs in out_adj.items():
        for b in bs:
            in_mask[b] |= 1 << a
    start = 0
    path = [start]
    remaining = set(out_adj) - {start}
    left = mask_of(remaining)  # `remaining` as a mask
    stack = [iter(out_adj[start])]
    budget = SEARCH_BUDGET
    while stack:
        advanced = False
        for nxt in stack[-1]:
            if nxt not in remaining:
                continue
            budget -= 1
            if budget < 0:
                return None
            remaining.discard(nxt)
            left &= ~(1 << nxt)
            if _viable(nxt, start, remaining, left, in_mask, out_mask):
                path.append(nxt)
                if not remaining:
                    if (out_mask[nxt] >> start) & 1:
                        return path
                    path.pop()
                    remaining.add(nxt)
                    left |= 1 << nxt
                    continue
                stack.append(iter(out_adj[nxt]))
                advanced = True
                break
            remaining.add(nxt)
            left |= 1 << nxt
        if not advanced:
            stack.pop()
            if len(path) > 1:
                back = path.pop()
                remaining.add(back)
                left |= 1 << back
    return None


def _greedy_cycle(out_adj: dict[int, list[int]]) -> list[int] | None:
    """The search's first path when it never backtracks: from GPU 0, always the first
    unvisited neighbour. If that closes into a cycle through every GPU, it is what the
    search returns (each prefix of a path that does close passes `_viable`, so the
    search takes the same first candidate at every step, at a budget of one per step)
    without the search's O(GPUs) viability check per step."""
    if len(out_adj) - 1 > SEARCH_BUDGET:
        return None
    path = [0]
    seen = {0}
    while len(path) < len(out_adj):
        nxt = next((b for b in out_adj[path[-1]] if b not in seen), None)
        if nxt is None:
            return None
        path.append(nxt)
        seen.add(nxt)
    return path if 0 in out_adj[path[-1]] else None


def _viable(current: int, start: int, remaining: set[int], left: int, in_mask: dict[int, int],
            out_mask: dict[int, int]) -> bool:
    """Can the path still close? Every unvisited GPU (`remaining`; `left`, the same as a
    mask) needs a way in and a way out. `in_mask[v]`, `out_mask[v]`: the GPUs with a hop
    to v, and those v has a hop to."""
    if not left:
        return True
    if not in_mask[start] & left:
        return False
    if not out_mask[current] & left:
        return False
    enter = left | 1 << current
    leave = left | 1 << start
    for u in remaining:
        if not in_mask[u] & enter or not out_mask[u] & leave:
            return False
    # Every unvisited GPU must still be reachable from the path's end through unvisited
    # GPUs (otherwise the path has walled part of the graph off).
    seen = 1 << current
    frontier = [current]
    while frontier:
        reached = 0
        for v in frontier:
            reached |= out_mask[v]
        new = reached & left & ~seen
        seen |= new
        frontier = mask_members(new)
    return seen == enter


# Children a tree node takes before others are allowed more: NCCL's trees are binary.
TREE_FANOUT = 2


@lru_cache(maxsize=64)
def find_tree(topology: Topology, root: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A spanning tree of the GPUs rooted at `root` whose edges are neighbour pairs (so
    every tree edge is a real path): (order, parent). `order` lists ranks root first,
    each after its parent; `parent[r]` is r's parent (-1 for the root).

    Built breadth first so the tree is shallow: each node, in the order it joined,
    adopts up to TREE_FANOUT unreached neighbours, fastest first (then lowest rank).
    GPUs that a binary tree cannot reach this way (few neighbours) are adopted by the
    shallowest reached neighbour, whatever its fan-out."""
    n = topology.num_ranks
    neighbours = gpu_neighbours(topology)
    parent = [-1] * n
    depth = {root: 0}
    order = [root]
    head = 0
    while len(order) < n:
        if head < len(order):
            node = order[head]
            head += 1
            ranked = sorted(neighbours[node].items(), key=lambda kv: (-kv[1], kv[0]))
            for child, _ in [kv for kv in ranked if kv[0] not in depth][:TREE_FANOUT]:
                parent[child], depth[child] = node, depth[node] + 1
                order.append(child)
            continue
        # Every reached node has its fan-out: let the shallowest one with an unreached
        # neighbour take it.
        candidates = [(depth[a], -w, b, a) for a in order for b, w in neighbours[a].items() if b not in depth]
        if not candidates:
            break  # the rest cannot be reached; the collective's reachability check reports it
        _, _, child, node = min(candidates)
        parent[child], depth[child] = node, depth[node] + 1
        order.append(child)
        head = order.index(child)
    return tuple(order), tuple(parent)
