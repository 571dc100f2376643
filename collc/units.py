"""Sizes, times and bandwidths: the units collc reads and writes, in one place.

The units are the .coll language's (the lexer's `UNIT` token, `grammar/coll.lark`):
sizes `B`, `KB`/`MB`/`GB`/`TB` (powers of 1000, as nccl-tests counts) and
`KiB`/`MiB`/`GiB`/`TiB` (powers of 1024); times `s`, `ms`, `us`, `ns`; bandwidths in
bytes (`GB/s`) or bits (`Gbit/s`, `Gb/s`) per second. A quantity's dimension is the
pair (exponent of bytes, exponent of seconds): a size is (1, 0), a time (0, 1), a
bandwidth (1, -1). Values are held in SI units (bytes, seconds, bytes per second).

On the command line a size may also take nccl-tests' (and the generated executors')
short forms `64K`, `1M`, `2G`, `1T`: powers of 1024, so `1M` = 1 MiB = 1,048,576 bytes
while `1MB` = 1,000,000 bytes.

This module is a bottom layer: it imports only `collc.diagnostics`.
"""

from __future__ import annotations

import math
import re
from typing import Callable

from collc.diagnostics import CollcError, Span

Dim = tuple[int, int]  # (bytes exponent, seconds exponent)

NUMBER: Dim = (0, 0)
SIZE: Dim = (1, 0)
TIME: Dim = (0, 1)
BANDWIDTH: Dim = (1, -1)

DIM_WORDS = {NUMBER: "a number", SIZE: "a size", TIME: "a time", BANDWIDTH: "a bandwidth"}
DIM_EXAMPLES = {SIZE: "64 MiB", TIME: "0.7 us", BANDWIDTH: "25 GB/s"}

# unit -> (SI factor, dimension). Bits are an eighth of a byte; GB = 1e9 bytes (as
# nccl-tests counts), GiB = 2**30. Binary factors are ints so that whole sizes stay exact.
UNITS: dict[str, tuple[float, Dim]] = {
    "TB/s": (1e12, BANDWIDTH), "GB/s": (1e9, BANDWIDTH), "MB/s": (1e6, BANDWIDTH), "KB/s": (1e3, BANDWIDTH),
    "Tbit/s": (1e12 / 8, BANDWIDTH), "Gbit/s": (1e9 / 8, BANDWIDTH), "Mbit/s": (1e6 / 8, BANDWIDTH),
    "Tb/s": (1e12 / 8, BANDWIDTH), "Gb/s": (1e9 / 8, BANDWIDTH), "Mb/s": (1e6 / 8, BANDWIDTH),
    "s": (1.0, TIME), "ms": (1e-3, TIME), "us": (1e-6, TIME), "ns": (1e-9, TIME),
    "B": (1, SIZE), "KB": (1e3, SIZE), "MB": (1e6, SIZE), "GB": (1e9, SIZE), "TB": (1e12, SIZE),
    "KiB": (2 ** 10, SIZE), "MiB": (2 ** 20, SIZE), "GiB": (2 ** 30, SIZE), "TiB": (2 ** 40, SIZE),
}

