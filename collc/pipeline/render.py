"""Pictures of a step: a Chrome trace (Perfetto, chrome://tracing) and the classic
pipeline diagram (matplotlib, PNG or SVG), bubbles shaded.

Both draw `Lanes`: one lane per stage (or per traced rank), each with its compute
intervals, its transfers, its gradient collective and its bubbles, so a predicted and
a measured step look alike.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii
from pathlib import Path
from typing import Any

import numpy as np

from collc.diagnostics import CollcError
from collc.io import atomic_write
from collc.pipeline.schedules import KIND_CODES
from collc.pipeline.timeline import Timeline
from collc.render.chrome_trace import TraceBuilder, write_trace as write_chrome_trace
from collc.render.plots import figure_bytes, pyplot

# Categories and their colours in the diagram.
COLOURS = {
    "F": "#4C72B0", "B": "#55A868", "I": "#8FBC8F", "W": "#C9B458", "compute": "#4C72B0",
    "gradient": "#DD8452", "bubble": "#D62728",
}

LETTERS = tuple(k.value for k in KIND_CODES)  # by kind code


@dataclass(frozen=True)
class Interval:
    start_us: float
    dur_us: float
    category: str  # F, B, I, W, compute, gradient, transfer
    label: str
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class Lane:
    title: str
    compute: list[Interval] = field(default_factory=list)
    transfers: list[Interval] = field(default_factory=list)
    collectives: list[Interval] = field(default_factory=list)
    bubbles: list[dict[str, Any]] = field(default_factory=list)  # report entries


def _lane_title(rank: int, stage: dict[str, Any]) -> str:
    return f"stage {rank} (GPUs {', '.join(map(str, stage['ranks']))})"


def _collective_spans(tl: Timeline, rank: int, report: dict[str, Any]) -> list[Interval]:
    """The rank's gradient collective, if it takes any time."""
    c = tl.collectives[rank]
    if c.end <= c.start:
        return []
    return [Interval(c.start * 1e6, (c.end - c.start) * 1e6, "gradient", f"gradient {report['gradient']['collective']}")]


def lanes_from_prediction(tl: Timeline, report: dict[str, Any]) -> list[Lane]:
    lanes = []
    for r in range(tl.order.ranks):
        stage = report["stages"][r]
        lane = Lane(_lane_title(r, stage))
        part = tl.rank_slice(r)
        ev = tl.events
        for s, k, mb, start_us, dur_us in zip(ev.stage[part].tolist(), ev.kind[part].tolist(),
                                              ev.microbatch[part].tolist(), (ev.start[part] * 1e6).tolist(),
                                              ((ev.end[part] - ev.start[part]) * 1e6).tolist()):
            letter = LETTERS[k]
            lane.compute.append(Interval(start_us, dur_us, letter, f"{s}{letter}{mb}", {"stage": s, "microbatch": mb}))
        lane.collectives = _collective_spans(tl, r, report)
        lane.bubbles = stage["bubbles"]
        lanes.append(lane)
    for t in tl.transfers:
        lanes[t.src_rank].transfers.append(
            Interval(t.start * 1e6, (t.end - t.start) * 1e6, "transfer",
                  f"{t.what} {t.src_stage}->{t.dst_stage} mb {t.microbatch}",
                  {"to_rank": t.dst_rank, "microbatch": t.microbatch}))
    return lanes


def _lane_rows(trace: TraceBuilder, pid: int, lane: Lane) -> None:
    """The lane's process and its rows, named."""
    trace.process(pid, lane.title, sort_index=pid, tid=0)
    for tid, name in ((0, "compute"), (1, "transfers (sent)"), (2, "gradient collective"), (3, "bubbles")):
        trace.thread(pid, tid, name)


def _add_spans(trace: TraceBuilder, pid: int, tid: int, spans: list[Interval]) -> None:
    for s in spans:
        trace.complete(s.label, s.category, pid, tid, s.start_us, s.dur_us, s.args)


