"""A plan's ops made in steps (`copy_ops_steps`, for work begun ahead of a solve's end)
are the ops `copy_ops` makes, and the steps stop as often as TRANSFERS_PER_STEP says."""

from __future__ import annotations

from functools import lru_cache

import topos

from collc.ir.collective import standard
from collc.synthesis import extract
from collc.synthesis.ahead import finish
from collc.synthesis.candidates import problem_for
from collc.synthesis.network import Network
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, SolverOptions
from collc.synthesis.steady.pipelining import pipelined_plan
from collc.synthesis.steady.rates import solve_rates


@lru_cache(maxsize=1)  # shared with test_timing: the rates and the rounding MILP take a second
def _dgx1_allgather_plan():
    net = Network(topos.dgx1())
    collective = standard("allgather", net.ranks)
    rates = solve_rates(problem_for(net, collective, 1 << 20, 1), SolverOptions(), Deadline(600), Progress(False))
    return pipelined_plan(problem_for(net, collective, 1 << 20, 4), rates, SolverOptions(), Deadline(600))


def _steps_taken(steps) -> tuple[int, object]:
    """(how many times `steps` stopped before its end, its product)."""
    stops = 0
    try:
        next(steps)
        while True:
            stops += 1
            steps.send(True)
    except StopIteration as stop:
        return stops, stop.value


def test_ops_made_in_steps_are_the_ops_made_at_once(monkeypatch):
    plan = _dgx1_allgather_plan()
    whole = extract.copy_ops(plan)
    monkeypatch.setattr(extract, "TRANSFERS_PER_STEP", 10)
    taken, stepped = _steps_taken(extract.copy_ops_steps(plan))
    assert stepped == whole and finish(extract.copy_ops_steps(plan)) == whole
    assert taken == -(-len(plan.transfers) // 10) - 1  # a stop between two steps of 10 transfers
