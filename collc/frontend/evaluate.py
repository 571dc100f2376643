"""Evaluating .coll expressions: scopes, operators with dimension checking, builtins.

Topologies, collectives and algorithms share this evaluator; each adds the builtins
it provides (`chunk(...)` in collectives, `ranks`, `ring`, ... as names) through the
`Scope` it evaluates in.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Any, Callable

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.values import Chunks, Quantity, dim_of, dim_word, format_value, quantity, type_word
from collc.ir.collective import value_str
from collc.limits import exceeded, int_limit
from collc.units import DIM_EXAMPLES, NUMBER, UNITS, Dim


class RequirementError(CollcError):
    """A `require` statement that does not hold for the given arguments."""


class RankRangeError(CollcError):
    """A rank past the end for this many ranks: a definition may still be right for more."""


@dataclass
class Binding:
    value: Any
    span: Span | None  # where it was defined (None for builtins)


class Scope:
    """Nested name -> value bindings. Names cannot be redefined while visible."""

    def __init__(self, parent: "Scope | None" = None, what: str = ""):
        self.parent = parent
        self.names: dict[str, Binding] = {}
        self.what = what

    def child(self) -> "Scope":
        return Scope(self)

    def find(self, name: str) -> Binding | None:
        scope: Scope | None = self
        while scope is not None:
            b = scope.names.get(name)
            if b is not None:
                return b
            scope = scope.parent
        return None

    def visible(self) -> set[str]:
        out: set[str] = set()
        scope: Scope | None = self
        while scope is not None:
            out |= set(scope.names)
            scope = scope.parent
        return out

    def define(self, name: str, value: Any, span: Span | None) -> None:
        old = self.find(name)
        if old is not None:
            where = f" (defined at {old.span})" if old.span is not None else " (a builtin)"
            raise CollcError(f"'{name}' is already defined{where}; choose another name", span)
        self.names[name] = Binding(value, span)

    def lookup(self, name: str, span: Span) -> Any:
        b = self.find(name)
        if b is None:
            raise unknown_name_error(name, self.visible(), span)
        return b.value


def suggest(name: str, candidates: set[str] | list[str]) -> str | None:
    import difflib  # here: only a misspelt name needs it, and it costs every command's start-up

    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_name_error(name: str, visible: set[str], span: Span, what: str = "name") -> CollcError:
    hint = suggest(name, visible)
    msg = f"unknown {what} '{name}'"
    if hint:
        msg += f"; did you mean '{hint}'?"
    return CollcError(msg, span)


# --- conversions with located errors ------------------------------------------------

def as_int(value: Any, span: Span, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CollcError(f"{what} must be a whole number, got {type_word(value)} ({format_value(value)})", span)
    if isinstance(value, float):
        if not value.is_integer():
            raise CollcError(f"{what} must be a whole number, got {format_value(value)}"
                             " (use // for integer division)", span)
        value = int(value)
    return check_int(value, span)


def check_int(value: int, span: Span) -> int:
    """An integer within the digits limit (larger ones make every later step slow)."""
    if -INT_BOUND < value < INT_BOUND or abs(value) < 10 ** int_limit("int_digits"):
        return value
    raise CollcError(f"this integer has {_digits(value)} digits" + exceeded("int_digits"), span)


def _digits(value: int) -> str:
    # str() of a huge integer is itself slow (and refused past 4,300 digits): estimate.
    bits = abs(value).bit_length()
    return f"{int(bits * math.log10(2)) + 1:,}" if bits > 10_000 else f"{len(str(abs(value))):,}"


# Integers this small never need the (slower) limit lookup.
INT_BOUND = 10 ** 15


def check_finite(value: Any, span: Span) -> Any:
    """A number or quantity whose magnitude is finite: inf and NaN are never meant."""
    magnitude = value.value if isinstance(value, Quantity) else value
    if isinstance(magnitude, float) and not math.isfinite(magnitude):
        raise CollcError("this value is not a finite number (it overflows, or subtracts infinities)", span)
    if isinstance(magnitude, int) and not isinstance(magnitude, bool):
        check_int(magnitude, span)
    return value


def as_bool(value: Any, span: Span, what: str = "a condition") -> bool:
    if not isinstance(value, bool):
        raise CollcError(f"{what} must be true or false, got {type_word(value)} ({format_value(value)})", span)
    return value


def as_dim(value: Any, dim: Dim, span: Span, what: str) -> float:
    """The SI magnitude of a value of the expected dimension."""
    got = dim_of(value)
    if got != dim:
        example = DIM_EXAMPLES.get(dim)
        hint = f" such as `{example}`" if example else ""
        got_text = type_word(value) if got is None else dim_word(got)
        raise CollcError(f"{what} must be {dim_word(dim)}{hint}, got {got_text} ({format_value(value)})", span)
    return value.value if isinstance(value, Quantity) else float(value)


def as_iterable(value: Any, span: Span, what: str = "a loop") -> range | tuple:
    if isinstance(value, (range, tuple)):
        return value
    raise CollcError(f"{what} needs a range `a..b` or a set `{{...}}`, got {type_word(value)}", span)


# --- the evaluator ---------------------------------------------------------------------

Builtin = Callable[[list[Any], list[Span], Span], Any]


@dataclass
class Evaluator:
    """Evaluates expressions; `functions` are the callable builtins in this context."""

    functions: dict[str, Builtin] = field(default_factory=dict)
    # Loop iterations begun with this evaluator, against the `loop_iterations` limit.
    iterations: int = 0

    def __post_init__(self) -> None:
        self.functions = {**STANDARD_FUNCTIONS, **self.functions}
        self._budget = int_limit("loop_iterations")

    def spend(self, count: int, span: Span, what: str = "this loop") -> None:
        """Count `count` loop iterations about to run; refuse them past the limit (a loop
        is charged in full when it starts, so a runaway loop fails at once)."""
        self.iterations += count
        if self.iterations > self._budget:
            raise CollcError(f"{what} would bring the loop iterations to {self.iterations:,}"
                             + exceeded("loop_iterations"), span)

    def eval(self, expr: ast.Expr, scope: Scope) -> Any:
        method = getattr(self, "_eval_" + type(expr).__name__)
        try:
            return method(expr, scope)
        except (OverflowError, ValueError) as exc:  # e.g. floor() of an infinite number
            raise CollcError(f"cannot compute this value: {exc}", expr.span) from None

    # --- atoms ---
    def _eval_Number(self, e: ast.Number, scope: Scope) -> Any:
        if e.unit is None:
            return e.value
        factor, dim = UNITS[e.unit]
        return check_finite(quantity(e.value * factor, dim), e.span)

    def _eval_String(self, e: ast.String, scope: Scope) -> Any:
        return e.value

    def _eval_Bool(self, e: ast.Bool, scope: Scope) -> Any:
        return e.value

    def _eval_Name(self, e: ast.Name, scope: Scope) -> Any:
        value = scope.lookup(e.id, e.span)
        if isinstance(value, NotAValue):
            raise CollcError(value.message, e.span)
        return value

    def _eval_SetLiteral(self, e: ast.SetLiteral, scope: Scope) -> Any:
        return tuple(self.eval(item, scope) for item in e.items)

    def _eval_Range(self, e: ast.Range, scope: Scope) -> Any:
        start = as_int(self.eval(e.start, scope), e.start.span, "the start of a range")
        stop = as_int(self.eval(e.stop, scope), e.stop.span, "the end of a range")
        return range(start, stop)

    # --- compound ---
    def _eval_Index(self, e: ast.Index, scope: Scope) -> Any:
        base = self.eval(e.base, scope)
        if not isinstance(base, (range, tuple)):
            raise CollcError(f"cannot index {type_word(base)} ({format_value(base)})", e.base.span)
        i = as_int(self.eval(e.index, scope), e.index.span, "an index")
        if not 0 <= i < len(base):
            raise CollcError(f"index {i} is out of range: {_describe_indexed(e.base)} has {len(base)} "
                             f"elements (0 to {len(base) - 1})", e.index.span)
        return base[i]

    def _eval_Attr(self, e: ast.Attr, scope: Scope) -> Any:
        raise CollcError(f"'.{e.name}' names a node of a part; it can only appear in a link", e.span)

    def _eval_Unary(self, e: ast.Unary, scope: Scope) -> Any:
        v = self.eval(e.operand, scope)
        if e.op is ast.UnaryOp.NOT:
            return not as_bool(v, e.operand.span, "the operand of `not`")
        if dim_of(v) is None:
            raise CollcError(f"cannot negate {type_word(v)}", e.operand.span)
        return Quantity(-v.value, v.dim) if isinstance(v, Quantity) else -v

    def _eval_Binary(self, e: ast.Binary, scope: Scope) -> Any:
        op = e.op
        if op in (ast.BinaryOp.AND, ast.BinaryOp.OR):
            left = as_bool(self.eval(e.left, scope), e.left.span, f"the left side of `{op.value}`")
            if (op is ast.BinaryOp.AND) != left:
                return left
            return as_bool(self.eval(e.right, scope), e.right.span, f"the right side of `{op.value}`")
        left = self.eval(e.left, scope)
        right = self.eval(e.right, scope)
        return check_finite(binary(op, left, right, e), e.span)

    def _eval_Call(self, e: ast.Call, scope: Scope) -> Any:
        fn = self.functions.get(e.func)
        if fn is None:
            hint = suggest(e.func, set(self.functions))
            msg = f"unknown function '{e.func}'"
            if e.func == "chunk":
                msg = "`chunk(rank, index)` names input chunks; it can only appear in a collective"
            elif hint:
                msg += f"; did you mean '{hint}'?"
            raise CollcError(msg, e.span)
        for a in e.args:
            if a.name is not None:
                raise CollcError(f"builtin function '{e.func}' takes no keyword arguments", a.span)
        values = [self.eval(a.value, scope) for a in e.args]
        return fn(values, [a.span for a in e.args], e.span)

    def _eval_Comprehension(self, e: ast.Comprehension, scope: Scope) -> Any:
        if e.func != "sum":
            raise CollcError(f"`{e.func}(v in ...: ...)` is not a known reduction; only `sum` is", e.span)
        items = as_iterable(self.eval(e.iterable, scope), e.iterable.span, "a sum")
        self.spend(len(items), e.iterable.span, "this sum")
        total: Any = None
        for item in items:
            inner = scope.child()
            inner.define(e.var, item, e.span)
            v = self.eval(e.body, inner)
            total = v if total is None else binary(ast.BinaryOp.ADD, total, v, e)
        if total is None:
            raise CollcError("this sum is over no values", e.iterable.span)
        return total


@dataclass(frozen=True)
class NotAValue:
    """A name that is defined but cannot be used as a value here (e.g. a node group)."""

    message: str


def _describe_indexed(expr: ast.Expr) -> str:
    if isinstance(expr, ast.Name):
        return f"'{expr.id}'"
    return "the value"


_COMPARE = {
    ast.BinaryOp.EQ: operator.eq, ast.BinaryOp.NE: operator.ne, ast.BinaryOp.LT: operator.lt,
    ast.BinaryOp.LE: operator.le, ast.BinaryOp.GT: operator.gt, ast.BinaryOp.GE: operator.ge,
}


def binary(op: ast.BinaryOp, left: Any, right: Any, node: ast.Expr) -> Any:
    """Apply a non-logical binary operator, checking types and dimensions."""
    span = node.span
    if op in (ast.BinaryOp.EQ, ast.BinaryOp.NE):
        ld, rd = dim_of(left), dim_of(right)
        if ld is not None and rd is not None:
            if ld != rd:
                raise CollcError(f"cannot compare {dim_word(ld)} with {dim_word(rd)}", span)
            return _COMPARE[op](_magnitude(left), _magnitude(right))
        return _COMPARE[op](left, right)
    if op in _COMPARE:
        ld, rd = dim_of(left), dim_of(right)
        if ld is None or rd is None:
            bad = left if ld is None else right
            raise CollcError(f"`{op.value}` compares numbers, not {type_word(bad)}", span)
        if ld != rd:
            raise CollcError(f"cannot compare {dim_word(ld)} with {dim_word(rd)}", span)
        return _COMPARE[op](_magnitude(left), _magnitude(right))
    if isinstance(left, Chunks) or isinstance(right, Chunks):
        return _chunk_sum(op, left, right, span)
    if op is ast.BinaryOp.ADD and isinstance(left, str) and isinstance(right, str):
        return left + right
    ld, rd = dim_of(left), dim_of(right)
    if ld is None or rd is None:
        bad = left if ld is None else right
        raise CollcError(f"`{op.value}` needs numbers, got {type_word(bad)} ({format_value(bad)})", span)
    a, b = _magnitude(left), _magnitude(right)
    if op in (ast.BinaryOp.ADD, ast.BinaryOp.SUB):
        if ld != rd:
            verb = "add" if op is ast.BinaryOp.ADD else "subtract"
            raise CollcError(f"cannot {verb} {dim_word(ld)} and {dim_word(rd)}", span)
        return quantity(a + b if op is ast.BinaryOp.ADD else a - b, ld)
    if op is ast.BinaryOp.MUL:
        return quantity(a * b, (ld[0] + rd[0], ld[1] + rd[1]))
    if b == 0:
        raise CollcError("division by zero", node.right.span if isinstance(node, ast.Binary) else span)
    if op is ast.BinaryOp.DIV:
        dim = (ld[0] - rd[0], ld[1] - rd[1])
        return quantity(a / b, dim)
    if op is ast.BinaryOp.FLOORDIV:
        dim = (ld[0] - rd[0], ld[1] - rd[1])
        if dim == NUMBER:
            return a // b if isinstance(a, int) and isinstance(b, int) else float(math.floor(a / b))
        return quantity(math.floor(a / b), dim)
    if op is ast.BinaryOp.MOD:
        if ld != rd and rd != NUMBER:
            raise CollcError(f"cannot take {dim_word(ld)} modulo {dim_word(rd)}", span)
        return quantity(a % b, ld)
    raise CollcError(f"operator `{op.value}` is not supported here", span)


def _magnitude(v: Any) -> Any:
    return v.value if isinstance(v, Quantity) else v


def _chunk_sum(op: ast.BinaryOp, left: Any, right: Any, span: Span) -> Chunks:
    if op is not ast.BinaryOp.ADD or not (isinstance(left, Chunks) and isinstance(right, Chunks)):
        other = right if isinstance(left, Chunks) else left
        raise CollcError(f"chunks can only be added to chunks (a reduction), not combined with "
                         f"{type_word(other)} by `{op.value}`", span)
    twice = left.chunks & right.chunks
    if twice:
        raise CollcError(f"{value_str(frozenset(twice))} would be counted twice in this reduction", span)
    return Chunks(left.chunks | right.chunks)


# --- builtin functions ------------------------------------------------------------------

def _arity(name: str, args: list, span: Span, lo: int, hi: int | None = None) -> None:
    hi = lo if hi is None else hi
    if not lo <= len(args) <= hi:
        want = str(lo) if lo == hi else (f"{lo} or more" if hi > 99 else f"{lo} to {hi}")
        raise CollcError(f"{name}() takes {want} argument{'s' if want != '1' else ''}, got {len(args)}", span)


def _extremum(name: str, pick: Callable) -> Builtin:
    def fn(args: list, spans: list[Span], span: Span) -> Any:
        _arity(name, args, span, 1, 1000)
        values = list(args[0]) if len(args) == 1 and isinstance(args[0], (range, tuple)) else args
        if not values:
            raise CollcError(f"{name}() of no values", span)
        dims = {dim_of(v) for v in values}
        if None in dims or len(dims) != 1:
            raise CollcError(f"{name}() needs numbers of one kind, got "
                             + ", ".join(type_word(v) for v in values), span)
        return pick(values, key=_magnitude)
    return fn


def _abs(args: list, spans: list[Span], span: Span) -> Any:
    _arity("abs", args, span, 1)
    v = args[0]
    if dim_of(v) is None:
        raise CollcError(f"abs() needs a number, got {type_word(v)}", spans[0])
    return Quantity(abs(v.value), v.dim) if isinstance(v, Quantity) else abs(v)


def _pow(args: list, spans: list[Span], span: Span) -> Any:
    _arity("pow", args, span, 2)
    base, exp = args
    if dim_of(base) != NUMBER:
        raise CollcError(f"pow() needs a plain number as base, got {type_word(base)}", spans[0])
    e = as_int(exp, spans[1], "the exponent of pow()")
    if base == 0 and e < 0:
        raise CollcError("pow(0, e) with a negative exponent divides by zero", spans[1])
    if abs(base) > 1 and e > 0 and e * math.log10(abs(base)) > int_limit("int_digits") + 1:
        # Refused before computing: pow(10, 100000000) alone takes minutes.
        raise CollcError(f"pow() would give a number of about {int(e * math.log10(abs(base))) + 1:,} digits"
                         + exceeded("int_digits"), span)
    if isinstance(base, int) and e >= 0:
        return check_int(base ** e, span)
    return check_finite(float(base) ** e, span)


def _rounding(name: str, fn: Callable[[float], int]) -> Builtin:
    def call(args: list, spans: list[Span], span: Span) -> Any:
        _arity(name, args, span, 1)
        if dim_of(args[0]) != NUMBER:
            raise CollcError(f"{name}() needs a plain number, got {type_word(args[0])}", spans[0])
        return fn(args[0])
    return call


def _len(args: list, spans: list[Span], span: Span) -> Any:
    _arity("len", args, span, 1)
    if not isinstance(args[0], (range, tuple, str)):
        raise CollcError(f"len() needs a range, a set or a string, got {type_word(args[0])}", spans[0])
    return len(args[0])


def _index_of(args: list, spans: list[Span], span: Span) -> Any:
    _arity("index_of", args, span, 2)
    seq, item = args
    if not isinstance(seq, (range, tuple)):
        raise CollcError(f"index_of() searches a range or a set, got {type_word(seq)}", spans[0])
    for i, v in enumerate(seq):
        if v == item:
            return i
    raise CollcError(f"{format_value(item)} does not occur in {format_value(seq)}", span)


STANDARD_FUNCTIONS: dict[str, Builtin] = {
    "min": _extremum("min", min),
    "max": _extremum("max", max),
    "abs": _abs,
    "pow": _pow,
    "floor": _rounding("floor", math.floor),
    "ceil": _rounding("ceil", math.ceil),
    "len": _len,
    "index_of": _index_of,
}
