"""How a command that builds and drops large NumPy arrays asks for memory.

`collc profile` of a job's per-rank logs works on columns of millions of records: 64
logs of 301,422 records make int64 columns of 154 MB, and matching the records into job
calls makes and drops dozens of them one after another. By default each such array is
a fresh mapping from the kernel (glibc serves blocks above its mmap threshold, at most
32 MiB, with mmap and unmaps them when freed), and NumPy asks for transparent huge pages
on every large array. Every page of a fresh mapping is zeroed by the kernel on first
touch: measured with perf on 8 such logs, 45% of the reading process's samples were in
the kernel's page zeroing, and on 64 logs 63%; that process is the command's serial part.

`collc pipeline` lays out a long pipeline's timeline in rounds of array operations the
same way (1,000 stages x 1,000 micro-batches: 0.90 of the wall time with this, the peak
12% higher).

`reuse_freed_memory()` makes the allocator keep freed blocks and serve large ones from
its heap, so a block freed by one step is reused by the next without a fault, and tells
NumPy not to ask for huge pages (fewer faults, but each zeroes 2 MiB). On the 64 logs
(`bench/bench_profile_command.py`): 70.0 -> 56.2 s wall (0.79-0.91 in five pairs), the
reading process's peak 12-22% higher (freed blocks are held rather than returned;
trimming still happens above `KEEP_FREED_BYTES` free at the heap's top). Outputs are the same: only where
memory comes from changes.

For a process, and only where the C library is glibc (elsewhere the call changes
nothing and says so); forked workers inherit the setting. A user who tunes glibc's
allocator (`MALLOC_MMAP_MAX_`, `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`, or
`glibc.malloc.*` in `GLIBC_TUNABLES`: say, `MALLOC_TRIM_THRESHOLD_=0` to trade the time
back for the smaller peak) keeps that tuning: the allocator is then left alone.
"""

from __future__ import annotations

import os
import sys

# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Free memory at the heap's top kept before it is given back (mallopt takes an int).
KEEP_FREED_BYTES = 2 ** 31 - 1
# Read by NumPy when it is first imported (a value the user set is kept).
NUMPY_HUGEPAGE_ENV = "NUMPY_MADVISE_HUGEPAGE"
# glibc's own ways to tune its allocator at start-up: where one is set, it is not overridden.
MALLOC_TUNING_ENV = ("MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def reuse_freed_memory() -> bool:
    """Keep freed memory for reuse in this process (see the module docstring). Call it
    before NumPy is first imported, or its huge-page request stays as it was. Returns
    whether the C allocator took the setting."""
    os.environ.setdefault(NUMPY_HUGEPAGE_ENV, "0")
    if not sys.platform.startswith("linux") or allocator_tuned_by_user():
        return False
    import ctypes   # here: ~5 ms that commands which never call this do without

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    # glibc returns 1 where it took a value; a C library whose mallopt takes nothing returns 0.
    return mallopt(_M_MMAP_MAX, 0) == 1 and mallopt(_M_TRIM_THRESHOLD, KEEP_FREED_BYTES) == 1


def allocator_tuned_by_user() -> bool:
    """Whether this process was started with glibc's allocator tuned by its environment."""
    return any(name in os.environ for name in MALLOC_TUNING_ENV) \
        or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")
