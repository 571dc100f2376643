"""Static checks of a loaded module, before anything is instantiated.

Each statement must belong to the kind of body it is in, every name must be defined
before use (parameters, `let`s, loop variables, the builtins of the context, the
module's constants), node references in links must start at a declared node or part,
and every topology, collective and part named must be visible. Pipelines are checked
for their names, settings and required settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.evaluate import STANDARD_FUNCTIONS, suggest, unknown_name_error
from collc.frontend.module import Module
from collc.ir.collective import DEMAND_NAME

TOPOLOGY, COLLECTIVE, ALGORITHM = "topology", "collective", "algorithm"

_OWN_STATEMENTS: dict[str, tuple[type, ...]] = {
    TOPOLOGY: (ast.NodeDecl, ast.PartDecl, ast.LinkStmt),
    COLLECTIVE: (ast.InputDecl, ast.OutputDecl, ast.Pre, ast.Post, ast.Deliver),
    ALGORITHM: (ast.ScratchDecl, ast.Transfer),
}
_STATEMENT_WORDS: dict[type, str] = {
    ast.NodeDecl: "node declarations", ast.PartDecl: "`part` statements", ast.LinkStmt: "`link` statements",
    ast.InputDecl: "`input` declarations", ast.OutputDecl: "`output` declarations",
    ast.Pre: "`pre` statements", ast.Post: "`post` statements", ast.Deliver: "`deliver` statements",
    ast.ScratchDecl: "`scratch` declarations", ast.Transfer: "`copy` and `reduce` statements",
}
_HOME = {t: kind for kind, types in _OWN_STATEMENTS.items() for t in types}

# Names each kind of body may use without defining them.
BUILTIN_NAMES: dict[str, tuple[str, ...]] = {
    TOPOLOGY: (),
    COLLECTIVE: ("ranks",),
    ALGORITHM: ("ranks", "chunks", "root", "ring", "tree_order", "tree_parent"),
}


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


class StaticScope:
    """The names defined at a point of a body (and where), for the static checks."""

    def __init__(self, parent: "StaticScope | None" = None):
        self.parent = parent
        self.names: dict[str, Span | None] = {}

    def find(self, name: str) -> tuple[bool, Span | None]:
        scope: StaticScope | None = self
        while scope is not None:
            if name in scope.names:
                return True, scope.names[name]
            scope = scope.parent
        return False, None

    def visible(self) -> set[str]:
        out: set[str] = set()
        scope: StaticScope | None = self
        while scope is not None:
            out |= set(scope.names)
            scope = scope.parent
        return out

    def define(self, name: str, span: Span, groups: dict[str, Span]) -> None:
        if name in groups:
            raise CollcError(f"'{name}' already names a node or part (declared at {groups[name]}); "
                             "choose another name", span)
        found, where = self.find(name)
        if found:
            origin = f"defined at {where}" if where is not None else "a builtin"
            raise CollcError(f"'{name}' is already defined ({origin}); choose another name", span)
        self.names[name] = span

    def child(self) -> "StaticScope":
        return StaticScope(self)


def constants_scope(module: Module) -> StaticScope:
    """A scope holding the module's `let` constants (what every body sees first)."""
    scope = StaticScope()
    for let in module.syntax.constants:
        scope.names[let.name] = let.span
    return scope


def check_module(module: Module) -> None:
    constants = StaticScope()
    builtins = {name for names in BUILTIN_NAMES.values() for name in names}
    for let in module.syntax.constants:
        BodyChecker(module, TOPOLOGY, {}, None).expr(let.value, constants)
        if let.name in builtins:
            raise CollcError(f"'{let.name}' is a builtin name in collectives and algorithms; choose another name",
                             let.span)
        constants.define(let.name, let.span, {})
    for d in module.syntax.definitions:
        kind = d.kind_word
        _check_definition(module, d, kind, constants_scope(module))
    for req in module.syntax.requests:
        if req.collective.name != DEMAND_NAME or module.find_collective(DEMAND_NAME) is not None:
            module.lookup_collective(req.collective.name, req.collective.name_span)  # else a demand matrix
        module.lookup_topology(req.topology.name, req.topology.name_span)
        checker = BodyChecker(module, TOPOLOGY, {}, None)
        for spec in (req.collective, req.topology, req.using):
            if spec is not None:
                for a in spec.args:
                    checker.expr(a.value, constants)
        if req.size is not None:
            checker.expr(req.size, constants)


def _check_definition(module: Module, d: ast.Definition, kind: str, constants: StaticScope) -> None:
    root_owner: str | None = None
    if isinstance(d, ast.AlgorithmDef):
        coll = module.lookup_collective(d.collective, d.collective_span)
        if not any(p.name == "root" for p in coll.defn.params):
            root_owner = d.collective
    groups = _declared_groups(d.body) if kind == TOPOLOGY else {}
    checker = BodyChecker(module, kind, groups, root_owner)
    scope = constants.child()
    for name in BUILTIN_NAMES[kind]:
        scope.names[name] = None
    seen: dict[str, Span] = {}
    for p in d.params:
        if p.name in seen:
            raise CollcError(f"parameter '{p.name}' is declared twice", p.span)
        seen[p.name] = p.span
        if p.default is not None:
            checker.expr(p.default, scope)
        scope.define(p.name, p.span, groups)
    checker.stmts(d.body, scope.child())


