"""`msccl-merge`: one op per run of contiguous chunks, and no op larger than a step.

An MSCCL step moves `cnt` consecutive chunks (cnt < 72). Ops of one schedule step that
move consecutive chunks between the same two buffers of the same two ranks in the same
way become one op: the step limit per threadblock is what runs out first on pipelined
and synthesized schedules, and one step of cnt=k is also cheaper than k steps. Ops of
one schedule step never depend on each other (a dependency points to an earlier step),
so merging them keeps every dependency and every slot access; ops larger than
`max_count` are split into pieces the same way. The result is a schedule again, which
the pass manager re-verifies.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from operator import itemgetter

from collc.diagnostics import CollcError
from collc.ir.schedule import Op, Schedule
from collc.passes.base import CompileUnit, Pass, register_pass

MAX_COUNT = 71  # cnt must stay below MSCCL_MAX_COUNT = 72 (msccl_struct.h)


def merge_ops(schedule: Schedule, max_count: int = MAX_COUNT) -> Schedule:
    """The schedule with same-step contiguous ops merged and large ops split; the same
    object when nothing changes."""
    if not 1 <= max_count <= MAX_COUNT:
        raise CollcError(f"msccl-merge: max_count={max_count} is out of range; an MSCCL step moves 1 to "
                         f"{MAX_COUNT} chunks")
    position = {op.id: i for i, op in enumerate(schedule.ops)}
    groups: dict[tuple, list[Op]] = defaultdict(list)
    for op in schedule.ops:
        src, dst = op.src, op.dst
        # Enum members by identity: hashing an Enum runs Python code, three per op here.
        groups[(op.step, id(op.kind), src[0], id(src[1]), dst[0], id(dst[1]), op.route)].append(op)

    runs: list[list[Op]] = []
    totals: list[int] = []  # chunks of each run
    for members in groups.values():
        if len(members) == 1:  # most groups
            runs.append(members)
            totals.append(members[0].count)
            continue
        members.sort(key=_src_index)
        run, total = [members[0]], members[0].count
        for prev, op in zip(members, members[1:]):
            # `op` continues the run when it starts where `prev` ended, at both ends.
            if (prev.src.index + prev.count == op.src.index and prev.dst.index + prev.count == op.dst.index
                    and total + op.count <= max_count):
                run.append(op)
                total += op.count
            else:
                runs.append(run)
                totals.append(total)
                run, total = [op], op.count
        runs.append(run)
        totals.append(total)
    if len(runs) == len(schedule.ops) and max(totals, default=0) <= max_count:
        return schedule

    # First every run's new ids, so that each new op is built once, with its deps already
    # renamed (a dependency may sit in a run met later).
    next_id = 1 + max(op.id for op in schedule.ops)
    # Old op id -> the ops that now do its work, where that is not the op itself.
    replacement: dict[int, tuple[int, ...]] = {}
    run_ids: list[list[int]] = []
    for run, total in zip(runs, totals):
        ids = [run[0].id]
        for _ in range(max_count, total, max_count):
            ids.append(next_id)
            next_id += 1
        run_ids.append(ids)
        if len(run) > 1 or len(ids) > 1:
            new = tuple(ids)
            for o in run:
                replacement[o.id] = new
    renamed = replacement.keys()
    placed: list[tuple[int, int, int, Op]] = []  # (step, position, piece, op)
    make = Op.make
    for run, ids, total in zip(runs, run_ids, totals):
        first = run[0]
        if len(run) == 1:  # most runs: no set to build
            pos, old = position[first.id], first.deps
            if len(old) > 1:
                old = sorted(set(old))
        else:
            pos = min(position[o.id] for o in run)
            old = sorted({d for o in run for d in o.deps})
        if renamed.isdisjoint(old):  # most ops: no dependency renamed
            deps = tuple(old)
        else:
            # The new ids of the old deps, in order, each once (dict keys keep their order).
            deps = tuple(dict.fromkeys(x for d in old for x in replacement.get(d, (d,))))
        if len(ids) == 1 and len(run) == 1 and deps == first.deps:
            placed.append((first.step, pos, 0, first))  # unchanged: the op itself
            continue
        for piece, offset in enumerate(range(0, total, max_count)):
            placed.append((first.step, pos, piece, make(
                ids[piece], first.kind, first.src.shifted(offset) if offset else first.src,
                first.dst.shifted(offset) if offset else first.dst,
                min(max_count, total - offset), deps, first.step, first.route, first.origin)))
    placed.sort(key=_placement)
    ops = [t[3] for t in placed]
    return replace(schedule, ops=tuple(ops))


_placement = itemgetter(0, 1, 2)  # (step, position, piece): each op's place in the result


def _src_index(op: Op) -> int:
    return op.src.index


@register_pass
@dataclass(frozen=True)
class MergeOps(Pass):
    name = "msccl-merge"
    summary = "merge same-step ops on consecutive chunks into one op (and split ops larger than an MSCCL step)"
    max_count: int = MAX_COUNT

    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule is None:
            raise CollcError("msccl-merge: there is no schedule to lower (run a pass that makes one first)")
        merged = merge_ops(unit.schedule, self.max_count)
        if merged is unit.schedule:
            return unit.with_note(self.name, merged=0)
        return replace(unit, schedule=merged).with_note(self.name, merged=len(unit.schedule.ops) - len(merged.ops))
