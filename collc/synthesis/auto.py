"""Running one method, or choosing among several (method auto).

auto decides by problem and message size. The steady-state method suits large messages
(bandwidth-bound: many pipelined chunks); the time-expanded MILP suits small ones
(latency-bound: few chunks, few hops), while its model is small enough to solve; rounds
take over where it is not. Every candidate is timed under the alpha-beta model and the
fastest schedule wins, so a poor guess costs solver time, never schedule quality.
"""

from __future__ import annotations

from dataclasses import replace

from collc.analysis.bounds import LowerBounds, lower_bounds
from collc.diagnostics import CollcError, SolverError
from collc.ir.collective import Collective, CollectiveKind
from collc.synthesis.candidates import (MIN_CUSTOM_SLOT, MIN_PIPELINED_SLOT, Candidate, Result, chunk_choices,
                                       problem_for, realize, realize_steps, to_result)
from collc.synthesis.lp import solve_lp
from collc.synthesis.milp import solve_milp
from collc.synthesis.network import Network
from collc.synthesis.options import Method, SynthesisOptions
from collc.synthesis.plan import Plan, SolveStats, Status
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.rounds import solve_rounds
from collc.synthesis.solver import Deadline
from collc.synthesis.steady.colgen import SPREADS
from collc.synthesis.steady.pipelining import Refinement, pipeline_fill, pipelined_ahead, pipelined_plan
from collc.synthesis.steady.rates import solve_rates
from collc.synthesis.steady.solution import NotApplicable
from collc.synthesis.timexp import EpochGrid, State, greedy, make_grid

# The exact MILP is tried while chunk x route x epoch stays below this.
MILP_VARIABLES = 40_000
# Rounds are tried while one epoch of the model (chunks x routes) stays below this.
ROUNDS_VARIABLES = 200_000
# Pipelining stops splitting chunks below MIN_PIPELINED_SLOT (MIN_CUSTOM_SLOT for a custom
# collective; collc.synthesis.candidates),
# and when a doubling gains less than this fraction.
MIN_GAIN = 0.002
# A custom collective's pieces go under MIN_PIPELINED_SLOT where the cut bound with
# latency is at least this fraction above the best bound (_latency_bound).
LATENCY_BOUND = 0.05
# The share of the time auto gives the steady-state method before trying the others.
STEADY_SHARE = 0.85
# A steady-state schedule this close to the lower bound ends the search.
NEAR_BOUND = 0.05
# Most seconds the time-expanded methods (small messages) get in auto.
TIME_EXPANDED_SECONDS = 60.0
# Steps that try to improve on the first steady-state schedule: at most this many.
MAX_IMPROVEMENTS = 4
# The first steady-state schedule aims this close to the rate LP's time T ...
FIRST_TARGET = 0.02
# ... and a step with more chunks aims at this share of the overhead the tolerance allows.
PREDICTION_MARGIN = 0.8
# The first schedule aims straight at the tolerance when its candidate has at most this
# many ops (building and timing one costs about 30 us per op).
CHEAP_OPS = 40_000


def run_method(method: Method, problem: Problem, options: SynthesisOptions, deadline: Deadline,
               progress: Progress, grid: EpochGrid | None = None, chosen: bool = True) -> Plan:
    """`chosen`: the user named the method; the time-expanded ones then say on stderr
    when their model will take a while (collc.synthesis.estimate)."""
    if method is Method.STEADY:
        rates = solve_rates(problem, options.solver, deadline, progress)
        return pipelined_plan(problem, rates, options.solver, deadline)
    if method is Method.LP:
        # lp picks its own grid: a coarse one where the fine one's model would be large.
        return solve_lp(problem, options.solver, deadline, progress, grid, options.timing)
    grid = grid or make_grid(problem)
    if method is Method.MILP:
        return solve_milp(problem, grid, options.solver, deadline, progress, epochs=options.epochs, chosen=chosen)
    if method is Method.ROUNDS:
        return solve_rounds(problem, grid, options.solver, deadline, progress, window=options.epochs, chosen=chosen)
    if method is Method.GREEDY:
        state = State.initial(problem)
        transfers = greedy(problem, grid, state)
        return Plan(problem, tuple(transfers), "greedy", Status.FEASIBLE, state.finish_epoch(),
                    SolveStats(seconds=deadline.elapsed()), {"epoch_seconds": grid.tau})
    raise CollcError(f"unknown synthesis method '{method.value}'")


