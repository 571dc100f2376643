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
- A side task is its process tree: each task runs under a supervisor (supervisor.py)
  in a process group of its own (and a cgroup v2 group where the manager can make one).
  Pausing, resuming and killing act on the group; the memory cap counts the whole tree
  (cgroup memory.max, else the tree's PSS watched at bubble boundaries and on a short
  timer); the supervisor ends the tree when the manager dies, even by kill -9.
- Supervisors are spawned from the main thread only: the kernel's parent-death signal
  follows the thread that forked the child.
- The runtime directory is private and held by one manager at a time (rundir.py);
  trainer events are taken only from the manager's own user (SO_PASSCRED) and only
  with sane times.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import queue
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, Listener, wait
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError
from collc.harvest import cgroups, limits, proctree, protocol, rundir
from collc.harvest.cgroups import TaskCgroups
from collc.harvest.manager_args import DEFAULT_MAX_BUBBLE_S, manager_argument_parser
from collc.harvest.supervisor import supervise
from collc.harvest.tasks import TaskSpec
from collc.units import SIZE, parse_quantity

FINAL_STATES = ("finished", "stopped")
# How often the tree's memory is read while no cgroup caps it (and at each run's end).
MEMORY_POLL_S = 0.1
# Trainer event times further than this from the manager's clock are not believed: an
# event waits in the socket at most while a bubble is harvested.
EVENT_SKEW_S = 60.0
_CRED = "iII"                      # struct ucred: pid, uid, gid


@dataclass
class DeviceConfig:
    name: str                        # "cpu:0" / "cuda:1"
    free_bytes: int | None = None    # memory free for side tasks during bubbles
    schedule: list[tuple[float, float]] = field(default_factory=list)  # (start, end) s
    step_s: float | None = None      # the report's step: no bubble is longer


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
    pid: int | None = None           # the task's process: leader of its process group
    baseline_bytes: int = 0          # its memory before the task was built
    cgroup: Path | None = None       # its cgroup v2 group, where the manager made one
    memory_limit_by: str = ""        # how its memory cap is enforced (shown by status)
    tree_by: str = ""                # how its process tree is held together
    members: list[int] = field(default_factory=list)  # its processes, last looked at
    memory_seen_bytes: int = 0       # the tree's memory, last looked at
    held: bool = False               # iterative: its tree SIGSTOPped between runs
    pipe_closed: bool = False        # the task's process is gone; its supervisor may not be

    @property
    def tree_cap_bytes(self) -> int:
        return self.baseline_bytes + self.spec.memory_bytes

    def summary(self, t0: float) -> dict[str, Any]:
        return {"id": self.id, "name": self.spec.name, "device": self.device,
                "state": self.state, "kind": self.kind, "priority": self.spec.priority,
                "memory_bytes": self.spec.memory_bytes, "harvested_s": self.harvested_s,
                "cpu_s": self.cpu_s,
                "steps": self.steps, "runs": self.runs, "progress": self.progress,
                "progress_unit": self.progress_unit, "max_overrun_s": self.max_overrun_s,
                "pid": self.pid,
                "supervisor_pid": self.proc.pid if self.proc is not None else None,
                "processes": len(self.members), "memory_seen_bytes": self.memory_seen_bytes,
                "memory_enforcement": self.memory_limit_by, "tree_enforcement": self.tree_by,
                "message": self.message}


