"""The floor plan, enforced: imports point down the layers, no circles, no private names.

The import graph of the `collc` package is built from the source with `ast`, top-level
and function-local imports alike (a function-local import that closes a circle is still
a circle; it only hides it from Python until the function runs). The rules, in the order
`docs/architecture.md` draws them:

| layer | packages and modules | may import |
|---|---|---|
| 0 foundation | collc (version), diagnostics, units, limits, io, native_output, jsontext, parallel, idle, memory, grammar, stdlib | 0 |
| 1 ir | ir | 0-1 |
| 2 ir services | verify, passes.base (the pass framework: registry, pipeline text, compile unit) | 0-2 |
| 3 frontend | frontend | 0-3 |
| 4 models | analysis, report | 0-2, 4 |
| 5 optimization | synthesis, passes | 0-5 |
| 6 backends | backends | 0-6 |
| 7 driver | driver, api | 0-7 |
| 8 services for tools | render, traces | 0-2, 4, 8 |
| 9 tools | profile, pipeline, harvest | 0-5, 7-9 |
| 10 commands | cli, commands, __main__, each tool's cli module | all |

On top of the layers: only the commands, the driver and the api import backends (a
tool asks the driver, so that a new backend reaches every tool at once); no module
imports a `_private` name of another module; and the graph has no cycle at all, inside
a layer included.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parent.parent

# Package name -> source folder, as pyproject.toml's package-dir maps them.
SOURCE_ROOTS: dict[str, Path] = {
    "collc": REPO / "collc",
    "collc.backends": REPO / "backends",
    "collc.grammar": REPO / "grammar",
    "collc.stdlib": REPO / "stdlib",
}

# (layer number, name, module prefixes): a module belongs to the layer of its longest prefix.
LAYERS: list[tuple[int, str, tuple[str, ...]]] = [
    (0, "foundation", ("collc", "collc.diagnostics", "collc.units", "collc.limits", "collc.io", "collc.native_output",
                       "collc.jsontext", "collc.parallel", "collc.idle", "collc.memory",
                       "collc.grammar", "collc.stdlib")),
    (1, "ir", ("collc.ir",)),
    (2, "ir services", ("collc.verify", "collc.passes.base")),
    (3, "frontend", ("collc.frontend",)),
    (4, "models", ("collc.analysis", "collc.report")),
    (5, "optimization", ("collc.synthesis", "collc.passes")),
    (6, "backends", ("collc.backends",)),
    (7, "driver", ("collc.driver", "collc.api")),
    (8, "services for tools", ("collc.render", "collc.traces")),
    (9, "tools", ("collc.profile", "collc.pipeline", "collc.harvest")),
    (10, "commands", ("collc.cli", "collc.commands", "collc.__main__",
                      "collc.profile.cli", "collc.pipeline.cli", "collc.harvest.cli")),
]

# What each layer may import besides itself. Not strictly stacked: the models need no front
# end, and the services for tools sit beside the driver, so that reading a trace never drags
# in a solver or a backend.
MAY_IMPORT: dict[int, frozenset[int]] = {
    0: frozenset({0}),
    1: frozenset({0, 1}),
    2: frozenset({0, 1, 2}),
    3: frozenset({0, 1, 2, 3}),
    4: frozenset({0, 1, 2, 4}),
    5: frozenset({0, 1, 2, 3, 4, 5}),
    6: frozenset({0, 1, 2, 3, 4, 5, 6}),
    7: frozenset({0, 1, 2, 3, 4, 5, 6, 7}),
    8: frozenset({0, 1, 2, 4, 8}),
    9: frozenset({0, 1, 2, 3, 4, 5, 7, 8, 9}),
    10: frozenset(range(11)),
}

# Only these reach the backends directly.
BACKEND_IMPORTERS: tuple[str, ...] = ("collc.backends", "collc.driver", "collc.api", "collc.cli",
                                      "collc.commands", "collc.__main__")


@dataclass(frozen=True)
class Import:
    importer: str
    imported: str
    name: str | None  # the name taken with `from X import name`, if any
    line: int


def module_files(roots: dict[str, Path]) -> dict[str, Path]:
    """Every module of the package, by dotted name (a package by its __init__)."""
    modules: dict[str, Path] = {}
    nested = {Path(*name.split(".")[1:]) for name in roots if "." in name}
    for package, folder in roots.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder).with_suffix("")
            if package == "collc" and any(relative.parts[:len(n.parts)] == n.parts for n in nested):
                continue  # a folder mapped under another name is read from its own root
            parts = list(relative.parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join([package, *parts])] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module a dotted name lives in (a name inside a module resolves to the module)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = package[:len(package) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """Every import of a collc module in one file, at any depth (functions included)."""
    found: list[Import] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, modules) if alias.name.startswith("collc") else None
                if target and target != module:
                    found.append(Import(module, target, None, node.lineno))
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, path, node)
            if not (source == "collc" or source.startswith("collc.")):
                continue
            for alias in node.names:
                full = f"{source}.{alias.name}"
                target = full if full in modules else _resolve(source, modules)
                if target and target != module:
                    name = None if full in modules else alias.name
                    found.append(Import(module, target, name, node.lineno))
    return found


def layer_of(module: str) -> int:
    best, best_length = None, -1
    for number, _, prefixes in LAYERS:
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and len(prefix) > best_length:
                best, best_length = number, len(prefix)
    assert best is not None, f"{module} is in no layer: add it to LAYERS"
    return best


def violations(roots: dict[str, Path]) -> list[str]:
    """Every broken rule, worded for a person: empty when the floor plan holds."""
    modules = module_files(roots)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    problems: list[str] = []
    for module, path in modules.items():
        for imp in imports_of(module, path, modules):
            graph.add_edge(module, imp.imported)
            where = f"{module} (line {imp.line})"
            if imp.name and imp.name.startswith("_") and not imp.name.startswith("__"):
                problems.append(f"private name: {where} imports {imp.imported}.{imp.name}")
            upper, lower = layer_of(module), layer_of(imp.imported)
            if lower not in MAY_IMPORT[upper]:
                problems.append(f"layer: {where} imports {imp.imported} "
                                f"({LAYERS[upper][1]} may not import {LAYERS[lower][1]})")
            if (imp.imported == "collc.backends" or imp.imported.startswith("collc.backends.")) \
                    and not module.startswith(BACKEND_IMPORTERS):
                problems.append(f"backend: {where} imports {imp.imported}")
    for component in nx.strongly_connected_components(graph):
        if len(component) > 1:
            cycle = nx.find_cycle(graph.subgraph(component))
            problems.append("cycle: " + " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]]))
    return problems


def test_collc_keeps_its_floor_plan() -> None:
    problems = violations(SOURCE_ROOTS)
    assert not problems, "\n".join(problems)


def test_every_module_has_a_layer() -> None:
    for module in module_files(SOURCE_ROOTS):
        layer_of(module)


# The checker itself: planted breakages in a throwaway package must be found.

def _plant(root: Path, files: dict[str, str]) -> dict[str, Path]:
    for relative, text in files.items():
        path = root / "collc" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return {"collc": root / "collc"}


BASE = {
    "__init__.py": "",
    "diagnostics.py": "class CollcError(Exception): ...\n",
    "ir/__init__.py": "",
    "ir/topology.py": "from collc.diagnostics import CollcError\n",
    "synthesis/__init__.py": "",
}


def test_checker_passes_a_clean_tree(tmp_path: Path) -> None:
    assert violations(_plant(tmp_path, BASE)) == []


def test_checker_finds_a_cycle_made_by_a_function_local_import(tmp_path: Path) -> None:
    roots = _plant(tmp_path, {**BASE,
                              "synthesis/a.py": "from collc.synthesis.b import f\n",
                              "synthesis/b.py": "def f():\n    from collc.synthesis import a\n"})
    problems = violations(roots)
    assert any(p.startswith("cycle:") and "collc.synthesis.a" in p for p in problems), problems


def test_checker_finds_a_private_import(tmp_path: Path) -> None:
    roots = _plant(tmp_path, {**BASE,
                              "ir/schedule.py": "from collc.ir.topology import _reach\n"})
    assert violations(roots) == [
        "private name: collc.ir.schedule (line 1) imports collc.ir.topology._reach"]


def test_checker_finds_an_import_up_the_layers(tmp_path: Path) -> None:
    roots = _plant(tmp_path, {**BASE,
                              "ir/schedule.py": "from . import topology\nimport collc.synthesis\n"})
    assert violations(roots) == [
        "layer: collc.ir.schedule (line 2) imports collc.synthesis (ir may not import optimization)"]


def test_checker_finds_a_tool_reaching_a_backend(tmp_path: Path) -> None:
    roots = _plant(tmp_path, {**BASE,
                              "backends/__init__.py": "",
                              "backends/msccl.py": "",
                              "profile/__init__.py": "",
                              "profile/library.py": "import collc.backends.msccl\n"})
    problems = violations(roots)
    assert any(p.startswith("backend: collc.profile.library") for p in problems), problems


@pytest.mark.parametrize("module,layer", [("collc.verify.symbolic", 2), ("collc.traces.kineto", 8),
                                          ("collc.backends.msccl_xml.merge", 6), ("collc", 0),
                                          ("collc.passes.base", 2), ("collc.passes.synthesize", 5),
                                          ("collc.profile.cli", 10), ("collc.profile.model", 9)])
def test_layer_lookup_takes_the_longest_prefix(module: str, layer: int) -> None:
    assert layer_of(module) == layer


def test_every_package_is_installed() -> None:
    """pyproject.toml lists packages by hand (its mapped folders hide them from `find`):
    a package left out works in a checkout and is missing from the installed wheel."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, path in module_files(SOURCE_ROOTS).items() if path.name == "__init__.py"}
    assert packages - listed == set(), "add these to [tool.setuptools] packages"
