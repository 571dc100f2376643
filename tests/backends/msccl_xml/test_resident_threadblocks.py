"""The lowering keeps a GPU's threadblocks within what its SMs can hold at once.

MSCCL's blocks wait on each other, so all of a GPU's threadblocks must be resident
together; a topology that names its GPUs' SM count (`gpu g[8] sms 80;`) bounds them at
SMs - 2 (`limits.resident_threadblocks`). A synthesized AllGather on dgx2(chassis=2)
used 121 threadblocks per GPU on 80-SM V100s before; the driver now halves a
synthesized schedule's op budget until it fits (bench: 61 threadblocks).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import msccl_xml_schedules as ms

from collc.backends import BackendOptions
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.limits import LimitError
from collc.backends.msccl_xml.threadblocks import assign_threadblocks, topology_sms
from collc.backends.msccl_xml.verify import verify_algo
from collc.ir import Node
from xml_checks import check_structure


def with_sms(unit, sms: int):
    topo = unit.topology
    nodes = tuple(replace(n, sms=sms) if n.rank is not None else n for n in topo.nodes)
    return replace(unit, topology=replace(topo, nodes=nodes))


def test_direct_alltoall_needs_15_threadblocks_per_gpu():
    # 7 send peers, 7 receive peers and the local copy: 15 threadblocks.
    program = assign_threadblocks(ms.direct_alltoall(8))
    assert max(len(g.tbs) for g in program.gpus) == 15
    assert assign_threadblocks(ms.direct_alltoall(8), sms=17).gpus  # 17 - 2 = 15: fits


def test_a_gpu_over_its_sms_gets_its_connections_packed():
    # Spread, the 7 send and 7 receive connections take a threadblock each (15 with the
    # copy); 16 SMs keep 14 resident, so each peer's send and receive share one.
    program = assign_threadblocks(ms.direct_alltoall(8), sms=16)
    tbs = program.gpus[0].tbs
    assert len(tbs) == 8
    assert sorted((tb.send, tb.recv) for tb in tbs) == [(-1, -1)] + [(p, p) for p in range(1, 8)]


def test_too_few_sms_even_packed_is_a_limit_error_naming_the_gpu():
    with pytest.raises(LimitError) as exc:
        assign_threadblocks(ms.direct_alltoall(8), sms=9)
    assert ("with 1 channel(s) per instance GPU 0 needs 15 threadblocks, but a GPU of 9 SMs keeps at most 7 "
            "resident at once") in exc.value.message
    assert "packed on 1 channel(s), GPU 0 still needs 8." in exc.value.message


def test_packed_alltoall_lowers_to_a_file_that_verifies_within_the_sms():
    unit = with_sms(ms.unit(ms.direct_alltoall(8)), 16)
    algo = lowered_algo(unit, BackendOptions())
    assert max(len(g.tbs) for g in algo.gpus) == 8
    check_structure(algo)
    assert verify_algo(algo, sms=16).ok and not verify_algo(algo, sms=9).ok


def test_the_topology_sms_bound_the_backend_lowering():
    unit = ms.unit(ms.direct_alltoall(8))
    assert topology_sms(unit.topology) == 0
    assert lowered_algo(unit, BackendOptions())  # no SM count: no bound
    small = with_sms(unit, 9)
    assert topology_sms(small.topology) == 9
    with pytest.raises(LimitError):
        lowered_algo(small, BackendOptions())
    algo = lowered_algo(with_sms(unit, 80), BackendOptions())
    assert verify_algo(algo, sms=80).ok and not verify_algo(algo, sms=16).ok


def test_more_channels_stop_at_the_sm_bound():
    # 16 chunks per rank over a ring need two channels to keep within 64 steps per
    # threadblock, and so more threadblocks than one channel would.
    schedule = ms.ring_allgather(8, 16, pipelined=True)
    one = assign_threadblocks(schedule, max_steps=256)
    two = assign_threadblocks(schedule)
    most_one = max(len(g.tbs) for g in one.gpus)
    most_two = max(len(g.tbs) for g in two.gpus)
    assert most_two > most_one
    with pytest.raises(LimitError) as exc:
        assign_threadblocks(schedule, sms=most_one + 2)
    assert f"with 2 channel(s) per instance GPU 0 needs {most_two} threadblocks" in exc.value.message
    # Packed, each ring connection is cut into slices on channels of their own: more
    # threadblocks here, not fewer, so the error stands and says so.
    assert "packed on 2 channel(s), GPU 0 still needs 5" in exc.value.message
    assert assign_threadblocks(schedule, sms=most_two + 2).nchannels == two.nchannels
