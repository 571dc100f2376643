"""Command-line specs: `name(args)`, `file.coll`, `file.coll:name(args)`, and sizes.

`resolve_topology("ndv2(chassis=2)")`, `resolve_collective("allgather(chunks=4)", 8)`,
`instantiate_algorithm("ring", ...)`, `resolve_pipeline("train.coll:gpt(8)")`: a bare
name is looked up in the whole standard library, a file form in that file. Each spec is
parsed as the pseudo-file `<--FLAG>` (its text kept in the session's `spec_sources`, so
that an error in it is shown with its line).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.eval import algorithm as algorithm_mod
from collc.frontend.eval import collective as collective_mod
from collc.frontend.eval import topology as topology_mod
from collc.frontend.eval.pipeline import evaluate_pipeline
from collc.frontend.eval.requests import check_reachable, size_bytes
from collc.frontend.evaluate import Evaluator, Scope, suggest
from collc.frontend.load import load_module, session
from collc.frontend.module import Entry, Module, stdlib_modules, stdlib_root
from collc.frontend.parser import parse_spec as parse_call_spec
from collc.frontend.parser import parse_value
from collc.frontend.runner import evaluate_args
from collc.ir.collective import Collective
from collc.ir.pipeline import PipelineJob
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.limits import int_limit
from collc.units import BINARY_SHORTHAND, UNITS


@dataclass(frozen=True)
class Spec:
    """A parsed spec: the file it names (if any) and the call (if any)."""

    path: Path | None
    call: ast.CallSpec | None
    text: str
    filename: str


def spec_sources() -> dict[str, str]:
    """Pseudo-file name -> text of each command-line spec parsed, so that an error located
    in `<--topology>` can be shown with its source line (`format_error(err, spec_sources())`)."""
    return dict(session().spec_sources)


def parse_spec(spec: str, flag: str, base_dir: Path | None) -> Spec:
    """`name(args)`, `file.coll`, or `file.coll:name(args)`."""
    pseudo = f"<--{flag}>"
    session().spec_sources[pseudo] = spec
    stripped = spec.strip()
    if not stripped:
        raise CollcError(f"empty --{flag}", Span(pseudo, 1, 1))
    cut = spec.find(".coll")
    if cut < 0:
        return Spec(None, parse_call_spec(spec, pseudo), spec, pseudo)
    end = cut + len(".coll")
    path = Path(spec[:end].strip())
    if not path.is_absolute():
        path = (base_dir or Path.cwd()) / path
    rest = spec[end:]
    if not rest.strip():
        return Spec(path, None, spec, pseudo)
    if not rest.startswith(":"):
        raise CollcError("after a file name, name a definition with ':NAME' or ':NAME(ARGS)'",
                         Span(pseudo, 1, end + 1))
    # Blank out the file name so that columns in errors match the whole spec.
    call = parse_call_spec(" " * (end + 1) + rest[1:], pseudo)
    return Spec(path, call, spec, pseudo)


def stdlib_view() -> Module:
    """A module that imports the whole standard library (what a bare spec name sees)."""
    modules = [load_module(p) for p in stdlib_modules().values()]
    view = session().new_module(stdlib_root(), "", ast.Module("<stdlib>"), None)
    view.imports = modules
    return view


def _only(table: dict[str, Any], what: str, spec: Spec) -> str:
    if len(table) == 1:
        return next(iter(table))
    names = ", ".join(sorted(table)) or "none"
    raise CollcError(f"{spec.path} defines {len(table)} {what} ({names}); name one with "
                     f"{spec.path.name if spec.path else ''}:NAME", Span(spec.filename, 1, 1))


def _args(spec: Spec, scope: Scope) -> list[tuple[str | None, Any, Span]]:
    return evaluate_args(spec.call.args if spec.call else (), scope, Evaluator())


def _call_span(spec: Spec) -> Span:
    return spec.call.span if spec.call is not None else Span(spec.filename, 1, 1, 1, len(spec.text) + 1)


def _entry(spec: str, kind: str, base_dir: Path | None) -> tuple[Spec, Entry]:
    """The definition a spec names: a file's (its only one of that kind where no name is
    given) or the standard library's."""
    parsed = parse_spec(spec, kind, base_dir)
    plural = "topologies" if kind == "topology" else "collectives"
    if parsed.path is not None:
        module = load_module(parsed.path)
        name = parsed.call.name if parsed.call else _only(getattr(module, plural), plural, parsed)
        span = parsed.call.name_span if parsed.call else Span(parsed.filename, 1, 1)
    else:
        assert parsed.call is not None
        module, name, span = stdlib_view(), parsed.call.name, parsed.call.name_span
    lookup = module.lookup_topology if kind == "topology" else module.lookup_collective
    return parsed, lookup(name, span)


def resolve_topology(spec: str, base_dir: Path | None = None) -> Topology:
    """`"dgx1"`, `"ndv2(chassis=2)"`, `"file.coll"` (its only topology), `"file.coll:name(args)"`."""
    parsed, entry = _entry(spec, "topology", base_dir)
    return topology_mod.instantiate(entry, _args(parsed, entry.module.constants), _call_span(parsed))


