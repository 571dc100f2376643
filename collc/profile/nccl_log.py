"""NCCL debug logs (`NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=COLL`, or INIT,COLL,TUNING), plain or gzip.

One record per COLL line (`AllReduce: opCount ... count N datatype D ... comm 0x.. [nranks=N]
stream 0x..`), NCCL 2.4 to current and RCCL (` task <n> globalrank <r>`, `acc (nil)`), in
whatever prefix the launcher adds (`host:pid:tid [dev]`, `(RayTrainWorker pid=615, ...)`,
`[rank3]:`, timestamps). Many processes may write one file; calls are keyed by (host, pid,
comm pointer). `INIT` lines (`comm 0x.. rank R nranks N ... commId 0x..`) give a comm's rank,
size and job-wide id; TUNING lines (`AllReduce: <bytes> Bytes -> Algo RING proto SIMPLE ...`)
the algorithm and protocol of the calls just logged by the same thread; they are never
counted as calls.

`count` is elements, and its meaning depends on the collective (reference section 5):
AllGather and Gather log the per-rank send count, ReduceScatter and Scatter the per-rank
receive count, AlltoAll the per-peer count; the rest the buffer. `bytes` is nccl-tests' size.

The file is scanned in chunks with one compiled regex anchored on `NCCL INFO`: lines that
are not INIT, COLL or TUNING lines cost a C-level scan and no Python at all. The scan
(`_scan`) makes compact events of the COLL and TUNING lines; the replay (`_replay`) makes
the records, in order. A big log is scanned by several processes and replayed here
(`nccl_log_split`), with the same code and the same result.
"""

from __future__ import annotations

import calendar
import functools
import gc
import re
import sys
import time
import zlib
from array import array
from itertools import repeat
from typing import BinaryIO, Iterator

from ..diagnostics import CollcError, Span
from .detect import TraceSource
from .records import CollectiveCall, SourceSummary, TraceContext

CHUNK_BYTES = 1 << 20     # fits the CPU caches: larger pieces read slower
PIECES_PER_BATCH = 64     # 64 MiB of log, ~160k records: see _scan_batch

# ncclDataType_t codes (NCCL 2.4 on; bfloat16 from 2.10, fp8 from 2.19; RCCL uses the same).
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
    9: ("bfloat16", 2), 10: ("fp8_e4m3", 1), 11: ("fp8_e5m2", 1)}

COLLECTIVE_OPS = {
    b"AllReduce": "allreduce", b"AllGather": "allgather", b"ReduceScatter": "reducescatter",
    b"Broadcast": "broadcast", b"Reduce": "reduce", b"Send": "send", b"Recv": "recv",
    b"AlltoAll": "alltoall", b"AllToAll": "alltoall", b"Gather": "gather", b"Scatter": "scatter"}

# The count is one rank's part for these (sizes need nranks): (in_factor, out_factor) in
# units of count x element size, where n is the communicator size.
_PER_RANK = {"allgather": (1, "n"), "gather": (1, "n"), "reducescatter": ("n", 1),
             "scatter": ("n", 1), "alltoall": ("n", "n")}

