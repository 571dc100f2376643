"""The schedule IR: chunk-level copies and reductions, with their order.

A schedule is a list of `Op`s in a topological order of their dependencies. Each op
moves `count` consecutive slots from `src` to `dst` (possibly on another rank, through
the topology) and either overwrites the destination (copy) or adds into it (reduce).
`deps` are ops that must finish first; `step` is the op's logical time (an epoch for a
synthesized schedule, a program-order level for a hand-written one) and is what the
simulator and the backends order by when several ops are ready.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import chain, repeat
from operator import attrgetter, itemgetter, ne as _ne
from enum import Enum
from typing import Any, NamedTuple

from collc.diagnostics import Span
from collc.ir.collective import Collective


class Buffer(str, Enum):
    """A rank's buffers; the values are MSCCL XML's buffer tokens."""

    INPUT = "i"
    OUTPUT = "o"
    SCRATCH = "s"

    @property
    def label(self) -> str:
        return {"i": "input", "o": "output", "s": "scratch"}[self.value]


class Loc(NamedTuple):
    """One slot (chunk-sized) of one rank's buffer."""

    rank: int
    buffer: Buffer
    index: int

    def __str__(self) -> str:
        return f"rank {self.rank} {self.buffer.label}[{self.index}]"

    def shifted(self, k: int) -> "Loc":
        return Loc(self.rank, self.buffer, self.index + k)


class OpKind(str, Enum):
    COPY = "copy"  # dst = src
    REDUCE = "reduce"  # dst = dst + src


@dataclass(frozen=True, slots=True)
class Op:
    """One copy or reduction. Slotted: a ring AllReduce on 1,024 ranks has 3.1 million
    of them, and a per-instance __dict__ would double their memory."""

    id: int
    kind: OpKind
    src: Loc
    dst: Loc
    count: int = 1
    deps: tuple[int, ...] = ()
    step: int = 0
    # Nodes from the source GPU to the destination GPU, both included. Empty: a local
    # op, or a transfer whose path the simulator chooses (fewest hops, widest).
    route: tuple[str, ...] = ()
    origin: Span | None = field(default=None, compare=False)

    @classmethod
    def make(cls, id: int, kind: OpKind, src: Loc, dst: Loc, count: int, deps: tuple[int, ...], step: int,
             route: tuple[str, ...], origin: Span | None) -> "Op":
        """`Op(...)` with every field given, at half the cost (the frozen dataclass's
        __init__ sets each field through object.__setattr__); for builders that make
        millions of ops. No check is skipped: the constructor has none."""
        op = _new_object(cls)
        _SET_ID(op, id), _SET_KIND(op, kind), _SET_SRC(op, src), _SET_DST(op, dst), _SET_COUNT(op, count)
        _SET_DEPS(op, deps), _SET_STEP(op, step), _SET_ROUTE(op, route), _SET_ORIGIN(op, origin)
        return op

    @property
    def is_transfer(self) -> bool:
        return self.src.rank != self.dst.rank

    def slots(self):
        """(src, dst) slot pairs this op touches."""
        return [(self.src.shifted(k), self.dst.shifted(k)) for k in range(self.count)]

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "id": self.id, "kind": self.kind.value,
            "src": [self.src.rank, self.src.buffer.value, self.src.index],
            "dst": [self.dst.rank, self.dst.buffer.value, self.dst.index],
            "count": self.count, "deps": list(self.deps), "step": self.step,
        }
        if self.route:
            d["route"] = list(self.route)
        if self.origin is not None:
            d["origin"] = self.origin.to_json()
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Op":
        s, t = d["src"], d["dst"]
        return cls(
            id=int(d["id"]), kind=OpKind(d["kind"]),
            src=Loc(int(s[0]), Buffer(s[1]), int(s[2])), dst=Loc(int(t[0]), Buffer(t[1]), int(t[2])),
            count=int(d.get("count", 1)), deps=tuple(int(x) for x in d.get("deps", ())),
            step=int(d.get("step", 0)), route=tuple(d.get("route", ())),
            origin=Span.from_json(d.get("origin")),
        )


