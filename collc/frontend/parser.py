"""Parsing .coll text into the AST.

Lark parses with the grammar in `collc.grammar` (LALR, positions propagated); a
Transformer (`collc.frontend.to_ast`) builds the AST. Every Lark error is converted into a located `CollcError`
in `_syntax_errors`, the one boundary between Lark and the rest of collc, with the
expected tokens named in words rather than Lark's terminal names.
"""

from __future__ import annotations

import contextlib
import functools
import re
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from collc import grammar
from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.syntax import CollSyntaxError
from collc.limits import exceeded, limit

if TYPE_CHECKING:
    import lark
    from lark import Token, Tree
    from lark.exceptions import UnexpectedInput

    from collc.frontend.to_ast import ToAst

# Lark (about 25 ms to import, with its logging) and the transformer to the AST are
# imported by the functions below that parse text, not here: a compile that names
# stdlib topologies and collectives reads their cached trees and parses nothing.

START_RULES = ("module", "spec", "value")


@functools.lru_cache(maxsize=1)
def grammar_text() -> str:
    # From the package's folder (see collc.frontend.module.stdlib_root for why not
    # importlib.resources).
    return (Path(grammar.__file__ or "").parent / "coll.lark").read_text(encoding="utf-8")


@functools.lru_cache(maxsize=1)
def lark_parser() -> lark.Lark:
    import lark  # see the note at the imports

    # cache=True keeps the built LALR tables in the temporary directory, keyed by the
    # grammar's hash: building them takes ~0.1 s, loading them ~0.01 s.
    return lark.Lark(grammar_text(), parser="lalr", start=list(START_RULES), propagate_positions=True,
                     maybe_placeholders=True, cache=True)


def parse_tree(text: str, filename: str, start: str = "module") -> Tree:
    """The raw Lark parse tree (used to measure grammar coverage)."""
    check_nesting(text, filename)
    with _syntax_errors(text, filename):
        return lark_parser().parse(text, start=start)


def _to_ast(filename: str, text: str) -> ToAst:
    from collc.frontend.to_ast import ToAst  # with Lark: see the note at the imports

    return ToAst(filename, text)


def parse(text: str, filename: str) -> ast.Module:
    """Parse a whole .coll file."""
    tree = parse_tree(text, filename)
    with _syntax_errors(text, filename):
        module = _to_ast(filename, text).transform(tree)
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
        return _to_ast(filename, text).transform(tree)


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
        return _to_ast(filename, text).transform(tree)


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
    from lark.lexer import PatternStr  # with the parser: see the note at the imports

    out = {}
    for term in lark_parser().terminals:
        if isinstance(term.pattern, PatternStr):
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
    from lark.exceptions import UnexpectedInput, VisitError  # see the note at the imports

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
    from lark.exceptions import UnexpectedCharacters, UnexpectedEOF, UnexpectedToken  # raised by Lark: loaded

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
