"""Trees that reach a subset of the ranks, relaying through the others (Steiner trees).

The tree-packing LP (collc.synthesis.steady) prices, for every source, the cheapest
tree that reaches its destinations. Where those are every rank (AllGather, Broadcast)
that is a spanning arborescence. Where they are a subset (a custom collective's
`deliver chunk(0, 1) to {4, 5}`), a tree over the destinations alone cannot relay
through another GPU: on a cluster whose GPUs each have their own NIC, the chunk would
cross one NIC whole while the cut bound counts all of them. A tree may therefore pass
through ranks outside the demand, which then hold the chunk in scratch and forward it.

The cheapest such tree is NP-hard to find; pricing only needs a good one (a column of
negative reduced cost), and the shortest-path heuristic (Takahashi and Matsuyama: grow
the tree from the root by the cheapest path to the nearest destination not yet
reached, over all ranks) finds the relays the link prices ask for. It is compared with
the arborescence over the destinations alone, and the cheaper is priced.
"""

from __future__ import annotations

import numpy as np

from collc.synthesis.arborescence import NoArborescence, min_arborescence


def all_pairs(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shortest path costs between ranks over the one-route costs `cost` (inf where no
    route), and each pair's next rank on such a path (Floyd-Warshall, one numpy pass per
    intermediate rank)."""
    n = cost.shape[0]
    dist = np.array(cost, dtype=float)
    np.fill_diagonal(dist, 0.0)
    nxt = np.tile(np.arange(n), (n, 1))
    for k in range(n):
        via = dist[:, k:k + 1] + dist[k:k + 1, :]
        better = via < dist * (1 - 1e-12)
        if better.any():
            dist = np.where(better, via, dist)
            nxt = np.where(better, nxt[:, k:k + 1], nxt)
    return dist, nxt


def steiner_parents(cost: np.ndarray, root: int, demand: tuple[int, ...]) -> dict[int, int]:
    """child -> parent of a tree from `root` that reaches every rank of `demand`, grown by
    the cheapest path from the tree to the nearest destination not yet in it; raises
    ValueError where a destination cannot be reached."""
    dist, nxt = all_pairs(cost)
    parent: dict[int, int] = {}
    in_tree = [root]
    left = [d for d in demand if d != root]
    while left:
        sub = dist[np.ix_(in_tree, left)]
        i, j = np.unravel_index(int(np.argmin(sub)), sub.shape)
        if not np.isfinite(sub[i, j]):
            raise ValueError(f"rank {left[j]} cannot be reached from rank {root}")
        u, d = in_tree[i], left[j]
        while u != d:  # walk the path, attaching each rank not yet in the tree
            v = int(nxt[u, d])
            if v not in parent and v != root:
                parent[v] = u
                in_tree.append(v)
            u = v
        left = [x for x in left if x not in parent]
    return parent


def tree_cost(cost: np.ndarray, parent: dict[int, int]) -> float:
    return float(sum(cost[p, c] for c, p in parent.items()))


def breadth_first(parent: dict[int, int], root: int) -> list[tuple[int, int, int]]:
    """(parent, child, depth) of every tree edge, parents before children, children in
    rank order (as collc.synthesis.steady.tree_routes lists a spanning tree)."""
    children: dict[int, list[int]] = {}
    for c, p in parent.items():
        children.setdefault(p, []).append(c)
    out: list[tuple[int, int, int]] = []
    frontier, depth = [root], 0
    while frontier:
        depth += 1
        nxt: list[int] = []
        for u in frontier:
            for v in sorted(children.get(u, ())):
                out.append((u, v, depth))
                nxt.append(v)
        frontier = nxt
    return out


def relayed_tree(grid: np.ndarray, nodes: tuple[int, ...], route_cost: np.ndarray
                 ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The cheaper of two trees from nodes[0] to the ranks nodes[1:]: the heuristic tree
    that may relay through any rank, and the minimum arborescence over `nodes` alone.
    `grid[u, v]` lists the routes from rank u to rank v (padded with len(route_cost)).
    Returns its routes, parents before children, and each receiver's depth; None where
    some destination cannot be reached at all."""
    costs = np.append(route_cost, np.inf)[grid]
    k = costs.argmin(axis=2)[..., None]
    cost = np.take_along_axis(costs, k, 2)[..., 0]
    best = np.take_along_axis(grid, k, 2)[..., 0]
    np.fill_diagonal(cost, np.inf)
    root = nodes[0]
    try:
        parent = steiner_parents(cost, root, nodes[1:])
    except ValueError:
        return None
    idx = np.asarray(nodes)
    try:
        within = min_arborescence(cost[np.ix_(idx, idx)], 0)
        direct = {int(idx[v]): int(idx[p]) for v, p in enumerate(within) if v}
        if tree_cost(cost, direct) <= tree_cost(cost, parent):
            parent = direct
    except NoArborescence:
        pass  # only relays reach some destination
    edges = breadth_first(parent, root)
    return tuple(int(best[u, v]) for u, v, _ in edges), tuple(d for _, _, d in edges)
