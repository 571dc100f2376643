"""Writing outputs: never leave a partial file behind, never clobber what is not ours.

- `atomic_write` writes to a temporary file beside the target and renames it into place;
  it refuses a target that exists and is not a regular file (a device, a FIFO, a
  symbolic link, a directory): renaming over one would replace it.
- `all_or_nothing()` groups the writes of one command: inside it, `atomic_write` only
  stages temporary files, and they are renamed into place together when the block ends
  without an error; on an error every staged file (and every directory made for one) is
  removed, so a failed command leaves the file system as it found it.
- `written_in_child()`: inside an `all_or_nothing()` block, a write of pieces is made
  by a forked child process while this one goes on (verifies the schedule, builds the
  report); the block's end waits for every child and renames only if all succeeded.
- `check_output_path` tells, before any work is done, whether a path can be written.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import os
import signal
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

from collc.diagnostics import CollcError, Span
from collc.parallel import local_workers

_TEMP_PREFIX = ".collc-"


class OutputError(CollcError):
    """An output path that cannot or must not be written."""


def _describe(mode: int) -> str:
    for test, word in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return word
    return "not a regular file"


def check_target(path: Path) -> None:
    """Refuse to replace anything but a regular file (or nothing)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(f"will not write {path}: it is {_describe(st.st_mode)}, and writing would replace it "
                          "with a regular file; name a new file or a regular one")


def _name_max(directory: Path) -> int:
    try:
        return os.pathconf(directory, "PC_NAME_MAX")
    except (OSError, ValueError):
        return 255


def check_output_path(path: Path, directory: bool = False, what: str = "output") -> None:
    """Whether `path` (a file, or a directory when `directory`) could be written, checked
    without leaving anything behind: the nearest existing ancestor must be a writable
    directory, names must fit the file system, an existing target must be of the right
    kind. Raises OutputError saying what is wrong."""
    path = Path(path)
    if _lexists(path, what):
        if directory:
            if not path.is_dir():
                raise OutputError(f"the {what} {path} must be a directory, but it is a file")
            _probe(path, what)
            return
        check_target(path)
        _probe(path.parent, what, path)
        return
    missing: list[str] = []
    ancestor = path
    while not _lexists(ancestor, what):
        missing.append(ancestor.name)
        if ancestor.parent == ancestor:
            break
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise OutputError(f"cannot write the {what} {path}: {ancestor} is a file, not a directory")
    limit = _name_max(ancestor)
    for name in missing:
        if len(os.fsencode(name)) > limit:
            raise OutputError(f"cannot write the {what} {str(path)[:60]}...: the name '{name[:40]}...' is longer "
                              f"than the file system allows ({limit} bytes)")
    _probe(ancestor, what, path)


def _lexists(path: Path, what: str) -> bool:
    try:
        os.lstat(path)
        return True
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise OutputError(f"cannot write the {what} {str(path)[:60]}...: the name is longer than the file "
                              "system allows") from None
        raise OutputError(f"cannot write the {what} {path}: {exc.strerror or exc}") from None


def _probe(directory: Path, what: str, target: Path | None = None) -> None:
    """Create and remove a file in `directory`: the only sure test that writing works
    (read-only file systems, /proc, permissions, quotas)."""
    try:
        fd, probe = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".probe", dir=directory)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.EROFS:
            reason = "the file system is read-only"
        raise OutputError(f"cannot write the {what} {target or directory}: {reason} ({directory})") from None
    os.close(fd)
    os.unlink(probe)


# --- staged writes ---------------------------------------------------------------------------

@dataclass
class _Child:
    """A forked process writing one staged file; it writes why it failed to `errors`."""

    pid: int
    final: Path
    errors: int  # the read end of a pipe
    done: bool = False


@dataclass
class _Transaction:
    staged: list[tuple[Path, Path]] = field(default_factory=list)  # (temporary, final)
    made_dirs: list[Path] = field(default_factory=list)
    children: list[_Child] = field(default_factory=list)

    def finals(self) -> set[str]:
        return {os.path.abspath(final) for _, final in self.staged}


