"""The rules every timeline obeys, checked after it is built.

1. One compute stream per rank: a rank's compute events do not overlap and run in the
   schedule's order.
2. Completeness: every micro-batch's forward runs once on every stage, and its backward
   once, either whole (B) or split (I then W), never both.
3. Dependencies: a forward starts after the previous stage's forward of the same
   micro-batch has finished and its activations have arrived; a backward (B or I)
   after its own forward and after the next stage's input gradient has arrived; a W
   after its own I.
4. The step covers everything: every compute event and every gradient collective ends
   by the step's end, and no event has negative duration.

`check_timeline` raises `TimelineError` naming the first rule broken.

Each rule is tested on the timeline's columns (`EventColumns`): a million-action step
is checked in a fraction of a second, where a loop over the events took microseconds
each. The arrays only find the events that may break a rule; those few are checked
again one by one, so the error names the same first event, with the same words, as a
plain loop over the events would.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import numpy as np

from collc.diagnostics import CollcError, Span
from collc.pipeline.schedules import Action, Kind
from collc.pipeline.timeline import ComputeEvent, EventColumns, Timeline

# Times are sums of floats; allow for their rounding when comparing.
EPS = 1e-12


class TimelineError(CollcError):
    """A timeline that breaks one of its rules (a bug, or a schedule that cannot run)."""


def _tol(t: float) -> float:
    return EPS * max(1.0, abs(t))


def _tol_array(t: np.ndarray) -> np.ndarray:
    """`_tol` of every element (the same float operations, so the same results)."""
    return EPS * np.maximum(1.0, np.abs(t))


def _in_range(tl: Timeline) -> bool:
    """Every stage and micro-batch inside the order: events can be numbered stage *
    microbatches + micro-batch (otherwise the checks loop over them)."""
    ev, order = tl.events, tl.order
    return bool(len(ev) == 0 or (ev.stage.min() >= 0 and ev.stage.max() < order.stages and ev.microbatch.min() >= 0
                                 and ev.microbatch.max() < order.microbatches))


def _slot(ev: EventColumns, microbatches: int) -> np.ndarray:
    return ev.stage * microbatches + ev.microbatch


def _first(mask: np.ndarray) -> int | None:
    hits = np.flatnonzero(mask)
    return int(hits[0]) if hits.size else None


def _check_rank_stream(r: int, events: tuple[ComputeEvent, ...], span: Span | None) -> None:
    prev: ComputeEvent | None = None
    for e in events:
        if e.end < e.start - _tol(e.start):
            raise TimelineError(f"rank {r}: {e.action} ends before it starts", span)
        if prev is not None and e.start < prev.end - _tol(prev.end):
            raise TimelineError(f"rank {r} runs {prev.action} and {e.action} at once "
                                f"({prev.end * 1e6:.3f} us > {e.start * 1e6:.3f} us)", span)
        prev = e


def _runs_in_order(tl: Timeline, rank: int) -> bool:
    ev, order = tl.events, tl.order.columns
    mine = slice(int(ev.offsets[rank]), int(ev.offsets[rank + 1]))
    planned = slice(int(order.offsets[rank]), int(order.offsets[rank + 1]))
    return all(np.array_equal(got[mine], want[planned]) for got, want in
               ((ev.stage, order.stage), (ev.kind, order.kind), (ev.microbatch, order.microbatch)))


def check_one_stream(tl: Timeline, span: Span | None = None) -> None:
    ev = tl.events
    bad = ev.end < ev.start - _tol_array(ev.start)
    if ev.start.size > 1:
        same_rank = ev.rank[1:] == ev.rank[:-1]
        bad[1:] |= same_rank & (ev.start[1:] < ev.end[:-1] - _tol_array(ev.end[:-1]))
    suspects = set(np.unique(ev.rank[bad]).tolist())
    for r in range(ev.offsets.size - 1):
        if not _runs_in_order(tl, r):
            raise TimelineError(f"rank {r} does not run its actions in the schedule's order", span)
        if r in suspects:
            _check_rank_stream(r, ev.rank_events(r), span)


def _check_complete_by_counting(tl: Timeline, span: Span | None) -> None:
    """Completeness of any events, however numbered (stages or micro-batches outside
    the order's)."""
    order = tl.order
    seen = Counter((e.action.stage, e.action.kind, e.action.microbatch) for events in tl.compute for e in events)
    for (stage, kind, mb), n in seen.items():
        if n > 1:
            raise TimelineError(f"{Action(stage, kind, mb)} runs {n} times", span)
    for r, events in enumerate(tl.compute):
        for e in events:
            if order.stage_rank[e.action.stage] != r:
                raise TimelineError(f"{e.action} runs on rank {r}, but stage {e.action.stage} is held by rank "
                                    f"{order.stage_rank[e.action.stage]}", span)
    for s in range(order.stages):
        for mb in range(order.microbatches):
            f = seen.get((s, Kind.F, mb), 0)
            b, i, w = (seen.get((s, k, mb), 0) for k in (Kind.B, Kind.I, Kind.W))
            _check_slot_counts(s, mb, f, b, i, w, span)


def _check_slot_counts(s: int, mb: int, f: int, b: int, i: int, w: int, span: Span | None) -> None:
    if f != 1:
        raise TimelineError(f"the forward of micro-batch {mb} on stage {s} does not run", span)
    if not ((b == 1 and i == 0 and w == 0) or (b == 0 and i == 1 and w == 1)):
        raise TimelineError(f"micro-batch {mb} on stage {s} needs one backward (B, or I and W); it has "
                            f"{b} B, {i} I, {w} W", span)


def check_complete(tl: Timeline, span: Span | None = None) -> None:
    ev = tl.events
    if not _in_range(tl):
        _check_complete_by_counting(tl, span)
        return
    order = tl.order
    M, slots = order.microbatches, order.stages * order.microbatches
    code = _slot(ev, M) * 4 + ev.kind
    counts = np.bincount(code, minlength=4 * slots)
    # The first action (in event order) that runs more than once.
    repeated = _first(counts[code] > 1)
    if repeated is not None:
        a = ev.actions.action(repeated)
        raise TimelineError(f"{Action(a.stage, a.kind, a.microbatch)} runs {int(counts[code[repeated]])} times",
                            span)
    holder = np.asarray(order.stage_rank, dtype=np.int64)
    moved = _first(holder[ev.stage] != ev.rank)
    if moved is not None:
        a, r = ev.actions.action(moved), int(ev.rank[moved])
        raise TimelineError(f"{a} runs on rank {r}, but stage {a.stage} is held by rank {order.stage_rank[a.stage]}",
                            span)
    per_slot = counts.reshape(slots, 4)
    f, b, i, w = per_slot[:, 0], per_slot[:, 1], per_slot[:, 2], per_slot[:, 3]
    whole = (b == 1) & (i == 0) & (w == 0)
    split = (b == 0) & (i == 1) & (w == 1)
    wrong = _first((f != 1) | ~(whole | split))
    if wrong is not None:
        s, mb = divmod(wrong, M)
        _check_slot_counts(s, mb, *(int(c) for c in per_slot[wrong]), span)


Need = tuple[tuple[int, str, int], float, str]


def _needs(a: Action, r: int, tl: Timeline) -> list[Need]:
    """What action `a` on rank `r` waits for: (producer key, transfer delay, what)."""
    order, costs = tl.order, tl.costs
    needs: list[Need] = []
    if a.kind is Kind.F and a.stage > 0:
        delay = costs.send_forward_s[a.stage - 1] if order.stage_rank[a.stage - 1] != r else 0.0
        needs.append(((a.stage - 1, "F", a.microbatch), delay, "the previous stage's forward"))
    elif a.kind in (Kind.B, Kind.I):
        needs.append(((a.stage, "F", a.microbatch), 0.0, "its forward"))
        if a.stage < order.stages - 1:
            delay = costs.send_backward_s[a.stage] if order.stage_rank[a.stage + 1] != r else 0.0
            needs.append(((a.stage + 1, "G", a.microbatch), delay, "the next stage's input gradient"))
    elif a.kind is Kind.W:
        needs.append(((a.stage, "G", a.microbatch), 0.0, "its input-gradient backward"))
    return needs


def _check_event_inputs(e: ComputeEvent, r: int, tl: Timeline, done: Callable[[tuple[int, str, int]], float | None],
                        span: Span | None) -> None:
    a = e.action
    for key, delay, what in _needs(a, r, tl):
        finished = done(key)
        if finished is None:
            raise TimelineError(f"{a} on rank {r} needs {what}, which never runs", span)
        ready = finished + delay
        if e.start < ready - _tol(ready):
            raise TimelineError(f"{a} on rank {r} starts at {e.start * 1e6:.3f} us, before {what} is "
                                f"ready at {ready * 1e6:.3f} us", span)


def _check_dependencies_by_key(tl: Timeline, span: Span | None) -> None:
    """Dependencies of any events, however numbered or repeated."""
    done: dict[tuple[int, str, int], float] = {}
    for events in tl.compute:
        for e in events:
            a = e.action
            kind = "G" if a.kind in (Kind.B, Kind.I) else a.kind.value
            done[(a.stage, kind, a.microbatch)] = e.end
    for r, events in enumerate(tl.compute):
        for e in events:
            _check_event_inputs(e, r, tl, done.get, span)


def check_dependencies(tl: Timeline, span: Span | None = None) -> None:
    ev = tl.events
    order, costs = tl.order, tl.costs
    S, M = order.stages, order.microbatches
    slots = S * M
    if not _in_range(tl):
        _check_dependencies_by_key(tl, span)
        return
    slot = _slot(ev, M)
    is_f = ev.kind == 0
    is_g = (ev.kind == 1) | (ev.kind == 2)
    # A repeated producer: the loop's "last one wins" decides, not an array.
    if (np.bincount(slot[is_f], minlength=slots) > 1).any() or (np.bincount(slot[is_g], minlength=slots) > 1).any():
        _check_dependencies_by_key(tl, span)
        return
    fin_f = np.full(slots, np.nan)
    fin_g = np.full(slots, np.nan)
    has_f = np.zeros(slots, dtype=bool)
    has_g = np.zeros(slots, dtype=bool)
    fin_f[slot[is_f]], has_f[slot[is_f]] = ev.end[is_f], True
    fin_g[slot[is_g]], has_g[slot[is_g]] = ev.end[is_g], True
    holder = np.asarray(order.stage_rank, dtype=np.int64)
    send_f = np.asarray(costs.send_forward_s + (0.0,), dtype=np.float64)  # padded: indexed by stage - 1 >= -1
    send_b = np.asarray(costs.send_backward_s + (0.0,), dtype=np.float64)  # padded: indexed by stage <= S - 1
    suspect = np.zeros(len(ev), dtype=bool)

    def late(needed: np.ndarray, src: np.ndarray, finished: np.ndarray, present: np.ndarray,
             delay: np.ndarray) -> None:
        """Mark the events in `needed` whose input (slot `src`) never runs or arrives after they start."""
        ready = finished[src] + delay
        suspect[needed] |= ~present[src] | (ev.start[needed] < ready - _tol_array(ready))

    fwd = np.flatnonzero(is_f & (ev.stage > 0))
    prev = ev.stage[fwd] - 1
    late(fwd, slot[fwd] - M, fin_f, has_f, np.where(holder[prev] != ev.rank[fwd], send_f[prev], 0.0))
    back = np.flatnonzero(is_g)
    late(back, slot[back], fin_f, has_f, np.zeros(back.size))
    back = back[ev.stage[back] < S - 1]
    nxt = ev.stage[back] + 1
    late(back, slot[back] + M, fin_g, has_g, np.where(holder[nxt] != ev.rank[back], send_b[nxt - 1], 0.0))
    weight = np.flatnonzero(ev.kind == 3)
    late(weight, slot[weight], fin_g, has_g, np.zeros(weight.size))

    def done(key: tuple[int, str, int]) -> float | None:
        s, kind, mb = key
        i = s * M + mb
        finished, present = (fin_f, has_f) if kind == "F" else (fin_g, has_g)
        return float(finished[i]) if present[i] else None

    for i in np.flatnonzero(suspect).tolist():
        _check_event_inputs(ev.event(i), int(ev.rank[i]), tl, done, span)


def check_step(tl: Timeline, span: Span | None = None) -> None:
    ev = tl.events
    end = tl.step_s + _tol(tl.step_s)
    outside = _first((ev.end > end) | (ev.start < -EPS))
    if outside is not None:
        raise TimelineError(f"{ev.actions.action(outside)} runs outside the step [0, {tl.step_s * 1e6:.3f} us]", span)
    for c in tl.collectives:
        if c.end > end or c.end < c.start - _tol(c.start):
            raise TimelineError(f"rank {c.rank}'s gradient collective runs outside the step", span)


def check_timeline(tl: Timeline, span: Span | None = None) -> None:
    check_one_stream(tl, span)
    check_complete(tl, span)
    check_dependencies(tl, span)
    check_step(tl, span)
