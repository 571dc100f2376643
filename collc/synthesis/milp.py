"""Method milp: the exact TE-CCL MILP, with the number of epochs searched from below.

The horizon starts at a lower bound (the farthest demand in epochs, and what each GPU's
incoming links can carry) and grows geometrically until a MILP finds a schedule; a
binary search then closes the gap between the last infeasible horizon and the first
feasible one. A greedy schedule on the same grid gives a horizon that is always
feasible, and warm-starts the final solve, so a time limit still leaves an answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from collc.diagnostics import SolverError
from collc.synthesis.estimate import announce, bounded
from collc.synthesis.plan import Plan, SolveStats, Status, Transfer
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, Outcome, SolverOptions, solve
from collc.synthesis.timexp import EpochGrid, State, build_flow_model, greedy

# A probe of one horizon may use this share of the remaining time; the final
# optimization of the chosen horizon keeps the rest.
PROBE_SHARE = 0.35


def epoch_lower_bound(problem: Problem, grid: EpochGrid) -> int:
    """No schedule on this grid finishes in fewer epochs."""
    net = problem.network
    far = 0
    need = [0] * problem.ranks
    for c in problem.commodities:
        for d in c.demand:
            far = max(far, int(min(grid.dist[h, d] for h in c.holders)))
            need[d] += 1
    ingress = 0
    for v in range(problem.ranks):
        if not need[v]:
            continue
        # Chunks a GPU can take in per epoch: each incoming last link at its fastest.
        rate = 0.0
        first = None
        last_links: dict[int, float] = {}
        for ri in net.in_routes[v]:
            l = net.routes[ri].links[-1]
            last_links[l] = grid.hold[l]
            first = grid.lag[ri] if first is None else min(first, grid.lag[ri])
        rate = sum(1.0 / h for h in last_links.values())
        if rate > 0 and first is not None:
            ingress = max(ingress, first - 1 + math.floor(need[v] / rate))
    return max(far, ingress, 1)


@dataclass
class _Found:
    """The smallest horizon known to fit, and a schedule in it."""

    epochs: int
    transfers: list[Transfer]


def solve_milp(problem: Problem, grid: EpochGrid, options: SolverOptions, deadline: Deadline,
               progress: Progress, epochs: int = 0, chosen: bool = True) -> Plan:
    """`epochs` > 0 fixes the horizon instead of searching for the smallest. `chosen`:
    the user asked for this method (auto's own tries run under a short limit, unannounced)."""
    heuristic_state = State.initial(problem)
    heuristic = greedy(problem, grid, heuristic_state)
    upper = max(1, heuristic_state.finish_epoch())
    lower = min(epoch_lower_bound(problem, grid), upper)
    best = _Found(upper, heuristic)
    # The horizon searched lies between the bound and the greedy schedule's: the model at
    # the greedy horizon bounds every probe's size.
    if chosen:
        announce(progress, bounded("milp", epochs or upper, len(problem.network.routes), len(problem.commodities),
                                   problem.ranks))
    if epochs:
        return _fixed_horizon(problem, grid, options, deadline, progress, epochs, lower)
    infeasible_below = lower - 1  # every horizon up to this one has no schedule
    proven = True
    largest = (0, 0)

    def probe(epochs: int) -> Outcome:
        nonlocal best, largest
        progress.stage(f"milp: trying {epochs} epochs (bound {lower}, greedy {upper})")
        fm = build_flow_model(problem, grid, State.initial(problem), 0, epochs, require_all=True)
        if fm is None:
            return Outcome.INFEASIBLE
        largest = max(largest, (fm.model.num_cols, fm.model.num_rows))
        limit = max(0.05, deadline.remaining() * PROBE_SHARE)
        res = solve(fm.model, maximize=True, time_limit=limit, options=options,
                    work=deadline.work, progress=progress,
                    first_solution=True)
        if res.has_solution:
            best = _Found(epochs, fm.transfers(res.values))
        return res.outcome

    # Gallop up from the bound, then bisect between the last failure and the first success.
    step, epochs = 1, lower
    while epochs < best.epochs and not deadline.expired:
        outcome = probe(epochs)
        if outcome in (Outcome.OPTIMAL, Outcome.FEASIBLE):
            break
        proven &= outcome is Outcome.INFEASIBLE
        infeasible_below = epochs
        epochs = min(best.epochs, epochs + step)
        step *= 2
    while best.epochs - infeasible_below > 1 and not deadline.expired:
        mid = (infeasible_below + best.epochs) // 2
        outcome = probe(mid)
        if outcome not in (Outcome.OPTIMAL, Outcome.FEASIBLE):
            proven &= outcome is Outcome.INFEASIBLE
            infeasible_below = mid
    if best.epochs - infeasible_below > 1:
        proven = False

    # Optimize the early-delivery objective at the chosen horizon.
    progress.stage(f"milp: {best.epochs} epochs")
    fm = build_flow_model(problem, grid, State.initial(problem), 0, best.epochs, require_all=True)
    final_optimal = False
    if fm is not None:
        largest = max(largest, (fm.model.num_cols, fm.model.num_rows))
        start = fm.start_vector(problem, grid, best.transfers)
        res = solve(fm.model, maximize=True, time_limit=max(0.05, deadline.remaining()), options=options,
                    work=deadline.work, progress=progress, start=start)
        if res.has_solution:
            best = _Found(best.epochs, fm.transfers(res.values))
        final_optimal = res.outcome is Outcome.OPTIMAL
    # Short of a proof, only the time limit stopped the search.
    status = Status.OPTIMAL if final_optimal and proven else Status.TIME_LIMIT
    return Plan(problem, tuple(best.transfers), "milp", status, best.epochs,
                SolveStats(largest[0], largest[1], deadline.elapsed()),
                {"epoch_seconds": grid.tau, "epoch_lower_bound": lower, "greedy_epochs": upper})


def _fixed_horizon(problem: Problem, grid: EpochGrid, options: SolverOptions, deadline: Deadline,
                   progress: Progress, epochs: int, lower: int) -> Plan:
    progress.stage(f"milp: {epochs} epochs (fixed)")
    fm = build_flow_model(problem, grid, State.initial(problem), 0, epochs, require_all=True)
    res = None
    if fm is not None:
        res = solve(fm.model, maximize=True, time_limit=max(0.05, deadline.remaining()), options=options,
                    work=deadline.work, progress=progress)
    if res is None or not res.has_solution:
        size = "" if fm is None else f" ({fm.model.num_cols} variables, {fm.model.num_rows} constraints)"
        if res is None or res.outcome is Outcome.INFEASIBLE:
            raise SolverError(
                f"the MILP over {epochs} epochs of {grid.tau * 1e6:.3g} us{size} is infeasible",
                notes=(f"no schedule fits in fewer than {lower} epochs; leave epochs=0 to search for the "
                       "smallest horizon that fits",))
        raise SolverError(
            f"the MILP over {epochs} epochs of {grid.tau * 1e6:.3g} us{size} found no schedule within the "
            f"time limit of {deadline.elapsed():.1f} s",
            notes=("raise time_limit, or leave epochs=0: the horizon search starts from a greedy schedule and "
                   "always has one to return",))
    status = Status.OPTIMAL if res.outcome is Outcome.OPTIMAL else Status.TIME_LIMIT
    return Plan(problem, tuple(fm.transfers(res.values)), "milp", status, epochs,
                SolveStats(fm.model.num_cols, fm.model.num_rows, deadline.elapsed()),
                {"epoch_seconds": grid.tau, "epoch_lower_bound": lower})
