"""Symbolic verification on arrays, a step at a time: the fast path of `verify`.

`collc.verify.symbolic.verify` runs a schedule op by op in Python (a few microseconds
an op: about 17 s for the 3.1 million ops of a ring AllReduce on 1,024 ranks). For the
common shape (ids that are list positions, and every slot's value a set of chunks of one index, which covers the standard collectives)
the same checks run here on numpy arrays:

- structure: dependencies earlier in the list and at an earlier step, slots inside
  their buffers, no writes to inputs or unused outputs, transfers between GPUs that a
  path through switches and NICs joins; a transfer with an explicit route (every
  steady-state schedule's) follows links from its source GPU to its destination GPU
  through no other GPU, checked once per distinct route (a schedule has few: tens of
  thousands of transfers on dgx1 share 32);
- races: the accesses of each slot sorted by step; two of one step where one writes
  would be a race; otherwise every access must depend directly on the slot's previous
  write, and every write directly on the reads since that write (the verifier's rule,
  which also accepts orders implied through other ops: those are left to it);
- values: a slot's value is (chunk index, bit set of ranks) with the bits in uint64
  words; a step's ops read the values before the step and then write, which is exact
  since nothing of one step conflicts; a reduction must join disjoint sets of one
  index, and the outputs must end equal to the postcondition.

`verify_on_arrays` returns True only when every check passes. Anything else (an error,
or a shape this path does not handle) returns False, and the caller runs the op-by-op
verifier, which decides and words the error: error messages are the verifier's alone.
"""

from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter, is_not

import numpy as np

from collc.ir.schedule import Schedule
from collc.ir.topology import NodeKind, Topology
from collc.verify.columns import OpColumns, columns_of, sort_order


def verify_on_arrays(schedule: Schedule, topology: Topology | None) -> bool:
    """True when the schedule certainly verifies (with its race check) on `topology`;
    False when it does not, or when this path cannot tell."""
    coll = schedule.collective
    ranks, n = coll.ranks, len(schedule.ops)
    if n == 0 or (topology is not None and topology.num_ranks != ranks):
        return False
    routes: dict[tuple[str, ...], int] = {}
    # Kept (where it has no routes): a lowering pass's re-verification reads them again.
    cols = columns_of(schedule, keep=True, routes=routes)
    if bool((cols.count < 1).any()) or not np.array_equal(cols.ids, np.arange(n)):
        return False  # an op of no slots, ids that are not positions
    if int(cols.count.sum()) > min(SLOTS_PER_OP * n, MOST_ACCESSES):
        return False  # ops of long ranges: the op-by-op run holds a range as one item
    edges = cols.edges()
    if edges is None:
        return False
    op_of_edge, dep = edges
    step = cols.step
    if bool((dep >= op_of_edge).any()) or bool((step[dep] >= step[op_of_edge]).any()):
        return False
    slots = _slot_numbers(schedule, cols, topology, routes)
    if slots is None:
        return False
    src, dst, total = slots
    reduce = (cols.kind_route & 1) == 1  # kind_route is route code x 2 + kind
    # One access per slot moved: an op of c slots is c accesses of its step, by it.
    who, src, dst = _per_slot(cols.count, src, dst)
    if who is not None:
        step, reduce = step[who], reduce[who]
    del cols, edges  # hundreds of MB at 1,024 ranks: keep only what the runs below read
    if not _race_free(src, dst, step, _DepTable(op_of_edge, dep, n), who):
        return False
    del op_of_edge, dep
    return _values_meet_postcondition(schedule, src, dst, reduce, step, total)


