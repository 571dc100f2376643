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
    and each of their arrays is released as soon as it is copied into the joined one,
    so that joining needs the memory of the result and of one column, not twice the
    result's (19 M records take about 2.5 GB as columns)."""
    if len(parts) == 1:
        return parts[0]
    n = sum(p.n for p in parts)
    tables: dict[str, list] = {}
    codes: dict[str, np.ndarray] = {}
    for name in _CODED:
        tables[name], codes[name] = _merged_codes([(p.tables[name], p.codes[name]) for p in parts])
        if consume:
            for p in parts:
                del p.codes[name]
    kinds, kind_codes = _merged_codes([(p.location_kinds, p.location_kind) for p in parts])
    other: dict[int, str] = {}
    group_ranks: dict[int, tuple[int, ...]] = {}
    offset = 0
    for p in parts:
        other.update((i + offset, text) for i, text in p.location_other.items())
        group_ranks.update((i + offset, g) for i, g in p.group_ranks.items())
        offset += p.n

    def joined(names: tuple[str, ...], of: str) -> dict[str, np.ndarray]:
        out = {}
        for name in names:
            out[name] = np.concatenate([getattr(p, of)[name] for p in parts])
            if consume:
                for p in parts:
                    del getattr(p, of)[name]
        return out

    ints, int_none = joined(_INTS, "ints"), joined(_INTS, "int_none")
    floats, float_none = joined(_FLOATS, "floats"), joined(_FLOATS, "float_none")
    numbers = np.concatenate([p.location_number for p in parts]) if parts else np.zeros(0, np.int64)
    return CallColumns(n, tables, codes, ints, int_none, floats, float_none, kind_codes, numbers,
                       kinds, other, group_ranks)


def _merged_codes(parts: Sequence[tuple[list, np.ndarray]]) -> tuple[list, np.ndarray]:
    """One table of the distinct values of several (first seen first), and the codes into
    it; a negative code (a location in no "<words> <number>" form) stays -1."""
    table: dict = {}
    pieces = []
    for values, part_codes in parts:
        remap = np.array([table.setdefault(v, len(table)) for v in values] + [-1], dtype=np.int32)
        pieces.append(remap[part_codes])      # code -1 takes the -1 appended
    return list(table), np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


def empty_columns() -> CallColumns:
    """The columns of no call."""
    return to_columns([])
