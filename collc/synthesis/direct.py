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

The pipeline's two ends run one half alone: the first pieces are reduced before any
gathering can start, the last ones gathered after every reduction has ended. Trees
packed for both halves at once are slow there (each half's links were shared with the
other), so the pieces reduced first take the ReduceScatter's own trees (its rate LP
alone) and the pieces gathered last the AllGather's own trees: a share END_SHARE of
every GPU's pieces at each end.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collc.analysis.bounds import lower_bounds
from collc.diagnostics import SolverError
from collc.ir.collective import Collective, CollectiveKind, allgather, standard
from collc.ir.schedule import Buffer, Op
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
from collc.synthesis.steady.rates import solve_rates
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
# The direct AllReduce at k pieces per GPU's chunk, list-scheduled, took at least
# 1 + PIECE_OVERHEAD / k times its joint LP's fluid time on every cluster measured (time
# over fluid time, pieces): dgx2(chassis=2) 1.074 (16), 1.055 (24), 1.053 (28), 1.055
# (32), 1.026 (48), 1.019 (64), 1.010 (128) at 1 GiB; dgx_h100(nodes=2) 1.123 (16), 1.086
# (32) at 1 GiB, 1.092 (64), 1.072 (128) at 64 MiB; dgx_h100(nodes=8) 1.311 (8), 1.687 (4);
# and further above at 1-16 MiB, where latency weighs more (dgx2(chassis=2) 3.237 (1),
# 2.093 (2), 1.611 (4), 1.122 (16); dgx_h100(nodes=2) 6.321 (1), 3.149 (4), 1.927 (8),
# 1.246 (16), 1.337 (32)). The fluid time is at least the bandwidth bound, so where the
# bound times 1 + PIECE_OVERHEAD / (most pieces) is not below the composition's time, the
# direct AllReduce cannot win, and its joint LP (on dgx_h100(nodes=8), 64 GPUs, most of a
# 280 s compile) is not solved.
PIECE_OVERHEAD = 1.0
# Share of every GPU's pieces, at each end of the pipeline, that runs on its half's own
# trees (module docstring). dgx2(chassis=2), 1 GiB, the model's time over the bound by
# pieces at each end:
#   128 pieces: none 1.0252, 2 1.0157, 4 1.0165, 8 1.0101, 16 1.0114;
#    64 pieces: none 1.0368, 1 1.0246, 2 1.0241, 4 1.0191, 8 1.0188;
#    32 pieces (erratic): none 1.0572, 1 1.0480, 2 1.0553, 4 1.0421, 8 1.0601;
#    16 pieces: none 1.1138, 1 1.0746, 2 1.1009, 4 1.0799.
END_SHARE = 1 / 16
# ... from this many pieces on (at 8 pieces one at each end: 1.190 instead of 1.249; at
# 4: 1.423 instead of 1.410).
ENDS_FROM = 8


@dataclass(frozen=True)
class JointRates:
    """The joint LP's answer: the reductions' trees (on the reversed network, as an
    AllGather there) and the gatherings' trees, and T for both at once."""

    seconds: float
    reduce: RateSolution
    gather: RateSolution
    # Each half's own LP (as the composition's), for the ends of the pipeline: solved
    # only once a pipeline is built (with_own_rates).
    reduce_alone: RateSolution | None = None
    gather_alone: RateSolution | None = None


def joint_rates(forward: Network, backward: Network, collective: Collective, size_bytes: int,
                options: SynthesisOptions, deadline: Deadline, progress: Progress) -> JointRates:
    base = _base(collective)
    up = problem_for(backward, base, size_bytes, base.chunks)
    down = problem_for(forward, base, size_bytes, base.chunks)
    progress.stage("allreduce: one rate LP for the reductions and the gatherings")
    reduce, gather = joint_tree_rates((up, down), options.solver, deadline, progress, SPREADS[0], ALONE_WEIGHT)
    return JointRates(reduce.seconds, reduce, gather)


