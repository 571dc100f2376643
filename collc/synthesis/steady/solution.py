"""What a steady-state rate LP answers, and the classes of data it is solved for.

A class is every chunk that starts at one rank and goes to the same destinations: the
rate LP finds, per class, the structures (trees or paths) that carry its data and the
share of it each carries.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from collc.synthesis.plan import SolveStats, Status
from collc.synthesis.signals import NotApplicable
from collc.synthesis.problem import Problem


@dataclass(frozen=True)
class RateSolution:
    """The rate LP's answer: per class, the structures that carry its data and their shares."""

    seconds: float  # T: the collective's time in the fluid limit
    shares: dict[tuple, list[tuple[tuple[int, ...], float]]]  # class -> [(routes of a tree/path, share)]
    depth: dict[tuple[int, ...], tuple[int, ...]]  # a tree's routes -> depth of each receiving rank
    status: Status
    stats: SolveStats
    kind: str  # "trees" | "paths"
    replicated: int = 0  # representatives the LP was solved for (0: every source)
    # Replicated: the representatives' own structures. Every other structure is the image
    # of one under an automorphism, whose links have the same latencies and bandwidths,
    # so whatever depends only on route times (pipeline_fill) is computed on these.
    representative_structures: tuple[tuple[int, ...], ...] = ()
    # Where a peer limit was checked: the most peers a GPU had without max_peers, and
    # whether max_peers was then applied.
    peers_without_limit: int = 0
    peers_limited: bool = False


def class_key(problem: Problem, k: int) -> tuple:
    c = problem.commodities[k]
    return (c.holders[0], c.demand)


def check_applicable(problem: Problem) -> None:
    if not problem.single_source:
        raise NotApplicable("the steady-state method needs every chunk to start at one rank only")


def class_bytes(problem: Problem) -> dict[tuple, float]:
    out: dict[tuple, float] = defaultdict(float)
    for k, c in enumerate(problem.commodities):
        if c.demand:
            out[class_key(problem, k)] += problem.slot_bytes
    return dict(sorted(out.items()))

