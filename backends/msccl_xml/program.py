"""The lowered program: a schedule on its way to MSCCL XML.

`msccl-threadblocks` turns every op of a schedule into *halves*: a transfer op becomes a
send on its source rank and a receive on its destination rank, a local op one local
half. Halves are placed in threadblocks (one send peer, one receive peer, one channel
each); `msccl-fuse` merges a receive with the send that forwards its data into one step;
`msccl-deps` orders and numbers the steps and turns the data dependencies between
threadblocks into `depid`/`deps` (with `nop` steps where a step waits on more than one
threadblock); `msccl-assemble` writes the result as an `XmlAlgo`.

Every half has a *key* that fixes its place in time: (schedule step, phase, then a
tiebreak: forwarded or fresh, what it forwards, position of its op in the schedule,
piece, instance). Within one schedule step the sends
of a rank come before its receives (phase 0 and 1); the rest of the key is the same at
both ends of a transfer, so
ordering every threadblock by key keeps each connection's messages in the same order at
the sender and the receiver and never waits on something later (the argument is in
`dependencies.py`).
"""

from __future__ import annotations

import gc
import itertools
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from functools import lru_cache, wraps
from typing import Callable, NamedTuple, TypeVar

import numpy as np

from collc.backends.msccl_xml.model import BufferName, StepType
from collc.diagnostics import CollcError
from collc.ir.collective import Collective, CollectiveKind, standard
from collc.ir.schedule import Buffer

T = TypeVar("T")


class HalfKind(str, Enum):
    SEND = "send"
    RECV = "recv"
    RECV_REDUCE = "recv-reduce"  # receive and add into the destination
    COPY = "copy"  # local
    REDUCE = "reduce"  # local: dst += src

    @property
    def receives(self) -> bool:
        return self is HalfKind.RECV or self is HalfKind.RECV_REDUCE  # asked per half: no tuple test

    @property
    def step_type(self) -> StepType:
        return _STEP_OF_HALF[self]


_STEP_OF_HALF = {
    HalfKind.SEND: StepType.SEND,
    HalfKind.RECV: StepType.RECV,
    HalfKind.RECV_REDUCE: StepType.RECV_REDUCE_COPY,
    HalfKind.COPY: StepType.COPY,
    HalfKind.REDUCE: StepType.REDUCE,
}

# Phases of a schedule step: a rank's sends, then its receives, then its local ops.
PHASE_SEND, PHASE_RECV, PHASE_LOCAL = 0, 1, 2


class Slot(NamedTuple):
    """The first of `count` consecutive chunk slots of one buffer (on some rank)."""

    buffer: BufferName
    index: int


class HalfKey(NamedTuple):
    step: int
    phase: int
    # Within a schedule step a connection carries forwarded chunks first (fresh 0), in the
    # order their sender received them (origin: the rank of that message among all
    # messages), then chunks that were already there (fresh 1, origin -1). Forwards thus
    # leave in the order they arrived, so each can fuse with its receive (see fuse.py).
    # Local ops: 0, -1.
    fresh: int
    origin: int
    position: int  # of the op in the schedule
    piece: int  # which slot of a split op
    instance: int

    @property
    def message(self) -> tuple[int, int, int, int, int, int]:
        """The key both ends of a transfer share."""
        return (self.step, self.fresh, self.origin, self.position, self.piece, self.instance)


class Half(NamedTuple):
    """One end of an op on one rank. A tuple (one per op end, a million at 1,024 GPUs):
    built in one call, no per-object dict. Its channel is its threadblock's."""

    id: int
    kind: HalfKind
    rank: int
    peer: int  # the other rank of a transfer; -1 for a local op
    src: Slot  # on `peer` for a receive
    dst: Slot  # on `peer` for a send
    count: int
    key: HalfKey
    op: int  # id of the schedule op it comes from
    instance: int = 0

    @property
    def is_local(self) -> bool:
        return self.peer < 0

    def reads(self) -> list[Slot]:
        """Slots of its own rank this half reads."""
        if self.kind is HalfKind.SEND or self.kind is HalfKind.COPY:
            return _range(self.src, self.count)
        if self.kind is HalfKind.REDUCE:
            return _range(self.src, self.count) + _range(self.dst, self.count)
        if self.kind is HalfKind.RECV_REDUCE:
            return _range(self.dst, self.count)
        return []

    def writes(self) -> list[Slot]:
        if self.kind is HalfKind.SEND:
            return []
        return _range(self.dst, self.count)


