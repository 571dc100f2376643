"""A big NCCL log read by several processes: pieces scanned in parallel, records made in order.

One process reads an NCCL log at 60 to 80 MB per CPU second, nearly all of it the scan
(`scan.scan`: the regexes, and the work per line of interest, in bulk or per line). Here the log
is cut at line boundaries into pieces of `PIECE_BYTES`; worker processes scan them and
send back their events (`scan.Events`: integer columns, one entry per COLL or TUNING
line, and the piece's small tables of call shapes, threads and TUNING lines), and this
process replays the events in file order (`scan.replay`): records, and which TUNING
line completes which call, come out of the same code, in the same order, as in one
sequential pass.

What a piece's scan needs from the lines before it is what INIT lines said (comm ranks,
sizes and ids, each process's rank). INIT lines are rare, and nearly always near the
top of a log: this process finds those of the first piece with a regex that skips
everything else at C speed (`_INIT_HINT`: a superset of INIT lines, each confirmed with
the reader's own line pattern) and hands out the later pieces of a plain file with the
tables as of that piece's end, reading of them only a few bytes to find where each ends.
Each worker sends back the INIT lines it read, and as the pieces are replayed in order
this process keeps the tables as they truly stand at each piece's start: a piece handed
out with other tables (an INIT line in a piece after the first changed them) is scanned
again here with the right ones, and from then on each piece is read here for its INIT
lines before the next is handed out (`_Speculation`), as pieces of a stream always are.
What a worker would tell the shared `TraceContext` (communicators, world size) it
records instead, and this process tells the context in file order. Line numbers are
counted from each piece's start and offset here, so errors and `location`s are those of
the sequential read.

Plain files are read by the workers themselves (only offsets are sent); gzip and other
streams are decompressed here, in `CHUNK_BYTES` reads as the sequential reader does (so a
truncated stream fails at the same line and offset), and their pieces handed over in
memory shared with the workers (`_Slots`; pickled where the workers are not forked).

Used when the log is at least `PARALLEL_MIN_BYTES` and more than one CPU is usable
(`os.sched_getaffinity`); `COLLC_NCCL_LOG_PROCESSES=1` keeps every read in one process
(worth it on a machine whose CPUs are all busy: the workers then only wait for them).
"""

from __future__ import annotations

import gc
import io
import multiprocessing
import os
import re
import stat
import threading
from collections import deque
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

from collc.parallel import local_workers

from ..detect import TraceSource
from ..records import SourceSummary, TraceContext
from . import sequential
from .scan import BAD_LINES_KEPT, ICOMM, LINE, Events, State, apply_init, apply_ops, replay, scan

PARALLEL_MIN_BYTES = 16 << 20   # below this, starting processes costs more than it saves
PIECE_BYTES = 8 << 20           # small enough that the last piece's replay is short
CUT_WINDOW = 64 << 10           # read at a piece's end to find its last line break
PROCESSES_ENV = "COLLC_NCCL_LOG_PROCESSES"

# Every INIT line contains this (the pattern's INIT branch: `comm 0x.. rank R n[Rr]anks N`);
# it starts with a literal that COLL and TUNING lines lack, so the scan for it is fast.
_INIT_HINT = re.compile(rb" rank \d+ n[Rr]anks \d")


def processes() -> int:
    """How many processes may read one log: the CPUs this process may run on, or
    COLLC_NCCL_LOG_PROCESSES (a positive integer) where set."""
    wanted = os.environ.get(PROCESSES_ENV, "").strip()
    if wanted.isdigit() and int(wanted) >= 1:
        return int(wanted)
    return local_workers()


def read_split(source: TraceSource, state: State) -> Iterator[None] | None:
    """The log read by several processes into `state.collected`, a step per piece
    replayed (the records the sequential read makes before its final flush, with
    `state` left as it would leave it), or None where one process should read it: one
    CPU, a small plain file, or no way to start workers."""
    workers = processes()
    if workers < 2:
        return None
    f = source.open()
    try:
        size = _regular_file_size(f)
        if size is not None and size < PARALLEL_MIN_BYTES:
            f.close()
            return None
        pool = _pool(workers)
    except BaseException:
        f.close()
        raise
    if pool is None:
        f.close()
        return None
    if size is not None:
        speculation = _Speculation(state)
        return _run(_file_tasks(f, size, speculation), state, pool, workers, speculation)
    return _read_stream(f, state, pool, workers)


