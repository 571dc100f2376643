"""Located errors, shared by every stage.

Every error a user can cause is a `CollcError` carrying a `Span`; the CLI prints it as
`FILE:LINE:COL: error: MESSAGE`, the source line and a caret, and exits with status 1.
"""

from __future__ import annotations

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


def read_source_line(span: Span, sources: dict[str, str] | None = None) -> str | None:
    text = (sources or {}).get(span.file)
    if text is None:
        try:
            text = Path(span.file).read_text(encoding="utf-8")
        except OSError:
            return None
    lines = text.splitlines()
    if 1 <= span.line <= len(lines):
        return lines[span.line - 1]
    return None


def format_error(err: CollcError, sources: dict[str, str] | None = None) -> str:
    """`FILE:LINE:COL: error: MESSAGE`, then the source line and a caret under the column."""
    if err.span is None:
        out = [f"collc: error: {err.message}"]
    else:
        out = [f"{err.span}: error: {err.message}"]
        line = read_source_line(err.span, sources)
        if line is not None:
            out.append("    " + line.expandtabs(1))
            width = 1
            if err.span.end_line == err.span.line and err.span.end_column:
                width = max(1, err.span.end_column - err.span.column)
            out.append("    " + " " * (err.span.column - 1) + "^" + "~" * (width - 1))
    out.extend(f"  note: {n}" for n in err.notes)
    return "\n".join(out)
