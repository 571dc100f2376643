"""Located errors, shared by every stage.

Every error a user can cause is a `CollcError` carrying a `Span`; the CLI prints it as
`FILE:LINE:COL: error: MESSAGE`, the source line and a caret, and exits with status 1.
A `UsageError` (options that do not go together) exits with status 2.
"""

from __future__ import annotations

import codecs
import errno
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Span:
    """A region of a source file. Lines and columns count from 1."""

    file: str
    line: int
    column: int
    end_line: int | None = None
    end_column: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.column}"

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "column": self.column,
                "end_line": self.end_line, "end_column": self.end_column}

    @classmethod
    def from_json(cls, d: dict[str, Any] | None) -> "Span | None":
        if d is None:
            return None
        return cls(d["file"], d["line"], d["column"], d.get("end_line"), d.get("end_column"))


class CollcError(Exception):
    """An error in the user's input, reported at a place in their source."""

    def __init__(self, message: str, span: Span | None = None, notes: tuple[str, ...] = ()):
        super().__init__(message)
        self.message = message
        self.span = span
        self.notes = tuple(notes)

    def __str__(self) -> str:
        return f"{self.span}: {self.message}" if self.span else self.message


class ScheduleError(CollcError):
    """A schedule that breaks a structural rule or the collective's postcondition."""


class SolverError(CollcError):
    """The optimizer found no schedule (infeasible, or no incumbent before the limit)."""


class UsageError(Exception):
    """A command line that does not make sense (exit 2, with the command's usage)."""


# Byte-order marks of encodings other than UTF-8, which a .coll file must not use.
_FOREIGN_BOMS = ((codecs.BOM_UTF32_LE, "UTF-32"), (codecs.BOM_UTF32_BE, "UTF-32"),
                 (codecs.BOM_UTF16_LE, "UTF-16"), (codecs.BOM_UTF16_BE, "UTF-16"))


def decode_source(data: bytes, filename: str) -> str:
    """Source bytes as text: UTF-8, with or without a byte-order mark. Anything else is
    a located error naming the line, the column and the byte offset of the first byte
    that is not UTF-8 (the one place where collc decodes source files)."""
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    for bom, name in _FOREIGN_BOMS:
        if data.startswith(bom):
            raise CollcError(f"this file is encoded as {name}; collc reads UTF-8 (save it as UTF-8)",
                             Span(filename, 1, 1))
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        line_start = data.rfind(b"\n", 0, exc.start) + 1
        column = len(data[line_start:exc.start].decode("utf-8", errors="replace")) + 1
        raise CollcError(f"this file is not UTF-8: byte 0x{data[exc.start]:02X} at byte offset {exc.start} "
                         "cannot be decoded (save the file as UTF-8)", Span(filename, line, column)) from None


def read_input_bytes(path: str | os.PathLike) -> bytes:
    """The bytes of an input file. Only regular files are read: opening a FIFO would
    wait forever for a writer, and a device may never end. Raises OSError (with
    `strerror` saying why) for what cannot or must not be read."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else \
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
            raise OSError(errno.EINVAL, f"it is {what}, not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


# C0/C1 control characters but tab and newline: echoed raw they would drive the terminal
# (colours, cursor moves, window titles) with bytes from the user's file.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """`text` with control characters shown as escapes (`\\x1b`), safe for a terminal."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def read_source_line(span: Span, sources: dict[str, str] | None = None) -> str | None:
    text = (sources or {}).get(span.file)
    if text is None:
        try:
            data = read_input_bytes(span.file)
        except OSError:
            return None
        text = data.removeprefix(codecs.BOM_UTF8).decode("utf-8", errors="replace")
    lines = text.splitlines()
    if 1 <= span.line <= len(lines):
        return lines[span.line - 1]
    return None


# Characters of a source line shown under an error at most.
ECHO_WIDTH = 160


def format_error(err: CollcError, sources: dict[str, str] | None = None) -> str:
    """`FILE:LINE:COL: error: MESSAGE`, then the source line and a caret under the column."""
    if err.span is None:
        out = [f"collc: error: {err.message}"]
    else:
        out = [f"{err.span}: error: {err.message}"]
        line = read_source_line(err.span, sources)
        if line is not None:
            line = line.expandtabs(1)
            column = max(1, err.span.column)
            width = 1
            if err.span.end_line == err.span.line and err.span.end_column:
                width = max(1, err.span.end_column - err.span.column)
            # A very long line (minified XML, a generated file) is shown as a window
            # around the column.
            start = max(0, column - 1 - ECHO_WIDTH // 2) if len(line) > ECHO_WIDTH else 0
            window = line[start:start + ECHO_WIDTH]
            before = "..." if start > 0 else ""
            after = "..." if start + ECHO_WIDTH < len(line) else ""
            # The caret sits under the column's character, even where an escape widened
            # the text before it.
            caret_col = len(before) + len(printable(window[:column - 1 - start]))
            width = min(width, max(1, len(window) - (column - 1 - start)))
            out.append("    " + before + printable(window) + after)
            out.append("    " + " " * caret_col + "^" + "~" * (width - 1))
    out.extend(f"  note: {n}" for n in err.notes)
    return printable("\n".join(out))
