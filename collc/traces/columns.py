"""Call records as compact columns: what a worker process (or a Dask worker) sends back.

A file's `CollectiveCall`s pickled one by one cost about a microsecond and 300 bytes
each; as columns (NumPy arrays of integers and floats, strings as small tables of
distinct values) they cost a few bytes each and one `pickle` of a dozen arrays.
`to_columns` and `from_columns` are exact inverses: every field comes back equal.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from dataclasses import dataclass, fields
from operator import attrgetter
from typing import Any, Iterator, Sequence

import numpy as np

from .records import CollectiveCall

# Fields stored as indices into a table of their distinct values.
_CODED = ("source", "collective", "communicator", "dtype", "algorithm", "protocol", "named_by")
# Integer fields: int64 with a mask for None (an opCount of more than 63 bits is kept as objects).
_INTS = ("rank", "nranks", "count", "bytes", "seq", "peer", "in_bytes", "out_bytes")
_FLOATS = ("start_us", "duration_us")
assert set(_CODED) | set(_INTS) | set(_FLOATS) | {"location", "group_ranks"} == \
    {f.name for f in fields(CollectiveCall)}, "a CollectiveCall field has no column"


@dataclass
class CallColumns:
    """The columns of a list of calls (see the module docstring)."""

    n: int
    tables: dict[str, list]                  # coded field -> its distinct values
    codes: dict[str, np.ndarray]             # coded field -> int32 indices
    ints: dict[str, np.ndarray]              # int field -> int64 (or object) values
    int_none: dict[str, np.ndarray]          # int field -> bool mask of None
    floats: dict[str, np.ndarray]            # float field -> float64, NaN for None
    float_none: dict[str, np.ndarray]
    location_kind: np.ndarray                # index into location_kinds ("line ", "event ", ...)
    location_number: np.ndarray              # the number after it (int64), -1 where none
    location_kinds: list[str]
    location_other: dict[int, str]           # locations not of the form "<words> <number>"
    group_ranks: dict[int, tuple[int, ...]]  # the few records that carry members


_ORDER = tuple(f.name for f in fields(CollectiveCall))     # the constructor's positional order
_GET_ALL = attrgetter(*_ORDER)


def coded(values: tuple) -> tuple[list, np.ndarray]:
    table = list(dict.fromkeys(values))                   # distinct values, first seen first
    lookup = {v: i for i, v in enumerate(table)}
    return table, np.fromiter(map(lookup.__getitem__, values), dtype=np.int32, count=len(values))


def with_none(values: tuple, fill: Any, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    objects = np.array(values, dtype=object)
    none = np.equal(objects, None)
    objects[none] = fill
    try:
        return objects.astype(dtype), none
    except OverflowError:                                 # an opCount of 64 bits: kept as is
        return objects, none


def to_columns(calls: Sequence[CollectiveCall]) -> CallColumns:
    with _collector_paused():
        return _to_columns(calls)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """The cyclic garbage collector paused: the columns' temporary tuples (one per record)
    and the records made back are all kept until the end, and each collection while they
    are made would walk them all (twice the time otherwise)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _to_columns(calls: Sequence[CollectiveCall]) -> CallColumns:
    n = len(calls)
    # One pass over the records (C-level: attrgetter, zip), then one per column.
    by_field = dict(zip(_ORDER, zip(*map(_GET_ALL, calls)))) if n else {name: () for name in _ORDER}
    tables: dict[str, list] = {}
    codes: dict[str, np.ndarray] = {}
    for name in _CODED:
        tables[name], codes[name] = coded(by_field[name])
    ints, int_none = {}, {}
    for name in _INTS:
        ints[name], int_none[name] = with_none(by_field[name], 0, np.int64)
    floats, float_none = {}, {}
    for name in _FLOATS:
        floats[name], float_none[name] = with_none(by_field[name], np.nan, np.float64)
    kinds: dict[str, int] = {}
    kind: list[int] = []
    number: list[int] = []
    other: dict[int, str] = {}
    for i, location in enumerate(by_field["location"]):
        head, _, digits = location.rpartition(" ")
        if not digits.isdigit() or str(int(digits)) != digits:     # keep other texts as they are
            other[i] = location
            kind.append(-1)
            number.append(-1)
            continue
        kind.append(kinds.setdefault(head + " ", len(kinds)))
        number.append(int(digits))
    group_ranks = {i: g for i, g in enumerate(by_field["group_ranks"]) if g is not None}
    return CallColumns(n, tables, codes, ints, int_none, floats, float_none, np.array(kind, dtype=np.int32),
                       np.array(number, dtype=np.int64), list(kinds), other, group_ranks)