def chrome_trace(lanes: list[Lane], title: str) -> dict[str, Any]:
    """One process per lane, with rows for compute, transfers sent, the gradient
    collective and bubbles."""
    trace = TraceBuilder()
    for pid, lane in enumerate(lanes):
        _lane_rows(trace, pid, lane)
        for tid, spans in ((0, lane.compute), (1, lane.transfers), (2, lane.collectives)):
            _add_spans(trace, pid, tid, spans)
        for b in lane.bubbles:
            trace.complete(f"bubble ({b['cause']})", "bubble", pid, 3, b["start_us"], b["duration_us"],
                           {k: v for k, v in b.items() if k not in ("start_us", "end_us")})
    return trace.trace(title)


def write_trace(path: Path, lanes: list[Lane], title: str) -> None:
    write_chrome_trace(path, chrome_trace(lanes, title))


# The slices of a predicted step, as json.dumps writes the events `chrome_trace` makes
# of them (keys in its order, its separators, floats by repr).
_COMPUTE_SLICE = ('{"ph": "X", "name": "%d%s%d", "cat": "%s", "pid": %d, "tid": 0, "ts": %r, "dur": %r, '
                  '"args": {"stage": %d, "microbatch": %d}}')
_TRANSFER_SLICE = ('{"ph": "X", "name": "%s %d->%d mb %d", "cat": "transfer", "pid": %d, "tid": 1, "ts": %r, '
                   '"dur": %r, "args": {"to_rank": %d, "microbatch": %d}}')
_BUBBLE_SLICE = ('{"ph": "X", "name": "bubble (%s)", "cat": "bubble", "pid": %d, "tid": 3, "ts": %r, "dur": %r, '
                 '"args": {"duration_us": %r, "cause": "%s", "free_bytes": %s, "waiting_on": %s}}')


def prediction_trace_pieces(tl: Timeline, report: dict[str, Any], title: str) -> Iterator[str]:
    """The text `write_trace` writes for `lanes_from_prediction(tl, report)`, made from
    the timeline's columns in pieces, a rank at a time: a step of two million actions
    would otherwise be millions of intervals and event dicts, and seconds of encoding
    per million. Metadata and collectives, a few per rank, go through `chrome_trace`."""
    yield '{"traceEvents": ['
    ev = tl.events
    transfers = tl.transfer_columns()
    sent_by = np.concatenate(([0], np.cumsum(np.bincount(transfers.src_rank, minlength=tl.order.ranks))))
    for r in range(tl.order.ranks):
        stage = report["stages"][r]
        head = TraceBuilder()
        _lane_rows(head, r, Lane(_lane_title(r, stage)))
        events = [json.dumps(e) for e in head.events]
        collective = TraceBuilder()
        _add_spans(collective, r, 2, _collective_spans(tl, r, report))
        part = tl.rank_slice(r)
        events += [_COMPUTE_SLICE % (s, LETTERS[k], mb, LETTERS[k], r, start, dur, s, mb) for s, k, mb, start, dur in
                   zip(ev.stage[part].tolist(), ev.kind[part].tolist(), ev.microbatch[part].tolist(),
                       (ev.start[part] * 1e6).tolist(), ((ev.end[part] - ev.start[part]) * 1e6).tolist())]
        sent = slice(int(sent_by[r]), int(sent_by[r + 1]))
        events += [_TRANSFER_SLICE % ("activation" if a else "gradient", s, d, mb, r, start, dur, to, mb)
                   for a, s, d, mb, to, start, dur in
                   zip(transfers.activation[sent].tolist(), transfers.src_stage[sent].tolist(),
                       transfers.dst_stage[sent].tolist(), transfers.microbatch[sent].tolist(),
                       transfers.dst_rank[sent].tolist(), (transfers.start[sent] * 1e6).tolist(),
                       ((transfers.end[sent] - transfers.start[sent]) * 1e6).tolist())]
        events += [json.dumps(e) for e in collective.events]
        events += [_BUBBLE_SLICE % (b["cause"], r, b["start_us"], b["duration_us"], b["duration_us"], b["cause"],
                                    "null" if b["free_bytes"] is None else int.__repr__(b["free_bytes"]),
                                    "null" if b["waiting_on"] is None else encode_basestring_ascii(b["waiting_on"]))
                   for b in stage["bubbles"]]
        yield (", " if r else "") + ", ".join(events)
    yield '], "displayTimeUnit": "ms", "otherData": {"title": ' + json.dumps(title) + "}}"


