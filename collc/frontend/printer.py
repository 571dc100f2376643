"""Printing the AST back as .coll text (canonical layout, minimal parentheses).

`parse(format_module(m))` equals `m` for every module `m`: the tests check this on the
standard library and on the test programs.
"""

from __future__ import annotations

from collc.frontend import ast

INDENT = "    "

# Binding strength: a sub-expression weaker than its context gets parentheses.
_RANGE, _OR, _AND, _NOT, _COMPARE, _ARITH, _TERM, _UNARY, _POSTFIX, _ATOM = range(10)

_BINARY_LEVEL = {
    ast.BinaryOp.OR: _OR, ast.BinaryOp.AND: _AND,
    ast.BinaryOp.EQ: _COMPARE, ast.BinaryOp.NE: _COMPARE, ast.BinaryOp.LT: _COMPARE,
    ast.BinaryOp.LE: _COMPARE, ast.BinaryOp.GT: _COMPARE, ast.BinaryOp.GE: _COMPARE,
    ast.BinaryOp.ADD: _ARITH, ast.BinaryOp.SUB: _ARITH,
    ast.BinaryOp.MUL: _TERM, ast.BinaryOp.DIV: _TERM, ast.BinaryOp.FLOORDIV: _TERM, ast.BinaryOp.MOD: _TERM,
}


def _level(e: ast.Expr) -> int:
    if isinstance(e, ast.Range):
        return _RANGE
    if isinstance(e, ast.Binary):
        return _BINARY_LEVEL[e.op]
    if isinstance(e, ast.Unary):
        return _NOT if e.op is ast.UnaryOp.NOT else _UNARY
    if isinstance(e, (ast.Index, ast.Attr)):
        return _POSTFIX
    return _ATOM


def format_expr(e: ast.Expr, context: int = _RANGE) -> str:
    text = _format_expr(e)
    return f"({text})" if _level(e) < context else text


def _operands(op: ast.BinaryOp) -> tuple[int, int]:
    level = _BINARY_LEVEL[op]
    if level == _COMPARE:
        return _ARITH, _ARITH  # comparisons do not chain
    return level, level + 1  # left-associative


def _format_expr(e: ast.Expr) -> str:
    if isinstance(e, ast.Number):
        digits = e.text or repr(e.value)
        return f"{digits} {e.unit}" if e.unit else digits
    if isinstance(e, ast.String):
        return format_string(e.value)
    if isinstance(e, ast.Bool):
        return "true" if e.value else "false"
    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Range):
        return f"{format_expr(e.start, _OR)}..{format_expr(e.stop, _OR)}"
    if isinstance(e, ast.Binary):
        left, right = _operands(e.op)
        return f"{format_expr(e.left, left)} {e.op.value} {format_expr(e.right, right)}"
    if isinstance(e, ast.Unary):
        if e.op is ast.UnaryOp.NOT:
            return f"not {format_expr(e.operand, _NOT)}"
        return f"-{format_expr(e.operand, _UNARY)}"
    if isinstance(e, ast.Index):
        return f"{format_expr(e.base, _POSTFIX)}[{format_expr(e.index)}]"
    if isinstance(e, ast.Attr):
        return f"{format_expr(e.base, _POSTFIX)}.{e.name}"
    if isinstance(e, ast.Call):
        return f"{e.func}({format_args(e.args)})"
    if isinstance(e, ast.Comprehension):
        return f"{e.func}({e.var} in {format_expr(e.iterable)}: {format_expr(e.body)})"
    if isinstance(e, ast.SetLiteral):
        return "{" + ", ".join(format_expr(i) for i in e.items) + "}"
    raise TypeError(f"cannot print {type(e).__name__}")


