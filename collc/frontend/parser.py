"""Parsing .coll text into the AST.

Lark parses with the grammar in `collc.grammar` (LALR, positions propagated); a
Transformer builds the AST. Every Lark error is converted into a located `CollcError`
in `_syntax_errors`, the one boundary between Lark and the rest of collc, with the
expected tokens named in words rather than Lark's terminal names.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import math
import re
from typing import Iterator

import lark
from lark import Token, Transformer, Tree, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedInput, UnexpectedToken, VisitError

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.limits import exceeded, limit

START_RULES = ("module", "spec", "value")


class CollSyntaxError(CollcError):
    """Source text that does not follow the .coll grammar."""


@functools.lru_cache(maxsize=1)
def grammar_text() -> str:
    return importlib.resources.files("collc.grammar").joinpath("coll.lark").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def lark_parser() -> lark.Lark:
    # cache=True keeps the built LALR tables in the temporary directory, keyed by the
    # grammar's hash: building them takes ~0.1 s, loading them ~0.01 s.
    return lark.Lark(grammar_text(), parser="lalr", start=list(START_RULES), propagate_positions=True,
                     maybe_placeholders=True, cache=True)


def parse_tree(text: str, filename: str, start: str = "module") -> Tree:
    """The raw Lark parse tree (used to measure grammar coverage)."""
    check_nesting(text, filename)
    with _syntax_errors(text, filename):
        return lark_parser().parse(text, start=start)


def parse(text: str, filename: str) -> ast.Module:
    """Parse a whole .coll file."""
    tree = parse_tree(text, filename)
    with _syntax_errors(text, filename):
        module = _ToAst(filename, text).transform(tree)
    return module


def parse_spec(text: str, filename: str) -> ast.CallSpec:
    """Parse a command-line call such as `ndv2(chassis = 2)`. A bare name (`dgx1`,
    `allgather`: most specs) is read without Lark, whose parser takes longer to load
    than the rest of such a command's front end; the call is the one Lark's would be."""
    bare = _BARE_NAME.fullmatch(text)
    if bare is not None and bare.group(1) not in _keywords():
        name = bare.group(1)
        column = bare.start(1) + 1
        span = Span(filename, 1, column, 1, column + len(name))
        return ast.CallSpec(name, (), span=span, name_span=span)
    tree = parse_tree(text, filename, start="spec")
    with _syntax_errors(text, filename):
        return _ToAst(filename, text).transform(tree)


# A spec that is one NAME (the grammar's terminal) between spaces.
_BARE_NAME = re.compile(r" *([A-Za-z_][A-Za-z0-9_]*) *")


@functools.lru_cache(maxsize=1)
def _keywords() -> frozenset[str]:
    """The grammar's quoted words (`topology`, `on`, ...): a spec of one of them goes
    through Lark, which decides what it is."""
    return frozenset(re.findall(r'"([A-Za-z_][A-Za-z0-9_]*)"', grammar_text()))


def parse_value(text: str, filename: str) -> ast.Expr:
    """Parse a command-line value such as `64 MiB`."""
    tree = parse_tree(text, filename, start="value")
    with _syntax_errors(text, filename):
        return _ToAst(filename, text).transform(tree)


# Tokens that matter for nesting depth; comments and strings are skipped whole.
_NESTING_TOKENS = re.compile(r'//[^\n]*|/\*(?:.|\n)*?\*/|"(?:[^"\\\n]|\\.)*"|[{(\[]|[})\]]')


def check_nesting(text: str, filename: str) -> None:
    """Refuse brackets and braces nested deeper than the limit, where the limit is
    passed. Every later stage walks the tree recursively, so this keeps them within
    Python's stack."""
    most = limit("nesting")
    depth = 0
    for m in _NESTING_TOKENS.finditer(text):
        tok = m.group()
        if tok in "{([":
            depth += 1
            if depth > most:
                line = text.count("\n", 0, m.start()) + 1
                column = m.start() - (text.rfind("\n", 0, m.start()) + 1) + 1
                raise CollSyntaxError("brackets are nested too deeply" + exceeded("nesting"),
                                      Span(filename, line, column, line, column + 1))
        elif tok in "})]":
            depth = max(0, depth - 1)


# --- from Lark's tree to the AST ---------------------------------------------------------

_UNIT_FREE_NUMBER = re.compile(r"^\d+$")