# Kind codes of the half columns (`HalfTable.kind`), in this order.
HALF_KINDS = (HalfKind.SEND, HalfKind.RECV, HalfKind.RECV_REDUCE, HalfKind.COPY, HalfKind.REDUCE)
_BUFFER_NAMES = (BufferName.INPUT, BufferName.OUTPUT, BufferName.SCRATCH)
_PHASE_OF_KIND = (PHASE_SEND, PHASE_RECV, PHASE_RECV, PHASE_LOCAL, PHASE_LOCAL)


class HalfTable(Sequence):
    """The halves of a program as columns, one integer array per field (kinds as
    indices into HALF_KINDS, buffers as 0 input, 1 output, 2 scratch); a `Half` is
    built when one is asked for. A million halves at 1,024 GPUs: as objects they took
    gigabytes and seconds, and the stages that touch every half read the columns."""

    COLUMNS = ("kind", "rank", "peer", "src_buffer", "src_index", "dst_buffer", "dst_index", "count", "step",
               "fresh", "origin", "position", "piece", "instance", "op")
    __slots__ = COLUMNS

    def __init__(self, **columns: np.ndarray):
        for name in self.COLUMNS:
            setattr(self, name, np.ascontiguousarray(columns[name], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.kind)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"half {index} of {len(self)}")
        return self._row(index, *(getattr(self, name).item(index) for name in self.COLUMNS))

    def __iter__(self):
        return itertools.starmap(self._row, zip(itertools.count(), *(getattr(self, name).tolist()
                                                                     for name in self.COLUMNS)))

    @staticmethod
    def _row(h: int, kind: int, rank: int, peer: int, sb: int, si: int, db: int, di: int, count: int, step: int,
             fresh: int, origin: int, pos: int, piece: int, inst: int, op: int) -> Half:
        new = tuple.__new__
        return new(Half, (h, HALF_KINDS[kind], rank, peer, new(Slot, (_BUFFER_NAMES[sb], si)),
                          new(Slot, (_BUFFER_NAMES[db], di)), count,
                          new(HalfKey, (step, _PHASE_OF_KIND[kind], fresh, origin, pos, piece, inst)), op, inst))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HalfTable):
            return all(np.array_equal(getattr(self, n), getattr(other, n)) for n in self.COLUMNS)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class PerHalf(Sequence):
    """A tuple of ints per half, kept as two arrays (the values of all halves in order,
    and where each half's start): `per_half[h]` is the tuple, built when asked for.
    The predecessors of every half as tuples were four million small tuples at 1,024
    GPUs (about 370 MiB); the stages that read all of them use the arrays."""

    __slots__ = ("bounds", "values")

    def __init__(self, owner: np.ndarray, values: np.ndarray, n: int):
        """`owner`: the half of each value, sorted; `values` in that order."""
        self.bounds = np.searchsorted(owner, np.arange(n + 1, dtype=np.int64))
        self.values = np.asarray(values, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self[i] for i in range(*index.indices(len(self))))
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"half {index} of {len(self)}")
        return tuple(self.values[self.bounds.item(index):self.bounds.item(index + 1)].tolist())

    def __iter__(self):
        values, bounds = self.values.tolist(), self.bounds.tolist()
        return (tuple(values[a:b]) for a, b in zip(bounds, bounds[1:]))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PerHalf):
            return np.array_equal(self.bounds, other.bounds) and np.array_equal(self.values, other.values)
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


