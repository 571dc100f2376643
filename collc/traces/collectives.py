"""What the traces' names and counts mean, shared by the readers: which collective an NCCL
operation, a c10d operator or an NCCL kernel names, and the byte sizes of one rank's call.

The NCCL names (`COLLECTIVE_OPS`) are those of debug-log COLL lines, profiler-plugin
events and Inspector records; the c10d names those of Kineto and Chakra traces; the
kernel names those of Kineto kernels and Chakra workload-graph nodes.
"""

from __future__ import annotations

import re

COLLECTIVE_OPS = {
    b"AllReduce": "allreduce", b"AllGather": "allgather", b"ReduceScatter": "reducescatter",
    b"Broadcast": "broadcast", b"Reduce": "reduce", b"Send": "send", b"Recv": "recv",
    b"AlltoAll": "alltoall", b"AllToAll": "alltoall", b"Gather": "gather", b"Scatter": "scatter"}

# The count is one rank's part for these (sizes need nranks): (in_factor, out_factor) in
# units of count x element size, where n is the communicator size.
_PER_RANK = {"allgather": (1, "n"), "gather": (1, "n"), "reducescatter": ("n", 1),
             "scatter": ("n", 1), "alltoall": ("n", "n")}

_KERNEL_NAME = re.compile(r"nccl(?:Dev)?Kernel_([A-Za-z]+)")
_KERNEL_COLLECTIVES = {"AllReduce": "allreduce", "AllGather": "allgather",
                       "ReduceScatter": "reducescatter", "Broadcast": "broadcast",
                       "Reduce": "reduce"}   # SendRecv and Generic kernels name no collective


def call_sizes(coll: str, count: int, size: int | None, nranks: int | None
               ) -> tuple[int | None, int | None, int | None]:
    """(send buffer, receive buffer, nccl-tests size) in bytes of one rank's call of
    `count` elements of `size` bytes, `count` in NCCL's meaning (reference section 5)."""
    if size is None:
        return None, None, None
    part = count * size
    factors = _PER_RANK.get(coll)
    if factors is None:
        in_b = None if coll == "recv" else part
        out_b = None if coll == "send" else part
        return in_b, out_b, part
    in_f, out_f = (nranks if f == "n" else f for f in factors)
    in_b = part * in_f if in_f is not None else None
    out_b = part * out_f if out_f is not None else None
    if coll in ("allgather", "gather"):
        return in_b, out_b, out_b
    return in_b, out_b, in_b     # reducescatter, scatter, alltoall: the send buffer


def collective_from_c10d(name: str) -> str | None:
    """`allreduce`, `_allgather_base`, `reduce_scatter_tensor_coalesced`, `all_to_all`, ...
    (c10d's names, or an `nccl:*` op's) as a stdlib collective; None for barrier and others."""
    key = name.lower().removeprefix("nccl:").replace("_", "").replace("c10d::", "")
    for stem, coll in (("reducescatter", "reducescatter"), ("allreduce", "allreduce"),
                       ("allgather", "allgather"), ("alltoall", "alltoall"),
                       ("broadcast", "broadcast"), ("reduce", "reduce"), ("gather", "gather"),
                       ("scatter", "scatter"), ("send", "send"), ("recv", "recv")):
        if stem in key:
            return coll
    return None


def kernel_collective(name: str) -> str | None:
    """`ncclKernel_AllReduce_RING_LL_Sum_float`, `ncclDevKernel_AllGather_...` -> the
    collective; None for SendRecv, Generic and other kernels."""
    m = _KERNEL_NAME.match(name)
    return _KERNEL_COLLECTIVES.get(m.group(1)) if m else None


# What a kernel's name alone says, where nothing else names its call: SendRecv kernels
# run both ends of a group of point-to-point transfers (or an AlltoAll built of them),
# so they stay "sendrecv"; an unknown stem (`Generic`, a new kernel) is kept, lower case.
_KERNEL_NAME_ONLY = {**_KERNEL_COLLECTIVES, "SendRecv": "sendrecv", "AllToAll": "alltoall",
                     "AlltoAll": "alltoall"}


def kernel_name_collective(name: str) -> str:
    """What an NCCL kernel's name says it runs, always something: `ncclKernel_SendRecv_*`
    -> "sendrecv", `ncclDevKernel_AllGather_*` -> "allgather", `ncclDevKernel_Generic`
    -> "generic". For kernels with no collective metadata and no launching op."""
    m = _KERNEL_NAME.match(name)
    if m is None:
        return "nccl-kernel"
    stem = m.group(1)
    return _KERNEL_NAME_ONLY.get(stem, stem.lower())


def nccl_tests_bytes(collective: str, in_bytes: int | None, out_bytes: int | None) -> int | None:
    """nccl-tests' size (reference section 4) from a call's input and output buffer sizes."""
    if collective in ("allgather", "gather"):
        return out_bytes                   # in_bytes is one rank's part
    if collective in ("reducescatter", "scatter", "alltoall"):
        return in_bytes
    if collective == "recv":
        return out_bytes if out_bytes is not None else in_bytes
    return in_bytes if in_bytes is not None else out_bytes
