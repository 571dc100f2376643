"""The process a side task lives in (one per task, started by the manager).

A process per task, not a thread in a worker per GPU: signals (pause, kill), memory caps
(RLIMIT_AS, MPS's per-client limit) and crashes are all per process, so one task's fault
cannot reach another task, the manager or the trainer.

Messages to the manager over the task's pipe, each `(kind, dict)`:
  ("created", {kind, progress_unit, pid, baseline_bytes}) -> ("paused", {}) after
  to_device(); baseline_bytes is the process's memory (PSS) before the task was built
  ("evicted", {}) after off_device(), when the manager asked (to_device() again at
  the next run)
  ("ran", {t_start, t_end, steps, progress, step_estimate_s, finished})   iterative
  ("finished", {progress})                                                 imperative
  ("failed", {reason: "memory" | "crash", message})
The manager's commands: ("run",) with the deadline already written to shared memory;
("stop", reason); ("evict",).
"""

from __future__ import annotations

import importlib
import os
import sys
import time
import traceback
from collections import deque
from multiprocessing.connection import Connection
from typing import Any

from collc.harvest import limits, proctree
from collc.harvest.tasks import ImperativeTask, IterativeTask, TaskContext, TaskSpec

EXIT_FAILED = 3


class StepEstimator:
    """The step duration to plan with: the largest of the last few measured steps.

    The largest, not the mean: a step that starts needs to end inside the bubble, and
    a noisy machine makes some steps slower.
    """

    def __init__(self, first_guess_s: float, window: int = 5):
        self.first_guess_s = first_guess_s
        self.recent: deque[float] = deque(maxlen=window)

    def add(self, duration_s: float) -> None:
        self.recent.append(duration_s)

    def forget_largest(self) -> None:
        """After a bubble in which no step fitted: one slow outlier (a hiccup of the
        machine) must not keep the task out of every later bubble."""
        if self.recent:
            self.recent.remove(max(self.recent))

    def estimate(self) -> float:
        return max(self.recent) if self.recent else self.first_guess_s


def _array_module(device: str, cap_bytes: int) -> Any:
    kind, index = limits.parse_device(device)
    if kind == "cpu":
        import numpy
        return numpy
    os.environ.update(limits.mps_environment(index, cap_bytes))
    import cupy  # noqa: PLC0415 (only on GPU devices)
    limits.cap_cupy_pool(cupy, index, cap_bytes)
    return cupy


def _load_class(spec: TaskSpec) -> type:
    for p in spec.sys_path:
        if p not in sys.path:
            sys.path.insert(0, p)
    module_name, _, attr = spec.target.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not (isinstance(obj, type) and issubclass(obj, (IterativeTask, ImperativeTask))):
        raise TypeError(f"{spec.target} is not an IterativeTask or ImperativeTask subclass")
    return obj


def _run_iterative(task: IterativeTask, conn: Connection, deadline: Any,
                   frozen: Any) -> None:
    estimator = StepEstimator(task.first_step_estimate_s)
    on_device = True
    while True:
        command = conn.recv()
        if command[0] == "stop":
            task.off_device()
            task.on_stopped(command[1])
            return
        if command[0] == "evict":
            task.off_device()
            on_device = False
            conn.send(("evicted", {}))
            continue
        # ("run",): harvest until the shared deadline (the manager may move it earlier).
        if not on_device:
            task.to_device()
            on_device = True
        task.on_running()
        t_start = time.monotonic()
        cpu_start = time.process_time()
        steps = 0
        finished = task.is_finished()
        while not finished and time.monotonic() + estimator.estimate() <= deadline.value:
            began, frozen_before = time.monotonic(), frozen.value
            task.step()
            task.ctx.synchronize()
            # Time the manager kept this step frozen (SIGSTOP) is not the step's length.
            estimator.add(time.monotonic() - began - (frozen.value - frozen_before))
            steps += 1
            finished = task.is_finished()
        t_end = time.monotonic()
        if steps == 0 and not finished:
            estimator.forget_largest()
        if finished:
            task.on_finished()
        else:
            task.on_paused()
        conn.send(("ran", {"t_start": t_start, "t_end": t_end, "steps": steps,
                           "cpu_s": time.process_time() - cpu_start,
                           "progress": float(task.progress()),
                           "step_estimate_s": estimator.estimate(), "finished": finished}))
        if finished:
            task.off_device()
            return


def _run_imperative(task: ImperativeTask, conn: Connection) -> None:
    # The manager stops this process (SIGSTOP) once it sees "paused" and sends "start"
    # with its first SIGCONT; from then on it only uses signals.
    command = conn.recv()
    if command[0] == "stop":
        return
    task.run()
    conn.send(("finished", {}))


def task_main(spec_json: dict, device: str, conn: Connection, deadline: Any,
              progress_cell: Any, frozen: Any) -> None:
    """Entry point of a task process (forked by its supervisor, see supervisor.py)."""
    limits.die_with_parent()
    kind, index = limits.parse_device(device)
    limits.lower_priority()
    if kind == "cpu":
        limits.pin_to_core(index)
    spec = TaskSpec(**spec_json)
    try:
        xp = _array_module(device, spec.memory_bytes)
        cls = _load_class(spec)
        # What the interpreter and its modules take: the tree's memory cap is this plus
        # the task's need (the need is what the task itself allocates).
        baseline = proctree.process_memory_bytes(os.getpid())
        cap: int | None = spec.memory_bytes
        if kind == "cpu":
            limits.cap_address_space(spec.memory_bytes)
        ctx = TaskContext(device, xp, cap, progress_cell)
        task = cls(ctx, **spec.kwargs)
        imperative = isinstance(task, ImperativeTask)
        conn.send(("created", {"kind": "imperative" if imperative else "iterative",
                               "progress_unit": task.progress_unit, "pid": os.getpid(),
                               "baseline_bytes": baseline}))
        if imperative:
            conn.send(("paused", {}))
            _run_imperative(task, conn)
        else:
            task.to_device()
            conn.send(("paused", {}))
            _run_iterative(task, conn, deadline, frozen)
    except BaseException as exc:  # noqa: BLE001 (everything is reported, then we exit)
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        _report_failure(spec, conn, exc)
        os._exit(EXIT_FAILED)


def _report_failure(spec: TaskSpec, conn: Connection, exc: BaseException) -> None:
    if limits.is_out_of_memory(exc):
        reason = "memory"
        message = (f"task {spec.name!r} exceeded its memory cap of "
                   f"{spec.memory_bytes / 2**20:.0f} MiB: {type(exc).__name__}: {exc}")
    else:
        reason = "crash"
        last = traceback.format_exception(type(exc), exc, exc.__traceback__)
        message = (f"task {spec.name!r} raised {type(exc).__name__}: {exc}\n"
                   + "".join(last[-3:]))
    try:
        conn.send(("failed", {"reason": reason, "message": message}))
    except (OSError, MemoryError):
        pass