def resolve_collective(spec: str, ranks: int, base_dir: Path | None = None) -> Collective:
    """`"allgather"`, `"allgather(chunks=4)"`, `"broadcast(root=2)"`, or a file form."""
    parsed, entry = _entry(spec, "collective", base_dir)
    return collective_mod.instantiate(entry, ranks, _args(parsed, entry.module.constants), _call_span(parsed))


def instantiate_algorithm(spec: str, topology: Topology, collective: Collective,
                          base_dir: Path | None = None) -> Schedule:
    """`"ring"`, `"tree"`, `"file.coll"`, `"file.coll:name(args)"`: the algorithm's
    verified schedule for this collective on this topology."""
    parsed = parse_spec(spec, "algorithm", base_dir)
    if parsed.path is not None:
        module = load_module(parsed.path)
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
        module = stdlib_view()
        name, span = parsed.call.name, parsed.call.name_span
    entry = module.lookup_algorithm(name, collective.name, span)
    check_reachable(topology, collective, _call_span(parsed))
    return algorithm_mod.instantiate(entry, topology, collective, _args(parsed, entry.module.constants),
                                     _call_span(parsed))


def algorithms_for(collective_name: str) -> list[str]:
    """Names of the standard library's algorithms implementing a collective."""
    names: set[str] = set()
    for module in stdlib_view().imports:
        for name, variants in module.algorithms.items():
            if collective_name in variants:
                names.add(name)
    return sorted(names)


def resolve_pipeline(spec: str | os.PathLike, base_dir: Path | None = None) -> PipelineJob:
    """`"file.coll"` (its only pipeline) or `"file.coll:name(args)"`."""
    parsed = parse_spec(os.fspath(spec), "pipeline", base_dir)
    if parsed.path is None:
        raise CollcError("name a .coll file that declares a pipeline: FILE.coll or FILE.coll:NAME(ARGS)",
                         Span(parsed.filename, 1, 1))
    module = load_module(parsed.path)
    found = {p.name: p for p in module.syntax.pipelines}
    if parsed.call is None:
        if len(found) != 1:
            listing = ", ".join(sorted(found)) or "none"
            raise CollcError(f"{parsed.path} declares {len(found)} pipelines ({listing}); name one with "
                             f"{parsed.path.name}:NAME", Span(parsed.filename, 1, 1))
        defn = next(iter(found.values()))
        return evaluate_pipeline(module, defn, [], None)
    if parsed.call.name not in found:
        hint = suggest(parsed.call.name, list(found))
        raise CollcError(f"{parsed.path} declares no pipeline '{parsed.call.name}'"
                         + (f"; did you mean '{hint}'?" if hint else f" (it declares: {', '.join(found) or 'none'})"),
                         parsed.call.name_span)
    args = evaluate_args(parsed.call.args, module.constants, Evaluator())
    return evaluate_pipeline(module, found[parsed.call.name], args, parsed.call.span)


def pipeline_names(path: str | os.PathLike) -> list[str]:
    """Names of the pipelines a file declares."""
    return [p.name for p in load_module(path).syntax.pipelines]


# `64K`, `1M`, `2G`, `1T`: nccl-tests' short forms (powers of 1024), read as `64 KiB`...
_BINARY_SUFFIX = re.compile(r"(\s*[0-9]+(?:\.[0-9]+)?)(\s*)([" + "".join(BINARY_SHORTHAND) + r"])\s*")


# A whole number, then bytes or a binary unit (exact integers: no float in between).
_WHOLE_BINARY_SIZE = re.compile(r"(0|[1-9][0-9]*) *(B|KiB|MiB|GiB|TiB)?")


def parse_size(text: str, span: Span | None = None) -> int:
    """`"1MiB"`, `"256MB"`, `"64 KiB"`, `"1024"`, `"1M"` (= 1 MiB, as nccl-tests reads it)
    -> bytes (0 is allowed: "no limit" in ranges), within the compiler's size limit
    (`COLLC_LIMIT_SIZE_BYTES`). The text is a .coll expression (`2 * 1 MiB` too), so
    the units are the language's (`collc.units`); `collc.units.parse_size` reads the
    plain `NUMBER [UNIT]` forms the same way, for tools outside the compiler."""
    pseudo = "<size>" if span is None else span.file
    binary = _BINARY_SUFFIX.fullmatch(text)
    if binary:  # `1M` as the generated executors and nccl-tests read it: 1 MiB
        text = f"{binary.group(1)}{binary.group(2)}{binary.group(3)}iB"
    plain = _WHOLE_BINARY_SIZE.fullmatch(text)
    if plain is not None:
        # A whole number of bytes or of a binary unit (`256MiB`, most sizes typed) is the
        # same exact integer the language makes of it, read without loading Lark's
        # parser; one past the limit is left to the language, which words the error.
        n = int(plain.group(1)) * int(UNITS[plain.group(2) or "B"][0])
        if n <= int_limit("size_bytes"):
            return n
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
