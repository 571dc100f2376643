"""Symbolic execution of a schedule against its collective's postcondition.

Chunks are symbols and a slot's value is the set of chunks reduced into it, so the
verifier names exactly what went wrong: a read of a slot nothing wrote, a chunk counted
twice in a reduction, a missing contribution, a race between ops that no dependency
orders, or a wrong final value.
"""

from __future__ import annotations

from collections.abc import Iterable

from collc.diagnostics import ScheduleError
from collc.ir.collective import ChunkId, Value, value_str
from collc.ir.graphs import mutually_reachable
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import NodeKind, Topology

# From this many ops `verify` tries the array form first (collc.verify.arrays); below it
# the op-by-op run is as fast (numpy has a fixed cost per call).
MIN_OPS = 4096


def buffer_size(schedule: Schedule, rank: int, buffer: Buffer) -> int:
    coll = schedule.collective
    if buffer is Buffer.INPUT:
        return len(coll.inputs[rank])
    if buffer is Buffer.OUTPUT:
        return len(coll.outputs[rank])
    return schedule.scratch_slots(rank)


def check_structure(schedule: Schedule, topology: Topology | None = None, in_place: bool = False) -> None:
    """Ids unique, deps point backwards, slots in range, routes follow links, and no
    writes to read-only buffers (unless `in_place`: the backends' aliased form, where
    input and output are one buffer)."""
    ranks = schedule.collective.ranks
    if topology is not None and topology.num_ranks != ranks:
        raise ScheduleError(
            f"schedule '{schedule.name}' is for {ranks} ranks but topology '{topology.name}' has "
            f"{topology.num_ranks} GPUs")
    # op id -> step for the ops seen so far: a list while ids are positions (every built
    # or synthesized schedule: no dict of millions of entries), else a dict.
    steps: list[int] | None = []
    step_of: dict[int, int] = {}
    unused = {r for r, buf in enumerate(schedule.collective.outputs) if all(v is None for v in buf)}
    # Looked up once per op, so computed once per schedule.
    sizes = {(r, b): buffer_size(schedule, r, b) for r in range(ranks) for b in Buffer}
    reach: dict[int, frozenset[int]] | None = None  # the topology's, read at the first unrouted transfer
    in_range: set[Loc] = set()  # slots one-slot ops have named (each is checked once)
    output, input_ = Buffer.OUTPUT, Buffer.INPUT
    # One loop with the checks inline: it runs once per op (millions at 1,024 ranks).
    for op in schedule.ops:
        op_id, step, src, dst, count = op.id, op.step, op.src, op.dst, op.count
        if steps is not None and op_id != len(steps):
            step_of, steps = dict(enumerate(steps)), None  # ids are not positions after all
        if steps is None and op_id in step_of:
            raise ScheduleError(f"op {op_id} appears twice in schedule '{schedule.name}'", op.origin)
        for d in op.deps:
            if steps is not None:
                dep_step = steps[d] if 0 <= d < len(steps) else None
            else:
                dep_step = step_of.get(d)
            if dep_step is None:
                raise ScheduleError(
                    f"op {op_id} depends on op {d}, which does not come before it "
                    "(ops must be listed in a dependency order)", op.origin)
            if dep_step >= step:
                # Executors run a schedule step by step; a dependency inside one step
                # would have to be honoured within a step that runs all at once.
                raise ScheduleError(
                    f"op {op_id} (step {step}) depends on op {d} (step {dep_step}); "
                    "a dependency must be at an earlier step", op.origin)
        if steps is not None:
            steps.append(step)
        else:
            step_of[op_id] = step
        if count < 1:
            raise ScheduleError(f"op {op_id} moves {count} slots; it must move at least one", op.origin)
        if count != 1 or src not in in_range or dst not in in_range:  # else both checked before
            _check_ranges(op, ranks, sizes)
            if count == 1:
                in_range.add(src)
                in_range.add(dst)
        if not in_place and (dst.buffer is input_ or (dst.buffer is output and dst.rank in unused)):
            _check_writable(schedule, op, unused)
        if topology is not None and src.rank != dst.rank:
            if op.route:
                _check_route(op, topology)
            elif dst.rank not in (reach := reach or topology.direct_reach)[src.rank]:
                src_name, dst_name = topology.gpu(src.rank).name, topology.gpu(dst.rank).name
                raise ScheduleError(
                    f"op {op_id} sends from {src_name} to {dst_name}, but no path joins them through switches "
                    "and NICs only; relay it through a GPU (one op into the relay's buffer, one out of it)",
                    op.origin)