_ACTIVE: contextvars.ContextVar[_Transaction | None] = contextvars.ContextVar("collc_io_transaction", default=None)
_IN_CHILD: contextvars.ContextVar[bool] = contextvars.ContextVar("collc_io_written_in_child", default=False)


@contextlib.contextmanager
def written_in_child(only_with_a_core_to_spare: bool = True) -> Iterator[None]:
    """Within an `all_or_nothing()` block: each `atomic_write` of pieces (an iterable, not
    text or bytes) in this block forks a child process that writes the temporary file
    while this process goes on. The pieces must be made from data this process no longer
    changes (the child sees it as it was at the fork). Outside such a block, or where
    the system has no fork, writes stay in this process; so they do, by default, where
    no core is free for the child (`core_to_spare`): the fork and the pages it makes both
    processes copy cost about 0.06 CPU s on the README's main job, a loss where the
    child would only take turns with this process."""
    token = _IN_CHILD.set(not only_with_a_core_to_spare or core_to_spare())
    try:
        yield
    finally:
        _IN_CHILD.reset(token)


@contextlib.contextmanager
def all_or_nothing() -> Iterator[None]:
    """Stage every `atomic_write` in the block; rename them all into place at its end,
    or remove them all if it raises."""
    if _ACTIVE.get() is not None:  # nested: the outer block decides
        yield
        return
    tx = _Transaction()
    token = _ACTIVE.set(tx)
    try:
        yield
        _wait_children(tx)
        for _, final in tx.staged:
            check_target(final)
        while tx.staged:
            tmp, final = tx.staged[0]
            os.replace(tmp, final)
            tx.staged.pop(0)
    except BaseException:
        _rollback(tx)
        raise
    finally:
        _ACTIVE.reset(token)


def core_to_spare() -> bool:
    """Whether a second process would have a core of its own: at least two CPUs this
    process may run on (its affinity: a container's or `taskset`'s share, not the
    machine's), and a 1-minute load average (this process included) at least one below
    their count."""
    cpus = local_workers()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # no load average on this system
        return False
    return cpus >= 2 and load <= cpus - 1


def _wait_children(tx: _Transaction) -> None:
    """Wait for every child writing a staged file; raise OutputError (with the child's
    reason) for the first that failed."""
    for child in tx.children:
        _, status = os.waitpid(child.pid, 0)
        child.done = True
        with os.fdopen(child.errors, "rb") as errors:
            reason = errors.read().decode(errors="replace")
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
            raise OutputError(f"cannot write {child.final}: {reason or 'the writing process ended abnormally'}")


def _stop_children(tx: _Transaction) -> None:
    for child in tx.children:
        if not child.done:
            with contextlib.suppress(OSError):
                os.kill(child.pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, 0)
            with contextlib.suppress(OSError):
                os.close(child.errors)
            child.done = True


def _rollback(tx: _Transaction) -> None:
    _stop_children(tx)
    for tmp, _ in tx.staged:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    for directory in reversed(tx.made_dirs):
        with contextlib.suppress(OSError):
            directory.rmdir()  # only if still empty


def _make_parents(directory: Path, tx: _Transaction | None) -> None:
    missing = []
    d = directory
    while not d.exists():
        missing.append(d)
        if d.parent == d:
            break
        d = d.parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the directory {directory}: {exc.strerror or exc}") from None
    if tx is not None:
        tx.made_dirs.extend(reversed(missing))


