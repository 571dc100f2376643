"""The .coll front end: parsing, checking, and evaluation into the IR.

Public entry points (everything a user can get wrong raises `CollcError` with a Span):

- `parse(text, filename)`: syntax only, to an AST.
- `load_module(path)`: parse, resolve imports, check.
- `check_file(path)`: load, then instantiate what the file defines and requests.
- `resolve_topology(spec)`, `resolve_collective(spec, ranks)`,
  `instantiate_algorithm(spec, topology, collective)`: command-line specs such as
  `"ndv2(chassis=2)"`, `"allgather(chunks=4)"`, `"ring"`, `"file.coll:name(args)"`.
- `load_requests(path)`: the file's `compile` statements, evaluated.
- `algorithms_for(name)`, `stdlib_catalog()`, `parse_size(text)`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.frontend import algorithm as _algorithm
from collc.frontend import ast
from collc.frontend import collective as _collective
from collc.frontend import topology as _topology
from collc.frontend.evaluate import Evaluator, RankRangeError, RequirementError, Scope
from collc.frontend.modules import Entry, Module, clear_cache as _clear_module_cache, load_module as _load_module
from collc.frontend.modules import stdlib_modules, stdlib_root
from collc.frontend.parser import CollSyntaxError, parse, parse_spec, parse_value
from collc.frontend.printer import format_expr, format_module
from collc.frontend.requests import CompileRequest, check_reachable, evaluate_request, size_bytes
from collc.frontend.rings import find_ring
from collc.frontend.runner import evaluate_args
from collc.ir.collective import Collective
from collc.ir.schedule import Schedule
from collc.ir.topology import Link, Node, NodeKind, Topology

__all__ = [
    "CheckSummary", "CollSyntaxError", "CompileRequest", "Module", "RequirementError", "algorithms_for",
    "check_file", "check_reachable", "clear_caches", "defined_names", "find_ring", "format_module",
    "instantiate_algorithm", "load_module", "load_requests", "parse", "parse_size", "resolve_collective",
    "resolve_topology", "show_file", "spec_sources", "stdlib_catalog",
]

# Pseudo-file name -> text of each command-line spec parsed, so that an error located
# in `<--topology>` can be shown with its source line (`format_error(err, spec_sources())`).
_SPEC_SOURCES: dict[str, str] = {}


def spec_sources() -> dict[str, str]:
    return dict(_SPEC_SOURCES)


def clear_caches() -> None:
    """Forget loaded modules and instantiated topologies (benchmarks use this)."""
    _clear_module_cache()
    _topology.clear_cache()
    find_ring.cache_clear()


def load_module(path: str | os.PathLike) -> Module:
    """Parse a .coll file, load what it imports, and check it statically."""
    return _load_module(path)


# --- command-line specs ------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    path: Path | None
    call: ast.CallSpec | None
    text: str
    filename: str


def _parse_spec(spec: str, flag: str, base_dir: Path | None) -> _Spec:
    """`name(args)`, `file.coll`, or `file.coll:name(args)`."""
    pseudo = f"<--{flag}>"
    _SPEC_SOURCES[pseudo] = spec
    stripped = spec.strip()
    if not stripped:
        raise CollcError(f"empty --{flag}", Span(pseudo, 1, 1))
    cut = spec.find(".coll")
    if cut < 0:
        return _Spec(None, parse_spec(spec, pseudo), spec, pseudo)
    end = cut + len(".coll")
    path = Path(spec[:end].strip())
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    rest = spec[end:]
    if not rest.strip():
        return _Spec(path, None, spec, pseudo)
    if not rest.startswith(":"):
        raise CollcError("after a file name, name a definition with ':NAME' or ':NAME(ARGS)'",
                         Span(pseudo, 1, end + 1))
    # Blank out the file name so that columns in errors match the whole spec.
    call = parse_spec(" " * (end + 1) + rest[1:], pseudo)
    return _Spec(path, call, spec, pseudo)


def _stdlib_view() -> Module:
    """A module that imports the whole standard library (what a bare spec name sees)."""
    modules = [_load_module(p) for p in stdlib_modules().values()]
    view = Module(path=stdlib_root(), text="", syntax=ast.Module("<stdlib>"), stdlib_name=None, imports=modules)
    return view


def _only(table: dict[str, Any], what: str, spec: _Spec) -> str:
    if len(table) == 1:
        return next(iter(table))
    names = ", ".join(sorted(table)) or "none"
    raise CollcError(f"{spec.path} defines {len(table)} {what} ({names}); name one with "
                     f"{spec.path.name if spec.path else ''}:NAME", Span(spec.filename, 1, 1))


def _args(spec: _Spec, scope: Scope) -> list[tuple[str | None, Any, Span]]:
    return evaluate_args(spec.call.args if spec.call else (), scope, Evaluator())


def _call_span(spec: _Spec) -> Span:
    return spec.call.span if spec.call is not None else Span(spec.filename, 1, 1, 1, len(spec.text) + 1)


def resolve_topology(spec: str, base_dir: Path | None = None) -> Topology:
    """`"dgx1"`, `"ndv2(chassis=2)"`, `"file.coll"` (its only topology), `"file.coll:name(args)"`."""
    parsed = _parse_spec(spec, "topology", base_dir)
    if parsed.path is not None:
        module = _load_module(parsed.path)
        name = parsed.call.name if parsed.call else _only(module.topologies, "topologies", parsed)
        span = parsed.call.name_span if parsed.call else Span(parsed.filename, 1, 1)
        entry = module.lookup_topology(name, span)
    else:
        assert parsed.call is not None
        module = _stdlib_view()
        entry = module.lookup_topology(parsed.call.name, parsed.call.name_span)
    return _topology.instantiate(entry, _args(parsed, entry.module.constants), _call_span(parsed))


def resolve_collective(spec: str, ranks: int, base_dir: Path | None = None) -> Collective:
    """`"allgather"`, `"allgather(chunks=4)"`, `"broadcast(root=2)"`, or a file form."""
    parsed = _parse_spec(spec, "collective", base_dir)
    if parsed.path is not None:
        module = _load_module(parsed.path)
        name = parsed.call.name if parsed.call else _only(module.collectives, "collectives", parsed)
        span = parsed.call.name_span if parsed.call else Span(parsed.filename, 1, 1)
        entry = module.lookup_collective(name, span)
    else:
        assert parsed.call is not None
        entry = _stdlib_view().lookup_collective(parsed.call.name, parsed.call.name_span)
    return _collective.instantiate(entry, ranks, _args(parsed, entry.module.constants), _call_span(parsed))


def instantiate_algorithm(spec: str, topology: Topology, collective: Collective,
                          base_dir: Path | None = None) -> Schedule:
    """`"ring"`, `"tree"`, `"file.coll"`, `"file.coll:name(args)"`: the algorithm's
    verified schedule for this collective on this topology."""
    parsed = _parse_spec(spec, "algorithm", base_dir)
    if parsed.path is not None:
        module = _load_module(parsed.path)
        if parsed.call is not None:
            name, span = parsed.call.name, parsed.call.name_span
        else:
            fitting = {n: v for n, v in module.algorithms.items() if collective.name in v}
            if not fitting and module.algorithms:
                listing = ", ".join(f"{n} (for {', '.join(sorted(v))})" for n, v in sorted(module.algorithms.items()))
                raise CollcError(f"{parsed.path} has no algorithm for {collective.name}: {listing}",
                                 Span(parsed.filename, 1, 1))
            name, span = _only(fitting, "algorithms", parsed), Span(parsed.filename, 1, 1)
    else:
        assert parsed.call is not None
        module = _stdlib_view()
        name, span = parsed.call.name, parsed.call.name_span
    entry = module.lookup_algorithm(name, collective.name, span)
    check_reachable(topology, collective, _call_span(parsed))
    return _algorithm.instantiate(entry, topology, collective, _args(parsed, entry.module.constants),
                                  _call_span(parsed))


def algorithms_for(collective_name: str) -> list[str]:
    """Names of the standard library's algorithms implementing a collective."""
    names: set[str] = set()
    for module in _stdlib_view().imports:
        for name, variants in module.algorithms.items():
            if collective_name in variants:
                names.add(name)
    return sorted(names)


