"""The end-to-end compile: problem -> schedule -> verified -> backend files -> report.

This is the top of the pipeline (with the commands): the only place under collc/
besides the commands that reaches the backends. Tools that write a backend's files
(`collc profile --library`) go through `emit_library` here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from collc import frontend, idle
from collc.analysis.bounds import LowerBounds, lower_bounds
from collc.analysis.ring_time import ring_allreduce_time
from collc.analysis.simulate import simulate
from collc.backends import BackendOptions, Library, LibraryBand, LibraryRequest, get_backend
from collc.diagnostics import CollcError, Span
from collc.frontend.demand import demand_request, direct_schedule
from collc.ir.collective import Collective, CollectiveKind
from collc.ir.heap import few_collections
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.io import written_in_child
from collc.limits import exceeded, int_limit
from collc.parallel import in_child
from collc.passes.base import CompileUnit, PassManager, parse_pipeline
from collc.report import Baseline, build_report
from collc.synthesis.nodes import OverNodes
from collc.verify import load_array_form, verify


@dataclass(frozen=True)
class CompileJob:
    """One thing to compile: a collective on a topology at a size, and how to route it."""

    topology: Topology
    collective: Collective
    size_bytes: int
    algorithm: str | None = None  # a hand-written algorithm's name (stdlib or file)
    schedule: Schedule | None = None  # its instantiated schedule, when the front end made it
    pipeline: str = "synthesize"  # passes that produce the schedule when there is no algorithm
    span: Span | None = None
    base_dir: Path | None = None


@dataclass
class CompileResult:
    unit: CompileUnit
    report: dict[str, Any]
    outputs: list[Path] = field(default_factory=list)


def schedule_pipeline(job: CompileJob) -> str:
    return "verify" if job.algorithm else f"{job.pipeline},verify"


def _capped(passes: list, max_ops: int | None, max_peers: int | None = None,
            peer_limit: int | None = None, landings: bool = True, over_nodes: bool = True) -> list:
    """The pipeline with its synthesize pass limited to `max_ops` ops, where the user set
    neither chunks nor max_ops, and to `max_peers` peers per GPU (where a GPU would
    otherwise have more than `peer_limit`), where the user did not set it (a choice the
    user made is never overridden); with `landings` False, a ReduceScatter's partial
    sums chained; with `over_nodes` False, the flat composition where the user left the
    choice to `auto`."""
    out = []
    for p in passes:
        if p.name == "synthesize":
            if max_ops is not None and p.chunks == 0 and p.max_ops == type(p).max_ops:
                p = replace(p, max_ops=max_ops)
            if max_peers is not None and p.max_peers == type(p).max_peers:
                p = replace(p, max_peers=max_peers, peer_limit=peer_limit or 0)
            if not landings:
                p = replace(p, landings=False)
            if not over_nodes and p.nodes == OverNodes.AUTO.value:
                p = replace(p, nodes=OverNodes.OFF.value)
        out.append(p)
    return out


def _verified_later(passes: list) -> list | None:
    """The default pipeline (a synthesize pass, then the race-checked verify) with the
    verification left to the caller: the synthesize pass alone, told not to verify.
    None for any other pipeline."""
    if (len(passes) == 2 and passes[0].name == "synthesize" and passes[0].verify
            and passes[1].name == "verify" and passes[1].races):
        return [replace(passes[0], verify=False)]
    return None


def produce_schedule(job: CompileJob, max_ops: int | None = None, max_peers: int | None = None,
                     peer_limit: int | None = None, landings: bool = True, verified: bool = True,
                     over_nodes: bool = True) -> tuple[CompileUnit, dict[str, Any] | None]:
    """Run the schedule-producing passes; return the unit and the solver's facts (if any).
    `verified` False: the default pipeline's schedule comes back unverified (the unit
    says so), for the caller to verify; any other pipeline verifies as usual."""
    unit = CompileUnit(job.topology, job.collective, job.size_bytes)
    if job.algorithm:
        t0 = time.perf_counter()
        # The front end verifies an algorithm's schedule on this topology when it builds it.
        schedule = job.schedule or frontend.instantiate_algorithm(job.algorithm, job.topology, job.collective,
                                                                  job.base_dir)
        unit = unit.with_verified(schedule).with_note("verify", ok=True, ops=len(schedule.ops))
        solver = {"method": f"algorithm {job.algorithm}", "seconds": time.perf_counter() - t0,
                  "status": "hand-written", "optimal": None, "epochs": None, "variables": 0, "constraints": 0}
        return unit, solver
    passes = parse_pipeline(schedule_pipeline(job), job.span)
    if max_ops is not None or max_peers is not None or not landings or not over_nodes:
        passes = _capped(passes, max_ops, max_peers, peer_limit, landings, over_nodes)
    later = None if verified else _verified_later(passes)
    if later is not None:
        unit = PassManager(later, verify_between=False).run(unit)
    else:
        unit = PassManager(passes).run(unit)
    return unit, unit.notes.get("synthesize")


# Halvings of a backend's op budget tried before its limit error reaches the user.
BUDGET_RETRIES = 4


def schedule_for_backend(job: CompileJob, back, options: BackendOptions,
                         verified: bool = True) -> tuple[CompileUnit, dict[str, Any] | None]:
    """Produce the schedule and run the backend's lowering. A synthesized schedule is
    kept within the backend's op budget, and on a cluster where a GPU could have more
    peers than the runtime takes, within its peers per GPU wherever the packing would
    exceed them; while lowering hits the runtime's limits, it is asked for at most the
    backend's peers per GPU (once, where a GPU had too many peers), else for half the
    ops, or, where a ReduceScatter's landed partial sums leave no fewer ops to ask for,
    for its sums chained (fewer steps); a ReduceScatter that `auto` composed over nodes
    is asked for flat instead (halving the budget would give the same schedule)."""
    lowering = back.lowering(options)
    budget = back.op_budget(job.collective.ranks) if back.op_budget and not job.algorithm else None
    limit = _peer_limit(job, back, options) if budget is not None else None
    peers: int | None = back.peer_budget if limit is not None else None
    forced = False  # max_peers applied whatever the packing
    landings = True  # a ReduceScatter's partial sums may land in scratch (collc.synthesis.compose)
    halved_from: float = float("inf")  # ops of the schedule refused when the op budget was last halved
    refused: list[str] = []  # why the runtime refused earlier schedules, for the report
    over_nodes = True  # `auto` may compose a ReduceScatter over nodes
    for attempt in range(BUDGET_RETRIES + 1):
        # Lowering passes start from a verified schedule: only a backend without them
        # may leave the verification to the caller.
        unit, solver = produce_schedule(job, budget, peers, None if forced else limit, landings,
                                        verified=verified or bool(lowering), over_nodes=over_nodes)
        if not lowering:
            return unit, solver
        ops = len(unit.schedule.ops)
        # The pass manager gets the only reference to the schedule: the first lowering
        # pass (msccl-merge) replaces it, and the ops it replaced (3 million at 1,024
        # ranks, over a GiB of objects) are freed then rather than kept through the rest
        # of the lowering. A retry produces its schedule again.
        handed = [unit]
        del unit
        try:
            lowered = PassManager(parse_pipeline(lowering)).run(handed.pop())
        except Exception as exc:
            if (budget is None or back.limit_error is None or not isinstance(exc, back.limit_error)
                    or attempt == BUDGET_RETRIES):
                raise
            refused.append(str(exc))
            if (not forced and back.peer_budget and back.peer_limit_error is not None
                    and isinstance(exc, back.peer_limit_error)):
                peers, forced = back.peer_budget, True
                halved_from = float("inf")
                continue
            if (over_nodes and job.collective.kind is CollectiveKind.REDUCESCATTER
                    and "over_nodes" in (solver or {}) and _nodes_auto(job)):
                # Its op count does not follow the budget: the flat composition instead.
                over_nodes = False
                continue
            # A halved budget that gave no fewer ops (synthesis is at its fewest chunks
            # already: AllToAll at one chunk per pair) would give the same schedule on
            # every further try, each a whole synthesis: fail now. At one chunk the
            # budget has nothing left to halve, so that is known without trying (a
            # 1,024-GPU AllReduce spent 7 minutes finding it out).
            if ops <= job.collective.ranks or ops >= halved_from or (solver or {}).get("chunks") == 1:
                if not (solver or {}).get("landings"):
                    raise
                # The landings' local adds are the steps left to give up (one chunk per
                # rank, where a 1,024-GPU ReduceScatter is): chained, each partial sum
                # is one step fewer at the rank that adds it.
                landings = False
                continue
            halved_from = ops
            budget = max(1, min(budget, ops) // 2)
            continue
        if refused and solver is not None:
            # The schedule the user gets was asked for within these limits, after the
            # runtime refused the ones before it.
            solver = {**solver, "backend_max_ops": budget, "backend_max_peers": peers, "refused_by_backend": refused,
                      **({} if landings else {"backend_landings": False}),
                      **({} if over_nodes else {"backend_over_nodes": False}),
                      **({"backend_peer_limit": limit} if limit is not None and not forced else {})}
        elif limit is not None and solver is not None:
            solver = {**solver, "backend_peer_limit": limit, "backend_max_peers": peers}
        return lowered, solver
    raise AssertionError("unreachable")


def _nodes_auto(job: CompileJob) -> bool:
    """Whether the job's synthesize pass leaves the composition over nodes to `auto`."""
    return any(p.name == "synthesize" and p.nodes == OverNodes.AUTO.value
               for p in parse_pipeline(schedule_pipeline(job), job.span))


