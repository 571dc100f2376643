"""Run-time values of .coll expressions: numbers, quantities with dimensions, ranges,
lists, chunk sets and strings; units; and how each is written in messages.

A quantity's dimension is the pair (exponent of bytes, exponent of seconds): a size is
(1, 0), a time (0, 1), a bandwidth (1, -1). Arithmetic combines dimensions, so
`1 GiB / 25 GB/s` is a time, and a link's `bw 5 us` is caught as a time where a
bandwidth was expected. Quantities are held in SI units (bytes, seconds). The units
themselves, and how sizes, times and bandwidths are written, are `collc.units`'.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from collc.ir.collective import ChunkId, value_str
from collc.units import (
    BANDWIDTH, DIM_WORDS, NUMBER, SIZE, TIME, UNITS, Dim, format_bandwidth, format_bytes, format_number, format_time,
)


class Unit(str, Enum):
    """Units a literal may carry; values are the source tokens."""

    TB_S = "TB/s"
    GB_S = "GB/s"
    MB_S = "MB/s"
    KB_S = "KB/s"
    TBIT_S = "Tbit/s"
    GBIT_S = "Gbit/s"
    MBIT_S = "Mbit/s"
    TB_S_BITS = "Tb/s"
    GB_S_BITS = "Gb/s"
    MB_S_BITS = "Mb/s"
    S = "s"
    MS = "ms"
    US = "us"
    NS = "ns"
    B = "B"
    KB = "KB"
    MB = "MB"
    GB = "GB"
    TB = "TB"
    KIB = "KiB"
    MIB = "MiB"
    GIB = "GiB"
    TIB = "TiB"


assert set(UNITS) == {u.value for u in Unit}


@dataclass(frozen=True)
class Quantity:
    """A number with a dimension other than (0, 0), in SI units."""

    value: float
    dim: Dim

    def __str__(self) -> str:
        return format_quantity(self)


@dataclass(frozen=True)
class Chunks:
    """A set of input chunks reduced together: `chunk(0, 1)`, `sum(...)`."""

    chunks: frozenset[ChunkId]

    def __str__(self) -> str:
        return value_str(self.chunks)


def quantity(value: float, dim: Dim) -> "Quantity | int | float":
    """A value of a dimension; dimensionless results are plain numbers."""
    if dim == NUMBER:
        return value
    return Quantity(value, dim)


def dim_of(value: object) -> Dim | None:
    """The dimension of a numeric value, or None for a non-number."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return NUMBER
    if isinstance(value, Quantity):
        return value.dim
    return None


def dim_word(dim: Dim) -> str:
    if dim in DIM_WORDS:
        return DIM_WORDS[dim]
    parts = []
    if dim[0]:
        parts.append("B" if dim[0] == 1 else f"B^{dim[0]}")
    if dim[1]:
        parts.append("s" if dim[1] == 1 else f"s^{dim[1]}")
    return "a quantity in " + " ".join(parts)


def type_word(value: object) -> str:
    """`a bandwidth`, `a string`, ... for messages."""
    if isinstance(value, bool):
        return "true or false"
    dim = dim_of(value)
    if dim is not None:
        return dim_word(dim)
    if isinstance(value, str):
        return "a string"
    if isinstance(value, range):
        return "a range"
    if isinstance(value, tuple):
        return "a set"
    if isinstance(value, Chunks):
        return "a chunk value"
    return type(value).__name__


def format_quantity(q: Quantity) -> str:
    if q.dim == BANDWIDTH:
        return format_bandwidth(q.value)
    if q.dim == TIME:
        return format_time(q.value)
    if q.dim == SIZE:
        return format_bytes(q.value)
    return f"{format_number(q.value)} ({dim_word(q.dim)})"


def format_value(value: object) -> str:
    """A value as .coll would write it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, Quantity):
        return format_quantity(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, range):
        return f"{value.start}..{value.stop}"
    if isinstance(value, tuple):
        return "{" + ", ".join(format_value(v) for v in value) + "}"
    if isinstance(value, Chunks):
        return str(value)
    return str(value)
