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

from collections.abc import Sequence
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
_XML_BUFFER_BY_ID = {id(b): x for b, x in _XML_BUFFER.items()}  # hashing an Enum runs Python code


class _SlotMap:
    """Physical slot of (rank, buffer, index) in instance j."""

    def __init__(self, schedule: Schedule, instances: int):
        self.instances = instances
        self.scratch = [schedule.scratch_slots(r) for r in range(schedule.collective.ranks)]

    def single(self, loc: Loc) -> Slot:
        """The slot of `loc` with one instance: its own index."""
        return Slot(_XML_BUFFER_BY_ID[id(loc[1])], loc[2])

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
    cols = _Columns()
    if instances == 1:
        cols.add_ops(ops, slot)
    else:
        for pos, op in enumerate(ops):
            for piece in range(op.count):  # sub-slots of one instance are not consecutive
                for j in range(instances):
                    cols.add(op, pos, piece, 1, j, slot)
    preds, sole_readers = _slot_analysis(cols, _required_slots(schedule.collective, inplace, slot))
    # Kinds, slots and counts do not change below, so neither do the candidates.
    candidates = tuple(_candidates(cols, preds))
    halves = cols.halves(_forward_order(cols, candidates))
    return Halves(halves, preds, sole_readers, buffer_sizes(schedule, inplace, instances), candidates,
                  key_places(halves))


class _Columns:
    """The halves of a schedule as one list per field, filled op by op; `halves` makes
    the Half objects once every key is known (see `_forward_order`)."""

    def __init__(self) -> None:
        self.kind: list[HalfKind] = []
        self.rank: list[int] = []
        self.peer: list[int] = []
        self.src: list[Slot] = []
        self.dst: list[Slot] = []
        self.count: list[int] = []
        self.step: list[int] = []
        self.position: list[int] = []
        self.piece: list[int] = []
        self.instance: list[int] = []
        self.op: list[int] = []

    def add(self, op: Op, pos: int, piece: int, count: int, instance: int, slot: _SlotMap) -> None:
        """The halves of one piece of `op` in one instance: a local half, or a send
        followed by its receive (the next id: `_forward_order` relies on it)."""
        src = slot(op.src.shifted(piece) if piece else op.src, instance)
        dst = slot(op.dst.shifted(piece) if piece else op.dst, instance)
        a, b = op.src.rank, op.dst.rank
        is_copy = op.kind is OpKind.COPY
        if a == b:
            self._append(HalfKind.COPY if is_copy else HalfKind.REDUCE, a, -1, src, dst, count,
                         op.step, pos, piece, instance, op.id)
            return
        self._append(HalfKind.SEND, a, b, src, dst, count, op.step, pos, piece, instance, op.id)
        self._append(HalfKind.RECV if is_copy else HalfKind.RECV_REDUCE, b, a, src, dst, count,
                     op.step, pos, piece, instance, op.id)

    def _append(self, kind: HalfKind, rank: int, peer: int, src: Slot, dst: Slot, count: int, step: int,
                pos: int, piece: int, instance: int, op: int) -> None:
        self.kind.append(kind)
        self.rank.append(rank)
        self.peer.append(peer)
        self.src.append(src)
        self.dst.append(dst)
        self.count.append(count)
        self.step.append(step)
        self.position.append(pos)
        self.piece.append(piece)
        self.instance.append(instance)
        self.op.append(op)

    def add_ops(self, ops: Sequence[Op], slot: _SlotMap) -> None:
        """`add` for every op of one instance, whole (the common case, a loop of its own:
        it runs once per op)."""
        send, copy, reduce = HalfKind.SEND, HalfKind.COPY, HalfKind.REDUCE
        recv, recv_reduce, op_copy = HalfKind.RECV, HalfKind.RECV_REDUCE, OpKind.COPY
        to_slot = slot.single
        kind, rank, peer, srcs, dsts = self.kind, self.rank, self.peer, self.src, self.dst
        count, step, position, piece, instance, ids = (self.count, self.step, self.position, self.piece,
                                                       self.instance, self.op)
        for pos, op in enumerate(ops):
            s, d = op.src, op.dst
            src, dst = to_slot(s), to_slot(d)
            a, b = s[0], d[0]
            is_copy = op.kind is op_copy
            if a == b:
                kind.append(copy if is_copy else reduce)
                rank.append(a)
                peer.append(-1)
                n = 1
            else:
                kind += (send, recv if is_copy else recv_reduce)
                rank += (a, b)
                peer += (b, a)
                n = 2
            srcs += (src,) * n
            dsts += (dst,) * n
            count += (op.count,) * n
            step += (op.step,) * n
            position += (pos,) * n
            piece += (0,) * n
            instance += (0,) * n
            ids += (op.id,) * n

    def halves(self, order: dict[int, tuple[int, int]]) -> tuple[Half, ...]:
        """The Half objects; `order`: (fresh, origin) of every send half (`HalfKey`)."""
        out = []
        new, local, send = _new_half, (0, -1), HalfKind.SEND
        phase_of = {HalfKind.SEND: PHASE_SEND, HalfKind.RECV: PHASE_RECV, HalfKind.RECV_REDUCE: PHASE_RECV,
                    HalfKind.COPY: PHASE_LOCAL, HalfKind.REDUCE: PHASE_LOCAL}
        for h, (kind, rank, peer, src, dst, count, step, pos, piece, inst, op) in enumerate(zip(
                self.kind, self.rank, self.peer, self.src, self.dst, self.count, self.step, self.position,
                self.piece, self.instance, self.op)):
            # A receive is the half after its send.
            fresh, origin = local if peer < 0 else order[h if kind is send else h - 1]
            half = new(Half)
            _SET_HALF[0](half, h), _SET_HALF[1](half, kind), _SET_HALF[2](half, rank), _SET_HALF[3](half, peer)
            _SET_HALF[4](half, src), _SET_HALF[5](half, dst), _SET_HALF[6](half, count)
            _SET_HALF[7](half, HalfKey(step, phase_of[kind], fresh, origin, pos, piece, inst))
            _SET_HALF[8](half, op), _SET_HALF[9](half, inst), _SET_HALF[10](half, 0)
            out.append(half)
        return tuple(out)


