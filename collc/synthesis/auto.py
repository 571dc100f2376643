"""Running one method, or choosing among several (method auto).

auto decides by problem and message size. The steady-state method suits large messages
(bandwidth-bound: many pipelined chunks); the time-expanded MILP suits small ones
(latency-bound: few chunks, few hops), while its model is small enough to solve; rounds
take over where it is not. Every candidate is timed under the alpha-beta model and the
fastest schedule wins, so a poor guess costs solver time, never schedule quality.
"""

from __future__ import annotations

import time
from dataclasses import replace

from collc.diagnostics import CollcError, SolverError
from collc.ir.collective import Collective
from collc.synthesis.core import Candidate, Method, SynthesisOptions, chunk_choices, problem_for, realize
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, SolveStats, Status
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timexp import EpochGrid, State, greedy, make_grid

# The exact MILP is tried while chunk x route x epoch stays below this.
MILP_VARIABLES = 40_000
# Rounds are tried while one epoch of the model (chunks x routes) stays below this.
ROUNDS_VARIABLES = 200_000
# Pipelining stops splitting chunks below this size: per-transfer costs the alpha-beta
# model leaves out (kernel steps, synchronization) would dominate smaller ones.
MIN_PIPELINED_SLOT = 32 * 1024
# ... and when a doubling gains less than this fraction.
MIN_GAIN = 0.002
# The share of the time auto gives the steady-state method before trying the others.
STEADY_SHARE = 0.85
# A steady-state schedule this close to the lower bound ends the search.
NEAR_BOUND = 0.05
# At most this long rounding shares to whole chunks (a small MILP).
WHOLE_COUNTS_SECONDS = 2.0
# Time the verifier and the rest of the pass need per op, kept free of the search.
SECONDS_PER_OP_AFTER = 20e-6


def run_method(method: Method, problem: Problem, options: SynthesisOptions, deadline: Deadline,
               progress: Progress, grid: EpochGrid | None = None) -> Plan:
    if method is Method.STEADY:
        from collc.synthesis.steady import pipelined_plan, solve_rates

        rates = solve_rates(problem, options.solver, deadline, progress)
        return pipelined_plan(problem, rates, options.solver, min(WHOLE_COUNTS_SECONDS, 0.1 * deadline.remaining()))
    grid = grid or make_grid(problem)
    if method is Method.MILP:
        from collc.synthesis.milp import solve_milp

        return solve_milp(problem, grid, options.solver, deadline, progress, epochs=options.epochs)
    if method is Method.LP:
        from collc.synthesis.lp import solve_lp

        return solve_lp(problem, grid, options.solver, deadline, progress)
    if method is Method.ROUNDS:
        from collc.synthesis.rounds import solve_rounds

        return solve_rounds(problem, grid, options.solver, deadline, progress, window=options.epochs)
    if method is Method.GREEDY:
        state = State.initial(problem)
        transfers = greedy(problem, grid, state)
        return Plan(problem, tuple(transfers), "greedy", Status.FEASIBLE, state.finish_epoch(),
                    SolveStats(seconds=deadline.elapsed()), {"epoch_seconds": grid.tau})
    raise CollcError(f"unknown synthesis method '{method.value}'")


def choose(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
           deadline: Deadline, progress: Progress) -> Candidate:
    choices = chunk_choices(collective, options.chunks)
    if options.method is Method.STEADY:
        return _best_steady(network, collective, size_bytes, options, deadline, progress, choices)
    if options.method is not Method.AUTO:
        chunks = choices[0] if choices else collective.chunks
        problem = problem_for(network, collective, size_bytes, chunks)
        return realize(run_method(options.method, problem, options, deadline, progress), options.timing)
    return _auto(network, collective, size_bytes, options, deadline, progress, choices)


def _auto(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
          deadline: Deadline, progress: Progress, choices: list[int] | None) -> Candidate:
    from collc.synthesis.steady import NotApplicable

    base_chunks = choices[0] if choices else collective.chunks
    base = problem_for(network, collective, size_bytes, base_chunks)
    found: list[Candidate] = []
    # Steady state first: its LP is quick, and for large messages nothing beats it.
    try:
        share = Deadline(deadline.remaining() * STEADY_SHARE)
        found.append(_best_steady(network, collective, size_bytes, options, share, progress, choices))
    except (NotApplicable, SolverError):
        pass  # the time-expanded methods below still answer
    bound = _lower_bound(network, base, size_bytes)
    if found and found[0].estimate_s <= bound * (1 + NEAR_BOUND):
        # Bandwidth decides, and pipelining is near the bound: a time-expanded model of
        # few chunks cannot do better.
        return found[0]
    grid = make_grid(base)
    method = _time_expanded_method(base, grid, len(base.commodities) * len(network.routes))
    if method is not None and not deadline.expired:
        found.append(realize(run_method(method, base, options, deadline, progress, grid), options.timing))
    if not found:
        plan = run_method(Method.GREEDY, base, options, deadline, progress, grid)
        found.append(realize(plan, options.timing))
    return min(found, key=lambda c: (c.estimate_s, c.plan.method))