def _doc_comment(lines: list[str], line: int) -> str:
    """The `//` comment lines (or one `/* */` block) directly above 1-based `line`."""
    i = line - 2
    out: list[str] = []
    while i >= 0 and lines[i].strip().startswith("//"):
        out.append(lines[i].strip()[2:].removeprefix(" ").rstrip())
        i -= 1
    if out:
        return "\n".join(reversed(out)).strip("\n")
    if i >= 0 and lines[i].rstrip().endswith("*/"):
        j = i
        while j >= 0 and "/*" not in lines[j]:
            j -= 1
        if j >= 0 and lines[j].lstrip().startswith("/*"):
            block = "\n".join(lines[j:i + 1]).strip()[2:-2]
            body = [ln.strip().removeprefix("*").removeprefix(" ").rstrip() for ln in block.splitlines()]
            return "\n".join(body).strip("\n")
    return ""


@v_args(meta=True)
class _ToAst(Transformer):
    def __init__(self, filename: str, text: str):
        super().__init__()
        self.filename = filename
        self.lines = text.splitlines()

    # --- spans ---
    def _span(self, meta) -> Span:
        if getattr(meta, "empty", True):
            return Span(self.filename, 1, 1)
        return Span(self.filename, meta.line, meta.column, meta.end_line, meta.end_column)

    def _tok_span(self, tok: Token) -> Span:
        return Span(self.filename, tok.line, tok.column, tok.end_line, tok.end_column)

    # --- start rules ---
    def module(self, meta, items):
        return ast.Module(self.filename, tuple(items), span=self._span(meta))

    def spec(self, meta, children):
        return children[0]

    def value(self, meta, children):
        return children[0]

    # --- imports ---
    def import_module(self, meta, children):
        return ast.Import(module=children[0], span=self._span(meta))

    def import_file(self, meta, children):
        return ast.Import(path=_unquote(children[0]), span=self._span(meta))

    def dotted_name(self, meta, parts):
        return ".".join(str(p) for p in parts)

    # --- definitions ---
    def _definition(self, cls, meta, name: Token, params, body, **extra):
        return cls(str(name), tuple(params or ()), tuple(body), doc=_doc_comment(self.lines, meta.line),
                   span=self._span(meta), name_span=self._tok_span(name), has_param_list=params is not None,
                   **extra)

    def topology_def(self, meta, children):
        name, params, body = children
        return self._definition(ast.TopologyDef, meta, name, params, body)

    def collective_def(self, meta, children):
        name, params, body = children
        return self._definition(ast.CollectiveDef, meta, name, params, body)

    def algorithm_def(self, meta, children):
        name, params, coll, body = children
        return self._definition(ast.AlgorithmDef, meta, name, params, body, collective=str(coll),
                                collective_span=self._tok_span(coll))

    def compile_stmt(self, meta, children):
        coll, topo, size, using = children
        return ast.Compile(coll, topo, size, using, span=self._span(meta))

    def pipeline_def(self, meta, children):
        name, params, topology, *settings = children
        return ast.PipelineDef(str(name), tuple(params or ()), topology, tuple(settings),
                               doc=_doc_comment(self.lines, meta.line), span=self._span(meta),
                               name_span=self._tok_span(name), has_param_list=params is not None)

    def pipeline_setting(self, meta, children):
        name, value = children
        return ast.PipelineSetting(str(name), value, span=self._span(meta), name_span=self._tok_span(name))

    def size_clause(self, meta, children):
        return children[0]

    def using_clause(self, meta, children):
        return children[0]

    def params(self, meta, children):
        return [p for p in children if p is not None]

    def param(self, meta, children):
        name, default = children
        return ast.Param(str(name), default, span=self._span(meta))

    def bare_callspec(self, meta, children):
        (name,) = children
        return ast.CallSpec(str(name), (), span=self._span(meta), name_span=self._tok_span(name))

    def callspec(self, meta, children):
        name, args = children
        return ast.CallSpec(str(name), tuple(args or ()), span=self._span(meta), name_span=self._tok_span(name))

    # --- statements ---
    def block(self, meta, stmts):
        return list(stmts)

    def node_decl(self, meta, children):
        kind, name, count, sms = children
        return ast.NodeDecl(ast.NodeKindToken(kind), str(name), count, sms, span=self._span(meta))

    def sms_attr(self, meta, children):
        return children[0]

    def node_kind(self, meta, children):
        return str(children[0])

    def part_decl(self, meta, children):
        name, count, spec = children
        return ast.PartDecl(str(name), count, spec, span=self._span(meta))

    def _link(self, meta, children, two_way: bool):
        src, dst, *attrs = children
        found: dict[str, ast.Expr] = {}
        for key, value, span in attrs:
            if key in found:
                raise CollSyntaxError(f"`{_ATTR_WORD[key]}` is given twice for this link", span)
            found[key] = value
        return ast.LinkStmt(src, dst, two_way, found.get("bandwidth"), found.get("latency"),
                            found.get("multiplicity"), span=self._span(meta))

    def link_one_way(self, meta, children):
        return self._link(meta, children, two_way=False)

    def link_two_way(self, meta, children):
        return self._link(meta, children, two_way=True)

    def bw_attr(self, meta, children):
        return ("bandwidth", children[0], self._span(meta))

    def lat_attr(self, meta, children):
        return ("latency", children[0], self._span(meta))

    def mult_attr(self, meta, children):
        return ("multiplicity", children[0], self._span(meta))

    def let_stmt(self, meta, children):
        name, value = children
        return ast.Let(str(name), value, span=self._span(meta))

    def for_stmt(self, meta, children):
        var, iterable, body = children
        return ast.For(str(var), iterable, tuple(body), span=self._span(meta))

    def if_stmt(self, meta, children):
        # `[_else]` inlines its rule, so there is no placeholder when it is absent.
        cond, then = children[0], children[1]
        orelse = children[2] if len(children) > 2 else None
        if orelse is None:
            return ast.If(cond, tuple(then), None, span=self._span(meta))
        if isinstance(orelse, ast.If):
            return ast.If(cond, tuple(then), (orelse,), else_is_if=True, span=self._span(meta))
        return ast.If(cond, tuple(then), tuple(orelse), span=self._span(meta))

    def require_stmt(self, meta, children):
        cond, message = children
        return ast.Require(cond, None if message is None else _unquote(message), span=self._span(meta))

    def input_decl(self, meta, children):
        return ast.InputDecl(children[0], span=self._span(meta))

    def output_decl(self, meta, children):
        return ast.OutputDecl(children[0], span=self._span(meta))

    def scratch_decl(self, meta, children):
        return ast.ScratchDecl(children[0], span=self._span(meta))

    def pre_stmt(self, meta, children):
        return ast.Pre(children[0], children[1], span=self._span(meta))

    def post_stmt(self, meta, children):
        return ast.Post(children[0], children[1], span=self._span(meta))

    def deliver_stmt(self, meta, children):
        return ast.Deliver(children[0], children[1], span=self._span(meta))

    def copy_stmt(self, meta, children):
        return ast.Transfer(ast.TransferKind.COPY, children[0], children[1], span=self._span(meta))

    def reduce_stmt(self, meta, children):
        return ast.Transfer(ast.TransferKind.REDUCE, children[0], children[1], span=self._span(meta))

    def loc(self, meta, children):
        buffer, rank, index = children
        return ast.Loc(ast.BufferToken(buffer), rank, index, span=self._span(meta))

    def buffer(self, meta, children):
        return str(children[0])

    # --- expressions ---
    def range(self, meta, children):
        return ast.Range(children[0], children[1], span=self._span(meta))

    def _binary(op: ast.BinaryOp):  # type: ignore[misc]  # a factory used in the class body
        def method(self, meta, children):
            return ast.Binary(op, children[0], children[1], span=self._span(meta))
        return method

    or_op = _binary(ast.BinaryOp.OR)
    and_op = _binary(ast.BinaryOp.AND)
    eq = _binary(ast.BinaryOp.EQ)
    ne = _binary(ast.BinaryOp.NE)
    lt = _binary(ast.BinaryOp.LT)
    le = _binary(ast.BinaryOp.LE)
    gt = _binary(ast.BinaryOp.GT)
    ge = _binary(ast.BinaryOp.GE)
    add = _binary(ast.BinaryOp.ADD)
    sub = _binary(ast.BinaryOp.SUB)
    mul = _binary(ast.BinaryOp.MUL)
    div = _binary(ast.BinaryOp.DIV)
    floordiv = _binary(ast.BinaryOp.FLOORDIV)
    mod = _binary(ast.BinaryOp.MOD)
    del _binary

    def not_op(self, meta, children):
        return ast.Unary(ast.UnaryOp.NOT, children[0], span=self._span(meta))

    def neg(self, meta, children):
        return ast.Unary(ast.UnaryOp.NEG, children[0], span=self._span(meta))

    def index(self, meta, children):
        return ast.Index(children[0], children[1], span=self._span(meta))

    def attr(self, meta, children):
        return ast.Attr(children[0], str(children[1]), span=self._span(meta))

    def quantity(self, meta, children):
        digits, unit = children
        text = str(digits)
        value: int | float
        if _UNIT_FREE_NUMBER.match(text):
            if len(text.lstrip("0")) > limit("int_digits"):
                raise CollSyntaxError(f"this number has {len(text.lstrip('0'))} digits" + exceeded("int_digits"),
                                      self._tok_span(digits))
            value = int(text)
        else:
            value = float(text)
            if not math.isfinite(value):
                raise CollSyntaxError(f"the number {text} is too large to represent", self._tok_span(digits))
        return ast.Number(value, None if unit is None else str(unit), text, span=self._span(meta))

    def string(self, meta, children):
        return ast.String(_unquote(children[0]), span=self._span(meta))

    def true(self, meta, children):
        return ast.Bool(True, span=self._span(meta))

    def false(self, meta, children):
        return ast.Bool(False, span=self._span(meta))

    def name(self, meta, children):
        return ast.Name(str(children[0]), span=self._span(meta))

    def call(self, meta, children):
        func, args = children
        return ast.Call(str(func), tuple(args or ()), span=self._span(meta))

    def comprehension(self, meta, children):
        func, var, iterable, body = children
        return ast.Comprehension(str(func), str(var), iterable, body, span=self._span(meta))

    def set_literal(self, meta, children):
        return ast.SetLiteral(tuple(c for c in children if c is not None), span=self._span(meta))

    def arguments(self, meta, children):
        args = []
        for c in children:
            if c is None:
                continue
            args.append(c if isinstance(c, ast.Arg) else ast.Arg(c, span=c.span))
        seen_keyword = None
        for a in args:
            if a.name is not None:
                seen_keyword = a
            elif seen_keyword is not None:
                raise CollSyntaxError("a positional argument cannot follow a keyword argument", a.span)
        return args

    def keyword_argument(self, meta, children):
        name, value = children
        return ast.Arg(value, str(name), span=self._span(meta))


