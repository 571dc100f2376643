"""The multi-commodity flow rate LP (unicast demands: AllToAll, Gather, Scatter),
decomposed into paths: a flow per source, with relays through GPUs."""

from __future__ import annotations

import heapq
import math
from collections import defaultdict

from collc.synthesis.network import Network
from collc.synthesis.plan import SolveStats, Status
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline, Model, Outcome, SolverOptions, solve
from collc.synthesis.steady.solution import NotApplicable, RateSolution


def flow_rates(problem: Problem, options: SolverOptions, deadline: Deadline, progress: Progress) -> RateSolution:
    net = problem.network
    n = problem.ranks
    demand: dict[int, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for c in problem.commodities:
        for d in c.demand:
            demand[c.holders[0]][d] += problem.slot_bytes
    sources = sorted(demand)
    links = list(net.used_links)
    # Bytes in units of the largest demand and time in units of that demand on the
    # fastest link: coefficients near 1 (HiGHS drops entries below 1e-9 as zeros).
    unit = max(a for per in demand.values() for a in per.values())
    fastest = max(net.links[l].capacity for l in links)
    unit_time = unit / fastest

    def build(t_fixed: float | None) -> tuple[Model, dict[tuple[int, int], int]]:
        m = Model()
        t = m.add_var(0.0, INF if t_fixed is None else t_fixed, 1.0 if t_fixed is None else 0.0)
        x: dict[tuple[int, int], int] = {}
        for s in sources:
            for r in net.routes:
                if r.dst == s:
                    continue
                # Second phase: among the fastest, the fewest bytes on the wire.
                x[(s, r.index)] = m.add_var(0.0, INF, 0.0 if t_fixed is None else float(r.hops))
        for s in sources:
            for v in range(n):
                if v == s:
                    continue
                cols, vals = [], []
                for ri in net.in_routes[v]:
                    if (s, ri) in x:
                        cols.append(x[(s, ri)])
                        vals.append(1.0)
                for ri in net.out_routes[v]:
                    if (s, ri) in x:
                        cols.append(x[(s, ri)])
                        vals.append(-1.0)
                want = demand[s].get(v, 0.0) / unit
                m.add_row(cols, vals, want, want)
        per_link: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for (s, ri), j in x.items():
            for l in net.routes[ri].links:
                per_link[l].append((j, fastest / net.links[l].capacity))
        for l in links:
            terms = per_link.get(l)
            if terms:
                m.add_row([j for j, _ in terms] + [t], [v for _, v in terms] + [-1.0], -INF, 0.0)
        return m, x

    progress.stage("steady: multi-commodity flow")
    m, x = build(None)
    res = solve(m, time_limit=max(0.05, deadline.remaining()), options=options, work=deadline.work)
    if not res.has_solution:
        raise NotApplicable("the steady-state flow LP found no solution in time")
    t_scaled = float(res.values[0])
    status = Status.OPTIMAL if res.outcome is Outcome.OPTIMAL else Status.TIME_LIMIT
    m2, x2 = build(t_scaled * (1 + 1e-7) + 1e-12)
    res2 = solve(m2, time_limit=max(0.05, deadline.remaining()), options=options, work=deadline.work)
    if res2.has_solution:
        res, x = res2, x2
    t_value = t_scaled * unit_time
    flows = {k: float(res.values[j]) * unit for k, j in x.items() if res.values[j] > 1e-9}
    shares: dict[tuple, list[tuple[tuple[int, ...], float]]] = defaultdict(list)
    for s in sources:
        for d, path, amount in _decompose(net, s, demand[s], flows):
            shares[(s, (d,))].append((path, amount / demand[s][d]))
    depth = {path: tuple(range(1, len(path) + 1)) for paths in shares.values() for path, _ in paths}
    stats = SolveStats(m.num_cols, m.num_rows, deadline.elapsed())
    return RateSolution(t_value, dict(shares), depth, status, stats, "paths")


def _decompose(net: Network, s: int, demand: dict[int, float], flows: dict[tuple[int, int], float]):
    """Split source s's flow into paths to its destinations (widest first)."""
    left = {ri: f for (src, ri), f in flows.items() if src == s}
    need = {d: a for d, a in demand.items() if a > 0}
    tol = 1e-9 * max(need.values(), default=1.0)
    out = []
    for d in sorted(need):
        while need[d] > tol:
            path = _widest_path(net, s, d, left, tol)
            if path is None:
                break
            amount = min(need[d], min(left[ri] for ri in path))
            for ri in path:
                left[ri] -= amount
            need[d] -= amount
            out.append((d, path, amount))
    return out


def _widest_path(net: Network, s: int, d: int, left: dict[int, float], tol: float) -> tuple[int, ...] | None:
    best = {s: math.inf}
    via: dict[int, int] = {}
    heap = [(-math.inf, 0, s)]
    done = set()
    while heap:
        w, hops, u = heapq.heappop(heap)
        if u in done:
            continue
        done.add(u)
        if u == d:
            break
        for ri in net.out_routes[u]:
            f = left.get(ri, 0.0)
            if f <= tol:
                continue
            v = net.routes[ri].dst
            width = min(-w, f)
            if width > best.get(v, 0.0):
                best[v] = width
                via[v] = ri
                heapq.heappush(heap, (-width, hops + 1, v))
    if d not in via:
        return None
    path = []
    v = d
    while v != s:
        ri = via[v]
        path.append(ri)
        v = net.routes[ri].src
    return tuple(reversed(path))
