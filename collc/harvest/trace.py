"""Pictures of a harvesting run, from the manager's log (harvest-log.json).

- A Chrome trace (chrome://tracing, Perfetto): one process per device; a row with the
  trainer's bubbles, a row per side task with the intervals it ran, overruns past a
  bubble's end as separate red slices, incidents (crash, memory cap, hang, kill) as
  instant events.
- A PNG/SVG timeline of the same (matplotlib, set up by collc.render.plots).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from collc.diagnostics import CollcError, Span
from collc.render.chrome_trace import TraceBuilder
from collc.render.plots import pyplot

_REQUIRED = ("devices", "tasks", "bubbles", "runs", "incidents")


def load_log(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if path.is_dir():
        path = path / "harvest-log.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise CollcError(f"cannot read harvest log: {exc.strerror}", Span(str(path), 1, 1))
    try:
        log = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CollcError(f"not valid JSON: {exc.msg}", Span(str(path), exc.lineno, exc.colno))
    if not isinstance(log, dict):
        raise CollcError("a harvest log must be a JSON object", Span(str(path), 1, 1))
    missing = [k for k in _REQUIRED if k not in log]
    if missing:
        raise CollcError(f"not a harvest log: missing {', '.join(missing)} (line 1 is the "
                         "object that should have them)", Span(str(path), 1, 1))
    return log


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
