"""The standard library's ring algorithms (stdlib/algorithms/ring.coll) and its direct
AllToAll (stdlib/algorithms/direct.coll), built in Python.

Interpreting ring.coll costs tens of microseconds per op (every index expression is
evaluated by the tree-walking interpreter), and the ring AllReduce on 256 ranks has
196k ops. For the standard library's own definitions, `algorithm.instantiate` runs
these loops instead: the same statements in the same order, so the same ops, with the
same dependencies and steps (both derived by `_Program.add`) and the same origins (each
op points at the ring.coll statement it comes from). tests/stdlib interprets ring.coll
and compares, so the two cannot drift apart. A user's algorithm is always interpreted.

The direct AllToAll is the baseline every AllToAll compile is compared with: at 1,024
ranks it is a million ops, which the interpreter took minutes to build (and on a rail
cluster the verifier then refuses at its tenth op).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import repeat
from typing import Any

import numpy as np

from collc.frontend import ast
from collc.ir.collective import Collective
from collc.ir.schedule import Buffer, Loc, Op, OpKind, make_ops
from collc.verify.columns import BuiltColumns

I, O, S = Buffer.INPUT, Buffer.OUTPUT, Buffer.SCRATCH
COPY, REDUCE = OpKind.COPY, OpKind.REDUCE


def transfers(body: Sequence[ast.Stmt]) -> list[ast.Stmt]:
    """The `copy`/`reduce` (and `scratch`) statements of a body, in source order."""
    def walk(stmts: Sequence[ast.Stmt]) -> Iterator[ast.Stmt]:
        for s in stmts:
            if isinstance(s, (ast.Transfer, ast.ScratchDecl)):
                yield s
            elif isinstance(s, ast.For):
                yield from walk(s.body)
            elif isinstance(s, ast.If):
                yield from walk(s.then)
                yield from walk(s.orelse or ())
    return list(walk(body))


class _Emitter:
    """`_Program.add` for one-slot ops, with the same dependency rule (the last writer of
    the source and of the destination, and every reader of the destination since its
    last write) and step rule (one more than the latest dependency), at a fraction of
    its cost: slots are ints, steps a list, each `Loc` made once and shared by every op
    that names it, and ops built with `Op.make`. Ops go to `program.ops`; a builder uses
    either this or `program.add`, never both (their slot tables are separate)."""

    def __init__(self, program: Any, coll: Collective, scratch: int = 0):
        self.ops: list[Op] = program.ops
        assert not self.ops, "an emitter starts an empty program"
        self.steps: list[int] = []
        self.step_ints: list[int] = [0]
        # slot number = (rank x 3 + buffer) x width + index, width above every buffer's
        # size: dense, so the slot tables are lists (a dict of millions of int keys
        # would cost ten times the memory)
        self.width = max(coll.chunks * coll.ranks, scratch, *(len(b) for b in coll.inputs),
                         *(len(b) for b in coll.outputs)) + 1
        slots = 3 * coll.ranks * self.width
        self.last_writer: list[int | None] = [None] * slots
        self.readers: list[list[int] | None] = [None] * slots  # None: no reader since the last write
        self.locs: list[Loc | None] = [None] * slots

    def loc(self, key: int) -> Loc:
        loc = self.locs[key]
        if loc is None:
            rank, rest = divmod(key, 3 * self.width)
            buffer, index = divmod(rest, self.width)
            loc = self.locs[key] = Loc(rank, _BUFFER_ORDER[buffer], index)
        return loc

    def slot(self, rank: int, buffer: int, index: int) -> int:
        return (rank * 3 + buffer) * self.width + index

    def bases(self, ranks: int) -> tuple[list[int], list[int], list[int]]:
        """Slot number of index 0 of every rank's input, output and scratch buffer (a
        slot is `base[rank] + index`: no call per slot in the builders' loops)."""
        return tuple([self.slot(r, b, 0) for r in range(ranks)] for b in (_I, _O, _S))  # type: ignore[return-value]

    def add(self, kind: OpKind, src: int, dst: int, origin: Any) -> None:
        last_writer, readers, steps = self.last_writer, self.readers, self.steps
        deps = []
        w = last_writer[src]
        if w is not None:
            deps.append(w)
        w = last_writer[dst]
        if w is not None and w not in deps:
            deps.append(w)
        for r in readers[dst] or ():
            if r not in deps:
                deps.append(r)
        if deps:
            deps.sort()
            step = 1 + max([steps[d] for d in deps])
            if step < len(self.step_ints):
                step = self.step_ints[step]  # one int object per step number, not one per op
            else:
                self.step_ints.append(step)
        else:
            step = 0
        op_id = len(steps)
        steps.append(step)
        locs = self.locs
        self.ops.append(_make_op(op_id, kind, locs[src] or self.loc(src), locs[dst] or self.loc(dst), 1,
                                 tuple(deps), step, (), origin))
        last_writer[dst] = op_id
        readers[dst] = None
        got = readers[src]
        if got is None:
            readers[src] = [op_id]
        else:
            got.append(op_id)


