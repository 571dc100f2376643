"""`msccl-threadblocks`: from a schedule to halves placed in threadblocks and channels.

Runs first among the MSCCL lowering passes (after `msccl-merge`): checks that the executor
can run the collective at all, maps buffers for in-place runs, copies the schedule for
`instances`, splits ops into halves (`halves.py`) and places them (`channels.py`). Each
threadblock's steps are one half each, in key order; `msccl-fuse` fuses them next. The
number of channels is chosen by trying the following passes: a placement is kept when
the fused threadblocks, nop steps included, fit `max_steps`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from collc.backends.msccl_xml import slots
from collc.backends.msccl_xml.channels import (
    Crowded, MAX_CHANNELS, MAX_TBS_PER_CHANNEL, PlanCache, TbPlan, channel_counts, check_counts, plan_compact,
    plan_threadblocks,
)
from collc.backends.msccl_xml.dependencies import ordered_lengths, ordered_lengths_within
from collc.backends.msccl_xml.fuse import fuse
from collc.backends.msccl_xml.halves import split_schedule
from collc.backends.msccl_xml.program import (
    LGpu, Program, Stage, base_chunks_per_loop, coll_token, collections_paused,
)
from collc.diagnostics import CollcError
from collc.backends.msccl_xml.limits import (
    LimitError, PeerLimitError, resident_threadblocks, threadblock_excess,
)
from collc.ir.schedule import Schedule, rank_peers
from collc.ir.topology import Topology
from collc.passes.base import CompileUnit, Pass, register_pass

DEFAULT_MAX_STEPS = 64  # MSCCL_MAX_NUM_STEPS of the current executor


def assign_threadblocks(schedule: Schedule, *, instances: int = 1, inplace: bool = False, channels: int = 0,
                        max_steps: int = DEFAULT_MAX_STEPS, sms: int = 0) -> Program:
    """The schedule as halves in threadblocks, on `channels` channels per instance (0: the
    fewest with which every threadblock, once fused and with its nop steps, keeps within
    `max_steps`). With `sms` (the GPUs' SM count; 0: unknown) no GPU gets more
    threadblocks than can be resident at once (`limits.resident_threadblocks`): more
    channels give more threadblocks, so the search stops at the first count over it."""
    coll = schedule.collective
    coll_token(coll)  # the executor must take this collective at all: fail before any work
    if max_steps < 1:
        raise CollcError(f"msccl-threadblocks: max_steps={max_steps}; a threadblock needs room for at least one step")
    check_counts(instances, channels)
    peers = _check_peers(schedule, instances, sms) if sms else 0
    split = split_schedule(schedule, inplace=inplace, instances=instances)
    if sms and not channels and _spread_estimate(split.arrays, peers, max_steps) * instances > resident_threadblocks(sms):
        # Spreading would only find out that it passes what the GPU keeps resident after
        # trying every channel count: minutes at 1,024 GPUs.
        program, why = _compact(schedule, split, PlanCache(split.halves, split.candidates, split.places,
                                                           split.arrays), instances, inplace, max_steps, sms)
        if program is not None:
            return program
        raise LimitError(f"msccl-threadblocks: a GPU has {peers} peers, too many to spread over channels within "
                         f"{resident_threadblocks(sms)} resident threadblocks; {why}. Use a schedule with fewer "
                         "peers per GPU or fewer chunks per rank, or fewer instances")
    tries = channel_counts(split.arrays, instances, channels, max_steps)
    # (steps, where) of each attempt that did not fit, in order; None for one given up
    # as soon as a threadblock passed max_steps (measured in full only for a message).
    missed: list[tuple[int, tuple[int, str] | None]] = []
    crowded: str | None = None  # why the last channel count tried had too many threadblocks
    cache: PlanCache | None = None
    matchings: dict = {}  # kept across caches (see `_matching`)
    for c in tries:
        if cache is None:
            cache = PlanCache(split.halves, split.candidates, split.places, split.arrays, matchings)
        plan = plan_threadblocks(split.halves, split.preds, coll.ranks, instances, c, max_steps,
                                 split.candidates, cache, resident_threadblocks(sms) if sms else 0)
        if plan is None:
            continue
        if isinstance(plan, Crowded):
            crowded = (f"with {c} channel(s) per instance GPU {plan.rank} needs "
                       f"{threadblock_excess(plan.threadblocks, sms)}")
            break
        if plan.least_steps > max_steps:
            missed.append((c, (plan.least_steps, plan.longest)))
            continue
        place_array = cache.place_array
        # The planning's arrays and chains (about 800 MiB at 1,024 GPUs) are freed while
        # the plan is measured, and built again only if another count must be tried.
        cache = None
        program = _program(schedule, split, plan, place_array, instances, inplace)
        # Fusing and dependencies decide the final length of each threadblock; both are
        # deterministic, so the passes that follow reproduce exactly what is measured here.
        measured = _longest_within(fuse(program), max_steps)
        if measured is None:
            missed.append((c, None))
            continue
        steps, where = measured
        if steps <= max_steps:
            return program
        missed.append((c, measured))
    if crowded is not None and not channels:
        # Spread over channels, the connections of a GPU with many peers each took a
        # threadblock per channel: pack them instead.
        if cache is None:
            cache = PlanCache(split.halves, split.candidates, split.places, split.arrays, matchings)
        program, why = _compact(schedule, split, cache, instances, inplace, max_steps, sms)
        if program is not None:
            return program
        crowded = f"{crowded}; {why}"
    # Only a refusal is left: its message names the least bad attempt.
    best = _least_bad(missed, lambda c: _measure_spread(split, coll.ranks, instances, c, max_steps, schedule,
                                                         inplace, matchings))
    if crowded is not None:
        steps_note = f"; with fewer channels {best[1]} gets {best[0]} steps (max_steps={max_steps})" if best else ""
        raise LimitError(f"msccl-threadblocks: {crowded}{steps_note}. Use fewer chunks per rank, fewer "
                         "instances, or a runtime that allows more steps per threadblock")
    if best is None:
        raise LimitError(f"msccl-threadblocks: no placement keeps at most {MAX_TBS_PER_CHANNEL} threadblocks per "
                         f"channel on every GPU with up to {tries[-1]} channel(s) per instance; use fewer "
                         "instances or more channels")
    steps, where = best
    if channels:
        raise LimitError(f"msccl-threadblocks: with channels={channels}, {where} gets {steps} steps, more than "
                         f"max_steps={max_steps}; let collc choose the channels (channels=0), or raise max_steps "
                         "if the runtime allows more (the current MSCCL executor runs 64 per threadblock, the "
                         "older runtime 256)")
    raise LimitError(f"msccl-threadblocks: even over {tries[-1]} channels {where} gets {steps} steps, more than "
                     f"max_steps={max_steps}; raise max_steps if the runtime allows more (the older MSCCL runtime "
                     "runs 256), or use fewer chunks per rank or fewer instances")


def _least_bad(missed: list[tuple[int, tuple[int, str] | None]],
               measure: Callable[[int], tuple[int, str]]) -> tuple[int, str] | None:
    """The (steps, where) of the first attempt with the fewest steps, `measure`-ing in
    full the channel counts given up early (only for the message of a refusal)."""
    best: tuple[int, str] | None = None
    for c, measured in missed:
        steps, where = measured if measured is not None else measure(c)
        if best is None or steps < best[0]:
            best = (steps, where)
    return best


def _measure_spread(split, ranks: int, instances: int, c: int, max_steps: int, schedule: Schedule, inplace: bool,
                    matchings: dict) -> tuple[int, str]:
    """The longest threadblock of the spread placement on `c` channels, measured in full."""
    cache = PlanCache(split.halves, split.candidates, split.places, split.arrays, matchings)
    plan = plan_threadblocks(split.halves, split.preds, ranks, instances, c, max_steps, split.candidates, cache)
    assert plan is not None  # it was placed before
    return _longest(fuse(_program(schedule, split, plan, cache.place_array, instances, inplace)))


def _spread_estimate(arrays, peers: int, max_steps: int) -> int:
    """About the threadblocks a spread placement gives the busiest GPU: it needs at least
    c = max(peers / 32, busiest connection / max_steps) channels, and spreading by load
    puts a connection of m messages on min(m, c) of them, each a threadblock end."""
    sends = (arrays.kind == slots.SEND) & (arrays.instance == 0)
    if not sends.any():
        return 0
    width = 1 + int(max(arrays.peer.max(initial=0), arrays.rank.max(initial=0)))
    keys, messages = np.unique(arrays.rank[sends] * width + arrays.peer[sends], return_counts=True)
    c = max(-(-peers // MAX_TBS_PER_CHANNEL), -(-int(messages.max()) // max(1, max_steps)), 1)
    ends = np.minimum(messages, c)
    out_ends = np.bincount(keys // width, weights=ends, minlength=width)
    in_ends = np.bincount(keys % width, weights=ends, minlength=width)
    return int(max(out_ends.max(), in_ends.max()))


def _program(schedule: Schedule, split, plan: TbPlan, place_array, instances: int, inplace: bool) -> Program:
    coll = schedule.collective
    return Program(
        name=schedule.name, collective=coll, coll=coll_token(coll), ngpus=coll.ranks,
        nchunksperloop=base_chunks_per_loop(coll) * instances, inplace=inplace, instances=instances,
        halves=split.halves, preds=split.preds, sole_readers=split.sole_readers,
        gpus=tuple(LGpu(r, *split.buffers[r], plan.tbs[r]) for r in range(coll.ranks)), stage=Stage.ASSIGNED,
        candidates=split.candidates, place_array=place_array,
        candidate_arrays=split.candidate_arrays, pred_pairs=split.pred_pairs)


def _most_threadblocks(plan: TbPlan) -> tuple[int, int]:
    """(threadblocks, rank) of the first GPU with the most threadblocks."""
    most, rank = max((len(tbs), -r) for r, tbs in enumerate(plan.tbs))
    return most, -rank


def _compact(schedule: Schedule, split, cache: PlanCache, instances: int, inplace: bool, max_steps: int,
             sms: int) -> tuple[Program | None, str]:
    """A packed placement (`channels.plan_compact`) within `max_steps` and the resident
    threadblocks, or None and why not. Send and receive slices are paired to fill a
    threadblock's steps; where fusing and nop steps still make one too long, the room
    they are paired in shrinks by a third, and channels grow only as the slices need."""
    coll = schedule.collective
    room = max_steps
    # Why not, or the (channels, room) of the last placement given up as soon as a
    # threadblock passed max_steps: measured in full only if the message is needed.
    why: str | tuple[int, int] = "no packed placement keeps within the channels"
    while True:
        for c in range(1, MAX_CHANNELS // instances + 1):
            plan = plan_compact(split.halves, split.preds, coll.ranks, instances, c, max(1, room // 2), room, cache)
            if plan is None:
                continue
            most, rank = _most_threadblocks(plan)
            if sms and threadblock_excess(most, sms) is not None:
                return None, f"packed on {c} channel(s), GPU {rank} still needs {most}"
            program = _program(schedule, split, plan, cache.place_array, instances, inplace)
            measured = _longest_within(fuse(program), max_steps)
            if measured is not None and measured[0] <= max_steps:
                return program, ""
            why = (c, room) if measured is None else _too_long(c, *measured, max_steps)
            break
        else:
            return None, _compact_why(why, schedule, split, cache, instances, inplace, max_steps)
        if room <= 2:
            return None, _compact_why(why, schedule, split, cache, instances, inplace, max_steps)
        room = max(2, room * 2 // 3)


def _too_long(c: int, steps: int, where: str, max_steps: int) -> str:
    return f"packed on {c} channel(s), {where} gets {steps} steps (max_steps={max_steps})"


def _compact_why(why: str | tuple[int, int], schedule: Schedule, split, cache: PlanCache, instances: int,
                 inplace: bool, max_steps: int) -> str:
    """`_compact`'s reason, the packed placement on (channels, room) placed again and
    measured in full where it was given up early."""
    if isinstance(why, str):
        return why
    c, room = why
    plan = plan_compact(split.halves, split.preds, schedule.collective.ranks, instances, c, max(1, room // 2), room,
                        cache)
    assert plan is not None  # it was placed before
    return _too_long(c, *_longest(fuse(_program(schedule, split, plan, cache.place_array, instances, inplace))),
                     max_steps)


def _check_peers(schedule: Schedule, instances: int, sms: int) -> int:
    """Fail at once where a GPU has more peers than it can have threadblocks: a
    threadblock sends to one peer and receives from one, so a GPU needs at least as many
    as it has distinct send (or receive) peers, per instance. Placing such a schedule
    would only find out after trying every channel count (minutes at 1,024 GPUs).
    Returns the most send or receive peers of any GPU."""
    sends, recvs = rank_peers(schedule)
    most, rank, what = max(max(((len(p), -r, "sends to") for r, p in sends.items()), default=(0, 0, "")),
                           max(((len(p), -r, "receives from") for r, p in recvs.items()), default=(0, 0, "")))
    excess = threadblock_excess(most * instances, sms)
    if excess is not None:
        raise PeerLimitError(f"msccl-threadblocks: GPU {-rank} {what} {most} GPUs, and each peer takes a threadblock "
                         f"of its own{f' per instance ({instances})' if instances > 1 else ''}: it needs at least "
                         f"{excess}. Use a schedule with fewer peers per GPU (synthesize{{max_peers=...}}) or "
                         "fewer instances")
    return most


def _longest(fused: Program) -> tuple[int, str]:
    """The steps of the fused program's longest threadblock once ordered (nops
    included; the first of the highest rank among equals), and where it is."""
    return _longest_of(fused, ordered_lengths(fused))


def _longest_within(fused: Program, max_steps: int) -> tuple[int, str] | None:
    """`_longest`, or None as soon as some threadblock is known to pass `max_steps`."""
    lengths = ordered_lengths_within(fused, max_steps)
    return None if lengths is None else _longest_of(fused, lengths)


def _longest_of(fused: Program, lengths: list[int]) -> tuple[int, str]:
    where = [(g.rank, tb) for g in fused.gpus for tb in g.tbs]
    k = max(range(len(where)), key=lambda k: (lengths[k], where[k][0]))
    (g, tb), steps = where[k], lengths[k]
    return steps, f"GPU {g}'s threadblock (send {tb.send}, recv {tb.recv}, channel {tb.chan})"


@register_pass
@dataclass(frozen=True)
class AssignThreadblocks(Pass):
    name = "msccl-threadblocks"
    summary = ("split ops into sends and receives and place them in MSCCL threadblocks and channels "
               "(in place, instances)")
    instances: int = 1
    inplace: bool = False
    channels: int = 0  # per instance; 0: the fewest that fit max_steps
    max_steps: int = DEFAULT_MAX_STEPS
    # SMs per GPU that bound the threadblocks per GPU; -1: the fewest any GPU of the
    # topology declares (`gpu g[8] sms 80;`), 0: no bound.
    sms: int = -1

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule is None:
            raise CollcError("msccl-threadblocks: there is no schedule to lower (run a pass that makes one first)")
        sms = topology_sms(unit.topology) if self.sms < 0 else self.sms
        program = assign_threadblocks(unit.schedule, instances=self.instances, inplace=self.inplace,
                                      channels=self.channels, max_steps=self.max_steps, sms=sms)
        tbs = sum(len(g.tbs) for g in program.gpus)
        return replace(unit, lowered=program).with_note(self.name, threadblocks=tbs, channels=program.nchannels,
                                                        halves=len(program.halves))


def topology_sms(topology: Topology | None) -> int:
    """The fewest SMs any GPU of the topology declares; 0 where none declares any."""
    declared = [g.sms for g in topology.gpus if g.sms] if topology is not None else []
    return min(declared, default=0)
