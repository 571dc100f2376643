"""What the tools ask of the compiler: a collective's schedule timed on a topology, and
the NCCL-style baselines `collc compile` reports beside it.

`collc profile` times a job's mix on a cluster model and `collc pipeline` times each
stage's gradient collective; both go through here rather than into the driver, so that
they time a collective exactly as `collc compile` does (the same passes, the same
verification, the same baselines) without depending on how a compile is put together.
This module sits beside the driver, above the tools: nothing below the tools imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from collc.analysis.simulate import Simulation, simulate
from collc.driver import CompileJob, baselines_for, produce_schedule
from collc.ir.collective import Collective
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.passes.base import CompileUnit
from collc.report import Baseline

__all__ = ["Baseline", "TimedSchedule", "baselines", "time_collective"]


@dataclass(frozen=True)
class TimedSchedule:
    """A collective's schedule on a topology and its simulation at one size."""

    unit: CompileUnit  # the compile unit the schedule came from (verified)
    solver: dict[str, Any] | None  # the synthesize pass's facts; for an algorithm, how it was built
    simulation: Simulation  # on collc's alpha-beta model, links served first come, first served

    @property
    def schedule(self) -> Schedule:
        assert self.unit.schedule is not None  # produce_schedule always leaves one
        return self.unit.schedule

    @property
    def time_s(self) -> float:
        return self.simulation.time_s


def time_collective(topology: Topology, collective: Collective, size_bytes: int, *,
                    algorithm: str | None = None, pipeline: str = "synthesize",
                    max_ops: int | None = None) -> TimedSchedule:
    """The schedule `collc compile` would produce for `collective` on `topology` at
    `size_bytes`, verified and simulated: the standard library's (or a file's) hand-written
    `algorithm` when given, else the schedule the `pipeline` of passes synthesizes, with
    at most `max_ops` ops where the pipeline sets neither chunks nor an op budget.

    Raises CollcError when there is no such schedule (the algorithm does not run on this
    topology, the solver finds nothing)."""
    job = CompileJob(topology, collective, size_bytes, algorithm=algorithm, pipeline=pipeline)
    unit, solver = produce_schedule(job, max_ops=max_ops)
    assert unit.schedule is not None
    return TimedSchedule(unit, solver, simulate(unit.schedule, topology, size_bytes))


def baselines(topology: Topology, collective: Collective, size_bytes: int) -> list[Baseline]:
    """Every standard-library algorithm for `collective`, timed as `collc compile` reports
    its baselines (an algorithm that sends several transfers at once from one GPU in its
    best case under fair link sharing); one that does not run on `topology` carries its
    error instead of a time."""
    return baselines_for(CompileJob(topology, collective, size_bytes))
