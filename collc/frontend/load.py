"""Loading .coll modules: parse, resolve imports, collect definitions, check.

Topologies are imported explicitly: `import topologies.ndv2;` or
`import "my_cluster.coll";` (relative to the importing file); the standard library's
collectives and algorithms are every module's prelude. A `Session` holds what loading
remembers: the loaded modules, cached by path and reloaded when a file they read
changes; the imports being loaded (to catch a cycle); which standard library module
defines each name; and the text of each command-line spec (to show it in errors). One
default session serves the process (`session()`); `clear_cache()` forgets it all.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from collc.diagnostics import CollcError, Span, decode_source, read_input_bytes
from collc.frontend import ast
from collc.frontend.check import check_module, check_pipelines
from collc.frontend.evaluate import Evaluator, Scope, suggest
from collc.frontend.module import Entry, Module, stdlib_modules, stdlib_name_of
from collc.frontend.parse_cache import parse_cached
from collc.frontend.parser import parse
from collc.frontend.rings import find_ring

# Folders of the standard library whose modules every module sees, in load order.
PRELUDE_FOLDERS = ("collectives", "algorithms")


class CollImportError(CollcError):
    """An import that cannot be resolved, or that closes a cycle."""


@dataclass
class _Loading:
    path: str
    span: Span | None  # the import statement that asked for it


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return -1


def _fresh(module: Module) -> bool:
    return all(_mtime(p) == t for p, t in module.files.items())


class Session:
    """What the front end remembers between loads (see the module docstring)."""

    def __init__(self) -> None:
        self.modules: dict[str, Module] = {}
        self.loading: list[_Loading] = []
        self.definers: dict[str, dict[str, str]] = {}
        # Pseudo-file name (`<--topology>`) -> the text of the last spec parsed under it.
        self.spec_sources: dict[str, str] = {}

    def clear(self) -> None:
        """Forget every loaded module (the next load parses and checks again), and with
        them the topologies instantiated from their definitions."""
        self.modules.clear()
        self.definers.clear()

    def load_module(self, path: str | os.PathLike, span: Span | None = None) -> Module:
        """Parse a file, load its imports and the prelude, and check it."""
        resolved = str(Path(path).resolve())
        cached = self.modules.get(resolved)
        if cached is not None and _fresh(cached):
            return cached
        for i, loading in enumerate(self.loading):
            if loading.path == resolved:
                chain = [Path(l.path).name for l in self.loading[i:]] + [Path(resolved).name]
                raise CollImportError("import cycle: " + " imports ".join(chain), span)
        try:
            data = read_input_bytes(resolved)
        except OSError as exc:
            reason = exc.strerror or str(exc)
            raise CollImportError(f"cannot read '{path}': {reason}", span) from None
        text = decode_source(data, os.fspath(path))
        self.loading.append(_Loading(resolved, span))
        try:
            module = self._build(Path(resolved), text, os.fspath(path))
        finally:
            self.loading.pop()
        self.modules[resolved] = module
        return module

    def stdlib_definers(self, table: str) -> dict[str, str]:
        """Name -> the standard library module defining it, for one namespace."""
        if table in self.definers:
            return self.definers[table]
        out: dict[str, str] = {}
        complete = True
        loading = {l.path for l in self.loading}
        for dotted, path in stdlib_modules().items():
            if str(path.resolve()) in loading:
                complete = False  # asked while that module is itself being loaded
                continue
            try:
                module = self.load_module(path)
            except CollcError:
                complete = False
                continue
            for name in getattr(module, table):
                out.setdefault(name, dotted)
        if complete:
            self.definers[table] = out
        return out

    def new_module(self, path: Path, text: str, syntax: ast.Module, stdlib_name: str | None) -> Module:
        """A module whose unknown names are looked up in this session's standard library."""
        return Module(path=path, text=text, syntax=syntax, stdlib_name=stdlib_name,
                      stdlib_definers=self.stdlib_definers)

    def _build(self, path: Path, text: str, shown_as: str) -> Module:
        # Messages name the file as the user (or the importing file) named it.
        stdlib_name = stdlib_name_of(path)
        # The standard library's trees come from the user's cache (parse_cache): they
        # are parsed on every run otherwise. A user's own files are parsed afresh.
        syntax = parse_cached(text, shown_as) if stdlib_name is not None else parse(text, shown_as)
        module = self.new_module(path, text, syntax, stdlib_name)
        module.files[str(path)] = _mtime(str(path))
        module.prelude = self._prelude_for(module)
        for imp in syntax.imports:
            dep = self._load_import(imp, path)
            if dep is not module and dep not in module.imports:
                module.imports.append(dep)
        for dep in [*module.imports, *module.prelude]:
            module.files.update(dep.files)
        _collect_definitions(module)
        _evaluate_constants(module)
        check_module(module)
        check_pipelines(module)
        return module

    def _prelude_for(self, module: Module) -> list[Module]:
        folder = (module.stdlib_name or "").split(".")[0] if module.stdlib_name else None
        wanted = PRELUDE_FOLDERS
        if folder in PRELUDE_FOLDERS:
            wanted = PRELUDE_FOLDERS[:PRELUDE_FOLDERS.index(folder)]
        out = []
        for dotted, p in stdlib_modules().items():
            if dotted.split(".")[0] in wanted:
                out.append(self.load_module(p))
        return out

    def _load_import(self, imp: ast.Import, importer: Path) -> Module:
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
            return self.load_module(target, imp.span)
        assert imp.path is not None
        target_path = Path(imp.path)
        if not target_path.is_absolute():
            target_path = importer.parent / target_path
        if not target_path.exists():
            raise CollImportError(f"cannot find '{imp.path}' (looked for {target_path})", imp.span)
        return self.load_module(target_path, imp.span)


_DEFAULT = Session()


def session() -> Session:
    """The process's front-end session."""
    return _DEFAULT


def load_module(path: str | os.PathLike, span: Span | None = None) -> Module:
    """Parse a file, load its imports and the prelude, and check it (the default session)."""
    return _DEFAULT.load_module(path, span)


def clear_cache() -> None:
    """Forget every loaded module (the next load parses and checks again)."""
    _DEFAULT.clear()


def clear_caches() -> None:
    """Forget loaded modules and instantiated topologies, and the rings found on them
    (benchmarks use this)."""
    _DEFAULT.clear()
    find_ring.cache_clear()


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
