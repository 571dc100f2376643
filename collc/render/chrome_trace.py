"""Chrome traces (the JSON Trace Event Format that Perfetto and chrome://tracing open).

A trace is `{"traceEvents": [...], "displayTimeUnit": "ms"}`; every event has a phase
`ph`, a process `pid` and (mostly) a thread `tid`; times `ts` and durations `dur` are
microseconds. collc writes three phases: metadata ("M": the names and order of
processes and threads), complete slices ("X": a start and a duration) and instant
events ("i"). `collc pipeline`/`collc bubbles` and `collc harvest trace` build their
traces here, each with its own processes and rows.

Keys are written in one fixed order per kind of event, so a trace is the same bytes
from run to run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collc.io import atomic_write

Event = dict[str, Any]


class TraceBuilder:
    """The events of one trace, in the order they are added."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def process(self, pid: int, name: str, *, sort_index: int | None = None, tid: int | None = None) -> None:
        """Name process `pid` (one row group in Perfetto), and place it at `sort_index`
        among the processes when given. `tid` is written on these metadata events only
        where a caller's traces always had it (Perfetto ignores it there)."""
        self.events.append(self._metadata("process_name", pid, tid, {"name": name}))
        if sort_index is not None:
            self.events.append(self._metadata("process_sort_index", pid, tid, {"sort_index": sort_index}))

    def thread(self, pid: int, tid: int, name: str) -> None:
        """Name row `tid` of process `pid`."""
        self.events.append(self._metadata("thread_name", pid, tid, {"name": name}))

    def complete(self, name: str, category: str, pid: int, tid: int, ts_us: float, dur_us: float,
                 args: dict[str, Any], *, colour: str | None = None) -> None:
        """A slice from `ts_us` lasting `dur_us`; `colour` is one of the trace viewer's
        reserved colour names (`cname`, e.g. "terrible" for red)."""
        event: Event = {"ph": "X", "name": name, "cat": category}
        if colour is not None:
            event["cname"] = colour
        event.update({"pid": pid, "tid": tid, "ts": ts_us, "dur": dur_us, "args": args})
        self.events.append(event)

    def instant(self, name: str, pid: int, tid: int, ts_us: float, args: dict[str, Any]) -> None:
        """A moment, drawn across the whole process (scope "p")."""
        self.events.append({"ph": "i", "s": "p", "name": name, "pid": pid, "tid": tid, "ts": ts_us, "args": args})

    def trace(self, title: str | None = None) -> dict[str, Any]:
        """The trace document; `title` goes into `otherData`, shown in the viewer's info."""
        doc: dict[str, Any] = {"traceEvents": self.events, "displayTimeUnit": "ms"}
        if title is not None:
            doc["otherData"] = {"title": title}
        return doc

    @staticmethod
    def _metadata(kind: str, pid: int, tid: int | None, args: dict[str, Any]) -> Event:
        event: Event = {"ph": "M", "name": kind, "pid": pid}
        if tid is not None:
            event["tid"] = tid
        event["args"] = args
        return event


def write_trace(path: str | Path, trace: dict[str, Any]) -> Path:
    """Write a trace document as compact JSON, all or nothing."""
    return atomic_write(path, json.dumps(trace))