def with_own_rates(rates: JointRates, forward: Network, backward: Network, collective: Collective,
                   size_bytes: int, options: SynthesisOptions, deadline: Deadline, progress: Progress) -> JointRates:
    """`rates` with each half's own rate LP solved, where it is not yet."""
    if rates.reduce_alone is not None and rates.gather_alone is not None:
        return rates
    base = _base(collective)
    progress.stage("allreduce: each half's own rate LP, for the pipeline's ends")
    reduce_alone = solve_rates(problem_for(backward, base, size_bytes, base.chunks), options.solver, deadline,
                               progress)
    gather_alone = solve_rates(problem_for(forward, base, size_bytes, base.chunks), options.solver, deadline,
                               progress)
    return replace(rates, reduce_alone=reduce_alone, gather_alone=gather_alone)


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


@dataclass(frozen=True)
class DirectOps:
    """The direct AllReduce's ops before list scheduling: their steps are the order keys
    (the list scheduler's priorities), and `plan` describes them."""

    ops: list[Op]
    scratch: tuple[int, ...]
    plan: Plan


def direct_candidate(forward: Network, backward: Network, collective: Collective, size_bytes: int, chunks: int,
                     rates: JointRates, options: SynthesisOptions, deadline: Deadline,
                     progress: Progress) -> Candidate:
    """The pipelined direct AllReduce at `chunks` pieces per GPU's chunk, list-scheduled."""
    built = direct_ops(forward, backward, collective, size_bytes, chunks, rates, options, deadline, progress)
    fine = built.plan.problem.collective
    timeline = sequence(built.ops, forward, fine.slot_bytes(size_bytes), options.timing)
    scratch = built.scratch
    return Candidate(built.plan, timeline, scratch if any(scratch) else (), timeline.seconds, chunks)


def direct_ops(forward: Network, backward: Network, collective: Collective, size_bytes: int, chunks: int,
               rates: JointRates, options: SynthesisOptions, deadline: Deadline, progress: Progress,
               relay_lead: float = DIRECT_LEAD, gather_lead: float = 0.0) -> DirectOps:
    """The ops of the pipelined direct AllReduce at `chunks` pieces per GPU's chunk, keyed
    for the list scheduler (`direct_candidate` schedules them).

    `relay_lead` is how far ahead of its pace (a share of T) a transfer to a forwarding
    rank is keyed; `gather_lead` moves every piece's gathering that share of T ahead of
    the key its reduction's end gives it (below 0: behind). Synthesis keeps the defaults;
    bench/bench_direct_structures.py measures other list orders with them."""
    progress.stage(f"allreduce: pipelining {chunks} pieces per chunk, both halves at once")
    deadline.work.candidates += 1
    base = _base(collective)
    up = problem_for(backward, base, size_bytes, chunks)
    down = problem_for(forward, base, size_bytes, chunks)
    paced_up = paced_transfers(up, rates.reduce, options.solver, deadline, relay_lead)
    paced_down = paced_transfers(down, rates.gather, options.solver, deadline, relay_lead)
    # Reductions carry the piece whose gathering is paced in the same place of the order.
    relabel = _match_pieces(up, paced_up, paced_down, rates.seconds)
    ends = end_pieces(chunks)
    if ends:
        rates = with_own_rates(rates, forward, backward, collective, size_bytes, options, deadline, progress)
        assert rates.reduce_alone is not None and rates.gather_alone is not None
        # Pieces are paced in index order within every GPU's chunk: the last `ends`
        # indices are gathered last, and (paced last in the reversed AllGather) reduced first.
        # Their trees are dealt by rounding the shares, without the MIP for the best
        # whole counts: few pieces take them (on dgx_h100(nodes=2), where the direct
        # AllReduce is tried and loses, the MIPs cost half the compile again).
        up_ends = _last_pieces(up, chunks, ends)
        paced_up = _on_own_trees(paced_up, paced_transfers(up, rates.reduce_alone), up_ends)
        down_ends = _last_pieces(down, chunks, ends)
        paced_down = _on_own_trees(paced_down, paced_transfers(down, rates.gather_alone), down_ends)
    unit = rates.seconds / KEY_STEPS
    low = min(float(paced_up.key.min(initial=0.0)), float(paced_down.key.min(initial=0.0)))
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
    ahead = round(gather_lead * KEY_STEPS)
    shift = {index: step_of[done[index]] + 1 - start - ahead for index, start in first.items()}
    more, extra = gather_ops(gathered, chunks, done, len(red_ops), shift)
    ops = red_ops + more
    scratch = tuple(a + b for a, b in zip(scratch, extra)) if extra else scratch
    fine = replace(standard(CollectiveKind.ALLREDUCE, collective.ranks, chunks, 0), name=collective.name,
                   root=collective.root)
    plan = Plan(up_plan.problem, up_plan.transfers, "steady", combined_status([rates.reduce.status,
                rates.gather.status]), 0, rates.reduce.stats,
                {"fluid_s": rates.seconds, "rate_model": "trees", "composed_from": "direct",
                 "structures": sum(len(v) for v in rates.reduce.shares.values())
                 + sum(len(v) for v in rates.gather.shares.values())})
    plan = replace(plan, problem=replace(plan.problem, collective=fine))
    return DirectOps(ops, scratch, plan)


