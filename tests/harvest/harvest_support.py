"""Helpers of the harvesting runtime's tests: task specs, the trainer's compute and
loop. A module of its own (not conftest) so test files import it by a unique name."""

from __future__ import annotations

import os
import time
from pathlib import Path

from collc.harvest import HarvestClient, ManagerHandle, TaskSpec

HERE = Path(__file__).resolve().parent
DEVICE = f"cpu:{max(os.sched_getaffinity(0))}"


def spec(cls: str, memory_mb: int = 256, **kwargs: object) -> TaskSpec:
    return TaskSpec(f"harvest_tasks:{cls}", kwargs=dict(kwargs), sys_path=[str(HERE)],
                    memory_bytes=memory_mb << 20)


def spin(seconds: float) -> None:
    """The trainer's compute: busy on its core for `seconds`."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def train(client: HarvestClient, steps: int, busy_s: float = 0.04,
          bubble_s: float = 0.12) -> list[float]:
    """Steps of compute then a bubble (the trainer waiting); returns step times."""
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        spin(busy_s)
        with client.bubble("wait", expected_s=bubble_s):
            time.sleep(bubble_s)
        times.append(time.perf_counter() - start)
    return times


def wait_paused(manager: ManagerHandle, *task_ids: int) -> None:
    for task_id in task_ids:
        task = manager.wait_for(task_id, ("paused", "finished", "stopped"), timeout_s=60)  # a loaded machine starts slowly
        assert task["state"] == "paused", task


def task_of(state: dict, task_id: int) -> dict:
    """One task's entry in a status or log."""
    return next(t for t in state["tasks"] if t["id"] == task_id)


def train_until_stopped(manager: ManagerHandle, client, task_id: int, steps: int) -> None:
    """Train a step at a time (a bubble each) until the task is stopped, at most `steps`."""
    for _ in range(steps):
        if task_of(manager.status(), task_id)["state"] == "stopped":
            return
        train(client, steps=1)