def write_prediction_trace(path: Path, tl: Timeline, report: dict[str, Any], title: str) -> None:
    """`write_trace(path, lanes_from_prediction(tl, report), title)`, the same bytes."""
    atomic_write(path, prediction_trace_pieces(tl, report, title))


def _unit(step_us: float) -> tuple[float, str]:
    if step_us >= 2e6:
        return 1e6, "s"
    if step_us >= 2e3:
        return 1e3, "ms"
    return 1.0, "us"


def write_plot(path: Path, lanes: list[Lane], title: str, step_us: float) -> None:
    """The pipeline diagram: one row per lane, compute coloured by kind and labelled
    with the micro-batch where it fits, gradient collectives, bubbles shaded red."""
    suffix = path.suffix.lower()
    if suffix not in (".png", ".svg"):
        raise CollcError(f"cannot draw '{path.name}': the picture must be a .png or .svg file")
    plt = pyplot()
    # Lazy, as pyplot() is: matplotlib is heavy and only drawing needs it.
    from matplotlib.patches import Patch

    scale, unit = _unit(step_us)
    n = len(lanes)
    fig, ax = plt.subplots(figsize=(13, 0.7 * n + 1.8))
    height = 0.8
    many = sum(len(l.compute) for l in lanes) > 4000
    for row, lane in enumerate(lanes):
        y = n - 1 - row
        for b in lane.bubbles:
            ax.broken_barh([(b["start_us"] / scale, b["duration_us"] / scale)], (y - height / 2, height),
                           facecolors=COLOURS["bubble"], alpha=0.18, hatch=None if many else "//",
                           edgecolor=COLOURS["bubble"], linewidth=0)
        by_cat: dict[str, list[tuple[float, float]]] = {}
        for s in lane.compute:
            by_cat.setdefault(s.category, []).append((s.start_us / scale, s.dur_us / scale))
        for cat, bars in by_cat.items():
            ax.broken_barh(bars, (y - height / 2, height), facecolors=COLOURS.get(cat, "#777777"),
                           edgecolor="white" if not many else None, linewidth=0.4)
        for s in lane.collectives:
            ax.broken_barh([(s.start_us / scale, s.dur_us / scale)], (y - height / 2, height),
                           facecolors=COLOURS["gradient"], edgecolor="white", linewidth=0.4)
        if not many:
            min_width = step_us / scale / 90
            for s in lane.compute:
                if s.dur_us / scale >= min_width and "microbatch" in s.args:
                    ax.text((s.start_us + s.dur_us / 2) / scale, y, str(s.args["microbatch"]), ha="center",
                            va="center", fontsize=7, color="white")
    ax.set_yticks(range(n))
    ax.set_yticklabels([l.title for l in reversed(lanes)], fontsize=8)
    ax.set_xlim(0, step_us / scale * 1.005)
    ax.set_ylim(-0.7, n - 0.3)
    ax.set_xlabel(f"time from the start of the step ({unit})")
    ax.set_title(title, fontsize=10)
    present = {s.category for l in lanes for s in l.compute}
    names = {"F": "forward", "B": "backward", "I": "backward (input grad)", "W": "backward (weight grad)",
             "compute": "compute kernels"}
    handles = [Patch(color=COLOURS[c], label=names[c]) for c in ("F", "B", "I", "W", "compute") if c in present]
    if any(l.collectives for l in lanes):
        handles.append(Patch(color=COLOURS["gradient"], label="gradient collective"))
    handles.append(Patch(facecolor=COLOURS["bubble"], alpha=0.3, label="bubble"))
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncol=len(handles), fontsize=8,
              frameon=False)
    fig.tight_layout()
    data = figure_bytes(fig, suffix[1:], dpi=130)
    plt.close(fig)
    atomic_write(path, data)
