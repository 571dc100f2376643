"""What has to move: chunk commodities of a collective without reductions.

A commodity is one chunk symbol: the input slots that hold it at the start and the
output slots that must hold it at the end. Collectives with reductions are synthesized
by composition (collc.synthesis.compose); everything else reduces to commodities.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

from collc.diagnostics import CollcError, SolverError
from collc.ir.collective import ChunkId, Collective, CollectiveKind, Value, standard
from collc.ir.schedule import Buffer, Loc
from collc.synthesis.network import Network


@dataclass(frozen=True)
class Commodity:
    chunk: ChunkId
    sources: tuple[Loc, ...]  # input slots holding the chunk at the start
    targets: tuple[Loc, ...]  # output slots that must hold it at the end

    @cached_property
    def holders(self) -> tuple[int, ...]:
        return tuple(sorted({l.rank for l in self.sources}))

    @cached_property
    def demand(self) -> tuple[int, ...]:
        """Ranks that need the chunk and do not hold it: the ones it must travel to."""
        held = set(self.holders)
        return tuple(sorted({l.rank for l in self.targets} - held))


@dataclass(frozen=True)
class Problem:
    collective: Collective
    network: Network
    slot_bytes: float
    commodities: tuple[Commodity, ...]

    @property
    def ranks(self) -> int:
        return self.network.ranks

    @property
    def size_bytes(self) -> int:
        """nccl-tests' size of the collective this problem moves."""
        c = self.collective
        return round(self.slot_bytes * max(c.in_chunks, c.out_chunks, 1))

    @cached_property
    def deliveries(self) -> int:
        return sum(len(c.demand) for c in self.commodities)

    @cached_property
    def single_source(self) -> bool:
        return all(len(c.holders) == 1 for c in self.commodities)

    @cached_property
    def unicast(self) -> bool:
        return all(len(c.demand) <= 1 for c in self.commodities)

    @cached_property
    def classes(self) -> dict[tuple[int, tuple[int, ...]], list[int]]:
        """The commodities with demand by class, in order: (first holder, demand) ->
        their indices (the steady-state method's classes, `steady.solution.class_key`).
        Kept: the method paces a plan on every incumbent of its rounding MILP, and
        grouping a 4,096-chunk problem's commodities took 20-30 ms each time."""
        by_class: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for k, c in enumerate(self.commodities):
            if c.demand:
                by_class.setdefault((c.holders[0], c.demand), []).append(k)
        return by_class


def build_problem(collective: Collective, network: Network, size_bytes: int) -> Problem:
    if collective.has_reduction:
        raise CollcError(f"collective '{collective.name}' reduces values; synthesize it by composition")
    if network.ranks != collective.ranks:
        raise CollcError(f"collective '{collective.name}' has {collective.ranks} ranks but topology "
                         f"'{network.topology.name}' has {network.ranks} GPUs")
    # Locs made by tuple.__new__: Loc(...) runs a Python-level constructor, and a refined
    # collective has tens of thousands of slots.
    new_loc, inp, out = tuple.__new__, Buffer.INPUT, Buffer.OUTPUT
    sources: dict[ChunkId, list[Loc]] = {}
    for r, buf in enumerate(collective.inputs):
        for i, v in enumerate(buf):
            if v is not None and len(v) == 1:
                (c,) = v
                sources.setdefault(c, []).append(new_loc(Loc, (r, inp, i)))
    targets: dict[ChunkId, list[Loc]] = {}
    for r, buf in enumerate(collective.outputs):
        for j, v in enumerate(buf):
            if v is not None:
                (c,) = v
                targets.setdefault(c, []).append(new_loc(Loc, (r, out, j)))
    missing = sorted(c for c in targets if c not in sources)
    if missing:
        raise CollcError(f"collective '{collective.name}' needs {missing[0]} in an output, but no rank's "
                         "input holds it")
    commodities = tuple(Commodity(c, tuple(sources[c]), tuple(targets[c])) for c in sorted(targets))
    if not commodities:
        raise CollcError(f"collective '{collective.name}' requires nothing in any output")
    problem = Problem(collective, network, collective.slot_bytes(size_bytes), commodities)
    check_reachable(problem)
    return problem


