"""The scanning core of the NCCL log reader: one regex for the lines of interest, the
scan that makes compact events of them, and the replay that makes the records.

The file is scanned in chunks. One `findall` of a whole-line pattern (`WHOLE_LINE`) gives
a tuple per line: the lines that are one intact COLL record are read a field at a time
over the chunk, with no Python per line; the others where anything could be read (INIT
and TUNING lines, malformed or merged records) go through one compiled regex (`LINE`)
anchored on `NCCL INFO`, one match at a time, in file order; lines that are neither cost
a C-level scan and no Python at all. The scan (`scan`) makes compact events of the COLL
and TUNING lines; the replay (`replay`) makes the records, in order. Both readers above this module use it: the sequential one
(`sequential`) in this process, the parallel one (`parallel`) with the scans in worker
processes and the replay here, with the same code and the same result.
"""

from __future__ import annotations

import calendar
import functools
import re
import sys
import time
from array import array
from itertools import compress, islice, repeat
from typing import Sequence
from operator import is_not, itemgetter

import numpy as np

from ...diagnostics import CollcError, Span
from ...limits import int_limit
from ..collectives import COLLECTIVE_OPS, call_sizes
from ..records import SourceSummary, TraceContext
from .collected import Collected

# ncclDataType_t codes (NCCL 2.4 on; bfloat16 from 2.10, fp8 from 2.19; RCCL uses the same).
DATATYPES: dict[int, tuple[str, int]] = {
    0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
    5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8),
    9: ("bfloat16", 2), 10: ("fp8_e4m3", 1), 11: ("fp8_e5m2", 1)}

# Every repeat in these patterns is possessive (`++`, `*+`): what follows each can never be
# matched by it (a space after `\S`, a colon after a word), so giving back characters could
# never succeed, and a line that does not match fails at once instead of retrying each
# shorter word. Python 3.10 has no possessive repeats: there the patterns without them
# match exactly the same text, only slower.
# What each alternative of LINE needs to start with, tested once: most "NCCL INFO" lines
# are none of them, and fail here after one look at their first word instead of four.
_LOOKAHEAD = rb"(?=[A-Za-z]*+: (?:opCount|\d)|\d|(?:\w++ )?comm )"
# COLL: <Op>: opCount <hex> sendbuff <p> recvbuff <p> [acc <p>] count <n> datatype <d>
#       op <o> root <r> comm <p> [nranks=<n>] stream <p> [task <t> globalrank <g>]
_COLL_HEAD = (rb"(?P<op>[A-Za-z]++): opCount (?P<opcount>[0-9a-fA-Fx]++) sendbuff \S++ recvbuff \S++"
              rb"(?: acc \S++)? ")
_COLL_TAIL = (
    rb"(?P<shape>count (?P<count>\d++) datatype (?P<dtype>\d++) op (?P<redop>\d++)"
    rb" root (?P<root>-?\d++) comm (?P<comm>\S++)(?: \[nranks=(?P<nranks>\d++)\])?)"
    rb"(?: stream (?P<stream>\S++))?(?: task (?P<task>\d++) globalrank (?P<grank>\d++))?")
_COLL_PATTERN = _COLL_HEAD + _COLL_TAIL
# TUNING: [<Op>: ]<bytes> Bytes -> Algo <a> proto <p> ...
_TUNING_PATTERN = (rb"(?:(?P<top>[A-Za-z]++): )?(?P<tbytes>\d++) Bytes -> Algo (?P<algo>\w++) proto (?P<proto>\w++)")
# Every line of interest. The pattern starts with a literal, so the regex engine jumps from
# one "NCCL INFO " to the next with a fast search; the prefix before it is taken separately.
_LINE_PATTERN = (
    rb"NCCL INFO " + _LOOKAHEAD + rb"(?:" + _COLL_PATTERN +
    rb"|(?P<tuning>" + _TUNING_PATTERN + rb")"
    # INIT: ... comm 0x.. rank R nranks N ... [busId B] ... [commId 0x..]
    rb"|(?:\w++ )?comm (?P<icomm>0x[0-9a-fA-F]++) rank (?P<irank>\d++) n[Rr]anks (?P<inranks>\d++)"
    rb"(?P<initrest>[^\n]*+)"
    # A line that starts like a COLL line but matched none of the above.
    # No alternative but INIT's takes the rest of its line: when several processes write
    # one terminal, a newline gets lost and two records share a line, or a broken record
    # is followed by an intact one ("... recvmew0:7:7 [1] NCCL INFO AllReduce: ..."); the
    # search then goes on from where the record ended and finds the next one.
    rb"|(?P<bad>[A-Za-z]++: opCount)"
    rb")")
# One match per line, for the bulk scan (`scan`): a line that is one COLL record after its
# prefix (the first `NCCL INFO ` of the line starts it) gives (prefix, op, opCount, the
# record's text from `count` to the end of the line, b"", b""), read by the same
# sub-pattern as LINE's up to `count`; the rest is checked once per distinct text
# against the record's tail (`_RECORD_TAIL`, in `scan`: a line with more after the
# record, such as a second record, is then read by LINE): reading every line's tail
# field by field took a fifth of the regex's time. A TUNING line of the same form (its
# text after the first `NCCL INFO `, and no other `NCCL INFO ` after it: what
# NCCL_DEBUG_SUBSYS=COLL,TUNING writes after every call) gives (prefix, b"", b"", b"",
# its TUNING text, b""); a line where LINE could match anything else (an INIT line, a
# malformed or merged record: a `NCCL INFO ` followed by what LINE's alternatives start
# with) gives its `NCCL INFO ` as the last field, and is read by LINE; any other line
# gives empty fields. `findall` then returns a tuple per line: the line numbers are the
# indices, and no match object is made.
_BEFORE_FIRST_INFO = rb"(?:[^N\n]++|N(?!CCL INFO ))*+"       # a line's text up to its first `NCCL INFO `


