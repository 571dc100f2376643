"""What a .coll file holds: `check_file`, `show_file`, `load_requests`, and the standard
library's catalog (for `collc check`, `collc show` and listings).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.eval import algorithm as algorithm_mod
from collc.frontend.eval import collective as collective_mod
from collc.frontend.eval import topology as topology_mod
from collc.frontend.eval.pipeline import evaluate_pipeline
from collc.frontend.eval.requests import CompileRequest, evaluate_request
from collc.frontend.evaluate import RankRangeError, RequirementError
from collc.frontend.load import load_module
from collc.frontend.module import Entry, Module, stdlib_modules
from collc.frontend.printer import format_expr
from collc.ir.collective import Collective
from collc.ir.topology import Link, Node, NodeKind, Topology


# --- files ------------------------------------------------------------------------------

def load_requests(path: str | os.PathLike, select: str | None = None) -> list[CompileRequest]:
    """The file's `compile` statements, evaluated (algorithms instantiated and verified).
    `select` keeps only some, before they are evaluated: a line number (the line of a
    `compile` statement) or a name (of the collective, topology or algorithm a request
    names); a selection that matches none is an error that lists the requests."""
    module = load_module(path)
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
    module = load_module(path)
    summary = CheckSummary(str(path))
    for name, entry in module.topologies.items():
        if all(p.default is not None for p in entry.defn.params):
            topo = topology_mod.instantiate(entry, [], None)
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
                coll = collective_mod.instantiate(entry, r, [], None)
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
            coll = collective_mod.instantiate(coll_entry, ranks, [], None)
            algorithm_mod.instantiate(entry, crossbar(ranks), coll, [], None)
        except (RequirementError, RankRangeError):
            continue
        checked.append(ranks)
    return checked


def defined_names(path: str | os.PathLike) -> set[str]:
    """Names of the topologies, collectives and algorithms a file defines itself."""
    module = load_module(path)
    return set(module.topologies) | set(module.collectives) | set(module.algorithms)


# Ranks at which `show_file` applies a file's collectives that no request uses.
SHOW_RANKS = 4


def show_file(path: str | os.PathLike) -> dict:
    """What a file means, as JSON-ready data: `topologies` (the file's own, instantiated
    with default arguments, then those its requests use), `collectives` (those its
    requests use, then the file's own at 4 ranks), `algorithms` (`{"name", "for"}`),
    and `requests` (one line each)."""
    module = load_module(path)
    requests = load_requests(path)
    topologies: dict[str, Topology] = {}
    for entry in module.topologies.values():
        if all(p.default is not None for p in entry.defn.params):
            topo = topology_mod.elaborate(entry, [], None).to_ir()
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
            coll = collective_mod.instantiate(entry, SHOW_RANKS, [], None)
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
                coll = collective_mod.instantiate(coll_entry, SHOW_RANKS, [], None)
                topo = crossbar(SHOW_RANKS)
                sched = algorithm_mod.instantiate(entry, topo, coll, [], None)
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
        module = load_module(path)
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