# Every line of interest. The pattern starts with a literal, so the regex engine jumps from
# one "NCCL INFO " to the next with a fast search; the prefix before it is taken separately.
# Every repeat is possessive (`++`, `*+`): what follows each can never be matched by it (a
# space after `\S`, a colon after a word), so giving back characters could never succeed,
# and a line that does not match fails at once instead of retrying each shorter word.
# Python 3.10 has no possessive repeats: there the pattern without them matches exactly
# the same text, only slower.
_LINE_PATTERN = (
    rb"NCCL INFO "
    # What each alternative below needs to start with, tested once: most "NCCL INFO" lines
    # are none of them, and fail here after one look at their first word instead of four.
    rb"(?=[A-Za-z]*+: (?:opCount|\d)|\d|(?:\w++ )?comm )"
    rb"(?:"
    # COLL: <Op>: opCount <hex> sendbuff <p> recvbuff <p> [acc <p>] count <n> datatype <d>
    #       op <o> root <r> comm <p> [nranks=<n>] stream <p> [task <t> globalrank <g>]
    rb"(?P<op>[A-Za-z]++): opCount (?P<opcount>[0-9a-fA-Fx]++) sendbuff \S++ recvbuff \S++"
    rb"(?: acc \S++)? (?P<shape>count (?P<count>\d++) datatype (?P<dtype>\d++) op (?P<redop>\d++)"
    rb" root (?P<root>-?\d++) comm (?P<comm>\S++)(?: \[nranks=(?P<nranks>\d++)\])?)"
    rb"(?: stream (?P<stream>\S++))?(?: task (?P<task>\d++) globalrank (?P<grank>\d++))?"
    rb"[^\n]*+"
    # TUNING: [<Op>: ]<bytes> Bytes -> Algo <a> proto <p> ...
    rb"|(?P<tuning>(?:(?P<top>[A-Za-z]++): )?(?P<tbytes>\d++) Bytes -> Algo (?P<algo>\w++) proto (?P<proto>\w++))"
    rb"[^\n]*+"
    # INIT: ... comm 0x.. rank R nranks N ... [busId B] ... [commId 0x..]
    rb"|(?:\w++ )?comm (?P<icomm>0x[0-9a-fA-F]++) rank (?P<irank>\d++) n[Rr]anks (?P<inranks>\d++)"
    rb"(?P<initrest>[^\n]*+)"
    # A line that starts like a COLL line but matched none of the above.
    rb"|(?P<bad>[A-Za-z]++: opCount)[^\n]*+"
    rb")")
if sys.version_info < (3, 11):
    _LINE_PATTERN = _LINE_PATTERN.replace(b"++", b"+").replace(b"*+", b"*")
_LINE = re.compile(_LINE_PATTERN)
# Group numbers of _LINE, for reading a match's groups() tuple without name lookups.
_G = {name: index - 1 for name, index in _LINE.groupindex.items()}
_OP, _OPCOUNT, _SHAPE, _COUNT, _DTYPE, _ROOT, _COMM, _NRANKS, _GRANK = (
    _G[n] for n in ("op", "opcount", "shape", "count", "dtype", "root", "comm", "nranks", "grank"))
_TUNING, _TOP, _TBYTES, _ALGO, _PROTO = (_G[n] for n in ("tuning", "top", "tbytes", "algo", "proto"))
_ICOMM, _IRANK, _INRANKS, _INITREST = (_G[n] for n in ("icomm", "irank", "inranks", "initrest"))

_PROCESS = re.compile(rb"(?P<host>[^\s:\]\[()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] $")
_RANK_PREFIX = re.compile(rb"\[(?:rank|Rank)\s*(?P<rank>\d+)\]|\brank(?P<rank2>\d+)\]?:")
_MPI_PREFIX = re.compile(rb"^\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")
_TIMESTAMP = re.compile(rb"(?P<date>\d{4}-\d\d-\d\d)[ T](?P<time>\d\d:\d\d:\d\d)(?P<frac>\.\d+)?")
_COMM_ID = re.compile(rb"commId (?P<id>0x[0-9a-fA-F]+)")


