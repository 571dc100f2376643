"""The harvesting manager: one process per machine, one worker thread per device.

Design (see docs/harvest.md):
- The manager is its own process so that nothing it does (spawning tasks, waiting on
  them, killing them) runs in the training process; the trainer only sends datagrams.
  It is not pinned to the device's core: on a real machine it runs on the host CPU, not
  on the GPU it manages.
- Each device ("cpu:N" standing in for a GPU, or "cuda:N") has a `DeviceWorker` thread
  that owns the device's event socket, its task processes' pipes and its bubbles. A
  bubble becomes a *window* [start, end): from the trainer as it happens (`bubble`
  event with the expected end, `bubble_end` when it really ends) or ahead of time from a
  pipeline report, each of the stage's bubbles placed relative to a `step` event.
- In a window the worker runs one task at a time, the highest priority first, among
  equals the one that has harvested least. Iterative tasks get the deadline
  (window end - margin) in shared memory and stop themselves before it; imperative
  tasks are resumed with SIGCONT and stopped with SIGSTOP at the deadline.
- A task still running `overrun_limit_s` past the window's end is frozen (SIGSTOP) and
  resumed in its next window; one that has run `hang_timeout_s` of bubble time without
  finishing a step is killed as hung. So a misbehaving task delays the trainer by at
  most the overrun limit, and the task runs at SCHED_IDLE meanwhile.
- Task processes are spawned from the main thread only: the kernel's parent-death
  signal (which kills tasks when the manager dies, even kill -9) follows the thread that
  forked the child.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError
from collc.harvest import limits, protocol
from collc.harvest.tasks import TaskSpec
from collc.units import SIZE, parse_quantity

FINAL_STATES = ("finished", "stopped")


@dataclass
class DeviceConfig:
    name: str                        # "cpu:0" / "cuda:1"
    free_bytes: int | None = None    # memory free for side tasks during bubbles
    schedule: list[tuple[float, float]] = field(default_factory=list)  # (start, end) s


@dataclass
class Window:
    id: int
    device: str
    start: float
    planned_end: float
    source: str                      # "trainer" or "schedule"
    actual_end: float | None = None
    harvested_s: float = 0.0
    cpu_s: float = 0.0
    tried: set[int] = field(default_factory=set)

    @property
    def end(self) -> float:
        return self.planned_end if self.actual_end is None else min(self.planned_end,
                                                                     self.actual_end)


@dataclass
class TaskRecord:
    id: int
    spec: TaskSpec
    device: str
    proc: Any = None
    conn: Connection | None = None
    deadline: Any = None             # shared double: the running window's deadline
    progress_cell: Any = None        # shared double: imperative tasks' progress
    frozen_cell: Any = None          # shared double: seconds spent frozen by the manager
    frozen_at: float = 0.0
    state: str = "submitted"
    kind: str | None = None
    progress_unit: str = ""
    progress: float = 0.0
    harvested_s: float = 0.0
    cpu_s: float = 0.0
    steps: int = 0
    runs: int = 0
    max_overrun_s: float = 0.0
    frozen: bool = False             # SIGSTOPped in the middle of a step
    stuck_s: float = 0.0             # bubble time spent in the current, unfinished step
    resumed_at: float = 0.0
    started: bool = False            # imperative: has had its first SIGCONT
    stop_requested: str | None = None
    evict_requested: bool = False
    evicted: bool = False            # iterative, state "created": its state is off device
    message: str = ""

    def summary(self, t0: float) -> dict[str, Any]:
        return {"id": self.id, "name": self.spec.name, "device": self.device,
                "state": self.state, "kind": self.kind, "priority": self.spec.priority,
                "memory_bytes": self.spec.memory_bytes, "harvested_s": self.harvested_s,
                "cpu_s": self.cpu_s,
                "steps": self.steps, "runs": self.runs, "progress": self.progress,
                "progress_unit": self.progress_unit, "max_overrun_s": self.max_overrun_s,
                "pid": self.proc.pid if self.proc is not None else None,
                "message": self.message}


class Manager:
    def __init__(self, runtime_dir: str | Path, devices: list[DeviceConfig], *,
                 margin_s: float = 0.002, overrun_limit_s: float = 0.005,
                 hang_timeout_s: float = 2.0):
        self.dir = Path(runtime_dir)
        self.devices = {d.name: d for d in devices}
        self.margin_s = margin_s
        self.overrun_limit_s = overrun_limit_s
        self.hang_timeout_s = hang_timeout_s
        self.t0 = time.monotonic()
        self.lock = threading.RLock()
        self.tasks: dict[int, TaskRecord] = {}
        self.runs: list[dict[str, Any]] = []
        self.bubbles: list[dict[str, Any]] = []
        self.incidents: list[dict[str, Any]] = []
        self.spawn_queue: queue.Queue[TaskRecord | None] = queue.Queue()
        self.stopping = threading.Event()
        self.workers = {name: DeviceWorker(self, cfg) for name, cfg in self.devices.items()}
        self._mp = multiprocessing.get_context("spawn")
        self.stopped_event = threading.Event()
        self.shutdown_answered = threading.Event()
        self.shutdown_requested = False

    # --- bookkeeping shared by the threads ------------------------------------------
    def rel(self, t: float) -> float:
        return t - self.t0

    def incident(self, task: TaskRecord | None, what: str, message: str) -> None:
        with self.lock:
            self.incidents.append({"t": self.rel(time.monotonic()), "what": what,
                                   "task": task.id if task else None,
                                   "name": task.spec.name if task else None,
                                   "message": message})
        sys.stderr.write(f"collc harvest: {message}\n")

    # --- placement ------------------------------------------------------------------
    def place(self, spec: TaskSpec) -> str:
        """The device for a new task: its bubbles' free memory fits the task's need;
        among those, the one with the fewest live tasks (shortest queue)."""
        names = [spec.device] if spec.device else list(self.devices)
        if spec.device and spec.device not in self.devices:
            raise ValueError(f"no device {spec.device!r} (devices: {', '.join(self.devices)})")
        fitting = [n for n in names if self.devices[n].free_bytes is None
                   or self.devices[n].free_bytes >= spec.memory_bytes]
        if not fitting:
            largest = max(self.devices[n].free_bytes or 0 for n in names)
            raise ValueError(f"task {spec.name!r} needs {spec.memory_bytes / 2**20:.0f} MiB "
                             f"but no device has that much free during bubbles (largest: "
                             f"{largest / 2**20:.0f} MiB)")
        with self.lock:
            def queue_length(n: str) -> int:
                return sum(1 for t in self.tasks.values()
                           if t.device == n and t.state not in FINAL_STATES)
            return min(fitting, key=lambda n: (queue_length(n), list(self.devices).index(n)))

    def submit(self, spec: TaskSpec) -> TaskRecord:
        device = self.place(spec)
        with self.lock:
            record = TaskRecord(len(self.tasks) + 1, spec, device)
            self.tasks[record.id] = record
        self.spawn_queue.put(record)
        return record

    def _spawn(self, record: TaskRecord) -> None:
        from collc.harvest.taskproc import task_main
        parent, child = self._mp.Pipe()
        record.deadline = self._mp.RawValue("d", 0.0)
        record.progress_cell = self._mp.RawValue("d", 0.0)
        record.frozen_cell = self._mp.RawValue("d", 0.0)
        proc = self._mp.Process(target=task_main, name=f"harvest-task-{record.id}",
                                args=(record.spec.to_json(), record.device, child,
                                      record.deadline, record.progress_cell,
                                      record.frozen_cell))
        proc.start()
        child.close()
        with self.lock:
            record.proc, record.conn = proc, parent
        self.workers[record.device].wake()

    # --- state for the command and the log ------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            devices = {}
            for name in self.devices:
                bubbles = [b for b in self.bubbles if b["device"] == name]
                runs = [r for r in self.runs if r["device"] == name]
                bubble_s = sum(b["end"] - b["start"] for b in bubbles)
                harvested = sum(b["harvested_s"] for b in bubbles)
                cpu = sum(b["cpu_s"] for b in bubbles)
                overruns = sorted(r["overrun_s"] for r in runs)
                devices[name] = {
                    "free_bytes": self.devices[name].free_bytes,
                    "bubbles": len(bubbles), "bubble_s": bubble_s,
                    "harvested_s": harvested,
                    "harvested_share": harvested / bubble_s if bubble_s else 0.0,
                    # CPU time the tasks really got (others' load on the core shows here)
                    "cpu_s": cpu, "cpu_share": cpu / bubble_s if bubble_s else 0.0,
                    "runs": len(runs),
                    "max_overrun_s": overruns[-1] if overruns else 0.0,
                    "p99_overrun_s": overruns[int(0.99 * (len(overruns) - 1))]
                    if overruns else 0.0,
                }
            return {"uptime_s": self.rel(time.monotonic()), "margin_s": self.margin_s,
                    "overrun_limit_s": self.overrun_limit_s,
                    "hang_timeout_s": self.hang_timeout_s, "devices": devices,
                    "tasks": [t.summary(self.t0) for t in self.tasks.values()],
                    "incidents": list(self.incidents)}

    def full_log(self) -> dict[str, Any]:
        log = self.snapshot()
        with self.lock:
            log["bubbles"] = list(self.bubbles)
            log["runs"] = list(self.runs)
        return log

    # --- the process's life -----------------------------------------------------------
    def serve(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        os.environ.update(limits.single_threaded_math_env())
        key = protocol.make_authkey(self.dir)
        for worker in self.workers.values():
            worker.bind()
        address = str(protocol.control_socket(self.dir))
        if os.path.exists(address):
            os.unlink(address)
        listener = Listener(address, family="AF_UNIX", authkey=key)
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        for worker in self.workers.values():
            worker.start()
        # Clients wait for this file: the socket file exists a moment before it listens.
        (self.dir / protocol.READY).write_text(str(os.getpid()))
        signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        while not self.stopping.is_set():
            try:
                record = self.spawn_queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if record is not None:
                try:
                    self._spawn(record)
                except Exception as exc:  # noqa: BLE001 (reported per task)
                    record.state, record.message = "stopped", f"could not start: {exc}"
                    self.incident(record, "spawn", record.message)
        for worker in self.workers.values():
            worker.join(timeout=10)
        from collc.io import atomic_write
        atomic_write(self.dir / protocol.LOG, json.dumps(self.full_log(), indent=1))
        listener.close()
        for path in [protocol.control_socket(self.dir), self.dir / protocol.READY] + [
                protocol.events_socket(self.dir, d) for d in self.devices]:
            try:
                path.unlink()
            except OSError:
                pass
        self.stopped_event.set()
        # The shutdown request's second answer (the log is written) goes out before exit.
        if self.shutdown_requested:
            self.shutdown_answered.wait(timeout=5)

    def _accept(self, listener: Listener) -> None:
        while True:
            try:
                conn = listener.accept()
            except (OSError, EOFError):
                if self.stopping.is_set():
                    return
                continue
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: Connection) -> None:
        try:
            request = conn.recv()
            conn.send(self._answer(request))
            if request.get("op") == "shutdown":
                self.stopped_event.wait(timeout=30)
                conn.send({"ok": True, "log": str(self.dir / protocol.LOG)})
                self.shutdown_answered.set()
        except (EOFError, OSError):
            pass
        finally:
            conn.close()

    def _answer(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        try:
            if op == "submit":
                record = self.submit(TaskSpec(**request["spec"]))
                return {"ok": True, "id": record.id, "device": record.device}
            if op == "status":
                return {"ok": True, "state": self.snapshot()}
            if op == "stop":
                with self.lock:
                    record = self.tasks.get(int(request["id"]))
                    if record is None:
                        return {"ok": False, "error": f"no task {request['id']}"}
                    record.stop_requested = "stopped on request"
                self.workers[record.device].wake()
                return {"ok": True}
            if op == "evict":
                with self.lock:
                    record = self.tasks.get(int(request["id"]))
                    if record is None or record.kind != "iterative":
                        return {"ok": False, "error": f"no iterative task {request['id']}"}
                    record.evict_requested = True
                self.workers[record.device].wake()
                return {"ok": True}
            if op == "shutdown":
                self.shutdown_requested = True
                self.stopping.set()
                for worker in self.workers.values():
                    worker.wake()
                return {"ok": True}
        except (TypeError, ValueError, KeyError) as exc:
            return {"ok": False, "error": str(exc)}
        return {"ok": False, "error": f"unknown request {op!r}"}


class DeviceWorker(threading.Thread):
    """Runs one device's side tasks inside that device's bubbles."""

    def __init__(self, manager: Manager, config: DeviceConfig):
        super().__init__(name=f"worker-{config.name}", daemon=True)
        self.m = manager
        self.config = config
        self.sock: socket.socket | None = None
        self.pending: list[Window] = []
        self.windows: list[Window] = []      # every window seen, for bubble_end matching
        self._next_window = 0

    # --- events ---------------------------------------------------------------------
    def bind(self) -> None:
        path = protocol.events_socket(self.m.dir, self.config.name)
        if path.exists():
            path.unlink()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.setblocking(False)

    def wake(self) -> None:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(protocol.encode_event({"ev": "wake"}),
                         str(protocol.events_socket(self.m.dir, self.config.name)))
        except OSError:
            pass

    def _new_window(self, start: float, end: float, source: str) -> None:
        self._next_window += 1
        w = Window(self._next_window, self.config.name, start, end, source)
        self.pending.append(w)
        self.windows.append(w)
        del self.windows[:-64]

    def _read_events(self) -> None:
        assert self.sock is not None
        while True:
            try:
                data = self.sock.recv(65536)
            except BlockingIOError:
                return
            event = protocol.decode_event(data)
            if event is None:
                continue
            kind, t = event["ev"], float(event.get("t", time.monotonic()))
            if kind == "bubble" and "end" in event and event["end"] > t:
                self._new_window(t, float(event["end"]), "trainer")
            elif kind == "bubble_end":
                for w in reversed(self.windows):
                    if w.source == "trainer" and w.start <= t:
                        if w.actual_end is None:
                            w.actual_end = t
                        break
            elif kind == "step":
                for start, end in self.config.schedule:
                    self._new_window(t + start, t + end, "schedule")

    # --- waiting on everything --------------------------------------------------------
    def _my_tasks(self) -> list[TaskRecord]:
        with self.m.lock:
            return [t for t in self.m.tasks.values()
                    if t.device == self.config.name and t.proc is not None
                    and t.conn is not None]

    def _pump(self, timeout: float) -> None:
        """Wait up to `timeout` s for an event or a task message, and handle what came."""
        tasks = self._my_tasks()
        waitables: list[Any] = [self.sock]
        for t in tasks:
            waitables += [t.conn, t.proc.sentinel]
        ready = wait(waitables, timeout=max(0.0, timeout))
        if self.sock in ready:
            self._read_events()
        for t in tasks:
            if t.conn in ready:
                self._drain(t)
        for t in tasks:
            if t.proc.sentinel in ready:
                self._died(t)

    def _drain(self, t: TaskRecord) -> None:
        assert t.conn is not None
        try:
            while t.conn.poll():
                kind, info = t.conn.recv()
                self._message(t, kind, info)
        except (EOFError, OSError):
            pass

    def _message(self, t: TaskRecord, kind: str, info: dict[str, Any]) -> None:
        with self.m.lock:
            if kind == "created":
                t.state, t.kind, t.progress_unit = "created", info["kind"], info["progress_unit"]
            elif kind == "paused":
                if t.kind == "imperative":
                    os.kill(t.proc.pid, signal.SIGSTOP)
                t.state = "paused"
            elif kind == "ran":
                self._record_iterative_run(t, info)
            elif kind == "evicted":
                t.state, t.evicted = "created", True
            elif kind == "finished":
                t.state = "finished"
            elif kind == "failed":
                t.state = "stopped"
                t.message = info["message"]
                what = "memory cap" if info["reason"] == "memory" else "crash"
                self.m.incident(t, what, info["message"].splitlines()[0])

    def _died(self, t: TaskRecord) -> None:
        self._drain(t)
        t.proc.join(timeout=1)
        code = t.proc.exitcode
        with self.m.lock:
            if t.state not in FINAL_STATES:
                t.state = "stopped"
                if code is not None and code < 0:
                    t.message = (f"task {t.spec.name!r} was killed by "
                                 f"{signal.Signals(-code).name}")
                else:
                    t.message = f"task {t.spec.name!r} exited with status {code}"
                self.m.incident(t, "died", t.message)
            t.conn.close()
            t.conn = None

    # --- running tasks in a window ------------------------------------------------------
    def _pick(self, w: Window) -> TaskRecord | None:
        # A task runs at most once per window: it returns when its next step no longer
        # fits, and then only a task with shorter steps can use what is left.
        ready = [t for t in self._my_tasks()
                 if (t.state == "paused" or (t.state == "created" and t.evicted))
                 and t.stop_requested is None and t.id not in w.tried]
        if not ready:
            return None
        return min(ready, key=lambda t: (not t.frozen, -t.spec.priority, t.harvested_s, t.id))

    def _harvest(self, w: Window) -> None:
        while not self.m.stopping.is_set():
            now = time.monotonic()
            if now >= w.end - self.m.margin_s:
                break
            task = self._pick(w)
            if task is None:
                self._pump(w.end - now)
                continue
            w.tried.add(task.id)
            if task.kind == "imperative":
                self._run_imperative(task, w)
            else:
                self._run_iterative(task, w)
        with self.m.lock:
            self.m.bubbles.append({"device": w.device, "window": w.id, "source": w.source,
                                   "start": self.m.rel(w.start), "end": self.m.rel(w.end),
                                   "harvested_s": w.harvested_s, "cpu_s": w.cpu_s})

    def _record_run(self, t: TaskRecord, w: Window, start: float, end: float,
                    steps: int, cpu_s: float) -> None:
        start = max(start, w.start)
        overrun = max(0.0, end - w.end)
        inside = max(0.0, min(end, w.end) - start)
        with self.m.lock:
            t.harvested_s += inside
            t.cpu_s += cpu_s
            w.harvested_s += inside
            w.cpu_s += cpu_s
            t.runs += 1
            t.max_overrun_s = max(t.max_overrun_s, overrun)
            self.m.runs.append({"task": t.id, "name": t.spec.name, "device": w.device,
                                "window": w.id, "start": self.m.rel(start),
                                "end": self.m.rel(end), "steps": steps,
                                "cpu_s": cpu_s, "overrun_s": overrun})

    def _record_iterative_run(self, t: TaskRecord, info: dict[str, Any]) -> None:
        w = self._current
        t.steps += info["steps"]
        t.progress = info["progress"]
        t.stuck_s = 0.0
        t.frozen = False
        t.state = "finished" if info["finished"] else "paused"
        if w is not None:
            self._record_run(t, w, max(info["t_start"], t.resumed_at), info["t_end"],
                             info["steps"], info["cpu_s"])

    _current: Window | None = None

    def _run_iterative(self, t: TaskRecord, w: Window) -> None:
        self._current = w
        t.evicted = False      # a run of an evicted task starts with to_device()
        t.deadline.value = w.end - self.m.margin_s
        t.resumed_at = time.monotonic()
        t.state = "running"
        if t.frozen:
            t.frozen_cell.value += t.resumed_at - t.frozen_at
            os.kill(t.proc.pid, signal.SIGCONT)
        else:
            t.conn.send(("run",))
        while t.state == "running":
            now = time.monotonic()
            if now - t.resumed_at + t.stuck_s > self.m.hang_timeout_s:
                self._kill_hung(t)
                break
            limit = w.end + self.m.overrun_limit_s
            if now >= limit:
                self._freeze(t, w)
                break
            self._pump(min(limit, t.resumed_at + self.m.hang_timeout_s - t.stuck_s) - now)
            t.deadline.value = min(t.deadline.value, w.end - self.m.margin_s)
        self._current = None

    def _freeze(self, t: TaskRecord, w: Window) -> None:
        os.kill(t.proc.pid, signal.SIGSTOP)
        # From here the task runs no more of its code (a stopped process that is still
        # waiting for the CPU stops before it executes anything): this is its end.
        now = time.monotonic()
        _wait_until_stopped(t.proc.pid)
        self._drain(t)
        if t.state != "running":      # its reply was already on the way: not stuck
            os.kill(t.proc.pid, signal.SIGCONT)
            return
        t.stuck_s += now - t.resumed_at
        t.frozen, t.frozen_at = True, now
        t.state = "paused"
        self._record_run(t, w, t.resumed_at, now, 0, 0.0)
        self.m.incident(t, "overrun", f"task {t.spec.name!r} was still in step() "
                                      f"{(now - w.end) * 1e3:.1f} ms after the bubble "
                                      f"ended: paused with SIGSTOP")

    def _kill_hung(self, t: TaskRecord) -> None:
        os.kill(t.proc.pid, signal.SIGKILL)
        with self.m.lock:
            t.state = "stopped"
            t.message = (f"task {t.spec.name!r} hung in step(): no step finished in "
                         f"{self.m.hang_timeout_s:.1f} s of bubble time; killed")
        self.m.incident(t, "hung", t.message)

    def _run_imperative(self, t: TaskRecord, w: Window) -> None:
        t.resumed_at = time.monotonic()
        cpu_before = _cpu_seconds(t.proc.pid)
        t.state = "running"
        if not t.started:
            t.conn.send(("start",))
            t.started = True
        os.kill(t.proc.pid, signal.SIGCONT)
        while t.state == "running":
            now = time.monotonic()
            deadline = w.end - self.m.margin_s
            if now >= deadline:
                os.kill(t.proc.pid, signal.SIGSTOP)
                end = time.monotonic()     # see _freeze
                _wait_until_stopped(t.proc.pid)
                t.state = "paused"
                break
            self._pump(deadline - now)
        else:
            end = time.monotonic()
        t.progress = t.progress_cell.value
        self._record_run(t, w, t.resumed_at, end, 0,
                         max(0.0, _cpu_seconds(t.proc.pid) - cpu_before))

    # --- stopping tasks -----------------------------------------------------------------
    def _stop_requested(self) -> None:
        for t in self._my_tasks():
            if (t.evict_requested and t.kind == "iterative" and t.state == "paused"
                    and not t.frozen):
                t.evict_requested = False
                t.conn.send(("evict",))
            if t.stop_requested and t.state not in FINAL_STATES and t.state != "running":
                self._stop_task(t, t.stop_requested)

    def _stop_task(self, t: TaskRecord, reason: str) -> None:
        if t.kind == "iterative" and not t.frozen and t.state == "paused":
            try:
                t.conn.send(("stop", reason))
            except OSError:
                pass
            t.proc.join(timeout=2)
        if t.proc.is_alive():
            os.kill(t.proc.pid, signal.SIGKILL)
            t.proc.join(timeout=2)
        with self.m.lock:
            t.state = "stopped"
            t.message = t.message or reason
            if t.conn is not None:
                t.conn.close()
                t.conn = None

    def run(self) -> None:
        _realtime_if_permitted()
        try:
            while not self.m.stopping.is_set():
                self._stop_requested()
                now = time.monotonic()
                self.pending.sort(key=lambda w: w.start)
                if self.pending and self.pending[0].start <= now:
                    w = self.pending.pop(0)
                    if w.end - self.m.margin_s > now:
                        self._harvest(w)
                    continue
                timeout = self.pending[0].start - now if self.pending else 0.5
                self._pump(timeout)
        finally:
            for t in self._my_tasks():
                if t.state not in FINAL_STATES:
                    self._stop_task(t, "manager shut down")
                else:
                    t.proc.join(timeout=2)


def _realtime_if_permitted() -> None:
    """Give this (worker) thread a real-time priority where the system permits it.

    The worker sleeps almost all the time; when a bubble ends it must wake at once to
    stop imperative tasks, even on a loaded machine. Without the permission it stays
    an ordinary thread (and the measured overrun shows what that costs).
    """
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
    except (AttributeError, OSError):
        pass


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _wait_until_stopped(pid: int, timeout: float = 0.05) -> None:
    """SIGSTOP is asynchronous: wait (briefly) until the kernel shows the task stopped."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat", encoding="ascii") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t", "Z", "X"):
                    return
        except OSError:
            return
        time.sleep(0.0002)