def end_pieces(chunks: int) -> int:
    """Pieces of every GPU's chunk, at each end of the pipeline, on their half's own trees:
    none below ENDS_FROM pieces, where so few are left in the middle that the ends are
    most of the run."""
    return max(1, int(chunks * END_SHARE)) if chunks >= ENDS_FROM else 0


def _last_pieces(problem: Problem, chunks: int, count: int) -> np.ndarray:
    """The commodities of every GPU's last `count` pieces."""
    return np.fromiter((k for k, com in enumerate(problem.commodities) if com.chunk[1] >= chunks - count),
                       dtype=np.int64)


def _on_own_trees(joint: PacedTransfers, alone: PacedTransfers, chosen: np.ndarray) -> PacedTransfers:
    """`joint` with the transfers of the `chosen` commodities taken from `alone` instead,
    keyed after all of joint's (in their own order): paced last, as in `joint`."""
    keep = ~np.isin(joint.commodity, chosen)
    take = np.isin(alone.commodity, chosen)
    moved = alone.key[take]
    if len(moved):
        # Shifted to start one key step (of alone's scale) after joint's last key.
        moved = moved - moved.min() + joint.key[keep].max(initial=0.0) + alone.key.max(initial=0.0) / KEY_STEPS
    # Both parts are sorted and the moved keys all come later: joined, they stay sorted,
    # each part's ties in its own order.
    return PacedTransfers(np.concatenate([joint.key[keep], moved]),
                          np.concatenate([joint.commodity[keep], alone.commodity[take]]),
                          np.concatenate([joint.route[keep], alone.route[take]]))


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
    from the lower bound, where its pipeline at the most pieces the op budget allows is
    predicted to be faster (PIECE_OVERHEAD), and where the joint LP's time promises at
    least MIN_PROMISE less; every decision follows modelled times, so the answer does
    not depend on the machine. Recorded in the plan's facts either way."""
    if options.method not in (Method.AUTO, Method.STEADY) or deadline.fired():
        return composed
    bounds = lower_bounds(topology, collective, size_bytes)
    bound = bounds.best_s
    if composed.estimate_s <= bound * (1 + options.tolerance):
        return composed
    most = max(piece_counts(collective, size_bytes, options))
    floor = bounds.bandwidth_s * (1 + PIECE_OVERHEAD / most)
    if floor >= composed.estimate_s:
        facts = {"direct_floor_s": floor, "composed_estimate_s": composed.estimate_s, "allreduce": "composed"}
        return replace(composed, plan=replace(composed.plan, facts={**composed.plan.facts, **facts}))
    try:
        rates = joint_rates(forward, backward, collective, size_bytes, options, deadline, progress)
    except (NotApplicable, SolverError):
        return composed
    facts: dict[str, Any] = {"direct_fluid_s": rates.seconds, "composed_estimate_s": composed.estimate_s}
    best = composed
    if rates.seconds <= composed.estimate_s * (1 - MIN_PROMISE):
        rates = with_own_rates(rates, forward, backward, collective, size_bytes, options, deadline, progress)
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