class _State:
    """What the log has said so far: comms (INIT lines), calls awaiting their TUNING line.

    The scan (`_scan`) turns lines into events and keeps what later lines' meaning depends
    on (comms, the process ranks, line numbers); `_replay` turns events into records and
    keeps the calls that wait for a TUNING line (`pending`). A worker process scanning one
    byte range of a big log gets the comms as of the range's start (`nccl_log_split`), and
    records what it tells the shared context (`ops`) instead of telling it, so that the
    parent can replay that in file order.
    """

    def __init__(self, name: str, summary: SourceSummary, context: TraceContext,
                 comms: dict | None = None, process_rank: dict | None = None,
                 record_ops: bool = False):
        self.name, self.summary, self.context = name, summary, context
        # (pid, comm pointer) -> (rank, nranks, job-wide communicator id or None). Not the
        # host: when processes share a terminal, other output gets glued to the front of a
        # line ("...  -1mew0:64904:64904 [0] NCCL INFO AllReduce: ..."), so it is unreliable.
        self.comms: dict[tuple[bytes, bytes], tuple[int, int, str | None]] = dict(comms or {})
        # pid -> (nranks, rank) of its largest communicator: the process's global rank.
        self.process_rank: dict[bytes, tuple[int, int]] = dict(process_rank or {})
        self.pending: dict[tuple[bytes, bytes], list[CollectiveCall]] = {}
        self.first_bad: int | None = None
        self.shapes: dict[tuple, int] = {}        # see _scan: a key -> its index in shape_list, or -1
        self.shape_list: list[tuple] = []         # see _coll_shape
        self.threads: dict[bytes, int] = {}       # line prefix -> its index in thread_list
        self.thread_list: list[tuple[bytes, bytes]] = []      # (pid, tid)
        self.tunings: dict[bytes, int] = {}       # TUNING line's text -> its index in tuning_list
        self.tuning_list: list[tuple] = []        # see _tuning
        self.seqs: dict[bytes, int] = {}          # opCount text -> its value
        self.process_local_comms = 0
        self.lines = 0                            # lines before the piece being scanned
        # What the scan would tell `context`, in order, when it must not tell it itself.
        self.ops: list[tuple] | None = [] if record_ops else None

    def trim(self) -> None:
        """Forget the shapes, threads and TUNING lines of events already replayed, if many."""
        if max(len(self.shape_list), len(self.thread_list), len(self.tuning_list)) > 100_000:
            for table in (self.shapes, self.shape_list, self.threads, self.thread_list,
                          self.tunings, self.tuning_list):
                table.clear()

    def saw_comm(self, comm_id: str | None, nranks: int) -> None:
        """An INIT line's communicator (and the world size it implies)."""
        if self.ops is not None:
            self.ops.append(("init", comm_id, nranks))
        else:
            _apply_init_op(self.context, comm_id, nranks)

    def process_local_comm(self, communicator: str, nranks: int | None) -> None:
        """A communicator no INIT line names: counted once, the first time it is seen."""
        if communicator in self.context.communicators:
            return
        if self.ops is not None:
            # The worker's own context only stops repeats; the parent checks its own.
            self.context.communicator(communicator, nranks)
            self.ops.append(("local", communicator, nranks))
        else:
            self.process_local_comms += 1
            self.context.communicator(communicator, nranks)


def _apply_init_op(context: TraceContext, comm_id: str | None, nranks: int) -> None:
    context.saw_world_size(nranks)
    if comm_id is not None:
        context.communicator(comm_id, nranks)


def apply_ops(ops: list[tuple], state: _State) -> None:
    """Tell the shared context, in order, what a worker's scan recorded in `ops`."""
    for kind, communicator, nranks in ops:
        if kind == "init":
            _apply_init_op(state.context, communicator, nranks)
        else:
            state.process_local_comm(communicator, nranks)


def read_nccl_log(source: TraceSource, summary: SourceSummary, context: TraceContext
                  ) -> Iterator[CollectiveCall]:
    state = _State(source.name, summary, context)
    from .nccl_log_split import read_split      # the same records, several processes
    split = read_split(source, state)
    if split is not None:
        for calls in split:       # lists, not calls: one generator less for each call to pass
            yield from calls
    else:
        with source.open() as f:
            pieces = _chunks(f, state)
            while (calls := _scan_batch(pieces, state)) is not None:
                yield from calls
    yield from finish(state)


def finish(state: _State) -> list[CollectiveCall]:
    """The calls still waiting for a TUNING line at the end of the log; notes and the
    error of a log none of whose COLL lines could be read."""
    out: list[CollectiveCall] = []
    for calls in state.pending.values():
        out.extend(calls)
    state.pending.clear()
    summary, context, name = state.summary, state.context, state.name
    summary.records += len(out)
    if state.first_bad is not None:
        bad = summary.skipped.get("COLL line in no known format", 0)
        if summary.records == 0:
            raise CollcError("no COLL line of this NCCL log is in a known format",
                             Span(name, state.first_bad, 1))
        context.notes.append(f"{name}: {bad} COLL lines in no known format were skipped "
                             f"(first at line {state.first_bad})")
    if state.process_local_comms:
        context.notes.append(f"{name}: no INIT line gives a job-wide commId for "
                             f"{state.process_local_comms} communicators; they are named by "
                             "host:pid:comm pointer, so calls cannot be matched across processes")
    return out


