"""Re-verification of a schedule that a pass only regrouped, on arrays.

The pass manager verifies the schedule again after every pass that changes it. A
lowering pass such as `msccl-merge` changes how the work is grouped into ops (ops of
one step over consecutive slots joined into one, large ops split) but not the work:
at 1,024 ranks, verifying its 2 million merged ops again symbolically costs about as
much as the first verification (tens of seconds). `same_work` decides instead, with a
few numpy sorts, that the new schedule does exactly the verified one's work:

- the same slot accesses: every op expanded into its one-slot units (step, kind,
  route, source slot, destination slot), the two lists equal as multisets;
- at least the same order: where a verified op a depends on op b, the op that now does
  a's work depends on the op that now does b's (each old op's work in one new op);
- well formed: unique ids, counts of at least one, every dependency listed earlier and
  at an earlier step; the same collective and scratch.

Why that is enough: the verified schedule has no races, so every two accesses of one
slot where one writes are ordered by its dependencies; those orders survive, so the new
schedule runs every slot's accesses in the same order (two units in one new op were of
one step, where nothing conflicts), reads the same values, and ends in the same state.
Its own unit accesses inherit the old ones' range, route and writability checks.

Anything else (a unit more or less, a dependency lost, a step changed, an op split over
several new ops) makes `same_work` return False, and the caller verifies in full: a
wrong rewrite is reported by the verifier's own message, never waved through.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, is_, itemgetter

import numpy as np

from collc.ir.schedule import Buffer, Op, OpKind, Schedule
from collc.ir.topology import Topology

# id(schedule) -> (a weak reference to it, the topology it was verified on): schedules
# that `verify` accepted with its race check. Weak: a registry must not keep millions
# of ops alive.
_VERIFIED: dict[int, tuple[weakref.ref, Topology | None]] = {}


def mark_verified(schedule: Schedule, topology: Topology | None) -> None:
    key = id(schedule)
    _VERIFIED[key] = (weakref.ref(schedule, lambda _ref, key=key: _VERIFIED.pop(key, None)), topology)


def is_verified(schedule: Schedule, topology: Topology | None) -> bool:
    """Whether `verify(schedule, topology)` (races checked) accepted this very object."""
    hit = _VERIFIED.get(id(schedule))
    return hit is not None and hit[0]() is schedule and hit[1] is topology


def verify_rewritten(before: Schedule | None, after: Schedule, topology: Topology) -> None:
    """Raise ScheduleError unless `after` verifies on `topology`; cheap when `before` was
    verified there and `after` does the same work (see the module docstring)."""
    from collc.verify import verify

    if before is not None and is_verified(before, topology) and same_work(before, after):
        mark_verified(after, topology)
        return
    verify(after, topology)


@dataclass(frozen=True)
class BuiltColumns:
    """A schedule's ops as columns, from the builder that made them (the stdlib rings'
    builders have them as arrays before they make the `Op`s): what `_Columns` would
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
_KNOWN_COLUMNS: dict[int, tuple[weakref.ref, "_Columns"]] = {}


def remember_columns(schedule: Schedule, columns: "BuiltColumns | _Columns") -> None:
    """Record `schedule`'s columns (they must be exactly its ops': a builder's own)."""
    if isinstance(columns, BuiltColumns):
        columns = _Columns.from_built(columns)
    key = id(schedule)
    _KNOWN_COLUMNS[key] = (weakref.ref(schedule, lambda _ref, key=key: _KNOWN_COLUMNS.pop(key, None)), columns)


def columns_of(schedule: Schedule, keep: bool = False) -> "_Columns":
    """The schedule's columns: the recorded ones, else read from its ops (and recorded
    if `keep`). Columns with routes are never recorded (their codes depend on a table)."""
    hit = _KNOWN_COLUMNS.get(id(schedule))
    if hit is not None and hit[0]() is schedule:
        return hit[1]
    routes: dict[tuple[str, ...], int] = {}
    columns = _Columns(schedule.ops, routes)
    if keep and not routes:
        remember_columns(schedule, columns)
    return columns


