"""Work begun on a MILP's incumbent while HiGHS is still proving it optimal.

The rounding MILP of a pipelined plan (collc.synthesis.steady.pipelining.whole_counts)
usually finds its answer at the root and spends most of its time proving that nothing
is better: on the README's main job (dgx1, AllGather, 256 MiB) the last improving
solution came after a fifth of the solve. HiGHS releases the GIL while it runs, so the
solve runs in a thread and the caller's thread meanwhile builds what the answer leads
to (the paced transfers, the ops, the list-scheduled timeline) from the latest
incumbent, in steps, begun once the incumbent has stayed the latest a moment
(SETTLE_S) and dropped when a newer one comes. Where it would only wait (for the first
incumbent, or for one to settle), it does the command's idle work (collc.idle: the
imports and baselines the command needs later) a piece at a time.

The answer is always the solve's: the work begun ahead is kept only where the final
solution decodes to exactly the same key as the incumbent it was begun on, and is
otherwise done again from the final key, so the result is the one a plain solve then
the work would give, on any machine and under any load.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Generator, Generic, TypeVar

import numpy as np

from collc import idle
from collc.synthesis.solver import Result

K = TypeVar("K")
T = TypeVar("T")

# Seconds of the solver's own CPU time an incumbent must stay the latest before work
# is begun on it: HiGHS often reports two or three at the root (the warm start, then
# better ones), and work begun on each would mostly be dropped. On the README's main
# job the warm start comes at once, a better point after about 10 ms and the answer
# after about 70 ms of the solve's 360. The work's steps are short (about 10-20 ms:
# collc.synthesis.extract.copy_ops_steps, collc.synthesis.timing.sequence_steps), so
# work on an incumbent that a newer one replaces stops within one of them: with 20 ms,
# the second's pacing is made and dropped (about 0.02 CPU s, while this thread would
# otherwise wait) and work begins on the answer 40 ms sooner than with the 60 ms this
# took while a step could last 0.18 s. Its CPU time, not the clock: on a busy machine
# the solver's thread gets a share of a core, and a wait on the clock would pass before
# it had looked further. Either decides only how much work is done ahead, never the
# answer.
SETTLE_S = 0.02

# The work: a generator that yields between its steps and returns its product. At each
# yield it is sent whether the solve is still running: an optional last step (work
# that may be wasted if this answer is not kept) is worth doing only while it does.
Steps = Generator[None, bool, T]


def finish(steps: Steps[T]) -> T:
    """Run `steps` to its end (the solve is over: optional steps are skipped)."""
    try:
        next(steps)
        while True:
            steps.send(False)
    except StopIteration as stop:
        return stop.value


class _Incumbents:
    """The latest incumbent HiGHS reported (from its thread) and whether it is done."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self.latest: np.ndarray | None = None
        self.count = 0
        self.done = False

    def push(self, values: np.ndarray) -> None:
        with self.changed:
            self.latest = values
            self.count += 1
            self.changed.notify()

    def close(self) -> None:
        with self.changed:
            self.done = True
            self.changed.notify()


class _Ahead(Generic[K, T]):
    """The work begun on one incumbent: its key and how far it got."""

    def __init__(self, key: K, steps: Steps[T]):
        self.key = key
        self.steps = steps
        self.started = False
        self.product: T | None = None
        self.finished = False
        self.failed = False

    @property
    def running(self) -> bool:
        """Whether steps remain (neither finished nor failed)."""
        return not self.finished and not self.failed

    def step(self, running: bool) -> None:
        """One step; an error drops this work (the final key, if it is this one, does it
        again and raises there)."""
        try:
            if self.started:
                self.steps.send(running)
            else:
                self.started = True
                next(self.steps)
        except StopIteration as stop:
            self.product, self.finished = stop.value, True
        except Exception:
            self.failed = True

    def complete(self) -> bool:
        """Run the remaining steps (optional ones skipped); whether the product is there."""
        while not self.finished and not self.failed:
            self.step(False)
        return self.finished


def solve_ahead(solve: Callable[[Callable[[np.ndarray], None]], Result],
                incumbent_key: Callable[[np.ndarray], K], final_key: Callable[[Result], K],
                work: Callable[[K], Steps[T]], settle_s: float = SETTLE_S) -> tuple[Result, K, T]:
    """`solve(on_incumbent)` in a thread; meanwhile `work(incumbent_key(values))` step by
    step on the latest incumbent, begun once no newer one has come for `settle_s`
    seconds. Returns the result, its `final_key` and the work's product for that key:
    the one begun ahead where the keys are equal, else done now."""
    incumbents = _Incumbents()
    outcome: list[Result | BaseException] = []

    def run() -> None:
        try:
            outcome.append(solve(lambda values: incumbents.push(np.array(values, dtype=float))))
        except BaseException as error:  # raised again in the caller's thread
            outcome.append(error)
        finally:
            incumbents.close()

    solver = threading.Thread(target=run, name="collc-milp", daemon=True)
    solver.start()
    solver_cpu = _cpu_clock(solver)
    ahead: _Ahead[K, T] | None = None
    settling: list[K] = []  # the latest incumbent's key, not yet begun on
    since = 0.0
    seen = 0
    while True:
        latest = None
        idle_turn = False
        with incumbents.changed:
            while not incumbents.done and incumbents.count == seen:
                left: float | None = None
                if settling:
                    left = since + settle_s - solver_cpu()
                    if left <= 0:
                        break
                elif ahead is not None and ahead.running:
                    break
                if idle.pending():  # this thread would wait: a piece of the command's idle work first
                    idle_turn = True
                    break
                incumbents.changed.wait(left)  # the solver's CPU time grows no faster than the clock
            if incumbents.done:
                break
            if incumbents.count != seen:
                latest, seen = incumbents.latest, incumbents.count
        if idle_turn:
            idle.run_one()
            continue
        if latest is not None:
            key = incumbent_key(latest)
            settling = [] if ahead is not None and key == ahead.key else [key]
            since = solver_cpu()
            continue
        if settling:
            ahead = _Ahead(settling[0], work(settling[0]))
            settling = []
        if ahead is not None and ahead.running:
            ahead.step(True)
    solver.join()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    key = final_key(result)
    if ahead is not None and ahead.key == key and ahead.complete():
        return result, key, ahead.product  # type: ignore[return-value]
    return result, key, finish(work(key))


def _cpu_clock(thread: threading.Thread) -> Callable[[], float]:
    """Seconds of CPU time `thread` has used (the clock where the system gives no
    per-thread CPU clock; infinity once the thread has ended)."""
    try:
        clock = time.pthread_getcpuclockid(thread.ident)  # type: ignore[arg-type]
    except (AttributeError, OSError, TypeError):
        return time.monotonic

    def used() -> float:
        try:
            return time.clock_gettime(clock)
        except OSError:  # the thread has ended
            return float("inf")

    return used