def _per_slot(count: np.ndarray, src: np.ndarray, dst: np.ndarray
              ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    """(the op of each slot access, their source and destination slot numbers) for ops
    of `count` slots from `src` and to `dst` (their first slots); the op column is None
    where every op moves one slot (the accesses are then the ops)."""
    if bool((count == 1).all()):
        return None, src, dst
    who = np.repeat(np.arange(len(count)), count)
    offset = np.arange(len(who)) - np.repeat(np.cumsum(count) - count, count)
    return who, src[who] + offset, dst[who] + offset


def _slot_numbers(schedule: Schedule, cols: OpColumns, topology: Topology | None,
                  routes: dict[tuple[str, ...], int]) -> tuple[np.ndarray, np.ndarray, int] | None:
    """Every op's source and destination as slot numbers (each rank's input, output and
    scratch one after another), after the range, writability, reach and route checks
    (`routes`: each route's code in `cols`); None when one fails."""
    coll = schedule.collective
    ranks = coll.ranks
    sizes = np.array([[len(coll.inputs[r]), len(coll.outputs[r]), schedule.scratch_slots(r)] for r in range(ranks)],
                     dtype=np.int64).reshape(-1)
    base = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    out = []
    for rb, idx in ((cols.src_rb, cols.src_idx), (cols.dst_rb, cols.dst_idx)):
        if bool((rb < 0).any()) or bool((rb >= 3 * ranks).any()) or bool((idx < 0).any()):
            return None
        if bool((idx + cols.count > sizes[rb]).any()):
            return None  # the op's last slot is past its buffer's end
        out.append(base[rb] + idx)
    dst_buf = cols.dst_rb % 3
    if bool((dst_buf == 0).any()):
        return None  # writes an input
    unused = np.array([all(v is None for v in buf) for buf in coll.outputs], dtype=bool)
    if bool((unused[cols.dst_rb // 3] & (dst_buf == 1)).any()):
        return None  # writes the output of a rank that has none
    if topology is not None and not _transfers_follow_links(cols, topology, routes):
        return None
    return out[0], out[1], int(sizes.sum())


def _transfers_follow_links(cols: OpColumns, topology: Topology, routes: dict[tuple[str, ...], int]) -> bool:
    """The verifier's link checks: a routed transfer follows its route (checked once
    per route, then by the route's end ranks), an unrouted one joins GPUs that a path
    through switches and NICs joins. Ops within one rank are not checked (as there)."""
    ranks = topology.num_ranks
    a, b = cols.src_rb // 3, cols.dst_rb // 3
    moved = a != b
    code = cols.kind_route >> 1  # 0: no route
    routed = moved & (code > 0)
    if bool(routed.any()):
        ends = _route_ends(topology, routes)  # row per code: (first rank, last rank), -1 if invalid
        first, last = ends[code[routed], 0], ends[code[routed], 1]
        if bool((first < 0).any()) or not (np.array_equal(first, a[routed]) and np.array_equal(last, b[routed])):
            return False
    direct = moved & (code == 0)
    if bool(direct.any()):
        joined = np.zeros((ranks, ranks), dtype=bool)
        for r, reach in topology.direct_reach.items():
            joined[r, list(reach)] = True
        if not bool(joined[a[direct], b[direct]].all()):
            return False
    return True


def _route_ends(topology: Topology, routes: dict[tuple[str, ...], int]) -> np.ndarray:
    """Per route code (row 0 unused): the ranks of the route's first and last GPU where
    the route is valid (each hop a link, no GPU between its ends), else (-1, -1)."""
    ends = np.full((len(routes) + 1, 2), -1, dtype=np.int64)
    links = topology.link_map
    for route, code in routes.items():
        if len(route) < 2 or not all(map(topology.has_node, route)):
            continue
        nodes = [topology.node(name) for name in route]
        if (nodes[0].kind is not NodeKind.GPU or nodes[-1].kind is not NodeKind.GPU
                or any(node.kind is NodeKind.GPU for node in nodes[1:-1])
                or not all((u, v) in links for u, v in zip(route, route[1:]))):
            continue
        ends[code] = (nodes[0].rank, nodes[-1].rank)
    return ends


class _DepTable:
    """Each op's dependencies as one row of a matrix (padded with -1): whether (op, dep)
    is a dependency is a comparison with a few entries, not a search of millions."""

    def __init__(self, op_of_edge: np.ndarray, dep: np.ndarray, n: int):
        counts = np.bincount(op_of_edge, minlength=n)
        width = max(1, int(counts.max()) if len(counts) else 1)
        self.rows = np.full((n, width), -1, dtype=np.int64)
        # Edges come grouped by op (from the columns' order): each one's place in its row.
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        self.rows[op_of_edge, np.arange(len(dep)) - starts[op_of_edge]] = dep

    def has(self, ops: np.ndarray, deps: np.ndarray) -> np.ndarray:
        out = np.zeros(len(ops), dtype=bool)
        for lo in range(0, len(ops), _BLOCK):
            o, d = ops[lo:lo + _BLOCK], deps[lo:lo + _BLOCK]
            out[lo:lo + _BLOCK] = (self.rows[o] == d[:, None]).any(axis=1)
        return out


def _race_free(src: np.ndarray, dst: np.ndarray, step: np.ndarray, table: _DepTable, op: np.ndarray | None) -> bool:
    """Every two accesses of a slot where one writes are ordered by a direct dependency
    (see the module docstring); False also for orders this path does not search. `op`:
    the op of each access (None: access i is op i). An op whose source and destination
    overlap reads and writes one slot in its step: False, left to the op-by-op run."""
    n = len(src)
    op = np.arange(n) if op is None else op
    slot = np.concatenate((src, dst))
    when = np.concatenate((step, step))
    who = np.concatenate((op, op))
    writes = np.concatenate((np.zeros(n, dtype=bool), np.ones(n, dtype=bool)))
    order = sort_order([slot, when, writes.astype(np.int64)])
    slot, when, who, writes = slot[order], when[order], who[order], writes[order]
    m = len(slot)
    same = slot[1:] == slot[:-1]
    if bool((same & (when[1:] == when[:-1]) & (writes[1:] | writes[:-1])).any()):
        return False  # a write and another access of one slot in one step
    # The last write before each access (entries of one slot are contiguous, in step order).
    last = np.maximum.accumulate(np.where(writes, np.arange(m), -1))
    prev = np.concatenate(([-1], last[:-1]))
    has = prev >= 0
    has[has] = slot[prev[has]] == slot[has]
    if not bool(table.has(who[has], who[prev[has]]).all()):
        return False
    # Each read and the next write of its slot.
    nxt_all = np.minimum.accumulate(np.where(writes, np.arange(m), m)[::-1])[::-1]
    nxt = np.concatenate((nxt_all[1:], [m]))
    reads = ~writes & (nxt < m)
    reads[reads] = slot[nxt[reads]] == slot[reads]
    return bool(table.has(who[nxt[reads]], who[reads]).all())


def _values_meet_postcondition(schedule: Schedule, src: np.ndarray, dst: np.ndarray, reduce: np.ndarray,
                               step: np.ndarray, total: int) -> bool:
    coll = schedule.collective
    words = (coll.ranks + 63) // 64
    index = np.full(total, -1, dtype=np.int64)  # -1: the slot holds nothing
    bits = np.zeros((total, words), dtype=np.uint64)
    if not _set_inputs(coll, schedule, index, bits):
        return False
    order = np.argsort(step, kind="stable")
    bounds = np.flatnonzero(np.diff(step[order])) + 1
    for ops in np.split(order, bounds):
        s, d, red = src[ops], dst[ops], reduce[ops]
        got = index[s]
        if bool((got < 0).any()):
            return False  # reads a slot that holds nothing
        got_bits = bits[s]
        if bool(red.any()):
            rd, rs = d[red], got_bits[red]
            if bool((index[rd] != got[red]).any()):
                return False  # holds nothing, or chunks of another index (left to the op-by-op run)
            if bool((bits[rd] & rs).any()):
                return False  # a chunk counted twice
            got_bits[red] = bits[rd] | rs
        index[d] = got
        bits[d] = got_bits
    return _outputs_equal(coll, schedule, index, bits)


_RANK_OF, _INDEX_OF = attrgetter("rank"), attrgetter("index")


def _one_index(value) -> tuple[int, np.ndarray] | None:
    """(index, ranks) of a value whose chunks share one index; None otherwise."""
    indices = set(map(_INDEX_OF, value))
    if len(indices) != 1:
        return None
    return indices.pop(), np.fromiter(map(_RANK_OF, value), dtype=np.int64, count=len(value))


class _Values:
    """Distinct values (by object: the collectives share equal values) as (index, bits
    rows), and which of them each slot has. The one-chunk values (every input of the
    standard collectives: n^2 of them for an AllReduce) are read by C-level maps and
    kept as their rank (their bit rows are made a block at a time, by `rows`)."""

    def __init__(self, values: list, words: int):
        ids = np.fromiter(map(id, values), dtype=np.int64, count=len(values))
        _, first, self.which = np.unique(ids, return_index=True, return_inverse=True)
        self.which = self.which.reshape(-1)
        self.ok = True
        self.words = words
        self.index = np.zeros(len(first), dtype=np.int64)
        self.rank = np.full(len(first), -1, dtype=np.int64)  # a one-chunk value's rank
        self.multi_row = np.full(len(first), -1, dtype=np.int64)  # else its row of `bits`
        self.bits = np.zeros((0, words), dtype=np.uint64)
        distinct = list(map(values.__getitem__, first.tolist()))
        if None in distinct:
            self.ok = False
            return
        sizes = np.fromiter(map(len, distinct), dtype=np.int64, count=len(distinct))
        if bool((sizes == 0).any()):
            self.ok = False
            return
        singles = np.flatnonzero(sizes == 1)
        if len(singles):
            chunks = list(map(next, map(iter, map(distinct.__getitem__, singles.tolist()))))
            self.index[singles] = np.fromiter(map(_INDEX_OF, chunks), dtype=np.int64, count=len(chunks))
            self.rank[singles] = np.fromiter(map(_RANK_OF, chunks), dtype=np.int64, count=len(chunks))
        multi = np.flatnonzero(sizes > 1)
        self.multi_row[multi] = np.arange(len(multi))
        self.bits = np.zeros((len(multi), words), dtype=np.uint64)
        for row, k in enumerate(multi.tolist()):
            found = _one_index(distinct[k])
            if found is None:
                self.ok = False
                return
            self.index[k] = found[0]
            ranks = found[1]
            np.bitwise_or.at(self.bits[row], ranks // 64, np.left_shift(np.uint64(1), (ranks % 64).astype(np.uint64)))

    def rows(self, which: np.ndarray) -> np.ndarray:
        """The bit rows of the distinct values `which`."""
        out = np.zeros((len(which), self.words), dtype=np.uint64)
        multi = self.multi_row[which]
        has = multi >= 0
        out[has] = self.bits[multi[has]]
        rank = self.rank[which]
        one = np.flatnonzero(rank >= 0)
        r = rank[one]
        out[one, r // 64] = np.left_shift(np.uint64(1), (r % 64).astype(np.uint64))
        return out


# Ops of several slots are checked here slot by slot (a rail AllToAll's rows of 8
# blocks: about 10 M accesses at 1,024 GPUs); ops of long ranges are left to the op-by-op
# run, whose cost does not grow with a range's length: an AllReduce composed over 128
# nodes, whose node-level transfers move whole ranges, needed over 23 GiB here.
SLOTS_PER_OP = 16
MOST_ACCESSES = 16_000_000
_BLOCK = 1 << 17  # slots compared at once (bounds the temporaries at 1,024 ranks)


def _layout(coll, schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Slot number of index 0 of every rank's input and output."""
    sizes = np.array([[len(coll.inputs[r]), len(coll.outputs[r]), schedule.scratch_slots(r)]
                      for r in range(coll.ranks)], dtype=np.int64).reshape(-1)
    base = np.concatenate(([0], np.cumsum(sizes)[:-1])).reshape(-1, 3)
    return base[:, 0], base[:, 1]


def _slots_of(buffers, base: np.ndarray) -> np.ndarray:
    return np.concatenate([base[r] + np.arange(len(buf), dtype=np.int64) for r, buf in enumerate(buffers)])


def _set_inputs(coll, schedule: Schedule, index: np.ndarray, bits: np.ndarray) -> bool:
    values = list(chain.from_iterable(coll.inputs))
    if not values:
        return True
    distinct = _Values(values, bits.shape[1])  # not ok where a value is empty
    if not distinct.ok:
        return False
    at = _slots_of(coll.inputs, _layout(coll, schedule)[0])
    index[at] = distinct.index[distinct.which]
    for lo in range(0, len(at), _BLOCK):
        bits[at[lo:lo + _BLOCK]] = distinct.rows(distinct.which[lo:lo + _BLOCK])
    return True


def _outputs_equal(coll, schedule: Schedule, index: np.ndarray, bits: np.ndarray) -> bool:
    """Every output slot with a required value holds exactly that value."""
    values = list(chain.from_iterable(coll.outputs))
    if not values:
        return True
    distinct = _Values(values, bits.shape[1])
    if not distinct.ok:
        return False
    at = _slots_of(coll.outputs, _layout(coll, schedule)[1])
    wanted = np.fromiter(map(is_not, values, repeat(None)), dtype=bool, count=len(values))
    at, which = at[wanted], distinct.which[wanted]
    if not np.array_equal(index[at], distinct.index[which]):
        return False
    for lo in range(0, len(at), _BLOCK):
        if not np.array_equal(bits[at[lo:lo + _BLOCK]], distinct.rows(which[lo:lo + _BLOCK])):
            return False
    return True
