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
"""

from __future__ import annotations

from dataclasses import dataclass

from collc.backends.msccl_xml.channels import fusion_candidates
from collc.backends.msccl_xml.inplace import aliased, in_place_ops
from collc.backends.msccl_xml.model import BufferName
from collc.backends.msccl_xml.program import (
    PHASE_LOCAL, PHASE_RECV, PHASE_SEND, Half, HalfKey, HalfKind, Slot, inplace_offset, key_places,
    unified_buffer,
)
from collc.ir.collective import Collective
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule


@dataclass(frozen=True)
class Halves:
    halves: tuple[Half, ...]
    preds: tuple[tuple[int, ...], ...]
    sole_readers: dict[int, int]
    # Per rank: (i_chunks, o_chunks, s_chunks) as the program names them.
    buffers: tuple[tuple[int, int, int], ...]
    # (receive half, send half) fusion candidates (`channels.fusion_candidates`), found once.
    candidates: tuple[tuple[int, int], ...]
    # Per half: the rank of its key among all keys (`key_places`).
    places: tuple[int, ...]


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
    slot = _SlotMap(schedule, instances)
    halves: list[Half] = []
    for pos, op in enumerate(ops):
        pieces = [(0, op.count)] if instances == 1 else [(q, 1) for q in range(op.count)]
        for piece, count in pieces:
            for j in range(instances):
                _add_halves(halves, op, pos, piece, count, j, slot)
    preds, sole_readers = _slot_analysis(halves, _required_slots(schedule.collective, inplace, slot))
    # Kinds, slots and counts do not change below, so neither do the candidates.
    candidates = tuple(fusion_candidates(tuple(halves), preds))
    done = _forwards_first(halves, candidates)
    return Halves(done, preds, sole_readers, buffer_sizes(schedule, inplace, instances), candidates,
                  key_places(done))



def _forwards_first(halves: list[Half], candidates: tuple[tuple[int, int], ...]) -> tuple[Half, ...]:
    """Give both halves of every transfer its place among the messages of its step:
    forwards first, in the order of what they forward (see `HalfKey`)."""
    forwarded = {b: a for a, b in candidates}  # send -> receive it forwards
    by_step: dict[int, list[Half]] = {}
    for h in halves:
        if h.kind is HalfKind.SEND:
            by_step.setdefault(h.key.step, []).append(h)
    # A send half is followed by the receive half of its transfer (see _add_halves).
    transfer_of_receive = {h.id + 1: h.id for hs in by_step.values() for h in hs}
    order: dict[int, tuple[int, int]] = {}  # send half -> (fresh, origin)
    rank: dict[int, int] = {}  # send half -> rank of its message among all messages
    for step in sorted(by_step):
        # What a forward forwards arrived at an earlier step, so its rank is known.
        for h in by_step[step]:
            a = forwarded.get(h.id)
            order[h.id] = (1, -1) if a is None else (0, rank[transfer_of_receive[a]])
        for h in sorted(by_step[step], key=lambda h: (order[h.id], h.key.position, h.key.piece, h.key.instance)):
            rank[h.id] = len(rank)
    send = HalfKind.SEND
    for h in halves:
        if h.peer < 0:  # local
            continue
        fresh, origin = order[h.id if h.kind is send else transfer_of_receive[h.id]]
        k = h.key
        # The halves are split_schedule's own until it returns them, so the key is
        # completed in place rather than by copying 260,000 frozen halves at 256 ranks.
        object.__setattr__(h, "key", HalfKey(k.step, k.phase, fresh, origin, k.position, k.piece, k.instance))
    return tuple(halves)


def _add_halves(out: list[Half], op: Op, pos: int, piece: int, count: int, instance: int, slot: _SlotMap) -> None:
    src = slot(op.src.shifted(piece) if piece else op.src, instance)
    dst = slot(op.dst.shifted(piece) if piece else op.dst, instance)

    def key(phase: int) -> HalfKey:
        return HalfKey(op.step, phase, 0, -1, pos, piece, instance)

    if not op.is_transfer:
        kind = HalfKind.COPY if op.kind is OpKind.COPY else HalfKind.REDUCE
        out.append(Half(len(out), kind, op.src.rank, -1, src, dst, count, key(PHASE_LOCAL), op.id, instance))
        return
    a, b = op.src.rank, op.dst.rank
    out.append(Half(len(out), HalfKind.SEND, a, b, src, dst, count, key(PHASE_SEND), op.id, instance))
    kind = HalfKind.RECV if op.kind is OpKind.COPY else HalfKind.RECV_REDUCE
    out.append(Half(len(out), kind, b, a, src, dst, count, key(PHASE_RECV), op.id, instance))


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


def _slot_analysis(halves: list[Half], needed: set[int]
                   ) -> tuple[tuple[tuple[int, ...], ...], dict[int, int]]:
    """Per half, the earlier halves of its rank it conflicts with; and, for receive-reduce
    halves whose stored sum only one later half reads (and nobody needs at the end), that
    reader. `needed`: the codes of the slots the postcondition names."""
    writer: dict[int, int] = {}  # slot code -> last half that wrote it
    readers: dict[int, list[int]] = {}  # slot code -> halves that read it since
    preds: list[list[int]] = []
    # For each (receive-reduce writer, slot): who read the value it wrote, and whether a
    # later write made it dead.
    uses: dict[int, list[tuple[list[int], bool, bool]]] = {}
    recv_reduce = HalfKind.RECV_REDUCE
    kinds = [h.kind for h in halves]

    writer_of, readers_of = writer.get, readers.get  # bound once: this loop runs per slot access
    for h in halves:
        hid, kind, count = h.id, h.kind, h.count
        mine: list[int] = []
        preds.append(mine)
        # The slots it reads and writes (see Half.reads and Half.writes), as codes.
        src = _slot_code(h.rank, h.src)
        dst = _slot_code(h.rank, h.dst)
        if kind is HalfKind.SEND or kind is HalfKind.COPY:
            reads, writes = range(src, src + count), () if kind is HalfKind.SEND else range(dst, dst + count)
        elif kind is HalfKind.REDUCE:
            reads, writes = [*range(src, src + count), *range(dst, dst + count)], range(dst, dst + count)
        elif kind is recv_reduce:
            reads = writes = range(dst, dst + count)
        else:
            reads, writes = (), range(dst, dst + count)
        for where in reads:
            w = writer_of(where)
            if w is not None and w != hid and w not in mine:
                mine.append(w)
            seen = readers_of(where)
            if seen is None:
                readers[where] = [hid]
            else:
                seen.append(hid)
        for where in writes:
            w = writer_of(where)
            if w is not None and w != hid and w not in mine:
                mine.append(w)
            seen = readers_of(where)
            if seen:
                for r in seen:
                    if r != hid and r not in mine:
                        mine.append(r)
            if w is not None and kinds[w] is recv_reduce:
                uses.setdefault(w, []).append((seen or [], True, where in needed))
            writer[where] = hid
            readers[where] = []
    for where, w in writer.items():
        if kinds[w] is recv_reduce:
            uses.setdefault(w, []).append((readers_of(where) or [], False, where in needed))

    sole: dict[int, int] = {}
    for w, per_slot in uses.items():
        reader_sets = {tuple(r) for r, _, _ in per_slot}
        if len(per_slot) != halves[w].count or len(reader_sets) != 1:
            continue
        (only,) = reader_sets
        if len(only) == 1 and all(overwritten or not named for _, overwritten, named in per_slot):
            sole[w] = only[0]
    return tuple(map(tuple, preds)), sole