class _Batches:
    """`_Emitter`'s rule applied to a batch of ops at once, with numpy: for the rings'
    inner loops (every (position, chunk) of one step of the ring is one batch), where
    a Python call per op costs seconds at 1,024 ranks.

    A batch is ops that do not conflict with each other: distinct destinations, and no
    source that is also a destination of the batch. Such ops give the same dependencies
    and steps whether run one by one or together. Batches may be added out of id order
    (a builder adds a loop's statements one batch each), as long as two ops of
    different batches that touch one slot are added in id order; the builders below
    only interleave statements that touch different slots. `finish` makes the `Op`s,
    in id order, and returns their columns for the verifier."""

    def __init__(self, program: Any, coll: Collective, total: int, scratch: int = 0):
        self.program = program
        assert not program.ops, "a batch emitter starts an empty program"
        self.width = max(coll.chunks * coll.ranks, scratch, *(len(b) for b in coll.inputs),
                         *(len(b) for b in coll.outputs)) + 1
        slots = 3 * coll.ranks * self.width
        self.total = total
        self.last_writer = np.full(slots, -1, dtype=np.int64)
        self.readers = np.full((slots, 2), -1, dtype=np.int64)  # since the last write; grows
        self.nreaders = np.zeros(slots, dtype=np.int64)
        self.step = np.zeros(total, dtype=np.int64)
        # Scratch marks for the batch check: the batch that last named a slot as a
        # destination, and that destination's position in it.
        self.batch_of = np.full(slots, -1, dtype=np.int64)
        self.place = np.zeros(slots, dtype=np.int64)
        self.parts: list[tuple[np.ndarray, int, np.ndarray, np.ndarray, np.ndarray, Any]] = []

    def bases(self, ranks: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Slot number of index 0 of every rank's input, output and scratch buffer."""
        r = np.arange(ranks, dtype=np.int64)
        return tuple((r * 3 + b) * self.width for b in (_I, _O, _S))  # type: ignore[return-value]

    def add(self, ids: np.ndarray, kind: OpKind, src: np.ndarray, dst: np.ndarray, origin: Any) -> None:
        m = len(ids)
        if m == 0:
            return
        token = len(self.parts)
        self.batch_of[dst] = token
        self.place[dst] = np.arange(m)
        if bool((self.place[dst] != np.arange(m)).any()) or bool((self.batch_of[src] == token).any()):
            raise AssertionError("ops of one batch conflict: a slot written twice, or read and written")
        width = 2 + self.readers.shape[1]
        deps = np.empty((m, width), dtype=np.int64)
        deps[:, 0] = self.last_writer[src]
        deps[:, 1] = self.last_writer[dst]
        deps[:, 2:] = self.readers[dst]
        deps.sort(axis=1)
        deps[:, 1:][deps[:, 1:] == deps[:, :-1]] = -1  # an op named twice counts once
        deps.sort(axis=1)  # -1 (none) first, then the dependencies in increasing order
        listed = deps >= 0
        steps = np.where(listed, self.step[deps], -1).max(axis=1) + 1
        self.step[ids] = steps
        self.last_writer[dst] = ids
        self.readers[dst] = -1
        self.nreaders[dst] = 0
        # The batch's ops join their sources' readers (several may read one source).
        by_src = np.argsort(src, kind="stable")
        s_sorted = src[by_src]
        first = np.concatenate(([0], np.flatnonzero(s_sorted[1:] != s_sorted[:-1]) + 1))
        rank_in_group = np.arange(m) - np.repeat(first, np.diff(np.append(first, m)))
        at = self.nreaders[s_sorted] + rank_in_group
        if int(at.max()) >= self.readers.shape[1]:
            grown = np.full((len(self.readers), int(at.max()) + 1), -1, dtype=np.int64)
            grown[:, :self.readers.shape[1]] = self.readers
            self.readers = grown
        self.readers[s_sorted, at] = ids[by_src]
        np.add.at(self.nreaders, s_sorted, 1)
        self.parts.append((ids, 1 if kind is REDUCE else 0, src, dst, deps, origin))

    def finish(self) -> "BuiltColumns":
        """Append the ops to the program, in id order; return their columns."""
        n = self.total
        ids = np.concatenate([p[0] for p in self.parts])
        if not np.array_equal(np.sort(ids), np.arange(n)):
            raise AssertionError("the batches do not cover the op ids once each")
        kind = np.zeros(n, dtype=np.int64)
        src = np.zeros(n, dtype=np.int64)
        dst = np.zeros(n, dtype=np.int64)
        origin_of = np.zeros(n, dtype=np.int64)
        origins: list[Any] = []
        width = max(p[4].shape[1] for p in self.parts)
        deps = np.full((n, width), -1, dtype=np.int64)
        for part_ids, k, s, d, dp, origin in self.parts:
            kind[part_ids], src[part_ids], dst[part_ids] = k, s, d
            deps[part_ids, width - dp.shape[1]:] = dp
            origin_of[part_ids] = len(origins)
            origins.append(origin)
        self.parts = []
        slots = len(self.last_writer)
        # The slot tables are done with: freed before the millions of objects are made.
        del self.last_writer, self.readers, self.nreaders, self.batch_of, self.place
        listed = deps >= 0
        ndeps = listed.sum(axis=1)
        # Python objects, made by C-level maps: one int object per op id (shared by the
        # dependency tuples that name it) and per step number, one Loc per slot.
        id_objects = list(range(n))
        dep_tuples: list[tuple[int, ...] | None] = [None] * n
        name = id_objects.__getitem__
        for k in range(width + 1):
            rows = np.flatnonzero(ndeps == k)
            if not len(rows):
                continue
            if k == 0:
                tuples: Any = repeat((), len(rows))
            else:
                tuples = zip(*(map(name, deps[rows, width - k + j].tolist()) for j in range(k)))
            list(map(dep_tuples.__setitem__, rows.tolist(), tuples))
        step_objects = list(range(int(self.step.max()) + 1))
        # The slots used, in slot order, and each one's position among them (a mark per
        # slot: np.unique of millions of slot numbers costs seconds).
        present = np.zeros(slots, dtype=bool)
        present[src] = True
        present[dst] = True
        used = np.flatnonzero(present)
        del present
        # Made in the order the ops first name them, so that a pass over the ops reads
        # the Locs roughly in memory order (as when each was made at its first use).
        first_use = np.full(slots, n, dtype=np.int64)
        op_ids = np.arange(n)
        np.minimum.at(first_use, dst, op_ids)
        np.minimum.at(first_use, src, op_ids)
        by_use = np.argsort(first_use[used], kind="stable")
        position = np.empty(slots, dtype=np.int64)
        position[used[by_use]] = np.arange(len(used))
        rank, rest = np.divmod(used[by_use], 3 * self.width)
        buffer, index = np.divmod(rest, self.width)
        # tuple.__new__ by a C-level map: Loc's own __new__ is a Python function.
        locs = list(map(tuple.__new__, repeat(Loc), zip(
            rank.tolist(), map(_BUFFER_ORDER.__getitem__, buffer.tolist()), index.tolist())))
        loc_at = locs.__getitem__
        self.program.ops.extend(make_ops(
            n, id_objects, map((COPY, REDUCE).__getitem__, kind.tolist()),
            map(loc_at, position[src].tolist()), map(loc_at, position[dst].tolist()),
            repeat(1), dep_tuples, map(step_objects.__getitem__, self.step.tolist()), repeat(()),
            map(origins.__getitem__, origin_of.tolist())))
        return BuiltColumns(ids=np.arange(n), step=self.step, kind=kind, src_rb=src // self.width,
                            src_idx=src % self.width, dst_rb=dst // self.width, dst_idx=dst % self.width,
                            ndeps=ndeps, deps=deps[listed])


_BUFFER_ORDER = (I, O, S)
_I, _O, _S = 0, 1, 2
_make_op = Op.make


def _ring_allgather(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    own, first, forward = (s.span for s in stmts)
    n, c = coll.ranks, coll.chunks
    out = _Batches(program, coll, n * c + (n - 1) * n * c)
    inp, outp, _ = out.bases(n)
    ranks = np.arange(n, dtype=np.int64)
    chunk = np.tile(np.arange(c, dtype=np.int64), n)  # i of each (r or p, i), in loop order
    per = np.repeat(ranks, c)
    out.add(np.arange(n * c), COPY, inp[per] + chunk, outp[per] + per * c + chunk, own)
    order = np.asarray(ring, dtype=np.int64)
    for s in range(n - 1):
        src, dst, owner = order[per], order[(per + 1) % n], order[(per - s) % n]
        j = owner * c + chunk
        ids = n * c + s * n * c + np.arange(n * c)
        if s == 0:
            out.add(ids, COPY, inp[src] + chunk, outp[dst] + j, first)
        else:
            out.add(ids, COPY, outp[src] + j, outp[dst] + j, forward)
    program.columns = out.finish()


def _ring_reducescatter(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    scratch, single, own_out, first_out, next_out, own_tmp, first_tmp, next_tmp = stmts
    n, c = coll.ranks, coll.chunks
    program.scratch, program.scratch_span = n * c, scratch.span
    if n == 1:
        program.add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single.span)
        return  # no other op: the ring loops below are empty
    per_step = n * c  # (p, i) pairs of one step, in loop order
    out = _Batches(program, coll, 2 * (n - 1) * per_step, scratch=n * c)
    inp, outp, tmp = out.bases(n)
    order = np.asarray(ring, dtype=np.int64)
    p = np.repeat(np.arange(n, dtype=np.int64), c)
    i = np.tile(np.arange(c, dtype=np.int64), n)
    k = np.arange(per_step, dtype=np.int64)
    # Each (s, p, i) copies the receiver's own chunk into the partial sum (its output
    # in the last step, where the receiver owns the block, else its scratch), then
    # reduces the sender's partial sum into it: ids 2k and 2k + 1 of the step. As in
    # the AllReduce's first half, a step's copies touch other slots than its
    # reductions of other (p, i), so they go in as one batch and the reductions as
    # another.
    for s in range(n - 1):
        src, dst = order[p], order[(p + 1) % n]
        j = order[(p - 1 - s) % n] * c + i
        last = s == n - 2  # the receiver is the block's owner (dst == b) exactly then
        acc = outp[dst] + i if last else tmp[dst] + j
        base = 2 * s * per_step
        out.add(base + 2 * k, COPY, inp[dst] + j, acc, own_out.span if last else own_tmp.span)
        if s == 0:
            out.add(base + 2 * k + 1, REDUCE, inp[src] + j, acc, first_out.span if last else first_tmp.span)
        else:
            out.add(base + 2 * k + 1, REDUCE, tmp[src] + j, acc, next_out.span if last else next_tmp.span)
    program.columns = out.finish()


def _ring_allreduce(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    single, own, first, reduce_next, forward = (s.span for s in stmts)
    n, c = coll.ranks, coll.chunks
    if n == 1:
        program.add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single)
        return  # no other op: the ring loops below are empty
    per_step = n * c  # (p, i) pairs of one step, in loop order
    out = _Batches(program, coll, 3 * (n - 1) * per_step)
    inp, outp, _ = out.bases(n)
    order = np.asarray(ring, dtype=np.int64)
    p = np.repeat(np.arange(n, dtype=np.int64), c)
    i = np.tile(np.arange(c, dtype=np.int64), n)
    k = np.arange(per_step, dtype=np.int64)
    # Reduce-scatter: each (s, p, i) copies the receiver's own chunk into its output,
    # then reduces the sender's partial sum into it (ids 2k and 2k + 1 of the step). The
    # copies of a step touch other slots than its reductions of other (p, i), so the
    # step's copies go in as one batch and its reductions as another.
    for s in range(n - 1):
        src, dst = order[p], order[(p + 1) % n]
        j = order[(p - 1 - s) % n] * c + i
        base = 2 * s * per_step
        out.add(base + 2 * k, COPY, inp[dst] + j, outp[dst] + j, own)
        if s == 0:
            out.add(base + 2 * k + 1, REDUCE, inp[src] + j, outp[dst] + j, first)
        else:
            out.add(base + 2 * k + 1, REDUCE, outp[src] + j, outp[dst] + j, reduce_next)
    # All-gather of the reduced chunks around the ring.
    for s in range(n - 1):
        src, dst = order[p], order[(p + 1) % n]
        j = order[(p - s) % n] * c + i
        out.add(2 * (n - 1) * per_step + s * per_step + k, COPY, outp[src] + j, outp[dst] + j, forward)
    program.columns = out.finish()


def _direct_alltoall(program: Any, coll: Collective, ring: Sequence[int] | None, stmts: list[ast.Stmt]) -> bool:
    """direct.coll: for s, r, i: copy in[s][r * chunks + i] -> out[r][s * chunks + i]. The
    ops touch distinct slots (each output slot written once, each input slot read
    once), so they are one batch: no dependencies, all at step 0. Not built (False,
    nothing added) where a buffer is not `ranks x chunks` slots: the interpreter then
    words the out-of-range error."""
    (copy,) = (s.span for s in stmts)
    n, c = coll.ranks, coll.chunks
    if any(len(b) != n * c for b in coll.inputs) or any(len(b) != n * c for b in coll.outputs):
        return False
    out = _Batches(program, coll, n * n * c)
    inp, outp, _ = out.bases(n)
    s = np.repeat(np.arange(n, dtype=np.int64), n * c)  # loop order: s, then r, then i
    r = np.tile(np.repeat(np.arange(n, dtype=np.int64), c), n)
    i = np.tile(np.arange(c, dtype=np.int64), n * n)
    out.add(np.arange(n * n * c), COPY, inp[s] + r * c + i, outp[r] + s * c + i, copy)
    program.columns = out.finish()
    return True


# A builder returns False where it does not apply to the collective (and has added
# nothing): the algorithm is interpreted then. None: built.
Builder = Callable[[Any, Collective, Sequence[int] | None, list[ast.Stmt]], bool | None]

# (module, algorithm, collective) -> builder, and the statement count it expects (a
# changed ring.coll or direct.coll falls back to the interpreter rather than mislabel ops).
BUILDERS: dict[tuple[str, str, str], tuple[Builder, int]] = {
    ("algorithms.ring", "ring", "allgather"): (_ring_allgather, 3),
    ("algorithms.ring", "ring", "reducescatter"): (_ring_reducescatter, 8),
    ("algorithms.ring", "ring", "allreduce"): (_ring_allreduce, 5),
    ("algorithms.direct", "direct", "alltoall"): (_direct_alltoall, 1),
}


def builder_for(stdlib_name: str | None, defn: ast.AlgorithmDef) -> tuple[Builder, list[ast.Stmt]] | None:
    found = BUILDERS.get((stdlib_name or "", defn.name, defn.collective))
    if found is None or defn.params:
        return None
    build, count = found
    stmts = transfers(defn.body)
    return (build, stmts) if len(stmts) == count else None
