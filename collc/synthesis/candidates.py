"""What every method answers: a candidate schedule (a plan and its list-scheduled
timeline) and the result a synthesis returns, with the helpers that make them.

Shared by the methods (collc.synthesis.auto, compose, direct, nodes) and the entry
point (collc.synthesis.core), below all of them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from collc.diagnostics import CollcError
from collc.ir.collective import Collective
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.synthesis.extract import OpList, copy_ops
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, Status
from collc.synthesis.problem import Problem, build_problem, refinable, refine
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import Timeline, TimingModel, sequence

# Pipelining stops splitting chunks below this size: per-transfer costs the alpha-beta
# model leaves out (kernel steps, synchronization) would dominate smaller ones.
MIN_PIPELINED_SLOT = 32 * 1024


@dataclass(frozen=True)
class Result:
    schedule: Schedule
    method: str
    status: Status
    seconds: float
    estimate_s: float  # completion time under the alpha-beta model
    epochs: int
    variables: int
    constraints: int
    chunks: int
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def optimal(self) -> bool:
        return self.status is Status.OPTIMAL

    def note(self) -> dict[str, Any]:
        return {"method": self.method, "seconds": round(self.seconds, 3), "status": self.status.value,
                "optimal": self.optimal, "epochs": self.epochs, "variables": self.variables,
                "constraints": self.constraints, "chunks": self.chunks, "estimate_s": self.estimate_s,
                **self.facts}


@dataclass(frozen=True)
class Candidate:
    plan: Plan
    timeline: Timeline  # its ops are made when first asked for: most candidates lose
    scratch: tuple[int, ...]
    estimate_s: float
    chunks: int

    @property
    def ops(self) -> OpList:
        return OpList(self.timeline.ops, self.scratch)


def to_result(cand: Candidate, collective: Collective, topology: Topology, deadline: Deadline) -> Result:
    plan = cand.plan
    coll = plan.problem.collective
    sched = Schedule(
        name=f"{collective.name}-{plan.method}", collective=coll, topology=topology.name, ops=cand.ops.ops,
        scratch=cand.ops.scratch,
        meta={"synthesized_by": "collc.synthesize", "method": plan.method, "status": plan.status.value,
              "epochs": plan.epochs, "chunks": cand.chunks, "estimate_s": cand.estimate_s})
    # A pipelined plan has no epoch grid; its steps are its time line.
    epochs = plan.epochs or sched.num_steps
    return Result(sched, plan.method, plan.status, deadline.elapsed(), cand.estimate_s, epochs,
                  plan.stats.variables, plan.stats.constraints, cand.chunks, dict(plan.facts))


def realize(plan: Plan, timing: TimingModel) -> Candidate:
    """Ops for a plan, ordered and stepped by the list-scheduled timeline."""
    raw = copy_ops(plan)
    timeline = sequence(raw.ops, plan.problem.network, plan.problem.slot_bytes, timing)
    coll = plan.problem.collective
    return Candidate(plan, timeline, raw.scratch, timeline.seconds, coll.chunks)


def problem_for(network: Network, collective: Collective, size_bytes: int, chunks: int) -> Problem:
    coll = refine(collective, chunks) if chunks and chunks != collective.chunks else collective
    return build_problem(coll, network, size_bytes)


def chunk_choices(collective: Collective, requested: int) -> list[int] | None:
    """Chunk counts a method may use: the requested one, or None to let it choose."""
    if requested:
        if not refinable(collective) and requested != collective.chunks:
            raise CollcError(f"collective '{collective.name}' is not a standard collective; its chunks cannot "
                             f"be split (asked for {requested} chunks per rank)")
        return [requested]
    if not refinable(collective):
        return [collective.chunks]
    return None
