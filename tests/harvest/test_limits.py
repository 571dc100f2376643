"""Memory caps and placement: the RLIMIT_AS path for real, the GPU paths against a
stand-in for CuPy (they have NOT been run on a GPU)."""

from __future__ import annotations

import multiprocessing
import os
import resource
from types import SimpleNamespace

import pytest

from collc.harvest import limits
from collc.harvest.manager import DeviceConfig, Manager, parse_device_arg, parse_size
from collc.harvest.tasks import TaskSpec


def _allocate_past_cap(queue) -> None:
    import numpy as np
    limits.cap_address_space(64 << 20)
    small = np.ones(16 << 20, dtype=np.uint8)      # inside the cap
    try:
        np.ones(256 << 20, dtype=np.uint8)         # past it
        queue.put(("allocated", int(small.sum())))
    except MemoryError:
        queue.put(("memory error", resource.getrlimit(resource.RLIMIT_AS)[0]))


def test_address_space_cap_makes_allocations_past_it_fail():
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_allocate_past_cap, args=(q,))
    p.start()
    outcome, value = q.get(timeout=30)
    p.join(10)
    assert outcome == "memory error" and value > 64 << 20


class FakePool:
    def __init__(self) -> None:
        self.limit = None

    def set_limit(self, size: int) -> None:
        self.limit = size


def test_cupy_pool_cap_against_a_stand_in_not_a_gpu():
    used, pool = [], FakePool()
    fake = SimpleNamespace(
        cuda=SimpleNamespace(Device=lambda i: SimpleNamespace(use=lambda: used.append(i))),
        get_default_memory_pool=lambda: pool)
    limits.cap_cupy_pool(fake, 3, 5 << 30)
    assert used == [3] and pool.limit == 5 << 30
    assert limits.mps_environment(3, 5 << 30) == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "3=5120M"}
    OutOfMemoryError = type("OutOfMemoryError", (Exception,), {})
    assert limits.is_out_of_memory(OutOfMemoryError()) and limits.is_out_of_memory(MemoryError())
    assert not limits.is_out_of_memory(ValueError())


def test_placement_fits_memory_then_shortest_queue(tmp_path):
    m = Manager(tmp_path, [DeviceConfig("cuda:0", 4 << 30), DeviceConfig("cuda:1", 16 << 30)])
    assert m.place(TaskSpec("m:T", memory_bytes=8 << 30)) == "cuda:1"
    first = m.place(TaskSpec("m:T", memory_bytes=1 << 30))
    assert first == "cuda:0"
    m.tasks[1] = SimpleNamespace(device="cuda:0", state="paused")
    assert m.place(TaskSpec("m:T", memory_bytes=1 << 30)) == "cuda:1"
    with pytest.raises(ValueError, match="needs 32768 MiB .*largest: 16384 MiB"):
        m.place(TaskSpec("m:T", memory_bytes=32 << 30))


def test_device_and_size_arguments():
    assert parse_size("512M") == 512 << 20 and parse_size("2GiB") == 2 << 30
    assert parse_device_arg("cpu:1=1G") == DeviceConfig("cpu:1", 1 << 30)
    with pytest.raises(ValueError):
        parse_device_arg("tpu:0")
    with pytest.raises(ValueError):
        parse_size("lots")


def test_task_process_gpu_setup_against_a_stand_in_not_a_gpu(monkeypatch):
    """What a task process on "cuda:2" does before its task exists: the MPS limit in the
    environment (read when the CUDA context is created), then the pool cap."""
    import sys

    from collc.harvest.taskproc import _array_module
    seen_env, used, pool = [], [], FakePool()

    def use(i: int):
        seen_env.append(os.environ.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"))
        return SimpleNamespace(use=lambda: used.append(i))

    fake = SimpleNamespace(cuda=SimpleNamespace(Device=use),
                           get_default_memory_pool=lambda: pool)
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setenv("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "unset")
    assert _array_module("cuda:2", 3 << 30) is fake
    assert seen_env == ["2=3072M"] and used == [2] and pool.limit == 3 << 30


def test_memory_sizes_take_the_language_units_and_every_old_spelling():
    # MB is 10^6 bytes as in .coll; M, MiB, m, mib are 2^20 as `--memory 512M` always meant
    assert parse_size("512MB") == 512 * 10 ** 6
    assert parse_size("512M") == parse_size("512m") == parse_size("512MiB") == parse_size("512mib") == 512 << 20
    assert parse_size("1.5G") == 3 << 29 and parse_size("8B") == 8 and parse_size("4096") == 4096
    assert parse_device_arg("cuda:0=2GB") == DeviceConfig("cuda:0", 2 * 10 ** 9)
    with pytest.raises(ValueError, match="got a time"):
        parse_size("5us")
