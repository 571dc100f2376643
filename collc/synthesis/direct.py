"""A direct AllReduce: reduction trees and gathering trees packed by one rate LP.

The composition (collc.synthesis.compose) synthesizes the ReduceScatter and the
AllGather each alone and runs one after the other, so the AllReduce takes the sum of
their times. Where the two halves are limited by different links, that sum is more
than the links need: on dgx2(chassis=2) the InfiniBand links enter only even GPUs, so
the odd GPUs' ingress limits the AllGather, while the reductions could send fewer
partial sums into them. Here one tree-packing LP (collc.synthesis.steady.trees,
joint_tree_rates) chooses, for every GPU's chunk, reduction trees (spanning trees of the
reversed topology, run backwards) and gathering trees from the same GPU, with every
link's load the sum of both. Its time is the time of both halves running at once.

The pipeline: every chunk is cut into K pieces. The reductions are the reversed
pipelined AllGather of the reversed topology; a piece's gathering starts where its
reduction ends. Pieces are matched so that the one whose gathering is paced first is
the one whose reduction ends first; the list scheduler then interleaves both halves by
their order keys (seconds of fluid time), which puts the gathering of early pieces
beside the reduction of later ones.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collc.analysis.bounds import lower_bounds
from collc.diagnostics import SolverError
from collc.ir.collective import Collective, CollectiveKind, allgather, standard
from collc.ir.schedule import Buffer
from collc.ir.topology import Topology
from collc.synthesis.candidates import MIN_PIPELINED_SLOT, Candidate, problem_for
from collc.synthesis.extract import copy_ops
from collc.synthesis.halves import gather_ops, reduction_ops
from collc.synthesis.network import Network
from collc.synthesis.options import Method, SynthesisOptions
from collc.synthesis.plan import Plan, Transfer, combined_status
from collc.synthesis.problem import Problem
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.steady.colgen import SPREADS
from collc.synthesis.steady.pipelining import PacedTransfers, paced_transfers
from collc.synthesis.steady.solution import NotApplicable, RateSolution
from collc.synthesis.steady.trees import joint_tree_rates
from collc.synthesis.timing import sequence

# Order keys are fluid seconds written as whole steps of T / KEY_STEPS: fine enough that
# a tree's parent keeps a smaller key than its child (their keys differ by at least a
# transfer's time, thousands of steps).
KEY_STEPS = 10**8
# Weight of each half's own time (its busiest link, alone) in the joint LP's objective.
# The halves run one after the other at the ends of the pipeline (the first pieces are
# still being reduced, the last ones gathered), and there a half whose links are not all
# saturated catches up. dgx2(chassis=2), 64 pieces: 0 gives 1.078 x the bound, 0.01
# 1.044, 0.1 1.052, 0.3 1.081; T together stays at the bound throughout.
ALONE_WEIGHT = 0.01
# How far ahead of its pace a transfer to a forwarding rank goes (steady.pipelining.RELAY_LEAD
# for one collective). Here both halves share the links and a lead holds back the other
# half: dgx2(chassis=2), 128 pieces: 0.05 gives 1.025, 0.2 1.040 (0, 0.05, 0.1, 0.2 at
# 64 pieces: 1.043, 1.037, 1.042, 1.044).
DIRECT_LEAD = 0.05
# The direct AllReduce is built only where its LP's time is below the composition's
# schedule by at least this share: both halves' pipeline fill and drain are left to
# pay for (measured: 2.5-4% on dgx2(chassis=2)).
MIN_PROMISE = 0.02


@dataclass(frozen=True)
class JointRates:
    """The joint LP's answer: the reductions' trees (on the reversed network, as an
    AllGather there) and the gatherings' trees, and T for both at once."""

    seconds: float
    reduce: RateSolution
    gather: RateSolution