def _declared_groups(stmts: tuple[ast.Stmt, ...]) -> dict[str, Span]:
    """Node and part names declared anywhere in a topology body (first declaration)."""
    out: dict[str, Span] = {}
    for s in stmts:
        if isinstance(s, (ast.NodeDecl, ast.PartDecl)):
            out.setdefault(s.name, s.span)
        elif isinstance(s, ast.For):
            for k, v in _declared_groups(s.body).items():
                out.setdefault(k, v)
        elif isinstance(s, ast.If):
            for k, v in {**_declared_groups(s.orelse or ()), **_declared_groups(s.then)}.items():
                out.setdefault(k, v)
    return out


class BodyChecker:
    """Checks the statements and expressions of one kind of body (a topology, collective or
    algorithm; pipelines are checked as topology-level expressions)."""

    def __init__(self, module: Module, kind: str, groups: dict[str, Span], root_owner: str | None):
        self.module = module
        self.kind = kind
        self.groups = groups
        self.root_owner = root_owner  # set when `root` is not available: the collective's name
        self.functions = set(STANDARD_FUNCTIONS) | ({"chunk"} if kind == COLLECTIVE else set())

    # --- statements ---
    def stmts(self, stmts: tuple[ast.Stmt, ...], scope: StaticScope) -> None:
        for s in stmts:
            self.stmt(s, scope)

    def stmt(self, s: ast.Stmt, scope: StaticScope) -> None:
        home = _HOME.get(type(s))
        if home is not None and home != self.kind:
            raise CollcError(f"{_STATEMENT_WORDS[type(s)]} belong in {_a(home)}, not in {_a(self.kind)}", s.span)
        if isinstance(s, ast.Let):
            self.expr(s.value, scope)
            scope.define(s.name, s.span, self.groups)
        elif isinstance(s, ast.For):
            self.expr(s.iterable, scope)
            inner = scope.child()
            inner.define(s.var, s.span, self.groups)
            self.stmts(s.body, inner)
        elif isinstance(s, ast.If):
            self.expr(s.cond, scope)
            self.stmts(s.then, scope.child())
            if s.orelse is not None:
                self.stmts(s.orelse, scope.child())
        elif isinstance(s, ast.Require):
            self.expr(s.cond, scope)
        elif isinstance(s, ast.NodeDecl):
            for e in (s.count, s.sms):
                if e is not None:
                    self.expr(e, scope)
        elif isinstance(s, ast.PartDecl):
            if s.count is not None:
                self.expr(s.count, scope)
            self.module.lookup_topology(s.topology.name, s.topology.name_span)
            for a in s.topology.args:
                self.expr(a.value, scope)
        elif isinstance(s, ast.LinkStmt):
            self.endpoint(s.src, scope)
            self.endpoint(s.dst, scope)
            for e in (s.bandwidth, s.latency, s.multiplicity):
                if e is not None:
                    self.expr(e, scope)
        elif isinstance(s, (ast.InputDecl, ast.OutputDecl, ast.ScratchDecl)):
            self.expr(s.count, scope)
        elif isinstance(s, (ast.Pre, ast.Post)):
            self.loc(s.loc, scope)
            self.expr(s.value, scope)
        elif isinstance(s, ast.Deliver):
            self.expr(s.value, scope)
            self.expr(s.targets, scope)
        elif isinstance(s, ast.Transfer):
            self.loc(s.src, scope)
            self.loc(s.dst, scope)
        else:  # pragma: no cover - every statement type is handled above
            raise CollcError(f"unexpected statement {type(s).__name__}", s.span)

    def loc(self, loc: ast.Loc, scope: StaticScope) -> None:
        self.expr(loc.rank, scope)
        self.expr(loc.index, scope)

    def endpoint(self, e: ast.Expr, scope: StaticScope) -> None:
        """`g[i]`, `sw`, `c[k].g[3]`: the leftmost name is a node or part."""
        if isinstance(e, ast.Name):
            if e.id not in self.groups:
                hint = suggest(e.id, set(self.groups))
                msg = f"no node or part named '{e.id}' is declared in this topology"
                if hint:
                    msg += f"; did you mean '{hint}'?"
                raise CollcError(msg, e.span)
        elif isinstance(e, ast.Index):
            self.endpoint(e.base, scope)
            self.expr(e.index, scope)
        elif isinstance(e, ast.Attr):
            self.endpoint(e.base, scope)
        else:
            raise CollcError("a link joins nodes: write a node such as `g[0]`, `sw` or `box[1].g[3]`", e.span)

    # --- expressions ---
    def expr(self, e: ast.Expr, scope: StaticScope) -> None:
        if isinstance(e, ast.Name):
            self.name(e, scope)
        elif isinstance(e, ast.Binary):
            self.expr(e.left, scope)
            self.expr(e.right, scope)
        elif isinstance(e, ast.Unary):
            self.expr(e.operand, scope)
        elif isinstance(e, ast.Range):
            self.expr(e.start, scope)
            self.expr(e.stop, scope)
        elif isinstance(e, ast.Index):
            self.expr(e.base, scope)
            self.expr(e.index, scope)
        elif isinstance(e, ast.Attr):
            raise CollcError(f"'.{e.name}' selects a node of a part; it can only appear in a link", e.span)
        elif isinstance(e, ast.Call):
            if e.func not in self.functions:
                if e.func == "chunk":
                    raise CollcError("`chunk(rank, index)` names input chunks; it can only appear in a "
                                     "collective", e.span)
                hint = suggest(e.func, self.functions)
                raise CollcError(f"unknown function '{e.func}'" + (f"; did you mean '{hint}'?" if hint else ""),
                                 e.span)
            for a in e.args:
                self.expr(a.value, scope)
        elif isinstance(e, ast.Comprehension):
            if e.func != "sum":
                raise CollcError(f"`{e.func}(v in ...: ...)` is not a known reduction; only `sum` is", e.span)
            self.expr(e.iterable, scope)
            inner = scope.child()
            inner.define(e.var, e.span, self.groups)
            self.expr(e.body, inner)
        elif isinstance(e, ast.SetLiteral):
            for item in e.items:
                self.expr(item, scope)

    def name(self, e: ast.Name, scope: StaticScope) -> None:
        found, _ = scope.find(e.id)
        if found:
            if e.id == "root" and self.root_owner is not None:
                raise CollcError(f"'root' is not available: collective {self.root_owner} has no root parameter",
                                 e.span)
            return
        if e.id in self.groups:
            raise CollcError(f"'{e.id}' is a node or part; it can only be used in a link", e.span)
        raise unknown_name_error(e.id, scope.visible(), e.span)