def _chunks(f: BinaryIO, state: _State) -> Iterator[tuple[bytes, int]]:
    """(data, end): the (decompressed) file in pieces whose first `end` bytes are whole
    lines; the bytes after `end` begin the next piece. Not sliced to `end` (the regex
    takes an end position), so each piece is copied once, not twice. `_scan` counts the
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


def _scan_batch(pieces: Iterator[tuple[bytes, int]], state: _State) -> list[CollectiveCall] | None:
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
            _replay(_scan(data, end, state), 0, state, out)
            state.trim()
            scanned += 1
            if scanned == PIECES_PER_BATCH:
                break
        return out if scanned else None
    finally:
        if enabled:
            gc.enable()


class Events:
    """What a scan saw, in file order, as columns (cheap to send between processes).

    `ids[k]` is a COLL line's shape (an index into `shapes`: see `_coll_shape`) or, as
    `~j`, the thread `threads[j]` (pid, tid) of a TUNING line; `lines`, `seqs` and
    `stamps` hold a COLL line's line number, opCount and timestamp, and a TUNING line's
    0, its index in `tunings` (see `_tuning`) and None. `stamps` is None where no line had
    a timestamp.
    """

    __slots__ = ("ids", "lines", "seqs", "stamps", "shapes", "threads", "tunings")

    def __init__(self, shapes: list, threads: list, tunings: list):
        self.ids: list[int] = []
        self.lines: list[int] = []
        self.seqs: list[int] = []
        self.stamps: list[float | None] | None = None
        self.shapes, self.threads, self.tunings = shapes, threads, tunings

    def extend(self, more: "Events") -> None:
        """Append the events of the next piece of the same scan (same shapes and tunings)."""
        if more.stamps is not None or self.stamps is not None:
            self.stamps = ((self.stamps if self.stamps is not None else [None] * len(self.ids))
                           + (more.stamps if more.stamps is not None else [None] * len(more.ids)))
        self.ids += more.ids
        self.lines += more.lines
        self.seqs += more.seqs

    def packed(self) -> "Events":
        """The same events with the columns as arrays: pickled as bytes, not per value."""
        out = Events(self.shapes, self.threads, self.tunings)
        out.ids, out.lines = array("q", self.ids), array("q", self.lines)
        try:
            out.seqs = array("Q", self.seqs)
        except OverflowError:          # an opCount of more than 64 bits: kept as ints
            out.seqs = self.seqs
        out.stamps = self.stamps
        return out

    def __getstate__(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __setstate__(self, values):
        for name, value in zip(self.__slots__, values):
            setattr(self, name, value)


def _scan(data: bytes, end: int, state: _State, begin: int = 0) -> Events:
    """The events of `data[begin:end]` (whole lines), in file order.

    The hot path of the reader, one pass per line of interest, written for speed: the
    regex's groups are read by index from locals, the line number is counted only for
    lines that need one (COLL lines and malformed ones), everything that depends only on
    the line's prefix, comm and shape comes from a cache (`state.shapes`), and the
    thread of a TUNING line from a cache keyed by its prefix. What to make of the events
    (records, and which TUNING line completes which call) is `_replay`'s.
    """
    events = Events(state.shape_list, state.thread_list, state.tuning_list)
    ids, lines, seqs_out = events.ids, events.lines, events.seqs
    add_id, add_line, add_seq = ids.append, lines.append, seqs_out.append
    stamps: list[float | None] | None = None
    pos, line = begin, state.lines + 1     # `line` = the number of the line at offset `pos`
    rfind, count = data.rfind, data.count
    shapes, threads, tunings = state.shapes, state.threads, state.tunings
    # opCount text -> value: values repeat (one per comm of the file; NCCL 2.27 logs 0 on every line)
    seqs = state.seqs
    summary = state.summary
    COLL_GROUPS = (_OP + 1, _OPCOUNT + 1, _SHAPE + 1, _GRANK + 1)
    TUNING = _TUNING + 1      # the group that ends a TUNING line's match: its `lastindex`
    ICOMM = _ICOMM + 1
    for m in _LINE.finditer(data, begin, end):
        start = m.start()
        line_start = rfind(b"\n", 0, start) + 1
        pre = data[line_start:start]
        op, opcount, shape_text, grank = m.group(*COLL_GROUPS)
        if op is not None:
            line += count(b"\n", pos, line_start)
            pos = line_start
            if b"-" in pre:                    # a timestamp (NCCL >= 2.26, or the launcher's)
                ts, pre = _timestamp(pre)
                if stamps is None:
                    stamps = [None] * len(ids)
            else:
                ts = None
            key = (pre, op, shape_text, grank)
            sid = shapes.get(key)
            if sid is None:
                if len(shapes) > 100_000:
                    shapes.clear()
                sid = shapes[key] = _coll_shape(m.groups(), pre, state)
            if sid < 0:
                summary.skip(f"COLL line of an unknown operation ({op.decode(errors='replace')})")
                continue
            seq = seqs.get(opcount)
            if seq is None:
                if len(seqs) > 100_000:
                    seqs.clear()
                seq = seqs[opcount] = int(opcount, 16)
            add_id(sid)
            add_line(line)
            add_seq(seq)
            if stamps is not None:
                stamps.append(ts)
        elif m.lastindex == TUNING:
            thread = threads.get(pre)
            if thread is None:
                thread = _thread(pre, state)
            tuning = tunings.get(m.group(TUNING))
            if tuning is None:
                tuning = _tuning(m, state)
            add_id(~thread)
            add_line(0)
            add_seq(tuning)
            if stamps is not None:
                stamps.append(None)
        elif m.group(ICOMM) is not None:
            _init_line(m.groups(), pre, state)
        else:
            line += count(b"\n", pos, line_start)
            pos = line_start
            summary.skip("COLL line in no known format")
            if state.first_bad is None:
                state.first_bad = line
    state.lines = line - 1 + count(b"\n", pos, end)
    events.stamps = stamps
    return events


def _replay(events: Events, line_base: int, state: _State, out: list[CollectiveCall]) -> None:
    """Records of the events (line numbers `line_base` on), appended to `out` in the order
    they are complete: a call waits for the TUNING line its thread logs after it (which
    gives its algorithm and protocol), unless its thread has no TUNING lines (more than
    512 calls wait) or many threads wait at once (more than 64)."""
    pending, name, summary = state.pending, state.name, state.summary
    shape_list, thread_list, tuning_list = events.shapes, events.threads, events.tunings
    call_record = CollectiveCall
    emitted = len(out)
    stamps = events.stamps if events.stamps is not None else repeat(None)
    for sid, a, b, ts in zip(events.ids, events.lines, events.seqs, stamps):
        if sid >= 0:
            thread, coll, rank, comm, nranks, dtype, n, nbytes, in_b, out_b, peer = shape_list[sid]
            call = call_record(name, f"line {a + line_base}", coll, rank, comm, nranks, dtype, n,
                               nbytes, b, ts, None, peer, None, None, None, "log", in_b, out_b)
            calls = pending.get(thread)
            if calls is not None:
                calls.append(call)
                if len(calls) > 512:       # no TUNING lines in this log: do not hold calls back
                    out.extend(calls)
                    calls.clear()
            else:
                pending[thread] = [call]
                if len(pending) > 64:      # many threads wait for a TUNING line: do not hold calls back
                    for calls in pending.values():
                        out.extend(calls)
                    pending.clear()
        else:
            calls = pending.pop(thread_list[~sid], None)
            if calls:
                coll, nbytes, algo, proto = tuning_list[b]
                # The calls this thread has just logged of the TUNING line's operation
                # and size (a thread may log several calls before one TUNING line).
                for call in calls:
                    if call.algorithm is None and (coll is None or call.collective == coll):
                        size = call.bytes
                        if size == nbytes or size is None:
                            call.algorithm, call.protocol = algo, proto
                out.extend(calls)
            else:
                summary.skip("TUNING line with no COLL line before it")
    summary.records += len(out) - emitted


def _timestamp(pre: bytes) -> tuple[float | None, bytes]:
    """(time in us, the prefix without it) of a prefix that may hold a timestamp. The
    timestamp is left out of the prefix so that the prefix still keys the shape cache."""
    t = _TIMESTAMP.search(pre)
    if t is None:
        return None, pre
    return _epoch_us(t.group("date"), t.group("time"), t.group("frac")), pre[:t.start()] + pre[t.end():]


def _thread(pre: bytes, state: _State) -> int:
    """The index in `state.thread_list` of a line prefix's (pid, tid), remembered unless
    the prefix has a timestamp (those never repeat)."""
    _host, pid, tid, _rank, ts = _process(pre)
    state.thread_list.append((pid, tid))
    index = len(state.thread_list) - 1
    if ts is None:
        if len(state.threads) > 100_000:
            state.threads.clear()
        state.threads[pre] = index
    return index


_prefix_cache: dict[bytes, tuple[bytes, bytes, bytes, int | None, float | None]] = {}


def _process(pre: bytes) -> tuple[bytes, bytes, bytes, int | None, float | None]:
    """(host, pid, tid, rank from a launcher prefix, timestamp in us) of a line's prefix."""
    cached = _prefix_cache.get(pre)
    if cached is not None:
        return cached
    p = _PROCESS.search(pre)
    host, pid, tid = (p.group("host"), p.group("pid"), p.group("tid")) if p else (b"", b"", b"")
    rank = None
    if b"ank" in pre:
        r = _RANK_PREFIX.search(pre)
        if r:
            rank = int(r.group("rank") or r.group("rank2"))
    elif pre.startswith(b"[") and b"<std" in pre:
        r = _MPI_PREFIX.search(pre)
        if r:
            rank = int(r.group("rank"))
    ts = None
    if b"-" in pre:
        t = _TIMESTAMP.search(pre)
        if t:
            ts = _epoch_us(t.group("date"), t.group("time"), t.group("frac"))
    result = (host, pid, tid, rank, ts)
    if ts is None:                           # prefixes with a timestamp never repeat
        if len(_prefix_cache) > 100_000:
            _prefix_cache.clear()
        _prefix_cache[pre] = result
    return result


