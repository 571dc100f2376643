"""Compile requests (`compile allgather on ndv2(chassis = 2) size 1 GiB using ring;`) and
the checks that tie a collective to a topology."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.eval import algorithm as algorithm_mod
from collc.frontend.eval import collective as collective_mod
from collc.frontend.eval import topology as topology_mod
from collc.frontend.evaluate import Evaluator, Scope, as_int
from collc.frontend.module import Module
from collc.frontend.runner import evaluate_args
from collc.frontend.values import SIZE, Quantity, dim_of, format_value, type_word
from collc.ir.collective import DEMAND_NAME, ChunkId, Collective, value_str
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.limits import exceeded, int_limit
from collc.units import format_bytes
from collc.verify import unreachable_pairs

# The pass a request names when `using` is omitted.
DEFAULT_PIPELINE = "synthesize"


@dataclass(frozen=True)
class CompileRequest:
    """One `compile` statement, evaluated."""

    topology: Topology
    collective: Collective
    size_bytes: int | None
    algorithm: str | None  # a hand-written algorithm (its name, with arguments if any)
    schedule: Schedule | None  # that algorithm's verified schedule
    pipeline: str | None  # pipeline text of the pass to run when no algorithm is named
    span: Span

    def describe(self) -> str:
        size = f", {format_bytes(self.size_bytes)}" if self.size_bytes is not None else ""
        how = f"using {self.algorithm}" if self.algorithm else f"via {self.pipeline}"
        return (f"{self.collective.name} on {self.topology.name}: {self.collective.ranks} ranks{size}, {how}")


def size_bytes(value: Any, span: Span, minimum: int = 1) -> int:
    """A size value (or a plain number of bytes) as a whole number of bytes >= minimum."""
    dim = dim_of(value)
    if dim is None or dim not in (SIZE, (0, 0)):
        shown = type_word(value) if dim is None else f"{type_word(value)} ({format_value(value)})"
        raise CollcError(f"expected a size such as `64 MiB`, got {shown}", span)
    raw = value.value if isinstance(value, Quantity) else value
    if isinstance(raw, float) and not raw.is_integer():
        raise CollcError(f"a size must be a whole number of bytes, got {raw:g} B", span)
    if raw > int_limit("size_bytes"):
        raise CollcError(f"a size of {raw:,} bytes is more than any GPU holds" + exceeded("size_bytes"), span)
    n = as_int(raw, span, "a size in bytes")
    if n < minimum:
        raise CollcError(f"a size must be at least {minimum} byte{'s' if minimum != 1 else ''}, got {n}", span)
    return n


def check_reachable(topology: Topology, collective: Collective, span: Span | None = None) -> None:
    """Every chunk an output needs must be able to travel from a rank holding it."""
    bad = set(unreachable_pairs(topology))
    if not bad:
        return
    holders: dict[ChunkId, set[int]] = {}
    for r, buf in enumerate(collective.inputs):
        for v in buf:
            for c in v:
                holders.setdefault(c, set()).add(r)
    for r, buf in enumerate(collective.outputs):
        for j, want in enumerate(buf):
            for c in sorted(want or ()):
                sources = holders.get(c, set())
                if r in sources or any((s, r) not in bad for s in sources):
                    continue
                s = min(sources)
                raise CollcError(
                    f"{collective.name} cannot run on {topology.name}: rank {r} ({topology.gpu(r).name}) must "
                    f"receive {value_str(frozenset({c}))} from rank {s} ({topology.gpu(s).name}), but no path "
                    f"of links leads from {topology.gpu(s).name} to {topology.gpu(r).name}", span)


_PLAIN_OPTION = re.compile(r"^[^\s{},=\"]+$")


def pipeline_text(spec: ast.CallSpec, scope: Scope, ev: Evaluator) -> str:
    """`synthesize(method = "lp", chunks = 4)` -> `synthesize{method=lp chunks=4}`."""
    from collc.passes.base import parse_pipeline

    options = []
    for name, value, span in evaluate_args(spec.args, scope, ev):
        if name is None:
            raise CollcError(f"options of pass '{spec.name}' are named: write {spec.name}(option = value)", span)
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, Quantity):
            text = repr(value.value)  # SI units: bytes, seconds, bytes/s
        elif isinstance(value, (int, float, str)):
            text = str(value)
        else:
            raise CollcError(f"option '{name}' must be a number, a string or true/false, got {type_word(value)}", span)
        if not _PLAIN_OPTION.match(text):
            raise CollcError(f"option '{name}' = {format_value(value)} cannot be passed to a pass (no spaces, "
                             "braces, commas, quotes or `=`)", span)
        options.append(f"{name}={text}")
    text = f"{spec.name}{{{' '.join(options)}}}" if options else spec.name
    parse_pipeline(text, spec.span)  # unknown options and bad values fail here, located
    return text


def evaluate_request(module: Module, req: ast.Compile) -> CompileRequest:
    from collc.passes.base import registered_passes

    ev = Evaluator()
    scope = module.constants
    topo_entry = module.lookup_topology(req.topology.name, req.topology.name_span)
    topology = topology_mod.instantiate(topo_entry, evaluate_args(req.topology.args, scope, ev), req.topology.span)
    size = None if req.size is None else size_bytes(ev.eval(req.size, scope), req.size.span)
    if req.collective.name == DEMAND_NAME and module.find_collective(DEMAND_NAME) is None:
        # `compile alltoallv(demand = "m.csv") on T size S;`: a demand matrix (collc.frontend.demand),
        # read with numpy (about 0.1 s to import): loaded for such a request only.
        from collc.frontend.demand import demand_of_request

        demand = demand_of_request(module, req, topology, size, evaluate_args(req.collective.args, scope, ev))
        collective, size = demand.collective, demand.size_bytes
    else:
        coll_entry = module.lookup_collective(req.collective.name, req.collective.name_span)
        collective = collective_mod.instantiate(coll_entry, topology.num_ranks,
                                                evaluate_args(req.collective.args, scope, ev), req.collective.span)
    check_reachable(topology, collective, req.topology.span)
    if req.using is None:
        return CompileRequest(topology, collective, size, None, None, DEFAULT_PIPELINE, req.span)
    using = req.using
    if module.algorithm_variants(using.name):
        alg_entry = module.lookup_algorithm(using.name, collective.name, using.name_span)
        schedule = algorithm_mod.instantiate(alg_entry, topology, collective,
                                             evaluate_args(using.args, scope, ev), using.span)
        return CompileRequest(topology, collective, size, schedule.name, schedule, None, req.span)
    passes = registered_passes()
    if using.name not in passes:
        algorithms = sorted(n for n in module.visible("algorithms")
                            if collective.name in module.algorithm_variants(n))
        raise CollcError(f"'{using.name}' is neither an algorithm nor a pass (algorithms for {collective.name}: "
                         f"{', '.join(algorithms) or 'none'}; passes: {', '.join(passes) or 'none'})",
                         using.name_span)
    return CompileRequest(topology, collective, size, None, None, pipeline_text(using, scope, ev), req.span)
