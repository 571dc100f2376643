"""Streaming reader of Chrome-trace JSON (Kineto / PyTorch profiler output), plain or gzip.

Traces of gigabytes are normal, so the file is never parsed as a whole. The reader takes
the bytes in chunks and cuts them at event boundaries, which in every layout Kineto and
`json.dump` write look like `}` `,` `{` between two events of `traceEvents`. A cut is
only trusted where the piece between two cuts parses as one JSON object: a `},{` inside
an event (a list of objects in `args`, or a string) leaves unbalanced pieces, which are
joined with their neighbours until they parse. Without a prefilter a whole chunk of
events is parsed by one `orjson.loads` call; with one (byte strings, any of which an
interesting event's raw text contains), only the events around a match are parsed at
all, so a reader that wants the NCCL kernels of a 1 GiB trace touches a few thousand
events instead of millions. Files whose top level is not laid out as
`{... "traceEvents": [ ... ] ...}` or `[ ... ]` in that way are read with ijson instead.

Malformed or truncated input raises a `CollcError` located at the line (and byte offset
of the decompressed stream) of the event that does not parse.
"""

from __future__ import annotations

import math
import re
import zlib
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Iterator

import orjson

from ..diagnostics import CollcError, Span
from ..limits import limit
from .detect import TraceSource

CHUNK_BYTES = 8 << 20          # bytes read per step; a chunk's parsed events stay well under 100 MB
HEADER_LIMIT = 64 << 20        # the header before "traceEvents" is metadata: never this large
_MAX_JOINS = 64                # pieces joined to make one event before calling it malformed

_SEPARATOR = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_ARRAY_END = re.compile(rb"\}\s*\]")
_EVENT_CLOSE = re.compile(rb"\}(?=\s*[,\]])")
_WHITESPACE = b" \t\r\n"
_BLANKS = re.compile(rb"[ \t\r\n]*")


def _skip_blanks(data: bytes, pos: int) -> int:
    """The first position at or after `pos` that is not whitespace (a regular expression,
    not a loop over bytes: a trace padded with 200 MiB of blanks is skipped at C speed)."""
    return _BLANKS.match(data, pos).end()  # type: ignore[union-attr]


class _ArrayEnds(Exception):
    """traceEvents ends at the event at `start` (what follows the array looked like events)."""

    def __init__(self, start: int):
        super().__init__(start)
        self.start = start