# nccl-tests' size suffixes (command line only, not in .coll source): powers of 1024.
BINARY_SHORTHAND: dict[str, int] = {"K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30, "T": 2 ** 40}

# A number as the language writes it (`1024`, `1.5`, `1e9`), and also `.5` and `5.`
# (which `collc harvest` has always taken), then an optional unit.
_QUANTITY = re.compile(r"(?P<lead>\s*)(?P<number>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
                       r"(?P<gap>\s*)(?P<unit>[A-Za-z/]*)\s*")
_WHOLE = re.compile(r"[0-9]+")


def units_of(dim: Dim) -> list[str]:
    """The language's units of one dimension, in the order of `UNITS`."""
    return [unit for unit, (_, d) in UNITS.items() if d == dim]


def _located(span: Span | None, filename: str, start: int, end: int) -> Span:
    """Columns `start`..`end` (0-based, end exclusive) of a text that begins at `span`."""
    if span is None:
        return Span(filename, 1, start + 1, 1, end + 1)
    return Span(span.file, span.line, span.column + start, span.line, span.column + end)


def _factor(unit: str, dim: Dim, ignore_case: bool) -> tuple[float, Dim] | None:
    """The factor and dimension of a unit written after a number, or None if unknown."""
    if dim == SIZE and unit in BINARY_SHORTHAND:
        return BINARY_SHORTHAND[unit], SIZE
    if unit in UNITS:
        return UNITS[unit]
    if ignore_case:  # only sizes: `Mb/s` and `MB/s` differ, but no two size units fold together
        folded = {u.upper(): u for u in [*units_of(SIZE), *BINARY_SHORTHAND]}
        if unit.upper() in folded:
            return _factor(folded[unit.upper()], dim, False)
    return None


def parse_quantity(text: str, dim: Dim, span: Span | None = None, *, ignore_case: bool = False,
                   filename: str = "<value>") -> float:
    """`NUMBER [UNIT]` of one dimension -> its value in SI units. A bare number is in the
    base unit (bytes, seconds, bytes per second). Errors are CollcErrors located in
    `text`, which begins at `span` (else column 1 of `filename`). `ignore_case` reads
    size units case-insensitively (`512m`, `2gib`), as `collc harvest` does."""
    assert not ignore_case or dim == SIZE, "only size units are unambiguous without case"
    example = DIM_EXAMPLES.get(dim, "1")
    match = _QUANTITY.fullmatch(text)
    if match is None:
        raise CollcError(f"cannot read '{text}' as {DIM_WORDS[dim]} such as `{example}`",
                         _located(span, filename, 0, max(len(text), 1)))
    number, unit = match.group("number"), match.group("unit")
    unit_at = match.start("unit")
    value: float = int(number) if _WHOLE.fullmatch(number) else float(number)
    if not unit:
        factor: float = 1
    else:
        found = _factor(unit, dim, ignore_case)
        where = _located(span, filename, unit_at, unit_at + len(unit))
        if found is None:
            known = ", ".join(units_of(dim) + (list(BINARY_SHORTHAND) if dim == SIZE else []))
            raise CollcError(f"unknown unit '{unit}' in '{text.strip()}': {DIM_WORDS[dim]} takes {known}", where)
        factor, unit_dim = found
        if unit_dim != dim:
            got = _FORMATTERS[unit_dim](value * factor)
            raise CollcError(f"expected {DIM_WORDS[dim]} such as `{example}`, got {DIM_WORDS[unit_dim]} ({got})",
                             _located(span, filename, match.start("number"), match.end("unit")))
    result = value * factor
    if not math.isfinite(result):
        raise CollcError(f"the number {number} is too large to represent",
                         _located(span, filename, match.start("number"), match.end("number")))
    return result


def parse_size(text: str, span: Span | None = None, *, ignore_case: bool = False) -> int:
    """`"1MiB"`, `"256MB"`, `"64 KiB"`, `"1024"`, `"1M"` (= 1 MiB, as nccl-tests reads it)
    -> a whole number of bytes (0 is allowed: "no limit" in ranges)."""
    value = parse_quantity(text, SIZE, span, ignore_case=ignore_case, filename="<size>")
    if isinstance(value, float) and not value.is_integer():
        raise CollcError(f"a size must be a whole number of bytes, got {format_number(value)} B",
                         _located(span, "<size>", 0, max(len(text), 1)))
    return int(value)


def parse_time(text: str, span: Span | None = None) -> float:
    """`"5 us"`, `"1.2ms"`, `"2"` (seconds) -> seconds."""
    return float(parse_quantity(text, TIME, span, filename="<time>"))


def parse_bandwidth(text: str, span: Span | None = None) -> float:
    """`"25 GB/s"`, `"100 Gbit/s"`, `"1e9"` (bytes per second) -> bytes per second."""
    return float(parse_quantity(text, BANDWIDTH, span, filename="<bandwidth>"))


SizeParser = Callable[[str, Span], int]


def parse_size_list(text: str, filename: str, parse_one: SizeParser = parse_size) -> list[int]:
    """`"1MiB, 4MiB,64M"` -> sizes, each error located at its column of `filename`
    (`<--size>`). `parse_one` reads one size (a caller may add its own limits)."""
    sizes, column = [], 1
    for part in text.split(","):
        lead = len(part) - len(part.lstrip())
        if part.strip():
            sizes.append(parse_one(part.strip(), Span(filename, 1, column + lead)))
        column += len(part) + 1
    return sizes


def parse_size_range(text: str, filename: str, parse_one: SizeParser = parse_size) -> tuple[int, int]:
    """`"MIN:MAX"` (either may be empty, meaning 0: "no limit") -> (min, max) bytes.
    Raises ValueError when there is no `:` (a usage error, not a located one)."""
    if ":" not in text:
        raise ValueError(f"{filename.strip('<>')} takes MIN:MAX (e.g. 0:1MiB; MAX 0 means no limit)")
    lo, hi = text.split(":", 1)
    return (parse_one(lo or "0", Span(filename, 1, 1)),
            parse_one(hi or "0", Span(filename, 1, len(lo) + 2)))


# --- writing -----------------------------------------------------------------------------

def format_number(x: float) -> str:
    """Six significant digits, as every quantity is written in messages."""
    return f"{x:.6g}"


def format_bytes(nbytes: float, *, exact: bool = True) -> str:
    """A size for people to read.

    exact=True (the language's own spelling, used in messages): the largest binary unit
    that divides it, else the largest decimal one, else bytes: `64 MiB`, `256 MB`, `1000 B`,
    `1.5 B`. exact=False (profile tables and plots): the largest binary unit below
    1024 of it, rounded to one decimal place (whole numbers without): `1.5 KiB`, `64 MiB`."""
    return _format_exact(nbytes) if exact else _format_rounded(nbytes)


def _format_exact(nbytes: float) -> str:
    if nbytes == int(nbytes):
        n = int(nbytes)
        for unit, f in (("TiB", 2 ** 40), ("GiB", 2 ** 30), ("MiB", 2 ** 20), ("KiB", 2 ** 10)):
            if n and n % f == 0:
                return f"{n // f} {unit}"
        for unit, f in (("TB", 10 ** 12), ("GB", 10 ** 9), ("MB", 10 ** 6), ("KB", 10 ** 3)):
            if n and n % f == 0:
                return f"{n // f} {unit}"
        return f"{n} B"
    return f"{format_number(nbytes)} B"


def _format_rounded(nbytes: float) -> str:
    n = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or n == math.floor(n) else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"  # pragma: no cover - the loop returns at TiB


def format_time(seconds: float) -> str:
    """`1.2 ms`, `700 ns`, `3 s`: the largest unit in which it is at least 1 (us from 0.1 us)."""
    v = abs(seconds)
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-7)):
        if v >= f:
            f = 1e-6 if unit == "us" else f
            return f"{format_number(seconds / f)} {unit}"
    return f"{format_number(seconds / 1e-9)} ns"


def format_bandwidth(bytes_per_second: float) -> str:
    """Always in GB/s (10^9 bytes per second), as link tables are read."""
    return f"{format_number(bytes_per_second / 1e9)} GB/s"


_FORMATTERS: dict[Dim, Callable[[float], str]] = {SIZE: format_bytes, TIME: format_time, BANDWIDTH: format_bandwidth}
