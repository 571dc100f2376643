"""Work the command's thread does while it would otherwise wait.

While HiGHS rounds a pipelined plan in a thread of its own (collc.synthesis.ahead),
the command's thread waits: for the first incumbent, and for the latest to stay the
latest a moment before work is begun on it (on the README's main job about 0.12 s of
its 1.3). Work that does not depend on the schedule is queued here by whoever will need
it later (the modules the verification, the report and its table load; the baselines,
which depend on the request alone), and `run_one` does one piece of it in such a wait.
Work no wait reached is done when its result is asked for (`Deferred.result`), where it
was done before: nothing here changes what a command computes, only when.

A queue lives for one `idle_queue()` block (one command); outside any block `defer`
queues nothing, and the work runs when asked for.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections import deque
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class Deferred(Generic[T]):
    """One piece of work, done at most once: in an idle moment or when asked for."""

    def __init__(self, work: Callable[[], T]):
        self._work: Callable[[], T] | None = work
        self._value: T | None = None
        self._error: Exception | None = None

    @property
    def done(self) -> bool:
        return self._work is None

    def run(self) -> None:
        """Do the work unless done; an error is kept for `result` to raise, where the
        caller asks (so that it reaches the user as it did when the work ran there)."""
        work, self._work = self._work, None
        if work is None:
            return
        try:
            self._value = work()
        except Exception as error:  # raised again by result()
            self._error = error

    def result(self) -> T:
        self.run()
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]


_QUEUE: contextvars.ContextVar[deque[Deferred] | None] = contextvars.ContextVar("collc_idle_queue", default=None)


@contextlib.contextmanager
def idle_queue() -> Iterator[None]:
    """A queue of idle work for the block; work left in it at the end is dropped (its
    `Deferred` still runs when asked for)."""
    token = _QUEUE.set(deque())
    try:
        yield
    finally:
        _QUEUE.reset(token)


def defer(work: Callable[[], T]) -> Deferred[T]:
    """`work` as a Deferred, queued for an idle moment where an `idle_queue()` block is
    open."""
    deferred = Deferred(work)
    queue = _QUEUE.get()
    if queue is not None:
        queue.append(deferred)
    return deferred


def pending() -> bool:
    """Whether any queued work is not done yet."""
    queue = _QUEUE.get()
    while queue and queue[0].done:
        queue.popleft()
    return bool(queue)


def run_one() -> bool:
    """Do the next queued piece of work not done yet; whether there was one. Each piece
    should be short (tens of milliseconds at most): the wait it fills may end meanwhile."""
    if not pending():
        return False
    queue = _QUEUE.get()
    assert queue is not None
    queue.popleft().run()
    return True
