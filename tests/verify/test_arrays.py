"""The array form of verification (collc/verify/arrays.py) against the op-by-op verifier:
it accepts the stdlib rings, and it never accepts a schedule the op-by-op verifier
rejects (checked on hundreds of single mutations of verified schedules)."""

import random
from dataclasses import replace

import pytest

import collc.frontend as fe
from collc.diagnostics import ScheduleError
from collc.ir import Buffer, Loc, OpKind
from collc.verify import verify, verify_op_by_op
from collc.verify.arrays import MIN_OPS, verify_on_arrays
from schedules import pipelined_ring_allgather, ring_topology


def _ring(collective: str, n: int):
    topo = fe.resolve_topology(f"ring({n})")
    return topo, fe.instantiate_algorithm("ring", topo, fe.resolve_collective(collective, n))


@pytest.mark.parametrize("collective", ["allreduce", "allgather", "reducescatter", "allreduce(chunks=2)"])
def test_the_stdlib_rings_verify_on_arrays(collective):
    topo, sched = _ring(collective, 6)
    assert verify_on_arrays(sched, topo)
    assert verify_on_arrays(sched, None)


def test_a_large_ring_takes_the_array_form():
    topo, sched = _ring("allreduce", 40)  # 3 n (n - 1) ops, above MIN_OPS
    assert len(sched.ops) >= MIN_OPS and verify_on_arrays(sched, topo)
    verify(sched, topo)


def test_a_pipelined_ring_with_steps_shared_by_chunks():
    sched = pipelined_ring_allgather(5, 3)
    assert verify_on_arrays(sched, ring_topology(5))


def _mutations(sched, rng: random.Random, count: int):
    """Single random changes of a schedule's ops (most of them make it wrong)."""
    ops = sched.ops
    n = len(ops)
    for _ in range(count):
        i = rng.randrange(n)
        op = ops[i]
        what = rng.randrange(9)
        if what == 0 and op.deps:
            new = replace(op, deps=tuple(d for d in op.deps if d != rng.choice(op.deps)))
        elif what == 1:
            new = replace(op, dst=op.dst.shifted(rng.choice([-1, 1])))
        elif what == 2:
            new = replace(op, src=op.src.shifted(rng.choice([-1, 1])))
        elif what == 3:
            new = replace(op, kind=OpKind.COPY if op.kind is OpKind.REDUCE else OpKind.REDUCE)
        elif what == 4:
            new = replace(op, step=op.step + rng.choice([-1, 1, 5]))
        elif what == 5:
            new = replace(op, dst=Loc((op.dst.rank + 1) % sched.collective.ranks, op.dst.buffer, op.dst.index))
        elif what == 6:
            new = replace(op, dst=Loc(op.dst.rank, Buffer.INPUT, op.dst.index))
        elif what == 7:
            yield replace(sched, ops=ops[:i] + ops[i + 1:])  # an op dropped
            continue
        else:
            extra = rng.randrange(n)
            new = replace(op, deps=tuple(sorted(set(op.deps) | {extra}))) if extra < i else replace(op, count=2)
        yield replace(sched, ops=ops[:i] + (new,) + ops[i + 1:])


@pytest.mark.parametrize("collective,seed", [("allreduce", 1), ("allgather", 2), ("reducescatter", 3)])
def test_the_array_form_never_accepts_what_the_verifier_rejects(collective, seed):
    topo, sched = _ring(collective, 5)
    rng = random.Random(seed)
    accepted = rejected = 0
    for wrong in _mutations(sched, rng, 150):
        try:
            verify_op_by_op(wrong, topo)
            ok = True
        except ScheduleError:
            ok = False
        fast = verify_on_arrays(wrong, topo)
        assert not fast or ok, "the array form accepted a schedule the verifier rejects"
        accepted += fast
        rejected += not ok
    assert rejected > 50 and accepted > 0  # the mutations do both


def test_errors_are_the_op_by_op_verifiers():
    topo, sched = _ring("allreduce", 40)
    last = sched.ops[-1]
    wrong = replace(sched, ops=sched.ops[:-1])
    assert not verify_on_arrays(wrong, topo)
    with pytest.raises(ScheduleError, match="must hold") as err:
        verify(wrong, topo)
    with pytest.raises(ScheduleError) as again:
        verify_op_by_op(wrong, topo)
    assert err.value.message == again.value.message and str(last.dst) in err.value.message


@pytest.mark.parametrize("collective", ["allgather", "allreduce"])
def test_values_of_more_than_64_ranks_take_several_words(collective):
    """Rank sets of 70 ranks span two uint64 words: the one-chunk inputs' bits are set
    a block at a time; a wrong chunk in one output must still be caught."""
    topo, sched = _ring(collective, 70)
    assert verify_on_arrays(sched, topo)
    # The last op writing an output slot of rank 69 now copies the wrong chunk index.
    i = max(k for k, op in enumerate(sched.ops) if op.dst.rank == 69 and op.dst.buffer is Buffer.OUTPUT
            and op.kind is OpKind.COPY and op.src.buffer is Buffer.OUTPUT)
    op = sched.ops[i]
    other = op.src.shifted(1 if op.src.index + 1 < len(sched.collective.outputs[op.src.rank]) else -1)
    wrong = replace(sched, ops=sched.ops[:i] + (replace(op, src=other),) + sched.ops[i + 1:])
    assert not verify_on_arrays(wrong, topo)
    with pytest.raises(ScheduleError):
        verify(wrong, topo)
