"""The packing LP shared by the steady-state rate LPs, and its column generation.

Every rate LP (trees per source, replicated trees, replicated paths) is the same LP:
per class, shares of structures adding up to 1; per link (or link orbit), the load of
the chosen structures at most T. Its structures are columns grown by pricing with the
LP's duals until none would shorten T.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

import highspy
import numpy as np

from collc.synthesis.plan import Status
from collc.synthesis.progress import Progress
from collc.synthesis.solver import INF, Deadline
from collc.synthesis.steady.solution import NotApplicable

# The rate LP charges EXCESS_PRICE (relative to T) for load a link carries above
# spread x T. Equally fast packings differ in how well they pipeline; auto tries these
# spreads in turn while time remains.
SPREADS = (0.97, 0.95, 0.93, 0.99)
EXCESS_PRICE = 0.05
# Column generation stops when no tree can shorten T by more than this fraction.
PRICING_TOLERANCE = 1e-6
MAX_PRICING_ROUNDS = 400


def packing_lp_rows(h: highspy.Highs, n_classes: int, n_rows: int, spread: float, excess_price: float) -> None:
    """The tree-packing LP before its columns: T, then one excess variable per link row;
    rows: one per class (its shares add up to 1), one per link row (load <= T), one per
    link row (load <= spread x T + excess). The trees are added as columns later. A
    small price on excess makes the LP, among packings as fast as the best, prefer one
    that leaves every link it can some slack: a list scheduler keeps a link busy far
    more easily when the links that feed it are not saturated."""
    h.addVar(0.0, INF)
    h.changeColCost(0, 1.0)
    for _ in range(n_rows):
        h.addVar(0.0, INF)
    h.changeColsCost(n_rows, np.arange(1, n_rows + 1, dtype=np.int32), np.full(n_rows, excess_price / n_rows))
    for _ in range(n_classes):
        h.addRow(1.0, 1.0, 0, np.array([], dtype=np.int32), np.array([], dtype=float))
    for _ in range(n_rows):
        h.addRow(-INF, 0.0, 1, np.array([0], dtype=np.int32), np.array([-1.0]))
    for i in range(n_rows):
        h.addRow(-INF, 0.0, 2, np.array([0, 1 + i], dtype=np.int32), np.array([-spread, -1.0]))


def solve_round(h: highspy.Highs, deadline: Deadline, what: str) -> bool:
    """One solve of a column-generation round: True when optimal, False when the time
    limit stopped it at a feasible point (recorded in the work counters); no solution at
    all is `NotApplicable`."""
    deadline.work.pricing_rounds += 1
    deadline.work.solves += 1
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal and not deadline.expired:
        # A warm start occasionally stalls; a cold start of the same LP does not.
        h.clearSolver()
        deadline.work.solves += 1
        h.run()
    if h.getModelStatus() == highspy.HighsModelStatus.kOptimal:
        return True
    if h.getInfo().primal_solution_status != 2:
        raise NotApplicable(f"{what} found no solution ({h.modelStatusToString(h.getModelStatus())})")
    deadline.work.time_limit_fired = True
    return False


@dataclass(frozen=True)
class RoundDuals:
    """What a solved round of column generation prices new columns with."""

    t_value: float  # the LP's objective: T plus the small price of excess
    class_dual: np.ndarray  # per class: the dual of its shares adding up to 1
    row_price: np.ndarray  # per load row: its price per unit of the column's coefficient / per_row
    # Per group of extra load rows (joint_tree_rates: one per problem), the same prices.
    group_price: np.ndarray | None = None


def solve_for_duals(h: highspy.Highs, deadline: Deadline, what: str, n_classes: int, n_rows: int,
                    per_row: np.ndarray) -> RoundDuals | None:
    """Solve a round (`solve_round`) and read its duals, laid out as packing_lp_rows
    makes the rows: the load rows' two duals summed, negated and divided by `per_row`
    (a link's capacity, or a link orbit's size times capacity). None when the time
    limit stopped the solve."""
    if not solve_round(h, deadline, what):
        return None
    duals = np.asarray(h.getSolution().row_dual)
    rows = n_classes + n_rows
    price = -(duals[n_classes:rows] + duals[rows:rows + n_rows]) / per_row
    # Rows after packing_lp_rows' own (joint_tree_rates: each problem's load alone)
    # price their columns apart: per extra row, its dual over `per_row` again.
    extra = duals[rows + n_rows:]
    more = -extra.reshape(-1, n_rows) / per_row if len(extra) else None
    return RoundDuals(h.getInfo().objective_function_value, duals[:n_classes], price, more)


def after_pricing(h: highspy.Highs, deadline: Deadline, added: int, rounds: int, t_value: float,
                  lagrange: float) -> Status | None:
    """After a pricing round: OPTIMAL when column generation is done (no tree priced
    below its class's dual, the Lagrangian gap closed, or the round budget spent),
    TIME_LIMIT when the safety net fired, None to solve again (the solver's own limit
    moved to what the deadline leaves)."""
    if not added or rounds >= MAX_PRICING_ROUNDS or (t_value - lagrange) <= PRICING_TOLERANCE * t_value:
        return Status.OPTIMAL
    if deadline.fired():
        return Status.TIME_LIMIT
    h.setOptionValue("time_limit", h.getRunTime() + max(0.05, deadline.remaining()))
    return None


def column_generation(h: highspy.Highs, deadline: Deadline, progress: Progress, what: str, n_classes: int,
                      n_rows: int, per_row: np.ndarray,
                      candidates: Callable[[RoundDuals], Iterable[tuple[int, Any, float]]],
                      add: Callable[[int, Any], None]) -> tuple[Status, float, np.ndarray]:
    """Solve the packing LP, price new columns with its duals, add those whose reduced
    cost is negative, and again, until `after_pricing` stops it. `candidates(duals)`
    gives (class, column, reduced cost) for each class's cheapest column, `add` puts
    one into the LP. Returns the status, T (in the LP's units) and every column's
    share, in the order the columns were added."""
    rounds = 0
    while True:
        rounds += 1
        got = solve_for_duals(h, deadline, f"{what} (round {rounds})", n_classes, n_rows, per_row)
        if got is None:
            status = Status.TIME_LIMIT
            break
        progress.stage(f"steady: {what}, round {rounds}")
        progress.note(T=f"{got.t_value:.4f}", columns=h.getNumCol() - 1 - n_rows)
        added = 0
        lagrange = got.t_value
        for g, column, reduced in candidates(got):
            if reduced < -PRICING_TOLERANCE * got.t_value:
                add(g, column)
                added += 1
                lagrange += reduced
        stop = after_pricing(h, deadline, added, rounds, got.t_value, lagrange)
        if stop is not None:
            status = stop
            break
    values = np.asarray(h.getSolution().col_value)
    return status, float(values[0]), values[1 + n_rows:]
