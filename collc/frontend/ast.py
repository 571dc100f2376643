"""The .coll abstract syntax tree.

Every node carries the `Span` of the source it came from. Spans (and the spans of
names inside a node) do not take part in equality, so two parses of the same program
printed differently compare equal: that is what the printer's round-trip test relies
on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from collc.diagnostics import Span

NO_SPAN = Span("<none>", 1, 1)


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class Syntax:
    span: Span = _span()


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


@dataclass(frozen=True)
class Expr(Syntax):
    pass


@dataclass(frozen=True)
class Number(Expr):
    """A literal, optionally with a unit: `25 GB/s`, `0.7 us`, `8`."""

    value: int | float
    unit: str | None = None
    # The digits as written, so that printing keeps `0.7` rather than a float repr.
    text: str = field(default="", compare=False)


@dataclass(frozen=True)
class String(Expr):
    value: str


@dataclass(frozen=True)
class Bool(Expr):
    value: bool


@dataclass(frozen=True)
class Name(Expr):
    id: str


@dataclass(frozen=True)
class Index(Expr):
    base: Expr
    index: Expr


@dataclass(frozen=True)
class Attr(Expr):
    base: Expr
    name: str


@dataclass(frozen=True)
class Arg(Syntax):
    """A call argument; `name` is set for `name = value`."""

    value: Expr
    name: str | None = None


@dataclass(frozen=True)
class Call(Expr):
    func: str
    args: tuple[Arg, ...] = ()


@dataclass(frozen=True)
class Comprehension(Expr):
    """`sum(s in 0..ranks: chunk(s, j))`."""

    func: str
    var: str
    iterable: Expr
    body: Expr


@dataclass(frozen=True)
class SetLiteral(Expr):
    items: tuple[Expr, ...] = ()


@dataclass(frozen=True)
class Unary(Expr):
    op: UnaryOp
    operand: Expr


@dataclass(frozen=True)
class Binary(Expr):
    op: BinaryOp
    left: Expr
    right: Expr


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class Stmt(Syntax):
    pass


@dataclass(frozen=True)
class CallSpec(Syntax):
    """A definition applied to arguments: `ndv2(chassis = 2)`, `dgx1`."""

    name: str
    args: tuple[Arg, ...] = ()
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
class NodeDecl(Stmt):
    kind: NodeKindToken
    name: str
    count: Expr | None = None


@dataclass(frozen=True)
class PartDecl(Stmt):
    name: str
    count: Expr | None
    topology: CallSpec


@dataclass(frozen=True)
class LinkStmt(Stmt):
    src: Expr
    dst: Expr
    two_way: bool
    bandwidth: Expr | None = None
    latency: Expr | None = None
    multiplicity: Expr | None = None


@dataclass(frozen=True)
class Let(Stmt):
    name: str
    value: Expr


@dataclass(frozen=True)
class For(Stmt):
    var: str
    iterable: Expr
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class If(Stmt):
    cond: Expr
    then: tuple[Stmt, ...]
    # None: no else; a one-element tuple holding an If: `else if`.
    orelse: tuple[Stmt, ...] | None = None
    else_is_if: bool = False


@dataclass(frozen=True)
class Require(Stmt):
    cond: Expr
    message: str | None = None


@dataclass(frozen=True)
class InputDecl(Stmt):
    count: Expr


@dataclass(frozen=True)
class OutputDecl(Stmt):
    count: Expr


@dataclass(frozen=True)
class ScratchDecl(Stmt):
    count: Expr


@dataclass(frozen=True)
class Loc(Syntax):
    """`out[rank][slot]`; `slot` may be a Range."""

    buffer: BufferToken
    rank: Expr
    index: Expr


@dataclass(frozen=True)
class Pre(Stmt):
    loc: Loc
    value: Expr


@dataclass(frozen=True)
class Post(Stmt):
    loc: Loc
    value: Expr


@dataclass(frozen=True)
class Deliver(Stmt):
    value: Expr
    targets: Expr


@dataclass(frozen=True)
class Transfer(Stmt):
    """`copy A -> B;` or `reduce A -> B;` (B += A)."""

    kind: TransferKind
    src: Loc
    dst: Loc


# --- definitions and the module ------------------------------------------------------

@dataclass(frozen=True)
class Param(Syntax):
    name: str
    default: Expr | None = None


@dataclass(frozen=True)
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


@dataclass(frozen=True)
class TopologyDef(Definition):
    @property
    def kind_word(self) -> str:
        return "topology"


@dataclass(frozen=True)
class CollectiveDef(Definition):
    @property
    def kind_word(self) -> str:
        return "collective"


@dataclass(frozen=True)
class AlgorithmDef(Definition):
    collective: str = ""
    collective_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)

    @property
    def kind_word(self) -> str:
        return "algorithm"


@dataclass(frozen=True)
class Import(Syntax):
    """`import topologies.ndv2;` (module set) or `import "file.coll";` (path set)."""

    module: str | None = None
    path: str | None = None


@dataclass(frozen=True)
class Compile(Syntax):
    collective: CallSpec
    topology: CallSpec
    size: Expr | None = None
    using: CallSpec | None = None


@dataclass(frozen=True)
class PipelineSetting(Syntax):
    """`microbatches = 8;` in a pipeline declaration."""

    name: str
    value: Expr
    name_span: Span = field(default=NO_SPAN, compare=False, repr=False, kw_only=True)


@dataclass(frozen=True)
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


@dataclass(frozen=True)
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
