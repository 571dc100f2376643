"""The tree-packing rate LP (multicast demands: AllGather, Broadcast), by column generation.

Every source's data is split over spanning arborescences rooted at it; the LP's link
prices make a minimum-cost arborescence (Chu-Liu/Edmonds, collc.synthesis.arborescence)
the most profitable new tree.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterator

import numpy as np

from collc.synthesis.arborescence import NoArborescence, min_arborescence
from collc.synthesis.network import Network
from collc.synthesis.plan import SolveStats
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline, SolverOptions, new_highs
from collc.synthesis.steady.colgen import EXCESS_PRICE, RoundDuals, column_generation, packing_lp_rows
from collc.synthesis.steady.solution import NotApplicable, RateSolution, class_bytes
from collc.synthesis.steiner import relayed_tree


def tree_rates(problem: Problem, options: SolverOptions, deadline: Deadline, progress: Progress,
                spread: float) -> RateSolution:
    return joint_tree_rates((problem,), options, deadline, progress, spread)[0]


def joint_tree_rates(problems: tuple[Problem, ...], options: SolverOptions, deadline: Deadline,
                     progress: Progress, spread: float, alone_weight: float = 0.0) -> list[RateSolution]:
    """One tree-packing LP for the multicast demands of several problems whose networks
    share their links (a topology and its reversal: link i is the same cable in both),
    so that every link's load is the sum over all of them. Returns each problem's
    trees and shares, all with the one T. With a single problem this is the tree LP.

    `alone_weight` > 0 adds, per problem, the time its own load alone would take (its
    busiest link), at that weight in the objective: among packings as fast together,
    the LP then prefers those whose parts are each fast alone, which a pipeline whose
    parts run one after the other in places (a reduction before its gathering) needs."""
    nets = [p.network for p in problems]
    side_classes = [class_bytes(p) for p in problems]
    keys = [(side, key) for side, classes in enumerate(side_classes) for key in classes]
    volume = [side_classes[side][key] for side, key in keys]
    links = sorted(set().union(*(net.used_links for net in nets)))
    row_of_link = {l: i for i, l in enumerate(links)}
    cap = np.array([nets[0].links[l].capacity for l in links])
    n_cls = len(keys)
    route_links = [[[row_of_link[l] for l in r.links] for r in net.routes] for net in nets]
    # Tie-break between trees of equal price: fewer, faster hops (a shallower pipeline).
    route_time = [np.array([r.seconds(p.slot_bytes) for r in p.network.routes]) for p in problems]
    grids = [RouteGrid(net) for net in nets]

    n_links = len(links)
    h = new_highs(options, max(0.05, deadline.remaining()))
    packing_lp_rows(h, n_cls, n_links, spread, EXCESS_PRICE)
    alone = alone_weight > 0 and len(problems) > 1
    if alone:
        first_alone = h.getNumCol()
        for side in range(len(problems)):
            h.addVar(0.0, INF)
            h.changeColCost(first_alone + side, alone_weight)
            for _ in range(n_links):
                h.addRow(-INF, 0.0, 1, np.array([first_alone + side], dtype=np.int32), np.array([-1.0]))
    columns: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []  # (class, routes, depths)
    seen: set[tuple[int, tuple[int, ...]]] = set()

    def add_tree(g: int, routes: tuple[int, ...], depths: tuple[int, ...]) -> None:
        key = (g, routes)
        if key in seen:
            return
        seen.add(key)
        use: dict[int, float] = defaultdict(float)
        for ri in routes:
            for li in route_links[keys[g][0]][ri]:
                use[li] += 1.0
        rows = [g] + [n_cls + li for li in sorted(use)] + [n_cls + n_links + li for li in sorted(use)]
        coef = [use[li] * volume[g] / cap[li] / scale for li in sorted(use)]
        vals = [1.0] + coef + coef
        if alone:
            rows += [n_cls + (2 + keys[g][0]) * n_links + li for li in sorted(use)]
            vals += coef
        h.addCol(0.0, 0.0, INF, len(rows), np.array(rows, dtype=np.int32), np.array(vals))
        columns.append((g, routes, depths))

    nodes_of = []
    first_trees = []
    load = np.zeros(n_links)
    for g, (side, (root, demand)) in enumerate(keys):
        nodes = (root,) + tuple(d for d in demand if d != root)
        nodes_of.append(nodes)
        routes, depths = grids[side].tree(nodes, route_time[side])
        first_trees.append((g, routes, depths))
        for ri in routes:
            rl = route_links[side][ri]
            load[rl] += volume[g] / cap[rl]
    # Times enter the LP in units of the first trees' time, so that T is about 1: HiGHS's
    # tolerances are absolute, and seconds (1e-3) would make them coarse.
    scale = float(load.max()) or 1.0
    for g, routes, depths in first_trees:
        add_tree(g, routes, depths)

    def candidates(duals: RoundDuals) -> Iterator[tuple[int, tuple[tuple[int, ...], tuple[int, ...]], float]]:
        price = duals.row_price  # per byte, >= 0
        per_side = [price + duals.group_price[i] if duals.group_price is not None else price
                    for i in range(len(problems))]
        route_price = [np.array([per_side[i][rl].sum() if rl else 0.0 for rl in side])
                       for i, side in enumerate(route_links)]
        for g, nodes in enumerate(nodes_of):
            side = keys[g][0]
            v = volume[g] / scale
            times = route_time[side]
            cost = v * route_price[side] + 1e-9 * duals.t_value * times / max(times.max(), 1e-30)
            routes, depths = grids[side].tree(nodes, cost)
            tree_price = v * sum(route_price[side][r] for r in routes)
            yield g, (routes, depths), tree_price - duals.class_dual[g]

    status, t_lp, chosen = column_generation(h, deadline, progress, "tree packing LP", n_cls, n_links, cap, candidates,
                                             lambda g, tree: add_tree(g, *tree))
    if alone:
        chosen = chosen[len(problems):]  # the parts' own times come before the trees
    shares: list[dict[tuple, list[tuple[tuple[int, ...], float]]]] = [defaultdict(list) for _ in problems]
    depth: list[dict[tuple[int, ...], tuple[int, ...]]] = [{} for _ in problems]
    t_value = t_lp * scale
    for (g, routes, depths), v in zip(columns, chosen):
        if v > 1e-9:
            side, key = keys[g]
            shares[side][key].append((routes, float(v)))
            depth[side][routes] = depths
    stats = SolveStats(h.getNumCol(), h.getNumRow(), deadline.elapsed())
    return [RateSolution(t_value, dict(shares[i]), depth[i], status, stats, "trees") for i in range(len(problems))]


class RouteGrid:
    """Every ordered pair of ranks' routes as one array (padded with a route of infinite
    cost), so that pricing a tree picks each pair's cheapest route with numpy: the
    column generation prices one tree per source in every round."""

    def __init__(self, net: Network):
        pairs = net.pair_routes
        width = max((len(rs) for rs in pairs.values()), default=1)
        self.none = len(net.routes)
        self.grid = np.full((net.ranks, net.ranks, width), self.none, dtype=np.int32)
        for (u, v), rs in pairs.items():
            self.grid[u, v, :len(rs)] = rs  # ascending: ties go to the lower index

    def tree(self, nodes: tuple[int, ...], route_cost: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The cheapest spanning tree over `nodes` rooted at nodes[0]: its routes (parents
        before children) and the depth of each route's receiver. Over a subset of the
        ranks the tree may relay through the others (collc.synthesis.steiner)."""
        if len(nodes) < self.grid.shape[0]:
            relayed = relayed_tree(self.grid, nodes, route_cost)
            if relayed is not None:
                return relayed
        idx = np.asarray(nodes)
        routes = self.grid[np.ix_(idx, idx)]
        costs = np.append(route_cost, np.inf)[routes]
        k = costs.argmin(axis=2)[..., None]
        cost = np.take_along_axis(costs, k, 2)[..., 0]
        best = np.take_along_axis(routes, k, 2)[..., 0]
        np.fill_diagonal(cost, np.inf)
        return tree_routes(cost, best)



def tree_routes(cost: np.ndarray, best) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The minimum arborescence of `cost` (an n x n matrix over tree positions, rooted at
    0) as routes in breadth-first order, parents before children, with each receiver's
    depth. `best[(u, v)]` is the route that joins positions u and v (a dict or an array)."""
    try:
        parent = min_arborescence(cost, 0)
    except NoArborescence:
        raise NotApplicable("a destination cannot be reached from its source through destinations only")
    children: dict[int, list[int]] = defaultdict(list)
    for v in range(1, len(cost)):
        children[int(parent[v])].append(v)
    routes, depths = [], []
    frontier, d = [0], 0
    while frontier:
        d += 1
        nxt = []
        for u in frontier:
            for v in sorted(children[u]):
                routes.append(int(best[(u, v)]))
                depths.append(d)
                nxt.append(v)
        frontier = nxt
    return tuple(routes), tuple(depths)