def format_string(value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{escaped}"'


def format_args(args: tuple[ast.Arg, ...]) -> str:
    return ", ".join(format_expr(a.value) if a.name is None else f"{a.name} = {format_expr(a.value)}"
                     for a in args)


def format_callspec(spec: ast.CallSpec) -> str:
    return f"{spec.name}({format_args(spec.args)})" if spec.args else spec.name


def format_loc(loc: ast.Loc) -> str:
    return f"{loc.buffer.value}[{format_expr(loc.rank)}][{format_expr(loc.index)}]"


# --- statements ------------------------------------------------------------------------

def _format_block(stmts: tuple[ast.Stmt, ...], depth: int) -> list[str]:
    out: list[str] = []
    for s in stmts:
        out.extend(_format_stmt(s, depth))
    return out


def _braced(header: str, body: tuple[ast.Stmt, ...], depth: int) -> list[str]:
    pad = INDENT * depth
    if not body:
        return [f"{pad}{header} {{ }}"]
    return [f"{pad}{header} {{", *_format_block(body, depth + 1), f"{pad}}}"]


def _format_stmt(s: ast.Stmt, depth: int) -> list[str]:
    pad = INDENT * depth
    if isinstance(s, ast.NodeDecl):
        count = f"[{format_expr(s.count)}]" if s.count is not None else ""
        return [f"{pad}{s.kind.value} {s.name}{count};"]
    if isinstance(s, ast.PartDecl):
        count = f"[{format_expr(s.count)}]" if s.count is not None else ""
        return [f"{pad}part {s.name}{count} = {format_callspec(s.topology)};"]
    if isinstance(s, ast.LinkStmt):
        arrow = "<->" if s.two_way else "->"
        attrs = ""
        if s.bandwidth is not None:
            attrs += f" bw {format_expr(s.bandwidth)}"
        if s.latency is not None:
            attrs += f" lat {format_expr(s.latency)}"
        if s.multiplicity is not None:
            attrs += f" x {format_expr(s.multiplicity)}"
        return [f"{pad}link {format_expr(s.src, _POSTFIX)} {arrow} {format_expr(s.dst, _POSTFIX)}{attrs};"]
    if isinstance(s, ast.Let):
        return [f"{pad}let {s.name} = {format_expr(s.value)};"]
    if isinstance(s, ast.For):
        return _braced(f"for {s.var} in {format_expr(s.iterable)}", s.body, depth)
    if isinstance(s, ast.If):
        return _format_if(s, depth, f"{pad}if")
    if isinstance(s, ast.Require):
        msg = f", {format_string(s.message)}" if s.message is not None else ""
        return [f"{pad}require {format_expr(s.cond)}{msg};"]
    if isinstance(s, ast.InputDecl):
        return [f"{pad}input {format_expr(s.count)};"]
    if isinstance(s, ast.OutputDecl):
        return [f"{pad}output {format_expr(s.count)};"]
    if isinstance(s, ast.ScratchDecl):
        return [f"{pad}scratch {format_expr(s.count)};"]
    if isinstance(s, ast.Pre):
        return [f"{pad}pre {format_loc(s.loc)} = {format_expr(s.value)};"]
    if isinstance(s, ast.Post):
        return [f"{pad}post {format_loc(s.loc)} = {format_expr(s.value)};"]
    if isinstance(s, ast.Deliver):
        return [f"{pad}deliver {format_expr(s.value)} to {format_expr(s.targets)};"]
    if isinstance(s, ast.Transfer):
        return [f"{pad}{s.kind.value} {format_loc(s.src)} -> {format_loc(s.dst)};"]
    raise TypeError(f"cannot print {type(s).__name__}")


def _format_if(s: ast.If, depth: int, lead: str) -> list[str]:
    pad = INDENT * depth
    lines = [f"{lead} {format_expr(s.cond)} {{", *_format_block(s.then, depth + 1)]
    if s.orelse is None:
        return lines + [f"{pad}}}"]
    if s.else_is_if:
        (inner,) = s.orelse
        assert isinstance(inner, ast.If)
        return lines + _format_if(inner, depth, f"{pad}}} else if")
    return lines + [f"{pad}}} else {{", *_format_block(s.orelse, depth + 1), f"{pad}}}"]


# --- definitions and modules ---------------------------------------------------------

def _doc_lines(doc: str) -> list[str]:
    if not doc:
        return []
    return [("// " + line).rstrip() for line in doc.split("\n")]


def _format_params(d: ast.Definition | ast.PipelineDef) -> str:
    if not d.params and not d.has_param_list:
        return ""
    parts = [p.name if p.default is None else f"{p.name} = {format_expr(p.default)}" for p in d.params]
    return "(" + ", ".join(parts) + ")"


def format_item(item: ast.Item) -> list[str]:
    if isinstance(item, ast.Import):
        target = item.module if item.module is not None else format_string(item.path or "")
        return [f"import {target};"]
    if isinstance(item, ast.Let):
        return _format_stmt(item, 0)
    if isinstance(item, ast.Compile):
        text = f"compile {format_callspec(item.collective)} on {format_callspec(item.topology)}"
        if item.size is not None:
            text += f" size {format_expr(item.size)}"
        if item.using is not None:
            text += f" using {format_callspec(item.using)}"
        return [text + ";"]
    if isinstance(item, ast.PipelineDef):
        header = f"pipeline {item.name}{_format_params(item)} on {format_callspec(item.topology)}"
        settings = [f"{INDENT}{st.name} = {format_expr(st.value)};" for st in item.settings]
        body = [header + " {", *settings, "}"] if settings else [header + " { }"]
        return _doc_lines(item.doc) + body
    if isinstance(item, ast.Definition):
        header = f"{item.kind_word} {item.name}{_format_params(item)}"
        if isinstance(item, ast.AlgorithmDef):
            header += f" for {item.collective}"
        return _doc_lines(item.doc) + _braced(header, item.body, 0)
    raise TypeError(f"cannot print {type(item).__name__}")


# Items printed as blocks, with a blank line around them.
_BLOCKS = (ast.Definition, ast.PipelineDef)


def format_module(module: ast.Module) -> str:
    chunks: list[str] = []
    prev: ast.Item | None = None
    for item in module.items:
        lines = format_item(item)
        # Imports, constants and requests sit together; definitions get a blank line.
        if prev is not None and (isinstance(item, _BLOCKS) or isinstance(prev, _BLOCKS)
                                 or type(item) is not type(prev)):
            chunks.append("")
        chunks.extend(lines)
        prev = item
    return "\n".join(chunks) + "\n"
