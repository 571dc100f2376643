"""Fusion (rcs, rrs, rrcs) and cross-threadblock dependencies (depid, deps, hasdep, nop)."""

from __future__ import annotations

from collections import Counter

import msccl_xml_schedules as ms
from xml_checks import check_structure

from collc.backends import BackendOptions
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.model import StepType
from collc.backends.msccl_xml.verify import verify_algo
from collc.ir import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.collective import broadcast

S, R, RCS, RRS, RRC, RRCS, CPY, NOP = (StepType.SEND, StepType.RECV, StepType.RECV_COPY_SEND,
                                       StepType.RECV_REDUCE_SEND, StepType.RECV_REDUCE_COPY,
                                       StepType.RECV_REDUCE_COPY_SEND, StepType.COPY, StepType.NOP)


def lower(schedule, **options):
    algo = lowered_algo(ms.unit(schedule), BackendOptions(**options))
    check_structure(algo)
    report = verify_algo(algo)
    assert report.ok, report.render()
    return algo


def types(tb):
    return [st.type for st in tb.steps]


def test_ring_allgather_in_place_is_send_then_forwards_then_receive():
    algo = lower(ms.ring_allgather(5), inplace=True)
    for g in algo.gpus:
        (tb,) = g.tbs
        assert (tb.send, tb.recv, tb.chan) == ((g.id + 1) % 5, (g.id - 1) % 5, 0)
        assert types(tb) == [S, RCS, RCS, RCS, R]
        # Chunks travel in ring order: own chunk, then the one from the left neighbour, ...
        assert [st.dstoff for st in tb.steps] == [(g.id - k) % 5 for k in range(5)]


def test_ring_allreduce_in_place_reduces_on_the_way_and_stores_once():
    algo = lower(ms.ring_allreduce(4), inplace=True)
    for g in algo.gpus:
        (tb,) = g.tbs
        # The partial sums are overwritten by the final values later, so they are not
        # stored (rrs); the owner stores the sum and sends it on (rrcs).
        assert types(tb) == [S, RRS, RRS, RRCS, RCS, RCS, R]
        assert all(st.depid == -1 for st in tb.steps)


def test_reducescatter_stores_only_what_the_postcondition_needs():
    algo = lower(ms.ring_reducescatter(4))
    for g in algo.gpus:
        recv_types = Counter(t for tb in g.tbs for t in types(tb) if t not in (S, CPY))
        assert recv_types == {RRS: 2, RRC: 1}  # two partials passed on, one sum kept


def test_pipelined_ring_fuses_every_forward():
    algo = lower(ms.ring_allgather(4, 3, pipelined=True), inplace=True)
    counts = {t: sum(types(tb).count(t) for g in algo.gpus for tb in g.tbs) for t in (S, RCS, R)}
    assert counts == {S: 12, RCS: 24, R: 12}


def echo_broadcast() -> Schedule:
    """Root 0 copies its chunk to scratch, sends it to ranks 1 and 2 from there, rank 1
    passes it to 3, and 3 sends it back into the root's scratch slot: that receive must
    wait for both of the root's sends (two other threadblocks), so it needs a nop."""
    i, o, s = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
    ops = (
        Op(0, OpKind.COPY, Loc(0, i, 0), Loc(0, o, 0), step=0),
        Op(1, OpKind.COPY, Loc(0, i, 0), Loc(0, s, 0), step=0),
        Op(2, OpKind.COPY, Loc(0, s, 0), Loc(1, o, 0), deps=(1,), step=1),
        Op(3, OpKind.COPY, Loc(0, s, 0), Loc(2, o, 0), deps=(1,), step=1),
        Op(4, OpKind.COPY, Loc(1, o, 0), Loc(3, o, 0), deps=(2,), step=2),
        Op(5, OpKind.COPY, Loc(3, o, 0), Loc(0, s, 0), deps=(4, 2, 3), step=3),
    )
    return Schedule("echo-broadcast", broadcast(4), "full4", ops, scratch=(1, 0, 0, 0))


def test_a_step_waiting_on_two_threadblocks_gets_a_nop_before_it():
    algo = lower(echo_broadcast())
    root = {(tb.send, tb.recv): tb for tb in algo.gpus[0].tbs}
    local, to1, to2, from3 = root[(-1, -1)], root[(1, -1)], root[(2, -1)], root[(-1, 3)]
    assert types(local) == [CPY, CPY]
    assert [(st.depid, st.deps) for st in to1.steps] == [(local.id, 1)]  # waits for the copy to scratch
    assert [(st.depid, st.deps) for st in to2.steps] == [(local.id, 1)]
    assert local.steps[1].hasdep and not local.steps[0].hasdep
    assert types(from3) == [NOP, R]
    assert sorted((st.depid, st.deps) for st in from3.steps) == sorted([(to1.id, 0), (to2.id, 0)])
    assert to1.steps[0].hasdep and to2.steps[0].hasdep
    assert [st.s for st in from3.steps] == [0, 1]
    # Rank 1 receives and forwards in one step.
    assert [types(tb) for tb in algo.gpus[1].tbs] == [[RCS]]