def _peer_limit(job: CompileJob, back, options: BackendOptions) -> int | None:
    """The most peers a GPU may have on the backend's runtime, where some GPU of this
    cluster could have more (it has more other GPUs than that); None otherwise."""
    if back.peer_limit is None or not back.peer_budget:
        return None
    limit = back.peer_limit(job.topology, options)
    return limit if limit is not None and job.collective.ranks - 1 > limit else None


def _is_stdlib_instance(schedule: Schedule | None, name: str) -> bool:
    """Whether `schedule` is the standard library's algorithm `name` without arguments
    (what a baseline would instantiate again: at 1,024 ranks that costs seconds)."""
    return (schedule is not None and schedule.meta.get("source") == "algorithm"
            and schedule.meta.get("stdlib") is True and schedule.meta.get("algorithm") == name
            and schedule.name == name)


def baseline_time(schedule: Schedule, topology: Topology, size_bytes: int) -> float:
    """A hand-written baseline's time on the model, in its best case. Under fifo sharing a
    link serves transfers in the order the algorithm happens to list them; where a GPU
    sends or receives several transfers in one step (a direct AllToAll), NCCL has them
    all in flight and the hardware interleaves them, so the baseline is also timed with
    fair sharing and the faster kept: collc's reported speedups are never inflated by
    the op order of an algorithm file."""
    fifo = simulate(schedule, topology, size_bytes).time_s
    if not _concurrent_transfers(schedule):
        return fifo
    return min(fifo, simulate(schedule, topology, size_bytes, sharing="fair").time_s)


