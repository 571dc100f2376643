"""The reductions that run a copy plan backwards: their op count known before they are
built, and partial sums dealt out to lanes."""

import pytest

from collc.ir.collective import CollectiveKind, allgather, standard
from collc.ir.schedule import Buffer, OpKind, Schedule
from collc.synthesis.auto import choose
from collc.synthesis.extract import arrival_trees
from collc.synthesis.halves import partial_sums, reduction_op_count, reduction_ops
from collc.synthesis.network import Network
from collc.synthesis.options import SynthesisOptions
from collc.synthesis.progress import Progress
from collc.synthesis.solver import Deadline
from collc.synthesis.timing import sequence
from collc.verify import verify
from topos import dgx1


@pytest.fixture(scope="module")
def dgx1_allgather():
    # dgx1's AllGather at one chunk per rank relays chunks to several GPUs at once: in
    # reverse, up to 4 partial sums reach one accumulator.
    topo = dgx1()
    net = Network(topo)
    up = choose(net, allgather(8, 1), 1 << 30, SynthesisOptions(progress=False, chunks=1), Deadline(60),
                Progress(False))
    return topo, net, up.plan


@pytest.mark.parametrize("land, lanes", [(False, 1), (True, 1), (False, 2), (False, 3), (False, 8)])
def test_op_count_is_known_before_the_ops_are_built(dgx1_allgather, land, lanes):
    topo, net, plan = dgx1_allgather
    sums = partial_sums(arrival_trees(plan))
    assert max(sums) >= 3
    ops, _, _ = reduction_ops(plan, CollectiveKind.REDUCESCATTER, net, land=land, lanes=lanes)
    assert len(ops) == reduction_op_count(sums, land, lanes)


def test_lanes_start_by_landing_and_add_each_lane_in_once(dgx1_allgather):
    topo, net, plan = dgx1_allgather
    sums = partial_sums(arrival_trees(plan))
    ops, scratch, done = reduction_ops(plan, CollectiveKind.REDUCESCATTER, net, lanes=3)
    landings = [op for op in ops if op.is_transfer and op.kind is OpKind.COPY]
    lane_adds = [op for op in ops if not op.is_transfer and op.kind is OpKind.REDUCE]
    # One landing and one local add per extra lane an accumulator uses, no more.
    assert len(landings) == len(lane_adds) == sum(min(n, 3) - 1 for n in sums) > 0
    assert all(op.dst.buffer is Buffer.SCRATCH for op in landings)
    by_id = {op.id: op for op in ops}
    for add in lane_adds:  # after the lane's own last write and the accumulator's
        writers = [by_id[d] for d in add.deps]
        assert any(w.dst == add.src for w in writers) and any(w.dst == add.dst for w in writers)
    coll = standard("reducescatter", 8, 1)
    timeline = sequence(ops, net, coll.slot_bytes(1 << 30))  # steps the dependencies respect
    verify(Schedule(name="lanes", collective=coll, topology=topo.name, ops=timeline.ops, scratch=scratch), topo)