def _check_ranges(op: Op, ranks: int, sizes: dict[tuple[int, Buffer], int]) -> None:
    """The op's ranks exist and its slots lie inside their buffers."""
    for loc in (op.src, op.dst):
        rank, buffer, index = loc
        if not 0 <= rank < ranks:
            raise ScheduleError(f"op {op.id} names rank {rank}, but there are {ranks} ranks", op.origin)
        size = sizes[(rank, buffer)]
        if index < 0 or index + op.count > size:
            raise ScheduleError(
                f"op {op.id} touches rank {rank} {buffer.label}[{index}"
                f"{'' if op.count == 1 else f'..{index + op.count}'}], but that buffer has {size} slots",
                op.origin)


def _check_writable(schedule: Schedule, op: Op, unused: set[int]) -> None:
    """Inputs are read-only (NCCL's sendbuff is const), and a rank whose output the
    collective leaves empty (a non-root of Reduce or Gather) may have no receive buffer
    at all; partial results belong in scratch."""
    dst = op.dst
    if dst.buffer is Buffer.INPUT:
        raise ScheduleError(
            f"op {op.id} writes {dst}: input buffers are read-only (NCCL's send buffer is const); "
            "keep partial results in scratch", op.origin)
    if dst.buffer is Buffer.OUTPUT and dst.rank in unused:
        raise ScheduleError(
            f"op {op.id} writes {dst}, but {schedule.collective.name} leaves rank {dst.rank}'s output "
            "unused (it may not exist on that rank); keep partial results in scratch", op.origin)


def _check_route(op: Op, topology: Topology) -> None:
    src, dst = topology.gpu(op.src.rank).name, topology.gpu(op.dst.rank).name
    if op.route[0] != src or op.route[-1] != dst:
        raise ScheduleError(
            f"op {op.id} is routed {' -> '.join(op.route)}, which does not run from {src} to {dst}", op.origin)
    for a, b in zip(op.route, op.route[1:]):
        if (a, b) not in topology.link_map:
            raise ScheduleError(f"op {op.id} is routed over {a} -> {b}, which is not a link", op.origin)
    for mid in op.route[1:-1]:
        if topology.node(mid).kind is NodeKind.GPU:
            raise ScheduleError(
                f"op {op.id} passes through GPU {mid} without storing; relay through a GPU with two ops",
                op.origin)


# How many branch points a chain proof climbs before it leaves the question to the search.
CHAIN_CLIMBS = 16


