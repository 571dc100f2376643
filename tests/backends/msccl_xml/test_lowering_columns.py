"""The lowering's column (numpy) stages decide exactly as the plain rules they replace.

`slots.slot_analysis` (what each half waits for on its rank, and which stored sums one
half alone reads), the chains of `channels.PlanCache` (connected components of the
fusion candidates) and the runs of `msccl-merge` are computed on integer arrays; each
test writes the rule out plainly, walking the halves or ops one by one, and compares.
"""

from __future__ import annotations

from collections import Counter

import msccl_xml_schedules as ms
import networkx as nx
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collc.backends.msccl_xml.channels import PlanCache, half_arrays
from collc.backends.msccl_xml.halves import _required_slots, _SlotMap, split_schedule
from collc.backends.msccl_xml.merge import merge_ops
from collc.backends.msccl_xml.model import BufferName
from collc.backends.msccl_xml.program import HalfKind, Slot
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.verify import verify


def _plain_slot_analysis(halves, needed_slots):
    """The walk the arrays replace: per half, its reads then its writes, against the
    last writer and the readers since of every (rank, slot)."""
    writer, readers, preds, uses = {}, {}, [], {}
    for h in halves:
        mine = []
        for slot in h.reads():
            where = (h.rank, slot)
            w = writer.get(where)
            if w is not None and w != h.id and w not in mine:
                mine.append(w)
            readers.setdefault(where, []).append(h.id)
        for slot in h.writes():
            where = (h.rank, slot)
            w = writer.get(where)
            if w is not None and w != h.id and w not in mine:
                mine.append(w)
            seen = readers.get(where, [])
            mine += [r for r in dict.fromkeys(seen) if r != h.id and r not in mine]
            if w is not None and halves[w].kind is HalfKind.RECV_REDUCE:
                uses.setdefault(w, []).append((tuple(seen), True, where in needed_slots))
            writer[where] = h.id
            readers[where] = []
        preds.append(tuple(mine))
    for where, w in writer.items():
        if halves[w].kind is HalfKind.RECV_REDUCE:
            uses.setdefault(w, []).append((tuple(readers.get(where, [])), False, where in needed_slots))
    sole = {}
    for w, per_slot in uses.items():
        reader_sets = {r for r, _, _ in per_slot}
        if len(per_slot) == halves[w].count and len(reader_sets) == 1:
            (only,) = reader_sets
            if len(only) == 1 and all(overwritten or not named for _, overwritten, named in per_slot):
                sole[w] = only[0]
    return tuple(preds), sole


