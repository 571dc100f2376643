"""Which trace format a file holds, from its first bytes (after gunzip), never its name.

Formats: "kineto" (Chrome trace JSON object with traceEvents), "nccl-profiler" (the NCCL
profiler plugin's Chrome-trace-like event array, often not strict JSON),
"nccl-inspector" (NCCL Inspector JSON lines), "nccl-log" (NCCL_DEBUG=INFO text),
"chakra-et" (Chakra protobuf execution trace), "chakra-json" (PyTorch host execution
trace or jsonized Chakra workload graph), "tar" (an archive whose members are detected
one by one).
"""

from __future__ import annotations

import gzip
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Callable

from ..diagnostics import CollcError, Span
from .urls import is_url, open_url

HEAD_BYTES = 1 << 16
LOG_SCAN_BYTES = 16 << 20
GZIP_MAGIC = b"\x1f\x8b"

_NCCL_LOG_LINE = re.compile(rb"NCCL (INFO|WARN|TRACE)\b")
_PROFILER_CATS = re.compile(rb'"cat"\s*:\s*"(GROUP_API|GROUP|COLL_API|COLL|P2P_API|P2P|KERNEL_LAUNCH|PROXY|NET|GPU)"')
_INSPECTOR_KEYS = re.compile(rb'"coll_sn"|"coll_msg_size_bytes"|"coll_exec_time_us"')


@dataclass(frozen=True)
class TraceSource:
    """Where a reader gets its bytes: a file, or a member of an archive (read in memory).

    `name` is what errors and summaries show (`archive.tgz:member.json` for a member);
    `open()` gives the bytes, gunzipped where they start with the gzip magic, without a
    leading UTF-8 byte-order mark (editors and spreadsheet programs write one; no JSON
    reader takes it).
    """

    name: str
    opener: Callable[[], BinaryIO]

    def open(self) -> BinaryIO:
        return _skip_bom(_maybe_gunzip(self.opener()))

    @classmethod
    def file(cls, path: str | Path) -> "TraceSource":
        """A local file, or a URL read through fsspec (`urls`)."""
        if is_url(path):
            return cls(str(path), lambda: open_url(str(path)))
        return cls(str(path), lambda: open(path, "rb"))


UTF8_BOM = b"\xef\xbb\xbf"


def _skip_bom(f: BinaryIO) -> BinaryIO:
    peek = getattr(f, "peek", None)
    if peek is not None and peek(3)[:3] == UTF8_BOM:
        f.read(3)
    return f


def _maybe_gunzip(f: BinaryIO) -> BinaryIO:
    magic = f.peek(2)[:2] if hasattr(f, "peek") else b""
    if not magic:
        magic = f.read(2)
        f.seek(0)
    if magic == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=f, mode="rb")  # type: ignore[return-value]
    return f


def open_binary(path: str | Path) -> BinaryIO:
    """The file's bytes, gunzipped when it starts with the gzip magic (whatever its name)."""
    return TraceSource.file(path).open()


def read_head(source: TraceSource, n: int = HEAD_BYTES) -> bytes:
    try:
        with source.open() as f:
            return f.read(n)
    except (OSError, EOFError, zlib.error) as e:
        raise CollcError(f"cannot read trace: {e}", Span(source.name, 1, 1)) from None


def detect_bytes(head: bytes) -> str | None:
    """The format of a stream whose first bytes are `head` (already gunzipped), or None."""
    if len(head) > 262 and head[257:262] == b"ustar":
        return "tar"
    stripped = head.lstrip()
    fmt = None
    if stripped[:1] == b"{":
        fmt = _json_object_format(stripped, head)
    elif stripped[:1] == b"[":
        if _PROFILER_CATS.search(head):
            fmt = "nccl-profiler"
        elif b'"ph"' in head:
            fmt = "kineto"   # a bare Chrome-trace event array
    if fmt is not None:
        return fmt
    if _NCCL_LOG_LINE.search(head):
        return "nccl-log"
    if _looks_like_chakra_et(head) and head.strip():  # blank lines start like a record
        return "chakra-et"
    return None


def _json_object_format(stripped: bytes, head: bytes) -> str | None:
    first_line = stripped.split(b"\n", 1)[0]
    if _INSPECTOR_KEYS.search(first_line):
        return "nccl-inspector"
    if b'"traceEvents"' in head or b'"deviceProperties"' in head or b'"schemaVersion"' in head:
        return "kineto"
    if re.search(rb'"schema"\s*:\s*"[^"]*"', head) and b'"nodes"' in head:
        return "chakra-json"
    if b'"workload_graph"' in head:
        return "chakra-json"
    if _INSPECTOR_KEYS.search(head):
        return "nccl-inspector"
    return None


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A protobuf varint at data[pos:]: (value, position after it). ValueError if cut short."""
    result = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("varint runs past the end of the data")
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint longer than 10 bytes")


def _looks_like_chakra_et(head: bytes) -> bool:
    """A varint length, then a message whose first field is GlobalMetadata.version (1, string)
    or ExecutionTraceMetadata-style attribute list: protobuf field 1 or 2, wire type 2."""
    try:
        length, pos = read_varint(head, 0)
    except ValueError:
        return False
    if length == 0 or pos >= len(head):
        return False
    tag = head[pos]
    return tag in (0x0A, 0x12) and length < (1 << 28)


def detect(source: TraceSource | str | Path) -> str:
    """The format of a file or member; a located CollcError when it is none collc reads."""
    if not isinstance(source, TraceSource):
        source = TraceSource.file(source)
    head = read_head(source)
    fmt = detect_bytes(head)
    if fmt is None and len(head) == HEAD_BYTES and b"\0" not in head:
        # A text file whose first NCCL line comes after much other output.
        if _NCCL_LOG_LINE.search(read_head(source, LOG_SCAN_BYTES)):
            fmt = "nccl-log"
    if fmt is None and not head.strip():
        raise CollcError("the file holds nothing but blank lines and spaces: it is no trace",
                         Span(source.name, 1, 1))
    if fmt is None:
        raise CollcError("not a trace format collc reads (NCCL debug log, Kineto/Chrome trace, "
                         "Chakra trace, NCCL profiler or Inspector output)", Span(source.name, 1, 1))
    return fmt