# `64K`, `1M`, `2G`, `1T`: powers of 1024, as nccl-tests and the generated executors read them.
_BINARY_SUFFIX = re.compile(r"(\s*[0-9]+(?:\.[0-9]+)?)(\s*)([KMGT])\s*")


def parse_size(text: str, span: Span | None = None) -> int:
    """`"1MiB"`, `"256MB"`, `"64 KiB"`, `"1024"`, `"1M"` (= 1 MiB, as nccl-tests reads it)
    -> bytes (0 is allowed: "no limit" in ranges)."""
    pseudo = "<size>" if span is None else span.file
    binary = _BINARY_SUFFIX.fullmatch(text)
    if binary:  # `1M` as the generated executors and nccl-tests read it: 1 MiB
        text = f"{binary.group(1)}{binary.group(2)}{binary.group(3)}iB"
    try:
        expr = parse_value(text, pseudo)
        try:
            value = Evaluator().eval(expr, Scope())
        except CollcError as err:
            raise CollcError(f"cannot read '{text}' as a size such as `64 MiB`: {err.message}", err.span) from None
        return size_bytes(value, expr.span, minimum=0)
    except CollcError as err:
        if span is None or err.span is None:
            raise
        moved = Span(span.file, span.line, span.column + err.span.column - 1, span.line,
                     None if err.span.end_column is None else span.column + err.span.end_column - 1)
        raise type(err)(err.message, moved, err.notes) from None


