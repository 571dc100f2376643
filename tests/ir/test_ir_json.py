import json

import pytest

from collc.ir import Collective, CollectiveKind, Schedule, Topology
from collc.ir.collective import STANDARD, ChunkId, standard
from schedules import ring_allgather, ring_topology


def test_topology_round_trip_through_json_text():
    topo = ring_topology(5)
    again = Topology.from_json(json.loads(json.dumps(topo.to_json())))
    assert again == topo
    assert again.num_ranks == 5
    assert again.link("g4", "g0").capacity == 10e9


@pytest.mark.parametrize("kind", list(STANDARD))
@pytest.mark.parametrize("ranks,chunks", [(2, 1), (4, 3)])
def test_collective_round_trip(kind, ranks, chunks):
    coll = standard(kind, ranks, chunks, root=ranks - 1)
    again = Collective.from_json(json.loads(json.dumps(coll.to_json())))
    assert again == coll


def test_schedule_round_trip_keeps_ops_and_meta():
    sched = ring_allgather(4).with_meta(solver="none", epochs=3)
    again = Schedule.from_json(json.loads(json.dumps(sched.to_json())))
    assert again == sched
    assert again.meta == {"solver": "none", "epochs": 3}
    assert again.ops[5].deps == sched.ops[5].deps


def test_slot_bytes_follow_nccl_tests_size_column():
    # AllGather's size is its output buffer; ReduceScatter's is its input buffer.
    assert standard(CollectiveKind.ALLGATHER, 8).slot_bytes(8 << 20) == 1 << 20
    assert standard(CollectiveKind.REDUCESCATTER, 8).slot_bytes(8 << 20) == 1 << 20
    assert standard(CollectiveKind.ALLREDUCE, 4, 2).slot_bytes(8 << 20) == 1 << 20


def test_standard_postconditions():
    ar = standard("allreduce", 3)
    assert ar.outputs[1][2] == frozenset({ChunkId(0, 2), ChunkId(1, 2), ChunkId(2, 2)})
    a2a = standard("alltoall", 3)
    assert a2a.outputs[2][0] == frozenset({ChunkId(0, 2)})
    red = standard("reduce", 3, root=1)
    assert red.outputs[0] == (None,) and red.outputs[1][0] == frozenset(ChunkId(s, 0) for s in range(3))
    assert not standard("alltoall", 3).has_reduction and ar.has_reduction
    assert standard("allgather", 3).demands()[ChunkId(1, 0)] == frozenset({0, 1, 2})
