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
from .scan import State, replay, scan

CHUNK_BYTES = 1 << 20     # fits the CPU caches: larger pieces read slower
PIECES_PER_BATCH = 64     # 64 MiB of log, ~160k records: see scan_batch


def read_stream(f: BinaryIO, state: State) -> None:
    """Read a (decompressed) log stream into `state.collected`: all its calls but those
    `finish` flushes at the end."""
    pieces = chunks(f, state)
    while scan_batch(pieces, state):
        pass


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


def scan_batch(pieces: Iterator[tuple[bytes, int]], state: State) -> bool:
    """Scan and replay the next PIECES_PER_BATCH pieces (False at the end of the file),
    with the cyclic garbage collector paused.

    The replay keeps every record as a few integers in flat arrays, but the scan's
    events and tables are lists of tuples: every collection while they are made would
    walk them. Paused over a batch, not a piece, so that few collections run in
    between; restored between batches, so that the collector never stays off for a
    whole file."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        scanned = 0
        for data, end in pieces:
            replay(scan(data, end, state), 0, state)
            state.trim()
            scanned += 1
            if scanned == PIECES_PER_BATCH:
                break
        return scanned > 0
    finally:
        if enabled:
            gc.enable()
