"""The runtime directory is the user's alone: planted symlinks, other owners, loose
modes, replaced sockets and a second manager, with real managers (`collc harvest serve`)."""

from __future__ import annotations

import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from collc.harvest import ManagerError, ManagerHandle, rundir

DEVICE = "cpu:0=1G"


def _nobody() -> pwd.struct_passwd:
    return pwd.getpwnam("nobody")


def _serve(rt: Path, cwd: Path, **popen: object) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "collc", "harvest", "serve", "--dir",
                             str(rt), "--device", DEVICE], cwd=cwd, text=True,
                            stderr=subprocess.PIPE, **popen)


def _serving(rt: Path, server: subprocess.Popen, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not (rt / "ready").exists() or (rt / "ready").read_text() != str(server.pid):
        assert server.poll() is None, server.stderr.read()
        assert time.monotonic() < deadline, "the manager did not start"
        time.sleep(0.05)


def _refused(rt: Path, cwd: Path) -> str:
    """Run `serve` where it must refuse: exit 1, and its message."""
    server = _serve(rt, cwd)
    try:
        _, err = server.communicate(timeout=60)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 1, err
    assert "Traceback" not in err
    return err


def _stop(rt: Path, server: subprocess.Popen) -> None:
    try:
        ManagerHandle(rt).shutdown()
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait(timeout=30)


# --- the default and the checks --------------------------------------------------------

def test_default_directory_is_private(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "xdg"))
    assert rundir.default_runtime_dir() == tmp_path / "xdg" / "collc-harvest"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)     # re-read TMPDIR
    default = rundir.default_runtime_dir()
    assert default == tmp_path / f"collc-harvest-{os.geteuid()}"
    old = os.umask(0)                    # even with a permissive umask
    try:
        assert rundir.prepare_dir(None) == default
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.lstat(default).st_mode) == 0o700


def test_a_directory_of_another_owner_is_refused(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    os.chown(rt, _nobody().pw_uid, _nobody().pw_gid)
    err = _refused(rt, tmp_path)
    assert f"runtime directory {rt} belongs to uid {_nobody().pw_uid}, not to you" in err
    assert os.listdir(rt) == []                       # nothing written there


def test_a_world_writable_directory_is_refused(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir()
    os.chmod(rt, 0o777)
    err = _refused(rt, tmp_path)
    assert "is writable by others (mode 0777)" in err
    assert os.listdir(rt) == []
    os.chmod(rt, 0o775)
    assert "writable by its group" in _refused(rt, tmp_path)


def test_a_symlinked_directory_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "rt").symlink_to(real)
    assert "is a symlink" in _refused(tmp_path / "rt", tmp_path)


def test_a_missing_directory_is_made_private(tmp_path):
    old = os.umask(0)
    try:
        handle = ManagerHandle.start(tmp_path / "new" / "rt", [DEVICE])
    finally:
        os.umask(old)
    try:
        rt = tmp_path / "new" / "rt"
        assert stat.S_IMODE(os.lstat(rt).st_mode) == 0o700
        for name in ("control.sock", "events-cpu0.sock", "authkey", "ready", "lock"):
            mode = os.lstat(rt / name).st_mode
            assert stat.S_IMODE(mode) == 0o600, (name, oct(mode))
        assert stat.S_ISSOCK(os.lstat(rt / "control.sock").st_mode)
        assert handle.status()["runtime_dir"] == str(rt)
    finally:
        handle.shutdown()
    assert stat.S_IMODE(os.lstat(rt / "harvest-log.json").st_mode) == 0o600


# --- planted files ---------------------------------------------------------------------

@pytest.mark.parametrize("name", ["authkey", "ready", "harvest-log.json"])
def test_a_planted_symlink_is_not_followed(tmp_path, name):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (rt / name).symlink_to(victim)
    server = _serve(rt, tmp_path)
    try:
        _serving(rt, server)
        assert ManagerHandle(rt).status()["tasks"] == []
    finally:
        _stop(rt, server)
    assert victim.read_text() == "precious"
    assert not (rt / name).is_symlink()


def test_a_socket_replaced_by_a_regular_file_is_refused(tmp_path):
    rt = tmp_path / "rt"
    rt.mkdir(mode=0o700)
    (rt / "control.sock").write_text("not a socket")
    err = _refused(rt, tmp_path)
    assert f"{rt / 'control.sock'} is not a socket (a regular file)" in err
    assert (rt / "control.sock").read_text() == "not a socket"     # left alone
    # And a client finds no manager there (it does not talk to a file).
    with pytest.raises(ManagerError, match="no manager"):
        ManagerHandle(rt).status()


# --- one manager per directory -----------------------------------------------------------

def test_a_second_manager_on_a_live_directory_is_refused(tmp_path):
    rt = tmp_path / "rt"
    first = _serve(rt, tmp_path)
    try:
        _serving(rt, first)
        key = (rt / "authkey").read_bytes()
        sockets = {n: os.lstat(rt / n).st_ino for n in ("control.sock", "events-cpu0.sock")}
        err = _refused(rt, tmp_path)
        assert f"a manager is already serving in {rt}" in err
        # The first is untouched and still answers.
        assert (rt / "authkey").read_bytes() == key
        assert {n: os.lstat(rt / n).st_ino for n in sockets} == sockets
        assert ManagerHandle(rt).status()["tasks"] == []
        with pytest.raises(ManagerError, match="already serving"):
            ManagerHandle.start(rt, [DEVICE])
    finally:
        _stop(rt, first)
    assert first.returncode == 0


def test_a_dead_managers_directory_is_reused(tmp_path):
    rt = tmp_path / "rt"
    first = _serve(rt, tmp_path)
    _serving(rt, first)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    assert (rt / "control.sock").exists() and (rt / "ready").exists()   # stale
    second = _serve(rt, tmp_path)
    try:
        _serving(rt, second)
        assert ManagerHandle(rt).status()["tasks"] == []
    finally:
        _stop(rt, second)
