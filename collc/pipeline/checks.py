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
"""

from __future__ import annotations

from collections import Counter

from collc.diagnostics import CollcError, Span
from collc.pipeline.schedules import Action, Kind
from collc.pipeline.timeline import ComputeEvent, Timeline

# Times are sums of floats; allow for their rounding when comparing.
EPS = 1e-12


class TimelineError(CollcError):
    """A timeline that breaks one of its rules (a bug, or a schedule that cannot run)."""


def _tol(t: float) -> float:
    return EPS * max(1.0, abs(t))


def check_one_stream(tl: Timeline, span: Span | None = None) -> None:
    for r, events in enumerate(tl.compute):
        if tuple(e.action for e in events) != tl.order.actions[r]:
            raise TimelineError(f"rank {r} does not run its actions in the schedule's order", span)
        prev: ComputeEvent | None = None
        for e in events:
            if e.end < e.start - _tol(e.start):
                raise TimelineError(f"rank {r}: {e.action} ends before it starts", span)
            if prev is not None and e.start < prev.end - _tol(prev.end):
                raise TimelineError(f"rank {r} runs {prev.action} and {e.action} at once "
                                    f"({prev.end * 1e6:.3f} us > {e.start * 1e6:.3f} us)", span)
            prev = e


def check_complete(tl: Timeline, span: Span | None = None) -> None:
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
            if f != 1:
                raise TimelineError(f"the forward of micro-batch {mb} on stage {s} does not run", span)
            if not ((b == 1 and i == 0 and w == 0) or (b == 0 and i == 1 and w == 1)):
                raise TimelineError(f"micro-batch {mb} on stage {s} needs one backward (B, or I and W); it has "
                                    f"{b} B, {i} I, {w} W", span)


def check_dependencies(tl: Timeline, span: Span | None = None) -> None:
    order, costs = tl.order, tl.costs
    done: dict[tuple[int, str, int], float] = {}
    for events in tl.compute:
        for e in events:
            a = e.action
            kind = "G" if a.kind in (Kind.B, Kind.I) else a.kind.value
            done[(a.stage, kind, a.microbatch)] = e.end
    for r, events in enumerate(tl.compute):
        for e in events:
            a = e.action
            needs: list[tuple[tuple[int, str, int], float, str]] = []
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
            for key, delay, what in needs:
                if key not in done:
                    raise TimelineError(f"{a} on rank {r} needs {what}, which never runs", span)
                ready = done[key] + delay
                if e.start < ready - _tol(ready):
                    raise TimelineError(f"{a} on rank {r} starts at {e.start * 1e6:.3f} us, before {what} is "
                                        f"ready at {ready * 1e6:.3f} us", span)


def check_step(tl: Timeline, span: Span | None = None) -> None:
    end = tl.step_s + _tol(tl.step_s)
    for events in tl.compute:
        for e in events:
            if e.end > end or e.start < -EPS:
                raise TimelineError(f"{e.action} runs outside the step [0, {tl.step_s * 1e6:.3f} us]", span)
    for c in tl.collectives:
        if c.end > end or c.end < c.start - _tol(c.start):
            raise TimelineError(f"rank {c.rank}'s gradient collective runs outside the step", span)


def check_timeline(tl: Timeline, span: Span | None = None) -> None:
    check_one_stream(tl, span)
    check_complete(tl, span)
    check_dependencies(tl, span)
    check_step(tl, span)