# --- the manager's own command line (`python -m collc.harvest.manager`) ----------------

def parse_size(text: str) -> int:
    """`512M`, `2GiB`, `512MB`, `1.5g`: the language's size units (`MB` = 10^6 bytes,
    `MiB` = 2^20) and nccl-tests' `K`/`M`/`G`/`T` (powers of 1024), in any case; a
    fraction of a byte is dropped. Raises ValueError on anything else."""
    try:
        return int(parse_quantity(text, SIZE, ignore_case=True, filename="<size>"))
    except CollcError as err:
        raise ValueError(f"size {text!r}: {err.message}") from None


def parse_device_arg(text: str) -> DeviceConfig:
    """"cpu:0" or "cpu:0=2GiB" (memory free for side tasks during bubbles)."""
    name, _, size = text.partition("=")
    limits.parse_device(name)
    return DeviceConfig(name, parse_size(size) if size else None)


def manager_argument_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--dir", required=True, help="runtime directory (sockets, log)")
    p.add_argument("--device", action="append", required=True, metavar="DEV[=FREE]",
                   help="a device to harvest: cpu:N (a core) or cuda:N, with the memory "
                        "free for side tasks during its bubbles")
    p.add_argument("--report", help="pipeline bubble report: bubbles ahead of time, "
                                    "placed at each step the trainer reports")
    p.add_argument("--stage", type=int, action="append", metavar="STAGE",
                   help="the report's stage for each --device, in order")
    p.add_argument("--margin-ms", type=float, default=2.0,
                   help="stop side tasks this long before a bubble's end")
    p.add_argument("--overrun-limit-ms", type=float, default=5.0,
                   help="freeze a task still in step() this long after a bubble's end")
    p.add_argument("--hang-timeout-s", type=float, default=2.0,
                   help="kill a task whose step() has run this much bubble time")
    p.add_argument("--exit-with-parent", action="store_true", help=argparse.SUPPRESS)
    return p


def build_manager(args: argparse.Namespace) -> Manager:
    devices = [parse_device_arg(d) for d in args.device]
    if args.report:
        from collc.harvest.report import load_report
        report = load_report(args.report)
        stages = args.stage or list(range(len(devices)))
        if len(stages) != len(devices):
            raise ValueError("give one --stage per --device")
        for dev, stage in zip(devices, stages):
            sb = report.stage(stage)
            dev.schedule = [(b.start_s, b.end_s) for b in sb.bubbles]
            if dev.free_bytes is None:
                dev.free_bytes = sb.min_free_bytes
    return Manager(args.dir, devices, margin_s=args.margin_ms / 1e3,
                   overrun_limit_s=args.overrun_limit_ms / 1e3,
                   hang_timeout_s=args.hang_timeout_s)


def main(argv: list[str] | None = None) -> int:
    args = manager_argument_parser(argparse.ArgumentParser(prog="collc-harvest-manager")
                                   ).parse_args(argv)
    if args.exit_with_parent:
        limits.die_with_parent(signal.SIGTERM)
    build_manager(args).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