@functools.lru_cache(maxsize=4096)
def _epoch_seconds(date: bytes, clock: bytes) -> int:
    return calendar.timegm(time.strptime((date + b" " + clock).decode(), "%Y-%m-%d %H:%M:%S"))


def _epoch_us(date: bytes, clock: bytes, frac: bytes | None) -> float:
    """Microseconds since the epoch of a `YYYY-MM-DD HH:MM:SS[.ffffff]` timestamp (UTC)."""
    return _epoch_seconds(date, clock) * 1e6 + (float(frac) * 1e6 if frac else 0.0)


def _host_name(host: bytes) -> str:
    return host.decode(errors="replace")


def _init_line(g: tuple, pre: bytes, state: _State) -> None:
    comm_id, nranks = apply_init(g, pre, state.comms, state.process_rank)
    state.shapes.clear()
    state.saw_comm(comm_id, nranks)


def apply_init(g: tuple, pre: bytes, comms: dict, process_rank: dict) -> tuple[str | None, int]:
    """What an INIT line (the groups `g` of its match, `pre` the text before `NCCL INFO`)
    tells later COLL lines: its comm's rank, size and id into `comms`, the process's
    rank into `process_rank`. Returns (communicator id or None, nranks)."""
    host, pid, _tid, _rank, _ts = _process(pre)
    cid = _COMM_ID.search(g[_INITREST])
    comm_id = cid.group("id").decode() if cid else None
    nranks = int(g[_INRANKS])
    key = (pid, g[_ICOMM])
    before = comms.get(key)
    if comm_id is None and before is not None:
        comm_id = before[2]          # "Destroy COMPLETE" lines repeat the comm without commId
    rank = int(g[_IRANK])
    comms[key] = (rank, nranks, comm_id)
    if nranks > process_rank.get(pid, (0, 0))[0]:
        process_rank[pid] = (nranks, rank)
    return comm_id, nranks


