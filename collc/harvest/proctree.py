"""A side task's process tree, read from /proc: its members, memory, CPU time, state.

A side task is every process it starts (DataLoader workers, a multiprocessing pool, a
shell-out), not only its first process. The runtime finds them from the task's
supervisor (see supervisor.py), which is a child subreaper: every descendant of the task,
even one whose parent has exited, stays below the supervisor. So the tree is the
supervisor's descendants, the supervisor left out; a cgroup's member list, where the
runtime has one, is the same set read in one file.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_PAGE = os.sysconf("SC_PAGE_SIZE")
_TICK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is [0], ppid [1],
    pgrp [2], utime [11], stime [12]); None once the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[int]:
    """Every live descendant of `root` (not `root` itself).

    /proc/PID/task/TID/children needs CONFIG_PROC_CHILDREN, which many kernels lack, so
    the parent links are read from every /proc/PID/stat: a few ms on a busy machine.
    """
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        fields = _stat_fields(int(entry.name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: list[int] = []
    stack = [root]
    while stack:
        for child in children.get(stack.pop(), ()):
            found.append(child)
            stack.append(child)
    return found


def memory_bytes(pids: list[int]) -> int:
    """The processes' memory together: the sum of their proportional set sizes (PSS).

    PSS, not RSS: a forked worker shares its parent's pages until it writes them, and
    RSS would count each shared page once per process.
    """
    return sum(process_memory_bytes(pid) for pid in pids)


def process_memory_bytes(pid: int) -> int:
    """PSS of one process (smaps_rollup), else its RSS; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    try:
        with open(f"/proc/{pid}/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time the processes have used so far (gone ones count 0)."""
    total = 0
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None:
            total += int(fields[11]) + int(fields[12])
    return total / _TICK


def all_stopped(pids: list[int]) -> bool:
    """Whether every process is stopped (or gone, or a zombie)."""
    for pid in pids:
        fields = _stat_fields(pid)
        if fields is not None and fields[0] not in ("T", "t", "Z", "X"):
            return False
    return True


def wait_until_stopped(pids: list[int], timeout: float = 0.05) -> None:
    """SIGSTOP is asynchronous: wait (briefly) until the kernel shows all stopped."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not all_stopped(pids):
        time.sleep(0.0002)


def cgroup_members(cgroup: Path) -> list[int]:
    """The processes of a cgroup v2 group (empty once it is gone)."""
    try:
        return [int(line) for line in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []
