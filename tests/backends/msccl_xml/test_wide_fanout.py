"""A rank that forwards one chunk to more peers than a channel holds (32).

In a large cluster a synthesized AllGather can relay a chunk from one GPU to dozens of
others; the receive and those forwards form one chain, and the lowering kept a chain on
one channel, and judged a channel's room (32 send and 32 receive peers per rank) before
the chain's own peers were added: dgx_h100(nodes=32) (256 GPUs) failed at every channel
count from 2 to 32, and here rank 0 needed 4 channels and 116 threadblocks. A chain's
peers now count, and a chain that fits no channel whole is split over channels by
connection: 2 channels (39 send peers cannot share fewer) and 64 threadblocks.
"""

from __future__ import annotations

from collections import Counter

import msccl_xml_schedules as ms
from xml_checks import check_structure

from collc.backends import BackendOptions
from collc.backends.msccl_xml.lowering import lowered_algo
from collc.backends.msccl_xml.channels import MAX_TBS_PER_CHANNEL
from collc.backends.msccl_xml.verify import verify_algo
from collc.ir import Buffer, Loc, OpKind, Schedule
from collc.ir.collective import allgather

I, O = Buffer.INPUT, Buffer.OUTPUT


def hub_allgather(n: int) -> Schedule:
    """Every rank sends its chunk to rank 0, which forwards each to all the others."""
    b = ms._Ops()
    for r in range(n):
        b.add(OpKind.COPY, Loc(r, I, 0), Loc(r, O, r), 0)
    arrived = {r: b.add(OpKind.COPY, Loc(r, I, 0), Loc(0, O, r), 0) for r in range(1, n)}
    for src in range(n):
        for q in range(1, n):
            if q != src:
                b.add(OpKind.COPY, Loc(0, O, src) if src else Loc(0, I, 0), Loc(q, O, src), 1,
                      (arrived.get(src),))
    return Schedule(f"hub-allgather-{n}", allgather(n), f"full{n}", tuple(b.ops))


def test_a_chain_wider_than_a_channel_is_split_over_channels():
    n = MAX_TBS_PER_CHANNEL + 8  # rank 0 sends to 39 peers, each chunk's chain to 38 of them
    algo = lowered_algo(ms.unit(hub_allgather(n)), BackendOptions())
    check_structure(algo)
    assert verify_algo(algo).ok
    hub = algo.gpus[0]
    assert len({tb.send for tb in hub.tbs if tb.send >= 0}) == n - 1
    per_channel = Counter(tb.chan for tb in hub.tbs)
    assert algo.nchannels == 2 and max(per_channel.values()) <= MAX_TBS_PER_CHANNEL
    assert len(hub.tbs) == 2 * MAX_TBS_PER_CHANNEL


def test_a_gpu_with_more_peers_than_resident_threadblocks_fails_before_placement():
    import pytest

    from collc.backends.msccl_xml.limits import LimitError
    from collc.backends.msccl_xml.threadblocks import assign_threadblocks

    schedule = hub_allgather(40)  # rank 0 receives from 39 GPUs and sends to 39
    assign_threadblocks(schedule, sms=66)  # 64 resident: its 2 channels x 32 threadblocks fit
    with pytest.raises(LimitError, match=r"GPU 0 sends to 39 GPUs, and each peer takes a threadblock of its own: "
                                         r"it needs at least 39 threadblocks, but a GPU of 40 SMs keeps at most 38"):
        assign_threadblocks(schedule, sms=40)
    with pytest.raises(LimitError, match=r"per instance \(2\): it needs at least 78 threadblocks"):
        assign_threadblocks(schedule, sms=60, instances=2)
