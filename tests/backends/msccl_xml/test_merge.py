"""`msccl-merge`: same-step ops on consecutive chunks become one step with cnt > 1."""

from __future__ import annotations

import msccl_xml_schedules as ms

from collc.backends import BackendOptions
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.merge import merge_ops
from collc.backends.msccl_xml.verify import verify_algo
from collc.ir import OpKind
from collc.verify import verify


def counts(algo):
    return sorted(st.cnt for g in algo.gpus for tb in g.tbs for st in tb.steps)


def test_split_chunks_of_one_step_travel_as_one_message():
    split = ms.chain_broadcast(4, 4, root=1, split=True)
    merged = merge_ops(split)
    verify(merged)
    assert len(split.ops) == 16 and len(merged.ops) == 4
    assert {op.count for op in merged.ops} == {4}
    algo = lowered_algo(ms.unit(split), BackendOptions())
    assert counts(algo) == [4] * 5  # root: copy and send; then rcs, rcs, r
    assert verify_algo(algo).ok


def test_dependencies_follow_the_merged_ops():
    merged = merge_ops(ms.chain_broadcast(3, 2, split=True))
    by_id = {op.id: op for op in merged.ops}
    for op in merged.ops:
        for d in op.deps:
            assert d in by_id and by_id[d].step < op.step
    forwards = [op for op in merged.ops if op.src.rank == 1]
    assert [by_id[d].dst.rank for d in forwards[0].deps] == [1]


def test_runs_break_at_gaps_and_at_the_size_limit():
    sched = ms.chain_broadcast(2, 150)
    merged = merge_ops(sched)
    verify(merged)
    assert sorted(op.count for op in merged.ops if op.is_transfer) == [8, 71, 71]
    assert sorted(op.src.index for op in merged.ops if op.is_transfer) == [0, 71, 142]
    assert sorted(op.count for op in merge_ops(sched, max_count=50).ops if op.is_transfer) == [50, 50, 50]


def test_nothing_to_merge_returns_the_same_schedule():
    sched = ms.ring_allgather(4)
    assert merge_ops(sched) is sched


def test_different_kinds_or_ranks_are_not_merged():
    sched = ms.ring_allreduce(3)
    merged = merge_ops(sched)
    verify(merged)
    transfers = [op for op in merged.ops if op.is_transfer]
    assert len(transfers) == len([op for op in sched.ops if op.is_transfer])
    assert {op.kind for op in transfers} == {OpKind.COPY, OpKind.REDUCE}
