"""The slot analysis of the halves, on integer arrays: what each half must wait for on
its own rank, and which stored sums only one later half reads.

A half reads and writes ranges of chunk slots (`program.Half.reads` / `writes`). Every
access is one *event*; a half's reads come before its writes. Sorting the events by slot
(stably, so that each slot's events stay in half order) puts every slot's history in
one run, and then:

- a read or a write must follow the last write of its slot before it;
- a write must also follow every read of its slot since that last write.

The second rule pairs each read with the next write of its slot, so the number of
(half, predecessor) pairs is at most twice the number of events: linear in the size of
the schedule, with no per-slot Python objects. The result is exactly what walking the
halves in order with a dictionary of last writers and readers gives (predecessors in
the same order, each once).
"""

from __future__ import annotations

import numpy as np

# Kind codes of the halves (halves.py maps HalfKind to these).
SEND, RECV, RECV_REDUCE, COPY, REDUCE = 0, 1, 2, 3, 4

SLOT_SHIFT = 40  # a slot code is ((rank * 3 + buffer) << 40) | index


def slot_codes(rank: np.ndarray, buffer: np.ndarray, index: np.ndarray) -> np.ndarray:
    """Each slot as one integer: rank, buffer (0 input, 1 output, 2 scratch), index."""
    return ((rank.astype(np.int64) * 3 + buffer) << SLOT_SHIFT) | index


