"""Loading .coll modules: imports, the standard library, name lookup.

Names live in three namespaces: topologies, collectives and algorithms (so the
topology `ring(n)` and the algorithm `ring` do not clash). A module sees its own
definitions, then those of the modules it imports (not re-exported further), then the
prelude: the standard library's collectives and algorithms, which every module sees
without importing them. Topologies are imported explicitly:
`import topologies.ndv2;` or `import "my_cluster.coll";` (relative to the importing
file). Loaded modules are cached by path and reloaded when a file they read changes.
"""

from __future__ import annotations

import functools
import importlib.resources
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from collc.diagnostics import CollcError, Span, decode_source, read_input_bytes
from collc.frontend import ast
from collc.frontend.evaluate import Evaluator, Scope, suggest
from collc.frontend.parser import parse

SUFFIX = ".coll"
# Folders of the standard library whose modules every module sees, in load order.
PRELUDE_FOLDERS = ("collectives", "algorithms")


class CollImportError(CollcError):
    """An import that cannot be resolved, or that closes a cycle."""


class NameLookupError(CollcError):
    """A topology, collective or algorithm name that no visible module defines."""


@functools.lru_cache(maxsize=1)
def stdlib_root() -> Path:
    return Path(str(importlib.resources.files("collc.stdlib")))


def stdlib_modules() -> dict[str, Path]:
    """Dotted name (`topologies.ndv2`) -> file, for every standard library module."""
    root = stdlib_root()
    out = {}
    for path in sorted(root.rglob("*" + SUFFIX)):
        rel = path.relative_to(root).with_suffix("")
        out[".".join(rel.parts)] = path
    return out


def stdlib_name_of(path: Path) -> str | None:
    try:
        rel = path.resolve().relative_to(stdlib_root().resolve())
    except ValueError:
        return None
    return ".".join(rel.with_suffix("").parts)


@dataclass(frozen=True)
class Entry:
    """A definition and the module it belongs to (whose names its body sees)."""

    defn: ast.Definition
    module: "Module"

    @property
    def is_stdlib(self) -> bool:
        return self.module.stdlib_name is not None

    @property
    def where(self) -> str:
        return self.module.display_name


@dataclass(eq=False)
class Module:
    """A loaded, checked .coll file."""

    path: Path
    text: str
    syntax: ast.Module
    stdlib_name: str | None
    imports: list["Module"] = field(default_factory=list)
    prelude: list["Module"] = field(default_factory=list)
    topologies: dict[str, Entry] = field(default_factory=dict)
    collectives: dict[str, Entry] = field(default_factory=dict)
    # algorithm name -> collective name -> entry
    algorithms: dict[str, dict[str, Entry]] = field(default_factory=dict)
    constants: Scope = field(default_factory=Scope)
    # Files this module was built from (itself and what it imports), with their mtimes.
    files: dict[str, int] = field(default_factory=dict)

    @property
    def display_name(self) -> str:
        return self.stdlib_name or str(self.path)

    @property
    def filename(self) -> str:
        return self.syntax.filename

    # --- lookup ---
    def _layers(self) -> Iterable[tuple[str, list["Module"]]]:
        yield "local", [self]
        yield "imported", self.imports
        yield "prelude", self.prelude

    def _find(self, table: str, name: str, span: Span | None) -> Entry | None:
        for _, modules in self._layers():
            found = [(m, getattr(m, table)[name]) for m in modules if name in getattr(m, table)]
            distinct = {id(e.defn): (m, e) for m, e in found}
            if len(distinct) > 1:
                names = " and ".join(m.display_name for m, _ in distinct.values())
                raise NameLookupError(f"'{name}' is defined by both {names}; rename one of them", span)
            if found:
                return found[0][1]
        return None

    def visible(self, table: str) -> set[str]:
        names: set[str] = set()
        for _, modules in self._layers():
            for m in modules:
                names |= set(getattr(m, table))
        return names

    def find_topology(self, name: str) -> Entry | None:
        return self._find("topologies", name, None)

    def find_collective(self, name: str) -> Entry | None:
        return self._find("collectives", name, None)

    def lookup_topology(self, name: str, span: Span | None) -> Entry:
        entry = self._find("topologies", name, span)
        if entry is None:
            raise self._unknown("topology", "topologies", name, span)
        return entry

    def lookup_collective(self, name: str, span: Span | None) -> Entry:
        entry = self._find("collectives", name, span)
        if entry is None:
            raise self._unknown("collective", "collectives", name, span)
        return entry

    def algorithm_variants(self, name: str) -> dict[str, Entry]:
        """Collective name -> entry, for every visible algorithm called `name`."""
        merged: dict[str, Entry] = {}
        for _, modules in reversed(list(self._layers())):
            for m in modules:
                merged.update(m.algorithms.get(name, {}))
        return merged

    def lookup_algorithm(self, name: str, collective: str, span: Span | None) -> Entry:
        variants = self.algorithm_variants(name)
        if not variants:
            raise self._unknown("algorithm", "algorithms", name, span)
        if collective not in variants:
            listing = ", ".join(sorted(variants))
            raise NameLookupError(f"algorithm '{name}' does not implement {collective} "
                                  f"(it implements {listing})", span)
        return variants[collective]

    def _unknown(self, what: str, table: str, name: str, span: Span | None) -> NameLookupError:
        msg = f"unknown {what} '{name}'"
        home = stdlib_definers(table).get(name)
        if home is not None and home != self.stdlib_name:
            msg += f"; did you mean `import {home};`?"
        else:
            hint = suggest(name, self.visible(table))
            if hint:
                msg += f"; did you mean '{hint}'?"
        return NameLookupError(msg, span)


