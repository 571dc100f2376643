"""Where a manager listens, and the trainer's event messages.

A manager owns a runtime directory (private to its user, one manager at a time: see
rundir.py):
  lock                held (flock) by the live manager
  control.sock        request/response (multiprocessing.connection, authenticated):
                      submit, status, stop, shutdown (mode 0600)
  authkey             the key for control.sock (mode 0600)
  events-<dev>.sock   one datagram socket per device, trainer -> manager, fire and forget
                      (mode 0600; the manager takes events only from its own uid)
  ready               written once the manager accepts requests (holds its pid)
  harvest-log.json    written at shutdown: bubbles, task runs, incidents

Trainer events are datagrams, not a stream, so that sending one never blocks the training
loop: with MSG_DONTWAIT a full or vanished manager costs the trainer one failed syscall.
Times are time.monotonic() seconds (CLOCK_MONOTONIC, the same in every process of a
machine), so the manager can compare a trainer's timestamps with its own and its tasks'.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

from collc.harvest import rundir

CONTROL = "control.sock"
AUTHKEY = "authkey"
LOG = "harvest-log.json"
READY = "ready"


def events_socket(runtime_dir: str | Path, device: str) -> Path:
    return Path(runtime_dir) / f"events-{device.replace(':', '')}.sock"


def control_socket(runtime_dir: str | Path) -> Path:
    return Path(runtime_dir) / CONTROL


def make_authkey(runtime_dir: str | Path) -> bytes:
    """A fresh key, written without following anything planted at `authkey`."""
    key = secrets.token_bytes(32)
    rundir.write_private_file(Path(runtime_dir) / AUTHKEY, key)
    return key


def read_authkey(runtime_dir: str | Path) -> bytes:
    return rundir.read_private_file(Path(runtime_dir) / AUTHKEY)


def encode_event(event: dict[str, Any]) -> bytes:
    return json.dumps(event, separators=(",", ":")).encode()


def decode_event(data: bytes) -> dict[str, Any] | None:
    """A trainer event, or None for a datagram that is not one (ignored, never fatal)."""
    try:
        event = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(event, dict) or event.get("ev") not in ("bubble", "bubble_end",
                                                               "step", "wake"):
        return None
    for key in ("t", "end"):
        if key in event and not isinstance(event[key], (int, float)):
            return None
    return event