# --- files ------------------------------------------------------------------------------

def load_requests(path: str | os.PathLike, select: str | None = None) -> list[CompileRequest]:
    """The file's `compile` statements, evaluated (algorithms instantiated and verified).
    `select` keeps only some, before they are evaluated: a line number (the line of a
    `compile` statement) or a name (of the collective, topology or algorithm a request
    names); a selection that matches none is an error that lists the requests."""
    module = _load_module(path)
    chosen = list(module.syntax.requests)
    if select is not None:
        chosen = [req for req in chosen if _selected(req, select.strip())]
        if not chosen:
            listing = "; ".join(f"line {r.span.line}: compile {r.collective.name} on {r.topology.name}"
                                + (f" using {r.using.name}" if r.using else "") for r in module.syntax.requests)
            raise CollcError(f"no compile request of {path} matches '{select}' (a line number or a name); "
                             f"its requests: {listing or 'none'}", Span(str(path), 1, 1))
    return [evaluate_request(module, req) for req in chosen]


def _selected(req: ast.Compile, select: str) -> bool:
    if select.isdigit():
        return req.span.line <= int(select) <= (req.span.end_line or req.span.line)
    names = {req.collective.name, req.topology.name} | ({req.using.name} if req.using else set())
    return select in names


# Rank counts at which `check_file` tries each algorithm a file defines.
CHECK_RANKS = (2, 3, 4, 8)


@dataclass(frozen=True)
class CheckSummary:
    """What `check_file` found; `str()` is one line (without the path)."""

    path: str
    topologies: list[str] = field(default_factory=list)
    collectives: list[str] = field(default_factory=list)
    algorithms: list[str] = field(default_factory=list)
    requests: list[CompileRequest] = field(default_factory=list)
    pipelines: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        def count(items: list, word: str) -> str:
            return f"{len(items)} {word}{'' if len(items) == 1 else 's'}"

        def detail(items: list[str]) -> str:
            return f" ({'; '.join(items)})" if items else ""

        reqs = [r.describe() for r in self.requests]
        return (f"{count(self.topologies, 'topology').replace('topologys', 'topologies')}"
                f"{detail(self.topologies)}, {count(self.collectives, 'collective')}{detail(self.collectives)}, "
                f"{count(self.algorithms, 'algorithm')}{detail(self.algorithms)}, "
                f"{count(self.requests, 'request')}{detail(reqs)}"
                + (f", {count(self.pipelines, 'pipeline')}{detail(self.pipelines)}" if self.pipelines else ""))


