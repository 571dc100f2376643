"""Limits on what one compile may ask for, and how a user raises them.

Inputs beyond these are almost always mistakes (a loop bound typed with too many zeros,
a bandwidth in the wrong unit) and would otherwise run for minutes or exhaust memory
before failing. Each limit has a default and an environment variable that overrides it
(`COLLC_LIMIT_LOOP_ITERATIONS=50000000 collc compile ...`); every error that a limit
causes names both. docs/robustness.md lists them.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from collc.diagnostics import CollcError


@dataclass(frozen=True)
class Limit:
    """A bound on one kind of quantity. `default` is a number in `unit`s."""

    name: str  # lower-case; the environment variable is COLLC_LIMIT_<NAME>
    default: float
    what: str  # what is counted, for messages ("loop iterations in one definition")
    integral: bool = True

    @property
    def env_var(self) -> str:
        return f"COLLC_LIMIT_{self.name.upper()}"


LIMITS: dict[str, Limit] = {lim.name: lim for lim in (
    Limit("loop_iterations", 5_000_000, "loop iterations while evaluating one definition"),
    Limit("nodes", 200_000, "nodes in one topology"),
    Limit("links", 500_000, "links in one topology"),
    Limit("ranks", 8_192, "ranks (GPUs) in one topology, collective or MSCCL XML file"),
    Limit("nesting", 100, "levels of nested brackets and braces in a source file"),
    Limit("int_digits", 18, "decimal digits of an integer"),
    Limit("chunks", 1_048_576, "chunks in one schedule (ranks x chunks per rank)"),
    Limit("size_bytes", 2 ** 50, "bytes in a collective's size (1 PiB)"),
    Limit("bandwidth", 1e15, "bytes/s of one link's bandwidth (1 PB/s)", integral=False),
    Limit("latency", 10.0, "seconds of one link's latency", integral=False),
    # Pipelines (`collc pipeline`, schedule CSVs) and traces (`collc profile`, `collc bubbles`).
    Limit("microbatches", 65_536, "micro-batches in one pipeline step"),
    Limit("model_chunks", 64, "model chunks per pipeline stage"),
    Limit("pipeline_actions", 2_097_152,
          "stage-micro-batch pairs of one pipeline step (stages x micro-batches x chunks)"),
    Limit("csv_cells", 4_194_304, "cells in one schedule CSV file"),
    Limit("duration", 86_400.0, "seconds of one compute action or traced event (a day)", integral=False),
)}


class LimitConfigError(CollcError):
    """An environment variable that sets a limit to something that is not a positive number."""


def limit(name: str) -> float:
    """The limit in force: the environment variable's value if set, else the default."""
    lim = LIMITS[name]
    raw = os.environ.get(lim.env_var)
    if raw is None or not raw.strip():
        return lim.default
    try:
        value = float(raw.replace("_", ""))
    except ValueError:
        raise LimitConfigError(f"{lim.env_var}={raw!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise LimitConfigError(f"{lim.env_var}={raw!r} must be a positive, finite number")
    return int(value) if lim.integral else value


def int_limit(name: str) -> int:
    return int(limit(name))


def exceeded(name: str, got: str | None = None) -> str:
    """The end of a message saying a limit was passed: what it is, and how to raise it."""
    lim = LIMITS[name]
    value = limit(name)
    shown = f"{value:,}" if lim.integral else f"{value:g}"
    head = f" ({got})" if got else ""
    return f"{head}; collc's limit is {shown} {lim.what} (set {lim.env_var} to raise it)"
