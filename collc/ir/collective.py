"""The collective IR: what each rank holds before, and must hold after.

Chunks are symbols. `ChunkId(r, i)` is chunk i of rank r's input buffer. A `Value` is
the set of chunk symbols reduced together into one buffer slot: a plain copy of a chunk
is a one-element set, an AllReduce result is the set of that index over every rank.
Keeping reductions as sets (not sums) lets the verifier name a double count or a
missing contribution exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from itertools import repeat
from operator import itemgetter
from enum import Enum
from typing import Any, Iterable, NamedTuple

from collc.ir.heap import few_collections


class ChunkId(NamedTuple):
    rank: int
    index: int

    def __str__(self) -> str:
        return f"chunk({self.rank}, {self.index})"


Value = frozenset  # frozenset[ChunkId]


def value_str(value: Value | None) -> str:
    if value is None:
        return "nothing"
    items = sorted(value)
    if len(items) == 1:
        return str(items[0])
    if len(items) <= 4:
        return "sum(" + ", ".join(str(c) for c in items) + ")"
    return f"sum of {len(items)} chunks (" + ", ".join(str(c) for c in items[:3]) + ", ...)"


class CollectiveKind(str, Enum):
    """The family a collective belongs to. Passes decide from the postcondition's
    structure, not from this label; it names the collective in reports and XML."""

    ALLGATHER = "allgather"
    REDUCESCATTER = "reducescatter"
    ALLREDUCE = "allreduce"
    ALLTOALL = "alltoall"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    GATHER = "gather"
    SCATTER = "scatter"
    CUSTOM = "custom"


@dataclass(frozen=True)
class Collective:
    """A collective over `ranks` ranks.

    `inputs[r][i]` is the value rank r's input slot i holds at the start (normally
    {chunk(r, i)}); `outputs[r][j]` is the value rank r's output slot j must hold at the
    end, or None where nothing is required.
    """

    name: str
    kind: CollectiveKind
    ranks: int
    chunks: int  # chunks per rank: the granularity parameter of the collective
    inputs: tuple[tuple[Value, ...], ...]
    outputs: tuple[tuple[Value | None, ...], ...]
    root: int | None = None
    # Where the collective was made from a demand matrix (collc.frontend.demand): the
    # bytes each rank sends each other rank, as (source, destination, bytes) for the
    # entries that are not zero. Its slots round those up to whole slots; the lower
    # bounds count these bytes exactly.
    demand: tuple[tuple[int, int, float], ...] | None = None

    @property
    def in_chunks(self) -> int:
        return max((len(b) for b in self.inputs), default=0)

    @property
    def out_chunks(self) -> int:
        return max((len(b) for b in self.outputs), default=0)

    def slot_bytes(self, size_bytes: int) -> float:
        """Bytes in one slot when the collective moves `size_bytes` as nccl-tests' size
        column counts it: the larger of a rank's input and output buffers (the output for
        AllGather and Gather, the input for ReduceScatter and Scatter, either for the
        rest). All slots of a collective have this size."""
        return size_bytes / max(self.in_chunks, self.out_chunks, 1)

    @property
    def has_reduction(self) -> bool:
        return any(v is not None and len(v) > 1 for b in self.outputs for v in b)

    def demands(self) -> dict[ChunkId, frozenset[int]]:
        """For a collective without reductions: chunk -> ranks whose output needs it."""
        need: dict[ChunkId, set[int]] = {}
        for r, buf in enumerate(self.outputs):
            for v in buf:
                if v is not None and len(v) == 1:
                    (c,) = v
                    need.setdefault(c, set()).add(r)
        return {c: frozenset(rs) for c, rs in need.items()}

    # --- JSON --------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        # A value's chunks as sorted [rank, index] pairs; `list` of a ChunkId (a tuple)
        # is that pair, made in C (an AllGather on dgx1 at 512 chunks has 36,864 values).
        return {
            "name": self.name,
            "kind": self.kind.value,
            "ranks": self.ranks,
            "chunks": self.chunks,
            "root": self.root,
            "inputs": [[None if v is None else sorted(map(list, v)) for v in b] for b in self.inputs],
            "outputs": [[None if v is None else sorted(map(list, v)) for v in b] for b in self.outputs],
            **({"demand": [list(e) for e in self.demand]} if self.demand is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Collective":
        def dec(v):
            return None if v is None else frozenset(ChunkId(r, i) for r, i in v)

        return cls(
            name=data["name"],
            kind=CollectiveKind(data["kind"]),
            ranks=int(data["ranks"]),
            chunks=int(data["chunks"]),
            root=data.get("root"),
            inputs=tuple(tuple(dec(v) for v in b) for b in data["inputs"]),
            outputs=tuple(tuple(dec(v) for v in b) for b in data["outputs"]),
            demand=(tuple((int(i), int(j), float(b)) for i, j, b in data["demand"])
                    if data.get("demand") is not None else None),
        )


# --- the standard collectives, built directly ---------------------------------------
# The stdlib's .coll definitions produce the same objects (tests/stdlib checks that by
# interpreting them); the front end uses these builders for the stdlib's collectives,
# since interpreting a postcondition costs ranks^2 (ranks^3 with reductions) evaluations.
# Equal values are one shared object: an AllReduce on 1,024 ranks then holds 1,024
# sets (one per slot index), not a million.

# C-level maps make the chunk ids and sets (a million of each at 1,024 ranks); a
# ChunkId is made as its NamedTuple __new__ makes it, tuple.__new__(ChunkId, (rank, index)).
_new_tuple = tuple.__new__


def _chunk_ids(ranks: int, n: int) -> list[list[ChunkId]]:
    """ChunkId(r, i) for every rank r and index i < n, a list per rank."""
    return [list(map(_new_tuple, repeat(ChunkId), zip(repeat(r, n), range(n)))) for r in range(ranks)]


def _identity_inputs(ranks: int, n: int, ids: list[list[ChunkId]] | None = None) -> tuple[tuple[Value, ...], ...]:
    return tuple(tuple(map(frozenset, zip(row))) for row in (ids or _chunk_ids(ranks, n)))


def _sum_over_ranks(ranks: int, index: int) -> Value:
    return frozenset(map(_new_tuple, repeat(ChunkId), zip(range(ranks), repeat(index))))


def allgather(ranks: int, chunks: int = 1) -> Collective:
    ins = _identity_inputs(ranks, chunks)
    row = tuple(ins[s][i] for s in range(ranks) for i in range(chunks))
    return Collective("allgather", CollectiveKind.ALLGATHER, ranks, chunks, ins, (row,) * ranks)


def reducescatter(ranks: int, chunks: int = 1) -> Collective:
    outs = tuple(tuple(_sum_over_ranks(ranks, r * chunks + i) for i in range(chunks)) for r in range(ranks))
    return Collective("reducescatter", CollectiveKind.REDUCESCATTER, ranks, chunks,
                      _identity_inputs(ranks, ranks * chunks), outs)


def allreduce(ranks: int, chunks: int = 1) -> Collective:
    n = ranks * chunks
    ids = _chunk_ids(ranks, n)  # shared by the inputs and the sums (equal either way)
    row = tuple(frozenset(map(itemgetter(j), ids)) for j in range(n))  # ranks in order, as _sum_over_ranks
    return Collective("allreduce", CollectiveKind.ALLREDUCE, ranks, chunks, _identity_inputs(ranks, n, ids),
                      (row,) * ranks)


def alltoall(ranks: int, chunks: int = 1) -> Collective:
    ins = _identity_inputs(ranks, ranks * chunks)
    outs = tuple(tuple(ins[s][r * chunks + i] for s in range(ranks) for i in range(chunks)) for r in range(ranks))
    return Collective("alltoall", CollectiveKind.ALLTOALL, ranks, chunks, ins, outs)


def broadcast(ranks: int, chunks: int = 1, root: int = 0) -> Collective:
    ins = _identity_inputs(ranks, chunks)
    return Collective("broadcast", CollectiveKind.BROADCAST, ranks, chunks, ins, (ins[root],) * ranks, root)


def reduce(ranks: int, chunks: int = 1, root: int = 0) -> Collective:
    sums = tuple(_sum_over_ranks(ranks, i) for i in range(chunks))
    empty = (None,) * chunks
    outs = tuple(sums if r == root else empty for r in range(ranks))
    return Collective("reduce", CollectiveKind.REDUCE, ranks, chunks, _identity_inputs(ranks, chunks), outs, root)


def gather(ranks: int, chunks: int = 1, root: int = 0) -> Collective:
    ins = _identity_inputs(ranks, chunks)
    full = tuple(ins[s][i] for s in range(ranks) for i in range(chunks))
    empty = (None,) * (ranks * chunks)
    outs = tuple(full if r == root else empty for r in range(ranks))
    return Collective("gather", CollectiveKind.GATHER, ranks, chunks, ins, outs, root)


def scatter(ranks: int, chunks: int = 1, root: int = 0) -> Collective:
    ins = _identity_inputs(ranks, ranks * chunks)
    outs = tuple(tuple(ins[root][r * chunks + i] for i in range(chunks)) for r in range(ranks))
    return Collective("scatter", CollectiveKind.SCATTER, ranks, chunks, ins, outs, root)


STANDARD = {
    CollectiveKind.ALLGATHER: allgather,
    CollectiveKind.REDUCESCATTER: reducescatter,
    CollectiveKind.ALLREDUCE: allreduce,
    CollectiveKind.ALLTOALL: alltoall,
    CollectiveKind.BROADCAST: broadcast,
    CollectiveKind.REDUCE: reduce,
    CollectiveKind.GATHER: gather,
    CollectiveKind.SCATTER: scatter,
}


# The name a demand collective (an AllToAllv from a demand matrix: collc.frontend.demand)
# goes by, and the `.coll` spelling's collective name.
DEMAND_NAME = "alltoallv"


def standard(kind: CollectiveKind | str, ranks: int, chunks: int = 1, root: int = 0) -> Collective:
    """The standard collective; the same (immutable) object for the same arguments, so
    the front end's, the backends' and the verifiers' copies compare by identity."""
    return _standard(CollectiveKind(kind), ranks, chunks, root)


@lru_cache(maxsize=8)
def _standard(kind: CollectiveKind, ranks: int, chunks: int, root: int) -> Collective:
    build = STANDARD[kind]
    with few_collections():
        if kind in (CollectiveKind.BROADCAST, CollectiveKind.REDUCE, CollectiveKind.GATHER, CollectiveKind.SCATTER):
            return build(ranks, chunks, root)  # type: ignore[call-arg]
        return build(ranks, chunks)


def chunks_of(values: Iterable[Value | None]) -> set[ChunkId]:
    out: set[ChunkId] = set()
    for v in values:
        if v:
            out |= v
    return out
