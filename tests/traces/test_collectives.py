"""The names and sizes the readers share: NCCL op, c10d and kernel names, and a call's bytes."""

import pytest

from collc.traces.collectives import (COLLECTIVE_OPS, call_sizes, collective_from_c10d,
                                      kernel_collective, nccl_tests_bytes)


@pytest.mark.parametrize("coll, sizes", [
    ("allreduce", (40, 40, 40)),
    ("allgather", (40, 320, 320)),        # count is one rank's send part
    ("gather", (40, 320, 320)),
    ("reducescatter", (320, 40, 320)),    # count is one rank's receive part
    ("scatter", (320, 40, 320)),
    ("alltoall", (320, 320, 320)),        # count is per peer
    ("send", (40, None, 40)),
    ("recv", (None, 40, 40)),
])
def test_call_sizes_follow_nccls_meaning_of_count(coll, sizes):
    assert call_sizes(coll, 10, 4, 8) == sizes


def test_call_sizes_unknown_without_element_size_or_ranks():
    assert call_sizes("allreduce", 10, None, 8) == (None, None, None)
    assert call_sizes("allgather", 10, 4, None) == (40, None, None)


def test_kernel_and_c10d_names():
    assert kernel_collective("ncclKernel_AllReduce_RING_LL_Sum_float") == "allreduce"
    assert kernel_collective("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(x)") == "reducescatter"
    assert kernel_collective("ncclDevKernel_SendRecv(x)") is None
    assert kernel_collective("volta_sgemm") is None
    assert collective_from_c10d("nccl:_reduce_scatter_base") == "reducescatter"
    assert collective_from_c10d("c10d::all_to_all") == "alltoall"
    assert collective_from_c10d("barrier") is None
    assert COLLECTIVE_OPS[b"AllToAll"] == COLLECTIVE_OPS[b"AlltoAll"] == "alltoall"


def test_nccl_tests_bytes_from_buffers():
    assert nccl_tests_bytes("allgather", 40, 320) == 320
    assert nccl_tests_bytes("reducescatter", 320, 40) == 320
    assert nccl_tests_bytes("recv", None, 40) == 40
    assert nccl_tests_bytes("allreduce", None, 40) == 40