def _pool(workers: int) -> ProcessPoolExecutor | None:
    """Worker processes (started as tasks come), or None where they cannot be had safely:
    `fork` from a process that runs threads can deadlock the child, and some sandboxes
    have no semaphores for the pool's queues."""
    methods = multiprocessing.get_all_start_methods()
    if "fork" in methods and threading.active_count() > 1:
        return None
    try:
        return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context(
            "fork" if "fork" in methods else None))
    except (OSError, ImportError, NotImplementedError):
        return None


def _regular_file_size(f: BinaryIO) -> int | None:
    """The size of a plain file on disk read as is, else None (decompressed, an archive
    member, a pipe: those are read here and their pieces sent)."""
    raw = getattr(f, "raw", None)
    if type(f) is not io.BufferedReader or type(raw) is not io.FileIO \
            or not isinstance(raw.name, (str, bytes, os.PathLike)):
        return None
    info = os.fstat(f.fileno())
    return info.st_size if stat.S_ISREG(info.st_mode) else None


# --- what each worker does ----------------------------------------------------------

# (events, lines, skipped counts, (first bad line, bad lines, rejoined), context ops, INIT lines)
PieceResult = tuple


def _scan_file_range(path: str, identity: tuple[int, int], start: int, end: int,
                     comms: dict, process_rank: dict) -> PieceResult:
    """Scan bytes [start, end) of the file at `path` (whole lines)."""
    with open(path, "rb") as f:
        info = os.fstat(f.fileno())
        if (info.st_dev, info.st_ino) != identity:
            raise OSError(f"{path} was replaced while it was read")
        parts = []
        while start < end and (part := os.pread(f.fileno(), end - start, start)):
            parts.append(part)
            start += len(part)
    return _scan_bytes(parts[0] if len(parts) == 1 else b"".join(parts), path, comms, process_rank)


def _scan_bytes(data: bytes, name: str, comms: dict, process_rank: dict) -> PieceResult:
    """Scan a piece (whole lines) in place, `CHUNK_BYTES` of lines at a time (the regex
    runs faster over a stretch that stays in the CPU's caches)."""
    state = State(name, SourceSummary(name, "nccl-log"), TraceContext(), comms, process_rank,
                   record_ops=True)
    events = Events(state.shape_list, state.thread_list, state.tuning_list)
    enabled = gc.isenabled()
    gc.disable()              # the events are all kept: see sequential.scan_batch
    try:
        begin, size = 0, len(data)
        while begin < size:
            end = min(size, begin + sequential.CHUNK_BYTES)
            if end < size:
                end = (data.rfind(b"\n", begin, end) + 1 or data.find(b"\n", end) + 1) or size
            events.extend(scan(data, end, state, begin))
            begin = end
    finally:
        if enabled:
            gc.enable()
    return (events.packed(), state.lines, dict(state.summary.skipped),
            (state.first_bad, state.bad_lines, state.rejoined), state.ops, state.init_lines)


# --- what this process does ---------------------------------------------------------

class _InitTables:
    """The INIT lines' tables (`State.comms`, `State.process_rank`) as of the end of
    the pieces seen so far."""

    def __init__(self, state: State):
        self.comms, self.process_rank = dict(state.comms), dict(state.process_rank)

    def snapshot(self) -> tuple[dict, dict]:
        return dict(self.comms), dict(self.process_rank)

    def apply(self, init_lines: list[tuple]) -> None:
        """Take in INIT lines a worker read (`State.init_lines`), in order."""
        for groups, pre in init_lines:
            apply_init(groups, pre, self.comms, self.process_rank)

    def see(self, data, start: int, end: int) -> None:
        """Take in the INIT lines of data[start:end] (whole lines), in order: each line
        that holds the hint and whose match by the reader's pattern is an INIT line."""
        last_line = -1
        for hint in _INIT_HINT.finditer(data, start, end):
            line_start = data.rfind(b"\n", start, hint.start()) + 1 or start
            if line_start == last_line:
                continue
            last_line = line_start
            line_end = data.find(b"\n", hint.end(), end)
            m = LINE.search(data, line_start, end if line_end < 0 else line_end)
            if m is not None and m.group(ICOMM + 1) is not None:
                apply_init(m.groups(), bytes(data[line_start:m.start()]), self.comms, self.process_rank)