# Half(...) field by field without the frozen dataclass's __init__ (which sets each
# through object.__setattr__): it runs once per half.
_new_half = object.__new__
_SET_HALF = tuple(Half.__dict__[name].__set__ for name in Half.__slots__)
assert Half.__slots__ == ("id", "kind", "rank", "peer", "src", "dst", "count", "key", "op", "instance", "channel")


def _candidates(cols: _Columns, preds: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
    """`channels.fusion_candidates` on the columns: (receive, send) pairs where the send
    forwards exactly what the receive stored."""
    out = []
    kind, src, dst, count = cols.kind, cols.src, cols.dst, cols.count
    send, receives = HalfKind.SEND, (HalfKind.RECV, HalfKind.RECV_REDUCE)
    for b, k in enumerate(kind):
        if k is not send:
            continue
        for a in preds[b]:
            ka = kind[a]
            if (ka is receives[0] or ka is receives[1]) and dst[a] == src[b] and count[a] == count[b]:
                out.append((a, b))
    return out


def _forward_order(cols: _Columns, candidates: tuple[tuple[int, int], ...]) -> dict[int, tuple[int, int]]:
    """(fresh, origin) of every send half: its transfer's place among the messages of its
    step is forwards first, in the order of what they forward (see `HalfKey`)."""
    forwarded = {b: a for a, b in candidates}  # send -> receive it forwards
    by_step: dict[int, list[int]] = {}
    send = HalfKind.SEND
    step = cols.step
    for h, k in enumerate(cols.kind):
        if k is send:
            by_step.setdefault(step[h], []).append(h)
    position, piece, instance = cols.position, cols.piece, cols.instance
    order: dict[int, tuple[int, int]] = {}  # send half -> (fresh, origin)
    rank: dict[int, int] = {}  # send half -> rank of its message among all messages
    fresh = (1, -1)
    for s in sorted(by_step):
        sends = by_step[s]
        # What a forward forwards arrived at an earlier step, so its rank is known. The
        # receive a is the half after its send.
        for h in sends:
            a = forwarded.get(h)
            order[h] = fresh if a is None else (0, rank[a - 1])
        for h in sorted(sends, key=lambda h: (order[h], position[h], piece[h], instance[h])):
            rank[h] = len(rank)
    return order


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


def _slot_analysis(cols: _Columns, needed: set[int]
                   ) -> tuple[tuple[tuple[int, ...], ...], dict[int, int]]:
    """Per half, the earlier halves of its rank it conflicts with; and, for receive-reduce
    halves whose stored sum only one later half reads (and nobody needs at the end), that
    reader. `needed`: the codes of the slots the postcondition names."""
    writer: dict[int, int] = {}  # slot code -> last half that wrote it
    readers: dict[int, list[int]] = {}  # slot code -> halves that read it since
    preds: list[tuple[int, ...]] = []
    # For each (receive-reduce writer, slot): who read the value it wrote, and whether a
    # later write made it dead.
    uses: dict[int, list[tuple[list[int], bool, bool]]] = {}
    send, copy, reduce, recv_reduce = HalfKind.SEND, HalfKind.COPY, HalfKind.REDUCE, HalfKind.RECV_REDUCE
    kinds = cols.kind
    buffer_code = {id(BufferName.INPUT): 0, id(BufferName.OUTPUT): 1, id(BufferName.SCRATCH): 2}
    no_preds: tuple[int, ...] = ()

    writer_of, readers_of = writer.get, readers.get  # bound once: this loop runs per slot access
    for hid, (kind, rank, src, dst, count) in enumerate(zip(kinds, cols.rank, cols.src, cols.dst, cols.count)):
        mine: list[int] = []
        # The slots it reads and writes (see Half.reads and Half.writes), as codes
        # (`_slot_code`, inlined: it runs per half).
        if kind is send or kind is copy or kind is reduce:
            first = ((rank * 3 + buffer_code[id(src[0])]) << 40) | src[1]
            reads = range(first, first + count)
        if kind is not send:
            first = ((rank * 3 + buffer_code[id(dst[0])]) << 40) | dst[1]
            writes = range(first, first + count)
            if kind is reduce:
                reads = [*reads, *writes]
            elif kind is recv_reduce:
                reads = writes
            elif kind is not copy:  # a plain receive reads nothing
                reads = ()
        else:
            writes = ()
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
        preds.append(tuple(mine) if mine else no_preds)
    for where, w in writer.items():
        if kinds[w] is recv_reduce:
            uses.setdefault(w, []).append((readers_of(where) or [], False, where in needed))

    sole: dict[int, int] = {}
    for w, per_slot in uses.items():
        reader_sets = {tuple(r) for r, _, _ in per_slot}
        if len(per_slot) != cols.count[w] or len(reader_sets) != 1:
            continue
        (only,) = reader_sets
        if len(only) == 1 and all(overwritten or not named for _, overwritten, named in per_slot):
            sole[w] = only[0]
    return tuple(preds), sole
