"""What native libraries print, kept out of collc's own standard output.

HiGHS writes its banner from C++ straight to file descriptor 1 when the first solver
is made, past Python's `sys.stdout`: it would land in the middle of collc's report, or
in JSON a command prints on stdout. Synthesis (collc.synthesis.solver) discards it;
callers that run a whole synthesis inside a command whose stdout is data
(collc.pipeline) send whatever is printed to stderr instead. Both swap the file
descriptor here, in one place.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator


@contextlib.contextmanager
def native_stdout_discarded() -> Iterator[None]:
    """File descriptor 1 goes to the null device for the block."""
    with _stdout_descriptor_to(lambda: os.open(os.devnull, os.O_WRONLY), close=True):
        yield


@contextlib.contextmanager
def native_stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 goes where stderr goes for the block."""
    with _stdout_descriptor_to(lambda: sys.stderr.fileno(), close=False):
        yield


@contextlib.contextmanager
def _stdout_descriptor_to(target: Callable[[], int], close: bool) -> Iterator[None]:
    """File descriptor 1 pointed at `target()` for the block, then back; `close`: the
    target descriptor is the block's own and is closed afterwards. Python's buffered
    stdout is flushed on both sides, so that what it holds goes where it was meant to."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # stdout replaced (tests): nothing to protect
        yield
        return
    sys.stdout.flush()
    saved = os.dup(fd)
    opened: int | None = None
    try:
        opened = target()
        os.dup2(opened, fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, fd)
        os.close(saved)
        if close and opened is not None:
            os.close(opened)
