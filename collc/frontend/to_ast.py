"""From Lark's parse tree to the AST: the transformer `collc.frontend.parser` runs on
every tree Lark gives it. A module apart so that the parser imports Lark (about 25 ms
with its logging) only when it parses text: a compile that names stdlib topologies and
collectives reads their cached trees (`collc.frontend.parse_cache`) and never does."""

from __future__ import annotations

import math
import re

from lark import Token, Transformer, v_args

from collc.diagnostics import Span
from collc.frontend import ast
from collc.frontend.syntax import CollSyntaxError
from collc.limits import exceeded, limit


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
class ToAst(Transformer):
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
