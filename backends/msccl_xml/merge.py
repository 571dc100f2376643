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

from dataclasses import dataclass, replace
from operator import attrgetter

import numpy as np

from collc.backends.msccl_xml.program import collections_paused
from collc.diagnostics import CollcError
from collc.ir.schedule import Op, Schedule
from collc.passes.base import CompileUnit, Pass, register_pass
from collc.verify.columns import columns_of

MAX_COUNT = 71  # cnt must stay below MSCCL_MAX_COUNT = 72 (msccl_struct.h)


def merge_ops(schedule: Schedule, max_count: int = MAX_COUNT) -> Schedule:
    """The schedule with same-step contiguous ops merged and large ops split; the same
    object when nothing changes."""
    if not 1 <= max_count <= MAX_COUNT:
        raise CollcError(f"msccl-merge: max_count={max_count} is out of range; an MSCCL step moves 1 to "
                         f"{MAX_COUNT} chunks")
    ops = schedule.ops
    if not ops:
        return schedule
    cols = _columns(schedule)
    order, run_start = _runs(cols, max_count)
    starts = np.flatnonzero(run_start)
    lengths = np.diff(np.r_[starts, len(order)])
    totals = np.add.reduceat(cols["count"][order], starts)
    if len(starts) == len(ops) and int(totals.max()) <= max_count:
        return schedule
    return replace(schedule, ops=_rebuilt(ops, cols, order, starts, lengths, totals, max_count))


def _plain_deps(counts: np.ndarray, flat: np.ndarray, renamed: np.ndarray) -> np.ndarray:
    """Per op (`counts` dependencies each, all of them in order in `flat`): whether its
    deps are strictly increasing (so sorted and each once) and none of them is in
    `renamed`."""
    owner = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    bad = np.isin(flat, renamed)
    bad[1:] |= (flat[1:] <= flat[:-1]) & (owner[1:] == owner[:-1])
    plain = np.ones(len(counts), dtype=bool)
    plain[owner[bad]] = False
    return plain


def _columns(schedule: Schedule) -> dict[str, np.ndarray]:
    """The fields that decide merging, one integer array each, and the dependencies
    (`ndeps` per op, all of them in order in `deps`). They come from the schedule's
    columns (`collc.verify.columns.columns_of`): the builder's own where it kept them (the
    stdlib rings: 3 million ops at 1,024 ranks, read from the objects in seconds), else
    read from the ops at C level. Buffers and routes are codes that only need to be
    equal where the values are (they group ops; groups are then ordered by first use)."""
    cols = columns_of(schedule)
    src_rank, src_buffer = np.divmod(cols.src_rb, 3)
    dst_rank, dst_buffer = np.divmod(cols.dst_rb, 3)
    return {"ids": cols.ids, "step": cols.step, "copy": 1 - (cols.kind_route & 1), "src_rank": src_rank, "src_buffer": src_buffer,
            "src_index": cols.src_idx, "dst_rank": dst_rank, "dst_buffer": dst_buffer, "dst_index": cols.dst_idx,
            "count": cols.count, "route": cols.kind_route >> 1, "ndeps": cols.ndeps, "deps": cols.deps}


def _runs(cols: dict[str, np.ndarray], max_count: int) -> tuple[np.ndarray, np.ndarray]:
    """The ops in run order, and where each run starts.

    Ops group by (step, kind, source rank and buffer, destination rank and buffer,
    route), groups in order of their first op; inside a group, by source index (then
    schedule order). A run continues while the next op starts where the previous ended
    at both ends and the run stays within `max_count` chunks (filled greedily)."""
    n = len(cols["step"])
    index = np.arange(n, dtype=np.int64)
    key_fields = ("route", "dst_buffer", "dst_rank", "src_buffer", "src_rank", "copy", "step")
    by_key = np.lexsort(tuple(cols[f] for f in key_fields))
    keys = np.stack([cols[f][by_key] for f in key_fields])
    new_group = np.r_[True, (keys[:, 1:] != keys[:, :-1]).any(axis=0)]
    group_sorted = np.cumsum(new_group) - 1
    group = np.empty(n, dtype=np.int64)
    group[by_key] = group_sorted
    first_use = np.full(int(group_sorted[-1]) + 1, n, dtype=np.int64)
    np.minimum.at(first_use, group, index)
    order = np.lexsort((index, cols["src_index"], first_use[group]))
    g = group[order]
    src, dst, count = cols["src_index"][order], cols["dst_index"][order], cols["count"][order]
    start = np.ones(n, dtype=bool)
    start[1:] = (g[1:] != g[:-1]) | (src[:-1] + count[:-1] != src[1:]) | (dst[:-1] + count[:-1] != dst[1:])
    # Contiguous stretches within max_count are one run each; a longer one is cut greedily.
    seg = np.flatnonzero(start)
    seg_total = np.add.reduceat(count, seg)
    for lo in seg[seg_total > max_count].tolist():
        total = 0
        k = lo
        while k < n and (k == lo or not start[k]):
            if total + count[k] > max_count and k != lo:
                start[k] = True
                total = 0
            total += int(count[k])
            k += 1
    return order, start


