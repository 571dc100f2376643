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
from collc.ir.schedule import Buffer, Loc, OpKind

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


def _ring_allgather(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    own, first, forward = (s.span for s in stmts)
    n, c, add = coll.ranks, coll.chunks, program.add
    for r in range(n):
        for i in range(c):
            add(COPY, Loc(r, I, i), Loc(r, O, r * c + i), 1, own)
    for s in range(n - 1):
        for p in range(n):
            src, dst, owner = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
            for i in range(c):
                j = owner * c + i
                if s == 0:
                    add(COPY, Loc(src, I, i), Loc(dst, O, j), 1, first)
                else:
                    add(COPY, Loc(src, O, j), Loc(dst, O, j), 1, forward)


def _ring_reducescatter(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    scratch, single, own_out, first_out, next_out, own_tmp, first_tmp, next_tmp = stmts
    n, c, add = coll.ranks, coll.chunks, program.add
    program.scratch, program.scratch_span = n * c, scratch.span
    if n == 1:
        add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single.span)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - 1 - s) % n]
            for i in range(c):
                j = b * c + i
                if dst == b:
                    add(COPY, Loc(dst, I, j), Loc(dst, O, i), 1, own_out.span)
                    if s == 0:
                        add(REDUCE, Loc(src, I, j), Loc(dst, O, i), 1, first_out.span)
                    else:
                        add(REDUCE, Loc(src, S, j), Loc(dst, O, i), 1, next_out.span)
                else:
                    add(COPY, Loc(dst, I, j), Loc(dst, S, j), 1, own_tmp.span)
                    if s == 0:
                        add(REDUCE, Loc(src, I, j), Loc(dst, S, j), 1, first_tmp.span)
                    else:
                        add(REDUCE, Loc(src, S, j), Loc(dst, S, j), 1, next_tmp.span)


def _ring_allreduce(program: Any, coll: Collective, ring: Sequence[int], stmts: list[ast.Stmt]) -> None:
    single, own, first, reduce_next, forward = (s.span for s in stmts)
    n, c, add = coll.ranks, coll.chunks, program.add
    if n == 1:
        add(COPY, Loc(0, I, 0), Loc(0, O, 0), c, single)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - 1 - s) % n]
            for i in range(c):
                j = b * c + i
                add(COPY, Loc(dst, I, j), Loc(dst, O, j), 1, own)
                if s == 0:
                    add(REDUCE, Loc(src, I, j), Loc(dst, O, j), 1, first)
                else:
                    add(REDUCE, Loc(src, O, j), Loc(dst, O, j), 1, reduce_next)
    for s in range(n - 1):
        for p in range(n):
            src, dst, b = ring[p], ring[(p + 1) % n], ring[(p - s) % n]
            for i in range(c):
                j = b * c + i
                add(COPY, Loc(src, O, j), Loc(dst, O, j), 1, forward)


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
