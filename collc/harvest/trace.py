"""Pictures of a harvesting run, from the manager's log (harvest-log.json).

- A Chrome trace (chrome://tracing, Perfetto): one process per device; a row with the
  trainer's bubbles, a row per side task with the intervals it ran, overruns past a
  bubble's end as separate red slices, incidents (crash, memory cap, hang, kill) as
  instant events.
- A PNG/SVG timeline of the same (matplotlib, set up by collc.render.plots).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.io import read_input_bytes
from collc.render.chrome_trace import TraceBuilder
from collc.render.plots import pyplot

_REQUIRED = ("devices", "tasks", "bubbles", "runs", "incidents")


# The largest harvest log read: a day of runs at a step a millisecond is well under it.
LOG_MAX_BYTES = 1 << 30

_NUM, _INT, _STR = "number", "whole number", "string"
# What every record of a log holds (the fields the tables and pictures read), by list.
_FIELDS: dict[str, dict[str, str]] = {
    "tasks": {"id": _INT, "name": _STR, "device": _STR, "state": _STR, "priority": _INT, "memory_bytes": _NUM,
              "harvested_s": _NUM, "runs": _INT, "progress": _NUM, "progress_unit": _STR, "max_overrun_s": _NUM},
    "bubbles": {"start": _NUM, "end": _NUM, "device": _STR, "source": _STR, "harvested_s": _NUM},
    "runs": {"task": _INT, "device": _STR, "start": _NUM, "end": _NUM, "overrun_s": _NUM, "steps": _INT},
    "incidents": {"t": _NUM, "what": _STR, "message": _STR},
}
_DEVICE_FIELDS = {"bubbles": _INT, "bubble_s": _NUM, "harvested_s": _NUM, "harvested_share": _NUM, "runs": _INT,
                  "max_overrun_s": _NUM, "p99_overrun_s": _NUM}


def load_log(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "harvest-log.json"
    data = read_input_bytes(path, "harvest log", LOG_MAX_BYTES)
    try:
        log = json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as exc:
        raise CollcError(f"not UTF-8: byte 0x{data[exc.start]:02X} at byte offset {exc.start}",
                         Span(str(path), 1, 1)) from None
    except json.JSONDecodeError as exc:
        raise CollcError(f"not valid JSON: {exc.msg}", Span(str(path), exc.lineno, exc.colno)) from None
    except RecursionError:
        raise CollcError("not a harvest log: nested too deeply", Span(str(path), 1, 1)) from None
    if not isinstance(log, dict):
        raise CollcError("a harvest log must be a JSON object", Span(str(path), 1, 1))
    missing = [k for k in _REQUIRED if k not in log]
    if missing:
        raise CollcError(f"not a harvest log: missing {', '.join(missing)} (line 1 is the "
                         "object that should have them)", Span(str(path), 1, 1))
    problem = log_problem(log)
    if problem is not None:
        raise CollcError(f"not a harvest log: {problem}", Span(str(path), 1, 1))
    return log


def _wrong(value: Any, kind: str) -> bool:
    if kind == _STR:
        return not isinstance(value, str)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return True
    return not math.isfinite(value) or (kind == _INT and not float(value).is_integer())


def log_problem(log: dict[str, Any]) -> str | None:
    """What in a log's records has the wrong type (None: nothing): a log edited by hand,
    or written by another program, is refused here rather than in the middle of a table."""
    devices = log["devices"]
    if not isinstance(devices, dict) or not all(isinstance(d, dict) for d in devices.values()):
        return "`devices` must be an object of objects"
    for name, d in devices.items():
        for key, kind in _DEVICE_FIELDS.items():
            if key not in d or _wrong(d[key], kind):
                return f"devices.{name}.{key} must be a {kind}"
    for key in ("margin_s", "overrun_limit_s", "hang_timeout_s", "uptime_s"):
        if key in log and _wrong(log[key], _NUM):
            return f"`{key}` must be a {_NUM}"
    for table, fields in _FIELDS.items():
        records = log[table]
        if not isinstance(records, list):
            return f"`{table}` must be a list"
        for i, rec in enumerate(records):
            if not isinstance(rec, dict):
                return f"{table}[{i}] must be an object"
            for key, kind in fields.items():
                if key not in rec or _wrong(rec[key], kind):
                    return f"{table}[{i}].{key} must be a {kind}"
            if "device" in fields and table != "tasks" and rec["device"] not in devices:
                return f"{table}[{i}].device '{rec['device'][:40]}' is not one of the log's devices"
        if table == "incidents":
            for i, rec in enumerate(records):
                if rec.get("task") is not None and _wrong(rec["task"], _INT):
                    return f"incidents[{i}].task must be a {_INT} or null"
    return None


def chrome_trace(log: dict[str, Any]) -> dict[str, Any]:
    trace = TraceBuilder()
    pids = {name: i + 1 for i, name in enumerate(log["devices"])}
    names = {t["id"]: t["name"] for t in log["tasks"]}
    for name, pid in pids.items():
        trace.process(pid, f"device {name}")
        trace.thread(pid, 0, "trainer bubbles")
    for t in log["tasks"]:
        if t["device"] in pids:
            trace.thread(pids[t["device"]], t["id"], f"task {t['id']} {t['name']}")
    for b in log["bubbles"]:
        trace.complete("bubble", b["source"], pids[b["device"]], 0, b["start"] * 1e6,
                       (b["end"] - b["start"]) * 1e6, {"harvested_ms": b["harvested_s"] * 1e3})
    for r in log["runs"]:
        pid = pids[r["device"]]
        inside_end = r["end"] - r["overrun_s"]
        trace.complete(names.get(r["task"], str(r["task"])), "side task", pid, r["task"],
                       r["start"] * 1e6, max(0.0, inside_end - r["start"]) * 1e6,
                       {"steps": r["steps"], "window": r["window"]})
        if r["overrun_s"] > 0:
            trace.complete("overrun", "overrun", pid, r["task"], inside_end * 1e6, r["overrun_s"] * 1e6,
                           {"overrun_ms": r["overrun_s"] * 1e3}, colour="terrible")
    task_device = {t["id"]: t["device"] for t in log["tasks"]}
    for inc in log["incidents"]:
        pid = pids.get(task_device.get(inc["task"]), 1)
        trace.instant(inc["what"], pid, inc["task"] or 0, inc["t"] * 1e6, {"message": inc["message"]})
    return trace.trace()


def timeline_figure(log: dict[str, Any], title: str = "side tasks in the trainer's bubbles",
                    window_s: tuple[float, float] | None = None) -> Any:
    plt = pyplot()
    rows: list[tuple[str, list[tuple[float, float]], list[tuple[float, float]]]] = []
    for dev in log["devices"]:
        rows.append((f"{dev} bubbles", [(b["start"], b["end"] - b["start"])
                                        for b in log["bubbles"] if b["device"] == dev], []))
        for t in (t for t in log["tasks"] if t["device"] == dev):
            runs = [r for r in log["runs"] if r["task"] == t["id"]]
            ok = [(r["start"], r["end"] - r["overrun_s"] - r["start"]) for r in runs]
            over = [(r["end"] - r["overrun_s"], r["overrun_s"]) for r in runs
                    if r["overrun_s"] > 0]
            rows.append((f"{t['name']} ({t['state']})", ok, over))
    fig, ax = plt.subplots(figsize=(11, 0.5 + 0.55 * len(rows)))
    for i, (label, spans, overs) in enumerate(reversed(rows)):
        color = "#c8c8c8" if label.endswith("bubbles") else "#2b7bb9"
        ax.broken_barh(spans, (i - 0.35, 0.7), facecolors=color)
        if overs:
            # Overruns are short: draw them at least 2 px wide so they can be seen.
            ax.broken_barh(overs, (i - 0.35, 0.7), facecolors="#d62728",
                           edgecolor="#d62728", linewidth=1.5)
    ax.set_yticks(range(len(rows)), [r[0] for r in reversed(rows)])
    ax.set_xlabel("time since the manager started (s)")
    ax.set_title(title)
    if window_s:
        ax.set_xlim(*window_s)
    for inc in log["incidents"]:
        ax.axvline(inc["t"], color="#d62728", linestyle=":", linewidth=1)
    fig.tight_layout()
    return fig
