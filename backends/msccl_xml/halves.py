"""Splitting a schedule into per-rank halves, and what each half must wait for.

Every op becomes halves on the ranks that execute it (`program.Half`). With `instances`
copies of the schedule, chunk slot i of the input and output buffers becomes slots
i*instances .. i*instances+instances-1 (the executor's buffer layout fixes where each
byte of a chunk lives, so instance j gets sub-slot j of every chunk) and scratch slot i
of instance j becomes j*scratch+i. Sub-slots of one instance are not consecutive, so with
more than one instance every op is split into one-chunk pieces.

Dependencies are recomputed from slot accesses, not copied from the ops: a half must
follow every earlier half of its rank that wrote a slot it touches and every earlier
reader of a slot it writes. In a verified schedule each such pair is ordered by the
dependency graph, so "earlier" in schedule order is the graph's order; and a dependency
between ops on disjoint ranks (which MSCCL cannot express) is never needed for the data.

Everything here works on integer arrays, one per field: the ops' fields are read once,
each op becomes one or two half rows (`np.repeat`), and the slot analysis, fusion
candidates, forwards-first order and key places are array operations (`slots.py`). The
halves stay columns (`program.HalfTable`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from collc.backends.msccl_xml.channels import HalfArrays
from collc.backends.msccl_xml.inplace import aliased, in_place_ops
from collc.backends.msccl_xml.model import BufferName
from collc.backends.msccl_xml import slots
from collc.backends.msccl_xml.program import (
    HALF_KINDS, PHASE_LOCAL, PHASE_RECV, PHASE_SEND, HalfKind, HalfTable, IntPairs, PerHalf, Slot, inplace_offset,
    unified_buffer,
)
from collc.backends.msccl_xml.slots import slot_analysis
from collc.ir.collective import Collective
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule


@dataclass(frozen=True)
class Halves:
    halves: HalfTable
    preds: PerHalf
    # (receive-reduce half, the only half that reads its sum), by receive.
    sole_readers: IntPairs
    # Per rank: (i_chunks, o_chunks, s_chunks) as the program names them.
    buffers: tuple[tuple[int, int, int], ...]
    # (receive half, send half) fusion candidates (`channels.fusion_candidates`), found once.
    candidates: IntPairs
    # Per half: the rank of its key among all keys (`key_places`), an array (as a tuple
    # of ints, 170 MiB at 1,024 GPUs).
    places: np.ndarray
    # The fields the threadblock planning reads, as arrays.
    arrays: HalfArrays
    # `candidates` and `preds` as arrays: (receives, sends) and (half, predecessor).
    candidate_arrays: tuple[np.ndarray, np.ndarray]
    pred_pairs: tuple[np.ndarray, np.ndarray]


def buffer_sizes(schedule: Schedule, inplace: bool, instances: int) -> tuple[tuple[int, int, int], ...]:
    coll = schedule.collective
    sizes = []
    for r in range(coll.ranks):
        i, o, s = len(coll.inputs[r]), len(coll.outputs[r]), schedule.scratch_slots(r)
        if inplace:
            unified = max(inplace_offset(coll, r, Buffer.INPUT) + i, inplace_offset(coll, r, Buffer.OUTPUT) + o)
            i, o = (unified, 0) if unified_buffer(coll.kind) is Buffer.INPUT else (0, unified)
        sizes.append((i * instances, o * instances, s * instances))
    return tuple(sizes)


_XML_BUFFER = {b: BufferName(b.value) for b in Buffer}
_XML_BUFFER_BY_ID = {id(b): x for b, x in _XML_BUFFER.items()}  # hashing an Enum runs Python code


class _SlotMap:
    """Physical slot of (rank, buffer, index) in instance j."""

    def __init__(self, schedule: Schedule, instances: int):
        self.instances = instances
        self.scratch = [schedule.scratch_slots(r) for r in range(schedule.collective.ranks)]

    def __call__(self, loc: Loc, instance: int) -> Slot:
        k = self.instances
        if loc.buffer is Buffer.SCRATCH:
            index = instance * self.scratch[loc.rank] + loc.index
        else:
            index = loc.index * k + instance
        return Slot(_XML_BUFFER[loc.buffer], index)


def split_schedule(schedule: Schedule, inplace: bool = False, instances: int = 1) -> Halves:
    ops = in_place_ops(schedule) if inplace else schedule.ops
    cols = _half_columns(_op_columns(ops), instances, [schedule.scratch_slots(r) for r in range(
        schedule.collective.ranks)])
    needed = _required_slots(schedule.collective, inplace, _SlotMap(schedule, instances))
    pair_half, pair_pred, sole_readers = slot_analysis(
        cols.kind, cols.rank, cols.src_buffer, cols.src_index, cols.dst_buffer, cols.dst_index, cols.count,
        np.fromiter(needed, np.int64, len(needed)))
    preds = PerHalf(pair_half, pair_pred, len(cols.kind))
    # Kinds, slots and counts do not change below, so neither do the candidates.
    candidates = _candidates(cols, pair_half, pair_pred)
    fresh, origin = _forward_order(cols, candidates)
    places = _key_places(cols, fresh, origin)
    halves = _half_table(cols, fresh, origin)
    return Halves(halves, preds, IntPairs(*sole_readers), buffer_sizes(schedule, inplace, instances),
                  IntPairs(*candidates), places,
                  HalfArrays(cols.kind, cols.rank, cols.peer, cols.position, cols.piece, cols.instance),
                  candidates, (pair_half, pair_pred))


@dataclass
class _OpColumns:
    """The ops, one integer array per field (kind: 1 for a reduction; buffers as codes
    0 input, 1 output, 2 scratch)."""

    reduce: np.ndarray
    src_rank: np.ndarray
    src_buffer: np.ndarray
    src_index: np.ndarray
    dst_rank: np.ndarray
    dst_buffer: np.ndarray
    dst_index: np.ndarray
    count: np.ndarray
    step: np.ndarray
    id: np.ndarray


_BUFFER_OF_LOC = {id(Buffer.INPUT): 0, id(Buffer.OUTPUT): 1, id(Buffer.SCRATCH): 2}
_BUFFER_NAMES = (BufferName.INPUT, BufferName.OUTPUT, BufferName.SCRATCH)


def _op_columns(ops: Sequence[Op]) -> _OpColumns:
    """One pass over the op objects (the only per-op Python loop of the split)."""
    code, reduce = _BUFFER_OF_LOC, OpKind.REDUCE
    rows = [(op.kind is reduce, s[0], code[id(s[1])], s[2], d[0], code[id(d[1])], d[2], op.count, op.step, op.id)
            for op in ops for s, d in ((op.src, op.dst),)]
    table = np.array(rows, dtype=np.int64).reshape(len(rows), 10)
    return _OpColumns(*(table[:, k].copy() for k in range(10)))


@dataclass
class _Columns:
    """The halves, one integer array per field, in half order: per op (and, with several
    instances, per piece and instance) a local half, or a send followed by its receive."""

    kind: np.ndarray  # slots.SEND, RECV, ...
    rank: np.ndarray
    peer: np.ndarray
    src_buffer: np.ndarray
    src_index: np.ndarray
    dst_buffer: np.ndarray
    dst_index: np.ndarray
    count: np.ndarray
    step: np.ndarray
    position: np.ndarray
    piece: np.ndarray
    instance: np.ndarray
    op: np.ndarray


def _half_columns(ops: _OpColumns, instances: int, scratch: list[int]) -> _Columns:
    """With `instances` copies, every op is split into one-chunk pieces, instance by
    instance (sub-slots of one instance are not consecutive); slots are mapped as
    `_SlotMap` maps them."""
    n_ops = len(ops.id)
    position = np.arange(n_ops, dtype=np.int64)
    if instances == 1:
        row = position
        piece = np.zeros(n_ops, dtype=np.int64)
        instance = piece
        count = ops.count
    else:
        per_op = ops.count * instances
        row = np.repeat(position, per_op)
        within = np.arange(len(row), dtype=np.int64) - np.repeat(np.cumsum(per_op) - per_op, per_op)
        piece, instance = within // instances, within % instances
        count = np.ones(len(row), dtype=np.int64)
    moving = ops.src_rank[row] != ops.dst_rank[row]
    per_row = 1 + moving
    half_row = np.repeat(np.arange(len(row), dtype=np.int64), per_row)
    second = np.zeros(len(half_row), dtype=bool)  # the receive of a transfer
    second[np.cumsum(per_row)[moving] - 1] = True
    r = row[half_row]
    is_moving = moving[half_row]
    reduce = ops.reduce[r] == 1
    kind = np.where(~is_moving, np.where(reduce, slots.REDUCE, slots.COPY),
                    np.where(second, np.where(reduce, slots.RECV_REDUCE, slots.RECV), slots.SEND))
    src_rank, dst_rank = ops.src_rank[r], ops.dst_rank[r]
    rank = np.where(second, dst_rank, src_rank)
    peer = np.where(~is_moving, -1, np.where(second, src_rank, dst_rank))
    p, j = piece[half_row], instance[half_row]
    columns = []
    for buffer, index, owner in ((ops.src_buffer, ops.src_index, src_rank), (ops.dst_buffer, ops.dst_index, dst_rank)):
        b, i = buffer[r], index[r]
        if instances > 1:
            room = np.array(scratch, dtype=np.int64)[owner] if scratch else np.zeros(len(owner), dtype=np.int64)
            i = np.where(b == 2, j * room + i + p, (i + p) * instances + j)
        columns += [b, i]
    return _Columns(kind, rank, peer, *columns, count[half_row], ops.step[r], r, p, j, ops.id[r])


def _candidates(cols: _Columns, pair_half: np.ndarray, pair_pred: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`channels.fusion_candidates` on the columns: (receive, send) pairs where the send
    forwards exactly what the receive stored, as two arrays, by send."""
    kind = cols.kind
    b, a = pair_half, pair_pred
    keep = ((kind[b] == slots.SEND) & ((kind[a] == slots.RECV) | (kind[a] == slots.RECV_REDUCE))
            & (cols.dst_buffer[a] == cols.src_buffer[b]) & (cols.dst_index[a] == cols.src_index[b])
            & (cols.count[a] == cols.count[b]))
    return a[keep], b[keep]