def crossbar(ranks: int) -> Topology:
    """`ranks` GPUs on one switch (what `check_file` runs algorithms on)."""
    gpus = [Node(f"g[{r}]", NodeKind.GPU, r) for r in range(ranks)]
    links = []
    for g in gpus:
        links += [Link(g.name, "sw", 25e9, 1e-6), Link("sw", g.name, 25e9, 1e-6)]
    return Topology(f"crossbar({ranks})", (*gpus, Node("sw", NodeKind.SWITCH)), tuple(links))


def check_file(path: str | os.PathLike) -> CheckSummary:
    """Load and check a file, then instantiate what it defines: topologies whose
    parameters all have defaults, every compile request, collectives at the rank counts
    the requests use (4 ranks for one no request uses), each algorithm at 2, 3, 4 and 8
    ranks on a crossbar. Rank counts a definition cannot take (its `require`s reject
    them, or it names a rank past the end) are skipped and said in the summary."""
    module = _load_module(path)
    summary = CheckSummary(str(path))
    for name, entry in module.topologies.items():
        if all(p.default is not None for p in entry.defn.params):
            topo = _topology.instantiate(entry, [], None)
            summary.topologies.append(f"{topo.name}: {topo.num_ranks} GPUs, {len(topo.nodes)} nodes, "
                                      f"{len(topo.links)} links")
        else:
            summary.topologies.append(f"{name}: needs arguments")
    requests = load_requests(path)
    used_at: dict[str, set[int]] = {}
    for req in requests:
        used_at.setdefault(req.collective.name, set()).add(req.collective.ranks)
    for name, entry in module.collectives.items():
        ranks = sorted(used_at.get(name, ())) or [SHOW_RANKS]
        notes = []
        for r in ranks:
            try:
                coll = _collective.instantiate(entry, r, [], None)
                notes.append(f"{coll.in_chunks} in, {coll.out_chunks} out at {r} ranks")
            except (RequirementError, RankRangeError) as exc:
                if name in used_at:
                    raise
                notes.append(f"not applicable at {r} ranks ({exc.message})")
        summary.collectives.append(f"{name}: " + "; ".join(notes))
    for name, variants in module.algorithms.items():
        for coll_name, entry in variants.items():
            checked = _check_algorithm(module, entry, coll_name)
            summary.algorithms.append(f"{name} for {coll_name}: verified at ranks "
                                      f"{', '.join(map(str, checked)) or 'none'}")
    summary.requests.extend(requests)
    # Pipelines are evaluated too (placement, costs, the static memory check), so that
    # `check` finds what `collc pipeline` would refuse; ones with parameters lacking
    # defaults wait for their arguments.
    from collc.frontend.pipeline import evaluate_pipeline

    for defn in module.syntax.pipelines:
        if all(p.default is not None for p in defn.params):
            job = evaluate_pipeline(module, defn, [], None)
            summary.pipelines.append(f"{defn.name}: {job.stages} stages x {job.data_parallel} data-parallel, "
                                     f"{job.microbatches} micro-batches, {job.schedule.value}")
        else:
            summary.pipelines.append(f"{defn.name}: needs arguments")
    return summary


def _check_algorithm(module: Module, entry: Entry, coll_name: str) -> list[int]:
    assert isinstance(entry.defn, ast.AlgorithmDef)
    coll_entry = entry.module.lookup_collective(coll_name, entry.defn.collective_span)
    checked = []
    for ranks in CHECK_RANKS:
        try:
            coll = _collective.instantiate(coll_entry, ranks, [], None)
            _algorithm.instantiate(entry, crossbar(ranks), coll, [], None)
        except (RequirementError, RankRangeError):
            continue
        checked.append(ranks)
    return checked


def defined_names(path: str | os.PathLike) -> set[str]:
    """Names of the topologies, collectives and algorithms a file defines itself."""
    module = _load_module(path)
    return set(module.topologies) | set(module.collectives) | set(module.algorithms)


