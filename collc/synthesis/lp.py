"""Method lp: TE-CCL's linear program without copies or chunk identity, rounded back to
whole-chunk paths.

Chunks that go from the same source to the same destination form one fluid commodity.
Its flow may rest at GPUs on the way (store and forward) but never multiplies, which is
exact for AllToAll, Gather and Scatter and an upper bound for collectives that could
copy. The fluid solution is split into paths through the time-expanded network, the
chunks of each commodity are dealt to its paths in proportion to their flow, and the
rare chunk the rounding leaves without a path is finished by the greedy schedule.
The horizon is searched up from the lower bound, as for the MILP.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import replace

import numpy as np

from collc.analysis.bounds import lower_bounds
from collc.synthesis.candidates import realize
from collc.synthesis.estimate import announce, bounded
from collc.synthesis.milp import epoch_lower_bound
from collc.synthesis.plan import Plan, SolveStats, Status, Transfer
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline, Model, Outcome, SolverOptions, solve
from collc.synthesis.steady.pipelining import apportion
from collc.synthesis.timing import DEFAULT_MODEL, TimingModel
from collc.synthesis.timexp import (EpochGrid, FlowModel, Guide, State, build_flow_model, coarse_grid, greedy,
                                    make_grid)

# The fine grid (make_grid) while a bound on its model's variables stays below this;
# the coarse grid (one epoch per slowest chunk) above it.
FINE_GRID_VARIABLES = 60_000
# The coarse grid's epochs are at least the lower bound over this many: a collective
# whose slow links carry hundreds of chunks (AllToAll over InfiniBand) gets longer
# epochs, each carrying several of them.
COARSE_EPOCHS = 32
# On the coarse grid a unicast group's flow may take routes whose path is at most this
# many epochs longer than its shortest: detours further out only fill the model.
COARSE_SLACK = 1


def _groups(problem: Problem, grid: EpochGrid) -> dict[tuple[int, int], list[int]]:
    """(source rank, destination rank) -> commodities; a chunk with several holders
    leaves from the one nearest the destination."""
    groups: dict[tuple[int, int], list[int]] = defaultdict(list)
    for k, c in enumerate(problem.commodities):
        for d in c.demand:
            h = min(c.holders, key=lambda u: (grid.dist[u, d], u))
            groups[(h, d)].append(k)
    return dict(sorted(groups.items()))


class _FluidModel:
    def __init__(self, problem: Problem, grid: EpochGrid, groups: dict[tuple[int, int], list[int]], horizon: int,
                 slack: int | None = None):
        net = problem.network
        dist = grid.dist
        m = Model()
        self.f: dict[tuple[int, int, int], int] = {}  # (group, route, epoch) -> column
        arrive: dict[tuple[int, int, int], list[int]] = defaultdict(list)  # (group, rank, epoch)
        depart: dict[tuple[int, int, int], list[int]] = defaultdict(list)
        link_terms: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.feasible = True
        keys = list(groups)
        for g, (h, d) in enumerate(keys):
            if dist[h, d] > horizon:
                self.feasible = False
                return
            for r in net.routes:
                if r.dst == h or r.src == d:
                    continue
                lag = grid.lag[r.index]
                if slack is not None and dist[h, r.src] + lag + dist[r.dst, d] > dist[h, d] + slack:
                    continue
                lo = int(dist[h, r.src])
                hi = horizon - lag - int(dist[r.dst, d])
                for k in range(lo, hi + 1):
                    reward = float(horizon - (k + lag) + 1) if r.dst == d else 0.0
                    j = m.add_var(0.0, INF, reward)
                    self.f[(g, r.index, k)] = j
                    arrive[(g, r.dst, k + lag)].append(j)
                    depart[(g, r.src, k)].append(j)
                    for l in r.links:
                        link_terms[(l, k)].append(j)
        eps = 1e-3
        for j in self.f.values():
            m.cost[j] -= eps
        for g, (h, d) in enumerate(keys):
            n = float(len(groups[(h, d)]))
            # Every rank but the destination: stock = previous stock + arrivals - departures >= 0.
            for v in range(problem.ranks):
                if v == d:
                    continue
                prev = None
                for k in range(horizon + 1):
                    a, b = arrive.get((g, v, k), ()), depart.get((g, v, k), ())
                    if prev is None and not a and not b and v != h:
                        continue
                    s = m.add_var(0.0, INF)
                    cols = [s] + list(a) + list(b)
                    vals = [1.0] + [-1.0] * len(a) + [1.0] * len(b)
                    if prev is not None:
                        cols.append(prev)
                        vals.append(-1.0)
                        m.add_row(cols, vals, 0.0, 0.0)
                    else:
                        start = n if v == h else 0.0
                        m.add_row(cols, vals, start, start)
                    prev = s
            cols = [j for k in range(horizon + 1) for j in arrive.get((g, d, k), ())]
            m.add_row(cols, [1.0] * len(cols), n, INF)
        for l, w in grid.window.items():
            ks = sorted({k for (ll, k) in link_terms if ll == l})
            hold = grid.hold[l]
            for s in sorted({s for k in ks for s in range(k - w + 1, k + 1)}):
                cols = [j for k in range(s, s + w) for j in link_terms.get((l, k), ())]
                if cols and hold * len(cols) > w + 1e-9:
                    m.add_row(cols, [hold] * len(cols), -INF, float(w))
        self.model = m
        self.keys = keys


def _paths(problem: Problem, grid: EpochGrid, fm: _FluidModel, values: np.ndarray, g: int, amount: float):
    """Split group g's fluid flow into paths [(route, epoch), ...] with their amounts."""
    net = problem.network
    h, d = fm.keys[g]
    left: dict[int, list[tuple[int, int, float]]] = defaultdict(list)  # rank -> [(epoch, route, flow)]
    for (gg, r, k), j in fm.f.items():
        if gg == g and values[j] > 1e-7:
            left[net.routes[r].src].append((k, r, float(values[j])))
    for v in left:
        left[v].sort()
    out = []
    remaining = amount
    while remaining > 1e-6:
        v, t, path = h, 0, []
        while v != d:
            options = [i for i, (k, r, f) in enumerate(left[v]) if k >= t and f > 1e-7]
            if not options:
                return out
            i = options[0]
            k, r, f = left[v][i]
            path.append((i, v, r, k))
            t = k + grid.lag[r]
            v = net.routes[r].dst
        flow = min(left[u][i][2] for i, u, _, _ in path)
        flow = min(flow, remaining)
        for i, u, r, k in path:
            kk, rr, f = left[u][i]
            left[u][i] = (kk, rr, f - flow)
        remaining -= flow
        out.append(([(r, k) for _, _, r, k in path], flow))
    return out