def _concurrent_transfers(schedule: Schedule) -> bool:
    seen: set[tuple[int, int, str]] = set()
    for op in schedule.ops:
        if op.src.rank == op.dst.rank:
            continue
        for key in ((op.step, op.src.rank, "out"), (op.step, op.dst.rank, "in")):
            if key in seen:
                return True
            seen.add(key)
    return False


def baselines_for(job: CompileJob, schedule: Schedule | None = None,
                  schedule_time_s: float | None = None) -> list[Baseline]:
    """The stdlib's hand-written algorithms for this collective, timed on the same model.
    `schedule`, the job's own when it is one of them, is reused rather than rebuilt, and
    so is its simulated time `schedule_time_s` when the caller has it."""
    if job.collective.demand is not None:
        return [_demand_direct(job)]
    out = []
    for name in frontend.algorithms_for(job.collective.name):
        try:
            if _is_stdlib_instance(schedule, name) and schedule.collective == job.collective:
                t = (schedule_time_s if schedule_time_s is not None
                     else simulate(schedule, job.topology, job.size_bytes).time_s)
            else:
                t = ring_allreduce_baseline(job) if name == "ring" else None
                if t is None:
                    sched = frontend.instantiate_algorithm(name, job.topology, job.collective)
                    t = baseline_time(sched, job.topology, job.size_bytes)
            out.append(Baseline(name, t))
        except CollcError as exc:
            out.append(Baseline(name, None, exc.message))
    return out


