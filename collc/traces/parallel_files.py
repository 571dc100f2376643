"""A job's per-rank files read in parallel: worker processes on this machine by default,
or the workers of a running Dask cluster (`scheduler`).

Each file is one work unit, read by `sources.read_file_columns` (passed in as `reader`:
the module that reads a file is above this one) with a context of its own; its
calls come back as compact columns (`columns.CallColumns`), with its summaries and what
it told its context. The reading process puts them together in file order, merging the
contexts in that order: communicators keep the first value given for each field, the
world size is the largest, notes follow one another, exactly as when one context is
passed from file to file. So the `TraceSet` is the one the one-process read gives.

An error in a file is sent back as a value (a `CollcError` pickles without its
location) and raised in the reading process: the first failing file's, in file order.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

from ..diagnostics import CollcError, Span
from ..parallel import process_pool
from .columns import CallColumns, ColumnsJoiner
from .records import SourceSummary, TraceContext

# Called with (files done, files in all) as files are read.
Progress = Callable[[int, int], None]


@dataclass
class FileResult:
    """What reading one file gives, in a form that pickles compactly."""

    path: str
    columns: CallColumns | None
    summaries: list[SourceSummary]
    context: TraceContext
    error: tuple[str, Span | None, tuple[str, ...]] | None = None   # (message, span, notes)


def _one_log_process() -> None:
    # The files are the parallel units: a big log inside a worker is read by that worker
    # alone, not split again over a pool of its own (processes of processes).
    os.environ["COLLC_NCCL_LOG_PROCESSES"] = "1"


Reader = Callable[[str], FileResult]


def read_local(files: Sequence[str], workers: int, reader: Reader,
               progress: Progress | None = None) -> Iterator[FileResult]:
    """The files read by a pool of `workers` processes on this machine, yielded in file
    order as they are ready: the reading process holds the columns of the files read
    ahead of the one it is combining, not of all of them."""
    pool = process_pool(min(workers, len(files)), _one_log_process)
    futures: list[Future | None] = []
    try:
        futures.extend(pool.submit(reader, f) for f in files)
        for i in range(len(futures)):
            future = futures[i]
            futures[i] = None                      # its result is dropped once combined
            yield future.result()
            if progress is not None:
                progress(i + 1, len(files))
    finally:
        # An error (or the caller stopping) leaves files unread: they are not waited for.
        pool.shutdown(wait=True, cancel_futures=True)


def read_dask(files: Sequence[str], scheduler: Any, reader: Reader,
              progress: Progress | None = None) -> Iterator[FileResult]:
    """The files read by the workers of a Dask cluster, yielded in file order. `scheduler`
    is the address of a running scheduler (`tcp://host:8786`) or a `distributed.Client`.
    A worker lost mid-run has its files read again elsewhere (Dask reschedules the tasks
    of a lost worker); a file whose reading raised is tried once more."""
    from distributed import Client   # optional: the [dask] extra

    client = scheduler if isinstance(scheduler, Client) else Client(scheduler)
    futures: list = []
    try:
        # Every worker gets the same environment setting as local workers.
        client.run(_one_log_process)
        futures = client.map(reader, list(files), pure=False, retries=1)
        for i in range(len(futures)):
            future = futures[i]
            result = future.result()
            future.release()                       # the cluster may forget it now
            futures[i] = None
            yield result
            if progress is not None:
                progress(i + 1, len(files))
    finally:
        pending = [f for f in futures if f is not None]
        if pending:
            client.cancel(pending)
        if client is not scheduler:
            client.close()


def combine(results: Iterable[FileResult], context: TraceContext, files: int = 1
            ) -> tuple[CallColumns, list[SourceSummary]]:
    """The files' calls (as one set of columns: joined as each file's come, no record
    made) and summaries in file order, their contexts merged into `context` in that
    order; the first failing file's error raised. `files`: how many results to expect
    (the joined arrays are sized from it)."""
    joiner = ColumnsJoiner(files, consume=True)
    summaries: list[SourceSummary] = []
    try:
        for r in results:
            if r.error is not None:
                message, span, notes = r.error
                raise CollcError(message, span, notes)
            merge_context(context, r.context)
            if r.columns is not None:
                joiner.add(r.columns)
            summaries.extend(r.summaries)
    finally:
        close = getattr(results, "close", None)
        if close is not None:       # a generator of results: stop its pool now, not when collected
            close()
    return joiner.result(), summaries


def merge_context(into: TraceContext, other: TraceContext) -> None:
    into.saw_world_size(other.world_size)
    for cid, info in other.communicators.items():
        into.communicator(cid, info.nranks, info.ranks, info.name)
    into.notes.extend(other.notes)
