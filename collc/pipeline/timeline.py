"""The timeline of one pipeline-parallel step.

Each pipeline rank has one compute stream and runs its actions in the schedule's
order; an action starts when the previous one on its rank has finished and its inputs
have arrived: a forward needs the previous stage's activations, a backward (B or I)
its own forward and the next stage's input gradient, a W its own I. Activations and
gradients travel between ranks on their own streams (they never delay compute they do
not feed); their times come from collc's alpha-beta model (network.py). After its last
action, each rank's data-parallel replicas combine gradients with one collective; the
step ends when the last of those ends.

The engine is a worklist over ranks: a rank runs actions until one waits on an input
not yet produced, and is woken when that input is produced, so each action is visited
a constant number of times (a 64-stage, 512-micro-batch interleaved step, 130k
actions, takes well under a second).
"""

from __future__ import annotations

from dataclasses import dataclass

from collc.diagnostics import CollcError, Span
from collc.ir.heap import few_collections
from collc.pipeline.schedules import Action, Kind, ScheduleOrder


@dataclass(frozen=True)
class StageCosts:
    """Durations in seconds, per virtual stage (and per stage boundary for transfers)."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]  # full backward B
    input_grad_s: tuple[float, ...]  # I
    weight_grad_s: tuple[float, ...]  # W
    send_forward_s: tuple[float, ...]  # activation from stage s to s+1 (len stages-1)
    send_backward_s: tuple[float, ...]  # gradient from stage s+1 to s
    gradient_s: tuple[float, ...]  # per rank: its data-parallel gradient collective

    @classmethod
    def uniform(cls, order: ScheduleOrder, forward: float, backward: float, weight: float | None = None,
                transfer: float = 0.0, gradient: float = 0.0) -> "StageCosts":
        """Every stage alike; a rank's costs divided among its chunks."""
        v, s = order.chunks, order.stages
        w = backward / 2 if weight is None else weight
        return cls((forward / v,) * s, (backward / v,) * s, ((backward - w) / v,) * s, (w / v,) * s,
                   (transfer,) * (s - 1), (transfer,) * (s - 1), (gradient,) * order.ranks)


# Events are not frozen: a frozen dataclass's __init__ goes through object.__setattr__,
# which made creating 130k of them a third of the whole timeline. Treat them as values.
@dataclass(slots=True)
class ComputeEvent:
    rank: int
    action: Action
    start: float
    end: float
    # The input that arrived last (None: the first action of the step, or its own
    # forward): what this action waited on if it did not start right after the previous.
    input_from: Action | None
    input_ready: float  # when that input was available on this rank
    input_produced: float  # when its producer finished (ready - produced = transfer time)


@dataclass(slots=True)
class TransferEvent:
    what: str  # "activation" or "gradient"
    src_rank: int
    dst_rank: int
    src_stage: int
    dst_stage: int
    microbatch: int
    start: float
    end: float


@dataclass(frozen=True, slots=True)
class CollectiveEvent:
    rank: int
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    order: ScheduleOrder
    costs: StageCosts
    compute: tuple[tuple[ComputeEvent, ...], ...]  # per rank, in order
    transfers: tuple[TransferEvent, ...]
    collectives: tuple[CollectiveEvent, ...]  # per rank (zero-length without data parallelism)
    step_s: float

    def busy_s(self, rank: int) -> float:
        return sum(e.end - e.start for e in self.compute[rank])


class ScheduleDeadlock(CollcError):
    """A schedule whose order waits on an input that is produced later on the same rank."""


# Kind codes by the member's id: an Enum's hash is a Python call, two million of them a
# noticeable share of a large timeline.
_CODE_BY_ID = {id(Kind.F): 0, id(Kind.B): 1, id(Kind.I): 2, id(Kind.W): 3}


def build_timeline(order: ScheduleOrder, costs: StageCosts, span: Span | None = None) -> Timeline:
    # The garbage collector would walk the growing event lists again and again; the loop
    # creates no cycles, so it is paused (a third of the time on large pipelines), and
    # the events it keeps go to the oldest generation unscanned (see collc.ir.heap).
    with few_collections():
        return _build(order, costs, span)