def _plain_groups(pattern: bytes, kept: tuple[bytes, ...]) -> bytes:
    """`pattern` with its named groups in `kept` made plain groups, the others non-capturing."""
    return re.sub(rb"\(\?P<(\w+)>", lambda m: b"(" if m.group(1) in kept else b"(?:", pattern)


_WHOLE_LINE_PATTERN = (
    rb"(?:(" + _BEFORE_FIRST_INFO + rb")NCCL INFO (?:"
    + _plain_groups(_COLL_HEAD, (b"op", b"opcount")) + rb"(count [^\n]*+)"
    + rb"|(" + _plain_groups(_TUNING_PATTERN, ()) + rb")" + _BEFORE_FIRST_INFO + rb"$)"
    + rb"|(?:[^N\n]++|N(?!CCL INFO " + _LOOKAHEAD + rb"))*+(NCCL INFO " + _LOOKAHEAD + rb")?[^\n]*+)\n?")
if sys.version_info < (3, 11):
    _LINE_PATTERN = _LINE_PATTERN.replace(b"++", b"+").replace(b"*+", b"*")
    _COLL_TAIL = _COLL_TAIL.replace(b"++", b"+")
    _TUNING_PATTERN = _TUNING_PATTERN.replace(b"++", b"+")
    # A run inside a repeat (`(?:[^N\n]+|...)*`) would backtrack through every way of
    # splitting the run: one character a turn keeps the repeat unambiguous, so linear.
    _WHOLE_LINE_PATTERN = (_WHOLE_LINE_PATTERN.replace(rb"[^N\n]++|", rb"[^N\n]|")
                           .replace(b"++", b"+").replace(b"*+", b"*"))
LINE = re.compile(_LINE_PATTERN)
_TUNING_TEXT = re.compile(rb"(?P<tuning>" + _TUNING_PATTERN + rb")")    # a claimed TUNING line's text
WHOLE_LINE = re.compile(_WHOLE_LINE_PATTERN, re.MULTILINE)
_RECORD_TAIL = re.compile(_plain_groups(_COLL_TAIL, ()))     # fullmatch: a COLL record's text from `count` on
# Group numbers of LINE, for reading a match's groups() tuple without name lookups.
_G = {name: index - 1 for name, index in LINE.groupindex.items()}
_OP, _OPCOUNT, _SHAPE, _COUNT, _DTYPE, _ROOT, _COMM, _NRANKS, _GRANK = (
    _G[n] for n in ("op", "opcount", "shape", "count", "dtype", "root", "comm", "nranks", "grank"))
_TUNING = _G["tuning"]
ICOMM, _IRANK, _INRANKS, _INITREST = (_G[n] for n in ("icomm", "irank", "inranks", "initrest"))

_PROCESS = re.compile(rb"(?P<host>[^\s:\]\[()]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] $")
_RANK_PREFIX = re.compile(rb"\[(?:rank|Rank)\s*(?P<rank>\d+)\]|\brank(?P<rank2>\d+)\]?:")
_MPI_PREFIX = re.compile(rb"^\[\d+,(?P<rank>\d+)\]<std(?:out|err)>:")
_TIMESTAMP = re.compile(rb"(?P<date>\d{4}-\d\d-\d\d)[ T](?P<time>\d\d:\d\d:\d\d)(?P<frac>\.\d+)?")
_COMM_ID = re.compile(rb"commId (?P<id>0x[0-9a-fA-F]+)")


class State:
    """What the log has said so far: comms (INIT lines), calls awaiting their TUNING line.

    The scan (`scan`) turns lines into events and keeps what later lines' meaning depends
    on (comms, the process ranks, line numbers); `replay` turns events into records and
    keeps the calls that wait for a TUNING line (`pending`). A worker process scanning one
    byte range of a big log gets the comms as of the range's start (`parallel`), and
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
        # thread -> its calls (indices in `collected`) awaiting a TUNING line
        self.pending: dict[tuple[bytes, bytes], list[int]] = {}
        self.collected = Collected()              # the records so far, as columns
        self.first_bad: int | None = None
        self.bad_lines: list[int] = []            # the first BAD_LINES_KEPT of them
        self.rejoined = 0                         # records read across a lost line break
        self.shapes: dict[tuple, int] = {}        # see scan: a key -> its index in shape_list, or -1
        self.shape_list: list[tuple] = []         # see _coll_shape
        self.threads: dict[bytes, int] = {}       # line prefix -> its index in thread_list
        self.thread_list: list[tuple[bytes, bytes]] = []      # (pid, tid)
        self.tunings: dict[bytes, int] = {}       # TUNING line's text -> its index in tuning_list
        self.tuning_list: list[tuple] = []        # see _tuning
        self.seqs: dict[bytes, int] = {}          # opCount text -> its value
        self.record_tails: dict[bytes, bool] = {}  # a COLL line's text from `count` -> whether a record's tail
        self.process_local_comms = 0
        self.lines = 0                            # lines before the piece being scanned
        self.unclaimed_pieces = 0                 # pieces still to read by LINE alone (see scan)
        # What the scan would tell `context`, in order, when it must not tell it itself.
        self.ops: list[tuple] | None = [] if record_ops else None
        # The INIT lines read, as (groups, prefix), for the parent to replay (`apply_init`).
        self.init_lines: list[tuple] | None = [] if record_ops else None

    def trim(self) -> None:
        """Forget the shapes, threads and TUNING lines of events already replayed, if many."""
        if max(len(self.shape_list), len(self.thread_list), len(self.tuning_list)) > 100_000:
            for table in (self.shapes, self.shape_list, self.threads, self.thread_list,
                          self.tunings, self.tuning_list):
                table.clear()
            self.collected.forget_table()

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


def apply_ops(ops: list[tuple], state: State) -> None:
    """Tell the shared context, in order, what a worker's scan recorded in `ops`."""
    for kind, communicator, nranks in ops:
        if kind == "init":
            _apply_init_op(state.context, communicator, nranks)
        else:
            state.process_local_comm(communicator, nranks)


