"""Synthesis from a topology, a collective and a message size to a verified schedule.

`synthesize` is what the `synthesize` pass calls. It refines standard collectives into
more chunks where that helps, composes collectives with reductions from copy-only ones
(collc.synthesis.compose), runs the requested method, or for `auto` the candidates that
fit the problem, times every candidate under the alpha-beta model and keeps the fastest.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.synthesis.extract import OpList, copy_ops
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, Status
from collc.synthesis.problem import Problem, build_problem, refinable, refine
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline, SolverOptions
from collc.synthesis.timing import DEFAULT_MODEL, Timeline, TimingModel, sequence
from collc.verify import verify


# The share of the time limit kept for building and verifying the schedule.
FINISHING_SHARE = 0.1


class Method(str, Enum):
    """Synthesis methods; the values are the pass option's tokens."""

    AUTO = "auto"
    MILP = "milp"  # exact time-expanded MILP (TE-CCL)
    LP = "lp"  # time-expanded LP relaxation, rounded to whole-chunk paths
    ROUNDS = "rounds"  # windows of epochs solved one after another
    STEADY = "steady"  # steady-state rate LP, pipelined over many chunks
    GREEDY = "greedy"  # the list-scheduling heuristic on the epoch grid


@dataclass(frozen=True)
class SynthesisOptions:
    method: Method = Method.AUTO
    chunks: int = 0  # chunks per rank; 0: choose
    time_limit: float = 600.0  # a safety net: the search is bounded by work, not by time
    mip_gap: float = 0.0
    threads: int = 0
    seed: int = 0
    epochs: int = 0  # 0: search from the lower bound
    progress: bool = True
    timing: TimingModel = DEFAULT_MODEL
    # Most ops a schedule may have (the verifier and backends stay fast); pipelining
    # stops splitting chunks before it.
    max_ops: int = 300_000
    # Search stops once a schedule is within this fraction of the lower bound.
    tolerance: float = 0.01
    # Most distinct peers per GPU in a replicated tree packing (0: no limit), applied
    # only where a GPU would otherwise have more than peer_limit (0: always).
    max_peers: int = 0
    peer_limit: int = 0
    # AllReduce over identical nodes (collc.synthesis.nodes): "auto" where the flat
    # composition cannot keep to max_ops, "on", "off".
    nodes: str = "auto"

    @property
    def solver(self) -> SolverOptions:
        return SolverOptions(self.mip_gap, self.threads, self.seed, self.max_peers, self.peer_limit)


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


def synthesize(topology: Topology, collective: Collective, size_bytes: int,
               options: SynthesisOptions = SynthesisOptions(), progress: Progress | None = None) -> Result:
    if size_bytes <= 0:
        raise CollcError(f"cannot synthesize '{collective.name}' for {size_bytes} bytes: the size must be positive")
    if options.nodes == "on" and collective.kind is not CollectiveKind.ALLREDUCE:
        raise CollcError(f"cannot compose '{collective.name}' over nodes (nodes=on): only an AllReduce is, "
                         f"and this is a {collective.kind.value}")
    own_progress = progress is None
    progress = progress if progress is not None else Progress(options.progress)
    # Solvers stop a little early: turning their answer into a verified schedule takes time too.
    deadline = Deadline(options.time_limit * (1 - FINISHING_SHARE))
    try:
        if collective.has_reduction:
            from collc.synthesis.compose import synthesize_with_reductions

            result = synthesize_with_reductions(topology, collective, size_bytes, options, deadline, progress)
        else:
            result = synthesize_copies(Network(topology), collective, size_bytes, options, deadline, progress)
    finally:
        if own_progress:
            progress.close()
    verify(result.schedule, topology)
    # The work done goes into the note and the schedule's meta: two runs that differ
    # can be told apart by it (and a fired safety net shows).
    work = deadline.work.to_json()
    schedule = replace(result.schedule, meta={**result.schedule.meta, "work": work})
    # The same ops, collective and scratch as the schedule just verified: the synthesize
    # pass marks it verified on its compile unit, and nothing runs the check again.
    return replace(result, schedule=schedule, facts={**result.facts, **work})


# --- collectives without reductions -----------------------------------------------

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


def synthesize_copies(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
                      deadline: Deadline, progress: Progress) -> Result:
    from collc.synthesis.auto import choose

    cand = choose(network, collective, size_bytes, options, deadline, progress)
    return to_result(cand, collective, network.topology, deadline)


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
