"""NCCL profiler-plugin output: the example plugin's event dumps and NCCL Inspector's JSON lines.

Example-plugin dumps (NCCL >= 2.23) are Chrome-trace-like arrays of begin/end events, one
per line, that are often not strict JSON: unquoted values (`"Stream": 0x262ca50`,
`"datatype": ncclFloat32`), blank lines, a trailing `{}]`, curly quotes, lines such as
`... [ trace truncated for brevity ]`. They are read line by line, leniently: unquoted
values are quoted, curly quotes straightened, and what still does not parse is skipped
and counted. A call is a `COLL` (args SeqNum, CommHash, Rank, Count, Datatype, Algorithm,
Protocol, nChannels) or `P2P` (CommHash, Rank, Peer, Count, Datatype) begin event; its
duration is the time to the end event of the same name, category, id and process.

NCCL Inspector (NCCL >= 2.28.3) writes one JSON object per line, one per collective per
communicator: `coll`, `coll_sn`, `coll_msg_size_bytes`, `coll_exec_time_us`, the timing
source, algorithm and bus bandwidth, and a header with the communicator's id, rank and size
(at the top level or under `header`/`coll_perf`). `coll_msg_size_bytes` is count x element
size in NCCL's meaning of count: one rank's part for AllGather and ReduceScatter (the
Inspector's own algobw for ReduceScatter is msg size x n_ranks / time).
"""

from __future__ import annotations

import re
import zlib
from typing import Any, BinaryIO, Iterator

import orjson

from ..diagnostics import CollcError, Span
from .collectives import COLLECTIVE_OPS, call_sizes
from .detect import TraceSource
from .records import CollectiveCall, SourceSummary, TraceContext

NCCL_DTYPES = {
    "ncclInt8": ("int8", 1), "ncclChar": ("int8", 1), "ncclUint8": ("uint8", 1),
    "ncclInt32": ("int32", 4), "ncclInt": ("int32", 4), "ncclUint32": ("uint32", 4),
    "ncclInt64": ("int64", 8), "ncclUint64": ("uint64", 8), "ncclFloat16": ("float16", 2),
    "ncclHalf": ("float16", 2), "ncclFloat32": ("float32", 4), "ncclFloat": ("float32", 4),
    "ncclFloat64": ("float64", 8), "ncclDouble": ("float64", 8), "ncclBfloat16": ("bfloat16", 2),
    "ncclFloat8e4m3": ("fp8_e4m3", 1), "ncclFloat8e5m2": ("fp8_e5m2", 1)}

# A bare (unquoted) value after a key: a hex pointer or an identifier such as ncclFloat32.
_BARE_VALUE = re.compile(rb'(:\s*)(0x[0-9a-fA-F]+|\(nil\)|[A-Za-z_][A-Za-z0-9_]*)(\s*[,}\]])')
_JSON_WORDS = {b"true", b"false", b"null"}


def _lines(f: BinaryIO, name: str) -> Iterator[tuple[int, bytes]]:
    try:
        for number, line in enumerate(f, 1):
            yield number, line
    except (EOFError, zlib.error, OSError) as e:
        raise CollcError(f"truncated or corrupt compressed file: {e}", Span(name, 1, 1)) from None


def _quote_bare(m: re.Match) -> bytes:
    value = m.group(2)
    if value in _JSON_WORDS:
        return m.group(0)
    return m.group(1) + b'"' + value + b'"' + m.group(3)