def test_implied_dependencies_are_dropped():
    """The receive on the root also must follow the copy to scratch, but both sends it
    waits for already waited for that copy."""
    algo = lower(echo_broadcast())
    waits = [(st.depid, st.deps) for tb in algo.gpus[0].tbs for st in tb.steps if st.depid >= 0]
    local = next(tb.id for tb in algo.gpus[0].tbs if (tb.send, tb.recv) == (-1, -1))
    assert waits.count((local, 1)) == 2 and len(waits) == 4


def test_lengths_measured_before_ordering_are_the_ordered_threadblocks():
    """msccl-threadblocks measures a placement by its threadblocks' lengths once
    ordered (nops included) without building the steps; they are the lengths of the
    steps msccl-deps then builds."""
    from collc.backends.msccl_xml.dependencies import order_steps, ordered_lengths
    from collc.backends.msccl_xml.fuse import fuse
    from collc.backends.msccl_xml.merge import merge_ops
    from collc.backends.msccl_xml.threadblocks import assign_threadblocks

    nops = 0
    for schedule in (echo_broadcast(), ms.ring_allreduce(6), ms.random_allgather(6, 3, seed=2),
                     ms.chain_reduce(5)):
        fused = fuse(assign_threadblocks(merge_ops(schedule)))
        lengths = ordered_lengths(fused)
        ordered = order_steps(fused)
        assert lengths == [len(tb.steps) for g in ordered.gpus for tb in g.tbs]
        nops += sum(st.type is NOP for g in ordered.gpus for tb in g.tbs for st in tb.steps)
    assert nops  # the echo broadcast's receive waits on two threadblocks


def test_lengths_within_a_limit_give_up_only_past_it():
    """A placement measured against max_steps: the same lengths where every
    threadblock keeps within it (and msccl-deps reuses that ordering), None as soon
    as one passes it, at any limit below the longest."""
    from collc.backends.msccl_xml.dependencies import order_steps, ordered_lengths, ordered_lengths_within
    from collc.backends.msccl_xml.fuse import fuse
    from collc.backends.msccl_xml.merge import merge_ops
    from collc.backends.msccl_xml.threadblocks import assign_threadblocks

    for schedule in (echo_broadcast(), ms.ring_allreduce(6), ms.random_allgather(6, 3, seed=2)):
        lengths = ordered_lengths(fuse(assign_threadblocks(merge_ops(schedule))))
        fused = fuse(assign_threadblocks(merge_ops(schedule)))
        assert ordered_lengths_within(fused, max(lengths)) == lengths
        assert [len(tb.steps) for g in order_steps(fused).gpus for tb in g.tbs] == lengths
        assert ordered_lengths_within(fuse(assign_threadblocks(merge_ops(schedule))), max(lengths) - 1) is None
        for limit in range(1, max(lengths) - 1):
            assert ordered_lengths_within(fuse(assign_threadblocks(merge_ops(schedule))), limit) is None


def test_lengths_within_a_limit_where_every_gpu_chains_its_waits(monkeypatch):
    """Where some GPU passes the executor's XML nodes even without nops, every
    placement chains its waits: chained GPU by GPU as the waits are decided, the lengths
    and the steps built are those of the waits chained at the end."""
    from collc.backends.msccl_xml import dependencies
    from collc.backends.msccl_xml.fuse import fuse
    from collc.backends.msccl_xml.merge import merge_ops
    from collc.backends.msccl_xml.threadblocks import assign_threadblocks

    monkeypatch.setattr(dependencies, "MAX_XML_NODES", 8)
    for schedule in (echo_broadcast(), ms.random_allgather(6, 3, seed=2), ms.chain_reduce(5)):
        whole = fuse(assign_threadblocks(merge_ops(schedule)))
        lengths = dependencies.ordered_lengths(whole)
        ordered = dependencies.order_steps(whole)
        fused = fuse(assign_threadblocks(merge_ops(schedule)))
        assert dependencies.ordered_lengths_within(fused, max(lengths)) == lengths
        assert [tb.steps for g in dependencies.order_steps(fused).gpus for tb in g.tbs] == \
            [tb.steps for g in ordered.gpus for tb in g.tbs]
        for limit in range(1, max(lengths)):
            assert dependencies.ordered_lengths_within(fuse(assign_threadblocks(merge_ops(schedule))), limit) is None