def _coll_shape(g: tuple, pre: bytes, state: _State) -> int:
    """The index in `state.shape_list` of the COLL line's (thread, collective, rank,
    communicator, nranks, dtype, count, bytes, in_bytes, out_bytes, peer), or -1 for an
    operation NCCL does not have. `peer` is the root of a Send/Recv."""
    host, pid, tid, rank, _ts = _process(pre)
    shape = _shape(g, host, pid, g[_COMM], rank, state)
    if shape is _UNKNOWN_OP:
        return -1
    peer = int(g[_ROOT]) if shape[0] in ("send", "recv") else None
    state.shape_list.append(((pid, tid), *shape, peer))
    return len(state.shape_list) - 1


_UNKNOWN_OP = object()


def _shape(g: tuple, host: bytes, pid: bytes, comm_ptr: bytes, rank: int | None, state: _State):
    coll = COLLECTIVE_OPS.get(g[_OP])
    if coll is None:
        return _UNKNOWN_OP
    dtype_code = int(g[_DTYPE])
    dtype, size = DATATYPES.get(dtype_code, (f"datatype {dtype_code}", None))
    known = state.comms.get((pid, comm_ptr))
    nranks = int(g[_NRANKS]) if g[_NRANKS] is not None else (known[1] if known else None)
    if g[_GRANK] is not None:
        rank = int(g[_GRANK])
    elif rank is None:
        # A comm-local rank is the global one only in a communicator as large as any of
        # the process's (one process may drive several GPUs, each a rank of that size).
        largest = state.process_rank.get(pid)
        if known is not None and (largest is None or known[1] >= largest[0]):
            rank = known[0]
        elif largest is not None:
            rank = largest[1]
    if known is not None and known[2] is not None:
        communicator = known[2]
    else:
        communicator = f"{_host_name(host)}:{pid.decode()}:{comm_ptr.decode()}"
        state.process_local_comm(communicator, nranks)
    count = int(g[_COUNT])
    in_b, out_b, nbytes = _sizes(coll, count, size, nranks)
    return coll, rank, communicator, nranks, dtype, count, nbytes, in_b, out_b