class ChromeTrace:
    """One Chrome-trace file. `events()` streams `traceEvents`; `metadata` holds the other
    top-level keys (complete once `events()` has run to the end; the keys before
    `traceEvents`, where Kineto puts distributedInfo and deviceProperties, at once)."""

    def __init__(self, source: TraceSource | str | Path):
        self.source = source if isinstance(source, TraceSource) else TraceSource.file(source)
        self.metadata: dict[str, Any] = {}
        self.event_offset = 0      # byte offset of the event last yielded (decompressed stream)
        self._event_line = 0
        self._line_base = 0
        self._data = b""
        self._data_offset = 0
        self._lines_known = True       # False while yielding a batch parsed in one call
        self._counted: tuple[int, int] = (0, 0)
        self._counted_data: bytes | None = None

    # -- locations ---------------------------------------------------------------------

    def location(self) -> str:
        """Where the event last yielded starts: "line L" or, in a one-line file, "byte offset O".

        Exact with a prefilter; without one, events are parsed a chunk at a time and this
        names the start of the chunk's batch."""
        if not self._lines_known:
            return f"the batch of events from byte offset {self.event_offset}"
        line = self._line_of_last_event()
        if line > 1 or self._line_base > 0:
            return f"line {line}"
        return f"byte offset {self.event_offset}"

    def _line_of_last_event(self) -> int:
        if self._event_line == 0 and self._lines_known:
            start = max(self.event_offset - self._data_offset, 0)
            # Count newlines from the last place counted in this buffer: events come in order.
            from_pos, from_line = self._counted
            if self._counted_data is not self._data or from_pos > start:
                from_pos, from_line = 0, self._line_base
            line = from_line + self._data.count(b"\n", from_pos, start)
            self._counted, self._counted_data = (start, line), self._data
            self._event_line = line + 1
        return self._event_line or 1

    def _error(self, message: str, offset: int, data: bytes | None = None, data_offset: int = 0,
               line_base: int = 0) -> CollcError:
        line, column = 1, offset + 1
        if data is not None:
            rel = max(0, min(offset - data_offset, len(data)))
            line = line_base + data.count(b"\n", 0, rel) + 1
            column = rel - (data.rfind(b"\n", 0, rel) + 1) + 1
            if line == 1:
                column = offset + 1
        return CollcError(f"{message} (byte offset {offset} of the "
                          f"{'decompressed ' if self._gzipped else ''}trace)",
                          Span(self.source.name, line, column))

    # -- reading -----------------------------------------------------------------------

    def events(self, prefilter: Iterable[bytes] | None = None) -> Iterator[dict[str, Any]]:
        """Every event of `traceEvents`, in file order.

        With a `prefilter`, events whose raw JSON text contains none of its byte strings
        may be left out (unparsed); the caller must still check the events it gets."""
        needles = tuple(prefilter) if prefilter is not None else None
        needle_re = re.compile(b"|".join(re.escape(n) for n in needles)) if needles else None
        with self._open() as f:
            head, start = self._read_header(f)
            if start is None:
                yield from self._events_ijson(head)
                return
            yield from self._stream(f, head, start, needle_re, needles is not None and not needles)

    def _open(self) -> BinaryIO:
        f = self.source.open()
        self._gzipped = f.__class__.__name__ == "GzipFile"
        return f

    def _read(self, f: BinaryIO, n: int, offset: int) -> bytes:
        try:
            return f.read(n)
        except (EOFError, zlib.error, OSError) as e:
            raise CollcError(f"truncated or corrupt compressed trace: {e}",
                             Span(self.source.name, 1, 1),
                             notes=(f"after {offset} bytes of decompressed data",)) from None

    def _read_folded(self, f: BinaryIO, n: int, offset: int) -> bytes:
        """A chunk past the header, where a chunk of nothing but whitespace is folded to
        its line breaks: the buffer a padded trace is searched in then stays a chunk or
        two long, so 1 GiB of blanks (from a 1 MB gzip) is read in seconds, not searched
        again at every chunk. Lines stay exact; byte offsets past a fold count it as its
        line breaks."""
        chunk = self._read(f, n, offset)
        if chunk and not chunk.translate(None, _WHITESPACE):
            return b" " + b"\n" * chunk.count(b"\n")
        return chunk

    def _read_header(self, f: BinaryIO) -> tuple[bytes, int | None]:
        """The bytes read so far and where the first event may start (None: use ijson)."""
        data = b""
        while True:
            chunk = self._read(f, CHUNK_BYTES if data else 1 << 16, len(data))
            data += chunk
            stripped = data.lstrip(_WHITESPACE)
            if stripped[:1] == b"[":                      # a bare event array
                self.metadata = {}
                return data, len(data) - len(stripped) + 1
            m = _EVENTS_KEY.search(data)
            if m is not None:
                header = data[:m.start()].rstrip(_WHITESPACE).rstrip(b",") + b"}"
                try:
                    meta = orjson.loads(header)
                except orjson.JSONDecodeError:
                    return data, None                     # "traceEvents" inside a string, or odd layout
                if not isinstance(meta, dict):
                    return data, None
                self.metadata = meta
                return data, m.end()
            if not chunk or len(data) > HEADER_LIMIT:
                if not stripped:
                    what = "empty trace file" if not chunk else \
                        f"the trace holds nothing but whitespace in its first {HEADER_LIMIT >> 20} MiB"
                    raise CollcError(what, Span(self.source.name, 1, 1))
                return data, None

    def _stream(self, f: BinaryIO, data: bytes, start: int, needle_re: re.Pattern | None,
                nothing: bool) -> Iterator[dict[str, Any]]:
        """Events from `data[start:]` on. `data_offset` is data[0]'s offset in the stream and
        `line_base` the number of newlines before it."""
        data_offset = line_base = 0
        pos = start
        eof = False
        while True:
            if not eof and len(data) - pos < CHUNK_BYTES:   # keep a chunk ahead of pos
                chunk = self._read_folded(f, CHUNK_BYTES, data_offset + len(data))
                if chunk:
                    line_base += data.count(b"\n", 0, pos)
                    data_offset += pos
                    data = data[pos:] + chunk
                    pos = 0
                else:
                    eof = True
            self._data, self._data_offset, self._line_base = data, data_offset, line_base
            pos = _skip_blanks(data, pos)
            if pos >= len(data):
                if eof:
                    raise self._error("truncated trace: the traceEvents array is not closed",
                                      data_offset + pos, data, data_offset, line_base)
                continue
            if data[pos] == 0x5D:  # "]": an empty array, or the end after a cut
                self._finish(f, data, pos + 1, data_offset, line_base, eof)
                return
            if data[pos] != 0x7B:  # "{"
                raise self._error("expected an event object in traceEvents",
                                  data_offset + pos, data, data_offset, line_base)
            cut = self._last_cut(data, pos)
            new_pos = pos
            try:
                if eof:       # the rest is in memory: walk it event by event
                    end = yield from self._final_events(data, pos, data_offset, line_base,
                                                        needle_re, nothing)
                    self._finish(f, data, end, data_offset, line_base, eof)
                    return
                if cut is not None:
                    if nothing:
                        new_pos = self._skip_to(data, cut)
                    elif needle_re is None:
                        new_pos = yield from self._parse_batch(data, pos, cut, data_offset, line_base)
                    else:
                        new_pos = yield from self._parse_matching(data, pos, cut, data_offset,
                                                                  line_base, needle_re)
            except _ArrayEnds as ends:
                # What looked like separators lies after the end of traceEvents.
                while not eof:
                    chunk = self._read_folded(f, CHUNK_BYTES, data_offset + len(data))
                    data += chunk
                    eof = not chunk
                end = yield from self._final_events(data, ends.start, data_offset, line_base,
                                                    needle_re, nothing)
                self._finish(f, data, end, data_offset, line_base, eof)
                return
            if new_pos == pos:
                # No whole event in the buffer (one event longer than a chunk): read more.
                if eof:
                    raise self._error("truncated or malformed trace event", data_offset + pos,
                                      data, data_offset, line_base)
                chunk = self._read_folded(f, CHUNK_BYTES, data_offset + len(data))
                data += chunk
                eof = not chunk
            pos = new_pos

    @staticmethod
    def _last_cut(data: bytes, pos: int) -> int | None:
        """The end (exclusive, just after `}`) of the last event followed by a separator."""
        window = max(pos, len(data) - (1 << 20))
        while True:
            last = None
            for last in _SEPARATOR.finditer(data, window):
                pass
            if last is not None:
                return last.start() + 1
            if window == pos:
                return None
            window = pos

    @staticmethod
    def _skip_to(data: bytes, cut: int) -> int:
        m = _SEPARATOR.match(data, cut - 1)
        return m.end() - 1 if m else cut

    def _parse_batch(self, data: bytes, pos: int, cut: int, data_offset: int,
                     line_base: int) -> Iterator[dict[str, Any]]:
        """All events of data[pos:cut] with one parse; on failure, event by event."""
        try:
            events = orjson.loads(b"[" + data[pos:cut] + b"]")
        except orjson.JSONDecodeError:
            events = None
        if events is not None and all(type(e) is dict for e in events):
            self._lines_known = False       # per-event lines are not tracked in batches
            self.event_offset = data_offset + pos
            self._event_line = 0
            yield from events
            self._lines_known = True
            return self._skip_to(data, cut)
        # A `},{` inside an event, or a malformed event: find which, event by event.
        return (yield from self._parse_matching(data, pos, cut, data_offset, line_base,
                                                re.compile(rb"\{")))

    def _parse_matching(self, data: bytes, pos: int, cut: int, data_offset: int, line_base: int,
                        needle_re: re.Pattern) -> Iterator[dict[str, Any]]:
        """The events of data[pos:cut] whose text matches `needle_re` (each parsed alone)."""
        search_from = pos
        resume = self._skip_to(data, cut)
        while True:
            m = needle_re.search(data, search_from, cut)
            if m is None:
                return resume
            start = self._event_start(data, m.start(), pos)
            end = self._event_end(data, m.end(), len(data))
            event, start, end = self._parse_event(data, start, end, pos, data_offset, line_base)
            if end > cut:
                # An event reaching past the cut (a `},{` inside it): take it up next round.
                return start
            self.event_offset = data_offset + start
            self._event_line = 0
            yield event
            search_from = end
            if end >= cut:
                resume = self._skip_to(data, end)

    @staticmethod
    def _event_start(data: bytes, p: int, lo: int) -> int:
        """Start of the event containing byte p: just after the last separator before it."""
        q = p + 1
        while True:
            q = data.rfind(b"}", lo, q)
            if q < 0:
                return lo
            m = _SEPARATOR.match(data, q)
            if m is not None and m.end() - 1 <= p:
                return m.end() - 1
            # a `}` inside the event: look further back

    @staticmethod
    def _event_end(data: bytes, p: int, hi: int) -> int:
        m = _SEPARATOR.search(data, p, hi)
        return m.start() + 1 if m else hi

    def _parse_event(self, data: bytes, start: int, end: int, lo: int, data_offset: int,
                     line_base: int) -> tuple[dict[str, Any], int, int]:
        """The event in data[start:end], widened across `},{` cuts inside it until it parses."""
        reason = ""
        first_start = start
        for _ in range(_MAX_JOINS):
            piece = data[start:end]
            balance = piece.count(b"{") - piece.count(b"}")
            if balance == 0:
                try:
                    event = orjson.loads(piece)
                except orjson.JSONDecodeError as e:
                    reason = f": {e}"
                else:
                    if isinstance(event, dict):
                        return event, start, end
                    reason = ": not an object"
            if balance >= 0 and end < len(data):
                end = self._event_end(data, end + 1, len(data))
            elif balance < 0 and start > lo:
                start = self._event_start(data, start - 2, lo)
            else:
                break
        if self._array_closes_at(data, first_start):
            raise _ArrayEnds(first_start)
        raise self._error(f"malformed trace event{reason}", data_offset + start, data, data_offset,
                          line_base)

    @staticmethod
    def _array_closes_at(data: bytes, start: int) -> bool:
        """Whether the event at `start` is the last one: `}`, `]`, then `,` or `}`."""
        for m in _ARRAY_END.finditer(data, start):
            try:
                event = orjson.loads(data[start:m.start() + 1])
            except orjson.JSONDecodeError:
                continue
            after = data[m.end():m.end() + 64].lstrip(_WHITESPACE)
            return isinstance(event, dict) and after[:1] in (b",", b"}", b"")
        return False

    def _final_events(self, data: bytes, pos: int, data_offset: int, line_base: int,
                      needle_re: re.Pattern | None, nothing: bool) -> Iterator[dict[str, Any]]:
        """The events from `pos` to the `]` closing the array, walked one at a time.

        Used once the whole rest of the stream is in `data`: there, what follows the array
        (a list of objects among the trailing keys) could pass for events, so no cut is
        trusted; each event ends at the first `}` before `,` or `]` where it parses."""
        while True:
            pos = _skip_blanks(data, pos)
            if pos < len(data) and data[pos] == 0x5D:          # "]"
                return pos + 1
            if pos >= len(data) or data[pos] != 0x7B:          # "{"
                raise self._error("truncated or malformed trace: expected an event or the end "
                                  "of traceEvents", data_offset + pos, data, data_offset, line_base)
            event, end = None, pos
            for tries, m in enumerate(_EVENT_CLOSE.finditer(data, pos)):
                if tries >= _MAX_JOINS:
                    break
                try:
                    candidate = orjson.loads(data[pos:m.end()])
                except orjson.JSONDecodeError:
                    continue
                if isinstance(candidate, dict):
                    event, end = candidate, m.end()
                    break
            if event is None:
                raise self._error("truncated or malformed trace event", data_offset + pos, data,
                                  data_offset, line_base)
            if not nothing and (needle_re is None or needle_re.search(data, pos, end)):
                self.event_offset = data_offset + pos
                self._event_line = 0
                yield event
            pos = end
            pos = _skip_blanks(data, pos)
            if pos < len(data) and data[pos] == 0x2C:          # ","
                pos += 1

    def _finish(self, f: BinaryIO, data: bytes, pos: int, data_offset: int, line_base: int,
                eof: bool) -> None:
        """The keys after `traceEvents` (Kineto writes traceName, displayTimeUnit, ...)."""
        rest = data[pos:]
        if not eof:
            parts = [rest]
            while True:
                chunk = self._read_folded(f, CHUNK_BYTES, data_offset + len(data))
                if not chunk:
                    break
                parts.append(chunk)
            rest = b"".join(parts)
        tail = rest.strip(_WHITESPACE)
        if not self.metadata and tail == b"":          # bare array: nothing follows
            return
        if tail.startswith(b","):
            tail = b"{" + tail[1:]
        elif tail.startswith(b"}"):
            tail = b"{" + tail
        try:
            more = orjson.loads(tail)
        except orjson.JSONDecodeError as e:
            raise self._error(f"malformed or truncated JSON after traceEvents: {e}",
                              data_offset + pos, data, data_offset, line_base) from None
        if isinstance(more, dict):
            self.metadata.update(more)

    def _events_ijson(self, head: bytes) -> Iterator[dict[str, Any]]:
        """Any other layout: ijson's C backend, events then the other top-level keys."""
        import ijson
        is_array = head.lstrip(_WHITESPACE)[:1] == b"["
        prefix = "item" if is_array else "traceEvents.item"
        index = -1
        try:
            with self._open() as f:
                for index, event in enumerate(ijson.items(f, prefix, use_float=True)):
                    if not isinstance(event, dict):
                        raise CollcError(f"trace event {index} is not an object",
                                         Span(self.source.name, 1, 1))
                    self.event_offset = index
                    self._lines_known = False
                    yield event
            if not is_array:
                with self._open() as f:
                    self.metadata = {k: v for k, v in ijson.kvitems(f, "", use_float=True)
                                     if k != "traceEvents"}
        except (ijson.JSONError, ijson.IncompleteJSONError) as e:
            raise CollcError(f"malformed or truncated trace after event {index + 1}: {e}",
                             Span(self.source.name, 1, 1)) from None
        except (EOFError, zlib.error) as e:
            raise CollcError(f"truncated or corrupt compressed trace: {e}",
                             Span(self.source.name, 1, 1)) from None


