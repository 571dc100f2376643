"""Elaborating a topology definition into the IR `Topology`.

Nodes are named as the source refers to them: `g[3]` for member 3 of `gpu g[8]`,
`sw` for `switch sw`, `c[1].g[3]` for node `g[3]` of part `c[1]`. GPUs get ranks in
declaration order, a part's GPUs at the point the part is declared, parts in index
order. A two-way link is two directed links; links declared more than once between
the same ordered pair merge into one with the multiplicities added.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.evaluate import Evaluator, Scope, as_dim, as_int, suggest
from collc.frontend.module import Entry
from collc.frontend.printer import format_expr
from collc.frontend.runner import BodyRunner, bind_args, called_from, evaluate_args, instance_name, params_scope
from collc.frontend.values import BANDWIDTH, TIME, Quantity, format_quantity
from collc.ir.topology import Link, Node, NodeKind, Topology
from collc.limits import exceeded, int_limit, limit

# Latency of a link that states none.
DEFAULT_LATENCY = 0.0
# More nodes in one declaration than any real machine has is a mistake in the program.
MAX_GROUP = 100_000
# SMs (CUs) per GPU: today's largest GPUs have under 320; ten times that is a typo.
MAX_SMS = 4096


@dataclass
class PartInstance:
    prefix: str  # "c[1]." - prepended to the part's node names
    groups: dict[str, "Group"]


@dataclass
class Group:
    """A declared name: a node group (`gpu g[8]`), a single node, or a part."""

    name: str
    kind: str  # a NodeKind value, or "part"
    count: int | None  # None: declared without `[count]`
    span: Span
    members: list[Any]  # node names, or PartInstances for a part

    def prefixed(self, prefix: str) -> "Group":
        if self.kind == "part":
            members = [PartInstance(prefix + m.prefix, {k: g.prefixed(prefix) for k, g in m.groups.items()})
                       for m in self.members]
        else:
            members = [prefix + m for m in self.members]
        return Group(self.name, self.kind, self.count, self.span, members)


@dataclass
class LinkInfo:
    bandwidth: float
    latency: float
    multiplicity: int
    span: Span


@dataclass
class Elaborated:
    """A topology instance before rank assignment: what parts are made of."""

    name: str
    description: str
    nodes: list[tuple[str, NodeKind]] = field(default_factory=list)
    groups: dict[str, Group] = field(default_factory=dict)
    links: dict[tuple[str, str], LinkInfo] = field(default_factory=dict)
    sms: dict[str, int] = field(default_factory=dict)  # GPU name -> SMs, where declared

    def prefixed(self, prefix: str) -> "Elaborated":
        return Elaborated(
            self.name, self.description,
            [(prefix + n, k) for n, k in self.nodes],
            {k: g.prefixed(prefix) for k, g in self.groups.items()},
            {(prefix + a, prefix + b): info for (a, b), info in self.links.items()},
            {prefix + n: s for n, s in self.sms.items()},
        )

    def to_ir(self) -> Topology:
        nodes = []
        rank = 0
        for name, kind in self.nodes:
            if kind is NodeKind.GPU:
                nodes.append(Node(name, kind, rank, self.sms.get(name)))
                rank += 1
            else:
                nodes.append(Node(name, kind, None))
        links = tuple(Link(a, b, i.bandwidth, i.latency, i.multiplicity) for (a, b), i in self.links.items())
        return Topology(self.name, tuple(nodes), links, self.description)


def _same(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


def add_link(elab: Elaborated, src: str, dst: str, info: LinkInfo) -> None:
    old = elab.links.get((src, dst))
    if old is None:
        elab.links[(src, dst)] = info
        return
    for what, new_v, old_v, dim in (("bandwidth", info.bandwidth, old.bandwidth, BANDWIDTH),
                                    ("latency", info.latency, old.latency, TIME)):
        if not _same(new_v, old_v):
            raise CollcError(
                f"link {src} -> {dst} is declared again with {what} {format_quantity(Quantity(new_v, dim))}, "
                f"but its declaration at {old.span} has {format_quantity(Quantity(old_v, dim))}; links between "
                "the same two nodes must agree on bandwidth and latency (their multiplicities add)", info.span)
    elab.links[(src, dst)] = LinkInfo(old.bandwidth, old.latency, old.multiplicity + info.multiplicity, old.span)


# --- elaboration --------------------------------------------------------------------

# Instances already elaborated live on the module that defines them (`Module.elaborated`).
MAX_PART_DEPTH = 32

# The instances being elaborated, outermost first, as (key, name): parts inside parts,
# to catch a topology containing itself.
Chain = tuple[tuple[tuple, str], ...]


def elaborate(entry: Entry, args: Sequence[tuple[str | None, Any, Span]], call_span: Span | None,
              chain: Chain = ()) -> Elaborated:
    """Instantiate a topology definition with arguments (name or None, value, span)."""
    defn = entry.defn
    ev = Evaluator()
    bound = bind_args(defn, args, call_span, entry.module.constants, ev)
    key = (id(defn), bound.key())
    cache = entry.module.elaborated
    cached = cache.get(key)
    if cached is not None and cached[0] is defn:
        return cached[1]
    name = instance_name(defn, bound)
    if any(k == key for k, _ in chain):
        names = " -> ".join([n for _, n in chain] + [name])
        raise CollcError(f"topology {name} contains itself through its parts ({names})", call_span)
    if len(chain) >= MAX_PART_DEPTH:
        raise CollcError(f"parts are nested more than {MAX_PART_DEPTH} deep", call_span)
    elab = Elaborated(name, defn.doc)
    scope = params_scope(entry.module.constants, defn, bound)
    with called_from(f"topology {elab.name}", call_span):
        _TopologyRunner(ev, entry, elab, (*chain, (key, name))).run(defn.body, scope.child())
    cache[key] = (defn, elab)
    return elab


def instantiate(entry: Entry, args: Sequence[tuple[str | None, Any, Span]], call_span: Span | None) -> Topology:
    """A topology used as the target of a collective: it must have GPUs."""
    elab = elaborate(entry, args, call_span)
    gpus = sum(1 for _, kind in elab.nodes if kind is NodeKind.GPU)
    if gpus > int_limit("ranks"):
        raise CollcError(f"topology '{elab.name}' has {gpus:,} GPUs" + exceeded("ranks"),
                         call_span or entry.defn.name_span)
    topo = elab.to_ir()
    if topo.num_ranks == 0:
        raise CollcError(f"topology '{topo.name}' has no GPUs", call_span or entry.defn.name_span)
    return topo


class _TopologyRunner(BodyRunner):
    def __init__(self, ev: Evaluator, entry: Entry, elab: Elaborated, chain: Chain):
        super().__init__(ev)
        self.chain = chain
        self.entry = entry
        self.elab = elab
        self.link_statements = 0  # links declared (merged ones too), against the `links` limit
        self.gpus = 0  # against the `ranks` limit, checked as GPUs are declared
        self.declared = {g: s for g, s in _all_declarations(entry.defn.body)}

    def statement(self, stmt: ast.Stmt, scope: Scope) -> None:
        if isinstance(stmt, ast.NodeDecl):
            self._node_decl(stmt, scope)
        elif isinstance(stmt, ast.PartDecl):
            self._part_decl(stmt, scope)
        elif isinstance(stmt, ast.LinkStmt):
            self._link(stmt, scope)
        else:
            super().statement(stmt, scope)

    # --- declarations ---
    def _count(self, expr: ast.Expr | None, scope: Scope, what: str) -> int | None:
        if expr is None:
            return None
        n = as_int(self.ev.eval(expr, scope), expr.span, f"the number of {what}")
        if n < 1:
            raise CollcError(f"the number of {what} must be at least 1, got {n}", expr.span)
        if n > MAX_GROUP:
            raise CollcError(f"the number of {what} is {n}; at most {MAX_GROUP} are supported", expr.span)
        return n

    def _declare(self, group: Group) -> None:
        old = self.elab.groups.get(group.name)
        if old is not None:
            raise CollcError(f"duplicate node name '{group.name}' (first declared at {old.span})", group.span)
        self.elab.groups[group.name] = group

    def _node_decl(self, stmt: ast.NodeDecl, scope: Scope) -> None:
        count = self._count(stmt.count, scope, f"{stmt.kind.value}s in '{stmt.name}'")
        self._check_nodes(count or 1, stmt.span)
        if stmt.kind.value == NodeKind.GPU.value:
            self._check_gpus(count or 1, stmt.span)
        names = [stmt.name] if count is None else [f"{stmt.name}[{i}]" for i in range(count)]
        self._declare(Group(stmt.name, stmt.kind.value, count, stmt.span, names))
        kind = NodeKind(stmt.kind.value)
        self.elab.nodes.extend((n, kind) for n in names)
        if stmt.sms is not None:
            sms = self._sms(stmt, scope)
            self.elab.sms.update((n, sms) for n in names)

    def _sms(self, stmt: ast.NodeDecl, scope: Scope) -> int:
        assert stmt.sms is not None
        if stmt.kind.value != "gpu":
            raise CollcError(f"only a GPU has streaming multiprocessors; `sms` on a {stmt.kind.value} means "
                             "nothing", stmt.sms.span)
        sms = as_int(self.ev.eval(stmt.sms, scope), stmt.sms.span, "a GPU's number of SMs")
        if not 1 <= sms <= MAX_SMS:
            raise CollcError(f"a GPU's number of SMs must be between 1 and {MAX_SMS}, got {sms}", stmt.sms.span)
        return sms

    def _part_decl(self, stmt: ast.PartDecl, scope: Scope) -> None:
        count = self._count(stmt.count, scope, f"parts in '{stmt.name}'")
        spec = stmt.topology
        target = self.entry.module.lookup_topology(spec.name, spec.name_span)
        sub = elaborate(target, evaluate_args(spec.args, scope, self.ev), spec.span, self.chain)
        # Checked before copying: parts of parts multiply (32 parts of 32 parts of ...).
        self._check_nodes((count or 1) * len(sub.nodes), stmt.span)
        self._check_gpus((count or 1) * sum(1 for _, kind in sub.nodes if kind is NodeKind.GPU), stmt.span)
        if len(self.elab.links) + (count or 1) * len(sub.links) > int_limit("links"):
            raise CollcError(f"these parts bring the topology to {len(self.elab.links) + (count or 1) * len(sub.links):,} "
                             "links" + exceeded("links"), stmt.span)
        prefixes = [f"{stmt.name}."] if count is None else [f"{stmt.name}[{k}]." for k in range(count)]
        members = []
        for prefix in prefixes:
            inst = sub.prefixed(prefix)
            self.elab.nodes.extend(inst.nodes)
            self.elab.sms.update(inst.sms)
            for (a, b), info in inst.links.items():
                add_link(self.elab, a, b, info)
            members.append(PartInstance(prefix, inst.groups))
        self._declare(Group(stmt.name, "part", count, stmt.span, members))

    def _check_gpus(self, more: int, span: Span) -> None:
        self.gpus += more
        if self.gpus > int_limit("ranks"):
            raise CollcError(f"this declaration brings the topology to {self.gpus:,} GPUs" + exceeded("ranks"), span)

    def _check_nodes(self, more: int, span: Span) -> None:
        total = len(self.elab.nodes) + more
        if total > int_limit("nodes"):
            raise CollcError(f"this declaration brings the topology to {total:,} nodes" + exceeded("nodes"), span)

    # --- links ---
    def _link(self, stmt: ast.LinkStmt, scope: Scope) -> None:
        self.link_statements += 1
        if self.link_statements > int_limit("links"):
            raise CollcError(f"this topology declares more than {int_limit('links'):,} links" + exceeded("links"),
                             stmt.span)
        src = self._endpoint(stmt.src, scope)
        dst = self._endpoint(stmt.dst, scope)
        if src == dst:
            raise CollcError(f"a link must join two different nodes, but both ends are {src}", stmt.span)
        if stmt.bandwidth is None:
            raise CollcError("a link needs a bandwidth, e.g. `bw 25 GB/s`", stmt.span)
        bw = as_dim(self.ev.eval(stmt.bandwidth, scope), BANDWIDTH, stmt.bandwidth.span, "a link's bandwidth")
        if not bw > 0:  # also NaN
            raise CollcError(f"a link's bandwidth must be positive, got {format_quantity(Quantity(bw, BANDWIDTH))}",
                             stmt.bandwidth.span)
        if not bw <= limit("bandwidth"):
            raise CollcError(f"a link's bandwidth of {format_quantity(Quantity(bw, BANDWIDTH))} is beyond any "
                             "real link" + exceeded("bandwidth"), stmt.bandwidth.span)
        lat = DEFAULT_LATENCY
        if stmt.latency is not None:
            lat = as_dim(self.ev.eval(stmt.latency, scope), TIME, stmt.latency.span, "a link's latency")
            if not lat >= 0:  # also NaN
                raise CollcError(f"a link's latency cannot be negative, got {format_quantity(Quantity(lat, TIME))}",
                                 stmt.latency.span)
            if not lat <= limit("latency"):
                raise CollcError(f"a link's latency of {format_quantity(Quantity(lat, TIME))} is beyond any real "
                                 "link" + exceeded("latency"), stmt.latency.span)
        mult = 1
        if stmt.multiplicity is not None:
            mult = as_int(self.ev.eval(stmt.multiplicity, scope), stmt.multiplicity.span, "a link's multiplicity")
            if mult < 1:
                raise CollcError(f"a link's multiplicity must be at least 1, got {mult}", stmt.multiplicity.span)
        add_link(self.elab, src, dst, LinkInfo(bw, lat, mult, stmt.span))
        if stmt.two_way:
            add_link(self.elab, dst, src, LinkInfo(bw, lat, mult, stmt.span))

    def _endpoint(self, expr: ast.Expr, scope: Scope) -> str:
        found = self._resolve(expr, scope)
        if isinstance(found, str):
            return found
        if isinstance(found, Group):
            if found.count is None and found.kind != "part":
                return found.members[0]
            if found.kind == "part":
                first = next(iter(found.members[0].groups), "g")
                example = f"{found.name}{'[0]' if found.count is not None else ''}.{first}"
                raise CollcError(f"'{found.name}' is a part, not a node; name one of its nodes, e.g. {example}",
                                 expr.span)
            raise CollcError(f"'{found.name}' is a group of {found.count} nodes; pick one with "
                             f"{found.name}[INDEX]", expr.span)
        assert isinstance(found, PartInstance)
        shown = format_expr(expr)
        first = next(iter(found.groups.values()), None)
        example = "" if first is None else f", e.g. {shown}.{first.name}{'[0]' if first.count is not None else ''}"
        raise CollcError(f"'{shown}' is a part, not a node; name one of its nodes{example}", expr.span)

    def _resolve(self, expr: ast.Expr, scope: Scope) -> Any:
        """A node name (str), a Group, or a PartInstance."""
        if isinstance(expr, ast.Name):
            return self._group(self.elab.groups, expr.id, expr.span, top=True)
        if isinstance(expr, ast.Index):
            base = self._resolve(expr.base, scope)
            if not isinstance(base, Group) or base.count is None:
                raise CollcError("only a node group or a part declared with a count can be indexed", expr.span)
            i = as_int(self.ev.eval(expr.index, scope), expr.index.span, "a node index")
            if not 0 <= i < base.count:
                raise CollcError(f"index {i} is out of range for '{base.name}', which has {base.count} "
                                 f"{'parts' if base.kind == 'part' else 'nodes'} (0 to {base.count - 1})",
                                 expr.index.span)
            return base.members[i]
        if isinstance(expr, ast.Attr):
            base = self._resolve(expr.base, scope)
            if isinstance(base, Group) and base.kind == "part" and base.count is None:
                base = base.members[0]
            if not isinstance(base, PartInstance):
                raise CollcError(f"'.{expr.name}' selects a node of a part, but this is not a part", expr.span)
            return self._group(base.groups, expr.name, expr.span, top=False)
        raise CollcError("a link joins nodes: write a node such as `g[0]`, `sw` or `box[1].g[3]`", expr.span)

    def _group(self, groups: dict[str, Group], name: str, span: Span, top: bool) -> Group:
        g = groups.get(name)
        if g is not None:
            return g
        if top and name in self.declared:
            raise CollcError(f"'{name}' is not declared at this point (its declaration at {self.declared[name]} "
                             "has not run); declare nodes before linking them", span)
        hint = suggest(name, set(groups))
        where = "this topology" if top else "that part"
        raise CollcError(f"no node named '{name}' in {where}" + (f"; did you mean '{hint}'?" if hint else ""), span)


def _all_declarations(stmts: Sequence[ast.Stmt]) -> list[tuple[str, Span]]:
    out: list[tuple[str, Span]] = []
    for s in stmts:
        if isinstance(s, (ast.NodeDecl, ast.PartDecl)):
            out.append((s.name, s.span))
        elif isinstance(s, ast.For):
            out.extend(_all_declarations(s.body))
        elif isinstance(s, ast.If):
            out.extend(_all_declarations(s.then))
            out.extend(_all_declarations(s.orelse or ()))
    return out
