"""A loaded .coll module and name lookup in it; where the standard library lives.

Names live in three namespaces: topologies, collectives and algorithms (so the
topology `ring(n)` and the algorithm `ring` do not clash). A module sees its own
definitions, then those of the modules it imports (not re-exported further), then the
prelude: the standard library's collectives and algorithms, which every module sees
without importing them. Loading (parsing, imports, checks, caching) is `load.py`'s;
this module holds only what the checker, the evaluators and the loader all share.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from collc import stdlib
from collc.diagnostics import CollcError, Span
from collc.frontend import ast
from collc.frontend.evaluate import Scope, suggest

SUFFIX = ".coll"


class NameLookupError(CollcError):
    """A topology, collective or algorithm name that no visible module defines."""


@functools.lru_cache(maxsize=1)
def stdlib_root() -> Path:
    # The package's folder, read from its module: importlib.resources.files() would
    # load the resource readers and zipfile (~15 ms of every command's start-up) to
    # say the same for an installed (unzipped) package.
    return Path(stdlib.__file__ or "").parent


def stdlib_modules() -> dict[str, Path]:
    """Dotted name (`topologies.ndv2`) -> file, for every standard library module."""
    return dict(_stdlib_files())


@functools.lru_cache(maxsize=1)
def _stdlib_files() -> tuple[tuple[str, Path], ...]:
    # The package's own folder, listed once per process: loading one file asks for the
    # listing a dozen times (each import, each prelude), and a walk of the folder costs
    # ~0.5 ms each time.
    root = stdlib_root()
    return tuple((".".join(path.relative_to(root).with_suffix("").parts), path)
                 for path in sorted(root.rglob("*" + SUFFIX)))


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
    # Name -> the standard library module defining it, per namespace: set by the loader
    # (which can load the whole standard library) so that an unknown name can suggest
    # `import topologies.ndv2;`.
    stdlib_definers: Callable[[str], dict[str, str]] = field(default=lambda table: {}, repr=False)
    # Topologies instantiated from this module's definitions: (definition id, arguments)
    # -> (definition, eval.topology.Elaborated). It lives and dies with the module, so a
    # reloaded file starts afresh; holding the definition keeps its id unique.
    elaborated: dict[tuple, tuple[ast.Definition, Any]] = field(default_factory=dict, repr=False)

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
        home = self.stdlib_definers(table).get(name)
        if home is not None and home != self.stdlib_name:
            msg += f"; did you mean `import {home};`?"
        else:
            hint = suggest(name, self.visible(table))
            if hint:
                msg += f"; did you mean '{hint}'?"
        return NameLookupError(msg, span)