def _needed(schedule: Schedule, inplace: bool, instances: int) -> set:
    """(rank, Slot) of every slot the postcondition names, as the halves see them."""
    codes = _required_slots(schedule.collective, inplace, _SlotMap(schedule, instances))
    names = (BufferName.INPUT, BufferName.OUTPUT, BufferName.SCRATCH)
    return {((code >> 40) // 3, Slot(names[(code >> 40) % 3], code & ((1 << 40) - 1))) for code in codes}


SCHEDULES = {
    "ring allreduce": lambda: ms.ring_allreduce(5),
    "ring reducescatter": lambda: ms.ring_reducescatter(6),
    "chain reduce": lambda: ms.chain_reduce(5, root=2),
    "pipelined ring allgather": lambda: ms.ring_allgather(4, 3, pipelined=True),
    "random allgather": lambda: ms.random_allgather(6, 2, seed=5),
    "direct alltoall": lambda: ms.direct_alltoall(4),
}


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("instances", [1, 2, 3])
@pytest.mark.parametrize("inplace", [False, True])
def test_slot_analysis_matches_the_walk(name, instances, inplace):
    schedule = SCHEDULES[name]()
    try:
        split = split_schedule(schedule, inplace=inplace, instances=instances)
    except Exception as err:  # a schedule that cannot run in place is refused, as before
        assert inplace and "cannot run in place" in str(err)
        return
    preds, sole = _plain_slot_analysis(split.halves, _needed(schedule, inplace, instances))
    assert split.preds == preds
    assert dict(split.sole_readers) == sole
    if name in ("ring allreduce", "ring reducescatter", "chain reduce"):
        assert sole, "a reduction schedule whose every partial sum is forwarded has sole readers"


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_halves_keep_their_op_order_and_candidates_forward_what_arrived(name):
    schedule = SCHEDULES[name]()
    split = split_schedule(schedule, instances=2)
    arrays = half_arrays(split.halves)
    for field in ("kind", "rank", "peer", "position", "piece", "instance"):
        assert (getattr(arrays, field) == getattr(split.arrays, field)).all(), field
    for h in split.halves:
        if h.kind is HalfKind.SEND:  # a transfer: the receive follows its send
            r = split.halves[h.id + 1]
            assert r.kind.receives and (r.rank, r.peer, r.key.message) == (h.peer, h.rank, h.key.message)
    for a, b in split.candidates:
        ra, sb = split.halves[a], split.halves[b]
        assert ra.kind.receives and sb.kind is HalfKind.SEND and a in split.preds[b]
        assert (ra.rank, ra.dst, ra.count) == (sb.rank, sb.src, sb.count)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_chains_are_the_components_of_the_candidate_links(name):
    split = split_schedule(SCHEDULES[name]())
    cache = PlanCache(split.halves, split.candidates, split.places, split.arrays)
    graph = nx.Graph()
    transfer = {}  # send half -> its transfer: (position, piece), numbered in half order
    number = {}
    for h in split.halves:
        if h.kind is HalfKind.SEND and h.instance == 0:
            transfer[h.id] = (h.key.position, h.key.piece)
            number[transfer[h.id]] = len(number)
            graph.add_node(transfer[h.id])
    for a, b in split.candidates:
        graph.add_edge(transfer[a - 1], transfer[b])
    place = {transfer[h]: split.places[h] for h in transfer}
    want = sorted((sorted(c, key=place.__getitem__) for c in nx.connected_components(graph)),
                  key=lambda c: place[c[0]])
    assert cache.chains == [[number[t] for t in c] for c in want]
    # Each chain's connections, in order of first use, with their message counts.
    conn_of = {number[transfer[h]]: (split.halves[h].rank, split.halves[h].peer) for h in transfer}
    for chain, uses in zip(cache.chains, cache.chain_uses):
        counted = Counter(conn_of[t] for t in chain)
        assert [(conn, n) for conn, _, n in uses.items] == list(counted.items())
        assert all(cache.conn_number[conn] == i for conn, i, _ in uses.items)
        assert all(cache.conn[t] == cache.conn_number[conn_of[t]] for t in chain)


def _plain_runs(ops, max_count):
    """msccl-merge's runs as a plain walk: same-step ops grouped by kind, buffers,
    ranks and route, sorted by source index, cut where slots stop being contiguous or
    the run would exceed max_count chunks."""
    groups = {}
    for op in ops:
        groups.setdefault((op.step, op.kind, op.src.rank, op.src.buffer, op.dst.rank, op.dst.buffer, op.route),
                          []).append(op)
    runs = []
    for members in groups.values():
        members = sorted(members, key=lambda o: o.src.index)
        run = [members[0]]
        for prev, op in zip(members, members[1:]):
            if (prev.src.index + prev.count == op.src.index and prev.dst.index + prev.count == op.dst.index
                    and sum(o.count for o in run) + op.count <= max_count):
                run.append(op)
            else:
                runs.append(run)
                run = [op]
        runs.append(run)
    out = []
    for run in runs:
        total = sum(o.count for o in run)
        first = run[0]
        for offset in range(0, total, max_count):
            out.append((first.step, first.kind, first.src.shifted(offset), first.dst.shifted(offset),
                        min(max_count, total - offset)))
    return Counter(out)


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 10**6), chunks=st.integers(1, 4), max_count=st.integers(1, 5),
       pipelined=st.booleans())