def solve_lp(problem: Problem, options: SolverOptions, deadline: Deadline, progress: Progress,
             grid: EpochGrid | None = None, timing: TimingModel = DEFAULT_MODEL) -> Plan:
    bound_s = lower_bounds(problem.network.topology, problem.collective, problem.size_bytes).best_s
    slack = None
    if grid is None:
        grid, coarse = lp_grid(problem, bound_s)
        slack = COARSE_SLACK if coarse else None
    upper_state = State.initial(problem)
    greedy(problem, grid, upper_state)
    upper = max(1, upper_state.finish_epoch())
    # No schedule on the grid is shorter than the lower bound: an epoch holds at most
    # its length of any link's wire time, and every route's lag covers its real time.
    lower = max(epoch_lower_bound(problem, grid), math.ceil(bound_s / grid.tau - 1e-9))
    horizon = min(lower, upper)
    if problem.unicast:
        return _unicast(problem, grid, options, deadline, progress, horizon, upper, slack)
    return _with_copies(problem, grid, options, deadline, progress, horizon, upper, timing)


def lp_grid(problem: Problem, bound_s: float) -> tuple[EpochGrid, bool]:
    """The fine grid (make_grid) while its model stays small, else the coarse one
    (epochs of the slowest route's chunk, or of the bound over COARSE_EPOCHS), whose
    model has fewer epochs; and whether it is the coarse one."""
    fine = make_grid(problem)
    epochs = max(epoch_lower_bound(problem, fine), math.ceil(bound_s / fine.tau - 1e-9))
    size = bounded("lp", epochs, len(problem.network.routes), len(_like_chunks(problem)[1]), problem.ranks)
    if size.variables <= FINE_GRID_VARIABLES:
        return fine, False
    return coarse_grid(problem, bound_s / COARSE_EPOCHS), True