# Ranks at which `show_file` applies a file's collectives that no request uses.
SHOW_RANKS = 4


def show_file(path: str | os.PathLike) -> dict:
    """What a file means, as JSON-ready data: `topologies` (the file's own, instantiated
    with default arguments, then those its requests use), `collectives` (those its
    requests use, then the file's own at 4 ranks), `algorithms` (`{"name", "for"}`),
    and `requests` (one line each)."""
    module = _load_module(path)
    requests = load_requests(path)
    topologies: dict[str, Topology] = {}
    for entry in module.topologies.values():
        if all(p.default is not None for p in entry.defn.params):
            topo = _topology.elaborate(entry, [], None).to_ir()
            topologies.setdefault(topo.name, topo)
    for req in requests:
        topologies.setdefault(req.topology.name, req.topology)
    collectives: dict[tuple, Collective] = {}
    for req in requests:  # two requests of one collective show it once
        collectives.setdefault((req.collective.name, req.collective.ranks, req.collective.chunks), req.collective)
    used = {c.name for c in collectives.values()}
    for name, entry in module.collectives.items():
        if name in used:
            continue
        try:
            coll = _collective.instantiate(entry, SHOW_RANKS, [], None)
        except (RequirementError, RankRangeError):
            continue
        collectives.setdefault((coll.name, coll.ranks, coll.chunks), coll)
    return {
        "file": str(path),
        "topologies": [t.to_json() for t in topologies.values()],
        "collectives": [c.to_json() for c in collectives.values()],
        "algorithms": [{"name": name, "for": coll} for name, variants in module.algorithms.items()
                       for coll in variants],
        "schedules": _algorithm_schedules(module, requests),
        "requests": [r.describe() for r in requests],
    }


def _algorithm_schedules(module: Module, requests: list[CompileRequest]) -> list[dict]:
    """The ops of the file's hand-written algorithms: as its requests use them, and the
    others on a crossbar of SHOW_RANKS GPUs."""
    out = []
    shown: set[tuple[str, str]] = set()
    for req in requests:
        if req.schedule is not None:
            out.append({"for": req.describe(), "schedule": req.schedule.to_json()})
            shown.add((str(req.algorithm).split("(")[0], req.collective.name))
    for name, variants in module.algorithms.items():
        for coll_name, entry in variants.items():
            if (name, coll_name) in shown:
                continue
            try:
                coll_entry = entry.module.lookup_collective(coll_name, entry.defn.collective_span)
                coll = _collective.instantiate(coll_entry, SHOW_RANKS, [], None)
                topo = crossbar(SHOW_RANKS)
                sched = _algorithm.instantiate(entry, topo, coll, [], None)
            except (RequirementError, RankRangeError):
                continue
            out.append({"for": f"{coll_name} on {topo.name} (an example)", "schedule": sched.to_json()})
    return out


def stdlib_catalog() -> dict:
    """What the standard library defines, for listings and reports."""
    def params(d: ast.Definition) -> list[dict]:
        return [{"name": p.name, "default": None if p.default is None else format_expr(p.default)}
                for p in d.params]

    topologies, collectives = [], []
    algorithms: dict[str, dict] = {}
    for dotted, path in stdlib_modules().items():
        module = _load_module(path)
        for name, e in module.topologies.items():
            topologies.append({"name": name, "params": params(e.defn), "description": e.defn.doc, "module": dotted})
        for name, e in module.collectives.items():
            collectives.append({"name": name, "params": params(e.defn), "description": e.defn.doc,
                                "module": dotted})
        for name, variants in module.algorithms.items():
            for coll_name, e in variants.items():
                item = algorithms.setdefault(name, {"name": name, "implements": [], "params": params(e.defn),
                                                    "description": e.defn.doc, "module": dotted})
                item["implements"].append(coll_name)
    for item in algorithms.values():
        item["implements"].sort()
    return {
        "topologies": sorted(topologies, key=lambda t: t["name"]),
        "collectives": sorted(collectives, key=lambda t: t["name"]),
        "algorithms": sorted(algorithms.values(), key=lambda t: t["name"]),
    }
