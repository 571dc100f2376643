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
from itertools import chain

import numpy as np

from collc.backends.msccl_xml.program import collections_paused
from collc.diagnostics import CollcError
from collc.ir.schedule import Buffer, Op, OpKind, Schedule
from collc.passes.base import CompileUnit, Pass, register_pass

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
    cols = _columns(ops)
    order, run_start = _runs(cols, max_count)
    starts = np.flatnonzero(run_start)
    lengths = np.diff(np.r_[starts, len(order)])
    totals = np.add.reduceat(cols["count"][order], starts)
    if len(starts) == len(ops) and int(totals.max()) <= max_count:
        return schedule
    return replace(schedule, ops=_rebuilt(ops, cols, order, starts, lengths, totals, max_count))


def _plain_deps(ops: tuple[Op, ...], renamed: np.ndarray) -> np.ndarray:
    """Per op: whether its deps are strictly increasing (so sorted and each once) and
    none of them is in `renamed`."""
    counts = np.fromiter(map(len, (op.deps for op in ops)), np.int64, len(ops))
    flat = np.fromiter(chain.from_iterable(op.deps for op in ops), np.int64, int(counts.sum()))
    owner = np.repeat(np.arange(len(ops), dtype=np.int64), counts)
    bad = np.isin(flat, renamed)
    bad[1:] |= (flat[1:] <= flat[:-1]) & (owner[1:] == owner[:-1])
    plain = np.ones(len(ops), dtype=bool)
    plain[owner[bad]] = False
    return plain


_BUFFER_CODE = {id(b): k for k, b in enumerate(Buffer)}  # by identity: hashing an Enum runs Python code


def _columns(ops: tuple[Op, ...]) -> dict[str, np.ndarray]:
    """The fields that decide merging, one integer array each (routes numbered in order
    of first use): one pass over the op objects."""
    route_number: dict[tuple[str, ...], int] = {}
    number = route_number.setdefault
    code, copy = _BUFFER_CODE, OpKind.COPY
    rows = [(op.step, op.kind is copy, s[0], code[id(s[1])], s[2], d[0], code[id(d[1])], d[2], op.count,
             number(op.route, len(route_number)))
            for op in ops for s, d in ((op.src, op.dst),)]
    table = np.array(rows, dtype=np.int64).reshape(len(rows), 10)
    names = ("step", "copy", "src_rank", "src_buffer", "src_index", "dst_rank", "dst_buffer", "dst_index", "count",
             "route")
    return {name: table[:, k].copy() for k, name in enumerate(names)}


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
    next_id = 1 + max(op.id for op in ops)
    pieces = -(-totals // max_count)  # ops each run becomes
    changed = (lengths > 1) | (pieces > 1)
    extra = np.cumsum(pieces - 1) - (pieces - 1)  # new ids before each run's
    order_list = order.tolist()
    starts_list, lengths_list, pieces_list = starts.tolist(), lengths.tolist(), pieces.tolist()
    # Old op id -> the ops that now do its work, where that is not the op itself.
    replacement: dict[int, tuple[int, ...]] = {}
    run_ids: dict[int, tuple[int, ...]] = {}
    for r in np.flatnonzero(changed).tolist():
        lo = starts_list[r]
        first = next_id + int(extra[r])
        ids = (ops[order_list[lo]].id, *range(first, first + pieces_list[r] - 1))
        run_ids[r] = ids
        for k in range(lo, lo + lengths_list[r]):
            replacement[ops[order_list[k]].id] = ids
    renamed = replacement.keys()
    leaders = order[starts]  # the first op of each run
    position_of_run = np.minimum.reduceat(order, starts)  # of each run, its least schedule position
    # A run of one op that keeps its id stays the op itself where its deps are already
    # sorted, each once, and none of them renamed: decided for all such runs at once.
    kept = ~changed & _plain_deps(ops, np.fromiter(renamed, np.int64, len(renamed)))[leaders]
    placed: list[Op] = [ops[k] for k in leaders[kept].tolist()]
    placed_step = [cols["step"][leaders[kept]]]
    placed_pos = [position_of_run[kept]]
    placed_piece = [np.zeros(len(placed), dtype=np.int64)]
    more_step: list[int] = []
    more_pos: list[int] = []
    more_piece: list[int] = []
    make = Op.make
    for r in np.flatnonzero(~kept).tolist():
        lo = starts_list[r]
        first = ops[order_list[lo]]
        length = lengths_list[r]
        pos = int(position_of_run[r])
        if length == 1:
            old = first.deps
            if len(old) > 1:
                old = sorted(set(old))
        else:
            old = sorted({d for k in range(lo, lo + length) for d in ops[order_list[k]].deps})
        if renamed.isdisjoint(old):
            deps = tuple(old)
        else:
            # The new ids of the old deps, in order, each once (dict keys keep their order).
            deps = tuple(dict.fromkeys(x for d in old for x in replacement.get(d, (d,))))
        ids = run_ids.get(r)
        if ids is None and deps == first.deps:
            placed.append(first)  # unchanged after all: the op itself
            more_step.append(first.step)
            more_pos.append(pos)
            more_piece.append(0)
            continue
        if ids is None:
            ids = (first.id,)
        total = int(totals[r])
        for piece, offset in enumerate(range(0, total, max_count)):
            placed.append(make(
                ids[piece], first.kind, first.src.shifted(offset) if offset else first.src,
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
