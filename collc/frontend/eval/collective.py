"""Applying a collective definition to a number of ranks: the IR `Collective`.

A collective states each rank's buffer sizes (`input N; output M;`), what the output
must hold (`post out[r][j] = chunk(s, i);`, reductions with `sum(...)` or `+`), and
optionally demands whose slots are allocated for it (`deliver chunk(0, 1) to {1, 2};`
takes the lowest free output slot of each rank). Input slot i of rank r holds
chunk(r, i) unless a `pre` statement says otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.evaluate import Evaluator, Scope, as_int, RankRangeError
from collc.frontend.module import Entry
from collc.frontend.runner import BodyRunner, bind_args, called_from, params_scope
from collc.frontend.values import Chunks, format_value, type_word
from collc.ir.collective import ChunkId, Collective, CollectiveKind, Value, standard, value_str
from collc.limits import exceeded, int_limit

ROOTED = {CollectiveKind.BROADCAST, CollectiveKind.REDUCE, CollectiveKind.GATHER, CollectiveKind.SCATTER}


@dataclass
class _Slot:
    value: frozenset[ChunkId]
    span: Span  # the statement that set it
    value_span: Span


@dataclass
class _State:
    ranks: int
    input_size: int | None = None
    input_span: Span | None = None
    output_size: int | None = None
    output_span: Span | None = None
    pre: dict[tuple[int, int], _Slot] = field(default_factory=dict)
    post: dict[tuple[int, int], _Slot] = field(default_factory=dict)


Args = Sequence[tuple[str | None, Any, Span]]
Inputs = tuple[tuple[Value, ...], ...]
Outputs = tuple[tuple[Value | None, ...], ...]


def instantiate(entry: Entry, ranks: int, args: Args, call_span: Span | None,
                interpret: bool = False) -> Collective:
    """The collective at `ranks` ranks. The standard library's definitions of the standard
    collectives are not interpreted but built by `collc.ir.collective.standard` (equal
    objects, checked by tests/stdlib; interpreting them costs a postcondition evaluation
    per slot and contribution); `interpret=True` runs the definition anyway."""
    defn = entry.defn
    if ranks < 1:
        raise CollcError(f"a collective needs at least one rank, got {ranks}", call_span)
    if ranks > int_limit("ranks"):
        raise CollcError(f"a collective on {ranks:,} ranks is too large" + exceeded("ranks"), call_span)
    state = _State(ranks)
    ev = Evaluator(functions={"chunk": _chunk_builtin(ranks)})
    base = entry.module.constants.child()
    base.define("ranks", ranks, None)
    bound = bind_args(defn, args, call_span, base, ev)
    params = {p.name for p in defn.params}
    chunks_arg = None
    if "chunks" in params:
        chunks_arg = as_int(bound.values["chunks"], bound.spans["chunks"], "chunks")
        if chunks_arg < 1:
            raise CollcError(f"chunks must be at least 1, got {chunks_arg}", bound.spans["chunks"])
    root = None
    if "root" in params:
        root = as_int(bound.values["root"], bound.spans["root"], "root")
        if not 0 <= root < ranks:
            raise RankRangeError(f"root {root} is out of range: there are {ranks} ranks (0 to {ranks - 1})",
                             bound.spans["root"])
    built = None if interpret else _built(entry, ranks, chunks_arg, root)
    if built is not None:
        return built
    scope = params_scope(base, defn, bound)
    with called_from(f"collective {defn.name} at {ranks} ranks", call_span):
        _CollectiveRunner(ev, state).run(defn.body, scope.child())
        inputs, outputs = _buffers(defn, state)
    in_size = len(inputs[0])
    coll = Collective(defn.name, CollectiveKind.CUSTOM, ranks, chunks_arg if chunks_arg is not None else in_size,
                      inputs, outputs, root)
    return _with_kind(coll, entry)


def _built(entry: Entry, ranks: int, chunks: int | None, root: int | None) -> Collective | None:
    """The IR builder's collective for a standard library definition of a standard
    collective (whose parameters are exactly chunks, and root for the rooted ones)."""
    if not entry.is_stdlib:
        return None
    try:
        kind = CollectiveKind(entry.defn.name)
    except ValueError:
        return None
    if kind is CollectiveKind.CUSTOM or chunks is None or (kind in ROOTED) != (root is not None):
        return None
    return standard(kind, ranks, chunks, root or 0)


def _with_kind(coll: Collective, entry: Entry) -> Collective:
    """The standard kind named like the collective: taken on trust for the standard library,
    checked against the IR's builder for a user's definition."""
    try:
        kind = CollectiveKind(coll.name)
    except ValueError:
        return coll
    if kind is CollectiveKind.CUSTOM:
        return coll
    named = Collective(coll.name, kind, coll.ranks, coll.chunks, coll.inputs, coll.outputs, coll.root)
    if entry.is_stdlib:
        return named
    if (kind in ROOTED) != (coll.root is not None):
        return coll
    reference = standard(kind, coll.ranks, coll.chunks, coll.root or 0)
    if reference.inputs == coll.inputs and reference.outputs == coll.outputs:
        return named
    return coll


def _chunk_builtin(ranks: int):
    def chunk(args: list, spans: list[Span], span: Span) -> Chunks:
        if len(args) != 2:
            raise CollcError(f"chunk() takes 2 arguments (rank, index), got {len(args)}", span)
        r = as_int(args[0], spans[0], "the rank of a chunk")
        i = as_int(args[1], spans[1], "the index of a chunk")
        if not 0 <= r < ranks:
            raise RankRangeError(f"rank {r} is out of range: there are {ranks} ranks (0 to {ranks - 1})", spans[0])
        if i < 0:
            raise CollcError(f"a chunk index cannot be negative, got {i}", spans[1])
        return Chunks(frozenset({ChunkId(r, i)}))
    return chunk


class _CollectiveRunner(BodyRunner):
    def __init__(self, ev: Evaluator, state: _State):
        super().__init__(ev)
        self.state = state

    def statement(self, stmt: ast.Stmt, scope: Scope) -> None:
        st = self.state
        if isinstance(stmt, (ast.InputDecl, ast.OutputDecl)):
            is_input = isinstance(stmt, ast.InputDecl)
            word = "input" if is_input else "output"
            if (st.input_span if is_input else st.output_span) is not None:
                raise CollcError(f"the {word} size is declared twice (first at "
                                 f"{st.input_span if is_input else st.output_span})", stmt.span)
            n = as_int(self.ev.eval(stmt.count, scope), stmt.count.span, f"the {word} size")
            if n < 1:
                raise CollcError(f"the {word} size must be at least 1 slot per rank, got {n}", stmt.count.span)
            if is_input:
                st.input_size, st.input_span = n, stmt.span
            else:
                st.output_size, st.output_span = n, stmt.span
        elif isinstance(stmt, ast.Pre):
            self._assign(stmt.loc, stmt.value, stmt.span, scope, pre=True)
        elif isinstance(stmt, ast.Post):
            self._assign(stmt.loc, stmt.value, stmt.span, scope, pre=False)
        elif isinstance(stmt, ast.Deliver):
            self._deliver(stmt, scope)
        else:
            super().statement(stmt, scope)

    def _chunks(self, expr: ast.Expr, scope: Scope) -> frozenset[ChunkId]:
        v = self.ev.eval(expr, scope)
        if not isinstance(v, Chunks):
            raise CollcError(f"expected chunks such as `chunk(r, i)` or `sum(s in 0..ranks: chunk(s, i))`, got "
                             f"{type_word(v)} ({format_value(v)})", expr.span)
        return v.chunks

    def _rank(self, expr: ast.Expr, scope: Scope) -> int:
        r = as_int(self.ev.eval(expr, scope), expr.span, "a rank")
        if not 0 <= r < self.state.ranks:
            raise RankRangeError(f"rank {r} is out of range: there are {self.state.ranks} ranks "
                             f"(0 to {self.state.ranks - 1})", expr.span)
        return r

    def _assign(self, loc: ast.Loc, value: ast.Expr, span: Span, scope: Scope, pre: bool) -> None:
        want = ast.BufferToken.IN if pre else ast.BufferToken.OUT
        if loc.buffer is not want:
            word = "input" if pre else "output"
            raise CollcError(f"`{'pre' if pre else 'post'}` describes the {word} buffer: write "
                             f"{want.value}[rank][slot]", loc.span)
        if isinstance(loc.index, ast.Range):
            raise CollcError("name one slot here, not a range", loc.index.span)
        r = self._rank(loc.rank, scope)
        j = as_int(self.ev.eval(loc.index, scope), loc.index.span, "a slot index")
        size = self.state.input_size if pre else self.state.output_size
        if j < 0 or (size is not None and j >= size):
            limit = f"0 to {size - 1}" if size is not None else "0 or more"
            raise CollcError(f"slot {j} is out of range for {want.value} (slots {limit})", loc.index.span)
        table = self.state.pre if pre else self.state.post
        chunks = self._chunks(value, scope)
        old = table.get((r, j))
        if old is not None:
            raise CollcError(f"{want.value}[{r}][{j}] is already set to {value_str(old.value)} at {old.span}", span)
        table[(r, j)] = _Slot(chunks, span, value.span)

    def _deliver(self, stmt: ast.Deliver, scope: Scope) -> None:
        chunks = self._chunks(stmt.value, scope)
        raw = self.ev.eval(stmt.targets, scope)
        targets = list(raw) if isinstance(raw, (range, tuple)) else [raw]
        seen: set[int] = set()
        for t in targets:
            r = as_int(t, stmt.targets.span, "a destination rank")
            if not 0 <= r < self.state.ranks:
                raise RankRangeError(f"rank {r} is out of range: there are {self.state.ranks} ranks "
                                 f"(0 to {self.state.ranks - 1})", stmt.targets.span)
            if r in seen:
                raise CollcError(f"rank {r} is named twice", stmt.targets.span)
            seen.add(r)
            j = 0
            while (r, j) in self.state.post:
                j += 1
            size = self.state.output_size
            if size is not None and j >= size:
                raise CollcError(f"rank {r} has no free output slot left (output has {size} slots)", stmt.span)
            self.state.post[(r, j)] = _Slot(chunks, stmt.span, stmt.value.span)


def _buffers(defn: ast.Definition, st: _State) -> tuple[Inputs, Outputs]:
    if not st.post:
        raise CollcError(f"collective '{defn.name}' requires nothing: add `post` or `deliver` statements",
                         defn.name_span)
    in_size = st.input_size
    if in_size is None:
        indices = [i for (_, i) in st.pre] + [c.index for s in st.post.values() for c in s.value]
        in_size = 1 + max(indices)
    out_size = st.output_size if st.output_size is not None else 1 + max(j for (_, j) in st.post)
    for (r, j), slot in st.post.items():
        if j >= out_size:
            raise CollcError(f"slot {j} is out of range for out (slots 0 to {out_size - 1})", slot.span)
    for (r, i), slot in st.pre.items():
        if i >= in_size:
            raise CollcError(f"slot {i} is out of range for in (slots 0 to {in_size - 1})", slot.span)
    inputs = tuple(
        tuple(st.pre[(r, i)].value if (r, i) in st.pre else frozenset({ChunkId(r, i)}) for i in range(in_size))
        for r in range(st.ranks))
    available: set[ChunkId] = set()
    for buf in inputs:
        for v in buf:
            available |= v
    for (r, j), slot in sorted(st.post.items()):
        missing = slot.value - available
        if missing:
            raise CollcError(f"out[{r}][{j}] needs {value_str(frozenset(missing))}, which no input slot holds "
                             f"(inputs have {in_size} slot{'s' if in_size != 1 else ''} per rank)", slot.value_span)
    outputs = tuple(tuple(st.post[(r, j)].value if (r, j) in st.post else None for j in range(out_size))
                    for r in range(st.ranks))
    return inputs, outputs
