"""Passes, their registry, textual pipelines and the pass manager.

A pass is a frozen dataclass with a `name` and typed option fields; `run` maps one
`CompileUnit` to the next. A pipeline is written as text, e.g.
`"synthesize{method=lp chunks=4},verify"`, and options are converted to the field
types. Passes register with `@register_pass`; packages outside collc add theirs through
the `collc.passes` entry-point group (each entry point names a module to import or a
Pass subclass).
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import time
import typing
from enum import Enum
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from collc.diagnostics import CollcError, Span
from collc.ir.collective import Collective
from collc.ir.schedule import Schedule
from collc.ir.topology import Topology
from collc.verify.regrouped import verify_rewritten


@dataclass(frozen=True)
class CompileUnit:
    """What flows through the pipeline: the problem, and what passes have made of it."""

    topology: Topology
    collective: Collective
    size_bytes: int  # bytes of each rank's output buffer (nccl-tests' size column)
    schedule: Schedule | None = None
    # A backend's lowered form of the schedule (set by its lowering passes).
    lowered: Any = None
    # name -> facts a pass reports (solver status, timings, ...), in pass order.
    notes: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The schedule and topology objects a verification (races checked) accepted. A pass
    # that replaces either leaves the mark behind on the objects it no longer holds, so
    # it never vouches for a schedule it did not see; at 1,024 GPUs it spares a
    # verification of a minute each time the same schedule would be checked again.
    verified_on: tuple[Schedule, Topology] | None = field(default=None, repr=False, compare=False)

    @property
    def verified(self) -> bool:
        """Whether this unit's schedule, this very object, verified on its topology."""
        mark = self.verified_on
        return mark is not None and mark[0] is self.schedule and mark[1] is self.topology

    def with_verified(self, schedule: Schedule) -> "CompileUnit":
        """This unit with `schedule`, which the caller has verified on this unit's
        topology with the race check."""
        return replace(self, schedule=schedule, verified_on=(schedule, self.topology))

    def with_note(self, pass_name: str, **facts: Any) -> "CompileUnit":
        merged = {**self.notes.get(pass_name, {}), **facts}
        return replace(self, notes={**self.notes, pass_name: merged})


class PipelineError(CollcError):
    """A pipeline text or pass option that does not make sense."""


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str] = ""
    # One line for `collc passes` and error messages.
    summary: ClassVar[str] = ""

    def run(self, unit: CompileUnit) -> CompileUnit:  # pragma: no cover - abstract
        raise NotImplementedError(f"pass {self.name!r} does not define run()")

    @classmethod
    def options(cls) -> dict[str, Any]:
        hints = typing.get_type_hints(cls)
        return {f.name: hints.get(f.name, str) for f in dataclasses.fields(cls)}

    def spec(self) -> str:
        """This pass written back as pipeline text."""
        opts = " ".join(f"{f.name}={_fmt(getattr(self, f.name))}" for f in dataclasses.fields(self)
                        if getattr(self, f.name) != f.default)
        return f"{self.name}{{{opts}}}" if opts else self.name


def _fmt(v: Any) -> str:
    if isinstance(v, Enum):
        return str(v.value)
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


_REGISTRY: dict[str, type[Pass]] = {}
_PLUGINS_LOADED = False


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator (or plain call) that makes a pass available by its name."""
    if not cls.name:
        raise TypeError(f"{cls.__qualname__} has no pass name")
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"pass {cls.name!r} must be a dataclass")
    other = _REGISTRY.get(cls.name)
    if other is not None and other is not cls:
        raise ValueError(f"pass name {cls.name!r} is taken by {other.__module__}.{other.__qualname__}")
    _REGISTRY[cls.name] = cls
    return cls


def load_builtin_passes() -> None:
    """Import the modules that register collc's own passes (synthesize, verify)."""
    for mod in BUILTIN_PASS_MODULES:
        importlib.import_module(mod)


def load_plugins() -> None:
    """Import the built-in passes and every `collc.passes` entry point, once."""
    global _PLUGINS_LOADED
    if _PLUGINS_LOADED:
        return
    _PLUGINS_LOADED = True
    from importlib.metadata import entry_points

    load_builtin_passes()
    for ep in entry_points(group="collc.passes"):
        obj = ep.load()
        if isinstance(obj, type) and issubclass(obj, Pass):
            register_pass(obj)


# Modules whose import registers collc's own passes. Backends add their lowering passes
# here by name so that the front end and passes never import a backend.
BUILTIN_PASS_MODULES: list[str] = ["collc.passes.verify_pass", "collc.passes.synthesize"]