def _sizes(coll: str, count: int, size: int | None, nranks: int | None
           ) -> tuple[int | None, int | None, int | None]:
    """(send buffer, receive buffer, nccl-tests size) in bytes of one rank's call."""
    if size is None:
        return None, None, None
    part = count * size
    factors = _PER_RANK.get(coll)
    if factors is None:
        in_b = None if coll == "recv" else part
        out_b = None if coll == "send" else part
        return in_b, out_b, part
    in_f, out_f = (nranks if f == "n" else f for f in factors)
    in_b = part * in_f if in_f is not None else None
    out_b = part * out_f if out_f is not None else None
    if coll in ("allgather", "gather"):
        return in_b, out_b, out_b
    return in_b, out_b, in_b     # reducescatter, scatter, alltoall: the send buffer


def _tuning(m: re.Match, state: _State) -> int:
    """The index in `state.tuning_list` of a TUNING line's (collective or None, bytes,
    algorithm, protocol), remembered by the line's text."""
    top, tbytes, algo, proto = m.group(_TOP + 1, _TBYTES + 1, _ALGO + 1, _PROTO + 1)
    if len(state.tunings) > 100_000:
        state.tunings.clear()
    state.tuning_list.append((COLLECTIVE_OPS.get(top) if top else None, int(tbytes),
                              algo.decode(), proto.decode()))
    index = state.tunings[m.group(_TUNING + 1)] = len(state.tuning_list) - 1
    return index
