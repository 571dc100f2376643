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
from collc.pipeline.schedules import Action, Kind, ScheduleOrder

# Index of each kind's array of finish times. B and I both produce the input gradient.
_F, _G, _W = 0, 1, 2


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


@dataclass(frozen=True, slots=True)
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


@dataclass(frozen=True, slots=True)
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


def _duration(costs: StageCosts, a: Action) -> float:
    if a.kind is Kind.F:
        return costs.forward_s[a.stage]
    if a.kind is Kind.B:
        return costs.backward_s[a.stage]
    if a.kind is Kind.I:
        return costs.input_grad_s[a.stage]
    return costs.weight_grad_s[a.stage]


def build_timeline(order: ScheduleOrder, costs: StageCosts, span: Span | None = None) -> Timeline:
    S, M, p = order.stages, order.microbatches, order.ranks
    n = S * M
    nan = float("nan")
    finish = [[nan] * n, [nan] * n, [nan] * n]  # F, input gradient (B or I), W
    producer: list[list[Action | None]] = [[None] * n, [None] * n, [None] * n]
    stage_rank = order.stage_rank
    fwd_x, bwd_x = costs.send_forward_s, costs.send_backward_s
    events: list[list[ComputeEvent]] = [[] for _ in range(p)]
    transfers: list[TransferEvent] = []
    waiting: dict[int, list[int]] = {}
    pos = [0] * p
    free_at = [0.0] * p
    stack = list(range(p - 1, -1, -1))
    while stack:
        r = stack.pop()
        acts = order.actions[r]
        i = pos[r]
        while i < len(acts):
            a = acts[i]
            s, mb, kind = a.stage, a.microbatch, a.kind
            idx = s * M + mb
            # (array, index, transfer delay) of each input
            if kind is Kind.F:
                needs = ((_F, idx - M, fwd_x[s - 1] if stage_rank[s - 1] != r else 0.0),) if s > 0 else ()
            elif kind is Kind.W:
                needs = ((_G, idx, 0.0),)
            elif s < S - 1:
                needs = ((_F, idx, 0.0), (_G, idx + M, bwd_x[s] if stage_rank[s + 1] != r else 0.0))
            else:
                needs = ((_F, idx, 0.0),)
            ready, produced, source = 0.0, 0.0, None
            blocked = -1
            for arr, j, delay in needs:
                t = finish[arr][j]
                if t != t:  # not produced yet
                    blocked = arr * n + j
                    break
                if t + delay >= ready:
                    ready, produced, source = t + delay, t, producer[arr][j]
            if blocked >= 0:
                waiting.setdefault(blocked, []).append(r)
                break
            start = free_at[r] if free_at[r] > ready else ready
            end = start + _duration(costs, a)
            free_at[r] = end
            events[r].append(ComputeEvent(r, a, start, end, source, ready, produced))
            out = _W if kind is Kind.W else (_F if kind is Kind.F else _G)
            key = out * n + idx
            if finish[out][idx] == finish[out][idx]:
                raise CollcError(f"schedule runs {a} twice (or both B and I for micro-batch {mb} of stage {s})",
                                 span)
            finish[out][idx] = end
            producer[out][idx] = a
            if kind is Kind.F and s < S - 1 and stage_rank[s + 1] != r:
                transfers.append(TransferEvent("activation", r, stage_rank[s + 1], s, s + 1, mb, end, end + fwd_x[s]))
            elif kind is not Kind.F and kind is not Kind.W and s > 0 and stage_rank[s - 1] != r:
                transfers.append(TransferEvent("gradient", r, stage_rank[s - 1], s, s - 1, mb, end,
                                               end + bwd_x[s - 1]))
            woken = waiting.pop(key, None)
            if woken:
                stack.extend(woken)
            i += 1
        pos[r] = i
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
