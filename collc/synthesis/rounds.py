"""Method rounds: short windows of epochs, solved one after another (TE-CCL's A*-like
scaling technique).

Each round is the TE-CCL MILP over a few epochs, starting from where the chunks are
after the previous rounds (and with the link capacity they already took), with the
demand that is left. Its objective rewards deliveries, the earlier the better, and
chunks that end the round at GPUs nearer to the ranks still waiting for them, so a
round makes progress even when no delivery fits in it. A round whose MILP finds nothing
in its share of the time falls back to the greedy schedule for that window.
"""

from __future__ import annotations

import math

from collc.synthesis.estimate import announce, bounded
from collc.synthesis.plan import Plan, SolveStats, Status, Transfer
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, Outcome, SolverOptions, solve
from collc.synthesis.timexp import EpochGrid, State, build_flow_model, greedy

# A round's model stays under about this many flow variables: its window shrinks to fit.
ROUND_VARIABLES = 20_000
# Reward, per epoch of distance saved, for a chunk left at a relay nearer its destination.
RELAY_REWARD = 0.25


def window_epochs(problem: Problem, grid: EpochGrid) -> int:
    """Epochs per round: a few hops, less when the model would grow too large."""
    per_epoch = max(1, len(problem.commodities) * len(problem.network.routes))
    fit = max(1, ROUND_VARIABLES // per_epoch)
    return max(1, min(2 * grid.max_lag + 1, fit))


def solve_rounds(problem: Problem, grid: EpochGrid, options: SolverOptions, deadline: Deadline,
                 progress: Progress, window: int = 0, chosen: bool = True) -> Plan:
    """`chosen`: the user asked for this method (auto's own tries run unannounced)."""
    state = State.initial(problem)
    width = window or window_epochs(problem, grid)
    if chosen:
        # As many rounds as the greedy schedule has windows, each a model of `width` epochs.
        greedy_state = State.initial(problem)
        greedy(problem, grid, greedy_state)
        rounds_likely = max(1, math.ceil(greedy_state.finish_epoch() / width))
        announce(progress, bounded("rounds", width, len(problem.network.routes), len(problem.commodities),
                                   problem.ranks, solves=rounds_likely))
    transfers: list[Transfer] = []
    first = 0
    rounds = solved = 0
    largest = (0, 0)
    timed_out = False
    total = sum(len(c.demand) for c in problem.commodities)
    while not state.done(problem):
        rounds += 1
        left = sum(len(state.pending(problem, k)) for k in range(len(problem.commodities)))
        progress.stage(f"rounds: round {rounds}, epochs {first}-{first + width}")
        progress.note(delivered=f"{total - left}/{total}")
        chosen: list[Transfer] = []
        if not deadline.expired:
            fm = build_flow_model(problem, grid, state, first, first + width, require_all=False,
                                  relay_reward=RELAY_REWARD)
            if fm is not None and fm.x:
                largest = max(largest, (fm.model.num_cols, fm.model.num_rows))
                # Later rounds may each take an equal part of what is left.
                share = deadline.remaining() / max(1.0, math.ceil(left / max(1, total) * 4))
                res = solve(fm.model, maximize=True, time_limit=max(0.05, share), options=options, work=deadline.work,
                            progress=progress)
                if res.has_solution:
                    chosen = fm.transfers(res.values)
                    solved += 1
                if res.outcome is not Outcome.OPTIMAL:
                    timed_out = True
        else:
            timed_out = True
        if chosen:
            state.apply(problem, grid, chosen)
            transfers.extend(chosen)
        else:
            # Nothing useful found by the solver: the greedy schedule takes the window.
            transfers.extend(greedy(problem, grid, state, first, first + width))
        first += width
    status = Status.TIME_LIMIT if timed_out else Status.FEASIBLE
    return Plan(problem, tuple(transfers), "rounds", status, state.finish_epoch(),
                SolveStats(largest[0], largest[1], deadline.elapsed()),
                {"epoch_seconds": grid.tau, "rounds": rounds, "rounds_solved": solved, "round_epochs": width})