@dataclass
class _Piece:
    """A piece handed to a worker: `scan(*args)` gives its `PieceResult`. `speculative`:
    a piece of a plain file given the INIT tables as of the first piece's end, not
    checked against the pieces between (`_Speculation`)."""

    scan: Callable[..., PieceResult]
    args: tuple
    speculative: bool = False


class _Speculation:
    """The INIT tables of a plain file's pieces: those handed out (`ahead`), and those
    that truly stand at the start of the next piece to replay (`true`, from the INIT
    lines the workers send back, in order). The first piece is read here for its INIT
    lines; later ones are handed out with the tables as of its end, unread, until a
    replayed piece shows tables that differ from what a later piece was given
    (`missed`): from then on each piece is read here first, as a stream's are."""

    def __init__(self, state: State):
        self.ahead = _InitTables(state)
        self.true = _InitTables(state)
        self.reading = True           # read the next piece here before handing it out
        self.missed = False           # set on replay; the tasks' generator catches up

    def valid(self, piece: _Piece) -> bool:
        """Whether a piece was handed out with the tables that stand at its start."""
        comms, process_rank = piece.args[-2:]
        return comms == self.true.comms and process_rank == self.true.process_rank


def _file_tasks(f: BinaryIO, size: int, speculation: _Speculation) -> Iterator[_Piece]:
    """Pieces of a plain file as (start, end) offsets for the workers to read, each with
    the INIT tables as of its start, or (`speculative`) as of the first piece's end
    (see `_Speculation`): memory stays one piece whatever the file's size."""
    with f:
        fd = f.fileno()
        info = os.fstat(fd)
        path = os.fsdecode(f.name)
        identity = (info.st_dev, info.st_ino)
        tables = speculation.ahead
        start = 0
        unread: list[tuple[int, int]] = []       # pieces handed out since the last one read here
        while start < size:
            if speculation.missed and not speculation.reading:
                # Catch up: the INIT lines of the pieces handed out unread, in order.
                for lo, hi in unread:
                    data, _ = _piece_at(fd, lo, size)
                    tables.see(data, 0, hi - lo)
                unread.clear()
                speculation.reading = True
            if speculation.reading:
                # The piece goes out before it is read here (for its INIT lines, for the next).
                end = _cut_at(fd, start, size)
                yield _Piece(_scan_file_range, (path, identity, start, start + end, *tables.snapshot()))
                data, _ = _piece_at(fd, start, size)
                tables.see(data, 0, end)
                speculation.reading = speculation.missed    # after the first piece: hand out unread
            else:
                end = _cut_at(fd, start, size)
                yield _Piece(_scan_file_range, (path, identity, start, start + end, *tables.snapshot()), True)
                unread.append((start, start + end))
            start += end


def _cut_at(fd: int, start: int, size: int) -> int:
    """Where the piece from `start` ends (as `_piece_at` finds it), read from the few
    bytes before its largest end: up to the last line break in PIECE_BYTES, or the end
    of the file."""
    if size - start <= PIECE_BYTES:
        return size - start
    width = min(CUT_WINDOW, PIECE_BYTES)
    window = os.pread(fd, width, start + PIECE_BYTES - width)
    if len(window) < width:
        raise OSError(f"the file ended at byte {start + PIECE_BYTES - width + len(window)}, "
                      f"before its size of {size} bytes")
    cut = window.rfind(b"\n") + 1
    if cut == 0:             # a line longer than the window: read the piece
        return _piece_at(fd, start, size)[1]
    return PIECE_BYTES - width + cut


