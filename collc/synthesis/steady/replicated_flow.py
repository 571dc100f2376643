"""The unicast rate LP (AllToAll, Gather, Scatter) solved once per orbit of source and
destination pairs, then replicated.

The whole multi-commodity flow LP has a flow variable per source and route: at 128
GPUs of dgx_h100 that is 358,000 variables and 88 s of a two-minute compile, and it
grows as N^3. On a topology with identical nodes and rails (collc.synthesis.symmetry)
the pair (s, d) is the image of a representative pair (r, d') under the automorphism
that maps r to s, and averaging any flow over those automorphisms gives one as fast
(the argument collc.synthesis.steady.replicated makes for trees). So the LP needs paths
for the representative pairs only, with one load row per link orbit; every other pair
uses the images of its representative's paths.

The LP is a path formulation, grown by column generation: the link orbits' prices make
the cheapest path from a representative source to every destination one shortest-path
computation over the ranks (a dense Bellman-Ford on a rank x rank cost matrix, a few
relaxations since paths are short), and a path enters the LP when it is cheaper than
its pair's dual. On dgx_h100 the nodes and rails form one orbit, so at 1,024 GPUs the LP
has 1,023 pairs rather than a million, and a few dozen rows.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

import numpy as np

from collc.synthesis.plan import SolveStats
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline, SolverOptions, new_highs
from collc.synthesis.steady.colgen import RoundDuals, column_generation, packing_lp_rows
from collc.synthesis.steady.replicated import orbit_rows
from collc.synthesis.steady.solution import NotApplicable, RateSolution
from collc.synthesis.symmetry import Symmetry

# Bellman-Ford relaxations at most: a path of more routes than this is never priced.
MAX_PATH_ROUTES = 8


def flow_peer_budget(options: SolverOptions) -> int:
    """The most peers per GPU a unicast flow may have: max_peers, or where it is applied
    only past a runtime's peer_limit, four fifths of that limit.

    A tree restricted to few peers loses only pipeline fill, but a unicast pair that is
    not allowed directly crosses the slow links twice: on dgx_h100(nodes=32) 32 peers
    cost AllToAll 1.19x its rate. So a flow keeps every direct pair the runtime can take,
    with a fifth of its threadblocks left for connections that need several (a node's
    relays carry about one block per other node). Measured on 1,024 H100 GPUs (130
    resident): 104 peers lower to 122 threadblocks per GPU, 1.24 of the bound; 97 peers
    to 115, 1.30."""
    if options.max_peers and options.peer_limit:
        return max(options.max_peers, options.peer_limit * 4 // 5)
    return options.max_peers


def flow_peer_mask(sym: Symmetry, max_peers: int, route_src: np.ndarray, route_dst: np.ndarray
                   ) -> np.ndarray | None:
    """Which routes replicated unicast paths may use so that a GPU has at most
    `max_peers` peers; None for all of them.

    A GPU's peers are the offsets (coords[v] - coords[u] modulo each shift's order) of
    the routes out of it. Along the longest shift (the nodes of a large cluster) only
    offsets 0..K are allowed, K as large as the budget permits: pairs further apart go
    through a node in between, which costs their share of the slow links twice, so the
    fewer such pairs the better (on 128 nodes of 8 GPUs, 104 peers leave 30 of the 127
    other nodes one hop further)."""
    if max_peers <= 0 or sym.coords is None or sym.orders is None or not len(route_src):
        return None
    orders = sym.orders
    offsets = (sym.coords[route_dst] - sym.coords[route_src]) % orders
    distinct = np.unique(offsets, axis=0)
    if len(distinct) <= max_peers:
        return None
    k = int(np.argmax(orders))
    along = np.sort(distinct[:, k])
    # Peers with offset at most K along k, for each K: the largest K within budget (at
    # least 1, so that every node stays reachable).
    within = np.searchsorted(along, np.arange(int(orders[k])), side="right")
    fits = np.flatnonzero(within <= max_peers)
    limit = max(1, int(fits[-1]) if len(fits) else 1)
    return offsets[:, k] <= limit


def pair_orbits(classes: dict[tuple, float], sym: Symmetry, ranks: int
                ) -> dict[tuple, list[tuple[tuple, int]]] | None:
    """Representative pair (r, (d',)) -> [(class, source rank)] it stands for; None where
    a pair's representative is not a class of the same size (then the symmetry does not
    carry over to the demand)."""
    inverse = np.empty_like(sym.rank_map)
    rows = np.arange(ranks)[:, None]
    inverse[rows, sym.rank_map] = np.arange(ranks)[None, :]  # inverse[s] maps s back to its representative
    out: dict[tuple, list[tuple[tuple, int]]] = defaultdict(list)
    for key, volume in classes.items():
        s, demand = key
        if len(demand) != 1:
            return None
        r = int(sym.representative[s])
        rep_key = (r, (int(inverse[s, demand[0]]),))
        if classes.get(rep_key) != volume:
            return None
        out[rep_key].append((key, s))
    return dict(out)


class _PairCosts:
    """The cheapest route of every ordered pair of ranks under a route cost, as an n x n
    matrix (inf on the diagonal and where no route is allowed), and which route it is."""

    def __init__(self, route_src: np.ndarray, route_dst: np.ndarray, ranks: int):
        self.ranks = ranks
        self.pair = route_src * ranks + route_dst

    def __call__(self, route_cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        n = self.ranks
        order = np.lexsort((np.arange(len(route_cost)), route_cost))  # ties: the lower route index
        pair = self.pair[order]
        _, first = np.unique(pair, return_index=True)
        chosen = order[first]
        cost = np.full(n * n, np.inf)
        best = np.full(n * n, -1, dtype=np.int64)
        cost[self.pair[chosen]] = route_cost[chosen]
        best[self.pair[chosen]] = chosen
        return cost.reshape(n, n), best.reshape(n, n)


def shortest_paths(cost: np.ndarray, best: np.ndarray, source: int) -> dict[int, tuple[int, ...]]:
    """From `source`, the cheapest path of routes to every rank it can reach (relaying
    through other ranks), by Bellman-Ford relaxations of the whole distance vector:
    each costs one n x n numpy operation, and paths here have few routes."""
    n = len(cost)
    dist = cost[source].copy()
    dist[source] = 0.0
    pred = np.full(n, source)
    for _ in range(MAX_PATH_ROUTES - 1):
        through = dist[:, None] + cost
        via = through.argmin(axis=0)
        better = through[via, np.arange(n)] < dist * (1 - 1e-12) - 1e-300
        better[source] = False
        if not better.any():
            break
        dist = np.where(better, through[via, np.arange(n)], dist)
        pred = np.where(better, via, pred)
    out: dict[int, tuple[int, ...]] = {}
    for d in np.flatnonzero(np.isfinite(dist)).tolist():
        if d == source:
            continue
        path: list[int] = []
        v = d
        while v != source and len(path) < MAX_PATH_ROUTES:
            u = int(pred[v])
            path.append(int(best[u, v]))
            v = u
        if v == source:
            out[d] = tuple(reversed(path))
    return out


def replicated_path_rates(problem: Problem, sym: Symmetry, orbits: dict[tuple, list[tuple[tuple, int]]],
                          classes: dict[tuple, float], options: SolverOptions, deadline: Deadline,
                          progress: Progress, spread: float, excess_price: float) -> RateSolution:
    net = problem.network
    n = net.ranks
    n_links_all = len(net.links)
    rows = orbit_rows(net, sym)
    # The padding column of a route's links falls on a row beyond the last.
    n_rows, link_row, orbit_size, row_cap = rows.count, rows.link_row, rows.size, rows.capacity
    cap = np.array([net.links[l].capacity for l in range(n_links_all)])
    reps = sorted(orbits)
    n_cls = len(reps)
    index_of = {key: g for g, key in enumerate(reps)}
    weight = np.array([len(orbits[key]) * classes[key] for key in reps])  # bytes a representative stands for
    route_src = np.array([r.src for r in net.routes])
    route_dst = np.array([r.dst for r in net.routes])
    route_time = np.array([r.seconds(problem.slot_bytes) for r in net.routes])
    padded = sym.routes.padded
    # Per route, how many links of each orbit row it crosses (one count row per route).
    route_rows = link_row[padded]
    pair_costs = _PairCosts(route_src, route_dst, n)
    sources = sorted({key[0] for key in reps})

    h = new_highs(options, max(0.05, deadline.remaining()))
    packing_lp_rows(h, n_cls, n_rows, spread, excess_price)
    columns: list[tuple[int, tuple[int, ...]]] = []
    seen: set[tuple[int, tuple[int, ...]]] = set()
    scale = 1.0

    def path_use(path: tuple[int, ...]) -> np.ndarray:
        use = np.bincount(route_rows[list(path)].ravel(), minlength=n_rows + 1)[:n_rows]
        return use / (orbit_size * row_cap)

    def add_path(g: int, path: tuple[int, ...]) -> None:
        if (g, path) in seen:
            return
        seen.add((g, path))
        use = path_use(path) * weight[g] / scale
        rows_used = np.flatnonzero(use)
        rows = np.concatenate([[g], n_cls + rows_used, n_cls + n_rows + rows_used]).astype(np.int32)
        vals = np.concatenate([[1.0], use[rows_used], use[rows_used]])
        h.addCol(0.0, 0.0, INF, len(rows), rows, vals)
        columns.append((g, path))

    allowed = flow_peer_mask(sym, flow_peer_budget(options), route_src, route_dst)

    def priced_paths(route_cost: np.ndarray) -> dict[tuple, tuple[int, ...]] | None:
        if allowed is not None:
            route_cost = np.where(allowed, route_cost, np.inf)
        cost, best = pair_costs(route_cost)
        found: dict[tuple, tuple[int, ...]] = {}
        for r in sources:
            paths = shortest_paths(cost, best, r)
            for key in reps:
                if key[0] == r:
                    path = paths.get(key[1][0])
                    if path is None:
                        return None
                    found[key] = path
        return found

    first = priced_paths(route_time)
    if first is None and allowed is not None:
        # The allowed pairs do not join every pair: no limit then (the backend's own
        # check still decides whether the schedule fits).
        allowed = None
        first = priced_paths(route_time)
    if first is None:
        raise NotApplicable("a destination cannot be reached from its source")
    load = np.zeros(n_rows)
    for key, path in first.items():
        load += path_use(path) * weight[index_of[key]]
    # Times in units of the first paths' time, so that T is about 1 (HiGHS's tolerances
    # are absolute).
    scale = float(load.max()) or 1.0
    for key, path in first.items():
        add_path(index_of[key], path)

    def candidates(duals: RoundDuals) -> Iterator[tuple[int, tuple[int, ...], float]]:
        link_price = np.append(duals.row_price, 0.0)[link_row]
        route_price = link_price[padded].sum(axis=1)
        # Among paths of one price, the faster (fewer hops) wins.
        priced = priced_paths(route_price + 1e-9 * duals.t_value * route_time / max(route_time.max(), 1e-30))
        for key, path in (priced or {}).items():
            g = index_of[key]
            yield g, path, weight[g] / scale * float(route_price[list(path)].sum()) - duals.class_dual[g]

    status, t_lp, chosen = column_generation(h, deadline, progress, "replicated path flow LP", n_cls, n_rows,
                                             orbit_size * row_cap, candidates, add_path)
    rep_shares: dict[int, list[tuple[tuple[int, ...], float]]] = defaultdict(list)
    for (g, path), v in zip(columns, chosen):
        if v > 1e-9:
            rep_shares[g].append((path, float(v)))
    t_value = t_lp * scale
    shares: dict[tuple, list[tuple[tuple[int, ...], float]]] = {}
    depth: dict[tuple[int, ...], tuple[int, ...]] = {}
    loads = np.zeros(n_links_all + 1)
    for g, key in enumerate(reps):
        members = orbits[key]
        src_ranks = np.array([s for _, s in members])
        for path, v in rep_shares[g]:
            images = sym.route_images(path)
            if images is None:
                raise NotApplicable("an automorphism maps a path's route to no route")
            mine = images[src_ranks]
            hops = tuple(range(1, len(path) + 1))
            for (cls, _), image in zip(members, mine.tolist()):
                image = tuple(image)
                shares.setdefault(cls, []).append((image, v))
                depth[image] = hops
            links = padded[mine].ravel()
            np.add.at(loads, links, v * classes[key] / np.append(cap, np.inf)[links])
    real = float(loads[:n_links_all].max())
    stats = SolveStats(h.getNumCol(), h.getNumRow(), deadline.elapsed())
    own = tuple(path for g in range(n_cls) for path, _ in rep_shares[g])
    return RateSolution(max(t_value, real), shares, depth, status, stats, "paths", replicated=n_cls,
                        representative_structures=own)