_ATTR_WORD = {"bandwidth": "bw", "latency": "lat", "multiplicity": "x"}

_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _unquote(tok: Token | str) -> str:
    body = str(tok)[1:-1]
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), body)


# --- syntax errors in words ----------------------------------------------------------

# Named terminals in words; anonymous ones (keywords, punctuation) are shown as written.
_TERMINAL_WORDS = {
    "NAME": "a name",
    "NUMBER": "a number",
    "STRING": "a string",
    "UNIT": "a unit (GB/s, us, MiB, ...)",
    "$END": "the end of the input",
}

# What to list first when many tokens would do: what usually ends or continues a line.
_PREFERRED_ORDER = [";", "}", ")", "]", "{", "(", "[", ",", "=", "->", "<->", "..", ":"]
_OPERATORS = {"==", "!=", "<", "<=", ">", ">=", "+", "-", "*", "/", "//", "%", "and", "or", ".", "[", ".."}


@functools.lru_cache(maxsize=1)
def _terminal_literals() -> dict[str, str]:
    """Terminal name -> its literal text, for the grammar's keyword and punctuation terminals."""
    out = {}
    for term in lark_parser().terminals:
        if isinstance(term.pattern, lark.lexer.PatternStr):
            out[term.name] = term.pattern.value
    return out