def registered_passes() -> dict[str, type[Pass]]:
    load_plugins()
    return dict(sorted(_REGISTRY.items()))


def get_pass(name: str, span: Span | None = None) -> type[Pass]:
    """The pass of this name. A built-in one is found without loading the entry
    points: reading the installed packages' metadata and importing the plugins (the
    MSCCL backend's lowering brings networkx) costs a compile ~0.3 s it does not need."""
    load_builtin_passes()
    if name in _REGISTRY:
        return _REGISTRY[name]
    passes = registered_passes()
    if name not in passes:
        known = ", ".join(passes)
        raise PipelineError(f"unknown pass '{name}' (known passes: {known})", span)
    return passes[name]


_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _convert(pass_name: str, key: str, raw: Any, typ: Any, span: Span | None) -> Any:
    origin = typing.get_origin(typ)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(typ) if a is not type(None)]
        if isinstance(raw, str) and raw.lower() in ("none", "null"):
            return None
        typ = args[0] if len(args) == 1 else str
    if not isinstance(raw, str):
        if typ is float and isinstance(raw, int) and not isinstance(raw, bool):
            return float(raw)
        if isinstance(raw, typ if isinstance(typ, type) else object):
            return raw
        raw = str(raw)
    try:
        if typ is bool:
            return _BOOL[raw.lower()]
        if typ is int:
            return int(raw)
        if typ is float:
            return float(raw)
        if isinstance(typ, type) and issubclass(typ, str):
            return typ(raw)
    except (KeyError, ValueError):
        tname = getattr(typ, "__name__", str(typ))
        raise PipelineError(f"option '{key}' of pass '{pass_name}' expects a {tname}, got '{raw}'", span)
    return raw


def make_pass(name: str, options: dict[str, Any], span: Span | None = None) -> Pass:
    cls = get_pass(name, span)
    fields = cls.options()
    kwargs = {}
    for key, raw in options.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise PipelineError(f"pass '{name}' has no option '{key}' (its options: {known})", span)
        kwargs[key] = _convert(name, key, raw, fields[key], span)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise PipelineError(f"pass '{name}': {exc}", span)


_ITEM = re.compile(r"\s*([A-Za-z_][\w\-]*)\s*(?:\{([^{}]*)\})?\s*(?:,|$)")


def parse_pipeline(text: str, span: Span | None = None) -> list[Pass]:
    """`"a{x=1 y=2},b"` -> [A(x=1, y=2), B()]."""
    passes: list[Pass] = []
    pos = 0
    text = text.strip()
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if not m or m.end() == pos:
            raise PipelineError(f"cannot read pipeline '{text}' at character {pos + 1}: expected "
                                "a pass name, optionally followed by {option=value ...}", span)
        name, body = m.group(1), m.group(2)
        opts: dict[str, Any] = {}
        for item in re.split(r"[\s,]+", (body or "").strip()):
            if not item:
                continue
            if "=" not in item:
                raise PipelineError(f"option '{item}' of pass '{name}' needs a value (write {item}=VALUE)", span)
            k, v = item.split("=", 1)
            opts[k.strip()] = v.strip().strip('"')
        passes.append(make_pass(name, opts, span))
        pos = m.end()
    return passes


@dataclass
class PassManager:
    """Runs passes in order, checking the IR after every pass that changed the schedule."""

    passes: list[Pass]
    verify_between: bool = True
    timings: list[tuple[str, float]] = field(default_factory=list)

    @classmethod
    def from_text(cls, text: str, **kw: Any) -> "PassManager":
        return cls(parse_pipeline(text), **kw)

    def run(self, unit: CompileUnit) -> CompileUnit:
        for p in self.passes:
            t0 = time.perf_counter()
            before, verified_before = unit.schedule, unit.verified
            unit = p.run(unit)
            if not isinstance(unit, CompileUnit):
                raise TypeError(f"pass {p.name!r} returned {type(unit).__name__}, not a CompileUnit")
            changed = unit.schedule is not None and unit.schedule is not before
            # A pass that verified its own schedule (synthesize) marks it: not run again.
            if self.verify_between and changed and not unit.verified:
                # Cheap when the pass only regrouped a verified schedule's ops (msccl-merge).
                verify_rewritten(before if verified_before else None, unit.schedule, unit.topology)
                unit = unit.with_verified(unit.schedule)
            self.timings.append((p.name, time.perf_counter() - t0))
        return unit