def _rebuilt(ops: tuple[Op, ...], cols: dict[str, np.ndarray], order: np.ndarray, starts: np.ndarray,
             lengths: np.ndarray, totals: np.ndarray, max_count: int) -> tuple[Op, ...]:
    """The merged ops: every run's new ids first, so that each new op is built once, with
    its deps already renamed (a dependency may sit in a run met later)."""
    ids = cols["ids"]
    next_id = 1 + int(ids.max())
    pieces = -(-totals // max_count)  # ops each run becomes
    changed = (lengths > 1) | (pieces > 1)
    extra = np.cumsum(pieces - 1) - (pieces - 1)  # new ids before each run's
    runs = len(starts)
    run_of = np.empty(len(ops), dtype=np.int64)  # the run of each op (by position)
    run_of[order] = np.repeat(np.arange(runs, dtype=np.int64), lengths)
    leaders = order[starts]  # the first op of each run
    position_of_run = np.minimum.reduceat(order, starts)  # of each run, its least schedule position
    # Each dependency as the position of the op it names (-1: none; ids are positions
    # in every built or synthesized schedule, and then nothing is searched).
    dep_pos = _positions(ids, cols["deps"])
    dep_changed = np.zeros(len(dep_pos), dtype=bool)
    named = dep_pos >= 0
    dep_changed[named] = changed[run_of[dep_pos[named]]]
    # A run of one op that keeps its id stays the op itself where its deps are already
    # sorted, each once, and none of them renamed: decided for all such runs at once.
    kept = ~changed & _plain_deps(cols["ndeps"], cols["deps"], ids[dep_pos[dep_changed]])[leaders]
    placed: list[Op] = [ops[k] for k in leaders[kept].tolist()]
    placed_step = [cols["step"][leaders[kept]]]
    placed_pos = [position_of_run[kept]]
    placed_piece = [np.zeros(len(placed), dtype=np.int64)]
    more_step: list[int] = []
    more_pos: list[int] = []
    more_piece: list[int] = []
    rest = np.flatnonzero(~kept)
    deps_of = _renamed_deps(ops, cols, run_of, dep_pos, dep_changed, rest, kept, changed, pieces, extra, ids[leaders],
                            next_id)
    make = Op.make
    order_list, starts_list, pieces_list = order.tolist(), starts.tolist(), pieces.tolist()
    leader_ids, extra_list = ids[leaders].tolist(), extra.tolist()
    for r, pos, is_changed, deps in zip(rest.tolist(), position_of_run[rest].tolist(), changed[rest].tolist(),
                                        deps_of):
        first = ops[order_list[starts_list[r]]]
        if not is_changed:
            if deps == first.deps:
                placed.append(first)  # unchanged after all: the op itself
                more_step.append(first.step)
                more_pos.append(pos)
                more_piece.append(0)
                continue
            new_ids: tuple[int, ...] = (first.id,)
        else:
            new = next_id + extra_list[r]
            new_ids = (leader_ids[r], *range(new, new + pieces_list[r] - 1))
        total = int(totals[r])
        for piece, offset in enumerate(range(0, total, max_count)):
            placed.append(make(
                new_ids[piece], first.kind, first.src.shifted(offset) if offset else first.src,
                first.dst.shifted(offset) if offset else first.dst,
                min(max_count, total - offset), deps, first.step, first.route, first.origin))
            more_step.append(first.step)
            more_pos.append(pos)
            more_piece.append(piece)
    placed_step.append(np.array(more_step, dtype=np.int64))
    placed_pos.append(np.array(more_pos, dtype=np.int64))
    placed_piece.append(np.array(more_piece, dtype=np.int64))
    # (step, position, piece): each op's place in the result.
    final = np.lexsort((np.concatenate(placed_piece), np.concatenate(placed_pos), np.concatenate(placed_step)))
    return tuple(map(placed.__getitem__, final.tolist()))


def _positions(ids: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The position of the op with each id of `wanted` (-1 where no op has it)."""
    n = len(ids)
    if np.array_equal(ids, np.arange(n)):
        return np.where((wanted >= 0) & (wanted < n), wanted, -1)
    by_id = np.argsort(ids, kind="stable")
    sorted_ids = ids[by_id]
    at = np.minimum(np.searchsorted(sorted_ids, wanted), max(0, n - 1))
    found = sorted_ids[at] == wanted if n else np.zeros(len(wanted), dtype=bool)
    return np.where(found, by_id[at], -1)


def _renamed_deps(ops: tuple[Op, ...], cols: dict[str, np.ndarray], run_of: np.ndarray, dep_pos: np.ndarray, dep_changed: np.ndarray,
                  rest: np.ndarray, kept: np.ndarray, changed: np.ndarray, pieces: np.ndarray, extra: np.ndarray,
                  leader_ids: np.ndarray, next_id: int) -> list[tuple[int, ...]]:
    """The dependencies of each run of `rest`, in its order: the deps of all the run's
    ops, sorted and each once; each one whose op now sits in a merged or split run
    replaced by that run's ids (its first op's id, then its new ones); each id once, at
    its first place. On arrays: at 1,024 ranks a million runs are renamed."""
    ndeps, deps = cols["ndeps"], cols["deps"]
    owner_run = np.repeat(run_of, ndeps)
    mine = ~kept[owner_run]
    runs, dep, pos, moved = owner_run[mine], deps[mine], dep_pos[mine], dep_changed[mine]
    # Sorted and each once per run (ids are non-negative; the run is the major key).
    width = int(dep.max(initial=0)) + 1
    _, first = np.unique(runs * width + dep, return_index=True)
    runs, dep, pos, moved = runs[first], dep[first], pos[first], moved[first]
    # Each dependency becomes the ids of its op's run where that run changed.
    dep_run = np.where(moved, run_of[np.maximum(pos, 0)], -1)
    count = np.where(moved, pieces[np.maximum(dep_run, 0)], 1)
    row = np.repeat(np.arange(len(dep), dtype=np.int64), count)
    j = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(count) - count, count)
    r = dep_run[row]
    value = np.where(~moved[row], dep[row],
                     np.where(j == 0, leader_ids[np.maximum(r, 0)], next_id + extra[np.maximum(r, 0)] + j - 1))
    owner = runs[row]
    # Each id once per run, at its first place (the order of `row` is the order wanted).
    width = int(value.max(initial=0)) + 1
    _, first = np.unique(owner * width + value, return_index=True)
    first.sort()
    owner, value = owner[first], value[first]
    bounds = np.searchsorted(owner, np.r_[rest, np.iinfo(np.int64).max]) if len(rest) else np.zeros(1, np.int64)
    # Runs of `rest` with no dependencies get (). The ids are the ops' own int objects
    # where ids are positions (as the tuples they replace held): two million fewer ints.
    values = value.tolist()
    if np.array_equal(cols["ids"], np.arange(len(run_of))) and next_id == len(run_of):
        objects = [*map(attrgetter("id"), ops), *range(next_id, next_id + int(extra[-1] + pieces[-1]) - 1)]
        values = list(map(objects.__getitem__, values))
        del objects
    b = bounds.tolist()
    empty: tuple[int, ...] = ()
    return [tuple(values[lo:hi]) if hi > lo else empty for lo, hi in zip(b, b[1:])]


@register_pass
@dataclass(frozen=True)
class MergeOps(Pass):
    name = "msccl-merge"
    summary = "merge same-step ops on consecutive chunks into one op (and split ops larger than an MSCCL step)"
    max_count: int = MAX_COUNT

    @collections_paused
    def run(self, unit: CompileUnit) -> CompileUnit:
        if unit.schedule is None:
            raise CollcError("msccl-merge: there is no schedule to lower (run a pass that makes one first)")
        merged = merge_ops(unit.schedule, self.max_count)
        if merged is unit.schedule:
            return unit.with_note(self.name, merged=0)
        return replace(unit, schedule=merged).with_note(self.name, merged=len(unit.schedule.ops) - len(merged.ops))