def describe_terminal(name: str) -> str:
    if name in _TERMINAL_WORDS:
        return _TERMINAL_WORDS[name]
    literal = _terminal_literals().get(name)
    if literal is not None:
        return f"`{literal}`"
    return name.lower()


def _describe_expected(names: set[str]) -> str:
    literals = _terminal_literals()
    words = []
    texts = {n: literals.get(n) for n in names}
    has_operators = sum(1 for t in texts.values() if t in _OPERATORS) >= 4
    shown = [n for n in names if not (has_operators and texts[n] in _OPERATORS)]

    def order(n: str) -> tuple[int, str]:
        t = texts[n]
        if t in _PREFERRED_ORDER:
            return (0, f"{_PREFERRED_ORDER.index(t):03d}")
        if n in _TERMINAL_WORDS:
            return (1, n)
        return (2, t or n)

    for n in sorted(shown, key=order):
        words.append(describe_terminal(n))
    if has_operators:
        words.append("an operator")
    if len(words) > 8:
        words = words[:8] + ["..."]
    if len(words) == 1:
        return words[0]
    return "one of " + ", ".join(words)


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of input"
    if tok.type in ("NAME", "NUMBER", "STRING", "UNIT"):
        return f"{_TERMINAL_WORDS[tok.type].removeprefix('a ').split(' (')[0]} `{tok}`"
    return f"`{tok}`"