class _Order:
    """Happens-before queries over the dependency DAG.

    Besides the DAG, it keeps *chains* that the symbolic run reports as it goes
    (`follows`): an op that depends directly on the op that wrote the slot it reads
    continues that op's chain, or, where another op already continued it, starts a
    branch off it. A chain is a path of dependencies, so an op earlier on a chain that
    leads to b (through a few branch points) is an ancestor of b, found in a few dict
    reads. This is what answers the race check of a ring: the op that read a slot is
    ordered before the op that overwrites it by the N - 1 hops of the slot's chunk around
    the ring, which the search walked one op at a time (at 1,024 GPUs over nodes,
    128-hop rings; at 128 GPUs over nodes the chains answer all 30,720 such questions).
    Only yes is read from the chains; a no goes to the search, so the answers are
    exactly the DAG's."""

    def __init__(self, ops: tuple[Op, ...]):
        self.ops = ops
        self._pos: dict[int, int] | None = None
        self._deps: dict[int, tuple[int, ...]] | None = None
        self._level: dict[int, int] | None = None
        # Per op reported to `follows`: its chain and its place on it. Per chain: its
        # last op, and the op its first op branched off (None: a chain of its own).
        self._chain: dict[int, int] = {}
        self._place: dict[int, int] = {}
        self._tail: list[int] = []
        self._branch_of: list[int | None] = []

    # Built at the first query: a schedule whose accesses are all ordered by direct
    # dependencies (every ring) never searches the DAG.
    @property
    def pos(self) -> dict[int, int]:
        if self._pos is None:
            self._pos = {op.id: i for i, op in enumerate(self.ops)}
        return self._pos

    @property
    def deps(self) -> dict[int, tuple[int, ...]]:
        if self._deps is None:
            self._deps = {op.id: op.deps for op in self.ops}
        return self._deps

    @property
    def level(self) -> dict[int, int]:
        """Per op, the ops on the longest chain of dependencies that ends at it (1: an op
        with none). An ancestor of an op has a lower level, and so does every op between
        them: a search for ancestors prunes by level as well as by list position, and in
        a schedule composed of interleaved parts (an AllReduce over 128 nodes) the level
        cuts off a third of what the position alone lets through."""
        if self._level is None:
            level: dict[int, int] = {}
            for op in self.ops:
                level[op.id] = 1 + max(map(level.__getitem__, op.deps), default=0)
            self._level = level
        return self._level

    def follows(self, op: int, pred: int | None) -> None:
        """Record that `op` depends directly on `pred` (None: on no op reported here), the
        op that wrote the slot it reads: `op` continues `pred`'s chain if it is the first
        to, else starts a branch off it."""
        chain = self._chain.get(pred) if pred is not None else None
        if chain is not None and self._tail[chain] == pred:
            self._chain[op] = chain
            self._place[op] = self._place[pred] + 1
            self._tail[chain] = op
            return
        self._chain[op] = len(self._tail)
        self._place[op] = 0
        self._tail.append(op)
        self._branch_of.append(pred if chain is not None else None)

    def on_chains(self, a: int, b: int) -> bool:
        """True if the chains show op a before op b (False: they do not show it, which
        does not mean it is not)."""
        chain_of = self._chain
        target = chain_of.get(a)
        chain = chain_of.get(b)
        if target is None or chain is None:
            return False
        place, last = self._place[a], self._place[b] - 1  # ops of b's chain strictly before b
        for _ in range(CHAIN_CLIMBS):
            if chain == target:
                return place <= last
            root = self._branch_of[chain]
            if root is None:
                return False
            chain, last = chain_of[root], self._place[root]  # the branch point itself comes before b
        return False

    def before(self, a: int, b: int) -> bool:
        """True if op a is an ancestor of op b (a must finish before b starts)."""
        return a != b and bool(self.ancestors_among(b, (a,)))

    def ancestors_among(self, b: int, candidates: Iterable[int]) -> set[int]:
        """The candidates that are ancestors of op b, found by one search from b (the
        race check asks about every earlier access of a slot at once): only ops later in
        the list and of higher level than the earliest candidate can lead to one."""
        deps = self.deps
        direct = deps[b]
        found = {c for c in candidates if c in direct or (c != b and self.on_chains(c, b))}
        wanted = {c for c in candidates if c != b and c not in found}
        if not wanted:
            return found
        # The maps bound once: the search reads them per visited op, a million queries
        # at 1,024 GPUs, and each property access is a function call.
        pos, level = self.pos, self.level
        low_pos = min(map(pos.__getitem__, wanted))
        low_level = min(map(level.__getitem__, wanted))
        stack = [b]
        seen = {b}
        while stack:
            for d in deps[stack.pop()]:
                if d in seen:
                    continue
                if d in wanted:
                    found.add(d)
                    wanted.discard(d)
                    if not wanted:
                        return found
                # Ancestors of a candidate come before it in list order and have a lower
                # level, so they cannot lead to it.
                if pos[d] > low_pos and level[d] > low_level:
                    seen.add(d)
                    stack.append(d)
        return found


# --- values as rank bit masks ------------------------------------------------------------
# A slot's value is a set of chunks. Python sets make a reduction of n contributions cost
# n element copies, and an AllReduce on n ranks does n^2 of them of size up to n: at 256
# ranks the verifier spent seconds in set unions. Here a value is a tuple of (index,
# rank mask) pairs sorted by index: the chunks of one index are one int whose bits are
# ranks. A standard reduction (all contributions share an index) is then one pair, its
# union one `|`, a double count one `&`; a copy shares the tuple. Sets come back only
# for error messages (`_Codec.decode`).

