"""Collectives with reductions, composed from copy-only ones.

- ReduceScatter is AllGather run backwards: every transfer of an AllGather schedule,
  reversed in direction and in time, becomes a reduction of a partial sum into the
  rank that had sent the chunk; the copies of a multicast become several partial sums
  arriving at one rank. The AllGather is synthesized on the reversed topology (every
  link turned around), so that the reversed schedule runs over real links even where
  links are one-way. The reductions are ordered as the reverse of the order in which
  the list-scheduled AllGather started its transfers.
- Reduce is Broadcast run backwards, the same way.
- AllReduce is ReduceScatter followed by AllGather (the list-scheduled ops of the
  AllGather that was reversed, where the topology is symmetric); chunk j's AllGather
  tree starts where its reduction finished, as soon as it finished. The bound this is
  measured against counts the messages between groups of GPUs (collc.analysis.bounds,
  grouped volume); on dgx_h100(nodes=8) it equals twice the AllGather's bound, so the
  composition can reach it and no direct AllReduce is needed there.

Partial sums collect in an accumulator per rank and chunk: the output slot where the
rank must end with the result, else (ReduceScatter, Reduce) a scratch slot. A rank
that only contributes sends straight from its input. Reductions into one accumulator
are chained by dependencies, so no two race; in a ReduceScatter, a partial sum after
the first lands in a scratch slot of its own and is added by a local op, so that
transfers into one rank need not wait for each other (collc.synthesis.halves).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind, allgather, broadcast, standard
from collc.ir.schedule import Buffer, Op, OpKind
from collc.ir.topology import Topology
from collc.synthesis import direct, nodes
from collc.synthesis.signals import NotOverNodes
from collc.synthesis.auto import choose, synthesize_copies
from collc.synthesis.candidates import Candidate, Result, to_result
from collc.synthesis.extract import arrival_trees
from collc.synthesis.halves import gather_ops, partial_sums, reduction_op_count, reduction_ops
from collc.synthesis.network import Network, reversed_topology
from collc.synthesis.nodes_reducescatter import reducescatter_over_nodes
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.plan import Plan, combined_status
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import sequence

REDUCTION_KINDS = (CollectiveKind.REDUCESCATTER, CollectiveKind.ALLREDUCE, CollectiveKind.REDUCE)

# Chains the partial sums into one accumulator are dealt to where every sum's landing
# does not fit the op budget (collc.synthesis.halves.reduction_ops, lanes). At one chunk
# per rank, time over the bound, chained / 2 lanes / 3 lanes / 4 lanes / every sum
# landed: dgx_h100(nodes=16) 1.166 / 1.086 / 1.054 / - / 1.054 (the AllGather's own
# 1.054); dgx_h100(nodes=32), at most 32 peers a GPU as on 128 nodes, 1.105 / 1.044 /
# 1.027 / 1.032 / 1.027 (the AllGather's 1.027), with 73,472 / 81,664 / 89,856 /
# 98,048 / 130,560 ops. Three in flight cover a transfer's latency into a rank.
SPLIT_LANES = 3


def reduction_kind(collective: Collective) -> tuple[CollectiveKind, int]:
    """The standard reduction the collective is, and its root. A custom collective (declared in a
    .coll file) counts as one where its buffers are that reduction's at its chunk
    count (its root: the one rank that must hold anything); synthesis then splits and
    composes it like the standard one."""
    kind = collective.kind
    root = collective.root if collective.root is not None else 0
    candidates = (kind,) if kind in REDUCTION_KINDS else ()
    if kind is CollectiveKind.CUSTOM:
        holding = [r for r, buf in enumerate(collective.outputs) if any(v is not None for v in buf)]
        root = holding[0] if len(holding) == 1 else root
        candidates = REDUCTION_KINDS
    for kind in candidates:
        try:
            canon = standard(kind, collective.ranks, collective.chunks, root)
        except (KeyError, ValueError):
            continue
        if canon.inputs == collective.inputs and canon.outputs == collective.outputs:
            return kind, root
    raise CollcError(
        f"cannot synthesize '{collective.name}': of the collectives that reduce, synthesis supports "
        "ReduceScatter, AllReduce and Reduce in their standard form; write other reductions as an algorithm")


def symmetric(topology: Topology) -> bool:
    links = {(l.src, l.dst, l.bandwidth, l.latency, l.multiplicity) for l in topology.links}
    return all((b, a, bw, lat, m) in links for a, b, bw, lat, m in links)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block. Composing an AllReduce on
    64 GPUs allocates half a million ops, locations and timeline entries, none of them
    in reference cycles; each allocation burst sets off full collections that walk all
    of them again (a quarter of the time on dgx_h100(nodes=8)). Reference counting
    still frees everything; the collector is back on, as it was, afterwards."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def synthesize_with_reductions(topology: Topology, collective: Collective, size_bytes: int,
                               options: SynthesisOptions, deadline: Deadline, progress: Progress) -> Result:
    with _collector_paused():
        return _compose(topology, collective, size_bytes, options, deadline, progress)


def _compose(topology: Topology, collective: Collective, size_bytes: int,
             options: SynthesisOptions, deadline: Deadline, progress: Progress, whole: bool = True) -> Result:
    """The collective composed as the module docstring says; `whole`: False for a part
    of a larger composition (collc.synthesis.nodes)."""
    kind, root = reduction_kind(collective)
    groups = nodes.wanted(topology, collective, options)
    if groups is not None:
        over_nodes = (reducescatter_over_nodes if kind is CollectiveKind.REDUCESCATTER
                      else nodes.compose_over_nodes)
        try:
            return over_nodes(topology, collective, size_bytes, groups, options, deadline, progress,
                              _part_synthesizer(deadline, progress))
        except NotOverNodes as exc:
            if options.nodes != nodes.OverNodes.AUTO:
                raise CollcError(f"cannot compose '{collective.name}' over the nodes of '{topology.name}': "
                                 f"{exc}") from None
            # The nodes cannot carry it: the flat composition, over budget or not.
    ranks, c0 = collective.ranks, collective.chunks
    base = broadcast(ranks, c0, root) if kind is CollectiveKind.REDUCE else allgather(ranks, c0)
    base = replace(base, name=collective.name)
    forward = Network(topology)
    mirror = symmetric(topology)
    backward = forward if mirror else Network(reversed_topology(topology))
    share = deadline.share(0.5) if kind is CollectiveKind.ALLREDUCE and not mirror else deadline
    progress.stage(f"{collective.kind.value}: synthesizing the {base.kind.value} it reverses")
    # An AllReduce has both halves' ops: each half gets half the op budget.
    halves = replace(options, max_ops=options.max_ops // 2) if kind is CollectiveKind.ALLREDUCE else options
    up = choose(backward, base, size_bytes, halves, share, progress)
    chunks = up.plan.problem.collective.chunks
    fine = standard(kind, ranks, chunks, root)
    fine = replace(fine, name=collective.name, root=collective.root, kind=collective.kind)
    up_ops = up.ops
    # A ReduceScatter's partial sums may land in scratch where several reach one rank
    # (see reduction_ops): on dgx_h100(nodes=4), 1.004 of the bound instead of 1.045;
    # at one chunk per rank, 1.027 instead of 1.105 on dgx_h100(nodes=32), the
    # AllGather's own time. Not for an AllReduce, whose MSCCL XML already runs out of
    # threadblocks on dgx2 (1.232 instead of 1.054 with them), nor for a node's part of
    # a composition over nodes, whose ops the batches pay for. A backend that refuses
    # the landings' extra steps at one chunk per rank, where it has no fewer chunks to
    # ask for, asks for the chained sums instead (options.landings, collc.driver).
    land = kind is CollectiveKind.REDUCESCATTER and whole and options.landings
    order = _start_order(up_ops.ops)
    trees = arrival_trees(up.plan) if land else None
    lanes = 1
    if land and chunks == 1:
        sums = partial_sums(trees)
        if reduction_op_count(sums, land=True) > options.max_ops:
            # At one chunk per rank no fewer chunks can make room for the landings' local
            # adds: where they do not fit the op budget (the 1,024-GPU ReduceScatter's:
            # about twice the ops, and its compile ran past 18 CPU minutes and 7 GiB with
            # them), they are not built, and the partial sums into one rank run in
            # SPLIT_LANES chains instead, at a local op or two per accumulator (see
            # SPLIT_LANES), where those fit; else chained. On 1,024 GPUs the chained
            # sums pass the budget already (a first copy per accumulator on top of the
            # AllGather's transfers: about 1.18 million ops against 1.05 million); with
            # lanes regardless, the compile still ended with the chained sums (1.044 of
            # the bound, the same file) after 879 CPU s, 1.6 to 1.8 times the chained
            # compile's (each over `collc verify`'s time that day).
            land = False
            lanes = SPLIT_LANES if reduction_op_count(sums, lanes=SPLIT_LANES) <= options.max_ops else 1
    ops, scratch, last_write = reduction_ops(up.plan, kind, forward, order, land, lanes, trees)
    plans = [up.plan]
    if kind is CollectiveKind.ALLREDUCE:
        if mirror:
            down_plan, down_ops = up.plan, up_ops
        else:
            progress.stage("allreduce: synthesizing the allgather half")
            inner = replace(halves, chunks=chunks)
            down = choose(forward, base, size_bytes, inner, deadline, progress)
            down_plan, down_ops = down.plan, down.ops
            plans.append(down_plan)
        more, extra = gather_ops(down_ops, chunks, last_write, len(ops), 1 + max(op.step for op in ops))
        ops += more
        scratch = tuple(a + b for a, b in zip(scratch, extra)) if extra else scratch
    timeline = sequence(ops, forward, fine.slot_bytes(size_bytes), options.timing)
    # A landing is the one transfer that copies rather than reduces (reduction_ops).
    landings = sum(op.is_transfer and op.kind is OpKind.COPY for op in ops) if land or lanes > 1 else 0
    # Lanes add a lane's slot in after the accumulator's last sum, so they can trail
    # the AllGather's pace by a hair; within the search's tolerance of it, the chained
    # sums (slower on every model measured) are not built and list-scheduled as well.
    slack = 1 + options.tolerance if lanes > 1 else 1
    if landings and timeline.seconds > up.estimate_s * slack:
        # The list scheduler is greedy, and with the landings it can do worse (on a
        # two-chassis cluster of 4 GPUs, 1.125 of the bound against 1.0625 chained):
        # the faster of the two, the chained one on a tie (fewer ops). Where the
        # landings keep the pace of the AllGather they reverse, the chained sums (the
        # same transfers, each waiting for the one before) are not list-scheduled too:
        # on a large cluster that would be a second pass over every op.
        chained, chained_scratch, _ = reduction_ops(up.plan, kind, forward, order, trees=trees)
        other = sequence(chained, forward, fine.slot_bytes(size_bytes), options.timing)
        if other.seconds <= timeline.seconds:
            timeline, scratch, landings = other, chained_scratch, 0
    scratch = scratch if any(scratch) else ()
    status = combined_status([p.status for p in plans])
    plan = Plan(up.plan.problem, up.plan.transfers, up.plan.method, status, up.plan.epochs, up.plan.stats,
                {**up.plan.facts, "composed_from": base.kind.value, **({"landings": landings} if landings else {}),
                 **({"landing_lanes": lanes} if landings and lanes > 1 else {})})
    sched_plan = replace(plan, problem=replace(plan.problem, collective=fine))
    cand = Candidate(sched_plan, timeline, scratch, timeline.seconds, chunks)
    if kind is CollectiveKind.ALLREDUCE and collective.kind is kind:  # custom-labelled: the composition
        cand = direct.keep_better(cand, topology, forward, backward, collective, size_bytes, options, deadline,
                                  progress)
    return to_result(cand, collective, topology, deadline)


def _part_synthesizer(deadline: Deadline, progress: Progress):
    """Synthesis of a sub-problem (a node's or a rail's) for collc.synthesis.nodes."""

    def part(topology: Topology, collective: Collective, size_bytes: int, options: SynthesisOptions) -> Result:
        if collective.has_reduction:
            return _compose(topology, collective, size_bytes, options, deadline, progress, whole=False)
        return synthesize_copies(Network(topology), collective, size_bytes, options, deadline, progress)
    return part


def _start_order(ops: tuple[Op, ...]) -> dict[tuple[int, int, int], int] | None:
    """When each chunk first reached each rank in a list-scheduled copy schedule:
    (owner, chunk index, rank) -> the place of that transfer in start order. None when
    an op's chunk cannot be traced (a source outside the input buffer).

    The reductions replay the copy schedule backwards in this order rather than by the
    plan's steps: the list-scheduled order already packs the links (on
    dgx_h100(nodes=8) the ReduceScatter half then takes 2,396 us instead of 2,439,
    against 2,360 for the AllGather it reverses)."""
    chunk_of: dict[int, tuple[int, int]] = {}
    order: dict[tuple[int, int, int], int] = {}
    for place, op in enumerate(ops):
        if op.src.buffer is Buffer.INPUT:
            chunk = (op.src.rank, op.src.index)
        elif op.deps and op.deps[0] in chunk_of:
            chunk = chunk_of[op.deps[0]]  # a relay: the op that filled its source
        else:
            return None
        chunk_of[op.id] = chunk
        if op.is_transfer:
            order.setdefault((chunk[0], chunk[1], op.dst.rank), place)
    return order