def _restore(values: np.ndarray, none: np.ndarray) -> list:
    objects = values.astype(object)                        # Python ints and floats
    objects[none] = None
    return objects.tolist()


def from_columns(cols: CallColumns) -> list[CollectiveCall]:
    """The calls again, field for field."""
    with _collector_paused():
        return _from_columns(cols)


def _from_columns(cols: CallColumns) -> list[CollectiveCall]:
    by_field: dict[str, list] = {}
    for name in _CODED:
        by_field[name] = list(map(cols.tables[name].__getitem__, cols.codes[name].tolist()))
    for name in _INTS:
        by_field[name] = _restore(cols.ints[name], cols.int_none[name])
    for name in _FLOATS:
        by_field[name] = _restore(cols.floats[name], cols.float_none[name])
    kinds, other = cols.location_kinds, cols.location_other
    by_field["location"] = [other[i] if k < 0 else f"{kinds[k]}{num}"
                            for i, (k, num) in enumerate(zip(cols.location_kind.tolist(),
                                                             cols.location_number.tolist()))]
    group_ranks = cols.group_ranks
    by_field["group_ranks"] = [group_ranks.get(i) for i in range(cols.n)] if group_ranks else [None] * cols.n
    return list(map(CollectiveCall, *(by_field[name] for name in _ORDER)))


def concat_columns(parts: Sequence[CallColumns], consume: bool = False) -> CallColumns:
    """The columns of several lists of calls, one after the other: codes renumbered into
    merged tables, positions of the sparse fields offset; no record is made.

    `consume`: the parts are the caller's to drop (a parallel read's per-file results),
    and each is emptied as soon as it is copied into the joined columns, so that joining
    needs the memory of the result and of one part, not twice the result's (19 M records
    take about 2.5 GB as columns)."""
    joiner = ColumnsJoiner(len(parts), consume)
    for part in parts:
        joiner.add(part)
    return joiner.result()


def _release(part: CallColumns) -> None:
    for arrays in (part.codes, part.ints, part.int_none, part.floats, part.float_none):
        arrays.clear()
    part.location_kind = part.location_number = np.zeros(0, dtype=np.int32)


