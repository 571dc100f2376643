"""Where `collc compile -o OUT` writes: one file, or a directory with a file per
schedule, checked before any solve (which may take minutes)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from collc.diagnostics import UsageError
from collc.io import check_output_path


def names_directory(text: str) -> bool:
    """`-o out/` always names a directory; `-o out` one only when it is an existing one."""
    return text.endswith(("/", os.sep)) or os.path.isdir(text)


def output_path(out: Path, job: Any, backend: Any, directory: bool, taken: set[Path]) -> Path:
    """The file a job's schedule goes to: `out` itself, or a name in the directory `out`
    made from the job (collective, topology, size, route) and the backend's suffix."""
    if not directory:
        return out
    route = job.algorithm.rsplit(":", 1)[-1] if job.algorithm else "synthesized"
    stem = safe_filename(f"{job.collective.name}-{job.topology.name}-{job.size_bytes}B-{route}")
    path, n = out / f"{stem}{backend.suffix}", 2
    while path in taken:  # two requests alike in all of the above still get a file each
        path, n = out / f"{stem}-{n}{backend.suffix}", n + 1
    taken.add(path)
    return path


def safe_filename(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_.=" else "_" for ch in name)


def check_outputs(args: argparse.Namespace, jobs: list, directory: bool) -> None:
    """Everything about the outputs that can fail, checked before any solve (which may
    take minutes): the kind of path, writability, and -o and --report apart."""
    if len(jobs) > 1 and not directory:
        raise UsageError(f"{len(jobs)} schedules are compiled, so -o must name a directory: write it with a "
                         f"trailing slash ('{args.output}/')")
    check_output_path(Path(args.output), directory=directory, what="output")
    if args.report:
        if not directory and os.path.abspath(args.report) == os.path.abspath(args.output):
            raise UsageError(f"--report and -o name the same file ({args.report}): the report would overwrite "
                             "the schedule")
        if directory and os.path.abspath(args.report) == os.path.abspath(args.output.rstrip("/" + os.sep)):
            raise UsageError(f"--report names the output directory {args.output}; give it a file name")
        check_output_path(Path(args.report), what="report")


def one_request_many_sizes(jobs: list) -> bool:
    """Whether the jobs are one request at several sizes (a size-band library, where
    the backend writes libraries); several requests get a file each instead."""
    if len(jobs) < 2 or len({job.size_bytes for job in jobs}) != len(jobs):
        return False
    first = jobs[0]
    return all(job.collective is first.collective and (job.topology.name, job.algorithm, job.pipeline, job.span)
               == (first.topology.name, first.algorithm, first.pipeline, first.span) for job in jobs)