class IntPairs(Sequence):
    """(a, b) pairs kept as two arrays; `pairs[k]` is the tuple, built when asked for
    (fusion candidates: two million pairs at 1,024 GPUs, read whole as arrays)."""

    __slots__ = ("first", "second")

    def __init__(self, first: np.ndarray, second: np.ndarray):
        self.first = np.asarray(first, dtype=np.int64)
        self.second = np.asarray(second, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.first)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(zip(self.first[index].tolist(), self.second[index].tolist()))
        return (self.first.item(index), self.second.item(index))

    def __iter__(self):
        return zip(self.first.tolist(), self.second.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, IntPairs):
            return np.array_equal(self.first, other.first) and np.array_equal(self.second, other.second)
        if isinstance(other, Sequence):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def _range(slot: Slot, count: int) -> list[Slot]:
    if count == 1:  # most halves: no new Slot
        return [slot]
    return [Slot(slot.buffer, slot.index + k) for k in range(count)]


class LStep(NamedTuple):
    """A step of a threadblock: one half, a receive fused with a send (receive first),
    or a `nop` (no halves) that only waits. A tuple: one per step, built in one call."""

    type: StepType
    halves: tuple[int, ...]
    # Set by msccl-deps: the (threadblock id, step s) this step waits for, and whether
    # another threadblock waits for this step.
    wait: tuple[int, int] | None = None
    hasdep: bool = False


_new_tuple = tuple.__new__


def make_step(type: StepType, halves: tuple[int, ...], wait: tuple[int, int] | None = None,
              hasdep: bool = False) -> LStep:
    """`LStep(type, halves, wait, hasdep)` without the NamedTuple's Python-level __new__."""
    return _new_tuple(LStep, (type, halves, wait, hasdep))


@dataclass(frozen=True, slots=True)
class LThreadblock:
    id: int
    send: int
    recv: int
    chan: int
    steps: tuple[LStep, ...]


@dataclass(frozen=True)
class LGpu:
    rank: int
    i_chunks: int
    o_chunks: int
    s_chunks: int
    tbs: tuple[LThreadblock, ...]


class Stage(str, Enum):
    ASSIGNED = "assigned"  # threadblocks and channels chosen, one half per step
    FUSED = "fused"
    ORDERED = "ordered"  # steps numbered, dependencies and nops in place


