"""The .coll abstract syntax tree.

Every node carries the `Span` of the source it came from. Spans (and the spans of
names inside a node) do not take part in equality, so two parses of the same program
printed differently compare equal: that is what the printer's round-trip test relies
on.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any, Callable

from collc.diagnostics import Span

NO_SPAN = Span("<none>", 1, 1)

# Every node class is a frozen dataclass whose equality, hash and repr are `Syntax`'s,
# written once below with the meaning the dataclass decorator gives them (fields with
# compare=False left out of == and hash, fields with repr=False out of the repr). The
# decorator compiles each method it generates on its own, for every class: for the
# forty node classes that was ~10 ms of every command that reads a .coll file.
node = dataclass(frozen=True, eq=False, repr=False)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@node
class Syntax:
    span: Span = _span()

    def __eq__(self, other: object) -> Any:
        if other.__class__ is self.__class__:
            return _compared_of(self.__class__)(self) == _compared_of(self.__class__)(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(_compared_of(self.__class__)(self))

    @reprlib.recursive_repr()
    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        return f"{self.__class__.__qualname__}({shown})"


_COMPARED: dict[type, Callable[[Syntax], tuple[Any, ...]]] = {}


def _compared_of(cls: type) -> Callable[[Syntax], tuple[Any, ...]]:
    """The tuple a node of `cls` is compared and hashed by: its compare=True fields in
    order (the dataclass decorator's `__eq__` and `__hash__`)."""
    compared = _COMPARED.get(cls)
    if compared is None:
        names = tuple(f.name for f in fields(cls) if f.compare)
        compared = _COMPARED[cls] = lambda obj: tuple([getattr(obj, name) for name in names])
    return compared


# --- expressions ---------------------------------------------------------------------

class BinaryOp(str, Enum):
    """Binary operators; values are the source tokens."""

    OR = "or"
    AND = "and"
    EQ = "=="
    NE = "!="
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    ADD = "+"
    SUB = "-"
    MUL = "*"
    DIV = "/"
    FLOORDIV = "//"
    MOD = "%"


class UnaryOp(str, Enum):
    NEG = "-"
    NOT = "not"


@node
class Expr(Syntax):
    pass


@node
class Number(Expr):
    """A literal, optionally with a unit: `25 GB/s`, `0.7 us`, `8`."""

    value: int | float
    unit: str | None = None
    # The digits as written, so that printing keeps `0.7` rather than a float repr.
    text: str = field(default="", compare=False)


@node
class String(Expr):
    value: str


@node
class Bool(Expr):
    value: bool


@node
class Name(Expr):
    id: str


@node
class Index(Expr):
    base: Expr
    index: Expr


@node
class Attr(Expr):
    base: Expr
    name: str


@node
class Arg(Syntax):
    """A call argument; `name` is set for `name = value`."""

    value: Expr
    name: str | None = None


@node
class Call(Expr):
    func: str
    args: tuple[Arg, ...] = ()


@node
class Comprehension(Expr):
    """`sum(s in 0..ranks: chunk(s, j))`."""

    func: str
    var: str
    iterable: Expr
    body: Expr


@node
class SetLiteral(Expr):
    items: tuple[Expr, ...] = ()


@node
class Unary(Expr):
    op: UnaryOp
    operand: Expr


@node
class Binary(Expr):
    op: BinaryOp
    left: Expr
    right: Expr


@node
class Range(Expr):
    """`start..stop`, half-open."""

    start: Expr
    stop: Expr


# --- statements ----------------------------------------------------------------------

class NodeKindToken(str, Enum):
    GPU = "gpu"
    SWITCH = "switch"
    NIC = "nic"


class BufferToken(str, Enum):
    """Buffer names as written in .coll (the IR's `Buffer` uses MSCCL's letters)."""

    IN = "in"
    OUT = "out"
    SCRATCH = "scratch"


class TransferKind(str, Enum):
    COPY = "copy"
    REDUCE = "reduce"


@node
class Stmt(Syntax):
    pass


@node
class CallSpec(Syntax):
    """A definition applied to arguments: `ndv2(chassis = 2)`, `dgx1`."""

    name: str
    args: tuple[Arg, ...] = ()
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@node
class NodeDecl(Stmt):
    kind: NodeKindToken
    name: str
    count: Expr | None = None
    sms: Expr | None = None  # `gpu g[8] sms 80;`: streaming multiprocessors (CUs) per GPU


@node
class PartDecl(Stmt):
    name: str
    count: Expr | None
    topology: CallSpec


@node
class LinkStmt(Stmt):
    src: Expr
    dst: Expr
    two_way: bool
    bandwidth: Expr | None = None
    latency: Expr | None = None
    multiplicity: Expr | None = None


@node
class Let(Stmt):
    name: str
    value: Expr


@node
class For(Stmt):
    var: str
    iterable: Expr
    body: tuple[Stmt, ...]


@node
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    # None: no else; a one-element tuple holding an If: `else if`.
    orelse: tuple[Stmt, ...] | None = None
    else_is_if: bool = False


@node
class Require(Stmt):
    cond: Expr
    message: str | None = None


@node
class InputDecl(Stmt):
    count: Expr


@node
class OutputDecl(Stmt):
    count: Expr


@node
class ScratchDecl(Stmt):
    count: Expr


@node
class Loc(Syntax):
    """`out[rank][slot]`; `slot` may be a Range."""

    buffer: BufferToken
    rank: Expr
    index: Expr


@node
class Pre(Stmt):
    loc: Loc
    value: Expr


@node
class Post(Stmt):
    loc: Loc
    value: Expr


@node
class Deliver(Stmt):
    value: Expr
    targets: Expr


@node
class Transfer(Stmt):
    """`copy A -> B;` or `reduce A -> B;` (B += A)."""

    kind: TransferKind
    src: Loc
    dst: Loc


# --- definitions and the module ------------------------------------------------------

@node
class Param(Syntax):
    name: str
    default: Expr | None = None


@node
class Definition(Syntax):
    name: str
    params: tuple[Param, ...]
    body: tuple[Stmt, ...]
    # The comment block right above the definition, without comment markers.
    doc: str = ""
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)
    # Whether the source wrote a parameter list; `dgx1` and `dgx1()` mean the same.
    has_param_list: bool = field(default=False, compare=False, kw_only=True)

    @property
    def kind_word(self) -> str:
        raise NotImplementedError