class ColumnsJoiner:
    """The columns of several lists of calls joined a part at a time, as the parts come
    (a parallel read's files, in file order): each part is copied into the joined arrays
    when it comes and may be dropped at once. So the reading process joins while its
    workers still read, and holds the joined columns and one part, never every part and
    then their join (on 64 per-rank logs the join at the end took 8 s, nearly all of it
    the kernel handing out the memory for a second copy of 2.5 GB).

    The arrays are made for `expected_parts` parts the size of the first, with room to
    spare (never written, so never given memory by the kernel), and grown where more
    comes. `consume`: each part's arrays are dropped once copied (the caller may still
    hold the part). `result()` is what `concat_columns` of the same parts gives."""

    # Room for parts this much larger than the first before the arrays must be grown.
    SPARE = 1.25

    def __init__(self, expected_parts: int = 1, consume: bool = False):
        self.expected_parts = max(expected_parts, 1)
        self.consume = consume
        self.first: CallColumns | None = None        # a lone part is kept as it is
        self.parts = 0
        self.n = 0
        self.tables: dict[str, dict] = {name: {} for name in _CODED}
        self.kinds: dict[str, int] = {}
        self.other: dict[int, str] = {}
        self.group_ranks: dict[int, tuple[int, ...]] = {}
        self.arrays: dict[tuple[str, str], np.ndarray] = {}    # (attribute, field) -> the joined array

    def add(self, part: CallColumns) -> None:
        self.parts += 1
        if self.parts == 1:
            self.first = part
            return
        if self.first is not None:
            first, self.first = self.first, None
            self._allocate(first, int(first.n * self.expected_parts * self.SPARE) + part.n)
            self._copy(first)
        self._copy(part)

    def result(self) -> CallColumns:
        if self.first is not None:
            return self.first
        if self.parts == 0:
            return empty_columns()
        n = self.n

        def joined(attribute: str, names: tuple[str, ...]) -> dict[str, np.ndarray]:
            return {name: self.arrays[attribute, name][:n] for name in names}

        return CallColumns(n, {name: list(table) for name, table in self.tables.items()},
                           joined("codes", _CODED), joined("ints", _INTS), joined("int_none", _INTS),
                           joined("floats", _FLOATS), joined("float_none", _FLOATS),
                           self.arrays["location", "kind"][:n], self.arrays["location", "number"][:n],
                           list(self.kinds), dict(self.other), dict(self.group_ranks))

    @staticmethod
    def _columns_of(part: CallColumns) -> Iterator[tuple[tuple[str, str], np.ndarray]]:
        for name in _CODED:
            yield ("codes", name), part.codes[name]
        for attribute, names in (("ints", _INTS), ("int_none", _INTS), ("floats", _FLOATS),
                                 ("float_none", _FLOATS)):
            for name in names:
                yield (attribute, name), getattr(part, attribute)[name]
        yield ("location", "kind"), part.location_kind
        yield ("location", "number"), part.location_number

    def _allocate(self, like: CallColumns, capacity: int) -> None:
        self.arrays = {key: np.empty(capacity, dtype=values.dtype) for key, values in self._columns_of(like)}

    def _copy(self, part: CallColumns) -> None:
        lo, hi = self.n, self.n + part.n
        if hi > len(self.arrays["location", "number"]):
            self._grow(hi)
        for key, values in self._columns_of(part):
            attribute, name = key
            if attribute == "codes":
                values = _remapped(self.tables[name], part.tables[name], values)
            elif key == ("location", "kind"):
                values = _remapped(self.kinds, part.location_kinds, values)
            out = self.arrays[key]
            if values.dtype != out.dtype and np.result_type(out, values) != out.dtype:
                # An opCount past 63 bits in this part: the joined column becomes objects.
                out = self.arrays[key] = out.astype(np.result_type(out, values))
            out[lo:hi] = values
        self.other.update((i + lo, text) for i, text in part.location_other.items())
        self.group_ranks.update((i + lo, g) for i, g in part.group_ranks.items())
        self.n = hi
        if self.consume:
            _release(part)

    def _grow(self, needed: int) -> None:
        capacity = max(needed, int(len(self.arrays["location", "number"]) * 1.5))
        for key, values in self.arrays.items():
            grown = np.empty(capacity, dtype=values.dtype)
            grown[:self.n] = values[:self.n]
            self.arrays[key] = grown


def _remapped(table: dict, values: list, part_codes: np.ndarray) -> np.ndarray:
    """A part's codes into `table` (its distinct values so far, first seen first; the
    part's new ones added); a negative code (a location in no "<words> <number>" form)
    stays -1."""
    remap = np.array([table.setdefault(v, len(table)) for v in values] + [-1], dtype=np.int32)
    return remap[part_codes]


def empty_columns() -> CallColumns:
    """The columns of no call."""
    return to_columns([])