def finish(state: State) -> None:
    """Emit the calls still waiting for a TUNING line at the end of the log; notes, and
    the error of a log none of whose COLL lines could be read."""
    emitted = state.collected.emitted
    before = len(emitted)
    for calls in state.pending.values():
        emitted.extend(calls)
    state.pending.clear()
    summary, context, name = state.summary, state.context, state.name
    summary.records += len(emitted) - before
    if state.first_bad is not None:
        bad = summary.skipped.get("COLL line in no known format", 0)
        if summary.records == 0:
            raise CollcError("no COLL line of this NCCL log is in a known format",
                             Span(name, state.first_bad, 1))
        summary.skipped_at["COLL line in no known format"] = list(state.bad_lines)
        shown = ", ".join(map(str, state.bad_lines))
        more = ", ..." if bad > len(state.bad_lines) else ""
        context.notes.append(f"{name}: {bad} COLL record(s) whose text is not intact were skipped "
                             f"(lines {shown}{more}); every intact record on those lines was read")
    if state.rejoined:
        context.notes.append(f"{name}: {state.rejoined} record(s) cut by a line break (output of several "
                             "processes merged) were read across it")
    if state.process_local_comms:
        context.notes.append(f"{name}: no INIT line gives a job-wide commId for "
                             f"{state.process_local_comms} communicators; they are named by "
                             "host:pid:comm pointer, so calls cannot be matched across processes")


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


def scan(data: bytes, end: int, state: State, begin: int = 0) -> Events:
    """The events of `data[begin:end]` (whole lines), in file order.

    The hot path of the reader. One `findall` of `WHOLE_LINE` gives a tuple per line,
    without a match object: a line that is one intact COLL record is read in bulk with
    the others like it (`_claimed`: a map over the tuples per field, the shape of each
    (prefix, op, the record's text from `count`) from a cache (`state.shapes`), the opCounts
    converted by one `map`); every other line where LINE could match anything (INIT,
    TUNING, malformed or merged records) is read one match at a time (`_scan_range`),
    between the claimed lines before and after it, so that the events stay in file
    order. A piece with many such lines (a log with TUNING lines) is read by
    `_scan_range` whole, as the bulk read would stop at every other line.
    What to make of the events (records, and which TUNING line completes which call)
    is `replay`'s.
    """
    events = Events(state.shape_list, state.thread_list, state.tuning_list)
    first_line = state.lines + 1
    newlines = None
    if end - begin < SMALL_PIECE:
        _scan_range(data, begin, end, end, first_line, state, events)
    elif state.unclaimed_pieces > 0:
        state.unclaimed_pieces -= 1
        _scan_range(data, begin, end, end, first_line, state, events)
    else:
        rows = WHOLE_LINE.findall(data, begin, end)
        # A row per line, then the empty match at the piece's end: its line breaks, counted.
        newlines = len(rows) - (1 if data[end - 1] == 10 else 2)
        if rows and not any(rows[-1]):
            rows.pop()      # the empty match at the end of the piece, or a last line with nothing to read
        _unclaim_broken_records(rows, state)
        unclaimed = list(compress(range(len(rows)), map(itemgetter(_UNCLAIMED), rows)))
        if len(unclaimed) * UNCLAIMED_SHARE > len(rows):
            # Mostly lines for LINE: read this piece and the next few that way.
            state.unclaimed_pieces = UNCLAIMED_PIECES_SKIPPED
            _scan_range(data, begin, end, end, first_line, state, events)
        else:
            starts = _LineStarts(data, begin, end)
            done = 0
            for k in unclaimed:
                _claimed(rows, done, k, first_line, starts, state, events)
                _scan_range(data, starts[k], starts.end_of(k), end, first_line + k, state, events)
                done = k + 1
            _claimed(rows, done, len(rows), first_line, starts, state, events)
    state.lines += data.count(b"\n", begin, end) if newlines is None else newlines
    return events


# The fields of a WHOLE_LINE tuple.
_PRE, _ROW_OP, _ROW_OPCOUNT, _ROW_SHAPE, _ROW_TUNING, _UNCLAIMED = range(6)
# A piece of fewer bytes (a line or two: the tail of a stream read in small reads) is read
# by `_scan_range`, which costs less than the bulk read's set-up there.
SMALL_PIECE = 512
# A piece in which more than 1 line in UNCLAIMED_SHARE is for LINE is read by `_scan_range`,
# and so are the UNCLAIMED_PIECES_SKIPPED pieces after it (the log's format goes on).
UNCLAIMED_SHARE = 8
UNCLAIMED_PIECES_SKIPPED = 64


def _unclaim_broken_records(rows: list[tuple], state: State) -> None:
    """Rows WHOLE_LINE took for one COLL record whose text after `count` is not a
    record's tail (more text after the record: another record whose line break was lost,
    or garbage) made rows for LINE, which reads their line as `_scan_range` does. Each
    distinct text is checked once (`state.record_tails`)."""
    known = state.record_tails
    distinct = set(map(itemgetter(_ROW_SHAPE), rows))
    distinct.discard(b"")
    broken = set()
    for tail in distinct:
        intact = known.get(tail)
        if intact is None:
            if len(known) > 100_000:
                known.clear()
            intact = known[tail] = _RECORD_TAIL.fullmatch(tail) is not None
        if not intact:
            broken.add(tail)
    if broken:
        for k, row in enumerate(rows):
            if row[_ROW_SHAPE] in broken:
                rows[k] = (row[_PRE], b"", b"", b"", b"", b"NCCL INFO ")


