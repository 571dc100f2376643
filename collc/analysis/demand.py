"""What a collective forces the network to move, derived from its postcondition.

The lower bounds reason about *requirements*: a distinct value R (a set of chunk symbols)
that some rank's output must hold. Two facts of the schedule IR drive every argument:

- values only grow: a copy keeps a value and a reduce joins two disjoint ones, and
  nothing subtracts; so every message (one slot moved from one GPU to another) whose
  value ends up inside a slot that must hold R carries a value V with V <= R. Call
  such a message *R-relevant*;
- a rank can use an input value V towards R only when V <= R. So chunk c of R is
  *held* (usably, for R) by the ranks with an input value V where c in V <= R.

From these: a rank *needs* R when its output requires R and its own usable inputs do
not cover R, and it then has to receive at least one R-relevant message. The chunks
of R that it lacks are its *missing* chunks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from itertools import chain, compress, repeat

from collc.diagnostics import CollcError
from collc.ir.collective import ChunkId, Collective, Value, value_str


@dataclass(frozen=True)
class Requirement:
    """One distinct output value and who holds and needs its parts."""

    value: Value
    chunks: tuple[ChunkId, ...]  # sorted(value)
    holders: tuple[frozenset[int], ...]  # per chunk (aligned with `chunks`): ranks that hold it usably
    needers: frozenset[int]  # ranks whose output requires the value and cannot form it locally

    def held_by(self, rank: int) -> frozenset[ChunkId]:
        """Chunks of the value that `rank` holds usably from the start."""
        return frozenset(c for c, hs in zip(self.chunks, self.holders) if rank in hs)

    def missing_at(self, rank: int) -> frozenset[ChunkId]:
        return frozenset(c for c, hs in zip(self.chunks, self.holders) if rank not in hs)

    def exclusive_owners(self) -> frozenset[int]:
        """Ranks that are the only usable holder of at least one chunk of the value."""
        # Over the distinct holder sets (equal sets are mostly one object: n per
        # requirement of an AllReduce on n ranks, a few at most of them distinct).
        distinct = dict(zip(map(id, self.holders), self.holders)).values()
        alone = compress(distinct, map((1).__eq__, map(len, distinct)))
        return frozenset(map(next, map(iter, alone)))

    def exclusive_chunks(self, rank: int) -> frozenset[ChunkId]:
        return frozenset(c for c, hs in zip(self.chunks, self.holders) if hs == frozenset((rank,)))


def requirements(collective: Collective) -> tuple[Requirement, ...]:
    """Every distinct required output value, in a deterministic order.

    Raises CollcError when a required chunk is held usably by no rank: no schedule can
    meet such a postcondition.
    """
    wanted = _wanted(collective)
    # A chunk whose containing inputs are all the chunk alone is held usably, for any
    # value with it, by exactly those ranks (the common case: no pre-reduced inputs);
    # its holder set is found once, and equal sets are one object.
    shared: dict[frozenset[int], frozenset[int]] = {}
    plain = _identity_holders(collective, shared)
    containing = _containing(collective) if plain is None else None
    if plain is None:
        plain = _plain_holders(containing, shared)
    ordered: dict[Value, tuple[ChunkId, ...]] = {}
    out = []
    for value in _by_size_then_chunks(wanted, ordered):
        chunks = ordered[value]
        if len(chunks) == 1:
            # One chunk (every value of an AllToAll, a million at 1,024 ranks): its
            # holders are the chunk's, and its needers the ranks wanting it outside them.
            hs = plain.get(chunks[0])
            if hs is not None:
                out.append(Requirement(value, chunks, (hs,), frozenset(wanted[value]) - hs))
                continue
        holders = list(map(plain.get, chunks))
        if None in holders:
            if containing is None:
                containing = _containing(collective)
            holders = [_usable_holders(c, value, containing, shared, collective, wanted) for c in chunks]
        # A rank needs the value when some chunk's holders lack it: when it is not in
        # every holder set (the distinct sets are few: one per rank at most).
        distinct = dict(zip(map(id, holders), holders)).values()
        everywhere = frozenset.intersection(*distinct)  # a wanted value has a chunk
        needers = frozenset(wanted[value]) - everywhere
        out.append(Requirement(value, chunks, tuple(holders), needers))
    return tuple(out)


def _by_size_then_chunks(values: Iterable[Value], ordered: dict[Value, tuple[ChunkId, ...]]) -> list[Value]:
    """The values by (size, sorted chunks), and into `ordered` each one's sorted chunks
    (they become a requirement's `chunks`). Sorted size by size on C-level keys: an
    AllToAll has a million values of one chunk, which a Python key function per value
    took seconds to order. No two values have the same chunks: the order is the same
    as one sort by (size, chunks)."""
    by_size: dict[int, list[Value]] = {}
    for value in values:
        by_size.setdefault(len(value), []).append(value)
    out: list[Value] = []
    for size in sorted(by_size):
        group = by_size[size]
        ordered.update(zip(group, map(tuple, group)) if size == 1 else ((v, tuple(sorted(v))) for v in group))
        group.sort(key=ordered.__getitem__)
        out += group
    return out


def _wanted(collective: Collective) -> dict[Value, set[int] | frozenset[int]]:
    """Every required output value and the ranks whose outputs require it. Ranks whose
    output buffers are one object (every rank of an AllGather or AllReduce) are read
    once, together: n buffers of n values would be n^2 steps."""
    same_buffer: dict[int, tuple[tuple, list[int]]] = {}
    for rank, buf in enumerate(collective.outputs):
        hit = same_buffer.get(id(buf))
        if hit is None:
            same_buffer[id(buf)] = (buf, [rank])
        else:
            hit[1].append(rank)
    wanted: dict[Value, set[int] | frozenset[int]] = {}
    for buf, ranks in same_buffer.values():
        group = frozenset(ranks)
        for value in dict.fromkeys(buf):  # distinct values (equal ones are usually one object)
            if value:
                have = wanted.get(value)
                wanted[value] = group if have is None else have | group
    return wanted


def _identity_holders(collective: Collective, shared: dict[frozenset[int], frozenset[int]]
                      ) -> dict[ChunkId, frozenset[int]] | None:
    """chunk -> {its rank} when every input value is one chunk and no chunk is in two
    inputs (the standard collectives), read by C-level maps; None otherwise."""
    values = list(chain.from_iterable(collective.inputs))
    if None in values or set(map(len, values)) != {1}:
        return None
    chunks = list(map(next, map(iter, values)))
    plain = dict(zip(chunks, chain.from_iterable(
        repeat(shared.setdefault(frozenset((r,)), frozenset((r,))), len(buf)) for r, buf in enumerate(collective.inputs))))
    return plain if len(plain) == len(chunks) else None


def _containing(collective: Collective) -> dict[ChunkId, list[tuple[int, Value]]]:
    """chunk -> (rank, input value) pairs that contain it; built once so that each
    requirement only looks at the inputs that can matter to it."""
    containing: dict[ChunkId, list[tuple[int, Value]]] = {}
    for rank, buf in enumerate(collective.inputs):
        for value in buf:
            for c in value or ():
                pairs = containing.get(c)
                if pairs is None:
                    containing[c] = [(rank, value)]
                else:
                    pairs.append((rank, value))
    return containing


def _plain_holders(containing: dict[ChunkId, list[tuple[int, Value]]],
                   shared: dict[frozenset[int], frozenset[int]]) -> dict[ChunkId, frozenset[int]]:
    plain: dict[ChunkId, frozenset[int]] = {}
    alone: dict[int, frozenset[int]] = {}  # rank -> {rank}: the one-holder sets, made once per rank
    for c, pairs in containing.items():
        if len(pairs) == 1:
            (r, v), = pairs
            if len(v) == 1:
                hs = alone.get(r)
                if hs is None:
                    hs = frozenset((r,))
                    hs = alone[r] = shared.setdefault(hs, hs)
                plain[c] = hs
        elif all(len(v) == 1 for _, v in pairs):
            hs = frozenset(r for r, _ in pairs)
            plain[c] = shared.setdefault(hs, hs)
    return plain


def _usable_holders(c: ChunkId, value: Value, containing: dict[ChunkId, list[tuple[int, Value]]],
                    shared: dict[frozenset[int], frozenset[int]], collective: Collective,
                    wanted: dict[Value, set[int]]) -> frozenset[int]:
    """Ranks with an input V where c in V <= value; raises when there are none."""
    hs = frozenset(r for r, v in containing.get(c, ()) if v <= value)
    if not hs:
        who = min(wanted[value])
        raise CollcError(
            f"collective '{collective.name}': rank {who}'s output must hold {value_str(value)}, but no "
            f"rank's input holds {c} in a form that can be reduced into it")
    return shared.setdefault(hs, hs)


def pairwise_disjoint(sets: Iterable[frozenset]) -> bool:
    seen: set = set()
    for s in sets:
        if not seen.isdisjoint(s):
            return False
        seen |= s
    return True


def greedy_disjoint(sets: Iterable[frozenset]) -> list[frozenset]:
    """A family of pairwise disjoint sets picked from `sets` (smallest first).

    Any such family is a valid witness for the counting arguments (each member needs
    its own message); greedy keeps all of them when they are already disjoint.
    """
    picked: list[frozenset] = []
    used: set = set()
    for s in sorted(set(sets), key=lambda s: (len(s), sorted(s))):
        if used.isdisjoint(s):
            picked.append(s)
            used |= s
    return picked


def disjoint_requirements(reqs: tuple[Requirement, ...]) -> tuple[Requirement, ...]:
    """Needed requirements whose values are pairwise disjoint (all of them, for the
    standard collectives); no message can be relevant to two of them."""
    needed = [r for r in reqs if r.needers]
    if pairwise_disjoint(r.value for r in needed):
        return tuple(needed)
    keep = set(greedy_disjoint(r.value for r in needed))
    return tuple(r for r in needed if r.value in keep)