def joint_rates(forward: Network, backward: Network, collective: Collective, size_bytes: int,
                options: SynthesisOptions, deadline: Deadline, progress: Progress) -> JointRates:
    base = _base(collective)
    up = problem_for(backward, base, size_bytes, base.chunks)
    down = problem_for(forward, base, size_bytes, base.chunks)
    progress.stage("allreduce: one rate LP for the reductions and the gatherings")
    reduce, gather = joint_tree_rates((up, down), options.solver, deadline, progress, SPREADS[0], ALONE_WEIGHT)
    return JointRates(reduce.seconds, reduce, gather)


def piece_counts(collective: Collective, size_bytes: int, options: SynthesisOptions) -> list[int]:
    """Pieces per GPU's chunk to try, most first: the largest power of two whose ops (a
    reduction and a copy per GPU and piece in every other GPU's chunk) keep within
    max_ops and whose pieces are at least MIN_PIPELINED_SLOT, and half of it. The
    requested chunk count only, where one is given."""
    if options.chunks:
        return [options.chunks]
    ranks = collective.ranks
    per_piece = 2 * ranks * (ranks - 1)
    chunk_bytes = size_bytes / ranks
    k = 1
    while per_piece * k * 2 <= options.max_ops and chunk_bytes / (k * 2) >= MIN_PIPELINED_SLOT:
        k *= 2
    return [k, k // 2] if k >= 2 else [k]


def direct_candidate(forward: Network, backward: Network, collective: Collective, size_bytes: int, chunks: int,
                     rates: JointRates, options: SynthesisOptions, deadline: Deadline,
                     progress: Progress) -> Candidate:
    """The pipelined direct AllReduce at `chunks` pieces per GPU's chunk, list-scheduled."""
    progress.stage(f"allreduce: pipelining {chunks} pieces per chunk, both halves at once")
    deadline.work.candidates += 1
    base = _base(collective)
    up = problem_for(backward, base, size_bytes, chunks)
    down = problem_for(forward, base, size_bytes, chunks)
    paced_up = paced_transfers(up, rates.reduce, options.solver, deadline, DIRECT_LEAD)
    paced_down = paced_transfers(down, rates.gather, options.solver, deadline, DIRECT_LEAD)
    unit = rates.seconds / KEY_STEPS
    low = min(float(paced_up.key.min(initial=0.0)), float(paced_down.key.min(initial=0.0)))
    # Reductions carry the piece whose gathering is paced in the same place of the order.
    relabel = _match_pieces(up, paced_up, paced_down, rates.seconds)
    up_plan = _plan(up, paced_up, relabel, low, unit, rates.reduce)
    down_plan = _plan(down, paced_down, None, low, unit, rates.gather)
    red_ops, scratch, done = reduction_ops(up_plan, CollectiveKind.ALLREDUCE, forward)
    step_of = {op.id: op.step for op in red_ops}
    gathered = copy_ops(down_plan)
    first: dict[int, int] = {}  # piece -> the step of its first send (ops are in step order)
    for op in gathered.ops:
        if op.src.buffer is Buffer.INPUT:
            first.setdefault(op.src.rank * chunks + op.src.index, op.step)
    # A piece's gathering keeps its own pace from the moment its reduction ends.
    shift = {index: step_of[done[index]] + 1 - start for index, start in first.items()}
    more, extra = gather_ops(gathered, chunks, done, len(red_ops), shift)
    ops = red_ops + more
    scratch = tuple(a + b for a, b in zip(scratch, extra)) if extra else scratch
    fine = replace(standard(CollectiveKind.ALLREDUCE, collective.ranks, chunks, 0), name=collective.name,
                   root=collective.root)
    timeline = sequence(ops, forward, fine.slot_bytes(size_bytes), options.timing)
    plan = Plan(up_plan.problem, up_plan.transfers, "steady", combined_status([rates.reduce.status,
                rates.gather.status]), 0, rates.reduce.stats,
                {"fluid_s": rates.seconds, "rate_model": "trees", "composed_from": "direct",
                 "structures": sum(len(v) for v in rates.reduce.shares.values())
                 + sum(len(v) for v in rates.gather.shares.values())})
    plan = replace(plan, problem=replace(plan.problem, collective=fine))
    return Candidate(plan, timeline, scratch if any(scratch) else (), timeline.seconds, chunks)


def _base(collective: Collective) -> Collective:
    return replace(allgather(collective.ranks, collective.chunks), name=collective.name)


def _match_pieces(problem: Problem, up: PacedTransfers, down: PacedTransfers, fluid_s: float) -> dict[int, int]:
    """Commodity of the reductions' plan -> the commodity (piece) it should carry: within
    every GPU's chunk, the piece whose reduction ends k-th (in fluid time, the reverse of
    its first transfer in the reversed AllGather) is the one whose gathering starts k-th."""
    ends = _first_key(up)
    starts = _first_key(down)
    by_root: dict[int, tuple[list[tuple[float, int]], list[tuple[float, int]]]] = defaultdict(lambda: ([], []))
    for k, com in enumerate(problem.commodities):
        if k in ends:
            by_root[com.holders[0]][0].append((fluid_s - ends[k], k))
        if k in starts:
            by_root[com.holders[0]][1].append((starts[k], k))
    relabel: dict[int, int] = {}
    for root in sorted(by_root):
        reduced, gathered = by_root[root]
        for (_, k), (_, j) in zip(sorted(reduced), sorted(gathered)):
            relabel[k] = j
    return relabel


def _first_key(paced: PacedTransfers) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, k in zip(paced.key.tolist(), paced.commodity.tolist()):
        out.setdefault(k, key)  # sorted by key: the first seen is the earliest
    return out


def _plan(problem: Problem, paced: PacedTransfers, relabel: dict[int, int] | None, low: float, unit: float,
          rates: RateSolution) -> Plan:
    """A plan whose transfer steps are the order keys in whole units (from 0)."""
    steps = np.rint((paced.key - low) / unit).astype(np.int64)
    coms = paced.commodity.tolist()
    if relabel is not None:
        coms = [relabel.get(k, k) for k in coms]
    transfers = tuple(map(Transfer, coms, paced.route.tolist(), steps.tolist()))
    return Plan(problem, transfers, "steady", rates.status, 0, rates.stats, {})


def keep_better(composed: Candidate, topology: Topology, forward: Network, backward: Network,
                collective: Collective, size_bytes: int, options: SynthesisOptions, deadline: Deadline,
                progress: Progress) -> Candidate:
    """The composed AllReduce, or the direct one where that is faster under the model.

    The direct one is tried only where the composition is further than the tolerance
    from the lower bound and the joint LP's time promises at least MIN_PROMISE less;
    every decision follows modelled times, so the answer does not depend on the
    machine. Recorded in the plan's facts either way."""
    if options.method not in (Method.AUTO, Method.STEADY) or deadline.fired():
        return composed
    bound = lower_bounds(topology, collective, size_bytes).best_s
    if composed.estimate_s <= bound * (1 + options.tolerance):
        return composed
    try:
        rates = joint_rates(forward, backward, collective, size_bytes, options, deadline, progress)
    except (NotApplicable, SolverError):
        return composed
    facts: dict[str, Any] = {"direct_fluid_s": rates.seconds, "composed_estimate_s": composed.estimate_s}
    best = composed
    if rates.seconds <= composed.estimate_s * (1 - MIN_PROMISE):
        tried = []
        for chunks in piece_counts(collective, size_bytes, options):
            if deadline.fired():
                break
            cand = direct_candidate(forward, backward, collective, size_bytes, chunks, rates, options, deadline,
                                    progress)
            tried.append({"chunks": chunks, "estimate_s": cand.estimate_s})
            if cand.estimate_s < best.estimate_s:
                best = cand
            if best.estimate_s <= bound * (1 + options.tolerance):
                break
        facts["direct_tried"] = tried
    facts["allreduce"] = "direct" if best is not composed else "composed"
    return replace(best, plan=replace(best.plan, facts={**composed.plan.facts, **best.plan.facts, **facts}))
