"""Running one method, or choosing among several (method auto).

auto decides by problem and message size. The steady-state method suits large messages
(bandwidth-bound: many pipelined chunks); the time-expanded MILP suits small ones
(latency-bound: few chunks, few hops), while its model is small enough to solve; rounds
take over where it is not. Every candidate is timed under the alpha-beta model and the
fastest schedule wins, so a poor guess costs solver time, never schedule quality.
"""

from __future__ import annotations

from dataclasses import replace

from collc.diagnostics import CollcError
from collc.ir.collective import Collective
from collc.synthesis.core import Candidate, Method, SynthesisOptions, chunk_choices, problem_for, realize
from collc.synthesis.network import Network
from collc.synthesis.plan import Plan, SolveStats, Status
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timexp import EpochGrid, State, greedy, make_grid

# Most ops a synthesized schedule may have (backends and the verifier stay fast).
OP_BUDGET = 300_000
# The exact MILP is tried while chunk x route x epoch stays below this.
MILP_VARIABLES = 40_000
# Rounds are tried while one epoch of the model (chunks x routes) stays below this.
ROUNDS_VARIABLES = 200_000
# Pipelining stops splitting chunks below this size: per-transfer costs the alpha-beta
# model leaves out (kernel steps, synchronization) would dominate smaller ones.
MIN_PIPELINED_SLOT = 32 * 1024
# ... and when a doubling gains less than this fraction.
MIN_GAIN = 0.002
# The share of the remaining time auto gives the time-expanded methods.
TIME_EXPANDED_SHARE = 0.5


def run_method(method: Method, problem: Problem, options: SynthesisOptions, deadline: Deadline,
               progress: Progress, grid: EpochGrid | None = None) -> Plan:
    if method is Method.STEADY:
        from collc.synthesis.steady import pipelined_plan, solve_rates

        return pipelined_plan(problem, solve_rates(problem, options.solver, deadline, progress))
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
    # Time-expanded first, on part of the time: small problems are solved exactly here.
    share = Deadline(deadline.remaining() * TIME_EXPANDED_SHARE)
    grid = make_grid(base)
    per_epoch = len(base.commodities) * len(network.routes)
    method = _time_expanded_method(base, grid, per_epoch)
    if method is not None:
        found.append(realize(run_method(method, base, options, share, progress, grid), options.timing))
    try:
        found.append(_best_steady(network, collective, size_bytes, options, deadline, progress, choices))
    except NotApplicable:
        pass
    if not found:
        plan = run_method(Method.GREEDY, base, options, deadline, progress, grid)
        found.append(realize(plan, options.timing))
    return min(found, key=lambda c: (c.estimate_s, c.plan.method))


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
    """The steady-state rates once, then pipelines of more and more chunks while they
    get faster (each doubling halves the fill; the op count and per-transfer latency
    eventually win)."""
    from collc.synthesis.steady import pipelined_plan, solve_rates

    base_chunks = choices[0] if choices else collective.chunks
    base = problem_for(network, collective, size_bytes, base_chunks)
    rates = solve_rates(base, options.solver, deadline, progress)
    per_chunk = max(1, base.deliveries) / base_chunks
    counts = [base_chunks] if choices else _doublings(base_chunks, per_chunk, base.slot_bytes)
    best = realize(pipelined_plan(base, rates), options.timing)
    tried = [base_chunks]
    worse = 0
    for chunks in counts[1:]:
        if deadline.expired or worse >= 1:
            break
        progress.stage(f"steady: pipelining {chunks} chunks per rank")
        problem = problem_for(network, collective, size_bytes, chunks)
        cand = realize(pipelined_plan(problem, rates), options.timing)
        tried.append(chunks)
        gain = 1 - cand.estimate_s / best.estimate_s
        if gain > 0:
            best = cand
        worse = 0 if gain > MIN_GAIN else worse + 1
    facts = {**best.plan.facts, "steady_chunks_tried": tried}
    return replace(best, plan=replace(best.plan, facts=facts))


def _doublings(base: int, deliveries_per_chunk: float, slot_bytes: float) -> list[int]:
    out = [base]
    while deliveries_per_chunk * out[-1] * 2 <= OP_BUDGET and slot_bytes * base / (out[-1] * 2) >= MIN_PIPELINED_SLOT:
        out.append(out[-1] * 2)
    return out