def parse_lenient(text: bytes) -> Any:
    """One event's text as JSON, after the repairs the plugin's output needs; raises
    orjson.JSONDecodeError when even that does not parse."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    fixed = text.replace("\u201c".encode(), b'"').replace("\u201d".encode(), b'"')
    fixed = _BARE_VALUE.sub(_quote_bare, fixed)
    fixed = re.sub(rb",\s*([}\]])", rb"\1", fixed)        # trailing commas
    return orjson.loads(fixed)


def read_profiler_dump(source: TraceSource, summary: SourceSummary, context: TraceContext
                       ) -> Iterator[CollectiveCall]:
    begins: dict[tuple, tuple[dict, int]] = {}
    ends: dict[tuple, float] = {}
    first_bad: int | None = None
    events = 0
    with source.open() as f:
        for number, raw in _lines(f, source.name):
            text = raw.strip().rstrip(b",").strip()
            if text in (b"", b"[", b"]", b"{}", b"{}]", b"[{}", b"[]"):
                continue
            text = text.removeprefix(b"[").strip()
            if text.endswith(b"]") and not text.endswith(b"}]}"):
                text = text[:-1].rstrip().rstrip(b",")
            try:
                event = parse_lenient(text)
            except orjson.JSONDecodeError:
                summary.skip("line that is no event, even read leniently")
                first_bad = first_bad or number
                continue
            if not isinstance(event, dict):
                summary.skip("line that is no event, even read leniently")
                first_bad = first_bad or number
                continue
            events += 1
            cat = event.get("cat")
            if cat not in ("COLL", "P2P"):
                continue
            key = (event.get("name"), cat, event.get("id"), event.get("pid"))
            if event.get("ph") == "b":
                begins[key] = (event, number)
            elif event.get("ph") == "e" and isinstance(event.get("ts"), (int, float)):
                ends[key] = float(event["ts"])
    if events == 0:
        raise CollcError("no event of this NCCL profiler dump parses, even read leniently",
                         Span(source.name, first_bad or 1, 1))
    if first_bad is not None:
        context.notes.append(f"{source.name}: {sum(v for k, v in summary.skipped.items() if k.startswith('line'))} "
                             f"lines were not events even read leniently and were skipped "
                             f"(first at line {first_bad})")
    for key in ends.keys() - begins.keys():
        summary.skip("end event without its begin event (trace cut)")
    open_calls = 0
    for key, (event, number) in begins.items():
        call = _profiler_call(event, number, ends.get(key), source, summary, context)
        if call is not None:
            summary.records += 1
            open_calls += call.duration_us is None
            yield call
    if open_calls:
        context.notes.append(f"{source.name}: {open_calls} calls have no end event (trace cut) "
                             "and so no duration")


def _profiler_call(event: dict, line: int, end_ts: float | None, source: TraceSource,
                   summary: SourceSummary, context: TraceContext) -> CollectiveCall | None:
    args = event.get("args") or {}
    coll = COLLECTIVE_OPS.get(str(event.get("name", "")).encode())
    if coll is None:
        summary.skip(f"{event.get('cat')} event of an unknown operation ({event.get('name')})")
        return None
    dtype, size = NCCL_DTYPES.get(str(args.get("Datatype")), (args.get("Datatype"), None))
    count = args.get("Count")
    count = int(count) if isinstance(count, (int, float)) else None
    comm = args.get("CommHash")
    communicator = str(comm) if comm is not None else None
    info = context.communicators.get(communicator) if communicator else None
    nranks = info.nranks if info else None
    in_b, out_b, nbytes = (call_sizes(coll, count, size, nranks) if count is not None
                           else (None, None, None))
    start = event.get("ts")
    duration = end_ts - float(start) if end_ts is not None and isinstance(start, (int, float)) else None
    if communicator is not None:
        context.communicator(communicator)
    return CollectiveCall(source=source.name, location=f"line {line}", collective=coll,
                          rank=args.get("Rank"), communicator=communicator, nranks=nranks,
                          dtype=dtype, count=count, bytes=nbytes, seq=args.get("SeqNum"),
                          start_us=float(start) if isinstance(start, (int, float)) else None,
                          duration_us=duration, peer=args.get("Peer"),
                          algorithm=args.get("Algorithm"), protocol=args.get("Protocol"),
                          named_by="metadata", in_bytes=in_b, out_bytes=out_b)


# -- NCCL Inspector ---------------------------------------------------------------------------

_INSPECTOR_COLLS = {k.decode().lower(): v for k, v in COLLECTIVE_OPS.items()}


def _find(obj: dict, *keys: str) -> Any:
    """The first of `keys` at the top level or one level down (header, coll_perf, ...)."""
    for key in keys:
        if key in obj:
            return obj[key]
    for value in obj.values():
        if isinstance(value, dict):
            for key in keys:
                if key in value:
                    return value[key]
    return None


def read_inspector(source: TraceSource, summary: SourceSummary, context: TraceContext
                   ) -> Iterator[CollectiveCall]:
    """One object per line (JSON lines), or pretty-printed objects one after another as
    the Inspector README shows them."""
    parts: list[bytes] = []
    depth = 0
    start_line = 0
    with source.open() as f:
        for number, raw in _lines(f, source.name):
            text = raw.strip()
            if not text and not parts:
                continue
            if not parts:
                start_line = number
            parts.append(text)
            depth += text.count(b"{") - text.count(b"}")
            if depth > 0:
                continue
            obj = _inspector_object(b"".join(parts), source, start_line)
            parts, depth = [], 0
            call = _inspector_call(obj, start_line, source, summary, context)
            if call is not None:
                summary.records += 1
                yield call
    if parts:
        raise CollcError("truncated NCCL Inspector output: the last object is not closed",
                         Span(source.name, start_line, 1))


def _inspector_object(text: bytes, source: TraceSource, line: int) -> dict:
    try:
        obj = orjson.loads(text)
    except orjson.JSONDecodeError as e:
        raise CollcError(f"malformed NCCL Inspector record: {e}", Span(source.name, line, 1)) from None
    if not isinstance(obj, dict):
        raise CollcError("NCCL Inspector record is not a JSON object", Span(source.name, line, 1))
    return obj


def _inspector_call(obj: dict, line: int, source: TraceSource, summary: SourceSummary,
                    context: TraceContext) -> CollectiveCall | None:
    name = _find(obj, "coll")
    if name is None:
        summary.skip("line with no collective (header or summary)")
        return None
    coll = _INSPECTOR_COLLS.get(str(name).lower().replace("_", ""))
    if coll is None:
        summary.skip(f"collective of an unknown name ({name})")
        return None
    size = _find(obj, "coll_msg_size_bytes")
    if not isinstance(size, (int, float)):
        raise CollcError("NCCL Inspector record without a numeric coll_msg_size_bytes",
                         Span(source.name, line, 1))
    nranks = _find(obj, "n_ranks", "nranks", "nRanks")
    nranks = int(nranks) if isinstance(nranks, (int, float)) else None
    comm = _find(obj, "id", "comm_id", "commId", "comm_hash")
    communicator = str(comm) if comm is not None else None
    if communicator is not None:
        context.communicator(communicator, nranks)
    rank = _find(obj, "rank")
    part = int(size)
    in_b, out_b, nbytes = call_sizes(coll, part, 1, nranks)
    exec_us = _find(obj, "coll_exec_time_us")
    start = _find(obj, "coll_start_time_us", "start_time_us")
    return CollectiveCall(source=source.name, location=f"line {line}", collective=coll,
                          rank=int(rank) if isinstance(rank, (int, float)) else None,
                          communicator=communicator, nranks=nranks, bytes=nbytes,
                          seq=_find(obj, "coll_sn"),
                          start_us=float(start) if isinstance(start, (int, float)) else None,
                          duration_us=float(exec_us) if isinstance(exec_us, (int, float)) else None,
                          algorithm=_find(obj, "coll_algo", "algo"), protocol=_find(obj, "coll_proto", "proto"),
                          named_by="metadata", in_bytes=in_b, out_bytes=out_b)
