"""Independent work units run in parallel: worker processes on this machine, or the
workers of a running Dask cluster.

One engine for every command whose work splits into independent units: `collc profile
--library` (a synthesis per size band) and `collc compile` with several sizes or
topologies (a schedule per request). A unit is a picklable function and its
arguments; its result comes back pickled, and the caller takes results as they
complete (`run_units` yields each with its index), so its answer does not depend on
the order in which units finish.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any, Callable, Generic, Iterator, Sequence, TypeVar

if TYPE_CHECKING:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

T = TypeVar("T")

# Called with (units done, units in all) as units complete.
Progress = Callable[[int, int], None]


def local_workers() -> int:
    """As many worker processes as this process may use CPUs."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:          # not Linux
        return os.cpu_count() or 1


def process_pool(workers: int, initializer: Callable[[], None] | None = None) -> ProcessPoolExecutor:
    """A pool of `workers` processes. fork is the cheapest start, but forking a process
    that runs other threads can deadlock: then a fresh interpreter per worker."""
    # Imported here: a command with one unit (the usual compile) never starts a pool,
    # and these modules cost its start-up ~20 ms.
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods() \
        else "forkserver"
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(method),
                               initializer=initializer)


def run_units(function: Callable[..., Any], units: Sequence[tuple], workers: int = 1, scheduler: Any = None,
              progress: Progress | None = None) -> Iterator[tuple[int, Any]]:
    """(index, function(*units[index])) for every unit, as each completes: on the Dask
    cluster whose scheduler is `scheduler` (an address or a `distributed.Client`; a
    unit whose worker is lost is run again, one that raised is tried once more), else
    on `workers` local processes where there are several units, else here in order."""
    if scheduler is not None and units:
        yield from _run_dask(function, units, scheduler, progress)
        return
    if workers > 1 and len(units) > 1:
        from concurrent.futures import as_completed  # with the pool (see process_pool)

        with process_pool(min(workers, len(units))) as pool:
            futures = {pool.submit(function, *unit): i for i, unit in enumerate(units)}
            for done, future in enumerate(as_completed(futures), 1):
                yield futures[future], future.result()
                if progress is not None:
                    progress(done, len(units))
        return
    for i, unit in enumerate(units):
        yield i, function(*unit)
        if progress is not None:
            progress(i + 1, len(units))


def _run_dask(function: Callable[..., Any], units: Sequence[tuple], scheduler: Any,
              progress: Progress | None) -> Iterator[tuple[int, Any]]:
    from distributed import Client, as_completed as dask_completed   # optional: the [dask] extra

    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    try:
        futures = [client.submit(function, *unit, pure=False, retries=1) for unit in units]
        index = {f.key: i for i, f in enumerate(futures)}
        for done, future in enumerate(dask_completed(futures), 1):
            yield index[future.key], future.result()
            if progress is not None:
                progress(done, len(units))
    finally:
        if client is not scheduler:
            client.close()


class InChild(Generic[T]):
    """`function(*args)`, computed by a forked child process while this one goes on
    (`in_child`). `result()` waits for it; where the child could not give it (it raised,
    its value would not pickle, it was killed), this process computes it instead, so
    the value, or the error raised, is the one a call here would give."""

    def __init__(self, function: Callable[..., T], args: tuple, process: BaseProcess, reader: Connection):
        self._function, self._args = function, args
        self._process: BaseProcess | None = process
        self._reader = reader
        self._value: T | None = None

    def result(self) -> T:
        if self._process is not None:
            try:
                outcome = self._reader.recv()
            except (EOFError, OSError):
                outcome = None
            finally:
                self._end()
            self._value = outcome[1] if outcome is not None and outcome[0] == "value" else self._function(*self._args)
        return self._value  # type: ignore[return-value]

    def cancel(self) -> None:
        """Stop the child if it still runs (the value is no longer wanted)."""
        if self._process is not None:
            self._process.kill()
            self._end()

    def _end(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            self._reader.close()
            process.join()


def in_child(function: Callable[..., T], *args: Any) -> InChild[T] | None:
    """`function(*args)` started in a forked child process, for work this process will
    need later and can leave to another core meanwhile; None where that cannot be done
    safely or would not pay: no fork on this system, fewer than two CPUs for this
    process, other threads running (a fork copies only the calling thread, and a lock
    another one held stays locked in the child), or this process a daemon."""
    if local_workers() < 2 or threading.active_count() != 1:
        return None
    import multiprocessing  # here: most commands never start a child (see process_pool)

    if "fork" not in multiprocessing.get_all_start_methods() or multiprocessing.current_process().daemon:
        return None  # (a daemon process, such as multiprocessing.Pool's worker, may not start children)
    context = multiprocessing.get_context("fork")
    reader, writer = context.Pipe(duplex=False)
    # daemon: a child still running when this process exits is stopped, not waited for.
    process = context.Process(target=_child_main, args=(writer, function, args), daemon=True,
                              name="collc-in-child")
    process.start()
    writer.close()
    return InChild(function, args, process, reader)


def _child_main(writer: Connection, function: Callable[..., Any], args: tuple) -> None:
    """The child of `in_child`: the value, or word that the parent must compute it."""
    try:
        outcome: tuple[str, Any] = ("value", function(*args))
    except BaseException:  # the parent computes it again and raises the error itself
        outcome = ("raised", None)
    try:
        writer.send(outcome)
    except Exception:  # a value that does not pickle
        writer.send(("raised", None))
    writer.close()