def ops_json_text(ops: Sequence[Op], level: int) -> bytes | None:
    """`[op.to_json() for op in ops]`'s elements as json.dumps(indent=1) writes them
    nested `level` deep (see `collc.jsontext.list_items_text`), made by one format per
    op: no dicts, no encoder (a dgx1 AllGather has 32,768 ops; to_json and orjson
    with the indentation rewritten took three times as long). None when some op has
    a field of another type than the IR's (an int subclass, a number from numpy, an
    origin): the caller then writes it from `to_json`."""
    if not ops or not _plain_fields(ops):
        return None
    i1 = "\n" + " " * (level + 1)
    i2 = i1 + " "
    sep, close = "," + i2, i1 + "]"
    kind_text = {id(kind): f',{i1}"kind": "{kind.value}",{i1}"src": [{i2}' for kind in OpKind}
    buffer_text = {id(buffer): f',{i2}"{buffer.value}",{i2}' for buffer in Buffer}
    head, between = " " * level + "{" + i1 + '"id": ', f'{i1}],{i1}"dst": [{i2}'
    count_head, deps_head, step_head = f'{i1}],{i1}"count": ', f',{i1}"deps": ', f',{i1}"step": '
    end = "\n" + " " * level + "}"
    route_text: dict[tuple[str, ...], str] = {(): ""}
    for route in set(map(_ROUTE_OF, ops)):
        if route:
            route_text[route] = f',{i1}"route": [{i2}{sep.join(map(json.dumps, route))}{close}'
    out = []
    for op in ops:
        src, dst, deps = op.src, op.dst, op.deps
        deps_text = f"[{i2}{sep.join(map(str, deps))}{close}" if deps else "[]"
        out.append(f"{head}{op.id}{kind_text[id(op.kind)]}{src[0]}{buffer_text[id(src[1])]}{src[2]}{between}"
                   f"{dst[0]}{buffer_text[id(dst[1])]}{dst[2]}{count_head}{op.count}{deps_head}{deps_text}"
                   f"{step_head}{op.step}{route_text[op.route]}{end}")
    return ",\n".join(out).encode()


def _plain_fields(ops: Sequence[Op]) -> bool:
    """Every field of every op of exactly the IR's type (checked by C-level maps), so
    that `str` writes each number as json.dumps does."""
    srcs, dsts = list(map(_SRC_OF, ops)), list(map(_DST_OF, ops))
    ints = chain(map(_ID_OF, ops), map(_COUNT_OF, ops), map(_STEP_OF, ops), chain.from_iterable(map(_DEPS_OF, ops)),
                 map(itemgetter(0), srcs), map(itemgetter(2), srcs), map(itemgetter(0), dsts), map(itemgetter(2), dsts))
    return (set(map(type, ints)) <= {int} and set(map(type, map(_KIND_OF, ops))) <= {OpKind}
            and set(map(type, chain(srcs, dsts))) <= {Loc}
            and set(map(type, chain(map(itemgetter(1), srcs), map(itemgetter(1), dsts)))) <= {Buffer}
            and set(map(type, map(_DEPS_OF, ops))) <= {tuple} and set(map(type, map(_ROUTE_OF, ops))) <= {tuple}
            and set(map(type, chain.from_iterable(map(_ROUTE_OF, ops)))) <= {str}
            and set(map(_ORIGIN_OF, ops)) <= {None})


def make_ops(n: int, *fields: Iterable[Any]) -> list[Op]:
    """`n` ops from one iterable per field (in `Op`'s field order), each field set for
    all ops by one C-level map: no Python call per op (a ring AllReduce on 1,024 ranks
    makes 3.1 million). Equal to `[Op.make(*row) for row in zip(*fields)]`."""
    ops = list(map(_new_object, repeat(Op, n)))
    drain = deque(maxlen=0).extend
    for setter, values in zip(_SETTERS, fields, strict=True):
        drain(map(setter, ops, values))
    return ops


_STEP_OF, _SRC_RANK_OF, _DST_RANK_OF = attrgetter("step"), attrgetter("src.rank"), attrgetter("dst.rank")


@dataclass(frozen=True)
class OpFields:
    """Ops as one list per field, in `Op`'s field order (Python values, not the
    verifier's numpy columns), for builders that pass ops from one stage to the next
    without needing them as objects: the list scheduler
    (collc.synthesis.timing) reads a few fields of every op the extractor made, then
    makes the final ops in another order with other ids, deps and steps; making the
    32,768 intermediate `Op`s of the README's main job cost about 0.07 CPU s."""

    id: list[int]
    kind: list[OpKind]
    src: list[Loc]
    dst: list[Loc]
    count: list[int]
    deps: list[tuple[int, ...]]
    step: list[int]
    route: list[tuple[str, ...]]
    origin: list[Span | None]

    def __len__(self) -> int:
        return len(self.id)

    @classmethod
    def of(cls, ops: Sequence[Op]) -> "OpFields":
        """The fields of `ops` (C-level maps)."""
        return cls(*(list(map(getter, ops)) for getter in
                     (_ID_OF, _KIND_OF, _SRC_OF, _DST_OF, _COUNT_OF, _DEPS_OF, _STEP_OF, _ROUTE_OF, _ORIGIN_OF)))

    def ops(self) -> list[Op]:
        """The ops, in list order (`make_ops`)."""
        return make_ops(len(self.id), self.id, self.kind, self.src, self.dst, self.count, self.deps, self.step,
                        self.route, self.origin)

    def placed(self, order: Sequence[int]) -> "OpFields":
        """The fields of the ops at `order`'s positions, in that order."""
        pick = picker(order)
        return OpFields(*(pick(values) for values in (self.id, self.kind, self.src, self.dst, self.count, self.deps,
                                                       self.step, self.route, self.origin)))


