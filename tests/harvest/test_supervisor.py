"""A side task is its process tree: tasks that start processes, with real processes and
signals. Each test runs twice: with cgroup v2 groups where this machine lets the
manager make them, and with them forced off (process groups and supervisors only: what a
user without cgroup access gets)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

import psutil
import pytest

from collc.harvest import HarvestClient
from collc.harvest.cgroups import TaskCgroups

from harvest_support import spec, spin, task_of, train, train_until_stopped, wait_paused

# The bound: nothing of a task is left 1 s after the manager is SIGKILLed.
GONE_WITHIN_S = 1.0


@pytest.fixture(params=[True, False], ids=["cgroups-if-available", "no-cgroups"])
def cgroups(request) -> bool:
    return request.param


def _cgroups_here() -> TaskCgroups | None:
    """What the manager finds on this machine (None: no writable cgroup v2)."""
    found = TaskCgroups.create()
    if found is not None:
        found.close()
    return found




def _tree(pid: int) -> list[psutil.Process]:
    return [psutil.Process(pid)] + psutil.Process(pid).children(recursive=True)


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def _alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.append(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def _wait_for_children(pid: int, count: int, timeout_s: float = 30.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while True:
        children = psutil.Process(pid).children(recursive=True)
        if len(children) >= count or time.monotonic() > deadline:
            return children
        time.sleep(0.02)


def _harvest_until_children(m, client, task_id: int, count: int) -> list[psutil.Process]:
    """Imperative tasks start their children inside their first bubble."""
    pid = task_of(m.status(), task_id)["pid"]
    for _ in range(40):
        if len(psutil.Process(pid).children(recursive=True)) >= count:
            break
        train(client, steps=1)
    return _wait_for_children(pid, count, timeout_s=5)


def test_children_are_paused_with_their_task(start_manager, trainer_core, cgroups):
    m = start_manager(cgroups=cgroups)
    forking = m.submit(spec("ForkingSpinner"))
    pooled = m.submit(spec("PoolInToDevice"))
    wait_paused(m, forking, pooled)
    client = HarvestClient(m.dir, trainer_core)
    children = _harvest_until_children(m, client, forking, 2)
    children += _wait_for_children(task_of(m.status(), pooled)["pid"], 2)
    assert len(children) >= 4, children
    # The whole trees run in the bubbles: every child gets CPU time (a busy machine may
    # need more than a few bubbles for a pool worker's first 10 ms tick) ...
    for _ in range(40):
        train(client, steps=1)
        if all(_cpu([c]) > 0 for c in children):
            break
    assert all(_cpu([c]) > 0 for c in children)
    before = _cpu(children)
    for _ in range(5):               # ... and not during the trainer's compute
        spin(0.05)
        time.sleep(0.05)
    after = _cpu(children)
    assert after - before <= 0.02, (before, after)
    state = m.status()
    for task_id in (forking, pooled):
        task = task_of(state, task_id)
        assert task["processes"] >= 3, task
        here = _cgroups_here() if cgroups else None
        assert task["tree_enforcement"] == (
            "cgroup v2 + process group + supervisor" if here is not None
            else "process group + supervisor (subreaper)")
        assert task["memory_enforcement"] == (
            "cgroup memory.max" if here is not None and here.memory
            else "tree PSS watch + RLIMIT_AS per process")
    log = m.shutdown()
    assert not _alive([c.pid for c in children])
    assert log["devices"][trainer_core]["harvested_s"] > 0


def test_the_memory_cap_counts_the_whole_tree(start_manager, trainer_core, cgroups):
    m = start_manager(cgroups=cgroups)
    hog = m.submit(spec("TreeMemoryHog", memory_mb=64, each_mb=48))
    good = m.submit(spec("Counter"))
    wait_paused(m, good)
    client = HarvestClient(m.dir, trainer_core)
    train_until_stopped(m, client, hog, 40)
    state = m.status()
    task = task_of(state, hog)
    assert task["state"] == "stopped", task
    assert "exceeded its memory cap of 64 MiB" in task["message"], task
    assert any(i["what"] == "memory cap" and i["task"] == hog for i in state["incidents"])
    assert task_of(state, good)["state"] in ("paused", "running")     # harvesting on


def test_nothing_of_a_task_outlives_a_killed_manager(start_manager, trainer_core, cgroups):
    m = start_manager(cgroups=cgroups)
    forking = m.submit(spec("ForkingSpinner"))
    pooled = m.submit(spec("PoolInToDevice"))
    wait_paused(m, forking, pooled)
    client = HarvestClient(m.dir, trainer_core)
    _harvest_until_children(m, client, forking, 2)
    _wait_for_children(task_of(m.status(), pooled)["pid"], 2)
    train(client, steps=1)           # end inside a run: some of the tree is running
    with warnings.catch_warnings(), client.bubble("wait", expected_s=0.2):
        warnings.simplefilter("ignore")      # the manager may be gone when it ends
        time.sleep(0.05)
        # Everything the manager started: supervisors, tasks, their workers, and the
        # multiprocessing resource tracker.
        commands = {p.pid: " ".join(p.cmdline())
                    for p in psutil.Process(m.proc.pid).children(recursive=True)}
        pids = list(commands)
        killed_at = time.monotonic()
        m.proc.kill()
    m.proc.wait()
    alive = pids
    while alive and time.monotonic() - killed_at < 10:
        alive = _alive(alive)
        time.sleep(0.01)
    gone_after = time.monotonic() - killed_at
    print(f"tree of {len(pids)} processes gone {gone_after * 1e3:.0f} ms after SIGKILL")
    assert len(pids) >= 2 + 2 + 4, pids            # supervisors, tasks, their children
    # The manager's spawn context starts multiprocessing's resource tracker: it went too.
    assert any("resource_tracker" in c for c in commands.values()), commands
    assert not alive, [psutil.Process(p).cmdline() for p in alive]
    assert gone_after < GONE_WITHIN_S, gone_after


def test_a_stopped_task_takes_its_children_along(start_manager, trainer_core, cgroups):
    m = start_manager(cgroups=cgroups)
    forking = m.submit(spec("ForkingSpinner"))
    wait_paused(m, forking)
    client = HarvestClient(m.dir, trainer_core)
    children = _harvest_until_children(m, client, forking, 2)
    m.stop(forking)
    assert m.wait_for(forking, ("stopped",), timeout_s=10)["state"] == "stopped"
    deadline = time.monotonic() + 5
    while _alive([c.pid for c in children]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive([c.pid for c in children])


def test_a_child_that_leaves_the_group_is_still_ended(start_manager, trainer_core, cgroups):
    # A task whose child calls setsid() is out of reach of the group's signals; its
    # supervisor (the subreaper) still sees it and kills it when the task is stopped.
    m = start_manager(cgroups=cgroups)
    runaway = m.submit(spec("SessionLeaver"))
    wait_paused(m, runaway)
    client = HarvestClient(m.dir, trainer_core)
    children = _harvest_until_children(m, client, runaway, 1)
    assert os.getsid(children[0].pid) != os.getsid(task_of(m.status(), runaway)["pid"])
    os.kill(task_of(m.status(), runaway)["pid"], signal.SIGKILL)   # the task itself dies
    deadline = time.monotonic() + 5
    while _alive([c.pid for c in children]) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not _alive([c.pid for c in children])
    assert "killed by SIGKILL" in m.wait_for(runaway, ("stopped",), timeout_s=10)["message"]


# Run as `nobody`: no cgroup directory is writable, no real-time priority, the private
# default runtime directory in TMPDIR. Prints what it saw as JSON.
AS_NOBODY = r"""
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from harvest_support import spec, train, wait_paused, DEVICE
from collc.harvest import HarvestClient, ManagerHandle
m = ManagerHandle.start(None, [DEVICE + "=1G"])
out = {"dir": str(m.dir), "mode": oct(os.stat(m.dir).st_mode & 0o777)}
try:
    task = m.submit(spec("ForkingSpinner"))
    wait_paused(m, task)
    client = HarvestClient(None, DEVICE)
    import psutil
    pid = next(t for t in m.status()["tasks"] if t["id"] == task)["pid"]
    for _ in range(40):
        if len(psutil.Process(pid).children()) >= 2:
            break
        train(client, steps=1)
    # The manager counts the tree when it next reads its memory (every 100 ms): wait for it.
    waited = time.monotonic() + 10
    while True:
        t = next(t for t in m.status()["tasks"] if t["id"] == task)
        if t["processes"] >= 3 or time.monotonic() > waited:
            break
        time.sleep(0.05)
    out.update(tree=t["tree_enforcement"], memory=t["memory_enforcement"],
               processes=t["processes"])
    pids = [p.pid for p in psutil.Process(m.proc.pid).children(recursive=True)]
    killed = time.monotonic()
    m.proc.kill()
    m.proc.wait()
    def running(p):
        # A process can exit between any two looks at it: gone is not running.
        try:
            return psutil.Process(p).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
    alive = pids
    while alive and time.monotonic() - killed < 10:
        alive = [p for p in alive if running(p)]
        time.sleep(0.01)
    out.update(pids=len(pids), alive=len(alive), gone_s=time.monotonic() - killed)