class _LineStarts:
    """The offsets at which the lines of `data[begin:end]` start, found (by NumPy) when
    first asked: only pieces with a line for LINE, or a new shape, need them."""

    def __init__(self, data: bytes, begin: int, end: int):
        self.data, self.begin, self.end = data, begin, end
        self.offsets: list[int] | None = None

    def __getitem__(self, k: int) -> int:
        if self.offsets is None:
            view = np.frombuffer(self.data, dtype=np.uint8, count=self.end - self.begin, offset=self.begin)
            self.offsets = [self.begin, *(np.flatnonzero(view == 10) + (self.begin + 1)).tolist()]
        return self.offsets[k]

    def end_of(self, k: int) -> int:
        """Where line k ends: its newline, or the end of the piece."""
        newline = self.data.find(b"\n", self[k], self.end)
        return self.end if newline < 0 else newline


def _claimed(rows: list[tuple], lo: int, hi: int, first_line: int, starts: _LineStarts,
             state: State, events: Events) -> None:
    """The events of the COLL and TUNING lines among `rows[lo:hi]` that WHOLE_LINE
    claimed (line k is line number `first_line + k`): the same events, skips and notes
    as `_scan_range` makes of them, one field at a time over all of them."""
    part = rows if lo == 0 and hi == len(rows) else rows[lo:hi]
    idx = list(compress(range(lo, hi), map(itemgetter(_ROW_OP), part)))
    tuning_rows = [] if len(idx) == len(part) else list(compress(range(lo, hi), map(itemgetter(_ROW_TUNING), part)))
    if not tuning_rows:
        _claimed_calls(rows, part, idx, lo, hi, first_line, starts, state, events)
        return
    calls = Events(events.shapes, events.threads, events.tunings)
    _claimed_calls(rows, part, idx, lo, hi, first_line, starts, state, calls)
    tunings = _claimed_tunings([rows[k] for k in tuning_rows], state)
    # In file order: a COLL event's line number is its row's; the TUNING lines' rows are known.
    call_lines = np.asarray(calls.lines, dtype=np.int64)
    tuning_lines = np.asarray(tuning_rows, dtype=np.int64) + first_line
    # The usual log: each call's TUNING line next, but for a TUNING line whose call ended
    # the piece before, and a call whose TUNING line starts the next piece.
    lead = int(len(tuning_lines) > 0 and (len(call_lines) == 0 or tuning_lines[0] < call_lines[0]))
    trail = int(len(call_lines) > 0 and (len(tuning_lines) == 0 or call_lines[-1] > tuning_lines[-1]))
    paired_calls, paired_tunings = call_lines[:len(call_lines) - trail], tuning_lines[lead:]
    if len(paired_calls) == len(paired_tunings) and bool(np.all(paired_calls + 1 == paired_tunings)):
        def merged(first: list, second: list) -> list:
            cut = len(first) - trail
            return second[:lead] + _interleaved(first[:cut], second[lead:]) + first[cut:]
    else:
        order = np.argsort(np.concatenate((call_lines, tuning_lines)), kind="stable").tolist()

        def merged(first: list, second: list) -> list:
            return list(map((first + second).__getitem__, order))
    count = len(tuning_rows)
    if calls.stamps is not None or events.stamps is not None:
        if events.stamps is None:
            events.stamps = [None] * len(events.ids)
        events.stamps += merged(calls.stamps if calls.stamps is not None else [None] * len(calls.ids),
                                [None] * count)
    events.ids += merged(calls.ids, [~thread for thread in tunings[0]])
    events.lines += merged(calls.lines, [0] * count)
    events.seqs += merged(calls.seqs, tunings[1])


def _interleaved(first: list, second: list) -> list:
    """first[0], second[0], first[1], second[1], ... of two lists of one length."""
    out = [None] * (2 * len(first))
    out[0::2] = first
    out[1::2] = second
    return out


def _claimed_tunings(tuning: list[tuple], state: State) -> tuple[list[int], list[int]]:
    """(thread, TUNING line) indices of claimed TUNING rows, as `_scan_range` finds them:
    from the caches keyed by the line's prefix and text, new ones made in file order."""
    pres = list(map(itemgetter(_PRE), tuning))
    texts = list(map(itemgetter(_ROW_TUNING), tuning))
    threads = list(map(state.threads.get, pres))
    if None in threads:
        for j, thread in enumerate(threads):
            if thread is None:
                thread = state.threads.get(pres[j])
                threads[j] = thread if thread is not None else _thread(pres[j], state)
    indices = list(map(state.tunings.get, texts))
    if None in indices:
        for j, index in enumerate(indices):
            if index is None:
                index = state.tunings.get(texts[j])
                indices[j] = index if index is not None else _tuning(_TUNING_TEXT.match(texts[j]), state)
    return threads, indices


def _claimed_calls(rows: list[tuple], part: list[tuple], idx: list[int], lo: int, hi: int, first_line: int,
                   starts: _LineStarts, state: State, events: Events) -> None:
    """`_claimed`'s events of the COLL lines: `idx`, the indices in `rows` of those
    among `rows[lo:hi]` (`part`)."""
    if not idx:
        return
    coll = part if len(idx) == len(part) else list(map(rows.__getitem__, idx))
    stamps: list | None = None
    distinct = set(map(itemgetter(_PRE), coll))
    if any(b"-" in pre for pre in distinct):   # a timestamp (NCCL >= 2.26, or the launcher's), or a host name with '-'
        split = {pre: (_timestamp(pre) if b"-" in pre else (None, pre)) for pre in distinct}
        pairs = list(map(split.__getitem__, map(itemgetter(_PRE), coll)))
        stamps = list(map(itemgetter(0), pairs))
        # The shape cache's keys: the prefix without its timestamp, as `_scan_range`'s.
        keys = list(zip(map(itemgetter(1), pairs), map(itemgetter(_ROW_OP), coll), map(itemgetter(_ROW_SHAPE), coll)))
        if events.stamps is None:
            events.stamps = [None] * len(events.ids)
    else:
        # (prefix, op, the record's text from `count`): keys of their own (finer than
        # `_scan_range`'s: the text holds the stream), each shape made from the line by
        # LINE the first time it is seen.
        keys = list(map(itemgetter(_PRE, _ROW_OP, _ROW_SHAPE), coll))
    sids = list(map(state.shapes.get, keys))
    if None in sids:
        _new_shapes(sids, keys, idx, coll, starts, state)
    opcounts = list(map(itemgetter(_ROW_OPCOUNT), coll))
    try:
        seqs = list(map(int, opcounts, repeat(16)))
    except ValueError:          # `x`, `0x`: the pattern takes NCCL's hex with or without 0x
        seqs = None
    lines = range(first_line + lo, first_line + hi) if coll is part else list(map(first_line.__add__, idx))
    if seqs is None or min(sids) < 0:
        _claimed_one_by_one(sids, coll, opcounts, lines, stamps, state, events)
        return
    events.ids += sids
    events.lines += lines
    events.seqs += seqs
    if events.stamps is not None:
        events.stamps += stamps if stamps is not None else repeat(None, len(sids))


