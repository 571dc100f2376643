"""`msccl-threadblocks`: from a schedule to halves placed in threadblocks and channels.

Runs first among the MSCCL lowering passes (after `msccl-merge`): checks that the executor
can run the collective at all, maps buffers for in-place runs, copies the schedule for
`instances`, splits ops into halves (`halves.py`) and places them (`channels.py`). Each
threadblock's steps are one half each, in key order; `msccl-fuse` fuses them next. The
number of channels is chosen by trying the following passes: a placement is kept when
the fused threadblocks, nop steps included, fit `max_steps`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from collc.backends.msccl_xml.channels import (
    MAX_TBS_PER_CHANNEL, PlanCache, channel_counts, check_counts, plan_threadblocks,
)
from collc.backends.msccl_xml.dependencies import order_steps
from collc.backends.msccl_xml.fuse import fuse
from collc.backends.msccl_xml.halves import split_schedule
from collc.backends.msccl_xml.program import (
    LGpu, Program, Stage, base_chunks_per_loop, coll_token, collections_paused,
)
from collc.diagnostics import CollcError
from collc.backends.msccl_xml.limits import LimitError, PeerLimitError, threadblock_excess
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
    token = coll_token(coll)
    if max_steps < 1:
        raise CollcError(f"msccl-threadblocks: max_steps={max_steps}; a threadblock needs room for at least one step")
    check_counts(instances, channels)
    if sms:
        _check_peers(schedule, instances, sms)
    split = split_schedule(schedule, inplace=inplace, instances=instances)
    tries = channel_counts(split.arrays, instances, channels, max_steps)
    best: tuple[int, str] | None = None  # (steps, where) of the least bad attempt
    crowded: str | None = None  # why the last channel count tried had too many threadblocks
    cache: PlanCache | None = None
    matchings: dict = {}  # kept across caches (see `_matching`)
    for c in tries:
        if cache is None:
            cache = PlanCache(split.halves, split.candidates, split.places, split.arrays, matchings)
        plan = plan_threadblocks(split.halves, split.preds, coll.ranks, instances, c, max_steps,
                                 split.candidates, cache)
        if plan is None:
            continue
        if sms:
            most, rank = max((len(tbs), -r) for r, tbs in enumerate(plan.tbs))  # the first busiest GPU
            excess = threadblock_excess(most, sms)
            if excess is not None:
                crowded = f"with {c} channel(s) per instance GPU {-rank} needs {excess}"
                break
        if plan.least_steps > max_steps:
            if best is None or plan.least_steps < best[0]:
                best = (plan.least_steps, plan.longest)
            continue
        place_array = cache.place_array
        # The planning's arrays and chains (about 800 MiB at 1,024 GPUs) are freed while
        # the plan is measured, and built again only if another count must be tried.
        cache = None
        halves = split.halves
        program = Program(
            name=schedule.name, collective=coll, coll=token, ngpus=coll.ranks,
            nchunksperloop=base_chunks_per_loop(coll) * instances, inplace=inplace, instances=instances,
            halves=halves, preds=split.preds, sole_readers=split.sole_readers,
            gpus=tuple(LGpu(r, *split.buffers[r], plan.tbs[r]) for r in range(coll.ranks)), stage=Stage.ASSIGNED,
            candidates=split.candidates, place_array=place_array,
            candidate_arrays=split.candidate_arrays, pred_pairs=split.pred_pairs)
        # Fusing and dependencies decide the final length of each threadblock; both are
        # deterministic, so the passes that follow reproduce exactly what is measured here.
        steps, where = _longest(order_steps(fuse(program)))
        if steps <= max_steps:
            return program
        if best is None or steps < best[0]:
            best = (steps, where)
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


def _check_peers(schedule: Schedule, instances: int, sms: int) -> None:
    """Fail at once where a GPU has more peers than it can have threadblocks: a
    threadblock sends to one peer and receives from one, so a GPU needs at least as many
    as it has distinct send (or receive) peers, per instance. Placing such a schedule
    would only find out after trying every channel count (minutes at 1,024 GPUs)."""
    sends, recvs = rank_peers(schedule)
    most, rank, what = max(max(((len(p), -r, "sends to") for r, p in sends.items()), default=(0, 0, "")),
                           max(((len(p), -r, "receives from") for r, p in recvs.items()), default=(0, 0, "")))
    excess = threadblock_excess(most * instances, sms)
    if excess is not None:
        raise PeerLimitError(f"msccl-threadblocks: GPU {-rank} {what} {most} GPUs, and each peer takes a threadblock "
                         f"of its own{f' per instance ({instances})' if instances > 1 else ''}: it needs at least "
                         f"{excess}. Use a schedule with fewer peers per GPU (synthesize{{max_peers=...}}) or "
                         "fewer instances")


def _longest(program: Program) -> tuple[int, str]:
    steps, g, tb = max(((len(tb.steps), g.rank, tb) for g in program.gpus for tb in g.tbs), key=lambda t: t[:2])
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
