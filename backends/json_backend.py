"""`--backend json`: the schedule IR (with its topology) as JSON."""

from __future__ import annotations

import json
from pathlib import Path

from collc.io import atomic_write

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
    return [atomic_write(output, json.dumps(document(unit), indent=1) + "\n")]


BACKEND = Backend(name="json", summary="the schedule IR as JSON", lowering=lambda o: "", emit=emit,
                  suffix=".json")