def _new_shapes(sids: list, keys: list[tuple], idx: list[int], coll: list[tuple], starts: _LineStarts,
                state: State) -> None:
    """Fill in the shapes of `sids` not in the cache, in file order (a shape may tell the
    context of a communicator it is the first to name), from the line's match by LINE."""
    shapes, data = state.shapes, starts.data
    for j, sid in enumerate(sids):
        if sid is not None:
            continue
        key = keys[j]
        sid = shapes.get(key)
        if sid is None:
            if len(shapes) > 100_000:
                shapes.clear()
            start = starts[idx[j]] + len(coll[j][_PRE])
            m = LINE.match(data, start, starts.end_of(idx[j]))
            sid = shapes[key] = _coll_shape(m.groups(), key[0], state)
        sids[j] = sid


def _claimed_one_by_one(sids: list[int], coll: list[tuple], opcounts: list[bytes], lines: Sequence[int],
                        stamps: list | None, state: State, events: Events) -> None:
    """`_claimed`'s events where some record is skipped: each record in turn, its skip
    counted when it comes, as `_scan_range` does."""
    summary = state.summary
    for j, sid in enumerate(sids):
        if sid < 0:
            summary.skip(f"COLL line of an unknown operation ({coll[j][_ROW_OP].decode(errors='replace')})" if sid == -1
                         else "COLL line with a count, size or rank past collc's limits")
            continue
        try:
            seq = int(opcounts[j], 16)
        except ValueError:
            summary.skip("COLL line whose opCount is not a number")
            continue
        events.ids.append(sid)
        events.lines.append(lines[j])
        events.seqs.append(seq)
        if events.stamps is not None:
            events.stamps.append(stamps[j] if stamps is not None else None)


def _scan_range(data: bytes, begin: int, stop: int, limit: int, first_line: int, state: State,
                events: Events) -> None:
    """The events of the matches of LINE in `data[begin:stop]` (whole lines, the first of
    them line number `first_line`), appended to `events`; `limit`: the end of the piece
    (a record cut by a line break may go on in the line after `stop`).

    One pass per line of interest: the regex's groups are read by index from locals, the
    line number is counted only for lines that need one (COLL lines and malformed ones),
    everything that depends only on the line's prefix, comm and shape comes from a cache
    (`state.shapes`), and the thread of a TUNING line from a cache keyed by its prefix.
    """

    ids, lines, seqs_out = events.ids, events.lines, events.seqs
    add_id, add_line, add_seq = ids.append, lines.append, seqs_out.append
    stamps = events.stamps
    pos, line = begin, first_line          # `line` = the number of the line at offset `pos`
    rfind, count = data.rfind, data.count
    shapes, threads, tunings = state.shapes, state.threads, state.tunings
    # opCount text -> value: values repeat (one per comm of the file; NCCL 2.27 logs 0 on every line)
    seqs = state.seqs
    summary = state.summary
    COLL_GROUPS = (_OP + 1, _OPCOUNT + 1, _SHAPE + 1, _GRANK + 1)
    TUNING = _TUNING + 1      # the group that ends a TUNING line's match: its `lastindex`
    ICOMM_GROUP = ICOMM + 1
    for m in LINE.finditer(data, begin, stop):
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
                summary.skip(f"COLL line of an unknown operation ({op.decode(errors='replace')})" if sid == -1
                             else "COLL line with a count, size or rank past collc's limits")
                continue
            seq = seqs.get(opcount)
            if seq is None:
                if len(seqs) > 100_000:
                    seqs.clear()
                try:
                    seq = int(opcount, 16)
                except ValueError:      # `x`, `0x`: the pattern takes NCCL's hex with or without 0x
                    summary.skip("COLL line whose opCount is not a number")
                    continue
                seqs[opcount] = seq
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
        elif m.group(ICOMM_GROUP) is not None:
            _init_line(m.groups(), pre, state)
        else:
            line += count(b"\n", pos, line_start)
            pos = line_start
            joined = _continued(data, start, limit)
            if joined is not None:
                # A record broken by a lost prefix: its text goes on at the start of the
                # next line (another process's output cut it). Read as one line.
                if b"-" in pre:
                    ts, pre = _timestamp(pre)
                    if stamps is None:
                        stamps = [None] * len(ids)
                else:
                    ts = None
                sid = _coll_shape(joined.groups(), pre, state)
                if sid >= 0:
                    opcount = joined.group(_OPCOUNT + 1)
                    add_id(sid)
                    add_line(line)
                    add_seq(int(opcount, 16))
                    if stamps is not None:
                        stamps.append(ts)
                    state.rejoined += 1
                    continue
            summary.skip("COLL line in no known format")
            if state.first_bad is None:
                state.first_bad = line
            if len(state.bad_lines) < BAD_LINES_KEPT:
                state.bad_lines.append(line)
    events.stamps = stamps




# How many line numbers of unreadable COLL lines are kept for the note (the count is exact).
BAD_LINES_KEPT = 20


