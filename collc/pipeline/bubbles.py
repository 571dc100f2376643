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

The bubbles of every rank are found at once, by array operations on the timeline's
columns (`bubble_columns`): a 1,000 x 1,000 1F1B step has a million of them.

Bubble fraction is a share of the step (idle / step); `bubble_fraction_of_ideal` is
Megatron's convention (idle / compute).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from collc.ir.pipeline import MemoryModel
from collc.pipeline.schedules import B_CODE, F_CODE, I_CODE, KIND_CODES, W_CODE
from collc.pipeline.timeline import Timeline

# Gaps shorter than this (seconds) are float rounding, not bubbles.
MIN_GAP_S = 1e-12

CAUSES = ("warmup", "cooldown", "transfer", "gradient", "unknown")
WARMUP, COOLDOWN, TRANSFER, GRADIENT, UNKNOWN = range(len(CAUSES))


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


@dataclass(frozen=True, eq=False)
class BubbleColumns:
    """Every rank's bubbles, rank after rank (rank r's are [offsets[r], offsets[r + 1])),
    in time order; one array per field, and the texts as lists."""

    offsets: np.ndarray
    start: np.ndarray
    end: np.ndarray
    cause: np.ndarray  # index in CAUSES
    free_bytes: list[int | None]
    waiting_on: list[str | None]

    def rank_bubbles(self, rank: int) -> list[Bubble]:
        lo, hi = int(self.offsets[rank]), int(self.offsets[rank + 1])
        return [Bubble(rank, s, e, CAUSES[c], f, w) for s, e, c, f, w in
                zip(self.start[lo:hi].tolist(), self.end[lo:hi].tolist(), self.cause[lo:hi].tolist(),
                    self.free_bytes[lo:hi], self.waiting_on[lo:hi])]

    def json_entries(self) -> list[list[dict[str, Any]]]:
        """Per rank, `Bubble.to_json` of each (the same float operations, on arrays)."""
        causes = [CAUSES[c] for c in self.cause.tolist()]
        flat = [{"start_us": s, "end_us": e, "duration_us": d, "cause": c, "free_bytes": f, "waiting_on": w}
                for s, e, d, c, f, w in zip((self.start * 1e6).tolist(), (self.end * 1e6).tolist(),
                                            ((self.end - self.start) * 1e6).tolist(), causes, self.free_bytes,
                                            self.waiting_on)]
        bounds = self.offsets.tolist()
        return [flat[bounds[r]:bounds[r + 1]] for r in range(len(bounds) - 1)]


def held_after(tl: Timeline) -> np.ndarray:
    """Micro-batch chunks whose activations each event's rank holds after it: a forward
    allocates when it starts, a B (or the W of a split backward) frees at its end; an I
    changes nothing."""
    ev = tl.events
    change = np.where(ev.kind == F_CODE, 1, np.where((ev.kind == B_CODE) | (ev.kind == W_CODE), -1, 0))
    total = np.cumsum(change)
    before_rank = np.concatenate(([0], total))[ev.offsets[:-1]]  # the count carried in from earlier ranks
    return total - np.repeat(before_rank, np.diff(ev.offsets))


def in_flight_after(tl: Timeline, rank: int) -> list[int]:
    """`held_after` of `rank`'s events."""
    return held_after(tl)[tl.rank_slice(rank)].tolist()


def peaks_in_flight(tl: Timeline) -> list[int]:
    """Per rank, the most micro-batch chunks held at once (0 with none held)."""
    held = held_after(tl)
    offsets = tl.events.offsets.tolist()
    return [max(0, int(held[lo:hi].max())) if hi > lo else 0 for lo, hi in zip(offsets, offsets[1:])]


def peak_in_flight(tl: Timeline, rank: int) -> int:
    part = held_after(tl)[tl.rank_slice(rank)]
    return max(0, int(part.max())) if part.size else 0


def _free(memory: MemoryModel | None, rank: int, chunks: int, held: int) -> int | None:
    if memory is None:
        return None
    used = memory.static_bytes(rank) + held * memory.activation_bytes[rank] // chunks
    return memory.device_bytes - used


