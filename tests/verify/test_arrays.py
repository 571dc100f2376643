"""The array form of verification (collc/verify/arrays.py) against the op-by-op verifier:
it accepts the stdlib rings and routed schedules, and it never accepts a schedule the
op-by-op verifier rejects (checked on hundreds of single mutations of verified
schedules, routes included)."""

import random
from dataclasses import replace

import pytest

import collc.frontend as fe
from collc.diagnostics import ScheduleError
from collc.ir import Buffer, Link, Loc, Node, NodeKind, OpKind, Topology
from collc.verify import verify, verify_op_by_op
from collc.verify.arrays import verify_on_arrays
from collc.verify.symbolic import MIN_OPS
from schedules import pipelined_ring_allgather, ring_allgather, ring_topology


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


def _both_verdicts(schedule, topo) -> tuple[bool, bool]:
    """(the array form accepts, the op-by-op verifier accepts), the first never without
    the second."""
    try:
        verify_op_by_op(schedule, topo)
        ok = True
    except ScheduleError:
        ok = False
    fast = verify_on_arrays(schedule, topo)
    assert not fast or ok, "the array form accepted a schedule the verifier rejects"
    return fast, ok


@pytest.mark.parametrize("collective,seed", [("allreduce", 1), ("allgather", 2), ("reducescatter", 3)])
def test_the_array_form_never_accepts_what_the_verifier_rejects(collective, seed):
    topo, sched = _ring(collective, 5)
    rng = random.Random(seed)
    accepted = rejected = 0
    for wrong in _mutations(sched, rng, 150):
        fast, ok = _both_verdicts(wrong, topo)
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


def _switched_ring(n: int) -> Topology:
    """`ring_topology(n)` plus a switch joined to every GPU: a transfer may go straight
    to the next GPU or through the switch."""
    ring = ring_topology(n)
    to_switch = [Link(f"g{i}", "sw", 1e9, 1e-6) for i in range(n)] + [Link("sw", f"g{i}", 1e9, 1e-6) for i in range(n)]
    return Topology(f"switched_ring{n}", ring.nodes + (Node("sw", NodeKind.SWITCH),), ring.links + tuple(to_switch))


def _routed(sched, via_switch: bool):
    """Every transfer of `sched` with an explicit route: straight over the ring's link,
    or through the switch."""
    def route(op):
        a, b = f"g{op.src.rank}", f"g{op.dst.rank}"
        return (a, "sw", b) if via_switch else (a, b)
    return replace(sched, ops=tuple(replace(op, route=route(op)) if op.is_transfer else op for op in sched.ops))


@pytest.mark.parametrize("via_switch", [False, True])
def test_routed_transfers_verify_on_arrays(via_switch):
    """Steady-state schedules route every transfer: the array form checks the routes
    (once per distinct route) instead of handing the schedule to the op-by-op run."""
    topo = _switched_ring(5)
    sched = _routed(ring_allgather(5), via_switch)
    verify_op_by_op(sched, topo)
    assert verify_on_arrays(sched, topo)
    assert verify_on_arrays(sched, None)


@pytest.mark.parametrize("route", [
    ("g0", "g2"),  # not a link
    ("g0", "g1", "g2"),  # through a GPU without storing
    ("g1", "sw", "g2"),  # starts at another GPU
    ("g0", "sw", "g3"),  # ends at another GPU
    ("g0", "nowhere", "g1"),  # a node the topology lacks
    ("g0",),  # one node
])
def test_a_wrong_route_is_left_to_the_verifier(route):
    topo = _switched_ring(5)
    sched = _routed(ring_allgather(5), True)
    i = next(k for k, op in enumerate(sched.ops) if op.src.rank == 0 and op.dst.rank == 1)
    wrong = replace(sched, ops=sched.ops[:i] + (replace(sched.ops[i], route=route),) + sched.ops[i + 1:])
    assert not verify_on_arrays(wrong, topo)
    with pytest.raises(ScheduleError) as err:
        verify(wrong, topo)
    with pytest.raises(ScheduleError) as again:
        verify_op_by_op(wrong, topo)
    assert err.value.message == again.value.message