def synthesize_copies(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
                      deadline: Deadline, progress: Progress) -> Result:
    """A collective without reductions: the chosen candidate as a result."""
    cand = choose(network, collective, size_bytes, options, deadline, progress)
    return to_result(cand, collective, network.topology, deadline)


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
    base_chunks = choices[0] if choices else collective.chunks
    base = problem_for(network, collective, size_bytes, base_chunks)
    found: list[Candidate] = []
    bounds = _lower_bounds(network, base, size_bytes)
    bound = bounds.best_s
    # Steady state first: its LP is quick, and for large messages nothing beats it.
    try:
        share = deadline.share(STEADY_SHARE)
        found.append(_best_steady(network, collective, size_bytes, options, share, progress, choices, bounds, base))
    except (NotApplicable, SolverError):
        pass  # the time-expanded methods below still answer
    if found and found[0].estimate_s <= bound * (1 + NEAR_BOUND):
        # Bandwidth decides, and pipelining is near the bound: a time-expanded model of
        # few chunks cannot do better.
        return found[0]
    grid = make_grid(base)
    method = _time_expanded_method(base, grid, len(base.commodities) * len(network.routes))
    if method is not None and not deadline.expired:
        # The time-expanded models stop at a time limit when they cannot prove optimality:
        # they keep the limit they always had, however long the safety net is.
        limited = Deadline(min(deadline.remaining(), TIME_EXPANDED_SECONDS), deadline.work)
        found.append(realize(run_method(method, base, options, limited, progress, grid, chosen=False), options.timing))
    if not found:
        plan = run_method(Method.GREEDY, base, options, deadline, progress, grid)
        found.append(realize(plan, options.timing))
    return min(found, key=lambda c: (c.estimate_s, c.plan.method))


def _lower_bounds(network: Network, problem: Problem, size_bytes: int) -> LowerBounds:
    return lower_bounds(network.topology, problem.collective, size_bytes)


def _time_expanded_method(problem: Problem, grid: EpochGrid, per_epoch: int) -> Method | None:
    if per_epoch > ROUNDS_VARIABLES:
        return None
    state = State.initial(problem)
    greedy(problem, grid, state)
    if per_epoch * max(1, state.finish_epoch()) <= MILP_VARIABLES:
        return Method.MILP
    return Method.ROUNDS