Bits = tuple[tuple[int, int], ...]


class _Codec:
    """frozenset[ChunkId] <-> Bits. Ranks are numbered in order of appearance (the
    in-place check uses negative ranks for placeholders)."""

    def __init__(self) -> None:
        self.bit_of_rank: dict[int, int] = {}
        self.rank_of_bit: list[int] = []
        self._seen: dict[int, tuple[Value, Bits]] = {}  # id(value) -> (value, bits): values are shared

    def encode(self, value: Value) -> Bits:
        hit = self._seen.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        if len(value) == 1:  # a plain chunk (every input of the standard collectives)
            for c in value:
                bit = self.bit_of_rank.get(c.rank)
                if bit is None:
                    bit = self.bit_of_rank[c.rank] = len(self.rank_of_bit)
                    self.rank_of_bit.append(c.rank)
                return ((c.index, 1 << bit),)  # not remembered: a one-chunk value is seldom shared
        masks: dict[int, int] = {}
        for c in value:
            bit = self.bit_of_rank.get(c.rank)
            if bit is None:
                bit = self.bit_of_rank[c.rank] = len(self.rank_of_bit)
                self.rank_of_bit.append(c.rank)
            masks[c.index] = masks.get(c.index, 0) | (1 << bit)
        bits = tuple(sorted(masks.items()))
        self._seen[id(value)] = (value, bits)
        return bits

    def decode(self, bits: Bits) -> Value:
        out = []
        for index, mask in bits:
            while mask:
                low = mask & -mask
                out.append(ChunkId(self.rank_of_bit[low.bit_length() - 1], index))
                mask ^= low
        return frozenset(out)


def _union(a: Bits, b: Bits) -> tuple[Bits, Bits]:
    """(a | b, a & b): the sum of two values and what they both count."""
    if len(a) == 1 and len(b) == 1 and a[0][0] == b[0][0]:
        (i, x), (_, y) = a[0], b[0]
        both = x & y
        return ((i, x | y),), (((i, both),) if both else ())
    merged = dict(a)
    twice = {}
    for i, y in b:
        x = merged.get(i, 0)
        if x & y:
            twice[i] = x & y
        merged[i] = x | y
    return tuple(sorted(merged.items())), tuple(sorted(twice.items()))


def _missing(want: Bits, got: Bits) -> Bits | None:
    """want - got where got is a proper subset of want, else None."""
    have = dict(got)
    if any(i not in dict(want) for i in have):
        return None
    out = []
    for i, x in want:
        y = have.get(i, 0)
        if y & ~x:
            return None
        if x & ~y:
            out.append((i, x & ~y))
    return tuple(out) or None


def _slot_pairs(op: Op) -> list[tuple[Loc, Loc]]:
    if op.count == 1:
        return [(op.src, op.dst)]
    return op.slots()


# Slots of a multi-slot op as plain (rank, buffer, index) tuples: they hash and compare
# equal to the `Loc`s of the same slot, so one dict holds both, and a tuple display costs
# a fraction of a NamedTuple's __new__ (the verifier touches every slot of every op).
# Error messages turn them back into `Loc`s (`_as_loc`).
SlotKey = tuple[int, Buffer, int]


def _slot_keys(op: Op) -> list[tuple[Loc, Loc]] | list[tuple[SlotKey, SlotKey]]:
    if op.count == 1:
        return [(op.src, op.dst)]
    (a, sb, si), (b, db, di) = op.src, op.dst
    return [((a, sb, si + k), (b, db, di + k)) for k in range(op.count)]


def _as_loc(key: Loc | SlotKey) -> Loc:
    return key if isinstance(key, Loc) else Loc(*key)


