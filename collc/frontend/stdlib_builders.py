"""The standard library's ring algorithms (stdlib/algorithms/ring.coll), built in Python.

Interpreting ring.coll costs tens of microseconds per op (every index expression is
evaluated by the tree-walking interpreter), and the ring AllReduce on 256 ranks has
196k ops. For the standard library's own definitions, `algorithm.instantiate` runs
these loops instead: the same statements in the same order, so the same ops, with the
same dependencies and steps (both derived by `_Program.add`) and the same origins (each
op points at the ring.coll statement it comes from). tests/stdlib interprets ring.coll
and compares, so the two cannot drift apart. A user's algorithm is always interpreted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from collc.frontend import ast
from collc.ir.collective import Collective
from collc.ir.schedule import Buffer, Loc, Op, OpKind

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


_BUFFER_ORDER = (I, O, S)
_I, _O, _S = 0, 1, 2
_make_op = Op.make


def _ring_allgather(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    own, first, forward = (s.span for s in stmts)
    n, c = coll.ranks, coll.chunks
    out = _Emitter(program, coll)
    add, (inp, outp, _) = out.add, out.bases(n)
    for r in range(n):
        for i in range(c):
            add(COPY, inp[r] + i, outp[r] + r * c + i, own)
    for s in range(n - 1):
        for p in range(n):
            src, dst, owner = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
            for i in range(c):
                j = owner * c + i
                if s == 0:
                    add(COPY, inp[src] + i, outp[dst] + j, first)
                else:
                    add(COPY, outp[src] + j, outp[dst] + j, forward)


def _ring_reducescatter(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    scratch, single, own_out, first_out, next_out, own_tmp, first_tmp, next_tmp = stmts
    n, c = coll.ranks, coll.chunks
    program.scratch, program.scratch_span = n * c, scratch.span
    if n == 1:
        program.add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single.span)
        return  # no other op: the ring loops below are empty
    out = _Emitter(program, coll, n * c)
    add, (inp, outp, tmp) = out.add, out.bases(n)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - 1 - s) % n]
            for i in range(c):
                j = b * c + i
                if dst == b:
                    add(COPY, inp[dst] + j, outp[dst] + i, own_out.span)
                    if s == 0:
                        add(REDUCE, inp[src] + j, outp[dst] + i, first_out.span)
                    else:
                        add(REDUCE, tmp[src] + j, outp[dst] + i, next_out.span)
                else:
                    add(COPY, inp[dst] + j, tmp[dst] + j, own_tmp.span)
                    if s == 0:
                        add(REDUCE, inp[src] + j, tmp[dst] + j, first_tmp.span)
                    else:
                        add(REDUCE, tmp[src] + j, tmp[dst] + j, next_tmp.span)


def _ring_allreduce(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    single, own, first, reduce_next, forward = (s.span for s in stmts)
    n, c = coll.ranks, coll.chunks
    if n == 1:
        program.add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single)
        return  # no other op: the ring loops below are empty
    out = _Emitter(program, coll)
    add, (inp, outp, _) = out.add, out.bases(n)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - 1 - s) % n]
            for i in range(c):
                j = b * c + i
                add(COPY, inp[dst] + j, outp[dst] + j, own)
                if s == 0:
                    add(REDUCE, inp[src] + j, outp[dst] + j, first)
                else:
                    add(REDUCE, outp[src] + j, outp[dst] + j, reduce_next)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
            for i in range(c):
                j = b * c + i
                add(COPY, outp[src] + j, outp[dst] + j, forward)


Builder = Callable[[Any, Collective, Sequence[int], list[ast.Stmt]], None]

# (module, algorithm, collective) -> builder, and the statement count it expects (a
# changed ring.coll falls back to the interpreter rather than mislabel ops).
BUILDERS: dict[tuple[str, str, str], tuple[Builder, int]] = {
    ("algorithms.ring", "ring", "allgather"): (_ring_allgather, 3),
    ("algorithms.ring", "ring", "reducescatter"): (_ring_reducescatter, 8),
    ("algorithms.ring", "ring", "allreduce"): (_ring_allreduce, 5),
}


def builder_for(stdlib_name: str | None, defn: ast.AlgorithmDef) -> tuple[Builder, list[ast.Stmt]] | None:
    found = BUILDERS.get((stdlib_name or "", defn.name, defn.collective))
    if found is None or defn.params:
        return None
    build, count = found
    stmts = transfers(defn.body)
    return (build, stmts) if len(stmts) == count else None