def _unicast(problem: Problem, grid: EpochGrid, options: SolverOptions, deadline: Deadline,
             progress: Progress, horizon: int, upper: int, slack: int | None) -> Plan:
    groups = _groups(problem, grid)
    routes = _routes_per_group(problem, grid, groups, slack)
    state = State.initial(problem)
    step = 1
    fm, res = None, None
    status = Status.OPTIMAL
    while True:
        progress.stage(f"lp: trying {horizon} epochs")
        # Said before the model is built: building a large one takes a while too.
        announce(progress, bounded("lp", horizon, routes, len(groups), problem.ranks, formulation="fluid"))
        fm = _FluidModel(problem, grid, groups, horizon, slack)
        if fm.feasible:
            progress.note(variables=f"{fm.model.num_cols:,}", rows=f"{fm.model.num_rows:,}")
            res = solve(fm.model, maximize=True, time_limit=max(0.05, deadline.remaining()), options=options,
                        work=deadline.work, progress=progress)
            if res.has_solution:
                if res.outcome is not Outcome.OPTIMAL:
                    status = Status.TIME_LIMIT
                break
            if res.outcome is not Outcome.INFEASIBLE:
                status = Status.TIME_LIMIT
        if horizon >= upper or deadline.expired:
            fm, res = None, None
            status = Status.TIME_LIMIT if deadline.expired else Status.FEASIBLE
            break
        horizon = min(upper, horizon + step)
        step *= 2
    transfers: list[Transfer] = []
    if fm is not None and res is not None:
        for g, key in enumerate(fm.keys):
            coms = groups[key]
            paths = _paths(problem, grid, fm, res.values, g, float(len(coms)))
            counts = apportion(min(len(coms), round(sum(a for _, a in paths))), [a for _, a in paths])
            it = iter(coms)
            for (path, _), n in zip(paths, counts):
                for _ in range(n):
                    c = next(it)
                    transfers.extend(Transfer(c, r, k) for r, k in path)
    # Chunks the rounding left out travel by the greedy schedule after the horizon.
    state.apply(problem, grid, transfers)
    if not state.done(problem):
        transfers.extend(greedy(problem, grid, state, max(horizon, state.finish_epoch())))
        status = Status.FEASIBLE if status is Status.OPTIMAL else status
    stats = SolveStats(fm.model.num_cols if fm else 0, fm.model.num_rows if fm else 0, deadline.elapsed())
    return Plan(problem, tuple(transfers), "lp", status, max(horizon, state.finish_epoch()), stats,
                {"epoch_seconds": grid.tau})


