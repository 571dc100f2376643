"""A thin layer over HiGHS: assemble a model as arrays, solve it within a deadline.

Models are built column by column and row by row in Python lists, converted once to a
column-wise sparse matrix and passed whole (`passModel`), which is much faster than
adding rows one at a time through highspy's expression API.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from enum import Enum
from typing import Callable, Sequence

import highspy
import numpy as np

from collc.native_output import native_stdout_discarded
from collc.synthesis.progress import Progress

INF = highspy.kHighsInf


@dataclass(frozen=True)
class SolverOptions:
    mip_gap: float = 0.0
    threads: int = 0  # 0: one thread (HiGHS's parallel modes do not give the same answer every run)
    seed: int = 0
    # Most distinct peers a GPU may exchange data with, where the packing is replicated
    # over identical nodes (0: no limit). A runtime that gives every peer its own
    # threadblock (MSCCL) needs this on large clusters: see replicate.peer_mask.
    max_peers: int = 0
    # With max_peers: apply it only where the packing without it gives some GPU more
    # peers than this (the most the runtime can take at all); 0: always apply it.
    peer_limit: int = 0


class Outcome(str, Enum):
    OPTIMAL = "optimal"
    FEASIBLE = "feasible"  # stopped (time limit) with a feasible solution
    INFEASIBLE = "infeasible"
    UNKNOWN = "unknown"  # stopped before finding a solution or proving there is none


@dataclass
class Result:
    outcome: Outcome
    values: np.ndarray | None
    objective: float
    bound: float
    gap: float
    seconds: float
    row_duals: np.ndarray | None = None

    @property
    def has_solution(self) -> bool:
        return self.values is not None


class Model:
    """Columns and rows of an LP or MILP."""

    def __init__(self) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        self.cost: list[float] = []
        self.integer: list[bool] = []
        self.row_lo: list[float] = []
        self.row_hi: list[float] = []
        self._rows: list[int] = []
        self._cols: list[int] = []
        self._vals: list[float] = []

    @property
    def num_cols(self) -> int:
        return len(self.lo)

    @property
    def num_rows(self) -> int:
        return len(self.row_lo)

    @property
    def num_nonzeros(self) -> int:
        return len(self._vals)

    def add_var(self, lo: float = 0.0, hi: float = INF, cost: float = 0.0, integer: bool = False) -> int:
        self.lo.append(lo)
        self.hi.append(hi)
        self.cost.append(cost)
        self.integer.append(integer)
        return len(self.lo) - 1

    def add_row(self, cols: Sequence[int], vals: Sequence[float], lo: float = -INF, hi: float = INF) -> int:
        r = len(self.row_lo)
        self.row_lo.append(lo)
        self.row_hi.append(hi)
        self._rows.extend([r] * len(cols))
        self._cols.extend(cols)
        self._vals.extend(vals)
        return r

    def to_highs_lp(self) -> highspy.HighsLp:
        lp = highspy.HighsLp()
        n, m = self.num_cols, self.num_rows
        lp.num_col_ = n
        lp.num_row_ = m
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.asarray(self.lo, dtype=float)
        lp.col_upper_ = np.asarray(self.hi, dtype=float)
        lp.row_lower_ = np.asarray(self.row_lo, dtype=float)
        lp.row_upper_ = np.asarray(self.row_hi, dtype=float)
        cols = np.asarray(self._cols, dtype=np.int64)
        order = np.argsort(cols, kind="stable")
        counts = np.bincount(cols, minlength=n) if n else np.zeros(0, dtype=np.int64)
        start = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(counts, out=start[1:])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
        lp.a_matrix_.start_ = start
        lp.a_matrix_.index_ = np.asarray(self._rows, dtype=np.int32)[order]
        lp.a_matrix_.value_ = np.asarray(self._vals, dtype=float)[order]
        if any(self.integer):
            lp.integrality_ = [highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous
                               for i in self.integer]
        return lp


_banner_shown = False


def _quiet_highs() -> highspy.Highs:
    """A Highs instance, without the banner the library writes (from C++, to file
    descriptor 1) when the first one is made: it would land in the middle of collc's
    report, or in JSON a command prints on stdout."""
    global _banner_shown
    if _banner_shown:
        return highspy.Highs()
    _banner_shown = True
    with native_stdout_discarded():
        return highspy.Highs()


def new_highs(options: SolverOptions, time_limit: float) -> highspy.Highs:
    h = _quiet_highs()
    h.silent()
    h.setOptionValue("time_limit", max(0.01, float(time_limit)))
    h.setOptionValue("random_seed", int(options.seed))
    h.setOptionValue("mip_rel_gap", float(options.mip_gap))
    # One thread unless asked otherwise: with several, HiGHS's MIP search may take a
    # different path from run to run, and the same input must give the same schedule.
    h.setOptionValue("threads", int(options.threads) if options.threads > 0 else 1)
    return h


def solve(model: Model, *, maximize: bool = False, time_limit: float, options: SolverOptions,
          progress: Progress | None = None, start: np.ndarray | None = None,
          want_duals: bool = False, first_solution: bool = False, node_limit: int = 0,
          work: "Work | None" = None, on_incumbent: Callable[[np.ndarray], None] | None = None) -> Result:
    """Solve within `time_limit` seconds; `first_solution` stops a MILP at its first
    feasible point (enough to show that a horizon is feasible); `node_limit` bounds a
    MILP's branch-and-bound by work rather than time, so the answer does not depend on
    the machine's speed or load. `on_incumbent` is called with each improving solution
    of a MILP (the column values), from the thread that runs the solve."""
    h = new_highs(options, time_limit)
    if work is not None:
        work.solves += 1
    if first_solution:
        h.setOptionValue("mip_max_improving_sols", 1)
    if node_limit:
        h.setOptionValue("mip_max_nodes", int(node_limit))
    lp = model.to_highs_lp()
    if maximize:
        lp.sense_ = highspy.ObjSense.kMaximize
    h.passModel(lp)
    mip = any(model.integer)
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(map(float, start))
        sol.value_valid = True
        h.setSolution(sol)
    if progress is not None and progress.enabled and mip:
        _watch(h, progress)
    if on_incumbent is not None and mip:
        h.cbMipImprovingSolution.subscribe(lambda event: on_incumbent(event.data_out.mip_solution))
    t0 = time.monotonic()
    h.run()
    seconds = time.monotonic() - t0
    return _result(h, mip, seconds, want_duals)


def _watch(h: highspy.Highs, progress: Progress) -> None:
    """Report the incumbent, bound and gap while a MILP runs. HiGHS calls the interrupt
    callback often (it could stop the solve there); it only reads from it."""

    def tick(event) -> None:
        out = event.data_out
        progress.solver(out.mip_primal_bound, out.mip_dual_bound, out.mip_gap)

    h.cbMipImprovingSolution.subscribe(tick)
    h.cbMipInterrupt.subscribe(tick)


def _result(h: highspy.Highs, mip: bool, seconds: float, want_duals: bool) -> Result:
    status = h.getModelStatus()
    info = h.getInfo()
    has_primal = info.primal_solution_status == int(highspy.SolutionStatus.kSolutionStatusFeasible)
    values = np.asarray(h.getSolution().col_value, dtype=float) if has_primal else None
    objective = info.objective_function_value if has_primal else float("nan")
    bound = info.mip_dual_bound if mip else objective
    gap = info.mip_gap if mip else 0.0
    if status == highspy.HighsModelStatus.kOptimal:
        outcome = Outcome.OPTIMAL
    elif status in (highspy.HighsModelStatus.kInfeasible,):
        outcome = Outcome.INFEASIBLE
    elif has_primal:
        outcome = Outcome.FEASIBLE
    else:
        outcome = Outcome.UNKNOWN
    duals = None
    if want_duals and outcome is Outcome.OPTIMAL:
        sol = h.getSolution()
        if sol.dual_valid:
            duals = np.asarray(sol.row_dual, dtype=float)
    return Result(outcome, values, objective, bound, gap, seconds, duals)


@dataclass
class Work:
    """What a synthesis did, counted: the search is bounded by these counts, not by the
    clock, so two runs that report the same work made the same schedule."""

    solves: int = 0  # LP and MILP solves (each run of HiGHS)
    pricing_rounds: int = 0  # rounds of column generation in the rate LP
    candidates: int = 0  # schedules built and timed under the alpha-beta model
    time_limit_fired: bool = False  # the wall-clock safety net cut something short

    def to_json(self) -> dict[str, int | bool]:
        return {"solver_runs": self.solves, "pricing_rounds": self.pricing_rounds,
                "candidates_timed": self.candidates, "time_limit_fired": self.time_limit_fired}


class Deadline:
    """The wall-clock end of the pass's time budget (a safety net: the search itself is
    bounded by work), and the work counted so far, shared by the deadlines cut from it."""

    def __init__(self, seconds: float, work: Work | None = None):
        self.start = time.monotonic()
        self.end = self.start + max(0.0, seconds)
        self.work = work if work is not None else Work()

    def share(self, fraction: float) -> "Deadline":
        """A deadline for part of the remaining time, counting into the same work."""
        return Deadline(self.remaining() * fraction, self.work)

    def fired(self) -> bool:
        """True (and recorded) when the safety net has run out."""
        if self.expired:
            self.work.time_limit_fired = True
            return True
        return False

    def remaining(self) -> float:
        return max(0.0, self.end - time.monotonic())

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self.end
