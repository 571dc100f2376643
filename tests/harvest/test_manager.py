"""The manager believes trainer events only from the trainer's user and only with times
a trainer can send; and it accounts every second a task holds the device."""

from __future__ import annotations

import json
import os
import pwd
import socket
import time

import pytest

from collc.harvest import HarvestClient
from collc.harvest.protocol import events_socket

from harvest_support import spec, task_of, train, train_until_stopped, wait_paused




def _send_raw(path, text: str) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.sendto(text.encode(), str(path))


def _rejected(m, device: str, kind: str, at_least: int, timeout_s: float = 10.0) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        n = m.status()["devices"][device]["events_rejected"][kind]
        if n >= at_least or time.monotonic() > deadline:
            return n
        time.sleep(0.05)


def _send_as_nobody(path, event: dict) -> tuple[str, str]:
    """From a child that drops to `nobody`: a datagram sent to the path (refused by the
    directory's and socket's modes) and one on a socket connected before dropping (it
    reaches the socket; the kernel stamps it with nobody's uid)."""
    nobody = pwd.getpwnam("nobody")
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:                                     # the child: never returns
        outcome = []
        try:
            connected = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            connected.connect(str(path))
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            data = json.dumps(event).encode()
            for attempt in ("path", "connected"):
                try:
                    if attempt == "path":
                        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                            s.sendto(data, str(path))
                    else:
                        connected.send(data)
                    outcome.append("sent")
                except OSError as exc:
                    outcome.append(type(exc).__name__)
            os.write(write_end, " ".join(outcome).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    with os.fdopen(read_end) as f:
        by_path, by_connected = f.read().split()
    return by_path, by_connected


def test_events_from_another_user_are_not_believed(start_manager, trainer_core):
    m = start_manager()
    counter = m.submit(spec("Counter"))
    wait_paused(m, counter)
    path = events_socket(m.dir, trainer_core)
    now = time.monotonic()
    by_path, by_connected = _send_as_nobody(path, {"ev": "bubble", "t": now,
                                                   "end": now + 1.0})
    assert by_path == "PermissionError"           # the 0700 directory keeps it out
    assert by_connected == "sent"                 # a socket it already had: delivered ...
    assert _rejected(m, trainer_core, "sender", 1) == 1     # ... and not believed
    time.sleep(0.3)
    state = m.status()
    assert state["devices"][trainer_core]["bubbles"] == 0
    assert task_of(state, counter)["runs"] == 0


@pytest.mark.parametrize("event", [
    '{"ev": "bubble", "t": NaN, "end": 1}',
    '{"ev": "bubble", "t": %(now)s, "end": NaN}',
    '{"ev": "bubble", "t": %(now)s, "end": Infinity}',
    '{"ev": "bubble", "t": %(now)s, "end": 1e300}',          # ran a task until hung
    '{"ev": "bubble", "t": %(now)s, "end": %(before)s}',     # negative length
    '{"ev": "bubble", "t": %(now)s, "end": %(long)s}',       # longer than any step
    '{"ev": "bubble", "t": 1e18, "end": 1.000001e18}',       # not this clock
    '{"ev": "bubble_end", "t": -Infinity}',
    '{"ev": "step", "t": NaN}',
], ids=["nan-start", "nan-end", "inf-end", "huge-end", "negative", "too-long",
        "far-future", "end-inf", "step-nan"])
def test_absurd_event_times_are_counted_not_acted_on(start_manager, trainer_core, event):
    m = start_manager()
    counter = m.submit(spec("Counter"))
    wait_paused(m, counter)
    now = time.monotonic()
    _send_raw(events_socket(m.dir, trainer_core),
              event % {"now": now, "before": now - 1, "long": now + 3600})
    assert _rejected(m, trainer_core, "invalid", 1) == 1
    time.sleep(0.3)
    state = m.status()
    assert state["devices"][trainer_core]["bubbles"] == 0
    assert task_of(state, counter)["runs"] == 0 and task_of(state, counter)["state"] == "paused"
    # The manager still believes sane events afterwards.
    train(HarvestClient(m.dir, trainer_core), steps=2)
    assert m.shutdown()["devices"][trainer_core]["bubbles"] == 2


def test_the_time_a_hung_task_held_the_device_is_accounted(start_manager, trainer_core):
    m = start_manager(hang_timeout_s=0.3)
    hang = m.submit(spec("HangInStep", step_s=0.002))
    wait_paused(m, hang)
    client = HarvestClient(m.dir, trainer_core)
    train_until_stopped(m, client, hang, 20)
    log = m.shutdown()
    task = task_of(log, hang)
    assert "hung in step()" in task["message"]
    runs = [r for r in log["runs"] if r["task"] == hang]
    held = sum(r["end"] - r["start"] for r in runs)
    # It held the device for the hang timeout of bubble time (plus the steps before it
    # hung); every second of it is in the runs and, inside bubbles, in harvested_s.
    assert held >= 0.3 * 0.95, runs
    assert task["harvested_s"] == pytest.approx(
        sum(r["end"] - r["start"] - r["overrun_s"] for r in runs), abs=2e-3)
    assert log["devices"][trainer_core]["harvested_s"] >= task["harvested_s"] - 1e-9
