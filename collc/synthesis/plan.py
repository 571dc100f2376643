"""A method's answer before it becomes a schedule: which chunk crosses which route, when.

Every method (time-expanded MILP or LP, rounds, steady-state pipelining) produces a
`Plan`; `collc.synthesis.extract` turns it into ops with buffers and dependencies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, NamedTuple

from collc.synthesis.problem import Problem


class Status(str, Enum):
    """How a method's model ended; the values are the tokens reported in notes."""

    OPTIMAL = "optimal"  # the model was solved to optimality
    TIME_LIMIT = "time_limit"  # stopped at the limit with a feasible answer
    FEASIBLE = "feasible"  # a heuristic answer, with no optimality claim


def combined_status(statuses: list[Status]) -> Status:
    """The status of an answer built from several: stopped at the limit if one was,
    optimal only if all were."""
    if any(s is Status.TIME_LIMIT for s in statuses):
        return Status.TIME_LIMIT
    if all(s is Status.OPTIMAL for s in statuses):
        return Status.OPTIMAL
    return Status.FEASIBLE


class Transfer(NamedTuple):
    """A named tuple: a pipelined plan at 1,024 GPUs has a million of them."""

    commodity: int  # index into Problem.commodities
    route: int  # index into Network.routes
    # Departure epoch, or for pipelined plans an order key. A transfer out of a rank
    # must have a larger step than the transfer that brought the chunk there.
    step: int


@dataclass(frozen=True)
class SolveStats:
    variables: int = 0
    constraints: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Plan:
    problem: Problem
    transfers: tuple[Transfer, ...]
    method: str
    status: Status
    epochs: int = 0
    stats: SolveStats = SolveStats()
    # Method-specific facts for the pass's note (bounds, pipeline depth, ...).
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def optimal(self) -> bool:
        return self.status is Status.OPTIMAL