# A timestamp past this many microseconds (~31,700 years after 1970) is no clock's.
MAX_TIMESTAMP_US = 1e18


def event_interval(ts: Any, dur: Any) -> tuple[float, float] | str:
    """An event's (start, end) in microseconds, or why no profiler wrote it: a field that
    is not a number, a timestamp past any clock, a negative duration or one past
    COLLC_LIMIT_DURATION. Readers leave such events out and count them."""
    if not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (ts, dur)):
        return "non-numeric ts or dur"
    ts, dur = float(ts), float(dur)
    if not (math.isfinite(ts) and abs(ts) <= MAX_TIMESTAMP_US):
        return "timestamp out of range"
    if dur < 0:
        return "negative duration"
    if not dur <= limit("duration") * 1e6:
        return "duration out of range"
    return ts, ts + dur


def iter_events(path: str | Path | TraceSource, prefilter: Iterable[bytes] | None = None
                ) -> Iterator[dict[str, Any]]:
    """Every event of the trace's `traceEvents`, in file order, streamed.

    `prefilter`: byte strings; events whose raw text contains none of them may be left
    out without being parsed (a cheap superset filter: check what you get)."""
    return ChromeTrace(path).events(prefilter)


def trace_metadata(path: str | Path | TraceSource) -> dict[str, Any]:
    """The top-level keys other than traceEvents (distributedInfo, deviceProperties, ...).

    Reads the whole file (events are skipped without being parsed) so that keys written
    after the events are included."""
    trace = ChromeTrace(path)
    for _ in trace.events(prefilter=()):
        pass
    return trace.metadata
