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
    real_longest = threadblocks._longest

    def too_long_once(program):
        steps, where = real_longest(program)
        measured.append(program.nchannels)
        return (10 ** 6, where) if len(measured) == 1 else (steps, where)

    monkeypatch.setattr(threadblocks, "PlanCache", counting_cache)
    monkeypatch.setattr(threadblocks, "_longest", too_long_once)
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


class _Node:
    def __init__(self, payload):
        self.payload = payload
        self.me = self  # a cycle: only the collector frees it