def forget_columns(schedule: Schedule) -> None:
    _KNOWN_COLUMNS.pop(id(schedule), None)


# Buffers and kinds by identity (their Enum hash is a Python-level call).
_BUFFER_CODE = {id(Buffer.INPUT): 0, id(Buffer.OUTPUT): 1, id(Buffer.SCRATCH): 2}
_KIND_CODE = {id(OpKind.COPY): 0, id(OpKind.REDUCE): 1}


class _Columns:
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
    def derived(cls, ops: tuple[Op, ...], base_ops: tuple[Op, ...], base: "_Columns",
                routes: dict[tuple[str, ...], int]) -> "_Columns":
        """`_Columns(ops, routes)` for ops of which many are `base_ops`' own objects (a
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
    def from_built(cls, built: BuiltColumns) -> "_Columns":
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


def _self_overlapping(c: _Columns) -> bool:
    """Some op of several slots reads slots it also writes (its own order would matter)."""
    same = (c.count > 1) & (c.src_rb == c.dst_rb)
    return bool((same & (c.src_idx < c.dst_idx + c.count) & (c.dst_idx < c.src_idx + c.count)).any())


def same_work(before: Schedule, after: Schedule) -> bool:
    """Whether `after` does exactly `before`'s slot accesses, at the same steps, with at
    least its ordering, and is well formed (see the module docstring)."""
    if after.collective is not before.collective and after.collective != before.collective:
        return False
    if after.scratch != before.scratch or after.topology != before.topology:
        return False
    old = columns_of(before)
    forget_columns(before)  # read once more here at most: the columns of millions of ops take hundreds of MB
    routes: dict[tuple[str, ...], int] = {}
    if bool((old.kind_route >= 2).any()):
        old = _Columns(before.ops, routes)  # route codes from one table for both schedules
        new = _Columns(after.ops, routes)
    elif old.ids_are_positions():
        new = _Columns.derived(after.ops, before.ops, old, routes)  # the ops a pass kept are not read again
    else:
        new = _Columns(after.ops, routes)
    if int(old.count.sum()) != int(new.count.sum()) or bool((new.count < 1).any()) or _self_overlapping(old):
        return False
    # Well formed: ids unique, dependencies listed earlier and at an earlier step.
    new_edges = new.edges()
    if new_edges is None:
        return False
    op_pos, dep_pos = new_edges
    if bool((dep_pos >= op_pos).any()) or bool((new.step[dep_pos] >= new.step[op_pos]).any()):
        return False
    # The same units: sorted the same way, the key columns are equal row by row.
    old_owner, old_keys = old.units()
    new_owner, new_keys = new.units()
    old_order, new_order = sort_order(old_keys), sort_order(new_keys)
    for a, b in zip(old_keys, new_keys):
        if not np.array_equal(a[old_order], b[new_order]):
            return False
    # Each old op's work is in one new op (else verify in full: a split op's pieces
    # would need a finer argument).
    new_of_unit = new_owner[new_order]
    old_of_unit = old_owner[old_order]
    new_of_old = np.full(old.n, -1, dtype=np.int64)
    new_of_old[old_of_unit] = new_of_unit
    if bool((new_of_old[old_of_unit] != new_of_unit).any()):
        return False
    # Every old dependency is a dependency of the ops that now do the work.
    old_edges = old.edges()
    if old_edges is None:
        return False
    o_op, o_dep = old_edges
    wanted = new_of_old[o_op] * new.n + new_of_old[o_dep]
    have = np.sort(op_pos * new.n + dep_pos)  # sorted and searched: np.isin hashes, slower here
    if len(wanted) == 0:
        return True
    if len(have) == 0:
        return False
    found = have[np.minimum(np.searchsorted(have, wanted), len(have) - 1)]
    return bool((found == wanted).all())
