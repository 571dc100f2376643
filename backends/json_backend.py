"""`--backend json`: the schedule IR (with its topology) as JSON."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from pathlib import Path

from collc.io import atomic_write
from collc.ir.schedule import Op, ops_json_text
from collc.jsontext import WrittenList, indented_json

from collc.backends import Backend, BackendOptions


def document(unit) -> dict:
    """The file's document, as plain JSON values: the file is json.dumps(indent=1) of it."""
    return _document(unit, unit.schedule.to_json())


def emit(unit, output: Path, options: BackendOptions) -> list[Path]:
    # The ops as a `WrittenList`: their text is written straight from the `Op`s
    # (`ops_json_text`), the same bytes as from `document(unit)`'s dicts.
    schedule = unit.schedule
    written = {**schedule.header_json(), "ops": WrittenList(schedule.ops, ops_json_text, Op.to_json)}
    return [atomic_write(output, encoded(_document(unit, written)))]


def _document(unit, schedule: dict) -> dict:
    return {
        "format": "collc-schedule",
        "version": 1,
        "size_bytes": unit.size_bytes,
        "topology": unit.topology.to_json(),
        "schedule": schedule,
    }


def encoded(doc: dict) -> Iterator[bytes]:
    """The bytes of json.dumps(doc, indent=1) and a newline, in pieces (the file is
    written as it is made: a schedule of millions of ops is never held whole as text)."""
    return chain(indented_json(doc), [b"\n"])


BACKEND = Backend(name="json", summary="the schedule IR as JSON", lowering=lambda o: "", emit=emit,
                  suffix=".json", emits_unverified=True)
