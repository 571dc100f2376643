"""Side tasks that misbehave on purpose, for the runtime's tests (imported by the
manager's task processes through TaskSpec.sys_path)."""

from __future__ import annotations

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