def _best_steady(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
                 deadline: Deadline, progress: Progress, choices: list[int] | None,
                 bounds: LowerBounds | None = None, base: Problem | None = None) -> Candidate:
    """Steady-state rates, one pipelined schedule at the chunk count whose predicted fill
    is small (FIRST_TARGET), then improvement steps while the schedule is further than
    the tolerance from the lower bound and the last step gained at least MIN_GAIN (for
    a demand matrix, once within NEAR_BOUND, only steps to candidates of at most
    CHEAP_OPS ops).

    Every decision depends on counts and modelled times only, never on the clock, so the
    same input gives the same schedule on any machine; the deadline is a safety net."""
    base_chunks = choices[0] if choices else collective.chunks
    if base is None or base.collective.chunks != base_chunks:
        base = problem_for(network, collective, size_bytes, base_chunks)
    per_chunk = max(1, base.deliveries) / base_chunks
    if bounds is None:
        bounds = _lower_bounds(network, base, size_bytes)
    bound = bounds.best_s
    # Where latency decides a custom collective's time, its pieces go finer and each
    # candidate is also dealt by latency.
    by_latency = _latency_dealt(collective) and _latency_bound(bounds)
    floor = MIN_CUSTOM_SLOT if by_latency else MIN_PIPELINED_SLOT
    counts = [base_chunks] if choices else _doublings(base_chunks, per_chunk, base.slot_bytes, options.max_ops,
                                                      floor)
    target = bound * (1 + options.tolerance)
    progress.stage("steady: rate LP")
    rates = solve_rates(base, options.solver, deadline, progress, spread=SPREADS[0])
    # The first schedule: the fewest chunks whose pipeline is predicted to come within
    # FIRST_TARGET of T. Fill and drain overlap the steady state by at least half
    # (measured on the standard topologies), so the predicted overhead is half the fill.
    slot_of = {c: base.slot_bytes * base_chunks / c for c in counts}
    fill = {c: pipeline_fill(network, rates, slot_of[c]) for c in counts}
    first = next((c for c in counts if fill[c] <= rates.seconds * FIRST_TARGET * 2), counts[-1])
    # Where a schedule within the tolerance is predicted at a count whose candidate is
    # still cheap to build and time, aim the first schedule there: a first step aimed at
    # FIRST_TARGET would be followed by one aimed at the tolerance anyway.
    within = (bound * (1 + options.tolerance * PREDICTION_MARGIN) / rates.seconds - 1) * 2 * rates.seconds
    aimed = next((c for c in counts if fill[c] <= within), None)
    if aimed is not None and aimed > first and per_chunk * aimed <= CHEAP_OPS:
        first = aimed
    best = _pipelined(network, collective, size_bytes, options, deadline, progress, rates, first, base,
                      target if by_latency else None)
    tried = [f"spread {SPREADS[0]:.2f}, {first} chunks"]
    first_estimate = best.estimate_s
    improvements = 0

    def better(cand: Candidate, label: str) -> float:
        nonlocal best
        tried.append(label)
        gain = 1 - cand.estimate_s / best.estimate_s
        if gain > 0:
            best = cand
        return gain

    # Improvement 1: more chunks. The pipeline's overhead over T shrinks about as 1/chunks,
    # so the next count is the one that overhead predicts to land within the tolerance.
    allowed_overhead = target / rates.seconds - 1
    while (best.estimate_s > target and allowed_overhead > 0 and improvements < MAX_IMPROVEMENTS
           and best.chunks < counts[-1] and not deadline.fired()):
        overhead = best.estimate_s / rates.seconds - 1
        want = best.chunks * overhead / (allowed_overhead * PREDICTION_MARGIN)
        nxt = next((c for c in counts if c > best.chunks and c >= want), counts[-1])
        # A demand matrix's AllToAllv is compiled again whenever the routing changes (a
        # mixture-of-experts layer's changes every step), so its compile time counts: once
        # within NEAR_BOUND of the bound, it steps only as far as a cheap candidate.
        # dgx_h100(nodes=2), 10%-dense matrix, 1 GiB per rank: 4 chunks gave 1.043, and the
        # tolerance then asked for 32 and 64 chunks (227,000 ops, 1.0098) in 41 CPU s.
        if collective.demand is not None and best.estimate_s <= bound * (1 + NEAR_BOUND):
            cheap = [c for c in counts if best.chunks < c <= nxt and per_chunk * c <= CHEAP_OPS]
            if not cheap:
                break
            nxt = cheap[-1]
        improvements += 1
        cand = _pipelined(network, collective, size_bytes, options, deadline, progress, rates, nxt, base,
                          target if by_latency else None)
        if better(cand, f"spread {SPREADS[0]:.2f}, {nxt} chunks") < MIN_GAIN:
            break
    # Improvement 2: other packings as fast as the first (trees only: a flow has one),
    # each pipelined at the best count so far and at the next count up: which packing
    # pipelines best varies with the chunk count (on dgx2(chassis=2), before forwarded data
    # went ahead of its pace, the second packing was no better at 32 chunks and 2% better
    # at 64), so a packing tried at one count only
    # is often dismissed wrongly; one clearly worse at the best count is not pursued.
    # The counts tried depend only on modelled times.
    if rates.kind == "trees":
        for spread in SPREADS[1:]:
            if best.estimate_s <= target or improvements >= MAX_IMPROVEMENTS or deadline.fired():
                break
            improvements += 1
            progress.stage(f"steady: rate LP (links above {spread:.0%} of T pay extra)")
            other = solve_rates(base, options.solver, deadline, progress, spread=spread)
            at = best.chunks
            for chunks in [at] + [c for c in counts if c > at][:1]:
                if best.estimate_s <= target or deadline.fired():
                    break
                cand = _pipelined(network, collective, size_bytes, options, deadline, progress, other, chunks, base,
                                  target if by_latency else None)
                if better(cand, f"spread {spread:.2f}, {chunks} chunks") < -MIN_GAIN:
                    break  # worse at the same count: more chunks are not tried for it
    facts = {**best.plan.facts, "steady_tried": tried, "tolerance": options.tolerance,
             "first_chunks": first, "first_estimate_s": first_estimate, "lower_bound_s": bound}
    return replace(best, plan=replace(best.plan, facts=facts))


