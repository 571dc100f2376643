"""An NCCL log read in this process: the (decompressed) stream in chunks of whole lines,
scanned and replayed (`scan`) in batches with the cyclic garbage collector paused.

The parallel reader (`parallel`) reads a stream as this module does (same chunk size,
same errors), so that both fail at the same line and offset.
"""

from __future__ import annotations

import gc
import zlib
from typing import BinaryIO, Iterator

from ...diagnostics import CollcError, Span
from ..records import CollectiveCall
from .scan import State, replay, scan

CHUNK_BYTES = 1 << 20     # fits the CPU caches: larger pieces read slower
PIECES_PER_BATCH = 64     # 64 MiB of log, ~160k records: see scan_batch


def read_stream(f: BinaryIO, state: State) -> Iterator[list[CollectiveCall]]:
    """The calls of a (decompressed) log stream, a list per batch (lists, not calls: one
    generator less for each call to pass), all but those `finish` flushes at the end."""
    pieces = chunks(f, state)
    while (calls := scan_batch(pieces, state)) is not None:
        yield calls


def chunks(f: BinaryIO, state: State) -> Iterator[tuple[bytes, int]]:
    """(data, end): the (decompressed) file in pieces whose first `end` bytes are whole
    lines; the bytes after `end` begin the next piece. Not sliced to `end` (the regex
    takes an end position), so each piece is copied once, not twice. `scan` counts the
    lines of each piece into `state.lines`."""
    rest = b""                  # the start of a line that the last piece did not finish
    unfinished: list[bytes] = []  # reads since, none with a newline (joined once, not re-copied per read)
    offset = 0
    while True:
        chunk = read_or_fail(f, CHUNK_BYTES, state.name, state.lines + 1, offset)
        offset += len(chunk)
        if not chunk:
            rest = b"".join([rest, *unfinished])
            if rest:
                yield rest, len(rest)
            return
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            unfinished.append(chunk)
            continue
        if rest or unfinished:
            head = b"".join([rest, *unfinished])
            data, cut = head + chunk, len(head) + cut
            unfinished.clear()
        else:
            data = chunk
        yield data, cut
        rest = data[cut:]


READ_ERRORS = (EOFError, zlib.error, OSError)   # what reading a truncated or corrupt stream raises


def read_or_fail(f: BinaryIO, n: int, name: str, line: int, offset: int) -> bytes:
    """`f.read(n)`, or a located error for a truncated or corrupt compressed log
    (`line`: the line being read; `offset`: decompressed bytes before it)."""
    try:
        return f.read(n)
    except READ_ERRORS as e:
        raise read_error(e, name, line, offset) from None


def read_error(e: BaseException, name: str, line: int, offset: int) -> CollcError:
    return CollcError(f"truncated or corrupt compressed log: {e}", Span(name, line, 1),
                      notes=(f"after {offset} bytes of decompressed data",))


def scan_batch(pieces: Iterator[tuple[bytes, int]], state: State) -> list[CollectiveCall] | None:
    """The calls of the next PIECES_PER_BATCH pieces (None at the end of the file), read
    with the cyclic garbage collector paused.

    Reading makes a record per call and keeps them all: none is garbage, yet every
    collection while they are made walks them (each record's 19 fields), and each
    eleventh walks all those read since again: 13% of the time on a 117 MB log. Paused
    over a batch, not a piece, so that few collections run in between (a log of less
    than ten batches then has each record walked once, not twice); never across a
    `yield`, so the caller's code always runs with the collector as it left it."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        out: list[CollectiveCall] = []
        scanned = 0
        for data, end in pieces:
            replay(scan(data, end, state), 0, state, out)
            state.trim()
            scanned += 1
            if scanned == PIECES_PER_BATCH:
                break
        return out if scanned else None
    finally:
        if enabled:
            gc.enable()