def _piece_at(fd: int, start: int, size: int) -> tuple[bytes, int]:
    """(data, end): the bytes from `start`, of which the first `end` make the piece: up to
    the last newline within PIECE_BYTES (or the first one after, for a longer line), or
    to the end of the file."""
    data = os.pread(fd, min(PIECE_BYTES, size - start), start)
    if not data:
        raise OSError(f"the file ended at byte {start}, before its size of {size} bytes")
    if start + len(data) >= size:
        return data, len(data)
    cut = data.rfind(b"\n") + 1
    while cut == 0 and start + len(data) < size:      # one line longer than a piece
        more = os.pread(fd, min(PIECE_BYTES, size - start - len(data)), start + len(data))
        if not more:
            break
        found = more.find(b"\n")
        data += more
        if found >= 0:
            cut = len(data) - len(more) + found + 1
    return data, cut or len(data)


def _read_stream(f: BinaryIO, state: State, pool: ProcessPoolExecutor,
                 workers: int) -> Iterator[None]:
    with f:
        try:
            head, complete = _read_ahead(f, state.name)
        except BaseException:
            pool.shutdown()
            raise
        if complete:          # small: read in this process, as the sequential reader does
            pool.shutdown()
            sequential.read_stream(io.BytesIO(head), state)
            return
        slots = _Slots.create(2 * workers + 2)
        try:
            yield from _run(_stream_tasks(f, head, state, slots), state, pool, workers)
        finally:
            if slots is not None:
                slots.close()


class _Slots:
    """Shared memory the workers inherit when they are forked: a stream's pieces are
    copied into it, a piece per slot in turn, instead of being pickled through a pipe
    (which costs about six copies of every byte, a tenth of a gzip log's read).

    A slot is written again only after `count - 1` later pieces were handed out; `_run`
    replays (so its worker has long copied it out) all but 2 x workers of those first.
    """

    def __init__(self, count: int):
        import mmap
        import secrets
        self.count, self.size, self.next = count, PIECE_BYTES, 0
        self.memory = mmap.mmap(-1, count * self.size)
        self.token = secrets.token_hex(8)
        _SHARED[self.token] = self.memory     # before the pool forks: see _scan_shared

    @classmethod
    def create(cls, count: int) -> "_Slots | None":
        if "fork" not in multiprocessing.get_all_start_methods():   # as _pool: no fork, no sharing
            return None
        try:
            return cls(count)
        except OSError:
            return None

    def task(self, piece: bytes, *args) -> _Piece:
        """The task that scans `piece`: through a slot, or pickled if it is too big for one."""
        if len(piece) > self.size:
            return _Piece(_scan_bytes, (piece, *args))
        start = self.next * self.size
        self.memory[start:start + len(piece)] = piece
        self.next = (self.next + 1) % self.count
        return _Piece(_scan_shared, (self.token, start, len(piece), *args))

    def close(self) -> None:
        _SHARED.pop(self.token, None)
        self.memory.close()


# Token -> shared memory of the pieces being read, as a worker inherits it (see _Slots).
_SHARED: dict[str, object] = {}


def _scan_shared(token: str, start: int, length: int, name: str, comms: dict,
                 process_rank: dict) -> PieceResult:
    return _scan_bytes(_SHARED[token][start:start + length], name, comms, process_rank)


def _read_ahead(f: BinaryIO, name: str) -> tuple[bytes, bool]:
    """The stream's first PARALLEL_MIN_BYTES (or all of it), read as the sequential reader
    reads (and fails); True if that is all of it."""
    chunks: list[bytes] = []
    read = 0
    while read < PARALLEL_MIN_BYTES:
        try:
            chunk = f.read(sequential.CHUNK_BYTES)
        except sequential.READ_ERRORS as e:
            lines = sum(c.count(b"\n") for c in chunks)
            raise sequential.read_error(e, name, lines + 1, read) from None
        if not chunk:
            return b"".join(chunks), True
        chunks.append(chunk)
        read += len(chunk)
    return b"".join(chunks), False


class _StreamError(Exception):
    """A stream failed to read after some pieces were handed out: the line it failed at is
    known once their workers have counted their lines (see `_run`)."""

    def __init__(self, cause: BaseException, offset: int, lines_after_pieces: int):
        super().__init__(str(cause))
        self.cause, self.offset, self.lines_after_pieces = cause, offset, lines_after_pieces