_DEFINERS: dict[str, dict[str, str]] = {}


def stdlib_definers(table: str) -> dict[str, str]:
    """Name -> the standard library module defining it, for one namespace."""
    if table in _DEFINERS:
        return _DEFINERS[table]
    out: dict[str, str] = {}
    complete = True
    loading = {l.path for l in _STACK}
    for dotted, path in stdlib_modules().items():
        if str(path.resolve()) in loading:
            complete = False  # asked while that module is itself being loaded
            continue
        try:
            module = load_module(path)
        except CollcError:
            complete = False
            continue
        for name in getattr(module, table):
            out.setdefault(name, dotted)
    if complete:
        _DEFINERS[table] = out
    return out


# --- loading ---------------------------------------------------------------------------

@dataclass
class _Loading:
    path: str
    span: Span | None  # the import statement that asked for it


_CACHE: dict[str, Module] = {}
_STACK: list[_Loading] = []


def clear_cache() -> None:
    """Forget every loaded module (the next load parses and checks again)."""
    _CACHE.clear()
    _DEFINERS.clear()


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _fresh(module: Module) -> bool:
    return all(_mtime(p) == t for p, t in module.files.items())


def load_module(path: str | os.PathLike, span: Span | None = None) -> Module:
    """Parse a file, load its imports and the prelude, and check it."""
    resolved = str(Path(path).resolve())
    cached = _CACHE.get(resolved)
    if cached is not None and _fresh(cached):
        return cached
    for i, loading in enumerate(_STACK):
        if loading.path == resolved:
            chain = [Path(l.path).name for l in _STACK[i:]] + [Path(resolved).name]
            raise CollImportError("import cycle: " + " imports ".join(chain), span)
    try:
        data = read_input_bytes(resolved)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise CollImportError(f"cannot read '{path}': {reason}", span) from None
    text = decode_source(data, os.fspath(path))
    _STACK.append(_Loading(resolved, span))
    try:
        module = _build(Path(resolved), text, os.fspath(path))
    finally:
        _STACK.pop()
    _CACHE[resolved] = module
    return module


def _build(path: Path, text: str, shown_as: str) -> Module:
    # Messages name the file as the user (or the importing file) named it.
    syntax = parse(text, shown_as)
    module = Module(path=path, text=text, syntax=syntax, stdlib_name=stdlib_name_of(path))
    module.files[str(path)] = _mtime(str(path))
    module.prelude = _prelude_for(module)
    for imp in syntax.imports:
        dep = _load_import(imp, path)
        if dep is not module and dep not in module.imports:
            module.imports.append(dep)
    for dep in [*module.imports, *module.prelude]:
        module.files.update(dep.files)
    _collect_definitions(module)
    _evaluate_constants(module)
    from collc.frontend.check import check_module

    check_module(module)
    from collc.frontend.pipeline import check_pipelines

    check_pipelines(module)
    return module


def _prelude_for(module: Module) -> list[Module]:
    folder = (module.stdlib_name or "").split(".")[0] if module.stdlib_name else None
    wanted = PRELUDE_FOLDERS
    if folder in PRELUDE_FOLDERS:
        wanted = PRELUDE_FOLDERS[:PRELUDE_FOLDERS.index(folder)]
    out = []
    for dotted, p in stdlib_modules().items():
        if dotted.split(".")[0] in wanted:
            out.append(load_module(p))
    return out


def _load_import(imp: ast.Import, importer: Path) -> Module:
    if imp.module is not None:
        known = stdlib_modules()
        target = known.get(imp.module)
        if target is None:
            hint = suggest(imp.module, list(known))
            msg = f"no standard library module '{imp.module}'"
            if hint:
                msg += f"; did you mean `import {hint};`?"
            else:
                msg += " (known: " + ", ".join(known) + ")"
            raise CollImportError(msg, imp.span)
        return load_module(target, imp.span)
    assert imp.path is not None
    target_path = Path(imp.path)
    if not target_path.is_absolute():
        target_path = importer.parent / target_path
    if not target_path.exists():
        raise CollImportError(f"cannot find '{imp.path}' (looked for {target_path})", imp.span)
    return load_module(target_path, imp.span)


def _collect_definitions(module: Module) -> None:
    for d in module.syntax.definitions:
        if isinstance(d, ast.TopologyDef):
            table: dict[str, Entry] = module.topologies
        elif isinstance(d, ast.CollectiveDef):
            table = module.collectives
        else:
            assert isinstance(d, ast.AlgorithmDef)
            table = module.algorithms.setdefault(d.name, {})
            key = d.collective
            if key in table:
                first = table[key].defn
                raise CollcError(f"algorithm '{d.name}' for {key} is defined twice (first at {first.span})",
                                 d.name_span)
            table[key] = Entry(d, module)
            continue
        if d.name in table:
            raise CollcError(f"{d.kind_word} '{d.name}' is defined twice (first at {table[d.name].defn.span})",
                             d.name_span)
        table[d.name] = Entry(d, module)


def _evaluate_constants(module: Module) -> None:
    ev = Evaluator()
    scope = Scope(what="module")
    for let in module.syntax.constants:
        scope.define(let.name, ev.eval(let.value, scope), let.span)
    module.constants = scope