def ring_allreduce_baseline(job: CompileJob) -> float | None:
    """The ring baseline of an AllReduce without building the ring's schedule
    (`collc.analysis.ring_time`: the same time, where its conditions hold); None where
    it must be built and simulated (which also words any error)."""
    if job.collective.kind is not CollectiveKind.ALLREDUCE:
        return None
    try:
        ring = frontend.find_ring(job.topology)
    except CollcError:
        return None
    return ring_allreduce_time(job.topology, job.collective, job.size_bytes, ring)


def demand_job(topology_spec: str, path: str, size_bytes: int | None, backend: str, pipeline: str) -> CompileJob:
    """`collc compile --topology T --demand M.csv [--size S]`: the matrix's AllToAllv,
    entries in bytes or in shares of S; for MSCCL XML, whose executor takes equal
    blocks only, the AllToAll with every block padded to the largest."""
    topology = frontend.resolve_topology(topology_spec)
    demand = demand_request(path, topology.num_ranks, size_bytes, backend == "msccl-xml")
    return CompileJob(topology=topology, collective=demand.collective, size_bytes=demand.size_bytes,
                      pipeline=pipeline)


def _demand_direct(job: CompileJob) -> Baseline:
    """A demand matrix's baseline: NCCL's AllToAllv, every block straight to its owner."""
    try:
        return Baseline("direct", baseline_time(direct_schedule(job.collective, job.topology), job.topology,
                                                job.size_bytes))
    except CollcError as exc:
        return Baseline("direct", None, exc.message)


def check_job(job: CompileJob, back, options: BackendOptions) -> None:
    """What can be refused before any schedule is produced (a solve may take minutes):
    a collective the backend cannot express, or nothing for synthesis to do. Errors
    point at the request."""
    if back.check_collective is not None:
        try:
            back.check_collective(job.collective, options)
        except CollcError as err:
            raise type(err)(err.message, err.span or job.span,
                            err.notes + (f"the {back.name} backend cannot take this request",)) from None
    if not job.algorithm:
        for p in parse_pipeline(schedule_pipeline(job), job.span):
            chunks = getattr(p, "chunks", 0) if p.name == "synthesize" else 0
            if chunks and chunks * job.collective.ranks > int_limit("chunks"):
                raise CollcError(f"{chunks:,} chunks per rank on {job.collective.ranks} ranks make "
                                 f"{chunks * job.collective.ranks:,} chunks" + exceeded("chunks"), job.span)
        if job.topology.num_ranks < 2:
            raise CollcError(f"topology '{job.topology.name}' has one GPU: there is nothing to communicate, "
                             "so nothing to synthesize", job.span)
        if _nothing_moves(job.collective):
            raise CollcError(f"collective '{job.collective.name}' needs no data to move between GPUs (every "
                             "rank's outputs come from its own inputs), so there is nothing to synthesize",
                             job.span)