def _expand(half: np.ndarray, first: np.ndarray, count: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One event per slot of each range [first, first + count): (half, slot code, k-th slot)."""
    total = int(count.sum())
    halves = np.repeat(half, count)
    starts = np.repeat(np.cumsum(count) - count, count)
    k = np.arange(total, dtype=np.int64) - starts
    return halves, np.repeat(first, count) + k, k


def slot_analysis(kind: np.ndarray, rank: np.ndarray, src_buffer: np.ndarray, src_index: np.ndarray,
                  dst_buffer: np.ndarray, dst_index: np.ndarray, count: np.ndarray, needed: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray]]:
    """(half, predecessor) pairs: per half, the earlier halves of its rank it conflicts
    with, by half and then in the order the sequential walk finds them (per access, the
    slot's last writer, then for a write the slot's readers since), each once; and, for
    receive-reduce halves whose stored sum exactly one later half reads (and nobody
    needs at the end), that reader: (receive-reduce halves in order, their readers).
    `needed`: the codes of the slots the postcondition names."""
    n = len(kind)
    ids = np.arange(n, dtype=np.int64)
    count = count.astype(np.int64)
    src = slot_codes(rank, src_buffer, src_index)
    dst = slot_codes(rank, dst_buffer, dst_index)
    # Reads: sends, copies and reduces read their source; reduces and receive-reduces
    # read their destination (after the source, as Half.reads lists them). Writes: every
    # kind but a send writes its destination.
    reads_src = (kind == SEND) | (kind == COPY) | (kind == REDUCE)
    reads_dst = (kind == REDUCE) | (kind == RECV_REDUCE)
    writes = kind != SEND
    parts = []  # (half, slot, is write), in half order, each part's slots in order
    for mask, where, phase in ((reads_src, src, 0), (reads_dst, dst, 1), (writes, dst, 2)):
        h, slot_part, _ = _expand(ids[mask], where[mask], count[mask])
        parts.append((h, slot_part, np.full(len(h), phase == 2)))
    half = np.concatenate([p[0] for p in parts])
    slot = np.concatenate([p[1] for p in parts])
    is_write = np.concatenate([p[2] for p in parts])
    # Arrays of every event are dropped as soon as they are used up (`del`): at 1,024
    # GPUs each is 70 MB, and keeping them all made this the lowering's peak.
    del parts, src, dst, h, slot_part
    # Events in the order the sequential walk meets them (half, then its accesses in
    # order), then grouped by slot, keeping that order inside each slot. The parts are
    # each in half order and follow each other in access order, so a stable sort by half
    # alone gives the walk (and merges three sorted runs: linear).
    walk = np.argsort(half, kind="stable")
    half, slot, is_write = half[walk], slot[walk], is_write[walk]
    del walk
    by_slot = np.argsort(slot, kind="stable")
    e_half, e_slot, e_write = half[by_slot], slot[by_slot], is_write[by_slot]
    del half, slot, is_write
    m = len(e_half)
    pos = np.arange(m, dtype=np.int64)
    starts = np.ones(m, dtype=bool)
    starts[1:] = e_slot[1:] != e_slot[:-1]
    group_start = np.maximum.accumulate(np.where(starts, pos, 0))
    ends = np.ones(m, dtype=bool)
    ends[:-1] = starts[1:]
    group_end = np.minimum.accumulate(np.where(ends, pos, m)[::-1])[::-1]  # last event of the slot
    del starts, ends
    # The last write strictly before each event, in its slot (-1: none).
    last_write = np.maximum.accumulate(np.where(e_write, pos, -1))
    prev_write = np.empty(m, dtype=np.int64)
    prev_write[0] = -1
    prev_write[1:] = last_write[:-1]
    prev_write[prev_write < group_start] = -1
    del last_write, group_start
    # The first write strictly after each event, in its slot (m: none).
    next_write_at = np.minimum.accumulate(np.where(e_write, pos, m)[::-1])[::-1]
    next_write = np.empty(m, dtype=np.int64)
    next_write[-1] = m
    next_write[:-1] = next_write_at[1:]
    next_write[next_write > group_end] = m
    del next_write_at

    # Predecessor pairs, each with the walk's order: the event that found it (its place in
    # the walk), then 0 for the last writer, 1 + the reader's position for a reader.
    walk_place = by_slot  # event position in the walk, per slot-sorted event
    has_writer = prev_write >= 0
    a_half = e_half[has_writer]
    a_pred = e_half[prev_write[has_writer]]
    a_at = walk_place[has_writer]
    a_sub = np.zeros(len(a_half), dtype=np.int64)
    is_read_with_next = ~e_write & (next_write < m)
    w = next_write[is_read_with_next]
    b_half = e_half[w]
    b_pred = e_half[is_read_with_next]
    b_at = walk_place[w]
    b_sub = 1 + pos[is_read_with_next]
    p_half = np.concatenate([a_half, b_half])
    p_pred = np.concatenate([a_pred, b_pred])
    p_at = np.concatenate([a_at, b_at])
    p_sub = np.concatenate([a_sub, b_sub])
    del a_half, a_pred, a_at, a_sub, b_half, b_pred, b_at, b_sub, has_writer, is_read_with_next, w
    keep = p_pred != p_half
    p_half, p_pred, p_at, p_sub = p_half[keep], p_pred[keep], p_at[keep], p_sub[keep]
    order = np.argsort(p_at * (m + 1) + p_sub)  # p_at orders by half too: the walk is half-major
    p_half, p_pred = p_half[order], p_pred[order]
    # Each predecessor once per half, at its first place.
    _, first = np.unique(p_half * n + p_pred, return_index=True)
    first.sort()
    p_half, p_pred = p_half[first], p_pred[first]
    return p_half, p_pred, _sole_readers(kind, count, e_half, e_slot, e_write, pos, prev_write, next_write, group_end,
                                needed)




def _sole_readers(kind: np.ndarray, count: np.ndarray, e_half: np.ndarray, e_slot: np.ndarray,
                  e_write: np.ndarray, pos: np.ndarray, prev_write: np.ndarray, next_write: np.ndarray,
                  group_end: np.ndarray, needed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Receive-reduce halves, in order, and for each the one half that reads what it
    stored, where in every slot it wrote exactly that half reads the stored value, once,
    and the slot is overwritten later or not named by the postcondition."""
    writes_rr = e_write & (kind[e_half] == RECV_REDUCE)
    if not writes_rr.any():
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    at = pos[writes_rr]
    writer = e_half[writes_rr]
    # The value lives until the next write of the slot (or the end): every event in
    # between is a read of it.
    end = np.where(next_write[at] < len(pos), next_write[at], group_end[at] + 1)
    overwritten = next_write[at] < len(pos)
    readers = end - at - 1
    reader = np.where(readers >= 1, e_half[np.minimum(at + 1, len(pos) - 1)], -1)
    ok = (readers == 1) & (overwritten | ~np.isin(e_slot[at], needed))
    # Per writer: every slot ok, one entry per slot it wrote, one reader for all.
    order = np.argsort(writer, kind="stable")
    writer, ok, reader = writer[order], ok[order], reader[order]
    starts = np.flatnonzero(np.r_[True, writer[1:] != writer[:-1]])
    slots = np.diff(np.r_[starts, len(writer)])
    all_ok = np.logical_and.reduceat(ok, starts)
    same_reader = np.minimum.reduceat(reader, starts) == np.maximum.reduceat(reader, starts)
    heads = writer[starts]
    sole = all_ok & same_reader & (slots == count[heads])
    return heads[sole], reader[starts][sole]