def _stream_tasks(f: BinaryIO, head: bytes, state: State, slots: "_Slots | None") -> Iterator[_Piece]:
    """Pieces of the decompressed stream (after `head`, its first bytes), each with the
    INIT tables as of its start."""
    tables = _InitTables(state)
    name = state.name
    buffered: list[bytes] = [head]
    size = len(head)
    offset = len(head)          # bytes read so far, for the error of a bad stream
    done = False
    target = PIECE_BYTES
    while True:
        while not done and size < target:
            try:
                chunk = f.read(sequential.CHUNK_BYTES)
            except sequential.READ_ERRORS as e:
                raise _StreamError(e, offset, sum(b.count(b"\n") for b in buffered)) from None
            if not chunk:
                done = True
                break
            buffered.append(chunk)
            size += len(chunk)
            offset += len(chunk)
        if size == 0:
            return
        data = b"".join(buffered) if len(buffered) > 1 else buffered[0]
        if done and len(data) <= PIECE_BYTES:
            cut = len(data)
        else:
            # Pieces of about PIECE_BYTES (the first read, of PARALLEL_MIN_BYTES, makes several).
            cut = data.rfind(b"\n", 0, PIECE_BYTES) + 1 or data.rfind(b"\n") + 1
            if cut == 0 and not done:       # one line longer than a piece: read on
                buffered, size, target = [data], len(data), len(data) + 1
                continue
            cut = cut or len(data)
        target = PIECE_BYTES
        piece = data[:cut] if cut < len(data) else data
        args = (name, *tables.snapshot())
        yield slots.task(piece, *args) if slots is not None else _Piece(_scan_bytes, (piece, *args))
        tables.see(piece, 0, len(piece))
        rest = data[cut:]
        buffered, size = [rest], len(rest)


def _run(tasks: Iterator[_Piece], state: State, pool: ProcessPoolExecutor, workers: int,
         speculation: _Speculation | None = None) -> Iterator[None]:
    """Hand the tasks to the pool, at most two per worker in flight, and replay their
    results in order (a step per piece)."""
    line_base = state.lines
    in_flight: deque[tuple[Future, _Piece]] = deque()
    try:
        try:
            for task in tasks:
                in_flight.append((pool.submit(task.scan, *task.args), task))
                if len(in_flight) > 2 * workers:
                    line_base = _merge(*in_flight.popleft(), line_base, state, speculation)
                    yield
        except _StreamError as e:
            # The lines before the failed read: the replayed pieces', the pieces in
            # flight (as their workers count them) and the unfinished piece's.
            lines = line_base + sum(future.result()[1] for future, _ in in_flight) + e.lines_after_pieces
            raise sequential.read_error(e.cause, state.name, lines + 1, e.offset) from None
        while in_flight:
            line_base = _merge(*in_flight.popleft(), line_base, state, speculation)
            yield
    finally:
        for future, _ in in_flight:
            future.cancel()
        pool.shutdown(wait=True)
    state.lines = line_base


def _merge(future: Future, piece: _Piece, line_base: int, state: State,
           speculation: _Speculation | None) -> int:
    """Replay a piece's events into `state.collected`; its counts, first malformed line
    and context ops taken into `state`. A piece handed out with INIT tables other than
    those that stand at its start is scanned again here. Returns the number of lines
    before the next piece."""
    result = future.result()
    if speculation is not None:
        if piece.speculative and not speculation.valid(piece):
            speculation.missed = True
            result = piece.scan(*piece.args[:-2], *speculation.true.snapshot())
        speculation.true.apply(result[5])
    events, lines, skipped, (first_bad, bad_lines, rejoined), ops, _init_lines = result
    apply_ops(ops, state)
    state.summary.skipped.update(skipped)
    if first_bad is not None and state.first_bad is None:
        state.first_bad = line_base + first_bad
    room = BAD_LINES_KEPT - len(state.bad_lines)
    state.bad_lines.extend(line_base + n for n in bad_lines[:max(room, 0)])
    state.rejoined += rejoined
    enabled = gc.isenabled()
    gc.disable()
    try:
        replay(events, line_base, state)
    finally:
        if enabled:
            gc.enable()
    return line_base + lines