def check_reachable(problem: Problem) -> None:
    """Raise SolverError naming GPUs that cannot reach each other, before any solve."""
    net = problem.network
    if net.strongly_connected:
        return
    # Many chunks share their holders and destinations (a refined collective has
    # thousands): each pattern is checked once.
    shapes = sorted({(c.holders, c.demand) for c in problem.commodities})
    need: set[tuple[int, int]] = set()
    for holders, demand in shapes:
        for d in demand:
            need.update((h, d) for h in holders)
    bad = set(net.unreachable(sorted(need)))
    stuck = []
    for c_holders, demand in shapes:
        for d in demand:
            if all((h, d) in bad for h in c_holders):
                stuck.append((c_holders[0], d))
    if stuck:
        stuck = sorted(set(stuck))
        a, b = stuck[0]
        more = f" (and {len(stuck) - 1} more pairs)" if len(stuck) > 1 else ""
        raise SolverError(
            f"no schedule exists for '{problem.collective.name}' on '{net.topology.name}': GPU "
            f"{net.gpu_names[a]} (rank {a}) has no path of links to GPU {net.gpu_names[b]} (rank {b}), "
            f"which needs its data{more}",
            notes=("check the topology's links and their directions",))


# --- refinement -------------------------------------------------------------------

def refinable(collective: Collective) -> bool:
    """Whether the collective's slots may be split into finer ones: every collective
    of the IR may. A slot's value is a chunk or an elementwise sum of chunks (the only
    reduction the IR has), so piece p of a slot is the chunk, or the sum, of piece p of
    each chunk: the same postcondition over k times as many slots of 1/k the bytes."""
    return collective.ranks > 0 and collective.chunks > 0


def refine(collective: Collective, chunks: int) -> Collective:
    """The same collective over `chunks` slots per rank (a multiple of its own count)."""
    if chunks == collective.chunks:
        return collective
    if chunks % collective.chunks:
        raise CollcError(f"cannot split '{collective.name}' ({collective.chunks} chunks per rank) into "
                         f"{chunks} chunks per rank: use a multiple of {collective.chunks}")
    if _is_standard(collective):
        root = collective.root if collective.root is not None else 0
        fine = standard(collective.kind, collective.ranks, chunks, root)
        return replace(fine, name=collective.name, root=collective.root)
    return split(collective, chunks // collective.chunks)


def _is_standard(collective: Collective) -> bool:
    if collective.kind is CollectiveKind.CUSTOM:
        return False
    try:
        canon = standard(collective.kind, collective.ranks, collective.chunks,
                         collective.root if collective.root is not None else 0)
    except (KeyError, ValueError):
        return False
    return canon.inputs == collective.inputs and canon.outputs == collective.outputs


def split(collective: Collective, pieces: int) -> Collective:
    """Every slot cut into `pieces` slots: slot s becomes slots s * pieces + p, and
    chunk(r, i) becomes chunk(r, i * pieces + p) in piece p. A sum of chunks becomes,
    in piece p, the sum of their pieces p (sums are elementwise). The destinations of
    each piece are those of its chunk, so a schedule may route the pieces of one chunk
    over different paths."""
    if pieces == 1:
        return collective

    def piece_of(value: Value | None, p: int) -> Value | None:
        if value is None:
            return None
        return frozenset(ChunkId(c.rank, c.index * pieces + p) for c in value)

    def split_buffer(buf: tuple[Value | None, ...]) -> tuple[Value | None, ...]:
        return tuple(piece_of(v, p) for v in buf for p in range(pieces))

    # Buffers that are one object stay one object (the requirement analysis reads
    # such ranks together).
    memo: dict[int, tuple] = {}

    def shared(buf: tuple) -> tuple:
        out = memo.get(id(buf))
        if out is None:
            out = memo[id(buf)] = split_buffer(buf)
        return out

    return replace(collective, chunks=collective.chunks * pieces,
                   inputs=tuple(shared(b) for b in collective.inputs),
                   outputs=tuple(shared(b) for b in collective.outputs))