def _gap_causes(tl: Timeline, gap_start: np.ndarray, position: np.ndarray) -> np.ndarray:
    """The cause of the wait before each event (for the events that wait): a transfer
    if most of it is an input in flight, else warm-up up to the rank's first backward,
    cool-down after its last forward, unknown between."""
    ev = tl.events
    offsets = ev.offsets
    n_ranks = offsets.size - 1
    index = np.arange(len(ev), dtype=np.int64)
    first_rank_index = np.repeat(offsets[:-1], np.diff(offsets))
    backward = (ev.kind == B_CODE) | (ev.kind == I_CODE)
    # Per rank: the position of its first backward (its length if none) and of its last
    # forward (-1 if none).
    first_back = np.diff(offsets).copy()
    np.minimum.at(first_back, ev.rank[backward], index[backward] - first_rank_index[backward])
    last_fwd = np.full(n_ranks, -1, dtype=np.int64)
    forward = ev.kind == F_CODE
    np.maximum.at(last_fwd, ev.rank[forward], index[forward] - first_rank_index[forward])
    rank = ev.rank
    waited = ev.start - gap_start
    in_flight = np.maximum(0.0, ev.input_ready - np.maximum(gap_start, ev.input_produced))
    return np.where(in_flight > waited - in_flight, TRANSFER,
                    np.where((position == 0) | (position <= first_back[rank]), WARMUP,
                             np.where(position > last_fwd[rank], COOLDOWN, UNKNOWN)))


def bubble_columns(tl: Timeline, memory: MemoryModel | None = None, min_s: float = 0.0) -> BubbleColumns:
    """Every rank's bubbles: the waits before its events, its gradient collective, and
    the end of the step after it."""
    ev = tl.events
    offsets = ev.offsets
    n_ranks = offsets.size - 1
    n = len(ev)
    position = np.arange(n, dtype=np.int64) - np.repeat(offsets[:-1], np.diff(offsets))
    first_of_rank = position == 0
    gap_start = np.where(first_of_rank, 0.0, np.concatenate(([0.0], ev.end[:-1])))
    held = held_after(tl)
    held_before = np.where(first_of_rank, 0, np.concatenate(([0], held[:-1])))
    shortest = max(MIN_GAP_S, min_s)
    waits = np.flatnonzero((ev.start - gap_start > MIN_GAP_S) & (ev.start - gap_start > shortest))
    cause = _gap_causes(tl, gap_start, position)[waits]
    # After its last event, a rank runs its gradient collective, then idles to the end.
    nonempty = np.diff(offsets) > 0
    last_index = offsets[1:][nonempty] - 1
    last = np.zeros(n_ranks, dtype=np.float64)
    last[nonempty] = ev.end[last_index]
    final_held = np.zeros(n_ranks, dtype=np.int64)
    final_held[nonempty] = held[last_index]
    coll_end = np.array([c.end for c in tl.collectives], dtype=np.float64)
    tail_start = np.concatenate((last, np.maximum(last, coll_end)))
    tail_end = np.concatenate((coll_end, np.full(n_ranks, tl.step_s)))
    tails = np.flatnonzero(tail_end - tail_start > shortest)
    tail_rank = np.concatenate((np.arange(n_ranks), np.arange(n_ranks)))[tails]
    # Rank by rank; within a rank the waits, then its collective, then the end of the
    # step (the order they are listed in here, kept by a stable sort).
    rank = np.concatenate((ev.rank[waits], tail_rank))
    order = np.argsort(rank, kind="stable")
    start = np.concatenate((gap_start[waits], tail_start[tails]))[order]
    end = np.concatenate((ev.start[waits], tail_end[tails]))[order]
    causes = np.concatenate((cause, np.where(tails < n_ranks, GRADIENT, COOLDOWN)))[order]
    bubble_held = np.concatenate((held_before[waits], final_held[tail_rank]))[order]
    source = np.concatenate((waits, np.full(tails.size, -1)))[order]
    rank = rank[order]
    bounds = np.zeros(n_ranks + 1, dtype=np.int64)
    np.cumsum(np.bincount(rank, minlength=n_ranks), out=bounds[1:])
    return BubbleColumns(bounds, start, end, causes, _free_bytes(tl, memory, rank, bubble_held),
                         _waiting_on(tl, source))