def test_merge_runs_match_the_plain_walk(seed, chunks, max_count, pipelined):
    schedules = [ms.random_allgather(5, chunks, seed=seed), ms.ring_allgather(4, chunks, pipelined=pipelined)]
    for sched in schedules:
        merged = merge_ops(sched, max_count)
        got = Counter((op.step, op.kind, op.src, op.dst, op.count) for op in merged.ops)
        assert got == _plain_runs(sched.ops, max_count)
        verify(merged)
        if merged is not sched:  # rebuilt ops are placed by step
            assert [op.step for op in merged.ops] == sorted(op.step for op in merged.ops)


def test_merge_cuts_a_long_contiguous_run_greedily():
    # One step, rank 0 sends 7 consecutive chunks of sizes 2, 3, 1, 4, 1, 1, 2 to rank 1.
    from collc.ir.collective import allgather
    sizes = [2, 3, 1, 4, 1, 1, 2]
    ops, at = [], 0
    coll = allgather(2, sum(sizes))
    for k, n in enumerate(sizes):
        ops.append(Op(k, OpKind.COPY, Loc(0, Buffer.INPUT, at), Loc(1, Buffer.OUTPUT, at), count=n, step=0))
        at += n
    sched = Schedule("cut", coll, "t", tuple(ops))
    merged = merge_ops(sched, 5)
    # Greedy: 2+3 | 1+4 | 1+1+2.
    assert [(op.src.index, op.count) for op in merged.ops] == [(0, 5), (5, 5), (10, 4)]
    assert [op.id for op in merged.ops] == [0, 2, 4]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_half_table_rows_are_the_halves_its_columns_describe(name):
    split = split_schedule(SCHEDULES[name](), instances=2)
    table = split.halves
    rows = list(table)
    assert len(rows) == len(table) and [h.id for h in rows] == list(range(len(table)))
    assert rows[5] == table[5] and rows[-1] == table[-1] and table[1:4] == rows[1:4]
    with pytest.raises(IndexError):
        table[len(table)]
    for h in rows:
        assert h.src.index == table.src_index[h.id] and h.dst.index == table.dst_index[h.id]
        assert h.key.step == table.step[h.id] and h.count == table.count[h.id] and h.op == table.op[h.id]
        # A send precedes its receive in time: the phases of the key say so.
        if h.kind is HalfKind.SEND:
            assert table[h.id + 1].key > h.key


class _Preds:
    """What `_waits_before_receive` reads of a program: its predecessor pairs."""

    def __init__(self, preds: list[list[int]]):
        self.preds = preds

    def predecessor_pairs(self):
        half = np.array([h for h, ps in enumerate(self.preds) for _ in ps], dtype=np.int64)
        pred = np.array([p for ps in self.preds for p in ps], dtype=np.int64)
        return half, pred


@pytest.mark.parametrize("seed", range(6))
def test_fusion_predecessor_test_matches_the_plain_rule(seed):
    from collc.backends.msccl_xml.fuse import _waits_before_receive
    rng = np.random.default_rng(seed)
    n = 60
    preds = [sorted(set(rng.integers(0, n, rng.integers(0, 4)).tolist()) - {h}) for h in range(n)]
    # Candidates (receive a, send b) with a among b's predecessors; some sends in two.
    candidates = [(a, b) for b in range(n) for a in preds[b][:2] if rng.random() < 0.7]
    ca = np.array([a for a, _ in candidates], dtype=np.int64)
    cb = np.array([b for _, b in candidates], dtype=np.int64)
    place = rng.permutation(n)
    got = _waits_before_receive(_Preds(preds), ca, cb, place).tolist()
    want = [all(p == a or place[p] < place[a] for p in preds[b]) for a, b in candidates]
    assert got == want
    assert True in want and False in want
    assert len(set(cb.tolist())) < len(cb)  # the several-candidates branch ran