@dataclass(frozen=True)
class Program:
    name: str
    collective: Collective
    coll: str  # the executor's token
    ngpus: int
    nchunksperloop: int
    inplace: bool
    instances: int
    halves: Sequence[Half]  # a HalfTable where msccl-threadblocks made them
    # Per half: halves of the same rank that must finish before it (conflicting accesses
    # to a slot, in schedule order). A PerHalf where msccl-threadblocks made them.
    preds: Sequence[tuple[int, ...]]
    # Receive-reduce half -> the only half that reads the sum it stores, where nothing
    # else ever needs that sum (so the pair can become `rrs`, which does not store it):
    # (receive, reader) pairs by receive, an IntPairs where msccl-threadblocks found them.
    sole_readers: Sequence[tuple[int, int]]
    gpus: tuple[LGpu, ...]
    stage: Stage = Stage.ASSIGNED
    # (receive, send) fusion candidates (`channels.fusion_candidates`) where known, so
    # that msccl-fuse need not find them again (IntPairs where msccl-threadblocks found
    # them); None: not given.
    candidates: Sequence[tuple[int, int]] | None = None
    # Per half: the rank of its key among all keys (`halves.key_places`), so that stages
    # compare integers rather than keys; None: not given (computed on first use, from
    # `place_array` where given: msccl-threadblocks gives only the array, the stages that
    # read every place read that).
    places: tuple[int, ...] | None = None

    # The same as arrays where msccl-threadblocks has them: places, candidates (receives,
    # sends) and predecessor pairs (half, predecessor); None: derived on first use.
    # (Caches of `places`, `candidates` and `preds`: not compared, not shown.)
    place_array: np.ndarray | None = field(default=None, compare=False, repr=False)
    candidate_arrays: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)
    pred_pairs: tuple[np.ndarray, np.ndarray] | None = field(default=None, compare=False, repr=False)

    def key_places(self) -> tuple[int, ...]:
        if self.places is None:
            # A cache of what the halves fix.
            places = tuple(self.place_array.tolist()) if self.place_array is not None else key_places(self.halves)
            object.__setattr__(self, "places", places)
        return self.places

    def places_array(self) -> np.ndarray:
        if self.place_array is None:
            object.__setattr__(self, "place_array", np.asarray(self.key_places(), dtype=np.int64))
        return self.place_array

    def candidate_pairs(self, candidates: Sequence[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        """The candidates as (receives, sends) arrays."""
        if self.candidate_arrays is not None:
            return self.candidate_arrays
        if isinstance(candidates, IntPairs):
            return candidates.first, candidates.second
        table = np.array(candidates, dtype=np.int64).reshape(len(candidates), 2)
        return table[:, 0].copy(), table[:, 1].copy()

    def predecessor_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        """(half, predecessor) of every entry of `preds`, by half."""
        if self.pred_pairs is None and isinstance(self.preds, PerHalf):
            counts = np.diff(self.preds.bounds)
            half = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
            object.__setattr__(self, "pred_pairs", (half, self.preds.values))
        if self.pred_pairs is None:
            counts = np.fromiter(map(len, self.preds), np.int64, len(self.preds))
            pred = np.fromiter(itertools.chain.from_iterable(self.preds), np.int64, int(counts.sum()))
            half = np.repeat(np.arange(len(self.preds), dtype=np.int64), counts)
            object.__setattr__(self, "pred_pairs", (half, pred))
        return self.pred_pairs

    @property
    def nchannels(self) -> int:
        return 1 + max((tb.chan for g in self.gpus for tb in g.tbs), default=0)


def key_places(halves: tuple[Half, ...]) -> tuple[int, ...]:
    """Per half, the rank of its key among all the halves' keys (keys are distinct: the
    two halves of a transfer differ in phase). The later stages compare these integers
    instead of the keys (a tuple comparison runs per field)."""
    order = sorted(range(len(halves)), key=[h.key for h in halves].__getitem__)
    places = [0] * len(halves)
    for place, h in enumerate(order):
        places[h] = place
    return tuple(places)


def remember_last(fn: Callable[[Program], Program]) -> Callable[[Program], Program]:
    """Keep the result of the last call, keyed by the argument's identity, for as long
    as the argument lives.

    msccl-threadblocks runs fusion and ordering to measure the threadblocks it chose; the
    passes that follow then get the same program object and need not redo the work. The
    argument is held weakly: once the pipeline has moved past a program (the unit holds
    the next one), it and the result kept for it are freed (at 1,024 GPUs each stage of
    the program holds millions of steps; all three stages and the XML model were alive
    at once)."""
    last: list = [None, None]  # a weak reference to the last argument, its result

    def forget(ref: weakref.ref) -> None:
        if last[0] is ref:
            last[0] = last[1] = None

    @wraps(fn)
    def wrapper(program: Program) -> Program:
        ref = last[0]
        if ref is None or ref() is not program:
            result = fn(program)
            last[0], last[1] = weakref.ref(program, forget), result
        return last[1]

    def remember(program: Program, result) -> None:
        """Keep `result` as what the call on `program` would return (it was computed
        another way, e.g. by a variant that may give up early and did not)."""
        last[0], last[1] = weakref.ref(program, forget), result

    wrapper.remember = remember  # type: ignore[attr-defined]
    return wrapper


def collections_paused(run: Callable[..., T]) -> Callable[..., T]:
    """Run a lowering pass with the cyclic garbage collector off.

    A pass builds up to millions of tuples, lists and dicts and no reference cycles, so
    the collector finds nothing; but CPython still scans the new objects every 100,000
    allocations (see `collc.ir.heap`), about a fifth of the lowering's time at 256 GPUs.
    What the pass leaves is scanned once, at the next collection after it."""

    @wraps(run)
    def paused(*args, **kwargs):
        if not gc.isenabled():
            return run(*args, **kwargs)
        gc.disable()
        try:
            return run(*args, **kwargs)
        finally:
            gc.enable()

    return paused


# --- what the executor calls the collective ------------------------------------------------

# The `coll` tokens of the current executor (msccl_parser.cc) for collc's collectives.
COLL_TOKENS = {
    CollectiveKind.ALLGATHER: "allgather",
    CollectiveKind.REDUCESCATTER: "reducescatter",
    CollectiveKind.ALLREDUCE: "allreduce",
    CollectiveKind.ALLTOALL: "alltoall",
    CollectiveKind.BROADCAST: "broadcast",
    CollectiveKind.REDUCE: "reduce",
    CollectiveKind.GATHER: "gather",
    CollectiveKind.SCATTER: "scatter",
}
ROOTED = (CollectiveKind.BROADCAST, CollectiveKind.REDUCE, CollectiveKind.GATHER, CollectiveKind.SCATTER)


def coll_token(collective: Collective) -> str:
    """The executor's name for the collective; an error for one it cannot run.

    The executor derives buffer sizes and in-place aliasing from `coll`, so the
    collective must have exactly the standard layout its label claims."""
    token = COLL_TOKENS.get(collective.kind)
    if token is not None and _last_checked[0] is collective:
        # The same object again (the driver checks the collective before solving, the
        # lowering once more): comparing AllReduce buffers of n ranks touches n^3 chunks.
        return token
    if token is None:
        raise CollcError(
            f"collective '{collective.name}' is a custom collective; the MSCCL executor runs only "
            f"{', '.join(COLL_TOKENS.values())} (use the json or cupy backend for it)")
    root = collective.root if collective.root is not None else 0
    expected = _standard(collective.kind, collective.ranks, collective.chunks, root)
    if expected.inputs != collective.inputs or expected.outputs != collective.outputs:
        raise CollcError(
            f"collective '{collective.name}' is labelled {token} but its buffers differ from the standard "
            f"{token} of {collective.ranks} ranks and {collective.chunks} chunks per rank; the MSCCL executor "
            "lays buffers out by the label, so it would compute something else")
    _last_checked[0] = collective  # collectives are frozen: one that passed once passes again
    return token


_last_checked: list[Collective | None] = [None]


@lru_cache(maxsize=8)
def _standard(kind: CollectiveKind, ranks: int, chunks: int, root: int) -> Collective:
    # Building an AllReduce of n ranks makes n^3 chunk symbols; a library compiles one
    # collective for many sizes, so build it once.
    return standard(kind, ranks, chunks, root)


def base_chunks_per_loop(collective: Collective) -> int:
    """Slots in the buffer the executor divides into `nchunksperloop` chunks: it splits
    `count x sizeMultiplier` elements (sizeMultiplier is ngpus for AllGather,
    ReduceScatter and AllToAll, 1 otherwise)."""
    kind = collective.kind
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.ALLREDUCE, CollectiveKind.BROADCAST,
                CollectiveKind.SCATTER):
        return collective.out_chunks
    return collective.in_chunks


def executor_bytes(collective: Collective, size_bytes: int) -> int:
    """The message size the executor compares with minBytes/maxBytes (count x type size x
    sizeMultiplier) for a compile size `size_bytes` (bytes of each rank's output buffer)."""
    return size_bytes * base_chunks_per_loop(collective) // max(1, collective.out_chunks)


# --- in-place aliasing ---------------------------------------------------------------------

def unified_buffer(kind: CollectiveKind) -> Buffer:
    """The one buffer an in-place program names for both input and output.

    The executor's in-place test (mscclSchedulerSelectAlgo): for AllGather and Gather the
    input is the output window at rank x input size; for ReduceScatter and Scatter the
    output is the input window at rank x output size; otherwise the two are the same."""
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.GATHER):
        return Buffer.OUTPUT
    return Buffer.INPUT


def inplace_offset(collective: Collective, rank: int, buffer: Buffer) -> int:
    """Where slot 0 of `buffer` of `rank` sits in the unified buffer."""
    kind = collective.kind
    if buffer is Buffer.SCRATCH or buffer is unified_buffer(kind):
        return 0
    if kind in (CollectiveKind.ALLGATHER, CollectiveKind.GATHER):
        return rank * len(collective.inputs[rank])
    if kind in (CollectiveKind.REDUCESCATTER, CollectiveKind.SCATTER):
        return rank * len(collective.outputs[rank])
    return 0
