"""What a training script uses: report bubbles (`HarvestClient`), run a manager
(`ManagerHandle`).

The training loop only ever sends datagrams (see protocol.py): no call here waits for
the manager, so a slow, crashed or absent manager cannot stall training. A failed send
is counted (`HarvestClient.dropped`) and warned about once.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import warnings
from collections import defaultdict, deque
from contextlib import contextmanager
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any, Iterator

from collc.harvest import protocol, rundir
from collc.harvest.tasks import TaskSpec


class HarvestClient:
    """The trainer's side: one per training process, for the device it trains on.

        harvest = HarvestClient(runtime_dir, "cuda:0")
        for batch in loader:
            harvest.step_started()            # bubbles ahead of time, from a report
            ...
            with harvest.bubble("recv-grad"):  # or as they happen
                wait_for_gradients()
    """

    def __init__(self, runtime_dir: str | Path | None, device: str, *, learn_from: int = 3):
        runtime_dir = runtime_dir if runtime_dir is not None else rundir.default_runtime_dir()
        self.address = str(protocol.events_socket(runtime_dir, device))
        self.device = device
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sent = 0
        self.dropped = 0
        self._warned = False
        # Bubbles named in bubble() without an expected length: the shortest of the last
        # few measured lengths (a bubble shorter than planned cuts harvesting short).
        self._lengths: dict[str, deque[float]] = defaultdict(lambda: deque(maxlen=learn_from))

    def _send(self, event: dict[str, Any]) -> None:
        try:
            self.sock.sendto(protocol.encode_event(event), socket.MSG_DONTWAIT, self.address)
            self.sent += 1
        except OSError as exc:
            self.dropped += 1
            if not self._warned:
                self._warned = True
                warnings.warn(f"harvest manager unreachable at {self.address} ({exc}); "
                              "training continues without harvesting", stacklevel=3)

    def step_started(self) -> None:
        """The start of a training step: bubbles from the report are placed from here."""
        self._send({"ev": "step", "t": time.monotonic()})

    def bubble_started(self, expected_s: float) -> float:
        t = time.monotonic()
        self._send({"ev": "bubble", "t": t, "end": t + expected_s})
        return t

    def bubble_ended(self) -> float:
        t = time.monotonic()
        self._send({"ev": "bubble_end", "t": t})
        return t

    @contextmanager
    def bubble(self, name: str = "bubble", expected_s: float | None = None) -> Iterator[None]:
        """Wrap the trainer's wait (for activations, gradients, a collective).

        The manager is told when the bubble should end (expected_s, or what the bubble
        of this name has measured before) and when it really ended.
        """
        lengths = self._lengths[name]
        expected = expected_s if expected_s is not None else (min(lengths) if lengths
                                                              else None)
        start = self.bubble_started(expected) if expected and expected > 0 else \
            time.monotonic()
        try:
            yield
        finally:
            end = self.bubble_ended() if expected else time.monotonic()
            lengths.append(end - start)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> "HarvestClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ManagerError(RuntimeError):
    """The manager refused a request or could not be reached."""


class ManagerHandle:
    """Start, talk to and stop a manager process (also what `collc harvest` uses)."""

    def __init__(self, runtime_dir: str | Path | None, proc: subprocess.Popen | None = None):
        self.dir = Path(runtime_dir) if runtime_dir is not None else \
            rundir.default_runtime_dir()
        self.proc = proc

    @classmethod
    def start(cls, runtime_dir: str | Path | None, devices: list[str], *,
              report: str | Path | None = None, stages: list[int] | None = None,
              margin_ms: float = 2.0, overrun_limit_ms: float = 5.0,
              hang_timeout_s: float = 2.0, timeout_s: float = 20.0,
              cgroups: bool = True) -> "ManagerHandle":
        """Start a manager process and wait until it accepts requests.

        `runtime_dir` None is the private default (rundir.default_runtime_dir()); a
        given one must be the user's own and not writable by others (ManagerError says
        why not), and free of a live manager. `cgroups=False` holds the tasks' trees
        without cgroups even where they are available (the fallback every user has).
        The manager exits (stopping its tasks) when the thread that started it exits:
        start it from the main thread of a long-lived process, or run
        `collc harvest serve` on its own.
        """
        try:
            runtime_dir = rundir.prepare_dir(runtime_dir)
            os.close(rundir.acquire_lock(runtime_dir))   # free now; the manager takes it
        except (rundir.RuntimeDirError, OSError) as exc:
            raise ManagerError(str(exc)) from None
        cmd = [sys.executable, "-m", "collc.harvest.manager", "--dir", str(runtime_dir),
               "--margin-ms", str(margin_ms), "--overrun-limit-ms", str(overrun_limit_ms),
               "--hang-timeout-s", str(hang_timeout_s), "--exit-with-parent"]
        if not cgroups:
            cmd.append("--no-cgroups")
        for d in devices:
            cmd += ["--device", d]
        if report is not None:
            cmd += ["--report", str(report)]
            for s in stages or []:
                cmd += ["--stage", str(s)]
        proc = subprocess.Popen(cmd)
        handle = cls(runtime_dir, proc)
        deadline = time.monotonic() + timeout_s
        while not _serving(runtime_dir, proc.pid):
            if proc.poll() is not None:
                raise ManagerError(f"the manager exited with status {proc.returncode}")
            if time.monotonic() > deadline:
                proc.kill()
                raise ManagerError("the manager did not start in time")
            time.sleep(0.02)
        return handle

    def _request(self, request: dict[str, Any]) -> dict[str, Any]:
        try:
            conn = Client(str(protocol.control_socket(self.dir)), family="AF_UNIX",
                          authkey=protocol.read_authkey(self.dir))
        except (OSError, EOFError, rundir.RuntimeDirError) as exc:
            raise ManagerError(f"no manager at {self.dir}: {exc}") from None
        with conn:
            conn.send(request)
            answer = conn.recv()
            if request["op"] == "shutdown" and answer.get("ok"):
                answer = conn.recv()
        if not answer.get("ok"):
            raise ManagerError(answer.get("error", "request refused"))
        return answer

    def submit(self, spec: TaskSpec) -> int:
        return int(self._request({"op": "submit", "spec": spec.to_json()})["id"])

    def status(self) -> dict[str, Any]:
        return self._request({"op": "status"})["state"]

    def stop(self, task_id: int) -> None:
        self._request({"op": "stop", "id": task_id})

    def evict(self, task_id: int) -> None:
        """Have a paused iterative task move its state off its device (off_device());
        it moves it back (to_device()) when it next runs."""
        self._request({"op": "evict", "id": task_id})

    def wait_for(self, task_id: int, states: tuple[str, ...], timeout_s: float = 30.0
                 ) -> dict[str, Any]:
        """Poll until the task reaches one of `states` (for scripts and tests)."""
        deadline = time.monotonic() + timeout_s
        while True:
            task = next(t for t in self.status()["tasks"] if t["id"] == task_id)
            if task["state"] in states or time.monotonic() > deadline:
                return task
            time.sleep(0.05)

    def shutdown(self, timeout_s: float = 30.0) -> dict[str, Any]:
        """Stop every task and the manager; returns the manager's log."""
        import json
        try:
            self._request({"op": "shutdown"})
        finally:
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=timeout_s)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
                    self.proc.wait()
        return json.loads((self.dir / protocol.LOG).read_text())

    def __enter__(self) -> "ManagerHandle":
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.shutdown()
            except (ManagerError, OSError):
                self.proc.kill()
                self.proc.wait()


def _serving(runtime_dir: Path, pid: int) -> bool:
    """Whether the manager `pid` has written `ready` (a dead manager's stale one holds
    another pid)."""
    try:
        return rundir.read_private_file(runtime_dir / protocol.READY) == str(pid).encode()
    except (OSError, rundir.RuntimeDirError):
        return False


def pin_trainer(device: str) -> None:
    """CPU mode: put the calling (trainer) process on the core that stands in for the GPU."""
    from collc.harvest.limits import parse_device, pin_to_core
    kind, index = parse_device(device)
    if kind == "cpu":
        pin_to_core(index)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
