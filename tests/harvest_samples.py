"""A well-formed harvest log (what `collc harvest status --log` and `collc harvest trace`
read), shared by the tests that break it on purpose (tests/hardening, tests/fuzz)."""

from __future__ import annotations

from typing import Any


def harvest_log(incidents: bool = True) -> dict[str, Any]:
    """A fresh copy each call: one device, one finished task, one bubble, one run."""
    return {"devices": {"cpu:0": {"bubbles": 1, "bubble_s": 0.1, "harvested_s": 0.05, "harvested_share": 0.5,
                                  "runs": 1, "max_overrun_s": 0.0, "p99_overrun_s": 0.0}},
            "tasks": [{"id": 1, "name": "t", "kind": "iterative", "device": "cpu:0", "state": "finished",
                       "priority": 0, "memory_bytes": 1024, "harvested_s": 0.05, "runs": 1, "progress": 1.0,
                       "progress_unit": "steps", "max_overrun_s": 0.0}],
            "bubbles": [{"start": 0.0, "end": 0.1, "device": "cpu:0", "source": "report", "harvested_s": 0.05}],
            "runs": [{"task": 1, "device": "cpu:0", "start": 0.0, "end": 0.05, "overrun_s": 0.0, "steps": 3,
                      "window": 0.1}],
            "incidents": [{"t": 0.01, "what": "crash", "message": "m", "task": 1}] if incidents else [],
            "margin_s": 0.002, "overrun_limit_s": 0.005, "hang_timeout_s": 2.0}