def _nothing_moves(collective: Collective) -> bool:
    for r, outputs in enumerate(collective.outputs):
        own = set().union(*collective.inputs[r]) if collective.inputs[r] else set()
        if any(v is not None and not v <= own for v in outputs):
            return False
    return True


def compile_job(job: CompileJob, backend: str = "json", output: Path | None = None,
                options: BackendOptions | None = None, with_baselines: bool = True,
                prepared: tuple[CompileUnit, dict[str, Any]] | None = None) -> CompileResult:
    """Compile a job and write its outputs; `prepared`: its `prepare_job` result, where
    that was computed already (in a worker process)."""
    options = options or BackendOptions()
    back = get_backend(backend)  # unknown backend: fail before the (maybe long) solve
    if prepared is None:
        prepared = prepare_job(job, backend, options, with_baselines)
    unit, report = prepared
    with few_collections():
        outputs = back.emit(unit, output, options) if output is not None else []
    report["outputs"] = [str(p) for p in outputs]
    return CompileResult(unit, report, outputs)


def prepare_job(job: CompileJob, backend: str = "json", options: BackendOptions | None = None,
                with_baselines: bool = True) -> tuple[CompileUnit, dict[str, Any]]:
    """A job's lowered schedule and its report, nothing written: a work unit that runs
    in a worker process or on a Dask worker as well as here (`collc.parallel`). The
    report (which simulates the schedule) comes before any output: a compile that fails
    anywhere writes nothing."""
    options = options or BackendOptions()
    back = get_backend(backend)
    check_job(job, back, options)
    with few_collections():
        unit, solver = schedule_for_backend(job, back, options)
        assert unit.schedule is not None
        report = make_report(job, unit, solver, backend, [], with_baselines)
    return unit, report


def compile_job_written_while_verified(job: CompileJob, backend: str, output: Path,
                                      options: BackendOptions | None = None,
                                      with_baselines: bool = True) -> CompileResult:
    """`compile_job` of one request in this process, within the command's
    `all_or_nothing()` block: the backend's files are written by forked children
    (`collc.io.written_in_child`) while this process builds the report and, for a
    backend that `emits_unverified` (JSON), verifies the schedule (the README's main
    job: its 9.9 MB of JSON take longer than both). A schedule that fails verification
    raises here, before the block renames anything, and the block removes the
    children's files: nothing is written, as before."""
    options = options or BackendOptions()
    back = get_backend(backend)
    check_job(job, back, options)
    # What needs the request alone: on a large cluster, the lower bounds and baselines
    # in a child process on another core while this one compiles (collc.parallel.in_child);
    # else done where the solver's thread runs and this one would wait (collc.idle), or
    # here when needed: the verifier's array form and the baselines (a hand-written
    # algorithm's schedule is its own baseline: no wait).
    want_baselines = with_baselines and not job.algorithm
    figures = in_child(request_figures, job, want_baselines) \
        if job.topology.num_ranks >= FIGURES_IN_CHILD_RANKS else None
    if back.emits_unverified:
        idle.defer(load_array_form)
    bounds: idle.Deferred[LowerBounds] | None = None
    baselines: idle.Deferred[list[Baseline]] | None = None
    if figures is not None:
        bounds = idle.Deferred(lambda: figures.result()[1])
        baselines = idle.Deferred(lambda: figures.result()[0]) if want_baselines else None
    elif want_baselines:
        baselines = idle.defer(lambda: baselines_for(job))
    try:
        with few_collections():
            unit, solver = schedule_for_backend(job, back, options, verified=not back.emits_unverified)
            assert unit.schedule is not None
            with written_in_child():
                outputs = back.emit(unit, output, options)
            if not unit.verified:
                verify(unit.schedule, unit.topology)
                unit = unit.with_verified(unit.schedule).with_note("verify", ok=True, ops=len(unit.schedule.ops))
            report = make_report(job, unit, solver, backend, [], with_baselines, baselines, bounds)
    finally:
        if figures is not None:
            figures.cancel()  # a compile that failed no longer needs them
    report["outputs"] = [str(p) for p in outputs]
    return CompileResult(unit, report, outputs)


