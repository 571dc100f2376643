"""msccl-coalesce: a connection's nearby transfers of consecutive slots joined into one
op, scratch slots renumbered to make them consecutive, only where a GPU would pass the
executor's XML nodes (or when forced)."""

from __future__ import annotations

from collections import Counter

import pytest

import msccl_xml_schedules as ms
from collc import frontend
from collc.analysis.simulate import simulate
from collc.backends import BackendOptions, get_backend
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.coalesce import CoalesceTransfers, coalesce_ops, node_estimate
from collc.backends.msccl_xml.lowering import lowering_pipeline
from collc.backends.msccl_xml.verify import verify_algo
from collc.diagnostics import CollcError
from collc.driver import CompileJob, produce_schedule
from collc.ir import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.collective import allgather
from collc.passes.base import CompileUnit
from collc.verify import verify

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH


@pytest.fixture(scope="module")
def alltoall128() -> CompileUnit:
    """A synthesized AllToAll on dgx_h100(nodes=16), one chunk per pair: GPU (A, r)
    gathers from its node the blocks bound for rail r of each other node in scratch,
    then sends them across. Its bursts spread over about 7 / 127 of the schedule (the
    staggered order), so the tests give a span of 0.1; at 1,024 GPUs 0.01 is enough."""
    topo = frontend.resolve_topology("dgx_h100(nodes=16)", None)
    coll = frontend.resolve_collective("alltoall", topo.num_ranks, None)
    unit, _ = produce_schedule(CompileJob(topo, coll, 1 << 30), get_backend("msccl-xml").op_budget(coll.ranks))
    return unit


def test_rail_bursts_become_one_op_each_and_the_schedule_stays_correct(alltoall128):
    before = alltoall128.schedule
    after = coalesce_ops(before, span=0.1)
    verify(after, alltoall128.topology)
    assert len(after.ops) < 0.7 * len(before.ops)
    assert node_estimate(after)[0] < node_estimate(before)[0]
    # Joined ops carry up to 7 relayed blocks (the 8th, the sender's own, comes from its
    # input, another buffer).
    counts = Counter(op.count for op in after.ops)
    assert max(counts) == 7 and all(1 <= c <= 7 for c in counts)
    # Waiting for the last of a burst costs little.
    t0 = simulate(before, alltoall128.topology, alltoall128.size_bytes).time_s
    t1 = simulate(after, alltoall128.topology, alltoall128.size_bytes).time_s
    assert t1 == pytest.approx(t0, rel=0.01)
    # Every dependency points to an earlier step, and ops are in a topological order.
    for op in after.ops:
        assert all(d < op.id and after.ops[d].step < op.step for d in op.deps)


def test_scratch_is_renumbered_within_each_rank(alltoall128):
    after = coalesce_ops(alltoall128.schedule, span=0.1)
    assert after.scratch == alltoall128.schedule.scratch
    for sched in (alltoall128.schedule, after):
        used: dict[int, set[int]] = {}
        for op in sched.ops:
            for at in (op.src, op.dst):
                if at.buffer is S:
                    used.setdefault(at.rank, set()).update(range(at.index, at.index + op.count))
        assert all(max(slots) < sched.scratch_slots(r) for r, slots in used.items())


def test_the_coalesced_lowering_verifies(alltoall128):
    unit = CoalesceTransfers(span=0.1, force=True).run(alltoall128)
    assert unit.schedule is not alltoall128.schedule
    algo = lowered_algo(unit, BackendOptions())
    assert verify_algo(algo, sms=132).ok
    plain = lowered_algo(alltoall128, BackendOptions())
    steps = [sum(len(tb.steps) for tb in g.tbs) for g in algo.gpus]
    plain_steps = [sum(len(tb.steps) for tb in g.tbs) for g in plain.gpus]
    assert max(steps) < max(plain_steps)


def test_under_the_node_limit_nothing_changes(alltoall128):
    assert node_estimate(alltoall128.schedule)[0] < 4096
    assert CoalesceTransfers().run(alltoall128) is alltoall128
    # Over a lower limit, it joins and says so.
    nodes = node_estimate(alltoall128.schedule)[0] - 1
    unit = CoalesceTransfers(span=0.1, nodes=nodes).run(alltoall128)
    note = unit.notes["msccl-coalesce"]
    assert unit.schedule is not alltoall128.schedule
    assert note["estimated_nodes_before"] == nodes + 1 and note["estimated_nodes_after"] < nodes