def picker(order: Sequence[int]) -> Callable[[Sequence[Any]], list[Any]]:
    """A function giving the items of a list at `order`'s positions, in that order: one
    `itemgetter` call per list, its loop in C (a third of `map(list.__getitem__, order)`'s
    time)."""
    if len(order) < 2:  # itemgetter of one position gives the item, not a tuple
        return lambda values: [values[i] for i in order]
    get = itemgetter(*order)
    return lambda values: list(get(values))


_ID_OF, _KIND_OF, _SRC_OF, _DST_OF, _COUNT_OF, _DEPS_OF, _ROUTE_OF, _ORIGIN_OF = map(
    attrgetter, ("id", "kind", "src", "dst", "count", "deps", "route", "origin"))
_new_object = object.__new__
(_SET_ID, _SET_KIND, _SET_SRC, _SET_DST, _SET_COUNT, _SET_DEPS, _SET_STEP, _SET_ROUTE, _SET_ORIGIN) = (
    Op.__dict__[name].__set__ for name in Op.__slots__)
_SETTERS = (_SET_ID, _SET_KIND, _SET_SRC, _SET_DST, _SET_COUNT, _SET_DEPS, _SET_STEP, _SET_ROUTE, _SET_ORIGIN)
assert Op.__slots__ == ("id", "kind", "src", "dst", "count", "deps", "step", "route", "origin")


@dataclass(frozen=True)
class Schedule:
    """Ops that turn the collective's precondition into its postcondition on a topology."""

    name: str
    collective: Collective
    topology: str  # the topology's name; the Topology itself travels beside the schedule
    ops: tuple[Op, ...]
    scratch: tuple[int, ...] = ()  # scratch slots per rank (empty: none)
    # What produced it: solver status, epochs, ... (free-form, JSON-serializable).
    meta: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def scratch_slots(self, rank: int) -> int:
        return self.scratch[rank] if rank < len(self.scratch) else 0

    def with_meta(self, **kv: Any) -> "Schedule":
        return replace(self, meta={**self.meta, **kv})

    @property
    def num_steps(self) -> int:
        # A C-level map rather than a generator: schedules have millions of ops.
        return 1 + max(map(_STEP_OF, self.ops), default=-1)

    @property
    def num_transfers(self) -> int:
        """Ops that move data between two GPUs."""
        return sum(map(_ne, map(_SRC_RANK_OF, self.ops), map(_DST_RANK_OF, self.ops)))

    def to_json(self) -> dict[str, Any]:
        return {**self.header_json(), "ops": [op.to_json() for op in self.ops]}

    def header_json(self) -> dict[str, Any]:
        """`to_json()` but its ops, in the same order (a writer adds them as it likes)."""
        return {
            "name": self.name,
            "topology": self.topology,
            "collective": self.collective.to_json(),
            "scratch": list(self.scratch),
            "meta": self.meta,
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "Schedule":
        return cls(
            name=d["name"], topology=d["topology"], collective=Collective.from_json(d["collective"]),
            ops=tuple(Op.from_json(o) for o in d["ops"]), scratch=tuple(d.get("scratch", ())),
            meta=dict(d.get("meta", {})),
        )


def rank_peers(schedule: Schedule) -> tuple[dict[int, set[int]], dict[int, set[int]]]:
    """Per rank, the ranks it sends to and the ranks it receives from (copies within a
    rank left out): what a runtime with a connection or threadblock per peer sizes."""
    sends: dict[int, set[int]] = {}
    recvs: dict[int, set[int]] = {}
    for op in schedule.ops:
        a, b = op.src.rank, op.dst.rank
        if a != b:
            sends.setdefault(a, set()).add(b)
            recvs.setdefault(b, set()).add(a)
    return sends, recvs