@node
class TopologyDef(Definition):
    @property
    def kind_word(self) -> str:
        return "topology"


@node
class CollectiveDef(Definition):
    @property
    def kind_word(self) -> str:
        return "collective"


@node
class AlgorithmDef(Definition):
    collective: str = ""
    collective_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)

    @property
    def kind_word(self) -> str:
        return "algorithm"


@node
class Import(Syntax):
    """`import topologies.ndv2;` (module set) or `import "file.coll";` (path set)."""

    module: str | None = None
    path: str | None = None


@node
class Compile(Syntax):
    collective: CallSpec
    topology: CallSpec
    size: Expr | None = None
    using: CallSpec | None = None


@node
class PipelineSetting(Syntax):
    """`microbatches = 8;` in a pipeline declaration."""

    name: str
    value: Expr
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@node
class PipelineDef(Syntax):
    """`pipeline NAME(params) on TOPOLOGY { setting = value; ... }`: one pipeline-parallel
    training step. Not a `Definition` (it has settings, not statements)."""

    name: str
    params: tuple[Param, ...]
    topology: CallSpec
    settings: tuple[PipelineSetting, ...] = ()
    doc: str = ""
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)
    has_param_list: bool = field(default=False, compare=False, kw_only=True)

    @property
    def kind_word(self) -> str:
        return "pipeline"


Item = Import | TopologyDef | CollectiveDef | AlgorithmDef | Compile | Let | PipelineDef


@node
class Module(Syntax):
    filename: str = field(compare=False)
    items: tuple[Item, ...] = ()

    @property
    def imports(self) -> list[Import]:
        return [i for i in self.items if isinstance(i, Import)]

    @property
    def definitions(self) -> list[Definition]:
        return [i for i in self.items if isinstance(i, Definition)]

    @property
    def requests(self) -> list[Compile]:
        return [i for i in self.items if isinstance(i, Compile)]

    @property
    def constants(self) -> list[Let]:
        return [i for i in self.items if isinstance(i, Let)]

    @property
    def pipelines(self) -> list[PipelineDef]:
        return [i for i in self.items if isinstance(i, PipelineDef)]
