"""Per-process limits of a side task: memory caps, CPU placement, scheduling priority.

Applied inside the task's own process before it builds the task, so they hold for
everything the task does.

- CPU devices ("cpu:N"): the task is pinned to core N (the core that stands in for a
  GPU, shared with the trainer) and capped with RLIMIT_AS at its address space at start
  plus its memory need: an allocation past the cap fails with MemoryError.
- GPU devices ("cuda:N"): CuPy's memory-pool limit caps what the task allocates through
  CuPy; CUDA MPS's per-client pinned limit (CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, read when
  the CUDA context is created) caps everything, including memory CuPy does not see,
  where an MPS daemon runs. This path has not been run on a GPU yet; it is tested
  against a stand-in for the CuPy module.
- Priority: the task runs in SCHED_IDLE, the CPU analogue of MPS client priorities
  (FreeRide keeps the trainer on the higher one): whenever the trainer is runnable on
  the shared core, the kernel runs the trainer.
"""

from __future__ import annotations

import ctypes
import os
import resource
import signal
from typing import Any

_PR_SET_PDEATHSIG = 1


def parse_device(device: str) -> tuple[str, int]:
    """"cpu:3" -> ("cpu", 3); "cuda:0" -> ("cuda", 0)."""
    kind, _, index = device.partition(":")
    if kind not in ("cpu", "cuda") or not index.isdigit():
        raise ValueError(f"device {device!r} must be 'cpu:N' or 'cuda:N'")
    return kind, int(index)


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Have the kernel send `sig` to this process when its parent exits (Linux).

    Delivered even to a stopped process, so a manager killed with -9 leaves no paused
    task behind.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def lower_priority() -> None:
    """SCHED_IDLE where the kernel has it, else the lowest nice value."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def pin_to_core(core: int) -> None:
    os.sched_setaffinity(0, {core})


def address_space_bytes() -> int:
    """This process's current virtual size (VmSize)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def cap_address_space(extra_bytes: int) -> int:
    """RLIMIT_AS = current size + extra_bytes; returns the limit set."""
    limit = address_space_bytes() + int(extra_bytes)
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    return limit


def mps_environment(device_index: int, cap_bytes: int) -> dict[str, str]:
    """Environment that makes CUDA MPS cap this client's device memory."""
    mib = max(1, cap_bytes >> 20)
    return {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"{device_index}={mib}M"}


def cap_cupy_pool(cupy: Any, device_index: int, cap_bytes: int) -> None:
    """Select the GPU and limit CuPy's default memory pool to cap_bytes."""
    cupy.cuda.Device(device_index).use()
    cupy.get_default_memory_pool().set_limit(size=int(cap_bytes))


def is_out_of_memory(exc: BaseException) -> bool:
    """MemoryError (NumPy under RLIMIT_AS) or CuPy's OutOfMemoryError."""
    if isinstance(exc, MemoryError):
        return True
    return type(exc).__name__ == "OutOfMemoryError"


def single_threaded_math_env() -> dict[str, str]:
    """One BLAS/OpenMP thread: a task must stay on its one core (and its address space
    must not be swollen by per-thread BLAS buffers)."""
    return {name: "1" for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                   "MKL_NUM_THREADS")}