def _open_temp(path: Path, mode: int | None) -> tuple[int, str]:
    """A new temporary file beside `path` (descriptor, name), with the mode a plain
    open() would give (or the one asked for): mkstemp creates 0600."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=_TEMP_PREFIX, suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.fchmod(fd, 0o666 & ~umask if mode is None else mode)
    except OSError as exc:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    return fd, tmp


def _write_to(fd: int, data: str | bytes | Iterable[str | bytes]) -> None:
    with os.fdopen(fd, "wb") as f:
        if isinstance(data, (str, bytes)):
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        else:  # pieces, written as they come (a large file need not be held whole)
            for piece in data:
                f.write(piece if isinstance(piece, bytes) else piece.encode("utf-8"))


def _write_temp(path: Path, data: str | bytes | Iterable[str | bytes], mode: int | None) -> Path:
    fd, tmp = _open_temp(path, mode)
    try:
        _write_to(fd, data)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if isinstance(exc, OSError):
            raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
        raise
    return Path(tmp)


def atomic_write(path: str | os.PathLike, data: str | bytes | Iterable[str | bytes], mode: int | None = None) -> Path:
    """Write `data` (text, bytes, or pieces of text or bytes) to a temporary file beside `path`,
    then rename it into place (at the end of the enclosing `all_or_nothing()` block, if
    there is one). `mode`: the file's permission bits (default: what `open()` would give
    under the umask)."""
    path = Path(path)
    check_target(path)
    tx = _ACTIVE.get()
    if tx is not None and os.path.abspath(path) in tx.finals():
        raise OutputError(f"two outputs of this command would both be written to {path}")
    _make_parents(path.parent, tx)
    if tx is not None and _IN_CHILD.get() and hasattr(os, "fork") and not isinstance(data, (str, bytes)):
        tx.staged.append((_write_temp_in_child(path, data, mode, tx), path))
        return path
    tmp = _write_temp(path, data, mode)
    if tx is not None:
        tx.staged.append((tmp, path))
        return path
    try:
        check_target(path)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def _write_temp_in_child(path: Path, data: Iterable[str | bytes], mode: int | None, tx: _Transaction) -> Path:
    """The temporary file made here, its content written by a forked child; the child
    is waited for at the end of the transaction (`_wait_children`)."""
    fd, tmp = _open_temp(path, mode)
    errors_read, errors_write = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        for end in (fd, errors_read, errors_write):
            os.close(end)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise OutputError(f"cannot write {path}: {exc.strerror or exc}") from None
    if pid == 0:  # the child: write, say why not, and leave without the parent's cleanup
        code = 1
        try:
            os.close(errors_read)
            _write_to(fd, data)
            code = 0
        except BaseException as exc:
            with contextlib.suppress(BaseException):
                os.write(errors_write, (getattr(exc, "strerror", None) or str(exc) or type(exc).__name__).encode())
        finally:
            os._exit(code)
    os.close(fd)
    os.close(errors_write)
    tx.children.append(_Child(pid, path, errors_read))
    return Path(tmp)


# --- inputs ------------------------------------------------------------------------------

class InputError(CollcError):
    """An input path that cannot be read as a file: missing, a directory, a device, a FIFO."""


def check_input_file(path: str | os.PathLike, what: str = "input") -> None:
    """Refuse, before opening it, anything but a regular file (or a link to one): opening
    a FIFO blocks until a writer comes, and a device such as /dev/zero never ends."""
    path = Path(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(f"cannot read the {what} '{path}': no such file", Span(str(path), 1, 1)) from None
    except OSError as exc:
        raise InputError(f"cannot read the {what} '{path}': {exc.strerror or exc}", Span(str(path), 1, 1)) from None
    if not stat.S_ISREG(st.st_mode):
        raise InputError(f"cannot read the {what} '{path}': it is {_describe(st.st_mode)}, not a file",
                         Span(str(path), 1, 1))


def read_input_bytes(path: str | os.PathLike, what: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (a larger one is refused
    without being read whole)."""
    check_input_file(path, what)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise InputError(f"cannot read the {what} '{path}': {exc.strerror or exc}", Span(str(path), 1, 1)) from None
    if len(data) > max_bytes:
        raise InputError(f"the {what} '{path}' is larger than {max_bytes:,} bytes, more than any such file holds",
                         Span(str(path), 1, 1))
    return data