def _execute(schedule: Schedule, check_races: bool) -> tuple[dict[Loc, Bits], _Codec]:
    coll = schedule.collective
    codec = _Codec()
    # slot -> [value, last op that wrote it, ops that read it since that write or None]: one
    # record per slot, so an op costs two dict lookups (it runs millions of times).
    slots: dict[Loc | SlotKey, list] = {}
    for r, buf in enumerate(coll.inputs):
        for i, v in enumerate(buf):
            slots[Loc(r, Buffer.INPUT, i)] = [codec.encode(v), None, None]
    order = _Order(schedule.ops) if check_races else None
    reduce = OpKind.REDUCE
    get = slots.get
    for op in schedule.ops:
        me, deps, is_reduce = op.id, op.deps, op.kind is reduce
        unchained = True  # reported to the chains at its first slot (see `_Order.follows`)
        for src, dst in ((op.src, op.dst),) if op.count == 1 else _slot_keys(op):
            held = get(src)
            if held is None:
                raise ScheduleError(f"op {me} reads {_as_loc(src)}, which holds nothing at that point",
                                    op.origin)
            v = held[0]
            target = get(dst)
            if is_reduce:
                if target is None:
                    raise ScheduleError(
                        f"op {me} reduces into {_as_loc(dst)}, which holds nothing at that point", op.origin)
                cur = target[0]
                if len(cur) == 1 and len(v) == 1 and cur[0][0] == v[0][0]:
                    # One index on both sides (every standard reduction): one `|`, one `&`.
                    (i, x), (_, y) = cur[0], v[0]
                    new, twice = ((i, x | y),), x & y
                else:
                    new, twice = _union(cur, v)
                if twice:
                    twice = _union(cur, v)[1]
                    raise ScheduleError(
                        f"op {me} reduces {value_str(codec.decode(v))} into {_as_loc(dst)}, which already holds "
                        f"{value_str(codec.decode(cur))}: {value_str(codec.decode(twice))} would be counted twice",
                        op.origin)
            else:
                new = v
            if order is not None:
                w = held[1]
                if unchained:
                    order.follows(me, w if w is not None and w in deps else None)
                    unchained = False
                # Every earlier access `_check_race` would check is a direct dependency
                # of `op` (or `op` itself): the common case, decided without searching.
                if not ((w is None or w == me or w in deps) and (
                        target is None or ((target[1] is None or target[1] in deps)
                                           and (not target[2] or _all_ordered(target[2], me, deps))))):
                    _check_race(op, src, dst, _writers(slots, src, dst), _readers(slots, dst), order)
            # Readers since the last write: None for none (millions of slots, most read once).
            if target is None:
                slots[dst] = [new, me, [me] if is_reduce else None]
            else:
                target[0], target[1], target[2] = new, me, [me] if is_reduce else None
            if held[2] is None:
                held[2] = [me]
            else:
                held[2].append(me)
    return {loc: record[0] for loc, record in slots.items()}, codec


def _all_ordered(readers: list[int], me: int, deps: tuple[int, ...]) -> bool:
    return all(r == me or r in deps for r in readers)


def _writers(slots: dict[Loc | SlotKey, list], *keys: Loc | SlotKey) -> dict[Loc | SlotKey, int]:
    return {k: slots[k][1] for k in keys if k in slots and slots[k][1] is not None}


def _readers(slots: dict[Loc | SlotKey, list], key: Loc | SlotKey) -> dict[Loc | SlotKey, list[int]]:
    return {key: slots[key][2]} if key in slots and slots[key][2] else {}


def execute(schedule: Schedule, check_races: bool = True) -> dict[Loc, Value]:
    """Run the ops symbolically; return the final value of every written or initial slot."""
    state, codec = _execute(schedule, check_races)
    return {_as_loc(loc): codec.decode(bits) for loc, bits in state.items()}


def _check_race(op: Op, src: Loc | SlotKey, dst: Loc | SlotKey, writer: dict[Loc, int],
                readers: dict[Loc, list[int]], order: _Order) -> None:
    earlier = [w for w in (writer.get(src), writer.get(dst)) if w is not None]
    earlier += readers.get(dst, ())
    ordered = order.ancestors_among(op.id, earlier)
    w = writer.get(src)
    if w is not None and w != op.id and w not in ordered:
        raise ScheduleError(
            f"op {op.id} reads {_as_loc(src)}, written by op {w}, without depending on it (a race)", op.origin)
    w = writer.get(dst)
    if w is not None and w not in ordered:
        raise ScheduleError(
            f"op {op.id} writes {_as_loc(dst)}, also written by op {w}, without depending on it (a race)",
            op.origin)
    for r in readers.get(dst, ()):
        if r != op.id and r not in ordered:
            raise ScheduleError(
                f"op {op.id} overwrites {_as_loc(dst)} while op {r} may still be reading it (a race)", op.origin)