def _build(order: ScheduleOrder, costs: StageCosts, span: Span | None) -> Timeline:
    S, M, p = order.stages, order.microbatches, order.ranks
    n = S * M
    nan = float("nan")
    # Finish times of forwards, input gradients (B or I) and weight gradients, by
    # stage * M + micro-batch; NaN until produced. The actions producing them, likewise.
    fin_f, fin_g, fin_w = [nan] * n, [nan] * n, [nan] * n
    by_f: list[Action | None] = [None] * n
    by_g: list[Action | None] = [None] * n
    stage_rank = order.stage_rank
    fwd_x, bwd_x = costs.send_forward_s, costs.send_backward_s
    durations = (costs.forward_s, costs.backward_s, costs.input_grad_s, costs.weight_grad_s)
    code_of = _CODE_BY_ID
    encoded = [[(code_of[id(a.kind)], a.stage, a.microbatch) for a in acts] for acts in order.actions]
    # Per rank: the events of the actions run so far.
    done: list[list[ComputeEvent]] = [[] for _ in range(p)]
    transfers: list[TransferEvent] = []
    waiting: dict[int, list[int]] = {}
    pos = [0] * p
    free_at = [0.0] * p
    stack = list(range(p - 1, -1, -1))
    while stack:
        r = stack.pop()
        acts = order.actions[r]
        enc = encoded[r]
        out_r = done[r]
        i = pos[r]
        count = len(enc)
        t_free = free_at[r]
        while i < count:
            k, s, mb = enc[i]
            idx = s * M + mb
            ready, produced, source = 0.0, 0.0, None
            if k == 0:  # forward: the previous stage's activations
                if s > 0:
                    t = fin_f[idx - M]
                    if t != t:
                        waiting.setdefault(idx - M, []).append(r)
                        break
                    ready = t + (fwd_x[s - 1] if stage_rank[s - 1] != r else 0.0)
                    produced, source = t, by_f[idx - M]
            elif k == 3:  # weight gradient: its own input gradient
                t = fin_g[idx]
                if t != t:
                    waiting.setdefault(n + idx, []).append(r)
                    break
                ready = produced = t
                source = by_g[idx]
            else:  # B or I: its forward, and the next stage's input gradient
                t = fin_f[idx]
                if t != t:
                    waiting.setdefault(idx, []).append(r)
                    break
                ready = produced = t
                source = by_f[idx]
                if s < S - 1:
                    t = fin_g[idx + M]
                    if t != t:
                        waiting.setdefault(n + idx + M, []).append(r)
                        break
                    arrive = t + (bwd_x[s] if stage_rank[s + 1] != r else 0.0)
                    if arrive >= ready:
                        ready, produced, source = arrive, t, by_g[idx + M]
            start = t_free if t_free > ready else ready
            end = start + durations[k][s]
            t_free = end
            a = acts[i]
            out_r.append(ComputeEvent(r, a, start, end, source, ready, produced))
            if k == 0:
                if fin_f[idx] == fin_f[idx]:
                    raise CollcError(f"schedule runs {a} twice", span)
                fin_f[idx] = end
                by_f[idx] = a
                key = idx
                if s < S - 1 and stage_rank[s + 1] != r:
                    transfers.append(TransferEvent("activation", r, stage_rank[s + 1], s, s + 1, mb, end,
                                                   end + fwd_x[s]))
            elif k == 3:
                if fin_w[idx] == fin_w[idx]:
                    raise CollcError(f"schedule runs {a} twice", span)
                fin_w[idx] = end
                key = -1
            else:
                if fin_g[idx] == fin_g[idx]:
                    raise CollcError(f"schedule runs {a} twice (or both B and I for micro-batch {mb} of stage {s})",
                                     span)
                fin_g[idx] = end
                by_g[idx] = a
                key = n + idx
                if s > 0 and stage_rank[s - 1] != r:
                    transfers.append(TransferEvent("gradient", r, stage_rank[s - 1], s, s - 1, mb, end,
                                                   end + bwd_x[s - 1]))
            if key >= 0 and waiting:
                woken = waiting.pop(key, None)
                if woken:
                    stack.extend(woken)
            i += 1
        pos[r] = i
        free_at[r] = t_free
    events = done
    stuck = [r for r in range(p) if pos[r] < len(order.actions[r])]
    if stuck:
        shown = "; ".join(f"rank {r} at {order.actions[r][pos[r]]} (action {pos[r] + 1})" for r in stuck[:4])
        raise ScheduleDeadlock(f"schedule '{order.name}' deadlocks: every unfinished rank waits on an input "
                               f"that is never produced before it: {shown}", span)
    collectives = []
    step = 0.0
    for r in range(p):
        last = events[r][-1].end if events[r] else 0.0
        end = last + costs.gradient_s[r]
        collectives.append(CollectiveEvent(r, last, end))
        step = max(step, end)
    return Timeline(order, costs, tuple(tuple(e) for e in events), tuple(transfers), tuple(collectives), step)
