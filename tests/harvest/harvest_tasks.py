"""Side tasks that misbehave on purpose, for the runtime's tests (imported by the
manager's task processes through TaskSpec.sys_path)."""

from __future__ import annotations

import multiprocessing
import os
import time
from typing import Any

from collc.harvest.tasks import ImperativeTask, IterativeTask, TaskContext


class Counter(IterativeTask):
    """Busy steps of `step_s` each; counts them and records when each ran."""

    first_step_estimate_s = 0.005

    def __init__(self, ctx: TaskContext, step_s: float = 0.004, max_steps: int | None = None,
                 **_: Any):
        super().__init__(ctx)
        self.step_s, self.max_steps, self.count = step_s, max_steps, 0
        self.hooks: list[str] = []

    def to_device(self) -> None:
        self.hooks.append("to_device")

    def off_device(self) -> None:
        self.hooks.append("off_device")

    def on_running(self) -> None:
        assert self.hooks[-1] in ("to_device", "paused"), self.hooks  # state is on device
        self.hooks.append("running")

    def on_paused(self) -> None:
        self.hooks.append("paused")

    def step(self) -> None:
        end = time.perf_counter() + self.step_s
        while time.perf_counter() < end:
            pass
        self.count += 1

    def is_finished(self) -> bool:
        return self.max_steps is not None and self.count >= self.max_steps

    def progress(self) -> float:
        # Encodes that hooks ran in order: every run is "running" then "paused".
        assert self.hooks[0] == "to_device"
        return float(self.count)


class MemoryHog(Counter):
    """Allocates more each step until the cap stops it."""

    def step(self) -> None:
        import numpy as np
        self.keep = getattr(self, "keep", [])
        self.keep.append(np.empty(32 << 20, dtype=np.uint8))  # 32 MiB more address space
        self.count += 1


class CrashAfter(Counter):
    def step(self) -> None:
        super().step()
        if self.count >= 3:
            raise RuntimeError("side task bug")


class HangInStep(Counter):
    def step(self) -> None:
        super().step()
        if self.count >= 2:
            while True:  # spins for ever: only the manager can end this
                pass


class SpinLoop(ImperativeTask):
    """Free-form code: spins, counting loop iterations as progress."""

    def run(self) -> None:
        n = 0
        while True:
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            n += 1
            self.ctx.report(n)


class SlowOnce(Counter):
    """One step (the 5th) far longer than a bubble: it must be frozen and resumed."""

    def step(self) -> None:
        if self.count == 4:
            end = time.perf_counter() + 0.3
            while time.perf_counter() < end:
                pass
        super().step()


def _spin_forever() -> None:
    while True:
        pass


class ForkingSpinner(SpinLoop):
    """Free-form code that forks two busy children first (a shell-out, a worker pool)."""

    def run(self) -> None:
        for _ in range(2):
            if os.fork() == 0:
                try:
                    _spin_forever()
                finally:
                    os._exit(0)
        super().run()


class PoolInToDevice(Counter):
    """Starts a two-worker pool in to_device() that keeps both workers busy."""

    def to_device(self) -> None:
        super().to_device()
        if not hasattr(self, "pool"):
            self.pool = multiprocessing.get_context("fork").Pool(2)
            self.busy = [self.pool.apply_async(_spin_forever) for _ in range(2)]


class TreeMemoryHog(Counter):
    """Two forked children each hold `each_mb` of touched memory: each alone is inside
    the task's cap (and its own RLIMIT_AS), together they are past it."""

    def __init__(self, ctx: TaskContext, each_mb: int = 48, **kwargs: Any):
        super().__init__(ctx, **kwargs)
        self.each_mb = each_mb

    def to_device(self) -> None:
        super().to_device()
        for _ in range(2):
            if os.fork() == 0:
                try:
                    block = bytearray(self.each_mb << 20)
                    for i in range(0, len(block), 4096):    # touch every page
                        block[i] = 1
                    while True:
                        time.sleep(1)
                finally:
                    os._exit(0)


class SessionLeaver(SpinLoop):
    """Forks a child that leaves the task's session and process group (setsid)."""

    def run(self) -> None:
        if os.fork() == 0:
            try:
                os.setsid()
                _spin_forever()
            finally:
                os._exit(0)
        super().run()
