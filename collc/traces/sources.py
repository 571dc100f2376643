"""Reading a job's traces: every file (or directory of per-rank files) into one `TraceSet`.

Each file's format is detected from its content; every reader streams, counts what it
skipped and why in the file's `SourceSummary`, and raises a located `CollcError` for a
record that makes the file unreadable.
"""

from __future__ import annotations

import os
import tarfile
import zlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from ..diagnostics import CollcError, Span
from ..io import check_input_file
from .detect import TraceSource, detect, detect_bytes, read_head
from .columns import CallColumns, ColumnsJoiner, from_columns, to_columns
from ..parallel import local_workers
from .parallel_files import FileResult, Progress, combine, read_dask, read_local
from .records import CollectiveCall, CommunicatorInfo, SourceSummary, TraceContext
from .urls import is_url, url_files

__all__ = ["CommunicatorInfo", "TraceSet", "read_traces", "read_file", "read_columns", "trace_files"]


@dataclass
class TraceSet:
    columns: CallColumns    # every call, as columns (`columns.CallColumns`)
    sources: list[SourceSummary]
    world_size: int | None
    communicators: dict[str, CommunicatorInfo]
    notes: list[str]        # e.g. "412 kernel rows were named by the launching nccl:* op"

    @property
    def call_count(self) -> int:
        return self.columns.n

    @cached_property
    def calls(self) -> list[CollectiveCall]:
        """Every call as a record (made when first asked for: the mix reads the columns)."""
        return from_columns(self.columns)


Reader = Callable[[TraceSource, SourceSummary, TraceContext], Iterator[CollectiveCall]]


def _reader(fmt: str) -> Reader:
    # Imported here so that reading one format never loads the others' dependencies.
    if fmt == "kineto":
        from .kineto import read_kineto
        return read_kineto
    if fmt == "nccl-log":
        from .nccl_log.reader import read_nccl_log
        return read_nccl_log
    if fmt == "nccl-profiler":
        from .nccl_profiler import read_profiler_dump
        return read_profiler_dump
    if fmt == "nccl-inspector":
        from .nccl_profiler import read_inspector
        return read_inspector
    if fmt == "chakra-et":
        from .chakra import read_chakra_et
        return read_chakra_et
    if fmt == "chakra-json":
        from .chakra import read_chakra_json
        return read_chakra_json
    raise ValueError(f"no reader for format {fmt!r}")


def trace_files(paths: Sequence[str | os.PathLike]) -> list[Path | str]:
    """The files named, directories recursed (sorted, hidden files and MANIFESTs left out);
    URLs (`urls`) stay strings."""
    files: list[Path | str] = []
    for p in paths:
        if is_url(p):                 # a file or a prefix of a store: fsspec lists it
            files.extend(url_files(str(p), _ignored))
            continue
        path = Path(p)
        if path.is_dir():
            for sub in sorted(path.rglob("*")):
                if sub.is_file() and not _ignored(sub.name):
                    files.append(sub)
        else:  # a FIFO or a device would block or never end: only regular files are read
            check_input_file(path, "trace")
            files.append(path)
    return files


def _ignored(name: str) -> bool:
    return name.startswith(".") or name.upper().startswith("MANIFEST") or name.upper().startswith("README")


def read_file(path: str | os.PathLike, context: TraceContext | None = None
              ) -> tuple[list[CollectiveCall], list[SourceSummary]]:
    """One file's calls and summaries (an archive gives one summary per trace member)."""
    columns, summaries = read_columns(path, context)
    return from_columns(columns), summaries


def read_columns(path: str | os.PathLike, context: TraceContext | None = None
                 ) -> tuple[CallColumns, list[SourceSummary]]:
    """One file's calls as columns, and its summaries (one per trace member of an archive)."""
    context = context if context is not None else TraceContext()
    source = TraceSource.file(path)
    fmt = detect(source)
    if fmt == "tar":
        return _read_archive(source, context)
    return _read_source(source, fmt, context)


def _read_source(source: TraceSource, fmt: str, context: TraceContext
                 ) -> tuple[CallColumns, list[SourceSummary]]:
    summary = SourceSummary(source.name, fmt)
    if fmt == "nccl-log":     # its reader keeps columns from the start: no record is made
        from .nccl_log.reader import read_nccl_log_columns
        return read_nccl_log_columns(source, summary, context), [summary]
    return to_columns(list(_reader(fmt)(source, summary, context))), [summary]


def _read_archive(archive: TraceSource, context: TraceContext
                  ) -> tuple[CallColumns, list[SourceSummary]]:
    """Members of a tar archive, each detected and read as a stream, none written to disk."""
    joiner = ColumnsJoiner(consume=True)
    summaries: list[SourceSummary] = []
    try:
        # A URL's archive is read from its stream; a local one by name (tarfile seeks in it).
        with (tarfile.open(fileobj=archive.opener(), mode="r:*") if is_url(archive.name)
              else tarfile.open(archive.name, "r:*")) as tar:
            for member in tar.getmembers():
                if not member.isfile() or _ignored(os.path.basename(member.name)):
                    continue
                source = TraceSource(f"{archive.name}:{member.name}",
                                     lambda m=member: tar.extractfile(m))  # type: ignore[misc]
                fmt = detect_bytes(read_head(source))
                if fmt is None or fmt == "tar":
                    summary = SourceSummary(source.name, "unknown")
                    summary.skip("archive member in no trace format")
                    summaries.append(summary)
                    continue
                member_columns, member_summaries = _read_source(source, fmt, context)
                joiner.add(member_columns)
                summaries.extend(member_summaries)
    except (tarfile.TarError, EOFError, zlib.error) as e:
        raise CollcError(f"unreadable archive: {e}", Span(archive.name, 1, 1)) from None
    return joiner.result(), summaries


def read_file_columns(path: str) -> FileResult:
    """One file read with a context of its own, its calls as columns: the work unit of a
    parallel read, run in a worker process or on a Dask worker."""
    context = TraceContext()
    try:
        columns, summaries = read_columns(path, context)
    except CollcError as e:
        return FileResult(path, None, [], context, (e.message, e.span, e.notes))
    return FileResult(path, columns, summaries, context)


def read_traces(paths: Sequence[str | os.PathLike], workers: int | None = None, scheduler: Any = None,
                progress: Progress | None = None) -> TraceSet:
    """Every call the files record, with what they say about ranks and communicators.

    Several files are read in parallel: by `workers` processes on this machine (default:
    as many as this process may use CPUs; 1 reads them here, one after another), or by
    the workers of the Dask cluster whose scheduler is `scheduler` (an address or a
    `distributed.Client`). The result is the same either way (`parallel_files`)."""
    context = TraceContext()
    files = trace_files(paths)
    workers = local_workers() if workers is None else workers
    if scheduler is not None or (workers > 1 and len(files) > 1):
        names = [str(f) for f in files]
        results = (read_dask(names, scheduler, read_file_columns, progress) if scheduler is not None
                   else read_local(names, workers, read_file_columns, progress))
        columns, sources = combine(results, context, len(names))
    else:
        joiner = ColumnsJoiner(len(files), consume=True)
        sources = []
        for done, path in enumerate(files, 1):
            file_columns, summaries = read_columns(path, context)
            joiner.add(file_columns)
            sources.extend(summaries)
            if progress is not None:
                progress(done, len(files))
        columns = joiner.result()
    return TraceSet(columns=columns, sources=sources, world_size=context.world_size,
                    communicators=context.communicators, notes=context.notes)
