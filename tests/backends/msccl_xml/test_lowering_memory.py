"""What keeps the lowering of a million-op schedule small gives the same program.

Predecessors, fusion candidates, sole readers and key places stay arrays (`PerHalf`,
`IntPairs`); `msccl-fuse` builds the fused steps from arrays; `msccl-deps` keeps each
step's needs as arrays; the planning's arrays are freed while a plan is measured and
built again if another channel count must be tried; the programs of past stages are
freed once the pipeline has moved on. Each test checks one of these against the plain
rule or object it replaces.
"""

from __future__ import annotations

import bisect
import gc
import weakref

import msccl_xml_schedules as ms
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collc.backends.msccl_xml import threadblocks
from collc.backends.msccl_xml.dependencies import order_steps
from collc.backends.msccl_xml.fuse import fuse
from collc.backends.msccl_xml.merge import merge_ops
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.program import HALF_KINDS, HalfKind, IntPairs, LThreadblock, PerHalf, make_step
from collc.backends.msccl_xml.threadblocks import assign_threadblocks
from collc.ir.heap import few_collections

SCHEDULES = {
    "ring allgather": lambda: ms.ring_allgather(6, chunks=2, pipelined=True),
    "ring allreduce": lambda: ms.ring_allreduce(6),
    "ring reducescatter": lambda: ms.ring_reducescatter(5),
    "direct alltoall": lambda: ms.direct_alltoall(5),
    "chain broadcast": lambda: ms.chain_broadcast(5, chunks=3, split=True),
    "chain reduce": lambda: ms.chain_reduce(5),
    "random allgather": lambda: ms.random_allgather(6, 3, seed=7),
}


@given(st.lists(st.lists(st.integers(0, 10 ** 6), max_size=4), max_size=30))
@settings(max_examples=60, deadline=None)
def test_per_half_reads_as_the_tuples(rows):
    owner = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r) for r in rows])
    values = np.array([v for r in rows for v in r], dtype=np.int64)
    table = PerHalf(owner, values, len(rows))
    plain = tuple(tuple(r) for r in rows)
    assert len(table) == len(plain)
    assert tuple(table) == plain and table == plain and table == list(plain)
    assert [table[i] for i in range(len(rows))] == list(plain)
    assert table[1:4] == plain[1:4]
    if rows:
        assert table[-1] == plain[-1]
        assert table != plain[:-1]
    with pytest.raises(IndexError):
        table[len(rows)]


@given(st.lists(st.tuples(st.integers(0, 10 ** 9), st.integers(0, 10 ** 9)), max_size=30))
@settings(max_examples=60, deadline=None)
def test_int_pairs_read_as_the_tuples(pairs):
    table = IntPairs(np.array([a for a, _ in pairs], dtype=np.int64), np.array([b for _, b in pairs], dtype=np.int64))
    assert len(table) == len(pairs) and list(table) == pairs and table == pairs
    assert [table[k] for k in range(len(pairs))] == pairs
    assert table[::2] == tuple(pairs[::2])
    assert dict(table) == dict(pairs)


def _plain_fuse_tb(tb, program, pairs, sole, send_places):
    """The per-threadblock rule the arrays replace: choose greedily, then walk the steps."""
    kinds = program.halves.kind
    partner, fused_sends = {}, set()
    for at, bt, a, b in pairs:
        if a in partner or b in fused_sends:
            continue
        lo = bisect.bisect_right(send_places, at)
        if send_places[lo] != bt:
            continue
        partner[a] = b
        fused_sends.add(b)
        send_places[lo] = at
    if not partner:
        return tb
    steps = []
    for step in tb.steps:
        h = step.halves[0]
        b = partner.get(h)
        if b is not None:
            if kinds[h] == HALF_KINDS.index(HalfKind.RECV):
                kind = StepType.RECV_COPY_SEND
            elif sole.get(h) == b:
                kind = StepType.RECV_REDUCE_SEND
            else:
                kind = StepType.RECV_REDUCE_COPY_SEND
            steps.append(make_step(kind, (h, b)))
        elif h not in fused_sends:
            steps.append(step)
    return LThreadblock(tb.id, tb.send, tb.recv, tb.chan, tuple(steps))


