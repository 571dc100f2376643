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

The package is layered, each module importing only those below it:

    ast, parser, printer, values, evaluate, runner, rings, stdlib_builders
    module.py    a loaded module, its entries and name lookup; where the stdlib lives
    check.py     static checks (BodyChecker), before anything is instantiated
    eval/        topology, collective, algorithm, pipeline and compile-request evaluation
    load.py      parse -> collect -> check, and the Session that caches loaded modules
    specs.py     command-line specs (`name(args)`, `file.coll:name(args)`) and sizes
    files.py     check_file, show_file, load_requests, stdlib_catalog

This file only re-exports.
"""

from __future__ import annotations

from collc.frontend.eval.requests import CompileRequest, check_reachable
from collc.frontend.evaluate import RequirementError
from collc.frontend.files import (
    CheckSummary, check_file, defined_names, load_requests, show_file, stdlib_catalog,
)
from collc.frontend.load import clear_caches, load_module, session
from collc.frontend.module import Module, stdlib_modules, stdlib_root
from collc.frontend.parser import CollSyntaxError, parse
from collc.frontend.printer import format_module
from collc.frontend.rings import find_ring
from collc.frontend.specs import (
    algorithms_for, instantiate_algorithm, parse_size, resolve_collective, resolve_pipeline, resolve_topology,
    spec_sources, stdlib_view,
)

__all__ = [
    "CheckSummary", "CollSyntaxError", "CompileRequest", "Module", "RequirementError", "algorithms_for",
    "check_file", "check_reachable", "clear_caches", "defined_names", "find_ring", "format_module",
    "instantiate_algorithm", "load_module", "load_requests", "parse", "parse_size", "resolve_collective",
    "resolve_pipeline", "resolve_topology", "session", "show_file", "spec_sources", "stdlib_catalog",
    "stdlib_modules", "stdlib_root", "stdlib_view",
]
