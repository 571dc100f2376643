"""A side task's supervisor: the small process between the manager and the task.

Why a supervisor (docs/harvest.md, "A task is its process tree"): nothing of a task may
outlive the manager, however the manager dies. SIGKILL leaves the manager no last word,
so something else has to act, and it has to be a process the kernel tells:
- PR_SET_PDEATHSIG reaches only a direct child, and the kernel clears it in that child's
  own children, so the task's workers never get it;
- `cgroup.kill` kills a whole tree but needs someone alive to write it, and a cgroup is
  not available to every user;
- PR_SET_CHILD_SUBREAPER on the manager dies with the manager.
So each task gets a supervisor that holds PDEATHSIG (SIGTERM) from the manager and is the
child subreaper of its task: every descendant of the task, orphaned or not, stays below
it. When the manager dies the supervisor kills the task's process group, every
descendant it can see, and the task's cgroup where there is one (`cgroup.kill`), reaps
them, and exits. It is never in the task's process group, so pausing the task (SIGSTOP
to the group) does not pause it. When the task itself ends, it does the same to what the
task left behind and exits with the task's status (dying by the same signal), so the
manager reads the task's fate from the supervisor's exit code.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from pathlib import Path
from typing import Any

from collc.harvest import cgroups, limits, proctree
from collc.harvest.taskproc import task_main

_PR_SET_CHILD_SUBREAPER = 36
EXIT_MANAGER_GONE = 4


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "PR_SET_CHILD_SUBREAPER failed")


def kill_tree(task_pid: int, group: Path | None) -> None:
    """SIGKILL the task's process group, its cgroup and every descendant of the caller
    (the supervisor, which is their subreaper)."""
    if group is not None:
        cgroups.kill(group)
    try:
        os.killpg(task_pid, signal.SIGKILL)
    except OSError:
        pass
    for pid in proctree.descendants(os.getpid()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _reap_all(task_pid: int, group: Path | None) -> int | None:
    """Kill and reap every descendant; returns the task's wait status if reaped here."""
    status = None
    while True:
        kill_tree(task_pid, group)
        try:
            pid, st = os.waitpid(-1, 0)
        except ChildProcessError:
            return status
        if pid == task_pid:
            status = st


def _exit_like(status: int) -> None:
    """Exit as the task did: the same exit code, or death by the same signal."""
    sys.stdout.flush()
    sys.stderr.flush()
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig not in (signal.SIGKILL, signal.SIGSTOP):   # those cannot be handled
            signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if not os.WIFSIGNALED(status) else 1)


def supervise(manager_pid: int, group: str | None, task_args: tuple[Any, ...]) -> None:
    """Entry point of a supervisor process (multiprocessing 'spawn' target): start the
    task in its own process group (and cgroup), watch it, and end its whole tree."""
    cgroup = Path(group) if group else None
    # The manager's death arrives as SIGTERM, which this process can act on (SIGKILL
    # could not be acted on); checked after setting it, in case the manager died first.
    limits.die_with_parent(signal.SIGTERM)
    _become_subreaper()
    stopping: list[int] = []

    def on_term(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        if task_pid:
            kill_tree(task_pid, cgroup)

    task_pid = 0
    signal.signal(signal.SIGTERM, on_term)
    if os.getppid() != manager_pid:
        os._exit(EXIT_MANAGER_GONE)
    task_pid = os.fork()
    if task_pid == 0:
        _task_child(cgroup, task_args)
    try:
        os.setpgid(task_pid, task_pid)    # also done in the child: whichever runs first
    except OSError:
        pass
    if stopping:                          # SIGTERM came while forking
        kill_tree(task_pid, cgroup)
    _close_task_ends(task_args)
    try:
        _, status = os.waitpid(task_pid, 0)
    except ChildProcessError:
        status = 0
    if stopping:
        status = status if os.WIFSIGNALED(status) else (signal.SIGKILL & 0x7f)
    _reap_all(task_pid, cgroup)
    _exit_like(status)


def _task_child(cgroup: Path | None, task_args: tuple[Any, ...]) -> None:
    code = 0
    try:
        os.setpgid(0, 0)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if cgroup is not None:
            cgroups.join(cgroup)
        task_main(*task_args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001 (task_main reports its own failures)
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _close_task_ends(task_args: tuple[Any, ...]) -> None:
    """The supervisor keeps no copy of the task's pipe: the manager must see EOF when
    the task dies, not when the supervisor does."""
    for arg in task_args:
        close = getattr(arg, "close", None)
        if close is not None and hasattr(arg, "recv"):
            close()