def check_postcondition(schedule: Schedule, state: dict[Loc, Value]) -> None:
    codec = _Codec()
    _check_postcondition(schedule, {loc: codec.encode(v) for loc, v in state.items()}, codec)


def _check_postcondition(schedule: Schedule, state: dict[Loc, Bits], codec: _Codec) -> None:
    coll = schedule.collective
    for r, buf in enumerate(coll.outputs):
        for j, want in enumerate(buf):
            if want is None:
                continue
            loc = Loc(r, Buffer.OUTPUT, j)
            got = state.get(loc)
            want_bits = codec.encode(want)
            if got == want_bits:
                continue
            culprit = _last_writer(schedule, loc)
            span = culprit.origin if culprit is not None else None
            if got is None:
                msg = f"{loc} must hold {value_str(want)} but holds nothing"
            else:
                missing = _missing(want_bits, got)
                shown = value_str(codec.decode(got))
                if missing is not None:
                    msg = (f"{loc} must hold {value_str(want)} but holds {shown}: missing "
                           f"{value_str(codec.decode(missing))}")
                else:
                    msg = f"{loc} must hold {value_str(want)} but holds {shown}"
            raise ScheduleError(f"postcondition of {coll.name} fails: {msg}", span)


def _last_writer(schedule: Schedule, loc: Loc) -> Op | None:
    """The last op that wrote `loc` (searched only once a check has failed)."""
    for op in reversed(schedule.ops):
        if any(dst == loc for _, dst in _slot_pairs(op)):
            return op
    return None


def verify(schedule: Schedule, topology: Topology | None = None, check_races: bool = True) -> None:
    """Raise ScheduleError unless the schedule is well formed and meets the postcondition.
    Every call runs the check: a caller that must not verify one schedule twice (at
    1,024 GPUs a run takes a minute) keeps what it verified, as the pass manager does on
    its compile unit."""
    if check_races and len(schedule.ops) >= MIN_OPS:
        # The array form imports numpy (about 0.1 s): loaded only for a schedule large
        # enough to take it, so that `collc check` of a small file does without.
        from collc.verify.arrays import verify_on_arrays

        if verify_on_arrays(schedule, topology):
            return  # the array form decided (it never words an error)
    verify_op_by_op(schedule, topology, check_races)


def load_array_form() -> None:
    """Import the array form `verify` uses for a large schedule (collc.verify.arrays),
    ahead of the call: for a caller with a moment to spare before it verifies one."""
    from collc.verify.arrays import verify_on_arrays  # noqa: F401  (loaded, not called: see verify)


def verify_op_by_op(schedule: Schedule, topology: Topology | None = None, check_races: bool = True) -> None:
    """`verify` without its array form: runs every op in Python, and words every error."""
    check_structure(schedule, topology)
    state, codec = _execute(schedule, check_races)
    _check_postcondition(schedule, state, codec)


def unreachable_pairs(topology: Topology, ranks: Iterable[int] | None = None) -> list[tuple[int, int]]:
    """Rank pairs (a, b) where no path of links leads from a's GPU to b's.

    Reachability goes through the strongly connected components: a connected cluster
    (the usual case) is one component and answers at once, where a search from every
    GPU would cost ranks x links (minutes at 2,000 GPUs)."""
    rs = list(range(topology.num_ranks)) if ranks is None else list(ranks)
    if mutually_reachable((topology.gpu(r).name for r in rs), (n.name for n in topology.nodes),
                          ((l.src, l.dst) for l in topology.links)):
        return []  # the usual case, answered without networkx (0.15-0.25 s to import)
    import networkx as nx  # heavy: only a cluster whose GPUs do not all reach each other gets here

    g = topology.to_networkx()
    condensed = nx.condensation(g)
    component = condensed.graph["mapping"]
    comp_of = {r: component[topology.gpu(r).name] for r in rs}
    if len(set(comp_of.values())) <= 1:
        return []
    reach = {c: nx.descendants(condensed, c) | {c} for c in set(comp_of.values())}
    return [(a, b) for a in rs for b in rs if a != b and comp_of[b] not in reach[comp_of[a]]]
