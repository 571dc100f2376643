"""A schedule's ops as columns of numpy arrays, for the verifier's fast paths.

At 1,024 ranks a schedule has millions of ops, and a Python loop over them costs
seconds: `OpColumns` reads them once, with C-level maps, into one array per field (one
row per op), which the array verifier (`collc.verify.arrays`) and the re-verification of
a regrouped schedule (`collc.verify.regrouped`) sort and compare. A builder that has its
ops as arrays already (the stdlib rings) hands them over as `BuiltColumns`, remembered
with the schedule so that nothing reads the ops back.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, is_, itemgetter

import numpy as np

from collc.ir.schedule import Buffer, Op, OpKind, Schedule


@dataclass(frozen=True)
class BuiltColumns:
    """A schedule's ops as columns, from the builder that made them (the stdlib rings'
    builders have them as arrays before they make the `Op`s): what `OpColumns` would
    read back from the ops, one row per op; `deps` all ops' dependencies, in order."""

    ids: np.ndarray
    step: np.ndarray
    kind: np.ndarray  # 0 copy, 1 reduce
    src_rb: np.ndarray  # rank x 3 + buffer (0 input, 1 output, 2 scratch)
    src_idx: np.ndarray
    dst_rb: np.ndarray
    dst_idx: np.ndarray
    ndeps: np.ndarray
    deps: np.ndarray


# id(schedule) -> (a weak reference to it, its columns): columns known without reading
# the ops again (from a builder, or from a verification that read them).
_KNOWN_COLUMNS: dict[int, tuple[weakref.ref, "OpColumns"]] = {}


def remember_columns(schedule: Schedule, columns: "BuiltColumns | OpColumns") -> None:
    """Record `schedule`'s columns (they must be exactly its ops': a builder's own)."""
    if isinstance(columns, BuiltColumns):
        columns = OpColumns.from_built(columns)
    key = id(schedule)
    _KNOWN_COLUMNS[key] = (weakref.ref(schedule, lambda _ref, key=key: _KNOWN_COLUMNS.pop(key, None)), columns)


def columns_of(schedule: Schedule, keep: bool = False,
               routes: dict[tuple[str, ...], int] | None = None) -> "OpColumns":
    """The schedule's columns: the recorded ones, else read from its ops (and recorded
    if `keep`). Columns with routes are never recorded (their codes depend on a table):
    a caller that reads route codes passes `routes`, which gets each route's code
    (recorded columns have no routes, and leave it empty)."""
    hit = _KNOWN_COLUMNS.get(id(schedule))
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    routes = {} if routes is None else routes
    columns = OpColumns(schedule.ops, routes)
    if keep and not routes:
        remember_columns(schedule, columns)
    return columns


def forget_columns(schedule: Schedule) -> None:
    _KNOWN_COLUMNS.pop(id(schedule), None)


# Buffers and kinds by identity (their Enum hash is a Python-level call).
_BUFFER_CODE = {id(Buffer.INPUT): 0, id(Buffer.OUTPUT): 1, id(Buffer.SCRATCH): 2}
_KIND_CODE = {id(OpKind.COPY): 0, id(OpKind.REDUCE): 1}


