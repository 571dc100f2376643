"""cgroup v2 groups for side tasks, where the manager may create them.

A group per task puts its whole tree under one name the kernel keeps up to date: a
process that leaves the task's process group (setsid, a double fork) is still a member,
`cgroup.kill` ends all members at once, and `memory.max` caps their memory together.
This needs a writable cgroup v2 directory: the manager's own group when it is root (or
the hierarchy's root), or a subtree delegated to the user (systemd's user slice). Where
there is none (a non-root user without delegation, a hybrid v1 hierarchy) the runtime
does the same with process groups, its supervisors and a memory watch (manager.py), and
`collc harvest status` says which is in force for each task.

Layout: `<manager's group>/collc-harvest-<manager pid>/task-<id>`. The kernel refuses to
enable a controller for the children of a group that has member processes (the "no
internal processes" rule), so the memory controller is used only where the manager's
group can delegate it; otherwise the groups still give kill and membership.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

MEMORY = "memory"


def _cgroup2_mount() -> Path | None:
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                if right.split()[:1] == ["cgroup2"]:
                    return Path(left.split()[4])
    except OSError:
        pass
    return None


def _own_cgroup() -> str | None:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as f:
            for line in f:
                if line.startswith("0::"):
                    return line[3:].strip()
    except OSError:
        pass
    return None


def _write(path: Path, text: str) -> None:
    with open(path, "w", encoding="ascii") as f:
        f.write(text)


class TaskCgroups:
    """The manager's cgroup v2 directory and one group per task inside it."""

    def __init__(self, root: Path, memory: bool):
        self.root = root
        self.memory = memory           # memory.max is available in the task groups

    @classmethod
    def create(cls) -> "TaskCgroups | None":
        """Make the manager's directory, or None where cgroups cannot be used."""
        mount, own = _cgroup2_mount(), _own_cgroup()
        if mount is None or own is None:
            return None
        parent = mount / own.lstrip("/")
        if not os.access(parent, os.W_OK):
            return None
        _remove_stale(parent)
        root = parent / f"collc-harvest-{os.getpid()}"
        try:
            root.mkdir(mode=0o755)
            # Probe: can a process be moved in here? (Not where the group is not ours.)
            if not os.access(root / "cgroup.procs", os.W_OK) or not (root / "cgroup.kill"
                                                                     ).exists():
                root.rmdir()
                return None
        except OSError:
            return None
        return cls(root, _enable_memory(parent, root))

    def task_group(self, task_id: int, memory_max: int) -> Path | None:
        """The group for a task (memory.max set where available); None if it fails."""
        group = self.root / f"task-{task_id}"
        try:
            group.mkdir(mode=0o755)
            if self.memory:
                _write(group / "memory.max", str(int(memory_max)))
                # Past the cap the kernel kills the whole group, not one worker: a task
                # that lost a worker would go on half-alive.
                _write(group / "memory.oom.group", "1")
                try:
                    _write(group / "memory.swap.max", "0")
                except OSError:
                    pass                 # no swap accounting: the cap is memory alone
        except OSError:
            return None
        return group

    def remove(self, group: Path) -> None:
        """Kill what is left in a task's group and remove it."""
        kill(group)
        for _ in range(200):                     # members leave once they are reaped
            try:
                group.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.005)

    def close(self) -> None:
        for group in self.root.glob("task-*"):
            self.remove(group)
        try:
            self.root.rmdir()
        except OSError:
            pass


def kill(group: Path) -> None:
    """SIGKILL every member of the group (cgroup.kill, Linux 5.14+)."""
    try:
        _write(group / "cgroup.kill", "1")
    except OSError:
        pass


def join(group: Path) -> None:
    """Move the calling process into the group."""
    _write(group / "cgroup.procs", "0")


def oom_kills(group: Path) -> int:
    """How many members the kernel killed for exceeding memory.max."""
    try:
        for line in (group / "memory.events").read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def memory_current(group: Path) -> int | None:
    try:
        return int((group / "memory.current").read_text())
    except (OSError, ValueError):
        return None


def _enable_memory(parent: Path, root: Path) -> bool:
    """Delegate the memory controller down to the task groups, where the kernel lets us."""
    try:
        if MEMORY not in (parent / "cgroup.controllers").read_text().split():
            return False
        if MEMORY not in (parent / "cgroup.subtree_control").read_text().split():
            _write(parent / "cgroup.subtree_control", f"+{MEMORY}")
        _write(root / "cgroup.subtree_control", f"+{MEMORY}")
        return MEMORY in (root / "cgroup.subtree_control").read_text().split()
    except OSError:
        return False


def _remove_stale(parent: Path) -> None:
    """Empty directories of managers that died without cleaning up (SIGKILL)."""
    for old in parent.glob("collc-harvest-*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            for group in old.glob("task-*"):
                kill(group)
                try:
                    group.rmdir()
                except OSError:
                    pass
            try:
                old.rmdir()
            except OSError:
                pass