def _free_bytes(tl: Timeline, memory: MemoryModel | None, rank: np.ndarray, held: np.ndarray) -> list[int | None]:
    """Free device memory during each bubble, worked out once per (rank, count in flight)."""
    if memory is None:
        return [None] * int(rank.size)
    chunks = tl.order.chunks
    free: dict[tuple[int, int], int | None] = {}
    pairs = list(zip(rank.tolist(), held.tolist()))
    for pair in set(pairs):
        free[pair] = _free(memory, pair[0], chunks, pair[1])
    return [free[pair] for pair in pairs]


def _waiting_on(tl: Timeline, source: np.ndarray) -> list[str | None]:
    """'3F2 (rank 1)': the input each bubble's event waited on last, and where it ran."""
    ev = tl.events
    has = source >= 0
    kind = np.full(source.size, -1, dtype=np.int64)
    stage = np.zeros(source.size, dtype=np.int64)
    microbatch = np.zeros(source.size, dtype=np.int64)
    kind[has], stage[has], microbatch[has] = (ev.input_kind[source[has]], ev.input_stage[source[has]],
                                              ev.input_microbatch[source[has]])
    holder = tl.order.stage_rank
    letters = [k.value for k in KIND_CODES]
    return [None if k < 0 else f"{s}{letters[k]}{m} (rank {holder[s]})"
            for k, s, m in zip(kind.tolist(), stage.tolist(), microbatch.tolist())]


def rank_bubbles(tl: Timeline, rank: int, memory: MemoryModel | None = None, min_s: float = 0.0) -> list[Bubble]:
    """One rank's bubbles. They are found for every rank at once: for several ranks, call
    `bubble_columns` once."""
    return bubble_columns(tl, memory, min_s).rank_bubbles(rank)


def textbook_fraction(schedule: str, ranks: int, microbatches: int, chunks: int) -> float | None:
    """The published bubble share of the step for uniform stages and free communication."""
    p, m, v = ranks, microbatches, chunks
    if schedule in ("gpipe", "1f1b") or (schedule == "interleaved" and v == 1):
        return (p - 1) / (m + p - 1)
    if schedule == "interleaved":
        return (p - 1) / (v * m + p - 1)
    return None


def stage_reports(tl: Timeline, gpus: list[list[int]], memory: MemoryModel | None,
                  min_s: float = 0.0) -> list[dict[str, Any]]:
    """The report's entry of every rank (`gpus`: each rank's GPUs)."""
    entries = bubble_columns(tl, memory, min_s).json_entries()
    peaks = peaks_in_flight(tl)
    return [_stage_entry(tl, r, gpus[r], memory, peaks[r], entries[r]) for r in range(len(entries))]


def stage_report(tl: Timeline, rank: int, gpus: list[int], memory: MemoryModel | None,
                 min_s: float = 0.0) -> dict[str, Any]:
    entries = [b.to_json() for b in rank_bubbles(tl, rank, memory, min_s)]
    return _stage_entry(tl, rank, gpus, memory, peak_in_flight(tl, rank), entries)


def _stage_entry(tl: Timeline, rank: int, gpus: list[int], memory: MemoryModel | None, peak: int,
                 bubbles: list[dict[str, Any]]) -> dict[str, Any]:
    busy = tl.busy_s(rank)
    idle = tl.step_s - busy
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
    entry["bubbles"] = bubbles
    return entry


def overall(stages: list[dict[str, Any]], step_us: float) -> dict[str, Any]:
    idle = sum(s["idle_us"] for s in stages)
    busy = sum(s["busy_us"] for s in stages)
    return {"bubble_fraction": idle / (step_us * len(stages)) if step_us > 0 and stages else 0.0,
            "bubble_fraction_of_ideal": idle / busy if busy > 0 else None}
