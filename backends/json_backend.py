"""`--backend json`: the schedule IR (with its topology) as JSON."""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from pathlib import Path

from collc.io import atomic_write
from collc.jsontext import indented_json

from collc.backends import Backend, BackendOptions


def document(unit) -> dict:
    return {
        "format": "collc-schedule",
        "version": 1,
        "size_bytes": unit.size_bytes,
        "topology": unit.topology.to_json(),
        "schedule": unit.schedule.to_json(),
    }


def emit(unit, output: Path, options: BackendOptions) -> list[Path]:
    return [atomic_write(output, encoded(document(unit)))]


def encoded(doc: dict) -> Iterator[bytes]:
    """The bytes of json.dumps(doc, indent=1) and a newline, in pieces (the file is
    written as it is made: a schedule of millions of ops is never held whole as text)."""
    return chain(indented_json(doc), [b"\n"])


BACKEND = Backend(name="json", summary="the schedule IR as JSON", lowering=lambda o: "", emit=emit,
                  suffix=".json")