def _pipelined(network: Network, collective: Collective, size_bytes: int, options: SynthesisOptions,
               deadline: Deadline, progress: Progress, rates, chunks: int, base: Problem,
               latency_target: float | None) -> Candidate:
    """The rates pipelined at `chunks` per rank; where a `latency_target` is given and
    the candidate is not within it, also dealt by latency (`latency_counts`), the faster
    of the two."""
    progress.stage(f"steady: pipelining {chunks} chunks per rank")
    # The refined problem is built while the rounding MILP runs (steady.pipelining.Refinement).
    problem = base if chunks == base.collective.chunks else Refinement(
        base, chunks, size_bytes, lambda: problem_for(network, collective, size_bytes, chunks))
    deadline.work.candidates += 1
    cand = pipelined_ahead(problem, rates, options.solver, deadline, lambda plan: realize_steps(plan, options.timing))
    if latency_target is None or cand.estimate_s <= latency_target:
        return cand
    deadline.work.candidates += 1
    aware = realize(pipelined_plan(cand.plan.problem, rates, options.solver, deadline, latency_aware=True),
                    options.timing)
    return aware if aware.estimate_s < cand.estimate_s else cand


def _latency_dealt(collective: Collective) -> bool:
    """Whether pipelined candidates may be dealt by latency (`latency_counts`) and cut
    under MIN_PIPELINED_SLOT: for a custom collective, whose destinations are a few
    ranks behind routes of unequal latency. The standard collectives' and demand
    matrices' schedules were measured and tuned as they are, and keep them."""
    return collective.kind is CollectiveKind.CUSTOM and collective.demand is None


def _latency_bound(bounds: LowerBounds) -> bool:
    """Whether latency decides the time: the cut bound with latency windows is at least
    LATENCY_BOUND above the best bound. Pieces under MIN_PIPELINED_SLOT pay off there
    (the README's fan_out at 1 MiB, 1.45x); elsewhere they mostly shorten the pipeline's
    fill, for many more ops (a custom multicast on dgx1 at 16 MiB, 1.01x: 4,096 chunks
    per rank, 1.5% sooner, five times the compile's CPU time)."""
    return bounds.cut_latency_s >= bounds.best_s * (1 + LATENCY_BOUND)


def _doublings(base: int, deliveries_per_chunk: float, slot_bytes: float, max_ops: int,
               floor: int = MIN_PIPELINED_SLOT) -> list[int]:
    """Chunk counts from `base` up, doubling while the ops stay within `max_ops` and the
    pieces at least `floor` bytes."""
    out = [base]
    while deliveries_per_chunk * out[-1] * 2 <= max_ops and slot_bytes * base / (out[-1] * 2) >= floor:
        out.append(out[-1] * 2)
    return out
