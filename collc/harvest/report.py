"""Reading a pipeline bubble report (`collc pipeline --report`, `collc bubbles --report`).

The report says, per pipeline stage, when in a training step the stage is idle and how
much device memory is free then. The harvesting runtime only needs the bubbles, so it
keeps its own small loader instead of importing the pipeline package: a training script
that imports `collc.harvest` stays cheap. Unknown fields are ignored (the format grows).

Errors are located: `Span(file, line, column)` of the offending JSON value (the loader
records where each object starts while parsing).
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span

CAUSES = ("warmup", "cooldown", "transfer", "gradient", "unknown")


@dataclass(frozen=True)
class Bubble:
    """One idle period of a stage, in seconds from the start of the training step."""

    start_s: float
    end_s: float
    cause: str = "unknown"
    free_bytes: int | None = None

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class StageBubbles:
    stage: int
    ranks: tuple[int, ...]
    busy_s: float
    bubbles: tuple[Bubble, ...]

    @property
    def min_free_bytes(self) -> int | None:
        """Memory a side task may use in every bubble of this stage (None: unknown)."""
        known = [b.free_bytes for b in self.bubbles if b.free_bytes is not None]
        return min(known) if known else None


@dataclass(frozen=True)
class BubbleReport:
    kind: str          # "predicted" or "measured"
    step_s: float
    stages: tuple[StageBubbles, ...]
    source: str = "<report>"

    def stage(self, index: int) -> StageBubbles:
        for s in self.stages:
            if s.stage == index:
                return s
        raise CollcError(f"the report has no stage {index} (stages: "
                         f"{', '.join(str(s.stage) for s in self.stages)})",
                         Span(self.source, 1, 1))

    def bubble_seconds(self, stage: int) -> float:
        return sum(b.duration_s for b in self.stage(stage).bubbles)


# --- a JSON parse that remembers where every object starts ----------------------------

def _parse_with_positions(text: str) -> tuple[Any, dict[int, int]]:
    """json.loads, plus {id(object): offset of its '{'} for every JSON object."""
    positions: dict[int, int] = {}
    decoder = json.JSONDecoder()
    plain_object = decoder.parse_object

    def parse_object(s_and_end, *args, **kwargs):  # type: ignore[no-untyped-def]
        obj, end = plain_object(s_and_end, *args, **kwargs)
        positions[id(obj)] = s_and_end[1] - 1
        return obj, end

    decoder.parse_object = parse_object  # type: ignore[assignment]
    # The C scanner does not call back into Python; the pure-Python one does.
    decoder.scan_once = json.scanner.py_make_scanner(decoder)
    return decoder.decode(text), positions


class _Locator:
    def __init__(self, source: str, text: str, positions: dict[int, int]):
        self.source, self.text, self.positions = source, text, positions

    def span(self, obj: Any) -> Span:
        offset = self.positions.get(id(obj), 0)
        line = self.text.count("\n", 0, offset) + 1
        column = offset - (self.text.rfind("\n", 0, offset) + 1) + 1
        return Span(self.source, line, column)

    def error(self, obj: Any, where: str, message: str) -> CollcError:
        return CollcError(f"{where}: {message}", self.span(obj))


def _number(loc: _Locator, obj: dict, key: str, where: str, *, optional: bool = False,
            minimum: float | None = 0.0) -> float | None:
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise loc.error(obj, where, f"missing field '{key}'")
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise loc.error(obj, where, f"'{key}' must be a number, not {json.dumps(value)}")
    if minimum is not None and value < minimum:
        raise loc.error(obj, where, f"'{key}' must be >= {minimum:g}, not {value}")
    return float(value)


def _bubble(loc: _Locator, obj: Any, where: str, step_s: float) -> Bubble:
    if not isinstance(obj, dict):
        raise loc.error(obj, where, "a bubble must be a JSON object")
    start = _number(loc, obj, "start_us", where)
    end = _number(loc, obj, "end_us", where)
    assert start is not None and end is not None
    if end < start:
        raise loc.error(obj, where, f"end_us {end:g} is before start_us {start:g}")
    if end > step_s * 1e6 * (1 + 1e-9) + 1e-3:
        raise loc.error(obj, where, f"end_us {end:g} is after the step's end "
                                    f"({step_s * 1e6:g} us)")
    cause = obj.get("cause", "unknown")
    if cause not in CAUSES:
        raise loc.error(obj, where, f"cause {json.dumps(cause)} is not one of "
                                    f"{', '.join(CAUSES)}")
    free = _number(loc, obj, "free_bytes", where, optional=True)
    return Bubble(start / 1e6, end / 1e6, cause, None if free is None else int(free))


def _stage(loc: _Locator, obj: Any, where: str, step_s: float) -> StageBubbles:
    if not isinstance(obj, dict):
        raise loc.error(obj, where, "a stage must be a JSON object")
    index = _number(loc, obj, "stage", where)
    assert index is not None
    if index != int(index):
        raise loc.error(obj, where, f"'stage' must be an integer, not {index:g}")
    ranks = obj.get("ranks", [])
    if not isinstance(ranks, list) or not all(isinstance(r, int) for r in ranks):
        raise loc.error(obj, where, "'ranks' must be a list of integers")
    raw = obj.get("bubbles")
    if not isinstance(raw, list):
        raise loc.error(obj, where, "missing list 'bubbles'")
    bubbles = [_bubble(loc, b, f"{where}.bubbles[{i}]", step_s) for i, b in enumerate(raw)]
    bubbles.sort(key=lambda b: b.start_s)
    for prev, nxt in zip(bubbles, bubbles[1:]):
        if nxt.start_s < prev.end_s - 1e-12:
            raise loc.error(obj, where, f"bubbles overlap ({prev.start_s * 1e6:g}-"
                                        f"{prev.end_s * 1e6:g} us and "
                                        f"{nxt.start_s * 1e6:g}-{nxt.end_s * 1e6:g} us)")
    busy = _number(loc, obj, "busy_us", where, optional=True)
    return StageBubbles(int(index), tuple(ranks), (busy or 0.0) / 1e6, tuple(bubbles))


def parse_report(text: str, source: str = "<report>") -> BubbleReport:
    try:
        data, positions = _parse_with_positions(text)
    except json.JSONDecodeError as exc:
        raise CollcError(f"not valid JSON: {exc.msg}", Span(source, exc.lineno, exc.colno))
    loc = _Locator(source, text, positions)
    if not isinstance(data, dict):
        raise CollcError("a bubble report must be a JSON object", Span(source, 1, 1))
    kind = data.get("kind")
    if kind not in ("predicted", "measured"):
        raise loc.error(data, "report", f"'kind' must be \"predicted\" or \"measured\", "
                                        f"not {json.dumps(kind)}")
    step_s = _number(loc, data, "step_us", "report")
    assert step_s is not None
    step_s /= 1e6
    if step_s <= 0:
        raise loc.error(data, "report", "'step_us' must be positive")
    raw = data.get("stages")
    if not isinstance(raw, list) or not raw:
        raise loc.error(data, "report", "missing non-empty list 'stages'")
    stages = tuple(_stage(loc, s, f"stages[{i}]", step_s) for i, s in enumerate(raw))
    return BubbleReport(kind, step_s, stages, source)


def load_report(path: str | Path) -> BubbleReport:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CollcError(f"cannot read bubble report: {exc.strerror}", Span(str(path), 1, 1))
    except UnicodeDecodeError as exc:
        raise CollcError(f"not UTF-8 text (byte offset {exc.start})", Span(str(path), 1, 1))
    return parse_report(text, str(path))