def _routes_per_group(problem: Problem, grid: EpochGrid, groups: dict[tuple[int, int], list[int]],
                      slack: int | None) -> int:
    """Routes a group's flow may take, on average (rounded up): all of them, or within
    `slack` epochs of its shortest path."""
    routes = problem.network.routes
    if slack is None or not groups:
        return len(routes)
    dist = grid.dist
    usable = sum(1 for h, d in groups for r in routes
                 if dist[h, r.src] + grid.lag[r.index] + dist[r.dst, d] <= dist[h, d] + slack)
    return -(-usable // len(groups))


def _like_chunks(problem: Problem) -> tuple[list[int], list[int]]:
    """Chunks with the same holders and demand, grouped: (commodity -> group, the first
    commodity of each group). Their flows are interchangeable in the relaxation."""
    index: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    group_of: list[int] = []
    firsts: list[int] = []
    for k, c in enumerate(problem.commodities):
        key = (c.holders, c.demand)
        if key not in index:
            index[key] = len(firsts)
            firsts.append(k)
        group_of.append(index[key])
    return group_of, firsts


def _with_copies(problem: Problem, grid: EpochGrid, options: SolverOptions, deadline: Deadline,
                 progress: Progress, horizon: int, upper: int, timing: TimingModel) -> Plan:
    """TE-CCL's model with copies, relaxed: like chunks form one commodity of that many
    units (holdings and flows fractional), solved at the shortest horizon it fits; the
    greedy schedule then rounds it, taking first the transfers its flows ask for."""
    group_of, firsts = _like_chunks(problem)
    amounts = [float(group_of.count(g)) for g in range(len(firsts))]
    grouped = replace(problem, commodities=tuple(problem.commodities[k] for k in firsts))
    step = 1
    status = Status.FEASIBLE
    guide: Guide | None = None
    largest = (0, 0)
    while True:
        progress.stage(f"lp: trying {horizon} epochs of {grid.tau * 1e6:.3g} us")
        announce(progress, bounded("lp", horizon, len(problem.network.routes), len(firsts), problem.ranks))
        fm = build_flow_model(grouped, grid, State.initial(grouped), 0, horizon, require_all=True,
                              integer=False, amounts=amounts)
        if fm is not None:
            largest = max(largest, (fm.model.num_cols, fm.model.num_rows))
            progress.note(variables=f"{fm.model.num_cols:,}", rows=f"{fm.model.num_rows:,}")
            res = solve(fm.model, maximize=True, time_limit=max(0.05, deadline.remaining()), options=options,
                        work=deadline.work, progress=progress)
            if res.has_solution:
                # Optimal for the relaxation only: the rounded schedule is feasible.
                status = Status.FEASIBLE if res.outcome is Outcome.OPTIMAL else Status.TIME_LIMIT
                guide = Guide(group_of, _route_flows(fm, res.values))
                break
            if res.outcome is not Outcome.INFEASIBLE:
                status = Status.TIME_LIMIT
        if horizon >= upper or deadline.expired:
            status = Status.TIME_LIMIT if deadline.expired else Status.FEASIBLE
            break
        horizon = min(upper, horizon + step)
        step *= 2
    # The relaxation's horizon is a bound; the rounded schedule may need a little more.
    # Its guide can also mislead (like chunks pooled, a copy counted where another
    # holder's copy is): the unguided schedule is kept where its modelled time is shorter
    # (dgx1 AllGather 256 MiB of 4 chunks: 1.072 of the bound unguided, 1.180 guided).
    facts = {"epoch_seconds": grid.tau, "relaxation_epochs": horizon}
    stats = SolveStats(largest[0], largest[1], deadline.elapsed())
    plans = []
    for rounding in ([guide] if guide is not None else []) + [None]:
        state = State.initial(problem)
        transfers = greedy(problem, grid, state, guide=rounding)
        plans.append(Plan(problem, tuple(transfers), "lp", status, state.finish_epoch(), stats,
                          {**facts, "rounding": "greedy" if rounding is None else "guided"}))
    # Stable: the guided schedule wins ties.
    return min(plans, key=lambda plan: realize(plan, timing).estimate_s)


def _route_flows(fm: FlowModel, values: np.ndarray) -> dict[tuple[int, int], list[tuple[int, float]]]:
    flows: dict[tuple[int, int], list[tuple[int, float]]] = defaultdict(list)
    for (g, r, k), j in sorted(fm.x.items()):
        if values[j] > 1e-6:
            flows[(g, r)].append((k, float(values[j])))
    return dict(flows)
