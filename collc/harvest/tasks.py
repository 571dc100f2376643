"""The two side-task interfaces, and how a task is described to the manager.

**Iterative** (`IterativeTask`): the task is a sequence of short `step()`s. The runtime
calls its hooks on every state change and calls `step()` only while the current bubble
has at least one step's *measured* duration left (the largest of the last few steps),
so a well-behaved task ends before the bubble does without being interrupted.

**Imperative** (`ImperativeTask`): free-form code, `run(ctx)`. The runtime pauses and
resumes it with SIGSTOP / SIGCONT. Signals, not cooperative checkpoints, because
free-form code has no place where it promises to look at a flag: a checkpoint API would
turn it into an iterative task with worse timing. SIGSTOP cannot be caught or ignored, so
a pause holds even for code stuck in a C extension; on a GPU, kernels already queued
still drain (the pause latency is then the queued work), which is why iterative tasks,
whose steps end with a device synchronisation, are the precise interface.

A task's class is named by an import path ("package.module:Class"), so the manager's
task process can build it with the device's array module; `TaskSpec` carries that path,
JSON-able arguments, a priority and a memory need.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

STATES = ("submitted", "created", "paused", "running", "finished", "stopped")


class TaskContext:
    """What a task's process knows about where it runs.

    `xp` is the array module of the device (numpy on a CPU core, cupy on a GPU);
    `device` is "cpu:N" or "cuda:N"; `memory_cap_bytes` is the cap the runtime enforces.
    """

    def __init__(self, device: str, xp: Any, memory_cap_bytes: int | None,
                 progress_cell: Any = None):
        self.device = device
        self.xp = xp
        self.memory_cap_bytes = memory_cap_bytes
        self._progress_cell = progress_cell

    def synchronize(self) -> None:
        """Wait for the device's queued work (no-op on CPUs)."""
        if self.device.startswith("cuda"):
            self.xp.cuda.Device().synchronize()

    def report(self, progress: float) -> None:
        """Imperative tasks: publish progress (work units done so far)."""
        if self._progress_cell is not None:
            self._progress_cell.value = float(progress)


class IterativeTask:
    """Subclass and implement `step()`; override the hooks you need.

    Lifecycle: created -> (to_device) -> paused <-> running -> finished, or stopped from
    any state. `progress()` is the work done so far, in the task's own units.
    """

    # Used as the step duration until the first step has been measured.
    first_step_estimate_s: float = 0.01
    # What one unit of progress() is (shown in reports).
    progress_unit: str = "steps"

    def __init__(self, ctx: TaskContext, **kwargs: Any):
        self.ctx = ctx
        self.xp = ctx.xp

    # state hooks ------------------------------------------------------------------
    def to_device(self) -> None:
        """created -> paused: move the task's state onto its device."""

    def off_device(self) -> None:
        """Move the state off the device (before stopping, or when evicted)."""

    def on_running(self) -> None:
        """paused -> running, at the start of a bubble."""

    def on_paused(self) -> None:
        """running -> paused, before the bubble ends."""

    def on_finished(self) -> None:
        """running -> finished."""

    def on_stopped(self, reason: str) -> None:
        """Any state -> stopped (asked to stop, or the manager shutting down)."""

    # work -------------------------------------------------------------------------
    def step(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define step(): an iterative task's unit of work")

    def is_finished(self) -> bool:
        return False

    def progress(self) -> float:
        return 0.0


class ImperativeTask:
    """Subclass and implement `run(ctx)`: free-form code, paused by signals.

    Call `ctx.report(progress)` now and then; the manager reads it while the task is
    stopped, too (it lives in shared memory).
    """

    progress_unit: str = "units"

    def __init__(self, ctx: TaskContext, **kwargs: Any):
        self.ctx = ctx
        self.xp = ctx.xp

    def run(self) -> None:
        raise NotImplementedError(f"{type(self).__name__} must define run(): an imperative task's work")


@dataclass
class TaskSpec:
    """A side task as submitted to the manager."""

    target: str                            # "package.module:Class"
    kwargs: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    priority: int = 0                      # higher runs first
    memory_bytes: int = 256 << 20          # cap, and what placement must fit
    sys_path: list[str] = field(default_factory=list)  # extra import paths for target
    device: str | None = None              # pin to one device; None: the manager places it

    def __post_init__(self) -> None:
        if ":" not in self.target:
            raise ValueError(f"task target {self.target!r} must be 'module:Class'")
        if not self.name:
            self.name = self.target.rsplit(":", 1)[1]
        if self.memory_bytes <= 0:
            raise ValueError("memory_bytes must be positive")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