def test_a_ring_that_fits_once_its_forwards_fuse_is_left_alone():
    # A ring AllReduce on 16 ranks counts 92 XML nodes per GPU unfused but 63 with each
    # receive fused with its forward (rrs, rcs), as the lowering fuses them: over a
    # limit between the two it still fits, and joining its pipelined chunks would only
    # delay them (on 1,024 ranks: 6,140 unfused, 4,095 fused, under 4,096).
    sched = ms.ring_allreduce(16)
    assert node_estimate(sched) == (63, 0)
    unit = ms.unit(sched)
    assert CoalesceTransfers(nodes=80, span=1.0).run(unit) is unit
    assert CoalesceTransfers(nodes=62, span=1.0).run(unit).schedule is not sched


def test_the_pipeline_runs_it_first():
    assert lowering_pipeline(BackendOptions()).startswith("msccl-coalesce,msccl-merge,")


def test_a_join_that_would_close_a_cycle_is_not_made():
    # Ops 0 and 2 go from rank 0 to rank 1 with consecutive slots at both ends, but op 2
    # waits (through op 1) for op 0: joined, the op would wait for itself.
    ops = (
        Op(0, OpKind.COPY, Loc(0, I, 0), Loc(1, O, 0), step=0),
        Op(1, OpKind.COPY, Loc(1, O, 0), Loc(0, O, 1), deps=(0,), step=1),
        Op(2, OpKind.COPY, Loc(0, I, 1), Loc(1, O, 1), deps=(1,), step=2),
    )
    sched = Schedule("cycle", allgather(2, 2), "full2", ops)
    assert coalesce_ops(sched, span=1.0) is sched
    # Without the dependency they join.
    free = Schedule("free", allgather(2, 2), "full2", (ops[0], ops[1], Op(2, OpKind.COPY, Loc(0, I, 1), Loc(1, O, 1),
                                                                           step=2)))
    joined = coalesce_ops(free, span=1.0)
    assert [(op.src, op.dst, op.count) for op in joined.ops if op.src.rank == 0] == [
        (Loc(0, I, 0), Loc(1, O, 0), 2)]


def test_far_apart_in_time_is_not_joined():
    # The pipelined ring AllGather sends a source's consecutive chunks one step apart:
    # with span 0 (ops of one step only) nothing joins, with a span of a step they do.
    sched = ms.ring_allgather(8, 4, pipelined=True)
    assert coalesce_ops(sched, span=0.0) is sched
    joined = coalesce_ops(sched, span=1 / sched.num_steps)
    assert len(joined.ops) < len(sched.ops)
    verify(joined, ms.full_topology(8))


def test_a_span_out_of_range_is_an_error(alltoall128):
    with pytest.raises(CollcError, match="span=1.5"):
        CoalesceTransfers(span=1.5, force=True).run(alltoall128)


def test_past_the_node_limit_waits_chain_instead_of_nop_steps(alltoall128, monkeypatch):
    # A joined rail send waits for the receives of its blocks, one per peer in the node:
    # a nop step per extra wait. Where a GPU would pass the executor's XML nodes, each
    # receive waits for the one before it instead, and the send for the last.
    from collc.backends.msccl_xml import dependencies
    from collc.backends.msccl_xml.model import StepType

    unit = CoalesceTransfers(span=0.1, force=True).run(alltoall128)

    def nops(algo) -> int:
        return sum(1 for g in algo.gpus for tb in g.tbs for s in tb.steps if s.type is StepType.NOP)

    plain = lowered_algo(unit, BackendOptions())
    monkeypatch.setattr(dependencies, "MAX_XML_NODES", 10)
    chained = lowered_algo(unit, BackendOptions())
    assert nops(plain) > 1000 and nops(chained) < nops(plain) // 4
    assert verify_algo(chained, sms=132).ok
    # Nothing else changes: the same threadblocks, with the same transfers.
    assert [[(tb.send, tb.recv, tb.chan) for tb in g.tbs] for g in chained.gpus] == [
        [(tb.send, tb.recv, tb.chan) for tb in g.tbs] for g in plain.gpus]
