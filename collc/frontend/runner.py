"""Running definition bodies: control flow shared by topologies, collectives and
algorithms, and binding a definition's parameters to call arguments."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.evaluate import Evaluator, RequirementError, Scope, as_bool, as_iterable, suggest
from collc.frontend.printer import format_expr
from collc.frontend.values import format_value


class BodyRunner:
    """Executes statements; subclasses handle the statements of their kind of body."""

    def __init__(self, evaluator: Evaluator):
        self.ev = evaluator

    def run(self, stmts: Sequence[ast.Stmt], scope: Scope) -> None:
        for stmt in stmts:
            self.exec(stmt, scope)

    def exec(self, stmt: ast.Stmt, scope: Scope) -> None:
        if isinstance(stmt, ast.Let):
            scope.define(stmt.name, self.ev.eval(stmt.value, scope), stmt.span)
        elif isinstance(stmt, ast.For):
            items = as_iterable(self.ev.eval(stmt.iterable, scope), stmt.iterable.span)
            self.ev.spend(len(items), stmt.iterable.span)
            for item in items:
                inner = scope.child()
                inner.define(stmt.var, item, stmt.span)
                self.run(stmt.body, inner)
        elif isinstance(stmt, ast.If):
            if as_bool(self.ev.eval(stmt.cond, scope), stmt.cond.span, "an `if` condition"):
                self.run(stmt.then, scope.child())
            elif stmt.orelse is not None:
                self.run(stmt.orelse, scope.child())
        elif isinstance(stmt, ast.Require):
            if not as_bool(self.ev.eval(stmt.cond, scope), stmt.cond.span, "a `require` condition"):
                text = stmt.message or f"`{format_expr(stmt.cond)}` does not hold"
                raise RequirementError(f"requirement failed: {text}", stmt.span)
        else:
            self.statement(stmt, scope)

    def statement(self, stmt: ast.Stmt, scope: Scope) -> None:  # pragma: no cover - the checker rejects these
        raise CollcError(f"this statement cannot appear here", stmt.span)


@contextlib.contextmanager
def called_from(what: str, call_span: Span | None) -> Iterator[None]:
    """Errors raised inside a definition's body also say where it was used (like a
    traceback), so a failed `require` in the standard library points back to the call."""
    try:
        yield
    except CollcError as err:
        if err.span is not None and err.span == call_span:
            raise
        where = f"in {what}" if call_span is None else f"in {what}, used at {call_span}"
        raise type(err)(err.message, err.span, err.notes + (where,)) from None


@dataclass(frozen=True)
class BoundArgs:
    """A definition's parameters bound to values, with where each value came from."""

    values: dict[str, Any]
    spans: dict[str, Span]

    def key(self) -> tuple:
        return tuple(self.values.items())


def evaluate_args(args: Sequence[ast.Arg], scope: Scope, evaluator: Evaluator) -> list[tuple[str | None, Any, Span]]:
    return [(a.name, evaluator.eval(a.value, scope), a.span) for a in args]


def bind_args(defn: ast.Definition, args: Sequence[tuple[str | None, Any, Span]], call_span: Span | None,
              default_scope: Scope, evaluator: Evaluator) -> BoundArgs:
    """Match positional and keyword arguments to parameters; evaluate missing defaults."""
    params = defn.params
    names = [p.name for p in params]
    what = f"{defn.kind_word} '{defn.name}'"
    values: dict[str, Any] = {}
    spans: dict[str, Span] = {}
    positional = [a for a in args if a[0] is None]
    if len(positional) > len(params):
        extra = positional[len(params)]
        if params:
            listing = ", ".join(names)
            raise CollcError(f"{what} takes at most {len(params)} argument{'s' if len(params) != 1 else ''} "
                             f"({listing}), got {len(positional)}", extra[2])
        raise CollcError(f"{what} takes no arguments, got {len(positional)}", extra[2])
    for param, (_, value, span) in zip(params, positional):
        values[param.name] = value
        spans[param.name] = span
    for name, value, span in args:
        if name is None:
            continue
        if name not in names:
            hint = suggest(name, names)
            listing = ", ".join(names) if names else "none"
            msg = f"{what} has no parameter '{name}'"
            if hint:
                msg += f"; did you mean '{hint}'?"
            raise CollcError(f"{msg} (its parameters: {listing})", span)
        if name in values:
            raise CollcError(f"parameter '{name}' of {what} is given twice", span)
        values[name] = value
        spans[name] = span
    scope = default_scope.child()
    for param in params:
        if param.name not in values:
            if param.default is None:
                raise CollcError(f"{what} needs a value for parameter '{param.name}'", call_span)
            values[param.name] = evaluator.eval(param.default, scope)
            spans[param.name] = param.default.span
        scope.define(param.name, values[param.name], param.span)
    return BoundArgs({n: values[n] for n in names}, spans)


def instance_name(defn: ast.Definition, bound: BoundArgs) -> str:
    """`ring(n=8)`, or the bare name for a definition without parameters."""
    if not defn.params:
        return defn.name
    return defn.name + "(" + ", ".join(f"{k}={format_value(v)}" for k, v in bound.values.items()) + ")"


def params_scope(parent: Scope, defn: ast.Definition, bound: BoundArgs) -> Scope:
    scope = parent.child()
    for param in defn.params:
        scope.define(param.name, bound.values[param.name], param.span)
    return scope
