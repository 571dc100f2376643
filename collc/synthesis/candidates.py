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
from collc.synthesis.ahead import Steps, finish
from collc.synthesis.extract import OpList, copy_fields_steps
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, Status
from collc.synthesis.problem import Problem, build_problem, refinable, refine
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import Timeline, TimingModel, sequence_fields_steps

# Pipelining stops splitting chunks below this size: per-transfer costs the alpha-beta
# model leaves out (kernel steps, synchronization) would dominate smaller ones.
MIN_PIPELINED_SLOT = 32 * 1024
# A custom collective's pieces may be split down to this size instead where latency
# decides its time (collc.synthesis.auto, LATENCY_BOUND): its few
# destinations sit behind routes whose latencies differ by a hop or two (1.4 us through
# an NVSwitch), and dealing pieces by latency (collc.synthesis.steady.pipelining.
# latency_counts) evens out such differences only with pieces whose time on the
# narrowest link is well under them. A 32 KiB piece holds a 12.5 GB/s NIC for 2.6 us
# and no schedule of such pieces brings the README's fan_out at 1 MiB within 1.05 of
# its latency bound (docs/lower-bounds.md); a 4 KiB piece holds it for 0.33 us. The
# per-transfer costs the model leaves out weigh more at this size: the JSON and CuPy
# backends run such schedules (the MSCCL XML backend takes only standard collectives).
MIN_CUSTOM_SLOT = 4 * 1024


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
    return finish(realize_steps(plan, timing))


def realize_steps(plan: Plan, timing: TimingModel) -> Steps[Candidate]:
    """`realize` in steps, for work begun ahead of a solve's end (collc.synthesis.ahead).
    Its last step, giving the ops their final steps, is optional: a search times many
    candidates and keeps one, so it is done ahead only while the solve still runs."""
    fields, scratch = yield from copy_fields_steps(plan)
    yield
    timeline = yield from sequence_fields_steps(fields, plan.problem.network, plan.problem.slot_bytes, timing)
    coll = plan.problem.collective
    candidate = Candidate(plan, timeline, scratch, timeline.seconds, coll.chunks)
    if (yield):
        candidate.timeline.ops  # made now (cached), while the solve's thread runs
    return candidate


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