def _end_of_previous_token(text: str, line: int, column: int) -> tuple[int, int] | None:
    """(line, column) just after the last non-blank character before a position, if it
    is on an earlier line (so a missing `;` is reported where it belongs)."""
    lines = text.splitlines()
    if not 1 <= line <= len(lines) + 1:
        return None
    row = line - 1
    before = lines[row][:column - 1] if row < len(lines) else ""
    if before.strip():
        return None
    row -= 1
    while row >= 0:
        content = lines[row].split("//", 1)[0].rstrip()
        if content:
            return row + 1, len(content) + 1
        row -= 1
    return None


@contextlib.contextmanager
def _syntax_errors(text: str, filename: str) -> Iterator[None]:
    """Turn Lark's exceptions into located CollcErrors; the one place that does so."""
    try:
        yield
    except VisitError as exc:
        if isinstance(exc.orig_exc, CollcError):
            raise exc.orig_exc from None
        if isinstance(exc.orig_exc, RecursionError):
            raise CollSyntaxError("the program is nested too deeply to read (an expression with too many "
                                  "operators in a row?)", Span(filename, 1, 1)) from None
        raise
    except UnexpectedInput as exc:
        raise _convert(exc, text, filename) from None
    except RecursionError:
        raise CollSyntaxError("the program is nested too deeply to read", Span(filename, 1, 1)) from None


def _convert(exc: UnexpectedInput, text: str, filename: str) -> CollSyntaxError:
    if isinstance(exc, UnexpectedToken):
        tok = exc.token
        expected = set(exc.accepts or exc.expected)
        line = tok.line if tok.line is not None else exc.line
        col = tok.column if tok.column is not None else exc.column
        if tok.type == "$END":
            line, col = _end_position(text)
        what = _describe_expected(expected)
        if "SEMICOLON" in expected and tok.type != "$END":
            prev = _end_of_previous_token(text, line, col)
            if prev is not None:
                return CollSyntaxError(f"expected `;` at the end of this line (found {_describe_token(tok)} on "
                                       f"the next line)", Span(filename, prev[0], prev[1], prev[0], prev[1] + 1))
        end_col = tok.end_column if tok.end_line == line and tok.end_column else col + 1
        notes = ()
        lines = text.splitlines()
        if 1 <= line <= len(lines) and "//" in lines[line - 1][:col - 1]:
            notes = ("`//` right after a value divides; put a comment after the statement's `;`",)
        return CollSyntaxError(f"unexpected {_describe_token(tok)}; expected {what}",
                               Span(filename, line, col, line, end_col), notes)
    if isinstance(exc, UnexpectedCharacters):
        char = text[exc.pos_in_stream] if 0 <= exc.pos_in_stream < len(text) else ""
        allowed = set(exc.allowed or ())
        hint = f"; expected {_describe_expected(allowed)}" if allowed else ""
        shown = repr(char)[1:-1] if char else "end of input"
        return CollSyntaxError(f"unexpected character `{shown}`{hint}",
                               Span(filename, exc.line, exc.column, exc.line, exc.column + 1))
    if isinstance(exc, UnexpectedEOF):
        line, col = _end_position(text)
        return CollSyntaxError(f"unexpected end of input; expected {_describe_expected(set(exc.expected))}",
                               Span(filename, line, col))
    line = getattr(exc, "line", 1) or 1
    col = getattr(exc, "column", 1) or 1
    return CollSyntaxError(f"syntax error: {exc}", Span(filename, line, col))


def _end_position(text: str) -> tuple[int, int]:
    lines = text.splitlines() or [""]
    return len(lines), len(lines[-1]) + 1