def _forward_order(cols: _Columns, candidates: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(fresh, origin) of every half (`HalfKey`): a send's transfer's place among the
    messages of its step is forwards first, in the order of what they forward; its
    receive shares it; local halves get (0, -1)."""
    n = len(cols.kind)
    is_send = cols.kind == slots.SEND
    forwarded = np.full(n, -1, dtype=np.int64)  # send -> the receive it forwards (the last candidate wins)
    forwarded[candidates[1]] = candidates[0]
    fresh = np.zeros(n, dtype=np.int64)
    origin = np.full(n, -1, dtype=np.int64)
    rank = np.full(n, -1, dtype=np.int64)  # send half -> rank of its message among all messages
    sends = np.flatnonzero(is_send)
    sends = sends[np.argsort(cols.step[sends], kind="stable")]
    steps = cols.step[sends]
    bounds = np.flatnonzero(np.r_[True, steps[1:] != steps[:-1], True])
    position, piece, instance = cols.position, cols.piece, cols.instance
    done = 0
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        hs = sends[lo:hi]
        # What a forward forwards arrived at an earlier step, so its rank is known. The
        # receive a is the half after its send.
        a = forwarded[hs]
        fw = a >= 0
        fresh[hs] = np.where(fw, 0, 1)
        origin[hs] = np.where(fw, rank[np.where(fw, a - 1, 0)], -1)
        order = hs[np.lexsort((instance[hs], piece[hs], position[hs], origin[hs], fresh[hs]))]
        rank[order] = np.arange(done, done + len(order))
        done += len(order)
    receives = np.flatnonzero((cols.kind == slots.RECV) | (cols.kind == slots.RECV_REDUCE))
    fresh[receives] = fresh[receives - 1]
    origin[receives] = origin[receives - 1]
    return fresh, origin


def _phase(kind: np.ndarray) -> np.ndarray:
    return np.where(kind == slots.SEND, PHASE_SEND,
                    np.where((kind == slots.RECV) | (kind == slots.RECV_REDUCE), PHASE_RECV, PHASE_LOCAL))


def _key_places(cols: _Columns, fresh: np.ndarray, origin: np.ndarray) -> np.ndarray:
    """`program.key_places` on the columns: each half's rank among all keys."""
    order = np.lexsort((cols.instance, cols.piece, cols.position, origin, fresh, _phase(cols.kind), cols.step))
    places = np.empty(len(order), dtype=np.int64)
    places[order] = np.arange(len(order), dtype=np.int64)
    return places


def _half_table(cols: _Columns, fresh: np.ndarray, origin: np.ndarray) -> HalfTable:
    """The halves as a HalfTable (kind codes of `slots.py` are HALF_KINDS' indices)."""
    return HalfTable(kind=cols.kind, rank=cols.rank, peer=cols.peer, src_buffer=cols.src_buffer,
                     src_index=cols.src_index, dst_buffer=cols.dst_buffer, dst_index=cols.dst_index, count=cols.count,
                     step=cols.step, fresh=fresh, origin=origin, position=cols.position, piece=cols.piece,
                     instance=cols.instance, op=cols.op)


assert [HALF_KINDS[k] for k in (slots.SEND, slots.RECV, slots.RECV_REDUCE, slots.COPY, slots.REDUCE)] == [
    HalfKind.SEND, HalfKind.RECV, HalfKind.RECV_REDUCE, HalfKind.COPY, HalfKind.REDUCE]


def _required_slots(coll: Collective, inplace: bool, slot: _SlotMap) -> set[int]:
    """Physical slots whose final value the postcondition names (as `_slot_code`s)."""
    need: set[int] = set()
    for r, buf in enumerate(coll.outputs):
        if not inplace and slot.instances == 1:  # the output slots themselves: no Loc or Slot to build
            base = _slot_code(r, Slot(BufferName.OUTPUT, 0))
            need.update(base + j for j, want in enumerate(buf) if want is not None)
            continue
        for j, want in enumerate(buf):
            if want is None:
                continue
            loc = Loc(r, Buffer.OUTPUT, j)
            if inplace:
                loc = aliased(coll, loc)
            for inst in range(slot.instances):
                need.add(_slot_code(r, slot(loc, inst)))
    return need


def _slot_code(rank: int, slot: Slot) -> int:
    """A slot of a rank as one integer (cheap to hash: an enum's hash runs Python code)."""
    b = slot.buffer
    buffer = 0 if b is BufferName.INPUT else 1 if b is BufferName.OUTPUT else 2
    return ((rank * 3 + buffer) << 40) | slot.index