def test_routes_are_unchecked_without_a_topology_in_both_forms():
    sched = _routed(ring_allgather(5), True)
    wrong = replace(sched, ops=tuple(replace(op, route=("x", "y")) if op.route else op for op in sched.ops))
    verify_op_by_op(wrong, None)
    assert verify_on_arrays(wrong, None)


@pytest.mark.parametrize("seed", [4, 5])
def test_the_array_form_never_accepts_a_routed_schedule_the_verifier_rejects(seed):
    topo = _switched_ring(5)
    sched = _routed(ring_allgather(5), bool(seed % 2))
    rng = random.Random(seed)
    names = [n.name for n in topo.nodes]
    accepted = rejected = 0
    for wrong in _mutations(sched, rng, 100):
        # Half of the mutations also reroute one transfer over random nodes.
        if rng.random() < 0.5:
            i = rng.randrange(len(wrong.ops))
            hops = tuple(rng.choice(names) for _ in range(rng.randrange(1, 4)))
            wrong = replace(wrong, ops=wrong.ops[:i] + (replace(wrong.ops[i], route=hops),) + wrong.ops[i + 1:])
        fast, ok = _both_verdicts(wrong, topo)
        accepted += fast
        rejected += not ok
    assert rejected > 30 and accepted > 0


@pytest.fixture(scope="module")
def rail_alltoall(tmp_path_factory):
    """A rail AllToAll on 4 nodes of 4 GPUs: its rail and scatter ops move a row of 4
    blocks each (ops of several slots). Built once for the tests below."""
    from rail_topologies import quad

    from collc.ir.collective import alltoall
    from collc.synthesis.core import synthesize
    from collc.synthesis.options import SynthesisOptions

    topo = quad(tmp_path_factory.mktemp("rails"), 4, 8)
    result = synthesize(topo, alltoall(topo.num_ranks), 1 << 30,
                        SynthesisOptions(progress=False, max_peers=32, peer_limit=5))
    assert result.method == "rails"
    return topo, result.schedule


def test_ops_of_several_slots_verify_on_arrays(rail_alltoall):
    topo, sched = rail_alltoall
    assert max(op.count for op in sched.ops) == 4
    assert verify_on_arrays(sched, topo)
    # A row one slot short leaves its last block's output empty; one slot long reads
    # past what its gather filled or writes past the buffer: both rejected by both.
    i = next(k for k, op in enumerate(sched.ops) if op.count == 4 and op.dst.buffer is Buffer.OUTPUT)
    for count in (3, 5):
        wrong = replace(sched, ops=sched.ops[:i] + (replace(sched.ops[i], count=count),) + sched.ops[i + 1:])
        assert _both_verdicts(wrong, topo) == (False, False)


def test_ops_of_long_ranges_are_left_to_the_op_by_op_run(rail_alltoall, monkeypatch):
    # Slot by slot, an AllReduce composed over 128 nodes (node-level ops of whole ranges)
    # passed 23 GiB; past SLOTS_PER_OP accesses an op on average, the op-by-op run decides.
    import collc.verify.arrays as arrays

    topo, sched = rail_alltoall
    monkeypatch.setattr(arrays, "SLOTS_PER_OP", 1)
    assert not verify_on_arrays(sched, topo)
    verify(sched, topo)
    monkeypatch.setattr(arrays, "SLOTS_PER_OP", 4)
    monkeypatch.setattr(arrays, "MOST_ACCESSES", 10)
    assert not verify_on_arrays(sched, topo)


def test_the_array_form_never_accepts_a_several_slot_schedule_the_verifier_rejects(rail_alltoall):
    topo, sched = rail_alltoall
    rng = random.Random(6)
    accepted = rejected = 0
    for wrong in _mutations(sched, rng, 60):
        fast, ok = _both_verdicts(wrong, topo)
        accepted += fast
        rejected += not ok
    assert rejected > 20 and accepted > 0
