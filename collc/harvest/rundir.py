"""The manager's runtime directory: private to its user, one manager at a time.

The directory holds the control socket, its key, the trainer's event sockets and the
log, so whoever can write in it can impersonate the manager, read the key or fake
bubbles. The rules (docs/harvest.md, "The runtime directory"):
- The default is private: `$XDG_RUNTIME_DIR/collc-harvest` (a per-user tmpfs that only
  its user can enter), else `collc-harvest-<uid>` in the temporary directory, made with
  mode 0700.
- A given directory must be a real directory (not a symlink), owned by the user and not
  writable by group or others; a missing one is created with mode 0700.
- Files are created with O_NOFOLLOW | O_EXCL under a temporary name and renamed into
  place, so nothing planted at the final name is followed or truncated.
- A stale socket is removed only if it is a socket owned by the user.
- One manager per directory: it holds an exclusive `flock` on `lock` for its life; the
  kernel drops it when the manager dies, however it dies, so a dead manager's directory
  is reused without ceremony.
"""

from __future__ import annotations

import errno
import fcntl
import os
import secrets
import stat
import tempfile
from pathlib import Path

LOCK = "lock"
DIR_NAME = "collc-harvest"


class RuntimeDirError(Exception):
    """The runtime directory is unsafe or taken (a user error: the message says why)."""


def default_runtime_dir() -> Path:
    """`$XDG_RUNTIME_DIR/collc-harvest`, else `<tmp>/collc-harvest-<uid>`."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / DIR_NAME
    return Path(tempfile.gettempdir()) / f"{DIR_NAME}-{os.geteuid()}"


def check_private_dir(path: Path) -> None:
    """Raise RuntimeDirError unless `path` is a directory owned by this user that no one
    else may write to (lstat: a symlink to a directory does not pass)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise RuntimeDirError(f"runtime directory {path} does not exist") from None
    if not stat.S_ISDIR(st.st_mode):
        what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a directory"
        raise RuntimeDirError(f"runtime directory {path} is {what}; give a directory "
                              "of your own")
    if st.st_uid != os.geteuid():
        raise RuntimeDirError(f"runtime directory {path} belongs to uid {st.st_uid}, not "
                              f"to you (uid {os.geteuid()}): another user could replace "
                              "its sockets and key")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise RuntimeDirError(f"runtime directory {path} is writable by "
                              f"{'others' if st.st_mode & stat.S_IWOTH else 'its group'} "
                              f"(mode {stat.S_IMODE(st.st_mode):04o}): make it 0700 "
                              "(chmod 700) or give another")


def prepare_dir(path: str | Path | None) -> Path:
    """The runtime directory to use, created (mode 0700) if missing and checked."""
    path = Path(path) if path is not None else default_runtime_dir()
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except FileNotFoundError:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.mkdir(path, 0o700)
    check_private_dir(path)
    return path


def acquire_lock(path: Path) -> int:
    """Hold `path/lock` exclusively for the caller's life; returns the descriptor.

    RuntimeDirError if another live process holds it (a manager already serves there).
    """
    fd = os.open(path / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise RuntimeDirError(f"{path / LOCK} is not a regular file of yours")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES):
                raise
            raise RuntimeDirError(f"a manager is already serving in {path} (it holds "
                                  f"{path / LOCK}); stop it with `collc harvest shutdown "
                                  f"--dir {path}`") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def write_private_file(path: Path, data: bytes) -> None:
    """Write `data` to `path` (mode 0600) without following anything planted there.

    The bytes go to a fresh name opened with O_CREAT | O_EXCL | O_NOFOLLOW, which is
    then renamed over `path`: rename replaces a symlink at `path` instead of writing
    through it.
    """
    existing = _lstat_or_none(path)
    if existing is not None and stat.S_ISDIR(existing.st_mode):
        raise RuntimeDirError(f"{path} is a directory; remove it")
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def read_private_file(path: Path) -> bytes:
    """Read a file the manager wrote: refuses a symlink or someone else's file."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            raise RuntimeDirError(f"{path} is not a regular file of yours")
        return f.read()


def remove_stale_socket(path: Path) -> None:
    """Remove what a dead manager left at a socket's name: only a socket of ours."""
    st = _lstat_or_none(path)
    if st is None:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise RuntimeDirError(f"{path} is not a socket (a {_kind(st.st_mode)}): not "
                              "removing it; remove it yourself if it is not needed")
    if st.st_uid != os.geteuid():
        raise RuntimeDirError(f"socket {path} belongs to uid {st.st_uid}, not to you")
    os.unlink(path)


def make_socket_private(path: Path) -> None:
    """After bind(): only the user may connect (the directory is 0700 as well)."""
    st = os.lstat(path)
    if not stat.S_ISSOCK(st.st_mode):   # Linux cannot chmod a symlink itself: check first
        raise RuntimeDirError(f"{path} is not the socket just bound")
    os.chmod(path, 0o600)


def _lstat_or_none(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISREG(mode):
        return "regular file"
    if stat.S_ISDIR(mode):
        return "directory"
    return "special file"
