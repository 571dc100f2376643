"""The tree-packing rate LP solved once per orbit of sources, then replicated.

On a topology with identical nodes and rails (collc.synthesis.symmetry) every source of
an orbit is the image of one representative under an automorphism. Averaging any
packing over those automorphisms gives a packing as fast, in which every link of a link
orbit carries the same load. So the LP needs trees for the representatives only, and
one load row per link orbit: the orbit's total load from the representative's trees
(times the number of sources it stands for), spread over the orbit's links. The other
sources use the images of their representative's trees. The replicated packing's real
link loads are computed afterwards; they equal the LP's unless the automorphisms found
do not average evenly, in which case T is the real maximum (still a valid packing).

Pricing a new tree is a minimum-cost arborescence over all ranks with the LP's link
prices, built from arrays of routes rather than pair by pair: at 1,024 GPUs a Python
loop over the million rank pairs would cost more than the LP.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from collc.synthesis.network import Network
from collc.synthesis.plan import SolveStats
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline, SolverOptions, new_highs
from collc.synthesis.steady.colgen import RoundDuals, column_generation, packing_lp_rows
from collc.synthesis.steady.solution import NotApplicable, RateSolution
from collc.synthesis.steady.trees import tree_routes
from collc.synthesis.symmetry import Symmetry


def class_orbits(problem: Problem, classes: dict[tuple, float], sym: Symmetry
                 ) -> dict[tuple, list[tuple[tuple, int]]] | None:
    """Representative class -> [(class, source rank)] it stands for; None where a class's
    image under its automorphism is not the class of its source (then the symmetry
    does not carry over to the demand)."""
    by_root = {key[0]: key for key in classes}
    out: dict[tuple, list[tuple[tuple, int]]] = defaultdict(list)
    for key in classes:
        s = key[0]
        rep = int(sym.representative[s])
        rep_key = by_root.get(rep)
        if rep_key is None or classes[rep_key] != classes[key]:
            return None
        image = tuple(sorted(int(sym.rank_map[s][d]) for d in rep_key[1]))
        if image != tuple(sorted(key[1])):
            return None
        out[rep_key].append((key, s))
    return dict(out)


def replicated_tree_rates(problem: Problem, sym: Symmetry, orbits: dict[tuple, list[tuple[tuple, int]]],
                          classes: dict[tuple, float], options: SolverOptions, deadline: Deadline,
                          progress: Progress, spread: float, excess_price: float) -> RateSolution:
    net = problem.network
    n_links_all = len(net.links)
    used = sorted(set(net.used_links))
    rows = orbit_rows(net, sym)
    n_rows, link_row, orbit_size, row_cap = rows.count, rows.link_row, rows.size, rows.capacity
    cap = np.array([net.links[l].capacity for l in range(n_links_all)])
    reps = sorted(orbits)
    weight = {key: len(orbits[key]) for key in reps}  # sources a representative stands for
    n_cls = len(reps)
    route_src = np.array([r.src for r in net.routes])
    route_dst = np.array([r.dst for r in net.routes])
    route_links = [r.links for r in net.routes]
    route_time = np.array([r.seconds(problem.slot_bytes) for r in net.routes])
    # Per route and link orbit: how many of the orbit's links the route crosses (made
    # for the routes that trees use: at 1,024 GPUs there are a million routes).
    orbit_use_of: dict[int, dict[int, int]] = {}

    def route_orbit_use(ri: int) -> dict[int, int]:
        use = orbit_use_of.get(ri)
        if use is None:
            use = defaultdict(int)
            for l in route_links[ri]:
                use[int(link_row[l])] += 1
            orbit_use_of[ri] = use
        return use

    h = new_highs(options, max(0.05, deadline.remaining()))
    packing_lp_rows(h, n_cls, n_rows, spread, excess_price)
    # Orbit row -> capacity of one of its links (all alike).
    columns: list[tuple[int, tuple[int, ...], tuple[int, ...]]] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()
    scale = 1.0

    def add_tree(g: int, routes: tuple[int, ...], depths: tuple[int, ...]) -> None:
        if (g, routes) in seen:
            return
        seen.add((g, routes))
        use: dict[int, float] = defaultdict(float)
        for ri in routes:
            for o, k in route_orbit_use(ri).items():
                use[o] += k
        rows_used = sorted(use)
        vol = weight[reps[g]] * classes[reps[g]] / scale
        coef = [vol * use[o] / (orbit_size[o] * row_cap[o]) for o in rows_used]
        rows = [g] + [n_cls + o for o in rows_used] + [n_cls + n_rows + o for o in rows_used]
        h.addCol(0.0, 0.0, INF, len(rows), np.array(rows, dtype=np.int32), np.array([1.0] + coef + coef))
        columns.append((g, routes, depths))

    nodes_of = [(key[0],) + tuple(d for d in key[1] if d != key[0]) for key in reps]
    allowed = peer_mask(sym, options.max_peers, route_src, route_dst)
    first_cost = route_time if allowed is None else np.where(allowed, route_time, np.inf)
    try:
        first = [(g, *arborescence(net, nodes_of[g], first_cost, route_src, route_dst)) for g in range(n_cls)]
    except NotApplicable:
        if allowed is None:
            raise
        # The restricted pairs do not span every source's destinations: no limit then
        # (the backend's own check still decides whether the schedule fits).
        allowed = None
        first = [(g, *arborescence(net, nodes_of[g], route_time, route_src, route_dst)) for g in range(n_cls)]
    load = np.zeros(n_rows)
    for g, routes, _ in first:
        for ri in routes:
            for o, k in route_orbit_use(ri).items():
                load[o] += weight[reps[g]] * classes[reps[g]] * k / (orbit_size[o] * row_cap[o])
    scale = float(load.max()) or 1.0
    for g, routes, depths in first:
        add_tree(g, routes, depths)

    def candidates(duals: RoundDuals):
        # A route's price is the sum of its links' (the padding column costs nothing).
        link_price = np.zeros(n_links_all + 1)
        link_price[used] = duals.row_price[link_row[used]]
        route_price = link_price[sym.routes.padded].sum(axis=1)
        for g in range(n_cls):
            volume = weight[reps[g]] * classes[reps[g]] / scale
            cost = volume * route_price + 1e-9 * duals.t_value * route_time / max(route_time.max(), 1e-30)
            if allowed is not None:
                cost[~allowed] = np.inf
            routes, depths = arborescence(net, nodes_of[g], cost, route_src, route_dst)
            yield g, (routes, depths), volume * float(route_price[list(routes)].sum()) - duals.class_dual[g]

    status, t_lp, chosen = column_generation(h, deadline, progress, "replicated tree packing LP", n_cls, n_rows,
                                             orbit_size * row_cap, candidates, lambda g, tree: add_tree(g, *tree))
    rep_shares: dict[int, list[tuple[tuple[int, ...], tuple[int, ...], float]]] = defaultdict(list)
    for (g, routes, depths), v in zip(columns, chosen):
        if v > 1e-9:
            rep_shares[g].append((routes, depths, float(v)))
    t_value = t_lp * scale
    shares: dict[tuple, list[tuple[tuple[int, ...], float]]] = {}
    depth: dict[tuple[int, ...], tuple[int, ...]] = {}
    loads = np.zeros(n_links_all)
    padded = sym.routes.padded
    for g, key in enumerate(reps):
        for routes, depths, v in rep_shares[g]:
            images = sym.route_images(routes)
            if images is None:
                raise NotApplicable("an automorphism maps a tree's route to no route")
            for cls, s in orbits[key]:
                image = tuple(images[s].tolist())
                shares.setdefault(cls, []).append((image, v))
                depth[image] = depths
                links = padded[images[s]].ravel()
                links = links[links < n_links_all]
                np.add.at(loads, links, v * classes[cls] / cap[links])
    real = float(loads.max())
    stats = SolveStats(h.getNumCol(), h.getNumRow(), deadline.elapsed())
    own = tuple(routes for g in range(n_cls) for routes, _, _ in rep_shares[g])
    return RateSolution(max(t_value, real), shares, depth, status, stats, "trees", replicated=len(reps),
                        representative_structures=own)


@dataclass(frozen=True)
class OrbitRows:
    """The load rows of a replicated LP: one per orbit of used links (links the
    automorphisms map onto one another, all alike)."""

    count: int
    link_row: np.ndarray  # (links + 1,): each link's row; unused links and the padding column: count
    size: np.ndarray  # per row: the links of its orbit
    capacity: np.ndarray  # per row: the capacity of one of its links


def orbit_rows(net: Network, sym: Symmetry) -> OrbitRows:
    orbit_of = link_orbits(sym.link_map)
    used = sorted(set(net.used_links))
    orbit_ids = sorted({int(orbit_of[l]) for l in used})
    row_of_orbit = {o: i for i, o in enumerate(orbit_ids)}
    count = len(orbit_ids)
    link_row = np.full(len(net.links) + 1, count, dtype=np.int64)
    size = np.zeros(count)
    capacity = np.zeros(count)
    for l in used:
        row = row_of_orbit[int(orbit_of[l])]
        link_row[l] = row
        size[row] += 1
        capacity[row] = net.links[l].capacity
    return OrbitRows(count, link_row, size, capacity)


def peer_mask(sym: Symmetry, max_peers: int, route_src: np.ndarray, route_dst: np.ndarray) -> np.ndarray | None:
    """Which routes a replicated tree may use so that every GPU keeps to few peers; None
    for all of them.

    Replicated trees are images of the representatives' trees under shifts, so a GPU's
    peers are the shifts' differences (coords[v] - coords[u]) that the representatives'
    trees use. Along a shift of order m larger than max_peers / 4 (the nodes of a large
    cluster), only differences below k = ceil(sqrt(m)) or multiples of k are allowed:
    about 2 sqrt(m) of them, and any node is still two hops away. On 128 nodes of 8 GPUs
    a GPU then talks to about 30 peers rather than 133 (one per other node on its rail,
    and its node's GPUs), which MSCCL's executor (a threadblock per peer, 32 peers per
    channel, every threadblock resident at once) can run. The rate is unchanged where
    the links of a shift's orbit are alike; the extra hop costs pipeline fill."""
    if max_peers <= 0 or sym.coords is None or sym.orders is None:
        return None
    allowed: np.ndarray | None = None
    for k, m in enumerate(sym.orders.tolist()):
        if m <= max(max_peers // 4, 2):
            continue
        step = math.isqrt(m - 1) + 1
        delta = (sym.coords[route_dst, k] - sym.coords[route_src, k]) % m
        ok = (delta < step) | (delta % step == 0)
        allowed = ok if allowed is None else allowed & ok
    return allowed


def link_orbits(link_map: np.ndarray) -> np.ndarray:
    """The smallest link of each link's orbit under the automorphisms in link_map (one
    row per automorphism: the link each link maps to).

    The orbits are the connected components of the links joined to their images, found
    on arrays: every link takes the smallest label among its neighbours', then jumps to
    its label's label, until nothing changes (a union-find in Python over 256 GPUs'
    links and automorphisms took 4% of an AllReduce's compile)."""
    n = link_map.shape[1]
    src = np.tile(np.arange(n, dtype=np.int64), link_map.shape[0])
    dst = np.asarray(link_map, dtype=np.int64).reshape(-1)
    label = np.arange(n, dtype=np.int64)
    while True:
        least = np.minimum(label[src], label[dst])
        new = label.copy()
        np.minimum.at(new, src, least)
        np.minimum.at(new, dst, least)
        while True:  # every link to the smallest label along its chain of labels
            jumped = new[new]
            if np.array_equal(jumped, new):
                break
            new = jumped
        if np.array_equal(new, label):
            return label
        label = new


def arborescence(net: Network, nodes: tuple[int, ...], route_cost: np.ndarray, route_src: np.ndarray,
                 route_dst: np.ndarray) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The cheapest spanning tree over `nodes` rooted at nodes[0] (ties: the lower route
    index): its routes, parents before children, and each receiver's depth."""
    n = len(nodes)
    pos = np.full(net.ranks, -1)
    pos[list(nodes)] = np.arange(n)
    a, b = pos[route_src], pos[route_dst]
    ok = np.flatnonzero((a >= 0) & (b >= 0))
    order = ok[np.lexsort((ok, route_cost[ok]))]
    pair = a[order] * n + b[order]
    _, first = np.unique(pair, return_index=True)
    chosen = order[first]
    cost = np.full((n, n), np.inf)
    best = np.full((n, n), -1, dtype=np.int64)
    cost[a[chosen], b[chosen]] = route_cost[chosen]
    best[a[chosen], b[chosen]] = chosen
    return tree_routes(cost, best)


