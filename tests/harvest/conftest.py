"""Fixtures for the harvesting runtime's tests: a manager on one CPU core that stands in
for a GPU, and a trainer loop (this test process, pinned to the same core)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from collc.harvest import ManagerHandle, pin_trainer

from harvest_support import DEVICE, HERE, spec, spin, train, wait_paused  # noqa: F401


@pytest.fixture
def trainer_core() -> Iterator[str]:
    old = os.sched_getaffinity(0)
    pin_trainer(DEVICE)
    yield DEVICE
    os.sched_setaffinity(0, old)


@pytest.fixture
def start_manager(tmp_path: Path) -> Iterator:
    handles: list[ManagerHandle] = []

    def start(**options: object) -> ManagerHandle:
        handle = ManagerHandle.start(tmp_path / f"rt{len(handles)}", [f"{DEVICE}=1G"],
                                     **options)
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.__exit__(None, None, None)