class OpColumns:
    """A schedule's ops as arrays (one row per op), and its units (one row per slot).
    Columns are read with C-level maps (attrgetter, itemgetter, id): at 1,024 ranks a
    schedule has millions of ops, and a Python loop over them costs seconds."""

    def __init__(self, ops: tuple[Op, ...], routes: dict[tuple[str, ...], int]):
        n = len(ops)
        self.n = n

        def col(values) -> np.ndarray:
            return np.fromiter(values, dtype=np.int64, count=n)

        self.ids = col(map(attrgetter("id"), ops))
        self.step = col(map(attrgetter("step"), ops))
        self.count = col(map(attrgetter("count"), ops))
        kind = col(map(_KIND_CODE.__getitem__, map(id, map(attrgetter("kind"), ops))))
        route_list = list(map(attrgetter("route"), ops))
        if any(route_list):
            route = col(routes.setdefault(r, len(routes) + 1) if r else 0 for r in route_list)
            self.kind_route = route * 2 + kind
        else:
            self.kind_route = kind
        del route_list
        self.src_rb, self.src_idx = self._slots(list(map(attrgetter("src"), ops)))
        self.dst_rb, self.dst_idx = self._slots(list(map(attrgetter("dst"), ops)))
        self.ndeps = col(map(len, map(attrgetter("deps"), ops)))
        self.deps = np.fromiter(chain.from_iterable(map(attrgetter("deps"), ops)), dtype=np.int64,
                                count=int(self.ndeps.sum()))

    @classmethod
    def derived(cls, ops: tuple[Op, ...], base_ops: tuple[Op, ...], base: "OpColumns",
                routes: dict[tuple[str, ...], int]) -> "OpColumns":
        """`OpColumns(ops, routes)` for ops of which many are `base_ops`' own objects (a
        lowering pass keeps the ops it does not change): their rows are copied from
        `base` (whose ids are positions, with no routes), only the others are read."""
        n = len(ops)
        ids = np.fromiter(map(attrgetter("id"), ops), dtype=np.int64, count=n)
        kept = np.zeros(n, dtype=bool)
        inside = np.flatnonzero((ids >= 0) & (ids < len(base_ops)))
        kept[inside] = np.fromiter(map(is_, map(ops.__getitem__, inside.tolist()),
                                       map(base_ops.__getitem__, ids[inside].tolist())), dtype=bool, count=len(inside))
        rest = np.flatnonzero(~kept)
        read = cls(tuple(map(ops.__getitem__, rest.tolist())), routes)
        same = np.flatnonzero(kept)
        at = ids[same]
        out = cls.__new__(cls)
        out.n = n
        for name in ("ids", "step", "count", "kind_route", "src_rb", "src_idx", "dst_rb", "dst_idx", "ndeps"):
            column = np.empty(n, dtype=np.int64)
            column[same] = getattr(base, name)[at]
            column[rest] = getattr(read, name)
            setattr(out, name, column)
        # Dependencies: each op's run of `deps`, from wherever its row came.
        starts = np.cumsum(out.ndeps) - out.ndeps
        out.deps = np.empty(int(out.ndeps.sum()), dtype=np.int64)
        base_starts = np.cumsum(base.ndeps) - base.ndeps
        read_starts = np.cumsum(read.ndeps) - read.ndeps
        for rows, from_starts, from_deps in ((same, base_starts[at], base.deps),
                                             (rest, read_starts, read.deps)):
            counts = out.ndeps[rows]
            total = int(counts.sum())
            if not total:
                continue
            within = np.arange(total) - np.repeat(np.cumsum(counts) - counts, counts)
            out.deps[np.repeat(starts[rows], counts) + within] = from_deps[np.repeat(from_starts, counts) + within]
        return out

    @classmethod
    def from_built(cls, built: BuiltColumns) -> "OpColumns":
        out = cls.__new__(cls)
        out.n = len(built.ids)
        out.ids, out.step, out.kind_route = built.ids, built.step, built.kind
        out.count = np.ones(out.n, dtype=np.int64)
        out.src_rb, out.src_idx, out.dst_rb, out.dst_idx = built.src_rb, built.src_idx, built.dst_rb, built.dst_idx
        out.ndeps, out.deps = built.ndeps, built.deps
        return out

    def _slots(self, locs: list) -> tuple[np.ndarray, np.ndarray]:
        """(rank x 3 + buffer, index) of each slot."""
        n = self.n
        rank = np.fromiter(map(itemgetter(0), locs), dtype=np.int64, count=n)
        buffer = np.fromiter(map(_BUFFER_CODE.__getitem__, map(id, map(itemgetter(1), locs))), dtype=np.int64,
                             count=n)
        index = np.fromiter(map(itemgetter(2), locs), dtype=np.int64, count=n)
        return rank * 3 + buffer, index

    def units(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """(op position of each unit, the unit key columns)."""
        if bool((self.count == 1).all()):
            owner = np.arange(self.n)
            offset = np.zeros(self.n, dtype=np.int64)
        else:
            owner = np.repeat(np.arange(self.n), self.count)
            starts = np.cumsum(self.count) - self.count
            offset = np.arange(len(owner)) - np.repeat(starts, self.count)
        keys = [self.step[owner], self.kind_route[owner], self.src_rb[owner], self.src_idx[owner] + offset,
                self.dst_rb[owner], self.dst_idx[owner] + offset]
        return owner, keys

    def positions_of(self, ids: np.ndarray) -> np.ndarray | None:
        """The list position of each op id in `ids`; None if an id is no op's (or ids repeat)."""
        if self.ids_are_positions():
            if len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= self.n):
                return None
            return ids
        order = np.argsort(self.ids, kind="stable")
        sorted_ids = self.ids[order]
        if bool((sorted_ids[1:] == sorted_ids[:-1]).any()):
            return None
        if len(ids) == 0:
            return np.zeros(0, dtype=np.int64)
        if self.n == 0:
            return None
        where = np.minimum(np.searchsorted(sorted_ids, ids), self.n - 1)
        if not bool((sorted_ids[where] == ids).all()):
            return None
        return order[where]

    def ids_are_positions(self) -> bool:
        """Whether op i has id i (every built or synthesized schedule): ids are then
        their own positions, with no search."""
        found = getattr(self, "_ids_are_positions", None)
        if found is None:
            found = self._ids_are_positions = bool(np.array_equal(self.ids, np.arange(self.n)))
        return found

    def edges(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(op position, dependency position) for every dependency; None if one names no op."""
        dep_pos = self.positions_of(self.deps)
        if dep_pos is None:
            return None
        return np.repeat(np.arange(self.n), self.ndeps), dep_pos


def sort_order(keys: list[np.ndarray]) -> np.ndarray:
    """`np.lexsort(keys[::-1])` (the first key major): the rows' order by the keys. Where
    the keys fit in 63 bits together (non-negative, as every column here is) they are
    packed into one int64 and sorted by numpy's radix sort, several times faster than
    a lexsort of millions of rows; ties keep their order in both."""
    if len(keys[0]) == 0:
        return np.zeros(0, dtype=np.int64)
    bits = []
    for k in keys:
        if int(k.min()) < 0:
            return np.lexsort(keys[::-1])
        bits.append(max(1, int(k.max()).bit_length()))
    if sum(bits) > 63:
        return np.lexsort(keys[::-1])
    code = np.zeros(len(keys[0]), dtype=np.int64)
    for k, b in zip(keys, bits):
        code <<= b
        code |= k
    return np.argsort(code, kind="stable")