def _plain_fused(program):
    """Every threadblock of an assigned program fused by the plain rule."""
    from collc.backends.msccl_xml.fuse import _waits_before_receive

    place = program.places_array()
    tbs = [tb for g in program.gpus for tb in g.tbs]
    owner = {step.halves[0]: k for k, tb in enumerate(tbs) for step in tb.steps}
    ca, cb = program.candidate_pairs(program.candidates)
    ok = _waits_before_receive(program, ca, cb, place)
    per_tb = {}
    for a, b, fine in zip(ca.tolist(), cb.tolist(), ok.tolist()):
        if fine and a in owner and owner.get(b) == owner[a]:
            per_tb.setdefault(owner[a], []).append((int(place[a]), int(place[b]), a, b))
    sole = dict(program.sole_readers)
    out = []
    for k, tb in enumerate(tbs):
        sends = sorted(int(place[s.halves[0]]) for s in tb.steps
                       if program.halves.kind[s.halves[0]] == HALF_KINDS.index(HalfKind.SEND))
        out.append(_plain_fuse_tb(tb, program, sorted(per_tb.get(k, [])), sole, sends))
    return out


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("instances", [1, 2])
def test_fused_steps_are_the_plain_rules(name, instances):
    program = assign_threadblocks(merge_ops(SCHEDULES[name]()), instances=instances)
    fused = fuse(program)
    got = [tb for g in fused.gpus for tb in g.tbs]
    plain = _plain_fused(program)
    assert got == plain
    assert any(len(s.halves) == 2 for tb in got for s in tb.steps) or name == "direct alltoall"
    # A threadblock where nothing fused is the very object it was, as before.
    before = [tb for g in program.gpus for tb in g.tbs]
    assert [b is a for a, b in zip(before, got)] == [p is a for a, p in zip(before, plain)]


def test_a_plan_refused_after_measuring_rebuilds_its_planning(monkeypatch):
    """The arrays of the planning are dropped while a plan is measured; when the fused
    and numbered threadblocks turn out too long, the next channel count is planned from
    scratch, and gives what planning that count directly gives."""
    schedule = merge_ops(ms.ring_allgather(8, chunks=4, pipelined=True))
    built = []
    real_cache = threadblocks.PlanCache

    def counting_cache(*args, **kwargs):
        built.append(args)
        return real_cache(*args, **kwargs)

    measured = []
    real_longest = threadblocks._longest_within

    def too_long_once(program, max_steps):
        steps, where = real_longest(program, max_steps)
        measured.append(program.nchannels)
        return (10 ** 6, where) if len(measured) == 1 else (steps, where)

    monkeypatch.setattr(threadblocks, "PlanCache", counting_cache)
    monkeypatch.setattr(threadblocks, "_longest_within", too_long_once)
    program = assign_threadblocks(schedule)
    assert len(built) == 2 and measured == [1, 2]
    monkeypatch.undo()
    direct = assign_threadblocks(schedule, channels=2)
    assert [g.tbs for g in program.gpus] == [g.tbs for g in direct.gpus]


def test_past_programs_are_freed_and_the_measured_ones_reused():
    program = assign_threadblocks(merge_ops(ms.ring_allreduce(6)))
    fused = fuse(program)
    assert fuse(program) is fused  # what msccl-threadblocks measured, reused by msccl-fuse
    ordered = order_steps(fused)
    assert order_steps(fused) is ordered
    kept = weakref.ref(fused)
    del program, fused
    gc.collect()
    # Nothing keeps the fused program once neither the assigned one nor a unit does...
    assert kept() is None
    # ...and the ordered one lives while someone holds it.
    assert ordered.stage.value == "ordered"