# --- pipelines -----------------------------------------------------------------------

# Settings of a `pipeline` declaration (evaluated by `eval/pipeline.py`).
@dataclass(frozen=True)
class SettingInfo:
    what: str  # for messages and docs
    required: bool = False


SETTINGS: dict[str, SettingInfo] = {
    "stages": SettingInfo("the number of pipeline stages"),
    "gpus": SettingInfo("the GPUs of each stage: a set per stage, one GPU per data-parallel replica"),
    "data_parallel": SettingInfo("data-parallel replicas of the whole pipeline"),
    "microbatches": SettingInfo("micro-batches per step", required=True),
    "schedule": SettingInfo('"gpipe", "1f1b", "interleaved", "zb-h1", or a schedule .csv file', required=True),
    "chunks": SettingInfo("model chunks per stage (interleaved 1F1B)"),
    "forward": SettingInfo("forward time of one micro-batch, per stage", required=True),
    "backward": SettingInfo("full backward time of one micro-batch, per stage", required=True),
    "backward_weight": SettingInfo("the weight-gradient part of the backward, per stage"),
    "activations": SettingInfo("bytes sent from one stage to the next per micro-batch"),
    "gradients": SettingInfo("gradient bytes of each stage (held, and combined across replicas)"),
    "gradient_collective": SettingInfo('"allreduce" or "reducescatter+allgather"'),
    "device_memory": SettingInfo("memory of one GPU"),
    "weights": SettingInfo("weight bytes per stage"),
    "optimizer": SettingInfo("optimizer-state bytes per stage"),
    "activation_memory": SettingInfo("activation bytes a stage keeps per in-flight micro-batch"),
}


def check_pipelines(module: Module) -> None:
    """Names, duplicates and required settings of every pipeline in a module."""
    seen: dict[str, Span] = {}
    for p in module.syntax.pipelines:
        if p.name in seen:
            raise CollcError(f"pipeline '{p.name}' is defined twice (first at {seen[p.name]})", p.name_span)
        seen[p.name] = p.span
        module.lookup_topology(p.topology.name, p.topology.name_span)
        checker = BodyChecker(module, TOPOLOGY, {}, None)
        scope = constants_scope(module).child()
        for param in p.params:
            if param.default is not None:
                checker.expr(param.default, scope)
            scope.define(param.name, param.span, {})
        for a in p.topology.args:
            checker.expr(a.value, scope)
        given: dict[str, Span] = {}
        for s in p.settings:
            if s.name not in SETTINGS:
                hint = suggest(s.name, list(SETTINGS))
                raise CollcError(f"unknown pipeline setting '{s.name}'" + (f"; did you mean '{hint}'?" if hint else
                                 f" (known: {', '.join(SETTINGS)})"), s.name_span)
            if s.name in given:
                raise CollcError(f"setting '{s.name}' is given twice (first at {given[s.name]})", s.name_span)
            given[s.name] = s.span
            checker.expr(s.value, scope)
        missing = [n for n, info in SETTINGS.items() if info.required and n not in given]
        if "stages" not in given and "gpus" not in given:
            missing.insert(0, "stages")
        if missing:
            raise CollcError(f"pipeline '{p.name}' needs {', '.join(f'`{n} = ...;`' for n in missing)} "
                             f"({'; '.join(SETTINGS[n].what for n in missing)})", p.name_span)