def _lower_bound(network: Network, problem: Problem, size_bytes: int) -> float:
    from collc.analysis.bounds import lower_bounds

    return lower_bounds(network.topology, problem.collective, size_bytes).best_s


def _time_expanded_method(problem: Problem, grid: EpochGrid, per_epoch: int) -> Method | None:
    if per_epoch > ROUNDS_VARIABLES:
        return None
    state = State.initial(problem)
    greedy(problem, grid, state)
    if per_epoch * max(1, state.finish_epoch()) <= MILP_VARIABLES:
        return Method.MILP
    return Method.ROUNDS


def _best_steady(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
                 deadline: Deadline, progress: Progress, choices: list[int] | None) -> Candidate:
    """Steady-state rates, then pipelines of more and more chunks while they get faster
    (each doubling halves the fill; op count and per-transfer latency eventually win).

    The rate LP has many optimal packings, and the list scheduler pipelines some much
    better than others; while time remains, packings that leave links different
    amounts of slack are tried too, at the chunk counts around the best so far."""
    from collc.synthesis.steady import SPREADS, solve_rates

    base_chunks = choices[0] if choices else collective.chunks
    base = problem_for(network, collective, size_bytes, base_chunks)
    per_chunk = max(1, base.deliveries) / base_chunks
    counts = [base_chunks] if choices else _doublings(base_chunks, per_chunk, base.slot_bytes, options.max_ops)
    best: Candidate | None = None
    tried: list[tuple[float, int]] = []
    lp_seconds = 0.0
    for spread in SPREADS:
        if best is not None:
            near = [c for c in counts if best.chunks <= c <= best.chunks * 2]
            # Another packing costs its LP and pipelines of the best one's size and twice it.
            cost = lp_seconds + 3 * best.plan.facts["pipeline_seconds"]
            if deadline.remaining() < cost or best.estimate_s <= best.plan.facts["fluid_s"] * (1 + MIN_GAIN):
                break
        else:
            near = counts
        t0 = time.monotonic()
        progress.stage(f"steady: rate LP (links above {spread:.0%} of T pay extra)")
        rates = solve_rates(base, options.solver, deadline, progress, spread=spread)
        lp_seconds = time.monotonic() - t0
        cand = _pipeline_search(network, collective, size_bytes, options, deadline, progress, rates, near, base)
        tried.extend((spread, c) for c in cand.plan.facts["steady_chunks_tried"])
        if best is None or cand.estimate_s < best.estimate_s:
            best = cand
        if rates.kind == "paths":
            break  # the slack price shapes tree packings only; flows have nothing to vary
    assert best is not None
    facts = {**best.plan.facts, "steady_tried": [f"spread {s:.2f}, {c} chunks" for s, c in tried]}
    return replace(best, plan=replace(best.plan, facts=facts))


def _pipeline_search(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
                     deadline: Deadline, progress: Progress, rates, counts: list[int], base: Problem) -> Candidate:
    from collc.synthesis.steady import pipelined_plan

    def build(problem: Problem) -> Candidate:
        rounding = min(WHOLE_COUNTS_SECONDS, 0.1 * deadline.remaining())
        return realize(pipelined_plan(problem, rates, options.solver, rounding), options.timing)

    best: Candidate | None = None
    per_op = 0.0
    tried: list[int] = []
    for chunks in counts:
        if best is not None:
            # Stop before a pipeline whose construction would not fit in the time left.
            ops = len(best.ops.ops) * chunks / best.chunks
            if ops * (per_op + SECONDS_PER_OP_AFTER) > deadline.remaining():
                break
        progress.stage(f"steady: pipelining {chunks} chunks per rank")
        problem = base if chunks == base.collective.chunks else problem_for(network, collective, size_bytes, chunks)
        t0 = time.monotonic()
        cand = build(problem)
        spent = time.monotonic() - t0
        cand = replace(cand, plan=replace(cand.plan, facts={**cand.plan.facts, "pipeline_seconds": spent}))
        per_op = spent / max(1, len(cand.ops.ops))
        tried.append(chunks)
        if best is None:
            best = cand
            continue
        gain = 1 - cand.estimate_s / best.estimate_s
        if gain > 0:
            best = cand
        if gain <= MIN_GAIN and chunks > best.chunks:
            break
    assert best is not None
    return replace(best, plan=replace(best.plan, facts={**best.plan.facts, "steady_chunks_tried": tried}))


def _doublings(base: int, deliveries_per_chunk: float, slot_bytes: float, max_ops: int) -> list[int]:
    out = [base]
    while deliveries_per_chunk * out[-1] * 2 <= max_ops and slot_bytes * base / (out[-1] * 2) >= MIN_PIPELINED_SLOT:
        out.append(out[-1] * 2)
    return out
