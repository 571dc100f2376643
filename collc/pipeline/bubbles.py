"""Bubbles: the idle intervals of each rank's compute stream, why each happens, and
how much device memory is free during it; and the bubble report (JSON).

Causes (`Bubble.cause`):
- `warmup`: waiting on another stage's compute up to the rank's first backward (the
  pipeline filling);
- `cooldown`: waiting on another stage after the rank's last forward (the pipeline
  draining), and the tail of the step after the rank's gradient collective;
- `transfer`: most of the wait is an activation or gradient in flight (this comes
  first: a wait that is mostly a transfer is a transfer bubble wherever it falls);
- `gradient`: the rank's data-parallel gradient collective is running;
- `unknown`: waiting on another stage's compute in the steady state (stages of
  unequal cost); `waiting_on` names the action waited for.

Bubble fraction is a share of the step (idle / step); `bubble_fraction_of_ideal` is
Megatron's convention (idle / compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from operator import attrgetter
from typing import Any

from collc.ir.pipeline import MemoryModel
from collc.pipeline.schedules import Kind
from collc.pipeline.timeline import Timeline

# Gaps shorter than this (seconds) are float rounding, not bubbles.
MIN_GAP_S = 1e-12

CAUSES = ("warmup", "cooldown", "transfer", "gradient", "unknown")


@dataclass(frozen=True)
class Bubble:
    rank: int
    start: float
    end: float
    cause: str
    free_bytes: int | None
    waiting_on: str | None = None

    @property
    def duration(self) -> float:
        return self.end - self.start

    def to_json(self) -> dict[str, Any]:
        return {"start_us": self.start * 1e6, "end_us": self.end * 1e6, "duration_us": (self.end - self.start) * 1e6,
                "cause": self.cause, "free_bytes": self.free_bytes, "waiting_on": self.waiting_on}


def _held_changes(tl: Timeline, rank: int) -> list[int]:
    """+1 for each forward (it allocates its activations), -1 for each B or W (it frees
    them), 0 for an I: per event of `rank`, in order."""
    f, b, w = Kind.F, Kind.B, Kind.W
    return [1 if k is f else -1 if k is b or k is w else 0 for k in map(_KIND_OF_EVENT, tl.compute[rank])]


_KIND_OF_EVENT = attrgetter("action.kind")


def in_flight_after(tl: Timeline, rank: int) -> list[int]:
    """Micro-batch chunks whose activations rank `rank` holds after each of its events:
    a forward allocates when it starts, a B (or the W of a split backward) frees at its end."""
    return list(accumulate(_held_changes(tl, rank)))


def peak_in_flight(tl: Timeline, rank: int) -> int:
    # The count only grows at a forward, so its largest value is one right after a forward
    # (or none held, before the first event).
    return max(0, max(accumulate(_held_changes(tl, rank)), default=0))


def _free(memory: MemoryModel | None, rank: int, chunks: int, held: int) -> int | None:
    if memory is None:
        return None
    used = memory.static_bytes(rank) + held * memory.activation_bytes[rank] // chunks
    return memory.device_bytes - used


def rank_bubbles(tl: Timeline, rank: int, memory: MemoryModel | None = None, min_s: float = 0.0) -> list[Bubble]:
    events = tl.compute[rank]
    chunks = tl.order.chunks
    held = in_flight_after(tl, rank)
    kinds = list(map(_KIND_OF_EVENT, events))
    first_back = next((i for i, k in enumerate(kinds) if k is Kind.B or k is Kind.I), len(kinds))
    last_fwd = next((i for i in range(len(kinds) - 1, -1, -1) if kinds[i] is Kind.F), -1)
    stage_rank = tl.order.stage_rank
    shortest = max(MIN_GAP_S, min_s)
    free_by_held: dict[int, int | None] = {}  # the free memory of each count in flight, worked out once
    out: list[Bubble] = []

    def add(start: float, end: float, cause: str, h: int, waiting: str | None = None) -> None:
        if end - start > shortest:
            free = free_by_held[h] if h in free_by_held else free_by_held.setdefault(h, _free(memory, rank, chunks, h))
            out.append(Bubble(rank, start, end, cause, free, waiting))

    prev_end = 0.0
    for i, e in enumerate(events):
        gap_start = prev_end
        if e.start - gap_start > MIN_GAP_S:
            waiting = None if e.input_from is None else f"{e.input_from} (rank {stage_rank[e.input_from.stage]})"
            in_flight = max(0.0, e.input_ready - max(gap_start, e.input_produced))
            if in_flight > (e.start - gap_start) - in_flight:
                cause = "transfer"
            elif i == 0 or i <= first_back:
                cause = "warmup"
            elif i > last_fwd:
                cause = "cooldown"
            else:
                cause = "unknown"
            add(gap_start, e.start, cause, held[i - 1] if i else 0, waiting)
        prev_end = e.end
    coll = tl.collectives[rank]
    final = held[-1] if held else 0
    add(prev_end, coll.end, "gradient", final)
    add(max(prev_end, coll.end), tl.step_s, "cooldown", final)
    return out


def textbook_fraction(schedule: str, ranks: int, microbatches: int, chunks: int) -> float | None:
    """The published bubble share of the step for uniform stages and free communication."""
    p, m, v = ranks, microbatches, chunks
    if schedule in ("gpipe", "1f1b") or (schedule == "interleaved" and v == 1):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return None


def stage_report(tl: Timeline, rank: int, gpus: list[int], memory: MemoryModel | None,
                 min_s: float = 0.0) -> dict[str, Any]:
    busy = tl.busy_s(rank)
    idle = tl.step_s - busy
    bubbles = rank_bubbles(tl, rank, memory, min_s)
    peak = peak_in_flight(tl, rank)
    entry: dict[str, Any] = {
        "stage": rank, "ranks": gpus, "busy_us": busy * 1e6, "idle_us": idle * 1e6,
        "bubble_fraction": idle / tl.step_s if tl.step_s > 0 else 0.0,
        "bubble_fraction_of_ideal": idle / busy if busy > 0 else None,
        "peak_in_flight_microbatches": peak / tl.order.chunks,
    }
    if memory is not None:
        act = peak * memory.activation_bytes[rank] // tl.order.chunks
        entry["peak_activation_bytes"] = act
        entry["peak_memory_bytes"] = memory.static_bytes(rank) + act
        entry["device_bytes"] = memory.device_bytes
    entry["bubbles"] = [b.to_json() for b in bubbles]
    return entry


def overall(stages: list[dict[str, Any]], step_us: float) -> dict[str, Any]:
    idle = sum(s["idle_us"] for s in stages)
    busy = sum(s["busy_us"] for s in stages)
    return {"bubble_fraction": idle / (step_us * len(stages)) if step_us > 0 and stages else 0.0,
            "bubble_fraction_of_ideal": idle / busy if busy > 0 else None}