finally:
    if m.proc.poll() is None:
        m.shutdown()
print(json.dumps(out))
"""


def _python_for_nobody(as_nobody: dict) -> tuple[str, str | None]:
    """An interpreter `nobody` can run with this environment's packages: this one, else
    the system's of the same version with this environment's paths (a virtual
    environment under root's home is out of nobody's reach)."""
    repo = str(Path(__file__).resolve().parents[2])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [(sys.executable, None)]
    system = shutil.which(version, path="/usr/local/bin:/usr/bin")
    if system:
        candidates.append((system, os.pathsep.join(site.getsitepackages() + [repo])))
    for python, path in candidates:
        env = dict(os.environ, PYTHONPATH=path) if path else None
        try:
            subprocess.run([python, "-c", "import collc.harvest, numpy, psutil"], cwd="/",
                           env=env, check=True, capture_output=True, timeout=60,
                           **as_nobody)
            return python, path
        except (OSError, subprocess.CalledProcessError):
            continue
    pytest.skip("no interpreter with this environment that nobody can run; the forced "
                "no-cgroups runs above cover the fallback")


def test_a_user_without_cgroup_access_gets_the_fallback(tmp_path):
    nobody = pwd.getpwnam("nobody")
    as_nobody = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
    python, path = _python_for_nobody(as_nobody)
    home = Path(tempfile.mkdtemp(prefix="collc-harvest-nobody-"))
    os.chown(home, nobody.pw_uid, nobody.pw_gid)
    try:
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        env["TMPDIR"] = str(home)
        if path:
            env["PYTHONPATH"] = path
        here = Path(__file__).resolve().parent
        run = subprocess.run([python, "-c", AS_NOBODY, str(here)], cwd=home,
                             env=env, capture_output=True, text=True, timeout=300,
                             **as_nobody)
        assert run.returncode == 0, run.stderr
        seen = json.loads(run.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(home, ignore_errors=True)
    assert seen["dir"] == str(home / f"collc-harvest-{nobody.pw_uid}")
    assert seen["mode"] == "0o700"
    assert seen["tree"] == "process group + supervisor (subreaper)"
    assert seen["memory"] == "tree PSS watch + RLIMIT_AS per process"
    assert seen["processes"] >= 3
    assert seen["pids"] >= 4 and seen["alive"] == 0, seen
    assert seen["gone_s"] < GONE_WITHIN_S, seen
