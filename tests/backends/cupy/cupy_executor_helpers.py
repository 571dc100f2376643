"""Helpers for the executor tests: generate an executor, load it as a module, run it,
and a stand-in for NCCL that routes sends and receives between threads."""

from __future__ import annotations

import importlib.util
import itertools
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from collc.backends import BackendOptions
from collc.backends.cupy.generate import emit
from collc.ir import Schedule
from collc.passes.base import CompileUnit

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "gpu"))

import collective_schedules  # noqa: E402  (tests/gpu/: shared with the GPU benchmark)

_module_ids = itertools.count()


def write_executor(schedule: Schedule, path: Path, size_bytes: int = 4096,
                   options: BackendOptions | None = None) -> Path:
    n = schedule.collective.ranks
    topology = collective_schedules.full_mesh(n, schedule.topology)
    unit = CompileUnit(topology, schedule.collective, size_bytes, schedule=schedule)
    (written,) = emit(unit, path, options or BackendOptions())
    return written


def load_executor(path: Path) -> ModuleType:
    """Import a generated executor under a fresh name (tests edit module constants)."""
    name = f"collc_executor_{next(_module_ids)}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_executor(path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout)


def table_rows(stdout: str) -> list[list[str]]:
    """The data rows of an executor's nccl-tests-style table."""
    return [line.split() for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


# --- a stand-in for NCCL ----------------------------------------------------------------

class ThreadWorld:
    """The ranks of a multi-process run as threads of this process. Sends and receives
    are matched per (sender, receiver) pair in order, as NCCL matches them; each
    receive must be for exactly as many bytes as the matching send (NCCL's rule)."""

    def __init__(self, size: int, timeout: float = 20.0):
        self.size = size
        self.timeout = timeout
        self.channels = {(a, b): queue.Queue() for a in range(size) for b in range(size) if a != b}
        self.barrier = threading.Barrier(size, timeout=timeout)
        self.values: list[np.ndarray | None] = [None] * size
        self.bytes_sent = [0] * size
        self.groups = [0] * size
        self.failed = threading.Event()  # set when a rank fails: the others stop waiting

    def take(self, sender: int, receiver: int) -> np.ndarray:
        deadline = time.monotonic() + self.timeout
        while not self.failed.is_set() and time.monotonic() < deadline:
            try:
                return self.channels[(sender, receiver)].get(timeout=0.05)
            except queue.Empty:
                continue
        raise RuntimeError(f"rank {receiver} gave up waiting for rank {sender}")

    def transport(self, rank: int) -> "ThreadTransport":
        return ThreadTransport(self, rank)


class ThreadTransport:
    def __init__(self, world: ThreadWorld, rank: int):
        self.world, self.rank, self.world_size = world, rank, world.size
        self.pending: list[tuple[Any, int]] | None = None

    def group_start(self) -> None:
        assert self.pending is None, "groups do not nest"
        self.pending = []

    def send(self, array: Any, peer: int) -> None:
        assert self.pending is not None, "send outside a group"
        assert peer != self.rank and 0 <= peer < self.world_size
        self.world.channels[(self.rank, peer)].put(np.array(array, copy=True))
        self.world.bytes_sent[self.rank] += array.nbytes

    def recv(self, array: Any, peer: int) -> None:
        assert self.pending is not None, "recv outside a group"
        assert peer != self.rank and 0 <= peer < self.world_size
        self.pending.append((array, peer))

    def group_end(self) -> None:
        # Every send of the group was posted before any receive waits: as in NCCL, a
        # group cannot deadlock on its own transfers.
        assert self.pending is not None
        pending, self.pending = self.pending, None
        self.world.groups[self.rank] += 1
        for array, peer in pending:
            data = self.world.take(peer, self.rank)
            assert data.nbytes == array.nbytes, (
                f"rank {self.rank} receives {array.nbytes} bytes from rank {peer}, which sent {data.nbytes}")
            array[...] = data

    def allreduce_sum(self, values: np.ndarray) -> np.ndarray:
        self.world.values[self.rank] = np.asarray(values, dtype=np.float64)
        self.world.barrier.wait()
        total = sum(v for v in self.world.values if v is not None)
        self.world.barrier.wait()  # nobody overwrites a value before everyone summed
        return np.asarray(total)


def run_ranks_in_threads(module: ModuleType, options: Any, out: Any = None) -> tuple[list[Any], ThreadWorld]:
    """Run `module.benchmark` for every rank at once, each rank in a thread with its own
    RankRunner; return rank 0's results and the world (for traffic counts)."""
    world = ThreadWorld(module.RANKS)
    results: list[Any] = [None] * module.RANKS
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        try:
            transport = world.transport(rank)
            runner = module.RankRunner(rank, transport, module.NumpyDevices(), 0, options.dtype, options.inplace)
            results[rank] = module.benchmark(runner, options, transport.allreduce_sum, module.RANKS,
                                             out if rank == 0 else None)
        except BaseException as exc:  # surfaced below; abort so no other rank waits forever
            errors.append(exc)
            world.failed.set()
            world.barrier.abort()

    threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(module.RANKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    assert all(not t.is_alive() for t in threads), "a rank did not finish"
    return results, world
