"""Lowering a hand-written algorithm to a verified `Schedule`.

Each `copy`/`reduce` statement run becomes one `Op` (moving as many slots as its
range names), in program order, with its statement as `origin`. Dependencies are
derived as MSCCLang does: an op depends on the last op that wrote any slot it reads,
and on the last writer and every reader since of any slot it writes. Its `step` is
one more than the latest step among its dependencies (0 without any), so ops that
could run together share a step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

from collc.diagnostics import CollcError, ScheduleError, Span
from collc.frontend import ast
from collc.frontend.evaluate import Evaluator, NotAValue, Scope, as_int, RankRangeError
from collc.frontend.module import Entry
from collc.frontend.rings import find_ring, find_tree
from collc.frontend.runner import BodyRunner, bind_args, called_from, instance_name, params_scope
from collc.ir.collective import Collective
from collc.ir.schedule import Buffer, Loc, Op, OpKind, Schedule
from collc.ir.topology import Topology
from collc.verify import verify

_BUFFERS = {ast.BufferToken.IN: Buffer.INPUT, ast.BufferToken.OUT: Buffer.OUTPUT,
            ast.BufferToken.SCRATCH: Buffer.SCRATCH}
_OP_KINDS = {ast.TransferKind.COPY: OpKind.COPY, ast.TransferKind.REDUCE: OpKind.REDUCE}

Slot = tuple[int, Buffer, int]


@dataclass
class _Program:
    collective: Collective
    scratch: int | None = None
    scratch_span: Span | None = None
    ops: list[Op] = field(default_factory=list)
    last_writer: dict[Slot, int] = field(default_factory=dict)
    readers: dict[Slot, list[int]] = field(default_factory=dict)
    columns: Any = None  # the ops as columns (collc.verify.columns.BuiltColumns), when a builder has them

    def buffer_size(self, rank: int, buffer: Buffer) -> int | None:
        if buffer is Buffer.INPUT:
            return len(self.collective.inputs[rank])
        if buffer is Buffer.OUTPUT:
            return len(self.collective.outputs[rank])
        return self.scratch

    def add(self, kind: OpKind, src: Loc, dst: Loc, count: int, origin: Span) -> None:
        deps: set[int] = set()
        # One-slot ops (nearly all of a ring) use the Locs themselves as slot keys: a Loc
        # hashes and compares as its (rank, buffer, index) tuple.
        src_slots = [src] if count == 1 else [(src.rank, src.buffer, src.index + k) for k in range(count)]
        dst_slots = [dst] if count == 1 else [(dst.rank, dst.buffer, dst.index + k) for k in range(count)]
        last_writer = self.last_writer
        for s in src_slots:
            w = last_writer.get(s)
            if w is not None:
                deps.add(w)
        for d in dst_slots:
            w = last_writer.get(d)
            if w is not None:
                deps.add(w)
            deps.update(self.readers.get(d, ()))
        ops = self.ops
        step = 1 + max((ops[d].step for d in deps), default=-1)
        op_id = len(self.ops)
        self.ops.append(Op(op_id, kind, src, dst, count, tuple(sorted(deps)), step, origin=origin))
        for d in dst_slots:
            self.last_writer[d] = op_id
            self.readers[d] = []
        for s in src_slots:
            self.readers.setdefault(s, []).append(op_id)


def _mentions(stmts: Sequence[ast.Stmt], name: str) -> bool:
    """Whether any expression in the body refers to `name`."""
    def walk(node: Any) -> Iterator[Any]:
        yield node
        if isinstance(node, (tuple, list)):
            for x in node:
                yield from walk(x)
        elif isinstance(node, ast.Syntax):
            for value in vars(node).values():
                if isinstance(value, (ast.Syntax, tuple)):
                    yield from walk(value)
    return any(isinstance(n, ast.Name) and n.id == name for n in walk(tuple(stmts)))


def instantiate(entry: Entry, topology: Topology, collective: Collective,
                args: Sequence[tuple[str | None, Any, Span]], call_span: Span | None,
                interpret: bool = False) -> Schedule:
    """The algorithm's verified schedule. The standard library's ring algorithms and its
    direct AllToAll are run by `stdlib_builders` (the same ops, faster); `interpret=True`
    interprets them anyway."""
    defn = entry.defn
    assert isinstance(defn, ast.AlgorithmDef)
    if defn.collective != collective.name:
        raise CollcError(f"algorithm '{defn.name}' implements {defn.collective}, not {collective.name}", call_span)
    if topology.num_ranks != collective.ranks:
        raise CollcError(f"{collective.name} is for {collective.ranks} ranks but topology '{topology.name}' has "
                         f"{topology.num_ranks} GPUs", call_span)
    ev = Evaluator()
    base = entry.module.constants.child()
    base.define("ranks", collective.ranks, None)
    base.define("chunks", collective.chunks, None)
    base.define("root", collective.root if collective.root is not None
                else NotAValue(f"collective {collective.name} has no root"), None)
    ring = find_ring(topology) if _mentions(defn.body, "ring") else None
    base.define("ring", ring if ring is not None else NotAValue("ring is not computed here"), None)
    tree = None
    if _mentions(defn.body, "tree_order") or _mentions(defn.body, "tree_parent"):
        if collective.root is None:
            raise CollcError(f"tree_order and tree_parent need a root, and {collective.name} has none", call_span)
        tree = find_tree(topology, collective.root)
    base.define("tree_order", tree[0] if tree else NotAValue("tree_order is not computed here"), None)
    base.define("tree_parent", tree[1] if tree else NotAValue("tree_parent is not computed here"), None)
    bound = bind_args(defn, args, call_span, base, ev)
    program = _Program(collective)
    scope = params_scope(base, defn, bound)
    built = None
    if not interpret and entry.is_stdlib:
        # The builders work on numpy arrays, whose import costs about 0.1 s: loaded where
        # a standard library algorithm is instantiated, not by every command that loads
        # the front end (`collc check` of a pipeline file needs no numpy at all).
        from collc.frontend.stdlib_builders import builder_for

        built = builder_for(entry.module.stdlib_name, defn)
    with called_from(f"algorithm {defn.name} for {collective.name} on {topology.name}", call_span):
        if built is None or built[0](program, collective, ring, built[1]) is False:
            _AlgorithmRunner(ev, program).run(defn.body, scope.child())
    scratch = () if program.scratch is None else (program.scratch,) * collective.ranks
    meta: dict[str, Any] = {"source": "algorithm", "algorithm": defn.name, "module": entry.where,
                            "stdlib": entry.is_stdlib}
    if ring is not None:
        meta["ring"] = list(ring)
    if tree is not None:
        meta["tree_parent"] = list(tree[1])
    schedule = Schedule(instance_name(defn, bound), collective, topology.name, tuple(program.ops), scratch, meta)
    if program.columns is not None:
        from collc.verify.columns import remember_columns  # numpy's module: see the builders' import above

        remember_columns(schedule, program.columns)  # the verifier reads them instead of the ops
    _verify(schedule, topology, defn)
    return schedule


def _verify(schedule: Schedule, topology: Topology, defn: ast.AlgorithmDef) -> None:
    where = f"checking algorithm '{defn.name}' for {defn.collective} on {topology.name}"
    try:
        verify(schedule, topology)
    except ScheduleError as err:
        if err.span is not None:
            raise ScheduleError(err.message, err.span, err.notes + (where,)) from None
        header = Span(defn.span.file, defn.span.line, defn.span.column, defn.collective_span.end_line,
                      defn.collective_span.end_column)
        raise ScheduleError(err.message, header,
                            err.notes + ("no statement of this algorithm writes that slot", where)) from None


class _AlgorithmRunner(BodyRunner):
    def __init__(self, ev: Evaluator, program: _Program):
        super().__init__(ev)
        self.program = program

    def statement(self, stmt: ast.Stmt, scope: Scope) -> None:
        if isinstance(stmt, ast.ScratchDecl):
            if self.program.scratch_span is not None:
                raise CollcError(f"scratch is declared twice (first at {self.program.scratch_span})", stmt.span)
            n = as_int(self.ev.eval(stmt.count, scope), stmt.count.span, "the scratch size")
            if n < 1:
                raise CollcError(f"the scratch size must be at least 1 slot per rank, got {n}", stmt.count.span)
            self.program.scratch, self.program.scratch_span = n, stmt.span
        elif isinstance(stmt, ast.Transfer):
            self._transfer(stmt, scope)
        else:
            super().statement(stmt, scope)

    def _transfer(self, stmt: ast.Transfer, scope: Scope) -> None:
        src, src_count = self._loc(stmt.src, scope)
        dst, dst_count = self._loc(stmt.dst, scope)
        if src_count != dst_count:
            raise CollcError(f"the source names {src_count} slot{'s' if src_count != 1 else ''} but the "
                             f"destination {dst_count}", stmt.span)
        if src.rank == dst.rank and src.buffer is dst.buffer and \
                src.index < dst.index + dst_count and dst.index < src.index + src_count:
            raise CollcError(f"this {stmt.kind.value}s {src} onto itself", stmt.span)
        self.program.add(_OP_KINDS[stmt.kind], src, dst, src_count, stmt.span)

    def _loc(self, loc: ast.Loc, scope: Scope) -> tuple[Loc, int]:
        coll = self.program.collective
        rank = as_int(self.ev.eval(loc.rank, scope), loc.rank.span, "a rank")
        if not 0 <= rank < coll.ranks:
            raise RankRangeError(f"rank {rank} is out of range: there are {coll.ranks} ranks "
                             f"(0 to {coll.ranks - 1})", loc.rank.span)
        buffer = _BUFFERS[loc.buffer]
        size = self.program.buffer_size(rank, buffer)
        if size is None:
            raise CollcError("scratch is used but its size is not declared: add `scratch N;` first", loc.span)
        index = self.ev.eval(loc.index, scope)
        if isinstance(index, range):
            start, count = index.start, len(index)
            if count < 1:
                raise CollcError(f"the range {index.start}..{index.stop} names no slots", loc.index.span)
        else:
            start, count = as_int(index, loc.index.span, "a slot index"), 1
        if start < 0 or start + count > size:
            shown = f"{start}" if count == 1 else f"{start}..{start + count}"
            raise CollcError(f"{loc.buffer.value}[{rank}][{shown}] is out of range: rank {rank} has {size} "
                             f"{buffer.label} slot{'s' if size != 1 else ''}", loc.index.span)
        return Loc(rank, buffer, start), count