def _continued(data: bytes, start: int, end: int) -> re.Match | None:
    """The COLL record that starts at `start` and is cut by a newline, read with its next
    line appended (that line having no `NCCL INFO` prefix of its own); None if that does
    not make a whole record, or the next line is not in this piece."""
    eol = data.find(b"\n", start, end)
    if eol < 0:
        return None
    nxt = data.find(b"\n", eol + 1, end)
    if nxt < 0:
        return None
    follow = data[eol + 1:nxt]
    if b"NCCL INFO" in follow:
        return None
    m = LINE.match(data[start:eol] + b" " + follow.lstrip())
    return m if m is not None and m.group(_OP + 1) is not None else None


# A thread's calls are emitted without a TUNING line once more than HELD_CALLS wait,
# and every waiting call once more than HELD_THREADS threads wait (see `replay`).
HELD_CALLS = 512
HELD_THREADS = 64
_is_not_none = functools.partial(is_not, None)
# Fewer events are replayed one at a time: NumPy's set-up costs more than it saves there
# (a stream read in small pieces).
COLUMNAR_EVENTS = 128


def replay(events: Events, line_base: int, state: State) -> None:
    """The records of the events (line numbers `line_base` on), appended to
    `state.collected` as columns, and emitted in the order they are complete: a call
    waits for the TUNING line its thread logs after it (which gives its algorithm and
    protocol), unless its thread has no TUNING lines (more than 512 calls wait) or many
    threads wait at once (more than 64). A record is its index in `state.collected`;
    nothing here makes an object per call.

    Events without TUNING lines are replayed a column at a time (`replay_untuned`); so
    are runs of COLL lines each followed at once by its thread's TUNING line (what
    NCCL_DEBUG_SUBSYS=COLL,TUNING writes: `replay_paired`); the rest one at a time."""
    if replay_untuned(events, line_base, state):
        return
    done = 0
    for lo, hi in paired_runs(events):
        _replay_one_by_one(events, done, lo, line_base, state)
        if not replay_paired(events, lo, hi, line_base, state):
            _replay_one_by_one(events, lo, hi, line_base, state)
        done = hi
    _replay_one_by_one(events, done, len(events.ids), line_base, state)


def paired_runs(events: Events) -> list[tuple[int, int]]:
    """The [lo, hi) ranges of events, in order, of at least COLUMNAR_EVENTS events each,
    that are pairs of a COLL line and then a TUNING line of the same thread."""
    n = len(events.ids)
    if n < COLUMNAR_EVENTS:
        return []
    ids = np.asarray(events.ids, dtype=np.int64)
    is_call = ids >= 0
    if not is_call.any() or is_call.all():
        return []
    # Each event's thread, as a code: by shape for a COLL line, by thread for a TUNING line.
    codes: dict[tuple[bytes, bytes], int] = {}
    shape_code = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
    # Distinct ids by counting (small non-negative ints; np.unique would import numpy.ma).
    for sid in np.flatnonzero(np.bincount(ids[is_call])).tolist():
        shape_code[sid] = codes.setdefault(events.shapes[sid][0], len(codes))
    thread_ids = ~ids[~is_call]
    thread_code = np.full(int(thread_ids.max()) + 1, -1, dtype=np.int64)
    for tid in np.flatnonzero(np.bincount(thread_ids)).tolist():
        thread_code[tid] = codes.setdefault(events.threads[tid], len(codes))
    code = np.empty(n, dtype=np.int64)
    code[is_call] = shape_code[ids[is_call]]
    code[~is_call] = thread_code[thread_ids]
    pair = np.zeros(n + 2, dtype=bool)          # pair[i]: events i, i + 1 are such a pair
    pair[:n - 1] = is_call[:-1] & ~is_call[1:] & (code[:-1] == code[1:])
    runs: list[tuple[int, int]] = []
    for parity in (0, 1):                       # pairs never overlap: runs of one parity are apart from the other's
        step = pair[parity::2].astype(np.int8)
        edges = np.diff(np.concatenate(([0], step, [0])))
        for first, stop in zip(np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()):
            if 2 * (stop - first) >= COLUMNAR_EVENTS:
                runs.append((parity + 2 * first, parity + 2 * stop))
    return sorted(runs)


def replay_paired(events: Events, lo: int, hi: int, line_base: int, state: State) -> bool:
    """`replay` of events[lo:hi], pairs of a COLL line and its thread's TUNING line
    (`paired_runs`), a column at a time: each call is emitted at its TUNING line, with
    that line's algorithm and protocol where its operation and size agree. False
    (nothing done) where a thread of theirs has calls waiting, or where the threads
    waiting are as many as HELD_THREADS (a call would then flush them)."""
    pending, collected = state.pending, state.collected
    sids = events.ids[lo:hi:2]
    distinct = dict.fromkeys(sids)
    if pending and (len(pending) >= HELD_THREADS
                    or any(events.shapes[sid][0] in pending for sid in distinct)):
        return False
    shape_index = collected.shape_index(events.shapes)
    record = len(collected.shape)
    calls = len(sids)
    collected.shape.extend(map(shape_index.__getitem__, sids))
    lines = events.lines[lo:hi:2]
    collected.line.extend(lines if line_base == 0 else map(line_base.__add__, lines))
    collected.add_seqs(events.seqs[lo:hi:2])
    if events.stamps is not None and collected.stamp is None:
        collected.stamp = [None] * record
    if collected.stamp is not None:
        collected.stamp.extend(events.stamps[lo:hi:2] if events.stamps is not None else repeat(None, calls))
    tuning_of = events.seqs[lo + 1:hi:2]
    tuning_list = events.tunings
    # The (algorithm, protocol) pairs are numbered as `replay` numbers them: in order of the lines.
    pair_code = {t: collected.tuning(tuning_list[t][2], tuning_list[t][3]) for t in dict.fromkeys(tuning_of)}
    verdict: dict[tuple[int, int], int | None] = {}
    for sid, t in dict.fromkeys(zip(sids, tuning_of)):
        coll, nbytes, _algo, _proto = tuning_list[t]
        shape = events.shapes[sid]
        size = shape[7]
        agrees = (coll is None or shape[1] == coll) and (size == nbytes or size is None)
        verdict[sid, t] = pair_code[t] if agrees else None
    codes = list(map(verdict.__getitem__, zip(sids, tuning_of)))
    tuned = collected.tuned
    for k in compress(range(calls), map(_is_not_none, codes)):
        tuned[record + k] = codes[k]
    collected.emitted.extend(range(record, record + calls))
    state.summary.records += calls
    return True