class Manager:
    def __init__(self, runtime_dir: str | Path, devices: list[DeviceConfig], *,
                 margin_s: float = 0.002, overrun_limit_s: float = 0.005,
                 hang_timeout_s: float = 2.0, use_cgroups: bool = True,
                 max_bubble_s: float = DEFAULT_MAX_BUBBLE_S):
        self.dir = Path(runtime_dir) if runtime_dir is not None else \
            rundir.default_runtime_dir()
        self.use_cgroups = use_cgroups
        self.cgroups: TaskCgroups | None = None
        self.max_bubble_s = max_bubble_s
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
        parent, child = self._mp.Pipe()
        record.deadline = self._mp.RawValue("d", 0.0)
        record.progress_cell = self._mp.RawValue("d", 0.0)
        record.frozen_cell = self._mp.RawValue("d", 0.0)
        group = (self.cgroups.task_group(record.id, record.spec.memory_bytes)
                 if self.cgroups is not None else None)
        record.cgroup = group
        record.tree_by = ("cgroup v2 + process group + supervisor" if group is not None
                          else "process group + supervisor (subreaper)")
        record.memory_limit_by = ("cgroup memory.max" if group is not None
                                  and self.cgroups is not None and self.cgroups.memory
                                  else "tree PSS watch + RLIMIT_AS per process")
        if limits.parse_device(record.device)[0] == "cuda":
            record.memory_limit_by += " + CuPy pool limit / MPS"
        task_args = (record.spec.to_json(), record.device, child, record.deadline,
                     record.progress_cell, record.frozen_cell)
        proc = self._mp.Process(target=supervise, name=f"harvest-task-{record.id}",
                                args=(os.getpid(), str(group) if group else None,
                                      task_args))
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
                    "events_rejected": dict(self.workers[name].rejected),
                }
            return {"uptime_s": self.rel(time.monotonic()), "margin_s": self.margin_s,
                    "runtime_dir": str(self.dir), "max_bubble_s": self.max_bubble_s,
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
        """Serve until shut down. rundir.RuntimeDirError if the directory is unsafe or
        another manager serves there (nothing in it is touched then)."""
        self.dir = rundir.prepare_dir(self.dir)
        lock_fd = rundir.acquire_lock(self.dir)   # held until this process exits
        os.environ.update(limits.single_threaded_math_env())
        address = protocol.control_socket(self.dir)
        for path in [address, self.dir / protocol.READY] + [
                protocol.events_socket(self.dir, d) for d in self.devices]:
            if path.name == protocol.READY:
                _remove_own_file(path)
            else:
                rundir.remove_stale_socket(path)
        key = protocol.make_authkey(self.dir)
        for worker in self.workers.values():
            worker.bind()
        listener = Listener(str(address), family="AF_UNIX", authkey=key)
        rundir.make_socket_private(address)
        if self.use_cgroups:
            self.cgroups = TaskCgroups.create()
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()
        for worker in self.workers.values():
            worker.start()
        # Clients wait for this file: the socket file exists a moment before it listens.
        rundir.write_private_file(self.dir / protocol.READY, str(os.getpid()).encode())
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
        if self.cgroups is not None:
            self.cgroups.close()
        _remove_own_file(self.dir / protocol.LOG)   # atomic_write replaces regular files only
        from collc.io import atomic_write
        atomic_write(self.dir / protocol.LOG, json.dumps(self.full_log(), indent=1),
                     mode=0o600)
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
        os.close(lock_fd)

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
        # Events not acted on: from another user, or with times that cannot be true.
        self.rejected = {"sender": 0, "invalid": 0}
        self._next_memory_check = 0.0
        self._max_step_s = config.step_s or 0.0

    # --- events ---------------------------------------------------------------------
    def bind(self) -> None:
        """Bind the device's event socket (a stale one was removed by serve()), only
        its user may send to it; the kernel attaches each sender's credentials."""
        path = protocol.events_socket(self.m.dir, self.config.name)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self.sock.bind(str(path))
        rundir.make_socket_private(path)
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
                data, ancillary, _, _ = self.sock.recvmsg(
                    65536, socket.CMSG_SPACE(struct.calcsize(_CRED)))
            except BlockingIOError:
                return
            if _sender_uid(ancillary) != os.geteuid():
                self.rejected["sender"] += 1
                continue
            event = protocol.decode_event(data)
            if event is None:
                continue
            if not self._believable(event):
                self.rejected["invalid"] += 1
                continue
            kind, t = event["ev"], float(event.get("t", time.monotonic()))
            if kind == "bubble" and "end" in event:
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

    def _believable(self, event: dict[str, Any]) -> bool:
        """Times a trainer can have sent: finite, near now, a bubble of positive length
        no longer than a step (the report's step, else max_bubble_s)."""
        now = time.monotonic()
        t = event.get("t", now)
        if not math.isfinite(t) or abs(t - now) > EVENT_SKEW_S:
            return False
        if event["ev"] != "bubble":
            return True
        end = event.get("end")
        longest = self._max_step_s or self.m.max_bubble_s
        return (end is not None and math.isfinite(end) and 0.0 < end - t <= longest)

    # --- waiting on everything --------------------------------------------------------
    def _my_tasks(self) -> list[TaskRecord]:
        with self.m.lock:
            return [t for t in self.m.tasks.values()
                    if t.device == self.config.name and t.proc is not None
                    and t.conn is not None]

    def _pump(self, timeout: float) -> None:
        """Wait up to `timeout` s for an event or a task message, and handle what came;
        every MEMORY_POLL_S, look at the tasks' trees."""
        tasks = self._my_tasks()
        waitables: list[Any] = [self.sock]
        for t in tasks:
            # A closed pipe is always readable: waiting on it would spin (at real-time
            # priority) until the supervisor has reaped the tree and exited.
            waitables += [t.proc.sentinel] if t.pipe_closed else [t.conn, t.proc.sentinel]
        now = time.monotonic()
        if now >= self._next_memory_check:
            # Stopped trees do not grow; the one running now and those still being
            # built (to_device) may.
            self._next_memory_check = now + MEMORY_POLL_S
            for t in tasks:
                if not t.held and not (t.kind == "imperative" and t.state == "paused"):
                    self._check_tree(t)
        timeout = min(timeout, self._next_memory_check - now)
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
            while not t.pipe_closed and t.conn.poll():
                kind, info = t.conn.recv()
                self._message(t, kind, info)
        except (EOFError, OSError):
            t.pipe_closed = True

    def _message(self, t: TaskRecord, kind: str, info: dict[str, Any]) -> None:
        with self.m.lock:
            if kind == "created":
                t.state, t.kind, t.progress_unit = "created", info["kind"], info["progress_unit"]
                t.pid, t.baseline_bytes = info["pid"], info["baseline_bytes"]
                t.members = [t.pid]
            elif kind == "paused":
                if t.kind == "imperative":
                    self._signal_tree(t, signal.SIGSTOP)
                else:
                    self._hold(t)
                t.state = "paused"
            elif kind == "ran":
                self._record_iterative_run(t, info)
                if not info["finished"]:
                    self._hold(t)
            elif kind == "evicted":
                t.state, t.evicted = "created", True
                self._hold(t)
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
        oom = t.cgroup is not None and cgroups.oom_kills(t.cgroup) > 0
        if t.cgroup is not None and self.m.cgroups is not None:
            self.m.cgroups.remove(t.cgroup)
        with self.m.lock:
            t.members = []
            if t.state not in FINAL_STATES:
                t.state = "stopped"
                if oom:
                    t.message = (f"task {t.spec.name!r} exceeded its memory cap of "
                                 f"{t.spec.memory_bytes / 2**20:.0f} MiB (cgroup "
                                 "memory.max): its processes were killed")
                    self.m.incident(t, "memory cap", t.message)
                elif code is not None and code < 0:
                    t.message = (f"task {t.spec.name!r} was killed by "
                                 f"{signal.Signals(-code).name}")
                else:
                    t.message = f"task {t.spec.name!r} exited with status {code}"
                if not oom:
                    self.m.incident(t, "died", t.message)
            t.conn.close()
            t.conn = None

    # --- the task's process tree -------------------------------------------------------
    def _signal_tree(self, t: TaskRecord, sig: int) -> None:
        """Signal the task's process group: the task and every worker it started."""
        if t.pid is None:
            return
        try:
            os.killpg(t.pid, sig)
        except ProcessLookupError:
            pass

    def _hold(self, t: TaskRecord) -> None:
        """Stop the whole tree between runs: an iterative task's process waits for the
        next command, but the workers it started would go on computing."""
        self._signal_tree(t, signal.SIGSTOP)
        t.held = True

    def _send(self, t: TaskRecord, command: tuple[Any, ...]) -> None:
        """A command to the task's process, which must be running to read it."""
        if t.held:
            self._signal_tree(t, signal.SIGCONT)
            t.held = False
        assert t.conn is not None
        t.conn.send(command)

    def _refresh_members(self, t: TaskRecord) -> list[int]:
        """The task's processes now: its cgroup's members, else the supervisor's
        descendants (it is their subreaper, so orphans stay among them)."""
        if t.cgroup is not None:
            members = proctree.cgroup_members(t.cgroup)
        else:
            members = proctree.descendants(t.proc.pid)
        t.members = members
        return members

    def _check_tree(self, t: TaskRecord) -> None:
        """Look at the tree; stop the task if it is past its memory cap (where a cgroup
        enforces memory.max the kernel does it, and this only records the size)."""
        if t.state in FINAL_STATES or t.pid is None:
            return
        members = self._refresh_members(t)
        if t.cgroup is not None and self.m.cgroups is not None and self.m.cgroups.memory:
            t.memory_seen_bytes = cgroups.memory_current(t.cgroup) or 0
            return
        t.memory_seen_bytes = proctree.memory_bytes(members)
        if t.memory_seen_bytes > t.tree_cap_bytes:
            message = (f"task {t.spec.name!r} exceeded its memory cap of "
                       f"{t.spec.memory_bytes / 2**20:.0f} MiB: its {len(members)} "
                       f"processes held {t.memory_seen_bytes / 2**20:.0f} MiB "
                       f"(cap {t.tree_cap_bytes / 2**20:.0f} MiB with the interpreter)")
            with self.m.lock:
                t.state, t.message = "stopped", message
            self._kill_tree(t)
            self.m.incident(t, "memory cap", message)

    def _kill_tree(self, t: TaskRecord) -> None:
        """SIGKILL the task's group (and cgroup) now; its supervisor then reaps what is
        left, kills any descendant that left the group, and exits."""
        if t.cgroup is not None:
            cgroups.kill(t.cgroup)
        if t.pid is not None:
            self._signal_tree(t, signal.SIGKILL)
        try:
            os.kill(t.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

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
        runs_before = t.runs
        if t.frozen:
            t.frozen_cell.value += t.resumed_at - t.frozen_at
            self._signal_tree(t, signal.SIGCONT)
            t.held = False
        else:
            self._send(t, ("run",))
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
        if t.runs == runs_before:
            # It died or was stopped for its memory during the run: it held the device.
            self._record_run(t, w, t.resumed_at, time.monotonic(), 0, 0.0)
        else:
            self._check_tree(t)         # at the run's end: a bubble boundary
        self._current = None

    def _freeze(self, t: TaskRecord, w: Window) -> None:
        self._signal_tree(t, signal.SIGSTOP)
        # From here the task runs no more of its code (a stopped process that is still
        # waiting for the CPU stops before it executes anything): this is its end.
        now = time.monotonic()
        proctree.wait_until_stopped(t.members)
        self._drain(t)
        if t.state != "running":      # its reply was already on the way: not stuck
            if not t.held:            # (a paused task's tree stays stopped: _hold)
                self._signal_tree(t, signal.SIGCONT)
            return
        t.stuck_s += now - t.resumed_at
        t.frozen, t.frozen_at = True, now
        t.state = "paused"
        self._record_run(t, w, t.resumed_at, now, 0, 0.0)
        self.m.incident(t, "overrun", f"task {t.spec.name!r} was still in step() "
                                      f"{(now - w.end) * 1e3:.1f} ms after the bubble "
                                      f"ended: paused with SIGSTOP")

    def _kill_hung(self, t: TaskRecord) -> None:
        with self.m.lock:
            t.state = "stopped"
            t.message = (f"task {t.spec.name!r} hung in step(): no step finished in "
                         f"{self.m.hang_timeout_s:.1f} s of bubble time; killed")
        self._kill_tree(t)
        self.m.incident(t, "hung", t.message)

    def _run_imperative(self, t: TaskRecord, w: Window) -> None:
        t.resumed_at = time.monotonic()
        cpu_before = proctree.cpu_seconds(t.members)
        t.state = "running"
        if not t.started:
            t.conn.send(("start",))
            t.started = True
        self._signal_tree(t, signal.SIGCONT)
        while t.state == "running":
            now = time.monotonic()
            deadline = w.end - self.m.margin_s
            if now >= deadline:
                self._signal_tree(t, signal.SIGSTOP)
                end = time.monotonic()     # see _freeze
                proctree.wait_until_stopped(t.members)
                t.state = "paused"
                break
            self._pump(deadline - now)
        else:
            end = time.monotonic()
        t.progress = t.progress_cell.value
        # The CPU time of the processes it had when the run started (a worker started
        # during the run is counted from the next run on).
        cpu_after = proctree.cpu_seconds(t.members)
        self._record_run(t, w, t.resumed_at, end, 0, max(0.0, cpu_after - cpu_before))
        self._check_tree(t)                # at the run's end: a bubble boundary

    # --- stopping tasks -----------------------------------------------------------------
    def _stop_requested(self) -> None:
        for t in self._my_tasks():
            if (t.evict_requested and t.kind == "iterative" and t.state == "paused"
                    and not t.frozen):
                t.evict_requested = False
                self._send(t, ("evict",))
            if t.stop_requested and t.state not in FINAL_STATES and t.state != "running":
                self._stop_task(t, t.stop_requested)

    def _stop_task(self, t: TaskRecord, reason: str) -> None:
        if t.kind == "iterative" and not t.frozen and t.state == "paused":
            try:
                self._send(t, ("stop", reason))
            except OSError:
                pass
            t.proc.join(timeout=2)
        if t.proc.is_alive():
            self._kill_tree(t)
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


def _sender_uid(ancillary: list[tuple[int, int, bytes]]) -> int | None:
    """The sending process's uid from SCM_CREDENTIALS (None if it did not come)."""
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS \
                and len(data) >= struct.calcsize(_CRED):
            return struct.unpack(_CRED, data[:struct.calcsize(_CRED)])[1]
    return None


def _remove_own_file(path: Path) -> None:
    """Remove a file or symlink the manager will write anew (never following it)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if st.st_uid != os.geteuid():
        raise rundir.RuntimeDirError(f"{path} belongs to uid {st.st_uid}, not to you")
    os.unlink(path)


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
            dev.step_s = report.step_s
            if dev.free_bytes is None:
                dev.free_bytes = sb.min_free_bytes
    return Manager(args.dir, devices, margin_s=args.margin_ms / 1e3,
                   overrun_limit_s=args.overrun_limit_ms / 1e3,
                   hang_timeout_s=args.hang_timeout_s, use_cgroups=args.cgroups,
                   max_bubble_s=args.max_bubble_s)


def main(argv: list[str] | None = None) -> int:
    args = manager_argument_parser(argparse.ArgumentParser(prog="collc-harvest-manager")
                                   ).parse_args(argv)
    if args.exit_with_parent:
        limits.die_with_parent(signal.SIGTERM)
    try:
        build_manager(args).serve()
    except rundir.RuntimeDirError as exc:
        sys.stderr.write(f"collc harvest: error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