# From this many GPUs, a compile's lower bounds and baselines are worked out in a child
# process (`request_figures`) while the schedule is made: on dgx_h100 they take 0.85 s
# at 128 GPUs, 1.2 s at 256 and about 35 s at 1,024 (the bounds' cut search and latency
# distances, the ring baseline's search), against the few milliseconds of a fork early
# in the command, when the heap is still small.
FIGURES_IN_CHILD_RANKS = 128


def request_figures(job: CompileJob, with_baselines: bool) -> tuple[list[Baseline] | None, LowerBounds]:
    """What a compile's report needs from the request alone: its baselines (if asked
    for) and its lower bounds."""
    baselines = baselines_for(job) if with_baselines else None
    return baselines, lower_bounds(job.topology, job.collective, job.size_bytes)


def schedule_job(job: CompileJob, backend: str, options: BackendOptions) -> tuple[CompileUnit, dict[str, Any] | None]:
    """`schedule_for_backend` with the backend by name: a work unit (`collc.parallel`)."""
    return schedule_for_backend(job, get_backend(backend), options)


def emit_library(backend: str, bands: list[LibraryBand], directory: Path, options: BackendOptions | None = None,
                 *, open_ended: bool = False, verify: bool = True) -> Library:
    """Write a size-band library through the backend (see `LibraryRequest`): all its
    files or none."""
    back = get_backend(backend)
    if back.emit_library is None:
        raise CollcError(f"the {back.name} backend writes no size-band libraries")
    request = LibraryRequest(tuple(bands), Path(directory), open_ended=open_ended, verify=verify)
    return back.emit_library(request, options or BackendOptions())


def make_report(job: CompileJob, unit: CompileUnit, solver: dict[str, Any] | None, backend: str,
                outputs: list[Path], with_baselines: bool = True,
                early_baselines: idle.Deferred[list[Baseline]] | None = None,
                early_bounds: idle.Deferred[LowerBounds] | None = None) -> dict[str, Any]:
    """The job's report. `early_baselines`: `baselines_for(job)`, computed before the
    schedule was there; used unless the schedule is a stdlib algorithm's (the baseline
    of that name is then the schedule itself, as `baselines_for` times it).
    `early_bounds`: the job's `lower_bounds`, computed before the schedule was there."""
    schedule = unit.schedule
    assert schedule is not None
    sim = simulate(schedule, job.topology, job.size_bytes)
    if not with_baselines:
        baselines = []
    elif early_baselines is not None and schedule.meta.get("source") != "algorithm":
        baselines = early_baselines.result()
    else:
        baselines = baselines_for(job, schedule, sim.time_s)
    bounds = early_bounds.result() if early_bounds is not None else \
        lower_bounds(job.topology, job.collective, job.size_bytes)
    transfers = schedule.num_transfers
    stats = {"name": schedule.name, "ops": len(schedule.ops), "transfers": transfers,
             "steps": schedule.num_steps, "chunks_per_rank": schedule.collective.chunks}
    util = {f"{a}->{b}": u for (a, b), u in sim.utilization().items()}
    return build_report(
        collective=schedule.collective, requested=job.collective, topology_name=job.topology.name,
        size_bytes=job.size_bytes, time_s=sim.time_s, bounds=bounds, solver=solver,
        baselines=baselines, schedule_stats=stats,
        link_utilization=util, outputs=[str(p) for p in outputs], backend=backend)


def reverify(schedule: Schedule, topology: Topology) -> None:
    """Re-run the symbolic check (used before writing anything)."""
    verify(schedule, topology)