def _replay_one_by_one(events: Events, lo: int, hi: int, line_base: int, state: State) -> None:
    """`replay` of events[lo:hi], one event at a time."""
    if lo >= hi:
        return
    pending, summary, collected = state.pending, state.summary, state.collected
    shape_list, thread_list, tuning_list = events.shapes, events.threads, events.tunings
    shape_index = collected.shape_index(shape_list)
    shapes = collected.shapes
    add_shape, add_line, add_seq = collected.shape.append, collected.line.append, collected.add_seq
    emit_all = collected.emitted.extend
    tuned = collected.tuned
    record = len(collected.shape)
    emitted = len(collected.emitted)
    if events.stamps is not None and collected.stamp is None:
        collected.stamp = [None] * record
    stamps_out = collected.stamp
    stamps = events.stamps if events.stamps is not None else repeat(None)
    every = zip(events.ids, events.lines, events.seqs, stamps)
    for sid, a, b, ts in (every if lo == 0 and hi == len(events.ids) else islice(every, lo, hi)):
        if sid >= 0:
            add_shape(shape_index[sid])
            add_line(a + line_base)
            add_seq(b)
            if stamps_out is not None:
                stamps_out.append(ts)
            thread = shape_list[sid][0]
            calls = pending.get(thread)
            if calls is not None:
                calls.append(record)
                if len(calls) > HELD_CALLS:    # no TUNING lines in this log: do not hold calls back
                    emit_all(calls)
                    calls.clear()
            else:
                pending[thread] = [record]
                if len(pending) > HELD_THREADS:    # many threads wait for a TUNING line: do not hold calls back
                    for calls in pending.values():
                        emit_all(calls)
                    pending.clear()
            record += 1
        else:
            calls = pending.pop(thread_list[~sid], None)
            if calls:
                coll, nbytes, algo, proto = tuning_list[b]
                tuning = collected.tuning(algo, proto)
                # The calls this thread has just logged of the TUNING line's operation
                # and size (a thread may log several calls before one TUNING line).
                for call in calls:
                    if call not in tuned:
                        shape = shapes[collected.shape[call]]
                        if coll is None or shape[1] == coll:
                            size = shape[7]
                            if size == nbytes or size is None:
                                tuned[call] = tuning
                emit_all(calls)
            else:
                summary.skip("TUNING line with no COLL line before it")
    summary.records += len(collected.emitted) - emitted


def replay_untuned(events: Events, line_base: int, state: State) -> bool:
    """`replay` of events without a TUNING line, where at most HELD_THREADS threads wait
    after them: the same records, emitted in the same order, a column at a time. Each
    thread's calls then only wait (in `state.pending`) until more than HELD_CALLS do,
    and are emitted in blocks of HELD_CALLS + 1, each when its last call comes. False
    (nothing done) for other events, or fewer than COLUMNAR_EVENTS, which `replay`
    takes one at a time."""
    n = len(events.ids)
    if n < COLUMNAR_EVENTS or min(events.ids) < 0:
        return False
    ids = np.asarray(events.ids, dtype=np.int64)
    shape_list, pending, collected = events.shapes, state.pending, state.collected
    distinct, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    thread_of = [shape_list[sid][0] for sid in distinct.tolist()]
    # The threads in the order of their first call here: the order `pending` gets them in.
    codes: dict[tuple[bytes, bytes], int] = {}
    for k in np.argsort(first, kind="stable").tolist():
        codes.setdefault(thread_of[k], len(codes))
    if len(pending.keys() | codes.keys()) > HELD_THREADS:
        return False
    shape_index = np.asarray(collected.shape_index(shape_list), dtype=np.int64)
    record = len(collected.shape)
    emitted_before = len(collected.emitted)
    # A column at a time, in NumPy: this process replays every piece the workers scan.
    collected.shape.frombytes(shape_index[ids].tobytes())
    lines = np.asarray(events.lines, dtype=np.int64)
    collected.line.frombytes((lines + line_base if line_base else lines).tobytes())
    collected.add_seqs(events.seqs)
    if events.stamps is not None and collected.stamp is None:
        collected.stamp = [None] * record
    if collected.stamp is not None:
        collected.stamp.extend(events.stamps if events.stamps is not None else repeat(None, n))
    thread_code = np.array([codes[t] for t in thread_of], dtype=np.int64)[inverse]
    order = np.argsort(thread_code, kind="stable") + record
    bounds = np.searchsorted(thread_code[order - record], np.arange(len(codes) + 1)).tolist()
    # Each thread's calls are emitted in blocks of HELD_CALLS + 1, a block when its last
    # call comes: (that call, the block) for every block, then in the order of those calls.
    lasts: list[int] = []
    blocks: list[np.ndarray] = []
    for thread, code in codes.items():
        calls = pending.setdefault(thread, [])
        new = order[bounds[code]:bounds[code + 1]]
        take = HELD_CALLS + 1 - len(calls)
        if len(new) < take:
            calls.extend(new.tolist())
            continue
        blocks.append(np.concatenate((np.asarray(calls, dtype=np.int64), new[:take])))
        lasts.append(int(new[take - 1]))
        full = (len(new) - take) // (HELD_CALLS + 1)
        whole = new[take:take + full * (HELD_CALLS + 1)].reshape(full, HELD_CALLS + 1)
        blocks.extend(whole)
        lasts.extend(whole[:, -1].tolist())
        calls[:] = new[take + full * (HELD_CALLS + 1):].tolist()
    emitted = collected.emitted
    if blocks:
        in_order = sorted(range(len(lasts)), key=lasts.__getitem__)
        emitted.frombytes(np.concatenate([blocks[k] for k in in_order]).tobytes())
    state.summary.records += len(emitted) - emitted_before
    return True