def test_leaving_few_collections_sets_off_no_collection_and_frees_cycles():
    collected = []
    gc.callbacks.append(lambda phase, info: collected.append(info["generation"]) if phase == "start" else None)
    try:
        with few_collections():
            kept = [[i] for i in range(300_000)]  # far past the young generation's threshold
            cycle = [None]
            cycle[0] = cycle
            ref = weakref.ref(_Node(cycle))
        assert gc.get_count()[0] < 1000
        extra = [[i] for i in range(10)]
        assert collected == []  # the block's survivors went to the oldest generation unscanned
        gc.collect()
        assert ref() is None  # cyclic garbage made in the block is still collected
    finally:
        gc.callbacks.pop()
    assert len(kept) == 300_000 and len(extra) == 10


def test_objects_frozen_by_the_program_stay_frozen():
    frozen = [[i] for i in range(10)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with few_collections():
            made = [[i] for i in range(10)]
        assert gc.get_freeze_count() == before  # not handed back to the collector
    finally:
        gc.unfreeze()
    assert len(frozen) == len(made) == 10


class _Node:
    def __init__(self, payload):
        self.payload = payload
        self.me = self  # a cycle: only the collector frees it


def _plain_merged(schedule, max_count):
    """msccl-merge's renaming op by op, as it was written before it moved to arrays: the
    runs (same grouping as `_runs`), then per run its deps sorted and each once, renamed
    to the ids of the run that now does each one's work, each id once."""
    from collc.backends.msccl_xml.merge import _columns, _runs
    from collc.ir.schedule import Op

    ops = schedule.ops
    cols = _columns(schedule)
    order, run_start = _runs(cols, max_count)
    starts = np.flatnonzero(run_start).tolist()
    bounds = starts + [len(order)]
    order = order.tolist()
    next_id = 1 + max(op.id for op in ops)
    replacement, run_ids, extra = {}, {}, 0
    for r, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        total = sum(ops[k].count for k in order[lo:hi])
        pieces = -(-total // max_count)
        if hi - lo > 1 or pieces > 1:
            run_ids[r] = (ops[order[lo]].id, *range(next_id + extra, next_id + extra + pieces - 1))
            for k in order[lo:hi]:
                replacement[ops[k].id] = run_ids[r]
        extra += pieces - 1
    if not run_ids:
        return ops  # nothing merged or split: the schedule as it is
    placed = []
    for r, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
        first = ops[order[lo]]
        old = sorted({d for k in order[lo:hi] for d in ops[k].deps})
        deps = tuple(dict.fromkeys(x for d in old for x in replacement.get(d, (d,))))
        ids = run_ids.get(r)
        pos = min(order[lo:hi])
        if ids is None and deps == first.deps:
            placed.append(((first.step, pos, 0), first))
            continue
        ids = ids or (first.id,)
        total = sum(ops[k].count for k in order[lo:hi])
        for piece, offset in enumerate(range(0, total, max_count)):
            placed.append(((first.step, pos, piece), Op(
                ids[piece], first.kind, first.src.shifted(offset) if offset else first.src,
                first.dst.shifted(offset) if offset else first.dst, count=min(max_count, total - offset),
                deps=deps, step=first.step, route=first.route, origin=first.origin)))
    return tuple(op for _, op in sorted(placed, key=lambda p: p[0]))


@pytest.mark.parametrize("name", sorted(SCHEDULES))
@pytest.mark.parametrize("max_count", [1, 2, 71])
def test_merged_ops_are_the_plain_renaming(name, max_count):
    schedule = SCHEDULES[name]()
    merged = merge_ops(schedule, max_count=max_count)
    assert merged.ops == _plain_merged(schedule, max_count)


@given(st.integers(2, 7), st.integers(1, 4), st.integers(0, 10 ** 6), st.integers(1, 5))
@settings(max_examples=40, deadline=None)
def test_merged_random_schedules_are_the_plain_renaming(ranks, chunks, seed, max_count):
    schedule = ms.random_allgather(ranks, chunks, seed=seed)
    assert merge_ops(schedule, max_count=max_count).ops == _plain_merged(schedule, max_count)