def _timestamp(pre: bytes) -> tuple[float | None, bytes]:
    """(time in us, the prefix without it) of a prefix that may hold a timestamp. The
    timestamp is left out of the prefix so that the prefix still keys the shape cache."""
    t = _TIMESTAMP.search(pre)
    if t is None:
        return None, pre
    return _epoch_us(t.group("date"), t.group("time"), t.group("frac")), pre[:t.start()] + pre[t.end():]


def _thread(pre: bytes, state: State) -> int:
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


def _init_line(g: tuple, pre: bytes, state: State) -> None:
    if state.init_lines is not None:
        state.init_lines.append((g, pre))
    init = apply_init(g, pre, state.comms, state.process_rank)
    if init is None:
        state.summary.skip("INIT line with a rank or size past collc's ranks limit")
        return
    comm_id, nranks = init
    state.shapes.clear()
    state.saw_comm(comm_id, nranks)


def bounded_int(digits: bytes | None, most: int) -> int | None:
    """The number written by `digits` if it is at most `most` (None past it): checked on
    the text's length first, so a 10,000-digit field is never converted."""
    if digits is None or len(digits.lstrip(b"-0")) > len(str(most)):
        return None
    value = int(digits)
    return value if abs(value) <= most else None


def apply_init(g: tuple, pre: bytes, comms: dict, process_rank: dict) -> tuple[str | None, int] | None:
    """What an INIT line (the groups `g` of its match, `pre` the text before `NCCL INFO`)
    tells later COLL lines: its comm's rank, size and id into `comms`, the process's
    rank into `process_rank`. Returns (communicator id or None, nranks), or None (and
    changes nothing) for a line whose size or rank is past collc's ranks limit."""
    nranks = bounded_int(g[_INRANKS], int_limit("ranks"))
    rank = bounded_int(g[_IRANK], int_limit("ranks"))
    if nranks is None or rank is None or nranks < 1:
        return None
    host, pid, _tid, _rank, _ts = _process(pre)
    cid = _COMM_ID.search(g[_INITREST])
    comm_id = cid.group("id").decode() if cid else None
    key = (pid, g[ICOMM])
    before = comms.get(key)
    if comm_id is None and before is not None:
        comm_id = before[2]          # "Destroy COMPLETE" lines repeat the comm without commId
    comms[key] = (rank, nranks, comm_id)
    if nranks > process_rank.get(pid, (0, 0))[0]:
        process_rank[pid] = (nranks, rank)
    return comm_id, nranks


def _coll_shape(g: tuple, pre: bytes, state: State) -> int:
    """The index in `state.shape_list` of the COLL line's (thread, collective, rank,
    communicator, nranks, dtype, count, bytes, in_bytes, out_bytes, peer), or -1 for an
    operation NCCL does not have. `peer` is the root of a Send/Recv."""
    host, pid, tid, rank, _ts = _process(pre)
    shape = _shape(g, host, pid, g[_COMM], rank, state)
    if shape is _UNKNOWN_OP:
        return -1
    if shape is _OUT_OF_RANGE:
        return -2
    peer = bounded_int(g[_ROOT], int_limit("ranks")) if shape[0] in ("send", "recv") else None
    state.shape_list.append(((pid, tid), *shape, peer))
    return len(state.shape_list) - 1


_UNKNOWN_OP = object()
_OUT_OF_RANGE = object()   # a count, size, rank or datatype no NCCL call has


def _shape(g: tuple, host: bytes, pid: bytes, comm_ptr: bytes, rank: int | None, state: State):
    coll = COLLECTIVE_OPS.get(g[_OP])
    if coll is None:
        return _UNKNOWN_OP
    ranks_limit = int_limit("ranks")
    dtype_code = bounded_int(g[_DTYPE], 1 << 16)
    count = bounded_int(g[_COUNT], int_limit("size_bytes"))
    if dtype_code is None or count is None:
        return _OUT_OF_RANGE
    dtype, size = DATATYPES.get(dtype_code, (f"datatype {dtype_code}", None))
    known = state.comms.get((pid, comm_ptr))
    nranks = bounded_int(g[_NRANKS], ranks_limit) if g[_NRANKS] is not None else (known[1] if known else None)
    if nranks is None and g[_NRANKS] is not None:
        return _OUT_OF_RANGE
    if g[_GRANK] is not None:
        rank = bounded_int(g[_GRANK], ranks_limit)
        if rank is None:
            return _OUT_OF_RANGE
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
    in_b, out_b, nbytes = call_sizes(coll, count, size, nranks)
    if max(in_b or 0, out_b or 0, nbytes or 0) > int_limit("size_bytes"):
        return _OUT_OF_RANGE
    return coll, rank, communicator, nranks, dtype, count, nbytes, in_b, out_b


def _tuning(m: re.Match, state: State) -> int:
    """The index in `state.tuning_list` of a TUNING line's (collective or None, bytes,
    algorithm, protocol), remembered by the line's text; `m` a match of LINE or of
    `_TUNING_TEXT`."""
    top, tbytes, algo, proto, text = m.group("top", "tbytes", "algo", "proto", "tuning")
    if len(state.tunings) > 100_000:
        state.tunings.clear()
    state.tuning_list.append((COLLECTIVE_OPS.get(top) if top else None, int(tbytes),
                              algo.decode(), proto.decode()))
    index = state.tunings[text] = len(state.tuning_list) - 1
    return index
